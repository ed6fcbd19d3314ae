/* The ViT forward pass (mita-spec section 1) and its attention (section 2). */
#include "vit.h"

#include <stdio.h>
#include <string.h>

#ifdef MS_HAVE_CUDA
#include "kernels/cuda_ctx.h"
#endif

ms_status trace_emit(ms_backend *be, const ms_trace *tr, const char *name,
                     const float *data, int ndim, const int64_t *shape)
{
    if (!tr || !tr->fn || be->dry_run) return MS_OK;
#ifdef MS_HAVE_CUDA
    if (be->device == MS_DEVICE_CUDA) {
        size_t n = 1;
        for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
        float *host = ms_malloc(n * sizeof(float));
        MS_CHECK_ALLOC(host, n * sizeof(float));
        ms_status st = cuda_copy_d2h(be->cuda, host, data, n * sizeof(float));
        if (st == MS_OK) st = cuda_sync(be->cuda);
        if (st == MS_OK) tr->fn(tr->user, name, host, ndim, shape);
        ms_free(host);
        return st;
    }
#endif
    tr->fn(tr->user, name, data, ndim, shape);
    return MS_OK;
}

ms_status trace_emit_each(ms_backend *be, const ms_trace *tr, const char *name,
                          const float *data, int batch, int ndim, const int64_t *shape)
{
    if (!tr || !tr->fn || be->dry_run) return MS_OK;
    size_t per = 1;
    for (int i = 0; i < ndim; i++) per *= (size_t)shape[i];
    for (int b = 0; b < batch; b++) MS_TRY(trace_emit(be, tr, name, data + b * per, ndim, shape));
    return MS_OK;
}

#define ALLOC_F32(ptr, count)                                        \
    do {                                                             \
        (ptr) = arena_alloc(act, (size_t)(count) * sizeof(float));   \
        if (!(ptr)) return MS_ERR_OOM;                               \
    } while (0)

ms_status vit_resize_pos_embed(ms_backend *be, ms_arena *act, float *out, const vit_weights *w,
                               const ms_config *cfg, int hp, int wp)
{
    int C = cfg->embed_dim, h0 = cfg->pos_grid[0], w0 = cfg->pos_grid[1];
    int nc = cfg->cls_token ? 1 : 0;
    if (hp == h0 && wp == w0)
        return op_crop(be, out, w->pos_embed, 1, nc + hp * wp, C, nc + hp * wp, C);
    if (nc) MS_TRY(op_crop(be, out, w->pos_embed, 1, 1, C, 1, C)); /* class row: never resized */
    /* Interpolation works on (C, H, W) maps; tokens are (N, C). */
    size_t mark = arena_mark(act);
    float *map0, *map1;
    ALLOC_F32(map0, (size_t)C * h0 * w0);
    ALLOC_F32(map1, (size_t)C * hp * wp);
    MS_TRY(op_transpose(be, map0, w->pos_embed + (size_t)nc * C, h0 * w0, C));
    MS_TRY(op_resize_bicubic(be, map1, map0, C, h0, w0, hp, wp));
    MS_TRY(op_transpose(be, out + (size_t)nc * C, map1, C, hp * wp));
    arena_reset(act, mark);
    return MS_OK;
}

int vit_stem_skip_index(const ms_config *cfg, int l) { return cfg->n_stem - 3 + l; }

size_t vit_stem_skip_floats(const ms_config *cfg, int l, int ph, int pw)
{
    int i = vit_stem_skip_index(cfg, l);
    return (size_t)cfg->stem_channels[i] * (ph >> (i + 1)) * (pw >> (i + 1));
}

/* Stem: (3, ph, pw) -> tokens (N, C); the conv stem outputs that the neck
 * takes (cfg->n_stem_skips) written to skips[l] instead of scratch. */
static ms_status vit_stem(ms_backend *be, ms_arena *act, float *tokens /* (N, C) */,
                          float *const skips[2] /* each (c_i, h_i, w_i) */,
                          const float *input /* (3, ph, pw) */, const vit_weights *w,
                          const ms_config *cfg, int ph, int pw)
{
    int C = cfg->embed_dim, p = cfg->patch_size, hp = ph / p, wp = pw / p;
    size_t mark = arena_mark(act);
    float *map;
    ALLOC_F32(map, (size_t)C * hp * wp);
    if (cfg->stem == MS_STEM_PATCH) {
        MS_TRY(op_conv2d(be, map, input, w->patch.w, w->patch.b, 3, ph, pw, C, p, p, p, 0,
                         MS_ACT_NONE));
    } else {
        const float *x = input;
        int c = 3, h = ph, wd = pw;
        for (int i = 0; i < cfg->n_stem; i++) {
            const ms_conv *cv = &w->stem[i];
            int ho = (h + 2 - 3) / 2 + 1, wo = (wd + 2 - 3) / 2 + 1;
            float *y = NULL;
            for (int l = 0; l < cfg->n_stem_skips; l++)
                if (vit_stem_skip_index(cfg, l) == i) y = skips[l];
            if (!y) ALLOC_F32(y, (size_t)cv->co * ho * wo);
            MS_TRY(op_conv2d(be, y, x, cv->w, cv->b, c, h, wd, cv->co, 3, 3, 2, 1, MS_ACT_RELU));
            x = y, c = cv->co, h = ho, wd = wo;
        }
        if (h != hp || wd != wp)
            return ms_error(MS_ERR_ARG, "conv stem produced a %dx%d grid, expected %dx%d", h, wd,
                            hp, wp);
        MS_TRY(op_conv2d(be, map, x, w->stem_proj.w, w->stem_proj.b, c, h, wd, C, 1, 1, 1, 0,
                         MS_ACT_NONE));
    }
    MS_TRY(op_transpose(be, tokens, map, C, hp * wp));
    arena_reset(act, mark);
    return MS_OK;
}

