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

/* Asynchronous copies on the context's stream. */
ms_status cuda_copy_h2d(ms_cuda_ctx *cu, void *dst, const void *src, size_t bytes);
ms_status cuda_copy_d2h(ms_cuda_ctx *cu, void *dst, const void *src, size_t bytes);
/* Waits for the stream; reports any asynchronous kernel error. */
ms_status cuda_sync(ms_cuda_ctx *cu);

/* Device storage for ms_arena (kernels/common.c). */
ms_status cuda_arena_alloc_storage(uint8_t **out, size_t bytes);
void cuda_arena_free_storage(uint8_t *p);

#ifdef __cplusplus
}
#endif
#endif
