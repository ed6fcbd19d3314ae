/* The CUDA backend's context: driver/device probing with one-line reasons,
 * one stream, cuBLAS(Lt)/cuDNN handles, a shared workspace, device storage
 * for arenas. */
#include "cuda_check.h"

#include <stdio.h>
#include <string.h>

/* Workspace for cuBLASLt epilogue GEMMs and cuDNN convolution algorithms;
 * algorithms that want more are skipped. */
#define MS_CUDA_WORKSPACE_BYTES ((size_t)64 << 20)

static ms_status cuda_ctx_probe(ms_cuda_ctx *cu, int device_index)
{
    int drv = 0, rt = 0, count = 0;
    cudaError_t e = cudaDriverGetVersion(&drv);
    if (e != cudaSuccess || drv == 0)
        return ms_error(MS_ERR_UNSUPPORTED, "no CUDA driver found (libcuda not loadable)");
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = CUDART_VERSION;
    /* Same major version suffices (minor version compatibility: the build
     * embeds machine code for its targets, no newer PTX to JIT). */
    if (drv / 1000 < rt / 1000)
        return ms_error(MS_ERR_UNSUPPORTED,
                        "CUDA driver too old: it supports CUDA %d.%d, this build needs %d.%d",
                        drv / 1000, (drv % 1000) / 10, rt / 1000, (rt % 1000) / 10);
    e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ms_error(MS_ERR_UNSUPPORTED, "no usable CUDA device: %s",
                        cudaGetErrorString(e));
    }
    if (count == 0) return ms_error(MS_ERR_UNSUPPORTED, "no CUDA device found");
    if (device_index < 0 || device_index >= count)
        return ms_error(MS_ERR_UNSUPPORTED, "CUDA device %d requested, %d present",
                        device_index, count);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
    if (prop.major < 8)
        return ms_error(MS_ERR_UNSUPPORTED,
                        "%s has compute capability %d.%d; mitaseg needs 8.0 or newer",
                        prop.name, prop.major, prop.minor);
    cu->device = device_index;
    cu->cc_major = prop.major;
    cu->cc_minor = prop.minor;
    cu->sm_count = prop.multiProcessorCount;
    cu->smem_optin = prop.sharedMemPerBlockOptin;
    snprintf(cu->name, sizeof cu->name, "%.200s (sm_%d%d, %.0f GiB)", prop.name, prop.major,
             prop.minor, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return MS_OK;
}

static ms_status cuda_ctx_create(ms_cuda_ctx *cu)
{
    CUDA_CHECK(cudaSetDevice(cu->device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&cu->blas));
    CUBLAS_CHECK(cublasSetStream(cu->blas, cu->stream));
    CUBLAS_CHECK(cublasLtCreate(&cu->lt));
    cudnnStatus_t ds = cudnnCreate(&cu->dnn);
    if (ds != CUDNN_STATUS_SUCCESS)
        return ms_error(MS_ERR_UNSUPPORTED, "cuDNN unusable: cudnnCreate: %s",
                        cudnnGetErrorString(ds));
    CUDNN_CHECK(cudnnSetStream(cu->dnn, cu->stream));
    cu->workspace_bytes = MS_CUDA_WORKSPACE_BYTES;
    CUDA_CHECK(cudaMalloc(&cu->workspace, cu->workspace_bytes));
    return MS_OK;
}

extern "C" ms_status cuda_ctx_init(ms_cuda_ctx **out, int device_index)
{
    *out = NULL;
    ms_cuda_ctx *cu = (ms_cuda_ctx *)ms_calloc(1, sizeof *cu);
    MS_CHECK_ALLOC(cu, sizeof *cu);
    ms_status st = cuda_ctx_probe(cu, device_index);
    if (st == MS_OK) st = cuda_ctx_create(cu);
    if (st != MS_OK) {
        cuda_ctx_free(cu);
        return st;
    }
    *out = cu;
    return MS_OK;
}

extern "C" void cuda_ctx_free(ms_cuda_ctx *cu)
{
    if (!cu) return;
    if (cu->stream) (void)cudaStreamSynchronize(cu->stream);
    linear_cuda_cache_free(cu);
    linear_cuda_weights_free(cu);
    if (cu->workspace) (void)cudaFree(cu->workspace);
    if (cu->dnn) (void)cudnnDestroy(cu->dnn);
    if (cu->lt) (void)cublasLtDestroy(cu->lt);
    if (cu->blas) (void)cublasDestroy(cu->blas);
    if (cu->stream) (void)cudaStreamDestroy(cu->stream);
    ms_free(cu);
}

