/* Built once per CPU path (cpu_path.h): plain C loops the compiler
 * vectorises for the path's instruction set. */
#include <math.h>
#include <stdint.h>

#include "attention_simd.h"

/* Bits of -127.0f. */
#define EXP2_LOW_BITS 0xC2FE0000u

/* 2^x for x <= 0 (a logit in log2 units minus its row's max), inlined so
 * the row loop vectorises into straight-line code (libmvec's expf, called
 * per vector, was three quarters of the softmax's time and a fifth of the
 * whole op's; this is 17 vector instructions). x = n + f, n an integer and
 * |f| <= 1/2 exactly; 2^f by a degree-6 polynomial (fitted for relative error
 * on [-1/2, 1/2]: 1e-7, under 2 ulp with float rounding); 2^n put into the
 * exponent bits. Below -126.5 (and at -inf) it returns 0, where exp2f is
 * below 1.7e-38.
 * The clamp is an integer min on the bits (for x <= 0, read as unsigned,
 * they grow with |x|): a float select would not vectorise without
 * -fno-trapping-math, and at n = -127 the exponent bits make 2^n = 0. */
static inline float exp2_nonpos(float x)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = x};
    v.u = v.u < EXP2_LOW_BITS ? v.u : EXP2_LOW_BITS;
    /* round to nearest by adding and taking away 1.5 * 2^23 (plain float
     * adds; rintf has no vector form before SSE4.1) */
    float n = (v.f + 12582912.0f) - 12582912.0f;
    float f = v.f - n;
    float p = 1.5353361960e-4f;
    p = p * f + 1.3398875017e-3f;
    p = p * f + 9.6184369177e-3f;
    p = p * f + 5.5503323674e-2f;
    p = p * f + 2.4022647738e-1f;
    p = p * f + 6.9314718246e-1f;
    p = p * f + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

float MS_SIMD_FN(attn_exp2_sum)(float *x /* (n) */, int n, float shift)
{
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) {
        float e = exp2_nonpos(x[i] - shift);
        x[i] = e;
        sum += e;
    }
    return sum;
}

/* max of x[0..n) (-inf for n = 0, NaN ignored). Four independent running
 * maxima over the row's quarters: one chain of dependent vector maxes per
 * vector was a third of the exp's time. A compare-select, not fmaxf, so it
 * vectorises without -ffast-math. */
static float row_max(const float *x /* (n) */, int n)
{
    int q = n / 4;
    const float *x1 = x + q, *x2 = x + 2 * q, *x3 = x + 3 * q;
    float m0 = -INFINITY, m1 = -INFINITY, m2 = -INFINITY, m3 = -INFINITY;
#pragma omp simd reduction(max : m0, m1, m2, m3)
    for (int j = 0; j < q; j++) {
        m0 = x[j] > m0 ? x[j] : m0;
        m1 = x1[j] > m1 ? x1[j] : m1;
        m2 = x2[j] > m2 ? x2[j] : m2;
        m3 = x3[j] > m3 ? x3[j] : m3;
    }
    for (int j = 4 * q; j < n; j++) m0 = x[j] > m0 ? x[j] : m0;
    m0 = m1 > m0 ? m1 : m0;
    m2 = m3 > m2 ? m3 : m2;
    return m2 > m0 ? m2 : m0;
}

bool MS_SIMD_FN(attn_tile_softmax)(float *tile /* (nq, nk) */, int nq, int nk, float *m /* (nq) */,
                                   float *l /* (nq) */, float *corr /* (nq) */)
{
    bool rescale = false;
    for (int i = 0; i < nq; i++) {
        float *row = tile + (size_t)i * nk;
        float mx = row_max(row, nk);
        float m_new = m[i] > mx ? m[i] : mx;
        corr[i] = m[i] == -INFINITY ? 0.0f : exp2f(m[i] - m_new);
        rescale |= corr[i] != 1.0f;
        /* a row all -inf so far: exp(-inf - 0) = 0 keeps it empty, not NaN */
        float shift = m_new == -INFINITY ? 0.0f : m_new;
        l[i] = l[i] * corr[i] + MS_SIMD_FN(attn_exp2_sum)(row, nk, shift);
        m[i] = m_new;
    }
    return rescale;
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
