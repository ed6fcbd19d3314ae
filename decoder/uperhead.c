/* UPerHead (mmsegmentation layout): PPM on the coarsest level, FPN laterals
 * with a top-down path, fused at level-0 size, 1x1 to classes. */
#include "decoder.h"

#include <stdio.h>

static ms_status conv_module(ms_backend *be, float *out, const float *in, const ms_conv *cv,
                             int h, int w)
{
    int pad = cv->kh / 2;
    return op_conv2d(be, out, in, cv->w, cv->b, cv->ci, h, w, cv->co, cv->kh, cv->kw, 1, pad,
                     MS_ACT_RELU);
}

ms_status uperhead_forward(ms_backend *be, ms_arena *act, float *logits, float *const levels[4],
                           const uperhead_weights *w, const ms_config *cfg, int hp, int wp,
                           const ms_trace *tr)
{
    const int Cin = cfg->neck_channels, ch = cfg->head_channels;
    int hs[4], ws[4];
    for (int l = 0; l < 4; l++) neck_level_size(&hs[l], &ws[l], cfg, l, hp, wp);
    size_t mark = arena_mark(act);
#define ALLOC(ptr, count)                                              \
    do {                                                               \
        (ptr) = arena_alloc(act, (size_t)(count) * sizeof(float));     \
        if (!(ptr)) return MS_ERR_OOM;                                 \
    } while (0)

    /* 1. PPM on level 3, concatenated channel-wise after the input. */
    const int h3 = hs[3], w3 = ws[3], np = cfg->n_pool;
    float *cat, *pooled, *pconv, *lat[4], *fpn_cat, *fused;
    ALLOC(cat, (size_t)(Cin + np * ch) * h3 * w3);
    MS_TRY(op_crop(be, cat, levels[3], Cin, h3, w3, h3, w3));
    for (int j = 0; j < np; j++) {
        int s = cfg->pool_scales[j];
        size_t m2 = arena_mark(act);
        ALLOC(pooled, (size_t)Cin * s * s);
        ALLOC(pconv, (size_t)ch * s * s);
        MS_TRY(op_adaptive_avgpool(be, pooled, levels[3], Cin, h3, w3, s, s));
        MS_TRY(conv_module(be, pconv, pooled, &w->psp[j], s, s));
        MS_TRY(op_resize_bilinear(be, cat + (size_t)(Cin + j * ch) * h3 * w3, pconv, ch, s, s,
                                  h3, w3, 0, 0));
        arena_reset(act, m2);
    }
    ALLOC(lat[3], (size_t)ch * h3 * w3);
    MS_TRY(conv_module(be, lat[3], cat, &w->bottleneck, h3, w3));
    const int64_t psp_shape[3] = {ch, h3, w3};
    MS_TRY(trace_emit(be, tr, "head.psp", lat[3], 3, psp_shape));

    /* 2-3. Laterals and the top-down path. */
    for (int l = 0; l < 3; l++) {
        ALLOC(lat[l], (size_t)ch * hs[l] * ws[l]);
        MS_TRY(conv_module(be, lat[l], levels[l], &w->lateral[l], hs[l], ws[l]));
    }
    for (int i = 3; i >= 1; i--) {
        size_t m2 = arena_mark(act);
        float *up;
        ALLOC(up, (size_t)ch * hs[i - 1] * ws[i - 1]);
        MS_TRY(op_resize_bilinear(be, up, lat[i], ch, hs[i], ws[i], hs[i - 1], ws[i - 1], 0, 0));
        MS_TRY(op_add(be, lat[i - 1], lat[i - 1], up, (size_t)ch * hs[i - 1] * ws[i - 1]));
        arena_reset(act, m2);
    }

    /* 4-5. FPN convs, all levels resized to level 0 and concatenated. */
    const int h0 = hs[0], w0 = ws[0];
    const size_t plane = (size_t)ch * h0 * w0;
    ALLOC(fpn_cat, 4 * plane);
    for (int l = 0; l < 3; l++) {
        size_t m2 = arena_mark(act);
        float *f = fpn_cat;
        if (l > 0) ALLOC(f, (size_t)ch * hs[l] * ws[l]);
        MS_TRY(conv_module(be, f, lat[l], &w->fpn[l], hs[l], ws[l]));
        char name[16];
        snprintf(name, sizeof name, "head.fpn.%d", l);
        const int64_t shape[3] = {ch, hs[l], ws[l]};
        MS_TRY(trace_emit(be, tr, name, f, 3, shape));
        if (l > 0)
            MS_TRY(op_resize_bilinear(be, fpn_cat + l * plane, f, ch, hs[l], ws[l], h0, w0, 0, 0));
        arena_reset(act, m2);
    }
    MS_TRY(op_resize_bilinear(be, fpn_cat + 3 * plane, lat[3], ch, h3, w3, h0, w0, 0, 0));
    ALLOC(fused, plane);
    MS_TRY(conv_module(be, fused, fpn_cat, &w->fpn_bottleneck, h0, w0));
    const int64_t fshape[3] = {ch, h0, w0};
    MS_TRY(trace_emit(be, tr, "head.fused", fused, 3, fshape));
    MS_TRY(op_conv2d(be, logits, fused, w->seg.w, w->seg.b, ch, h0, w0, cfg->n_classes, 1, 1, 1,
                     0, MS_ACT_NONE));
    const int64_t lshape[3] = {cfg->n_classes, h0, w0};
    MS_TRY(trace_emit(be, tr, "head.logits", logits, 3, lshape));
#undef ALLOC
    arena_reset(act, mark);
    return MS_OK;
}
