#include "cpu_path.h"

#include <pthread.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <stdlib.h>

static ms_cpu_path cpu_path_current = MS_CPU_PATH_BASE;
static pthread_once_t cpu_path_once = PTHREAD_ONCE_INIT;

bool cpu_path_supported(ms_cpu_path p)
{
    if (p == MS_CPU_PATH_BASE) return true;
#if defined(MS_SIMD_HAVE_V3) && (defined(__x86_64__) || defined(__i386__))
    if (p != MS_CPU_PATH_V3) return false;
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
#else
    return false;
#endif
}

const char *cpu_path_name(ms_cpu_path p) { return p == MS_CPU_PATH_V3 ? "v3" : "base"; }

static void cpu_path_detect(void)
{
    ms_cpu_path best = cpu_path_supported(MS_CPU_PATH_V3) ? MS_CPU_PATH_V3 : MS_CPU_PATH_BASE;
    const char *env = getenv("MS_CPU_PATH");
    /* An override the CPU cannot run is ignored rather than crashing on an
     * illegal instruction; the tests check cpu_path_get() after asking. */
    if (env && strcmp(env, "base") == 0) best = MS_CPU_PATH_BASE;
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
#ifdef MS_SIMD_HAVE_V3
                        "CPU"
#else
                        "build"
#endif
        );
    cpu_path_current = p;
    return MS_OK;
}
