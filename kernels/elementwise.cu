/* Memory-bound ops on the GPU: add, transpose, softmax_rows, crop, argmax,
 * normalize_pad. Grid-stride element kernels; per-element arithmetic from
 * the MS_HD helpers (elementwise.h, image_cuda_math.h). */
#include "cuda_check.h"
#include "elementwise.h"
#include "image_cuda_math.h"

#define EW_THREADS 256

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n)
{
    CUDA_FOR(i, n) out[i] = a[i] + b[i];
}

extern "C" ms_status add_cuda(ms_backend *be, float *out, const float *a, const float *b,
                              size_t n)
{
    if (n == 0) return MS_OK;
    MS_LAUNCH(add_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, cuda_ctx_of(be)->stream)(out,
        a, b, n);
    CUDA_CHECK_LAUNCH("add_kernel");
    return MS_OK;
}

__global__ void window_add_kernel(float *acc, const float *win, int c, int h, int w, int wh,
                                  int ww, int y0, int x0, bool first)
{
    size_t n = first ? (size_t)c * h * w : (size_t)c * wh * ww;
    CUDA_FOR(i, n) {
        if (first) { /* every acc element: the window's value inside it, else 0 */
            int x = (int)(i % w), y = (int)(i / w % h), ch = (int)(i / ((size_t)w * h));
            bool in = y >= y0 && y < y0 + wh && x >= x0 && x < x0 + ww;
            acc[i] = in ? win[((size_t)ch * wh + y - y0) * ww + x - x0] : 0.0f;
        } else {
            int x = (int)(i % ww), y = (int)(i / ww % wh), ch = (int)(i / ((size_t)ww * wh));
            acc[((size_t)ch * h + y0 + y) * w + x0 + x] += win[i];
        }
    }
}

extern "C" ms_status window_add_cuda(ms_backend *be, float *acc, const float *win, int c, int h,
                                     int w, int wh, int ww, int y0, int x0, bool first)
{
    size_t n = first ? (size_t)c * h * w : (size_t)c * wh * ww;
    MS_LAUNCH(window_add_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0, cuda_ctx_of(be)->stream)(
        acc, win, c, h, w, wh, ww, y0, x0, first);
    CUDA_CHECK_LAUNCH("window_add_kernel");
    return MS_OK;
}

__global__ void window_average_kernel(float *acc, int c, int h, int w, int wh, int ww, int sh,
                                      int sw)
{
    CUDA_FOR(i, (size_t)c * h * w) {
        int x = (int)(i % w), y = (int)(i / w % h);
        acc[i] /= (float)(slide_count(y, h, wh, sh) * slide_count(x, w, ww, sw));
    }
}

extern "C" ms_status window_average_cuda(ms_backend *be, float *acc, int c, int h, int w, int wh,
                                         int ww, int sh, int sw)
{
    size_t n = (size_t)c * h * w;
    MS_LAUNCH(window_average_kernel, cuda_blocks(n, EW_THREADS), EW_THREADS, 0,
              cuda_ctx_of(be)->stream)(acc, c, h, w, wh, ww, sh, sw);
    CUDA_CHECK_LAUNCH("window_average_kernel");
    return MS_OK;
}

/* 32x32 tiles through shared memory (one column of padding against bank
 * conflicts), so both the reads and the writes are coalesced. */
__global__ void transpose_kernel(float *out, const float *in, int rows, int cols)
{
    __shared__ float tile[32][33];
    int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        int r = r0 + j, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[j][threadIdx.x] = in[(size_t)r * cols + c];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += blockDim.y) {
        int c = c0 + j, r = r0 + threadIdx.x;
        if (r < rows && c < cols) out[(size_t)c * rows + r] = tile[threadIdx.x][j];
    }
}

extern "C" ms_status transpose_cuda(ms_backend *be, float *out, const float *in, int rows,
                                    int cols)
{
    if (rows <= 0 || cols <= 0) return MS_OK;
    if ((rows + 31) / 32 > 65535)
        return ms_error(MS_ERR_UNSUPPORTED, "transpose_cuda: %d rows", rows);
    dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + 31) / 32)), block(32, 8);
    MS_LAUNCH(transpose_kernel, grid, block, 0, cuda_ctx_of(be)->stream)(out, in, rows, cols);
    CUDA_CHECK_LAUNCH("transpose_kernel");
    return MS_OK;
}

