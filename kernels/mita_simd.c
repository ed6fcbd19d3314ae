/* Built once per CPU path (cpu_path.h): plain C loops the compiler
 * vectorises for the path's instruction set. */
#include "mita_simd.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "elementwise.h" /* argmax_first */
#include "simd_math.h"

float MS_SIMD_FN(mita_max)(const float *x, int n)
{
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* The path's vector at a float's alignment (a typedef may lower it),
 * may_alias as the intrinsics' types: it reads and writes float arrays. */
#if defined(__AVX512F__)
typedef float add_vec __attribute__((vector_size(64), aligned(4), may_alias));
#elif defined(__AVX2__)
typedef float add_vec __attribute__((vector_size(32), aligned(4), may_alias));
#endif

/* acc[i] += x[r ld + i] for r = 0, 1, ... in that order. On v3 and v4 a
 * block of 4 vectors of acc stays in registers over all rows (the row by
 * row loop loaded and stored acc once a row: the landmarks' pooling was 5 %
 * of the layer's samples at N = 4096, 6 heads). */
void MS_SIMD_FN(mita_add_rows)(float *restrict acc, const float *restrict x, size_t ld, int rows,
                               int n)
{
    int i = 0;
#if defined(__AVX512F__) || defined(__AVX2__)
    const int vl = (int)(sizeof(add_vec) / sizeof(float));
    for (; i + 4 * vl <= n; i += 4 * vl) {
        add_vec *a = (add_vec *)(acc + i);
        add_vec a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
        for (int r = 0; r < rows; r++) {
            const add_vec *xr = (const add_vec *)(x + (size_t)r * ld + i);
            a0 += xr[0], a1 += xr[1], a2 += xr[2], a3 += xr[3];
        }
        a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3;
    }
#endif
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * ld;
#pragma omp simd
        for (int j = i; j < n; j++) acc[j] += xr[j];
    }
}

/* topk_key as bit operations the compiler vectorises: -0 becomes +0, a
 * negative float's bits are inverted, a positive one's sign bit set. */
void MS_SIMD_FN(mita_keys)(uint32_t *restrict key, const float *restrict x, int n,
                           uint32_t *kmin, uint32_t *kmax, float *sum, float *sumsq)
{
    uint32_t lo = UINT32_MAX, hi = 0;
    float s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(min : lo) reduction(max : hi) reduction(+ : s1, s2)
    for (int i = 0; i < n; i++) {
        union {
            float f;
            uint32_t u;
        } v = {x[i] == 0.0f ? 0.0f : x[i]};
        uint32_t neg = (uint32_t)((int32_t)v.u >> 31);
        uint32_t kv = v.u ^ (neg | 0x80000000u);
        key[i] = kv;
        lo = kv < lo ? kv : lo;
        hi = kv > hi ? kv : hi;
        s1 += x[i];
        s2 += x[i] * x[i];
    }
    *kmin = lo;
    *kmax = hi;
    *sum = s1;
    *sumsq = s2;
}

#if defined(__AVX2__) && !defined(__AVX512F__)
/* Left-packing without AVX-512's compress: for an 8-bit mask of lanes,
 * the lanes' indices in order, a byte each (for vpermd). A table, not
 * pdep/pext: those are microcoded on Zen 1 and 2, which run this path. */
