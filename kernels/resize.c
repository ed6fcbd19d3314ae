/* Resizes on the CPU: taps per output row and column, then a weighted sum. */
#include "resize.h"

void resize_bilinear_cpu(float *out, const float *in, int c, int h, int w, int ho, int wo,
                         int y_begin, int y_end, double scale_h, double scale_w)
{
    float rh = resize_ratio(h, ho, scale_h), rw = resize_ratio(w, wo, scale_w);
    const int rows = y_end - y_begin;
#pragma omp parallel for collapse(2) schedule(static)
    for (int ch = 0; ch < c; ch++) {
        for (int r = 0; r < rows; r++) {
            int y = y_begin + r, y0, y1;
            float wy0, wy1;
            bilinear_taps(&y0, &y1, &wy0, &wy1, y, rh, h);
            const float *r0 = in + ((size_t)ch * h + y0) * w;
            const float *r1 = in + ((size_t)ch * h + y1) * w;
            float *o = out + ((size_t)ch * rows + r) * wo;
            for (int x = 0; x < wo; x++) {
                int x0, x1;
                float wx0, wx1;
                bilinear_taps(&x0, &x1, &wx0, &wx1, x, rw, w);
                o[x] = wy0 * (wx0 * r0[x0] + wx1 * r0[x1]) + wy1 * (wx0 * r1[x0] + wx1 * r1[x1]);
            }
        }
    }
}

void resize_bicubic_cpu(float *out, const float *in, int c, int h, int w, int ho, int wo)
{
    float rh = resize_ratio(h, ho, 0.0), rw = resize_ratio(w, wo, 0.0);
#pragma omp parallel for collapse(2) schedule(static)
    for (int ch = 0; ch < c; ch++) {
        for (int y = 0; y < ho; y++) {
            int iy[4], ix[4];
            float wy[4], wx[4];
            bicubic_taps(iy, wy, y, rh, h);
            const float *plane = in + (size_t)ch * h * w;
            float *o = out + ((size_t)ch * ho + y) * wo;
            for (int x = 0; x < wo; x++) {
                bicubic_taps(ix, wx, x, rw, w);
                float acc = 0.0f;
                for (int i = 0; i < 4; i++) {
                    const float *r = plane + (size_t)iy[i] * w;
                    acc += wy[i] * (wx[0] * r[ix[0]] + wx[1] * r[ix[1]] + wx[2] * r[ix[2]] +
                                    wx[3] * r[ix[3]]);
                }
                o[x] = acc;
            }
        }
    }
}
