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

/* The fused kernel (x86-64-v4 and v3; attention_full.c uses it where
 * attn_fused_has says so): whether this path has it for head dim d. */
MS_SIMD_DECLARE(bool, attn_fused_has, (int d));

/* Keys chunk..chunk+63 of head h, transposed (zeros past n): kt[t][jj]. */
MS_SIMD_DECLARE(void, attn_pack_kt, (float *kt /* (d, 64) */, const float *qkv /* (n, 3c) */,
                                     int n, int c, int d, int h, int chunk));

/* Scratch floats of one attn_fused_rows call of nq queries. */
#define ATTN_FUSED_WS_FLOATS(nq, kb) ((size_t)(nq) * ((size_t)(kb) + 20))

/* Queries [q0, q0+nq) of head h: the online softmax over key tiles of kb
 * (a multiple of 64), each tile's max exact; kt holds head h's keys as
 * attn_pack_kt's chunks, one after the other. A row with a NaN or +inf
 * logit, or only -inf ones, comes out NaN, as the plain softmax's. */
MS_SIMD_DECLARE(void, attn_fused_rows,
                (float *out /* (n, c) */, const float *qkv /* (n, 3c) */,
                 const float *kt /* (ceil(n / 64), d, 64) */, int n, int c, int d, int h, int q0,
                 int nq, int kb, float *ws /* (ATTN_FUSED_WS_FLOATS(nq, kb)) */));

static inline bool attn_fused_has(int d) { return MS_SIMD_CALL(attn_fused_has, d); }

static inline void attn_pack_kt(float *kt, const float *qkv, int n, int c, int d, int h, int chunk)
{
    MS_SIMD_CALL(attn_pack_kt, kt, qkv, n, c, d, h, chunk);
}

static inline void attn_fused_rows(float *out, const float *qkv, const float *kt, int n, int c,
                                   int d, int h, int q0, int nq, int kb, float *ws)
{
    MS_SIMD_CALL(attn_fused_rows, out, qkv, kt, n, c, d, h, q0, nq, kb, ws);
}

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
