/* Linear layer on the GPU: one cuBLASLt GEMM with bias (and ReLU) fused in
 * the epilogue and the residual as beta = 1; exact-erf GELU as a small
 * kernel after it (cuBLASLt's GELU epilogue is the tanh approximation). FP32
 * mode computes in true FP32. Otherwise the operands are stored in BF16 (the
 * weight converted once and cached in the context, the input converted into
 * scratch per call) and tensor cores accumulate in FP32 into the FP32
 * output: half the operand traffic of FP32 storage. */
#include "cuda_check.h"
#include "linear.h"

#include <string.h>

/* cuda_gemm_batched (conv_transpose2x2): FP32 storage, BF16 tensor cores
 * rounding the operands on the fly outside FP32 mode. */
static cublasComputeType_t gemm_compute(bool fp32)
{
    return fp32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_16BF;
}

/* Operand type of the linear GEMM: FP32 in FP32 mode, else BF16 bits. */
static cudaDataType_t linear_operand_type(bool fp32) { return fp32 ? CUDA_R_32F : CUDA_R_16BF; }

extern "C" size_t linear_cuda_scratch_bytes(int n, int cin, bool fp32)
{
    if (fp32 || n <= 0 || cin <= 0) return 0;
    return cuda_align256((size_t)n * (size_t)cin * sizeof(uint16_t));
}

__global__ void f32_to_bf16_kernel(uint16_t *out, const float *in, long long total)
{
    CUDA_FOR(i, total) out[i] = bf16_from_f32(in[i]);
}

static ms_status f32_to_bf16(ms_cuda_ctx *cu, uint16_t *out, const float *in, long long total)
{
    if (total == 0) return MS_OK;
    MS_LAUNCH(f32_to_bf16_kernel, cuda_blocks((size_t)total, 256), 256, 0, cu->stream)(out, in,
        total);
    CUDA_CHECK_LAUNCH("f32_to_bf16");
    return MS_OK;
}

/* BF16 copies of the weights, made on each weight's first use (the first
 * image; later images allocate nothing) and kept until the context is freed
 * or cuda_ctx_forget_weights. Keyed by (pointer, shape): a model's weights
 * stay at one address, unchanged, for the engine's life. A linear search: a
 * model has a few dozen linear weights. */
struct bf16_weight {
    const float *w; /* (rows, cols) FP32 original, the key */
    int rows, cols;
    uint16_t *dev; /* (rows, cols) BF16 copy, own cudaMalloc: 256-byte aligned */
};

struct bf16_weights {
    bf16_weight *e;
    int used, cap;
};

void linear_cuda_weights_free(ms_cuda_ctx *cu)
{
    bf16_weights *bw = cu->bf16_w;
    if (!bw) return;
    for (int i = 0; i < bw->used; i++) cuda_arena_free_storage((uint8_t *)bw->e[i].dev);
    ms_free(bw->e);
    ms_free(bw);
    cu->bf16_w = NULL;
}

