/* For the *_simd.c files only (cpu_path.h): libmvec's vector expf and erff
 * made callable from `#pragma omp simd` loops (glibc declares them only under
 * -ffast-math, which we do not want elsewhere; glibc documents at most 1-2
 * ulp for them), and the exact GELU on that erff. */
#ifndef MS_SIMD_MATH_H
#define MS_SIMD_MATH_H

#include <math.h>

#pragma omp declare simd notinbranch
extern float expf(float);
#pragma omp declare simd notinbranch
extern float erff(float);

/* gelu_erf (linear.h) written out here, so that erff is the vector one. */
static inline float simd_gelu(float x)
{
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}

#endif
