/* Bilinear and bicubic resizes with F.interpolate(align_corners=False)
 * semantics. The coordinate arithmetic is float, as PyTorch's CPU kernels. */
#ifndef MS_RESIZE_H
#define MS_RESIZE_H

#include <math.h>

#include "ops.h"

/* Source-per-destination step (PyTorch area_pixel_compute_scale): in/out
 * when resizing to a size, 1/scale when a scale factor was given. */
MS_HD float resize_ratio(int in, int out, double scale)
{
    return scale > 0.0 ? (float)(1.0 / scale) : (float)in / (float)out;
}

/* Half-pixel source coordinate of destination index dst (not clamped). */
MS_HD float resize_src(int dst, float ratio) { return ratio * ((float)dst + 0.5f) - 0.5f; }

/* Bilinear taps of destination index dst: out = w0*in[i0] + w1*in[i1].
 * The source coordinate is clamped at 0 below; i1 = min(i0+1, in-1). */
MS_HD void bilinear_taps(int *i0, int *i1, float *w0, float *w1, int dst, float ratio, int in)
{
    float src = resize_src(dst, ratio);
    if (src < 0.0f) src = 0.0f;
    int lo = (int)src; /* floor: src >= 0 */
    if (lo > in - 1) lo = in - 1;
    float t = src - (float)lo;
    if (t > 1.0f) t = 1.0f;
    *i0 = lo;
    *i1 = lo < in - 1 ? lo + 1 : lo;
    *w0 = 1.0f - t;
    *w1 = t;
}

/* Keys cubic convolution with A = -0.75 (PyTorch upsample_bicubic2d). */
#define MS_BICUBIC_A (-0.75f)

MS_HD float cubic_near(float x) /* |x| <= 1 */
{
    const float a = MS_BICUBIC_A;
    return ((a + 2.0f) * x - (a + 3.0f)) * x * x + 1.0f;
}

MS_HD float cubic_far(float x) /* 1 < |x| < 2 */
{
    const float a = MS_BICUBIC_A;
    return ((a * x - 5.0f * a) * x + 8.0f * a) * x - 4.0f * a;
}

/* Bicubic taps of destination index dst: 4 source indices floor-1..floor+2,
 * clamped to [0, in-1], and their weights. The source coordinate is not
 * clamped (unlike bilinear), so t is the fraction past floor(src). */
MS_HD void bicubic_taps(int idx[4], float wgt[4], int dst, float ratio, int in)
{
    float src = resize_src(dst, ratio);
    int fl = (int)floorf(src);
    if (fl > in - 1) fl = in - 1;
    float t = src - (float)fl;
    t = t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t);
    wgt[0] = cubic_far(t + 1.0f);
    wgt[1] = cubic_near(t);
    wgt[2] = cubic_near(1.0f - t);
    wgt[3] = cubic_far(2.0f - t);
    for (int j = 0; j < 4; j++) {
        int i = fl - 1 + j;
        idx[j] = i < 0 ? 0 : (i > in - 1 ? in - 1 : i);
    }
}

#ifdef __cplusplus
extern "C" {
#endif

/* Output rows y_begin .. y_end-1 of a (c, ho, wo) resize into out. */
void resize_bilinear_cpu(float *out /* (c, y_end - y_begin, wo) */, const float *in /* (c, h, w) */,
                         int c, int h, int w, int ho, int wo, int y_begin, int y_end,
                         double scale_h, double scale_w);
void resize_bicubic_cpu(float *out /* (c, ho, wo) */, const float *in /* (c, h, w) */, int c,
                        int h, int w, int ho, int wo);

#ifdef MS_HAVE_CUDA
ms_status resize_bilinear_cuda(ms_backend *be, float *out /* (c, y_end - y_begin, wo) */,
                               const float *in /* (c, h, w) */, int c, int h, int w, int ho,
                               int wo, int y_begin, int y_end, double scale_h, double scale_w);
ms_status resize_bicubic_cuda(ms_backend *be, float *out /* (c, ho, wo) */,
                              const float *in /* (c, h, w) */, int c, int h, int w, int ho,
                              int wo);
#endif

#ifdef __cplusplus
}
#endif
#endif
