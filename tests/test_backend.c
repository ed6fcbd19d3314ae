/* Backend test, as ggml's test-backend-ops: every op on CUDA against its CPU
 * twin on random inputs of several shapes (odd sizes, n not a multiple of the
 * kernels' tiles, k >= n, experts that receive no query), in FP32 mode
 * against the plain CPU and in the tensor-core mode against the CPU with the
 * same operand rounding (ms_backend.tc_round). Every device output is
 * poisoned (NaN, -1) before every launch. Without CUDA in the build, or
 * without a GPU on the machine, it prints why and exits 77 (skipped); with a
 * GPU present (ms_gpu_present) any failure to use it is a failure (exit 1).
 * MS_BACKEND_SMALL=1 keeps small shapes only (for compute-sanitizer). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/engine.h"
#include "app/model_file.h"
#include "app/selftest.h"
#include "kernels/mita_cuda_math.h" /* mita_landmark_value: exact-score references */
#include "kernels/ops.h"
#include "tests/testutil.h"

#ifdef MS_HAVE_CUDA
#include "kernels/cuda_ctx.h"

/* Tolerances, normwise: max|gpu - cpu| <= tol * max|cpu| (elementwise
 * relative error is meaningless near zeros).
 * FP32: 1e-4 (the bound; only summation orders differ, ~1e-6 seen
 * in the CPU emulation of the kernels).
 * Tensor-core mode against the CPU with the same rounding (tc_round): every
 * GEMM op rounds its operands with our own kernels before the library sees
 * them (linear to BF16 storage; conv2d to TF32 and conv_transpose2x2 to BF16
 * values kept in FP32, so cuDNN's and cuBLAS's own conversion, whose rounding
 * NVIDIA does not document, is exact), as the CPU does; only FP32
 * accumulation order differs: TOL_TC. Ops without a GEMM are FP32 in both
 * modes.
 * BF16 against the plain CPU (only the weight-cache case, whose two weights
 * differ by O(1)): operand rounding 2^-8 per operand, ~2u normwise = 8e-3,
 * 3e-2 with a margin for the maximum over many outputs. */
#define TOL_FP32 1e-4
#define TOL_BF16 3e-2
#define TOL_TC 1e-4

static ms_cuda_ctx *g_cu;
static ms_arena g_dev;     /* test tensors */
static ms_arena g_scratch; /* op scratch, as the engine's activation arena */
static bool g_small;

static ms_backend cpu_be(void)
{
    ms_backend be;
    memset(&be, 0, sizeof be);
    be.device = MS_DEVICE_CPU;
    backend_set_threads(&be, 0);
    return be;
}

/* The CPU reference for a GPU mode: mode 0 (FP32) plain, mode 1 (tensor
 * cores) with the same operand rounding. */
static ms_backend cpu_ref(int mode)
{
    ms_backend be = cpu_be();
    be.tc_round = mode == 1;
    return be;
}

static ms_backend gpu_be(bool fp32)
{
    ms_backend be;
    memset(&be, 0, sizeof be);
    be.device = MS_DEVICE_CUDA;
    be.fp32 = fp32;
    be.cuda = g_cu;
    be.scratch = &g_scratch;
    return be;
}

static void *dalloc(size_t bytes)
{
    void *p = arena_alloc(&g_dev, bytes);
    ck_assert_msg(p != NULL, "device arena: %s", ms_last_error());
    return p;
}

static float *dput(const float *h, size_t n)
{
    float *d = dalloc(n * sizeof(float));
    ck_assert_msg(cuda_copy_h2d(g_cu, d, h, n * sizeof(float)) == MS_OK, "%s", ms_last_error());
    return d;
}

static void dget(void *h, const void *d, size_t bytes)
{
    ck_assert_msg(cuda_copy_d2h(g_cu, h, d, bytes) == MS_OK, "%s", ms_last_error());
    ck_assert_msg(cuda_sync(g_cu) == MS_OK, "%s", ms_last_error());
}

/* Poison a device output before a launch: 0xFF bytes are NaN floats and -1
 * indices, so an element the kernel did not write fails the comparison (and
 * a result left from an earlier launch cannot pass for a new one). */
static void dpoison(void *d, size_t bytes)
{
    ck_assert_msg(cuda_fill_bytes(g_cu, d, 0xFF, bytes) == MS_OK, "%s", ms_last_error());
}

static float *hrand(size_t n, uint32_t seed, float lo, float hi)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(x);
    rand_fill(x, n, seed, lo, hi);
    return x;
}

