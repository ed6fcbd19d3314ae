/* Linear layer on the GPU: one cuBLASLt GEMM with bias (and ReLU) fused in
 * the epilogue and the residual as beta = 1; exact-erf GELU as a small
 * kernel after it (cuBLASLt's GELU epilogue is the tanh approximation). FP32
 * mode computes in true FP32; otherwise BF16 tensor cores accumulate in
 * FP32 (CUBLAS_COMPUTE_32F_FAST_16BF: operands rounded to BF16 on the fly). */
#include "cuda_check.h"
#include "linear.h"

static cublasComputeType_t gemm_compute(bool fp32)
{
    return fp32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_16BF;
}

/* out[i] = act(out[i] + b[i % cols]); b may be NULL. */
__global__ void bias_act_kernel(float *out, const float *b, long long total, int cols, int act)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        float v = out[i] + (b ? b[i % cols] : 0.0f);
        out[i] = act_apply(v, (ms_act)act);
    }
}

static ms_status bias_act(ms_cuda_ctx *cu, float *out, const float *b, long long rows, int cols,
                          ms_act act)
{
    long long total = rows * cols;
    if (total == 0 || (!b && act == MS_ACT_NONE)) return MS_OK;
    bias_act_kernel<<<cuda_blocks((size_t)total, 256), 256, 0, cu->stream>>>(out, b, total, cols,
                                                                           (int)act);
    CUDA_CHECK_LAUNCH("bias_act");
    return MS_OK;
}

ms_status cuda_gemm_batched(ms_cuda_ctx *cu, bool fp32, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, float alpha, const float *a, int lda,
                            long long sa, const float *b, int ldb, long long sb, float beta,
                            float *c, int ldc, long long sc, int batch)
{
    if (m == 0 || n == 0 || batch == 0) return MS_OK;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(cu->blas, ta, tb, m, n, k, &alpha, a, CUDA_R_32F,
                                            lda, sa, b, CUDA_R_32F, ldb, sb, &beta, c,
                                            CUDA_R_32F, ldc, sc, batch, gemm_compute(fp32),
                                            CUBLAS_GEMM_DEFAULT));
    return MS_OK;
}

/* Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic
 * must only offer kernels whose vector loads the pointers allow. */
static uint32_t ptr_align(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 4 && (u % al) != 0) al >>= 1;
    return al;
}

/* Owns the cuBLASLt descriptors of one call. */
struct lt_call {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~lt_call()
    {
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (c) cublasLtMatrixLayoutDestroy(c);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (op) cublasLtMatmulDescDestroy(op);
    }
};

/* Tries the fused cuBLASLt GEMM; *done = false when no algorithm fits (the
 * caller then uses cublasGemmEx plus bias_act). */
static ms_status linear_lt(const ms_backend *be, bool *done, float *out, const float *in,
                           const float *w, const float *b, int n, int cin, int cout, ms_act act,
                           bool residual)
{
    ms_cuda_ctx *cu = cuda_ctx_of(be);
    lt_call L;
    *done = false;
    /* Column-major view: out^T (cout x n) = w (cin x cout)^T * in^T (cin x n). */
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&L.op, gemm_compute(be->fp32), CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(L.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(L.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (b) epi = act == MS_ACT_RELU ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    else if (act == MS_ACT_RELU) epi = CUBLASLT_EPILOGUE_RELU;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(L.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                sizeof epi));
    if (b)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(L.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b,
                                                    sizeof b));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&L.a, CUDA_R_32F, cin, cout, cin));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&L.b, CUDA_R_32F, cin, n, cin));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&L.c, CUDA_R_32F, cout, n, cout));
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&L.pref));
    size_t wsb = cu->workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        L.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    uint32_t al_a = ptr_align(w), al_b = ptr_align(in), al_c = ptr_align(out);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        L.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        L.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        L.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        L.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(cu->lt, L.op, L.a, L.b, L.c, L.c, L.pref, 1,
                                                       &res, &nres);
    if (hs != CUBLAS_STATUS_SUCCESS || nres == 0) return MS_OK; /* not supported: fall back */
    float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(cu->lt, L.op, &alpha, w, L.a, in, L.b, &beta, out, L.c, out, L.c,
                                &res.algo, cu->workspace, cu->workspace_bytes, cu->stream));
    *done = true;
    if (act == MS_ACT_GELU) MS_TRY(bias_act(cu, out, NULL, n, cout, MS_ACT_GELU));
    return MS_OK;
}

extern "C" ms_status linear_cuda(ms_backend *be, float *out, const float *in, const float *w,
                                 const float *b, int n, int cin, int cout, ms_act act,
                                 bool residual)
{
    ms_cuda_ctx *cu = cuda_ctx_of(be);
    if (n <= 0 || cout <= 0) return MS_OK;
    if (residual && act != MS_ACT_NONE)
        return ms_error(MS_ERR_ARG, "linear: residual with an activation");
    if (cin <= 0) { /* empty product: out = act(b) or out += b */
        if (!residual) CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)n * cout * sizeof(float),
                                                  cu->stream));
        return bias_act(cu, out, b, n, cout, act);
    }
    bool done = false;
    MS_TRY(linear_lt(be, &done, out, in, w, b, n, cin, cout, act, residual));
    if (done) return MS_OK;
    float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublasGemmEx(cu->blas, CUBLAS_OP_T, CUBLAS_OP_N, cout, n, cin, &alpha, w,
                              CUDA_R_32F, cin, in, CUDA_R_32F, cin, &beta, out, CUDA_R_32F, cout,
                              gemm_compute(be->fp32), CUBLAS_GEMM_DEFAULT));
    return bias_act(cu, out, b, n, cout, act);
}
