/* Parsing and validating the model config (model-format.md). Every error
 * names the key by its dotted path so a bad model file is easy to fix. */
#include "config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Looks up `key` in `obj`; NULL when absent or JSON null. Unknown keys are
 * ignored by never being looked up. */
static const cJSON *get(const cJSON *obj, const char *key)
{
    const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static ms_status missing(const char *path) { return ms_error(MS_ERR_FORMAT, "config: missing key %s", path); }

static ms_status get_object(const cJSON **out, const cJSON *obj, const char *key, const char *path,
                            bool required)
{
    const cJSON *v = get(obj, key);
    *out = NULL;
    if (!v) return required ? missing(path) : MS_OK;
    if (!cJSON_IsObject(v)) return ms_error(MS_ERR_FORMAT, "config: %s: expected an object", path);
    *out = v;
    return MS_OK;
}

/* An integer in [lo, hi]; JSON numbers are doubles, so 4.0 counts but 4.5
 * does not. */
static ms_status to_int(int *out, const cJSON *v, const char *path, int lo, int hi)
{
    if (!cJSON_IsNumber(v)) return ms_error(MS_ERR_FORMAT, "config: %s: expected an integer", path);
    double d = v->valuedouble;
    if (d != floor(d) || !isfinite(d))
        return ms_error(MS_ERR_FORMAT, "config: %s: expected an integer, got %g", path, d);
    if (d < lo || d > hi)
        return ms_error(MS_ERR_FORMAT, "config: %s: %.0f out of range %d..%d", path, d, lo, hi);
    *out = (int)d;
    return MS_OK;
}

static ms_status get_int(int *out, const cJSON *obj, const char *key, const char *path, bool required,
                         int dflt, int lo, int hi)
{
    const cJSON *v = get(obj, key);
    if (!v) {
        if (required) return missing(path);
        *out = dflt;
        return MS_OK;
    }
    return to_int(out, v, path, lo, hi);
}

static ms_status to_float(float *out, const cJSON *v, const char *path, double lo, double hi)
{
    if (!cJSON_IsNumber(v)) return ms_error(MS_ERR_FORMAT, "config: %s: expected a number", path);
    double d = v->valuedouble;
    if (!(d >= lo && d <= hi))
        return ms_error(MS_ERR_FORMAT, "config: %s: %g out of range %g..%g", path, d, lo, hi);
    *out = (float)d;
    return MS_OK;
}

static ms_status get_float(float *out, const cJSON *obj, const char *key, const char *path, float dflt,
                           double lo, double hi)
{
    const cJSON *v = get(obj, key);
    if (!v) {
        *out = dflt;
        return MS_OK;
    }
    return to_float(out, v, path, lo, hi);
}

static ms_status get_bool(bool *out, const cJSON *obj, const char *key, const char *path, bool dflt)
{
    const cJSON *v = get(obj, key);
    if (!v) {
        *out = dflt;
        return MS_OK;
    }
    if (!cJSON_IsBool(v)) return ms_error(MS_ERR_FORMAT, "config: %s: expected true or false", path);
    *out = cJSON_IsTrue(v);
    return MS_OK;
}

/* A string from a fixed set; returns its index. */
static ms_status get_enum(int *out, const cJSON *obj, const char *key, const char *path, int dflt,
                          const char *const *names, int n)
{
    const cJSON *v = get(obj, key);
    if (!v) {
        if (dflt < 0) return missing(path);
        *out = dflt;
        return MS_OK;
    }
    if (!cJSON_IsString(v)) return ms_error(MS_ERR_FORMAT, "config: %s: expected a string", path);
    for (int i = 0; i < n; i++) {
        if (strcmp(v->valuestring, names[i]) == 0) {
            *out = i;
            return MS_OK;
        }
    }
    return ms_error(MS_ERR_FORMAT, "config: %s: unknown value '%.64s'", path, v->valuestring);
}

/* An array of integers with n_min..n_max entries, each in [lo, hi].
 * *n receives the count. Absent: *n = 0 (caller applies defaults). */
static ms_status get_int_array(int *out, int *n, const cJSON *obj, const char *key, const char *path,
                               bool required, int n_min, int n_max, int lo, int hi)
{
    const cJSON *v = get(obj, key);
    *n = 0;
    if (!v) return required ? missing(path) : MS_OK;
    if (!cJSON_IsArray(v)) return ms_error(MS_ERR_FORMAT, "config: %s: expected an array", path);
    int len = cJSON_GetArraySize(v);
    if (len < n_min || len > n_max) {
        if (n_min == n_max)
            return ms_error(MS_ERR_FORMAT, "config: %s: expected %d entries, got %d", path, n_min, len);
        return ms_error(MS_ERR_FORMAT, "config: %s: expected %d..%d entries, got %d", path, n_min, n_max,
                        len);
    }
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v)
    {
        char p[128];
        snprintf(p, sizeof p, "%s[%d]", path, i);
        MS_TRY(to_int(&out[i], e, p, lo, hi));
        i++;
    }
    *n = len;
    return MS_OK;
}

