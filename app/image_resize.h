/* 8-bit RGB resizing as OpenCV's cv::resize with INTER_LINEAR computes it for
 * 8-bit images, bit for bit: the resize mmcv.imresize (so mmsegmentation's
 * test pipeline) applies to the uint8 image before normalising. The model
 * file's input.resize "cv2_uint8" selects it (README, Models).
 *
 * What OpenCV does (opencv-python 4.x, reimplemented from its documented
 * algorithm in imgproc/src/resize.cpp; checked bit-exact against cv2.resize by
 * tools/tests/test_upstream.py and tests/test_image_resize.c's goldens):
 *   - source coordinate of output column x: f = (float)((x + 0.5) * (sw/dw)
 *     - 0.5) in double, rounded to float; s = floor(f), fx = f - s (float).
 *     Columns left of the image (s < 0) take column 0, right of it (s >=
 *     sw - 1) column sw - 1, both with fx = 0. Rows the same, except that the
 *     fraction is kept where the row index is clamped (both taps then read the
 *     same edge row).
 *   - weights: rint((1 - f) * 2048) and rint(f * 2048) (11 fraction bits,
 *     rounded half to even).
 *   - horizontal pass in exact integers: h = a0 * S[s] + a1 * S[s + 1].
 *   - vertical pass, the rounding OpenCV's vectorised loop uses everywhere:
 *     ((b0 * (h0 >> 4)) >> 16) + ((b1 * (h1 >> 4)) >> 16), then (+ 2) >> 2.
 *   - an exact 2x reduction in both directions is a 2x2 box mean instead,
 *     (a + b + c + d + 2) >> 2; an unchanged size is a copy. */
#ifndef MS_IMAGE_RESIZE_H
#define MS_IMAGE_RESIZE_H

#include "kernels/common.h"

/* Bytes of scratch image_resize_u8_rgb needs for these sizes (coefficient
 * tables and two horizontally resized rows). */
size_t image_resize_u8_scratch(int sw, int sh, int dw, int dh);

/* dst (dh, dw, 3) <- src (sh, sw, 3), all sizes >= 1; scratch holds
 * image_resize_u8_scratch(sw, sh, dw, dh) bytes, 8-byte aligned. Pure: no
 * allocation, no failure. */
void image_resize_u8_rgb(uint8_t *dst /* (dh, dw, 3) */, const uint8_t *src /* (sh, sw, 3) */,
                         int sw, int sh, int dw, int dh, void *scratch);

/* The working size mmcv's keep-ratio rescale gives an h x w image
 * (mmcv.rescale_size): s = min(long_side / max(h, w), short_side / min(h, w))
 * (without long_side, only the short side's), rh = (int)(h * s + 0.5),
 * rw = (int)(w * s + 0.5) in double, at least 1. short_side 0: unchanged. */
void image_keep_ratio_size(int *rh, int *rw, int h, int w, int short_side, int long_side);

#endif
