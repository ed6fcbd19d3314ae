/* The CPU convolution paths (kernels/conv.c, kernels/conv_simd.c) against a
 * plain direct convolution written here (double accumulation): the 1x1
 * GEMM-in-chunks path, the stride-1 implicit GEMM, Winograd F(4x4, 3x3)
 * (also run directly at every size), the im2col path (also run
 * directly on stride-1 convs), their fused bias/activation output passes,
 * and the 2x2 transposed conv. Odd sizes (h, w in 1, 2, 7, 33; channel
 * counts that are not multiples of 8), stride 1 and 2, pad 0/1/3, kernels
 * 1, 3 and 7, bias on and off, every activation; workspaces from the sizing
 * function down to one im2col row (many bands, fewer threads, the fallback
 * from implicit to im2col); 1, 2 and 3 threads, and every path's bits the
 * same at 1 to 5; every CPU path this machine has (and CMake runs the file
 * again with MS_CPU_PATH=base).
 *
 * Every workspace is filled with NaN (a junk value that reached an output
 * would show) and followed by guard floats that must stay untouched (the
 * sizing functions are what callers size the activation arena from).
 *
 * Tolerance: sums of up to 17*49 O(1) terms in float against double,
 * reassociated differently by each path: 1e-5 * (1 + max|want|), as the
 * conv cases of test_ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/conv.h"
#include "kernels/cpu_path.h"
#include "testutil_ops.h"

#define GUARD 64
#define GUARD_VALUE 12345.0f
#define TOL 1e-5

static int max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* A workspace of n floats, NaN-filled, with GUARD guard floats after it. */
static float *ws_alloc(size_t n)
{
    float *ws = falloc(n + GUARD);
    for (size_t i = 0; i < n; i++) ws[i] = NAN;
    for (size_t i = 0; i < GUARD; i++) ws[n + i] = GUARD_VALUE;
    return ws;
}

static void ws_check_free(float *ws, size_t n, const char *what)
{
    for (size_t i = 0; i < GUARD; i++)
        ck_assert_msg(ws[n + i] == GUARD_VALUE, "%s: wrote past the workspace (%zu floats)", what,
                      n);
    ms_free(ws);
}

static void naive_conv2d(double *out /* (co, ho, wo) */, const float *in /* (ci, h, wd) */,
                         const float *w /* (co, ci, k, k) */, const float *b, int ci, int h,
                         int wd, int co, int k, int stride, int pad, ms_act act)
{
    int ho = conv_out_size(h, k, stride, pad), wo = conv_out_size(wd, k, stride, pad);
    for (int o = 0; o < co; o++)
        for (int y = 0; y < ho; y++)
            for (int x = 0; x < wo; x++) {
                double s = b ? b[o] : 0.0;
                for (int c = 0; c < ci; c++)
                    for (int ky = 0; ky < k; ky++)
                        for (int kx = 0; kx < k; kx++) {
                            int iy = y * stride - pad + ky, ix = x * stride - pad + kx;
                            if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                            s += (double)in[((size_t)c * h + iy) * wd + ix] *
                                 w[(((size_t)o * ci + c) * k + ky) * k + kx];
                        }
                out[((size_t)o * ho + y) * wo + x] = naive_act(s, act);
            }
}

/* ---------- conv2d ---------- */

static const int conv_hw[][2] = {{1, 1}, {2, 7}, {7, 2}, {33, 7}, {7, 33}, {33, 33}};
static const int conv_ksp[][3] = {/* kernel, stride, pad */
                                  {1, 1, 0}, {1, 1, 1}, {1, 2, 0}, {3, 1, 1}, {3, 1, 0},
                                  {3, 2, 1}, {3, 2, 0}, {7, 1, 3}, {7, 2, 3}};
static const int conv_cico[][2] = {{3, 5}, {11, 13}, {9, 1}, {17, 7}};

/* One conv through every entry point and workspace size, on the current
 * path and thread count. */
