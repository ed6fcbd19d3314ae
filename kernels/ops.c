/* The backend-neutral ops: check sizes, take scratch from be->scratch, then
 * run the CPU reference (kernels/<op>.c) or its CUDA twin (kernels/<op>.cu).
 * In a dry run (arena sizing) nothing is computed, but scratch is still taken
 * and given back, so the sizing pass counts it and later images allocate
 * nothing. */
#include "ops.h"

#include <limits.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attention_full.h"
#include "conv.h"
#include "elementwise.h"
#include "layernorm.h"
#include "linear.h"
#include "mita.h"
#include "pool.h"
#include "resize.h"

/* ON_CUDA(call): the function's CUDA branch; without CUDA, an error.
 * CUDA_BYTES(call): the CUDA version's scratch size. */
#ifdef MS_HAVE_CUDA
#define ON_CUDA(call) return (call)
#define CUDA_BYTES(call) (call)
#else
static ms_status no_cuda(const char *op)
{
    return ms_error(MS_ERR_UNSUPPORTED, "%s: this build has no CUDA backend", op);
}
#define ON_CUDA(call) return no_cuda(__func__)
#define CUDA_BYTES(call) ((size_t)0)
#endif

#define BAD_SIZES(op, fmt, ...) \
    ms_error(MS_ERR_ARG, "%s: bad sizes (" fmt ")", op, __VA_ARGS__)

/* How many parallel chunks CPU ops with per-thread scratch split into. */
static int cpu_chunks(const ms_backend *be)
{
    int t = be->threads;
#ifdef _OPENMP
    if (t <= 0) t = omp_get_max_threads();
#endif
    return t < 1 ? 1 : (t > 256 ? 256 : t);
}

/* Op scratch: from be->scratch when set, else (tests) from the heap. */
typedef struct {
    void *ptr;
    size_t mark;
    bool heap;
} op_scratch;

static ms_status scratch_take(ms_backend *be, op_scratch *s, size_t bytes, const char *op)
{
    s->ptr = NULL;
    s->mark = 0;
    s->heap = false;
    if (be->scratch) {
        s->mark = arena_mark(be->scratch);
        if (bytes == 0) return MS_OK;
        s->ptr = arena_alloc(be->scratch, bytes);
        if (!s->ptr) return ms_error_prefix(MS_ERR_OOM, "%s: scratch", op);
        return MS_OK;
    }
    if (be->dry_run || bytes == 0) return MS_OK;
    if (be->device != MS_DEVICE_CPU)
        return ms_error(MS_ERR_ARG, "%s: device ops need be->scratch", op);
    s->ptr = ms_malloc(bytes);
    MS_CHECK_ALLOC(s->ptr, bytes);
    s->heap = true;
    return MS_OK;
}

static void scratch_give_back(ms_backend *be, op_scratch *s)
{
    if (s->heap) ms_free(s->ptr);
    else if (be->scratch) arena_reset(be->scratch, s->mark);
    s->ptr = NULL;
}

/* be->tc_round (CPU): dst = src with every element rounded to BF16 (bf16)
 * or TF32, the operands a tensor-core GEMM sees. */
static void tc_round_copy(float *dst, const float *src, size_t n, bool bf16)
{
    for (size_t i = 0; i < n; i++) dst[i] = bf16 ? bf16_round(src[i]) : tf32_round(src[i]);
}

/* CPU with be->tc_round: rounded copies of a GEMM's two operands in scratch
 * (na + nb floats, taken and given back by the caller). */
static void tc_round_operands(float *s, const float **a, size_t na, const float **b, size_t nb,
                              bool bf16)
{
    tc_round_copy(s, *a, na, bf16);
    tc_round_copy(s + na, *b, nb, bf16);
    *a = s;
    *b = s + na;
}

