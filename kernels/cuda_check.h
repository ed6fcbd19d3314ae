/* CUDA backend internals shared by the kernels/ CUDA files (CUDA C++ only):
 * the context layout, error-check macros that report the call, file and
 * line through ms_error, and launch helpers. */
#ifndef MS_CUDA_CHECK_H
#define MS_CUDA_CHECK_H

#ifdef MS_CUDA_EMU
/* The tests' CUDA execution layer: these kernels compiled as host C++ and run
 * on the CPU (tests/cuda_emu/cuda_emu.h defines MS_LAUNCH, MS_SHARED_DYN). */
#include "cuda_emu.h"
#else
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

/* kernel<<<grid, block, smem, stream>>>(args), written
 * MS_LAUNCH(kernel, grid, block, smem, stream)(args) so that the tests'
 * execution layer can run the same launch on the CPU. */
#define MS_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
/* The launch's dynamic shared memory as a T array. */
#define MS_SHARED_DYN(type, name) extern __shared__ type name[]
#endif

#include "cuda_ctx.h"

struct lt_cache;     /* linear.cu */
struct bf16_weights; /* linear.cu */

struct ms_cuda_ctx {
    int device;
    int cc_major, cc_minor;
    int sm_count;
    size_t smem_optin;        /* max dynamic shared memory per block (opt-in) */
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    cudnnHandle_t dnn;
    void *workspace;          /* cuBLASLt and cuDNN workspace, used on the one stream */
    size_t workspace_bytes;
    char name[320];
    struct lt_cache *lt_cache; /* cuBLASLt plans by shape, linear.cu */
    struct bf16_weights *bf16_w; /* BF16 copies of linear weights, linear.cu */
};

/* Frees linear.cu's cuBLASLt plan cache (cuda_ctx_free). */
void linear_cuda_cache_free(ms_cuda_ctx *cu);
/* Frees linear.cu's BF16 weight copies (cuda_ctx_free,
 * cuda_ctx_forget_weights); the caller has synchronised the stream. */
void linear_cuda_weights_free(ms_cuda_ctx *cu);

/* Device memory exhaustion is an OOM, everything else a CUDA error. */
static inline ms_status ms_cuda_status(cudaError_t e)
{
    return e == cudaErrorMemoryAllocation ? MS_ERR_OOM : MS_ERR_CUDA;
}

#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        cudaError_t ms_ce_ = (call);                                                      \
        if (ms_ce_ != cudaSuccess) {                                                      \
            (void)cudaGetLastError(); /* clear a non-sticky error */                      \
            return ms_error(ms_cuda_status(ms_ce_), "%s failed: %s (%s) at %s:%d", #call, \
                            cudaGetErrorName(ms_ce_), cudaGetErrorString(ms_ce_),         \
                            __FILE__, __LINE__);                                          \
        }                                                                                 \
    } while (0)

#define CUBLAS_CHECK(call)                                                             \
    do {                                                                               \
        cublasStatus_t ms_bs_ = (call);                                                \
        if (ms_bs_ != CUBLAS_STATUS_SUCCESS)                                           \
            return ms_error(ms_bs_ == CUBLAS_STATUS_ALLOC_FAILED ? MS_ERR_OOM           \
                                                                 : MS_ERR_CUDA,        \
                            "%s failed: %s at %s:%d", #call, cublasGetStatusString(ms_bs_), \
                            __FILE__, __LINE__);                                       \
    } while (0)

/* cuDNN 9 reports allocation failures as internal errors with a reason
 * (CUDNN_STATUS_ALLOC_FAILED is the deprecated alias of the host one). */
static inline ms_status ms_cudnn_status(cudnnStatus_t s)
{
#if CUDNN_MAJOR >= 9
    return s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                   s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
               ? MS_ERR_OOM
               : MS_ERR_CUDA;
#else
    return s == CUDNN_STATUS_ALLOC_FAILED ? MS_ERR_OOM : MS_ERR_CUDA;
#endif
}

#define CUDNN_CHECK(call)                                                              \
    do {                                                                               \
        cudnnStatus_t ms_ds_ = (call);                                                 \
        if (ms_ds_ != CUDNN_STATUS_SUCCESS)                                            \
            return ms_error(ms_cudnn_status(ms_ds_), "%s failed: %s at %s:%d", #call,   \
                            cudnnGetErrorString(ms_ds_), __FILE__, __LINE__);          \
    } while (0)

/* After a kernel launch: catches bad launch configurations at once (an
 * asynchronous fault shows up at the next cuda_sync). No synchronisation. */
#define CUDA_CHECK_LAUNCH(name)                                                           \
    do {                                                                                  \
        cudaError_t ms_le_ = cudaGetLastError();                                          \
        if (ms_le_ != cudaSuccess)                                                        \
            return ms_error(MS_ERR_CUDA, "kernel %s launch failed: %s (%s) at %s:%d", name, \
                            cudaGetErrorName(ms_le_), cudaGetErrorString(ms_le_),         \
                            __FILE__, __LINE__);                                          \
    } while (0)

static inline ms_cuda_ctx *cuda_ctx_of(const ms_backend *be)
{
    return (ms_cuda_ctx *)be->cuda;
}

/* Blocks for n items at `threads` per block, capped so the grid stays legal;
 * kernels use grid-stride loops. */
/* Byte counts rounded up to the arenas' 256-byte alignment. */
static inline size_t cuda_align256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

static inline unsigned cuda_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535u * 32u) b = 65535u * 32u;
    return (unsigned)b;
}

/* Block-wide sum / max (blockDim a multiple of 32, <= 1024); every thread
 * gets the result. s_red: 33 floats of shared memory. */
__device__ inline float block_reduce_sum(float v, float *s_red)
{
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, off);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads(); /* s_red may still be read from a previous call */
    if (lane == 0) s_red[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < nw; w++) t += s_red[w];
        s_red[32] = t;
    }
    __syncthreads();
    return s_red[32];
}

__device__ inline float block_reduce_max(float v, float *s_red)
{
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_down_sync(0xFFFFFFFFu, v, off));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) s_red[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = s_red[0];
        for (int w = 1; w < nw; w++) t = fmaxf(t, s_red[w]);
        s_red[32] = t;
    }
    __syncthreads();
    return s_red[32];
}

/* Grid-stride loop over [0, n). */
#define CUDA_FOR(i, n)                                                              \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)(n); \
         i += (long long)gridDim.x * blockDim.x)

/* Column-major strided-batched GEMM on the context's stream: FP32 (fp32) or
 * BF16 tensor cores with FP32 accumulation. Defined in linear.cu. */
ms_status cuda_gemm_batched(ms_cuda_ctx *cu, bool fp32, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, float alpha, const float *a, int lda,
                            long long sa, const float *b, int ldb, long long sb, float beta,
                            float *c, int ldc, long long sc, int batch);

#endif
