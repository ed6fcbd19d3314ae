#include "cpu_path.h"

#include "cpu_features.h"
#include <pthread.h>
#include <stdlib.h>

static ms_cpu_path cpu_path_current = MS_CPU_PATH_BASE;
static pthread_once_t cpu_path_once = PTHREAD_ONCE_INIT;

/* -1 where path p's kernels are not in this build (the compiler may lack a
 * -march level; other architectures have the base path only), else whether
 * this CPU and OS run them (1) or not (0). */
static int cpu_path_check(ms_cpu_path p)
{
    switch (p) {
    case MS_CPU_PATH_BASE: return 1;
#if defined(MS_SIMD_HAVE_V3) && (defined(__x86_64__) || defined(__i386__))
    case MS_CPU_PATH_V3: return cpu_features_has_v3();
#endif
#if defined(MS_SIMD_HAVE_V4) && (defined(__x86_64__) || defined(__i386__))
    case MS_CPU_PATH_V4: return cpu_features_has_v4();
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
