/* The model's config (model-format.md), parsed from the safetensors metadata. */
#ifndef MS_CONFIG_H
#define MS_CONFIG_H

#include "kernels/common.h"

#define MS_MAX_CLASSES 256
#define MS_MAX_STEM 8
#define MS_MAX_POOL 8
#define MS_CLASS_NAME 64

typedef enum { MS_ATTN_FULL = 0, MS_ATTN_MITA = 1 } ms_attn_type;
typedef enum { MS_STEM_PATCH = 0, MS_STEM_CONV = 1 } ms_stem_type;
typedef enum { MS_NECK_MLN = 0, MS_NECK_FPN_DECONV = 1, MS_NECK_NONE = 2 } ms_neck_type;

typedef struct {
    ms_attn_type type;
    int gh, gw;             /* landmarks */
    int topk;
    bool shared_scale_d;    /* "d": q.l/d; "sqrt_d": q.l/sqrt(d) */
} ms_attn_config;

typedef struct {
    /* backbone */
    int patch_size, embed_dim, depth, num_heads, mlp_ratio;
    float ln_eps;
    ms_stem_type stem;
    int stem_channels[MS_MAX_STEM]; /* conv stem: log2(patch) entries */
    int n_stem;
    int pos_grid[2];        /* Hp, Wp */
    int out_indices[4];
    bool final_norm;
    bool cls_token;         /* a class token at sequence index 0 (mita-spec 1, 2.7) */
    ms_attn_config attn;
    /* neck */
    ms_neck_type neck;
    int neck_channels;      /* mln out_channels; else embed_dim */
    int n_stem_skips;       /* mln + conv stem: levels l < this also take the conv
                             * stem output of their size (n_stem - 3 + l), by a 1x1 conv */
    /* decoder */
    int head_channels;
    int pool_scales[MS_MAX_POOL];
    int n_pool;
    float bn_eps;
    /* classes */
    int n_classes;
    char class_names[MS_MAX_CLASSES][MS_CLASS_NAME];
    uint8_t palette[MS_MAX_CLASSES][3];
    int ignore_index;       /* -1: none */
    /* input */
    float mean[3], stdv[3];
    int short_side;         /* 0: native size */
    int long_side;          /* 0: none; else the working size's long side at most this
                             * (mmcv keep_ratio: s = min(short/min(h,w), long/max(h,w))) */
    bool resize_cv2_uint8;  /* "cv2_uint8": the uint8 image resized as OpenCV's
                             * INTER_LINEAR does (mmseg), then normalised;
                             * "float" (default): the float image, bilinear */
    int pad_multiple;
    bool padded_logits_resize; /* "resize": padded logits straight to the unpadded size (mmseg) */
    int slide_crop[2];      /* sliding-window test (mmseg slide_inference) on the working-size */
    int slide_stride[2];    /* image: window and stride, h then w; 0: whole image */
    char *provenance;       /* owned, may be "" */
    char *json;             /* the config string as stored, owned */
} ms_config;

/* Parses and validates a config JSON string. Errors name the key. */
ms_status config_parse(ms_config *cfg, const char *json);
void config_free(ms_config *cfg);

#endif
