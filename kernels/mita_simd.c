/* Built once per CPU path (cpu_path.h): plain C loops the compiler
 * vectorises for the path's instruction set. */
#include "mita_simd.h"

float MS_SIMD_FN(mita_max)(const float *x, int n)
{
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* Blocks of 32 tested at once with an OR of the compares: in a top-k scan
 * almost no element beats the heap's worst, so nearly every block is one
 * vector pass and a branch. */
int MS_SIMD_FN(mita_first_above)(const float *x, int n, float thr)
{
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        int any = 0;
#pragma omp simd reduction(| : any)
        for (int j = 0; j < 32; j++) any |= x[i + j] > thr;
        if (any) break;
    }
    for (; i < n; i++)
        if (x[i] > thr) return i;
    return n;
}

int MS_SIMD_FN(mita_collect_at_least)(float *val, int32_t *pos, const float *x, int n, float t)
{
    int nc = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        int any = 0;
#pragma omp simd reduction(| : any)
        for (int j = 0; j < 32; j++) any |= x[i + j] >= t;
        if (!any) continue;
        for (int j = i; j < i + 32; j++)
            if (x[j] >= t) val[nc] = x[j], pos[nc++] = j;
    }
    for (; i < n; i++)
        if (x[i] >= t) val[nc] = x[i], pos[nc++] = i;
    return nc;
}

void MS_SIMD_FN(mita_add)(float *restrict acc, const float *restrict x, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++) acc[i] += x[i];
}

void MS_SIMD_FN(mita_scale_row)(float *x, int n, float a)
{
#pragma omp simd
    for (int i = 0; i < n; i++) x[i] *= a;
}
