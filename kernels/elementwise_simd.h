/* Vectorised row loops of the CPU elementwise ops, linear epilogue and
 * LayerNorm, built once per CPU path (cpu_path.h). GELU's erf comes from
 * glibc's libmvec in both builds (erff's vector variants: within 2 ulp), so
 * the loops vectorise without -ffast-math; the v3 build also contracts
 * multiply-adds to FMA. Results match the scalar loops to float rounding. */
#ifndef MS_ELEMENTWISE_SIMD_H
#define MS_ELEMENTWISE_SIMD_H

#include "cpu_path.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x[i, j] = act(x[i, j] + b[j]) over rows of a (rows, cols) matrix with row
 * stride ld; b may be NULL (activation only). */
MS_SIMD_DECLARE(void, ew_bias_act_cols,
                (float *x /* (rows, ld) */, const float *b /* (cols) or NULL */, int rows,
                 int cols, long ld, ms_act act));
/* out[i] = a[i] + b[i]; out may alias a or b. */
MS_SIMD_DECLARE(void, ew_add, (float *out /* (n) */, const float *a /* (n) */,
                               const float *b /* (n) */, size_t n));
/* out[i] = the first k with the largest in[k * plane + i] over k < c, for
 * n <= EW_ARGMAX_PIXELS pixels (argmax_first per pixel, vectorised across
 * pixels: strict >, so ties and NaNs keep the earlier class). */
#define EW_ARGMAX_PIXELS 256
MS_SIMD_DECLARE(void, ew_argmax_planes, (uint8_t *out /* (n) */, const float *in /* (c, plane) */,
                                         int c, long plane, int n));
/* x[i] *= s. */
MS_SIMD_DECLARE(void, ew_scale, (float *x /* (n) */, size_t n, float s));
/* One LayerNorm row: mean and variance in double (two passes), then
 * layernorm_apply per element. */
MS_SIMD_DECLARE(void, ew_layernorm_row,
                (float *y /* (c) */, const float *x /* (c) */, const float *w /* (c) */,
                 const float *b /* (c) */, int c, float eps));

static inline void ew_bias_act_cols(float *x /* (rows, ld) */, const float *b /* (cols) */,
                                    int rows, int cols, long ld, ms_act act)
{
    MS_SIMD_CALL(ew_bias_act_cols, x, b, rows, cols, ld, act);
}

static inline void ew_add(float *out /* (n) */, const float *a /* (n) */,
                          const float *b /* (n) */, size_t n)
{
    MS_SIMD_CALL(ew_add, out, a, b, n);
}

static inline void ew_argmax_planes(uint8_t *out /* (n) */, const float *in /* (c, plane) */,
                                    int c, long plane, int n)
{
    MS_SIMD_CALL(ew_argmax_planes, out, in, c, plane, n);
}

static inline void ew_scale(float *x /* (n) */, size_t n, float s)
{
    MS_SIMD_CALL(ew_scale, x, n, s);
}

static inline void ew_layernorm_row(float *y /* (c) */, const float *x /* (c) */,
                                    const float *w /* (c) */, const float *b /* (c) */, int c,
                                    float eps)
{
    MS_SIMD_CALL(ew_layernorm_row, y, x, w, b, c, eps);
}

#ifdef __cplusplus
}
#endif
#endif
