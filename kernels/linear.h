/* Linear layer (op_linear) and the activations shared with conv. */
#ifndef MS_LINEAR_H
#define MS_LINEAR_H

#include <math.h>

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

#ifdef __cplusplus
extern "C" {
#endif

/* out = act(in @ w^T + b), or out += in @ w^T + b when residual. */
void linear_cpu(float *out /* (n, cout) */, const float *in /* (n, cin) */,
                const float *w /* (cout, cin) */, const float *b /* (cout) or NULL */,
                int n, int cin, int cout, ms_act act, bool residual);

#ifdef MS_HAVE_CUDA
ms_status linear_cuda(ms_backend *be, float *out /* (n, cout) */, const float *in /* (n, cin) */,
                      const float *w /* (cout, cin) */, const float *b /* (cout) or NULL */,
                      int n, int cin, int cout, ms_act act, bool residual);
#endif

#ifdef __cplusplus
}
#endif
#endif
