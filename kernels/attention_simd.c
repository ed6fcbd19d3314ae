/* Built once per CPU path (cpu_path.h): plain C loops the compiler
 * vectorises for the path's instruction set. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "attention_simd.h"
#include "simd_math.h" /* exp2_clamped */

float MS_SIMD_FN(attn_exp2_sum)(float *x /* (n) */, int n, float shift)
{
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) {
        float e = exp2_clamped(x[i] - shift);
        x[i] = e;
        sum += e;
    }
    return sum;
}

/* x = 2^(x - shift) and the max of the old x, in one pass; returns the sum
 * of the new x, meaningful only where that max is at most shift + 126 and
 * *finite is true (no x was NaN or infinite: the sum of x * 0 is 0 then,
 * NaN otherwise, one FMA per vector; a NaN of either sign must be seen, and
 * the compare-select max skips NaN). */
static float exp2_sum_max(float *x /* (n) */, int n, float shift, float *max, bool *finite)
{
    float sum = 0.0f, mx = -INFINITY, zero = 0.0f;
#pragma omp simd reduction(+ : sum, zero) reduction(max : mx)
    for (int i = 0; i < n; i++) {
        mx = x[i] > mx ? x[i] : mx;
        zero += x[i] * 0.0f;
        float e = exp2_clamped(x[i] - shift);
        x[i] = e;
        sum += e;
    }
    *max = mx;
    *finite = zero == 0.0f;
    return sum;
}

/* max of x[0..n) (-inf for n = 0, NaN ignored); *nan: whether any x is
 * NaN. Four independent running maxima over the row's quarters: one chain
 * of dependent vector maxes per vector was a third of the exp's time. A
 * compare-select, not fmaxf, so it vectorises without -ffast-math. */
static float row_max(const float *x /* (n) */, int n, bool *nan)
{
    int q = n / 4, bad = 0;
    const float *x1 = x + q, *x2 = x + 2 * q, *x3 = x + 3 * q;
    float m0 = -INFINITY, m1 = -INFINITY, m2 = -INFINITY, m3 = -INFINITY;
#pragma omp simd reduction(max : m0, m1, m2, m3) reduction(| : bad)
    for (int j = 0; j < q; j++) {
        m0 = x[j] > m0 ? x[j] : m0;
        m1 = x1[j] > m1 ? x1[j] : m1;
        m2 = x2[j] > m2 ? x2[j] : m2;
        m3 = x3[j] > m3 ? x3[j] : m3;
        bad |= (x[j] != x[j]) | (x1[j] != x1[j]) | (x2[j] != x2[j]) | (x3[j] != x3[j]);
    }
    for (int j = 4 * q; j < n; j++) {
        m0 = x[j] > m0 ? x[j] : m0;
        bad |= x[j] != x[j];
    }
    *nan = bad != 0;
    m0 = m1 > m0 ? m1 : m0;
    m2 = m3 > m2 ? m3 : m2;
    return m2 > m0 ? m2 : m0;
}

void MS_SIMD_FN(attn_row_softmax)(float *row /* (nk) */, int nk, float *m, float *l, float *corr)
{
    bool nan;
    float mx = row_max(row, nk, &nan);
    float m_new = *m > mx ? *m : mx;
    *corr = *m == -INFINITY ? 0.0f : exp2f(*m - m_new);
    /* a row all -inf so far: 2^(-inf - 0) = 0 keeps it empty, not NaN */
    float shift = m_new == -INFINITY ? 0.0f : m_new;
    *l = *l * *corr + MS_SIMD_FN(attn_exp2_sum)(row, nk, shift);
    *m = m_new;
    if (nan) *l = NAN; /* the query's output is NaN, as the plain softmax's */
}