static ms_status get_float3(float out[3], const cJSON *obj, const char *key, const char *path,
                            const float dflt[3], double lo, double hi)
{
    const cJSON *v = get(obj, key);
    if (!v) {
        memcpy(out, dflt, 3 * sizeof *out);
        return MS_OK;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 3)
        return ms_error(MS_ERR_FORMAT, "config: %s: expected an array of 3 numbers", path);
    for (int i = 0; i < 3; i++) {
        char p[128];
        snprintf(p, sizeof p, "%s[%d]", path, i);
        MS_TRY(to_float(&out[i], cJSON_GetArrayItem(v, i), p, lo, hi));
    }
    return MS_OK;
}

static ms_status parse_backbone(ms_config *c, const cJSON *root)
{
    const cJSON *bb, *stem, *attn;
    MS_TRY(get_object(&bb, root, "backbone", "backbone", true));
    MS_TRY(get_int(&c->patch_size, bb, "patch_size", "backbone.patch_size", true, 0, 1, 64));
    MS_TRY(get_int(&c->embed_dim, bb, "embed_dim", "backbone.embed_dim", true, 0, 1, 65536));
    MS_TRY(get_int(&c->depth, bb, "depth", "backbone.depth", true, 0, 1, 1024));
    MS_TRY(get_int(&c->num_heads, bb, "num_heads", "backbone.num_heads", true, 0, 1, 65536));
    if (c->embed_dim % c->num_heads != 0)
        return ms_error(MS_ERR_FORMAT, "config: backbone.embed_dim %d is not divisible by num_heads %d",
                        c->embed_dim, c->num_heads);
    MS_TRY(get_int(&c->mlp_ratio, bb, "mlp_ratio", "backbone.mlp_ratio", false, 4, 1, 64));
    MS_TRY(get_float(&c->ln_eps, bb, "ln_eps", "backbone.ln_eps", 1e-6f, 1e-30, 1.0));

    static const char *const stems[] = {"patch", "conv"};
    int stem_type = MS_STEM_PATCH;
    MS_TRY(get_object(&stem, bb, "stem", "backbone.stem", false));
    if (stem) MS_TRY(get_enum(&stem_type, stem, "type", "backbone.stem.type", -1, stems, 2));
    c->stem = (ms_stem_type)stem_type;
    if (c->stem == MS_STEM_CONV) {
        /* The conv stem halves the resolution per 3x3 stride-2 layer, so the
         * patch must be 2^n with exactly n listed channel counts. */
        int p = c->patch_size, log2p = 0;
        if (p < 2 || (p & (p - 1)) != 0)
            return ms_error(MS_ERR_FORMAT,
                            "config: backbone.patch_size: %d must be a power of 2 (2..64) with a conv stem", p);
        while ((1 << log2p) < p) log2p++;
        MS_TRY(get_int_array(c->stem_channels, &c->n_stem, stem, "channels", "backbone.stem.channels", true,
                             log2p, log2p, 1, 65536));
    }

    int grid_n;
    MS_TRY(get_int_array(c->pos_grid, &grid_n, bb, "pos_grid", "backbone.pos_grid", true, 2, 2, 1, 4096));

    int n_out;
    MS_TRY(get_int_array(c->out_indices, &n_out, bb, "out_indices", "backbone.out_indices", false, 4, 4, 0,
                         c->depth - 1));
    if (n_out == 0) {
        /* Evenly spaced taps ending at the last block: 2,5,8,11 for depth 12
         * (the spec's default). */
        for (int i = 0; i < 4; i++) {
            int t = (i + 1) * c->depth / 4 - 1;
            c->out_indices[i] = t < 0 ? 0 : t;
        }
    }
    MS_TRY(get_bool(&c->final_norm, bb, "final_norm", "backbone.final_norm", false));
    MS_TRY(get_bool(&c->cls_token, bb, "cls_token", "backbone.cls_token", false));

    static const char *const attn_types[] = {"full", "mita"}; /* index == ms_attn_type */
    static const char *const scales[] = {"d", "sqrt_d"};
    int at = MS_ATTN_MITA, sc = 0, lm[2] = {7, 7}, n_lm;
    MS_TRY(get_object(&attn, bb, "attention", "backbone.attention", false));
    MS_TRY(get_enum(&at, attn, "type", "backbone.attention.type", MS_ATTN_MITA, attn_types, 2));
    MS_TRY(get_int_array(lm, &n_lm, attn, "landmarks", "backbone.attention.landmarks", false, 2, 2, 1, 1024));
    if (n_lm == 0) lm[0] = lm[1] = 7;
    MS_TRY(get_int(&c->attn.topk, attn, "topk", "backbone.attention.topk", false, 49, 1, 1 << 24));
    MS_TRY(get_enum(&sc, attn, "shared_scale", "backbone.attention.shared_scale", 0, scales, 2));
    c->attn.type = (ms_attn_type)at;
    c->attn.gh = lm[0];
    c->attn.gw = lm[1];
    c->attn.shared_scale_d = sc == 0;
    return MS_OK;
}