static const uint64_t pack_lanes[256] = {
    0x0000000000000000ull, 0x0000000000000000ull, 0x0000000000000001ull, 0x0000000000000100ull,
    0x0000000000000002ull, 0x0000000000000200ull, 0x0000000000000201ull, 0x0000000000020100ull,
    0x0000000000000003ull, 0x0000000000000300ull, 0x0000000000000301ull, 0x0000000000030100ull,
    0x0000000000000302ull, 0x0000000000030200ull, 0x0000000000030201ull, 0x0000000003020100ull,
    0x0000000000000004ull, 0x0000000000000400ull, 0x0000000000000401ull, 0x0000000000040100ull,
    0x0000000000000402ull, 0x0000000000040200ull, 0x0000000000040201ull, 0x0000000004020100ull,
    0x0000000000000403ull, 0x0000000000040300ull, 0x0000000000040301ull, 0x0000000004030100ull,
    0x0000000000040302ull, 0x0000000004030200ull, 0x0000000004030201ull, 0x0000000403020100ull,
    0x0000000000000005ull, 0x0000000000000500ull, 0x0000000000000501ull, 0x0000000000050100ull,
    0x0000000000000502ull, 0x0000000000050200ull, 0x0000000000050201ull, 0x0000000005020100ull,
    0x0000000000000503ull, 0x0000000000050300ull, 0x0000000000050301ull, 0x0000000005030100ull,
    0x0000000000050302ull, 0x0000000005030200ull, 0x0000000005030201ull, 0x0000000503020100ull,
    0x0000000000000504ull, 0x0000000000050400ull, 0x0000000000050401ull, 0x0000000005040100ull,
    0x0000000000050402ull, 0x0000000005040200ull, 0x0000000005040201ull, 0x0000000504020100ull,
    0x0000000000050403ull, 0x0000000005040300ull, 0x0000000005040301ull, 0x0000000504030100ull,
    0x0000000005040302ull, 0x0000000504030200ull, 0x0000000504030201ull, 0x0000050403020100ull,
    0x0000000000000006ull, 0x0000000000000600ull, 0x0000000000000601ull, 0x0000000000060100ull,
    0x0000000000000602ull, 0x0000000000060200ull, 0x0000000000060201ull, 0x0000000006020100ull,
    0x0000000000000603ull, 0x0000000000060300ull, 0x0000000000060301ull, 0x0000000006030100ull,
    0x0000000000060302ull, 0x0000000006030200ull, 0x0000000006030201ull, 0x0000000603020100ull,
    0x0000000000000604ull, 0x0000000000060400ull, 0x0000000000060401ull, 0x0000000006040100ull,
    0x0000000000060402ull, 0x0000000006040200ull, 0x0000000006040201ull, 0x0000000604020100ull,
    0x0000000000060403ull, 0x0000000006040300ull, 0x0000000006040301ull, 0x0000000604030100ull,
    0x0000000006040302ull, 0x0000000604030200ull, 0x0000000604030201ull, 0x0000060403020100ull,
    0x0000000000000605ull, 0x0000000000060500ull, 0x0000000000060501ull, 0x0000000006050100ull,
    0x0000000000060502ull, 0x0000000006050200ull, 0x0000000006050201ull, 0x0000000605020100ull,
    0x0000000000060503ull, 0x0000000006050300ull, 0x0000000006050301ull, 0x0000000605030100ull,
    0x0000000006050302ull, 0x0000000605030200ull, 0x0000000605030201ull, 0x0000060503020100ull,
    0x0000000000060504ull, 0x0000000006050400ull, 0x0000000006050401ull, 0x0000000605040100ull,
    0x0000000006050402ull, 0x0000000605040200ull, 0x0000000605040201ull, 0x0000060504020100ull,
    0x0000000006050403ull, 0x0000000605040300ull, 0x0000000605040301ull, 0x0000060504030100ull,
    0x0000000605040302ull, 0x0000060504030200ull, 0x0000060504030201ull, 0x0006050403020100ull,
    0x0000000000000007ull, 0x0000000000000700ull, 0x0000000000000701ull, 0x0000000000070100ull,
    0x0000000000000702ull, 0x0000000000070200ull, 0x0000000000070201ull, 0x0000000007020100ull,
    0x0000000000000703ull, 0x0000000000070300ull, 0x0000000000070301ull, 0x0000000007030100ull,
    0x0000000000070302ull, 0x0000000007030200ull, 0x0000000007030201ull, 0x0000000703020100ull,
    0x0000000000000704ull, 0x0000000000070400ull, 0x0000000000070401ull, 0x0000000007040100ull,
    0x0000000000070402ull, 0x0000000007040200ull, 0x0000000007040201ull, 0x0000000704020100ull,
    0x0000000000070403ull, 0x0000000007040300ull, 0x0000000007040301ull, 0x0000000704030100ull,
    0x0000000007040302ull, 0x0000000704030200ull, 0x0000000704030201ull, 0x0000070403020100ull,
    0x0000000000000705ull, 0x0000000000070500ull, 0x0000000000070501ull, 0x0000000007050100ull,
    0x0000000000070502ull, 0x0000000007050200ull, 0x0000000007050201ull, 0x0000000705020100ull,
    0x0000000000070503ull, 0x0000000007050300ull, 0x0000000007050301ull, 0x0000000705030100ull,
    0x0000000007050302ull, 0x0000000705030200ull, 0x0000000705030201ull, 0x0000070503020100ull,
    0x0000000000070504ull, 0x0000000007050400ull, 0x0000000007050401ull, 0x0000000705040100ull,
    0x0000000007050402ull, 0x0000000705040200ull, 0x0000000705040201ull, 0x0000070504020100ull,
    0x0000000007050403ull, 0x0000000705040300ull, 0x0000000705040301ull, 0x0000070504030100ull,
    0x0000000705040302ull, 0x0000070504030200ull, 0x0000070504030201ull, 0x0007050403020100ull,
    0x0000000000000706ull, 0x0000000000070600ull, 0x0000000000070601ull, 0x0000000007060100ull,
    0x0000000000070602ull, 0x0000000007060200ull, 0x0000000007060201ull, 0x0000000706020100ull,
    0x0000000000070603ull, 0x0000000007060300ull, 0x0000000007060301ull, 0x0000000706030100ull,
    0x0000000007060302ull, 0x0000000706030200ull, 0x0000000706030201ull, 0x0000070603020100ull,
    0x0000000000070604ull, 0x0000000007060400ull, 0x0000000007060401ull, 0x0000000706040100ull,
    0x0000000007060402ull, 0x0000000706040200ull, 0x0000000706040201ull, 0x0000070604020100ull,
    0x0000000007060403ull, 0x0000000706040300ull, 0x0000000706040301ull, 0x0000070604030100ull,
    0x0000000706040302ull, 0x0000070604030200ull, 0x0000070604030201ull, 0x0007060403020100ull,
    0x0000000000070605ull, 0x0000000007060500ull, 0x0000000007060501ull, 0x0000000706050100ull,
    0x0000000007060502ull, 0x0000000706050200ull, 0x0000000706050201ull, 0x0000070605020100ull,
    0x0000000007060503ull, 0x0000000706050300ull, 0x0000000706050301ull, 0x0000070605030100ull,
    0x0000000706050302ull, 0x0000070605030200ull, 0x0000070605030201ull, 0x0007060503020100ull,
    0x0000000007060504ull, 0x0000000706050400ull, 0x0000000706050401ull, 0x0000070605040100ull,
    0x0000000706050402ull, 0x0000070605040200ull, 0x0000070605040201ull, 0x0007060504020100ull,
    0x0000000706050403ull, 0x0000070605040300ull, 0x0000070605040301ull, 0x0007060504030100ull,
    0x0000070605040302ull, 0x0007060504030200ull, 0x0007060504030201ull, 0x0706050403020100ull,
};

