/* The self-test (selftest.h): ops and a bundled model on a device against
 * the CPU. Shapes are small (the whole GPU run takes well under a second)
 * but odd, past the kernels' tiles where it costs nothing. */
#include "selftest.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "model_file.h"
#ifdef MS_HAVE_CUDA
#include "kernels/cuda_ctx.h"
#endif

/* Tolerances, normwise. FP32 (and ops without a GEMM, FP32 in both modes):
 * only summation orders differ. Tensor-core GEMMs against the CPU with the
 * same operand rounding (the GPU rounds the operands with its own kernels,
 * kernels/linear.cu and conv.cu): again only the FP32 accumulation order. */
#define ST_TOL 1e-4
#define ST_TOL_MODEL 1e-3      /* logits after many layers */
#define ST_MASK_SAME 0.995     /* a pixel whose top two logits nearly tie may flip */
#define ST_REC_DIFF 0.001      /* MiTA decisions at near-ties */

static ms_selftest_row *row_add(ms_selftest *st, const char *op, const char *device,
                                const char *ref)
{
    if (st->count == st->cap) {
        int cap = st->cap ? 2 * st->cap : 32;
        ms_selftest_row *r = realloc(st->rows, (size_t)cap * sizeof *r);
        if (!r) return NULL;
        st->rows = r;
        st->cap = cap;
    }
    ms_selftest_row *r = &st->rows[st->count++];
    memset(r, 0, sizeof *r);
    snprintf(r->op, sizeof r->op, "%s", op);
    snprintf(r->device, sizeof r->device, "%s", device);
    snprintf(r->reference, sizeof r->reference, "%s", ref);
    return r;
}

static void row_fail(ms_selftest *st, ms_selftest_row *r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void row_fail(ms_selftest *st, ms_selftest_row *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof r->detail, fmt, ap);
    va_end(ap);
    r->pass = false;
    r->err = NAN;
    st->failed++;
}

static void row_judge(ms_selftest *st, ms_selftest_row *r, double err, double tol)
{
    r->err = err;
    r->tol = tol;
    r->pass = err <= tol; /* NaN (an unwritten element) fails */
    if (!r->pass) st->failed++;
}

/* max|a - b| / max|b|; NaN anywhere in a gives NaN. */
static double normwise_err(const float *a /* (n) */, const float *b /* (n) */, size_t n)
{
    double d = 0, s = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (e != e) return NAN;
        d = e > d ? e : d;
        s = fabs((double)b[i]) > s ? fabs((double)b[i]) : s;
    }
    return d / s;
}

void selftest_free(ms_selftest *st)
{
    free(st->rows);
    memset(st, 0, sizeof *st);
}

ms_status result_compare(ms_agreement *a, const ms_result *got, const ms_result *ref)
{
    memset(a, 0, sizeof *a);
    if (got->h != ref->h || got->w != ref->w || got->classes != ref->classes)
        return ms_error(MS_ERR_ARG, "results differ in size: %dx%dx%d vs %dx%dx%d",
                        got->classes, got->h, got->w, ref->classes, ref->h, ref->w);
    size_t np = (size_t)ref->h * ref->w, same = 0;
    for (size_t i = 0; i < np; i++) same += got->mask[i] == ref->mask[i];
    a->mask_same = np ? (double)same / (double)np : 1.0;
    a->logits_err = normwise_err(got->logits, ref->logits, np * (size_t)ref->classes);
    if (ref->attention != MS_ATTN_MITA || !ref->topk_idx || !got->topk_idx || !ref->layer_mita)
        return MS_OK;
    if (got->depth != ref->depth || got->heads != ref->heads || got->m != ref->m ||
        got->k != ref->k || got->n != ref->n || got->ncls != ref->ncls)
        return ms_error(MS_ERR_ARG, "MiTA records differ in shape");
    /* route: n + ncls entries per head, a class token's last */
    size_t per = (size_t)ref->heads * ref->m * ref->k, pr = (size_t)ref->heads * (ref->n + ref->ncls);
    for (int l = 0; l < ref->depth; l++) {
        if (!ref->layer_mita[l]) continue;
        for (size_t j = 0; j < per; j++)
            a->rec_diff += got->topk_idx[l * per + j] != ref->topk_idx[l * per + j];
        for (size_t j = 0; j < pr; j++)
            a->rec_diff += got->route[l * pr + j] != ref->route[l * pr + j];
        a->rec_total += per + pr;
    }
    return MS_OK;
}