static ms_status bf16_weight_get(ms_cuda_ctx *cu, const uint16_t **out, const float *w, int rows,
                                 int cols)
{
    *out = NULL;
    if (!cu->bf16_w) {
        cu->bf16_w = (bf16_weights *)ms_calloc(1, sizeof(bf16_weights));
        MS_CHECK_ALLOC(cu->bf16_w, sizeof(bf16_weights));
    }
    bf16_weights *bw = cu->bf16_w;
    for (int i = 0; i < bw->used; i++) {
        const bf16_weight *e = &bw->e[i];
        if (e->w == w && e->rows == rows && e->cols == cols) {
            *out = e->dev;
            return MS_OK;
        }
    }
    if (bw->used == bw->cap) {
        int cap = bw->cap ? 2 * bw->cap : 64;
        bf16_weight *ne = (bf16_weight *)ms_calloc((size_t)cap, sizeof *ne);
        MS_CHECK_ALLOC(ne, (size_t)cap * sizeof *ne);
        if (bw->used) memcpy(ne, bw->e, (size_t)bw->used * sizeof *ne);
        ms_free(bw->e);
        bw->e = ne;
        bw->cap = cap;
    }
    long long total = (long long)rows * cols;
    uint8_t *dev = NULL;
    MS_TRY(cuda_arena_alloc_storage(&dev, cuda_align256((size_t)total * sizeof(uint16_t))));
    /* enqueued after whatever wrote w on this stream (the weight upload) */
    ms_status st = f32_to_bf16(cu, (uint16_t *)dev, w, total);
    if (st != MS_OK) {
        cuda_arena_free_storage(dev);
        return st;
    }
    bf16_weight *e = &bw->e[bw->used++];
    e->w = w;
    e->rows = rows;
    e->cols = cols;
    e->dev = (uint16_t *)dev;
    *out = e->dev;
    return MS_OK;
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
    MS_LAUNCH(bias_act_kernel, cuda_blocks((size_t)total, 256), 256, 0, cu->stream)(out, b, total,
        cols, (int)act);
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

/* cuBLASLt plans, cached per shape: descriptor creation and the heuristic
 * query cost tens of microseconds of host time, per linear layer per image. */
struct lt_plan {
    int n, cin, cout, epi, fp32;
    uint32_t al_a, al_b, al_c;
    bool ok; /* false: cuBLASLt has no algorithm, use the fallback */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};

#define LT_CACHE_SIZE 64

struct lt_cache {
    lt_plan plan[LT_CACHE_SIZE];
    int used, next;
};

static void lt_plan_clear(lt_plan *p)
{
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

void linear_cuda_cache_free(ms_cuda_ctx *cu)
{
    if (!cu->lt_cache) return;
    for (int i = 0; i < cu->lt_cache->used; i++) lt_plan_clear(&cu->lt_cache->plan[i]);
    ms_free(cu->lt_cache);
    cu->lt_cache = NULL;
}

/* Builds a plan: column-major view out^T (cout x n) = w (cin x cout)^T *
 * in^T (cin x n), epilogue epi, pointer alignments al_*. A and B are FP32
 * (FP32 mode) or BF16; C, D, alpha/beta and the bias (Lt's default bias
 * type is D's) are FP32; FP32 accumulation either way. Leading dimensions
 * are the packed ones (cin, cout), any value: where no Lt kernel takes them
 * (or the alignments), the heuristic returns nothing and the caller falls
 * back to cublasGemmEx. */
static ms_status lt_plan_build(ms_cuda_ctx *cu, lt_plan *p)
{
    cudaDataType_t ab = linear_operand_type(p->fp32 != 0);
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)p->epi;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                sizeof epi));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ab, p->cin, p->cout, p->cin));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ab, p->cin, p->n, p->cin));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, p->cout, p->n, p->cout));
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t wsb = cu->workspace_bytes;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &p->al_a, sizeof p->al_a);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &p->al_b, sizeof p->al_b);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &p->al_c, sizeof p->al_c);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &p->al_c, sizeof p->al_c);
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    if (st == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulAlgoGetHeuristic(cu->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res,
                                       &nres) == CUBLAS_STATUS_SUCCESS &&
        nres > 0) {
        p->ok = true;
        p->algo = res.algo;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    CUBLAS_CHECK(st);
    return MS_OK;
}

