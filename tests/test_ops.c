/* Every CPU op against a naive loop written here (double accumulation) on
 * random inputs of odd sizes, plus hand-computed and PyTorch-computed cases,
 * and the dispatcher's contract (sizes, dry runs, scratch).
 *
 * Tolerances: inputs are O(1); a float op differs from the double reference
 * by float rounding, about 6e-8 relative per operation, growing with the
 * length of the sums (sqrt(K) typically). "tol" below is an absolute bound
 * on |got - want| scaled by (1 + max|want|); each use says why its value. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_full.h"
#include "kernels/conv.h"
#include "kernels/cpu_path.h"
#include "kernels/vmath.h"
#include "kernels/elementwise.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/mita.h"
#include "kernels/ops.h"
#include "kernels/pool.h"
#include "kernels/resize.h"
#include "testutil_ops.h"

static void check_close_f(const float *got, const float *want, size_t n, double tol,
                          const char *what)
{
    double *w = dalloc(n);
    for (size_t i = 0; i < n; i++) w[i] = want[i];
    check_close(got, w, n, tol, what);
    free(w);
}

/* ---------- linear, layernorm ---------- */

START_TEST(test_gelu_values)
{
    /* Phi(1) = 0.841344746..., Phi(2) = 0.977249868... (normal CDF tables) */
    ck_assert_float_eq_tol(gelu_erf(1.0f), 0.8413447461f, 1e-6f);
    ck_assert_float_eq_tol(gelu_erf(-1.0f), -0.1586552539f, 1e-6f);
    ck_assert_float_eq_tol(gelu_erf(2.0f), 1.9544997361f, 1e-6f);
    ck_assert_float_eq(gelu_erf(0.0f), 0.0f);
    ck_assert_float_eq(act_apply(-3.0f, MS_ACT_RELU), 0.0f);
    ck_assert_float_eq(act_apply(-3.0f, MS_ACT_NONE), -3.0f);
}
END_TEST

START_TEST(test_linear)
{
    const int n = 37, cin = 29, cout = 23;
    ms_backend be = cpu_backend();
    float *in = frand((size_t)n * cin, 1, -1, 1), *w = frand((size_t)cout * cin, 2, -1, 1);
    float *b = frand(cout, 3, -1, 1), *out = falloc((size_t)n * cout);
    float *base = frand((size_t)n * cout, 4, -1, 1);
    double *want = dalloc((size_t)n * cout);
    /* cases: act x bias, then residual with and without bias */
    for (int cs = 0; cs < 8; cs++) {
        ms_act act = (ms_act)(cs % 3);
        bool residual = cs >= 6;
        const float *bias = (cs == 3 || cs == 7) ? NULL : b;
        if (residual) act = MS_ACT_NONE;
        memcpy(out, base, (size_t)n * cout * sizeof(float));
        for (int i = 0; i < n; i++)
            for (int o = 0; o < cout; o++) {
                double s = bias ? bias[o] : 0.0;
                for (int j = 0; j < cin; j++) s += (double)in[i * cin + j] * w[o * cin + j];
                want[i * cout + o] = residual ? base[i * cout + o] + s : naive_act(s, act);
            }
        ck_assert_int_eq(op_linear(&be, out, in, w, bias, n, cin, cout, act, residual), MS_OK);
        /* 29-term float dot products of O(1) values: rounding ~1e-6 */
        check_close(out, want, (size_t)n * cout, 1e-5, "linear");
    }
    ms_free(in); ms_free(w); ms_free(b); ms_free(out); ms_free(base); free(want);
}
END_TEST

START_TEST(test_layernorm)
{
    const int n = 13, c = 47;
    ms_backend be = cpu_backend();
    float *in = frand((size_t)n * c, 5, -1, 1), *w = frand(c, 6, 0.5f, 1.5f);
    float *b = frand(c, 7, -0.5f, 0.5f), *out = falloc((size_t)n * c);
    /* Rows 0..4 ride on a large mean: one-pass float E[x^2]-E[x]^2 loses
     * ~300^2 * 6e-8 = 5e-3 of a variance of 1/3 there, so a 1e-4 bound
     * catches the unstable formula. */
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < c; j++) in[i * c + j] += 300.0f;
    double *want = dalloc((size_t)n * c);
    for (int i = 0; i < n; i++) {
        double mean = 0, var = 0;
        for (int j = 0; j < c; j++) mean += in[i * c + j];
        mean /= c;
        for (int j = 0; j < c; j++) var += (in[i * c + j] - mean) * (in[i * c + j] - mean);
        var /= c;
        for (int j = 0; j < c; j++)
            want[i * c + j] = (in[i * c + j] - mean) / sqrt(var + 1e-6) * w[j] + b[j];
    }
    ck_assert_int_eq(op_layernorm(&be, out, in, w, b, n, c, 1e-6f), MS_OK);
    /* float mean of values near 300 is off by <= ulp(300)/2 = 1.5e-5, i.e.
     * 3e-5 of the std 0.58: below the bound */
    check_close(out, want, (size_t)n * c, 1e-4, "layernorm");
    ms_free(in); ms_free(w); ms_free(b); ms_free(out); free(want);
}
END_TEST

/* ---------- elementwise ---------- */

START_TEST(test_add_transpose_crop)
{
    ms_backend be = cpu_backend();
    const size_t n = 1001;
    float *a = frand(n, 8, -1, 1), *b = frand(n, 9, -1, 1);
    double *want = dalloc(n);
    for (size_t i = 0; i < n; i++) want[i] = (double)a[i] + b[i];
    ck_assert_int_eq(op_add(&be, a, a, b, n), MS_OK); /* out aliases a */
    check_close(a, want, n, 1e-7, "add");             /* one rounding */

    /* transposes that are not multiples of the 32-tile */
    const int shapes[3][2] = {{37, 53}, {70, 33}, {1, 5}};
    for (int s = 0; s < 3; s++) {
        int r = shapes[s][0], c = shapes[s][1];
        float *in = frand((size_t)r * c, 10 + s, -1, 1), *out = falloc((size_t)r * c);
        ck_assert_int_eq(op_transpose(&be, out, in, r, c), MS_OK);
        for (int i = 0; i < r; i++)
            for (int j = 0; j < c; j++)
                ck_assert_float_eq(out[(size_t)j * r + i], in[(size_t)i * c + j]);
        ms_free(in); ms_free(out);
    }

    const int ch = 3, h = 7, w = 9, ho = 5, wo = 4;
    float *in = frand((size_t)ch * h * w, 14, -1, 1), *out = falloc((size_t)ch * ho * wo);
    ck_assert_int_eq(op_crop(&be, out, in, ch, h, w, ho, wo), MS_OK);
    for (int c = 0; c < ch; c++)
        for (int y = 0; y < ho; y++)
            for (int x = 0; x < wo; x++)
                ck_assert_float_eq(out[(c * ho + y) * wo + x], in[(c * h + y) * w + x]);
    ms_free(a); ms_free(b); ms_free(in); ms_free(out); free(want);
}
END_TEST

/* Sliding windows as mmseg's slide_inference writes them (grids, starts,
 * coverage), and the window ops against a direct sum / count. */