ms_status op_linear(ms_backend *be, float *out, const float *in, const float *w, const float *b,
                    int n, int cin, int cout, ms_act act, bool residual)
{
    if (n <= 0 || cin <= 0 || cout <= 0)
        return BAD_SIZES(__func__, "n=%d cin=%d cout=%d", n, cin, cout);
    if (residual && act != MS_ACT_NONE)
        return ms_error(MS_ERR_ARG, "%s: a residual linear takes no activation", __func__);
    if (be->device == MS_DEVICE_CPU && !be->tc_round) {
        if (!be->dry_run) linear_cpu(out, in, w, b, n, cin, cout, act, residual);
        return MS_OK;
    }
    if (be->device == MS_DEVICE_CPU) { /* tc_round: BF16 operands, as on CUDA */
        size_t ni = (size_t)n * cin, nw = (size_t)cout * cin;
        op_scratch s;
        MS_TRY(scratch_take(be, &s, (ni + nw) * sizeof(float), __func__));
        if (!be->dry_run) {
            tc_round_operands((float *)s.ptr, &in, ni, &w, nw, true);
            linear_cpu(out, in, w, b, n, cin, cout, act, residual);
        }
        scratch_give_back(be, &s);
        return MS_OK;
    }
    op_scratch s; /* CUDA: the input's BF16 copy outside FP32 mode */
    MS_TRY(scratch_take(be, &s, CUDA_BYTES(linear_cuda_scratch_bytes(n, cin, be->fp32)),
                        __func__));
    ms_status st = MS_OK;
    if (!be->dry_run) {
#ifdef MS_HAVE_CUDA
        st = linear_cuda(be, out, in, w, b, n, cin, cout, act, residual, s.ptr);
#else
        st = no_cuda(__func__);
#endif
    }
    scratch_give_back(be, &s);
    return st;
}

ms_status op_layernorm(ms_backend *be, float *out, const float *in, const float *w,
                       const float *b, int n, int c, float eps)
{
    if (n <= 0 || c <= 0) return BAD_SIZES(__func__, "n=%d c=%d", n, c);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        layernorm_cpu(out, in, w, b, n, c, eps);
        return MS_OK;
    }
    ON_CUDA(layernorm_cuda(be, out, in, w, b, n, c, eps));
}

ms_status op_add(ms_backend *be, float *out, const float *a, const float *b, size_t n)
{
    if (n == 0) return BAD_SIZES(__func__, "n=%zu", n);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        add_cpu(out, a, b, n);
        return MS_OK;
    }
    ON_CUDA(add_cuda(be, out, a, b, n));
}

ms_status op_transpose(ms_backend *be, float *out, const float *in, int rows, int cols)
{
    if (rows <= 0 || cols <= 0) return BAD_SIZES(__func__, "rows=%d cols=%d", rows, cols);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        transpose_cpu(out, in, rows, cols);
        return MS_OK;
    }
    ON_CUDA(transpose_cuda(be, out, in, rows, cols));
}

ms_status op_softmax_rows(ms_backend *be, float *x, int rows, int cols)
{
    if (rows <= 0 || cols <= 0) return BAD_SIZES(__func__, "rows=%d cols=%d", rows, cols);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        softmax_rows_cpu(x, rows, cols);
        return MS_OK;
    }
    ON_CUDA(softmax_rows_cuda(be, x, rows, cols));
}

ms_status op_attention_full(ms_backend *be, float *out, const float *qkv, int n, int c,
                            int heads)
{
    if (n <= 0 || c <= 0 || heads <= 0 || c % heads != 0)
        return BAD_SIZES(__func__, "n=%d c=%d heads=%d; c must be a multiple of heads", n, c,
                         heads);
    int chunks = cpu_chunks(be);
    size_t bytes = be->device == MS_DEVICE_CUDA
                       ? CUDA_BYTES(attention_full_cuda_scratch_bytes(n, c, heads))
                       : attention_full_scratch_floats(n, c, MS_ATTN_QB, MS_ATTN_KB, chunks) *
                             sizeof(float);
    op_scratch s;
    MS_TRY(scratch_take(be, &s, bytes, __func__));
    ms_status st = MS_OK;
    if (!be->dry_run) {
        if (be->device == MS_DEVICE_CPU)
            attention_full_cpu(out, qkv, n, c, heads, MS_ATTN_QB, MS_ATTN_KB, (float *)s.ptr,
                               chunks);
        else {
#ifdef MS_HAVE_CUDA
            st = attention_full_cuda(be, out, qkv, n, c, heads, s.ptr);
#else
            st = no_cuda(__func__);
#endif
        }
    }
    scratch_give_back(be, &s);
    return st;
}

