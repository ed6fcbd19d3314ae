/* Pooling on the GPU: one thread per output element (image_cuda_math.h). */
#include "cuda_check.h"
#include "image_cuda_math.h"
#include "pool.h"

#define POOL_THREADS 256

__global__ void adaptive_avgpool_kernel(float *out, const float *in, int h, int w, int gh, int gw,
                                        long long total)
{
    CUDA_FOR(t, total)
    {
        int j = (int)(t % gw);
        long long r = t / gw;
        int i = (int)(r % gh), ch = (int)(r / gh);
        out[t] = adaptive_pool_pixel(in + (size_t)ch * h * w, h, w, gh, gw, i, j);
    }
}

extern "C" ms_status adaptive_avgpool_cuda(ms_backend *be, float *out, const float *in, int c,
                                           int h, int w, int gh, int gw)
{
    long long total = (long long)c * gh * gw;
    if (total <= 0) return MS_OK;
    MS_LAUNCH(adaptive_avgpool_kernel, cuda_blocks((size_t)total, POOL_THREADS), POOL_THREADS, 0,
              cuda_ctx_of(be)->stream)(out, in, h, w, gh, gw, total);
    CUDA_CHECK_LAUNCH("adaptive_avgpool_kernel");
    return MS_OK;
}

__global__ void maxpool2x2_kernel(float *out, const float *in, int h, int w, long long total)
{
    int ho = h / 2, wo = w / 2;
    CUDA_FOR(t, total)
    {
        int x = (int)(t % wo);
        long long r = t / wo;
        int y = (int)(r % ho), ch = (int)(r / ho);
        out[t] = maxpool2x2_pixel(in + (size_t)ch * h * w, w, y, x);
    }
}

extern "C" ms_status maxpool2x2_cuda(ms_backend *be, float *out, const float *in, int c, int h,
                                     int w)
{
    long long total = (long long)c * (h / 2) * (w / 2);
    if (total <= 0) return MS_OK;
    MS_LAUNCH(maxpool2x2_kernel, cuda_blocks((size_t)total, POOL_THREADS), POOL_THREADS, 0,
              cuda_ctx_of(be)->stream)(out, in, h, w, total);
    CUDA_CHECK_LAUNCH("maxpool2x2_kernel");
    return MS_OK;
}
