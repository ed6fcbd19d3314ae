/* The vectorised elementwise paths (kernels/resize_simd.c,
 * kernels/elementwise_simd.c) against plain loops written here: the bilinear
 * resize, the linear layer's fused bias/activation epilogue with libmvec's
 * erff GELU, LayerNorm, add, the softmax rows and the per-pixel argmax.
 * Every check runs on each CPU path this machine has (cpu_path_set) and on 1
 * and 2 OpenMP threads; CMake
 * runs the whole file a second time with MS_CPU_PATH=base.
 *
 * Bit-for-bit claims: the base path does the same float operations in the
 * same order as the one-pass scalar loops, so it must match them exactly
 * where no sum is reordered (resize, bias, ReLU); the v3 path contracts
 * multiply-adds to FMA, so there the bounds are a few float roundings. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu_path.h"
#include "kernels/elementwise.h"
#include "kernels/elementwise_simd.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/ops.h"
#include "kernels/resize.h"
#include "testutil_ops.h"

static void use_path(int pi)
{
    ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
}

/* True when the path computes a*b + c with one rounding (FMA contraction),
 * so results can differ from the plain loops by float rounding. */
static bool path_fuses(int pi) { return pi >= MS_CPU_PATH_V3; }

/* ---------- bilinear resize ---------- */

/* The resize as it was before vectorising: taps per pixel, one-pass blend. */
static void old_bilinear(float *out, const float *in, int c, int h, int w, int ho, int wo,
                         int y_begin, int y_end, double sh, double sw)
{
    float rh = resize_ratio(h, ho, sh), rw = resize_ratio(w, wo, sw);
    int rows = y_end - y_begin;
    for (int ch = 0; ch < c; ch++)
        for (int r = 0; r < rows; r++) {
            int y0, y1;
            float wy0, wy1;
            bilinear_taps(&y0, &y1, &wy0, &wy1, y_begin + r, rh, h);
            const float *r0 = in + ((size_t)ch * h + y0) * w, *r1 = in + ((size_t)ch * h + y1) * w;
            for (int x = 0; x < wo; x++) {
                int x0, x1;
                float wx0, wx1;
                bilinear_taps(&x0, &x1, &wx0, &wx1, x, rw, w);
                out[((size_t)ch * rows + r) * wo + x] =
                    wy0 * (wx0 * r0[x0] + wx1 * r0[x1]) + wy1 * (wx0 * r1[x0] + wx1 * r1[x1]);
            }
        }
}

/* F.interpolate(align_corners=False) with the coordinates in double. */
static void double_bilinear(double *out, const float *in, int c, int h, int w, int ho, int wo,
                            double sh, double sw)
{
    double rh = sh > 0 ? 1.0 / sh : (double)h / ho, rw = sw > 0 ? 1.0 / sw : (double)w / wo;
    for (int k = 0; k < c; k++)
        for (int y = 0; y < ho; y++)
            for (int x = 0; x < wo; x++) {
                double sy = fmax((y + 0.5) * rh - 0.5, 0), sx = fmax((x + 0.5) * rw - 0.5, 0);
                int y0 = (int)sy < h - 1 ? (int)sy : h - 1, x0 = (int)sx < w - 1 ? (int)sx : w - 1;
                int y1 = y0 + 1 < h ? y0 + 1 : h - 1, x1 = x0 + 1 < w ? x0 + 1 : w - 1;
                double ty = fmin(sy - y0, 1), tx = fmin(sx - x0, 1);
                const float *p = in + (size_t)k * h * w;
                out[((size_t)k * ho + y) * wo + x] =
                    (1 - ty) * ((1 - tx) * p[y0 * w + x0] + tx * p[y0 * w + x1]) +
                    ty * ((1 - tx) * p[y1 * w + x0] + tx * p[y1 * w + x1]);
            }
}

/* Checks got against the old loops: equal on the base path, within a few
 * roundings of the largest input magnitude (inputs lie in [-1, 1)) on v3. */
