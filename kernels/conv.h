/* Convolutions: conv2d (implicit GEMM at stride 1, else im2col + GEMM) and
 * 2x2 stride-2 transposed conv. */
#ifndef MS_CONV_H
#define MS_CONV_H

#include "linear.h" /* act_apply */

/* Output length of a zero-padded convolution along one axis (< 1: invalid). */
MS_HD int conv_out_size(int in, int k, int stride, int pad)
{
    return (in + 2 * pad - k) / stride + 1;
}

/* Scratch cap: the CPU convs work a band of output rows at a time per
 * thread, so a 2048-channel 3x3 conv on a 128x128 map does not need a 1.2 GB
 * column matrix. The bands are cut for 2 threads whatever the count (the
 * same bits at any), each thread's slice within half of this: 2 threads
 * stay within it, more take up to half of it each. At least one row is
 * always allowed. */
#define MS_CONV_SCRATCH_FLOATS ((size_t)4 << 20)

#ifdef __cplusplus
extern "C" {
#endif

/* Floats of scratch conv2d_cpu wants (0 for a 1x1 stride-1 unpadded conv,
 * which is GEMMs on the input itself). Sized for a band per OpenMP thread
 * at the thread count of the call (omp_get_max_threads, which the engine
 * keeps fixed); given less, the conv runs smaller bands or fewer threads
 * within what it has. */
size_t conv2d_scratch_floats(int ci, int h, int wd, int co, int kh, int kw, int stride, int pad);

/* ws holds ws_floats floats: what conv2d_scratch_floats returned, or at
 * least one output row's im2col columns (ci*kh*kw*wo); none for a 1x1
 * stride-1 unpadded conv. 3x3 stride-1 pad-1 convs of 32+ channels in and
 * out on maps of 12 4x4 tiles or more run as Winograd F(4x4, 3x3), other stride-1 convs as an
 * implicit GEMM, when ws holds the path's transformed weights and one band
 * (the sized amount always does); else (falling back Winograd, implicit
 * GEMM), and at other strides, as conv2d_im2col_cpu. */
void conv2d_cpu(float *out /* (co, ho, wo) */, const float *in /* (ci, h, w) */,
                const float *w /* (co, ci, kh, kw) */, const float *b /* (co) or NULL */, int ci,
                int h, int wd, int co, int kh, int kw, int stride, int pad, ms_act act,
                float *ws /* (ws_floats) */, size_t ws_floats);

/* The im2col path on its own (tests run stride-1 convs through it too): ws
 * holds at least ci*kh*kw*wo floats. */
void conv2d_im2col_cpu(float *out /* (co, ho, wo) */, const float *in /* (ci, h, w) */,
                       const float *w /* (co, ci, kh, kw) */, const float *b /* (co) or NULL */,
                       int ci, int h, int wd, int co, int kh, int kw, int stride, int pad,
                       ms_act act, float *ws /* (ws_floats) */, size_t ws_floats);

/* The Winograd F(4x4, 3x3) path on its own, for any 3x3 stride-1 pad-1 conv
 * (conv2d_cpu takes it from 32 channels and 12 4x4 tiles up; tests run it
 * at every size): its sized scratch, and the conv; given less than its
 * transformed weights (36 co kc floats, kc = ci, or for 36 co ci over 2^20 ci
 * split evenly into the fewest chunks under that) and one band of one tile
 * row (36 (kc + co) ceil(w/4) floats and a little), it runs
 * conv2d_im2col_cpu in ws instead. */
size_t conv2d_winograd_scratch_floats(int ci, int h, int wd, int co);
void conv2d_winograd_cpu(float *out /* (co, h, wd) */, const float *in /* (ci, h, wd) */,
                         const float *w /* (co, ci, 3, 3) */, const float *b /* (co) or NULL */,
                         int ci, int h, int wd, int co, ms_act act,
                         float *ws /* (ws_floats) */, size_t ws_floats);

size_t conv_transpose2x2_scratch_floats(int ci, int h, int wd, int co);

/* ws holds at least one input row's GEMM result (4*co*wd floats). */
void conv_transpose2x2_cpu(float *out /* (co, 2h, 2w) */, const float *in /* (ci, h, w) */,
                           const float *w /* (ci, co, 2, 2) */, const float *b /* (co) or NULL */,
                           int ci, int h, int wd, int co, ms_act act,
                           float *ws /* (ws_floats) */, size_t ws_floats);

#ifdef MS_HAVE_CUDA
/* Bytes of be->scratch the CUDA versions need (allocated by the dispatcher).
 * Outside FP32 mode they include copies of the input and weights rounded to
 * the tensor-core format (TF32 for conv2d, BF16 for conv_transpose2x2) by our
 * own kernel, so that the library's undocumented conversion of them is
 * exact and the result is what the CPU's tc_round computes. */
size_t conv2d_cuda_scratch_bytes(int ci, int h, int wd, int co, int kh, int kw, int stride,
                                 int pad, bool fp32);
ms_status conv2d_cuda(ms_backend *be, float *out /* (co, ho, wo) */,
                      const float *in /* (ci, h, w) */, const float *w /* (co, ci, kh, kw) */,
                      const float *b /* (co) or NULL */, int ci, int h, int wd, int co, int kh,
                      int kw, int stride, int pad, ms_act act, void *ws);
size_t conv_transpose2x2_cuda_scratch_bytes(int ci, int h, int wd, int co, bool fp32);
ms_status conv_transpose2x2_cuda(ms_backend *be, float *out /* (co, 2h, 2w) */,
                                 const float *in /* (ci, h, w) */,
                                 const float *w /* (ci, co, 2, 2) */,
                                 const float *b /* (co) or NULL */, int ci, int h, int wd, int co,
                                 ms_act act, void *ws);
#endif

#ifdef __cplusplus
}
#endif
#endif
