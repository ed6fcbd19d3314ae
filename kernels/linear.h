/* Linear layer (op_linear) and the activations shared with conv. */
#ifndef MS_LINEAR_H
#define MS_LINEAR_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops.h"

/* Exact GELU, PyTorch's default (approximate="none"): 0.5 x (1 + erf(x/sqrt2)). */
MS_HD float gelu_erf(float x)
{
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}

MS_HD float act_apply(float x, ms_act act)
{
    if (act == MS_ACT_RELU) return x > 0.0f ? x : 0.0f;
    if (act == MS_ACT_GELU) return gelu_erf(x);
    return x;
}

/* FP32 -> BF16 bits, round to nearest, ties to even (as __float2bfloat16_rn
 * and PyTorch's conversion): adding 0x7FFF plus the kept part's lowest bit
 * carries into bit 16 exactly when the dropped half is above the tie, or at
 * the tie with an odd kept part; a carry out of the largest finite values
 * gives infinity, as IEEE rounding does. Subnormals need no special case
 * (BF16 has FP32's exponent range). NaN stays NaN with its sign: the quiet
 * bit is set, since the payload may lie only in the dropped bits. */
MS_HD uint16_t bf16_from_f32(float x)
{
    uint32_t u = ms_float_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* x rounded to BF16 and back (the value a BF16 tensor-core operand has). */
MS_HD float bf16_round(float x)
{
    return ms_bits_float((uint32_t)bf16_from_f32(x) << 16);
}

/* x rounded to TF32 (10 mantissa bits), to nearest, ties away from zero, as
 * the hardware conversion cvt.rna.tf32.f32; infinities and NaNs unchanged. */
MS_HD float tf32_round(float x)
{
    uint32_t u = ms_float_bits(x);
    if ((u & 0x7F800000u) != 0x7F800000u) u = (u + 0x1000u) & 0xFFFFE000u;
    return ms_bits_float(u);
}

#ifdef __cplusplus
extern "C" {
#endif

/* out = act(in @ w^T + b), or out += in @ w^T + b when residual. */
void linear_cpu(float *out /* (n, cout) */, const float *in /* (n, cin) */,
                const float *w /* (cout, cin) */, const float *b /* (cout) or NULL */,
                int n, int cin, int cout, ms_act act, bool residual);

#ifdef MS_HAVE_CUDA
/* Scratch for linear_cuda: the BF16 copy of the input outside FP32 mode
 * (none in FP32 mode). */
size_t linear_cuda_scratch_bytes(int n, int cin, bool fp32);
/* Outside FP32 mode the GEMM reads a BF16 copy of w, made on its first use
 * and cached in the CUDA context by (w, cout, cin): w must not change while
 * the context lives (model weights do not), or call cuda_ctx_forget_weights.
 * ws: linear_cuda_scratch_bytes bytes, 256-byte aligned (arena). */
ms_status linear_cuda(ms_backend *be, float *out /* (n, cout) */, const float *in /* (n, cin) */,
                      const float *w /* (cout, cin) */, const float *b /* (cout) or NULL */,
                      int n, int cin, int cout, ms_act act, bool residual, void *ws);
#endif

#ifdef __cplusplus
}
#endif
#endif