static ms_status parse_neck_decoder(ms_config *c, const cJSON *root)
{
    const cJSON *neck, *dec;
    static const char *const necks[] = {"mln", "fpn-deconv", "none"}; /* index == ms_neck_type */
    int nt = MS_NECK_NONE;
    MS_TRY(get_object(&neck, root, "neck", "neck", false));
    MS_TRY(get_enum(&nt, neck, "type", "neck.type", MS_NECK_NONE, necks, 3));
    c->neck = (ms_neck_type)nt;
    c->neck_channels = c->embed_dim;
    if (c->neck == MS_NECK_MLN)
        MS_TRY(get_int(&c->neck_channels, neck, "out_channels", "neck.out_channels", false, c->embed_dim, 1,
                       65536));
    MS_TRY(get_int(&c->n_stem_skips, neck, "stem_skips", "neck.stem_skips", false, 0, 0, 2));
    if (c->n_stem_skips && (c->neck != MS_NECK_MLN || c->stem != MS_STEM_CONV || c->n_stem < 3))
        return ms_error(MS_ERR_FORMAT,
                        "config: neck.stem_skips: needs the mln neck and a conv stem of 3 or more convs");

    static const char *const decs[] = {"uperhead"};
    int dt = 0;
    MS_TRY(get_object(&dec, root, "decoder", "decoder", false));
    MS_TRY(get_enum(&dt, dec, "type", "decoder.type", 0, decs, 1));
    MS_TRY(get_int(&c->head_channels, dec, "channels", "decoder.channels", false, 512, 1, 65536));
    MS_TRY(get_int_array(c->pool_scales, &c->n_pool, dec, "pool_scales", "decoder.pool_scales", false, 1,
                         MS_MAX_POOL, 1, 256));
    if (c->n_pool == 0) {
        static const int dflt[] = {1, 2, 3, 6};
        memcpy(c->pool_scales, dflt, sizeof dflt);
        c->n_pool = 4;
    }
    MS_TRY(get_float(&c->bn_eps, dec, "bn_eps", "decoder.bn_eps", 1e-5f, 1e-30, 1.0));
    return MS_OK;
}

static ms_status parse_classes(ms_config *c, const cJSON *root)
{
    const cJSON *cls = get(root, "classes"), *pal = get(root, "palette"), *e;
    if (!cls) return missing("classes");
    if (!cJSON_IsArray(cls)) return ms_error(MS_ERR_FORMAT, "config: classes: expected an array of names");
    int n = cJSON_GetArraySize(cls);
    if (n < 1 || n > MS_MAX_CLASSES)
        return ms_error(MS_ERR_FORMAT, "config: classes: %d names, expected 1..%d", n, MS_MAX_CLASSES);
    c->n_classes = n;
    int i = 0;
    cJSON_ArrayForEach(e, cls)
    {
        if (!cJSON_IsString(e)) return ms_error(MS_ERR_FORMAT, "config: classes[%d]: expected a string", i);
        if (strlen(e->valuestring) >= MS_CLASS_NAME)
            return ms_error(MS_ERR_FORMAT, "config: classes[%d]: name longer than %d bytes", i,
                            MS_CLASS_NAME - 1);
        strcpy(c->class_names[i], e->valuestring);
        i++;
    }

    if (!pal) return missing("palette");
    if (!cJSON_IsArray(pal)) return ms_error(MS_ERR_FORMAT, "config: palette: expected an array");
    if (cJSON_GetArraySize(pal) != n)
        return ms_error(MS_ERR_FORMAT, "config: palette: %d entries for %d classes", cJSON_GetArraySize(pal),
                        n);
    i = 0;
    cJSON_ArrayForEach(e, pal)
    {
        char p[48];
        snprintf(p, sizeof p, "palette[%d]", i);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 3)
            return ms_error(MS_ERR_FORMAT, "config: %s: expected [r, g, b]", p);
        for (int k = 0; k < 3; k++) {
            char pk[64];
            int v = 0;
            snprintf(pk, sizeof pk, "%s[%d]", p, k);
            MS_TRY(to_int(&v, cJSON_GetArrayItem(e, k), pk, 0, 255));
            c->palette[i][k] = (uint8_t)v;
        }
        i++;
    }
    /* Labels are 8-bit, so any 0..255 value may mark "ignore", in or out of
     * the class range (CamVid uses 11 with 11 classes). */
    MS_TRY(get_int(&c->ignore_index, root, "ignore_index", "ignore_index", false, -1, 0, 255));
    return MS_OK;
}

