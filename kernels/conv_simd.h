/* The convolutions' output passes (bias + activation) and Winograd
 * transforms, built once per CPU path (cpu_path.h). */
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

/* Accumulating: dst[i] += src[i], or at the last term dst[i] = act(dst[i] +
 * src[i] + bias). */
MS_SIMD_DECLARE(void, conv_acc_bias_act_row,
                (float *dst /* (n) */, const float *src /* (n) */, int n, float bias, ms_act act,
                 bool last));

/* dst[2i] = act(t0[i] + bias), dst[2i+1] = act(t1[i] + bias): one output row
 * of the 2x2 transposed conv from its two column phases. */
MS_SIMD_DECLARE(void, conv_bias_act_interleave,
                (float *dst /* (2n) */, const float *t0 /* (n) */, const float *t1 /* (n) */,
                 int n, float bias, ms_act act));

/* Winograd F(4x4, 3x3), one tile row of tw = ceil(wd / 4) tiles: the input
 * transform B^T d B of the six input rows d (wd each; the tiles start one
 * column left of the image, zeros there and past its right edge; t is
 * scratch of 6 (4 tw + 2)) into v[k * kst + x] for the 36 positions k = 6 i
 * + j; and the output transform A^T m A of m[k * kst + x] into four output
 * rows of 4 tw. */
MS_SIMD_DECLARE(void, wino43_input_row,
                (float *v /* (36, kst) */, size_t kst, const float *const d[6] /* 6 x (wd) */,
                 float *t /* (6, 4 tw + 2) */, int wd, int tw));
MS_SIMD_DECLARE(void, wino43_output_row,
                (float *y /* (4, 4 tw) */, const float *m /* (36, kst) */, size_t kst, int tw));
/* The transformed kernels G g G^T of one output channel: u[k * kst + c]. */
MS_SIMD_DECLARE(void, wino43_weights_row,
                (float *u /* (36, kst) */, size_t kst, const float *w /* (ci, 3, 3) */, int ci));

static inline void conv_bias_act_row(float *dst /* (n) */, const float *src /* (n) */, int n,
                                     float bias, ms_act act)
{
    MS_SIMD_CALL(conv_bias_act_row, dst, src, n, bias, act);
}

static inline void conv_acc_bias_act_row(float *dst /* (n) */, const float *src /* (n) */,
                                         int n, float bias, ms_act act, bool last)
{
    MS_SIMD_CALL(conv_acc_bias_act_row, dst, src, n, bias, act, last);
}

static inline void conv_bias_act_interleave(float *dst /* (2n) */, const float *t0 /* (n) */,
                                            const float *t1 /* (n) */, int n, float bias,
                                            ms_act act)
{
    MS_SIMD_CALL(conv_bias_act_interleave, dst, t0, t1, n, bias, act);
}

static inline void wino43_input_row(float *v /* (36, kst) */, size_t kst,
                                    const float *const d[6] /* 6 x (wd) */,
                                    float *t /* (6, 4 tw + 2) */, int wd, int tw)
{
    MS_SIMD_CALL(wino43_input_row, v, kst, d, t, wd, tw);
}

static inline void wino43_output_row(float *y /* (4, 4 tw) */, const float *m /* (36, kst) */,
                                     size_t kst, int tw)
{
    MS_SIMD_CALL(wino43_output_row, y, m, kst, tw);
}

static inline void wino43_weights_row(float *u /* (36, kst) */, size_t kst,
                                      const float *w /* (ci, 3, 3) */, int ci)
{
    MS_SIMD_CALL(wino43_weights_row, u, kst, w, ci);
}

#ifdef __cplusplus
}
#endif
#endif