/* Poison so that an element the kernel forgot to write shows up. */
static float *hpoison(size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(x);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

static void check_close(const float *got, const float *ref, size_t n, double tol,
                        const char *what)
{
    double err = max_abs_diff(got, ref, n), scale = max_abs(ref, n);
    if (scale < 1e-30) scale = 1e-30;
    ck_assert_msg(err <= tol * scale, "%s: max abs diff %g > %g * max|ref| %g", what, err, tol,
                  scale);
}

#define OK(call) ck_assert_msg((call) == MS_OK, "%s: %s", #call, ms_last_error())

/* Runs one float-output op on both backends: cpu_call/gpu_call fill out. */
#define BOTH_MODES for (int mode = 0; mode < 2; mode++)

/* Outside FP32 mode the BF16 copy of a weight is made once, at its first
 * use, and kept (weights do not change while an engine lives): rewriting the
 * weight in place still gives the old product, FP32 mode (no copy) the new
 * one at once, and after cuda_ctx_forget_weights the BF16 mode too. The two
 * random weights differ by O(1) per entry, far beyond the tolerances. */
static void linear_weight_cache_case(const float *din, float *dw, const float *db, float *dout,
                                     const float *in /* (n, cin) */, const float *b, int n,
                                     int cin, int cout)
{
    size_t no = (size_t)n * cout, nw = (size_t)cout * cin;
    float *w1 = malloc(nw * sizeof(float)), *w2 = hrand(nw, 40, -1, 1);
    float *ref1 = malloc(no * sizeof(float)), *ref2 = malloc(no * sizeof(float));
    float *got = hpoison(no);
    ck_assert_ptr_nonnull(w1);
    ck_assert_ptr_nonnull(ref1);
    ck_assert_ptr_nonnull(ref2);
    dget(w1, dw, nw * sizeof(float));
    ms_backend cb = cpu_be(), bf = gpu_be(false), f32 = gpu_be(true);
    OK(op_linear(&cb, ref1, in, w1, b, n, cin, cout, MS_ACT_NONE, false));
    OK(op_linear(&cb, ref2, in, w2, b, n, cin, cout, MS_ACT_NONE, false));
    OK(cuda_copy_h2d(g_cu, dw, w2, nw * sizeof(float)));
    dpoison(dout, no * sizeof(float));
    OK(op_linear(&bf, dout, din, dw, db, n, cin, cout, MS_ACT_NONE, false));
    dget(got, dout, no * sizeof(float));
    check_close(got, ref1, no, TOL_BF16, "linear bf16, weight rewritten: cached copy");
    dpoison(dout, no * sizeof(float));
    OK(op_linear(&f32, dout, din, dw, db, n, cin, cout, MS_ACT_NONE, false));
    dget(got, dout, no * sizeof(float));
    check_close(got, ref2, no, TOL_FP32, "linear fp32, weight rewritten");
    OK(cuda_ctx_forget_weights(g_cu));
    dpoison(dout, no * sizeof(float));
    OK(op_linear(&bf, dout, din, dw, db, n, cin, cout, MS_ACT_NONE, false));
    dget(got, dout, no * sizeof(float));
    check_close(got, ref2, no, TOL_BF16, "linear bf16 after cuda_ctx_forget_weights");
    free(w1); free(w2); free(ref1); free(ref2); free(got);
}

START_TEST(test_linear)
{
    const int shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {65, 96, 130}, {197, 384, 1152}};
    for (size_t si = 0; si < 4; si++) {
        int n = shapes[si][0], cin = shapes[si][1], cout = shapes[si][2];
        if (g_small && si == 3) continue;
        size_t mark = arena_mark(&g_dev);
        float *in = hrand((size_t)n * cin, 1 + (uint32_t)si, -1, 1);
        float *w = hrand((size_t)cout * cin, 2 + (uint32_t)si, -1, 1);
        float *b = hrand((size_t)cout, 3 + (uint32_t)si, -1, 1);
        float *res = hrand((size_t)n * cout, 4 + (uint32_t)si, -1, 1);
        float *ref = malloc((size_t)n * cout * sizeof(float)), *got = hpoison((size_t)n * cout);
        float *din = dput(in, (size_t)n * cin), *dw = dput(w, (size_t)cout * cin),
              *db = dput(b, (size_t)cout), *dout = dalloc((size_t)n * cout * sizeof(float));
        for (int act = 0; act < 3; act++)
            for (int withb = 0; withb < 2; withb++)
                for (int resid = 0; resid < 2; resid++) {
                    if (resid && act) continue;
                    BOTH_MODES
                    {
                        ms_backend gb = gpu_be(mode == 0), cb = cpu_ref(mode);
                        size_t smark = arena_mark(&g_scratch);
                        memcpy(ref, res, (size_t)n * cout * sizeof(float));
                        if (resid) /* out += in w^T + b: out starts as res */
                            OK(cuda_copy_h2d(g_cu, dout, res, (size_t)n * cout * sizeof(float)));
                        else
                            dpoison(dout, (size_t)n * cout * sizeof(float));
                        OK(op_linear(&cb, ref, in, w, withb ? b : NULL, n, cin, cout,
                                     (ms_act)act, resid));
                        OK(op_linear(&gb, dout, din, dw, withb ? db : NULL, n, cin, cout,
                                     (ms_act)act, resid));
                        dget(got, dout, (size_t)n * cout * sizeof(float));
                        char what[96];
                        snprintf(what, sizeof what, "linear %dx%dx%d act %d b %d res %d %s", n,
                                 cin, cout, act, withb, resid, mode ? "bf16" : "fp32");
                        check_close(got, ref, (size_t)n * cout, mode ? TOL_TC : TOL_FP32, what);
                        /* the op gives its scratch (the BF16 input) back */
                        ck_assert_uint_eq(arena_mark(&g_scratch), smark);
                    }
                }
        if (si == 2) linear_weight_cache_case(din, dw, db, dout, in, b, n, cin, cout);
        /* the next shape's weights may land at dw: drop its BF16 copy */
        OK(cuda_ctx_forget_weights(g_cu));
        free(in); free(w); free(b); free(res); free(ref); free(got);
        arena_reset(&g_dev, mark);
    }
    /* The engine's dry run counts the scratch: the input's BF16 copy outside
     * FP32 mode (256-byte aligned, as every arena block), none in FP32 mode. */
    for (int mode = 0; mode < 2; mode++) {
        ms_arena sizing;
        memset(&sizing, 0, sizeof sizing);
        sizing.device = MS_DEVICE_CUDA;
        arena_begin_sizing(&sizing);
        ms_backend gb = gpu_be(mode == 0);
        gb.scratch = &sizing;
        gb.dry_run = true;
        OK(op_linear(&gb, NULL, NULL, NULL, NULL, 197, 385, 7, MS_ACT_NONE, false));
        ck_assert_uint_eq(sizing.high, mode ? (197 * 385 * 2 + 255) / 256 * 256 : 0);
        ck_assert_uint_eq(sizing.used, 0);
        arena_free(&sizing);
    }
}
END_TEST

