/* backbone/: the plain ViT of mita-spec section 1, with full or MiTA attention
 * per run. It composes kernels/ops.h and holds no arithmetic loops itself. */
#ifndef MS_VIT_H
#define MS_VIT_H

#include "backbone/config.h"
#include "kernels/ops.h"

/* A convolution with its BatchNorm (if any) folded in: y = conv(x, w) + b. */
typedef struct {
    float *w;   /* (co, ci, kh, kw); transposed conv: (ci, co, kh, kw) */
    float *b;   /* (co) */
    int co, ci, kh, kw;
} ms_conv;

typedef struct {
    float *norm1_w, *norm1_b;   /* (C) */
    float *qkv_w, *qkv_b;       /* (3C, C), (3C) */
    float *proj_w, *proj_b;     /* (C, C), (C) */
    float *norm2_w, *norm2_b;   /* (C) */
    float *fc1_w, *fc1_b;       /* (rC, C), (rC) */
    float *fc2_w, *fc2_b;       /* (C, rC), (C) */
} vit_block;

typedef struct {
    ms_conv patch;                  /* patch stem: (C, 3, p, p) */
    ms_conv stem[MS_MAX_STEM];      /* conv stem, BN folded */
    ms_conv stem_proj;              /* (C, c_last, 1, 1) */
    float *pos_embed;               /* (ncls + Hp0*Wp0, C) at cfg pos_grid, class row first */
    float *cls_token;               /* (C), cls_token only */
    vit_block *blocks;              /* (depth), host array of device pointers */
    float *norm_w, *norm_b;         /* (C), final_norm only */
} vit_weights;

/* Optional stage dump for tests: called with device pointers' host copies. */
typedef void (*ms_trace_fn)(void *user, const char *name, const float *data,
                            int ndim, const int64_t *shape);
typedef struct {
    ms_trace_fn fn;
    void *user;
} ms_trace;

/* Emits a trace of a device tensor (copies to the host when on CUDA). */
ms_status trace_emit(ms_backend *be, const ms_trace *tr, const char *name,
                     const float *data, int ndim, const int64_t *shape);
/* A batched tensor (batch, shape...) traced image by image under one name, so
 * a batch of one traces exactly as trace_emit. */
ms_status trace_emit_each(ms_backend *be, const ms_trace *tr, const char *name,
                          const float *data /* (batch, shape...) */, int batch, int ndim,
                          const int64_t *shape);

typedef struct {
    ms_attn_type attention;
    ms_mita_params mita;            /* clamped to the grid */
    /* MiTA records of every image and layer, or NULL (no recording). */
    int32_t *topk_idx;              /* (batch, depth, heads, m, k) */
    int32_t *route;                 /* (batch, depth, heads, ncls + n) */
    float *shared_mass;             /* (batch, depth, heads, ncls + n) */
    float *blocks;                  /* (batch, depth, n, C) grid tokens' block outputs, or NULL */
} vit_run;

/* Resizes the stored position embedding's grid rows to a (hp, wp) grid
 * (bicubic), or copies them when the grid is the training grid; the class
 * token's row (if any) is copied unchanged (mita-spec 1). */
ms_status vit_resize_pos_embed(ms_backend *be, ms_arena *act,
                               float *out /* (ncls + hp*wp, C) */,
                               const vit_weights *w, const ms_config *cfg, int hp, int wp);

/* The conv stem output that neck level l < cfg->n_stem_skips takes (the
 * one of its size), and its floats for one (ph, pw) input: (stem_channels[i],
 * ph >> (i + 1), pw >> (i + 1)) (ph, pw are whole patches). */
int vit_stem_skip_index(const ms_config *cfg, int l);
size_t vit_stem_skip_floats(const ms_config *cfg, int l, int ph, int pw);

/* The backbone over a batch of same-size images: inputs (B, 3, ph, pw) ->
 * four taps (B, C, hp, wp), and the conv stem outputs the neck takes
 * (skips[l], each (B, c, h, w), cfg->n_stem_skips of them). Each image's
 * sequence is T = ncls + N tokens, the class token (if any) first; the
 * taps drop it. The images' tokens are
 * stacked (B*T, C), so the
 * LayerNorms, linears (GELU and residual adds fused) run once over B*N rows:
 * bigger GEMMs. The stem, the attention (it mixes tokens within one image)
 * and the taps' transposes run image by image on row slices. */
ms_status vit_forward(ms_backend *be, ms_arena *act,
                      float *taps[4] /* each (B, C, hp, wp) */,
                      float *const skips[2] /* each (B, c, h, w) or unused */,
                      const float *input /* (B, 3, ph, pw) */,
                      const float *pos /* (ncls + hp*wp, C) */,
                      const vit_weights *w, const ms_config *cfg, const vit_run *run,
                      int batch, int ph, int pw, const ms_trace *tr);

#endif
