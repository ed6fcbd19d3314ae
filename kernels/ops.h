/* Backend-neutral ops: each dispatches to <op>_cpu (kernels/<op>.c) or
 * <op>_cuda (kernels/<op>.cu) by be->device, and returns MS_OK at once when
 * be->dry_run is set (arena sizing pass). All pointers live on be's device.
 * Layouts: token matrices are row-major (N, C); feature maps are (C, H, W). */
#ifndef MS_OPS_H
#define MS_OPS_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MS_ACT_NONE = 0, MS_ACT_RELU = 1, MS_ACT_GELU = 2 } ms_act;

/* Linear layer: out = act(in @ w^T + b), or with residual: out += in @ w^T + b
 * (act must then be NONE). b may be NULL. On CUDA outside FP32 mode the
 * context caches a BF16 copy of w by address: weights must not change while
 * the context lives (cuda_ctx_forget_weights drops the copies). */
ms_status op_linear(ms_backend *be,
                    float *out,        /* (n, cout) */
                    const float *in,   /* (n, cin) */
                    const float *w,    /* (cout, cin) */
                    const float *b,    /* (cout) or NULL */
                    int n, int cin, int cout, ms_act act, bool residual);

/* LayerNorm over the last dim, biased variance, (x-mean)/sqrt(var+eps)*w+b. */
ms_status op_layernorm(ms_backend *be, float *out /* (n, c) */, const float *in /* (n, c) */,
                       const float *w /* (c) */, const float *b /* (c) */,
                       int n, int c, float eps);

/* out[i] = a[i] + b[i]; out may alias a. */
ms_status op_add(ms_backend *be, float *out /* (n) */, const float *a /* (n) */,
                 const float *b /* (n) */, size_t n);

/* out = in^T. */
ms_status op_transpose(ms_backend *be, float *out /* (cols, rows) */,
                       const float *in /* (rows, cols) */, int rows, int cols);

/* Row-wise softmax in place. */
ms_status op_softmax_rows(ms_backend *be, float *x /* (rows, cols) */, int rows, int cols);

/* Full multi-head attention, streaming softmax over key blocks so no more than
 * a block of the (n, n) scores exists at once. qkv rows: [q | k | v], heads
 * contiguous within each part (head h uses channels h*d .. h*d+d-1). */
ms_status op_attention_full(ms_backend *be, float *out /* (n, c) */,
                            const float *qkv /* (n, 3c) */, int n, int c, int heads);

typedef struct {
    int gh, gw;            /* landmark grid, already clamped to the token grid */
    int topk;              /* already clamped to n (all tokens, class token included) */
    bool shared_scale_d;   /* true: shared logit q.l/d; false: q.l/sqrt(d) */
    int ncls;              /* tokens before the grid: 1 with a class token, else 0 */
} ms_mita_params;

/* What a MiTA layer records for the viewer; any pointer may be NULL.
 * Positions are numbered as mita-spec 2.7 reports them: grid tokens 0..N-1,
 * the class token (if any) N, so n = N + ncls entries. */
typedef struct {
    int32_t *topk_idx;     /* (heads, M, k): expert m's routed positions, by descending score */
    int32_t *route;        /* (heads, n): expert chosen by each query */
    float *shared_mass;    /* (heads, n): softmax mass on the M shared summaries */
} ms_mita_record;

/* MiTA attention (spec section 2), all steps, for one layer. The sequence is
 * n = p->ncls + hp*wp tokens, the class token (if any) first; the landmarks
 * pool the grid tokens only (spec 2.7). rec may be NULL (no recording, no
 * cost). */
ms_status op_mita(ms_backend *be, float *out /* (n, c) */,
                  const float *qkv /* (n, 3c) */, int hp, int wp, int c, int heads,
                  const ms_mita_params *p, const ms_mita_record *rec);

/* Makes ahead what op_mita's CPU path would otherwise make on first use
 * (the small-product kernels of its routed blocks): for a plan step,
 * once a size, out of the per-image path. Nothing on CUDA. */
void op_mita_prepare(const ms_backend *be, int c, int heads, const ms_mita_params *p);

