/* The convolutions' output passes (bias + activation), built once per CPU
 * path (cpu_path.h). */
#ifndef MS_CONV_SIMD_H
#define MS_CONV_SIMD_H

#include "cpu_path.h"
#include "ops.h" /* ms_act */

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = act(src[i] + bias); dst may be src (in place). */
MS_SIMD_DECLARE(void, conv_bias_act_row,
                (float *dst /* (n) */, const float *src /* (n) */, int n, float bias, ms_act act));

/* dst[2i] = act(t0[i] + bias), dst[2i+1] = act(t1[i] + bias): one output row
 * of the 2x2 transposed conv from its two column phases. */
MS_SIMD_DECLARE(void, conv_bias_act_interleave,
                (float *dst /* (2n) */, const float *t0 /* (n) */, const float *t1 /* (n) */,
                 int n, float bias, ms_act act));

static inline void conv_bias_act_row(float *dst /* (n) */, const float *src /* (n) */, int n,
                                     float bias, ms_act act)
{
    MS_SIMD_CALL(conv_bias_act_row, dst, src, n, bias, act);
}

static inline void conv_bias_act_interleave(float *dst /* (2n) */, const float *t0 /* (n) */,
                                            const float *t1 /* (n) */, int n, float bias,
                                            ms_act act)
{
    MS_SIMD_CALL(conv_bias_act_interleave, dst, t0, t1, n, bias, act);
}

#ifdef __cplusplus
}
#endif
#endif