/* ---- ops ---- */

/* The device under test: its backend and memory (host arenas on the CPU). */
typedef struct {
    ms_backend be;
    ms_arena mem, scratch;
} st_target;

static void st_rand(float *x, size_t n, uint32_t seed, float lo, float hi)
{
    uint64_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = lo + (hi - lo) * (float)((s >> 40) / 16777216.0);
    }
}

static void *st_alloc(st_target *t, size_t bytes) { return arena_alloc(&t->mem, bytes); }

static ms_status st_copy_in(st_target *t, void *d, const void *h, size_t bytes)
{
#ifdef MS_HAVE_CUDA
    if (t->be.device == MS_DEVICE_CUDA) return cuda_copy_h2d(t->be.cuda, d, h, bytes);
#endif
    memcpy(d, h, bytes);
    return MS_OK;
}

static ms_status st_copy_out(st_target *t, void *h, const void *d, size_t bytes)
{
#ifdef MS_HAVE_CUDA
    if (t->be.device == MS_DEVICE_CUDA) {
        MS_TRY(cuda_copy_d2h(t->be.cuda, h, d, bytes));
        return cuda_sync(t->be.cuda);
    }
#endif
    memcpy(h, d, bytes);
    return MS_OK;
}

/* NaN floats (and -1 ints) everywhere, before every launch. */
static ms_status st_poison(st_target *t, void *d, size_t bytes)
{
#ifdef MS_HAVE_CUDA
    if (t->be.device == MS_DEVICE_CUDA) return cuda_fill_bytes(t->be.cuda, d, 0xFF, bytes);
#endif
    memset(d, 0xFF, bytes);
    return MS_OK;
}

/* A device copy of host floats, or NULL (message set). */
static float *st_put(st_target *t, const float *h, size_t n)
{
    float *d = st_alloc(t, n * sizeof(float));
    if (d && st_copy_in(t, d, h, n * sizeof(float)) != MS_OK) return NULL;
    return d;
}

/* One op: fills ref (on the CPU) and got (on the target, copied back) from
 * the same random inputs, and sets *nout. */
typedef ms_status (*st_op_fn)(st_target *t, ms_backend *cpu, float *got /* (*nout) */,
                              float *ref /* (*nout) */, size_t *nout);

#define ST_MAX_OUT ((size_t)1 << 17)