extern "C" ms_status cuda_ctx_use(ms_cuda_ctx *cu)
{
    CUDA_CHECK(cudaSetDevice(cu->device));
    return MS_OK;
}

extern "C" ms_status cuda_ctx_forget_weights(ms_cuda_ctx *cu)
{
    /* the stream may still read the copies (cudaFree would also wait, but
     * reports no kernel error) */
    CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    linear_cuda_weights_free(cu);
    return MS_OK;
}

extern "C" const char *cuda_ctx_name(const ms_cuda_ctx *cu) { return cu ? cu->name : "none"; }

extern "C" ms_status cuda_copy_h2d(ms_cuda_ctx *cu, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0) return MS_OK;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cu->stream));
    return MS_OK;
}

extern "C" ms_status cuda_copy_d2h(ms_cuda_ctx *cu, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0) return MS_OK;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cu->stream));
    return MS_OK;
}

extern "C" ms_status cuda_fill_bytes(ms_cuda_ctx *cu, void *dst, int value, size_t bytes)
{
    if (bytes == 0) return MS_OK;
    CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, cu->stream));
    return MS_OK;
}

extern "C" void cuda_query_versions(ms_cuda_versions *v)
{
    memset(v, 0, sizeof *v);
    if (cudaDriverGetVersion(&v->driver) != cudaSuccess) v->driver = 0;
    if (cudaRuntimeGetVersion(&v->runtime) != cudaSuccess) v->runtime = 0;
    v->runtime_build = CUDART_VERSION;
    int major = 0, minor = 0, patch = 0;
    if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
        cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
        v->cublas = major * 10000 + minor * 100 + patch;
    v->cudnn = (int)cudnnGetVersion();
    v->cudnn_build = CUDNN_VERSION;
    if (v->driver == 0) {
        v->devices = 0;
        snprintf(v->device_error, sizeof v->device_error, "no CUDA driver (libcuda) found");
        return;
    }
    cudaError_t e = cudaGetDeviceCount(&v->devices);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        v->devices = -1;
        snprintf(v->device_error, sizeof v->device_error, "%s", cudaGetErrorString(e));
    } else if (v->devices == 0) {
        snprintf(v->device_error, sizeof v->device_error, "the driver sees no CUDA device");
    }
}

extern "C" ms_status cuda_query_device(int i, char *name, int *cc_major, int *cc_minor,
                                       size_t *total_bytes)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || i < 0 || i >= count) {
        (void)cudaGetLastError();
        return ms_error(MS_ERR_UNSUPPORTED, "CUDA device %d: not present", i);
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    snprintf(name, 256, "%s", prop.name);
    *cc_major = prop.major;
    *cc_minor = prop.minor;
    *total_bytes = prop.totalGlobalMem;
    return MS_OK;
}

extern "C" ms_status cuda_sync(ms_cuda_ctx *cu)
{
    CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    CUDA_CHECK(cudaGetLastError());
    return MS_OK;
}

extern "C" ms_status cuda_arena_alloc_storage(uint8_t **out, size_t bytes)
{
    *out = NULL;
    cudaError_t e = cudaMalloc((void **)out, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        return ms_error(MS_ERR_OOM, "GPU out of memory: %.1f MiB requested, %.1f of %.1f MiB free",
                        bytes / 1048576.0, free_b / 1048576.0, total_b / 1048576.0);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ms_error(MS_ERR_CUDA, "cudaMalloc(%zu bytes) failed: %s at %s:%d", bytes,
                        cudaGetErrorString(e), __FILE__, __LINE__);
    }
    return MS_OK;
}

extern "C" void cuda_arena_free_storage(uint8_t *p)
{
    if (p) (void)cudaFree(p);
}

/* For the benchmarks (bench/, declared there): the context's stream, to
 * time with CUDA events on it. Not in cuda_ctx.h: the engine needs none. */
extern "C" void *cuda_ctx_stream(ms_cuda_ctx *cu) { return (void *)cu->stream; }