/* Unsigned keys with their sign bit flipped: AVX2 compares signed, and
 * so flipped they order as the unsigned ones. */
static inline __m256i keys_signed(__m256i kv)
{
    return _mm256_xor_si256(kv, _mm256_set1_epi32((int)0x80000000u));
}

/* The lanes of an 8-key vector whose unsigned key >= t, as a bit mask
 * (tb: t through keys_signed). */
static inline int lanes_at_least(__m256i kv, __m256i tb)
{
    __m256i lt = _mm256_cmpgt_epi32(tb, keys_signed(kv));
    return ~_mm256_movemask_ps(_mm256_castsi256_ps(lt)) & 0xff;
}

static inline __m256i pack_perm(int hit)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&pack_lanes[hit]));
}
#endif

int MS_SIMD_FN(mita_collect_at_least_u32)(uint32_t *val, int32_t *pos, const uint32_t *key, int n,
                                           uint32_t t)
{
    int nc = 0, i = 0;
#ifdef __AVX512F__
    /* 16 keys a step: compare to a mask, compress the hits and their
     * positions into registers and store all 16 lanes (in bounds: nc <= i;
     * a compress straight to memory is slow on Zen 4) */
    const __m512i tv = _mm512_set1_epi32((int)t);
    __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= n; i += 16, at = _mm512_add_epi32(at, _mm512_set1_epi32(16))) {
        __m512i kv = _mm512_loadu_si512(key + i);
        __mmask16 hit = _mm512_cmpge_epu32_mask(kv, tv);
        if (!hit) continue;
        _mm512_storeu_si512(val + nc, _mm512_maskz_compress_epi32(hit, kv));
        _mm512_storeu_si512(pos + nc, _mm512_maskz_compress_epi32(hit, at));
        nc += __builtin_popcount(hit);
    }
#elif defined(__AVX2__)
    /* 8 keys a step, left-packed by a permutation: the scalar loop below
     * was 5.8 % of a MiTA layer's samples on a Zen 3 at N = 1024, where
     * most 32-key blocks hold a candidate, this 3.3 %. Stores of all 8
     * lanes stay in bounds, nc <= i. */
    const __m256i tb = keys_signed(_mm256_set1_epi32((int)t));
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (; i + 8 <= n; i += 8) {
        __m256i kv = _mm256_loadu_si256((const __m256i *)(key + i));
        int hit = lanes_at_least(kv, tb);
        if (!hit) continue;
        __m256i perm = pack_perm(hit);
        __m256i at = _mm256_add_epi32(_mm256_set1_epi32(i), iota);
        _mm256_storeu_si256((__m256i *)(val + nc), _mm256_permutevar8x32_epi32(kv, perm));
        _mm256_storeu_si256((__m256i *)(pos + nc), _mm256_permutevar8x32_epi32(at, perm));
        nc += __builtin_popcount((unsigned)hit);
    }
#endif
    for (; i + 32 <= n; i += 32) {
        int any = 0;
#pragma omp simd reduction(| : any)
        for (int j = 0; j < 32; j++) any |= key[i + j] >= t;
        if (!any) continue;
        for (int j = i; j < i + 32; j++) { /* branch-free: hits are not predictable */
            val[nc] = key[j], pos[nc] = j;
            nc += key[j] >= t;
        }
    }
    for (; i < n; i++) {
        val[nc] = key[i], pos[nc] = i;
        nc += key[i] >= t;
    }
    return nc;
}

