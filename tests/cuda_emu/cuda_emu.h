/* A CUDA execution layer for the tests: the kernels in kernels/ (.cu) compiled
 * as host C++ (g++) and run on the CPU, so that CI without a GPU executes
 * every line of them (tests/test_cuda_emu.cpp). kernels/cuda_check.h
 * includes this instead of the CUDA headers when MS_CUDA_EMU is defined.
 *
 * Execution model (tests/cuda_emu/cuda_emu.cpp):
 * - A launch runs synchronously: the blocks one after another in a random
 *   order (seeded, the seed printed on failure); each block's threads are
 *   fibers (ucontext) on the calling thread.
 * - A fiber runs until it reaches __syncthreads or a warp collective, then
 *   yields; the fibers that may continue are resumed in a random order. So
 *   code between two barriers runs thread after thread in any order, and a
 *   missing barrier shows as a read of another thread's unwritten data.
 * - Shared memory (__shared__ and the dynamic part) is one copy per block,
 *   filled with 0xFF bytes (NaN, -1) before each block.
 * - __syncthreads must be reached by every thread of the block at the same
 *   call site; a warp collective (*_sync) by exactly the lanes named in its
 *   mask, each naming itself, all at one call site with one mask. Anything
 *   else (a lane that exited or waits elsewhere, a deadlock) fails the
 *   launch with a message naming the kernel, block, lanes, site and seed;
 *   cudaGetLastError then reports it (CUDA_CHECK_LAUNCH).
 * - Launch configurations are checked as the device would (block <= 1024
 *   threads, grid limits, dynamic shared memory over 48 KB only after
 *   cudaFuncSetAttribute, up to the device's opt-in limit).
 * - Device memory is host memory. cuBLAS's cublasGemmEx and
 *   cublasGemmStridedBatchedEx are a plain reference GEMM (FP32, or BF16
 *   operands for the FAST_16BF compute type); cuBLASLt offers no
 *   algorithm (linear_cuda takes its cublasGemmEx fallback); cuDNN
 *   convolutions are not emulated (they report "not supported").
 * Not modelled: memory ordering between threads other than through
 * barriers, warp lockstep (no code may rely on it), bank conflicts, timing. */
#ifndef MS_CUDA_EMU_H
#define MS_CUDA_EMU_H

#ifndef __cplusplus
#error "cuda_emu.h is C++"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

/* ---- qualifiers ---- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
/* One copy per block: blocks run one at a time on one thread, so a static
 * is the block's shared memory; the section lets the layer poison all of it
 * before each block. */
#define __shared__ static __attribute__((section("ms_emu_shared"), aligned(16)))
/* extern __shared__ T name[]: the launch's dynamic shared memory. */
#define MS_SHARED_DYN(type, name) type *name = (type *)ms_emu::dyn_shared()
/* kernel<<<grid, block, smem, stream>>>(args) */
#define MS_LAUNCH(kernel, grid, block, smem, stream) \
    ms_emu::launcher(kernel, #kernel, dim3(grid), dim3(block), (size_t)(smem), (stream))

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef dim3 uint3;

/* ---- runtime types (cuda_runtime.h) ---- */
typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorLaunchFailure = 719,
} cudaError_t;
typedef struct ms_emu_stream *cudaStream_t;
typedef struct ms_emu_event *cudaEvent_t;
typedef enum { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 } cudaMemcpyKind;
typedef enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;
#define cudaStreamNonBlocking 0x01
#define CUDART_VERSION 13000
struct cudaDeviceProp {
    char name[256];
    int major, minor, multiProcessorCount;
    size_t sharedMemPerBlockOptin, totalGlobalMem;
};

