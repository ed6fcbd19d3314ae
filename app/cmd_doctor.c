/* mitaseg doctor: can this machine run mitaseg well, and if not, why. The
 * CPU and its OpenBLAS, the CUDA driver, runtime and libraries, each GPU,
 * then the self-test (app/selftest.c) on every usable device, as a table.
 * Exit 0: every self-test row passed (no GPU is not a failure, only said);
 * 1: a row failed, or a GPU is present that cannot be used; 2: usage. */
#include <cblas.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h> /* strcasecmp */
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cli.h"
#include "kernels/cpu_features.h"
#include "kernels/cpu_path.h"
#include "kernels/gemm.h"
#include "kernels/gemm_small.h"
#include "selftest.h"
#ifdef MS_HAVE_CUDA
#include "kernels/cuda_ctx.h"
#endif

static const char doctor_help[] =
    "usage: mitaseg doctor [options]\n"
    "\n"
    "Says whether this machine can run mitaseg well, and why not: CPU features\n"
    "and threads, the OpenBLAS build, the CUDA driver, runtime, cuBLAS and cuDNN\n"
    "versions, each GPU (name, compute capability, memory); then a self-test that\n"
    "runs every op and a bundled tiny model on each usable device against the CPU\n"
    "and prints a table (op, device, reference, max error, tolerance, result).\n"
    "On a GPU each op runs in FP32 mode against the CPU and in tensor-core mode\n"
    "against the CPU with the same operand rounding.\n"
    "On the CPU the ops run on all threads against one thread, and the model\n"
    "against the golden output of the independent Python reference. Exit status:\n"
    "0 when every row passed, 1 when one failed or a GPU is present that CUDA\n"
    "cannot use (no GPU at all is not a failure).\n"
    "\n"
    "options:\n"
    "  --no-selftest           only the facts, no self-test\n"
    "  --selftest-model FILE   the model to run (default: assets/selftest/tiny.model.safetensors)\n"
    "  --selftest-golden FILE  its expected output (default: assets/selftest/tiny.golden.safetensors)\n"
    "  -h, --help              this help\n";

/* Threads of this process (/proc/self/status), 1 where unknown. */
static int doctor_threads(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    int n = 1;
    if (!f) return n;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1) break;
    fclose(f);
    return n;
}

static void print_cpu(void)
{
    char model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                const char *v = strchr(line, ':');
                if (v) {
                    snprintf(model, sizeof model, "%s", v + 2);
                    model[strcspn(model, "\n")] = '\0';
                }
                break;
            }
        fclose(f);
    }
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("cpu: %s; %ld cores online, %d threads used\n", model, sysconf(_SC_NPROCESSORS_ONLN),
           threads);
    printf("cpu features:");
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) printf(" sse4.2");
    if (__builtin_cpu_supports("avx")) printf(" avx");
    if (__builtin_cpu_supports("avx2")) printf(" avx2");
    if (__builtin_cpu_supports("fma")) printf(" fma");
    if (__builtin_cpu_supports("avx512f")) printf(" avx512f");
    if (__builtin_cpu_supports("avx512bw")) printf(" avx512bw");
    if (__builtin_cpu_supports("avx512vl")) printf(" avx512vl");
    if (!__builtin_cpu_supports("avx2"))
        printf(" (no AVX2: OpenBLAS picks an older kernel; expect a slow CPU path)");
#else
    printf(" (not an x86 CPU: not listed)");