START_TEST(test_slide_windows)
{
    const int cases[][3] = {{40, 24, 16}, {52, 28, 12}, {512, 512, 341}, {683, 512, 341},
                            {500, 512, 341}, {100, 512, 341}, {7, 3, 3}, {10, 4, 1}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int len = cases[ci][0], crop = cases[ci][1], stride = cases[ci][2];
        int grids = (len - crop + stride - 1 > 0 ? len - crop + stride - 1 : 0) / stride + 1;
        int win = crop < len ? crop : len;
        ck_assert_int_eq(slide_windows(len, win, stride), grids);
        int *cover = calloc((size_t)len, sizeof(int));
        for (int i = 0; i < grids; i++) {
            int y2 = i * stride + crop < len ? i * stride + crop : len;
            int y1 = y2 - crop > 0 ? y2 - crop : 0; /* mmseg's window */
            ck_assert_int_eq(slide_start(i, len, win, stride), y1);
            for (int y = y1; y < y2; y++) cover[y]++;
        }
        for (int y = 0; y < len; y++) ck_assert_int_eq(slide_count(y, len, win, stride), cover[y]);
        free(cover);
    }

    /* 2 channels, 9x11 map, 5x6 windows at strides 4, 5: 2x2 windows */
    ms_backend be = cpu_backend();
    const int c = 2, h = 9, w = 11, wh = 5, ww = 6, sh = 4, sw = 5;
    int ny = slide_windows(h, wh, sh), nx = slide_windows(w, ww, sw);
    float *acc = frand((size_t)c * h * w, 3, -9, 9); /* garbage: the first window clears it */
    double *sum = dalloc((size_t)c * h * w), *cnt = dalloc((size_t)h * w);
    for (int i = 0; i < ny * nx; i++) {
        int y0 = slide_start(i / nx, h, wh, sh), x0 = slide_start(i % nx, w, ww, sw);
        float *win = frand((size_t)c * wh * ww, 40 + i, -1, 1);
        ck_assert_int_eq(op_window_add(&be, acc, win, c, h, w, wh, ww, y0, x0, i == 0), MS_OK);
        for (int ch = 0; ch < c; ch++)
            for (int y = 0; y < wh; y++)
                for (int x = 0; x < ww; x++)
                    sum[((size_t)ch * h + y0 + y) * w + x0 + x] += win[((size_t)ch * wh + y) * ww + x];
        for (int y = 0; y < wh; y++)
            for (int x = 0; x < ww; x++) cnt[(size_t)(y0 + y) * w + x0 + x] += 1;
        ms_free(win);
    }
    ck_assert_int_eq(op_window_average(&be, acc, c, h, w, wh, ww, sh, sw), MS_OK);
    for (int ch = 0; ch < c; ch++)
        for (size_t p = 0; p < (size_t)h * w; p++) {
            ck_assert(cnt[p] >= 1);
            ck_assert_double_eq_tol(acc[(size_t)ch * h * w + p], sum[(size_t)ch * h * w + p] / cnt[p],
                                    1e-6);
        }
    ck_assert_int_ne(op_window_add(&be, acc, acc, c, h, w, wh, ww, 5, 0, false), MS_OK); /* off the map */
    ms_free(acc); free(sum); free(cnt);
}
END_TEST

/* Both builds of the vector math against scalar expf (FMA in the argument and
 * libmvec's 1 ulp: within 1e-6 relative), at lengths that leave
 * vector tails, with the sum; and the path switch itself. */
START_TEST(test_vmath_paths)
{
    ms_cpu_path start = cpu_path_get();
    /* the start path: the best one the CPU runs, or a lower one asked for */
    const char *env = getenv("MS_CPU_PATH");
    int n_paths = cpu_path_count(), want = n_paths - 1;
    for (int pi = 0; env && pi < n_paths; pi++)
        if (strcmp(env, cpu_path_name((ms_cpu_path)pi)) == 0) want = pi;
    ck_assert_int_eq(start, (ms_cpu_path)want);
    ck_assert(cpu_path_supported(MS_CPU_PATH_BASE));
    for (int pi = n_paths; pi < MS_CPU_PATH_COUNT; pi++) {
        ck_assert(!cpu_path_supported((ms_cpu_path)pi));
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_ERR_UNSUPPORTED);
    }
    for (int pi = 0; pi < n_paths; pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        ck_assert_int_eq(cpu_path_get(), (ms_cpu_path)pi);
        for (int n = 0; n <= 37; n += (n < 20 ? 1 : 17)) {
            float x[64], y[64];
            for (int i = 0; i < n; i++) x[i] = y[i] = (float)((i * 37) % 23) * 0.7f - 9.0f;
            float sum = vm_exp_sum(x, n, 0.37f, 1.5f);
            double ref_sum = 0;
            for (int i = 0; i < n; i++) {
                float e = expf(y[i] * 0.37f - 1.5f);
                ref_sum += e;
                ck_assert_msg(fabsf(x[i] - e) <= 1e-6f * e, "path %s n %d i %d: %g vs %g",
                              cpu_path_name((ms_cpu_path)pi), n, i, x[i], e);
            }
            ck_assert(fabs(sum - ref_sum) <= 1e-6 * ref_sum + 1e-30);
        }
    }
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

START_TEST(test_softmax_rows)
{
    ms_backend be = cpu_backend();
    const int rows = 9, cols = 131;
    float *x = frand((size_t)rows * cols, 15, -5, 5);
    /* row 0: huge logits, which overflow exp() without the max subtraction */
    for (int j = 0; j < cols; j++) x[j] += 1000.0f;
    double *want = dalloc((size_t)rows * cols);
    for (int i = 0; i < rows; i++) {
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < cols; j++) mx = fmax(mx, x[i * cols + j]);
        for (int j = 0; j < cols; j++) sum += exp(x[i * cols + j] - mx);
        for (int j = 0; j < cols; j++) want[i * cols + j] = exp(x[i * cols + j] - mx) / sum;
    }
    ck_assert_int_eq(op_softmax_rows(&be, x, rows, cols), MS_OK);
    /* expf of arguments up to 10 in magnitude: ~1e-6 relative */
    check_close(x, want, (size_t)rows * cols, 1e-6, "softmax_rows");
    ms_free(x); free(want);
}
END_TEST

START_TEST(test_argmax_normalize)
{
    ms_backend be = cpu_backend();
    const int c = 5, h = 3, w = 4;
    float *in = frand((size_t)c * h * w, 16, -1, 1);
    /* pixel 0: classes 1 and 3 tie at the max; pixel 1: all tie */
    in[1 * h * w + 0] = 5.0f;
    in[3 * h * w + 0] = 5.0f;
    for (int k = 0; k < c; k++) in[k * h * w + 1] = 2.0f;
    uint8_t out[12];
    ck_assert_int_eq(op_argmax(&be, out, in, c, h, w), MS_OK);
    ck_assert_int_eq(out[0], 1);
    ck_assert_int_eq(out[1], 0);
    for (int p = 2; p < h * w; p++) {
        int best = 0;
        for (int k = 1; k < c; k++)
            if (in[k * h * w + p] > in[best * h * w + p]) best = k;
        ck_assert_int_eq(out[p], best);
    }

    const int ih = 5, iw = 6, hp = 8, wp = 7;
    const float mean[3] = {123.675f, 116.28f, 103.53f}, stdv[3] = {58.395f, 57.12f, 57.375f};
    float *img = frand((size_t)3 * ih * iw, 17, 0, 255), *o = falloc((size_t)3 * hp * wp);
    for (size_t i = 0; i < (size_t)3 * hp * wp; i++) o[i] = NAN; /* padding must be written */
    ck_assert_int_eq(op_normalize_pad(&be, o, img, ih, iw, hp, wp, mean, stdv), MS_OK);
    double *want = dalloc((size_t)3 * hp * wp);
    for (int k = 0; k < 3; k++)
        for (int y = 0; y < hp; y++)
            for (int x = 0; x < wp; x++)
                want[(k * hp + y) * wp + x] =
                    (y < ih && x < iw) ? (img[(k * ih + y) * iw + x] - mean[k]) / stdv[k] : 0.0;
    check_close(o, want, (size_t)3 * hp * wp, 1e-6, "normalize_pad"); /* two roundings */
    ms_free(in); ms_free(img); ms_free(o); free(want);
}
END_TEST