START_TEST(test_layernorm_add_transpose_softmax)
{
    ms_backend cb = cpu_be(), gb = gpu_be(true);
    const int shapes[][2] = {{1, 1}, {7, 384}, {33, 1000}, {3, 4097}};
    for (size_t si = 0; si < 4; si++) {
        int n = shapes[si][0], c = shapes[si][1];
        size_t nc = (size_t)n * c, mark = arena_mark(&g_dev);
        /* a large mean, as in ViT residual streams */
        float *x = hrand(nc, 10 + (uint32_t)si, 20.0f, 24.0f), *y = hrand(nc, 20 + (uint32_t)si, -3, 3);
        float *w = hrand((size_t)c, 30, 0.5f, 1.5f), *b = hrand((size_t)c, 31, -1, 1);
        float *ref = malloc(nc * sizeof(float)), *got = hpoison(nc);
        float *dx = dput(x, nc), *dy = dput(y, nc), *dw = dput(w, (size_t)c), *db = dput(b, (size_t)c);
        float *dout = dalloc(nc * sizeof(float));

        OK(op_layernorm(&cb, ref, x, w, b, n, c, 1e-6f));
        dpoison(dout, nc * sizeof(float));
        OK(op_layernorm(&gb, dout, dx, dw, db, n, c, 1e-6f));
        dget(got, dout, nc * sizeof(float));
        check_close(got, ref, nc, TOL_FP32, "layernorm");

        OK(op_add(&cb, ref, x, y, nc));
        dpoison(dout, nc * sizeof(float));
        OK(op_add(&gb, dout, dx, dy, nc));
        dget(got, dout, nc * sizeof(float));
        check_close(got, ref, nc, TOL_FP32, "add");
        OK(op_add(&gb, dx, dx, dy, nc)); /* out aliases a */
        dget(got, dx, nc * sizeof(float));
        check_close(got, ref, nc, TOL_FP32, "add in place");

        OK(op_transpose(&cb, ref, y, n, c));
        dpoison(dout, nc * sizeof(float));
        OK(op_transpose(&gb, dout, dy, n, c));
        dget(got, dout, nc * sizeof(float));
        check_close(got, ref, nc, 0.0, "transpose");

        memcpy(ref, y, nc * sizeof(float));
        OK(op_softmax_rows(&cb, ref, n, c));
        OK(op_softmax_rows(&gb, dy, n, c));
        dget(got, dy, nc * sizeof(float));
        check_close(got, ref, nc, TOL_FP32, "softmax_rows");
        free(x); free(y); free(w); free(b); free(ref); free(got);
        arena_reset(&g_dev, mark);
    }
}
END_TEST

START_TEST(test_attention_full)
{
    /* d = 8 (generic path), 64, 32, 128, 256, 24; n below, at and past the
     * tiles. The small set (sanitizers) keeps d <= 128 at small n: racecheck
     * instruments every shared-memory access of the key tiles. */
    const int shapes[][4] = {{1, 8, 1, 1},     {13, 24, 3, 1},   {130, 64, 1, 1},
                             {40, 128, 1, 1},  {257, 128, 4, 0}, {200, 256, 2, 0},
                             {1000, 384, 6, 0}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int n = shapes[si][0], c = shapes[si][1], heads = shapes[si][2];
        if (g_small && !shapes[si][3]) continue;
        size_t mark = arena_mark(&g_dev), nq = (size_t)n * 3 * c, no = (size_t)n * c;
        float *qkv = hrand(nq, 40 + (uint32_t)si, -2, 2);
        float *ref = malloc(no * sizeof(float)), *got = hpoison(no), *got0 = hpoison(no);
        float *dqkv = dput(qkv, nq), *dout = dalloc(no * sizeof(float));
        ms_backend cb = cpu_be();
        OK(op_attention_full(&cb, ref, qkv, n, c, heads));
        /* The flash kernel is FP32 CUDA-core code in both modes (memory- and
         * softmax-bound at these head dims): mode 1 must give mode 0's bits. */
        BOTH_MODES
        {
            ms_backend gb = gpu_be(mode == 0);
            dpoison(dout, no * sizeof(float));
            OK(op_attention_full(&gb, dout, dqkv, n, c, heads));
            dget(mode ? got : got0, dout, no * sizeof(float));
        }
        check_close(got0, ref, no, TOL_FP32, "attention_full");
        ck_assert_msg(memcmp(got, got0, no * sizeof(float)) == 0,
                      "attention_full shape %zu: tensor-core mode differs from FP32 mode", si);
        free(qkv); free(ref); free(got); free(got0);
        arena_reset(&g_dev, mark);
    }
}
END_TEST

typedef struct {
    int hp, wp, c, heads, gh, gw, k;
    bool shd;
    bool small; /* in the sanitizers' small set */
} mita_case;

/* Exact-score references in double for judging near-ties: P (heads, m, n)
 * and R (heads, n, m) from the landmarks both implementations compute
 * identically (mita_landmark_value). */
static void mita_scores_ref(double *pd, double *rd, const float *qkv, const mita_case *t)
{
    int n = t->hp * t->wp, m = t->gh * t->gw, c = t->c, d = c / t->heads;
    float *land = malloc((size_t)m * c * sizeof(float));
    ck_assert_ptr_nonnull(land);
    for (int mi = 0; mi < m; mi++)
        for (int ch = 0; ch < c; ch++)
            land[(size_t)mi * c + ch] = mita_landmark_value(qkv, t->hp, t->wp, 3 * c, ch,
                                                            mi / t->gw, mi % t->gw, t->gh, t->gw);
    for (int h = 0; h < t->heads; h++)
        for (int mi = 0; mi < m; mi++)
            for (int j = 0; j < n; j++) {
                const float *l = land + (size_t)mi * c + h * d;
                const float *q = qkv + (size_t)j * 3 * c + h * d, *k = q + c;
                double pk = 0, pq = 0;
                for (int i = 0; i < d; i++) {
                    pk += (double)l[i] * k[i];
                    pq += (double)l[i] * q[i];
                }
                pd[((size_t)h * m + mi) * n + j] = pk;
                rd[((size_t)h * n + j) * m + mi] = pq;
            }
    free(land);
}