ms_status vit_forward(ms_backend *be, ms_arena *act, float *taps[4], float *const skips[2],
                      const float *input, const float *pos, const vit_weights *w,
                      const ms_config *cfg, const vit_run *run, int batch, int ph, int pw,
                      const ms_trace *tr)
{
    const int C = cfg->embed_dim, H = cfg->num_heads, p = cfg->patch_size;
    const int hp = ph / p, wp = pw / p, N = hp * wp, R = cfg->mlp_ratio * C;
    const int nc = cfg->cls_token ? 1 : 0, T = nc + N; /* sequence: class token, then grid */
    const int M = run->mita.gh * run->mita.gw, K = run->mita.topk, BN = batch * T;
    const size_t img_tokens = (size_t)T * C, img_qkv = (size_t)T * 3 * C;
    size_t mark = arena_mark(act);
    float *x, *xn, *qkv, *a, *hid;
    ALLOC_F32(x, (size_t)BN * C);       /* (B*T, C): image b's tokens at rows b*T.. */
    ALLOC_F32(xn, (size_t)BN * C);      /* (B*T, C) */
    ALLOC_F32(qkv, (size_t)BN * 3 * C); /* (B*T, 3C) */
    ALLOC_F32(a, (size_t)BN * C);       /* (B*T, C) */
    ALLOC_F32(hid, (size_t)BN * R);     /* (B*T, rC) */

    for (int b = 0; b < batch; b++) {
        float *xb = x + b * img_tokens; /* (T, C) */
        if (nc) MS_TRY(op_crop(be, xb, w->cls_token, 1, 1, C, 1, C));
        float *skips_b[2] = {NULL, NULL};
        for (int l = 0; l < cfg->n_stem_skips; l++)
            skips_b[l] = skips[l] + (size_t)b * vit_stem_skip_floats(cfg, l, ph, pw);
        MS_TRY(vit_stem(be, act, xb + (size_t)nc * C, skips_b, input + (size_t)b * 3 * ph * pw,
                        w, cfg, ph, pw));
        MS_TRY(op_add(be, xb, xb, pos, img_tokens));
    }
    const int64_t tok_shape[2] = {T, C}, map_shape[3] = {C, hp, wp};
    MS_TRY(trace_emit_each(be, tr, "embed", x, batch, 2, tok_shape));

    int last_tap = cfg->out_indices[3];
    for (int i = 0; i < cfg->depth; i++) {
        const vit_block *bl = &w->blocks[i];
        MS_TRY(op_layernorm(be, xn, x, bl->norm1_w, bl->norm1_b, BN, C, cfg->ln_eps));
        MS_TRY(op_linear(be, qkv, xn, bl->qkv_w, bl->qkv_b, BN, C, 3 * C, MS_ACT_NONE, false));
        for (int b = 0; b < batch; b++) {
            const float *qkv_b = qkv + b * img_qkv; /* (T, 3C) */
            float *a_b = a + b * img_tokens;        /* (T, C) */
            if (run->attention == MS_ATTN_MITA) {
                /* records: (B, depth, heads, ...), this image's layer i */
                size_t layer = (size_t)b * cfg->depth + i;
                ms_mita_record rec = {0};
                if (run->topk_idx) rec.topk_idx = run->topk_idx + layer * H * M * K;
                if (run->route) rec.route = run->route + layer * H * T;
                if (run->shared_mass) rec.shared_mass = run->shared_mass + layer * H * T;
                bool any = rec.topk_idx || rec.route || rec.shared_mass;
                MS_TRY(op_mita(be, a_b, qkv_b, hp, wp, C, H, &run->mita, any ? &rec : NULL));
            } else {
                MS_TRY(op_attention_full(be, a_b, qkv_b, T, C, H));
            }
        }
        MS_TRY(op_linear(be, x, a, bl->proj_w, bl->proj_b, BN, C, C, MS_ACT_NONE, true));
        MS_TRY(op_layernorm(be, xn, x, bl->norm2_w, bl->norm2_b, BN, C, cfg->ln_eps));
        MS_TRY(op_linear(be, hid, xn, bl->fc1_w, bl->fc1_b, BN, C, R, MS_ACT_GELU, false));
        MS_TRY(op_linear(be, x, hid, bl->fc2_w, bl->fc2_b, BN, R, C, MS_ACT_NONE, true));

        if (run->blocks) /* image b's grid rows (N, C), no class token, to its (b, i) slot */
            for (int b = 0; b < batch; b++)
                MS_TRY(op_crop(be, run->blocks + ((size_t)b * cfg->depth + i) * N * C,
                               x + b * img_tokens + (size_t)nc * C, 1, N, C, N, C));
        char name[32];
        snprintf(name, sizeof name, "blocks.%d", i);
        MS_TRY(trace_emit_each(be, tr, name, x, batch, 2, tok_shape));
        for (int j = 0; j < 4; j++) {
            if (cfg->out_indices[j] != i) continue;
            const float *src = x;
            if (cfg->final_norm && i == last_tap && j == 3) {
                MS_TRY(op_layernorm(be, xn, x, w->norm_w, w->norm_b, BN, C, cfg->ln_eps));
                src = xn;
            }
            for (int b = 0; b < batch; b++) /* grid rows (N, C) -> (C, hp, wp) per image */
                MS_TRY(op_transpose(be, taps[j] + (size_t)b * N * C,
                                    src + b * img_tokens + (size_t)nc * C, N, C));
            snprintf(name, sizeof name, "taps.%d", j);
            MS_TRY(trace_emit_each(be, tr, name, taps[j], batch, 3, map_shape));
        }
    }
    arena_reset(act, mark);
    return MS_OK;
}