static void check_vs_old(const float *got, const float *old, size_t n, int pi, const char *what,
                         int cs)
{
    for (size_t i = 0; i < n; i++) {
        if (!path_fuses(pi))
            ck_assert_msg(got[i] == old[i], "%s case %d path %s: [%zu] %.9g != %.9g", what, cs,
                          cpu_path_name((ms_cpu_path)pi), i, (double)got[i], (double)old[i]);
        else
            ck_assert_msg(fabsf(got[i] - old[i]) <= 3e-7f, "%s case %d path v3: [%zu] %.9g vs %.9g",
                          what, cs, i, (double)got[i], (double)old[i]);
    }
}

START_TEST(test_resize_bilinear_paths)
{
    ms_backend be = cpu_backend();
    /* c, h, w, ho, wo, scale (0: to a size). Up and down, by sizes and by the
     * scale factors the neck uses (4, 2, 0.5) and odd ones, 1-pixel inputs
     * and outputs, outputs wider than the 512-column tile, few channels (row
     * runs split across threads) and many. */
    const double cases[][6] = {
        {3, 8, 12, 32, 48, 4},   {3, 8, 12, 16, 24, 2},  {2, 9, 13, 4, 6, 0.5},
        {1, 5, 7, 8, 11, 1.7},   {1, 5, 7, 2, 3, 0.5},   {3, 9, 13, 31, 17, 0},
        {2, 5, 5, 5, 5, 0},      {1, 1, 3, 4, 4, 0},     {2, 1, 1, 7, 5, 0},
        {1, 6, 9, 1, 1, 0},      {2, 7, 1, 3, 9, 0},     {1, 3, 4, 1, 600, 0},
        {2, 17, 23, 67, 1100, 0}, {1, 64, 96, 9, 13, 0}, {37, 4, 5, 16, 20, 0},
        {1, 2, 600, 5, 1030, 0}, {3, 11, 3, 11, 3, 0},   {1, 33, 47, 129, 130, 0},
    };
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        use_path(pi);
        for (int t = 1; t <= 2; t++) {
            set_threads(t);
            for (int cs = 0; cs < (int)(sizeof cases / sizeof cases[0]); cs++) {
                int c = (int)cases[cs][0], h = (int)cases[cs][1], w = (int)cases[cs][2];
                int ho = (int)cases[cs][3], wo = (int)cases[cs][4];
                double sc = cases[cs][5];
                size_t no = (size_t)c * ho * wo;
                float *in = frand((size_t)c * h * w, 100 + (uint32_t)cs, -1, 1);
                float *out = falloc(no), *old = falloc(no);
                double *want = dalloc(no);
                ck_assert_int_eq(op_resize_bilinear(&be, out, in, c, h, w, ho, wo, sc, sc), MS_OK);
                old_bilinear(old, in, c, h, w, ho, wo, 0, ho, sc, sc);
                check_vs_old(out, old, no, pi, "bilinear", cs);
                double_bilinear(want, in, c, h, w, ho, wo, sc, sc);
                /* float coordinates (as PyTorch's): the source position is
                 * off by a few ulp of max(h, w), which moves a weight on
                 * inputs 2 apart; a wrong tap would move values by ~0.1 */
                double tol = 1e-6 + 8 * 1.2e-7 * (h > w ? h : w);
                for (size_t i = 0; i < no; i++)
                    ck_assert_msg(fabs(out[i] - want[i]) <= tol, "case %d [%zu]: %.9g vs %.9g",
                                  cs, i, (double)out[i], want[i]);
                /* bands of rows (the mask path) are the same rows of the whole */
                if (sc == 0) {
                    for (int y0 = 0; y0 < ho; y0 += 3) {
                        int y1 = y0 + 3 < ho ? y0 + 3 : ho, rows = y1 - y0;
                        float *band = falloc((size_t)c * rows * wo);
                        ck_assert_int_eq(
                            op_resize_bilinear_rows(&be, band, in, c, h, w, ho, wo, y0, y1), MS_OK);
                        for (int ch = 0; ch < c; ch++)
                            ck_assert(memcmp(band + (size_t)ch * rows * wo,
                                             out + ((size_t)ch * ho + y0) * wo,
                                             (size_t)rows * wo * sizeof(float)) == 0);
                        ms_free(band);
                    }
                }
                ms_free(in); ms_free(out); ms_free(old); free(want);
            }
        }
    }
    set_threads(2);
}
END_TEST