static ms_status parse_input(ms_config *c, const cJSON *root)
{
    static const float mean[3] = {123.675f, 116.28f, 103.53f}, stdv[3] = {58.395f, 57.12f, 57.375f};
    const cJSON *in;
    MS_TRY(get_object(&in, root, "input", "input", false));
    MS_TRY(get_float3(c->mean, in, "mean", "input.mean", mean, -1e6, 1e6));
    MS_TRY(get_float3(c->stdv, in, "std", "input.std", stdv, 1e-6, 1e6));
    /* Bounded so no image's work is absurd for its size: a larger short side
     * or pad multiple would make every (or a tiny) image a huge network input. */
    MS_TRY(get_int(&c->short_side, in, "short_side", "input.short_side", false, 0, 1, 4096));
    MS_TRY(get_int(&c->pad_multiple, in, "pad_multiple", "input.pad_multiple", false, 16, 1, 256));
    /* mmcv's keep-ratio cap on the long side (Resize scale (long, short)) */
    MS_TRY(get_int(&c->long_side, in, "long_side", "input.long_side", false, 0, 1, 16384));
    static const char *const resizes[] = {"float", "cv2_uint8"};
    int rs = 0;
    MS_TRY(get_enum(&rs, in, "resize", "input.resize", 0, resizes, 2));
    c->resize_cv2_uint8 = rs == 1;
    static const char *const padded[] = {"crop", "resize"};
    int pl = 0;
    MS_TRY(get_enum(&pl, in, "padded_logits", "input.padded_logits", 0, padded, 2));
    c->padded_logits_resize = pl == 1;
    const cJSON *slide = in ? get(in, "slide") : NULL;
    if (slide && !cJSON_IsNull(slide)) {
        int n;
        MS_TRY(get_object(&slide, in, "slide", "input.slide", true));
        MS_TRY(get_int_array(c->slide_crop, &n, slide, "crop", "input.slide.crop", true, 2, 2, 16,
                             65535));
        MS_TRY(get_int_array(c->slide_stride, &n, slide, "stride", "input.slide.stride", true, 2,
                             2, 1, 65535));
        for (int i = 0; i < 2; i++)
            if (c->slide_stride[i] > c->slide_crop[i])
                return ms_error(MS_ERR_FORMAT,
                                "config: input.slide.stride %d is larger than the crop %d",
                                c->slide_stride[i], c->slide_crop[i]);
    }

    const cJSON *prov = get(root, "provenance");
    if (prov && !cJSON_IsString(prov)) return ms_error(MS_ERR_FORMAT, "config: provenance: expected a string");
    const char *s = prov ? prov->valuestring : "";
    c->provenance = strdup(s);
    MS_CHECK_ALLOC(c->provenance, strlen(s) + 1);
    return MS_OK;
}

static ms_status parse_all(ms_config *c, const cJSON *root, const char *json)
{
    if (!cJSON_IsObject(root)) return ms_error(MS_ERR_FORMAT, "config: expected a JSON object");
    MS_TRY(parse_backbone(c, root));
    MS_TRY(parse_neck_decoder(c, root));
    MS_TRY(parse_classes(c, root));
    MS_TRY(parse_input(c, root));
    c->json = strdup(json);
    MS_CHECK_ALLOC(c->json, strlen(json) + 1);
    return MS_OK;
}

ms_status config_parse(ms_config *cfg, const char *json)
{
    memset(cfg, 0, sizeof *cfg);
    if (!json) return ms_error(MS_ERR_ARG, "config: no config string");
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = (at && at >= json) ? (long)(at - json) : -1;
        return ms_error(MS_ERR_FORMAT, "config: not valid JSON (near byte %ld)", off);
    }
    ms_status st = parse_all(cfg, root, json);
    cJSON_Delete(root);
    if (st != MS_OK) {
        /* Keep the message; free what was allocated and leave cfg empty. */
        config_free(cfg);
    }
    return st;
}

void config_free(ms_config *cfg)
{
    if (!cfg) return;
    free(cfg->provenance);
    free(cfg->json);
    memset(cfg, 0, sizeof *cfg);
}
