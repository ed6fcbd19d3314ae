/* Row-major single-precision GEMM on the CPU: C = alpha op(A) op(B) + beta C.
 * The one place the large products are made: by oneDNN's sgemm on CPUs
 * with AVX-512 where libdnnl is installed (loaded on first use), else by
 * OpenBLAS; MS_GEMM=openblas in the environment (read once) asks for
 * OpenBLAS. (Full attention calls OpenBLAS's small-matrix kernels
 * directly, which beat oneDNN's on its shapes; MiTA's small products go
 * through gemm_small.h.) Either runs
 * single-threaded and the product is split across OpenMP threads, so there
 * is one thread pool: two pools (libgomp's and OpenBLAS's pthreads) spin
 * against each other and ran 2.5x slower on a DeiT-Tiny forward on 2 cores. */
#ifndef MS_GEMM_H
#define MS_GEMM_H

#include <pthread.h>
#include <stdbool.h>

#include "common.h"

typedef enum { MS_GEMM_OPENBLAS = 0, MS_GEMM_ONEDNN = 1 } ms_gemm_lib;
#define MS_GEMM_LIB_COUNT 2

/* The library gemm_cpu calls, and in words why (for doctor). */
ms_gemm_lib gemm_lib_get(void);
const char *gemm_lib_why(void);
const char *gemm_lib_name(ms_gemm_lib lib);
/* Chooses one (tests, benches); MS_ERR_UNSUPPORTED where oneDNN is not
 * usable here. Not thread-safe against running products. */
ms_status gemm_lib_set(ms_gemm_lib lib);

void gemm_cpu(float *c /* (m, n), row stride ldc */, const float *a /* (m, k) or (k, m) if ta */,
              const float *b /* (k, n) or (n, k) if tb */, int m, int n, int k, bool ta, bool tb,
              int lda, int ldb, int ldc, float alpha, float beta);
/* The same on a given library (doctor's check of one against the other);
 * oneDNN where it is not usable here is OpenBLAS. */
void gemm_cpu_lib(ms_gemm_lib lib, float *c /* (m, n), row stride ldc */,
                  const float *a /* (m, k) or (k, m) if ta */,
                  const float *b /* (k, n) or (n, k) if tb */, int m, int n, int k, bool ta,
                  bool tb, int lda, int ldb, int ldc, float alpha, float beta);

/* Start of part `part` of `parts` of len rows split for
 * threads: near len * part / parts, at a multiple of 48 (OpenBLAS's tile
 * heights divide it) and of at least min_part, and not within min_part of
 * len, so that every call a split makes takes the path one call over the
 * whole takes, and results do not depend on the split; len for
 * part >= parts. min_part: gemm_min_part of the multiply-adds per row
 * (n times k). */
int gemm_split_at(int len, int part, int parts, int min_part);
/* Products of at most this many multiply-adds run as one call. */
#define MS_GEMM_SMALL_MACS 1e6
int gemm_min_part(double other_macs);
/* The threads to split a product of len rows of other_macs
 * multiply-adds each over: 1 (one call) for a product of at most
 * MS_GEMM_SMALL_MACS, inside a parallel region, or where the split would
 * leave one part; with *min_part for gemm_split_at. */
int gemm_split_threads(int *min_part, int len, double other_macs);
/* gemm_cpu as one call of the library on the calling thread, whatever its
 * shape: for a caller that cuts rows at gemm_split_at itself (linear_cpu),
 * whose slabs must each be made as the whole would be. */
void gemm_cpu_whole(float *c /* (m, n), row stride ldc */,
                    const float *a /* (m, k) or (k, m) if ta */,
                    const float *b /* (k, n) or (n, k) if tb */, int m, int n, int k, bool ta,
                    bool tb, int lda, int ldb, int ldc, float alpha, float beta);
/* A product wider than tall (n > m) is made as gemm_col_chunks calls, a
 * number fixed by its shape (other_macs: m times k), the chunk-th starting
 * at column gemm_col_at (n for chunk >= chunks). */
int gemm_col_chunks(int n, double other_macs);
int gemm_col_at(int n, int chunk, int chunks);

/* oneDNN generates its kernels on the first product: gemm_warm_begin has a
 * thread do that while the caller does other work (the engine loads its
 * weights), and gemm_warm_end waits for it, where begin returned true.
 * Both within one function: a thread left in oneDNN while the program
 * exits crashed in the other libraries' exit handlers. */
bool gemm_warm_begin(pthread_t *thread);
void gemm_warm_end(pthread_t thread);

/* Makes OpenBLAS single-threaded (idempotent); gemm_cpu calls it too. The
 * library is chosen (and oneDNN looked for) at the first product or
 * question about it. */
void gemm_init_threads(void);

#endif
