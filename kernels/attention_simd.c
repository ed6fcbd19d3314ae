/* Built once per CPU path (cpu_path.h): plain C loops the compiler
 * vectorises for the path's instruction set; exp is vmath's (libmvec). */
#include <math.h>

#include "attention_simd.h"
#include "elementwise.h" /* softmax_rescale */
#include "vmath.h"

bool MS_SIMD_FN(attn_tile_softmax)(float *tile /* (nq, nk) */, int nq, int nk, float *m /* (nq) */,
                                   float *l /* (nq) */, float *corr /* (nq) */)
{
    bool rescale = false;
    for (int i = 0; i < nq; i++) {
        float *row = tile + (size_t)i * nk;
        /* a compare-select, not fmaxf: it vectorises without -ffast-math */
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < nk; j++) mx = row[j] > mx ? row[j] : mx;
        float m_new = m[i] > mx ? m[i] : mx;
        corr[i] = softmax_rescale(m[i], m_new);
        rescale |= corr[i] != 1.0f;
        /* a row all -inf so far: exp(-inf - 0) = 0 keeps it empty, not NaN */
        float shift = m_new == -INFINITY ? 0.0f : m_new;
        l[i] = l[i] * corr[i] + MS_SIMD_FN(vm_exp_sum)(row, nk, 1.0f, shift);
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