/* ---------- pooling ---------- */

START_TEST(test_adaptive_pool)
{
    ms_backend be = cpu_backend();
    /* 5 -> 3 overlaps: windows [0,2), [1,4), [3,5) */
    ck_assert_int_eq(adaptive_pool_start(1, 5, 3), 1);
    ck_assert_int_eq(adaptive_pool_end(0, 5, 3), 2);
    ck_assert_int_eq(adaptive_pool_end(1, 5, 3), 4);
    ck_assert_int_eq(adaptive_pool_start(2, 5, 3), 3);
    const float col[5] = {1, 2, 4, 8, 16};
    float got[3];
    ck_assert_int_eq(op_adaptive_avgpool(&be, got, col, 1, 5, 1, 3, 1), MS_OK);
    ck_assert_float_eq_tol(got[0], 1.5f, 1e-6f);
    ck_assert_float_eq_tol(got[1], 14.0f / 3.0f, 1e-6f);
    ck_assert_float_eq_tol(got[2], 12.0f, 1e-6f);

    /* random, odd sizes, both axes overlapping; also upsampling (G > S) */
    const int cases[3][4] = {{11, 7, 3, 4}, {6, 6, 6, 1}, {3, 5, 6, 2}};
    for (int cs = 0; cs < 3; cs++) {
        int c = 4, h = cases[cs][0], w = cases[cs][1], gh = cases[cs][2], gw = cases[cs][3];
        float *in = frand((size_t)c * h * w, 18 + cs, -1, 1), *out = falloc((size_t)c * gh * gw);
        double *want = dalloc((size_t)c * gh * gw);
        for (int k = 0; k < c; k++)
            for (int i = 0; i < gh; i++)
                for (int j = 0; j < gw; j++) {
                    int y0 = (int)floor((double)i * h / gh), y1 = (int)ceil((double)(i + 1) * h / gh);
                    int x0 = (int)floor((double)j * w / gw), x1 = (int)ceil((double)(j + 1) * w / gw);
                    double s = 0;
                    for (int y = y0; y < y1; y++)
                        for (int x = x0; x < x1; x++) s += in[(k * h + y) * w + x];
                    want[(k * gh + i) * gw + j] = s / ((y1 - y0) * (x1 - x0));
                }
        ck_assert_int_eq(op_adaptive_avgpool(&be, out, in, c, h, w, gh, gw), MS_OK);
        check_close(out, want, (size_t)c * gh * gw, 1e-6, "adaptive_avgpool"); /* <= 12-term sums */
        ms_free(in); ms_free(out); free(want);
    }
}
END_TEST

START_TEST(test_maxpool)
{
    ms_backend be = cpu_backend();
    const int c = 3, h = 7, w = 9, ho = 3, wo = 4; /* odd: last row and column dropped */
    float *in = frand((size_t)c * h * w, 21, -1, 1), *out = falloc((size_t)c * ho * wo);
    ck_assert_int_eq(op_maxpool2x2(&be, out, in, c, h, w), MS_OK);
    for (int k = 0; k < c; k++)
        for (int y = 0; y < ho; y++)
            for (int x = 0; x < wo; x++) {
                float m = -INFINITY;
                for (int dy = 0; dy < 2; dy++)
                    for (int dx = 0; dx < 2; dx++)
                        m = fmaxf(m, in[(k * h + 2 * y + dy) * w + 2 * x + dx]);
                ck_assert_float_eq(out[(k * ho + y) * wo + x], m);
            }
    ms_free(in); ms_free(out);
}
END_TEST

/* ---------- convolutions ---------- */

static void naive_conv2d(double *out, const float *in, const float *w, const float *b, int ci,
                         int h, int wd, int co, int kh, int kw, int stride, int pad, ms_act act)
{
    int ho = (h + 2 * pad - kh) / stride + 1, wo = (wd + 2 * pad - kw) / stride + 1;
    for (int o = 0; o < co; o++)
        for (int y = 0; y < ho; y++)
            for (int x = 0; x < wo; x++) {
                double s = b ? b[o] : 0.0;
                for (int c = 0; c < ci; c++)
                    for (int ky = 0; ky < kh; ky++)
                        for (int kx = 0; kx < kw; kx++) {
                            int iy = y * stride - pad + ky, ix = x * stride - pad + kx;
                            if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                            s += (double)in[(c * h + iy) * wd + ix] *
                                 w[((o * ci + c) * kh + ky) * kw + kx];
                        }
                out[(o * ho + y) * wo + x] = naive_act(s, act);
            }
}

START_TEST(test_conv2d)
{
    ms_backend be = cpu_backend();
    /* ci, h, w, co, k, stride, pad, act */
    const int cases[][8] = {
        {5, 11, 9, 7, 3, 1, 1, MS_ACT_RELU},   /* 3x3 ConvModule */
        {3, 13, 10, 6, 3, 2, 1, MS_ACT_NONE},  /* stride-2 stem conv, odd input */
        {4, 9, 7, 5, 1, 1, 0, MS_ACT_GELU},    /* 1x1: direct GEMM path */
        {6, 8, 9, 4, 1, 2, 0, MS_ACT_NONE},    /* 1x1 stride 2: im2col path */
        {3, 32, 48, 8, 16, 16, 0, MS_ACT_NONE},/* patch embedding */
        {2, 7, 6, 3, 5, 1, 2, MS_ACT_RELU},    /* 5x5, pad 2 */
    };
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        int ci = cases[cs][0], h = cases[cs][1], wd = cases[cs][2], co = cases[cs][3];
        int k = cases[cs][4], st = cases[cs][5], pad = cases[cs][6];
        ms_act act = (ms_act)cases[cs][7];
        int ho = conv_out_size(h, k, st, pad), wo = conv_out_size(wd, k, st, pad);
        size_t no = (size_t)co * ho * wo;
        float *in = frand((size_t)ci * h * wd, 30 + cs, -1, 1);
        float *w = frand((size_t)co * ci * k * k, 40 + cs, -1, 1);
        float *b = frand(co, 50 + cs, -1, 1), *out = falloc(no);
        double *want = dalloc(no);
        const float *bias = cs == 1 ? NULL : b;
        naive_conv2d(want, in, w, bias, ci, h, wd, co, k, k, st, pad, act);
        ck_assert_int_eq(op_conv2d(&be, out, in, w, bias, ci, h, wd, co, k, k, st, pad, act),
                         MS_OK);
        /* up to 768-term float sums (patch embedding) of O(1) terms: the
         * rounding error grows like sqrt(K) * 6e-8 * |partial sums| ~ 1e-5 */
        check_close(out, want, no, 1e-5, "conv2d");
        /* banded im2col: scratch for one row, then for 2.5 rows (ragged last band) */
        if (k > 1 || st > 1) {
            size_t row = (size_t)ci * k * k * wo;
            size_t sizes[2] = {row, row * 5 / 2};
            for (int s = 0; s < 2; s++) {
                float *ws = falloc(sizes[s]);
                memset(out, 0, no * sizeof(float));
                conv2d_cpu(out, in, w, bias, ci, h, wd, co, k, k, st, pad, act, ws, sizes[s]);
                check_close(out, want, no, 1e-5, "conv2d banded");
                ms_free(ws);
            }
        }
        ms_free(in); ms_free(w); ms_free(b); ms_free(out); free(want);
    }
}
END_TEST

