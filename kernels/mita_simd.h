/* Row loops of MiTA on the CPU (kernels/mita.c), built once per CPU path
 * (cpu_path.h). All exact (compares, maxima, element-wise adds and scales,
 * nothing reassociated), so both paths give the same landmarks, routes and
 * routed sets. */
#ifndef MS_MITA_SIMD_H
#define MS_MITA_SIMD_H

#include "cpu_path.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest of x[0..n), n >= 1 (unspecified where x holds a NaN). */
MS_SIMD_DECLARE(float, mita_max, (const float *x /* (n) */, int n));
/* The first i in [0, n) with x[i] > thr, or n. */
MS_SIMD_DECLARE(int, mita_first_above, (const float *x /* (n) */, int n, float thr));
/* Appends the x[i] >= t to val and their i to pos, in order; returns how
 * many. */
MS_SIMD_DECLARE(int, mita_collect_at_least,
                (float *val /* (n) */, int32_t *pos /* (n) */, const float *x /* (n) */, int n,
                 float t));
/* acc[i] += x[i]. */
MS_SIMD_DECLARE(void, mita_add, (float *acc /* (n) */, const float *x /* (n) */, int n));
/* x[i] *= a. */
MS_SIMD_DECLARE(void, mita_scale_row, (float *x /* (n) */, int n, float a));

static inline float mita_max(const float *x, int n) { return MS_SIMD_CALL(mita_max, x, n); }
static inline int mita_first_above(const float *x, int n, float thr)
{
    return MS_SIMD_CALL(mita_first_above, x, n, thr);
}
static inline int mita_collect_at_least(float *val, int32_t *pos, const float *x, int n, float t)
{
    return MS_SIMD_CALL(mita_collect_at_least, val, pos, x, n, t);
}
static inline void mita_add(float *acc, const float *x, int n)
{
    MS_SIMD_CALL(mita_add, acc, x, n);
}
static inline void mita_scale_row(float *x, int n, float a)
{
    MS_SIMD_CALL(mita_scale_row, x, n, a);
}

#ifdef __cplusplus
}
#endif
#endif