int MS_SIMD_FN(mita_compact_at_least_u32)(uint32_t *key, int32_t *pos, int n, uint32_t t)
{
    int nc = 0, i = 0;
#ifdef __AVX512F__
    /* as mita_collect_at_least_u32; the 16-lane stores at nc <= i cover
     * only lanes already loaded */
    const __m512i tv = _mm512_set1_epi32((int)t);
    for (; i + 16 <= n; i += 16) {
        __m512i kv = _mm512_loadu_si512(key + i), pv = _mm512_loadu_si512(pos + i);
        __mmask16 hit = _mm512_cmpge_epu32_mask(kv, tv);
        _mm512_storeu_si512(key + nc, _mm512_maskz_compress_epi32(hit, kv));
        _mm512_storeu_si512(pos + nc, _mm512_maskz_compress_epi32(hit, pv));
        nc += __builtin_popcount(hit);
    }
#elif defined(__AVX2__)
    const __m256i tb = keys_signed(_mm256_set1_epi32((int)t));
    for (; i + 8 <= n; i += 8) { /* as mita_collect_at_least_u32, in place */
        __m256i kv = _mm256_loadu_si256((const __m256i *)(key + i));
        __m256i pv = _mm256_loadu_si256((const __m256i *)(pos + i));
        int hit = lanes_at_least(kv, tb);
        __m256i perm = pack_perm(hit);
        _mm256_storeu_si256((__m256i *)(key + nc), _mm256_permutevar8x32_epi32(kv, perm));
        _mm256_storeu_si256((__m256i *)(pos + nc), _mm256_permutevar8x32_epi32(pv, perm));
        nc += __builtin_popcount((unsigned)hit);
    }
#endif
    for (; i < n; i++) { /* branch-free: in place, nc <= i */
        uint32_t kv = key[i];
        int32_t pv = pos[i];
        key[nc] = kv, pos[nc] = pv;
        nc += kv >= t;
    }
    return nc;
}

int MS_SIMD_FN(mita_count_at_least_u32)(const uint32_t *key, int n, uint32_t t)
{
    int cnt = 0;
#pragma omp simd reduction(+ : cnt)
    for (int i = 0; i < n; i++) cnt += key[i] >= t;
    return cnt;
}

/* AVX2: per row the max by vector maxima (no compare chain: the scalar
 * argmax's compare-select chain costs 3-4 cycles a column), then the first
 * vector holding it by compare and movemask. Rows with a NaN take
 * argmax_first (maxps and the chain treat NaNs differently); -0 and +0
 * compare equal in both. The base path keeps the scalar loop. */
void MS_SIMD_FN(mita_argmax_rows)(int32_t *route, const float *x, int rows, int m, int ld)
{
    for (int r = 0; r < rows; r++) {
        const float *row = x + (size_t)r * ld;
#ifdef __AVX512F__
        /* 16 lanes, the tail masked in (m = 49: 3 vectors and 1 lane,
         * where 8 lanes took 6 and a scalar one) */
        if (m <= 128) {
            int nv = (m + 15) / 16;
            __mmask16 tm = (__mmask16)(0xFFFFu >> (16 * nv - m));
            __m512 v[8], mx = _mm512_set1_ps(-INFINITY);
            __mmask16 nan = 0;
            for (int i = 0; i < nv; i++) {
                v[i] = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), i + 1 < nv ? 0xFFFF : tm,
                                            row + 16 * i);
                mx = _mm512_max_ps(mx, v[i]);
                nan |= _mm512_cmp_ps_mask(v[i], v[i], _CMP_UNORD_Q);
            }
            if (!nan) {
                /* the first lane equal to the max, from one 64-bit mask
                 * per 4 vectors, without a branch per vector (which one
                 * holds the max is a coin toss: mispredicted) */
                __m512 bv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
                uint64_t eq[2] = {0, 0};
                for (int i = 0; i < nv; i++)
                    eq[i / 4] |= (uint64_t)_mm512_cmp_ps_mask(v[i], bv, _CMP_EQ_OQ) << (16 * (i % 4));
                route[r] = eq[0] ? __builtin_ctzll(eq[0]) : 64 + __builtin_ctzll(eq[1]);
                continue;
            }
        }
#endif
#ifdef __AVX2__
        int nv = m / 8;
        if (nv >= 1) {
            __m256 mx = _mm256_loadu_ps(row), nan = _mm256_cmp_ps(mx, mx, _CMP_UNORD_Q);
            for (int v = 1; v < nv; v++) {
                __m256 a = _mm256_loadu_ps(row + 8 * v);
                mx = _mm256_max_ps(mx, a);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
            }
            float tail = -INFINITY;
            int tail_nan = 0;
            for (int i = 8 * nv; i < m; i++) {
                tail = row[i] > tail ? row[i] : tail;
                tail_nan |= row[i] != row[i];
            }
            if (!_mm256_movemask_ps(nan) && !tail_nan) {
                float best = hmax8(mx);
                best = tail > best ? tail : best;
                __m256 bv = _mm256_set1_ps(best);
                int at = -1;
                for (int v = 0; v < nv && at < 0; v++) {
                    int mask = _mm256_movemask_ps(
                        _mm256_cmp_ps(_mm256_loadu_ps(row + 8 * v), bv, _CMP_EQ_OQ));
                    if (mask) at = 8 * v + __builtin_ctz((unsigned)mask);
                }
                for (int i = 8 * nv; i < m && at < 0; i++)
                    if (row[i] == best) at = i;
                route[r] = at;
                continue;
            }
        }