/* Two FP32 GEMMs (cuBLAS, OpenBLAS) round differently (~1e-7 relative), so a
 * pair of scores closer than that may order either way. Decisions are
 * compared exactly, except where the two choices' exact scores are within
 * MITA_TIE of the row's range: such a near-tie is accepted (and counted),
 * and the queries it touches (routed to an expert whose set differs, or
 * routed differently) are left out of the output comparison. */
#define MITA_TIE 1e-5

START_TEST(test_mita)
{
    const mita_case cases[] = {
        {5, 7, 16, 2, 3, 3, 4, true, true},       /* d = 8, generic kernel */
        {2, 3, 8, 1, 2, 2, 6, false, true},       /* k = n */
        {9, 11, 128, 2, 7, 7, 49, true, true},    /* d = 64, default M and k, empty experts */
        {13, 10, 96, 3, 4, 5, 17, false, true},   /* d = 32, overlapping windows */
        {25, 40, 384, 3, 7, 7, 100, true, false}, /* d = 128, n = 1000, key tiles */
        {1, 1, 4, 1, 1, 1, 1, true, true},        /* one token */
        {50, 100, 16, 1, 2, 2, 4500, false, false}, /* k > MS_TOPK_SMEM: rank-sort path */
        {64, 64, 384, 6, 7, 7, 49, true, false},  /* n = 4096, DeiT-S width */
        {16, 16, 256, 1, 16, 15, 30, true, false}, /* d = 256, M x d > any device's shared
                                                     memory: summaries staged in tiles */
        {65, 70, 32, 2, 7, 7, 49, false, false},  /* n = 4550 > 4096: split-N summary GEMMs */
        {32, 32, 128, 2, 32, 32, 49, true, false}, /* 32x32 landmarks at d = 64: tiled summaries */
        {6, 7, 128, 1, 2, 2, 5, true, true},      /* d = 128 at a size racecheck gets through */
    };
    int ncases = (int)(sizeof cases / sizeof cases[0]);
    int empty = 0;
    for (int ci = 0; ci < ncases; ci++) {
        const mita_case *t = &cases[ci];
        /* racecheck (small shapes) would crawl through the staged summaries of
         * the tiled cases' ~200 blocks, and through d = 128's key tiles at n = 1000 */
        if (g_small && !t->small) continue;
        int n = t->hp * t->wp, m = t->gh * t->gw, H = t->heads, k = t->k, d = t->c / H;
        size_t mark = arena_mark(&g_dev), nq = (size_t)n * 3 * t->c, no = (size_t)n * t->c;
        size_t ntk = (size_t)H * m * k, nr = (size_t)H * n;
        float *qkv = hrand(nq, 60 + (uint32_t)ci, -1.5f, 1.5f);
        float *ref = malloc(no * sizeof(float)), *got = hpoison(no);
        float *rmass = malloc(nr * sizeof(float)), *gmass = hpoison(nr);
        int32_t *rtopk = malloc(ntk * 4), *gtopk = malloc(ntk * 4);
        int32_t *rroute = malloc(nr * 4), *groute = malloc(nr * 4);
        double *pd = malloc((size_t)H * m * n * sizeof(double));
        double *rd = malloc((size_t)H * n * m * sizeof(double));
        uint8_t *skip = calloc(nr, 1), *set_differs = calloc((size_t)H * m, 1);
        char *mark_tk = calloc((size_t)n, 1);
        ck_assert(ref && rmass && rtopk && gtopk && rroute && groute && pd && rd && skip &&
                  set_differs && mark_tk);
        mita_scores_ref(pd, rd, qkv, t);
        ms_mita_params p = {t->gh, t->gw, k, t->shd};
        ms_backend cb = cpu_be();
        ms_mita_record rrec = {rtopk, rroute, rmass};
        OK(op_mita(&cb, ref, qkv, t->hp, t->wp, t->c, H, &p, &rrec));

        float *dqkv = dput(qkv, nq), *dout = dalloc(no * 4), *dmass = dalloc(nr * 4);
        int32_t *dtopk = dalloc(ntk * 4), *droute = dalloc(nr * 4);
        /* mode 0's results, which mode 1 must reproduce bit for bit */
        float *out0 = malloc(no * 4), *mass0 = malloc(nr * 4);
        int32_t *topk0 = malloc(ntk * 4), *route0 = malloc(nr * 4);
        ck_assert(out0 && mass0 && topk0 && route0);
        BOTH_MODES
        {
            ms_backend gb = gpu_be(mode == 0);
            ms_mita_record grec = {dtopk, droute, dmass};
            dpoison(dout, no * 4);
            dpoison(dmass, nr * 4);
            dpoison(dtopk, ntk * 4);
            dpoison(droute, nr * 4);
            OK(op_mita(&gb, dout, dqkv, t->hp, t->wp, t->c, H, &p, &grec));
            dget(got, dout, no * sizeof(float));
            dget(gmass, dmass, nr * sizeof(float));
            dget(gtopk, dtopk, ntk * 4);
            dget(groute, droute, nr * 4);
            /* MiTA is FP32 in both modes (kernels/mita.cu: memory-bound GEMMs,
             * BF16 would save nothing and move the decisions): mode 1 runs the
             * same code and must give mode 0's bits (cuBLAS is deterministic
             * for a given handle, stream and shape). */
            if (mode == 0) {
                memcpy(out0, got, no * 4);
                memcpy(mass0, gmass, nr * 4);
                memcpy(topk0, gtopk, ntk * 4);
                memcpy(route0, groute, nr * 4);
            } else {
                ck_assert_msg(!memcmp(out0, got, no * 4) && !memcmp(mass0, gmass, nr * 4) &&
                                  !memcmp(topk0, gtopk, ntk * 4) && !memcmp(route0, groute, nr * 4),
                              "mita case %d: tensor-core mode differs from FP32 mode", ci);
            }
            int ties = 0;
            memset(set_differs, 0, (size_t)H * m);
            memset(skip, 0, nr);
            for (int r = 0; r < H * m; r++) {
                const double *prow = pd + (size_t)r * n;
                double scale = 1e-30;
                for (int j = 0; j < n; j++) scale = fmax(scale, fabs(prow[j]));
                const int32_t *g = gtopk + (size_t)r * k, *c = rtopk + (size_t)r * k;
                memset(mark_tk, 0, (size_t)n);
                for (int j = 0; j < k; j++) {
                    ck_assert_msg(g[j] >= 0 && g[j] < n && !mark_tk[g[j]],
                                  "case %d row %d: topk[%d] = %d invalid or repeated", ci, r, j,
                                  g[j]);
                    mark_tk[g[j]] = 1;
                    if (g[j] == c[j]) continue;
                    ck_assert_msg(fabs(prow[g[j]] - prow[c[j]]) <= MITA_TIE * scale,
                                  "case %d mode %d row %d rank %d: gpu %d (%.9g) cpu %d (%.9g)",
                                  ci, mode, r, j, g[j], prow[g[j]], c[j], prow[c[j]]);
                    ties++;
                }
                for (int j = 0; j < k; j++) set_differs[r] |= !mark_tk[c[j]];
            }
            int flips = 0;
            for (size_t i = 0; i < nr; i++) {
                int h = (int)(i / n);
                if (groute[i] != rroute[i]) {
                    const double *rrow = rd + i * m;
                    double scale = 1e-30;
                    for (int e = 0; e < m; e++) scale = fmax(scale, fabs(rrow[e]));
                    ck_assert_msg(groute[i] >= 0 && groute[i] < m &&
                                      fabs(rrow[groute[i]] - rrow[rroute[i]]) <= MITA_TIE * scale,
                                  "case %d mode %d: route[%zu] gpu %d cpu %d", ci, mode, i,
                                  groute[i], rroute[i]);
                    flips++;
                    skip[i] = 1;
                }
                if (set_differs[h * m + rroute[i]]) skip[i] = 1;
            }
            size_t skipped = 0;
            for (size_t i = 0; i < nr; i++) skipped += skip[i];
            ck_assert_msg(skipped * 100 <= nr, "case %d: %zu of %zu queries touched by near-ties",
                          ci, skipped, nr);
            if (ties || flips)
                printf("mita case %d mode %d: %d near-tie rank swaps, %d near-tie route flips, "
                       "%zu queries not compared\n", ci, mode, ties, flips, skipped);
            /* compare the (query, head) slices the near-ties did not touch */
            for (size_t i = 0; i < nr; i++) {
                int h = (int)(i / n), q = (int)(i % n);
                if (skip[i]) {
                    memcpy(got + (size_t)q * t->c + h * d, ref + (size_t)q * t->c + h * d,
                           (size_t)d * sizeof(float));
                    gmass[i] = rmass[i];
                }
            }
            check_close(got, ref, no, TOL_FP32, "mita out");
            check_close(gmass, rmass, nr, TOL_FP32, "mita shared mass");
            /* without records: the same output */
            float *dout2 = dalloc(no * 4);
            dpoison(dout2, no * 4);
            OK(op_mita(&gb, dout2, dqkv, t->hp, t->wp, t->c, H, &p, NULL));
            float *got2 = malloc(no * sizeof(float));
            dget(got2, dout2, no * sizeof(float));
            dget(got, dout, no * sizeof(float));
            ck_assert_msg(memcmp(got, got2, no * sizeof(float)) == 0,
                          "case %d: output differs without records", ci);
            free(got2);
        }
        /* count experts that no query chose */
        for (int h = 0; h < H; h++)
            for (int e = 0; e < m; e++) {
                int cnt = 0;
                for (int q = 0; q < n; q++) cnt += rroute[(size_t)h * n + q] == e;
                empty += cnt == 0;
            }
        free(qkv); free(ref); free(got); free(rmass); free(gmass); free(rtopk); free(gtopk);
        free(rroute); free(groute); free(pd); free(rd); free(skip); free(set_differs);
        free(mark_tk); free(out0); free(mass0); free(topk0); free(route0);
        arena_reset(&g_dev, mark);
    }
    ck_assert_int_gt(empty, 0);
}
END_TEST

