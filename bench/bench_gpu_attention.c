/* MiTA against full attention on the GPU, one layer's attention (qkv in,
 * heads concatenated out), at N = 1K .. 1M tokens (full attention up to
 * --max-full-n, default 256K: at 1M it would take about a minute), head dim 64 (C = 384,
 * 6 heads, DeiT-Small), M = 49 (7x7 landmarks), k = 49. CUDA events on the
 * backend's stream, one warm-up, the L2 flushed before every timed repeat,
 * median of the repeats. Also: MiTA's time per stage, and the fused routed
 * kernel's achieved bandwidth against a measured device-to-device copy.
 *
 * Usage: bench_gpu_attention [--max-n N] [--max-full-n N] [--fp32]
 * Without CUDA in the build, or without a GPU on the machine, it prints
 * "skipped: <reason>" and exits 0; with a GPU present (ms_gpu_present) a GPU
 * it cannot use is an error (exit 1), so a device run cannot pass empty. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"

#ifndef MS_HAVE_CUDA
int main(void)
{
    printf("skipped: this build has no CUDA backend\n");
    return ms_gpu_present() ? 1 : 0;
}
#else

#include <cuda_runtime.h>

#include "kernels/cuda_ctx.h"

/* Defined in kernels/cuda_ctx.cu and kernels/mita.cu for benchmarks only. */
void *cuda_ctx_stream(ms_cuda_ctx *cu);
void mita_cuda_profile(float *stage_ms /* (8) or NULL */);

#define C_DIM 384
#define HEADS 6
#define GRID 7
#define TOPK 49
#define FLUSH_BYTES ((size_t)512 << 20) /* > 8x the H200's 60 MB L2 */

static const char *stage_names[8] = {"landmarks", "probe GEMM", "top-k",     "sum-softmax",
                                     "sum GEMM",  "route GEMM", "route+sort", "routed"};

