/* One attention layer on the CPU, side by side: MiTA (op_mita) against our
 * full attention (op_attention_full) and against OpenBLAS sgemm's rate on
 * GEMMs of the same layer (the qkv projection, (N, C) x (C, 3C), split over
 * the threads as the engine splits it) and on a 1024^3 GEMM, all in one
 * process, interleaved round by round. As in a layer, each attention reads
 * the qkv that the projection has just written (random x in [-1, 1), weights
 * scaled for q, k, v of about unit variance): a round is the projection,
 * MiTA, the 1024^3 GEMM, MiTA again ("mita_cold": its input and scratch
 * pushed out of the caches by that GEMM), the projection (untimed) and full
 * attention. The token grid is the squarest hp x wp with hp * wp = N.
 *
 * Rates are useful FLOPs per second: MiTA per head 2 N d (4 M + 2 k) (probe,
 * summaries, routing, shared output; routed logits and outputs), full
 * attention 4 N^2 d. Prints one JSON line per (heads, N) with min and median
 * ms and GF/s, then a Markdown table. --serve (for bench/bench_mita.py):
 * reads lines "N HEADS" and answers each with one JSON line of one timed
 * round, so a driver can interleave other contenders. --only W --spin R
 * runs item W R more times, untimed, after its timed rounds: a profile's
 * load. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <cblas.h>

#include "kernels/attention_full.h"
#include "kernels/gemm.h"
#include "kernels/mita.h"
#include "kernels/ops.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

typedef struct {
    int n, heads, d, c, hp, wp, k;
    ms_mita_params p;
    float *x /* (n, c) */, *wq /* (3c, c) */, *qkv /* (n, 3c) */, *out /* (n, c) */;
    float *ga, *gb, *gc; /* (1024, 1024) each */
    ms_arena arena;
    ms_backend be;
} layer;

enum { GEMM_SIDE = 1024 };

static void fill(float *x, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / 8388608.0f - 1.0f;
    }
}

static float *alloc_f(size_t n)
{
    float *p = ms_malloc(n * sizeof(float));
    if (!p) {
        fprintf(stderr, "bench_mita: out of memory (%zu floats)\n", n);
        exit(1);
    }
    return p;
}

static void layer_init(layer *l, int n, int heads, int d, int grid, int topk, int threads)
{
    memset(l, 0, sizeof *l);
    l->n = n, l->heads = heads, l->d = d, l->c = heads * d;
    l->hp = (int)sqrt((double)n);
    while (n % l->hp) l->hp--;
    l->wp = n / l->hp;
    l->p = (ms_mita_params){grid, grid, topk, true, 0};
    int gh, gw;
    mita_clamp(&gh, &gw, &l->k, l->hp, l->wp, &l->p);
    int c = l->c;
    l->x = alloc_f((size_t)n * c);
    l->wq = alloc_f((size_t)3 * c * c);
    l->qkv = alloc_f((size_t)n * 3 * c);
    l->out = alloc_f((size_t)n * c);
    fill(l->x, (size_t)n * c, 7u + (uint32_t)n);
    fill(l->wq, (size_t)3 * c * c, 11u);
    /* uniform [-1, 1) has variance 1/3: q, k, v = x W^T of variance 1 */
    for (size_t i = 0; i < (size_t)3 * c * c; i++) l->wq[i] *= sqrtf(3.0f / c) * sqrtf(3.0f);
    l->ga = alloc_f((size_t)GEMM_SIDE * GEMM_SIDE);
    l->gb = alloc_f((size_t)GEMM_SIDE * GEMM_SIDE);
    l->gc = alloc_f((size_t)GEMM_SIDE * GEMM_SIDE);
    fill(l->ga, (size_t)GEMM_SIDE * GEMM_SIDE, 3u);
    fill(l->gb, (size_t)GEMM_SIDE * GEMM_SIDE, 5u);
    size_t a = mita_scratch_bytes(l->hp, l->wp, 0, c, heads, gh, gw, l->k, threads);
    size_t b = attention_full_scratch_floats(n, c, MS_ATTN_QB, MS_ATTN_KB, threads) * sizeof(float);
    if (arena_init(&l->arena, (a > b ? a : b) + 4096, MS_DEVICE_CPU) != MS_OK) {
        fprintf(stderr, "bench_mita: %s\n", ms_last_error());
        exit(1);
    }
    l->be = (ms_backend){.device = MS_DEVICE_CPU, .threads = threads, .scratch = &l->arena};
}

static void layer_free(layer *l)
{
    ms_free(l->x), ms_free(l->wq), ms_free(l->qkv), ms_free(l->out);
    ms_free(l->ga), ms_free(l->gb), ms_free(l->gc);
    arena_free(&l->arena);
}

static double flops_mita(const layer *l)
{
    int m = l->p.gh * l->p.gw < l->n ? l->p.gh * l->p.gw : l->n; /* after the clamp */
    return 2.0 * l->n * l->d * (4.0 * m + 2.0 * l->k) * l->heads;
}
static double flops_full(const layer *l) { return 4.0 * l->n * (double)l->n * l->d * l->heads; }
static double flops_qkv(const layer *l) { return 2.0 * l->n * (double)l->c * 3 * l->c; }
static double flops_sq(void) { return 2.0 * GEMM_SIDE * GEMM_SIDE * (double)GEMM_SIDE; }