START_TEST(test_conv)
{
    /* (ci, h, w, co, kh, kw, stride, pad) */
    const int shapes[][8] = {{3, 17, 13, 5, 3, 3, 1, 1}, {4, 16, 16, 7, 1, 1, 1, 0},
                             {3, 33, 31, 8, 16, 16, 16, 0}, {6, 15, 9, 4, 3, 3, 2, 1},
                             {64, 32, 32, 64, 3, 3, 1, 1}};
    for (size_t si = 0; si < 5; si++) {
        const int *s = shapes[si];
        int ci = s[0], h = s[1], wd = s[2], co = s[3], kh = s[4], kw = s[5], st = s[6], pad = s[7];
        int ho = (h + 2 * pad - kh) / st + 1, wo = (wd + 2 * pad - kw) / st + 1;
        size_t mark = arena_mark(&g_dev), ni = (size_t)ci * h * wd, no = (size_t)co * ho * wo;
        size_t nw = (size_t)co * ci * kh * kw;
        float *in = hrand(ni, 70 + (uint32_t)si, -1, 1), *w = hrand(nw, 80 + (uint32_t)si, -1, 1);
        float *b = hrand((size_t)co, 90, -1, 1);
        float *ref = malloc(no * sizeof(float)), *got = hpoison(no);
        float *din = dput(in, ni), *dw = dput(w, nw), *db = dput(b, (size_t)co), *dout = dalloc(no * 4);
        for (int act = 0; act < 3; act++)
            for (int withb = 0; withb < 2; withb++) {
                BOTH_MODES
                {
                    ms_backend gb = gpu_be(mode == 0), cb = cpu_ref(mode);
                    OK(op_conv2d(&cb, ref, in, w, withb ? b : NULL, ci, h, wd, co, kh, kw, st, pad,
                                 (ms_act)act));
                    dpoison(dout, no * 4);
                    OK(op_conv2d(&gb, dout, din, dw, withb ? db : NULL, ci, h, wd, co, kh, kw, st,
                                 pad, (ms_act)act));
                    dget(got, dout, no * 4);
                    char what[96];
                    snprintf(what, sizeof what, "conv2d shape %zu act %d b %d %s", si, act, withb,
                             mode ? "tf32" : "fp32");
                    check_close(got, ref, no, mode ? TOL_TC : TOL_FP32, what);
                    if (mode && si == 4 && act == 1 && withb) /* for the record */
                        printf("conv2d 64x32x32 tf32 vs cpu tc rounding: %.2e normwise\n",
                               max_abs_diff(got, ref, no) / max_abs(ref, no));
                }
            }
        free(in); free(w); free(b); free(ref); free(got);
        arena_reset(&g_dev, mark);
    }
    /* transposed 2x2 */
    const int tshapes[][4] = {{5, 4, 7, 3}, {64, 15, 17, 32}};
    for (size_t si = 0; si < 2; si++) {
        int ci = tshapes[si][0], h = tshapes[si][1], wd = tshapes[si][2], co = tshapes[si][3];
        size_t mark = arena_mark(&g_dev), ni = (size_t)ci * h * wd, no = (size_t)co * 4 * h * wd;
        size_t nw = (size_t)ci * co * 4;
        float *in = hrand(ni, 100 + (uint32_t)si, -1, 1), *w = hrand(nw, 110 + (uint32_t)si, -1, 1);
        float *b = hrand((size_t)co, 120, -1, 1);
        float *ref = malloc(no * sizeof(float)), *got = hpoison(no);
        float *din = dput(in, ni), *dw = dput(w, nw), *db = dput(b, (size_t)co), *dout = dalloc(no * 4);
        for (int act = 0; act < 3; act++) {
            BOTH_MODES
            {
                ms_backend gb = gpu_be(mode == 0), cb = cpu_ref(mode);
                OK(op_conv_transpose2x2(&cb, ref, in, w, b, ci, h, wd, co, (ms_act)act));
                dpoison(dout, no * 4);
                OK(op_conv_transpose2x2(&gb, dout, din, dw, db, ci, h, wd, co, (ms_act)act));
                dget(got, dout, no * 4);
                check_close(got, ref, no, mode ? TOL_TC : TOL_FP32, "conv_transpose2x2");
                if (mode && si == 1 && act == 0)
                    printf("conv_transpose2x2 64->32 bf16 vs cpu tc rounding: %.2e normwise\n",
                           max_abs_diff(got, ref, no) / max_abs(ref, no));
            }
        }
        free(in); free(w); free(b); free(ref); free(got);
        arena_reset(&g_dev, mark);
    }
}
END_TEST