START_TEST(test_conv_transpose)
{
    ms_backend be = cpu_backend();
    const int ci = 5, h = 4, wd = 7, co = 3;
    size_t no = (size_t)co * 4 * h * wd;
    float *in = frand((size_t)ci * h * wd, 60, -1, 1), *w = frand((size_t)ci * co * 4, 61, -1, 1);
    float *b = frand(co, 62, -1, 1), *out = falloc(no);
    double *want = dalloc(no);
    for (int act = 0; act < 3; act++) {
        for (int o = 0; o < co; o++)
            for (int y = 0; y < 2 * h; y++)
                for (int x = 0; x < 2 * wd; x++) {
                    double s = b[o];
                    for (int c = 0; c < ci; c++)
                        s += (double)in[(c * h + y / 2) * wd + x / 2] *
                             w[((c * co + o) * 2 + y % 2) * 2 + x % 2];
                    want[(o * 2 * h + y) * 2 * wd + x] = naive_act(s, (ms_act)act);
                }
        ck_assert_int_eq(op_conv_transpose2x2(&be, out, in, w, b, ci, h, wd, co, (ms_act)act),
                         MS_OK);
        check_close(out, want, no, 1e-6, "conv_transpose2x2"); /* 5-term sums */
        /* one input row per band */
        float *ws = falloc((size_t)4 * co * wd);
        memset(out, 0, no * sizeof(float));
        conv_transpose2x2_cpu(out, in, w, b, ci, h, wd, co, (ms_act)act, ws, (size_t)4 * co * wd);
        check_close(out, want, no, 1e-6, "conv_transpose2x2 banded");
        ms_free(ws);
    }
    ms_free(in); ms_free(w); ms_free(b); ms_free(out); free(want);
}
END_TEST

/* ---------- resizes ---------- */

/* Expected values from PyTorch 1.13 (/usr/bin/python3), F.interpolate(x,
 * ..., align_corners=False) on x[i] = ((i*37) % 17)/4 - 2, i over the h*w
 * input in row-major order, shape (1, 1, h, w). */
/* bilinear, size=(7, 3) from 4x5 */
static const float bilin_4x5_to_7x3[] = {
    -1.75f, -0.5000001f, 0.7499999f, -0.9166665f, -0.6785715f, 0.5714285f, 0.4166668f,
    -0.9642858f, 0.2857142f, 1.041667f, -1.25f, -1.41561e-07f, 1.464286f, -1.535714f,
    -0.2857144f, 1.178571f, -1.821428f, -0.5714287f, 1.0f, -2.0f, -0.7500001f};
/* bilinear, size=(3, 2) from 4x5 */
static const float bilin_4x5_to_3x2[] = {-1.34375f, 0.3541667f, 0.4687502f,
                                         -0.3125f,  1.395833f,  -0.9791667f};
/* bilinear, scale_factor=0.5 from 5x7 (output 2x3, coordinates by 1/0.5 = 2,
 * not by the size ratios 2.5 and 2.33) */
static const float bilin_5x7_scale_0_5[] = {-1.125f, 0.375f, 0.8125f, 0.875f, -0.8125f, -0.375f};
/* bilinear, scale_factor=1.7 from 5x7 (output 8x11) */
static const float bilin_5x7_scale_1_7[] = {
    -2.0f, -1.713235f, -1.272059f, -0.8308823f, -0.3897058f, 0.05147067f, 0.4926472f, 0.9338236f,
    1.375f, 1.441176f, -0.6176481f, -1.617647f, -1.330882f, -0.8897058f, -0.4485294f,
    -0.007352812f, 0.4338236f, 0.8750002f, 1.316177f, 0.9448527f, 0.3419113f, -0.76103f,
    -1.029412f, -0.742647f, -0.3014704f, 0.139706f, 0.5808825f, 1.022059f, 1.463235f, 1.904412f,
    0.2830873f, -1.349265f, -0.9816175f, -0.4411764f, -0.1544117f, 0.2867648f, 0.7279413f,
    0.8198528f, -0.1360297f, -0.3235295f, 0.117647f, -0.3786768f, -0.8749998f, -0.4338233f,
    0.1470589f, 0.4338237f, 0.8750002f, 0.9669116f, 0.5992641f, -1.091912f, -1.610294f,
    -1.169117f, -0.7279409f, -0.2867644f, 0.1544121f, 0.7352942f, 1.022059f, 1.463235f,
    0.1580879f, -0.9448533f, -1.165441f, -1.022059f, -0.5808821f, -0.1397056f, 0.3014709f,
    0.7426474f, 1.323529f, 1.084559f, 0.7169111f, -0.4889708f, -1.316176f, -0.8749998f,
    -0.4338232f, 0.007353213f, 0.4485297f, 0.7683823f, 0.4007348f, 1.911765f, 0.7169116f,
    -1.121324f, -1.003677f, -0.7279409f, -0.2867645f, 0.154412f, 0.5955885f, 1.036765f,
    1.136029f, -0.702207f};
/* bicubic, size=(7, 9) from 4x5 */
static const float bicub_4x5_to_7x9[] = {
    -2.490195f, -2.04487f, -1.357459f, -0.8133888f, -0.4503924f, -0.04401343f, 0.4179214f,
    0.8551646f, 1.125226f, -0.5947216f, -1.049724f, -1.629395f, -1.368875f, -0.639623f,
    -0.2117324f, 0.2286905f, 0.6659334f, 0.9359946f, 1.906694f, 0.418861f, -1.639553f,
    -1.897508f, -0.9482965f, -0.5257598f, -0.07998302f, 0.3572599f, 0.627321f, 2.077241f,
    1.416522f, 0.3785262f, -0.7208613f, -1.25f, -1.018519f, -0.381687f, 0.05555603f, 0.3256171f,
    1.102886f, 1.701561f, 2.301017f, 0.5627847f, -1.551703f, -1.511276f, -0.6833904f,
    -0.2461475f, 0.02391352f, 0.7876539f, 1.416981f, 2.055698f, 0.297389f, -1.860376f,
    -1.825304f, -0.9920639f, -0.554821f, -0.2847599f, 0.6247746f, 1.130948f, 1.611914f,
    -0.06572701f, -2.049608f, -1.993024f, -1.181295f, -0.744052f, -0.473991f};
/* bicubic, size=(3, 2) from 4x5 */
static const float bicub_4x5_to_3x2[] = {-1.48876f, 0.4359448f, 0.6718143f,
                                         -0.2509766f, 1.827147f, -0.9378978f};
/* bicubic, size=(9, 4) from 4x5 */
static const float bicub_4x5_to_9x4[] = {
    -2.288566f, -0.8417049f, 0.001111024f, 0.983655f, -1.454648f, -1.13217f, -0.1114376f,
    0.8662426f, 0.1359478f, -1.842948f, -0.2804022f, 0.6716264f, 1.500005f, -1.83066f,
    -0.6049579f, 0.3898836f, 1.727226f, -0.6147575f, -0.9432983f, 0.1793213f, 1.390609f,
    0.6703187f, -1.281639f, -0.03124101f, 1.175072f, 0.8763946f, -1.606194f, -0.3129838f,
    0.9358032f, 0.3901094f, -1.775159f, -0.5075999f, 0.8099242f, 0.2173949f, -1.887708f,
    -0.6250125f};