#endif
    printf("\n");
    static const char *const path_what[MS_CPU_PATH_COUNT] = {
        "baseline x86-64", "x86-64-v3: AVX2, FMA", "x86-64-v4: AVX-512, 512-bit vectors"};
    ms_cpu_path path = cpu_path_get();
    printf("cpu kernels: %s path (%s)%s\n", cpu_path_name(path), path_what[path],
           path + 1 < MS_CPU_PATH_COUNT && cpu_path_supported((ms_cpu_path)(path + 1))
               ? "; a faster one runs here: MS_CPU_PATH asked for this one"
               : "");
    /* gemm_cpu makes the library single-threaded and splits products over
     * OpenMP threads (kernels/gemm.h) */
    printf("gemm: %s (%s)\n", gemm_lib_name(gemm_lib_get()), gemm_lib_why());
    printf("small gemm: %s (%s)\n", gemm_small_lib_name(gemm_small_lib_get()),
           gemm_small_lib_why());
    printf("openblas: %s; core %s", openblas_get_config(), openblas_get_corename());
    /* who chose the core: the user (OPENBLAS_CORETYPE), mitaseg for this
     * CPU's instruction set (app/omp_env/omp_env.c) or OpenBLAS from its
     * table of CPU models */
    const char *core = getenv("OPENBLAS_CORETYPE");
    const char *chosen = getenv("MS_OPENBLAS_CORE_CHOSEN");
    bool core_env = core && *core;
    if (core_env && chosen && !strcmp(chosen, core))
        printf(" (chosen by mitaseg for this CPU's instruction set: OPENBLAS_CORETYPE=%s; "
               "MS_OPENBLAS_CORE=openblas leaves it to OpenBLAS)", core);
    else if (core_env)
        printf(" (chosen by OPENBLAS_CORETYPE=%s in the environment)", core);
    else
        printf(" (chosen by OpenBLAS)");
    printf("\n");
    /* x86-64-v4's AVX-512 subsets are what OpenBLAS's AVX-512 cores
     * (SkylakeX and its successors) need; its other cores run AVX2 kernels
     * or older ones */
    const char *name = openblas_get_corename();
    if (cpu_path_supported(MS_CPU_PATH_V4) && strcasecmp(name, "SkylakeX") &&
        strcasecmp(name, "Cooperlake") && strcasecmp(name, "SapphireRapids"))
        printf("openblas note: this CPU runs AVX-512 but OpenBLAS runs %s's kernels, at half "
               "its sgemm rate or less; OPENBLAS_CORETYPE=%s runs its AVX-512 ones%s\n",
               name, cpu_features_openblas_core(),
               core_env ? " (or unset it: mitaseg then asks for them)"
                        : " (mitaseg asks for them unless MS_OPENBLAS_CORE=openblas)");
    /* OpenBLAS's own pool: app/omp_env/omp_env.c asks for none. No parallel
     * region has run yet, so the process's other threads are the pool's. */
    const char *nt = getenv("OPENBLAS_NUM_THREADS");
    printf("openblas pool: %d thread(s) besides the main one (OPENBLAS_NUM_THREADS=%s)\n",
           doctor_threads() - 1, nt ? nt : "unset");
    /* what libgomp read at start (app/omp_env/omp_env.c chose it unless the
     * user did) */
    const char *policy = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    printf("openmp wait: ");
    if (policy) printf("OMP_WAIT_POLICY=%s%s", policy, spin ? ", " : "");
    if (spin) printf("GOMP_SPINCOUNT=%s", spin);
    if (!policy && !spin) printf("libgomp's default");
    printf("\n");
}

#ifdef MS_HAVE_CUDA
static void print_cuda_versions(const ms_cuda_versions *v)
{
    if (v->driver)
        printf("cuda driver: supports CUDA %d.%d\n", v->driver / 1000, (v->driver % 1000) / 10);
    else
        printf("cuda driver: none (%s)\n", v->device_error);
    printf("cuda runtime: %d.%d (built with %d.%d)\n", v->runtime / 1000, (v->runtime % 1000) / 10,
           v->runtime_build / 1000, (v->runtime_build % 1000) / 10);
    printf("cublas: %d.%d.%d\n", v->cublas / 10000, (v->cublas / 100) % 100, v->cublas % 100);
    printf("cudnn: %d.%d.%d (built with %d.%d.%d)\n", v->cudnn / 10000, (v->cudnn / 100) % 100,
           v->cudnn % 100, v->cudnn_build / 10000, (v->cudnn_build / 100) % 100,
           v->cudnn_build % 100);
    if (v->driver && v->driver < v->runtime)
        printf("cuda: the driver (CUDA %d.%d) is older than the runtime (%d.%d): update the "
               "NVIDIA driver\n",
               v->driver / 1000, (v->driver % 1000) / 10, v->runtime / 1000,
               (v->runtime % 1000) / 10);
}
#endif

/* Prints the CUDA facts; returns how many GPUs CUDA sees (0 without CUDA),
 * -1 when the machine has a GPU (ms_gpu_present) that CUDA cannot use. */
