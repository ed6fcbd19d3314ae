/* gemm_small_nn (kernels/gemm_small.h) on both of its libraries where this
 * build and CPU run them (OpenBLAS always; libxsmm where built in and
 * generating kernels): which one is chosen and why; MiTA's product shapes,
 * with and without accumulation, against a double loop; the stride's gap
 * left alone; the same bits on a second call (the kernel cache); and the
 * row counts (every row the same bits whatever the rows; prepared shapes)
 * and the columns gemm_small_cols pads to. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_path.h"
#include "kernels/gemm_small.h"
#include "testutil_ops.h"

/* Whether libxsmm should be chosen, found apart from gemm_small.c: built
 * in, on a CPU with AVX2 (libxsmm generates code for AVX2 and later), and
 * not asked otherwise. */
static bool xsmm_expected(void)
{
#ifdef MS_HAVE_LIBXSMM
    const char *env = getenv("MS_SMALL_GEMM");
    return cpu_path_supported(MS_CPU_PATH_V3) && !(env && !strcmp(env, "openblas"));
#else
    return false;
#endif
}

START_TEST(test_small_lib_choice)
{
    ms_gemm_small_lib start = gemm_small_lib_get();
    ck_assert_msg(start == (xsmm_expected() ? MS_GEMM_SMALL_LIBXSMM : MS_GEMM_SMALL_OPENBLAS),
                  "chose %s (%s)", gemm_small_lib_name(start), gemm_small_lib_why());
    ck_assert(strlen(gemm_small_lib_why()) > 0);
    ck_assert_int_eq(gemm_small_lib_set(MS_GEMM_SMALL_OPENBLAS), MS_OK);
    ck_assert_int_eq(gemm_small_lib_get(), MS_GEMM_SMALL_OPENBLAS);
    ms_status st = gemm_small_lib_set(MS_GEMM_SMALL_LIBXSMM);
#ifdef MS_HAVE_LIBXSMM
    if (cpu_path_supported(MS_CPU_PATH_V3)) ck_assert_int_eq(st, MS_OK);
#else
    ck_assert_int_eq(st, MS_ERR_UNSUPPORTED);
#endif
    if (st != MS_OK) ck_assert(strstr(ms_last_error(), "libxsmm") != NULL);
    ck_assert_int_eq(gemm_small_lib_set((ms_gemm_small_lib)5), MS_ERR_ARG);
    ck_assert_str_eq(gemm_small_lib_name(MS_GEMM_SMALL_LIBXSMM), "libxsmm");
    ck_assert_str_eq(gemm_small_lib_name(MS_GEMM_SMALL_OPENBLAS), "openblas");
    ck_assert_str_eq(gemm_small_lib_name((ms_gemm_small_lib)9), "?");
    ck_assert_int_eq(gemm_small_lib_set(start), MS_OK);
}
END_TEST

static int lib_count(void)
{
    ms_gemm_small_lib start = gemm_small_lib_get();
    int count = gemm_small_lib_set(MS_GEMM_SMALL_LIBXSMM) == MS_OK ? 2 : 1;
    ck_assert_int_eq(gemm_small_lib_set(start), MS_OK);
    return count;
}