static float *torch_input(int h, int w)
{
    float *x = falloc((size_t)h * w);
    for (int i = 0; i < h * w; i++) x[i] = (float)((i * 37) % 17) / 4.0f - 2.0f;
    return x;
}

START_TEST(test_resize_torch)
{
    ms_backend be = cpu_backend();
    struct {
        const float *want;
        int h, w, ho, wo;
        double scale; /* 0: to a size */
        bool cubic;
    } cases[] = {
        {bilin_4x5_to_7x3, 4, 5, 7, 3, 0, false},    {bilin_4x5_to_3x2, 4, 5, 3, 2, 0, false},
        {bilin_5x7_scale_0_5, 5, 7, 2, 3, 0.5, false}, {bilin_5x7_scale_1_7, 5, 7, 8, 11, 1.7, false},
        {bicub_4x5_to_7x9, 4, 5, 7, 9, 0, true},     {bicub_4x5_to_3x2, 4, 5, 3, 2, 0, true},
        {bicub_4x5_to_9x4, 4, 5, 9, 4, 0, true},
    };
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        float *in = torch_input(cases[cs].h, cases[cs].w);
        float *out = falloc((size_t)cases[cs].ho * cases[cs].wo);
        ms_status st = cases[cs].cubic
                           ? op_resize_bicubic(&be, out, in, 1, cases[cs].h, cases[cs].w,
                                               cases[cs].ho, cases[cs].wo)
                           : op_resize_bilinear(&be, out, in, 1, cases[cs].h, cases[cs].w,
                                                cases[cs].ho, cases[cs].wo, cases[cs].scale,
                                                cases[cs].scale);
        ck_assert_int_eq(st, MS_OK);
        /* values pasted with 7 significant digits; a few float roundings */
        check_close_f(out, cases[cs].want, (size_t)cases[cs].ho * cases[cs].wo, 2e-6,
                      cases[cs].cubic ? "bicubic vs torch" : "bilinear vs torch");
        ms_free(in); ms_free(out);
    }
}
END_TEST

/* Naive bilinear with the coordinates in double. */
static void naive_bilinear(double *out, const float *in, int c, int h, int w, int ho, int wo,
                           double sh, double sw)
{
    double rh = sh > 0 ? 1.0 / sh : (double)h / ho, rw = sw > 0 ? 1.0 / sw : (double)w / wo;
    for (int k = 0; k < c; k++)
        for (int y = 0; y < ho; y++)
            for (int x = 0; x < wo; x++) {
                double sy = fmax((y + 0.5) * rh - 0.5, 0), sx = fmax((x + 0.5) * rw - 0.5, 0);
                int y0 = (int)sy, x0 = (int)sx;
                int y1 = y0 + 1 < h ? y0 + 1 : h - 1, x1 = x0 + 1 < w ? x0 + 1 : w - 1;
                double ty = sy - y0, tx = sx - x0;
                const float *p = in + (size_t)k * h * w;
                out[(k * ho + y) * wo + x] =
                    (1 - ty) * ((1 - tx) * p[y0 * w + x0] + tx * p[y0 * w + x1]) +
                    ty * ((1 - tx) * p[y1 * w + x0] + tx * p[y1 * w + x1]);
            }
}

START_TEST(test_resize_bilinear_random)
{
    ms_backend be = cpu_backend();
    /* h, w, ho, wo, scale (0: to a size): the decoder's resizes */
    const double cases[][5] = {
        {8, 12, 32, 48, 4}, {8, 12, 16, 24, 2}, {9, 13, 4, 6, 0.5}, {9, 13, 31, 17, 0},
        {5, 5, 5, 5, 0},    {1, 3, 4, 4, 0},
    };
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        int c = 3, h = (int)cases[cs][0], w = (int)cases[cs][1];
        int ho = (int)cases[cs][2], wo = (int)cases[cs][3];
        double sc = cases[cs][4];
        float *in = frand((size_t)c * h * w, 70 + cs, -1, 1), *out = falloc((size_t)c * ho * wo);
        double *want = dalloc((size_t)c * ho * wo);
        naive_bilinear(want, in, c, h, w, ho, wo, sc, sc);
        ck_assert_int_eq(op_resize_bilinear(&be, out, in, c, h, w, ho, wo, sc, sc), MS_OK);
        /* float coordinates are off by ~1 ulp of the source index (<1e-6) */
        check_close(out, want, (size_t)c * ho * wo, 1e-5, "bilinear");
        ms_free(in); ms_free(out); free(want);
    }
}
END_TEST

/* ---------- full attention ---------- */

static void naive_attention(double *out, const float *qkv, int n, int c, int heads)
{
    int d = c / heads;
    double s = 1.0 / sqrt(d);
    double *p = dalloc(n);
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < n; i++) {
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < n; j++) {
                double dot = 0;
                for (int t = 0; t < d; t++)
                    dot += (double)qkv[(size_t)i * 3 * c + h * d + t] *
                           qkv[(size_t)j * 3 * c + c + h * d + t];
                p[j] = dot * s;
                mx = fmax(mx, p[j]);
            }
            for (int j = 0; j < n; j++) sum += (p[j] = exp(p[j] - mx));
            for (int t = 0; t < d; t++) {
                double acc = 0;
                for (int j = 0; j < n; j++) acc += p[j] * qkv[(size_t)j * 3 * c + 2 * c + h * d + t];
                out[(size_t)i * c + h * d + t] = acc / sum;
            }
        }
    free(p);
}

START_TEST(test_attention_full)
{
    ms_backend be = cpu_backend();
    /* n, c, heads, qb, kb (0: the op's defaults through the dispatcher) */
    const int cases[][5] = {
        {600, 24, 3, 0, 0},  /* 2 key blocks of the default 512, the second ragged (+ 88) */
        {61, 16, 2, 7, 5},   /* many ragged query and key blocks */
        {1, 8, 1, 0, 0},     /* one token */
        {40, 12, 1, 64, 13}, /* query block bigger than n */
    };
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        int n = cases[cs][0], c = cases[cs][1], heads = cases[cs][2];
        /* q, k in [-3, 3]: logits up to ~20, so the running max moves a lot */
        float *qkv = frand((size_t)n * 3 * c, 80 + cs, -3, 3), *out = falloc((size_t)n * c);
        double *want = dalloc((size_t)n * c);
        naive_attention(want, qkv, n, c, heads);
        if (cases[cs][3] == 0) {
            ck_assert_int_eq(op_attention_full(&be, out, qkv, n, c, heads), MS_OK);
        } else {
            int qb = cases[cs][3], kb = cases[cs][4];
            float *ws = falloc(attention_full_scratch_floats(n, c, qb, kb, 2));
            attention_full_cpu(out, qkv, n, c, heads, qb, kb, ws, 2);
            ms_free(ws);
        }
        /* logits ~20 carry float error ~20 * 1e-7; exp turns it into
         * relative error 2e-6 of the weights; outputs are O(3) */
        check_close(out, want, (size_t)n * c, 2e-5, "attention_full");
        ms_free(qkv); ms_free(out); free(want);
    }
}
END_TEST

/* ---------- MiTA ---------- */

typedef struct {
    double *out;     /* (n, c) */
    int32_t *topk;   /* (heads, m, k) */
    int32_t *route;  /* (heads, n) */
    double *mass;    /* (heads, n) */
    double *shared;  /* (heads, n, d): the shared-only attention sum_m softmax_m(a) Sv[m] */
} naive_mita_result;

