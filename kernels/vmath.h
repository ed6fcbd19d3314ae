/* Vector math on rows of floats, shared by the CPU ops. Built twice (see
 * cpu_path.h); exp comes from glibc's libmvec in both builds (1 ulp for
 * the AVX2 variant, per glibc's documented bounds), so the loops vectorise
 * without -ffast-math. Sums are reassociated by the vector reduction: the two
 * paths agree to float rounding, not bit for bit. */
#ifndef MS_VMATH_H
#define MS_VMATH_H

#include "cpu_path.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x[i] = exp(x[i] * scale - shift); returns the sum of the new x. */
MS_SIMD_DECLARE(float, vm_exp_sum, (float *x /* (n) */, int n, float scale, float shift));

static inline float vm_exp_sum(float *x /* (n) */, int n, float scale, float shift)
{
    return MS_SIMD_CALL(vm_exp_sum, x, n, scale, shift);
}

#ifdef __cplusplus
}
#endif
#endif