/* Non-finite inputs spread through the blend as in the old loops. */
START_TEST(test_resize_bilinear_nonfinite)
{
    ms_backend be = cpu_backend();
    const int h = 4, w = 5, ho = 9, wo = 11;
    float *in = frand((size_t)h * w, 7, -1, 1), *out = falloc((size_t)ho * wo);
    float *old = falloc((size_t)ho * wo);
    in[6] = NAN;
    in[13] = INFINITY;
    in[19] = -INFINITY;
    old_bilinear(old, in, 1, h, w, ho, wo, 0, ho, 0, 0);
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        use_path(pi);
        ck_assert_int_eq(op_resize_bilinear(&be, out, in, 1, h, w, ho, wo, 0, 0), MS_OK);
        for (int i = 0; i < ho * wo; i++) {
            ck_assert_msg(isnan(out[i]) == isnan(old[i]), "[%d] %g vs %g", i, (double)out[i],
                          (double)old[i]);
            if (!isfinite(old[i]) && !isnan(old[i])) ck_assert(out[i] == old[i]);
        }
    }
    ms_free(in); ms_free(out); ms_free(old);
}
END_TEST

/* ---------- GELU and the linear epilogue ---------- */

static double gelu_double(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

/* GELU of the vector path against erf in double from -30 to 30 (dense near
 * 0, where GELU bends, and out where erf saturates to +-1), plus bias. */
START_TEST(test_gelu_vs_double)
{
    const int n = 60001;
    float *x = falloc(n), *b = falloc(n), *y = falloc(n);
    for (int i = 0; i < n; i++) {
        double u = (i - n / 2) / (double)(n / 2); /* [-1, 1] */
        x[i] = (float)(30.0 * u * u * u);         /* dense near 0 */
        b[i] = (i % 7) * 0.001f;
    }
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        use_path(pi);
        memcpy(y, x, n * sizeof(float));
        ew_bias_act_cols(y, b, 1, n, n, MS_ACT_GELU);
        for (int i = 0; i < n; i++) {
            float v = x[i] + b[i];
            double want = gelu_double(v), got = y[i];
            /* The float formula 0.5 v (1 + erf(v/sqrt2)): erff within 2 ulp
             * (<= 1.2e-7 absolute, |erf| <= 1) and the rounding of v/sqrt2
             * move 1 + erf by <= 2e-7, times 0.5|v|; each float product adds
             * 6e-8 relative. For v << 0 this is the cancellation of the
             * exact formula itself (PyTorch's, too): the result is ~0. */
            double bound = 1.0e-7 * fabs(v) + 2.5e-7 * fabs(want) + 1e-30;
            ck_assert_msg(fabs(got - want) <= bound, "path %s gelu(%.9g) = %.9g, want %.9g",
                          cpu_path_name((ms_cpu_path)pi), (double)v, got, want);
            /* and against the scalar gelu_erf of linear.h (glibc's erff) */
            float s = gelu_erf(v);
            ck_assert_msg(fabsf(y[i] - s) <= 1.2e-7f * fabsf(v) + 2.5e-7f * fabsf(s),
                          "gelu(%.9g): vector %.9g, scalar %.9g", (double)v, got, (double)s);
        }
    }
    ms_free(x); ms_free(b); ms_free(y);
}
END_TEST

/* NaN and infinities: the same as act_apply (GELU(-inf) is -inf * 0 = NaN
 * there; ReLU maps NaN to 0); ReLU, bias only and no bias exactly equal. */
