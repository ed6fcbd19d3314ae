/* Linear layer on the CPU: one sgemm per thread's slab of rows, its bias and
 * activation applied by the same thread right after (vectorised,
 * elementwise_simd.c) while the slab is still warm in its cache. Without a
 * residual the bias is written first and the GEMM accumulates onto it (beta
 * 1), which replaces OpenBLAS's own clearing pass of the output. */
#include "linear.h"

#include "elementwise_simd.h"
#include "gemm.h"
#ifdef _OPENMP
#include <omp.h>
#endif

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
    gemm_cpu(o, in + (size_t)r0 * cin, w, rows, cout, cin, false, true, cin, cin, cout, 1.0f,
             residual || prefill ? 1.0f : 0.0f);
    const float *eb = prefill ? NULL : b; /* the bias still to add */
    if (eb || act != MS_ACT_NONE) ew_bias_act_cols(o, eb, rows, cout, cout, act);
}

void linear_cpu(float *out, const float *in, const float *w, const float *b, int n, int cin,
                int cout, ms_act act, bool residual)
{
    gemm_init_threads();
    int threads = 1;
#ifdef _OPENMP
    if (!omp_in_parallel()) threads = omp_get_max_threads();
#endif
    /* Slabs of rows, a multiple of 16 (full micro-kernels), one per thread;
     * small products run as one call, as gemm_cpu does. */
    int slab = (n + threads - 1) / threads;
    slab = (slab + 15) / 16 * 16;
    if (threads <= 1 || (double)n * cout * cin < 1e6 || slab >= n) {
        linear_rows(out, in, w, b, 0, n, cin, cout, act, residual);
        return;
    }
    int slabs = (n + slab - 1) / slab;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int s = 0; s < slabs; s++)
        linear_rows(out, in, w, b, s * slab, n - s * slab < slab ? n : (s + 1) * slab, cin, cout,
                    act, residual);
}