#endif
        route[r] = argmax_first(row, m, 1);
    }
}

/* Branch-free: each entry's rank is one vector count over the keys (the
 * higher ones, and the equal ones before it: they have lower positions).
 * mita_topk_row pads np to a multiple of 16, whole 512-bit vectors on v4
 * (np = 56 for k = 49 was 3.5 of them, and the half-vector tail made it
 * twice as slow as 256-bit vectors; perf, N = 1024). */
void MS_SIMD_FN(mita_rank_desc)(int32_t *idx, const uint32_t *key, const int32_t *pos, int n,
                                int np)
{
#ifdef __AVX512F__
    /* Up to 128 keys in 8 registers of per-lane ranks: each key i, as a
     * broadcast, adds 1 to the rank of every key below it. No horizontal
     * sum per key, which the per-key count below ends with (its share of
     * the layer's samples went from 5.5 % to 2.6 %, N = 1024). Equal keys
     * (rare: equal scores) get equal ranks; then the count below, which
     * orders them by position. */
    if (np <= 128) {
        int nv = (np + 15) / 16;
        __m512i kv[8], rk[8];
        for (int v = 0; v < nv; v++) {
            kv[v] = _mm512_loadu_si512(key + 16 * v);
            rk[v] = _mm512_setzero_si512();
        }
        const __m512i one = _mm512_set1_epi32(1);
        for (int i = 0; i < n; i++) {
            __m512i ki = _mm512_set1_epi32((int)key[i]);
            for (int v = 0; v < nv; v++)
                rk[v] = _mm512_mask_add_epi32(rk[v], _mm512_cmpgt_epu32_mask(ki, kv[v]), rk[v], one);
        }
        /* No ties iff the n ranks sum to n (n - 1) / 2: each count of
         * the keys above is at most the entry's place in the order, and
         * below it for the later of two equal keys. */
        int32_t r[128];
        long rsum = 0;
        for (int v = 0; v < nv; v++) {
            int left = n - 16 * v; /* real lanes of vector v */
            __mmask16 real =
                left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (left > 0 ? left : 0)) - 1u);
            rsum += _mm512_reduce_add_epi32(_mm512_maskz_mov_epi32(real, rk[v]));
            _mm512_storeu_si512(r + 16 * v, rk[v]);
        }
        if (rsum == (long)n * (n - 1) / 2) {
            for (int j = 0; j < n; j++) idx[r[j]] = pos[j];
            return;
        }
    }
#elif defined(__AVX2__)
    /* The same on 8 lanes (v3: 3.9 % of the layer's samples with the
     * per-key count, N = 1024, 3 heads), on keys_signed's keys; the
     * compare's -1 lanes are subtracted. */
    if (np <= 128) {
        int nv = (np + 7) / 8;
        __m256i kv[16], rk[16];
        for (int v = 0; v < nv; v++) {
            kv[v] = keys_signed(_mm256_loadu_si256((const __m256i *)(key + 8 * v)));
            rk[v] = _mm256_setzero_si256();
        }
        if (nv <= 8) { /* k <= 64 (MiTA's 49): 8 ranks in registers, unrolled */
            for (int v = nv; v < 8; v++) kv[v] = _mm256_set1_epi32(INT32_MIN); /* below all */
            __m256i r0 = rk[0], r1 = r0, r2 = r0, r3 = r0, r4 = r0, r5 = r0, r6 = r0, r7 = r0;
            for (int i = 0; i < n; i++) {
                __m256i ki = keys_signed(_mm256_set1_epi32((int)key[i]));
                r0 = _mm256_sub_epi32(r0, _mm256_cmpgt_epi32(ki, kv[0]));
                r1 = _mm256_sub_epi32(r1, _mm256_cmpgt_epi32(ki, kv[1]));
                r2 = _mm256_sub_epi32(r2, _mm256_cmpgt_epi32(ki, kv[2]));
                r3 = _mm256_sub_epi32(r3, _mm256_cmpgt_epi32(ki, kv[3]));
                r4 = _mm256_sub_epi32(r4, _mm256_cmpgt_epi32(ki, kv[4]));
                r5 = _mm256_sub_epi32(r5, _mm256_cmpgt_epi32(ki, kv[5]));
                r6 = _mm256_sub_epi32(r6, _mm256_cmpgt_epi32(ki, kv[6]));
                r7 = _mm256_sub_epi32(r7, _mm256_cmpgt_epi32(ki, kv[7]));
            }
            rk[0] = r0, rk[1] = r1, rk[2] = r2, rk[3] = r3;
            rk[4] = r4, rk[5] = r5, rk[6] = r6, rk[7] = r7;
        } else {
            for (int i = 0; i < n; i++) {
                __m256i ki = keys_signed(_mm256_set1_epi32((int)key[i]));
                for (int v = 0; v < nv; v++)
                    rk[v] = _mm256_sub_epi32(rk[v], _mm256_cmpgt_epi32(ki, kv[v]));
            }
        }
        int32_t r[128];
        long rsum = 0;
        for (int v = 0; v < nv; v++) _mm256_storeu_si256((__m256i *)(r + 8 * v), rk[v]);
        for (int j = 0; j < n; j++) rsum += r[j];
        if (rsum == (long)n * (n - 1) / 2) { /* no ties (see above) */
            for (int j = 0; j < n; j++) idx[r[j]] = pos[j];
            return;
        }
    }
