/* The CUDA backend's context: device, one stream, cuBLAS(Lt)/cuDNN handles.
 * Host code includes this only under MS_HAVE_CUDA. Everything is enqueued on
 * the one stream; nothing synchronises inside a forward pass except
 * cuda_sync() and the device-to-host copies the caller asks for. */
#ifndef MS_CUDA_CTX_H
#define MS_CUDA_CTX_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ms_cuda_ctx ms_cuda_ctx;

/* Probes the driver and device (compute capability >= 8.0 required) and
 * creates the stream and handles. A missing or too-old driver, no device or
 * an unsupported GPU returns MS_ERR_UNSUPPORTED with a one-line reason. */
ms_status cuda_ctx_init(ms_cuda_ctx **out, int device_index);
void cuda_ctx_free(ms_cuda_ctx *cu);
/* Makes the context's GPU current for the calling thread (the runtime's
 * current device is per thread, 0 in a new thread), so a context on GPU 1
 * can be used from a thread that did not create it. */
ms_status cuda_ctx_use(ms_cuda_ctx *cu);
/* Drops the cached BF16 copies of linear weights (op_linear outside FP32
 * mode converts each weight once, keyed by pointer and shape, assuming it
 * never changes) and frees their device memory, after waiting for the
 * stream. For callers that free or rewrite weights while the context lives
 * (tests); an engine's weights live as long as its context. */
ms_status cuda_ctx_forget_weights(ms_cuda_ctx *cu);
/* "NVIDIA H200 (sm_90, 139 GiB)". */
const char *cuda_ctx_name(const ms_cuda_ctx *cu);

/* What the machine offers, for `mitaseg doctor` and the device check; works
 * without a GPU. Versions are as the libraries encode them (driver and
 * runtime 12040 = 12.4; cuBLAS 130100 = 13.1.0; cuDNN 91300 = 9.13.0),
 * 0 where unknown (no libcuda: driver 0). cudnn_build is cuDNN's version
 * this program was compiled against; cudnn the loaded library's. */
typedef struct {
    int driver, runtime, runtime_build, cublas, cudnn, cudnn_build;
    int devices;            /* -1: the count failed (device_error says why) */
    char device_error[160];
} ms_cuda_versions;
void cuda_query_versions(ms_cuda_versions *v);
/* GPU i: name, compute capability, memory. MS_ERR_UNSUPPORTED past the count. */
ms_status cuda_query_device(int i, char *name /* (256) */, int *cc_major, int *cc_minor,
                            size_t *total_bytes);

/* Asynchronous copies on the context's stream. */
ms_status cuda_copy_h2d(ms_cuda_ctx *cu, void *dst, const void *src, size_t bytes);
ms_status cuda_copy_d2h(ms_cuda_ctx *cu, void *dst, const void *src, size_t bytes);
/* Fills bytes with the byte value on the stream (0xFF: NaN floats, -1 ints). */
ms_status cuda_fill_bytes(ms_cuda_ctx *cu, void *dst, int value, size_t bytes);
/* Waits for the stream; reports any asynchronous kernel error. */
ms_status cuda_sync(ms_cuda_ctx *cu);

/* Device storage for ms_arena (kernels/common.c). */
ms_status cuda_arena_alloc_storage(uint8_t **out, size_t bytes);
void cuda_arena_free_storage(uint8_t *p);

#ifdef __cplusplus
}
#endif
#endif
