/* Convolutions on the CPU: im2col a band of output rows at a time, then one
 * sgemm per band; the transposed conv is a GEMM followed by a scatter. */
#include "conv.h"
#include "gemm.h"


static bool conv2d_is_pointwise(int kh, int kw, int stride, int pad)
{
    return kh == 1 && kw == 1 && stride == 1 && pad == 0;
}

size_t conv2d_scratch_floats(int ci, int h, int wd, int co, int kh, int kw, int stride, int pad)
{
    if (conv2d_is_pointwise(kh, kw, stride, pad)) return 0;
    int ho = conv_out_size(h, kh, stride, pad), wo = conv_out_size(wd, kw, stride, pad);
    size_t row = (size_t)ci * kh * kw * wo; /* im2col columns of one output row */
    size_t all = row * ho;
    if (all <= MS_CONV_SCRATCH_FLOATS) return all;
    return row > MS_CONV_SCRATCH_FLOATS ? row : (MS_CONV_SCRATCH_FLOATS / row) * row;
}

/* Rows of im2col for output rows [y0, y0+rows): col[(c*kh+ky)*kw+kx][pixel]. */
static void im2col_band(float *col /* (ci*kh*kw, rows*wo) */, const float *in /* (ci, h, wd) */,
                        int ci, int h, int wd, int kh, int kw, int stride, int pad, int wo, int y0,
                        int rows)
{
    size_t npix = (size_t)rows * wo;
#pragma omp parallel for collapse(2) schedule(static)
    for (int c = 0; c < ci; c++) {
        for (int k = 0; k < kh * kw; k++) {
            int ky = k / kw, kx = k % kw;
            const float *plane = in + (size_t)c * h * wd;
            float *dst = col + ((size_t)c * kh * kw + k) * npix;
            for (int r = 0; r < rows; r++) {
                int iy = (y0 + r) * stride - pad + ky;
                float *d = dst + (size_t)r * wo;
                if (iy < 0 || iy >= h) {
                    for (int x = 0; x < wo; x++) d[x] = 0.0f;
                    continue;
                }
                const float *src = plane + (size_t)iy * wd;
                for (int x = 0; x < wo; x++) {
                    int ix = x * stride - pad + kx;
                    d[x] = (ix >= 0 && ix < wd) ? src[ix] : 0.0f;
                }
            }
        }
    }
}

static void bias_act(float *out /* (co, plane) */, const float *b /* (co) or NULL */, int co,
                     size_t plane, ms_act act)
{
    if (!b && act == MS_ACT_NONE) return;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < co; c++) {
        float bias = b ? b[c] : 0.0f;
        float *o = out + (size_t)c * plane;
        for (size_t i = 0; i < plane; i++) o[i] = act_apply(o[i] + bias, act);
    }
}

void conv2d_cpu(float *out, const float *in, const float *w, const float *b, int ci, int h,
                int wd, int co, int kh, int kw, int stride, int pad, ms_act act, float *ws,
                size_t ws_floats)
{
    int ho = conv_out_size(h, kh, stride, pad), wo = conv_out_size(wd, kw, stride, pad);
    int kdim = ci * kh * kw;
    size_t plane = (size_t)ho * wo;
    if (conv2d_is_pointwise(kh, kw, stride, pad)) {
        /* out (co, hw) = w (co, ci) @ in (ci, hw) */
        gemm_cpu(out, w, in, co, (int)plane, ci, false, false, ci, (int)plane, (int)plane, 1.0f,
                 0.0f);
    } else {
        size_t row = (size_t)kdim * wo;
        int band = (int)(ws_floats / row);
        if (band < 1) band = 1; /* caller guarantees one row fits */
        if (band > ho) band = ho;
        for (int y0 = 0; y0 < ho; y0 += band) {
            int rows = ho - y0 < band ? ho - y0 : band;
            int npix = rows * wo;
            im2col_band(ws, in, ci, h, wd, kh, kw, stride, pad, wo, y0, rows);
            /* out[:, band] (co, npix; row stride ho*wo) = w (co, kdim) @ col (kdim, npix) */
            gemm_cpu(out + (size_t)y0 * wo, w, ws, co, npix, kdim, false, false, kdim, npix,
                     (int)plane, 1.0f, 0.0f);
        }
    }
    bias_act(out, b, co, plane, act);
}

size_t conv_transpose2x2_scratch_floats(int ci, int h, int wd, int co)
{
    size_t row = (size_t)4 * co * wd; /* GEMM result of one input row */
    size_t all = row * h;
    if (all <= MS_CONV_SCRATCH_FLOATS) return all;
    return row > MS_CONV_SCRATCH_FLOATS ? row : (MS_CONV_SCRATCH_FLOATS / row) * row;
}

void conv_transpose2x2_cpu(float *out, const float *in, const float *w, const float *b, int ci,
                           int h, int wd, int co, ms_act act, float *ws, size_t ws_floats)
{
    size_t row = (size_t)4 * co * wd;
    int band = (int)(ws_floats / row);
    if (band < 1) band = 1;
    if (band > h) band = h;
    int wo = 2 * wd;
    size_t plane_out = (size_t)4 * h * wd;
    for (int y0 = 0; y0 < h; y0 += band) {
        int rows = h - y0 < band ? h - y0 : band;
        int npix = rows * wd;
        /* t (4co, npix) = w^T, w stored (ci, 4co), @ in[:, band] (ci, npix; row stride h*wd) */
        gemm_cpu(ws, w, in + (size_t)y0 * wd, 4 * co, npix, ci, true, false, 4 * co, h * wd, npix,
                 1.0f, 0.0f);
        /* out[o, 2y+dy, 2x+dx] = t[(o*2+dy)*2+dx, (y-y0)*wd + x] */
#pragma omp parallel for collapse(2) schedule(static)
        for (int o = 0; o < co; o++) {
            for (int r = 0; r < rows; r++) {
                float bias = b ? b[o] : 0.0f;
                for (int dy = 0; dy < 2; dy++) {
                    float *dst = out + (size_t)o * plane_out + (size_t)(2 * (y0 + r) + dy) * wo;
                    const float *t0 = ws + (size_t)(o * 4 + dy * 2) * npix + (size_t)r * wd;
                    const float *t1 = t0 + npix;
                    for (int x = 0; x < wd; x++) {
                        dst[2 * x] = act_apply(t0[x] + bias, act);
                        dst[2 * x + 1] = act_apply(t1[x] + bias, act);
                    }
                }
            }
        }
    }
}
