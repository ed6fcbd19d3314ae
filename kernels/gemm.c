#include "gemm.h"

#include <cblas.h>
#include <pthread.h>
#include <stddef.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static pthread_once_t gemm_once = PTHREAD_ONCE_INIT;
static void gemm_set_single(void) { openblas_set_num_threads(1); }
void gemm_init_threads(void) { pthread_once(&gemm_once, gemm_set_single); }

static void gemm_one(float *c, const float *a, const float *b, int m, int n, int k, bool ta,
                     bool tb, int lda, int ldb, int ldc, float alpha, float beta)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* OpenBLAS's micro-kernels round a row differently in a full tile and in
 * a call's tail (Haswell/Zen sgemm: tiles of 12 rows; SkylakeX/Cooperlake:
 * 16), so a row's result depends on where a call starts. Cut at multiples
 * of 48, the least common multiple, every row lands in the same kind of
 * tile as in one call over all rows, and the results do not depend on the
 * thread count (on Haswell kernels, cuts at multiples of 16 changed 1255 of
 * 19488 outputs of a 203 x 96 x 64 product). */
#define GEMM_ALIGN 48

int gemm_split_at(int len, int part, int parts)
{
    if (part >= parts) return len;
    long at = ((long)len * part / parts + GEMM_ALIGN / 2) / GEMM_ALIGN * GEMM_ALIGN;
    return at > len ? len : (int)at;
}

void gemm_cpu(float *c, const float *a, const float *b, int m, int n, int k, bool ta, bool tb,
              int lda, int ldb, int ldc, float alpha, float beta)
{
    gemm_init_threads();
    int threads = 1;
#ifdef _OPENMP
    if (!omp_in_parallel()) threads = omp_get_max_threads();
#endif
    /* Small products, or already inside a parallel region: one call. */
    if (threads <= 1 || (double)m * n * k < 1e6) {
        gemm_one(c, a, b, m, n, k, ta, tb, lda, ldb, ldc, alpha, beta);
        return;
    }
    /* Split the larger of m and n into one slab per thread, cut at
     * gemm_split_at's aligned boundaries. */
    bool split_m = m >= n;
    int len = split_m ? m : n;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int s = 0; s < threads; s++) {
        int i0 = gemm_split_at(len, s, threads), cnt = gemm_split_at(len, s + 1, threads) - i0;
        if (cnt <= 0) continue;
        if (split_m) {
            const float *as = ta ? a + i0 : a + (size_t)i0 * lda;
            gemm_one(c + (size_t)i0 * ldc, as, b, cnt, n, k, ta, tb, lda, ldb, ldc, alpha, beta);
        } else {
            const float *bs = tb ? b + (size_t)i0 * ldb : b + i0;
            gemm_one(c + i0, a, bs, m, cnt, k, ta, tb, lda, ldb, ldc, alpha, beta);
        }
    }
}
