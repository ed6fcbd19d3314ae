/* libgomp's wait policy, OpenBLAS's thread count and OpenBLAS's kernels,
 * chosen before those libraries read them. Each reads its variables once,
 * in its own constructor, before main runs (and libc resets the environment
 * after the executable's .preinit_array, so that is too early). This one-function
 * shared object is linked right after libgomp and libopenblas: the loader
 * runs the constructors of independent libraries in reverse order of the
 * executable's NEEDED list, so this runs after libc's and before theirs.
 *
 * OpenBLAS: mitaseg calls it single-threaded inside its own OpenMP threads
 * (kernels/gemm.c), so OpenBLAS's own pool only costs: started at load, its
 * threads spin in sched_yield for about 0.1 s, on the cores the first
 * image needs (one CamVid image on the 2-core machine, `segment --threads
 * 2`, 8 runs: 195-230 ms with the pool, 161-199 ms without). So
 * OPENBLAS_NUM_THREADS=1 unless the user set it: no pool.
 *
 * OpenBLAS's kernels: it picks them from a table of CPU models, and a CPU
 * newer than its build gets its oldest x86-64 ones (Debian's 0.3.21 on a
 * Xeon of family 6 model 207 with AVX-512: Prescott's, the CamVid model
 * 2.8-3.5x slower end to end). So OPENBLAS_CORETYPE is set to the core for
 * the CPU's instruction set (cpu_features_openblas_core; where OpenBLAS
 * knows the CPU, the core it would pick itself), unless the user named one
 * or MS_OPENBLAS_CORE=openblas leaves the choice to OpenBLAS.
 * MS_OPENBLAS_CORE_CHOSEN records the choice for `mitaseg doctor`.
 *
 * Why it matters: libgomp's default (spin for a long while, then sleep)
 * steals the cores the next parallel loop needs on a busy machine (8
 * CamVid images on the loaded 2-core machine: 54 s against 11 s passive),
 * while a passive wait puts the CPU to sleep at every barrier, and in a VM
 * every wake-up is slow (the CamVid model at 480x360 on the quiet 2-core VM:
 * 147-152 ms passive, 127-129 ms with a spin of 10000 rounds, about 0.1 ms).
 * So, unless the user chose (OMP_WAIT_POLICY or GOMP_SPINCOUNT set):
 * MS_OMP_WAIT=passive or spin forces one; otherwise (auto) the short spin
 * when nothing else is running now (the runnable count of /proc/loadavg,
 * this process aside), passive when something is.
 * tests/e2e_runtime.sh checks what libgomp sees and that it is initialised
 * once (the program never re-executes itself). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_features.h"

/* Other runnable tasks on the machine right now, or -1 if unknown. */
static int omp_env_others_running(void)
{
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f) return -1;
    double l1, l5, l15;
    int running = 0, total = 0;
    int got = fscanf(f, "%lf %lf %lf %d/%d", &l1, &l5, &l15, &running, &total);
    fclose(f);
    return got == 5 && running >= 1 ? running - 1 : -1;
}

__attribute__((constructor)) static void omp_env_choose(void)
{
    setenv("OPENBLAS_NUM_THREADS", "1", 0);
    const char *core_want = getenv("MS_OPENBLAS_CORE");
    const char *core = cpu_features_openblas_core();
    if (core && !getenv("OPENBLAS_CORETYPE") && !(core_want && !strcmp(core_want, "openblas"))) {
        setenv("OPENBLAS_CORETYPE", core, 1);
        setenv("MS_OPENBLAS_CORE_CHOSEN", core, 1);
    }
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    const char *want = getenv("MS_OMP_WAIT");
    int spin;
    if (want && !strcmp(want, "spin")) spin = 1;
    else if (want && !strcmp(want, "passive")) spin = 0;
    else spin = omp_env_others_running() == 0;
    if (spin) setenv("GOMP_SPINCOUNT", "10000", 0);
    else setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
}