START_TEST(test_image_ops)
{
    ms_backend cb = cpu_be(), gb = gpu_be(true);
    const int shapes[][3] = {{3, 13, 9}, {19, 64, 48}, {1, 1, 1}};
    for (size_t si = 0; si < 3; si++) {
        int c = shapes[si][0], h = shapes[si][1], w = shapes[si][2];
        size_t mark = arena_mark(&g_dev), ni = (size_t)c * h * w, big = (size_t)c * (4 * h + 1) * (4 * w + 1);
        float *in = hrand(ni, 130 + (uint32_t)si, -4, 4);
        float *ref = malloc(big * sizeof(float)), *got = hpoison(big);
        float *din = dput(in, ni), *dout = dalloc(big * 4);
        ck_assert_ptr_nonnull(ref);

        const int grids[][2] = {{7, 7}, {3, 2}, {1, 1}};
        for (int gi = 0; gi < 3; gi++) {
            int gh = grids[gi][0] < h ? grids[gi][0] : h, gw = grids[gi][1] < w ? grids[gi][1] : w;
            OK(op_adaptive_avgpool(&cb, ref, in, c, h, w, gh, gw));
            dpoison(dout, (size_t)c * gh * gw * 4);
            OK(op_adaptive_avgpool(&gb, dout, din, c, h, w, gh, gw));
            dget(got, dout, (size_t)c * gh * gw * 4);
            check_close(got, ref, (size_t)c * gh * gw, TOL_FP32, "adaptive_avgpool");
        }
        if (h >= 2 && w >= 2) {
            size_t no = (size_t)c * (h / 2) * (w / 2);
            OK(op_maxpool2x2(&cb, ref, in, c, h, w));
            dpoison(dout, no * 4);
            OK(op_maxpool2x2(&gb, dout, din, c, h, w));
            dget(got, dout, no * 4);
            check_close(got, ref, no, 0.0, "maxpool2x2");
        }
        const int sizes[][2] = {{4 * h + 1, 4 * w + 1}, {h / 2 + 1, w / 3 + 1}, {h, w}};
        for (int zi = 0; zi < 3; zi++) {
            int ho = sizes[zi][0], wo = sizes[zi][1];
            size_t no = (size_t)c * ho * wo;
            OK(op_resize_bilinear(&cb, ref, in, c, h, w, ho, wo, 0.0, 0.0));
            dpoison(dout, no * 4);
            OK(op_resize_bilinear(&gb, dout, din, c, h, w, ho, wo, 0.0, 0.0));
            dget(got, dout, no * 4);
            check_close(got, ref, no, TOL_FP32, "resize_bilinear");
            OK(op_resize_bicubic(&cb, ref, in, c, h, w, ho, wo));
            dpoison(dout, no * 4);
            OK(op_resize_bicubic(&gb, dout, din, c, h, w, ho, wo));
            dget(got, dout, no * 4);
            check_close(got, ref, no, TOL_FP32, "resize_bicubic");
        }
        { /* by scale factor 4 */
            size_t no = (size_t)c * (4 * h) * (4 * w);
            OK(op_resize_bilinear(&cb, ref, in, c, h, w, 4 * h, 4 * w, 4.0, 4.0));
            dpoison(dout, no * 4);
            OK(op_resize_bilinear(&gb, dout, din, c, h, w, 4 * h, 4 * w, 4.0, 4.0));
            dget(got, dout, no * 4);
            check_close(got, ref, no, TOL_FP32, "resize_bilinear scale");
        }
        { /* crop */
            int ho = (h + 1) / 2, wo = w - w / 3;
            size_t no = (size_t)c * ho * wo;
            OK(op_crop(&cb, ref, in, c, h, w, ho, wo));
            dpoison(dout, no * 4);
            OK(op_crop(&gb, dout, din, c, h, w, ho, wo));
            dget(got, dout, no * 4);
            check_close(got, ref, no, 0.0, "crop");
        }
        { /* argmax with ties (integer logits): lowest class wins */
            float *q = malloc(ni * sizeof(float));
            for (size_t i = 0; i < ni; i++) q[i] = floorf(in[i] * 0.5f);
            float *dq = dput(q, ni);
            size_t np = (size_t)h * w;
            uint8_t *ra = malloc(np), *ga = malloc(np);
            uint8_t *da = dalloc(np);
            OK(op_argmax(&cb, ra, q, c, h, w));
            dpoison(da, np);
            OK(op_argmax(&gb, da, dq, c, h, w));
            dget(ga, da, np);
            ck_assert_int_eq(memcmp(ra, ga, np), 0);
            free(q); free(ra); free(ga);
        }
        free(in); free(ref); free(got);
        arena_reset(&g_dev, mark);
    }
    { /* normalize_pad */
        int h = 37, w = 29, hp = 48, wp = 32;
        size_t mark = arena_mark(&g_dev), ni = 3 * (size_t)h * w, no = 3 * (size_t)hp * wp;
        float *img = hrand(ni, 140, 0, 255), *ref = malloc(no * 4), *got = hpoison(no);
        const float mean[3] = {123.675f, 116.28f, 103.53f}, stdv[3] = {58.395f, 57.12f, 57.375f};
        float *dimg = dput(img, ni), *dout = dalloc(no * 4);
        OK(op_normalize_pad(&cb, ref, img, h, w, hp, wp, mean, stdv));
        dpoison(dout, no * 4);
        OK(op_normalize_pad(&gb, dout, dimg, h, w, hp, wp, mean, stdv));
        dget(got, dout, no * 4);
        check_close(got, ref, no, TOL_FP32, "normalize_pad");
        free(img); free(ref); free(got);
        arena_reset(&g_dev, mark);
    }
}
END_TEST

