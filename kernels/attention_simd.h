/* The per-tile softmax arithmetic of full attention on the CPU
 * (kernels/attention_full.c), built once per CPU path (cpu_path.h). */
#ifndef MS_ATTENTION_SIMD_H
#define MS_ATTENTION_SIMD_H

#include "cpu_path.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One key tile of the online softmax, in base 2: tile holds the logits of
 * nq queries against nk keys times log2(e) (so exp(logit) = 2^tile; the
 * caller folds log2(e) into the GEMM's scale); m, l are each query's running
 * reference (same units) and sum (m = -inf: nothing seen yet). Per row:
 * tile = 2^(tile - m') and l = l * corr + the row's sum, where m' is the new
 * reference and corr = 2^(m - m') (0 for an empty row) is what the caller
 * multiplies the row's accumulator by. m' is not the max: it is the max of
 * the first 16 logits the row sees, and stays (corr = 1) while no logit
 * exceeds it by over 64 (values up to 2^64 are fine in floats). A row that
 * does (or holds a NaN or an infinity) is left to the caller, marked by
 * corr = NaN, its tile values spoilt: the caller recomputes its logits and
 * calls attn_row_softmax. Returns how many rows were left so. A NaN logit
 * makes its row's l NaN. */
MS_SIMD_DECLARE(int, attn_tile_softmax,
                (float *tile /* (nq, nk) */, int nq, int nk, float *m /* (nq) */,
                 float *l /* (nq) */, float *corr /* (nq) */));

/* One row of attn_tile_softmax the two-pass way: m' = the larger of m and
 * the row's max. */
MS_SIMD_DECLARE(void, attn_row_softmax, (float *row /* (nk) */, int nk, float *m, float *l,
                                         float *corr));

/* x[i] = 2^(x[i] - shift) for x[i] - shift <= 126; returns the sum of the
 * new x. Within 2 ulp of exp2f from 2^-126.5 (below that 0) to 2^126. */
MS_SIMD_DECLARE(float, attn_exp2_sum, (float *x /* (n) */, int n, float shift));

/* x[i, :] *= f[i] for rows whose f is not 1. */
MS_SIMD_DECLARE(void, attn_scale_rows,
                (float *x /* (rows, cols), row stride ld */, int rows, int cols, long ld,
                 const float *f /* (rows) */));

static inline int attn_tile_softmax(float *tile, int nq, int nk, float *m, float *l, float *corr)
{
    return MS_SIMD_CALL(attn_tile_softmax, tile, nq, nk, m, l, corr);
}

static inline void attn_row_softmax(float *row, int nk, float *m, float *l, float *corr)
{
    MS_SIMD_CALL(attn_row_softmax, row, nk, m, l, corr);
}

static inline float attn_exp2_sum(float *x, int n, float shift)
{
    return MS_SIMD_CALL(attn_exp2_sum, x, n, shift);
}

static inline void attn_scale_rows(float *x, int rows, int cols, long ld, const float *f)
{
    MS_SIMD_CALL(attn_scale_rows, x, rows, cols, ld, f);
}

#ifdef __cplusplus
}
#endif
#endif