enum { T_MITA, T_FULL, T_QKV, T_SQ, T_MITA_COLD, N_TIMED };
static const char *const timed_names[N_TIMED] = {"mita", "full", "gemm_qkv", "gemm_1024",
                                                 "mita_cold"};

/* One timed run of item `which`; ms. */
static double run_one(layer *l, int which)
{
    double t0 = now_ms();
    ms_status st = MS_OK;
    switch (which) {
    case T_MITA:
    case T_MITA_COLD:
        st = op_mita(&l->be, l->out, l->qkv, l->hp, l->wp, l->c, l->heads, &l->p, NULL);
        break;
    case T_FULL: st = op_attention_full(&l->be, l->out, l->qkv, l->n, l->c, l->heads); break;
    case T_QKV: /* the layer's projection: writes the attention's input */
        gemm_cpu(l->qkv, l->x, l->wq, l->n, 3 * l->c, l->c, false, true, l->c, l->c, 3 * l->c,
                 1.0f, 0.0f);
        break;
    default:
        gemm_cpu(l->gc, l->ga, l->gb, GEMM_SIDE, GEMM_SIDE, GEMM_SIDE, false, false, GEMM_SIDE,
                 GEMM_SIDE, GEMM_SIDE, 1.0f, 0.0f);
    }
    if (st != MS_OK) {
        fprintf(stderr, "bench_mita: %s\n", ms_last_error());
        exit(1);
    }
    return now_ms() - t0;
}

/* One round (see the top), or `only` alone, back to back; t[w] and ran[w]
 * for each item timed. with_full: full attention too. */
static void run_round(layer *l, int only, bool with_full, double *t /* (N_TIMED) */,
                      bool *ran /* (N_TIMED) */)
{
    static const int order[] = {T_QKV, T_MITA, T_SQ, T_MITA_COLD, T_FULL};
    for (int w = 0; w < N_TIMED; w++) ran[w] = false;
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        int w = order[i];
        if ((only >= 0 && w != only) || (w == T_FULL && !with_full)) continue;
        if (w == T_FULL && only < 0) run_one(l, T_QKV); /* its own fresh input */
        t[w] = run_one(l, w);
        ran[w] = true;
    }
}

static double flops_of(const layer *l, int which)
{
    return which == T_MITA || which == T_MITA_COLD ? flops_mita(l)
           : which == T_FULL ? flops_full(l)
           : which == T_QKV  ? flops_qkv(l)
                             : flops_sq();
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int parse_list(int *out, int max, const char *s)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1 << 24) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

typedef struct {
    double min[N_TIMED], med[N_TIMED];
    int runs[N_TIMED];
} result;

int main(int argc, char **argv)
{
    int ns[16] = {1024, 4096, 16384}, hs[16] = {3, 6}, nn = 3, nh = 2;
    int d = 64, grid = 7, topk = 49, threads = 2, repeat = 7, full_repeat = -1, spin = 0;
    long full_max = 1L << 30;
    bool serving = false;
    int only = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--n") && v) nn = parse_list(ns, 16, v), i++;
        else if (!strcmp(a, "--heads") && v) nh = parse_list(hs, 16, v), i++;
        else if (!strcmp(a, "--d") && v) d = atoi(v), i++;
        else if (!strcmp(a, "--grid") && v) grid = atoi(v), i++;
        else if (!strcmp(a, "--topk") && v) topk = atoi(v), i++;
        else if (!strcmp(a, "--threads") && v) threads = atoi(v), i++;
        else if (!strcmp(a, "--repeat") && v) repeat = atoi(v), i++;
        else if (!strcmp(a, "--full-repeat") && v) full_repeat = atoi(v), i++;
        else if (!strcmp(a, "--full-max") && v) full_max = atol(v), i++;
        else if (!strcmp(a, "--spin") && v) spin = atoi(v), i++;
        else if (!strcmp(a, "--serve")) serving = true;
        else if (!strcmp(a, "--only") && v) {
            for (int w = 0; w < N_TIMED; w++)
                if (!strcmp(v, timed_names[w])) only = w;
            if (only < 0) return 2;
            i++;
        }
        else {
            fprintf(stderr,
                    "usage: bench_mita [--n 1024,4096,16384] [--heads 3,6] [--d 64] [--grid 7]"
                    " [--topk 49] [--threads 2] [--repeat 7] [--full-repeat R] [--full-max N]"
                    " [--only mita|full|gemm_qkv|gemm_1024|mita_cold [--spin R]] [--serve]\n");
            return 2;
        }
    }
    if (nn < 1 || nh < 1 || d < 1 || grid < 1 || topk < 1 || threads < 1 || repeat < 1 ||
        spin < 0 || (spin && only < 0)) {
        fprintf(stderr, "bench_mita: bad arguments\n");
        return 2;
    }
    if (full_repeat < 0) full_repeat = repeat;
