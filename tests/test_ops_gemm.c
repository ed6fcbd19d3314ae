/* gemm_cpu (kernels/gemm.h) on every GEMM library this machine runs
 * (OpenBLAS always; oneDNN where libdnnl loads and the CPU has AVX-512):
 * which one is chosen and why; every transpose, alpha, beta and leading
 * dimension against a double loop; and the same bits at 1 to 7 threads,
 * for gemm_cpu and linear_cpu, at sizes whose split leaves a tail of a few
 * rows (oneDNN's calls of fewer than 16 rows of A B^T round differently:
 * gemm_split_at keeps them away). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_path.h"
#include "kernels/gemm.h"
#include "kernels/linear.h"
#include "testutil_ops.h"

/* Whether oneDNN should be usable here, found independently of gemm.c: an
 * AVX-512 CPU and a loadable libdnnl. */
static bool onednn_expected(void)
{
    if (!cpu_path_supported(MS_CPU_PATH_V4)) return false;
    const char *names[] = {"libdnnl.so.2", "libdnnl.so.3"};
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            dlclose(h);
            return true;
        }
    }
    return false;
}

/* Libraries 0 .. count-1 run here (leaves the choice as it found it). */
static int lib_count(void)
{
    ms_gemm_lib start = gemm_lib_get();
    int count = gemm_lib_set(MS_GEMM_ONEDNN) == MS_OK ? 2 : 1;
    ck_assert_int_eq(gemm_lib_set(start), MS_OK);
    return count;
}

START_TEST(test_gemm_lib_choice)
{
    const char *env = getenv("MS_GEMM");
    bool ask_openblas = env && !strcmp(env, "openblas");
    ms_gemm_lib start = gemm_lib_get();
    ck_assert_msg(start == (!ask_openblas && onednn_expected() ? MS_GEMM_ONEDNN : MS_GEMM_OPENBLAS),
                  "chose %s (%s)", gemm_lib_name(start), gemm_lib_why());
    ck_assert(strlen(gemm_lib_why()) > 0);
    ck_assert_int_eq(gemm_lib_set(MS_GEMM_OPENBLAS), MS_OK);
    ck_assert_int_eq(gemm_lib_get(), MS_GEMM_OPENBLAS);
    /* oneDNN on request wherever it is usable (MS_GEMM=openblas leaves
     * it unloaded) */
    ms_status st = gemm_lib_set(MS_GEMM_ONEDNN);
    ck_assert_int_eq(st, onednn_expected() && !ask_openblas ? MS_OK : MS_ERR_UNSUPPORTED);
    if (st != MS_OK) ck_assert(strstr(ms_last_error(), "onednn") != NULL);
    ck_assert_int_eq(gemm_lib_set((ms_gemm_lib)7), MS_ERR_ARG);
    ck_assert_str_eq(gemm_lib_name(MS_GEMM_ONEDNN), "onednn");
    ck_assert_str_eq(gemm_lib_name(MS_GEMM_OPENBLAS), "openblas");
    ck_assert_int_eq(gemm_lib_set(start), MS_OK);
}
END_TEST

/* C = alpha op(A) op(B) + beta C in double, row-major with strides. */
static void naive_gemm(double *c /* (m, n), ldc */, const float *a, const float *b,
                       const float *c0, int m, int n, int k, bool ta, bool tb, int lda, int ldb,
                       int ldc, float alpha, float beta)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++)
                s += (double)(ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]) *
                     (tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j]);
            c[(size_t)i * ldc + j] = alpha * s + (double)beta * c0[(size_t)i * ldc + j];
        }
}

