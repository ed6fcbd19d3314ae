/* Pooling on the CPU. */
#include "pool.h"

void adaptive_avgpool_cpu(float *out, const float *in, int c, int h, int w, int gh, int gw)
{
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)c * h * w >= MS_PAR_MIN)
    for (int ch = 0; ch < c; ch++) {
        for (int i = 0; i < gh; i++) {
            const float *plane = in + (size_t)ch * h * w;
            int y0 = adaptive_pool_start(i, h, gh), y1 = adaptive_pool_end(i, h, gh);
            for (int j = 0; j < gw; j++) {
                int x0 = adaptive_pool_start(j, w, gw), x1 = adaptive_pool_end(j, w, gw);
                float sum = 0.0f;
                for (int y = y0; y < y1; y++)
                    for (int x = x0; x < x1; x++) sum += plane[(size_t)y * w + x];
                out[((size_t)ch * gh + i) * gw + j] = sum / (float)((y1 - y0) * (x1 - x0));
            }
        }
    }
}

void maxpool2x2_cpu(float *out, const float *in, int c, int h, int w)
{
    int ho = h / 2, wo = w / 2;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)c * h * w >= MS_PAR_MIN)
    for (int ch = 0; ch < c; ch++) {
        for (int y = 0; y < ho; y++) {
            const float *r0 = in + ((size_t)ch * h + 2 * y) * w;
            const float *r1 = r0 + w;
            float *o = out + ((size_t)ch * ho + y) * wo;
            for (int x = 0; x < wo; x++) {
                float a = r0[2 * x] > r0[2 * x + 1] ? r0[2 * x] : r0[2 * x + 1];
                float b = r1[2 * x] > r1[2 * x + 1] ? r1[2 * x] : r1[2 * x + 1];
                o[x] = a > b ? a : b;
            }
        }
    }
}