static ms_status lt_plan_get(ms_cuda_ctx *cu, lt_plan **out, const lt_plan *key)
{
    if (!cu->lt_cache) {
        cu->lt_cache = (lt_cache *)ms_calloc(1, sizeof(lt_cache));
        MS_CHECK_ALLOC(cu->lt_cache, sizeof(lt_cache));
    }
    lt_cache *lc = cu->lt_cache;
    for (int i = 0; i < lc->used; i++) {
        lt_plan *p = &lc->plan[i];
        if (p->n == key->n && p->cin == key->cin && p->cout == key->cout && p->epi == key->epi &&
            p->fp32 == key->fp32 && p->al_a == key->al_a && p->al_b == key->al_b &&
            p->al_c == key->al_c) {
            *out = p;
            return MS_OK;
        }
    }
    lt_plan *p;
    if (lc->used < LT_CACHE_SIZE) {
        p = &lc->plan[lc->used++];
    } else { /* round-robin eviction */
        p = &lc->plan[lc->next];
        lc->next = (lc->next + 1) % LT_CACHE_SIZE;
        lt_plan_clear(p);
    }
    *p = *key;
    p->ok = false;
    p->op = nullptr;
    p->a = p->b = p->c = nullptr;
    ms_status st = lt_plan_build(cu, p);
    if (st != MS_OK) {
        lt_plan_clear(p); /* an all-zero plan never matches a real key (n >= 1) */
        return st;
    }
    *out = p;
    return MS_OK;
}

/* Tries the fused cuBLASLt GEMM; *done = false when no algorithm fits (the
 * caller then uses cublasGemmEx plus bias_act). in and w: FP32 in FP32 mode,
 * else their BF16 copies. */
static ms_status linear_lt(const ms_backend *be, bool *done, float *out, const void *in,
                           const void *w, const float *b, int n, int cin, int cout, ms_act act,
                           bool residual)
{
    ms_cuda_ctx *cu = cuda_ctx_of(be);
    *done = false;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (b) epi = act == MS_ACT_RELU ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    else if (act == MS_ACT_RELU) epi = CUBLASLT_EPILOGUE_RELU;
    lt_plan key;
    memset(&key, 0, sizeof key);
    key.n = n;
    key.cin = cin;
    key.cout = cout;
    key.epi = (int)epi;
    key.fp32 = be->fp32 ? 1 : 0;
    key.al_a = ptr_align(w);
    key.al_b = ptr_align(in);
    key.al_c = ptr_align(out);
    lt_plan *p = NULL;
    MS_TRY(lt_plan_get(cu, &p, &key));
    if (!p->ok) return MS_OK; /* not supported: fall back */
    if (b)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b,
                                                    sizeof b));
    float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(cu->lt, p->op, &alpha, w, p->a, in, p->b, &beta, out, p->c, out,
                                p->c, &p->algo, cu->workspace, cu->workspace_bytes, cu->stream));
    *done = true;
    if (act == MS_ACT_GELU) MS_TRY(bias_act(cu, out, NULL, n, cout, MS_ACT_GELU));
    return MS_OK;
}

extern "C" ms_status linear_cuda(ms_backend *be, float *out, const float *in, const float *w,
                                 const float *b, int n, int cin, int cout, ms_act act,
                                 bool residual, void *ws)
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
    /* GEMM operands: as given in FP32 mode, else BF16 copies */
    const void *a_in = in, *a_w = w;
    if (!be->fp32) {
        if (!ws) return ms_error(MS_ERR_ARG, "linear: no scratch for the BF16 input");
        const uint16_t *wb = NULL;
        MS_TRY(bf16_weight_get(cu, &wb, w, cout, cin));
        MS_TRY(f32_to_bf16(cu, (uint16_t *)ws, in, (long long)n * cin));
        a_in = ws;
        a_w = wb;
    }
    bool done = false;
    MS_TRY(linear_lt(be, &done, out, a_in, a_w, b, n, cin, cout, act, residual));
    if (done) return MS_OK;
    cudaDataType_t ab = linear_operand_type(be->fp32);
    float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublasGemmEx(cu->blas, CUBLAS_OP_T, CUBLAS_OP_N, cout, n, cin, &alpha, a_w, ab,
                              cin, a_in, ab, cin, &beta, out, CUDA_R_32F, cout,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return bias_act(cu, out, b, n, cout, act);
}