static void conv_case(int ci, int h, int wd, int co, int k, int st, int pad, bool bias,
                      ms_act act, uint32_t seed)
{
    int ho = conv_out_size(h, k, st, pad), wo = conv_out_size(wd, k, st, pad);
    size_t no = (size_t)co * ho * wo;
    float *in = frand((size_t)ci * h * wd, seed, -1.0f, 1.0f), *w = frand((size_t)co * ci * k * k, seed + 1, -1.0f, 1.0f);
    float *b = bias ? frand(co, seed + 2, -1.0f, 1.0f) : NULL, *out = falloc(no);
    double *want = dalloc(no);
    naive_conv2d(want, in, w, b, ci, h, wd, co, k, st, pad, act);
    char what[160];
    snprintf(what, sizeof what, "conv ci %d %dx%d co %d k %d s %d p %d bias %d act %d path %s "
             "threads %d", ci, h, wd, co, k, st, pad, bias, act, cpu_path_name(cpu_path_get()),
             max_threads());

    size_t full = conv2d_scratch_floats(ci, h, wd, co, k, k, st, pad);
    size_t row = (size_t)ci * k * k * wo; /* the contract's minimum */
    bool pointwise = k == 1 && st == 1 && pad == 0;
    if (pointwise) {
        ck_assert_uint_eq(full, 0);
        for (size_t i = 0; i < no; i++) out[i] = NAN;
        conv2d_cpu(out, in, w, b, ci, h, wd, co, k, k, st, pad, act, NULL, 0);
        check_close(out, want, no, TOL, what);
    } else {
        /* the implicit GEMM may want less than one im2col row */
        if (st != 1) ck_assert_uint_ge(full, row);
        /* from the sized workspace down to one row: fewer and smaller bands,
         * fewer threads, then (stride 1) the fall-back to im2col; the
         * contract is either size, so below both only the sized one */
        const size_t div[][2] = {{1, 1}, {3, 4}, {1, 2}, {1, 3}, {1, 5}, {1, 9}, {0, 1}};
        for (size_t d = 0; d < sizeof div / sizeof div[0]; d++) {
            size_t n = full * div[d][0] / div[d][1];
            if (n < row && n < full) n = row;
            float *ws = ws_alloc(n);
            for (size_t i = 0; i < no; i++) out[i] = NAN;
            conv2d_cpu(out, in, w, b, ci, h, wd, co, k, k, st, pad, act, ws, n);
            check_close(out, want, no, TOL, what);
            ws_check_free(ws, n, what);
        }
        /* the im2col path itself: one row, 2.5 rows, all rows */
        const size_t rows_x2[] = {2, 5, 2 * (size_t)ho};
        for (size_t r = 0; r < 3; r++) {
            size_t n = row * rows_x2[r] / 2;
            float *ws = ws_alloc(n);
            for (size_t i = 0; i < no; i++) out[i] = NAN;
            conv2d_im2col_cpu(out, in, w, b, ci, h, wd, co, k, k, st, pad, act, ws, n);
            check_close(out, want, no, TOL, what);
            ws_check_free(ws, n, what);
        }
    }
    ms_free(in); ms_free(w); ms_free(b); ms_free(out); free(want);
}

START_TEST(test_conv2d_paths)
{
    ms_cpu_path start = cpu_path_get();
    int start_threads = max_threads(), cases = 0;
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        for (int t = 1; t <= 3; t++) {
            set_threads(t);
            uint32_t seed = 1000;
            for (size_t s = 0; s < sizeof conv_hw / sizeof conv_hw[0]; s++)
                for (size_t g = 0; g < sizeof conv_ksp / sizeof conv_ksp[0]; g++) {
                    int h = conv_hw[s][0], wd = conv_hw[s][1];
                    int k = conv_ksp[g][0], st = conv_ksp[g][1], pad = conv_ksp[g][2];
                    if (conv_out_size(h, k, st, pad) < 1 || conv_out_size(wd, k, st, pad) < 1)
                        continue;
                    size_t c = (s + g) % (sizeof conv_cico / sizeof conv_cico[0]);
                    bool bias = (s + g) % 2 == 0;
                    ms_act act = (ms_act)((s * 2 + g) % 3);
                    conv_case(conv_cico[c][0], h, wd, conv_cico[c][1], k, st, pad, bias, act,
                              seed += 3);
                    cases++;
                }
        }
    }
    ck_assert_int_ge(cases, 100);
    set_threads(start_threads);
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

/* Wider than one band at this project's shapes' band width (stride-1 3x3
 * over 96 output columns, 40 rows) and every activation with bias. */
