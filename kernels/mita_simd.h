/* Row loops of MiTA on the CPU (kernels/mita.c), built once per CPU path
 * (cpu_path.h). What the selections use is exact (compares, maxima,
 * element-wise adds, integer counts), so every path gives the same
 * landmarks, routes and routed sets; the softmax sums are reassociated
 * (the paths' outputs agree to float rounding). */
#ifndef MS_MITA_SIMD_H
#define MS_MITA_SIMD_H

#include "cpu_path.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest of x[0..n), n >= 1 (unspecified where x holds a NaN). */
MS_SIMD_DECLARE(float, mita_max, (const float *x /* (n) */, int n));
/* x[i] = 2^(x[i] * scale - shift), for x[i] * scale - shift <= 126 (shift
 * the row max times scale); returns the sum of the new x, NaN where x held
 * a NaN or an infinity. */
MS_SIMD_DECLARE(float, mita_exp2_sum, (float *x /* (n) */, int n, float scale, float shift));
/* acc[i] += x[r ld + i] for r = 0 .. rows-1, in that order (one call per
 * run of tokens: the landmarks' pooling). */
MS_SIMD_DECLARE(void, mita_add_rows,
                (float *acc /* (n) */, const float *x /* (rows, ld) */, size_t ld, int rows, int n));
/* key[i] = topk_key(x[i]) (mita_cuda_math.h): the order-preserving keys;
 * their least and largest, and the sums of x and x^2 (reassociated: for
 * the search's first guess only). */
MS_SIMD_DECLARE(void, mita_keys, (uint32_t *key /* (n) */, const float *x /* (n) */, int n,
                                  uint32_t *kmin, uint32_t *kmax, float *sum, float *sumsq));
/* Appends the key[i] >= t to val and their i to pos, in order; returns
 * how many. */
MS_SIMD_DECLARE(int, mita_collect_at_least_u32,
                (uint32_t *val /* (n) */, int32_t *pos /* (n) */, const uint32_t *key /* (n) */,
                 int n, uint32_t t));
/* Keeps the (key[i], pos[i]) with key[i] >= t, in order, in place;
 * returns how many. */
MS_SIMD_DECLARE(int, mita_compact_at_least_u32,
                (uint32_t *key /* (n) */, int32_t *pos /* (n) */, int n, uint32_t t));
/* How many key[i] >= t. */
MS_SIMD_DECLARE(int, mita_count_at_least_u32, (const uint32_t *key /* (n) */, int n, uint32_t t));
/* route[r] = argmax_first(x + r ld, m, 1): the first maximum of each row
 * (ld >= m: the rows may be padded). */
MS_SIMD_DECLARE(void, mita_argmax_rows,
                (int32_t *route /* (rows) */, const float *x /* (rows, ld) */, int rows, int m,
                 int ld));
/* idx[r] = pos[i], r = i's rank in descending key order, ties to the
 * lower i (pos ascending: ties to the lower position). key[n..np) must be
 * 0 (np >= n, a multiple of 8: no loop tail). O(n np): small n. */
MS_SIMD_DECLARE(void, mita_rank_desc,
                (int32_t *idx /* (n) */, const uint32_t *key /* (np) */,
                 const int32_t *pos /* (n) */, int n, int np));
/* The joint softmax of nb rows of lg (stride ld >= m + k), in base 2, over the
 * shared logits row[0..m) (R[q, :]) and the routed ones row[m..m+k), both
 * in units that `scale` (log2(e) included) turns into base-2 logits: each
 * row becomes 2^(logit - the row's max), inv[r] = 1 / its sum, mass[r]
 * (mass not NULL) = the shared part's share. Every row's shared part has
 * its max at column e (the expert the rows are routed to: R's argmax). A
 * row with a NaN or infinite logit gets inv NaN. */
MS_SIMD_DECLARE(void, mita_joint_softmax,
                (float *lg /* (nb, ld) */, int ld, float *inv /* (nb) */, float *mass /* (nb) */,
                 int e, int nb, int m, int k, float scale));
