/* Pooling: adaptive average pool (PyTorch windows) and 2x2 max pool. */
#ifndef MS_POOL_H
#define MS_POOL_H

#include "ops.h"

/* Adaptive pooling window of output i along an axis of `in` samples pooled to
 * `out`: [start, end) with start = floor(i*in/out), end = ceil((i+1)*in/out).
 * Neighbouring windows overlap when out does not divide in. */
MS_HD int adaptive_pool_start(int i, int in, int out)
{
    return (int)(((long long)i * in) / out);
}

MS_HD int adaptive_pool_end(int i, int in, int out)
{
    return (int)(((long long)(i + 1) * in + out - 1) / out);
}

#ifdef __cplusplus
extern "C" {
#endif

void adaptive_avgpool_cpu(float *out /* (c, gh, gw) */, const float *in /* (c, h, w) */, int c,
                          int h, int w, int gh, int gw);
void maxpool2x2_cpu(float *out /* (c, h/2, w/2) */, const float *in /* (c, h, w) */, int c, int h,
                    int w);

#ifdef MS_HAVE_CUDA
ms_status adaptive_avgpool_cuda(ms_backend *be, float *out /* (c, gh, gw) */,
                                const float *in /* (c, h, w) */, int c, int h, int w, int gh,
                                int gw);
ms_status maxpool2x2_cuda(ms_backend *be, float *out /* (c, h/2, w/2) */,
                          const float *in /* (c, h, w) */, int c, int h, int w);
#endif

#ifdef __cplusplus
}
#endif
#endif