/* A random input of n floats: name_h on the host, name_d on the target. */
#define ST_IN(name, n, seed, lo, hi)                                   \
    float name##_h[(n) > 0 ? (n) : 1];                                  \
    st_rand(name##_h, (n), (seed), (lo), (hi));                         \
    float *name##_d = st_put(t, name##_h, (n));                         \
    if (!name##_d) return ms_error_prefix(MS_ERR_OOM, "self-test input")

/* Device output of n floats, poisoned; on return *nout = n. */
static ms_status st_out(st_target *t, float **d, size_t n, size_t *nout)
{
    if (n > ST_MAX_OUT) return ms_error(MS_ERR_ARG, "self-test output too large");
    *d = st_alloc(t, n * sizeof(float));
    if (!*d) return ms_error_prefix(MS_ERR_OOM, "self-test output");
    *nout = n;
    return st_poison(t, *d, n * sizeof(float));
}

static ms_status op_t_linear(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { N = 37, CI = 96, CO = 130 };
    ST_IN(x, N * CI, 1, -1, 1);
    ST_IN(w, CO * CI, 2, -1, 1);
    ST_IN(b, CO, 3, -1, 1);
    float *d;
    MS_TRY(st_out(t, &d, N * CO, no));
    MS_TRY(op_linear(cpu, ref, x_h, w_h, b_h, N, CI, CO, MS_ACT_GELU, false));
    MS_TRY(op_linear(&t->be, d, x_d, w_d, b_d, N, CI, CO, MS_ACT_GELU, false));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

static ms_status op_t_layernorm(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { N = 33, C = 200 };
    ST_IN(x, N * C, 4, 20, 24); /* a large mean, as in ViT residual streams */
    ST_IN(w, C, 5, 0.5f, 1.5f);
    ST_IN(b, C, 6, -1, 1);
    float *d;
    MS_TRY(st_out(t, &d, N * C, no));
    MS_TRY(op_layernorm(cpu, ref, x_h, w_h, b_h, N, C, 1e-6f));
    MS_TRY(op_layernorm(&t->be, d, x_d, w_d, b_d, N, C, 1e-6f));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

static ms_status op_t_add(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { N = 1031 };
    ST_IN(a, N, 7, -3, 3);
    ST_IN(b, N, 8, -3, 3);
    float *d;
    MS_TRY(st_out(t, &d, N, no));
    MS_TRY(op_add(cpu, ref, a_h, b_h, N));
    MS_TRY(op_add(&t->be, d, a_d, b_d, N));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

static ms_status op_t_transpose(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { R = 37, C = 70 };
    ST_IN(x, R * C, 9, -3, 3);
    float *d;
    MS_TRY(st_out(t, &d, R * C, no));
    MS_TRY(op_transpose(cpu, ref, x_h, R, C));
    MS_TRY(op_transpose(&t->be, d, x_d, R, C));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

static ms_status op_t_softmax(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { R = 9, C = 1000 };
    ST_IN(x, R * C, 10, -8, 8);
    float *d;
    MS_TRY(st_out(t, &d, R * C, no));
    MS_TRY(st_copy_in(t, d, x_h, sizeof x_h)); /* in place */
    memcpy(ref, x_h, sizeof x_h);
    MS_TRY(op_softmax_rows(cpu, ref, R, C));
    MS_TRY(op_softmax_rows(&t->be, d, R, C));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

static ms_status op_t_attention(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { N = 130, C = 128, H = 2 }; /* d = 64, n past the 128-query tile */
    ST_IN(qkv, N * 3 * C, 11, -2, 2);
    float *d;
    MS_TRY(st_out(t, &d, N * C, no));
    MS_TRY(op_attention_full(cpu, ref, qkv_h, N, C, H));
    MS_TRY(op_attention_full(&t->be, d, qkv_d, N, C, H));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

/* MiTA's output; its decisions (topk_idx, route) must match exactly: with
 * these inputs the closest scores are far apart compared with FP32
 * summation-order differences (measured: inputs perturbed by up to 1e-5
 * relative, 200 times, never changed a decision). */
static ms_status op_t_mita(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { HP = 9, WP = 11, N = HP * WP, C = 128, H = 2, G = 7, K = 20, M = G * G };
    ST_IN(qkv, N * 3 * C, 12, -1.5f, 1.5f);
    float *d;
    MS_TRY(st_out(t, &d, N * C, no));
    ms_mita_params p = {G, G, K, true};
    int32_t rtk[H * M * K], rrt[H * N], gtk[H * M * K], grt[H * N];
    int32_t *dtk = st_alloc(t, sizeof gtk), *drt = st_alloc(t, sizeof grt);
    if (!dtk || !drt) return ms_error_prefix(MS_ERR_OOM, "self-test output");
    MS_TRY(st_poison(t, dtk, sizeof gtk));
    MS_TRY(st_poison(t, drt, sizeof grt));
    ms_mita_record rr = {rtk, rrt, NULL}, gr = {dtk, drt, NULL};
    MS_TRY(op_mita(cpu, ref, qkv_h, HP, WP, C, H, &p, &rr));
    MS_TRY(op_mita(&t->be, d, qkv_d, HP, WP, C, H, &p, &gr));
    MS_TRY(st_copy_out(t, gtk, dtk, sizeof gtk));
    MS_TRY(st_copy_out(t, grt, drt, sizeof grt));
    if (memcmp(gtk, rtk, sizeof gtk) || memcmp(grt, rrt, sizeof grt))
        return ms_error(MS_ERR_CUDA, "mita: top-k indices or routes differ from the CPU's");
    return st_copy_out(t, got, d, *no * sizeof(float));
}

static ms_status op_t_conv2d(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { CI = 8, H = 17, W = 13, CO = 12 };
    ST_IN(x, CI * H * W, 13, -1, 1);
    ST_IN(w, CO * CI * 9, 14, -1, 1);
    ST_IN(b, CO, 15, -1, 1);
    float *d;
    MS_TRY(st_out(t, &d, CO * H * W, no));
    MS_TRY(op_conv2d(cpu, ref, x_h, w_h, b_h, CI, H, W, CO, 3, 3, 1, 1, MS_ACT_RELU));
    MS_TRY(op_conv2d(&t->be, d, x_d, w_d, b_d, CI, H, W, CO, 3, 3, 1, 1, MS_ACT_RELU));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

static ms_status op_t_convt(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { CI = 16, H = 5, W = 7, CO = 8 };
    ST_IN(x, CI * H * W, 16, -1, 1);
    ST_IN(w, CI * CO * 4, 17, -1, 1);
    ST_IN(b, CO, 18, -1, 1);
    float *d;
    MS_TRY(st_out(t, &d, CO * 4 * H * W, no));
    MS_TRY(op_conv_transpose2x2(cpu, ref, x_h, w_h, b_h, CI, H, W, CO, MS_ACT_NONE));
    MS_TRY(op_conv_transpose2x2(&t->be, d, x_d, w_d, b_d, CI, H, W, CO, MS_ACT_NONE));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

enum { IMG_C = 5, IMG_H = 19, IMG_W = 13 };

static ms_status op_t_avgpool(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    ST_IN(x, IMG_C * IMG_H * IMG_W, 19, -4, 4);
    float *d;
    MS_TRY(st_out(t, &d, IMG_C * 7 * 5, no));
    MS_TRY(op_adaptive_avgpool(cpu, ref, x_h, IMG_C, IMG_H, IMG_W, 7, 5));
    MS_TRY(op_adaptive_avgpool(&t->be, d, x_d, IMG_C, IMG_H, IMG_W, 7, 5));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

static ms_status op_t_maxpool(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    ST_IN(x, IMG_C * IMG_H * IMG_W, 20, -4, 4);
    float *d;
    MS_TRY(st_out(t, &d, IMG_C * (IMG_H / 2) * (IMG_W / 2), no));
    MS_TRY(op_maxpool2x2(cpu, ref, x_h, IMG_C, IMG_H, IMG_W));
    MS_TRY(op_maxpool2x2(&t->be, d, x_d, IMG_C, IMG_H, IMG_W));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

static ms_status op_t_bilinear(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { HO = 4 * IMG_H + 1, WO = 3 * IMG_W - 2 };
    ST_IN(x, IMG_C * IMG_H * IMG_W, 21, -4, 4);
    float *d;
    MS_TRY(st_out(t, &d, IMG_C * HO * WO, no));
    MS_TRY(op_resize_bilinear(cpu, ref, x_h, IMG_C, IMG_H, IMG_W, HO, WO, 0.0, 0.0));
    MS_TRY(op_resize_bilinear(&t->be, d, x_d, IMG_C, IMG_H, IMG_W, HO, WO, 0.0, 0.0));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

static ms_status op_t_bicubic(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { HO = 2 * IMG_H + 3, WO = IMG_W / 2 + 1 };
    ST_IN(x, IMG_C * IMG_H * IMG_W, 22, -4, 4);
    float *d;
    MS_TRY(st_out(t, &d, IMG_C * HO * WO, no));
    MS_TRY(op_resize_bicubic(cpu, ref, x_h, IMG_C, IMG_H, IMG_W, HO, WO));
    MS_TRY(op_resize_bicubic(&t->be, d, x_d, IMG_C, IMG_H, IMG_W, HO, WO));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

static ms_status op_t_crop(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { HO = IMG_H - 3, WO = IMG_W - 5 };
    ST_IN(x, IMG_C * IMG_H * IMG_W, 23, -4, 4);
    float *d;
    MS_TRY(st_out(t, &d, IMG_C * HO * WO, no));
    MS_TRY(op_crop(cpu, ref, x_h, IMG_C, IMG_H, IMG_W, HO, WO));
    MS_TRY(op_crop(&t->be, d, x_d, IMG_C, IMG_H, IMG_W, HO, WO));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

/* argmax's classes, as floats (ties among integer logits: lowest class). */
static ms_status op_t_argmax(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { NP = IMG_H * IMG_W };
    float q[IMG_C * NP];
    st_rand(q, IMG_C * NP, 24, -4, 4);
    for (int i = 0; i < IMG_C * NP; i++) q[i] = floorf(q[i] * 0.5f);
    float *qd = st_put(t, q, IMG_C * NP);
    uint8_t *ad = st_alloc(t, NP), ra[NP], ga[NP];
    if (!qd || !ad) return ms_error_prefix(MS_ERR_OOM, "self-test");
    MS_TRY(st_poison(t, ad, NP));
    MS_TRY(op_argmax(cpu, ra, q, IMG_C, IMG_H, IMG_W));
    MS_TRY(op_argmax(&t->be, ad, qd, IMG_C, IMG_H, IMG_W));
    MS_TRY(st_copy_out(t, ga, ad, NP));
    for (int i = 0; i < NP; i++) {
        ref[i] = ra[i];
        got[i] = ga[i] < IMG_C ? ga[i] : NAN; /* the poison (255) is no class */
    }
    *no = NP;
    return MS_OK;
}

static ms_status op_t_normalize(st_target *t, ms_backend *cpu, float *got, float *ref, size_t *no)
{
    enum { H = 37, W = 29, HP = 48, WP = 32 };
    const float mean[3] = {123.675f, 116.28f, 103.53f}, stdv[3] = {58.395f, 57.12f, 57.375f};
    ST_IN(x, 3 * H * W, 25, 0, 255);
    float *d;
    MS_TRY(st_out(t, &d, 3 * HP * WP, no));
    MS_TRY(op_normalize_pad(cpu, ref, x_h, H, W, HP, WP, mean, stdv));
    MS_TRY(op_normalize_pad(&t->be, d, x_d, H, W, HP, WP, mean, stdv));
    return st_copy_out(t, got, d, *no * sizeof(float));
}

static const struct {
    const char *name;
    st_op_fn fn;
} st_ops[] = {
    {"linear", op_t_linear},           {"layernorm", op_t_layernorm},
    {"add", op_t_add},                 {"transpose", op_t_transpose},
    {"softmax_rows", op_t_softmax},    {"attention_full", op_t_attention},
    {"mita", op_t_mita},               {"conv2d", op_t_conv2d},
    {"conv_transpose2x2", op_t_convt}, {"adaptive_avgpool", op_t_avgpool},
    {"maxpool2x2", op_t_maxpool},      {"resize_bilinear", op_t_bilinear},
    {"resize_bicubic", op_t_bicubic},  {"crop", op_t_crop},
    {"argmax", op_t_argmax},           {"normalize_pad", op_t_normalize},
};

/* One pass over the ops in one mode (fp32: FP32 mode / plain CPU). */
static ms_status selftest_ops_mode(ms_selftest *st, st_target *t, bool fp32, const char *label,
                                   float *got /* (ST_MAX_OUT) */, float *ref /* (ST_MAX_OUT) */)
{
    ms_backend cpu;
    memset(&cpu, 0, sizeof cpu);
    cpu.device = MS_DEVICE_CPU;
    /* on the CPU itself the reference is one thread: OpenMP splits and
     * OpenBLAS kernels against the serial path */
    backend_set_threads(&cpu, t->be.device == MS_DEVICE_CPU ? 1 : 0);
    cpu.tc_round = !fp32;
    t->be.fp32 = fp32;
    char dev[48];
    if (t->be.device == MS_DEVICE_CPU)
        snprintf(dev, sizeof dev, "%.40s", label);
    else
        snprintf(dev, sizeof dev, "%.24s %s", label, fp32 ? "fp32" : "tensor cores");
    const char *refname = t->be.device == MS_DEVICE_CPU ? "cpu, 1 thread"
                          : fp32                       ? "cpu"
                                                       : "cpu, tc rounding";
    for (size_t i = 0; i < sizeof st_ops / sizeof st_ops[0]; i++) {
        ms_selftest_row *r = row_add(st, st_ops[i].name, dev, refname);
        if (!r) return ms_error(MS_ERR_OOM, "self-test: out of memory");
        size_t mark = arena_mark(&t->mem), n = 0;
        ms_clear_error();
        ms_status s = st_ops[i].fn(t, &cpu, got, ref, &n);
        arena_reset(&t->mem, mark);
        arena_reset(&t->scratch, 0);
        if (s != MS_OK) {
            row_fail(st, r, "%s", ms_last_error());
            continue;
        }
        row_judge(st, r, normwise_err(got, ref, n), ST_TOL);
    }
    return MS_OK;
}

/* Where oneDNN makes the large GEMMs, a product of the MLP's second
 * linear's shape (A W^T, k = 768, split over the threads) on it against
 * OpenBLAS: a CPU or a oneDNN release that disagrees shows here before it
 * shows in a model. (At k = 768 the two sum in other orders, about 1e-7
 * apart; at k = 192 they agree to the bit.) */
static ms_status selftest_gemm_libs(ms_selftest *st, float *got /* (ST_MAX_OUT) */,
                                    float *ref /* (ST_MAX_OUT) */)
{
    enum { M = 203, N = 96, K = 768 };
    ms_selftest_row *r = row_add(st, "gemm", "cpu, onednn", "openblas");
    if (!r) return ms_error(MS_ERR_OOM, "self-test: out of memory");
    float *a = malloc((size_t)(M + N) * K * sizeof(float));
    if (!a) return ms_error(MS_ERR_OOM, "self-test: out of memory");
    st_rand(a, (size_t)(M + N) * K, 41, -1, 1);
    const float *w = a + (size_t)M * K; /* (N, K) */
    gemm_cpu_lib(MS_GEMM_ONEDNN, got, a, w, M, N, K, false, true, K, K, N, 1.0f, 0.0f);
    gemm_cpu_lib(MS_GEMM_OPENBLAS, ref, a, w, M, N, K, false, true, K, K, N, 1.0f, 0.0f);
    free(a);
    row_judge(st, r, normwise_err(got, ref, (size_t)M * N), ST_TOL);
    return MS_OK;
}

ms_status selftest_ops(ms_selftest *st, void *cuda, const char *label)
{
    st_target t;
    memset(&t, 0, sizeof t);
    ms_device dev = cuda ? MS_DEVICE_CUDA : MS_DEVICE_CPU;
    t.be.device = dev;
    t.be.cuda = cuda;
    backend_set_threads(&t.be, 0);
    ms_status s = arena_init(&t.mem, (size_t)16 << 20, dev);
    if (s == MS_OK) s = arena_init(&t.scratch, (size_t)16 << 20, dev);
    float *got = malloc(ST_MAX_OUT * sizeof(float)), *ref = malloc(ST_MAX_OUT * sizeof(float));
    if (s == MS_OK && (!got || !ref)) s = ms_error(MS_ERR_OOM, "self-test: out of memory");
    if (s != MS_OK) { /* e.g. no GPU memory: every op fails, say why once */
        ms_selftest_row *r = row_add(st, "(setup)", label, "-");
        if (r) row_fail(st, r, "%s", ms_last_error());
    } else {
        t.be.scratch = &t.scratch;
        s = selftest_ops_mode(st, &t, true, label, got, ref);
        if (s == MS_OK && dev == MS_DEVICE_CUDA)
            s = selftest_ops_mode(st, &t, false, label, got, ref);
        if (s == MS_OK && dev == MS_DEVICE_CPU && gemm_lib_get() == MS_GEMM_ONEDNN)
            s = selftest_gemm_libs(st, got, ref);
    }
    free(got);
    free(ref);
    arena_free(&t.scratch);
    arena_free(&t.mem);
    return s == MS_ERR_OOM && st->count == 0 ? s : MS_OK;
}

/* ---- the model ---- */

/* The golden file's image and expected logits/mask as an ms_result. The
 * logits are copied (a file's F32 data need not be 4-byte aligned);
 * ref->logits is the caller's to free. */
static ms_status golden_load(ms_model_file **g, ms_image *img, ms_result *ref, const char *path)
{
    memset(ref, 0, sizeof *ref);
    MS_TRY(safetensors_open(g, path));
    const ms_tensor *im = model_file_find(*g, "image"), *lg = model_file_find(*g, "logits"),
                    *mk = model_file_find(*g, "mask");
    if (!im || !lg || !mk || im->ndim != 3 || lg->ndim != 3 || mk->ndim != 2 ||
        im->dtype != MS_DT_U8 || mk->dtype != MS_DT_U8 || im->shape[2] != 3 ||
        mk->shape[0] != lg->shape[1] || mk->shape[1] != lg->shape[2])
        return ms_error(MS_ERR_FORMAT, "%s: needs image (h, w, 3) u8, logits (c, h, w) and "
                                       "mask (h, w) u8", path);
    img->h = (int)im->shape[0];
    img->w = (int)im->shape[1];
    img->rgb = (uint8_t *)im->data;
    ref->classes = (int)lg->shape[0];
    ref->h = (int)lg->shape[1];
    ref->w = (int)lg->shape[2];
    size_t nl = (size_t)ref->classes * ref->h * ref->w;
    ref->logits = malloc(nl * sizeof(float));
    MS_CHECK_ALLOC(ref->logits, nl * sizeof(float));
    MS_TRY(model_file_read_f32(*g, "logits", ref->logits, 3, lg->shape));
    ref->mask = (uint8_t *)mk->data;
    ref->attention = -1; /* no records to compare */
    return MS_OK;
}

static void model_row(ms_selftest *st, ms_selftest_row *r, const ms_agreement *a)
{
    snprintf(r->detail, sizeof r->detail, "mask %.2f%% equal", 100.0 * a->mask_same);
    if (a->rec_total)
        snprintf(r->detail + strlen(r->detail), sizeof r->detail - strlen(r->detail),
                 ", MiTA records %zu of %zu differ", a->rec_diff, a->rec_total);
    row_judge(st, r, a->logits_err, ST_TOL_MODEL);
    bool ok = a->mask_same >= ST_MASK_SAME &&
              (double)a->rec_diff <= ST_REC_DIFF * (double)a->rec_total;
    if (r->pass && !ok) {
        r->pass = false;
        st->failed++;
    }
}

static ms_status run_model(ms_result *res, const char *model_path, const ms_engine_options *o,
                           const ms_image *img)
{
    ms_engine *e = NULL;
    MS_TRY(engine_init(&e, model_path, o));
    ms_run_options ro = {.attention = -1, .record = true};
    ms_status s = engine_device(e) == o->device || o->device == MS_DEV_AUTO
                      ? engine_run(e, res, img, &ro)
                      : ms_error(MS_ERR_UNSUPPORTED, "engine not on the requested device");
    engine_free(e);
    return s;
}

ms_status selftest_model(ms_selftest *st, ms_device_choice dev, int device_index,
                         const char *model_path, const char *golden_path)
{
    ms_model_file *g = NULL;
    ms_image img;
    ms_result gold, cpu = {0}, got = {0};
    ms_agreement a;
    char label[48];
    snprintf(label, sizeof label, dev == MS_DEV_CPU ? "cpu" : "cuda:%d", device_index);
    ms_status s = golden_load(&g, &img, &gold, golden_path);
    ms_engine_options co = {.device = MS_DEV_CPU};
    if (dev == MS_DEV_CPU) {
        ms_selftest_row *r = row_add(st, "model", label, "python reference");
        if (!r) s = ms_error(MS_ERR_OOM, "self-test: out of memory");
        else {
            if (s == MS_OK) s = run_model(&cpu, model_path, &co, &img);
            if (s == MS_OK) s = result_compare(&a, &cpu, &gold);
            if (s == MS_OK) model_row(st, r, &a);
            else row_fail(st, r, "%s", ms_last_error());
        }
    }
    for (int mode = 0; dev == MS_DEV_CUDA && mode < 2; mode++) {
        char dl[48];
        snprintf(dl, sizeof dl, "%.24s %s", label, mode ? "tensor cores" : "fp32");
        ms_selftest_row *r = row_add(st, "model", dl, mode ? "cpu, tc rounding" : "cpu");
        if (!r) return ms_error(MS_ERR_OOM, "self-test: out of memory");
        ms_status ms = s;
        co.tc_round = mode == 1;
        ms_engine_options go = {.device = MS_DEV_CUDA, .fp32 = mode == 0,
                                .device_index = device_index};
        if (ms == MS_OK) ms = run_model(&cpu, model_path, &co, &img);
        if (ms == MS_OK) ms = run_model(&got, model_path, &go, &img);
        if (ms == MS_OK) ms = result_compare(&a, &got, &cpu);
        if (ms == MS_OK) model_row(st, r, &a);
        else row_fail(st, r, "%s", ms_last_error());
    }
    result_free(&cpu);
    result_free(&got);
    free(gold.logits);
    if (g) model_file_close(g);
    return MS_OK;
}

/* ---- --device auto ---- */

#define ST_MAX_DEVICES 64
static pthread_mutex_t g_usable_lock = PTHREAD_MUTEX_INITIALIZER;
static signed char g_usable[ST_MAX_DEVICES]; /* 0 unknown, 1 passed, -1 failed */
static char g_usable_why[ST_MAX_DEVICES][256];

bool selftest_cuda_usable(void *cuda, int device_index, char *why, size_t why_len)
{
    if (device_index < 0 || device_index >= ST_MAX_DEVICES) return false;
    pthread_mutex_lock(&g_usable_lock);
    if (g_usable[device_index] == 0) {
        ms_selftest st = {0};
        char label[16];
        snprintf(label, sizeof label, "cuda:%d", device_index);
        ms_status s = selftest_ops(&st, cuda, label);
        g_usable[device_index] = s == MS_OK && st.failed == 0 ? 1 : -1;
        g_usable_why[device_index][0] = '\0';
        for (int i = 0; i < st.count; i++)
            if (!st.rows[i].pass) {
                snprintf(g_usable_why[device_index], sizeof g_usable_why[0],
                         "%.31s (%.47s): %.100s%s%.3g > %.3g", st.rows[i].op, st.rows[i].device,
                         st.rows[i].detail, st.rows[i].detail[0] ? "; " : "error ",
                         st.rows[i].err, st.rows[i].tol);
                break;
            }
        if (s != MS_OK) snprintf(g_usable_why[device_index], sizeof g_usable_why[0], "%s",
                                 ms_last_error());
        selftest_free(&st);
    }
    bool ok = g_usable[device_index] == 1;
    if (!ok && why) snprintf(why, why_len, "%s", g_usable_why[device_index]);
    pthread_mutex_unlock(&g_usable_lock);
    return ok;
}
