/* MiTA attention (spec section 2): landmarks, probe and top-k routed sets,
 * shared summaries, top-1 routing and the joint softmax. */
#ifndef MS_MITA_H
#define MS_MITA_H

#include "elementwise.h" /* softmax_merge, argmax_first */
#include "pool.h"        /* adaptive_pool_start/end */

/* Top-k order: higher score first, ties to the lower position. */
MS_HD bool topk_before(float score_a, int idx_a, float score_b, int idx_b)
{
    return score_a > score_b || (score_a == score_b && idx_a < idx_b);
}

/* Softmax scales of the two logit kinds: s = d^-1/2 for routed logits q.k s;
 * shared logits q.l s s_sh with s_sh = s ("d") or 1 ("sqrt_d"). */
MS_HD float mita_scale(int d) { return 1.0f / sqrtf((float)d); }
MS_HD float mita_shared_scale(int d, bool shared_scale_d)
{
    float s = mita_scale(d);
    return shared_scale_d ? s * s : s;
}

#ifdef __cplusplus
extern "C" {
#endif

/* Effective sizes after the defensive clamps: gh <= hp, gw <= wp,
 * k <= n = p->ncls + hp*wp (the class token is a key too), all >= 1. */
void mita_clamp(int *gh, int *gw, int *k, int hp, int wp, const ms_mita_params *p);

/* Recorded number of sequence position i (mita-spec 2.7): grid tokens
 * 0..N-1 keep theirs, the class token (i < ncls) becomes N. */
MS_HD int mita_report_pos(int i, int ncls, int n) { return i < ncls ? n - ncls + i : i - ncls; }

/* Bytes of scratch for mita_cpu with `chunks` parallel query chunks. */
size_t mita_scratch_bytes(int hp, int wp, int ncls, int c, int heads, int gh, int gw, int k,
                          int chunks);

/* idx = the k best positions of score[0..n) (1 <= k <= n), best first:
 * higher score first, ties to the lower position, NaNs ordered by their
 * bits (topk_key, mita_cuda_math.h). buf: mita_topk_floats(n, k) floats.
 * Returns the largest score (by key: a NaN where the largest key is a
 * NaN's; -0 comes back as +0). What mita_cpu runs per expert; exposed for
 * the tests. */
size_t mita_topk_floats(int n, int k);
float mita_topk_row(int32_t *idx /* (k) */, const float *score /* (n) */, int n, int k,
                   float *buf /* (mita_topk_floats(n, k)) */);

/* Generates the small-product kernels of mita_cpu's routed blocks, at
 * every block size, so that no image makes one (a plan step; sizes
 * clamped). */
void mita_cpu_prepare(int c, int heads, int gh, int gw, int k);

/* Sizes already clamped (mita_clamp). n = ncls + hp*wp tokens, the class
 * token first. ws: mita_scratch_bytes bytes. */
void mita_cpu(float *out /* (n, c) */, const float *qkv /* (n, 3c) */, int hp, int wp, int ncls,
              int c, int heads, int gh, int gw, int k, bool shared_scale_d,
              const ms_mita_record *rec /* or NULL */, void *ws, int chunks);

#ifdef MS_HAVE_CUDA
size_t mita_cuda_scratch_bytes(int hp, int wp, int ncls, int c, int heads, int gh, int gw, int k);
/* Sizes already clamped; rec pointers are device pointers. */
ms_status mita_cuda(ms_backend *be, float *out /* (n, c) */, const float *qkv /* (n, 3c) */,
                    int hp, int wp, int ncls, int c, int heads, int gh, int gw, int k,
                    bool shared_scale_d, const ms_mita_record *rec /* or NULL */, void *ws);
#endif

#ifdef __cplusplus
}
#endif
#endif
