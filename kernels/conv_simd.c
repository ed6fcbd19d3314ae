/* Built once per CPU path (cpu_path.h): the convolutions' output passes as
 * plain loops the compiler vectorises (GELU on libmvec's erff, as the linear
 * layers' epilogue, elementwise_simd.c). */
#include "conv_simd.h"
#include "simd_math.h"

void MS_SIMD_FN(conv_bias_act_row)(float *dst /* (n) */, const float *src /* (n) */, int n,
                                   float bias, ms_act act)
{
    if (act == MS_ACT_RELU) {
#pragma omp simd
        for (int i = 0; i < n; i++) {
            float v = src[i] + bias;
            dst[i] = v > 0.0f ? v : 0.0f;
        }
    } else if (act == MS_ACT_NONE) {
#pragma omp simd
        for (int i = 0; i < n; i++) dst[i] = src[i] + bias;
    } else {
#pragma omp simd
        for (int i = 0; i < n; i++) dst[i] = simd_gelu(src[i] + bias);
    }
}

void MS_SIMD_FN(conv_bias_act_interleave)(float *dst /* (2n) */, const float *t0 /* (n) */,
                                          const float *t1 /* (n) */, int n, float bias,
                                          ms_act act)
{
    if (act == MS_ACT_RELU) {
#pragma omp simd
        for (int i = 0; i < n; i++) {
            float a = t0[i] + bias, b = t1[i] + bias;
            dst[2 * i] = a > 0.0f ? a : 0.0f;
            dst[2 * i + 1] = b > 0.0f ? b : 0.0f;
        }
    } else if (act == MS_ACT_NONE) {
#pragma omp simd
        for (int i = 0; i < n; i++) {
            dst[2 * i] = t0[i] + bias;
            dst[2 * i + 1] = t1[i] + bias;
        }
    } else {
#pragma omp simd
        for (int i = 0; i < n; i++) {
            dst[2 * i] = simd_gelu(t0[i] + bias);
            dst[2 * i + 1] = simd_gelu(t1[i] + bias);
        }
    }
}