START_TEST(test_small_vs_naive)
{
    ms_gemm_small_lib start = gemm_small_lib_get();
    /* (m, n, k): MiTA's routed logits (nb x 49 x 64) and outputs (nb x 64 x
     * 98) at block sizes 1 .. 128, its probe (49 x 256 x 64), summary slice
     * (12 x 64 x 64) and routing (128 x 49 x 64); odd sizes; k = 0 */
    const int shapes[][3] = {{1, 49, 64},  {3, 49, 64},  {21, 49, 64}, {128, 49, 64},
                             {1, 64, 98},  {21, 64, 98}, {127, 64, 98}, {49, 256, 64},
                             {12, 64, 64}, {7, 13, 5},   {33, 1, 17},  {5, 9, 0}};
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    for (int li = 0, libs = lib_count(); li < libs; li++) {
        ck_assert_int_eq(gemm_small_lib_set((ms_gemm_small_lib)li), MS_OK);
        for (int si = 0; si < nshapes; si++)
            for (int acc = 0; acc < 2; acc++) {
                int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
                int lda = k + 3, ldb = n + 5, ldc = n + 2;
                float *a = frand((size_t)m * lda + 1, 10u + (uint32_t)si, -1, 1);
                float *b = frand((size_t)(k ? k : 1) * ldb, 20u + (uint32_t)si, -1, 1);
                float *c = frand((size_t)m * ldc, 30u + (uint32_t)si, -1, 1);
                float *c0 = falloc((size_t)m * ldc), *c1 = falloc((size_t)m * ldc);
                memcpy(c0, c, (size_t)m * ldc * sizeof(float));
                double *want = dalloc((size_t)m * ldc);
                for (int i = 0; i < m; i++)
                    for (int j = 0; j < n; j++) {
                        double s = acc ? (double)c0[(size_t)i * ldc + j] : 0.0;
                        for (int p = 0; p < k; p++)
                            s += (double)a[(size_t)i * lda + p] * b[(size_t)p * ldb + j];
                        want[(size_t)i * ldc + j] = s;
                    }
                gemm_small_nn(c, a, b, m, n, k, lda, ldb, ldc, acc);
                char what[96];
                snprintf(what, sizeof what, "%s %dx%dx%d accumulate %d",
                         gemm_small_lib_name((ms_gemm_small_lib)li), m, n, k, acc);
                for (int i = 0; i < m; i++) {
                    check_close(c + (size_t)i * ldc, want + (size_t)i * ldc, (size_t)n, 2e-6, what);
                    for (int j = n; j < ldc; j++)
                        ck_assert_msg(c[(size_t)i * ldc + j] == c0[(size_t)i * ldc + j],
                                      "%s: the gap at row %d col %d written", what, i, j);
                }
                /* again (a cached kernel): the same bits */
                memcpy(c1, c0, (size_t)m * ldc * sizeof(float));
                gemm_small_nn(c1, a, b, m, n, k, lda, ldb, ldc, acc);
                ck_assert_msg(!memcmp(c1, c, (size_t)m * ldc * sizeof(float)),
                              "%s: a second call differs", what);
                ms_free(a), ms_free(b), ms_free(c), ms_free(c0), ms_free(c1), free(want);
            }
    }
    /* m or n of 0: nothing written */
    float c = 7.0f, a = 1.0f, b = 1.0f;
    gemm_small_nn(&c, &a, &b, 0, 1, 1, 1, 1, 1, false);
    gemm_small_nn(&c, &a, &b, 1, 0, 1, 1, 1, 1, false);
    ck_assert_float_eq(c, 7.0f);
    ck_assert_int_eq(gemm_small_lib_set(start), MS_OK);
}
END_TEST

/* A row of an m-row product: the same bits as of any other row count
 * with libxsmm (which is what lets MiTA size its routed products by the
 * rows it has, each generated by gemm_small_prepare beforehand); a
 * prepared shape's product the same as an unprepared one's, on both
 * libraries. */
START_TEST(test_small_rows)
{
    ms_gemm_small_lib start = gemm_small_lib_get();
    for (int li = 0, libs = lib_count(); li < libs; li++) {
        ck_assert_int_eq(gemm_small_lib_set((ms_gemm_small_lib)li), MS_OK);
        bool x = li == MS_GEMM_SMALL_LIBXSMM;
        {   /* a shape first made by gemm_small_prepare, then run: the bits of
             * the same product at another lda, made on first use */
            float *a = frand(37 * 21, 30u, -1, 1), *b = frand(20 * 13, 31u, -1, 1);
            float *a20 = falloc(37 * 20), *c0 = falloc(37 * 13), *c1 = falloc(37 * 13);
            for (int r = 0; r < 37; r++) memcpy(a20 + r * 20, a + r * 21, 20 * sizeof(float));
            gemm_small_nn(c0, a20, b, 37, 13, 20, 20, 13, 13, false);
            gemm_small_prepare(37, 13, 20, 21, 13, 13, false);
            gemm_small_prepare(0, 13, 20, 21, 13, 13, false); /* nothing */
            gemm_small_nn(c1, a, b, 37, 13, 20, 21, 13, 13, false);
            ck_assert_msg(!memcmp(c0, c1, 37 * 13 * sizeof(float)),
                          "%s: a prepared shape's product differs", gemm_small_lib_name(li));
            ms_free(a), ms_free(b), ms_free(a20), ms_free(c0), ms_free(c1);
        }
        if (!x) continue;
        /* MiTA's routed shapes (n, k): every row count 1 .. 130 against 130 */
        const int nk[][2] = {{49, 64}, {64, 98}, {256, 64}, {64, 64}};
        for (int si = 0; si < 4; si++) {
            int n = nk[si][0], k = nk[si][1];
            float *a = frand((size_t)130 * k, 40u + (uint32_t)si, -1, 1);
            float *b = frand((size_t)k * n, 50u + (uint32_t)si, -1, 1);
            float *all = falloc((size_t)130 * n), *c = falloc((size_t)130 * n);
            gemm_small_nn(all, a, b, 130, n, k, k, n, n, false);
            for (int m = 1; m < 130; m++) {
                gemm_small_nn(c, a, b, m, n, k, k, n, n, false);
                ck_assert_msg(!memcmp(c, all, (size_t)m * n * sizeof(float)),
                              "libxsmm %dx%dx%d: rows differ from the 130-row product's", m, n, k);
            }
            ms_free(a), ms_free(b), ms_free(all), ms_free(c);
        }
    }
    ck_assert_int_eq(gemm_small_lib_set(start), MS_OK);
}
END_TEST