int MS_SIMD_FN(attn_tile_softmax)(float *tile /* (nq, nk) */, int nq, int nk, float *m /* (nq) */,
                                  float *l /* (nq) */, float *corr /* (nq) */)
{
    int left = 0;
    for (int i = 0; i < nq; i++) {
        float *row = tile + (size_t)i * nk;
        /* the reference: the running one, or on a row's first tile the max
         * of its first 16 values (a full max pass first costs a third of
         * the exponentials' time); if neither is finite, the two passes */
        float ref = m[i];
        if (ref == -INFINITY)
            for (int j = 0; j < nk && j < 16; j++) ref = row[j] > ref ? row[j] : ref;
        if (ref == -INFINITY || ref != ref) {
            MS_SIMD_FN(attn_row_softmax)(row, nk, &m[i], &l[i], &corr[i]);
            continue;
        }
        /* exponentials against the reference and the tile's max in the same
         * pass. Up to 2^64 the values stay as they are (floats keep their
         * relative precision; sums of 2^64 times any N stay finite), so the
         * reference, the sum and the output row stay put: after the first
         * tile that is nearly every row. */
        float mx;
        bool finite;
        float sum = exp2_sum_max(row, nk, ref, &mx, &finite);
        if (mx <= ref + 64.0f && finite) {
            corr[i] = m[i] == -INFINITY ? 0.0f : 1.0f; /* empty before: nothing to keep */
            l[i] += sum;
            m[i] = ref;
        } else {
            /* a max far above the reference, or a NaN or infinite logit:
             * the caller recomputes the row's logits for the two-pass
             * attn_row_softmax */
            corr[i] = NAN;
            left++;
        }
    }
    return left;
}

void MS_SIMD_FN(attn_scale_rows)(float *x /* (rows, cols), row stride ld */, int rows, int cols,
                                 long ld, const float *f /* (rows) */)
{
    for (int i = 0; i < rows; i++) {
        float fi = f[i];
        if (fi == 1.0f) continue;
        float *xi = x + (size_t)i * ld;
#pragma omp simd
        for (int j = 0; j < cols; j++) xi[j] *= fi;
    }
}

/* ---- The fused kernel (x86-64-v4 and v3): attention_simd.h, attn_fused_rows. ----
 * Why: OpenBLAS on these shapes (k = d = 64 for the scores, n = d for
 * tile @ V) spent 14 % of the time packing operands, the score tile made
 * a second trip through memory for the exponentials, and beta = 0 cleared
 * it first. Here the keys are transposed once per call (K^T in 64-key
 * chunks); a chunk of K^T (or of V) stays in L1 while every 6-query block
 * of the query block passes over it, holding a 6 x 64 block of logits (or
 * a 6 x d block of outputs) in 24 registers; the tile's max comes from the
 * logits' registers. Each output depends only on its own query and the key
 * tiles, never on query blocks or threads. */
#define FUSED_ROWS 6   /* queries per register block */
#define FUSED_CHUNK 64 /* keys per register block (4 vectors) */
#define UNROLL _Pragma("GCC unroll 8")

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define ATTN_FUSED 1
#endif

bool MS_SIMD_FN(attn_fused_has)(int d)
{
#ifdef ATTN_FUSED
    return d == 32 || d == 64 || d == 128;
#else
    (void)d;
    return false;
#endif
}

void MS_SIMD_FN(attn_pack_kt)(float *kt /* (d, 64) */, const float *qkv /* (n, 3c) */, int n,
                              int c, int d, int h, int chunk)
{
    const float *k = qkv + c + (size_t)h * d;
    for (int jj = 0; jj < FUSED_CHUNK; jj++) {
        int j = chunk * FUSED_CHUNK + jj;
        const float *kj = k + (size_t)j * 3 * c;
        for (int t = 0; t < d; t++) kt[t * FUSED_CHUNK + jj] = j < n ? kj[t] : 0.0f;
    }
}

#ifdef ATTN_FUSED
/* A tile row's shift: its exact max tmx joins the running max *m (updated
 * here), *corr the rescale of the row's output so far; +inf sets *bad. */
static float fused_row_shift(float tmx, float *m, float *corr, float *bad)
{
    float mn = *m > tmx ? *m : tmx;
    /* +inf: 2^(inf - inf), the plain softmax's NaN for the whole row */
    if (mn == INFINITY) *bad = 1.0f;
    float shift = mn == -INFINITY || mn == INFINITY ? 0.0f : mn;
    *corr = *m == -INFINITY ? 0.0f : exp2_clamped(*m - shift);
    *m = mn;
    return shift;
}
#endif

#if defined(__AVX512F__)
#define AINLINE static inline __attribute__((always_inline))

