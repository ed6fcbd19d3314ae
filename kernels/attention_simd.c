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
