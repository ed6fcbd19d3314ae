#include "cpu_path.h"

#include <pthread.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <stdlib.h>

static ms_cpu_path cpu_path_current = MS_CPU_PATH_BASE;
static pthread_once_t cpu_path_once = PTHREAD_ONCE_INIT;

#if defined(MS_SIMD_HAVE_V3) && (defined(__x86_64__) || defined(__i386__))
static bool cpu_has_v3(void)
{
    __builtin_cpu_init();
    /* x86-64-v3 also has F16C, MOVBE and LZCNT; the compiler may use them.
     * Read from CPUID: clang's __builtin_cpu_supports does not know them. */
    unsigned a, b, c, d, c_ext = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    unsigned a2, b2, d2;
    if (__get_cpuid(0x80000001u, &a2, &b2, &c_ext, &d2) == 0) c_ext = 0;
    bool f16c = c & (1u << 29), movbe = c & (1u << 22), lzcnt = c_ext & (1u << 5);
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") && f16c && movbe &&
           lzcnt;
}
#endif

#if defined(MS_SIMD_HAVE_V4) && (defined(__x86_64__) || defined(__i386__))
/* x86-64-v4: AVX-512 F, BW, CD, DQ and VL, and an OS that saves the opmask
 * and all 512-bit registers (XCR0 bits 1-2 and 5-7; a hypervisor may hide
 * them although CPUID lists the instructions). */
static bool cpu_has_v4(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xe6u) != 0xe6u) return false;
    return cpu_has_v3() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}
#endif

/* -1 where path p's kernels are not in this build (the compiler may lack a
 * -march level; other architectures have the base path only), else whether
 * this CPU and OS run them (1) or not (0). */
static int cpu_path_check(ms_cpu_path p)
{
    switch (p) {
    case MS_CPU_PATH_BASE: return 1;
#if defined(MS_SIMD_HAVE_V3) && (defined(__x86_64__) || defined(__i386__))
    case MS_CPU_PATH_V3: return cpu_has_v3();
#endif
#if defined(MS_SIMD_HAVE_V4) && (defined(__x86_64__) || defined(__i386__))
    case MS_CPU_PATH_V4: return cpu_has_v4();
#endif
    default: return -1;
    }
}

bool cpu_path_supported(ms_cpu_path p) { return cpu_path_check(p) > 0; }

const char *cpu_path_name(ms_cpu_path p)
{
    return p == MS_CPU_PATH_V4 ? "v4" : p == MS_CPU_PATH_V3 ? "v3" : "base";
}

static void cpu_path_detect(void)
{
    ms_cpu_path best = MS_CPU_PATH_BASE;
    while (best + 1 < MS_CPU_PATH_COUNT && cpu_path_supported((ms_cpu_path)(best + 1)))
        best = (ms_cpu_path)(best + 1);
    /* A lower path on request; one above what the CPU runs is ignored
     * rather than crashing on an illegal instruction (the tests check
     * cpu_path_get() after asking). */
    const char *env = getenv("MS_CPU_PATH");
    for (int p = 0; env && p < (int)best; p++)
        if (strcmp(env, cpu_path_name((ms_cpu_path)p)) == 0) best = (ms_cpu_path)p;
    cpu_path_current = best;
}

ms_cpu_path cpu_path_get(void)
{
    pthread_once(&cpu_path_once, cpu_path_detect);
    return cpu_path_current;
}

ms_status cpu_path_set(ms_cpu_path p)
{
    pthread_once(&cpu_path_once, cpu_path_detect);
    if (!cpu_path_supported(p))
        return ms_error(MS_ERR_UNSUPPORTED, "cpu path %s: not supported by this %s",
                        cpu_path_name(p),
                        cpu_path_check(p) < 0 ? "build" : "CPU");
    cpu_path_current = p;
    return MS_OK;
}
