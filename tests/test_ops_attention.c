/* Full attention's CPU fast path (kernels/attention_full.c with the
 * vectorised softmax of kernels/attention_simd.c) against a plain two-pass
 * softmax attention written here in double, on every CPU path this machine
 * runs (cpu_path_set), 1 to 4 threads (the same bits at each); and the
 * softmax pieces on their own:
 * the 2^x against exp2, the one-pass tile update's hand-offs (a max that
 * jumps, NaN, rows that are -inf so far).
 *
 * Tolerance: the logits themselves carry float rounding from the GEMM, up
 * to a few 1e-8 of the sum of |q_t k_t| / sqrt(d) (A below); a logit error e
 * moves the weights by a relative e, so outputs move by about e max|v|. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_full.h"
#include "kernels/attention_simd.h"
#include "kernels/cpu_path.h"
#include "kernels/ops.h"
#include "testutil_ops.h"

/* Plain attention: for each head and query, all logits, their max, the sum
 * of exp(logit - max), then the weighted sum of v; in double. *a_max: the
 * largest sum_t |q_t k_t| / sqrt(d) (the scale of the logits' float error). */
static void two_pass_attention(double *out /* (n, c) */, const float *qkv /* (n, 3c) */, int n,
                               int c, int heads, double *a_max)
{
    int d = c / heads;
    double s = 1.0 / sqrt((double)d), amax = 0;
    double *p = malloc(sizeof(double) * (size_t)n);
    ck_assert_ptr_nonnull(p);
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < n; i++) {
            const float *q = qkv + (size_t)i * 3 * c + h * d;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < n; j++) {
                const float *k = qkv + (size_t)j * 3 * c + c + h * d;
                double dot = 0, adot = 0;
                for (int t = 0; t < d; t++) {
                    dot += (double)q[t] * k[t];
                    adot += fabs((double)q[t] * k[t]);
                }
                p[j] = dot * s;
                amax = fmax(amax, adot * s);
                mx = fmax(mx, p[j]);
            }
            for (int j = 0; j < n; j++) sum += (p[j] = exp(p[j] - mx));
            for (int t = 0; t < d; t++) {
                double acc = 0;
                for (int j = 0; j < n; j++)
                    acc += p[j] * qkv[(size_t)j * 3 * c + 2 * c + h * d + t];
                out[(size_t)i * c + h * d + t] = acc / sum;
            }
        }
    free(p);
    *a_max = amax;
}

/* Random inputs, or a ramp (below); `scale` sets the logits' magnitude. */
enum { INPUT_RANDOM, INPUT_RAMP, INPUT_NEGATIVE };
static float *make_qkv(int n, int c, int kind, float scale, uint32_t seed)
{
    float *qkv = falloc((size_t)n * 3 * c);
    rand_fill(qkv, (size_t)n * 3 * c, seed, -1.0f, 1.0f);
    for (size_t i = 0; i < (size_t)n * 3 * c; i++)
        if ((i % (3 * (size_t)c)) < 2 * (size_t)c) qkv[i] *= scale; /* q and k */
    if (kind == INPUT_NEGATIVE) {
        /* q near -scale (1, ..., 1), k near +scale: every logit far below 0
         * (hundreds), so a row's max is far below the 0 logits that padded
         * keys would give, if any lane past the last key counted */
        for (int j = 0; j < n; j++)
            for (int t = 0; t < c; t++) {
                qkv[(size_t)j * 3 * c + t] = -scale + 0.1f * qkv[(size_t)j * 3 * c + t];
                qkv[(size_t)j * 3 * c + c + t] = scale + 0.1f * qkv[(size_t)j * 3 * c + c + t];
            }
    }
    if (kind == INPUT_RAMP) {
        /* key j leans along (1, 1, ..., 1) by an amount growing with j, and
         * half the queries lean the same way, half the other: for the
         * first half every key tile raises the max (inside tiles too, and
         * by far more than 2^64 across the big ones); for the others the
         * first tile holds the max and later tiles underflow to 0 */
        for (int j = 0; j < n; j++)
            for (int t = 0; t < c; t++) {
                qkv[(size_t)j * 3 * c + c + t] += scale * 3.0f * (float)j / (float)n;
                qkv[(size_t)j * 3 * c + t] += (j % 2 ? 1.0f : -1.0f) * scale;
            }
    }
    return qkv;
}