START_TEST(test_errors)
{
    /* A device pointer mistake must come back as a status, not a crash:
     * here only the synchronous error paths (bad sizes) are checked. */
    ms_backend gb = gpu_be(true);
    ck_assert_int_ne(op_linear(&gb, NULL, NULL, NULL, NULL, 0, 1, 1, MS_ACT_NONE, false), MS_OK);
    ms_mita_params p = {7, 7, 49, true};
    ck_assert_int_ne(op_mita(&gb, NULL, NULL, 4, 4, 10, 3, &p, NULL), MS_OK);
    ck_assert_str_ne(ms_last_error(), "");
    /* GPU out of memory: a status and a message, not a crash. Not under
     * MS_BACKEND_SMALL, the compute-sanitizer run (tests/gpu/gpu-run.sh):
     * the sanitizer counts the deliberately failing cudaMalloc (and the
     * cudaGetLastError that clears it) as errors, failing that run. */
    if (!g_small) {
        ms_arena huge;
        ck_assert_int_eq(arena_init(&huge, (size_t)1 << 50, MS_DEVICE_CUDA), MS_ERR_OOM);
        ck_assert_msg(strstr(ms_last_error(), "GPU out of memory") != NULL, "%s",
                      ms_last_error());
    }
    /* and the context still works afterwards */
    float one = 1.0f, two = 0.0f;
    float *d = dput(&one, 1);
    OK(op_add(&gb, d, d, d, 1));
    dget(&two, d, sizeof two);
    ck_assert_float_eq(two, 2.0f);
}
END_TEST


/* End to end on the fixtures: the engine on CUDA against the engine on the
 * CPU, same model, same image; FP32 mode against the plain CPU, tensor-core
 * mode against the CPU with the same operand rounding (tc_round). Against
 * the plain CPU the tensor-core mode would fail on correct code: the rounding
 * alone moves 8% of pad_resize's pixels and 22% of its MiTA decisions
 * (test_tc_round). Against the matching reference only summation order
 * differs, so both modes are held to the same tight bounds: masks >= 99.5%
 * equal (a pixel whose top two logits nearly tie may flip), logits within
 * 1e-3 of their range, at most 0.1% of the MiTA record entries differ
 * (near-ties; test_mita checks those against exact scores). The agreement
 * is printed for the record. */
