/* Built once per CPU path (cpu_path.h): plain C loops the compiler
 * vectorises for the path's instruction set. */
#include "mita_simd.h"

#include "elementwise.h" /* softmax_merge */
#include "simd_math.h"

float MS_SIMD_FN(mita_max)(const float *x, int n)
{
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* Blocks of 32 tested at once with an OR of the compares: in a top-k scan
 * almost no element beats the heap's worst, so nearly every block is one
 * vector pass and a branch. */
int MS_SIMD_FN(mita_first_above)(const float *x, int n, float thr)
{
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        int any = 0;
#pragma omp simd reduction(| : any)
        for (int j = 0; j < 32; j++) any |= x[i + j] > thr;
        if (any) break;
    }
    for (; i < n; i++)
        if (x[i] > thr) return i;
    return n;
}

int MS_SIMD_FN(mita_collect_at_least)(float *val, int32_t *pos, const float *x, int n, float t)
{
    int nc = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        int any = 0;
#pragma omp simd reduction(| : any)
        for (int j = 0; j < 32; j++) any |= x[i + j] >= t;
        if (!any) continue;
        for (int j = i; j < i + 32; j++)
            if (x[j] >= t) val[nc] = x[j], pos[nc++] = j;
    }
    for (; i < n; i++)
        if (x[i] >= t) val[nc] = x[i], pos[nc++] = i;
    return nc;
}

void MS_SIMD_FN(mita_add)(float *restrict acc, const float *restrict x, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++) acc[i] += x[i];
}

void MS_SIMD_FN(mita_scale_row)(float *x, int n, float a)
{
#pragma omp simd
    for (int i = 0; i < n; i++) x[i] *= a;
}

/* topk_key as bit operations the compiler vectorises: -0 becomes +0, a
 * negative float's bits are inverted, a positive one's sign bit set. */
void MS_SIMD_FN(mita_keys)(uint32_t *restrict key, const float *restrict x, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++) {
        union {
            float f;
            uint32_t u;
        } v = {x[i] == 0.0f ? 0.0f : x[i]};
        uint32_t neg = (uint32_t)((int32_t)v.u >> 31);
        key[i] = v.u ^ (neg | 0x80000000u);
    }
}

int MS_SIMD_FN(mita_collect_at_least_u32)(uint32_t *val, int32_t *pos, const uint32_t *key, int n,
                                           uint32_t t)
{
    int nc = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        int any = 0;
#pragma omp simd reduction(| : any)
        for (int j = 0; j < 32; j++) any |= key[i + j] >= t;
        if (!any) continue;
        for (int j = i; j < i + 32; j++)
            if (key[j] >= t) val[nc] = key[j], pos[nc++] = j;
    }
    for (; i < n; i++)
        if (key[i] >= t) val[nc] = key[i], pos[nc++] = i;
    return nc;
}

int MS_SIMD_FN(mita_count_at_least_u32)(const uint32_t *key, int n, uint32_t t)
{
    int cnt = 0;
#pragma omp simd reduction(+ : cnt)
    for (int i = 0; i < n; i++) cnt += key[i] >= t;
    return cnt;
}

/* Branch-free: each entry's rank is two vector counts over the row (the
 * higher keys, and the equal ones before it: they have lower positions). */
void MS_SIMD_FN(mita_rank_desc)(int32_t *idx, const uint32_t *key, const int32_t *pos, int n)
{
    for (int i = 0; i < n; i++) {
        uint32_t v = key[i];
        int r = 0;
#pragma omp simd reduction(+ : r)
        for (int j = 0; j < i; j++) r += key[j] >= v;
#pragma omp simd reduction(+ : r)
        for (int j = i + 1; j < n; j++) r += key[j] > v;
        idx[r] = pos[i];
    }
}

/* Per row: exp and sum of the shared part (its max is row[e], the route's
 * logit), max, exp and sum of the routed part, the log-sum-exp merge, and
 * both parts scaled to final weights; the same arithmetic as vm_exp_sum and
 * mita_max one part at a time, in one call per block. */
void MS_SIMD_FN(mita_joint_softmax)(float *lg, float *mass, int nb, int m, int k, int e,
                                    float s_shared)
{
    for (int r = 0; r < nb; r++) {
        float *a = lg + (size_t)r * (m + k), *b = a + m;
        float m_a = a[e] * s_shared, l_a = 0.0f, m_b = b[0], l_b = 0.0f;
#pragma omp simd reduction(+ : l_a)
        for (int i = 0; i < m; i++) {
            float x = expf(a[i] * s_shared - m_a);
            a[i] = x;
            l_a += x;
        }
#pragma omp simd reduction(max : m_b)
        for (int j = 1; j < k; j++) m_b = b[j] > m_b ? b[j] : m_b;
#pragma omp simd reduction(+ : l_b)
        for (int j = 0; j < k; j++) {
            float x = expf(b[j] - m_b);
            b[j] = x;
            l_b += x;
        }
        float mm, l, c_a, c_b;
        softmax_merge(&mm, &l, &c_a, &c_b, m_a, l_a, m_b, l_b);
        float inv = 1.0f / l, w_a = c_a * inv, w_b = c_b * inv;
#pragma omp simd
        for (int i = 0; i < m; i++) a[i] *= w_a;
#pragma omp simd
        for (int j = 0; j < k; j++) b[j] *= w_b;
        mass[r] = l_a * w_a;
    }
}