/* out = attention_full_cpu with blocks qb, kb (> 0) or op_attention_full
 * (qb = 0), on `threads`. */
static void run_attention(float *out /* (n, c) */, const float *qkv /* (n, 3c) */, int n, int c,
                          int heads, int qb, int kb, int threads)
{
    if (qb == 0) {
        ms_backend be;
        memset(&be, 0, sizeof be);
        be.device = MS_DEVICE_CPU;
        be.threads = threads;
        ck_assert_int_eq(op_attention_full(&be, out, qkv, n, c, heads), MS_OK);
    } else {
        float *ws = falloc(attention_full_scratch_floats(n, c, qb, kb, threads));
        attention_full_cpu(out, qkv, n, c, heads, qb, kb, ws, threads);
        ms_free(ws);
    }
}

/* run_attention checked against the two-pass reference; returns the
 * output (ms_free). */
static float *check_case(const float *qkv, const double *want, double amax, int n, int c, int heads,
                       int qb, int kb, int threads, const char *what)
{
    float *out = falloc((size_t)n * c);
    for (size_t i = 0; i < (size_t)n * c; i++) out[i] = NAN; /* every output must be written */
    run_attention(out, qkv, n, c, heads, qb, kb, threads);
    double vmax = 0, err = 0;
    for (int j = 0; j < n; j++)
        for (int t = 0; t < c; t++) vmax = fmax(vmax, fabs(qkv[(size_t)j * 3 * c + 2 * c + t]));
    for (size_t i = 0; i < (size_t)n * c; i++) {
        double e = fabs(out[i] - want[i]);
        err = isnan(out[i]) ? INFINITY : fmax(err, e);
    }
    double tol = (2e-6 + 2e-7 * amax) * (1.0 + vmax);
    ck_assert_msg(err <= tol, "%s, path %s: n %d c %d heads %d qb %d kb %d threads %d: "
                  "max error %.3g > %.3g (logit scale %.3g)", what,
                  cpu_path_name(cpu_path_get()), n, c, heads, qb, kb, threads, err, tol, amax);
    return out;
}

START_TEST(test_attention_against_two_pass)
{
    /* n, d, heads, qb, kb (0: op_attention_full's blocks), input, scale */
    const struct {
        int n, d, heads, qb, kb, kind;
        float scale;
    } cases[] = {
        {1, 8, 1, 0, 0, INPUT_RANDOM, 1.0f},      /* one token */
        {2, 24, 3, 0, 0, INPUT_RANDOM, 2.0f},     /* two */
        {17, 32, 2, 5, 4, INPUT_RANDOM, 3.0f},    /* tails of both block sizes */
        {17, 8, 6, 16, 16, INPUT_RAMP, 4.0f},     /* a query block of 16 + 1 */
        {1000, 64, 3, 0, 0, INPUT_RANDOM, 1.5f},  /* default 512 blocks: 512 + 488 */
        {1000, 64, 1, 0, 0, INPUT_RAMP, 3.0f},    /* large logits, the max moves */
        {300, 128, 2, 96, 64, INPUT_RANDOM, 1.0f},/* d = 128; 300 = 3 x 96 + 12, 4 x 64 + 44 */
        {300, 24, 5, 33, 7, INPUT_RAMP, 6.0f},    /* logits in the hundreds, tiny tiles */
        {513, 32, 4, 0, 0, INPUT_RANDOM, 2.0f},   /* one past the default blocks */
        {130, 64, 6, 64, 128, INPUT_RAMP, 2.0f},  /* DeiT-S's heads, d = 64 */
        {100, 64, 2, 0, 0, INPUT_NEGATIVE, 4.0f},  /* logits near -128: 100 = 64 + 36 */
        {70, 32, 3, 0, 0, INPUT_NEGATIVE, 5.0f},   /* near -141, 70 = 64 + 6 */
    };
    ms_cpu_path start = cpu_path_get();
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int n = cases[ci].n, heads = cases[ci].heads, c = cases[ci].d * heads;
        float *qkv = make_qkv(n, c, cases[ci].kind, cases[ci].scale, 900 + (uint32_t)ci);
        double *want = malloc(sizeof(double) * (size_t)n * c), amax;
        ck_assert_ptr_nonnull(want);
        two_pass_attention(want, qkv, n, c, heads, &amax);
        for (int pi = 0; pi < cpu_path_count(); pi++) {
            ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
            /* the op's query blocks do not follow the thread count: the
             * same bits at each */
            float *one = NULL;
            for (int threads = 1; threads <= 4; threads++) {
                float *out = check_case(qkv, want, amax, n, c, heads, cases[ci].qb,
                                        cases[ci].kb, threads,
                                        cases[ci].kind == INPUT_RAMP ? "ramp" : "random");
                if (one) {
                    ck_assert_mem_eq(out, one, (size_t)n * c * sizeof(float));
                    ms_free(out);
                } else {
                    one = out;
                }
            }
            ms_free(one);
        }
        free(want);
        ms_free(qkv);
    }
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