START_TEST(test_bias_act_specials_and_exact)
{
    const float sp[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e30f, -1e30f, 3.4e38f,
                        -3.4e38f, 1e-40f, -1e-40f, 5.0f, -5.0f, 9.5f, -9.5f, 20.0f, -20.0f};
    const int ns = (int)(sizeof sp / sizeof sp[0]);
    /* rows of odd width with a row stride wider than the row */
    const int rows = 5, cols = 37, ld = 41;
    float *x = frand((size_t)rows * ld, 21, -6, 6), *b = frand(cols, 22, -1, 1);
    for (int i = 0; i < ns; i++) x[(size_t)(i % rows) * ld + (i * 3) % cols] = sp[i];
    float *y = falloc((size_t)rows * ld);
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        use_path(pi);
        for (int a = 0; a < 3; a++) {
            ms_act act = (ms_act)a;
            for (int wb = 0; wb < 2; wb++) {
                const float *bias = wb ? b : NULL;
                memcpy(y, x, (size_t)rows * ld * sizeof(float));
                ew_bias_act_cols(y, bias, rows, cols, ld, act);
                for (int i = 0; i < rows; i++)
                    for (int j = 0; j < ld; j++) {
                        size_t k = (size_t)i * ld + j;
                        if (j >= cols) { /* past the row: untouched */
                            ck_assert(memcmp(&y[k], &x[k], sizeof(float)) == 0);
                            continue;
                        }
                        float v = x[k] + (bias ? bias[j] : 0.0f);
                        float want = act_apply(v, act);
                        ck_assert_msg(isnan(y[k]) == isnan(want), "act %d: f(%g) = %g, want %g",
                                      a, (double)v, (double)y[k], (double)want);
                        if (isnan(want)) continue;
                        if (act != MS_ACT_GELU || !isfinite(want))
                            ck_assert_msg(y[k] == want, "act %d: f(%g) = %g, want %g", a,
                                          (double)v, (double)y[k], (double)want);
                        else
                            ck_assert_msg(fabsf(y[k] - want) <=
                                              1.2e-7f * fabsf(v) + 2.5e-7f * fabsf(want) + 1e-44f,
                                          "gelu(%g) = %g, want %g", (double)v, (double)y[k],
                                          (double)want);
                    }
            }
        }
    }
    ms_free(x); ms_free(b); ms_free(y);
}
END_TEST

/* op_linear on sizes that take the per-thread slab path (n * cin * cout >=
 * 1e6) and the single-call path, every activation, bias or none, residual,
 * against double dot products; 1 and 2 threads give the same floats (each
 * row's GEMM and epilogue do not depend on the split). */
START_TEST(test_linear_fused_epilogue)
{
    const int sizes[][3] = {{67, 97, 161}, {5, 29, 23}, {203, 64, 96}, {1, 300, 7}};
    ms_backend be = cpu_backend();
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        use_path(pi);
        for (int sz = 0; sz < 4; sz++) {
            int n = sizes[sz][0], cin = sizes[sz][1], cout = sizes[sz][2];
            size_t no = (size_t)n * cout;
            float *in = frand((size_t)n * cin, 31 + sz, -1, 1);
            float *w = frand((size_t)cout * cin, 41 + sz, -1, 1);
            float *b = frand(cout, 51 + sz, -2, 2), *base = frand(no, 61 + sz, -1, 1);
            float *out = falloc(no), *out1 = falloc(no);
            double *want = dalloc(no);
            for (int cs = 0; cs < 8; cs++) {
                ms_act act = (ms_act)(cs % 3);
                bool residual = cs >= 6;
                const float *bias = (cs == 3 || cs == 7) ? NULL : b;
                if (residual) act = MS_ACT_NONE;
                for (int i = 0; i < n; i++)
                    for (int o = 0; o < cout; o++) {
                        double s = bias ? bias[o] : 0.0;
                        for (int j = 0; j < cin; j++)
                            s += (double)in[(size_t)i * cin + j] * w[(size_t)o * cin + j];
                        double r = residual ? base[(size_t)i * cout + o] + s : s;
                        if (act == MS_ACT_RELU) r = r > 0 ? r : 0;
                        if (act == MS_ACT_GELU) r = gelu_double(r);
                        want[(size_t)i * cout + o] = r;
                    }
                for (int t = 2; t >= 1; t--) {
                    set_threads(t);
                    float *o = t == 2 ? out : out1;
                    memcpy(o, base, no * sizeof(float));
                    ck_assert_int_eq(op_linear(&be, o, in, w, bias, n, cin, cout, act, residual),
                                     MS_OK);
                }
                ck_assert_msg(memcmp(out, out1, no * sizeof(float)) == 0,
                              "size %d case %d: 1 and 2 threads differ", sz, cs);
                /* cin-long float dot products of O(1) terms: sqrt(cin) * 6e-8
                 * * sum|terms| <= ~2e-5 at cin = 300 */
                double err = 0, mx = 0;
                for (size_t i = 0; i < no; i++) {
                    err = fmax(err, fabs(out[i] - want[i]));
                    mx = fmax(mx, fabs(want[i]));
                }
                ck_assert_msg(err <= 2e-5 * (1 + mx), "size %d case %d: error %g", sz, cs, err);
            }
            ms_free(in); ms_free(w); ms_free(b); ms_free(base); ms_free(out); ms_free(out1);
            free(want);
        }
    }
    set_threads(2);
}
END_TEST