namespace ms_emu {

/* ---- the layer's state and scheduler (cuda_emu.cpp) ---- */
void *dyn_shared();
void syncthreads(const char *file, int line);
/* A warp collective: waits for the lanes in mask, returns this lane's
 * result. kind: 'b' ballot, 'a' any, 'l' all, 'd' shfl_down, 'x' shfl_xor,
 * 'i' shfl (index), 'u' shfl_up, 's' syncwarp. */
uint64_t warp_op(char kind, unsigned mask, uint64_t value, int param, int width,
                 const char *file, int line);
/* Runs every block of the grid; fn(arg) is one thread. */
void launch(const char *name, const void *key, dim3 grid, dim3 block, size_t smem,
            void (*fn)(void *), void *arg);

struct thread_state; /* one fiber */
extern const dim3 *g_thread_idx;
extern dim3 g_block_idx, g_block_dim, g_grid_dim;

/* Seed of the random block and thread orders: MS_EMU_SEED or the time. */
uint64_t seed();
void set_seed(uint64_t s);
/* The device's opt-in shared memory limit (default 227 KB, as H100/H200). */
void set_smem_optin(size_t bytes);
/* The failure of the last launch (empty: none). */
const char *last_failure();
/* Every launch since clear_launches (tests check which path host code took). */
struct launch_record {
    const char *name;
    dim3 grid, block;
    size_t smem;
};
const std::vector<launch_record> &launches();
void clear_launches();

template <class... P>
struct launcher {
    void (*kernel)(P...);
    const char *name;
    dim3 grid, block;
    size_t smem;
    launcher(void (*k)(P...), const char *nm, dim3 g, dim3 b, size_t s, cudaStream_t)
        : kernel(k), name(nm), grid(g), block(b), smem(s)
    {
    }
    template <class... A>
    void operator()(A &&...args)
    {
        struct call {
            void (*kernel)(P...);
            std::tuple<typename std::decay<P>::type...> args;
        } c{kernel, std::tuple<typename std::decay<P>::type...>(std::forward<A>(args)...)};
        launch(name, (const void *)kernel, grid, block, smem,
               [](void *p) {
                   call *cc = (call *)p;
                   std::apply(cc->kernel, cc->args); /* by value, as a kernel's parameters */
               },
               &c);
    }
};

template <class T>
uint64_t to_bits(T v)
{
    static_assert(sizeof(T) <= 8, "shuffle of a type over 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <class T>
T from_bits(uint64_t u)
{
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}

} // namespace ms_emu

#define threadIdx (*ms_emu::g_thread_idx)
#define blockIdx ((const dim3 &)ms_emu::g_block_idx)
#define blockDim ((const dim3 &)ms_emu::g_block_dim)
#define gridDim ((const dim3 &)ms_emu::g_grid_dim)
#define warpSize 32

/* ---- barriers, warp collectives ---- */
#define __syncthreads() ms_emu::syncthreads(__FILE__, __LINE__)
#define __ballot_sync(mask, pred) \
    ((unsigned)ms_emu::warp_op('b', (mask), (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(mask, pred) \
    ((int)ms_emu::warp_op('a', (mask), (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __all_sync(mask, pred) \
    ((int)ms_emu::warp_op('l', (mask), (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __syncwarp(...)                                                                         \
    ((void)ms_emu::warp_op('s', MS_EMU_SYNCWARP_MASK(__VA_ARGS__ + 0), 0, 0, 32, __FILE__, \
                           __LINE__))
#define MS_EMU_SYNCWARP_MASK(m) ((m) ? (unsigned)(m) : 0xFFFFFFFFu)
#define MS_EMU_SHFL(kind, mask, v, p, w)                                                        \
    ms_emu::from_bits<typename std::decay<decltype(v)>::type>(                                  \
        ms_emu::warp_op(kind, (mask), ms_emu::to_bits(v), (int)(p), (w), __FILE__, __LINE__))
#define MS_EMU_SHFL_W(kind, mask, v, p, w, ...) MS_EMU_SHFL(kind, mask, v, p, w)
#define __shfl_down_sync(mask, ...) MS_EMU_SHFL_W('d', mask, __VA_ARGS__, 32, 0)
#define __shfl_up_sync(mask, ...) MS_EMU_SHFL_W('u', mask, __VA_ARGS__, 32, 0)
#define __shfl_xor_sync(mask, ...) MS_EMU_SHFL_W('x', mask, __VA_ARGS__, 32, 0)
#define __shfl_sync(mask, ...) MS_EMU_SHFL_W('i', mask, __VA_ARGS__, 32, 0)
/* Fibers run one at a time: every access is already ordered. */
static inline void __threadfence_block() {}
static inline void __threadfence() {}

/* ---- atomics (fibers never switch inside one: each is atomic); only what
 * the kernels use, as the intrinsics below ---- */
template <class T>
static inline T atomicAdd(T *p, T v)
{
    T old = *p;
    *p = old + v;
    return old;
}

/* ---- integer and float intrinsics ---- */
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline unsigned __float_as_uint(float x)
{
    return ms_emu::from_bits<unsigned>(ms_emu::to_bits(x));
}
/* __expf, __logf: glibc's (the same functions as expf, logf) */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

/* ---- runtime API (device memory is host memory) ---- */
cudaError_t cudaGetLastError();
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t ms_emu_func_set_attribute(const void *fn, cudaFuncAttribute a, int v);
template <class F>
cudaError_t cudaFuncSetAttribute(F fn, cudaFuncAttribute a, int v)
{
    return ms_emu_func_set_attribute((const void *)fn, a, v);
}

/* ---- cuBLAS: the two GEMMs the kernels call, as a reference GEMM ---- */
typedef struct ms_emu_blas *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_16BF = 75 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
const char *cublasGetStatusString(cublasStatus_t s);
typedef enum { MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2 } libraryPropertyType;
cublasStatus_t cublasGetProperty(libraryPropertyType t, int *v);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *a, cudaDataType_t at,
                            int lda, const void *b, cudaDataType_t bt, int ldb, const void *beta,
                            void *c, cudaDataType_t ct, int ldc, cublasComputeType_t comp,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *a, cudaDataType_t at,
                                          int lda, long long sa, const void *b, cudaDataType_t bt,
                                          int ldb, long long sb, const void *beta, void *c,
                                          cudaDataType_t ct, int ldc, long long sc, int batch,
                                          cublasComputeType_t comp, cublasGemmAlgo_t algo);

/* ---- cuBLASLt: handles and descriptors only; the heuristic finds no
 * algorithm, so linear_cuda uses its cublasGemmEx fallback ---- */
typedef struct ms_emu_lt *cublasLtHandle_t;
typedef struct ms_emu_lt_desc *cublasLtMatmulDesc_t;
typedef struct ms_emu_lt_layout *cublasLtMatrixLayout_t;
typedef struct ms_emu_lt_pref *cublasLtMatmulPreference_t;
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
} cublasLtMatmulHeuristicResult_t;
typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_RELU = 2,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_RELU_BIAS = 6,
} cublasLtEpilogue_t;
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
} cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c,
                                        cudaDataType_t s);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void *v,
                                              size_t n);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t t,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *v, size_t n);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                              cublasLtMatmulPreference_t p, int want,
                                              cublasLtMatmulHeuristicResult_t *res, int *got);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *a, cublasLtMatrixLayout_t al, const void *b,
                              cublasLtMatrixLayout_t bl, const void *beta, const void *c,
                              cublasLtMatrixLayout_t cl, void *dd, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsb,
                              cudaStream_t s);

/* ---- cuDNN: a handle; every convolution call is "not supported" ---- */
#define CUDNN_MAJOR 9
#define CUDNN_VERSION 90000
size_t cudnnGetVersion();
typedef struct ms_emu_dnn *cudnnHandle_t;
typedef struct ms_emu_dnn_desc *cudnnTensorDescriptor_t, *cudnnFilterDescriptor_t,
    *cudnnConvolutionDescriptor_t, *cudnnActivationDescriptor_t;
typedef enum {
    CUDNN_STATUS_SUCCESS = 0,
    CUDNN_STATUS_NOT_SUPPORTED = 3000,
    CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED = 4001,
    CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED = 4002,
} cudnnStatus_t;
#define CUDNN_STATUS_CATEGORY(s) ((cudnnStatus_t)((s) / 1000 * 1000))
typedef enum { CUDNN_TENSOR_NCHW = 0 } cudnnTensorFormat_t;
typedef enum { CUDNN_DATA_FLOAT = 0 } cudnnDataType_t;
typedef enum { CUDNN_CROSS_CORRELATION = 1 } cudnnConvolutionMode_t;
typedef enum {
    CUDNN_DEFAULT_MATH = 0,
    CUDNN_TENSOR_OP_MATH = 1,
    CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,
    CUDNN_FMA_MATH = 3,
} cudnnMathType_t;
typedef enum { CUDNN_ACTIVATION_RELU = 1 } cudnnActivationMode_t;
typedef enum { CUDNN_NOT_PROPAGATE_NAN = 0 } cudnnNanPropagation_t;
typedef enum {
    CUDNN_CONVOLUTION_FWD_ALGO_FFT = 4,
    CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING = 5,
    CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD = 6,
    CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED = 7,
    CUDNN_CONVOLUTION_FWD_ALGO_COUNT = 8,
} cudnnConvolutionFwdAlgo_t;
typedef struct {
    cudnnConvolutionFwdAlgo_t algo;
    cudnnStatus_t status;
    float time;
    size_t memory;
    int determinism;
    cudnnMathType_t mathType;
} cudnnConvolutionFwdAlgoPerf_t;
cudnnStatus_t cudnnCreate(cudnnHandle_t *h);
cudnnStatus_t cudnnDestroy(cudnnHandle_t h);
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s);
const char *cudnnGetErrorString(cudnnStatus_t s);
/* Every other cuDNN call: any arguments, "not supported". */
#define MS_EMU_DNN_UNSUPPORTED(name)                                 \
    template <class... A>                                            \
    static inline cudnnStatus_t name(A...)                           \
    {                                                                \
        return CUDNN_STATUS_NOT_SUPPORTED;                           \
    }
MS_EMU_DNN_UNSUPPORTED(cudnnCreateTensorDescriptor)
MS_EMU_DNN_UNSUPPORTED(cudnnCreateFilterDescriptor)
MS_EMU_DNN_UNSUPPORTED(cudnnCreateConvolutionDescriptor)
MS_EMU_DNN_UNSUPPORTED(cudnnCreateActivationDescriptor)
MS_EMU_DNN_UNSUPPORTED(cudnnDestroyTensorDescriptor)
MS_EMU_DNN_UNSUPPORTED(cudnnDestroyFilterDescriptor)
MS_EMU_DNN_UNSUPPORTED(cudnnDestroyConvolutionDescriptor)
MS_EMU_DNN_UNSUPPORTED(cudnnDestroyActivationDescriptor)
MS_EMU_DNN_UNSUPPORTED(cudnnSetTensor4dDescriptor)
MS_EMU_DNN_UNSUPPORTED(cudnnSetFilter4dDescriptor)
MS_EMU_DNN_UNSUPPORTED(cudnnSetConvolution2dDescriptor)
MS_EMU_DNN_UNSUPPORTED(cudnnSetConvolutionMathType)
MS_EMU_DNN_UNSUPPORTED(cudnnSetActivationDescriptor)
MS_EMU_DNN_UNSUPPORTED(cudnnGetConvolution2dForwardOutputDim)
MS_EMU_DNN_UNSUPPORTED(cudnnGetConvolutionForwardAlgorithm_v7)
MS_EMU_DNN_UNSUPPORTED(cudnnConvolutionBiasActivationForward)
MS_EMU_DNN_UNSUPPORTED(cudnnConvolutionForward)

#endif