#endif
    for (int i = 0; i < n; i++) {
        uint32_t v = key[i];
        int r = 0;
#pragma omp simd reduction(+ : r)
        for (int j = 0; j < np; j++) r += (key[j] > v) | ((key[j] == v) & (j < i));
        idx[r] = pos[i];
    }
}

/* x[i] = 2^(x[i] * scale - shift); returns their sum, NaN where x holds a
 * NaN or an infinity, as with expf (z: the sum of x * 0), which
 * exp2_clamped (simd_math.h; inlined, where libmvec's expf is a call per
 * vector) would clamp. */
static inline float exp2_sum(float *x, int n, float scale, float shift)
{
    float sum = 0.0f, z = 0.0f;
#pragma omp simd reduction(+ : sum, z)
    for (int i = 0; i < n; i++) {
        float e = exp2_clamped(x[i] * scale - shift);
        z += x[i] * 0.0f;
        x[i] = e;
        sum += e;
    }
    return z == 0.0f ? sum : NAN;
}

/* Per row: the max, 2^(logit * scale - max) and the sum in two uniform
 * passes over all m + k (the routed logits come scaled to the shared
 * ones' units), then the shared part's sum when asked. exp2_sum's inlined
 * exp2 was worth it: libmvec's expf was a third of this. On v4 both passes
 * take 16 lanes with a masked tail (m + k = 98 is 6 vectors and 2 lanes;
 * as compiled the tail went scalar, so the loops took 256-bit vectors),
 * and all rows' maxima come first, so that their reductions overlap: its
 * share of the layer's samples 12.7 % -> 6.4 % (N = 1024, 1 thread). */
#ifdef __AVX512F__
static inline float row_max(const float *row, int mk)
{
    int nv = mk / 16;
    __mmask16 tm = (__mmask16)((1u << (mk % 16)) - 1u);
    __m512 mx = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tm, row + 16 * nv);
    for (int v = 0; v < nv; v++) mx = _mm512_max_ps(mx, _mm512_loadu_ps(row + 16 * v));
    return _mm512_reduce_max_ps(mx);
}

/* *inv: the row's shift (max times scale) on entry */
static void joint_softmax_row(float *row, float *inv, int mk, float scale)
{
    int nv = mk / 16;
    __mmask16 tm = (__mmask16)((1u << (mk % 16)) - 1u);
    __m512 sc = _mm512_set1_ps(scale);
    __m512 sh = _mm512_set1_ps(*inv);
    __m512 sum = _mm512_setzero_ps(), z = _mm512_setzero_ps(), zero = _mm512_setzero_ps();
    for (int v = 0; v < nv; v++) {
        __m512 x = _mm512_loadu_ps(row + 16 * v);
        __m512 e = exp2_clamped_v16(_mm512_fmsub_ps(x, sc, sh));
        _mm512_storeu_ps(row + 16 * v, e);
        sum = _mm512_add_ps(sum, e);
        z = _mm512_add_ps(z, _mm512_mul_ps(x, zero));
    }
    if (tm) {
        __m512 x = _mm512_maskz_loadu_ps(tm, row + 16 * nv);
        __m512 e = exp2_clamped_v16(_mm512_fmsub_ps(x, sc, sh));
        _mm512_mask_storeu_ps(row + 16 * nv, tm, e);
        sum = _mm512_mask_add_ps(sum, tm, sum, e);
        z = _mm512_add_ps(z, _mm512_mul_ps(x, zero));
    }
    /* z: NaN lanes where the row held a NaN or an infinity (as exp2_sum) */
    *inv = _mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q) ? NAN : 1.0f / _mm512_reduce_add_ps(sum);
}
#elif defined(__AVX2__)
/* v3: the same with 8 lanes, the tails by masked loads and stores (as
 * compiled the tails went scalar and the max was a call a row; the lane
 * helpers are simd_math.h's). */
static inline float row_max(const float *row, int n)
{
    int nv = n / 8, t = n % 8;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int v = 0; v < nv; v++) mx = _mm256_max_ps(mx, _mm256_loadu_ps(row + 8 * v));
    if (t) {
        __m256i tm = tail_mask8(t);
        __m256 x = _mm256_maskload_ps(row + 8 * nv, tm);
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(mx, x, _mm256_castsi256_ps(tm)));
    }
    return hmax8(mx);
}

