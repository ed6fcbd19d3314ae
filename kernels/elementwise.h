/* Small memory-bound ops: add, transpose, crop, normalize_pad, argmax,
 * softmax_rows; and the softmax arithmetic that attention and MiTA share. */
#ifndef MS_ELEMENTWISE_H
#define MS_ELEMENTWISE_H

#include <math.h>

#include "ops.h"

/* Online softmax. A partial softmax over some logits x_i is kept as its
 * running max m and l = sum exp(x_i - m) (and, by the caller, an accumulator
 * sum exp(x_i - m) v_i). When the max grows from m_old to m_new, everything
 * accumulated so far is multiplied by this factor. m_old = -inf means "empty". */
MS_HD float softmax_rescale(float m_old, float m_new)
{
    return m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
}

/* Merges two partial softmaxes (m1, l1) and (m2, l2) by log-sum-exp: the
 * joint max m, the joint sum l, and the factors c1, c2 by which the two
 * accumulators are scaled before adding (then divide by l). */
MS_HD void softmax_merge(float *m, float *l, float *c1, float *c2,
                         float m1, float l1, float m2, float l2)
{
    float mm = m1 > m2 ? m1 : m2;
    *c1 = softmax_rescale(m1, mm);
    *c2 = softmax_rescale(m2, mm);
    *m = mm;
    *l = l1 * *c1 + l2 * *c2;
}

/* Index of the first maximum of x[0], x[stride], ... (ties: lowest index). */
MS_HD int argmax_first(const float *x, int n, long stride)
{
    int best = 0;
    float bv = x[0];
    for (int i = 1; i < n; i++) {
        float v = x[(long)i * stride];
        if (v > bv) {
            bv = v;
            best = i;
        }
    }
    return best;
}

/* Image normalisation of one value, as torchvision Normalize. */
MS_HD float normalize_value(float x, float mean, float stdv) { return (x - mean) / stdv; }

#ifdef __cplusplus
extern "C" {
#endif

void add_cpu(float *out /* (n) */, const float *a /* (n) */, const float *b /* (n) */, size_t n);
void transpose_cpu(float *out /* (cols, rows) */, const float *in /* (rows, cols) */, int rows,
                   int cols);
/* Stable: subtracts the row max before exp. */
void softmax_rows_cpu(float *x /* (rows, cols) */, int rows, int cols);
void crop_cpu(float *out /* (c, ho, wo) */, const float *in /* (c, h, w) */, int c, int h, int w,
              int ho, int wo);
void argmax_cpu(uint8_t *out /* (h, w) */, const float *in /* (c, h, w) */, int c, int h, int w);
void normalize_pad_cpu(float *out /* (3, hp, wp) */, const float *in /* (3, h, w) */, int h,
                       int w, int hp, int wp, const float mean[3], const float stdv[3]);

#ifdef MS_HAVE_CUDA
ms_status add_cuda(ms_backend *be, float *out /* (n) */, const float *a /* (n) */,
                   const float *b /* (n) */, size_t n);
ms_status transpose_cuda(ms_backend *be, float *out /* (cols, rows) */,
                         const float *in /* (rows, cols) */, int rows, int cols);
ms_status softmax_rows_cuda(ms_backend *be, float *x /* (rows, cols) */, int rows, int cols);
ms_status crop_cuda(ms_backend *be, float *out /* (c, ho, wo) */, const float *in /* (c, h, w) */,
                    int c, int h, int w, int ho, int wo);
ms_status argmax_cuda(ms_backend *be, uint8_t *out /* (h, w) */, const float *in /* (c, h, w) */,
                      int c, int h, int w);
ms_status normalize_pad_cuda(ms_backend *be, float *out /* (3, hp, wp) */,
                             const float *in /* (3, h, w) */, int h, int w, int hp, int wp,
                             const float mean[3], const float stdv[3]);
#endif

#ifdef __cplusplus
}
#endif
#endif
