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
 * max (same units) and sum (m = -inf: nothing seen yet). Per row: the new
 * max, tile = 2^(tile - max), l = l * corr + the row's sum, where
 * corr = 2^(m_old - m_new) (0 for an empty row) is what the caller
 * multiplies the row's accumulator by.
 * Returns whether any corr is not 1 (some accumulator needs scaling). */
MS_SIMD_DECLARE(bool, attn_tile_softmax,
                (float *tile /* (nq, nk) */, int nq, int nk, float *m /* (nq) */,
                 float *l /* (nq) */, float *corr /* (nq) */));

/* x[i] = 2^(x[i] - shift), for x[i] <= shift (a row max); returns the sum
 * of the new x. Within 2 ulp of exp2f down to 2^-126.5, below that 0. */
MS_SIMD_DECLARE(float, attn_exp2_sum, (float *x /* (n) */, int n, float shift));

/* x[i, :] *= f[i] for rows whose f is not 1. */
MS_SIMD_DECLARE(void, attn_scale_rows,
                (float *x /* (rows, cols), row stride ld */, int rows, int cols, long ld,
                 const float *f /* (rows) */));

static inline bool attn_tile_softmax(float *tile, int nq, int nk, float *m, float *l, float *corr)
{
    return MS_SIMD_CALL(attn_tile_softmax, tile, nq, nk, m, l, corr);
}

static inline void attn_scale_rows(float *x, int rows, int cols, long ld, const float *f)
{
    MS_SIMD_CALL(attn_scale_rows, x, rows, cols, ld, f);
}

#ifdef __cplusplus
}
#endif
#endif