/* Logits of R queries against one chunk of 64 keys (nv of them real):
 * p[r][0..64) = s q_r . k_j, -inf past nv; each row's vector max (NaN
 * ignored) and a NaN flag updated. */
AINLINE void fused_scores(float *p /* (R, ldp) */, int ldp, const float *q /* (R, d), ldq */,
                          size_t ldq, const float *ktc /* (d, 64) */, int d, float s, int nv,
                          float *vmax /* (R, 16) */, float *bad /* (R) */, const int R)
{
    __m512 acc[FUSED_ROWS][4];
    UNROLL for (int r = 0; r < R; r++)
        UNROLL for (int v = 0; v < 4; v++) acc[r][v] = _mm512_setzero_ps();
    for (int t = 0; t < d; t++) {
        const float *kr = ktc + (size_t)t * FUSED_CHUNK;
        __m512 k0 = _mm512_loadu_ps(kr), k1 = _mm512_loadu_ps(kr + 16);
        __m512 k2 = _mm512_loadu_ps(kr + 32), k3 = _mm512_loadu_ps(kr + 48);
        UNROLL for (int r = 0; r < R; r++) {
            __m512 qb = _mm512_set1_ps(q[(size_t)r * ldq + t]);
            acc[r][0] = _mm512_fmadd_ps(qb, k0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(qb, k1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(qb, k2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(qb, k3, acc[r][3]);
        }
    }
    const __m512 sv = _mm512_set1_ps(s), ninf = _mm512_set1_ps(-INFINITY);
    UNROLL for (int r = 0; r < R; r++) {
        __m512 mx = _mm512_loadu_ps(vmax + 16 * r);
        __mmask16 nan = 0;
        UNROLL for (int v = 0; v < 4; v++) {
            int left = nv - 16 * v;
            __mmask16 live = left >= 16  ? (__mmask16)0xFFFF
                             : left <= 0 ? (__mmask16)0
                                         : (__mmask16)((1u << left) - 1u);
            __m512 x = _mm512_mask_blend_ps(live, ninf, _mm512_mul_ps(acc[r][v], sv));
            _mm512_storeu_ps(p + (size_t)r * ldp + 16 * v, x);
            nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
            mx = _mm512_max_ps(x, mx); /* a NaN x leaves mx as it was */
        }
        _mm512_storeu_ps(vmax + 16 * r, mx);
        if (nan) bad[r] = 1.0f;
    }
}

/* o[r] = corr[r] o[r] + p[r] @ V over nk keys (corr NULL: 1); v holds the
 * keys' value rows, stride ldv. */
AINLINE void fused_pv(float *o /* (R, d), ldo */, size_t ldo, const float *corr /* (R) */,
                      const float *p /* (R, ldp) */, int ldp, const float *v /* (nk, ldv) */,
                      size_t ldv, int nk, const int R, const int DV)
{
    __m512 acc[FUSED_ROWS][8];
    UNROLL for (int r = 0; r < R; r++) {
        __m512 cr = _mm512_set1_ps(corr ? corr[r] : 1.0f);
        UNROLL for (int u = 0; u < DV; u++)
            acc[r][u] = _mm512_mul_ps(cr, _mm512_loadu_ps(o + (size_t)r * ldo + 16 * u));
    }
    for (int j = 0; j < nk; j++) {
        const float *vj = v + (size_t)j * ldv;
        __m512 vv[8];
        UNROLL for (int u = 0; u < DV; u++) vv[u] = _mm512_loadu_ps(vj + 16 * u);
        UNROLL for (int r = 0; r < R; r++) {
            __m512 pb = _mm512_set1_ps(p[(size_t)r * ldp + j]);
            UNROLL for (int u = 0; u < DV; u++) acc[r][u] = _mm512_fmadd_ps(pb, vv[u], acc[r][u]);
        }
    }
    UNROLL for (int r = 0; r < R; r++)
        UNROLL for (int u = 0; u < DV; u++)
            _mm512_storeu_ps(o + (size_t)r * ldo + 16 * u, acc[r][u]);
}

/* Rows per block of the output product: at most 24 accumulators. */
static int fused_pv_rows(int d) { return d == 128 ? 3 : FUSED_ROWS; }

#define FUSED_PV_CASE(R, DV) \
    case (R) * 16 + (DV): fused_pv(o, ldo, corr, p, ldp, v, ldv, nk, R, DV); break
static void fused_pv_block(float *o, size_t ldo, const float *corr, const float *p, int ldp,
                           const float *v, size_t ldv, int nk, int R, int d)
{
    switch (R * 16 + d / 16) {
        FUSED_PV_CASE(1, 2); FUSED_PV_CASE(2, 2); FUSED_PV_CASE(3, 2);
        FUSED_PV_CASE(4, 2); FUSED_PV_CASE(5, 2); FUSED_PV_CASE(6, 2);
        FUSED_PV_CASE(1, 4); FUSED_PV_CASE(2, 4); FUSED_PV_CASE(3, 4);
        FUSED_PV_CASE(4, 4); FUSED_PV_CASE(5, 4); FUSED_PV_CASE(6, 4);
        FUSED_PV_CASE(1, 8); FUSED_PV_CASE(2, 8); FUSED_PV_CASE(3, 8);
    default: break;
    }
}

/* Row r of a tile: its exact max joins the running one, the logits become
 * weights 2^(x - max) (0 past nk), and the running sum and the rescale of
 * the row's output so far follow. */
static void fused_row_softmax(float *row /* (nk) */, int nk, const float *vmax /* (16) */,
                              float *m, float *l, float *corr, float *bad)
{
    float shift = fused_row_shift(_mm512_reduce_max_ps(_mm512_loadu_ps(vmax)), m, corr, bad);
    const __m512 sh = _mm512_set1_ps(shift);
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < nk; j += 16) {
        /* the vector exp2 of -inf is 2^-127, not 0: mask the tail */
        __mmask16 live =
            nk - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nk - j)) - 1u);
        __m512 e = _mm512_maskz_mov_ps(
            live, exp2_clamped_v16(_mm512_sub_ps(_mm512_loadu_ps(row + j), sh)));
        _mm512_storeu_ps(row + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    *l = *l * *corr + _mm512_reduce_add_ps(sum);
}
#elif defined(ATTN_FUSED)
/* v3 (AVX2 + FMA, 16 registers of 8 lanes): the same kernel in smaller
 * register blocks. Logits: 6 queries x 16 keys (12 accumulators), the 64-key
 * chunk in four such steps, those wholly past the last key skipped;
 * outputs: 6 queries x 16 columns likewise, the head's d in blocks of 16.
 * The tile's max is kept in 8 of the 16 lanes per row. */
#define AINLINE static inline __attribute__((always_inline))
#define FUSED_SUB 16 /* keys per logits block */

AINLINE void fused_scores(float *p /* (R, ldp) */, int ldp, const float *q /* (R, d), ldq */,
                          size_t ldq, const float *ktc /* (d, 64) */, int d, float s, int nv,
                          float *vmax /* (R, 16) */, float *bad /* (R) */, const int R)
{
    const __m256 sv = _mm256_set1_ps(s), ninf = _mm256_set1_ps(-INFINITY);
    __m256 mx[FUSED_ROWS];
    int nan[FUSED_ROWS];
    UNROLL for (int r = 0; r < R; r++) {
        mx[r] = _mm256_loadu_ps(vmax + 16 * r);
        nan[r] = 0;
    }
    for (int sc = 0; sc < FUSED_CHUNK && sc < nv; sc += FUSED_SUB) {
        __m256 acc[FUSED_ROWS][2];
        UNROLL for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int t = 0; t < d; t++) {
            const float *kr = ktc + (size_t)t * FUSED_CHUNK + sc;
            __m256 k0 = _mm256_loadu_ps(kr), k1 = _mm256_loadu_ps(kr + 8);
            UNROLL for (int r = 0; r < R; r++) {
                __m256 qb = _mm256_set1_ps(q[(size_t)r * ldq + t]);
                acc[r][0] = _mm256_fmadd_ps(qb, k0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(qb, k1, acc[r][1]);
            }
        }
        UNROLL for (int v = 0; v < 2; v++) {
            int left = nv - sc - 8 * v;
            __m256 live = _mm256_castsi256_ps(tail_mask8(left < 8 ? left : 8));
            UNROLL for (int r = 0; r < R; r++) {
                __m256 x = _mm256_blendv_ps(ninf, _mm256_mul_ps(acc[r][v], sv), live);
                _mm256_storeu_ps(p + (size_t)r * ldp + sc + 8 * v, x);
                nan[r] |= _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
                mx[r] = _mm256_max_ps(x, mx[r]); /* a NaN x leaves mx as it was */
            }
        }
    }
    UNROLL for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(vmax + 16 * r, mx[r]);
        if (nan[r]) bad[r] = 1.0f;
    }
}