/* *inv: the row's shift (max times scale) on entry */
static void joint_softmax_row(float *row, float *inv, int mk, float scale)
{
    int nv = mk / 8, t = mk % 8;
    __m256 sc = _mm256_set1_ps(scale), sh = _mm256_set1_ps(*inv);
    __m256 sum = _mm256_setzero_ps(), z = _mm256_setzero_ps(), zero = _mm256_setzero_ps();
    for (int v = 0; v < nv; v++) {
        __m256 x = _mm256_loadu_ps(row + 8 * v);
        __m256 e = exp2_clamped_v8(_mm256_fmsub_ps(x, sc, sh));
        _mm256_storeu_ps(row + 8 * v, e);
        sum = _mm256_add_ps(sum, e);
        z = _mm256_fmadd_ps(x, zero, z);
    }
    if (t) {
        __m256i tm = tail_mask8(t);
        __m256 x = _mm256_maskload_ps(row + 8 * nv, tm); /* 0 past the tail */
        __m256 e = exp2_clamped_v8(_mm256_fmsub_ps(x, sc, sh));
        _mm256_maskstore_ps(row + 8 * nv, tm, e);
        sum = _mm256_add_ps(sum, _mm256_and_ps(e, _mm256_castsi256_ps(tm)));
        z = _mm256_fmadd_ps(x, zero, z);
    }
    /* z: NaN lanes where the row held a NaN or an infinity (as exp2_sum) */
    *inv = _mm256_movemask_ps(_mm256_cmp_ps(z, z, _CMP_UNORD_Q)) ? NAN : 1.0f / hsum8(sum);
}
#else
static inline float row_max(const float *row, int mk) { return MS_SIMD_FN(mita_max)(row, mk); }

/* *inv: the row's shift (max times scale) on entry */
static void joint_softmax_row(float *row, float *inv, int mk, float scale)
{
    *inv = 1.0f / exp2_sum(row, mk, scale, *inv); /* NaN stays NaN */
}
#endif

void MS_SIMD_FN(mita_joint_softmax)(float *lg, int ld, float *inv, float *mass, int e, int nb,
                                    int m, int k, float scale)
{
    int mk = m + k;
    /* all rows' maxima first: their reductions overlap; the shared part's
     * is at e (the route is R's argmax), so only the routed part is
     * searched (the max pass was 2.9 % of the layer's samples on v3, N =
     * 1024, 3 heads; 1.7 % so) */
    for (int r = 0; r < nb; r++) {
        const float *row = lg + (size_t)r * ld;
        float rm = row_max(row + m, k);
        inv[r] = (rm > row[e] ? rm : row[e]) * scale; /* a NaN: exp2_sum's z makes inv NaN */
    }
    for (int r = 0; r < nb; r++) {
        float *row = lg + (size_t)r * ld;
        joint_softmax_row(row, &inv[r], mk, scale);
        if (mass) {
            float l_a = 0.0f;
#pragma omp simd reduction(+ : l_a)
            for (int i = 0; i < m; i++) l_a += row[i];
            mass[r] = l_a * inv[r];
        }
    }
}

float MS_SIMD_FN(mita_exp2_sum)(float *x, int n, float scale, float shift)
{
    return exp2_sum(x, n, scale, shift);
}

/* Kept a loop (GCC would turn it into a memcpy call per row). */
#if defined(__GNUC__) && !defined(__clang__)
#define MITA_NO_MEMCPY __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define MITA_NO_MEMCPY
#endif

/* Rows ahead of the one copied whose lines are asked for: the rows are
 * scattered (queries sorted by expert, a top-k set), which the hardware
 * prefetcher cannot follow; at N = 16384 they come from memory. */
#define MITA_PF_ROWS 8

/* Asks for every line the d floats at x touch, to be read or written (a
 * row not aligned to a line touches one more). A loop over addresses: GCC
 * 12 dropped every prefetch of a loop over t < d followed by one of x[d-1]. */
static inline void prefetch_row(const float *x, int d)
{
    for (uintptr_t a = (uintptr_t)x & ~(uintptr_t)63, e = (uintptr_t)(x + d - 1); a <= e; a += 64)
        __builtin_prefetch((const void *)a, 0, 3);
}

static inline void prefetch_row_w(float *x, int d)
{
    for (uintptr_t a = (uintptr_t)x & ~(uintptr_t)63, e = (uintptr_t)(x + d - 1); a <= e; a += 64)
        __builtin_prefetch((void *)a, 1, 3);
}

MITA_NO_MEMCPY void MS_SIMD_FN(mita_gather_rows)(float *restrict dst, size_t dld,
                                                 const float *restrict src, size_t sld,
                                                 const int32_t *rows, int nr, int d, float f)
{
    for (int r = 0; r < nr; r++) {
        if (r + MITA_PF_ROWS < nr) prefetch_row(src + (size_t)rows[r + MITA_PF_ROWS] * sld, d);
        const float *a = src + (size_t)rows[r] * sld;
        float *b = dst + (size_t)r * dld;
#pragma omp simd
        for (int t = 0; t < d; t++) b[t] = a[t] * f;
    }
}