/* ---------- LayerNorm ---------- */

START_TEST(test_layernorm_paths)
{
    ms_backend be = cpu_backend();
    const int widths[] = {1, 3, 7, 33, 192, 771};
    /* offsets: activations of ViT residual streams can ride on large means;
     * the spread stays O(1), so the variance is what a float one-pass sum
     * would lose */
    const float offsets[] = {0.0f, 300.0f, -4096.0f, 1e5f};
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        use_path(pi);
        for (int wi = 0; wi < 6; wi++) {
            const int n = 9, c = widths[wi];
            float *w = frand(c, 70 + wi, 0.5f, 1.5f), *b = frand(c, 80 + wi, -0.5f, 0.5f);
            float *in = frand((size_t)n * c, 90 + wi, -1, 1);
            float *out = falloc((size_t)n * c), *out1 = falloc((size_t)n * c);
            for (int i = 0; i < n; i++)
                for (int j = 0; j < c; j++) in[(size_t)i * c + j] += offsets[i % 4];
            set_threads(2);
            ck_assert_int_eq(op_layernorm(&be, out, in, w, b, n, c, 1e-6f), MS_OK);
            set_threads(1);
            ck_assert_int_eq(op_layernorm(&be, out1, in, w, b, n, c, 1e-6f), MS_OK);
            ck_assert(memcmp(out, out1, (size_t)n * c * sizeof(float)) == 0);
            for (int i = 0; i < n; i++) {
                const float *x = in + (size_t)i * c;
                double mean = 0, var = 0;
                for (int j = 0; j < c; j++) mean += x[j];
                mean /= c;
                for (int j = 0; j < c; j++) var += (x[j] - mean) * (x[j] - mean);
                var /= c;
                double rstd = 1.0 / sqrt(var + 1e-6);
                /* The kernel subtracts the mean rounded to float: off by up
                 * to ulp(mean)/2, i.e. 0.5 * 2^-23 * |mean| (4e-3 at 1e5),
                 * scaled by rstd and w; plus a few float roundings. */
                double mean_err = fabs(mean) * 6.0e-8 * rstd;
                for (int j = 0; j < c; j++) {
                    double want = (x[j] - mean) * rstd * w[j] + b[j];
                    double got = out[(size_t)i * c + j];
                    double bound = mean_err * 1.5 + 1e-6 * (1 + fabs(want));
                    ck_assert_msg(fabs(got - want) <= bound,
                                  "path %s c %d row %d [%d]: %.9g vs %.9g (bound %.3g)",
                                  cpu_path_name((ms_cpu_path)pi), c, i, j, got, want, bound);
                }
            }
            ms_free(w); ms_free(b); ms_free(in); ms_free(out); ms_free(out1);
        }
    }
    set_threads(2);
}
END_TEST

/* ---------- add, softmax rows ---------- */