/* Non-finite inputs poison exactly what they poison in plain attention: a
 * NaN in one query's q makes that query's row of its head NaN; +inf in one
 * key's k makes NaN the rows of the queries whose logit for it is +inf
 * (inf - inf in the softmax) and leaves the others (logit -inf: weight 0)
 * finite; a NaN in one key's v makes NaN that column of its head for every
 * query; a NaN in one key's k, every row of its head (one NaN logit in a row
 * of numbers). A clamp inside exp or a NaN-dropping max would turn some of these
 * NaN into numbers, and a stray NaN would leak into clean heads. Every path,
 * the op's blocks and small explicit ones, against the double reference. */
START_TEST(test_attention_nonfinite)
{
    const struct {
        int n, d, qb, kb;
    } cases[] = {
        {200, 64, 0, 0}, {200, 64, 64, 32}, {200, 32, 0, 0},
        {97, 128, 0, 0}, {200, 24, 0, 0},   {300, 32, 48, 16},
    };
    const int heads = 4;
    ms_cpu_path start = cpu_path_get();
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int n = cases[ci].n, d = cases[ci].d, c = d * heads;
        float *qkv = make_qkv(n, c, INPUT_RANDOM, 1.5f, 700 + (uint32_t)ci);
        double *want = malloc(sizeof(double) * (size_t)n * c), amax;
        ck_assert_ptr_nonnull(want);
        /* small values: a NaN logit that an exp clamp turned into 2^126
         * must not come out as a number only because its sums overflowed */
        for (int j = 0; j < n; j++)
            for (int t = 0; t < c; t++) qkv[(size_t)j * 3 * c + 2 * c + t] *= 1e-3f;
        two_pass_attention(want, qkv, n, c, heads, &amax); /* the clean logits' scale */
        int qi = n / 3, kj = n / 2 + 1, vj = n - 2;
        qkv[(size_t)qi * 3 * c + 0 * d + 5] = NAN;        /* head 0, q */
        qkv[(size_t)kj * 3 * c + c + 1 * d + 3] = INFINITY; /* head 1, k */
        qkv[(size_t)vj * 3 * c + 2 * c + 2 * d + 7] = NAN;  /* head 2, v */
        qkv[(size_t)kj * 3 * c + c + 3 * d + 1] = NAN;      /* head 3, k: NaN among numbers */
        two_pass_attention(want, qkv, n, c, heads, &(double){0});
        size_t nan_want = 0;
        for (size_t i = 0; i < (size_t)n * c; i++) nan_want += isnan(want[i]) != 0;
        /* the cases must cover each kind: the NaN query row, the column of
         * the NaN value, and head 1 with both NaN rows and finite rows */
        int h1_nan = 0, h1_fin = 0;
        for (int i = 0; i < n; i++) {
            if (isnan(want[(size_t)i * c + d])) h1_nan++; else h1_fin++;
        }
        ck_assert(isnan(want[(size_t)qi * c + 0]) && isnan(want[(size_t)0 * c + 2 * d + 7]) &&
                  isnan(want[(size_t)1 * c + 3 * d + 9]) && !isnan(want[(size_t)1 * c + 2 * d]));
        ck_assert_msg(h1_nan > 0 && h1_fin > 0, "head 1: %d NaN rows, %d finite", h1_nan, h1_fin);
        double vmax = 0;
        for (int j = 0; j < n; j++)
            for (int t = 0; t < c; t++) {
                float v = qkv[(size_t)j * 3 * c + 2 * c + t];
                if (isfinite(v)) vmax = fmax(vmax, fabs(v));
            }
        double tol = (2e-6 + 2e-7 * amax) * (1.0 + vmax);
        for (int pi = 0; pi < cpu_path_count(); pi++) {
            ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
            for (int threads = 1; threads <= 2; threads++) {
                float *out = falloc((size_t)n * c);
                run_attention(out, qkv, n, c, heads, cases[ci].qb, cases[ci].kb, threads);
                size_t wrong_nan = 0, first = (size_t)-1;
                double err = 0;
                for (size_t i = 0; i < (size_t)n * c; i++) {
                    if ((isnan(out[i]) != 0) != (isnan(want[i]) != 0)) {
                        if (!wrong_nan++) first = i;
                    } else if (!isnan(want[i])) {
                        err = isfinite(out[i]) ? fmax(err, fabs(out[i] - want[i])) : INFINITY;
                    }
                }
                ck_assert_msg(wrong_nan == 0, "path %s, n %d d %d qb %d kb %d threads %d: %zu of "
                              "%zu NaN wrong, first at query %zu channel %zu (want %g, got %g)",
                              cpu_path_name(cpu_path_get()), n, d, cases[ci].qb, cases[ci].kb,
                              threads, wrong_nan, nan_want, first / (size_t)c, first % (size_t)c,
                              want[first], out[first]);
                ck_assert_msg(err <= tol, "path %s, n %d d %d: max error %.3g > %.3g",
                              cpu_path_name(cpu_path_get()), n, d, err, tol);
                ms_free(out);
            }
        }
        free(want);
        ms_free(qkv);
    }
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

