/* Built once per CPU path (cpu_path.h): plain C loops the compiler
 * vectorises for the path's instruction set. */
#include "simd_math.h"
#include "vmath.h"

float MS_SIMD_FN(vm_exp_sum)(float *x /* (n) */, int n, float scale, float shift)
{
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) {
        float e = expf(x[i] * scale - shift);
        x[i] = e;
        sum += e;
    }
    return sum;
}