START_TEST(test_conv2d_many_bands)
{
    ms_cpu_path start = cpu_path_get();
    int start_threads = max_threads();
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        for (int t = 1; t <= 2; t++) {
            set_threads(t);
            for (int act = 0; act < 3; act++)
                conv_case(12, 40, 96, 10, 3, 1, 1, true, (ms_act)act, 2000 + act);
        }
    }
    set_threads(start_threads);
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

/* Called from inside a parallel region (as when images run in parallel),
 * each conv runs on its own thread within the workspace sized outside. */
START_TEST(test_conv2d_nested)
{
    const int ci = 7, h = 9, wd = 11, co = 6, k = 3;
    int ho = h, wo = wd;
    size_t no = (size_t)co * ho * wo, n = conv2d_scratch_floats(ci, h, wd, co, k, k, 1, 1);
    float *in = frand((size_t)ci * h * wd, 3000, -1.0f, 1.0f), *w = frand((size_t)co * ci * k * k, 3001, -1.0f, 1.0f);
    float *b = frand(co, 3002, -1.0f, 1.0f);
    double *want = dalloc(no);
    naive_conv2d(want, in, w, b, ci, h, wd, co, k, 1, 1, MS_ACT_RELU);
    float *outs[2], *wss[2];
    for (int i = 0; i < 2; i++) {
        outs[i] = falloc(no);
        wss[i] = ws_alloc(n);
    }
#pragma omp parallel for num_threads(2)
    for (int i = 0; i < 2; i++)
        conv2d_cpu(outs[i], in, w, b, ci, h, wd, co, k, k, 1, 1, MS_ACT_RELU, wss[i], n);
    for (int i = 0; i < 2; i++) {
        check_close(outs[i], want, no, TOL, "nested conv");
        ws_check_free(wss[i], n, "nested conv");
        ms_free(outs[i]);
    }
    ms_free(in); ms_free(w); ms_free(b); free(want);
}
END_TEST

/* Every path cuts its work by the layer's size alone (bands cut for two
 * threads whatever the count; Winograd's bands and channel chunks by the
 * sized workspace) and calls each GEMM whole inside its parallel region:
 * the same bits at 1 to 5 threads, byte for byte. OpenBLAS may round a row
 * otherwise in a call of other columns, so a cut that followed the thread
 * count gave other last bits (the stem's bands on Zen 3's kernels). Shapes
 * of several bands and column chunks: transposed (k = 2, stride 2: the 2x2
 * transposed conv), pointwise with and without the output pass, implicit
 * GEMM (3x3 under 32 channels, 7x7), im2col (stride 2), Winograd. */
START_TEST(test_conv2d_same_bits_any_threads)
{
    const struct {
        int ci, h, wd, co, k, st, pad;
    } cs[] = {
        {40, 46, 61, 36, 3, 1, 1},  /* Winograd, 3 tile rows short of 12 x 16 */
        {40, 9, 200, 36, 3, 1, 1},  /* Winograd, 3 tile rows of 50 */
        {24, 45, 61, 20, 3, 1, 1},  /* implicit GEMM, 45 rows of 63 */
        {5, 37, 70, 9, 7, 1, 3},    /* implicit GEMM, 7x7 */
        {16, 90, 120, 24, 3, 2, 1}, /* im2col, 45 rows of 60 */
        {3, 121, 161, 16, 3, 2, 1}, /* im2col, a stem's first conv */
        {48, 45, 60, 40, 1, 1, 0},  /* pointwise, 3 column chunks */
        {24, 23, 30, 16, 2, 2, 0},  /* the 2x2 transposed conv */
    };
    int start_threads = max_threads();
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int ci = cs[i].ci, h = cs[i].h, wd = cs[i].wd, co = cs[i].co, k = cs[i].k;
        int st = cs[i].st, pad = cs[i].pad;
        bool transposed = k == 2;
        size_t no = transposed ? (size_t)co * 4 * h * wd
                               : (size_t)co * conv_out_size(h, k, st, pad) *
                                     conv_out_size(wd, k, st, pad);
        float *in = frand((size_t)ci * h * wd, 4000 + (uint32_t)i, -1.0f, 1.0f);
        float *w = frand((size_t)co * ci * k * k, 4100 + (uint32_t)i, -1.0f, 1.0f);
        float *b = frand(co, 4200 + (uint32_t)i, -1.0f, 1.0f), *one = falloc(no);
        /* pass 1 without bias and activation: the pointwise conv is then one
         * GEMM call, the others skip the output pass's bias */
        for (int pass = 0; pass < 2; pass++)
            for (int t = 1; t <= 5; t++) {
                set_threads(t);
                const float *bias = pass ? NULL : b;
                ms_act act = pass ? MS_ACT_NONE : MS_ACT_RELU;
                size_t n = transposed ? conv_transpose2x2_scratch_floats(ci, h, wd, co)
                                      : conv2d_scratch_floats(ci, h, wd, co, k, k, st, pad);
                float *ws = n ? ws_alloc(n) : NULL, *out = t == 1 ? one : falloc(no);
                if (transposed)
                    conv_transpose2x2_cpu(out, in, w, bias, ci, h, wd, co, act, ws, n);
                else
                    conv2d_cpu(out, in, w, bias, ci, h, wd, co, k, k, st, pad, act, ws, n);
                if (t > 1) {
                    ck_assert_msg(memcmp(out, one, no * sizeof(float)) == 0,
                                  "conv case %zu (ci %d %dx%d co %d k %d s %d, pass %d): %d "
                                  "threads differ from 1", i, ci, h, wd, co, k, st, pass, t);
                    ms_free(out);
                }
                if (ws) ws_check_free(ws, n, "same bits");
            }
        ms_free(in); ms_free(w); ms_free(b); ms_free(one);
    }
    set_threads(start_threads);
}
END_TEST

