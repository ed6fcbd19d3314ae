/* Convolutions on the GPU. conv2d: cuDNN (NCHW, batch 1), with bias + ReLU
 * fused through cudnnConvolutionBiasActivationForward where cuDNN takes it;
 * otherwise the convolution, then one bias+activation kernel (exact GELU).
 * FP32 mode asks cuDNN for FMA math (no TF32); otherwise tensor cores (TF32
 * for FP32 data). The workspace is the context's; algorithms that need more
 * are skipped. conv_transpose2x2: one GEMM G = W^T X, then a scatter kernel
 * that adds bias and activation (image_cuda_math.h). */
#include "conv.h"
#include "cuda_check.h"
#include "image_cuda_math.h"
#include "linear.h" /* bf16_round, tf32_round */

#define CV_THREADS 256

/* out = in rounded to BF16 (bf16) or TF32 values, still stored as FP32. */
__global__ void round_operand_kernel(float *out, const float *in, long long total, int bf16)
{
    CUDA_FOR(i, total) out[i] = bf16 ? bf16_round(in[i]) : tf32_round(in[i]);
}

/* Tensor-core mode: copies of a GEMM's two operands rounded as the CPU's
 * tc_round does (round to nearest: even for BF16, away for TF32), into ws
 * (cuda_align256(na) + cuda_align256(nb) floats' bytes); *a and *b then point at them. The
 * library's own conversion of these values is exact, whatever its rounding. */
static ms_status round_operands(ms_cuda_ctx *cu, void *ws, const float **a, size_t na,
                                const float **b, size_t nb, bool bf16)
{
    float *ra = (float *)ws, *rb = (float *)((char *)ws + cuda_align256(na * sizeof(float)));
    MS_LAUNCH(round_operand_kernel, cuda_blocks(na, CV_THREADS), CV_THREADS, 0, cu->stream)(ra,
        *a, (long long)na, bf16);
    CUDA_CHECK_LAUNCH("round_operand_kernel");
    MS_LAUNCH(round_operand_kernel, cuda_blocks(nb, CV_THREADS), CV_THREADS, 0, cu->stream)(rb,
        *b, (long long)nb, bf16);
    CUDA_CHECK_LAUNCH("round_operand_kernel");
    *a = ra;
    *b = rb;
    return MS_OK;
}

static size_t round_operands_bytes(size_t na, size_t nb, bool fp32)
{
    return fp32 ? 0 : cuda_align256(na * sizeof(float)) + cuda_align256(nb * sizeof(float));
}

/* Owns the cuDNN descriptors of one call. */
struct dnn_call {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
    cudnnFilterDescriptor_t f = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    cudnnActivationDescriptor_t act = nullptr;
    ~dnn_call()
    {
        if (act) cudnnDestroyActivationDescriptor(act);
        if (conv) cudnnDestroyConvolutionDescriptor(conv);
        if (f) cudnnDestroyFilterDescriptor(f);
        if (bias) cudnnDestroyTensorDescriptor(bias);
        if (y) cudnnDestroyTensorDescriptor(y);
        if (x) cudnnDestroyTensorDescriptor(x);
    }
};

/* out[t] = act(out[t] + b[t / plane]) over a (co, plane) map. */
__global__ void chan_bias_act_kernel(float *out, const float *b, long long plane, long long total,
                                     int act)
{
    CUDA_FOR(t, total) out[t] = act_apply(out[t] + (b ? b[t / plane] : 0.0f), (ms_act)act);
}

extern "C" size_t conv2d_cuda_scratch_bytes(int ci, int h, int wd, int co, int kh, int kw,
                                            int stride, int pad, bool fp32)
{
    /* cuDNN uses the context's workspace; outside FP32 mode the TF32 copies */
    return round_operands_bytes((size_t)ci * h * wd, (size_t)co * ci * kh * kw, fp32);
}