#ifdef _OPENMP
    omp_set_num_threads(threads); /* gemm_cpu's split */
#endif
    gemm_init_threads();

    if (serving) {
        printf("{\"ready\": true, \"openblas\": \"%s\", \"core\": \"%s\", \"threads\": %d}\n",
               openblas_get_config(), openblas_get_corename(), threads);
        fflush(stdout);
        char line[256];
        int n, h;
        while (fgets(line, sizeof line, stdin) && sscanf(line, "%d %d", &n, &h) == 2) {
            layer l;
            layer_init(&l, n, h, d, grid, topk, threads);
            double t[N_TIMED];
            bool ran[N_TIMED];
            run_round(&l, -1, false, t, ran); /* warm-up: arena pages, caches */
            run_round(&l, -1, n <= full_max, t, ran);
            printf("{\"n\": %d, \"heads\": %d", n, h);
            for (int w = 0; w < N_TIMED; w++)
                if (ran[w]) printf(", \"%s_ms\": %.3f", timed_names[w], t[w]);
            printf("}\n");
            fflush(stdout);
            layer_free(&l);
        }
        return 0;
    }

    result res[16][16];
    memset(res, 0, sizeof res);
    for (int hi = 0; hi < nh; hi++)
        for (int ni = 0; ni < nn; ni++) {
            layer l;
            layer_init(&l, ns[ni], hs[hi], d, grid, topk, threads);
            double t[N_TIMED][64];
            int cnt[N_TIMED] = {0};
            int reps = repeat > 64 ? 64 : repeat;
            double tr[N_TIMED];
            bool ran[N_TIMED];
            run_one(&l, T_QKV);                  /* the input */
            run_round(&l, only, false, tr, ran); /* warm-up: arena pages, caches */
            for (int r = 0; r < reps; r++) {
                run_round(&l, only, l.n <= full_max && r < full_repeat, tr, ran);
                for (int w = 0; w < N_TIMED; w++)
                    if (ran[w]) t[w][cnt[w]++] = tr[w];
            }
            for (int r = 0; r < spin; r++) run_one(&l, only); /* for a profiler, untimed */
            result *o = &res[hi][ni];
            printf("{\"n\": %d, \"heads\": %d, \"d\": %d, \"m\": %d, \"k\": %d, \"threads\": %d",
                   l.n, l.heads, d, l.p.gh * l.p.gw, l.k, threads);
            for (int w = 0; w < N_TIMED; w++) {
                o->runs[w] = cnt[w];
                if (!cnt[w]) continue;
                qsort(t[w], cnt[w], sizeof(double), cmp_d);
                o->min[w] = t[w][0];
                o->med[w] = median(t[w], cnt[w]);
                printf(", \"%s\": {\"runs\": %d, \"min_ms\": %.3f, \"median_ms\": %.3f, "
                       "\"gflops_at_min\": %.2f}",
                       timed_names[w], cnt[w], o->min[w], o->med[w],
                       flops_of(&l, w) / o->min[w] / 1e6);
            }
            printf("}\n");
            fflush(stdout);
            layer_free(&l);
        }

    printf("\n| heads | N | MiTA ms min / med | GF/s | full ms min / med | GF/s | full / MiTA |"
           " sgemm qkv GF/s | sgemm 1024^3 GF/s | MiTA / qkv-GEMM rate | cold MiTA ms min |"
           " cold / qkv rate |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int hi = 0; hi < nh; hi++)
        for (int ni = 0; ni < nn; ni++) {
            layer l = {.n = ns[ni], .heads = hs[hi], .d = d, .c = hs[hi] * d,
                       .k = topk < ns[ni] ? topk : ns[ni]};
            l.p.gh = l.p.gw = grid;
            const result *o = &res[hi][ni];
            if (!o->runs[T_MITA] || !o->runs[T_QKV] || !o->runs[T_SQ] || !o->runs[T_MITA_COLD])
                continue;
            double g_m = flops_mita(&l) / o->min[T_MITA] / 1e6;
            double g_q = flops_qkv(&l) / o->min[T_QKV] / 1e6;
            printf("| %d | %d | %.2f / %.2f | %.1f | ", l.heads, l.n, o->min[T_MITA],
                   o->med[T_MITA], g_m);
            if (o->runs[T_FULL])
                printf("%.1f / %.1f | %.1f | %.1fx | ", o->min[T_FULL], o->med[T_FULL],
                       flops_full(&l) / o->min[T_FULL] / 1e6, o->min[T_FULL] / o->min[T_MITA]);
            else
                printf("- | - | - | ");
            double g_c = flops_mita(&l) / o->min[T_MITA_COLD] / 1e6;
            printf("%.1f | %.1f | %.0f %% | %.2f | %.0f %% |\n", g_q,
                   flops_sq() / o->min[T_SQ] / 1e6, 100.0 * g_m / g_q, o->min[T_MITA_COLD],
                   100.0 * g_c / g_q);
        }
    return 0;
}