/* 2^x of the softmax against exp2 in double: within 2.5 float ulp of the
 * value down to 2^-126, at most 2^-126 below, 0 under -126.5 and at -inf. */
START_TEST(test_exp2_accuracy)
{
    enum { N = 40003 };
    float *x = falloc(N), *y = falloc(N);
    /* up to 100: a sum of 2^126s would overflow */
    for (int i = 0; i < N; i++) x[i] = -130.0f + 230.0f * (float)i / (float)(N - 1);
    x[0] = -INFINITY;
    x[1] = 0.0f;
    x[2] = -0.0f;
    x[3] = 126.0f;
    x[4] = -126.5f;
    x[5] = -1e-30f;
    ms_cpu_path start = cpu_path_get();
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        for (int shift_i = 0; shift_i < 2; shift_i++) {
            float shift = shift_i ? 3.25f : 0.0f; /* x - shift, shift applied inside */
            memcpy(y, x, sizeof(float) * N);
            for (int i = 0; i < N; i++) y[i] += shift;
            float sum = attn_exp2_sum(y, N, shift);
            double ref_sum = 0;
            for (int i = 0; i < N; i++) {
                double xi = (double)(x[i] + shift) - shift; /* what the kernel exponentiates */
                double want = exp2(xi);
                ref_sum += want;
                double tol = want >= 0x1p-126 ? 2.5 * 0x1p-23 * want : 0x1p-126;
                if (xi < -126.51) want = 0; /* flushed */
                ck_assert_msg(fabs(y[i] - want) <= tol,
                              "path %d: 2^%.9g = %.9g, want %.9g", pi, xi, y[i], want);
            }
            ck_assert(fabs(sum - ref_sum) <= 1e-5 * ref_sum);
        }
    }
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
    ms_free(x);
    ms_free(y);
}
END_TEST

/* attn_tile_softmax's per-row cases, by hand: the first tile (against the
 * max of its first 16 logits; a row far above that handed back), a later
 * tile under the running reference (one pass, nothing rescaled), a max
 * 2^10 higher (still one pass: values up to 2^64 kept), a max 2^80 higher,
 * a NaN and a row of -inf (handed back: corr NaN, counted), and a row -inf
 * so far. */