ms_status op_mita(ms_backend *be, float *out, const float *qkv, int hp, int wp, int c, int heads,
                  const ms_mita_params *p, const ms_mita_record *rec)
{
    if (!p) return ms_error(MS_ERR_ARG, "%s: no parameters", __func__);
    if (hp <= 0 || wp <= 0 || c <= 0 || heads <= 0 || c % heads != 0)
        return BAD_SIZES(__func__, "hp=%d wp=%d c=%d heads=%d; c must be a multiple of heads",
                         hp, wp, c, heads);
    if ((long long)hp * wp > INT_MAX / 64)
        return BAD_SIZES(__func__, "hp=%d wp=%d: too many tokens", hp, wp);
    if (p->gh <= 0 || p->gw <= 0 || p->topk <= 0 || p->ncls < 0 || p->ncls > 1)
        return BAD_SIZES(__func__, "gh=%d gw=%d topk=%d ncls=%d", p->gh, p->gw, p->topk, p->ncls);
    int gh, gw, k, nc = p->ncls;
    mita_clamp(&gh, &gw, &k, hp, wp, p); /* the caller clamps too; be defensive */
    int chunks = cpu_chunks(be);
    size_t bytes = be->device == MS_DEVICE_CUDA
                       ? CUDA_BYTES(mita_cuda_scratch_bytes(hp, wp, nc, c, heads, gh, gw, k))
                       : mita_scratch_bytes(hp, wp, nc, c, heads, gh, gw, k, chunks);
    op_scratch s;
    MS_TRY(scratch_take(be, &s, bytes, __func__));
    ms_status st = MS_OK;
    if (!be->dry_run) {
        if (be->device == MS_DEVICE_CPU)
            mita_cpu(out, qkv, hp, wp, nc, c, heads, gh, gw, k, p->shared_scale_d, rec, s.ptr,
                     chunks);
        else {
#ifdef MS_HAVE_CUDA
            st = mita_cuda(be, out, qkv, hp, wp, nc, c, heads, gh, gw, k, p->shared_scale_d, rec,
                           s.ptr);
#else
            st = no_cuda(__func__);
#endif
        }
    }
    scratch_give_back(be, &s);
    return st;
}

void op_mita_prepare(const ms_backend *be, int c, int heads, const ms_mita_params *p)
{
    if (be->device == MS_DEVICE_CPU && p && c > 0 && heads > 0 && c % heads == 0 && p->gh > 0 &&
        p->gw > 0 && p->topk > 0)
        mita_cpu_prepare(c, heads, p->gh, p->gw, p->topk);
}

ms_status op_adaptive_avgpool(ms_backend *be, float *out, const float *in, int c, int h, int w,
                              int gh, int gw)
{
    if (c <= 0 || h <= 0 || w <= 0 || gh <= 0 || gw <= 0)
        return BAD_SIZES(__func__, "c=%d h=%d w=%d gh=%d gw=%d", c, h, w, gh, gw);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        adaptive_avgpool_cpu(out, in, c, h, w, gh, gw);
        return MS_OK;
    }
    ON_CUDA(adaptive_avgpool_cuda(be, out, in, c, h, w, gh, gw));
}

ms_status op_conv2d(ms_backend *be, float *out, const float *in, const float *w, const float *b,
                    int ci, int h, int wd, int co, int kh, int kw, int stride, int pad,
                    ms_act act)
{
    if (ci <= 0 || h <= 0 || wd <= 0 || co <= 0 || kh <= 0 || kw <= 0 || stride <= 0 || pad < 0)
        return BAD_SIZES(__func__, "ci=%d h=%d w=%d co=%d k=%dx%d stride=%d pad=%d", ci, h, wd,
                         co, kh, kw, stride, pad);
    int ho = conv_out_size(h, kh, stride, pad), wo = conv_out_size(wd, kw, stride, pad);
    if (ho < 1 || wo < 1 || (long long)ho * wo > INT_MAX || (long long)ci * kh * kw > INT_MAX)
        return BAD_SIZES(__func__, "%dx%d input, %dx%d kernel, stride %d, pad %d: output %dx%d",
                         h, wd, kh, kw, stride, pad, ho, wo);
    size_t floats = conv2d_scratch_floats(ci, h, wd, co, kh, kw, stride, pad);
    /* tc_round: TF32 copies of input and weights after the conv's own scratch */
    size_t ni = (size_t)ci * h * wd, nw = (size_t)co * ci * kh * kw;
    size_t tc = be->device == MS_DEVICE_CPU && be->tc_round ? ni + nw : 0;
    size_t bytes = be->device == MS_DEVICE_CUDA
                       ? CUDA_BYTES(conv2d_cuda_scratch_bytes(ci, h, wd, co, kh, kw, stride, pad,
                                                              be->fp32))
                       : (floats + tc) * sizeof(float);
    op_scratch s;
    MS_TRY(scratch_take(be, &s, bytes, __func__));
    ms_status st = MS_OK;
    if (!be->dry_run) {
        if (be->device == MS_DEVICE_CPU) {
            if (tc) tc_round_operands((float *)s.ptr + floats, &in, ni, &w, nw, false);
            conv2d_cpu(out, in, w, b, ci, h, wd, co, kh, kw, stride, pad, act, (float *)s.ptr,
                       floats);
        }
        else {
#ifdef MS_HAVE_CUDA
            st = conv2d_cuda(be, out, in, w, b, ci, h, wd, co, kh, kw, stride, pad, act, s.ptr);
#else
            st = no_cuda(__func__);
#endif
        }
    }
    scratch_give_back(be, &s);
    return st;
}