/* Row r of dst (stride dld) = row rows[r] of src (stride sld), d floats,
 * times f (exact for f = 1); scatter: the other way round, times f[r].
 * Inline vector copies: rows of 64 floats are too short for memcpy's call
 * to pay. */
MS_SIMD_DECLARE(void, mita_gather_rows,
                (float *dst /* (nr, dld) */, size_t dld, const float *src, size_t sld,
                 const int32_t *rows /* (nr) */, int nr, int d, float f));
/* dst[t * dld + r] = src[rows[r] * sld + t], t < d: the rows gathered as
 * columns (dld >= nr), so that a GEMM takes them untransposed. */
MS_SIMD_DECLARE(void, mita_gather_rows_t,
                (float *dst /* (d, dld) */, size_t dld, const float *src, size_t sld,
                 const int32_t *rows /* (nr) */, int nr, int d));
MS_SIMD_DECLARE(void, mita_scatter_rows_scaled,
                (float *dst, size_t dld, const float *src /* (nr, sld) */, size_t sld,
                 const int32_t *rows /* (nr) */, const float *f /* (nr) */, int nr, int d));

static inline float mita_max(const float *x, int n) { return MS_SIMD_CALL(mita_max, x, n); }
static inline float mita_exp2_sum(float *x, int n, float scale, float shift)
{
    return MS_SIMD_CALL(mita_exp2_sum, x, n, scale, shift);
}
static inline void mita_add_rows(float *acc, const float *x, size_t ld, int rows, int n)
{
    MS_SIMD_CALL(mita_add_rows, acc, x, ld, rows, n);
}
static inline void mita_keys(uint32_t *key, const float *x, int n, uint32_t *kmin,
                             uint32_t *kmax, float *sum, float *sumsq)
{
    MS_SIMD_CALL(mita_keys, key, x, n, kmin, kmax, sum, sumsq);
}
static inline int mita_collect_at_least_u32(uint32_t *val, int32_t *pos, const uint32_t *key,
                                            int n, uint32_t t)
{
    return MS_SIMD_CALL(mita_collect_at_least_u32, val, pos, key, n, t);
}
static inline int mita_compact_at_least_u32(uint32_t *key, int32_t *pos, int n, uint32_t t)
{
    return MS_SIMD_CALL(mita_compact_at_least_u32, key, pos, n, t);
}
static inline int mita_count_at_least_u32(const uint32_t *key, int n, uint32_t t)
{
    return MS_SIMD_CALL(mita_count_at_least_u32, key, n, t);
}
static inline void mita_argmax_rows(int32_t *route, const float *x, int rows, int m, int ld)
{
    MS_SIMD_CALL(mita_argmax_rows, route, x, rows, m, ld);
}
static inline void mita_rank_desc(int32_t *idx, const uint32_t *key, const int32_t *pos, int n,
                                  int np)
{
    MS_SIMD_CALL(mita_rank_desc, idx, key, pos, n, np);
}
static inline void mita_joint_softmax(float *lg, int ld, float *inv, float *mass, int e, int nb,
                                      int m, int k, float scale)
{
    MS_SIMD_CALL(mita_joint_softmax, lg, ld, inv, mass, e, nb, m, k, scale);
}
static inline void mita_gather_rows(float *dst, size_t dld, const float *src, size_t sld,
                                    const int32_t *rows, int nr, int d, float f)
{
    MS_SIMD_CALL(mita_gather_rows, dst, dld, src, sld, rows, nr, d, f);
}
static inline void mita_gather_rows_t(float *dst, size_t dld, const float *src, size_t sld,
                                      const int32_t *rows, int nr, int d)
{
    MS_SIMD_CALL(mita_gather_rows_t, dst, dld, src, sld, rows, nr, d);
}
static inline void mita_scatter_rows_scaled(float *dst, size_t dld, const float *src, size_t sld,
                                            const int32_t *rows, const float *f, int nr, int d)
{
    MS_SIMD_CALL(mita_scatter_rows_scaled, dst, dld, src, sld, rows, f, nr, d);
}

#ifdef __cplusplus
}
#endif
#endif
