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
    /* decoder.stem_refine: 1x1 ConvModule from the fused features, 1x1 conv
     * with bias from the stem output, 3x3 ConvModule, 1x1 with bias to classes */
    ms_conv refine_lateral, refine_skip, refine_conv, refine_seg;
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

/* The head's logits' size: level 0's, twice that with cfg->refine_channels. */
void uperhead_logits_size(int *h, int *w, const ms_config *cfg, int hp, int wp);

/* levels -> logits (classes, h0, w0) at uperhead_logits_size. With
 * cfg->refine_channels, the logits at level-0 size are doubled (bilinear) and
 * the refinement added: stem, the conv stem output of that size (twice level
 * 0's: vit_stem_kept's last), through refine_* (tools/mitaseg_ref.py
 * UPerHead). */
ms_status uperhead_forward(ms_backend *be, ms_arena *act, float *logits /* (classes, h0, w0) */,
                           float *const levels[4],
                           const float *stem /* (c, h0, w0) or NULL without refine */,
                           const uperhead_weights *w, const ms_config *cfg, int hp, int wp,
                           const ms_trace *tr);

#endif
