/* The engine: loads a model file into one weight arena (BatchNorm folded),
 * sizes one activation arena per input size and batch count with a dry run,
 * and runs preprocess -> ViT -> neck -> UperHead -> logits -> mask
 * (mita-spec 1-4) on a batch of same-size images. */
#include "engine.h"
#include "selftest.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backbone/vit.h"
#include "decoder/decoder.h"
#include "kernels/elementwise.h" /* slide_windows, slide_start */
#include "kernels/gemm.h"      /* gemm_warm_begin */
#include "kernels/pool.h"
#include "image_resize.h"
#include "model_file.h"
#ifdef MS_HAVE_CUDA
#include "kernels/cuda_ctx.h"
#endif

#define MS_MAX_PLANS 4
/* Default memory budget: this share of physical memory. */
#define MS_DEFAULT_MEMORY_PERCENT 50

/* Everything that depends on the input size, batch count and run options. */
typedef struct {
    bool used;
    uint64_t last_use;
    int h, w, rh, rw, batch, attention, gh, gw, topk;
    bool record, keep_blocks, mask_only;
    ms_arena act;
    float *pos;             /* (n, C) resized position embedding, in act */
    size_t act_base;        /* act mark after pos: reset point for each run */
    size_t bytes;           /* what the plan holds: arena, staging, results */
    float *host_in;         /* (B, 3, ih, iw) planar input staging, host */
    uint8_t *host_u8;       /* (rh, rw, 3) one image resized as OpenCV does, or NULL */
    void *resize_scratch;   /* image_resize_u8_rgb's tables and rows, or NULL */
    float *host_net;        /* CUDA: (classes, h0, w0) host copy of one image's
                             * network logits, for the finiteness check */
} engine_plan;

struct ms_engine {
    ms_model_file *mf;
    const ms_config *cfg;
    ms_device_choice device;
    char fallback[512];
    bool has_fallback;
    char device_name[64];
    ms_backend be;
    ms_arena weights_host;
    ms_arena weights_dev;   /* CUDA only */
    vit_weights vit;
    neck_weights neck;
    uperhead_weights head;
    engine_plan plans[MS_MAX_PLANS];
    size_t max_memory;      /* host bytes a run may hold (weights included) */
    float *tta_host;        /* (classes, h, w) mirror pass's logits, host; grows */
    size_t tta_cap;         /* floats in tta_host */
    uint64_t clock;
    ms_trace trace;
#ifdef MS_HAVE_CUDA
    ms_cuda_ctx *cu;
#endif
};

/* ---- loading ------------------------------------------------------------ */

typedef struct {
    const ms_model_file *mf;
    ms_arena *arena;
    ms_status st;   /* sticky: the first error wins */
    bool check;     /* only check names, shapes and dtypes; read nothing */
} loader;

