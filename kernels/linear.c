/* Linear layer on the CPU: one sgemm per thread's slab of rows, its bias and
 * activation applied by the same thread right after (vectorised,
 * elementwise_simd.c) while the slab is still warm in its cache. Without a
 * residual the bias is written first and the GEMM accumulates onto it (beta
 * 1), which replaces OpenBLAS's own clearing pass of the output. */
#include "linear.h"

#include "elementwise_simd.h"
#include "gemm.h"

/* Rows [r0, r1) of the layer. */
static void linear_rows(float *out, const float *in, const float *w, const float *b, int r0,
                        int r1, int cin, int cout, ms_act act, bool residual)
{
    float *o = out + (size_t)r0 * cout;
    int rows = r1 - r0;
    bool prefill = b && !residual;
    if (prefill)
        for (int i = 0; i < rows; i++) memcpy(o + (size_t)i * cout, b, (size_t)cout * sizeof(float));
    /* out = in @ w^T (+ out: the residual or the bias written above) */
    gemm_cpu_whole(o, in + (size_t)r0 * cin, w, rows, cout, cin, false, true, cin, cin, cout,
                   1.0f, residual || prefill ? 1.0f : 0.0f);
    const float *eb = prefill ? NULL : b; /* the bias still to add */
    if (eb || act != MS_ACT_NONE) ew_bias_act_cols(o, eb, rows, cout, cout, act);
}

void linear_cpu(float *out, const float *in, const float *w, const float *b, int n, int cin,
                int cout, ms_act act, bool residual)
{
    gemm_init_threads();
    /* One slab of rows per thread, cut where gemm_split_at says (results
     * independent of the split); small products run as one call, as
     * gemm_cpu does. */
    int min_part, threads = gemm_split_threads(&min_part, n, (double)cout * cin);
    if (threads <= 1) {
        linear_rows(out, in, w, b, 0, n, cin, cout, act, residual);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int s = 0; s < threads; s++) {
        int r0 = gemm_split_at(n, s, threads, min_part);
        int r1 = gemm_split_at(n, s + 1, threads, min_part);
        if (r1 > r0) linear_rows(out, in, w, b, r0, r1, cin, cout, act, residual);
    }
}