/* The Winograd F(4x4, 3x3) path on its own at every size (conv2d_cpu takes
 * it only from 32 channels and 12 tiles up): heights and widths of every
 * residue mod 4 (a last tile with one, two or three rows or columns),
 * channel counts that are not multiples of 8, bias on and off, every
 * activation; workspaces from the sized one down to the transformed weights
 * and one tile row (a band per tile row), then
 * below that (the im2col fall-back); 1 and 2 threads; every CPU path. */
static void wino_case(int ci, int h, int wd, int co, bool bias, ms_act act, uint32_t seed)
{
    size_t no = (size_t)co * h * wd;
    float *in = frand((size_t)ci * h * wd, seed, -1.0f, 1.0f);
    float *w = frand((size_t)co * ci * 9, seed + 1, -1.0f, 1.0f);
    float *b = bias ? frand(co, seed + 2, -1.0f, 1.0f) : NULL, *out = falloc(no);
    double *want = dalloc(no);
    naive_conv2d(want, in, w, b, ci, h, wd, co, 3, 1, 1, act);
    char what[160];
    snprintf(what, sizeof what, "winograd ci %d %dx%d co %d bias %d act %d path %s threads %d",
             ci, h, wd, co, bias, act, cpu_path_name(cpu_path_get()), max_threads());
    /* the header's sizes: 36 kc co transformed weights, 36 (kc + co) tw
     * floats a tile row plus row buffers and a zero row (under 100 tw + 1300
     * at 2 threads), one
     * im2col row for the fall-back */
    size_t full = conv2d_winograd_scratch_floats(ci, h, wd, co);
    size_t tw = (size_t)(wd + 3) / 4, kc = (size_t)ci;
    if ((size_t)36 * co * ci > ((size_t)1 << 20)) { /* chunks of at most 2^20 floats of U */
        size_t chunks = ((size_t)36 * co * ci + ((size_t)1 << 20) - 1) >> 20;
        kc = (ci + chunks - 1) / chunks;
    }
    size_t wf = (size_t)36 * kc * co, one = (size_t)36 * (kc + co) * tw + 100 * tw + 1300;
    size_t sizes[] = {full, wf + (full - wf) / 2, wf + 2 * one + 64, wf + one + 64,
                      (size_t)ci * 9 * wd};
    ck_assert_uint_ge(full, wf + one - 100 * tw - 1300);
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        size_t n = sizes[z] < full ? sizes[z] : full;
        float *ws = ws_alloc(n);
        for (size_t i = 0; i < no; i++) out[i] = NAN;
        conv2d_winograd_cpu(out, in, w, b, ci, h, wd, co, act, ws, n);
        check_close(out, want, no, TOL, what);
        ws_check_free(ws, n, what);
    }
    ms_free(in); ms_free(w); ms_free(b); ms_free(out); free(want);
}