static float *load(loader *ld, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static float *load(loader *ld, int ndim, const int64_t *shape, const char *fmt, ...)
{
    if (ld->st != MS_OK) return NULL;
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (ld->check) {
        ld->st = model_file_check_f32(ld->mf, name, ndim, shape);
        return NULL;
    }
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    float *p = arena_alloc(ld->arena, n * sizeof(float));
    if (!p) {
        ld->st = MS_ERR_OOM;
        return NULL;
    }
    ld->st = model_file_read_f32(ld->mf, name, p, ndim, shape);
    /* One pass: a NaN or Inf weight would silently give a one-class mask. */
    for (size_t i = 0; ld->st == MS_OK && i < n; i++)
        if (!isfinite(p[i]))
            ld->st = ms_error(MS_ERR_FORMAT, "%s: tensor %s has a non-finite value (%g at flat index %zu)",
                              model_file_path(ld->mf), name, (double)p[i], i);
    return ld->st == MS_OK ? p : NULL;
}

static float *alloc_f32(loader *ld, size_t n)
{
    if (ld->st != MS_OK || ld->check) return NULL;
    float *p = arena_alloc(ld->arena, n * sizeof(float));
    if (!p) ld->st = MS_ERR_OOM;
    return p;
}

/* Folds BatchNorm (gamma, beta, mean, var) into a conv: per output channel
 * scale = gamma / sqrt(var + eps), w *= scale, b = (b - mean) * scale + beta.
 * transposed: weight layout (ci, co, kh, kw). */
static void fold_bn(ms_conv *cv, const float *g, const float *beta, const float *mean,
                    const float *var, float eps, bool transposed)
{
    size_t khw = (size_t)cv->kh * cv->kw;
    for (int o = 0; o < cv->co; o++) {
        double scale = g[o] / sqrt((double)var[o] + eps);
        if (transposed) {
            for (int i = 0; i < cv->ci; i++)
                for (size_t t = 0; t < khw; t++)
                    cv->w[((size_t)i * cv->co + o) * khw + t] *= (float)scale;
        } else {
            for (size_t t = 0; t < (size_t)cv->ci * khw; t++)
                cv->w[(size_t)o * cv->ci * khw + t] *= (float)scale;
        }
        cv->b[o] = (float)((cv->b[o] - mean[o]) * scale + beta[o]);
    }
}

/* prefix.weight (+ prefix.bias) of a plain conv. */
static void load_conv(loader *ld, ms_conv *cv, int co, int ci, int kh, int kw, bool bias,
                      bool transposed, const char *prefix)
{
    cv->co = co, cv->ci = ci, cv->kh = kh, cv->kw = kw;
    int64_t shape[4] = {transposed ? ci : co, transposed ? co : ci, kh, kw}, bshape[1] = {co};
    cv->w = load(ld, 4, shape, "%s.weight", prefix);
    if (bias) {
        cv->b = load(ld, 1, bshape, "%s.bias", prefix);
    } else {
        cv->b = alloc_f32(ld, (size_t)co);
        if (cv->b) memset(cv->b, 0, (size_t)co * sizeof(float));
    }
}

static void load_bn(loader *ld, ms_conv *cv, float eps, bool transposed, const char *prefix)
{
    int64_t s[1] = {cv->co};
    size_t mark = arena_mark(ld->arena);
    float *g = load(ld, 1, s, "%s.weight", prefix);
    float *b = load(ld, 1, s, "%s.bias", prefix);
    float *m = load(ld, 1, s, "%s.running_mean", prefix);
    float *v = load(ld, 1, s, "%s.running_var", prefix);
    if (ld->st != MS_OK || ld->check) return;
    for (int o = 0; o < cv->co; o++)
        if (!(v[o] >= 0) || !isfinite(v[o])) {
            ld->st = ms_error(MS_ERR_FORMAT, "%s: %s.running_var[%d] = %g is not a variance",
                              model_file_path(ld->mf), prefix, o, (double)v[o]);
            return;
        }
    fold_bn(cv, g, b, m, v, eps, transposed);
    arena_reset(ld->arena, mark); /* BN stats are no longer needed */
}

/* An mmseg ConvModule: prefix.conv.weight (no bias) + prefix.bn.*, folded. */
static void load_conv_module(loader *ld, ms_conv *cv, int co, int ci, int k, float eps,
                             const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static void load_conv_module(loader *ld, ms_conv *cv, int co, int ci, int k, float eps,
                             const char *fmt, ...)
{
    char prefix[200], name[220];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    snprintf(name, sizeof name, "%s.conv", prefix);
    load_conv(ld, cv, co, ci, k, k, false, false, name);
    snprintf(name, sizeof name, "%s.bn", prefix);
    load_bn(ld, cv, eps, false, name);
}

static void load_weights(loader *ld, ms_engine *e)
{
    const ms_config *c = e->cfg;
    const int C = c->embed_dim, R = c->mlp_ratio * C, p = c->patch_size;
    int64_t s1[1] = {C}, s3c[1] = {3 * C}, sr[1] = {R};
    vit_weights *v = &e->vit;
    if (c->stem == MS_STEM_PATCH) {
        load_conv(ld, &v->patch, C, 3, p, p, true, false, "backbone.patch_embed.proj");
    } else {
        int ci = 3;
        for (int i = 0; i < c->n_stem; i++) {
            char name[64];
            snprintf(name, sizeof name, "backbone.stem.%d.conv", i);
            load_conv(ld, &v->stem[i], c->stem_channels[i], ci, 3, 3, false, false, name);
            snprintf(name, sizeof name, "backbone.stem.%d.bn", i);
            load_bn(ld, &v->stem[i], 1e-5f, false, name);
            ci = c->stem_channels[i];
        }
        load_conv(ld, &v->stem_proj, C, ci, 1, 1, true, false, "backbone.stem.proj");
    }
    int nc = c->cls_token ? 1 : 0;
    if (!nc && ld->st == MS_OK && model_file_find(ld->mf, "backbone.cls_token")) {
        /* Running without it would silently drop a token the weights rely on. */
        ld->st = ms_error(MS_ERR_FORMAT,
                          "%s: has a tensor backbone.cls_token but the config's "
                          "backbone.cls_token is not true",
                          model_file_path(ld->mf));
        return;
    }
    int64_t pos_shape[3] = {1, nc + (int64_t)c->pos_grid[0] * c->pos_grid[1], C};
    v->pos_embed = load(ld, 3, pos_shape, "backbone.pos_embed");
    if (nc) {
        int64_t cls_shape[3] = {1, 1, C};
        v->cls_token = load(ld, 3, cls_shape, "backbone.cls_token");
    }
    v->blocks = calloc((size_t)c->depth, sizeof *v->blocks);
    if (!v->blocks) {
        ld->st = ms_error(MS_ERR_OOM, "out of memory: %d block descriptors", c->depth);
        return;
    }
    for (int i = 0; i < c->depth && ld->st == MS_OK; i++) {
        vit_block *b = &v->blocks[i];
        int64_t wqkv[2] = {3 * C, C}, wproj[2] = {C, C}, wfc1[2] = {R, C}, wfc2[2] = {C, R};
        const char *pre = "backbone.blocks";
        b->norm1_w = load(ld, 1, s1, "%s.%d.norm1.weight", pre, i);
        b->norm1_b = load(ld, 1, s1, "%s.%d.norm1.bias", pre, i);
        b->qkv_w = load(ld, 2, wqkv, "%s.%d.attn.qkv.weight", pre, i);
        b->qkv_b = load(ld, 1, s3c, "%s.%d.attn.qkv.bias", pre, i);
        b->proj_w = load(ld, 2, wproj, "%s.%d.attn.proj.weight", pre, i);
        b->proj_b = load(ld, 1, s1, "%s.%d.attn.proj.bias", pre, i);
        b->norm2_w = load(ld, 1, s1, "%s.%d.norm2.weight", pre, i);
        b->norm2_b = load(ld, 1, s1, "%s.%d.norm2.bias", pre, i);
        b->fc1_w = load(ld, 2, wfc1, "%s.%d.mlp.fc1.weight", pre, i);
        b->fc1_b = load(ld, 1, sr, "%s.%d.mlp.fc1.bias", pre, i);
        b->fc2_w = load(ld, 2, wfc2, "%s.%d.mlp.fc2.weight", pre, i);
        b->fc2_b = load(ld, 1, s1, "%s.%d.mlp.fc2.bias", pre, i);
    }
    if (c->final_norm) {
        v->norm_w = load(ld, 1, s1, "backbone.norm.weight");
        v->norm_b = load(ld, 1, s1, "backbone.norm.bias");
    }

    neck_weights *n = &e->neck;
    const int Cn = c->neck_channels;
    if (c->neck == MS_NECK_MLN) {
        for (int l = 0; l < 4; l++) {
            char name[64];
            snprintf(name, sizeof name, "neck.lateral_convs.%d.conv", l);
            load_conv(ld, &n->lateral[l], Cn, C, 1, 1, true, false, name);
            snprintf(name, sizeof name, "neck.convs.%d.conv", l);
            load_conv(ld, &n->convs[l], Cn, Cn, 3, 3, true, false, name);
        }
        for (int l = 0; l < c->n_stem_skips; l++) {
            char name[64];
            snprintf(name, sizeof name, "neck.stem_convs.%d.conv", l);
            load_conv(ld, &n->stem[l], Cn, c->stem_channels[vit_stem_skip_index(c, l)], 1, 1, true,
                      false, name);
        }
    } else if (c->neck == MS_NECK_FPN_DECONV) {
        load_conv(ld, &n->fpn1a, C, C, 2, 2, true, true, "neck.fpn1.0");
        load_bn(ld, &n->fpn1a, c->bn_eps, true, "neck.fpn1.1");
        load_conv(ld, &n->fpn1b, C, C, 2, 2, true, true, "neck.fpn1.3");
        load_conv(ld, &n->fpn2, C, C, 2, 2, true, true, "neck.fpn2.0");
    }

    uperhead_weights *h = &e->head;
    const int ch = c->head_channels;
    const float eps = c->bn_eps;
    for (int j = 0; j < c->n_pool; j++)
        load_conv_module(ld, &h->psp[j], ch, Cn, 1, eps, "decode_head.psp_modules.%d.1", j);
    load_conv_module(ld, &h->bottleneck, ch, Cn + c->n_pool * ch, 3, eps,
                     "decode_head.bottleneck");
    for (int l = 0; l < 3; l++) {
        load_conv_module(ld, &h->lateral[l], ch, Cn, 1, eps, "decode_head.lateral_convs.%d", l);
        load_conv_module(ld, &h->fpn[l], ch, ch, 3, eps, "decode_head.fpn_convs.%d", l);
    }
    load_conv_module(ld, &h->fpn_bottleneck, ch, 4 * ch, 3, eps, "decode_head.fpn_bottleneck");
    load_conv(ld, &h->seg, c->n_classes, ch, 1, 1, true, false, "decode_head.conv_seg");
}

/* Moves every weight pointer from the host arena to the same offset in the
 * device arena. */
static void rebase_ptr(float **p, const ms_arena *from, const ms_arena *to)
{
    if (*p) *p = (float *)(to->base + ((uint8_t *)*p - from->base));
}

static void rebase_conv(ms_conv *cv, const ms_arena *from, const ms_arena *to)
{
    rebase_ptr(&cv->w, from, to);
    rebase_ptr(&cv->b, from, to);
}

static void rebase_weights(ms_engine *e, const ms_arena *from, const ms_arena *to)
{
    vit_weights *v = &e->vit;
    rebase_conv(&v->patch, from, to);
    for (int i = 0; i < MS_MAX_STEM; i++) rebase_conv(&v->stem[i], from, to);
    rebase_conv(&v->stem_proj, from, to);
    rebase_ptr(&v->pos_embed, from, to);
    rebase_ptr(&v->cls_token, from, to);
    rebase_ptr(&v->norm_w, from, to);
    rebase_ptr(&v->norm_b, from, to);
    for (int i = 0; i < e->cfg->depth; i++) {
        float **f = (float **)&v->blocks[i];
        for (size_t k = 0; k < sizeof(vit_block) / sizeof(float *); k++) rebase_ptr(&f[k], from, to);
    }
    ms_conv *nc[] = {&e->neck.fpn1a, &e->neck.fpn1b, &e->neck.fpn2};
    for (int i = 0; i < 3; i++) rebase_conv(nc[i], from, to);
    for (int l = 0; l < 4; l++) {
        rebase_conv(&e->neck.lateral[l], from, to);
        rebase_conv(&e->neck.convs[l], from, to);
    }
    for (int l = 0; l < 2; l++) rebase_conv(&e->neck.stem[l], from, to);
    uperhead_weights *h = &e->head;
    for (int j = 0; j < MS_MAX_POOL; j++) rebase_conv(&h->psp[j], from, to);
    for (int l = 0; l < 3; l++) {
        rebase_conv(&h->lateral[l], from, to);
        rebase_conv(&h->fpn[l], from, to);
    }
    rebase_conv(&h->bottleneck, from, to);
    rebase_conv(&h->fpn_bottleneck, from, to);
    rebase_conv(&h->seg, from, to);
}

/* Whether the run is on the CPU whatever engine_setup_device finds: asked
 * for, or auto on a machine without an NVIDIA GPU (WSL2 exposes its GPUs
 * through /dev/dxg only: there CUDA is asked). */
static bool engine_cpu_certain(const ms_engine_options *opt)
{
    if (opt->device == MS_DEV_CPU) return true;
#ifdef MS_HAVE_CUDA
    return opt->device == MS_DEV_AUTO && !ms_gpu_present() && access("/dev/dxg", F_OK) != 0;
#else
    return opt->device == MS_DEV_AUTO;
#endif
}

static ms_status engine_setup_device(ms_engine *e, const ms_engine_options *opt)
{
    e->device = MS_DEV_CPU;
    snprintf(e->device_name, sizeof e->device_name, "CPU (%d thread%s)", e->be.threads,
             e->be.threads == 1 ? "" : "s");
    if (opt->device == MS_DEV_CPU) {
        e->be.tc_round = opt->tc_round;
        return MS_OK;
    }
#ifdef MS_HAVE_CUDA
    /* auto on a machine without an NVIDIA GPU loads no CUDA library at all
     * (kernels/cuda_loader.c): hundreds of MB mapped for a no-device answer */
    if (engine_cpu_certain(opt)) {
        snprintf(e->fallback, sizeof e->fallback,
                 "no NVIDIA GPU on this machine (no /dev/nvidia0 or /dev/dxg)");
        e->has_fallback = true;
        return MS_OK;
    }
    ms_status st = cuda_ctx_init(&e->cu, opt->device_index);
    /* auto never picks a GPU that fails its self-test (run once per process) */
    char why[256];
    if (st == MS_OK && opt->device == MS_DEV_AUTO &&
        !selftest_cuda_usable(e->cu, opt->device_index, why, sizeof why)) {
        st = ms_error(MS_ERR_UNSUPPORTED, "%s failed its self-test (mitaseg doctor): %s",
                      cuda_ctx_name(e->cu), why);
        cuda_ctx_free(e->cu);
        e->cu = NULL;
    }
    if (st == MS_OK) {
        e->device = MS_DEV_CUDA;
        e->be.device = MS_DEVICE_CUDA;
        e->be.cuda = e->cu;
        e->be.fp32 = opt->fp32;
        snprintf(e->device_name, sizeof e->device_name, "%s", cuda_ctx_name(e->cu));
        return MS_OK;
    }
    if (opt->device == MS_DEV_CUDA) return st;
    snprintf(e->fallback, sizeof e->fallback, "%s", ms_last_error());
    e->has_fallback = true;
#else
    /* A CPU-only build: auto means the CPU, nothing fell back. */
    if (opt->device == MS_DEV_CUDA)
        return ms_error(MS_ERR_UNSUPPORTED, "--device cuda: this build has no CUDA backend");
#endif
    return MS_OK;
}

/* Checks every tensor's name, shape and dtype against the config before
 * anything is sized (a config that disagrees with its tensors is named, not
 * an arena overflow), then reads the weights into one arena. */
static ms_status engine_load(ms_engine *e)
{
    ms_arena none = {.sizing = true}; /* marks work; nothing is allocated */
    loader check = {e->mf, &none, MS_OK, true};
    load_weights(&check, e);
    free(e->vit.blocks);
    e->vit.blocks = NULL;
    if (check.st != MS_OK) return check.st;

    /* Upper bound for the weight arena: every stored element as F32 plus
     * alignment and the bias vectors made for bias-free convs. */
    size_t bytes = 1 << 20;
    for (int i = 0; i < model_file_count(e->mf); i++) {
        const ms_tensor *t = model_file_tensor(e->mf, i);
        size_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
        bytes += n * sizeof(float) + 512;
    }
    MS_TRY(arena_init(&e->weights_host, bytes, MS_DEVICE_CPU));
    loader ld = {e->mf, &e->weights_host, MS_OK, false};
    load_weights(&ld, e);
    return ld.st;
}

ms_status engine_check_model(const ms_model_file *mf)
{
    ms_engine *e = calloc(1, sizeof *e);
    MS_CHECK_ALLOC(e, sizeof *e);
    e->mf = (ms_model_file *)mf; /* borrowed: not closed below */
    e->cfg = model_file_config(mf);
    ms_status st = e->cfg ? engine_load(e)
                          : ms_error(MS_ERR_FORMAT, "%s: not a mitaseg model", model_file_path(mf));
    arena_free(&e->weights_host);
    free(e->vit.blocks);
    free(e);
    return st;
}

size_t engine_default_memory_budget(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return SIZE_MAX;
    size_t mem = (size_t)pages * (size_t)page;
    /* In a container the cgroup's limit (v2) is what the OOM killer uses. */
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (f) {
        unsigned long long lim;
        if (fscanf(f, "%llu", &lim) == 1 && lim > 0 && lim < mem) mem = (size_t)lim;
        fclose(f);
    }
    return mem / 100 * MS_DEFAULT_MEMORY_PERCENT;
}

ms_status engine_init(ms_engine **out, const char *model_path, const ms_engine_options *opt)
{
    *out = NULL;
    ms_engine_options defaults = {.device = MS_DEV_AUTO};
    if (!opt) opt = &defaults;
    ms_engine *e = calloc(1, sizeof *e);
    MS_CHECK_ALLOC(e, sizeof *e);
    ms_status st = model_file_open(&e->mf, model_path);
    if (st != MS_OK) {
        free(e);
        return st;
    }
    e->cfg = model_file_config(e->mf);
    backend_set_threads(&e->be, opt->threads);
    e->max_memory = opt->max_memory ? opt->max_memory : engine_default_memory_budget();
    pthread_t warm; /* oneDNN's kernels generated while the weights load, for a CPU run */
    bool warming = engine_cpu_certain(opt) && gemm_warm_begin(&warm);
    st = engine_load(e);
    if (warming) gemm_warm_end(warm);
    if (st == MS_OK) st = engine_setup_device(e, opt);
#ifdef MS_HAVE_CUDA
    if (st == MS_OK && e->device == MS_DEV_CUDA) {
        st = arena_init(&e->weights_dev, e->weights_host.used, MS_DEVICE_CUDA);
        if (st == MS_OK) st = cuda_copy_h2d(e->cu, e->weights_dev.base, e->weights_host.base,
                                            e->weights_host.used);
        if (st == MS_OK) st = cuda_sync(e->cu);
        if (st == MS_OK) {
            rebase_weights(e, &e->weights_host, &e->weights_dev);
            arena_free(&e->weights_host);
        }
    }
#else
    (void)rebase_weights;
#endif
    if (st != MS_OK) {
        engine_free(e);
        return st;
    }
    *out = e;
    return MS_OK;
}

static void plan_free(engine_plan *pl)
{
    arena_free(&pl->act);
    ms_free(pl->host_in);
    ms_free(pl->host_u8);
    ms_free(pl->resize_scratch);
    ms_free(pl->host_net);
    memset(pl, 0, sizeof *pl);
}

void engine_free(ms_engine *e)
{
    if (!e) return;
#ifdef MS_HAVE_CUDA
    if (e->cu) (void)cuda_ctx_use(e->cu); /* freeing from another thread */
#endif
    for (int i = 0; i < MS_MAX_PLANS; i++) plan_free(&e->plans[i]);
    ms_free(e->tta_host);
    arena_free(&e->weights_host);
    arena_free(&e->weights_dev);
    free(e->vit.blocks);
#ifdef MS_HAVE_CUDA
    cuda_ctx_free(e->cu);
#endif
    model_file_close(e->mf);
    free(e);
}

const ms_config *engine_config(const ms_engine *e) { return e->cfg; }
const char *engine_model_path(const ms_engine *e) { return model_file_path(e->mf); }
const char *engine_fallback_reason(const ms_engine *e) { return e->has_fallback ? e->fallback : NULL; }
ms_device_choice engine_device(const ms_engine *e) { return e->device; }

void engine_set_trace(ms_engine *e, ms_trace_fn fn, void *user)
{
    e->trace.fn = fn;
    e->trace.user = user;
}

/* ---- running ------------------------------------------------------------ */

void mita_landmark_window(int *r0, int *r1, int *c0, int *c1, int m, int hp, int wp, int gh,
                          int gw)
{
    int i = m / gw, j = m % gw;
    *r0 = adaptive_pool_start(i, hp, gh);
    *r1 = adaptive_pool_end(i, hp, gh);
    *c0 = adaptive_pool_start(j, wp, gw);
    *c1 = adaptive_pool_end(j, wp, gw);
}

typedef struct {
    int batch;              /* images in the pass, all h x w */
    int h, w, rh, rw, ph, pw, hp, wp, n;
    /* The staged input's size: the image's, or with input.resize cv2_uint8
     * the working size (resized on the host as uint8 before staging). */
    int ih, iw;
    bool u8_resize;
    int ncls, seq;          /* class tokens (0 or 1); seq = ncls + n tokens */
    /* Sliding windows on the working-size image (mmseg slide_inference):
     * ny x nx windows of wh x ww at strides sh, sw; ph..n above are one
     * window's network input. Without: one window, the whole image. */
    bool slide;
    int wh, ww, sh, sw, ny, nx, nwin;
    ms_attn_type attention;
    ms_mita_params mita;
    bool record, keep_blocks, mask_only;
} run_geometry;

int engine_short_side(const ms_config *c, const ms_run_options *opt)
{
    return opt->short_side > 0 ? opt->short_side : opt->short_side < 0 ? 0 : c->short_side;
}

static ms_status plan_geometry(run_geometry *g, const ms_config *c, int batch, int h, int w,
                               const ms_run_options *opt)
{
    memset(g, 0, sizeof *g);
    g->batch = batch;
    g->h = h, g->w = w;
    /* native (short side 0): image_keep_ratio_size leaves the size as it is */
    image_keep_ratio_size(&g->rh, &g->rw, h, w, engine_short_side(c, opt), c->long_side);
    g->u8_resize = c->resize_cv2_uint8 && (g->rh != h || g->rw != w);
    g->ih = g->u8_resize ? g->rh : h, g->iw = g->u8_resize ? g->rw : w;
    g->attention = opt->attention >= 0 ? (ms_attn_type)opt->attention : c->attn.type;
    g->record = opt->record && g->attention == MS_ATTN_MITA;
    g->keep_blocks = opt->keep_blocks;
    /* Records (viewer, --dump) and kept block outputs need one token grid:
     * those runs take the whole image even when the model has a sliding
     * window. (The plan cache keys on both, so this keeps plans apart.) */
    g->slide = c->slide_crop[0] > 0 && !g->record && !g->keep_blocks;
    g->wh = g->rh, g->ww = g->rw, g->sh = g->sw = 1;
    if (g->slide) {
        g->wh = c->slide_crop[0] < g->rh ? c->slide_crop[0] : g->rh;
        g->ww = c->slide_crop[1] < g->rw ? c->slide_crop[1] : g->rw;
        g->sh = c->slide_stride[0], g->sw = c->slide_stride[1];
    }
    g->ny = slide_windows(g->rh, g->wh, g->sh), g->nx = slide_windows(g->rw, g->ww, g->sw);
    g->nwin = g->ny * g->nx;
    int m = c->pad_multiple > 0 ? c->pad_multiple : 1, p = c->patch_size;
    g->ph = (g->wh + m - 1) / m * m;
    g->pw = (g->ww + m - 1) / m * m;
    g->ph = (g->ph + p - 1) / p * p; /* the grid needs whole patches */
    g->pw = (g->pw + p - 1) / p * p;
    g->hp = g->ph / p, g->wp = g->pw / p, g->n = g->hp * g->wp;
    g->ncls = c->cls_token ? 1 : 0, g->seq = g->ncls + g->n;
    if ((int64_t)g->ph * g->pw * g->nwin > ((int64_t)1 << 28))
        return ms_error(MS_ERR_ARG, "network input %dx%d%s is too large", g->pw, g->ph,
                        g->nwin > 1 ? " in sliding windows" : "");
    int gh = opt->gh > 0 ? opt->gh : c->attn.gh, gw = opt->gw > 0 ? opt->gw : c->attn.gw;
    int k = opt->topk > 0 ? opt->topk : c->attn.topk;
    g->mita.gh = gh < g->hp ? gh : g->hp;   /* spec 2.1: clamp G to the grid */
    g->mita.gw = gw < g->wp ? gw : g->wp;
    g->mita.topk = k < g->seq ? k : g->seq; /* spec 2.2: clamp k to the keys */
    g->mita.shared_scale_d = c->attn.shared_scale_d;
    g->mita.ncls = g->ncls;
    g->mask_only = opt->mask_only && !opt->tta_flip; /* TTA averages the logits */
    return MS_OK;
}

/* Output rows per band when the mask is taken while resizing (mask_only):
 * the band's logits, (classes, rows, w), are all that is held at image size. */
#define MS_MASK_BAND_ROWS 64

/* One image's network logits must be finite: NaN/Inf (overflowing weights or
 * activations) would otherwise argmax to an arbitrary class. On CUDA the
 * check reads a host copy (the network-size logits, not the image-size). */
static ms_status check_finite_logits(ms_engine *e, const ms_backend *be, engine_plan *pl,
                                     const float *net, size_t n)
{
    if (be->dry_run) return MS_OK;
    (void)pl;
    const float *h = net;
#ifdef MS_HAVE_CUDA
    if (be->device == MS_DEVICE_CUDA) {
        MS_TRY(cuda_copy_d2h(e->cu, pl->host_net, net, n * sizeof(float)));
        MS_TRY(cuda_sync(e->cu));
        h = pl->host_net;
    }
#endif
    for (size_t i = 0; i < n; i++)
        if (!isfinite(h[i]))
            return ms_error(MS_ERR_FORMAT,
                            "non-finite logits (%g): the model's weights or this image overflow "
                            "float32; no mask written", (double)h[i]);
    return MS_OK;
}

typedef struct {
    float *input;         /* (B, 3, ph, pw) */
    float *logits;        /* (B, classes, h, w), NULL when mask_only */
    uint8_t *mask;        /* (B, h, w) */
    int32_t *topk_idx;    /* (B, depth, heads, m, k) or NULL */
    int32_t *route;       /* (B, depth, heads, seq) or NULL */
    float *shared_mass;   /* (B, depth, heads, seq) or NULL */
    float *blocks;        /* (B, depth, n, C) grid tokens' block outputs, or NULL */
} run_buffers;

/* Head logits (K, h0, w0) of a (ph, pw) network input -> (K, th, tw), the
 * unpadded size: resized to the input and the padding cropped (spec 3.6),
 * or, as mmseg does, resized straight to the unpadded size. */
static ms_status logits_unpad(ms_backend *be, ms_arena *act, float *out /* (K, th, tw) */,
                              const float *net /* (K, h0, w0) */, const ms_config *c, int h0,
                              int w0, int ph, int pw, int th, int tw)
{
    int K = c->n_classes;
    if (c->padded_logits_resize) return op_resize_bilinear(be, out, net, K, h0, w0, th, tw, 0, 0);
    size_t mark = arena_mark(act);
    float *full = arena_alloc(act, (size_t)K * ph * pw * sizeof(float)); /* (K, ph, pw) */
    if (!full) return MS_ERR_OOM;
    MS_TRY(op_resize_bilinear(be, full, net, K, h0, w0, ph, pw, 0, 0));
    MS_TRY(op_crop(be, out, full, K, ph, pw, th, tw));
    arena_reset(act, mark);
    return MS_OK;
}

/* The whole forward pass of a batch on the plan's arena; in a dry run only
 * sizes. The backbone runs once over the batch; the rest image by image. */
static ms_status engine_forward(ms_engine *e, ms_backend *be, engine_plan *pl,
                                const run_geometry *g, run_buffers *rb, const ms_trace *tr)
{
    const ms_config *c = e->cfg;
    ms_arena *act = &pl->act;
    const int C = c->embed_dim, heads = c->num_heads, K = c->n_classes, B = g->batch;
    const int M = g->mita.gh * g->mita.gw, k = g->mita.topk, NW = g->nwin;
    const size_t px = (size_t)g->h * g->w, in_px = (size_t)g->ph * g->pw;
    const size_t rpx = (size_t)g->rh * g->rw, ipx = (size_t)g->ih * g->iw;
#define ALLOC(ptr, bytes)                                          \
    do {                                                           \
        (ptr) = arena_alloc(act, (bytes));                         \
        if (!(ptr)) return MS_ERR_OOM;                             \
    } while (0)
    /* Buffers that outlive the pass. */
    rb->logits = NULL;
    if (!g->mask_only) ALLOC(rb->logits, (size_t)B * K * px * sizeof(float));
    ALLOC(rb->mask, (size_t)B * px);
    rb->topk_idx = NULL, rb->route = NULL, rb->shared_mass = NULL;
    if (g->record) {
        size_t layers = (size_t)B * c->depth * heads;
        ALLOC(rb->topk_idx, layers * M * k * sizeof(int32_t));
        ALLOC(rb->route, layers * g->seq * sizeof(int32_t));
        ALLOC(rb->shared_mass, layers * g->seq * sizeof(float));
    }
    rb->blocks = NULL;
    if (g->keep_blocks) ALLOC(rb->blocks, (size_t)B * c->depth * g->n * C * sizeof(float));
    /* Input: planar (B, 3, ih, iw) staged on the host, then per image resized
     * (unless staged at the working size), and per window cut out,
     * normalised, padded into (B*NW, 3, ph, pw). */
    float *raw = pl->host_in, *resized = NULL, *win = NULL; /* the CPU reads the staging in place */
    ALLOC(rb->input, (size_t)B * NW * 3 * in_px * sizeof(float));
#ifdef MS_HAVE_CUDA
    if (be->device == MS_DEVICE_CUDA) {
        ALLOC(raw, (size_t)B * 3 * ipx * sizeof(float));
        if (!be->dry_run)
            MS_TRY(cuda_copy_h2d(e->cu, raw, pl->host_in, (size_t)B * 3 * ipx * sizeof(float)));
    }
#endif
    const bool resized_in = g->rh != g->ih || g->rw != g->iw;
    const bool resized_out = g->rh != g->h || g->rw != g->w; /* logits back to the image */
    if (resized_in) ALLOC(resized, 3 * rpx * sizeof(float)); /* one image */
    if (g->slide) ALLOC(win, (size_t)3 * g->wh * g->ww * sizeof(float));
    const int64_t in_shape[3] = {3, g->ph, g->pw};
    for (int b = 0; b < B; b++) {
        const float *raw_b = raw ? raw + b * 3 * ipx : NULL; /* (3, ih, iw); NULL when sizing */
        if (resized_in)
            MS_TRY(op_resize_bilinear(be, resized, raw_b, 3, g->ih, g->iw, g->rh, g->rw, 0, 0));
        const float *src = resized_in ? resized : raw_b; /* (3, rh, rw) */
        for (int wi = 0; wi < NW; wi++) {
            float *input_b = rb->input + ((size_t)b * NW + wi) * 3 * in_px; /* (3, ph, pw) */
            const float *wsrc = src;
            if (g->slide) { /* the window: a strided view of src, copied out */
                int y0 = slide_start(wi / g->nx, g->rh, g->wh, g->sh);
                int x0 = slide_start(wi % g->nx, g->rw, g->ww, g->sw);
                MS_TRY(op_crop(be, win, src + (size_t)y0 * g->rw + x0, 3, g->rh, g->rw, g->wh,
                               g->ww));
                wsrc = win;
            }
            MS_TRY(op_normalize_pad(be, input_b, wsrc, g->wh, g->ww, g->ph, g->pw, c->mean,
                                    c->stdv));
            MS_TRY(trace_emit(be, tr, "input", input_b, 3, in_shape));
        }
    }
    const int64_t pos_shape[2] = {g->seq, C};
    MS_TRY(trace_emit(be, tr, "pos_embed", pl->pos, 2, pos_shape));

    float *taps[4]; /* each (B*NW, C, hp, wp) */
    for (int j = 0; j < 4; j++) ALLOC(taps[j], (size_t)B * NW * C * g->n * sizeof(float));
    vit_run run = {.attention = g->attention, .mita = g->mita, .topk_idx = rb->topk_idx,
                   .route = rb->route, .shared_mass = rb->shared_mass,
                   .blocks = rb->blocks};
    float *skips[2] = {NULL, NULL}; /* each (B*NW, c, h, w): the stem outputs the neck takes */
    for (int l = 0; l < c->n_stem_skips; l++)
        ALLOC(skips[l], (size_t)B * NW * vit_stem_skip_floats(c, l, g->ph, g->pw) * sizeof(float));
    MS_TRY(vit_forward(be, act, taps, skips, rb->input, pl->pos, &e->vit, c, &run, B * NW, g->ph,
                       g->pw, tr));

    /* Neck, head and postprocessing per image (and window), each on the same
     * scratch. */
    int h0, w0;
    neck_level_size(&h0, &w0, c, 0, g->hp, g->wp);
    const int64_t lg_shape[3] = {K, g->h, g->w};
    for (int b = 0; b < B; b++) {
        size_t mark = arena_mark(act);
        float *logits_b = rb->logits ? rb->logits + b * K * px : NULL; /* (K, h, w) */
        uint8_t *mask_b = rb->mask + b * px; /* (h, w) */
        /* logits at the working size, unpadded (the image's when not resized) */
        float *work = resized_out ? NULL : logits_b; /* (K, rh, rw) */
        if (!work) ALLOC(work, (size_t)K * rpx * sizeof(float));
        float *net_logits, *wl = NULL;
        ALLOC(net_logits, (size_t)K * h0 * w0 * sizeof(float));
        if (g->slide) ALLOC(wl, (size_t)K * g->wh * g->ww * sizeof(float)); /* one window */
        for (int wi = 0; wi < NW; wi++) {
            size_t wmark = arena_mark(act);
            float *taps_b[4], *levels[4];
            for (int j = 0; j < 4; j++) /* (C, hp, wp) */
                taps_b[j] = taps[j] + ((size_t)b * NW + wi) * C * g->n;
            float *skips_b[2] = {NULL, NULL};
            for (int l = 0; l < c->n_stem_skips; l++)
                skips_b[l] = skips[l] + ((size_t)b * NW + wi) *
                                            vit_stem_skip_floats(c, l, g->ph, g->pw);
            MS_TRY(neck_forward(be, act, levels, taps_b, skips_b, &e->neck, c, g->hp, g->wp, tr));
            MS_TRY(uperhead_forward(be, act, net_logits, levels, &e->head, c, g->hp, g->wp, tr));
            MS_TRY(check_finite_logits(e, be, pl, net_logits, (size_t)K * h0 * w0));
            if (!g->slide) {
                MS_TRY(logits_unpad(be, act, work, net_logits, c, h0, w0, g->ph, g->pw, g->rh,
                                    g->rw));
            } else { /* summed where windows overlap, then averaged by count */
                int y0 = slide_start(wi / g->nx, g->rh, g->wh, g->sh);
                int x0 = slide_start(wi % g->nx, g->rw, g->ww, g->sw);
                MS_TRY(logits_unpad(be, act, wl, net_logits, c, h0, w0, g->ph, g->pw, g->wh,
                                    g->ww));
                MS_TRY(op_window_add(be, work, wl, K, g->rh, g->rw, g->wh, g->ww, y0, x0,
                                     wi == 0));
            }
            arena_reset(act, wmark);
        }
        if (g->slide)
            MS_TRY(op_window_average(be, work, K, g->rh, g->rw, g->wh, g->ww, g->sh, g->sw));
        if (logits_b) {
            if (resized_out)
                MS_TRY(op_resize_bilinear(be, logits_b, work, K, g->rh, g->rw, g->h, g->w, 0, 0));
            MS_TRY(trace_emit(be, tr, "logits", logits_b, 3, lg_shape));
            MS_TRY(op_argmax(be, mask_b, logits_b, K, g->h, g->w));
        } else if (!resized_out) {
            MS_TRY(op_argmax(be, mask_b, work, K, g->h, g->w));
        } else {
            /* The same resize, a band of rows at a time, then its argmax. */
            int rows = g->h < MS_MASK_BAND_ROWS ? g->h : MS_MASK_BAND_ROWS;
            float *band; /* (K, rows, w) */
            ALLOC(band, (size_t)K * rows * g->w * sizeof(float));
            for (int y0 = 0; y0 < g->h; y0 += rows) {
                int y1 = y0 + rows < g->h ? y0 + rows : g->h;
                MS_TRY(op_resize_bilinear_rows(be, band, work, K, g->rh, g->rw, g->h, g->w, y0,
                                               y1));
                MS_TRY(op_argmax(be, mask_b + (size_t)y0 * g->w, band, K, y1 - y0, g->w));
            }
        }
        arena_reset(act, mark);
    }
#undef ALLOC
    return MS_OK;
}

static bool plan_matches(const engine_plan *pl, const run_geometry *g)
{
    return pl->used && pl->h == g->h && pl->w == g->w && pl->rh == g->rh && pl->rw == g->rw &&
           pl->batch == g->batch &&
           pl->attention == (int)g->attention &&
           pl->gh == g->mita.gh && pl->gw == g->mita.gw && pl->topk == g->mita.topk &&
           pl->record == g->record && pl->keep_blocks == g->keep_blocks &&
           pl->mask_only == g->mask_only;
}

/* Host bytes of count results as result_reserve makes them. */
static size_t result_bytes(const run_geometry *g, const ms_config *c)
{
    size_t px = (size_t)g->h * g->w, dh = (size_t)c->depth * c->num_heads;
    size_t one = px + (g->mask_only ? 0 : (size_t)c->n_classes * px * sizeof(float));
    if (g->record)
        one += dh * ((size_t)g->mita.gh * g->mita.gw * g->mita.topk + 2 * (size_t)g->seq) * 4 +
               (size_t)c->depth;
    if (g->keep_blocks) one += (size_t)c->depth * g->n * c->embed_dim * sizeof(float);
    return one * (size_t)g->batch;
}

/* A dry run of the forward pass: the activation arena's high-water mark, and
 * the host bytes the plan and its results hold besides it. Allocates nothing. */
static ms_status plan_measure(ms_engine *e, const run_geometry *g, size_t *act_bytes,
                              size_t *host_bytes)
{
    /* A private copy of the backend: another thread may be running the
     * engine (segment checks images as it decodes them). */
    ms_backend dry = e->be, *be = &dry;
    engine_plan sizing = {0};
    ms_arena *act = &sizing.act;
    act->device = be->device;
    arena_begin_sizing(act);
    be->dry_run = true;
    be->scratch = act;
    run_buffers rb;
    sizing.pos = arena_alloc(act, (size_t)g->seq * e->cfg->embed_dim * sizeof(float));
    ms_status st = engine_forward(e, be, &sizing, g, &rb, NULL);
    *act_bytes = act->high;
    if (st != MS_OK) {
        /* The dry run refused this geometry (a token grid too small for the
         * neck, ...): about the image's size, not about memory. */
        if (g->batch == 1)
            ms_error_prefix(st, "a %dx%d image (%dx%d after resizing and padding)", g->w, g->h,
                            g->pw, g->ph);
        else
            ms_error_prefix(st, "%d %dx%d images", g->batch, g->w, g->h);
        return st;
    }
    int h0, w0;
    neck_level_size(&h0, &w0, e->cfg, 0, g->hp, g->wp);
    *host_bytes = (size_t)g->batch * 3 * g->ih * g->iw * sizeof(float) + result_bytes(g, e->cfg) +
                  (g->u8_resize ? (size_t)g->rh * g->rw * 3 +
                                      image_resize_u8_scratch(g->w, g->h, g->rw, g->rh)
                                : 0) +
                  (be->device == MS_DEVICE_CUDA ? (size_t)e->cfg->n_classes * h0 * w0 * 4 : 0);
    return st;
}

/* Host memory a plan of this size would hold: weights, activations (CPU),
 * input staging and results. */
static size_t plan_host_total(const ms_engine *e, size_t act_bytes, size_t host_bytes)
{
    return e->weights_host.cap + (e->be.device == MS_DEVICE_CPU ? act_bytes : 0) + host_bytes;
}

static ms_status over_budget(const ms_engine *e, const run_geometry *g, size_t total,
                             size_t act_bytes, size_t extra)
{
    char what[64];
    if (g->batch == 1)
        snprintf(what, sizeof what, "a %dx%d image", g->w, g->h);
    else
        snprintf(what, sizeof what, "%d %dx%d images", g->batch, g->w, g->h);
    return ms_error(MS_ERR_OOM,
                    "%s would need about %zu MiB (network input %dx%d, activations %zu MiB%s), "
                    "over the memory budget of %zu MiB (--max-memory)",
                    what, (total + extra) >> 20, g->pw, g->ph, act_bytes >> 20,
                    e->be.device == MS_DEVICE_CUDA ? " on the GPU" : "", e->max_memory >> 20);
}

/* Finds or builds the plan for this geometry: sizes the activation arena with
 * a dry run, checks the memory budget before allocating anything, allocates
 * the arena once, and caches the resized position embedding. */
static ms_status engine_get_plan(ms_engine *e, engine_plan **out, const run_geometry *g)
{
    engine_plan *pl = NULL, *lru = &e->plans[0];
    for (int i = 0; i < MS_MAX_PLANS; i++) {
        if (plan_matches(&e->plans[i], g)) pl = &e->plans[i];
        if (!e->plans[i].used || e->plans[i].last_use < lru->last_use) lru = &e->plans[i];
    }
    if (pl) {
        pl->last_use = ++e->clock;
        *out = pl;
        return MS_OK;
    }
    size_t act_bytes, host_bytes;
    MS_TRY(plan_measure(e, g, &act_bytes, &host_bytes));
    size_t total = plan_host_total(e, act_bytes, host_bytes);
    if (total > e->max_memory) return over_budget(e, g, total, act_bytes, 0);
    /* Cached plans of other sizes are only a cache: drop them rather than
     * exceed the budget together. */
    size_t cached = 0;
    for (int i = 0; i < MS_MAX_PLANS; i++)
        if (e->plans[i].used && &e->plans[i] != lru) cached += e->plans[i].bytes;
    if (total + cached > e->max_memory)
        for (int i = 0; i < MS_MAX_PLANS; i++) plan_free(&e->plans[i]);
    pl = lru;
    plan_free(pl);

    ms_backend *be = &e->be;
    ms_arena *act = &pl->act;
    size_t in_bytes = (size_t)g->batch * 3 * g->ih * g->iw * sizeof(float);
    pl->host_in = ms_malloc(in_bytes);
    MS_CHECK_ALLOC(pl->host_in, in_bytes);
    if (g->u8_resize) {
        size_t u8_bytes = (size_t)g->rh * g->rw * 3;
        size_t scratch = image_resize_u8_scratch(g->w, g->h, g->rw, g->rh);
        pl->host_u8 = ms_malloc(u8_bytes);
        pl->resize_scratch = ms_malloc(scratch);
        if (!pl->host_u8 || !pl->resize_scratch) {
            plan_free(pl);
            return ms_error(MS_ERR_OOM, "out of memory: %zu bytes for resizing a %dx%d image",
                            u8_bytes + scratch, g->w, g->h);
        }
    }
    ms_status st = arena_init(act, act_bytes, be->device);
    if (st == MS_OK && be->device == MS_DEVICE_CUDA) {
        int h0, w0;
        neck_level_size(&h0, &w0, e->cfg, 0, g->hp, g->wp);
        size_t nb = (size_t)e->cfg->n_classes * h0 * w0 * sizeof(float);
        pl->host_net = ms_malloc(nb);
        if (!pl->host_net) st = ms_error(MS_ERR_OOM, "out of memory: %zu bytes", nb);
    }
    if (st != MS_OK) {
        if (g->batch == 1)
            ms_error_prefix(st, "activation memory for a %dx%d image (%zu MiB)", g->w, g->h,
                            act_bytes >> 20);
        else
            ms_error_prefix(st, "activation memory for %d %dx%d images (%zu MiB)", g->batch,
                            g->w, g->h, act_bytes >> 20);
        plan_free(pl);
        return st;
    }
    pl->pos = arena_alloc(act, (size_t)g->seq * e->cfg->embed_dim * sizeof(float));
    st = vit_resize_pos_embed(be, act, pl->pos, &e->vit, e->cfg, g->hp, g->wp);
    if (st != MS_OK) {
        plan_free(pl);
        return st;
    }
    pl->act_base = arena_mark(act);
    if (g->attention == MS_ATTN_MITA)
        op_mita_prepare(be, e->cfg->embed_dim, e->cfg->num_heads, &g->mita);
    pl->used = true;
    pl->bytes = act_bytes + host_bytes;
    pl->h = g->h, pl->w = g->w, pl->rh = g->rh, pl->rw = g->rw;
    pl->batch = g->batch, pl->attention = g->attention;
    pl->gh = g->mita.gh, pl->gw = g->mita.gw, pl->topk = g->mita.topk, pl->record = g->record;
    pl->mask_only = g->mask_only;
    pl->keep_blocks = g->keep_blocks;
    pl->last_use = ++e->clock;
    *out = pl;
    return MS_OK;
}

ms_status engine_check_memory(ms_engine *e, int count, int h, int w, const ms_run_options *opt,
                              size_t extra_bytes)
{
    ms_run_options defaults = {.attention = -1};
    if (!opt) opt = &defaults;
    /* flip TTA: the mirror images in the same pass, and the host copy of their logits */
    bool tta = opt->tta_flip;
    if (tta) extra_bytes += (size_t)e->cfg->n_classes * h * w * sizeof(float);
    run_geometry g;
    MS_TRY(plan_geometry(&g, e->cfg, tta ? 2 * count : count, h, w, opt));
    size_t act_bytes, host_bytes;
    MS_TRY(plan_measure(e, &g, &act_bytes, &host_bytes));
    size_t total = plan_host_total(e, act_bytes, host_bytes);
    if (total + extra_bytes > e->max_memory) return over_budget(e, &g, total, act_bytes, extra_bytes);
    return MS_OK;
}

size_t engine_memory_budget(const ms_engine *e) { return e->max_memory; }

static ms_status result_reserve(ms_result *r, const run_geometry *g, const ms_config *c)
{
    size_t px = (size_t)g->h * g->w, nl = (size_t)c->n_classes * px;
    bool same = r->mask && r->h == g->h && r->w == g->w && r->classes == c->n_classes &&
                !r->logits == g->mask_only;
    if (!same) {
        ms_free(r->logits);
        ms_free(r->mask);
        r->logits = g->mask_only ? NULL : ms_malloc(nl * sizeof(float));
        r->mask = ms_malloc(px);
        if ((!g->mask_only && !r->logits) || !r->mask)
            return ms_error(MS_ERR_OOM, "out of memory: result for a %dx%d image", g->w, g->h);
    }
    int M = g->mita.gh * g->mita.gw, k = g->mita.topk;
    if (g->record) {
        bool same_rec = r->topk_idx && r->depth == c->depth && r->heads == c->num_heads &&
                        r->m == M && r->k == k && r->n == g->n && r->ncls == g->ncls;
        if (!same_rec) {
            ms_free(r->topk_idx), ms_free(r->route), ms_free(r->shared_mass), ms_free(r->layer_mita);
            size_t dh = (size_t)c->depth * c->num_heads;
            r->topk_idx = ms_malloc(dh * M * k * sizeof(int32_t));
            r->route = ms_malloc(dh * g->seq * sizeof(int32_t));
            r->shared_mass = ms_malloc(dh * g->seq * sizeof(float));
            r->layer_mita = ms_malloc((size_t)c->depth);
            if (!r->topk_idx || !r->route || !r->shared_mass || !r->layer_mita)
                return ms_error(MS_ERR_OOM, "out of memory: MiTA record");
        }
    }
    size_t nb = (size_t)c->depth * g->n * c->embed_dim;
    if (g->keep_blocks && !(r->blocks && r->dim == c->embed_dim && r->n == g->n && r->depth == c->depth)) {
        ms_free(r->blocks);
        r->blocks = ms_malloc(nb * sizeof(float));
        if (!r->blocks) return ms_error(MS_ERR_OOM, "out of memory: block outputs");
    }
    if (!g->keep_blocks) {
        ms_free(r->blocks);
        r->blocks = NULL;
    }
    r->dim = g->keep_blocks ? c->embed_dim : 0;
    r->h = g->h, r->w = g->w, r->rh = g->rh, r->rw = g->rw, r->ph = g->ph, r->pw = g->pw;
    r->patch = c->patch_size, r->hp = g->hp, r->wp = g->wp, r->n = g->n, r->ncls = g->ncls;
    r->classes = c->n_classes, r->depth = c->depth, r->heads = c->num_heads;
    r->gh = g->mita.gh, r->gw = g->mita.gw, r->m = M, r->k = k;
    r->attention = g->attention;
    if (!g->record) {
        ms_free(r->topk_idx), ms_free(r->route), ms_free(r->shared_mass), ms_free(r->layer_mita);
        r->topk_idx = NULL, r->route = NULL, r->shared_mass = NULL, r->layer_mita = NULL;
    }
    return MS_OK;
}

static ms_status copy_out(ms_engine *e, void *dst, const void *src, size_t bytes)
{
#ifdef MS_HAVE_CUDA
    if (e->be.device == MS_DEVICE_CUDA) return cuda_copy_d2h(e->cu, dst, src, bytes);
#endif
    memcpy(dst, src, bytes);
    return MS_OK;
}

/* Waits for copy_out's copies (asynchronous on CUDA) before the host reads them. */
static ms_status copies_done(ms_engine *e)
{
#ifdef MS_HAVE_CUDA
    if (e->be.device == MS_DEVICE_CUDA) return cuda_sync(e->cu);
#endif
    (void)e;
    return MS_OK;
}

ms_status engine_run(ms_engine *e, ms_result *res, const ms_image *img, const ms_run_options *opt)
{
    return engine_run_batch(e, res, &img, 1, opt);
}

ms_status engine_run_batch(ms_engine *e, ms_result *res, const ms_image *const *imgs, int count,
                           const ms_run_options *opt)
{
    ms_run_options defaults = {.attention = -1};
    if (!opt) opt = &defaults;
    if (count < 1 || !imgs) return ms_error(MS_ERR_ARG, "engine_run_batch: no images");
    for (int b = 0; b < count; b++) {
        const ms_image *im = imgs[b];
        if (!im || !im->rgb || im->w < 1 || im->h < 1)
            return ms_error(MS_ERR_ARG, "engine_run: empty image%s", count > 1 ? " in a batch" : "");
        if (im->w != imgs[0]->w || im->h != imgs[0]->h)
            return ms_error(MS_ERR_ARG,
                            "engine_run_batch: image %d is %dx%d but image 0 is %dx%d; a batch "
                            "needs one size", b, im->w, im->h, imgs[0]->w, imgs[0]->h);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
#ifdef MS_HAVE_CUDA
    if (e->be.device == MS_DEVICE_CUDA) MS_TRY(cuda_ctx_use(e->cu)); /* this thread's GPU */
#endif
    /* the engine's thread count on this thread too: a worker thread's
     * OpenMP regions would otherwise take a team per core (segment --tile
     * 16 at --threads 1 spent 18 s of 30 in futex calls) */
    backend_use_threads(&e->be);
    /* Flip TTA: the mirror images run as images count..2count-1 of the same
     * pass; their logits are mirrored back and averaged in on the host. */
    const bool tta = opt->tta_flip;
    const int passes = tta ? 2 * count : count;
    run_geometry g;
    MS_TRY(plan_geometry(&g, e->cfg, passes, imgs[0]->h, imgs[0]->w, opt));
    engine_plan *pl = NULL;
    MS_TRY(engine_get_plan(e, &pl, &g));
    for (int b = 0; b < count; b++) MS_TRY(result_reserve(&res[b], &g, e->cfg));
    const ms_config *c = e->cfg;
    size_t px = (size_t)g.h * g.w, n_logits = (size_t)c->n_classes * px;
    if (tta && e->tta_cap < n_logits) {
        ms_free(e->tta_host);
        e->tta_cap = 0;
        e->tta_host = ms_malloc(n_logits * sizeof(float));
        if (!e->tta_host)
            return ms_error(MS_ERR_OOM, "out of memory: flip TTA logits for a %dx%d image", g.w, g.h);
        e->tta_cap = n_logits;
    }

    /* Interleaved uint8 -> planar float staging, (B, 3, ih, iw), resized
     * first as OpenCV does with input.resize cv2_uint8; mirrored left-right
     * for the TTA half (after resizing: mmseg's TTA flips the resized image). */
    const size_t ipx = (size_t)g.ih * g.iw;
    for (int b = 0; b < passes; b++) {
        float *dst = pl->host_in + (size_t)b * 3 * ipx;
        const uint8_t *rgb = imgs[b % count]->rgb; /* (h, w, 3), then (ih, iw, 3) */
        if (g.u8_resize) {
            image_resize_u8_rgb(pl->host_u8, rgb, g.w, g.h, g.rw, g.rh, pl->resize_scratch);
            rgb = pl->host_u8;
        }
        if (b < count) {
            for (size_t i = 0; i < ipx; i++)
                for (int ch = 0; ch < 3; ch++) dst[ch * ipx + i] = rgb[i * 3 + ch];
        } else {
            for (int y = 0; y < g.ih; y++)
                for (int x = 0; x < g.iw; x++) {
                    size_t i = (size_t)y * g.iw + x, src = (size_t)y * g.iw + (g.iw - 1 - x);
                    for (int ch = 0; ch < 3; ch++) dst[ch * ipx + i] = rgb[src * 3 + ch];
                }
        }
    }

    arena_reset(&pl->act, pl->act_base);
    e->be.scratch = &pl->act;
    run_buffers rb;
    ms_status st = engine_forward(e, &e->be, pl, &g, &rb, &e->trace);
    size_t dh = (size_t)c->depth * c->num_heads;
    size_t n_topk = dh * g.mita.gh * g.mita.gw * g.mita.topk;
    for (int b = 0; b < count && st == MS_OK; b++) {
        ms_result *r = &res[b];
        if (r->logits) st = copy_out(e, r->logits, rb.logits + b * n_logits, n_logits * sizeof(float));
        if (st == MS_OK && tta) {
            st = copy_out(e, e->tta_host, rb.logits + (count + b) * n_logits,
                          n_logits * sizeof(float));
            if (st == MS_OK) st = copies_done(e);
            if (st == MS_OK) {
                for (size_t p = 0; p < (size_t)c->n_classes * g.h; p++) {
                    float *row = r->logits + p * g.w;                  /* (w) */
                    const float *mir = e->tta_host + p * g.w;          /* (w), mirrored */
                    for (int x = 0; x < g.w; x++) row[x] = 0.5f * (row[x] + mir[g.w - 1 - x]);
                }
                argmax_cpu(r->mask, r->logits, c->n_classes, g.h, g.w);
            }
        } else if (st == MS_OK) {
            st = copy_out(e, r->mask, rb.mask + b * px, px);
        }
        if (st == MS_OK && g.record) {
            st = copy_out(e, r->topk_idx, rb.topk_idx + b * n_topk, n_topk * sizeof(int32_t));
            if (st == MS_OK)
                st = copy_out(e, r->route, rb.route + b * dh * g.seq,
                              dh * g.seq * sizeof(int32_t));
            if (st == MS_OK)
                st = copy_out(e, r->shared_mass, rb.shared_mass + b * dh * g.seq,
                              dh * g.seq * sizeof(float));
            memset(r->layer_mita, 1, (size_t)c->depth);
        }
        if (st == MS_OK && g.keep_blocks) {
            size_t nb = (size_t)c->depth * g.n * c->embed_dim;
            st = copy_out(e, r->blocks, rb.blocks + b * nb, nb * sizeof(float));
        }
        r->tta_flip = tta;
    }
    if (st == MS_OK) st = copies_done(e);
    arena_reset(&pl->act, pl->act_base);
    if (st != MS_OK) return st;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    for (int b = 0; b < count; b++) {
        res[b].ms_total = ms / count;
        snprintf(res[b].device_name, sizeof res[b].device_name, "%s", e->device_name);
    }
    return MS_OK;
}

void result_free(ms_result *r)
{
    if (!r) return;
    ms_free(r->logits), ms_free(r->mask), ms_free(r->topk_idx), ms_free(r->route);
    ms_free(r->shared_mass), ms_free(r->layer_mita), ms_free(r->blocks);
    memset(r, 0, sizeof *r);
}

ms_status result_write_dump(const ms_result *r, const char *path)
{
    if (!r->logits) return ms_error(MS_ERR_ARG, "%s: nothing to dump", path);
    int depth = r->topk_idx ? r->depth : 0;
    int nblocks = r->blocks ? r->depth : 0, per_layer = r->shared_mass ? 3 : 2;
    int n = 2 + per_layer * depth + nblocks;
    ms_tensor *t = calloc((size_t)n, sizeof *t);
    char(*names)[48] = calloc((size_t)n, sizeof *names);
    if (!t || !names) {
        free(t), free(names);
        return ms_error(MS_ERR_OOM, "out of memory: dump of %s", path);
    }
    t[0] = (ms_tensor){.name = "logits", .dtype = MS_DT_F32, .ndim = 3,
                       .shape = {r->classes, r->h, r->w}, .data = r->logits,
                       .nbytes = (size_t)r->classes * r->h * r->w * sizeof(float)};
    t[1] = (ms_tensor){.name = "mask", .dtype = MS_DT_U8, .ndim = 2, .shape = {r->h, r->w},
                       .data = r->mask, .nbytes = (size_t)r->h * r->w};
    for (int i = 0; i < depth; i++) {
        int at = 2 + per_layer * i;
        ms_tensor *a = &t[at], *b = &t[at + 1];
        snprintf(names[at], sizeof names[0], "layers.%d.topk_idx", i);
        snprintf(names[at + 1], sizeof names[0], "layers.%d.route", i);
        size_t per = (size_t)r->heads * r->m * r->k;
        *a = (ms_tensor){.name = names[at], .dtype = MS_DT_I32, .ndim = 3,
                         .shape = {r->heads, r->m, r->k}, .data = r->topk_idx + (size_t)i * per,
                         .nbytes = per * sizeof(int32_t)};
        size_t pr = (size_t)r->heads * (r->n + r->ncls); /* the class token last */
        *b = (ms_tensor){.name = names[at + 1], .dtype = MS_DT_I32, .ndim = 2,
                         .shape = {r->heads, r->n + r->ncls}, .data = r->route + (size_t)i * pr,
                         .nbytes = pr * sizeof(int32_t)};
        if (per_layer == 3) {
            snprintf(names[at + 2], sizeof names[0], "layers.%d.shared_mass", i);
            t[at + 2] = (ms_tensor){.name = names[at + 2], .dtype = MS_DT_F32, .ndim = 2,
                                    .shape = {r->heads, r->n + r->ncls},
                                    .data = r->shared_mass + (size_t)i * pr,
                                    .nbytes = pr * sizeof(float)};
        }
    }
    for (int i = 0; i < nblocks; i++) {
        int at = 2 + per_layer * depth + i;
        size_t pb = (size_t)r->n * r->dim;
        snprintf(names[at], sizeof names[0], "blocks.%d", i);
        t[at] = (ms_tensor){.name = names[at], .dtype = MS_DT_F32, .ndim = 2, .shape = {r->n, r->dim},
                            .data = r->blocks + (size_t)i * pb, .nbytes = pb * sizeof(float)};
    }
    char grid[32], topk[16], tokens[32], work[32];
    snprintf(grid, sizeof grid, "%dx%d", r->gh, r->gw);
    snprintf(topk, sizeof topk, "%d", r->k);
    /* rows x columns, as the landmarks: what topk_idx positions index */
    snprintf(tokens, sizeof tokens, "%dx%d", r->hp, r->wp);
    snprintf(work, sizeof work, "%dx%d", r->rh, r->rw);
    const char *meta[] = {"format", "mitaseg-dump", "attention",
                          r->attention == MS_ATTN_MITA ? "mita" : "full",
                          "landmarks", grid, "topk", topk, "token_grid", tokens,
                          "working_size", work, NULL};
    ms_status st = safetensors_write(path, t, n, meta);
    free(t), free(names);
    return st;
}