static int print_cuda(void)
{
#ifdef MS_HAVE_CUDA
    ms_cuda_versions v;
    cuda_query_versions(&v);
    /* runtime_build 0: the backend library did not load (device_error says
     * why, on the gpus line); there are no versions to print */
    if (v.runtime_build) print_cuda_versions(&v);
    if (v.devices <= 0) {
        if (ms_gpu_present()) {
            printf("gpus: a GPU is present, but CUDA cannot use it: %s\n",
                   v.device_error);
            return -1;
        }
        printf("gpus: none: %s; the CPU is used\n", v.device_error);
        return 0;
    }
    for (int i = 0; i < v.devices; i++) {
        char name[256];
        int ma = 0, mi = 0;
        size_t mem = 0;
        if (cuda_query_device(i, name, &ma, &mi, &mem) != MS_OK) {
            printf("gpu %d: %s\n", i, ms_last_error());
            continue;
        }
        printf("gpu %d: %s, compute capability %d.%d, %.1f GiB%s\n", i, name, ma, mi,
               (double)mem / (1024.0 * 1024 * 1024),
               ma < 8 ? " (mitaseg needs 8.0 or newer: not usable)" : "");
    }
    return v.devices;
#else
    printf("cuda: this build has no CUDA backend (built without the CUDA toolkit or with "
           "-DMS_CUDA=OFF); the CPU is used%s\n",
           ms_gpu_present() ? " (this machine has a GPU: a CUDA build would use it)" : "");
    return 0;
#endif
}

static void print_table(const ms_selftest *st)
{
    printf("\n%-18s %-22s %-18s %10s %8s  %s\n", "op", "device", "reference", "max error", "tol",
           "result");
    for (int i = 0; i < st->count; i++) {
        const ms_selftest_row *r = &st->rows[i];
        printf("%-18s %-22s %-18s %10.2e %8.0e  %s%s%s\n", r->op, r->device, r->reference,
               r->err, r->tol, r->pass ? "pass" : "FAIL", r->detail[0] ? ": " : "", r->detail);
    }
}

int cmd_doctor(int argc, char **argv)
{
    bool selftest = true;
    const char *model = NULL, *golden = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(doctor_help, stdout);
            return 0;
        } else if (!strcmp(a, "--no-selftest")) {
            selftest = false;
        } else if ((!strcmp(a, "--selftest-model") || !strcmp(a, "--selftest-golden")) &&
                   i + 1 < argc) {
            if (a[11] == 'm') model = argv[++i];
            else golden = argv[++i];
        } else {
            cli_error("doctor: unknown or incomplete option '%s' (see mitaseg doctor --help)", a);
            return 2;
        }
    }
    char mbuf[PATH_MAX], gbuf[PATH_MAX];
    if (!model) model = cli_asset_path(mbuf, sizeof mbuf, "selftest/tiny.model.safetensors");
    if (!golden) golden = cli_asset_path(gbuf, sizeof gbuf, "selftest/tiny.golden.safetensors");

    printf("mitaseg doctor\n");
    print_cpu();
    int gpus = print_cuda();
    int unusable = gpus < 0; /* GPUs present that cannot be used: failures */
    fflush(stdout);
    if (!selftest) return unusable ? 1 : 0;

    ms_selftest st = {0};
    double t0 = cli_now_s();
    ms_status s = selftest_ops(&st, NULL, "cpu");
    if (s == MS_OK) s = selftest_model(&st, MS_DEV_CPU, 0, model, golden);
#ifdef MS_HAVE_CUDA
    for (int i = 0; s == MS_OK && i < gpus; i++) {
        char label[16];
        snprintf(label, sizeof label, "cuda:%d", i);
        ms_cuda_ctx *cu = NULL;
        if (cuda_ctx_init(&cu, i) != MS_OK) {
            printf("%s: not usable: %s\n", label, ms_last_error());
            unusable++;
            continue;
        }
        double tg = cli_now_s();
        s = selftest_ops(&st, cu, label);
        cuda_ctx_free(cu);
        if (s == MS_OK) s = selftest_model(&st, MS_DEV_CUDA, i, model, golden);
        printf("%s: self-test ran in %.2f s\n", label, cli_now_s() - tg);
    }
#else
    (void)gpus;
#endif
    if (s != MS_OK) {
        cli_error("doctor: %s", ms_last_error());
        selftest_free(&st);
        return 1;
    }
    print_table(&st);
    printf("\nself-test: %s (%d rows, %d failed, %.2f s)\n",
           st.failed ? "FAILED" : "all passed", st.count, st.failed, cli_now_s() - t0);
    if (unusable) printf("gpus: %s unusable (above): fix that to use the GPU\n",
                         gpus < 0 ? "the GPU present is" : "some are");
    int rc = st.failed || unusable ? 1 : 0;
    selftest_free(&st);
    return rc;
}
