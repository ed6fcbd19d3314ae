/* OpenCV-exact 8-bit bilinear resizing (see image_resize.h for the rules).
 * Compiled with -ffp-contract=off (CMakeLists.txt): the source coordinates
 * are OpenCV's double expressions rounded to float, and a fused multiply-add
 * would change their last bit. */
#include "image_resize.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define COEF_BITS 11
#define COEF_ONE (1 << COEF_BITS)

typedef struct {
    int32_t *xofs;  /* (dw) left source column of each output column */
    int32_t *yofs;  /* (dh) upper source row, unclamped */
    int32_t *rows;  /* (2, dw*3) horizontally resized source rows */
    int16_t *alpha; /* (dw, 2) column weights */
    int16_t *beta;  /* (dh, 2) row weights */
} resize_tables;

size_t image_resize_u8_scratch(int sw, int sh, int dw, int dh)
{
    (void)sw, (void)sh;
    return sizeof(int32_t) * ((size_t)dw + dh + (size_t)2 * 3 * dw) +
           sizeof(int16_t) * ((size_t)2 * dw + (size_t)2 * dh);
}

static resize_tables tables_at(void *scratch, int dw, int dh)
{
    resize_tables t;
    t.xofs = scratch;
    t.yofs = t.xofs + dw;
    t.rows = t.yofs + dh;
    t.alpha = (int16_t *)(t.rows + (size_t)2 * 3 * dw);
    t.beta = t.alpha + (size_t)2 * dw;
    return t;
}

/* Source index and the two 11-bit weights of each of n outputs from a source
 * of len. OpenCV works from 1 / (n / len), not len / n: the last bit can
 * differ. Columns (clamp) move an outside position onto the edge with weight
 * (1, 0); rows keep the fraction and clamp the row index when read. */
static void linear_coeffs(int32_t *ofs /* (n) */, int16_t *w /* (n, 2) */, int len, int n,
                          bool clamp)
{
    double scale = 1.0 / ((double)n / len);
    for (int i = 0; i < n; i++) {
        float f = (float)((i + 0.5) * scale - 0.5);
        int s = (int)floorf(f);
        f -= (float)s;
        if (clamp && s < 0) s = 0, f = 0.f;
        if (clamp && s >= len - 1) s = len - 1, f = 0.f;
        ofs[i] = s;
        w[2 * i] = (int16_t)lrintf((1.f - f) * COEF_ONE);
        w[2 * i + 1] = (int16_t)lrintf(f * COEF_ONE);
    }
}

/* One source row (sw, 3) -> (dw*3) fixed-point values, exact in int32. */
static void resize_row(int32_t *out /* (dw*3) */, const uint8_t *row /* (sw, 3) */, int sw,
                       int dw, const int32_t *xofs, const int16_t *alpha)
{
    for (int x = 0; x < dw; x++) {
        int s0 = xofs[x], s1 = s0 + 1 < sw ? s0 + 1 : s0; /* weight 0 at the edge */
        int a0 = alpha[2 * x], a1 = alpha[2 * x + 1];
        for (int c = 0; c < 3; c++)
            out[x * 3 + c] = a0 * row[s0 * 3 + c] + a1 * row[s1 * 3 + c];
    }
}

static void resize_half(uint8_t *dst, const uint8_t *src, int sw, int dw, int dh)
{
    size_t sstride = (size_t)sw * 3;
    for (int y = 0; y < dh; y++) {
        const uint8_t *r0 = src + (size_t)2 * y * sstride, *r1 = r0 + sstride;
        uint8_t *d = dst + (size_t)y * dw * 3;
        for (int x = 0; x < dw; x++)
            for (int c = 0; c < 3; c++) {
                int i = 6 * x + c;
                d[3 * x + c] = (uint8_t)((r0[i] + r0[i + 3] + r1[i] + r1[i + 3] + 2) >> 2);
            }
    }
}

void image_resize_u8_rgb(uint8_t *dst, const uint8_t *src, int sw, int sh, int dw, int dh,
                         void *scratch)
{
    if (sw == dw && sh == dh) {
        memcpy(dst, src, (size_t)sh * sw * 3);
        return;
    }
    /* OpenCV swaps in its 2x2 area mean when both scales are exactly 2. */
    double scale_x = 1.0 / ((double)dw / sw), scale_y = 1.0 / ((double)dh / sh);
    if (fabs(scale_x - 2.0) < DBL_EPSILON && fabs(scale_y - 2.0) < DBL_EPSILON) {
        resize_half(dst, src, sw, dw, dh);
        return;
    }
    resize_tables t = tables_at(scratch, dw, dh);
    linear_coeffs(t.xofs, t.alpha, sw, dw, true);
    linear_coeffs(t.yofs, t.beta, sh, dh, false);
    const size_t n = (size_t)dw * 3, sstride = (size_t)sw * 3;
    int32_t *buf[2] = {t.rows, t.rows + n};
    int held[2] = {-1, -1}; /* source row each buffer holds */
    for (int y = 0; y < dh; y++) {
        int r[2] = {t.yofs[y], t.yofs[y] + 1}, slot[2];
        for (int k = 0; k < 2; k++) r[k] = r[k] < 0 ? 0 : r[k] >= sh ? sh - 1 : r[k];
        for (int k = 0; k < 2; k++) {
            slot[k] = held[0] == r[k] ? 0 : held[1] == r[k] ? 1 : -1;
            if (slot[k] < 0) { /* the buffer the other tap does not need */
                slot[k] = k == 1 && slot[0] == 0 ? 1 : k == 1 ? 0 : held[1] == r[1] ? 0 : 1;
                resize_row(buf[slot[k]], src + (size_t)r[k] * sstride, sw, dw, t.xofs, t.alpha);
                held[slot[k]] = r[k];
            }
        }
        const int32_t *h0 = buf[slot[0]], *h1 = buf[slot[1]];
        const int b0 = t.beta[2 * y], b1 = t.beta[2 * y + 1];
        uint8_t *d = dst + (size_t)y * n;
        for (size_t i = 0; i < n; i++) {
            int v = (((b0 * (h0[i] >> 4)) >> 16) + ((b1 * (h1[i] >> 4)) >> 16) + 2) >> 2;
            d[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
}

void image_keep_ratio_size(int *rh, int *rw, int h, int w, int short_side, int long_side)
{
    *rh = h, *rw = w;
    if (short_side <= 0) return;
    double s = (double)short_side / (h < w ? h : w);
    if (long_side > 0) {
        double l = (double)long_side / (h > w ? h : w);
        if (l < s) s = l;
    }
    *rh = (int)(h * s + 0.5);
    *rw = (int)(w * s + 0.5);
    if (*rh < 1) *rh = 1;
    if (*rw < 1) *rw = 1;
}
