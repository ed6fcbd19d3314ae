/* LayerNorm on the CPU. */
#include "layernorm.h"

void layernorm_cpu(float *out, const float *in, const float *w, const float *b, int n, int c,
                   float eps)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *x = in + (size_t)i * c;
        float *y = out + (size_t)i * c;
        double sum = 0.0;
        for (int j = 0; j < c; j++) sum += x[j];
        double mean = sum / c;
        double sq = 0.0;
        for (int j = 0; j < c; j++) {
            double dlt = x[j] - mean;
            sq += dlt * dlt;
        }
        float rstd = layernorm_rstd((float)(sq / c), eps);
        for (int j = 0; j < c; j++) y[j] = layernorm_apply(x[j], (float)mean, rstd, w[j], b[j]);
    }
}
