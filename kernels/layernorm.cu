/* LayerNorm on the GPU: one warp per token row, two passes over the row
 * (mean, then the biased variance of x - mean: no cancellation when the
 * residual stream has a large mean), then layernorm_apply. */
#include "cuda_check.h"
#include "layernorm.h"

#define LN_THREADS 256

__global__ void layernorm_kernel(float *out, const float *in, const float *w, const float *b,
                                 int n, int c, float eps)
{
    int row = blockIdx.x * (LN_THREADS / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n) return; /* whole warps exit together */
    const float *x = in + (size_t)row * c;
    float *y = out + (size_t)row * c;
    float sum = 0.0f;
    for (int j = lane; j < c; j += 32) sum += x[j];
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, off);
    float mean = sum / (float)c;
    float sq = 0.0f;
    for (int j = lane; j < c; j += 32) {
        float dl = x[j] - mean;
        sq += dl * dl;
    }
    for (int off = 16; off > 0; off >>= 1) sq += __shfl_xor_sync(0xFFFFFFFFu, sq, off);
    float rstd = layernorm_rstd(sq / (float)c, eps);
    for (int j = lane; j < c; j += 32) y[j] = layernorm_apply(x[j], mean, rstd, w[j], b[j]);
}

extern "C" ms_status layernorm_cuda(ms_backend *be, float *out, const float *in, const float *w,
                                    const float *b, int n, int c, float eps)
{
    if (n <= 0 || c <= 0) return MS_OK;
    unsigned rows_per_block = LN_THREADS / 32;
    MS_LAUNCH(layernorm_kernel, (unsigned)((n + rows_per_block - 1) / rows_per_block), LN_THREADS,
              0, cuda_ctx_of(be)->stream)(out, in, w, b, n, c, eps);
    CUDA_CHECK_LAUNCH("layernorm_kernel");
    return MS_OK;
}