START_TEST(test_tile_softmax_rows)
{
    enum { NK = 37, NQ = 7 };
    ms_cpu_path start = cpu_path_get();
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        float tile[NQ * NK], keep[NQ * NK], m[NQ], l[NQ], corr[NQ];
        rand_fill(keep, NQ * NK, 77, -6.0f, 6.0f);
        for (int j = 0; j < NK; j++) keep[5 * NK + j] = -INFINITY; /* row 5: nothing yet */
        keep[6 * NK + 30] = 100.0f; /* row 6: 2^94 over its first 16 logits' max */
        for (int i = 0; i < NQ; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }
        memcpy(tile, keep, sizeof tile);
        ck_assert_int_eq(attn_tile_softmax(tile, NQ, NK, m, l, corr), 1);
        ck_assert(isnan(corr[6]));
        memcpy(tile + 6 * NK, keep + 6 * NK, sizeof(float) * NK);
        attn_row_softmax(tile + 6 * NK, NK, &m[6], &l[6], &corr[6]);
        for (int i = 0; i < NQ; i++) {
            /* the reference: the max of the first 16 (all of row 6) */
            double ref = -INFINITY, sum = 0;
            for (int j = 0; j < (i == 6 ? NK : 16); j++) ref = fmax(ref, keep[i * NK + j]);
            ck_assert(m[i] == (float)ref);
            ck_assert(corr[i] == 0.0f); /* empty before: nothing to rescale */
            for (int j = 0; j < NK; j++) {
                /* the difference rounded to float, as the kernel's */
                double e = i == 5 ? 0.0 : exp2((float)(keep[i * NK + j] - (float)ref));
                sum += e;
                ck_assert_msg(fabs(tile[i * NK + j] - e) <= 3e-7 * e, "row %d j %d", i, j);
            }
            ck_assert(fabs(l[i] - sum) <= 1e-6 * sum);
        }
        float m1[NQ], l1[NQ];
        memcpy(m1, m, sizeof m);
        memcpy(l1, l, sizeof l);
        /* second tile: row 0 below its max, row 1 up by 10, row 2 up by 80,
         * row 3 a NaN, row 4 -inf throughout, row 5 finite at last */
        rand_fill(keep, NQ * NK, 78, -6.0f, 6.0f);
        for (int j = 0; j < NK; j++) {
            keep[0 * NK + j] = m1[0] - 1.0f - (float)j;
            keep[4 * NK + j] = -INFINITY;
        }
        keep[1 * NK + 20] = m1[1] + 10.0f;
        keep[2 * NK + 3] = m1[2] + 80.0f;
        keep[3 * NK + 36] = -NAN; /* x86's default NaN is negative */
        memcpy(tile, keep, sizeof tile);
        ck_assert_int_eq(attn_tile_softmax(tile, NQ, NK, m, l, corr), 3);
        for (int i = 0; i < 2; i++) { /* kept reference: 2^(x - m_old), corr 1 */
            double sum = 0;
            for (int j = 0; j < NK; j++) {
                double e = exp2((float)(keep[i * NK + j] - m1[i]));
                sum += e;
                ck_assert_msg(fabs(tile[i * NK + j] - e) <= 3e-7 * e, "row %d j %d", i, j);
            }
            ck_assert(corr[i] == 1.0f && m[i] == m1[i]);
            ck_assert(fabs(l[i] - (l1[i] + sum)) <= 1e-6 * (l1[i] + sum));
        }
        ck_assert(isnan(corr[2]) && isnan(corr[3]) && isnan(corr[4])); /* -inf: handed back too */
        ck_assert(corr[5] == 0.0f); /* was empty */
        /* the caller's part for the rows handed back: logits again, then
         * the two-pass row update */
        for (int i = 2; i <= 4; i++) {
            memcpy(tile + i * NK, keep + i * NK, sizeof(float) * NK);
            attn_row_softmax(tile + i * NK, NK, &m[i], &l[i], &corr[i]);
        }
        ck_assert(m[2] == keep[2 * NK + 3]);
        ck_assert(fabs(corr[2] - exp2(m1[2] - m[2])) <= 3e-7 * exp2(m1[2] - m[2]));
        ck_assert(tile[2 * NK + 3] == 1.0f);
        ck_assert(isnan(l[3])); /* a NaN logit: the query's output is NaN */
        ck_assert(corr[4] == 1.0f && l[4] == l1[4] && m[4] == m1[4]); /* 2^-inf = 0 */
    }
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_attention");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_exp2_accuracy);
    tcase_add_test(tc, test_tile_softmax_rows);
    tcase_add_test(tc, test_attention_against_two_pass);
    tcase_add_test(tc, test_attention_nonfinite);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
