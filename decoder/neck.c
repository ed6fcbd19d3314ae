/* Necks: mln (MultiLevelNeck), fpn-deconv (BEiT style) and none. */
#include "decoder.h"

#include <math.h>
#include <stdio.h>

static const double mln_scales[4] = {4.0, 2.0, 1.0, 0.5};

void neck_level_size(int *h, int *w, const ms_config *cfg, int level, int hp, int wp)
{
    switch (cfg->neck) {
    case MS_NECK_MLN: /* F.interpolate(scale_factor=s): floor(S * s) */
        *h = (int)floor(hp * mln_scales[level]);
        *w = (int)floor(wp * mln_scales[level]);
        break;
    case MS_NECK_FPN_DECONV: {
        static const int mul[4] = {4, 2, 1, 0};
        *h = level == 3 ? hp / 2 : hp * mul[level];
        *w = level == 3 ? wp / 2 : wp * mul[level];
        break;
    }
    default:
        *h = hp;
        *w = wp;
    }
}

ms_status neck_forward(ms_backend *be, ms_arena *act, float *levels[4], float *const taps[4],
                       float *const skips[2], const neck_weights *w, const ms_config *cfg,
                       int hp, int wp, const ms_trace *tr)
{
    const int C = cfg->embed_dim, Cn = cfg->neck_channels;
    for (int l = 0; l < 4; l++) {
        int h, wd;
        neck_level_size(&h, &wd, cfg, l, hp, wp);
        if (h < 1 || wd < 1)
            return ms_error(MS_ERR_ARG, "token grid %dx%d too small for neck level %d", hp, wp, l);
        if (cfg->neck == MS_NECK_NONE) {
            levels[l] = taps[l];
        } else {
            levels[l] = arena_alloc(act, (size_t)Cn * h * wd * sizeof(float));
            if (!levels[l]) return MS_ERR_OOM;
        }
        if (cfg->neck == MS_NECK_MLN) {
            size_t mark = arena_mark(act);
            float *lat = arena_alloc(act, (size_t)Cn * hp * wp * sizeof(float));
            float *up = arena_alloc(act, (size_t)Cn * h * wd * sizeof(float));
            if (!lat || !up) return MS_ERR_OOM;
            const ms_conv *a = &w->lateral[l], *b = &w->convs[l];
            MS_TRY(op_conv2d(be, lat, taps[l], a->w, a->b, C, hp, wp, Cn, 1, 1, 1, 0, MS_ACT_NONE));
            MS_TRY(op_resize_bilinear(be, up, lat, Cn, hp, wp, h, wd, mln_scales[l],
                                      mln_scales[l]));
            if (l < cfg->n_stem_skips) { /* + the stem's detail at this size, before the 3x3 */
                const ms_conv *s = &w->stem[l];
                float *sk = arena_alloc(act, (size_t)Cn * h * wd * sizeof(float));
                if (!sk) return MS_ERR_OOM;
                MS_TRY(op_conv2d(be, sk, skips[l], s->w, s->b, s->ci, h, wd, Cn, 1, 1, 1, 0,
                                 MS_ACT_NONE));
                MS_TRY(op_add(be, up, up, sk, (size_t)Cn * h * wd));
            }
            MS_TRY(op_conv2d(be, levels[l], up, b->w, b->b, Cn, h, wd, Cn, 3, 3, 1, 1,
                             MS_ACT_NONE));
            arena_reset(act, mark);
        } else if (cfg->neck == MS_NECK_FPN_DECONV) {
            if (l == 0) {
                size_t mark = arena_mark(act);
                float *mid = arena_alloc(act, (size_t)C * 2 * hp * 2 * wp * sizeof(float));
                if (!mid) return MS_ERR_OOM;
                MS_TRY(op_conv_transpose2x2(be, mid, taps[0], w->fpn1a.w, w->fpn1a.b, C, hp, wp,
                                            C, MS_ACT_GELU));
                MS_TRY(op_conv_transpose2x2(be, levels[0], mid, w->fpn1b.w, w->fpn1b.b, C, 2 * hp,
                                            2 * wp, C, MS_ACT_NONE));
                arena_reset(act, mark);
            } else if (l == 1) {
                MS_TRY(op_conv_transpose2x2(be, levels[1], taps[1], w->fpn2.w, w->fpn2.b, C, hp,
                                            wp, C, MS_ACT_NONE));
            } else if (l == 2) {
                MS_TRY(op_crop(be, levels[2], taps[2], C, hp, wp, hp, wp));
            } else {
                MS_TRY(op_maxpool2x2(be, levels[3], taps[3], C, hp, wp));
            }
        }
        char name[16];
        snprintf(name, sizeof name, "neck.%d", l);
        const int64_t shape[3] = {Cn, h, wd};
        MS_TRY(trace_emit(be, tr, name, levels[l], 3, shape));
    }
    return MS_OK;
}