ms_status op_conv_transpose2x2(ms_backend *be, float *out, const float *in, const float *w,
                               const float *b, int ci, int h, int wd, int co, ms_act act)
{
    if (ci <= 0 || h <= 0 || wd <= 0 || co <= 0 || (long long)h * wd > INT_MAX / 4 ||
        (long long)co * 4 * wd > INT_MAX)
        return BAD_SIZES(__func__, "ci=%d h=%d w=%d co=%d", ci, h, wd, co);
    size_t floats = conv_transpose2x2_scratch_floats(ci, h, wd, co);
    /* tc_round: BF16 copies of input and weights (cuBLAS FAST_16BF) */
    size_t ni = (size_t)ci * h * wd, nw = (size_t)ci * co * 4;
    size_t tc = be->device == MS_DEVICE_CPU && be->tc_round ? ni + nw : 0;
    size_t bytes = be->device == MS_DEVICE_CUDA
                       ? CUDA_BYTES(conv_transpose2x2_cuda_scratch_bytes(ci, h, wd, co, be->fp32))
                       : (floats + tc) * sizeof(float);
    op_scratch s;
    MS_TRY(scratch_take(be, &s, bytes, __func__));
    ms_status st = MS_OK;
    if (!be->dry_run) {
        if (be->device == MS_DEVICE_CPU) {
            if (tc) tc_round_operands((float *)s.ptr + floats, &in, ni, &w, nw, true);
            conv_transpose2x2_cpu(out, in, w, b, ci, h, wd, co, act, (float *)s.ptr, floats);
        }
        else {
#ifdef MS_HAVE_CUDA
            st = conv_transpose2x2_cuda(be, out, in, w, b, ci, h, wd, co, act, s.ptr);
#else
            st = no_cuda(__func__);
#endif
        }
    }
    scratch_give_back(be, &s);
    return st;
}

ms_status op_maxpool2x2(ms_backend *be, float *out, const float *in, int c, int h, int w)
{
    if (c <= 0 || h < 2 || w < 2)
        return BAD_SIZES(__func__, "c=%d h=%d w=%d; h and w must be >= 2", c, h, w);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        maxpool2x2_cpu(out, in, c, h, w);
        return MS_OK;
    }
    ON_CUDA(maxpool2x2_cuda(be, out, in, c, h, w));
}

ms_status op_resize_bilinear(ms_backend *be, float *out, const float *in, int c, int h, int w,
                             int ho, int wo, double scale_h, double scale_w)
{
    if (c <= 0 || h <= 0 || w <= 0 || ho <= 0 || wo <= 0)
        return BAD_SIZES(__func__, "c=%d h=%d w=%d ho=%d wo=%d", c, h, w, ho, wo);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        resize_bilinear_cpu(out, in, c, h, w, ho, wo, 0, ho, scale_h, scale_w);
        return MS_OK;
    }
    ON_CUDA(resize_bilinear_cuda(be, out, in, c, h, w, ho, wo, 0, ho, scale_h, scale_w));
}

