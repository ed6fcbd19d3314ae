/* Full multi-head attention with a streaming (online) softmax over key
 * blocks: memory O(block), so N = 64K tokens fit. */
#ifndef MS_ATTENTION_FULL_H
#define MS_ATTENTION_FULL_H

#include "elementwise.h" /* softmax_rescale */

/* Default blocks: a (QB x KB) score tile per GEMM, small enough to stay in
 * a core's L2 cache. */
#define MS_ATTN_QB 256
#define MS_ATTN_KB 256

#ifdef __cplusplus
extern "C" {
#endif

/* Floats of scratch for query/key blocks qb, kb and `chunks` threads: per
 * thread a score tile plus each query's running max, sum and rescale. */
size_t attention_full_scratch_floats(int n, int qb, int kb, int chunks);

/* Threads (at most `chunks`) take (head, query block) items; GEMMs inside run
 * single-threaded. */
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