/* Adaptive average pooling with PyTorch windows: start=floor(i*S/G),
 * end=ceil((i+1)*S/G). */
ms_status op_adaptive_avgpool(ms_backend *be, float *out /* (c, gh, gw) */,
                              const float *in /* (c, h, w) */, int c, int h, int w,
                              int gh, int gw);

/* 2D convolution, zero padding, dilation 1: out = act(conv(in, w) + b). */
ms_status op_conv2d(ms_backend *be, float *out /* (co, ho, wo) */,
                    const float *in /* (ci, h, w) */, const float *w /* (co, ci, kh, kw) */,
                    const float *b /* (co) or NULL */, int ci, int h, int wd, int co,
                    int kh, int kw, int stride, int pad, ms_act act);

/* 2x2 stride-2 transposed conv (PyTorch weight layout), out = act(y + b). */
ms_status op_conv_transpose2x2(ms_backend *be, float *out /* (co, 2h, 2w) */,
                               const float *in /* (ci, h, w) */,
                               const float *w /* (ci, co, 2, 2) */, const float *b /* (co) or NULL */,
                               int ci, int h, int wd, int co, ms_act act);

/* 2x2 stride-2 max pool (floor). */
ms_status op_maxpool2x2(ms_backend *be, float *out /* (c, h/2, w/2) */,
                        const float *in /* (c, h, w) */, int c, int h, int w);

/* Bilinear resize, align_corners=False, no antialias (F.interpolate).
 * scale_h/scale_w <= 0: resize to a size, coordinates mapped by in/out ratio.
 * scale > 0: the caller passes ho=floor(h*scale), coordinates mapped by 1/scale. */
ms_status op_resize_bilinear(ms_backend *be, float *out /* (c, ho, wo) */,
                             const float *in /* (c, h, w) */, int c, int h, int w,
                             int ho, int wo, double scale_h, double scale_w);

/* Rows y_begin .. y_end-1 of op_resize_bilinear to a size (scale <= 0), the
 * same values: lets a caller resize and consume a large output band by band. */
ms_status op_resize_bilinear_rows(ms_backend *be, float *out /* (c, y_end - y_begin, wo) */,
                                  const float *in /* (c, h, w) */, int c, int h, int w, int ho,
                                  int wo, int y_begin, int y_end);

/* Bicubic resize to a size, align_corners=False, A=-0.75, indices clamped at
 * the border (F.interpolate(mode="bicubic")). */
ms_status op_resize_bicubic(ms_backend *be, float *out /* (c, ho, wo) */,
                            const float *in /* (c, h, w) */, int c, int h, int w,
                            int ho, int wo);

/* Copy a (c, ho, wo) window at the origin out of (c, h, w) (crop padding). */
ms_status op_crop(ms_backend *be, float *out /* (c, ho, wo) */, const float *in /* (c, h, w) */,
                  int c, int h, int w, int ho, int wo);

/* Per pixel, the class with the largest logit (ties: lowest class). */
/* Sliding-window logits (mmseg slide_inference): acc (c, h, w) += win
 * (c, wh, ww) at (y0, x0); the first window (first = true) also clears acc. */
ms_status op_window_add(ms_backend *be, float *acc /* (c, h, w) */, const float *win /* (c, wh, ww) */,
                        int c, int h, int w, int wh, int ww, int y0, int x0, bool first);
/* acc /= the number of windows (wh x ww, strides sh, sw) covering each pixel. */
ms_status op_window_average(ms_backend *be, float *acc /* (c, h, w) */, int c, int h, int w,
                            int wh, int ww, int sh, int sw);
ms_status op_argmax(ms_backend *be, uint8_t *out /* (h, w) */, const float *in /* (c, h, w) */,
                    int c, int h, int w);

/* Image normalisation: in is planar RGB in [0,255]; out has (x - mean)/std
 * and zeros in the right/bottom padding. */
ms_status op_normalize_pad(ms_backend *be, float *out /* (3, hp, wp) */,
                           const float *in /* (3, h, w) */, int h, int w, int hp, int wp,
                           const float mean[3], const float stdv[3]);

#ifdef __cplusplus
}
#endif
#endif
