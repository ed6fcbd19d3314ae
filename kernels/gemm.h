/* Row-major single-precision GEMM on the CPU: C = alpha op(A) op(B) + beta C.
 * The one place OpenBLAS is called for large products. OpenBLAS runs
 * single-threaded and the product is split across OpenMP threads, so there is
 * one thread pool: two pools (libgomp's and OpenBLAS's pthreads) spin against
 * each other and ran 2.5x slower on a DeiT-Tiny forward on 2 cores. */
#ifndef MS_GEMM_H
#define MS_GEMM_H

#include <stdbool.h>

void gemm_cpu(float *c /* (m, n), row stride ldc */, const float *a /* (m, k) or (k, m) if ta */,
              const float *b /* (k, n) or (n, k) if tb */, int m, int n, int k, bool ta, bool tb,
              int lda, int ldb, int ldc, float alpha, float beta);

/* Start of part `part` of `parts` of len rows (or columns) split for
 * threads: near len * part / parts, at a multiple of 48 (OpenBLAS's tile
 * heights divide it, so results do not depend on the split); len for
 * part >= parts. */
int gemm_split_at(int len, int part, int parts);

/* Makes OpenBLAS single-threaded (idempotent); gemm_cpu calls it too. */
void gemm_init_threads(void);

#endif