ms_status op_resize_bilinear_rows(ms_backend *be, float *out, const float *in, int c, int h, int w,
                                  int ho, int wo, int y_begin, int y_end)
{
    if (c <= 0 || h <= 0 || w <= 0 || ho <= 0 || wo <= 0 || y_begin < 0 || y_end > ho ||
        y_begin >= y_end)
        return BAD_SIZES(__func__, "c=%d h=%d w=%d ho=%d wo=%d rows %d..%d", c, h, w, ho, wo,
                         y_begin, y_end);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        resize_bilinear_cpu(out, in, c, h, w, ho, wo, y_begin, y_end, 0, 0);
        return MS_OK;
    }
    ON_CUDA(resize_bilinear_cuda(be, out, in, c, h, w, ho, wo, y_begin, y_end, 0, 0));
}

ms_status op_resize_bicubic(ms_backend *be, float *out, const float *in, int c, int h, int w,
                            int ho, int wo)
{
    if (c <= 0 || h <= 0 || w <= 0 || ho <= 0 || wo <= 0)
        return BAD_SIZES(__func__, "c=%d h=%d w=%d ho=%d wo=%d", c, h, w, ho, wo);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        resize_bicubic_cpu(out, in, c, h, w, ho, wo);
        return MS_OK;
    }
    ON_CUDA(resize_bicubic_cuda(be, out, in, c, h, w, ho, wo));
}

ms_status op_crop(ms_backend *be, float *out, const float *in, int c, int h, int w, int ho,
                  int wo)
{
    if (c <= 0 || ho <= 0 || wo <= 0 || ho > h || wo > w)
        return BAD_SIZES(__func__, "c=%d %dx%d cropped to %dx%d", c, h, w, ho, wo);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        crop_cpu(out, in, c, h, w, ho, wo);
        return MS_OK;
    }
    ON_CUDA(crop_cuda(be, out, in, c, h, w, ho, wo));
}

ms_status op_window_add(ms_backend *be, float *acc, const float *win, int c, int h, int w, int wh,
                        int ww, int y0, int x0, bool first)
{
    if (c <= 0 || wh <= 0 || ww <= 0 || y0 < 0 || x0 < 0 || y0 + wh > h || x0 + ww > w)
        return BAD_SIZES(__func__, "c=%d window %dx%d at (%d, %d) in %dx%d", c, wh, ww, y0, x0, h, w);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        window_add_cpu(acc, win, c, h, w, wh, ww, y0, x0, first);
        return MS_OK;
    }
    ON_CUDA(window_add_cuda(be, acc, win, c, h, w, wh, ww, y0, x0, first));
}

ms_status op_window_average(ms_backend *be, float *acc, int c, int h, int w, int wh, int ww,
                            int sh, int sw)
{
    if (c <= 0 || h <= 0 || w <= 0 || wh <= 0 || ww <= 0 || sh <= 0 || sw <= 0)
        return BAD_SIZES(__func__, "c=%d %dx%d windows %dx%d strides %d, %d", c, h, w, wh, ww,
                         sh, sw);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        window_average_cpu(acc, c, h, w, wh, ww, sh, sw);
        return MS_OK;
    }
    ON_CUDA(window_average_cuda(be, acc, c, h, w, wh, ww, sh, sw));
}

ms_status op_argmax(ms_backend *be, uint8_t *out, const float *in, int c, int h, int w)
{
    if (c <= 0 || c > 256 || h <= 0 || w <= 0)
        return BAD_SIZES(__func__, "c=%d h=%d w=%d; 1..256 classes", c, h, w);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        argmax_cpu(out, in, c, h, w);
        return MS_OK;
    }
    ON_CUDA(argmax_cuda(be, out, in, c, h, w));
}

ms_status op_normalize_pad(ms_backend *be, float *out, const float *in, int h, int w, int hp,
                           int wp, const float mean[3], const float stdv[3])
{
    if (h <= 0 || w <= 0 || hp < h || wp < w)
        return BAD_SIZES(__func__, "%dx%d padded to %dx%d", h, w, hp, wp);
    if (be->dry_run) return MS_OK;
    if (be->device == MS_DEVICE_CPU) {
        normalize_pad_cpu(out, in, h, w, hp, wp, mean, stdv);
        return MS_OK;
    }
    ON_CUDA(normalize_pad_cuda(be, out, in, h, w, hp, wp, mean, stdv));
}
