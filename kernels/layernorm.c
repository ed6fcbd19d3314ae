/* LayerNorm on the CPU, a row per token (elementwise_simd.c vectorises it). */
#include "layernorm.h"

#include "elementwise_simd.h"

void layernorm_cpu(float *out, const float *in, const float *w, const float *b, int n, int c,
                   float eps)
{
#pragma omp parallel for schedule(static) if ((size_t)n * c >= MS_PAR_MIN)
    for (int i = 0; i < n; i++)
        ew_layernorm_row(out + (size_t)i * c, in + (size_t)i * c, w, b, c, eps);
}