START_TEST(test_gemm_vs_naive)
{
    ms_gemm_lib start = gemm_lib_get();
    /* small (one call) and large (split over threads, by rows or columns) */
    const int shapes[][3] = {{37, 29, 23}, {203, 96, 64}, {64, 300, 80}, {1, 200, 64}};
    for (int li = 0, libs = lib_count(); li < libs; li++) {
        ck_assert_int_eq(gemm_lib_set((ms_gemm_lib)li), MS_OK);
        for (int si = 0; si < 4; si++)
            for (int cs = 0; cs < 8; cs++) {
                int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
                bool ta = cs & 1, tb = cs & 2;
                float alpha = cs & 4 ? 0.75f : 1.0f, beta = cs & 4 ? 0.5f : 0.0f;
                int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
                float *a = frand((size_t)(ta ? k : m) * lda, 10 + cs, -1, 1);
                float *b = frand((size_t)(tb ? n : k) * ldb, 20 + cs, -1, 1);
                float *c = frand((size_t)m * ldc, 30 + cs, -1, 1);
                float *c0 = falloc((size_t)m * ldc);
                memcpy(c0, c, (size_t)m * ldc * sizeof(float));
                double *want = dalloc((size_t)m * ldc);
                naive_gemm(want, a, b, c0, m, n, k, ta, tb, lda, ldb, ldc, alpha, beta);
                gemm_cpu(c, a, b, m, n, k, ta, tb, lda, ldb, ldc, alpha, beta);
                char what[96];
                snprintf(what, sizeof what, "%s %dx%dx%d ta %d tb %d alpha %g beta %g",
                         gemm_lib_name((ms_gemm_lib)li), m, n, k, ta, tb, alpha, beta);
                /* sums of k products of O(1): float rounding, ~sqrt(k) 6e-8 */
                for (int i = 0; i < m; i++) {
                    check_close(c + (size_t)i * ldc, want + (size_t)i * ldc, (size_t)n, 2e-6, what);
                    for (int j = n; j < ldc; j++) /* the stride's gap is left alone */
                        ck_assert_float_eq(c[(size_t)i * ldc + j], c0[(size_t)i * ldc + j]);
                }
                ms_free(a), ms_free(b), ms_free(c), ms_free(c0), free(want);
            }
    }
    ck_assert_int_eq(gemm_lib_set(start), MS_OK);
}
END_TEST

/* The same bits at every thread count. 100 rows at 4 threads are cut at 48
 * and 96: without the 16-row floor the last call would have 4. */
START_TEST(test_gemm_same_bits_any_threads)
{
    ms_gemm_lib start = gemm_lib_get();
    const int shapes[][3] = {{100, 64, 192}, {690, 576, 192}, {243, 96, 64}, {64, 1009, 96},
                             {1009, 49, 64}, {96, 1500, 192}};
    const int threads[] = {2, 3, 4, 5, 7};
    for (int li = 0, libs = lib_count(); li < libs; li++) {
        ck_assert_int_eq(gemm_lib_set((ms_gemm_lib)li), MS_OK);
        for (int si = 0; si < 6; si++)
            for (int cs = 0; cs < 4; cs++) {
                int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
                bool ta = cs & 1, tb = cs & 2;
                int lda = ta ? m : k, ldb = tb ? k : n;
                float *a = frand((size_t)m * k, 40 + si, -1, 1), *b = frand((size_t)k * n, 50 + si, -1, 1);
                float *one = falloc((size_t)m * n), *got = falloc((size_t)m * n);
                set_threads(1);
                gemm_cpu(one, a, b, m, n, k, ta, tb, lda, ldb, n, 1.0f, 0.0f);
                for (int ti = 0; ti < 5; ti++) {
                    set_threads(threads[ti]);
                    memset(got, 0, (size_t)m * n * sizeof(float));
                    gemm_cpu(got, a, b, m, n, k, ta, tb, lda, ldb, n, 1.0f, 0.0f);
                    ck_assert_msg(!memcmp(one, got, (size_t)m * n * sizeof(float)),
                                  "%s %dx%dx%d ta %d tb %d: %d threads differ from 1",
                                  gemm_lib_name((ms_gemm_lib)li), m, n, k, ta, tb, threads[ti]);
                }
                ms_free(a), ms_free(b), ms_free(one), ms_free(got);
            }
        /* linear_cpu: its own slabs of rows, A W^T */
        const int lin[][3] = {{100, 192, 64}, {690, 192, 576}, {1009, 64, 49}};
        for (int si = 0; si < 3; si++) {
            int n = lin[si][0], cin = lin[si][1], cout = lin[si][2];
            float *x = frand((size_t)n * cin, 60 + si, -1, 1), *w = frand((size_t)cout * cin, 70, -1, 1);
            float *bias = frand(cout, 80, -1, 1);
            float *one = falloc((size_t)n * cout), *got = falloc((size_t)n * cout);
            set_threads(1);
            linear_cpu(one, x, w, bias, n, cin, cout, MS_ACT_GELU, false);
            for (int ti = 0; ti < 5; ti++) {
                set_threads(threads[ti]);
                linear_cpu(got, x, w, bias, n, cin, cout, MS_ACT_GELU, false);
                ck_assert_msg(!memcmp(one, got, (size_t)n * cout * sizeof(float)),
                              "%s linear %d x %d -> %d: %d threads differ from 1",
                              gemm_lib_name((ms_gemm_lib)li), n, cin, cout, threads[ti]);
            }
            ms_free(x), ms_free(w), ms_free(bias), ms_free(one), ms_free(got);
        }
    }
    set_threads(2);
    ck_assert_int_eq(gemm_lib_set(start), MS_OK);
}
END_TEST