/* Spec section 2 written out per query in double; gh, gw, k already clamped. */
static naive_mita_result naive_mita(const float *qkv, int hp, int wp, int c, int heads, int gh,
                                    int gw, int k, bool shared_scale_d)
{
    int n = hp * wp, m = gh * gw, d = c / heads, ld = 3 * c;
    double s = 1.0 / sqrt(d), s_sh = shared_scale_d ? s : 1.0;
    naive_mita_result r;
    r.out = dalloc((size_t)n * c);
    r.topk = calloc((size_t)heads * m * k, sizeof(int32_t));
    r.route = calloc((size_t)heads * n, sizeof(int32_t));
    r.mass = dalloc((size_t)heads * n);
    r.shared = dalloc((size_t)heads * n * d);
    double *land = dalloc((size_t)m * c), *P = dalloc((size_t)m * n), *sv = dalloc((size_t)m * d);
    double *logit = dalloc((size_t)m + k);
    bool *taken = calloc(n, sizeof(bool));
    ck_assert_ptr_nonnull(r.topk);
    ck_assert_ptr_nonnull(r.route);
    ck_assert_ptr_nonnull(taken);
    for (int i = 0; i < gh; i++)
        for (int j = 0; j < gw; j++) {
            int y0 = (int)floor((double)i * hp / gh), y1 = (int)ceil((double)(i + 1) * hp / gh);
            int x0 = (int)floor((double)j * wp / gw), x1 = (int)ceil((double)(j + 1) * wp / gw);
            for (int ch = 0; ch < c; ch++) {
                double a = 0;
                for (int y = y0; y < y1; y++)
                    for (int x = x0; x < x1; x++) a += qkv[(size_t)(y * wp + x) * ld + ch];
                land[(i * gw + j) * c + ch] = a / ((y1 - y0) * (x1 - x0));
            }
        }
    for (int h = 0; h < heads; h++) {
        for (int e = 0; e < m; e++) {
            for (int p = 0; p < n; p++) {
                double dot = 0;
                for (int t = 0; t < d; t++)
                    dot += land[e * c + h * d + t] * qkv[(size_t)p * ld + c + h * d + t];
                P[e * n + p] = dot;
            }
            /* top-k by repeated selection: best score, then lowest position */
            for (int p = 0; p < n; p++) taken[p] = false;
            for (int t = 0; t < k; t++) {
                int best = -1;
                for (int p = 0; p < n; p++)
                    if (!taken[p] && (best < 0 || P[e * n + p] > P[e * n + best])) best = p;
                taken[best] = true;
                r.topk[((size_t)h * m + e) * k + t] = best;
            }
            double mx = -INFINITY, sum = 0;
            for (int p = 0; p < n; p++) mx = fmax(mx, P[e * n + p] * s);
            for (int t = 0; t < d; t++) sv[e * d + t] = 0;
            for (int p = 0; p < n; p++) {
                double wgt = exp(P[e * n + p] * s - mx);
                sum += wgt;
                for (int t = 0; t < d; t++) sv[e * d + t] += wgt * qkv[(size_t)p * ld + 2 * c + h * d + t];
            }
            for (int t = 0; t < d; t++) sv[e * d + t] /= sum;
        }
        for (int q = 0; q < n; q++) {
            const float *qv = qkv + (size_t)q * ld + h * d;
            int e = 0;
            double best = -INFINITY;
            for (int mi = 0; mi < m; mi++) {
                double dot = 0;
                for (int t = 0; t < d; t++) dot += qv[t] * land[mi * c + h * d + t];
                logit[mi] = dot * s * s_sh;
                if (dot > best) { best = dot; e = mi; }
            }
            r.route[(size_t)h * n + q] = e;
            const int32_t *ids = r.topk + ((size_t)h * m + e) * k;
            for (int j = 0; j < k; j++) {
                double dot = 0;
                for (int t = 0; t < d; t++) dot += qv[t] * qkv[(size_t)ids[j] * ld + c + h * d + t];
                logit[m + j] = dot * s;
            }
            /* one joint softmax over all m + k logits */
            double mx = -INFINITY, sum = 0, sum_sh = 0;
            for (int j = 0; j < m + k; j++) mx = fmax(mx, logit[j]);
            for (int j = 0; j < m + k; j++) sum += exp(logit[j] - mx);
            for (int j = 0; j < m; j++) sum_sh += exp(logit[j] - mx);
            r.mass[(size_t)h * n + q] = sum_sh / sum;
            for (int t = 0; t < d; t++) {
                double acc = 0, acc_sh = 0;
                for (int j = 0; j < m; j++) acc_sh += exp(logit[j] - mx) * sv[j * d + t];
                acc = acc_sh;
                for (int j = 0; j < k; j++)
                    acc += exp(logit[m + j] - mx) * qkv[(size_t)ids[j] * ld + 2 * c + h * d + t];
                r.out[(size_t)q * c + h * d + t] = acc / sum;
                r.shared[((size_t)h * n + q) * d + t] = acc_sh / sum_sh;
            }
        }
    }
    free(land); free(P); free(sv); free(logit); free(taken);
    return r;
}

static void naive_mita_free(naive_mita_result *r)
{
    free(r->out); free(r->topk); free(r->route); free(r->mass); free(r->shared);
}

typedef struct {
    float *out;
    int32_t *topk, *route;
    float *mass;
} mita_run;

static mita_run run_mita(ms_backend *be, const float *qkv, int hp, int wp, int c, int heads,
                         const ms_mita_params *p, int m, int k)
{
    int n = hp * wp;
    mita_run r;
    r.out = falloc((size_t)n * c);
    r.topk = calloc((size_t)heads * m * k, sizeof(int32_t));
    r.route = calloc((size_t)heads * n, sizeof(int32_t));
    r.mass = falloc((size_t)heads * n);
    ck_assert_ptr_nonnull(r.topk);
    ck_assert_ptr_nonnull(r.route);
    ms_mita_record rec = {r.topk, r.route, r.mass};
    ck_assert_int_eq(op_mita(be, r.out, qkv, hp, wp, c, heads, p, &rec), MS_OK);
    return r;
}

static void mita_run_free(mita_run *r)
{
    ms_free(r->out); free(r->topk); free(r->route); ms_free(r->mass);
}

