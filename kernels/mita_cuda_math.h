/* Per-thread arithmetic of the MiTA and flash-attention CUDA kernels
 * (kernels/mita.cu, kernels/attention_full.cu), as MS_HD helpers: the
 * kernels call these and tests/test_kernel_math.c runs the same functions on
 * the CPU against the CPU ops. Plain C11 so the tests can include it. */
#ifndef MS_MITA_CUDA_MATH_H
#define MS_MITA_CUDA_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mita.h" /* softmax_rescale, softmax_merge, argmax_first, adaptive_pool_* */

#ifdef __CUDA_ARCH__
#define MS_UNROLL _Pragma("unroll")
#else
#define MS_UNROLL
#endif

/* Largest head dim the flash and routed kernels take (per-thread arrays). */
#define MS_MITA_DMAX 256
/* Routed sets up to this size are sorted in shared memory (bitonic);
 * larger ones by rank in device memory. */
#define MS_TOPK_SMEM 4096

/* Index of channel ch of token t in qkv rows of c3 = 3c floats. 64-bit:
 * n * 3c passes 2^31 from ViT-B (c = 768) at 932K tokens. */
MS_HD size_t mita_qkv_index(long t, int c3, long ch)
{
    return (size_t)t * (size_t)c3 + (size_t)ch;
}

/* ---- landmarks: adaptive average pool of q over one window ---- */

/* Landmark (gy, gx) of channel ch: mean of q over its pooling window.
 * qkv rows have stride c3 = 3c; q is the first c channels. */
MS_HD float mita_landmark_value(const float *qkv /* (hp*wp, 3c) */, int hp, int wp, int c3,
                                int ch, int gy, int gx, int gh, int gw)
{
    int y0 = adaptive_pool_start(gy, hp, gh), y1 = adaptive_pool_end(gy, hp, gh);
    int x0 = adaptive_pool_start(gx, wp, gw), x1 = adaptive_pool_end(gx, wp, gw);
    float sum = 0.0f;
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) sum += qkv[mita_qkv_index((long)y * wp + x, c3, ch)];
    return sum / (float)((y1 - y0) * (x1 - x0));
}

/* ---- top-k: radix select on order-preserving keys, then bitonic sort ---- */

/* Float -> uint32 with the same order (larger float, larger key); -0 and +0
 * map to one key so that they tie as in topk_before. */
