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

/* Sliding windows along an axis of length len (mmseg's slide_inference):
 * windows of win (or the whole axis when shorter) at 0, stride, 2*stride,
 * ..., the last moved back flush with the end. */
MS_HD int slide_windows(int len, int win, int stride)
{
    return len <= win ? 1 : (len - win + stride - 1) / stride + 1;
}
MS_HD int slide_start(int i, int len, int win, int stride)
{
    int s = i * stride;
    if (len <= win) return 0;
    return s + win > len ? len - win : s;
}
/* How many windows cover position y. */
MS_HD int slide_count(int y, int len, int win, int stride)
{
    int n = slide_windows(len, win, stride), cnt = 0, w = len < win ? len : win;
    for (int i = 0; i < n; i++) {
        int s = slide_start(i, len, win, stride);
        cnt += s <= y && y < s + w;
    }
    return cnt;
}

#ifdef __cplusplus
extern "C" {
#endif

/* acc (c, h, w) += win (c, wh, ww) placed at (y0, x0); first: acc is set to
 * win there and to 0 elsewhere (mmseg: preds = 0; preds += pad(window)). */
void window_add_cpu(float *acc, const float *win, int c, int h, int w, int wh, int ww, int y0,
                    int x0, bool first);
/* acc /= number of windows (wh x ww, strides sh, sw) covering each pixel. */
void window_average_cpu(float *acc, int c, int h, int w, int wh, int ww, int sh, int sw);
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
ms_status window_add_cuda(ms_backend *be, float *acc, const float *win, int c, int h, int w,
                          int wh, int ww, int y0, int x0, bool first);
ms_status window_average_cuda(ms_backend *be, float *acc, int c, int h, int w, int wh, int ww,
                              int sh, int sw);
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