START_TEST(test_mita_vs_naive)
{
    ms_backend be = cpu_backend();
    /* hp, wp, c, heads, gh, gw, topk as given, shared_scale_d; the caller's
     * values are clamped by op_mita (M > grid, k > n) */
    const int cases[][8] = {
        {7, 11, 24, 3, 3, 4, 9, 1},   /* non-square grid, overlapping windows */
        {5, 6, 16, 2, 2, 3, 30, 0},   /* k = n */
        {3, 4, 8, 2, 5, 7, 20, 1},    /* grid smaller than 5x7 landmarks, k > n */
        {9, 9, 32, 4, 7, 7, 49, 1},   /* default M and k, many experts */
        {1, 1, 8, 2, 7, 7, 49, 0},    /* one token */
    };
    int unused_experts = 0; /* (head, expert) pairs no query is routed to */
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        int hp = cases[cs][0], wp = cases[cs][1], c = cases[cs][2], heads = cases[cs][3];
        ms_mita_params p = {cases[cs][4], cases[cs][5], cases[cs][6], cases[cs][7] != 0};
        int gh, gw, k, n = hp * wp;
        mita_clamp(&gh, &gw, &k, hp, wp, &p);
        ck_assert_int_eq(gh, cases[cs][4] < hp ? cases[cs][4] : hp);
        ck_assert_int_eq(gw, cases[cs][5] < wp ? cases[cs][5] : wp);
        ck_assert_int_eq(k, cases[cs][6] < n ? cases[cs][6] : n);
        int m = gh * gw, d = c / heads;
        float *qkv = frand((size_t)n * 3 * c, 90 + cs, -2, 2);
        naive_mita_result want = naive_mita(qkv, hp, wp, c, heads, gh, gw, k, p.shared_scale_d);
        mita_run got = run_mita(&be, qkv, hp, wp, c, heads, &p, m, k);
        /* Top-k sets and order, and routes: exact. Scores are float GEMM
         * sums vs double here; random data has no gaps near 1e-6, so the
         * orders agree (seeds fixed). */
        for (size_t i = 0; i < (size_t)heads * m * k; i++)
            ck_assert_msg(got.topk[i] == want.topk[i], "case %zu: topk[%zu] = %d, want %d", cs, i,
                          got.topk[i], want.topk[i]);
        for (size_t i = 0; i < (size_t)heads * n; i++)
            ck_assert_msg(got.route[i] == want.route[i], "case %zu: route[%zu] = %d, want %d", cs,
                          i, got.route[i], want.route[i]);
        /* logits up to ~|q||k|/sqrt(d) ~ 10 with float error 1e-6 each;
         * outputs O(2) */
        check_close(got.out, want.out, (size_t)n * c, 2e-5, "mita out");
        check_close(got.mass, want.mass, (size_t)heads * n, 1e-5, "mita shared_mass");
        for (int h = 0; h < heads; h++)
            for (int e = 0; e < m; e++) {
                bool used = false;
                for (int q = 0; q < n; q++) used |= got.route[h * n + q] == e;
                unused_experts += !used;
            }
        /* one token: every summary and routed value is v_0, so out = v_0 */
        if (n == 1)
            for (int j = 0; j < c; j++) ck_assert_float_eq_tol(got.out[j], qkv[2 * c + j], 1e-6f);
        (void)d;
        naive_mita_free(&want);
        mita_run_free(&got);
        ms_free(qkv);
    }
    /* the cases above must include experts that receive no query */
    ck_assert_int_gt(unused_experts, 0);
}
END_TEST

START_TEST(test_mita_ties)
{
    ms_backend be = cpu_backend();
    const int hp = 4, wp = 5, c = 8, heads = 2, n = hp * wp, d = c / heads;
    ms_mita_params p = {2, 2, 3, true};
    const int m = 4, k = 3;
    float *qkv = frand((size_t)n * 3 * c, 100, -1, 1);
    /* every query row all ones: landmarks are exactly ones, all experts tie
     * for every query (route 0) */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c; j++) qkv[(size_t)i * 3 * c + j] = 1.0f;
    /* keys: zero except positions 17, 4, 13, 9, 11 which are ones: those
     * tie for the max (exact sums of small integers in any order); the
     * lower positions win: 4, 9, 11 */
    const int hot[5] = {17, 4, 13, 9, 11};
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c; j++) qkv[(size_t)i * 3 * c + c + j] = 0.0f;
    for (int t = 0; t < 5; t++)
        for (int j = 0; j < c; j++) qkv[(size_t)hot[t] * 3 * c + c + j] = 1.0f;
    /* identical value rows: any convex combination is that row */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c; j++) qkv[(size_t)i * 3 * c + 2 * c + j] = (float)(j + 1) * 0.25f;
    mita_run got = run_mita(&be, qkv, hp, wp, c, heads, &p, m, k);
    for (int h = 0; h < heads; h++) {
        for (int e = 0; e < m; e++) {
            ck_assert_int_eq(got.topk[(h * m + e) * k + 0], 4);
            ck_assert_int_eq(got.topk[(h * m + e) * k + 1], 9);
            ck_assert_int_eq(got.topk[(h * m + e) * k + 2], 11);
        }
        for (int q = 0; q < n; q++) ck_assert_int_eq(got.route[h * n + q], 0);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c; j++)
            ck_assert_float_eq_tol(got.out[i * c + j], (float)(j + 1) * 0.25f, 1e-6f);
    mita_run_free(&got);

    /* all keys identical: every score ties, the first k positions win */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c; j++) qkv[(size_t)i * 3 * c + c + j] = 0.5f;
    got = run_mita(&be, qkv, hp, wp, c, heads, &p, m, k);
    for (int i = 0; i < heads * m; i++)
        for (int t = 0; t < k; t++) ck_assert_int_eq(got.topk[i * k + t], t);
    mita_run_free(&got);
    (void)d;
    ms_free(qkv);
}
END_TEST

START_TEST(test_mita_k_equals_n_is_full_attention_plus_summaries)
{
    /* With k = n every expert routes to all positions, so the routed part of
     * the joint softmax is exactly full attention: out = mass * A_shared +
     * (1 - mass) * op_attention_full, whatever the routing. Checks op_mita's
     * routed path and shared mass against the separate full-attention op. */
    ms_backend be = cpu_backend();
    const int hp = 6, wp = 7, c = 24, heads = 3, n = hp * wp, d = c / heads;
    ms_mita_params p = {3, 3, n, true};
    float *qkv = frand((size_t)n * 3 * c, 110, -2, 2), *full = falloc((size_t)n * c);
    ck_assert_int_eq(op_attention_full(&be, full, qkv, n, c, heads), MS_OK);
    naive_mita_result want = naive_mita(qkv, hp, wp, c, heads, 3, 3, n, true);
    mita_run got = run_mita(&be, qkv, hp, wp, c, heads, &p, 9, n);
    double *pred = dalloc((size_t)n * c);
    for (int h = 0; h < heads; h++)
        for (int q = 0; q < n; q++) {
            double mass = got.mass[h * n + q];
            for (int t = 0; t < d; t++)
                pred[q * c + h * d + t] = mass * want.shared[((size_t)h * n + q) * d + t] +
                                          (1 - mass) * full[q * c + h * d + t];
        }
    /* float op outputs (O(2)) combined in double: ~1e-6 */
    check_close(got.out, pred, (size_t)n * c, 2e-5, "mita k=n vs full attention");
    naive_mita_free(&want);
    mita_run_free(&got);
    free(pred);
    ms_free(qkv);
    ms_free(full);
}
END_TEST

START_TEST(test_mita_thread_count_independent)
{
    /* The threads take the same fixed items (experts, query blocks,
     * chunks of sorted queries) in any order: a wrong split or a missing
     * barrier shows here, and the results are bit-identical. */
    const int hp = 7, wp = 9, c = 16, heads = 2, n = hp * wp, gh = 3, gw = 4, k = 11;
    float *qkv = frand((size_t)n * 3 * c, 130, -2, 2);
    float *a = falloc((size_t)n * c), *b = falloc((size_t)n * c);
    int32_t ia[2 * 12 * 11], ib[2 * 12 * 11];
    ms_mita_record ra = {ia, NULL, NULL}, rb = {ib, NULL, NULL};
    void *ws = ms_malloc(mita_scratch_bytes(hp, wp, 0, c, heads, gh, gw, k, 3));
    ck_assert_ptr_nonnull(ws);
    mita_cpu(a, qkv, hp, wp, 0, c, heads, gh, gw, k, true, &ra, ws, 1);
    mita_cpu(b, qkv, hp, wp, 0, c, heads, gh, gw, k, true, &rb, ws, 3);
    ck_assert_mem_eq(a, b, (size_t)n * c * sizeof(float));
    ck_assert_mem_eq(ia, ib, sizeof ia);
    ms_free(ws); ms_free(qkv); ms_free(a); ms_free(b);
}
END_TEST