START_TEST(test_conv2d_winograd)
{
    ms_cpu_path start = cpu_path_get();
    int start_threads = max_threads(), cases = 0;
    static const int hw[][2] = {{1, 1},   {2, 2},   {3, 5},   {5, 3},  {1, 33},
                                {33, 2},  {33, 33}, {34, 31}, {6, 12}};
    static const int cico[][2] = {{16, 16}, {17, 33}, {33, 17}, {65, 64}};
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        for (int t = 1; t <= 2; t++) {
            set_threads(t);
            for (size_t s = 0; s < sizeof hw / sizeof hw[0]; s++)
                for (size_t c = 0; c < sizeof cico / sizeof cico[0]; c++)
                    for (int act = 0; act < 3; act++) {
                        wino_case(cico[c][0], hw[s][0], hw[s][1], cico[c][1],
                                  (s + c + act) % 2 == 0, (ms_act)act,
                                  (uint32_t)(5000 + 17 * s + 3 * c + act));
                        cases++;
                    }
            /* input channels in two chunks (U of 36 co ci floats over 2^20) */
            for (int act = 0; act < 3; act++)
                wino_case(200, 9, 10, 160, act != 1, (ms_act)act, (uint32_t)(5800 + act));
            /* through conv2d_cpu, which takes Winograd here (and the
             * implicit GEMM below 32 channels) */
            conv_case(33, 33, 33, 32, 3, 1, 1, true, MS_ACT_RELU, 5900);
            conv_case(32, 40, 31, 31, 3, 1, 1, false, MS_ACT_GELU, 5910);
        }
    }
    ck_assert_int_ge(cases, 216);
    set_threads(start_threads);
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

/* ---------- 2x2 transposed conv ---------- */

START_TEST(test_conv_transpose_paths)
{
    ms_cpu_path start = cpu_path_get();
    int start_threads = max_threads();
    const int cases[][4] = {{3, 1, 1, 5}, {7, 2, 33, 3}, {11, 33, 7, 9}, {5, 7, 7, 1}};
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        for (int t = 1; t <= 3; t++) {
            set_threads(t);
            for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
                int ci = cases[cs][0], h = cases[cs][1], wd = cases[cs][2], co = cases[cs][3];
                size_t no = (size_t)co * 4 * h * wd;
                float *in = frand((size_t)ci * h * wd, 4000 + cs, -1.0f, 1.0f);
                float *w = frand((size_t)ci * co * 4, 4010 + cs, -1.0f, 1.0f), *b = frand(co, 4020 + cs, -1.0f, 1.0f);
                float *out = falloc(no);
                double *want = dalloc(no);
                for (int act = 0; act < 3; act++) {
                    const float *bias = (cs + act) % 2 ? NULL : b;
                    for (int o = 0; o < co; o++)
                        for (int y = 0; y < 2 * h; y++)
                            for (int x = 0; x < 2 * wd; x++) {
                                double s = bias ? bias[o] : 0.0;
                                for (int c = 0; c < ci; c++)
                                    s += (double)in[((size_t)c * h + y / 2) * wd + x / 2] *
                                         w[(((size_t)c * co + o) * 2 + y % 2) * 2 + x % 2];
                                want[((size_t)o * 2 * h + y) * 2 * wd + x] =
                                    naive_act(s, (ms_act)act);
                            }
                    size_t row = (size_t)4 * co * wd;
                    size_t sizes[3] = {conv_transpose2x2_scratch_floats(ci, h, wd, co), row,
                                       row * 5 / 2};
                    for (int z = 0; z < 3; z++) {
                        float *ws = ws_alloc(sizes[z]);
                        for (size_t i = 0; i < no; i++) out[i] = NAN;
                        conv_transpose2x2_cpu(out, in, w, bias, ci, h, wd, co, (ms_act)act, ws,
                                              sizes[z]);
                        check_close(out, want, no, TOL, "conv_transpose2x2");
                        ws_check_free(ws, sizes[z], "conv_transpose2x2");
                    }
                }
                ms_free(in); ms_free(w); ms_free(b); ms_free(out); free(want);
            }
        }
    }
    set_threads(start_threads);
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_conv");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_conv2d_paths);
    tcase_add_test(tc, test_conv2d_many_bands);
    tcase_add_test(tc, test_conv2d_nested);
    tcase_add_test(tc, test_conv2d_same_bits_any_threads);
    tcase_add_test(tc, test_conv2d_winograd);
    tcase_add_test(tc, test_conv_transpose_paths);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