MS_HD uint32_t topk_key(float x)
{
    if (x == 0.0f) x = 0.0f;
    uint32_t u = ms_float_bits(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The float whose topk_key is key (+0 for the key of -0). */
MS_HD float topk_key_value(uint32_t key)
{
    return ms_bits_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

/* (key, position) as one 64-bit value: descending order of it is descending
 * score, ties to the lower position (topk_before). 0 sorts after all real
 * entries (a real key is never 0 except for a negative NaN). */
MS_HD uint64_t topk_composite(uint32_t key, int pos)
{
    return ((uint64_t)key << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)pos);
}

MS_HD int topk_composite_pos(uint64_t v) { return (int)(0xFFFFFFFFu - (uint32_t)v); }

/* One radix-select pass: hist[256] counts the candidates' current digit.
 * Returns the digit of the need-th largest candidate (need >= 1) and sets
 * *need to its rank among the candidates with that digit. */
MS_HD int topk_pick_digit(const unsigned *hist, int *need)
{
    unsigned cum = 0;
    for (int dg = 255; dg >= 0; dg--) {
        if (cum + hist[dg] >= (unsigned)*need) {
            *need -= (int)cum;
            return dg;
        }
        cum += hist[dg];
    }
    return 0; /* need > number of candidates: not reached for need <= n */
}

/* One compare-exchange of a bitonic sort of n2 (a power of two) values into
 * descending order: merge stage `size`, distance `stride`, pair i in
 * [0, n2/2). The pairs of one (size, stride) step are disjoint, so a block
 * runs them in parallel and a CPU loop in any order. */
MS_HD void bitonic_step_desc(uint64_t *a, int size, int stride, int i)
{
    int lo = (i / stride) * 2 * stride + (i % stride);
    int hi = lo + stride;
    bool desc = (lo & size) == 0;
    uint64_t x = a[lo], y = a[hi];
    if (desc ? x < y : x > y) {
        a[lo] = y;
        a[hi] = x;
    }
}

MS_HD int next_pow2(int n)
{
    int p = 1;
    while (p < n) p <<= 1;
    return p;
}

/* ---- shared summaries: softmax over N of P s, streamed ---- */

/* Adds logit x to the partial softmax (m, l) (no accumulator). */
MS_HD void softmax_stats_push(float *m, float *l, float x)
{
    if (x > *m) {
        *l = *l * softmax_rescale(*m, x) + 1.0f;
        *m = x;
    } else {
        *l += expf(x - *m);
    }
}

/* ---- routing: counting sort of queries by expert ---- */

/* From per-(head, expert) query counts: each group's start within its
 * head's segment of the order array, and the exclusive prefix of the
 * number of qb-query chunks (the routed kernel's work list;
 * chunk_starts[groups] = total). */
MS_HD void mita_scan_groups(int *starts /* (heads*m) */, int *chunk_starts /* (heads*m+1) */,
                            const int *counts /* (heads*m) */, int heads, int m, int qb)
{
    int chunks = 0;
    for (int h = 0; h < heads; h++) {
        int pos = 0;
        for (int e = 0; e < m; e++) {
            int g = h * m + e;
            starts[g] = pos;
            chunk_starts[g] = chunks;
            pos += counts[g];
            chunks += (counts[g] + qb - 1) / qb;
        }
    }
    chunk_starts[heads * m] = chunks;
}

/* The group whose chunks contain work item b: the last g with
 * chunk_starts[g] <= b (skips empty groups). Needs b < chunk_starts[groups]. */
MS_HD int mita_find_group(const int *chunk_starts, int groups, int b)
{
    int lo = 0, hi = groups;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (chunk_starts[mid] <= b) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* ---- one query's joint softmax (routed kernel and flash kernel) ---- */

/* Adds one logit with its value row to the online softmax (m, l, acc). */
MS_HD void osm_push(float *m, float *l, float *acc, float logit, const float *v, int d)
{
    if (logit > *m) {
        float cr = softmax_rescale(*m, logit);
        *l *= cr;
        MS_UNROLL
        for (int i = 0; i < d; i++) acc[i] *= cr;
        *m = logit;
    }
    float p = expf(logit - *m);
    *l += p;
    MS_UNROLL
    for (int i = 0; i < d; i++) acc[i] += p * v[i];
}

MS_HD void osm_init(float *m, float *l, float *acc, int d)
{
    *m = -INFINITY;
    *l = 0.0f;
    MS_UNROLL
    for (int i = 0; i < d; i++) acc[i] = 0.0f;
}

/* The M shared logits R[n,m] s s_sh with the summaries Sv (staged). */
MS_HD void mita_query_shared(float *m, float *l, float *acc, const float *rrow /* (nm) */,
                             int nm, float sh_scale, const float *sv /* (nm, d) */, int d)
{
    for (int e = 0; e < nm; e++) osm_push(m, l, acc, rrow[e] * sh_scale, sv + (long)e * d, d);
}

/* nk keys with their values (a staged tile, rows of d): logits q.k s. */
MS_HD void osm_query_keys(float *m, float *l, float *acc, const float *q /* (d) */,
                          const float *ks /* (nk, d) */, const float *vs /* (nk, d) */, int nk,
                          int d, float s)
{
    for (int j = 0; j < nk; j++) {
        const float *kr = ks + (long)j * d;
        /* four partial sums: independent FMA chains keep the GPU's pipes
         * busy (one chain of d dependent FMAs would be latency-bound) */
        float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
        int i = 0;
        MS_UNROLL
        for (; i + 4 <= d; i += 4) {
            d0 += q[i] * kr[i];
            d1 += q[i + 1] * kr[i + 1];
            d2 += q[i + 2] * kr[i + 2];
            d3 += q[i + 3] * kr[i + 3];
        }
        for (; i < d; i++) d0 += q[i] * kr[i];
        osm_push(m, l, acc, ((d0 + d1) + (d2 + d3)) * s, vs + (long)j * d, d);
    }
}

/* out = acc / l; *mass (if not NULL) = the part of l that came from the
 * shared logits, (m_sh, l_sh) being the state after them. */
MS_HD void osm_finish(float *out /* (d) */, float *mass, float m, float l, float m_sh,
                      float l_sh, const float *acc, int d)
{
    float inv = 1.0f / l;
    MS_UNROLL
    for (int i = 0; i < d; i++) out[i] = acc[i] * inv;
    if (mass) *mass = l_sh * softmax_rescale(m_sh, m) * inv;
}

#endif
