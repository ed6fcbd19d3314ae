/* The vectorised inner loops of the CPU bilinear resize (kernels/resize.c),
 * built once per CPU path (cpu_path.h). The resize is separable: each input
 * row needed is blended horizontally once (rs_hpass) into a row of the output
 * width, and each output row is then a weighted sum of two such rows
 * (rs_vblend). Per element this is the same arithmetic as the one-pass
 * formula wy0*(wx0*a + wx1*b) + wy1*(wx0*c + wx1*d), so the base path gives
 * the same floats; the v3 path contracts to FMA (float rounding). */
#ifndef MS_RESIZE_SIMD_H
#define MS_RESIZE_SIMD_H

#include "cpu_path.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[x] = wx0[x] * row[x0[x]] + wx1[x] * row[x1[x]]. */
MS_SIMD_DECLARE(void, rs_hpass,
                (float *dst /* (wo) */, const float *row /* (w) */, const int *x0 /* (wo) */,
                 const int *x1 /* (wo) */, const float *wx0 /* (wo) */,
                 const float *wx1 /* (wo) */, int wo));
/* dst[x] = wy0 * h0[x] + wy1 * h1[x]. */
MS_SIMD_DECLARE(void, rs_vblend,
                (float *dst /* (wo) */, const float *h0 /* (wo) */, const float *h1 /* (wo) */,
                 float wy0, float wy1, int wo));

static inline void rs_hpass(float *dst /* (wo) */, const float *row /* (w) */,
                            const int *x0 /* (wo) */, const int *x1 /* (wo) */,
                            const float *wx0 /* (wo) */, const float *wx1 /* (wo) */, int wo)
{
    MS_SIMD_CALL(rs_hpass, dst, row, x0, x1, wx0, wx1, wo);
}

static inline void rs_vblend(float *dst /* (wo) */, const float *h0 /* (wo) */,
                             const float *h1 /* (wo) */, float wy0, float wy1, int wo)
{
    MS_SIMD_CALL(rs_vblend, dst, h0, h1, wy0, wy1, wo);
}

#ifdef __cplusplus
}
#endif
#endif