extern "C" ms_status conv2d_cuda(ms_backend *be, float *out, const float *in, const float *w,
                                 const float *b, int ci, int h, int wd, int co, int kh, int kw,
                                 int stride, int pad, ms_act act, void *ws)
{
    ms_cuda_ctx *cu = cuda_ctx_of(be);
    int ho = conv_out_size(h, kh, stride, pad), wo = conv_out_size(wd, kw, stride, pad);
    if (ho < 1 || wo < 1 || ci <= 0 || co <= 0)
        return ms_error(MS_ERR_ARG, "conv2d_cuda: bad sizes");
    if (!be->fp32)
        MS_TRY(round_operands(cu, ws, &in, (size_t)ci * h * wd, &w, (size_t)co * ci * kh * kw,
                              false));
    dnn_call D;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&D.x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&D.y));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&D.f));
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&D.conv));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(D.x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, ci, h, wd));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(D.f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, co, ci, kh, kw));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(D.conv, pad, pad, stride, stride, 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionMathType(D.conv, be->fp32 ? CUDNN_FMA_MATH
                                                             : CUDNN_DEFAULT_MATH));
    int n_, c_, h_, w_;
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(D.conv, D.x, D.f, &n_, &c_, &h_, &w_));
    if (n_ != 1 || c_ != co || h_ != ho || w_ != wo)
        return ms_error(MS_ERR_CUDA, "conv2d_cuda: cuDNN output %dx%dx%d, expected %dx%dx%d", c_,
                        h_, w_, co, ho, wo);
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(D.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, co, ho, wo));

    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0;
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(cu->dnn, D.x, D.f, D.conv, D.y,
                                                       CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got,
                                                       perf));
    /* Outside FP32 mode, no transform algorithms (FFT, Winograd): their
     * transformed operands are no longer TF32 values, so the tensor cores
     * would round them again and the result would drift from the CPU's
     * tc_round by ~2^-11 instead of summation order. */
    int pick = -1;
    for (int i = 0; i < got && pick < 0; i++) {
        cudnnConvolutionFwdAlgo_t a = perf[i].algo;
        bool transform = a == CUDNN_CONVOLUTION_FWD_ALGO_FFT ||
                         a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
                         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
                         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
        if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= cu->workspace_bytes &&
            (be->fp32 ? perf[i].mathType != CUDNN_TENSOR_OP_MATH &&
                            perf[i].mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
                      : !transform))
            pick = i;
    }
    if (pick < 0)
        return ms_error(MS_ERR_UNSUPPORTED,
                        "conv2d_cuda: no cuDNN algorithm for %dx%dx%d -> %d (%dx%d s%d p%d) "
                        "within %zu bytes of workspace",
                        ci, h, wd, co, kh, kw, stride, pad, cu->workspace_bytes);
    cudnnConvolutionFwdAlgo_t algo = perf[pick].algo;
    const float one = 1.0f, zero = 0.0f;

    if (act == MS_ACT_RELU && b) {
        CUDNN_CHECK(cudnnCreateTensorDescriptor(&D.bias));
        CUDNN_CHECK(cudnnSetTensor4dDescriptor(D.bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, co,
                                               1, 1));
        CUDNN_CHECK(cudnnCreateActivationDescriptor(&D.act));
        CUDNN_CHECK(cudnnSetActivationDescriptor(D.act, CUDNN_ACTIVATION_RELU,
                                                 CUDNN_NOT_PROPAGATE_NAN, 0.0));
        cudnnStatus_t fs = cudnnConvolutionBiasActivationForward(
            cu->dnn, &one, D.x, in, D.f, w, D.conv, algo, cu->workspace, cu->workspace_bytes,
            &zero, D.y, out, D.bias, b, D.act, D.y, out);
        if (fs == CUDNN_STATUS_SUCCESS) return MS_OK;
#ifdef CUDNN_STATUS_CATEGORY /* cuDNN 9: "not supported" comes with a reason, 3001..3014 */
        const bool unsupported = CUDNN_STATUS_CATEGORY(fs) == CUDNN_STATUS_NOT_SUPPORTED;
#else
        const bool unsupported = fs == CUDNN_STATUS_NOT_SUPPORTED;
#endif
        if (!unsupported) CUDNN_CHECK(fs);
        /* not supported for this algorithm: unfused below */
    }
    CUDNN_CHECK(cudnnConvolutionForward(cu->dnn, &one, D.x, in, D.f, w, D.conv, algo,
                                        cu->workspace, cu->workspace_bytes, &zero, D.y, out));
    if (!b && act == MS_ACT_NONE) return MS_OK;
    long long plane = (long long)ho * wo, total = plane * co;
    MS_LAUNCH(chan_bias_act_kernel, cuda_blocks((size_t)total, CV_THREADS), CV_THREADS, 0,
              cu->stream)(out, b, plane, total, (int)act);
    CUDA_CHECK_LAUNCH("chan_bias_act_kernel");
    return MS_OK;
}

__global__ void convt2x2_scatter_kernel(float *out, const float *g, const float *b, int h, int w,
                                        long long total, int act)
{
    CUDA_FOR(t, total) out[t] = convt2x2_pixel(g, b, h, w, (long)t, (ms_act)act);
}

extern "C" size_t conv_transpose2x2_cuda_scratch_bytes(int ci, int h, int wd, int co, bool fp32)
{
    /* G, then outside FP32 mode the BF16-rounded copies */
    return cuda_align256((size_t)4 * co * h * wd * sizeof(float)) +
           round_operands_bytes((size_t)ci * h * wd, (size_t)ci * co * 4, fp32);
}

extern "C" ms_status conv_transpose2x2_cuda(ms_backend *be, float *out, const float *in,
                                            const float *w, const float *b, int ci, int h, int wd,
                                            int co, ms_act act, void *ws)
{
    ms_cuda_ctx *cu = cuda_ctx_of(be);
    long long hw = (long long)h * wd;
    if (hw <= 0 || co <= 0 || ci <= 0) return MS_OK;
    if (hw > INT32_MAX || 4LL * co > INT32_MAX)
        return ms_error(MS_ERR_UNSUPPORTED, "conv_transpose2x2_cuda: sizes too large");
    float *g = (float *)ws; /* (4 co, h w) */
    if (!be->fp32)
        MS_TRY(round_operands(cu, (char *)ws + cuda_align256((size_t)4 * co * hw * sizeof(float)), &in,
                              (size_t)ci * hw, &w, (size_t)ci * co * 4, true));
    /* Column-major: G^T (hw x 4co) = X^T (hw x ci, ld hw) * Wm (4co x ci, ld 4co)^T. */
    MS_TRY(cuda_gemm_batched(cu, be->fp32, CUBLAS_OP_N, CUBLAS_OP_T, (int)hw, 4 * co, ci, 1.0f, in,
                             (int)hw, 0, w, 4 * co, 0, 0.0f, g, (int)hw, 0, 1));
    long long total = 4 * hw * co;
    MS_LAUNCH(convt2x2_scatter_kernel, cuda_blocks((size_t)total, CV_THREADS), CV_THREADS, 0,
              cu->stream)(out, g, b, h, wd, total, (int)act);
    CUDA_CHECK_LAUNCH("convt2x2_scatter_kernel");
    return MS_OK;
}
