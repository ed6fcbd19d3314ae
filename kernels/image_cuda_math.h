/* Per-output-element arithmetic of the image kernels (pool.cu, resize.cu,
 * conv.cu, elementwise.cu), as MS_HD helpers built on the CPU ops' helpers:
 * each CUDA thread calls one of these for its element, and
 * tests/test_kernel_math.c calls the same functions on the CPU for every
 * element and compares with the CPU ops. Plain C11. */
#ifndef MS_IMAGE_CUDA_MATH_H
#define MS_IMAGE_CUDA_MATH_H

#include "elementwise.h"
#include "linear.h" /* act_apply */
#include "pool.h"
#include "resize.h"

/* Adaptive average pool: output (i, j) of one (h, w) plane. */
MS_HD float adaptive_pool_pixel(const float *plane, int h, int w, int gh, int gw, int i, int j)
{
    int y0 = adaptive_pool_start(i, h, gh), y1 = adaptive_pool_end(i, h, gh);
    int x0 = adaptive_pool_start(j, w, gw), x1 = adaptive_pool_end(j, w, gw);
    float sum = 0.0f;
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) sum += plane[(long)y * w + x];
    return sum / (float)((y1 - y0) * (x1 - x0));
}

/* 2x2 max pool: output (y, x) of one plane of width w. */
MS_HD float maxpool2x2_pixel(const float *plane, int w, int y, int x)
{
    const float *r0 = plane + (long)(2 * y) * w, *r1 = r0 + w;
    float a = r0[2 * x] > r0[2 * x + 1] ? r0[2 * x] : r0[2 * x + 1];
    float b = r1[2 * x] > r1[2 * x + 1] ? r1[2 * x] : r1[2 * x + 1];
    return a > b ? a : b;
}

/* Bilinear resize: output (y, x) of one (h, w) plane; rh, rw from
 * resize_ratio. */
MS_HD float bilinear_pixel(const float *plane, int h, int w, float rh, float rw, int y, int x)
{
    int y0, y1, x0, x1;
    float wy0, wy1, wx0, wx1;
    bilinear_taps(&y0, &y1, &wy0, &wy1, y, rh, h);
    bilinear_taps(&x0, &x1, &wx0, &wx1, x, rw, w);
    const float *r0 = plane + (long)y0 * w, *r1 = plane + (long)y1 * w;
    return wy0 * (wx0 * r0[x0] + wx1 * r0[x1]) + wy1 * (wx0 * r1[x0] + wx1 * r1[x1]);
}

/* Bicubic resize: output (y, x) of one (h, w) plane. */
MS_HD float bicubic_pixel(const float *plane, int h, int w, float rh, float rw, int y, int x)
{
    int iy[4], ix[4];
    float wy[4], wx[4];
    bicubic_taps(iy, wy, y, rh, h);
    bicubic_taps(ix, wx, x, rw, w);
    float acc = 0.0f;
    for (int i = 0; i < 4; i++) {
        const float *r = plane + (long)iy[i] * w;
        acc += wy[i] * (wx[0] * r[ix[0]] + wx[1] * r[ix[1]] + wx[2] * r[ix[2]] + wx[3] * r[ix[3]]);
    }
    return acc;
}

/* 2x2 stride-2 transposed conv, after the GEMM g = W^T X ((4 co) x (h w),
 * row (o*4 + dy*2 + dx)): output element t of the (co, 2h, 2w) map. */
MS_HD float convt2x2_pixel(const float *g, const float *b, int h, int w, long t, ms_act act)
{
    int wo = 2 * w;
    long hw = (long)h * w, plane = 4 * hw;
    int o = (int)(t / plane);
    long r = t - (long)o * plane;
    int oy = (int)(r / wo), ox = (int)(r - (long)oy * wo);
    int tap = (oy & 1) * 2 + (ox & 1);
    float v = g[((long)o * 4 + tap) * hw + (long)(oy >> 1) * w + (ox >> 1)];
    return act_apply(v + (b ? b[o] : 0.0f), act);
}

/* normalize_pad: output (ch, y, x) of the (3, hp, wp) map. */
MS_HD float normalize_pad_pixel(const float *in, int h, int w, int ch, int y, int x, float mean,
                                float stdv)
{
    if (y >= h || x >= w) return 0.0f;
    return normalize_value(in[((long)ch * h + y) * w + x], mean, stdv);
}

#endif