/* AVX2: 8 rows at a time, 8 x 8 tiles transposed in registers, so that
 * each store writes 8 floats of a column block rather than one (per row
 * it still costs about 1.4x a plain gather's time: perf, N = 1024). */
void MS_SIMD_FN(mita_gather_rows_t)(float *restrict dst, size_t dld, const float *restrict src,
                                     size_t sld, const int32_t *rows, int nr, int d)
{
    int r0 = 0;
#ifdef __AVX2__
    for (; r0 + 8 <= nr; r0 += 8) {
        const float *a[8];
        for (int i = 0; i < 8; i++) a[i] = src + (size_t)rows[r0 + i] * sld;
        for (int i = r0 + MITA_PF_ROWS; i < r0 + 2 * MITA_PF_ROWS && i < nr; i++)
            prefetch_row(src + (size_t)rows[i] * sld, d);
        int t0 = 0;
        for (; t0 + 8 <= d; t0 += 8) {
            __m256 x0 = _mm256_loadu_ps(a[0] + t0), x1 = _mm256_loadu_ps(a[1] + t0);
            __m256 x2 = _mm256_loadu_ps(a[2] + t0), x3 = _mm256_loadu_ps(a[3] + t0);
            __m256 x4 = _mm256_loadu_ps(a[4] + t0), x5 = _mm256_loadu_ps(a[5] + t0);
            __m256 x6 = _mm256_loadu_ps(a[6] + t0), x7 = _mm256_loadu_ps(a[7] + t0);
            __m256 u0 = _mm256_unpacklo_ps(x0, x1), u1 = _mm256_unpackhi_ps(x0, x1);
            __m256 u2 = _mm256_unpacklo_ps(x2, x3), u3 = _mm256_unpackhi_ps(x2, x3);
            __m256 u4 = _mm256_unpacklo_ps(x4, x5), u5 = _mm256_unpackhi_ps(x4, x5);
            __m256 u6 = _mm256_unpacklo_ps(x6, x7), u7 = _mm256_unpackhi_ps(x6, x7);
            __m256 v0 = _mm256_shuffle_ps(u0, u2, 0x44), v1 = _mm256_shuffle_ps(u0, u2, 0xEE);
            __m256 v2 = _mm256_shuffle_ps(u1, u3, 0x44), v3 = _mm256_shuffle_ps(u1, u3, 0xEE);
            __m256 v4 = _mm256_shuffle_ps(u4, u6, 0x44), v5 = _mm256_shuffle_ps(u4, u6, 0xEE);
            __m256 v6 = _mm256_shuffle_ps(u5, u7, 0x44), v7 = _mm256_shuffle_ps(u5, u7, 0xEE);
            float *b = dst + (size_t)t0 * dld + r0;
            _mm256_storeu_ps(b, _mm256_permute2f128_ps(v0, v4, 0x20));
            _mm256_storeu_ps(b + dld, _mm256_permute2f128_ps(v1, v5, 0x20));
            _mm256_storeu_ps(b + 2 * dld, _mm256_permute2f128_ps(v2, v6, 0x20));
            _mm256_storeu_ps(b + 3 * dld, _mm256_permute2f128_ps(v3, v7, 0x20));
            _mm256_storeu_ps(b + 4 * dld, _mm256_permute2f128_ps(v0, v4, 0x31));
            _mm256_storeu_ps(b + 5 * dld, _mm256_permute2f128_ps(v1, v5, 0x31));
            _mm256_storeu_ps(b + 6 * dld, _mm256_permute2f128_ps(v2, v6, 0x31));
            _mm256_storeu_ps(b + 7 * dld, _mm256_permute2f128_ps(v3, v7, 0x31));
        }
        for (; t0 < d; t0++)
            for (int i = 0; i < 8; i++) dst[(size_t)t0 * dld + r0 + i] = a[i][t0];
    }
#endif
    for (; r0 < nr; r0++) {
        const float *a = src + (size_t)rows[r0] * sld;
        for (int t = 0; t < d; t++) dst[(size_t)t * dld + r0] = a[t];
    }
}

void MS_SIMD_FN(mita_scatter_rows_scaled)(float *restrict dst, size_t dld,
                                           const float *restrict src, size_t sld,
                                           const int32_t *rows, const float *f, int nr, int d)
{
    for (int r = 0; r < nr; r++) {
        if (r + MITA_PF_ROWS < nr) prefetch_row_w(dst + (size_t)rows[r + MITA_PF_ROWS] * dld, d);
        const float *a = src + (size_t)r * sld;
        float *b = dst + (size_t)rows[r] * dld, fr = f[r];
#pragma omp simd
        for (int t = 0; t < d; t++) b[t] = a[t] * fr;
    }
}
