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
    /* Split the larger of m and n into one slab per thread, multiples of 16
     * so the micro-kernels stay full. */
    bool split_m = m >= n;
    int len = split_m ? m : n;
    int slab = (len + threads - 1) / threads;
    slab = (slab + 15) / 16 * 16;
    int slabs = (len + slab - 1) / slab;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int s = 0; s < slabs; s++) {
        int i0 = s * slab, cnt = len - i0 < slab ? len - i0 : slab;
        if (split_m) {
            const float *as = ta ? a + i0 : a + (size_t)i0 * lda;
            gemm_one(c + (size_t)i0 * ldc, as, b, cnt, n, k, ta, tb, lda, ldb, ldc, alpha, beta);
        } else {
            const float *bs = tb ? b + (size_t)i0 * ldb : b + i0;
            gemm_one(c + i0, a, bs, m, cnt, k, ta, tb, lda, ldb, ldc, alpha, beta);
        }
    }
}