/* ---------- softmax helpers ---------- */

START_TEST(test_softmax_merge)
{
    /* two halves of [1, 3, -2, 0.5] merged equal the whole softmax */
    const float x[4] = {1.0f, 3.0f, -2.0f, 0.5f};
    float m1 = 3.0f, l1 = expf(1.0f - 3.0f) + 1.0f;
    float m2 = 0.5f, l2 = expf(-2.0f - 0.5f) + 1.0f;
    float m, l, c1, c2;
    softmax_merge(&m, &l, &c1, &c2, m1, l1, m2, l2);
    double whole = 0;
    for (int i = 0; i < 4; i++) whole += exp(x[i] - 3.0);
    ck_assert_float_eq(m, 3.0f);
    ck_assert_double_eq_tol(l, whole, 1e-6);
    ck_assert_float_eq(c1, 1.0f);
    ck_assert_double_eq_tol(c2, exp(0.5 - 3.0), 1e-7);
    /* an empty partial (m = -inf) contributes nothing */
    softmax_merge(&m, &l, &c1, &c2, -INFINITY, 0.0f, m2, l2);
    ck_assert_float_eq(m, m2);
    ck_assert_float_eq(l, l2);
    ck_assert_float_eq(c1, 0.0f);
    ck_assert(topk_before(2.0f, 7, 1.0f, 3));
    ck_assert(topk_before(1.0f, 3, 1.0f, 7));
    ck_assert(!topk_before(1.0f, 7, 1.0f, 3));
}
END_TEST

/* ---------- dispatcher contract ---------- */

START_TEST(test_dispatch_sizes)
{
    ms_backend be = cpu_backend();
    float x[4] = {0};
    ms_clear_error();
    ck_assert_int_eq(op_linear(&be, x, x, x, NULL, 0, 2, 2, MS_ACT_NONE, false), MS_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "op_linear"));
    ck_assert_int_eq(op_linear(&be, x, x, x, NULL, 1, 2, 2, MS_ACT_RELU, true), MS_ERR_ARG);
    ck_assert_int_eq(op_conv2d(&be, x, x, x, NULL, 1, 2, 2, 1, 3, 3, 1, 0, MS_ACT_NONE),
                     MS_ERR_ARG); /* 3x3 kernel on a 2x2 input, no padding */
    ck_assert_int_eq(op_attention_full(&be, x, x, 4, 10, 3), MS_ERR_ARG); /* 10 % 3 */
    ms_mita_params p = {0, 7, 49, true};
    ck_assert_int_eq(op_mita(&be, x, x, 2, 2, 4, 1, &p, NULL), MS_ERR_ARG);
    ck_assert_int_eq(op_crop(&be, x, x, 1, 2, 2, 3, 1), MS_ERR_ARG);
    ck_assert_int_eq(op_argmax(&be, (uint8_t *)x, x, 300, 1, 1), MS_ERR_ARG);
    ck_assert_int_eq(op_maxpool2x2(&be, x, x, 1, 1, 4), MS_ERR_ARG);
    ck_assert_int_eq(op_resize_bilinear(&be, x, x, 1, 2, 2, 0, 2, 0, 0), MS_ERR_ARG);
    ck_assert_int_eq(op_add(&be, x, x, x, 0), MS_ERR_ARG);
#ifndef MS_HAVE_CUDA
    be.device = MS_DEVICE_CUDA;
    ck_assert_int_eq(op_add(&be, x, x, x, 4), MS_ERR_UNSUPPORTED);
#endif
}
END_TEST

START_TEST(test_dispatch_scratch)
{
    /* A dry run touches no memory (NULL tensors) but takes the op's scratch
     * from a sizing arena; a real arena of that size then runs the op
     * without allocating, returns to its mark, and matches the heap path. */
    const int hp = 9, wp = 10, c = 16, heads = 2, n = hp * wp;
    ms_mita_params p = {7, 7, 49, true};
    ms_arena arena;
    ck_assert_int_eq(arena_init(&arena, 0, MS_DEVICE_CPU), MS_OK);
    arena_begin_sizing(&arena);
    ms_backend be = cpu_backend();
    be.scratch = &arena;
    be.dry_run = true;
    ck_assert_int_eq(op_mita(&be, NULL, NULL, hp, wp, c, heads, &p, NULL), MS_OK);
    ck_assert_int_eq(op_conv2d(&be, NULL, NULL, NULL, NULL, 8, 20, 30, 4, 3, 3, 1, 1, MS_ACT_RELU),
                     MS_OK);
    ck_assert_int_eq(op_attention_full(&be, NULL, NULL, n, c, heads), MS_OK);
    ck_assert_uint_eq(arena.used, 0);
    size_t need = arena.high;
    ck_assert_uint_ge(need, mita_scratch_bytes(hp, wp, 0, c, heads, 7, 7, 49, be.threads > 0 ? be.threads : 1));
    ck_assert_uint_ge(need, conv2d_scratch_floats(8, 20, 30, 4, 3, 3, 1, 1) * sizeof(float));
    arena_free(&arena);

    ck_assert_int_eq(arena_init(&arena, need, MS_DEVICE_CPU), MS_OK);
    be.dry_run = false;
    float *qkv = frand((size_t)n * 3 * c, 120, -1, 1);
    float *a = falloc((size_t)n * c), *b = falloc((size_t)n * c);
    ck_assert_int_eq(op_mita(&be, a, qkv, hp, wp, c, heads, &p, NULL), MS_OK);
    ck_assert_uint_eq(arena.used, 0);
    ms_backend heap = cpu_backend();
    ck_assert_int_eq(op_mita(&heap, b, qkv, hp, wp, c, heads, &p, NULL), MS_OK);
    check_close_f(a, b, (size_t)n * c, 0.0, "mita arena vs heap"); /* same code, same data */
    ck_assert_int_eq(op_attention_full(&be, a, qkv, n, c, heads), MS_OK);
    arena_free(&arena);

    /* an arena too small: an error, not a crash */
    ck_assert_int_eq(arena_init(&arena, 1024, MS_DEVICE_CPU), MS_OK);
    ck_assert_int_eq(op_mita(&be, a, qkv, hp, wp, c, heads, &p, NULL), MS_ERR_OOM);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "op_mita"));
    arena_free(&arena);
    ms_free(qkv); ms_free(a); ms_free(b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_gelu_values);
    tcase_add_test(tc, test_linear);
    tcase_add_test(tc, test_layernorm);
    tcase_add_test(tc, test_add_transpose_crop);
    tcase_add_test(tc, test_vmath_paths);
    tcase_add_test(tc, test_softmax_rows);
    tcase_add_test(tc, test_slide_windows);
    tcase_add_test(tc, test_argmax_normalize);
    tcase_add_test(tc, test_adaptive_pool);
    tcase_add_test(tc, test_maxpool);
    tcase_add_test(tc, test_conv2d);
    tcase_add_test(tc, test_conv_transpose);
    tcase_add_test(tc, test_resize_torch);
    tcase_add_test(tc, test_resize_bilinear_random);
    tcase_add_test(tc, test_attention_full);
    tcase_add_test(tc, test_softmax_merge);
    tcase_add_test(tc, test_mita_vs_naive);
    tcase_add_test(tc, test_mita_ties);
    tcase_add_test(tc, test_mita_k_equals_n_is_full_attention_plus_summaries);
    tcase_add_test(tc, test_mita_thread_count_independent);
    tcase_add_test(tc, test_dispatch_sizes);
    tcase_add_test(tc, test_dispatch_scratch);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
