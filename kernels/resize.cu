/* Resizes on the GPU: one thread per output element; taps and weights from
 * resize.h through image_cuda_math.h, as the CPU op. */
#include "cuda_check.h"
#include "image_cuda_math.h"
#include "resize.h"

#define RS_THREADS 256

/* out holds output rows y_begin .. y_begin+rows-1 of each channel. */
template <bool CUBIC>
__global__ void resize_kernel(float *out, const float *in, int h, int w, int y_begin, int rows,
                              int wo, float rh, float rw, long long total)
{
    CUDA_FOR(t, total)
    {
        int x = (int)(t % wo);
        long long r = t / wo;
        int y = y_begin + (int)(r % rows), ch = (int)(r / rows);
        const float *plane = in + (size_t)ch * h * w;
        out[t] = CUBIC ? bicubic_pixel(plane, h, w, rh, rw, y, x)
                       : bilinear_pixel(plane, h, w, rh, rw, y, x);
    }
}

template <bool CUBIC>
static ms_status resize_launch(ms_backend *be, float *out, const float *in, int c, int h, int w,
                               int y_begin, int y_end, int wo, float rh, float rw)
{
    int rows = y_end - y_begin;
    long long total = (long long)c * rows * wo;
    if (total <= 0) return MS_OK;
    MS_LAUNCH(resize_kernel<CUBIC>, cuda_blocks((size_t)total, RS_THREADS), RS_THREADS, 0,
              cuda_ctx_of(be)->stream)(out, in, h, w, y_begin, rows, wo, rh, rw, total);
    CUDA_CHECK_LAUNCH("resize_kernel");
    return MS_OK;
}

extern "C" ms_status resize_bilinear_cuda(ms_backend *be, float *out, const float *in, int c,
                                          int h, int w, int ho, int wo, int y_begin, int y_end,
                                          double scale_h, double scale_w)
{
    return resize_launch<false>(be, out, in, c, h, w, y_begin, y_end, wo,
                                resize_ratio(h, ho, scale_h), resize_ratio(w, wo, scale_w));
}

extern "C" ms_status resize_bicubic_cuda(ms_backend *be, float *out, const float *in, int c,
                                         int h, int w, int ho, int wo)
{
    return resize_launch<true>(be, out, in, c, h, w, 0, ho, wo, resize_ratio(h, ho, 0.0),
                               resize_ratio(w, wo, 0.0));
}