/* o[r][0..16) = corr[r] o[r] + p[r] @ V over nk keys (corr NULL: 1): the
 * logits' block turned round, 6 queries x 16 columns in 12 accumulators. */
AINLINE void fused_pv(float *o /* (R, 16), ldo */, size_t ldo, const float *corr /* (R) */,
                      const float *p /* (R, ldp) */, int ldp, const float *v /* (nk, ldv) */,
                      size_t ldv, int nk, const int R)
{
    __m256 acc[FUSED_ROWS][2];
    UNROLL for (int r = 0; r < R; r++) {
        __m256 cr = _mm256_set1_ps(corr ? corr[r] : 1.0f);
        UNROLL for (int u = 0; u < 2; u++)
            acc[r][u] = _mm256_mul_ps(cr, _mm256_loadu_ps(o + (size_t)r * ldo + 8 * u));
    }
    for (int j = 0; j < nk; j++) {
        const float *vj = v + (size_t)j * ldv;
        __m256 v0 = _mm256_loadu_ps(vj), v1 = _mm256_loadu_ps(vj + 8);
        UNROLL for (int r = 0; r < R; r++) {
            __m256 pb = _mm256_set1_ps(p[(size_t)r * ldp + j]);
            acc[r][0] = _mm256_fmadd_ps(pb, v0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(pb, v1, acc[r][1]);
        }
    }
    UNROLL for (int r = 0; r < R; r++)
        UNROLL for (int u = 0; u < 2; u++)
            _mm256_storeu_ps(o + (size_t)r * ldo + 8 * u, acc[r][u]);
}

static int fused_pv_rows(int d) { return (void)d, FUSED_ROWS; }

#define FUSED_PV_CASE(R) \
    case R: fused_pv(o + c0, ldo, corr, p, ldp, v + c0, ldv, nk, R); break
static void fused_pv_block(float *o, size_t ldo, const float *corr, const float *p, int ldp,
                           const float *v, size_t ldv, int nk, int R, int d)
{
    for (int c0 = 0; c0 < d; c0 += 16) {
        switch (R) {
            FUSED_PV_CASE(1); FUSED_PV_CASE(2); FUSED_PV_CASE(3);
            FUSED_PV_CASE(4); FUSED_PV_CASE(5); FUSED_PV_CASE(6);
        default: break;
        }
    }
}

/* As the v4 one, with 8 lanes. */
static void fused_row_softmax(float *row /* (nk) */, int nk, const float *vmax /* (16) */,
                              float *m, float *l, float *corr, float *bad)
{
    float shift = fused_row_shift(hmax8(_mm256_loadu_ps(vmax)), m, corr, bad);
    const __m256 sh = _mm256_set1_ps(shift);
    __m256 sum = _mm256_setzero_ps();
    /* lanes past nk hold -inf (fused_scores' 16-key steps), whose
     * exp2_clamped_v8 is 0 exactly: no mask (v4's scalef gives 2^-127) */
    for (int j = 0; j < nk; j += 8) {
        __m256 e = exp2_clamped_v8(_mm256_sub_ps(_mm256_loadu_ps(row + j), sh));
        _mm256_storeu_ps(row + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    *l = *l * *corr + hsum8(sum);
}
#endif

#ifdef ATTN_FUSED
/* The register blocks' shapes as compile-time constants, so that acc[][]
 * lives in registers. */
#define FUSED_SCORES_CASE(R) \
    case R: fused_scores(p, ldp, q, ldq, ktc, d, s, nv, vmax, bad, R); break
static void fused_scores_rows(float *p, int ldp, const float *q, size_t ldq, const float *ktc,
                              int d, float s, int nv, float *vmax, float *bad, int R)
{
    switch (R) {
        FUSED_SCORES_CASE(1); FUSED_SCORES_CASE(2); FUSED_SCORES_CASE(3);
        FUSED_SCORES_CASE(4); FUSED_SCORES_CASE(5); FUSED_SCORES_CASE(6);
    default: break;
    }
}
#endif

void MS_SIMD_FN(attn_fused_rows)(float *out /* (n, c) */, const float *qkv /* (n, 3c) */,
                                 const float *kt /* (n / 64 chunks, d, 64) */, int n, int c,
                                 int d, int h, int q0, int nq, int kb,
                                 float *ws /* (ATTN_FUSED_WS_FLOATS(nq, kb)) */)
{
#ifdef ATTN_FUSED
    const size_t ld = 3 * (size_t)c;
    const float s = 1.44269504088896341f / sqrtf((float)d); /* log2 units, as attention_block */
    const int pvr = fused_pv_rows(d);
    float *p = ws;                          /* (nq, kb) logits, then weights */
    float *vmax = p + (size_t)nq * kb;      /* (nq, 16) the tile's max, by lane */
    float *m = vmax + (size_t)nq * 16;      /* (nq) running max */
    float *l = m + nq;                      /* (nq) running sum of 2^(x - m) */
    float *corr = l + nq;                   /* (nq) this tile's rescale of the output */
    float *bad = corr + nq;                 /* (nq) 1: a NaN or +inf logit */
    const float *q = qkv + (size_t)q0 * ld + (size_t)h * d;     /* (nq, d), ld */
    const float *vh = qkv + 2 * (size_t)c + (size_t)h * d;      /* (n, d), ld */
    float *o = out + (size_t)q0 * c + (size_t)h * d;            /* (nq, d), c */
    for (int i = 0; i < nq; i++) {
        m[i] = -INFINITY;
        l[i] = bad[i] = 0.0f;
#pragma omp simd
        for (int t = 0; t < d; t++) o[(size_t)i * c + t] = 0.0f;
    }
    for (int k0 = 0; k0 < n; k0 += kb) {
        int nk = n - k0 < kb ? n - k0 : kb;
#pragma omp simd
        for (int i = 0; i < nq * 16; i++) vmax[i] = -INFINITY;
        for (int j = 0; j < nk; j += FUSED_CHUNK) {
            const float *ktc = kt + (size_t)((k0 + j) / FUSED_CHUNK) * d * FUSED_CHUNK;
            for (int g = 0; g < nq; g += FUSED_ROWS)
                fused_scores_rows(p + (size_t)g * kb + j, kb, q + (size_t)g * ld, ld, ktc, d, s,
                                  nk - j, vmax + (size_t)g * 16, bad + g,
                                  nq - g < FUSED_ROWS ? nq - g : FUSED_ROWS);
        }
        for (int i = 0; i < nq; i++)
            fused_row_softmax(p + (size_t)i * kb, nk, vmax + (size_t)i * 16, &m[i], &l[i],
                              &corr[i], &bad[i]);
        for (int j = 0; j < nk; j += FUSED_CHUNK) {
            int nc = nk - j < FUSED_CHUNK ? nk - j : FUSED_CHUNK;
            for (int g = 0; g < nq; g += pvr)
                fused_pv_block(o + (size_t)g * c, (size_t)c, j == 0 ? corr + g : NULL,
                               p + (size_t)g * kb + j, kb, vh + (size_t)(k0 + j) * ld, ld, nc,
                               nq - g < pvr ? nq - g : pvr, d);
        }
    }
    for (int i = 0; i < nq; i++) {
        /* every logit -inf: NaN, as the plain softmax's 0 / 0 */
        float inv = bad[i] != 0.0f || m[i] == -INFINITY ? NAN : 1.0f / l[i];
#pragma omp simd
        for (int t = 0; t < d; t++) o[(size_t)i * c + t] *= inv;
    }
#else
    (void)out, (void)qkv, (void)kt, (void)n, (void)c, (void)d, (void)h, (void)q0, (void)nq;
    (void)kb, (void)ws;
#endif
}
