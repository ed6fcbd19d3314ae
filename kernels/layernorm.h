/* LayerNorm over the channels of each token (op_layernorm). */
#ifndef MS_LAYERNORM_H
#define MS_LAYERNORM_H

#include <math.h>

#include "ops.h"

/* 1/sqrt(var + eps) with the biased variance, as torch.nn.LayerNorm. */
MS_HD float layernorm_rstd(float var, float eps) { return 1.0f / sqrtf(var + eps); }

MS_HD float layernorm_apply(float x, float mean, float rstd, float w, float b)
{
    return (x - mean) * rstd * w + b;
}

#ifdef __cplusplus
extern "C" {
#endif

/* Mean and variance in double, two passes: activations can have a large mean
 * (ViT residual streams), where one-pass float sums lose the variance. */
void layernorm_cpu(float *out /* (n, c) */, const float *in /* (n, c) */,
                   const float *w /* (c) */, const float *b /* (c) */, int n, int c, float eps);

#ifdef MS_HAVE_CUDA
ms_status layernorm_cuda(ms_backend *be, float *out /* (n, c) */, const float *in /* (n, c) */,
                         const float *w /* (c) */, const float *b /* (c) */, int n, int c,
                         float eps);
#endif

#ifdef __cplusplus
}
#endif
#endif