/* gemm_cpu_lib makes the product on the library asked for, whatever
 * gemm_cpu's choice: bit for bit what gemm_cpu gives on that library;
 * oneDNN where it is not usable is OpenBLAS. */
START_TEST(test_gemm_cpu_lib)
{
    ms_gemm_lib start = gemm_lib_get();
    const int m = 203, n = 96, k = 768;
    float *a = frand((size_t)m * k, 90, -1, 1), *b = frand((size_t)n * k, 91, -1, 1);
    float *want = falloc((size_t)m * n), *got = falloc((size_t)m * n);
    int libs = lib_count();
    for (int li = 0; li < MS_GEMM_LIB_COUNT; li++) {
        ms_gemm_lib asked = (ms_gemm_lib)li;
        ms_gemm_lib runs = li < libs ? asked : MS_GEMM_OPENBLAS;
        ck_assert_int_eq(gemm_lib_set(runs), MS_OK);
        gemm_cpu(want, a, b, m, n, k, false, true, k, k, n, 1.0f, 0.0f);
        /* gemm_cpu's own choice the other library, where there are two */
        ms_gemm_lib other = libs == 2 && runs == MS_GEMM_OPENBLAS ? MS_GEMM_ONEDNN
                                                                 : MS_GEMM_OPENBLAS;
        ck_assert_int_eq(gemm_lib_set(other), MS_OK);
        gemm_cpu_lib(asked, got, a, b, m, n, k, false, true, k, k, n, 1.0f, 0.0f);
        ck_assert_msg(!memcmp(want, got, (size_t)m * n * sizeof(float)), "%s",
                      gemm_lib_name(asked));
    }
    ms_free(a), ms_free(b), ms_free(want), ms_free(got);
    ck_assert_int_eq(gemm_lib_set(start), MS_OK);
}
END_TEST

/* The split itself: cuts at multiples of 48 and of min_part, none within
 * min_part of the end, parts in order covering all. */
START_TEST(test_gemm_split_at)
{
    const int mins[] = {16, 40, 49, 100};
    for (int mi = 0; mi < 4; mi++)
        for (int len = 0; len < 500; len++)
            for (int parts = 1; parts <= 9; parts++) {
                int mp = mins[mi], prev = 0;
                ck_assert_int_eq(gemm_split_at(len, 0, parts, mp), 0);
                for (int p = 1; p <= parts; p++) {
                    int at = gemm_split_at(len, p, parts, mp);
                    ck_assert_int_ge(at, prev);
                    ck_assert(at == len || at == 0 || (at % 48 == 0 && len - at >= mp));
                    ck_assert(at == prev || at == len || at - prev >= mp);
                    prev = at;
                }
                ck_assert_int_eq(prev, len);
            }
    /* parts of more than 10^6 multiply-adds, and at least 16 rows */
    ck_assert_int_eq(gemm_min_part(192.0 * 576), 16);
    ck_assert_int_eq(gemm_min_part(64.0 * 96), 163);
    ck_assert_int_eq(gemm_min_part(1e6), 16);
    ck_assert_int_eq(gemm_min_part(0), 1000001);
    /* column chunks: fixed by the shape, covering 0..n in order, each at
     * least 48 wide and starting 16-aligned */
    ck_assert_int_eq(gemm_col_chunks(1009, 64.0 * 96), 12);
    ck_assert_int_eq(gemm_col_chunks(200, 64.0 * 96), 3);
    ck_assert_int_eq(gemm_col_chunks(127, 1e6), 1);
    ck_assert_int_eq(gemm_col_chunks(5000, 10.0), 1); /* 5e4 multiply-adds: one call */
    for (int n = 128; n < 3000; n += 37) {
        int chunks = gemm_col_chunks(n, 1e5);
        ck_assert_int_eq(gemm_col_at(n, 0, chunks), 0);
        ck_assert_int_eq(gemm_col_at(n, chunks, chunks), n);
        for (int q = 1; q <= chunks; q++) {
            int at = gemm_col_at(n, q, chunks), prev = gemm_col_at(n, q - 1, chunks);
            ck_assert_int_ge(at - prev, 48);
            ck_assert(q == chunks || at % 16 == 0);
        }
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_gemm");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_gemm_lib_choice);
    tcase_add_test(tc, test_gemm_vs_naive);
    tcase_add_test(tc, test_gemm_same_bits_any_threads);
    tcase_add_test(tc, test_gemm_cpu_lib);
    tcase_add_test(tc, test_gemm_split_at);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
