/* decoder/: the neck that turns four same-size ViT taps into four scales, and
 * the UperNet head (mita-spec section 3). Composes kernels/ops.h only. */
#ifndef MS_DECODER_H
#define MS_DECODER_H

#include "backbone/vit.h"

typedef struct {
    ms_conv lateral[4], convs[4];   /* mln: 1x1 and 3x3 convs with bias */
    ms_conv stem[2];                /* mln stem_skips: 1x1 convs with bias */
    ms_conv fpn1a, fpn1b, fpn2;     /* fpn-deconv: 2x2 transposed convs (fpn1a has BN folded) */
} neck_weights;

typedef struct {
    ms_conv psp[MS_MAX_POOL];       /* 1x1 ConvModules, BN folded */
    ms_conv bottleneck;             /* 3x3 */
    ms_conv lateral[3];             /* 1x1 */
    ms_conv fpn[3];                 /* 3x3 */
    ms_conv fpn_bottleneck;         /* 3x3 over 4*ch */
    ms_conv seg;                    /* 1x1 with bias, to classes */
} uperhead_weights;

/* Level l's size for a (hp, wp) token grid. */
void neck_level_size(int *h, int *w, const ms_config *cfg, int level, int hp, int wp);

/* taps (C, hp, wp) -> levels (Cn, h_l, w_l); a level may alias a tap.
 * skips: the conv stem outputs levels l < cfg->n_stem_skips add (each
 * level l's size). */
ms_status neck_forward(ms_backend *be, ms_arena *act, float *levels[4],
                       float *const taps[4] /* each (C, hp, wp) */,
                       float *const skips[2] /* each (c_l, h_l, w_l) or unused */,
                       const neck_weights *w,
                       const ms_config *cfg, int hp, int wp, const ms_trace *tr);

/* levels -> logits (classes, h0, w0) at level-0 size. */
ms_status uperhead_forward(ms_backend *be, ms_arena *act, float *logits /* (classes, h0, w0) */,
                           float *const levels[4], const uperhead_weights *w,
                           const ms_config *cfg, int hp, int wp, const ms_trace *tr);

#endif
