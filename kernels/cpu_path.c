#include "cpu_path.h"

#include <pthread.h>
#include <stdlib.h>

static ms_cpu_path cpu_path_current = MS_CPU_PATH_BASE;
static pthread_once_t cpu_path_once = PTHREAD_ONCE_INIT;

bool cpu_path_supported(ms_cpu_path p)
{
    if (p == MS_CPU_PATH_BASE) return true;
#if defined(MS_SIMD_HAVE_V3) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    /* x86-64-v3 also has BMI1/2, LZCNT and MOVBE; the compiler may use them. */
    return p == MS_CPU_PATH_V3 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
           __builtin_cpu_supports("f16c") && __builtin_cpu_supports("movbe");
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