static void e2e_case(const char *case_name)
{
    char mpath[256], gpath[256], mfull[4096];
    snprintf(mpath, sizeof mpath, "%s.model.safetensors", case_name);
    snprintf(gpath, sizeof gpath, "%s.golden.safetensors", case_name);
    snprintf(mfull, sizeof mfull, "%s", fixture_path(mpath));
    ms_model_file *g = NULL;
    ck_assert_msg(safetensors_open(&g, fixture_path(gpath)) == MS_OK, "%s", ms_last_error());
    const ms_tensor *img_t = model_file_find(g, "image");
    ck_assert_ptr_nonnull(img_t);
    ms_image img = {.h = (int)img_t->shape[0], .w = (int)img_t->shape[1],
                    .rgb = (uint8_t *)img_t->data};
    const char *sl = model_file_metadata(g, "slide"); /* windows run only without records */
    ms_run_options ro = {.attention = -1, .record = !(sl && !strcmp(sl, "yes"))};
    const char *att = model_file_metadata(g, "attention");
    if (att) ro.attention = strcmp(att, "full") ? MS_ATTN_MITA : MS_ATTN_FULL;

    for (int mode = 0; mode < 2; mode++) {
        ms_engine_options co = {.device = MS_DEV_CPU, .threads = 0, .tc_round = mode == 1};
        ms_engine *ec = NULL;
        ck_assert_msg(engine_init(&ec, mfull, &co) == MS_OK, "%s", ms_last_error());
        ms_result rc = {0};
        ck_assert_msg(engine_run(ec, &rc, &img, &ro) == MS_OK, "%s", ms_last_error());
        ms_engine_options go = {.device = MS_DEV_CUDA, .fp32 = mode == 0};
        ms_engine *eg = NULL;
        ck_assert_msg(engine_init(&eg, mfull, &go) == MS_OK, "%s cuda: %s", case_name,
                      ms_last_error());
        ck_assert_int_eq(engine_device(eg), MS_DEV_CUDA);
        ms_result rg = {0};
        for (int rep = 0; rep < 2; rep++) /* the second run reuses the sized arena */
            ck_assert_msg(engine_run(eg, &rg, &img, &ro) == MS_OK, "%s cuda: %s", case_name,
                          ms_last_error());
        ms_agreement a;
        OK(result_compare(&a, &rg, &rc));
        const char *mname = mode ? "tensor cores vs cpu tc rounding" : "fp32 vs cpu";
        printf("e2e %-16s %s: masks %.2f%% equal, logits %.2e, MiTA records %zu of %zu differ\n",
               case_name, mname, 100.0 * a.mask_same, a.logits_err, a.rec_diff, a.rec_total);
        ck_assert_msg(a.mask_same >= 0.995, "%s %s: masks agree on %.3f%%", case_name, mname,
                      100.0 * a.mask_same);
        ck_assert_msg(a.logits_err <= 1e-3, "%s %s: logits differ by %.3g",
                      case_name, mname, a.logits_err);
        ck_assert_msg(a.rec_diff * 1000 <= a.rec_total, "%s %s: %zu of %zu MiTA record entries "
                      "differ", case_name, mname, a.rec_diff, a.rec_total);
        result_free(&rg);
        engine_free(eg);
        result_free(&rc);
        engine_free(ec);
    }
    model_file_close(g);
}

START_TEST(test_e2e_fixtures)
{
    const char *cases[] = {"pad_resize", "full_none", "mita_d", "mita_sqrtd_conv",
                           "posgrid",    "small_grid", "f16",      "cls_mita",
                           "cls_full",   "mmseg_pad",  "slide"};
    /* the small set (memcheck) keeps MiTA with resize and padding, and full
     * attention: each case makes four engines, and handle creation under the
     * sanitizer takes seconds */
    size_t n = g_small ? 2 : sizeof cases / sizeof cases[0];
    for (size_t i = 0; i < n; i++) e2e_case(cases[i]);
}
END_TEST

static Suite *backend_suite(void)
{
    /* One case per op family, so a run can pick one: CK_RUN_CASE=mita. */
    const struct {
        const char *name;
        const TTest *test;
    } cases[] = {{"linear", test_linear},
                 {"small_ops", test_layernorm_add_transpose_softmax},
                 {"attention", test_attention_full},
                 {"mita", test_mita},
                 {"conv", test_conv},
                 {"image", test_image_ops},
                 {"errors", test_errors},
                 {"e2e", test_e2e_fixtures}};
    Suite *s = suite_create("backend");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    /* the versions first: most reasons a GPU cannot be used are here */
    ms_cuda_versions v;
    cuda_query_versions(&v);
    printf("cuda: driver %d.%d, runtime %d.%d (built %d.%d), cublas %d, cudnn %d (built %d)\n",
           v.driver / 1000, (v.driver % 1000) / 10, v.runtime / 1000, (v.runtime % 1000) / 10,
           v.runtime_build / 1000, (v.runtime_build % 1000) / 10, v.cublas, v.cudnn,
           v.cudnn_build);
    bool present = ms_gpu_present();
    if (present && v.driver && v.driver < v.runtime) {
        printf("FAIL: the CUDA driver (supports %d.%d) is older than the runtime (%d.%d)\n",
               v.driver / 1000, (v.driver % 1000) / 10, v.runtime / 1000,
               (v.runtime % 1000) / 10);
        return 1;
    }
    ms_status st = cuda_ctx_init(&g_cu, 0);
    if (st != MS_OK) {
        /* without a GPU: skipped; with one there, not using it is a failure */
        printf("%s: no usable CUDA device: %s\n", present ? "FAIL (a GPU is present)" : "skipped",
               ms_last_error());
        return present ? 1 : 77;
    }
    printf("device: %s\n", cuda_ctx_name(g_cu));
    const char *small = getenv("MS_BACKEND_SMALL");
    g_small = small && small[0] == '1';
    if (arena_init(&g_dev, (size_t)1 << 30, MS_DEVICE_CUDA) != MS_OK ||
        arena_init(&g_scratch, (size_t)1 << 30, MS_DEVICE_CUDA) != MS_OK) {
        printf("FAIL: device arenas: %s\n", ms_last_error());
        return 1;
    }
    SRunner *sr = srunner_create(backend_suite());
    /* One CUDA context, made before the tests: no fork (a forked child
     * cannot use its parent's CUDA context). */
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    arena_free(&g_scratch);
    arena_free(&g_dev);
    cuda_ctx_free(g_cu);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#else /* !MS_HAVE_CUDA */

int main(void)
{
    printf("skipped: this build has no CUDA backend (configure with the CUDA toolkit, MS_CUDA=ON)\n");
    /* a CPU-only build on a GPU machine is a choice (-DMS_CUDA=OFF), not a
     * failure of the GPU: still skipped, but said */
    if (ms_gpu_present()) printf("note: this machine has a GPU\n");
    return 77;
}

#endif