#define CK(call)                                                                     \
    do {                                                                             \
        cudaError_t e_ = (call);                                                     \
        if (e_ != cudaSuccess) {                                                     \
            fprintf(stderr, "%s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, \
                    __LINE__);                                                       \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)
#define MS(call)                                                                   \
    do {                                                                           \
        if ((call) != MS_OK) {                                                     \
            fprintf(stderr, "%s: %s\n", #call, ms_last_error());                   \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct {
    ms_cuda_ctx *cu;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    void *flush;
} bench_ctx;

static void l2_flush(bench_ctx *b)
{
    CK(cudaMemsetAsync(b->flush, 0x5a, FLUSH_BYTES, b->st));
}

/* Device-to-device copy bandwidth, bytes read + written per second. */
static double copy_bandwidth(bench_ctx *b)
{
    size_t bytes = (size_t)1 << 30;
    void *src, *dst;
    CK(cudaMalloc(&src, bytes));
    CK(cudaMalloc(&dst, bytes));
    CK(cudaMemsetAsync(src, 1, bytes, b->st));
    float best = 1e30f;
    for (int r = 0; r < 6; r++) {
        CK(cudaEventRecord(b->e0, b->st));
        CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, b->st));
        CK(cudaEventRecord(b->e1, b->st));
        CK(cudaEventSynchronize(b->e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, b->e0, b->e1));
        if (r > 0 && ms < best) best = ms; /* r = 0 is the warm-up */
    }
    CK(cudaFree(src));
    CK(cudaFree(dst));
    return 2.0 * (double)bytes / (best * 1e-3);
}

typedef enum { RUN_MITA, RUN_FULL } run_kind;

static float time_median(bench_ctx *b, ms_backend *be, run_kind kind, int reps, float *out,
                         const float *qkv, int hp, int wp, const ms_mita_params *p)
{
    float t[16];
    if (reps > 16) reps = 16;
    for (int r = 0; r < reps; r++) {
        l2_flush(b);
        CK(cudaEventRecord(b->e0, b->st));
        if (kind == RUN_MITA) MS(op_mita(be, out, qkv, hp, wp, C_DIM, HEADS, p, NULL));
        else MS(op_attention_full(be, out, qkv, hp * wp, C_DIM, HEADS));
        CK(cudaEventRecord(b->e1, b->st));
        CK(cudaEventSynchronize(b->e1));
        CK(cudaEventElapsedTime(&t[r], b->e0, b->e1));
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_float);
    return t[reps / 2];
}

int main(int argc, char **argv)
{
    long max_n = 1048576, max_full_n = 262144;
    bool fp32 = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--max-n") && i + 1 < argc) max_n = atol(argv[++i]);
        else if (!strcmp(argv[i], "--max-full-n") && i + 1 < argc) max_full_n = atol(argv[++i]);
        else if (!strcmp(argv[i], "--fp32")) fp32 = true;
        else {
            fprintf(stderr, "usage: %s [--max-n N] [--max-full-n N] [--fp32]\n", argv[0]);
            return 2;
        }
    }
    bench_ctx b;
    memset(&b, 0, sizeof b);
    if (cuda_ctx_init(&b.cu, 0) != MS_OK) {
        bool present = ms_gpu_present();
        printf("%s: %s\n", present ? "FAIL (a GPU is present)" : "skipped", ms_last_error());
        return present ? 1 : 0;
    }
    b.st = (cudaStream_t)cuda_ctx_stream(b.cu);
    CK(cudaEventCreate(&b.e0));
    CK(cudaEventCreate(&b.e1));
    CK(cudaMalloc(&b.flush, FLUSH_BYTES));
    printf("device: %s\n", cuda_ctx_name(b.cu));
    double bw = copy_bandwidth(&b);
    printf("device-to-device copy: %.0f GB/s (read + write)\n", bw / 1e9);

    const int sides[][2] = {{32, 32}, {64, 64}, {128, 128}, {256, 256}, {512, 512},
                            {1024, 1024}};
    int nsizes = 0;
    for (int i = 0; i < 6; i++)
        if ((long)sides[i][0] * sides[i][1] <= max_n) nsizes = i + 1;
    if (nsizes == 0) {
        printf("skipped: --max-n below 1024\n");
        return 0;
    }
    int nmax = sides[nsizes - 1][0] * sides[nsizes - 1][1];
    size_t qkv_n = (size_t)nmax * 3 * C_DIM, out_n = (size_t)nmax * C_DIM;
    float *h = malloc(qkv_n * sizeof(float));
    if (!h) {
        fprintf(stderr, "out of host memory\n");
        return 1;
    }
    uint64_t s = 12345;
    for (size_t i = 0; i < qkv_n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)((double)(s >> 40) / 16777216.0 * 2.0 - 1.0);
    }
    ms_arena dev, scratch;
    MS(arena_init(&dev, (qkv_n + 2 * out_n) * sizeof(float) + (size_t)HEADS * nmax * 4 + (4 << 20),
                  MS_DEVICE_CUDA));
    MS(arena_init(&scratch, (size_t)HEADS * GRID * GRID * nmax * 4 * 2 + ((size_t)256 << 20),
                  MS_DEVICE_CUDA));
    float *qkv = arena_alloc(&dev, qkv_n * sizeof(float));
    float *out = arena_alloc(&dev, out_n * sizeof(float));
    int32_t *route = arena_alloc(&dev, (size_t)HEADS * nmax * 4);
    MS(cuda_copy_h2d(b.cu, qkv, h, qkv_n * sizeof(float)));
    MS(cuda_sync(b.cu));
    free(h);

    ms_backend be;
    memset(&be, 0, sizeof be);
    be.device = MS_DEVICE_CUDA;
    be.cuda = b.cu;
    be.fp32 = fp32;
    be.scratch = &scratch;
    ms_mita_params p = {GRID, GRID, TOPK, true};

    printf("\nC=%d heads=%d d=%d M=%d k=%d; median of repeats, L2 flushed before each\n", C_DIM,
           HEADS, C_DIM / HEADS, GRID * GRID, TOPK);
    printf("%8s %12s %12s %9s %14s %9s\n", "N", "MiTA ms", "full ms", "full/MiTA",
           "routed GB/s", "of copy");
    float stages[6][8];
    for (int si = 0; si < nsizes; si++) {
        int hp = sides[si][0], wp = sides[si][1], n = hp * wp;
        /* warm-up (module load, handles, cuBLAS heuristics) */
        MS(op_mita(&be, out, qkv, hp, wp, C_DIM, HEADS, &p, NULL));
        float t_mita = time_median(&b, &be, RUN_MITA, 7, out, qkv, hp, wp, &p);
        /* full attention: O(N^2); fewer repeats as N grows */
        int reps = n <= 16384 ? 5 : (n <= 65536 ? 3 : 1);
        if (n <= 65536) MS(op_attention_full(&be, out, qkv, n, C_DIM, HEADS));
        /* past --max-full-n: not run; printed as an N^2 extrapolation from
         * the largest size run, marked "~" */
        static float last_full = 0;
        static int last_full_n = 0;
        bool full_run = n <= max_full_n;
        float t_full = full_run ? time_median(&b, &be, RUN_FULL, reps, out, qkv, hp, wp, &p)
                       : last_full_n ? last_full * ((float)n / last_full_n) * ((float)n / last_full_n)
                                     : 0.0f;
        if (full_run) {
            last_full = t_full;
            last_full_n = n;
        }

        /* per-stage times (synchronising profile mode) and the routed
         * kernel's bytes: q rows, R rows, out rows, plus per block the
         * staged summaries and k key/value rows */
        ms_mita_record rec = {NULL, route, NULL};
        l2_flush(&b);
        mita_cuda_profile(stages[si]);
        MS(op_mita(&be, out, qkv, hp, wp, C_DIM, HEADS, &p, &rec));
        mita_cuda_profile(NULL);
        int32_t *hr = malloc((size_t)HEADS * n * 4);
        MS(cuda_copy_d2h(b.cu, hr, route, (size_t)HEADS * n * 4));
        MS(cuda_sync(b.cu));
        int M = GRID * GRID, d = C_DIM / HEADS;
        long blocks = 0;
        for (int hh = 0; hh < HEADS; hh++) {
            int cnt[64] = {0};
            for (int q = 0; q < n; q++) cnt[hr[(size_t)hh * n + q]]++;
            for (int e = 0; e < M; e++) blocks += (cnt[e] + 127) / 128;
        }
        free(hr);
        double bytes = 4.0 * ((double)n * C_DIM * 2 + (double)HEADS * n * M +
                              (double)blocks * (M * d + 2.0 * TOPK * d));
        double routed_bw = bytes / (stages[si][7] * 1e-3);
        printf("%8d %12.3f %11.3f%s %9.1f %14.0f %8.0f%%\n", n, t_mita, t_full,
               full_run ? " " : "~", t_full / t_mita, routed_bw / 1e9, 100.0 * routed_bw / bw);
    }
    printf("(~: full attention not run at this N, extrapolated as N^2 from the largest N run)\n");
    printf("\nMiTA per stage, ms (profile run):\n%8s", "N");
    for (int i = 0; i < 8; i++) printf(" %11s", stage_names[i]);
    printf("\n");
    for (int si = 0; si < nsizes; si++) {
        printf("%8d", sides[si][0] * sides[si][1]);
        for (int i = 0; i < 8; i++) printf(" %11.3f", stages[si][i]);
        printf("\n");
    }
    arena_free(&scratch);
    arena_free(&dev);
    CK(cudaFree(b.flush));
    cuda_ctx_free(b.cu);
    return 0;
}
#endif