START_TEST(test_add_softmax_paths)
{
    ms_backend be = cpu_backend();
    /* lengths around the 16384-element work items and vector tails */
    const size_t lens[] = {1, 7, 8, 9, 16383, 16384, 16385, 3 * 16384 + 5};
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        use_path(pi);
        for (int t = 1; t <= 2; t++) {
            set_threads(t);
            for (int li = 0; li < 8; li++) {
                size_t n = lens[li];
                float *a = frand(n, 200 + li, -1, 1), *b = frand(n, 210 + li, -1, 1);
                float *sum = falloc(n);
                for (size_t i = 0; i < n; i++) sum[i] = a[i] + b[i];
                ck_assert_int_eq(op_add(&be, a, a, b, n), MS_OK); /* out aliases a */
                ck_assert(memcmp(a, sum, n * sizeof(float)) == 0); /* one rounding, exact */
                ms_free(a); ms_free(b); ms_free(sum);
            }
        }
        /* softmax rows of odd widths, one row on huge logits */
        const int rows = 5, cols = 67;
        float *x = frand((size_t)rows * cols, 230, -8, 8);
        for (int j = 0; j < cols; j++) x[j] += 1e4f;
        double *want = dalloc((size_t)rows * cols);
        for (int i = 0; i < rows; i++) {
            const float *r = x + (size_t)i * cols;
            double mx = r[0], s = 0;
            for (int j = 1; j < cols; j++) mx = fmax(mx, r[j]);
            for (int j = 0; j < cols; j++) s += exp(r[j] - mx);
            for (int j = 0; j < cols; j++) want[(size_t)i * cols + j] = exp(r[j] - mx) / s;
        }
        ck_assert_int_eq(op_softmax_rows(&be, x, rows, cols), MS_OK);
        for (int i = 0; i < rows * cols; i++)
            ck_assert_msg(fabs(x[i] - want[i]) <= 1e-6 * want[i] + 1e-9, "[%d] %.9g vs %.9g", i,
                          (double)x[i], want[i]);
        ms_free(x); free(want);
    }
    set_threads(2);
}
END_TEST

/* ---------- argmax ---------- */

/* Per pixel, the first class with the largest logit, as argmax_first: the
 * values are on a coarse grid so ties are common, and some are NaN (never
 * larger than anything, so a NaN in class 0 keeps class 0). */
START_TEST(test_argmax_paths)
{
    ms_backend be = cpu_backend();
    const int shapes[][3] = {{1, 3, 5}, {2, 16, 16}, {12, 9, 29}, {150, 7, 37}, {256, 3, 87},
                             {19, 1, 257}, {3, 33, 31}};
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        use_path(pi);
        for (int t = 1; t <= 2; t++) {
            set_threads(t);
            for (int si = 0; si < 7; si++) {
                int c = shapes[si][0], h = shapes[si][1], w = shapes[si][2];
                size_t plane = (size_t)h * w;
                float *in = frand((size_t)c * plane, 300 + si, -4, 4);
                for (size_t i = 0; i < (size_t)c * plane; i++) {
                    in[i] = floorf(in[i]); /* 8 levels: many ties */
                    if (i % 53 == 7) in[i] = NAN;
                }
                uint8_t *got = calloc(plane, 1);
                ck_assert_ptr_nonnull(got);
                ck_assert_int_eq(op_argmax(&be, got, in, c, h, w), MS_OK);
                for (size_t p = 0; p < plane; p++) {
                    int best = 0;
                    for (int k = 1; k < c; k++)
                        if (in[(size_t)k * plane + p] > in[(size_t)best * plane + p]) best = k;
                    ck_assert_msg(got[p] == best, "c %d pixel %zu: %d, want %d", c, p, got[p], best);
                }
                ms_free(in); free(got);
            }
        }
    }
    set_threads(2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_elem");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_resize_bilinear_paths);
    tcase_add_test(tc, test_resize_bilinear_nonfinite);
    tcase_add_test(tc, test_gelu_vs_double);
    tcase_add_test(tc, test_bias_act_specials_and_exact);
    tcase_add_test(tc, test_linear_fused_epilogue);
    tcase_add_test(tc, test_layernorm_paths);
    tcase_add_test(tc, test_add_softmax_paths);
    tcase_add_test(tc, test_argmax_paths);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