/* One block per row: max, sum of exp, scale (as softmax_rows_cpu). */
__global__ void softmax_rows_kernel(float *x, int cols)
{
    __shared__ float s_red[33];
    float *row = x + (size_t)blockIdx.x * cols;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) mx = fmaxf(mx, row[j]);
    mx = block_reduce_max(mx, s_red);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float e = expf(row[j] - mx);
        row[j] = e;
        sum += e;
    }
    float inv = 1.0f / block_reduce_sum(sum, s_red);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) row[j] *= inv;
}

extern "C" ms_status softmax_rows_cuda(ms_backend *be, float *x, int rows, int cols)
{
    if (rows <= 0 || cols <= 0) return MS_OK;
    unsigned threads = cols >= 1024 ? 512 : (cols >= 256 ? 256 : 64);
    MS_LAUNCH(softmax_rows_kernel, (unsigned)rows, threads, 0, cuda_ctx_of(be)->stream)(x, cols);
    CUDA_CHECK_LAUNCH("softmax_rows_kernel");
    return MS_OK;
}

__global__ void crop_kernel(float *out, const float *in, int h, int w, int ho, int wo, long long total)
{
    CUDA_FOR(t, total)
    {
        int x = (int)(t % wo);
        long long r = t / wo;
        int y = (int)(r % ho), ch = (int)(r / ho);
        out[t] = in[((size_t)ch * h + y) * w + x];
    }
}

extern "C" ms_status crop_cuda(ms_backend *be, float *out, const float *in, int c, int h, int w,
                               int ho, int wo)
{
    long long total = (long long)c * ho * wo;
    if (total <= 0) return MS_OK;
    if (ho > h || wo > w)
        return ms_error(MS_ERR_ARG, "crop_cuda: %dx%d window out of %dx%d", ho, wo, h, w);
    MS_LAUNCH(crop_kernel, cuda_blocks((size_t)total, EW_THREADS), EW_THREADS, 0,
              cuda_ctx_of(be)->stream)(out, in, h, w, ho, wo, total);
    CUDA_CHECK_LAUNCH("crop_kernel");
    return MS_OK;
}

/* One thread per pixel; consecutive threads read consecutive pixels of each
 * class plane. */
__global__ void argmax_kernel(uint8_t *out, const float *in, int c, long long plane)
{
    CUDA_FOR(i, plane) out[i] = (uint8_t)argmax_first(in + i, c, (long)plane);
}

extern "C" ms_status argmax_cuda(ms_backend *be, uint8_t *out, const float *in, int c, int h,
                                 int w)
{
    long long plane = (long long)h * w;
    if (plane <= 0 || c <= 0) return MS_OK;
    if (c > 256) return ms_error(MS_ERR_ARG, "argmax_cuda: %d classes do not fit a byte", c);
    MS_LAUNCH(argmax_kernel, cuda_blocks((size_t)plane, EW_THREADS), EW_THREADS, 0,
              cuda_ctx_of(be)->stream)(out, in, c, plane);
    CUDA_CHECK_LAUNCH("argmax_kernel");
    return MS_OK;
}

/* mean/stdv are passed by value: they are host arrays (the config). */
struct norm3 {
    float mean[3], stdv[3];
};

__global__ void normalize_pad_kernel(float *out, const float *in, int h, int w, int hp, int wp,
                                     norm3 nm)
{
    long long total = 3LL * hp * wp;
    CUDA_FOR(t, total)
    {
        int x = (int)(t % wp);
        long long r = t / wp;
        int y = (int)(r % hp), ch = (int)(r / hp);
        out[t] = normalize_pad_pixel(in, h, w, ch, y, x, nm.mean[ch], nm.stdv[ch]);
    }
}

extern "C" ms_status normalize_pad_cuda(ms_backend *be, float *out, const float *in, int h, int w,
                                        int hp, int wp, const float mean[3], const float stdv[3])
{
    long long total = 3LL * hp * wp;
    if (total <= 0) return MS_OK;
    norm3 nm;
    for (int i = 0; i < 3; i++) {
        nm.mean[i] = mean[i];
        nm.stdv[i] = stdv[i];
    }
    MS_LAUNCH(normalize_pad_kernel, cuda_blocks((size_t)total, EW_THREADS), EW_THREADS, 0,
              cuda_ctx_of(be)->stream)(out, in, h, w, hp, wp, nm);
    CUDA_CHECK_LAUNCH("normalize_pad_kernel");
    return MS_OK;
}
