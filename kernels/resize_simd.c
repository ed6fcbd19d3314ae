/* Built once per CPU path (cpu_path.h): plain C loops the compiler
 * vectorises for the path's instruction set. */
#include "resize_simd.h"

void MS_SIMD_FN(rs_hpass)(float *restrict dst, const float *restrict row, const int *restrict x0,
                          const int *restrict x1, const float *restrict wx0,
                          const float *restrict wx1, int wo)
{
#pragma omp simd
    for (int x = 0; x < wo; x++) dst[x] = wx0[x] * row[x0[x]] + wx1[x] * row[x1[x]];
}

void MS_SIMD_FN(rs_vblend)(float *restrict dst, const float *restrict h0,
                           const float *restrict h1, float wy0, float wy1, int wo)
{
#pragma omp simd
    for (int x = 0; x < wo; x++) dst[x] = wy0 * h0[x] + wy1 * h1[x];
}
