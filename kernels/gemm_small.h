/* Small row-major single-precision products for the attention ops:
 * C = A B, or C += A B, alpha 1, on the calling thread. MiTA's products
 * are a few dozen rows by 49 or 64 columns; OpenBLAS 0.3.21 has
 * small-matrix kernels for them on AVX-512 only, and elsewhere (its
 * Haswell/Zen kernels) packs both operands and clears C first, which was
 * 21 % of a MiTA layer's time on a Zen 3 (N = 1024). libxsmm generates a
 * kernel for each shape at run time (AVX2 or AVX-512, the CPU's) and
 * makes them 1.15-2.4x faster there (1 thread). So: libxsmm where it
 * was built in and generates a kernel here, else OpenBLAS;
 * MS_SMALL_GEMM=openblas in the environment (read once) asks for
 * OpenBLAS. Each product is one call of one library whose bits depend on
 * the shape only, so results do not depend on the thread count. */
#ifndef MS_GEMM_SMALL_H
#define MS_GEMM_SMALL_H

#include <stdbool.h>

#include "common.h"

typedef enum { MS_GEMM_SMALL_OPENBLAS = 0, MS_GEMM_SMALL_LIBXSMM = 1 } ms_gemm_small_lib;
#define MS_GEMM_SMALL_LIB_COUNT 2

/* The library gemm_small_nn calls, and in words why (for doctor). */
ms_gemm_small_lib gemm_small_lib_get(void);
const char *gemm_small_lib_why(void);
const char *gemm_small_lib_name(ms_gemm_small_lib lib);
/* Chooses one (tests, benches); MS_ERR_UNSUPPORTED where libxsmm is not
 * built in or generates no kernel here. Not thread-safe against running
 * products. */
ms_status gemm_small_lib_set(ms_gemm_small_lib lib);

/* c = a b (accumulate: c += a b). A shape libxsmm has no kernel for goes
 * to OpenBLAS. */
void gemm_small_nn(float *c /* (m, n), row stride ldc */, const float *a /* (m, k), lda */,
                   const float *b /* (k, n), ldb */, int m, int n, int k, int lda, int ldb,
                   int ldc, bool accumulate);

/* Generates the kernel of this shape now, where libxsmm runs the
 * products (nothing with OpenBLAS), so that its first product does not
 * (13-60 us, and a page for the code): for a plan step, out of the
 * per-image path. libxsmm's kernels compute a row of c from its row of a
 * alone, the same bits whatever m (checked, 1-130 rows, on MiTA's
 * shapes: test_ops_gemm_small), so a caller may size its products by
 * the rows it has. */
void gemm_small_prepare(int m, int n, int k, int lda, int ldb, int ldc, bool accumulate);

/* Kernels generated so far in this process (0 without libxsmm): for the
 * tests of what gemm_small_prepare saves the hot path. */
int gemm_small_kernels_made(void);

/* Columns to compute for a product of n columns whose rows in the
 * caller's buffers have room for max_cols (>= n), the columns past n
 * computed from whatever the operands hold there and then ignored: with
 * libxsmm n rounded up to a multiple of 8 (at most max_cols), so that no
 * vector of its kernels is masked (n = 49, MiTA's experts and routed
 * keys: 69 GF/s against 86 for 56 columns of which 49 are used, 1 thread,
 * Zen 3); each column from its column of B alone, the same bits whatever
 * the columns (test_ops_gemm_small). With OpenBLAS n. */
int gemm_small_cols(int n, int max_cols);

#endif
