/* Built once per CPU path (cpu_path.h): plain C loops the compiler
 * vectorises for the path's instruction set. */
#include "elementwise_simd.h"
#include "layernorm.h"
#include "simd_math.h"

SIMD_256_FN
void MS_SIMD_FN(ew_bias_act_cols)(float *x, const float *b, int rows, int cols, long ld,
                                  ms_act act)
{
    for (int i = 0; i < rows; i++) {
        float *restrict r = x + (size_t)i * ld;
        if (act == MS_ACT_GELU && b) {
#pragma omp simd
            for (int j = 0; j < cols; j++) r[j] = simd_gelu(r[j] + b[j]);
        } else if (act == MS_ACT_GELU) {
#pragma omp simd
            for (int j = 0; j < cols; j++) r[j] = simd_gelu(r[j]);
        } else if (act == MS_ACT_RELU) {
            /* x > 0 ? x : 0, as act_apply: NaN becomes 0 there too */
#pragma omp simd
            for (int j = 0; j < cols; j++) {
                float v = r[j] + (b ? b[j] : 0.0f);
                r[j] = v > 0.0f ? v : 0.0f;
            }
        } else if (b) {
#pragma omp simd
            for (int j = 0; j < cols; j++) r[j] += b[j];
        }
    }
}

void MS_SIMD_FN(ew_add)(float *out, const float *a, const float *b, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void MS_SIMD_FN(ew_argmax_planes)(uint8_t *out, const float *in, int c, long plane, int n)
{
    float best_v[EW_ARGMAX_PIXELS];
    int best_k[EW_ARGMAX_PIXELS];
#pragma omp simd
    for (int i = 0; i < n; i++) {
        best_v[i] = in[i];
        best_k[i] = 0;
    }
    for (int k = 1; k < c; k++) {
        const float *x = in + (size_t)k * plane;
#pragma omp simd
        for (int i = 0; i < n; i++) {
            bool gt = x[i] > best_v[i];
            best_v[i] = gt ? x[i] : best_v[i];
            best_k[i] = gt ? k : best_k[i];
        }
    }
#pragma omp simd
    for (int i = 0; i < n; i++) out[i] = (uint8_t)best_k[i];
}

void MS_SIMD_FN(ew_scale)(float *x, size_t n, float s)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void MS_SIMD_FN(ew_layernorm_row)(float *restrict y, const float *restrict x,
                                  const float *restrict w, const float *restrict b, int c,
                                  float eps)
{
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < c; j++) sum += x[j];
    double mean = sum / c;
    double sq = 0.0;
#pragma omp simd reduction(+ : sq)
    for (int j = 0; j < c; j++) {
        double dlt = x[j] - mean;
        sq += dlt * dlt;
    }
    float rstd = layernorm_rstd((float)(sq / c), eps), m = (float)mean;
#pragma omp simd
    for (int j = 0; j < c; j++) y[j] = layernorm_apply(x[j], m, rstd, w[j], b[j]);
}
