/* Linear layer on the CPU: one sgemm, then bias and activation in one pass. */
#include "linear.h"

#include "gemm.h"

void linear_cpu(float *out, const float *in, const float *w, const float *b, int n, int cin,
                int cout, ms_act act, bool residual)
{
    /* residual: out += in @ w^T (beta 1), else out = in @ w^T (beta 0) */
    gemm_cpu(out, in, w, n, cout, cin, false, true, cin, cin, cout, 1.0f, residual ? 1.0f : 0.0f);
    if (!b && act == MS_ACT_NONE) return;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        float *row = out + (size_t)i * cout;
        for (int j = 0; j < cout; j++) row[j] = act_apply(row[j] + (b ? b[j] : 0.0f), act);
    }
}