/* gemm_small_cols: with libxsmm, columns rounded up to 8 within the row,
 * and a column of an n-column product the same bits as of the padded one
 * (which is what lets MiTA compute the padding columns of its routing and
 * routed logits); with OpenBLAS n. */
START_TEST(test_small_cols)
{
    ms_gemm_small_lib start = gemm_small_lib_get();
    for (int li = 0, libs = lib_count(); li < libs; li++) {
        ck_assert_int_eq(gemm_small_lib_set((ms_gemm_small_lib)li), MS_OK);
        bool x = li == MS_GEMM_SMALL_LIBXSMM;
        ck_assert_int_eq(gemm_small_cols(49, 56), x ? 56 : 49);
        ck_assert_int_eq(gemm_small_cols(56, 56), 56);
        ck_assert_int_eq(gemm_small_cols(1, 8), x ? 8 : 1);
        ck_assert_int_eq(gemm_small_cols(49, 50), x ? 50 : 49);
        ck_assert_int_eq(gemm_small_cols(49, 49), 49);
        if (!x) continue;
        /* MiTA's (rows, columns, k, ldb): routed logits at block sizes
         * (K_e^T's rows of 56), routing blocks (L^T's), odd columns */
        const int sh[][4] = {{1, 49, 64, 56},  {24, 49, 64, 56}, {128, 49, 64, 56},
                             {128, 49, 64, 56}, {17, 13, 20, 16}, {8, 1, 64, 8}};
        for (int si = 0; si < 6; si++) {
            int m = sh[si][0], n = sh[si][1], k = sh[si][2], np = sh[si][3];
            int lda = si == 3 ? 576 : k, ldc = np + 3; /* 3: a strided Q's rows */
            float *a = frand((size_t)m * lda, 60u + (uint32_t)si, -1, 1);
            float *b = frand((size_t)k * np, 70u + (uint32_t)si, -1, 1);
            float *c0 = frand((size_t)m * ldc, 80u, -1, 1), *c1 = falloc((size_t)m * ldc);
            memcpy(c1, c0, (size_t)m * ldc * sizeof(float));
            gemm_small_nn(c0, a, b, m, n, k, lda, np, ldc, false);
            gemm_small_nn(c1, a, b, m, gemm_small_cols(n, np), k, lda, np, ldc, false);
            for (int i = 0; i < m; i++)
                ck_assert_msg(!memcmp(c0 + (size_t)i * ldc, c1 + (size_t)i * ldc,
                                      (size_t)n * sizeof(float)),
                              "libxsmm %dx%dx%d: row %d differs padded to %d columns", m, n, k,
                              i, np);
            ms_free(a), ms_free(b), ms_free(c0), ms_free(c1);
        }
    }
    ck_assert_int_eq(gemm_small_lib_set(start), MS_OK);
}
END_TEST

/* More shapes than a thread's kernel cache holds before it is emptied
 * (768), in turn, twice: every result the same as the first time (a
 * cache slot reused for another shape must not hand back the wrong
 * kernel). */
START_TEST(test_small_cache_many_shapes)
{
    enum { R = 130, K = 98, NS = 7 };
    const int ns[NS] = {64, 48, 32, 16, 8, 24, 40};
    float *a = frand((size_t)R * K, 1u, -1, 1), *b = frand((size_t)K * 64, 2u, -1, 1);
    float *first = falloc((size_t)R * (R + 1) / 2 * 232), *c = falloc((size_t)R * 64);
    for (int pass = 0; pass < 2; pass++) {
        size_t at = 0;
        for (int si = 0; si < NS; si++)
            for (int m = 1; m <= R; m++) {
                int n = ns[si];
                gemm_small_nn(c, a, b, m, n, K, K, 64, n, false);
                if (pass == 0) memcpy(first + at, c, (size_t)m * n * sizeof(float));
                else ck_assert_msg(!memcmp(first + at, c, (size_t)m * n * sizeof(float)),
                                   "%dx%d: differs on the second pass", m, n);
                at += (size_t)m * n;
                /* and row 0 is the one-row product's (each row alone: a
                 * row of C reads only its row of A) to float rounding */
                double want0 = 0;
                for (int p = 0; p < K; p++) want0 += (double)a[p] * b[(size_t)p * 64];
                ck_assert_msg(fabs(c[0] - want0) <= 1e-5, "%dx%d: c[0] %g want %g", m, n, c[0],
                              want0);
            }
    }
    ms_free(a), ms_free(b), ms_free(first), ms_free(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_gemm_small");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_small_lib_choice);
    tcase_add_test(tc, test_small_vs_naive);
    tcase_add_test(tc, test_small_rows);
    tcase_add_test(tc, test_small_cols);
    tcase_add_test(tc, test_small_cache_many_shapes);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
