/* Full multi-head attention with a streaming (online) softmax over key
 * blocks: memory O(block), so N = 64K tokens fit (the fused kernel also
 * holds K^T, as large as K). */
#ifndef MS_ATTENTION_FULL_H
#define MS_ATTENTION_FULL_H

#include "elementwise.h" /* softmax_rescale */

/* Default blocks: a (QB x KB) score tile per GEMM (1 MiB). Measured on a
 * 2-core Zen 4 (1 MiB L2 per core), d = 64, N = 1024 and 4096, 3 and 6
 * heads: 512 x 512 was the fastest of QB 128..1024 x KB 256..1024 (CPU time
 * 2-6 % below 256 x 256; larger query blocks pack K and V fewer times). */
#define MS_ATTN_QB 512
#define MS_ATTN_KB 512
/* The fused kernel's largest key tile (x86-64-v4 and v3, attention_simd.h;
 * 128 timed alike on a Zen 3). */
#define MS_ATTN_FUSED_KB 256

#ifdef __cplusplus
extern "C" {
#endif

/* Floats of scratch for query/key blocks qb, kb and `chunks` threads: per
 * thread a score tile plus each query's running max, sum and rescale; or,
 * for the fused kernel, K^T of every head and per thread 6 rows of a key
 * tile (the larger of the two). */
size_t attention_full_scratch_floats(int n, int c, int qb, int kb, int chunks);

/* Threads (at most `chunks`) take (head, query block) items; GEMMs inside run
 * single-threaded. qb is the largest query block: smaller ones are used
 * where that keeps the threads evenly busy. */
void attention_full_cpu(float *out /* (n, c) */, const float *qkv /* (n, 3c) */, int n, int c,
                        int heads, int qb, int kb, float *ws /* (scratch_floats) */, int chunks);

#ifdef MS_HAVE_CUDA
size_t attention_full_cuda_scratch_bytes(int n, int c, int heads);
ms_status attention_full_cuda(ms_backend *be, float *out /* (n, c) */,
                              const float *qkv /* (n, 3c) */, int n, int c, int heads, void *ws);
#endif

#ifdef __cplusplus
}
#endif
#endif
