/* Model files: config parsing and defaults, safetensors round trips with
 * F32/F16/BF16 conversion, every rejection in model-format.md ("What a loader
 * rejects") with its message, and truncation/corruption sweeps that must
 * fail cleanly or read in bounds (run under ASan in CI). */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "backbone/config.h"
#include "app/engine.h"
#include "app/model_file.h"
#include "testutil.h"

/* The smallest config model-format.md accepts: only the required keys. */
static const char *MIN_CONFIG =
    "{\"backbone\":{\"patch_size\":16,\"embed_dim\":32,\"depth\":12,\"num_heads\":2,\"pos_grid\":[4,4]},"
    "\"classes\":[\"sky\",\"road\"],\"palette\":[[1,2,3],[250,251,252]]}";

static void setup(void) { test_dir_create("model_file"); }
static void teardown(void) { test_dir_remove(); }
#define at test_path
#define dir test_dir
#define assert_error assert_error_names

/* "__metadata__":{...} as a JSON member (no braces), config escaped by cJSON. */
static char *meta_member(const char *format, const char *version, const char *config)
{
    cJSON *o = cJSON_CreateObject();
    if (format) cJSON_AddStringToObject(o, "format", format);
    if (version) cJSON_AddStringToObject(o, "format_version", version);
    if (config) cJSON_AddStringToObject(o, "config", config);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    size_t n = strlen(s) + 32;
    char *m = malloc(n);
    snprintf(m, n, "\"__metadata__\":%s", s);
    free(s);
    return m;
}

/* A safetensors file from a raw header string and data, header length as given. */
static void write_raw_len(const char *path, uint64_t hlen, const char *header, const void *data, size_t nd)
{
    size_t hn = strlen(header);
    uint8_t *buf = malloc(8 + hn + nd + 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, header, hn);
    if (nd) memcpy(buf + 8 + hn, data, nd);
    write_bytes(path, buf, 8 + hn + nd);
    free(buf);
}

/* Header = {<metadata>, <tensors>} with valid metadata and MIN_CONFIG. */
static void write_raw(const char *path, const char *tensors_json, const void *data, size_t nd)
{
    char *meta = meta_member("mitaseg", "1", MIN_CONFIG);
    size_t n = strlen(meta) + strlen(tensors_json) + 8;
    char *h = malloc(n);
    snprintf(h, n, "{%s%s%s}", meta, tensors_json[0] ? "," : "", tensors_json);
    write_raw_len(path, strlen(h), h, data, nd);
    free(h);
    free(meta);
}

static ms_status write_model(const char *path, const ms_tensor *t, int n)
{
    const char *meta[] = {"format", "mitaseg", "format_version", "1", "config", MIN_CONFIG, NULL};
    return safetensors_write(path, t, n, meta);
}

/* ---------------------------------------------------------------- config */

START_TEST(test_config_defaults)
{
    ms_config c;
    ck_assert_int_eq(config_parse(&c, MIN_CONFIG), MS_OK);
    ck_assert_int_eq(c.patch_size, 16);
    ck_assert_int_eq(c.embed_dim, 32);
    ck_assert_int_eq(c.depth, 12);
    ck_assert_int_eq(c.num_heads, 2);
    ck_assert_int_eq(c.mlp_ratio, 4);
    ck_assert_float_eq(c.ln_eps, 1e-6f);
    ck_assert_int_eq(c.stem, MS_STEM_PATCH);
    ck_assert_int_eq(c.pos_grid[0], 4);
    ck_assert_int_eq(c.pos_grid[1], 4);
    /* spec: default taps 2,5,8,11 for depth 12 */
    ck_assert_int_eq(c.out_indices[0], 2);
    ck_assert_int_eq(c.out_indices[1], 5);
    ck_assert_int_eq(c.out_indices[2], 8);
    ck_assert_int_eq(c.out_indices[3], 11);
    ck_assert(!c.final_norm);
    ck_assert_int_eq(c.attn.type, MS_ATTN_MITA);
    ck_assert_int_eq(c.attn.gh, 7);
    ck_assert_int_eq(c.attn.gw, 7);
    ck_assert_int_eq(c.attn.topk, 49);
    ck_assert(c.attn.shared_scale_d);
    ck_assert_int_eq(c.neck, MS_NECK_NONE);
    ck_assert_int_eq(c.neck_channels, 32);
    ck_assert_int_eq(c.head_channels, 512);
    ck_assert_int_eq(c.n_pool, 4);
    ck_assert_int_eq(c.pool_scales[3], 6);
    ck_assert_float_eq(c.bn_eps, 1e-5f);
    ck_assert_int_eq(c.n_classes, 2);
    ck_assert_str_eq(c.class_names[1], "road");
    ck_assert_int_eq(c.palette[1][2], 252);
    ck_assert_int_eq(c.ignore_index, -1);
    ck_assert_float_eq(c.mean[0], 123.675f);
    ck_assert_float_eq(c.stdv[2], 57.375f);
    ck_assert_int_eq(c.short_side, 0);
    ck_assert_int_eq(c.pad_multiple, 16);
    ck_assert_str_eq(c.provenance, "");
    ck_assert_str_eq(c.json, MIN_CONFIG);
    config_free(&c);
    config_free(&c); /* idempotent */
}
END_TEST

START_TEST(test_config_full)
{
    const char *j =
        "{\"backbone\":{\"patch_size\":8,\"embed_dim\":64,\"depth\":6,\"num_heads\":4,"
        "\"stem\":{\"type\":\"conv\",\"channels\":[8,16,32]},\"mlp_ratio\":2,\"ln_eps\":1e-5,"
        "\"pos_grid\":[5,6],\"out_indices\":[1,2,3,5],\"final_norm\":true,\"cls_token\":true,"
        "\"attention\":{\"type\":\"full\",\"landmarks\":[3,4],\"topk\":9,\"shared_scale\":\"sqrt_d\"},"
        "\"unknown_key\":[1,2]},"
        "\"neck\":{\"type\":\"mln\",\"out_channels\":48,\"stem_skips\":1},"
        "\"decoder\":{\"type\":\"uperhead\",\"channels\":128,\"pool_scales\":[1,2],\"bn_eps\":0.001},"
        "\"classes\":[\"a\"],\"palette\":[[0,128,255]],\"ignore_index\":255,"
        "\"input\":{\"mean\":[1,2,3],\"std\":[4,5,6],\"short_side\":360,\"pad_multiple\":32,"
        "\"padded_logits\":\"resize\",\"slide\":{\"crop\":[512,480],\"stride\":[341,300]}},"
        "\"provenance\":\"trained on CamVid\",\"extra\":{}}";
    ms_config c;
    ck_assert_msg(config_parse(&c, j) == MS_OK, "%s", ms_last_error());
    ck_assert_int_eq(c.stem, MS_STEM_CONV);
    ck_assert_int_eq(c.n_stem, 3);
    ck_assert_int_eq(c.stem_channels[2], 32);
    ck_assert_int_eq(c.n_stem_skips, 1);
    ck_assert_int_eq(c.mlp_ratio, 2);
    ck_assert_float_eq(c.ln_eps, 1e-5f);
    ck_assert_int_eq(c.pos_grid[1], 6);
    ck_assert_int_eq(c.out_indices[3], 5);
    ck_assert(c.final_norm);
    ck_assert(c.cls_token);
    ck_assert(c.padded_logits_resize);
    ck_assert_int_eq(c.slide_crop[0], 512);
    ck_assert_int_eq(c.slide_crop[1], 480);
    ck_assert_int_eq(c.slide_stride[0], 341);
    ck_assert_int_eq(c.slide_stride[1], 300);
    ck_assert_int_eq(c.attn.type, MS_ATTN_FULL);
    ck_assert_int_eq(c.attn.gh, 3);
    ck_assert_int_eq(c.attn.gw, 4);
    ck_assert_int_eq(c.attn.topk, 9);
    ck_assert(!c.attn.shared_scale_d);
    ck_assert_int_eq(c.neck, MS_NECK_MLN);
    ck_assert_int_eq(c.neck_channels, 48);
    ck_assert_int_eq(c.head_channels, 128);
    ck_assert_int_eq(c.n_pool, 2);
    ck_assert_float_eq(c.bn_eps, 0.001f);
    ck_assert_int_eq(c.ignore_index, 255);
    ck_assert_float_eq(c.mean[2], 3.0f);
    ck_assert_float_eq(c.stdv[0], 4.0f);
    ck_assert_int_eq(c.short_side, 360);
    ck_assert_int_eq(c.pad_multiple, 32);
    ck_assert_str_eq(c.provenance, "trained on CamVid");
    config_free(&c);

    /* fpn-deconv keeps the backbone width; short_side/ignore_index null. */
    ck_assert_int_eq(config_parse(&c, "{\"backbone\":{\"patch_size\":16,\"embed_dim\":32,\"depth\":3,"
                                      "\"num_heads\":1,\"pos_grid\":[2,2]},\"neck\":{\"type\":\"fpn-deconv\"},"
                                      "\"classes\":[\"a\"],\"palette\":[[0,0,0]],\"ignore_index\":null,"
                                      "\"input\":{\"short_side\":null}}"),
                     MS_OK);
    ck_assert_int_eq(c.neck, MS_NECK_FPN_DECONV);
    ck_assert_int_eq(c.neck_channels, 32);
    ck_assert_int_eq(c.ignore_index, -1);
    ck_assert_int_eq(c.short_side, 0);
    ck_assert(!c.cls_token && !c.padded_logits_resize); /* defaults: no class token, crop */
    ck_assert_int_eq(c.slide_crop[0], 0);
    /* depth 3: evenly spaced default taps stay inside the network */
    for (int i = 0; i < 4; i++) ck_assert(c.out_indices[i] >= 0 && c.out_indices[i] < 3);
    ck_assert_int_eq(c.out_indices[3], 2);
    config_free(&c);
}
END_TEST

/* Replaces the first occurrence of `from` in MIN_CONFIG-like text. */
static char *subst(const char *s, const char *from, const char *to)
{
    const char *p = strstr(s, from);
    ck_assert_msg(p != NULL, "'%s' not in template", from);
    size_t n = strlen(s) - strlen(from) + strlen(to) + 1;
    char *r = malloc(n);
    snprintf(r, n, "%.*s%s%s", (int)(p - s), s, to, p + strlen(from));
    return r;
}

static const struct {
    const char *from, *to, *msg;
} config_errors[] = {
    {"\"depth\":12,", "", "config: missing key backbone.depth"},
    {"\"embed_dim\":32,", "", "config: missing key backbone.embed_dim"},
    {"\"num_heads\":2,", "", "config: missing key backbone.num_heads"},
    {"\"patch_size\":16,", "", "config: missing key backbone.patch_size"},
    {",\"pos_grid\":[4,4]", "", "config: missing key backbone.pos_grid"},
    {"\"classes\":[\"sky\",\"road\"],", "", "config: missing key classes"},
    {",\"palette\":[[1,2,3],[250,251,252]]", "", "config: missing key palette"},
    {"{\"backbone\":", "{\"b\":", "config: missing key backbone"},
    {"\"depth\":12", "\"depth\":\"12\"", "config: backbone.depth: expected an integer"},
    {"\"depth\":12", "\"depth\":12.5", "config: backbone.depth: expected an integer"},
    {"\"depth\":12", "\"depth\":0", "config: backbone.depth: 0 out of range 1..1024"},
    {"\"depth\":12", "\"depth\":1025", "backbone.depth: 1025 out of range"},
    {"\"num_heads\":2", "\"num_heads\":3", "embed_dim 32 is not divisible by num_heads 3"},
    {"\"pos_grid\":[4,4]", "\"pos_grid\":[4]", "backbone.pos_grid: expected 2 entries, got 1"},
    {"\"pos_grid\":[4,4]", "\"pos_grid\":[4,4],\"attention\":{\"type\":\"foo\"}",
     "config: backbone.attention.type: unknown value 'foo'"},
    {"\"pos_grid\":[4,4]", "\"pos_grid\":[4,4],\"attention\":{\"shared_scale\":\"s\"}",
     "backbone.attention.shared_scale: unknown value 's'"},
    {"\"pos_grid\":[4,4]", "\"pos_grid\":[4,4],\"stem\":{\"type\":\"conv\",\"channels\":[8,16]}",
     "backbone.stem.channels: expected 4 entries, got 2"},
    {"\"patch_size\":16", "\"patch_size\":12,\"stem\":{\"type\":\"conv\",\"channels\":[8,16]}",
     "patch_size: 12 must be a power of 2"},
    {"\"pos_grid\":[4,4]", "\"pos_grid\":[4,4],\"stem\":{\"type\":\"deep\"}", "backbone.stem.type: unknown value"},
    {"\"pos_grid\":[4,4]", "\"pos_grid\":[4,4],\"out_indices\":[2,5,8,12]",
     "backbone.out_indices[3]: 12 out of range 0..11"},
    {"\"pos_grid\":[4,4]", "\"pos_grid\":[4,4],\"final_norm\":1", "backbone.final_norm: expected true or false"},
    {"\"pos_grid\":[4,4]", "\"pos_grid\":[4,4],\"attention\":[]", "backbone.attention: expected an object"},
    {"\"classes\":", "\"neck\":{\"type\":\"fpn\"},\"classes\":", "config: neck.type: unknown value 'fpn'"},
    {"\"classes\":", "\"decoder\":{\"type\":\"fcnhead\"},\"classes\":", "decoder.type: unknown value 'fcnhead'"},
    {"\"classes\":", "\"decoder\":{\"pool_scales\":[]},\"classes\":", "decoder.pool_scales: expected 1..8 entries"},
    {"[[1,2,3],[250,251,252]]", "[[1,2,3]]", "palette: 1 entries for 2 classes"},
    {"[250,251,252]", "[250,251,256]", "palette[1][2]: 256 out of range 0..255"},
    {"[250,251,252]", "[250,251]", "palette[1]: expected [r, g, b]"},
    {"[\"sky\",\"road\"]", "[]", "classes: 0 names"},
    {"[\"sky\",\"road\"]", "[\"sky\",7]", "classes[1]: expected a string"},
    {"\"classes\":", "\"input\":{\"std\":[1,0,1]},\"classes\":", "input.std[1]: 0 out of range"},
    {"\"classes\":", "\"ignore_index\":-3,\"classes\":", "ignore_index: -3 out of range"},
    {"\"classes\":", "\"provenance\":5,\"classes\":", "provenance: expected a string"},
    {"\"pos_grid\":[4,4]", "\"pos_grid\":[4,4],\"cls_token\":\"yes\"", "backbone.cls_token: expected true or false"},
    {"\"classes\":", "\"input\":{\"padded_logits\":\"pad\"},\"classes\":",
     "input.padded_logits: unknown value 'pad'"},
    {"\"classes\":", "\"input\":{\"slide\":{\"crop\":[512,512]}},\"classes\":",
     "missing key input.slide.stride"},
    {"\"classes\":", "\"input\":{\"slide\":{\"crop\":[8,512],\"stride\":[8,8]}},\"classes\":",
     "input.slide.crop[0]: 8 out of range"},
    {"\"classes\":", "\"input\":{\"slide\":{\"crop\":[64,64],\"stride\":[32,65]}},\"classes\":",
     "input.slide.stride 65 is larger than the crop 64"},
    {"\"classes\":", "\"input\":{\"slide\":[512]},\"classes\":", "input.slide: expected an object"},
    {"\"classes\":", "\"neck\":{\"type\":\"mln\",\"stem_skips\":1},\"classes\":",
     "neck.stem_skips: needs the mln neck and a conv stem of 3 or more convs"},
    {"\"pos_grid\":[4,4]", "\"pos_grid\":[4,4],\"stem\":{\"type\":\"conv\",\"channels\":[8,8,8,8]}},"
     "\"neck\":{\"type\":\"none\",\"stem_skips\":2},\"x\":{", "neck.stem_skips: needs the mln neck"},
    {"\"pos_grid\":[4,4]", "\"pos_grid\":[4,4],\"stem\":{\"type\":\"conv\",\"channels\":[8,8,8,8]}},"
     "\"neck\":{\"type\":\"mln\",\"stem_skips\":3},\"x\":{", "neck.stem_skips: 3 out of range 0..2"},
    {"]]}", "]]", "config: not valid JSON"},
};

START_TEST(test_config_errors)
{
    ms_config c;
    for (size_t i = 0; i < sizeof config_errors / sizeof *config_errors; i++) {
        char *j = subst(MIN_CONFIG, config_errors[i].from, config_errors[i].to);
        ms_clear_error();
        ck_assert_msg(config_parse(&c, j) == MS_ERR_FORMAT, "case %zu accepted: %s", i, j);
        ck_assert_msg(strstr(ms_last_error(), config_errors[i].msg) != NULL, "case %zu: expected '%s', got '%s'",
                      i, config_errors[i].msg, ms_last_error());
        ck_assert_ptr_null(c.json); /* nothing left allocated */
        free(j);
    }
    ck_assert_int_eq(config_parse(&c, "[1]"), MS_ERR_FORMAT);
    ck_assert_int_eq(config_parse(&c, ""), MS_ERR_FORMAT);
}
END_TEST

/* ---------------------------------------------------------- round trips */

static float bits_f32(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

START_TEST(test_roundtrip_dtypes)
{
    const float f32[6] = {1.5f, -2.25f, 0.0f, 3.4e38f, -1e-40f /* subnormal */, INFINITY};
    /* F16 bits and their exact values. */
    const uint16_t f16[10] = {0x3C00, 0xC000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x8000, 0x7E00};
    const float f16_want[9] = {1.0f, -2.0f, 0x1p-24f, 1023 * 0x1p-24f, 0x1p-14f, 65504.0f, INFINITY, -INFINITY, -0.0f};
    const uint16_t bf16[5] = {0x3F80, 0xC040, 0x4049, 0x7F80, 0x0001};
    const float bf16_want[5] = {1.0f, -3.0f, 3.140625f, INFINITY, bits_f32(0x00010000)};
    const int32_t i32[2] = {7, -7};
    const uint8_t u8[3] = {1, 2, 3};
    const double f64[2] = {0.1, -2.5};
    const int64_t i64[1] = {12345}; /* BatchNorm's num_batches_tracked in a raw state dict */
    ms_tensor t[] = {
        {.name = "w.f32", .dtype = MS_DT_F32, .ndim = 2, .shape = {2, 3}, .data = f32, .nbytes = sizeof f32},
        {.name = "w.f16", .dtype = MS_DT_F16, .ndim = 2, .shape = {5, 2}, .data = f16, .nbytes = sizeof f16},
        {.name = "w.bf16", .dtype = MS_DT_BF16, .ndim = 1, .shape = {5}, .data = bf16, .nbytes = sizeof bf16},
        {.name = "i.i32", .dtype = MS_DT_I32, .ndim = 1, .shape = {2}, .data = i32, .nbytes = sizeof i32},
        {.name = "i.u8", .dtype = MS_DT_U8, .ndim = 3, .shape = {1, 1, 3}, .data = u8, .nbytes = sizeof u8},
        {.name = "empty", .dtype = MS_DT_F32, .ndim = 2, .shape = {0, 4}, .data = NULL, .nbytes = 0},
        {.name = "scalar", .dtype = MS_DT_F32, .ndim = 0, .data = f32, .nbytes = 4},
        {.name = "w.f64", .dtype = MS_DT_F64, .ndim = 1, .shape = {2}, .data = f64, .nbytes = sizeof f64},
        {.name = "bn.num_batches_tracked", .dtype = MS_DT_I64, .ndim = 0, .data = i64, .nbytes = 8},
    };
    const char *p = at("m.safetensors");
    ck_assert_msg(write_model(p, t, 9) == MS_OK, "%s", ms_last_error());

    /* Header padded to 8, data contiguous in the given order. */
    size_t n;
    uint8_t *raw = read_bytes(p, &n);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | raw[i];
    ck_assert_uint_eq(hlen % 8, 0);
    ck_assert_uint_eq(n, 8 + hlen + sizeof f32 + sizeof f16 + sizeof bf16 + sizeof i32 + sizeof u8 + 4 +
                             sizeof f64 + sizeof i64);
    /* Widest elements first, so every tensor is aligned to its element size. */
    ck_assert_int_eq(memcmp(raw + 8 + hlen, f64, sizeof f64), 0);
    free(raw);

    ms_model_file *mf;
    ck_assert_msg(model_file_open(&mf, p) == MS_OK, "%s", ms_last_error());
    ck_assert_str_eq(model_file_path(mf), p);
    ck_assert_int_eq(model_file_count(mf), 9);
    ck_assert_int_eq(model_file_config(mf)->n_classes, 2);
    const ms_tensor *ti = model_file_find(mf, "i.i32");
    ck_assert_ptr_nonnull(ti);
    ck_assert_int_eq(ti->dtype, MS_DT_I32);
    ck_assert_int_eq(memcmp(ti->data, i32, sizeof i32), 0);
    ck_assert_ptr_null(model_file_find(mf, "nope"));
    ck_assert_ptr_null(model_file_tensor(mf, 9));
    for (int i = 0; i < model_file_count(mf); i++) ck_assert_ptr_nonnull(model_file_find(mf, model_file_tensor(mf, i)->name));

    float out[10];
    ck_assert_int_eq(model_file_read_f32(mf, "w.f32", out, 2, (int64_t[]){2, 3}), MS_OK);
    ck_assert_int_eq(memcmp(out, f32, sizeof f32), 0); /* bit-exact */

    ck_assert_int_eq(model_file_read_f32(mf, "w.f16", out, 2, (int64_t[]){5, 2}), MS_OK);
    for (int i = 0; i < 9; i++) {
        /* Every F16 value is exactly representable in F32: compare bits. */
        ck_assert_msg(memcmp(&out[i], &f16_want[i], 4) == 0, "f16 %d: %a != %a", i, out[i], f16_want[i]);
    }
    ck_assert(isnan(out[9]));

    ck_assert_int_eq(model_file_read_f32(mf, "w.bf16", out, 1, (int64_t[]){5}), MS_OK);
    for (int i = 0; i < 5; i++) ck_assert_msg(memcmp(&out[i], &bf16_want[i], 4) == 0, "bf16 %d: %a", i, out[i]);

    ck_assert_int_eq(model_file_read_f32(mf, "w.f64", out, 1, (int64_t[]){2}), MS_OK);
    ck_assert_float_eq(out[0], (float)0.1);
    ck_assert_float_eq(out[1], -2.5f);

    ck_assert_int_eq(model_file_read_f32(mf, "scalar", out, 0, NULL), MS_OK);
    ck_assert_float_eq(out[0], 1.5f);
    ck_assert_int_eq(model_file_read_f32(mf, "empty", out, 2, (int64_t[]){0, 4}), MS_OK);

    /* Misshaped, missing, non-float. */
    ck_assert_int_eq(model_file_read_f32(mf, "w.f32", out, 2, (int64_t[]){2, 4}), MS_ERR_FORMAT);
    assert_error(p, "tensor w.f32 has shape (2, 3), expected (2, 4)");
    ck_assert_int_eq(model_file_read_f32(mf, "w.f32", out, 1, (int64_t[]){6}), MS_ERR_FORMAT);
    assert_error(p, "tensor w.f32 has shape (2, 3), expected (6)");
    ck_assert_int_eq(model_file_read_f32(mf, "backbone.blocks.0.attn.qkv.weight", out, 2, (int64_t[]){96, 33}),
                     MS_ERR_FORMAT);
    assert_error(p, "missing tensor backbone.blocks.0.attn.qkv.weight");
    ck_assert_int_eq(model_file_read_f32(mf, "i.i32", out, 1, (int64_t[]){2}), MS_ERR_FORMAT);
    assert_error(p, "dtype I32");
    ck_assert_int_eq(model_file_read_f32(mf, "bn.num_batches_tracked", out, 0, NULL), MS_ERR_FORMAT);
    assert_error(p, "dtype I64");
    model_file_close(mf);

    /* No temp file left behind. */
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", p, (long)getpid());
    ck_assert_int_ne(access(tmp, F_OK), 0);
}
END_TEST

START_TEST(test_write_errors)
{
    float x[2] = {1, 2};
    ms_tensor t = {.name = "x", .dtype = MS_DT_F32, .ndim = 1, .shape = {2}, .data = x, .nbytes = 8};
    char p[600];
    snprintf(p, sizeof p, "%s/no/such/dir/m.safetensors", dir);
    ck_assert_int_eq(write_model(p, &t, 1), MS_ERR_IO);
    assert_error(p, "cannot create");
    char sub[600];
    snprintf(sub, sizeof sub, "%s/no", dir);
    ck_assert_int_ne(access(sub, F_OK), 0);

    /* Lying tensor descriptions are refused before anything is written. */
    const char *q = at("bad.safetensors");
    t.nbytes = 4;
    ck_assert_int_eq(write_model(q, &t, 1), MS_ERR_ARG);
    assert_error(q, "tensor x");
    t.nbytes = 8;
    ms_tensor two[2] = {t, t};
    ck_assert_int_eq(write_model(q, two, 2), MS_ERR_ARG);
    assert_error(q, "given twice");
    ck_assert_int_ne(access(q, F_OK), 0);

    /* Overwriting an existing file replaces it atomically. */
    ck_assert_int_eq(write_model(q, &t, 1), MS_OK);
    x[0] = 5;
    ck_assert_int_eq(write_model(q, &t, 1), MS_OK);
    ms_model_file *mf;
    ck_assert_int_eq(model_file_open(&mf, q), MS_OK);
    float out[2];
    ck_assert_int_eq(model_file_read_f32(mf, "x", out, 1, (int64_t[]){2}), MS_OK);
    ck_assert_float_eq(out[0], 5.0f);
    model_file_close(mf);

    /* A file written without model metadata (a --dump) is not a model. */
    ck_assert_int_eq(safetensors_write(q, &t, 1, NULL), MS_OK);
    ck_assert_int_eq(model_file_open(&mf, q), MS_ERR_FORMAT);
    assert_error(q, "no __metadata__");
}
END_TEST

START_TEST(test_plain_safetensors)
{
    float x[2] = {1, 2};
    ms_tensor t = {.name = "logits", .dtype = MS_DT_F32, .ndim = 1, .shape = {2}, .data = x, .nbytes = 8};
    const char *p = at("dump.safetensors");
    ms_model_file *mf;
    float out[2];

    /* No metadata at all: opens, no config, no metadata values. */
    ck_assert_int_eq(safetensors_write(p, &t, 1, NULL), MS_OK);
    ck_assert_msg(safetensors_open(&mf, p) == MS_OK, "%s", ms_last_error());
    ck_assert_ptr_null(model_file_config(mf));
    ck_assert_ptr_null(model_file_metadata(mf, "format"));
    ck_assert_int_eq(model_file_read_f32(mf, "logits", out, 1, (int64_t[]){2}), MS_OK);
    ck_assert_float_eq(out[1], 2.0f);
    model_file_close(mf);

    /* Metadata that is not a model's is readable but no config is parsed. */
    const char *meta[] = {"attention", "mita", "format", "other", NULL};
    ck_assert_int_eq(safetensors_write(p, &t, 1, meta), MS_OK);
    ck_assert_int_eq(safetensors_open(&mf, p), MS_OK);
    ck_assert_str_eq(model_file_metadata(mf, "attention"), "mita");
    ck_assert_str_eq(model_file_metadata(mf, "format"), "other");
    ck_assert_ptr_null(model_file_metadata(mf, "config"));
    ck_assert_ptr_null(model_file_config(mf));
    model_file_close(mf);
    ck_assert_int_eq(model_file_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "format is 'other'");

    /* A model opens either way; model_file_open also parses the config. */
    ck_assert_int_eq(write_model(p, &t, 1), MS_OK);
    ck_assert_int_eq(safetensors_open(&mf, p), MS_OK);
    ck_assert_ptr_null(model_file_config(mf));
    ck_assert_str_eq(model_file_metadata(mf, "format_version"), "1");
    model_file_close(mf);
    ck_assert_int_eq(model_file_open(&mf, p), MS_OK);
    ck_assert_ptr_nonnull(model_file_config(mf));
    ck_assert_str_eq(model_file_metadata(mf, "config"), MIN_CONFIG);
    model_file_close(mf);

    /* The container checks still apply; metadata must map strings to strings. */
    write_raw_len(p, strlen("{\"__metadata__\":{\"a\":1}}"), "{\"__metadata__\":{\"a\":1}}", NULL, 0);
    ck_assert_int_eq(safetensors_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "__metadata__ value for a is not a string");
    write_raw_len(p, 999, "{}", NULL, 0);
    ck_assert_int_eq(safetensors_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "past end of file");
    write_raw_len(p, 2, "{}", NULL, 0);
    ck_assert_int_eq(safetensors_open(&mf, p), MS_OK);
    ck_assert_int_eq(model_file_count(mf), 0);
    model_file_close(mf);
}
END_TEST

/* -------------------------------------------------------------- rejects */

START_TEST(test_rejects_container)
{
    ms_model_file *mf = (ms_model_file *)1;
    const char *p = at("x.safetensors");

    ck_assert_int_eq(model_file_open(&mf, at("missing.safetensors")), MS_ERR_IO);
    ck_assert_ptr_null(mf);
    assert_error(at("missing.safetensors"), "cannot open");

    write_bytes(p, "", 0);
    ck_assert_int_eq(model_file_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "file too small (0 bytes)");
    write_bytes(p, "\x02\0\0", 3);
    ck_assert_int_eq(model_file_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "file too small (3 bytes)");

    write_raw_len(p, 999, "{}", NULL, 0);
    ck_assert_int_eq(model_file_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "header length 999 past end of file (10 bytes)");

    write_raw_len(p, 200000000, "{}", NULL, 0);
    ck_assert_int_eq(model_file_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "header length 200000000 over the 100 MB limit");
    write_raw_len(p, UINT64_MAX, "{}", NULL, 0); /* 8 + len would wrap */
    ck_assert_int_eq(model_file_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "over the 100 MB limit");

    write_raw_len(p, 9, "{\"a\": [1,", NULL, 0);
    ck_assert_int_eq(model_file_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "header JSON does not parse");
    /* Valid JSON only if read past the declared length: must not parse. */
    write_raw_len(p, 1, "{}", NULL, 0);
    ck_assert_int_eq(model_file_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "header JSON does not parse");
    write_raw_len(p, 3, "[1]", NULL, 0);
    ck_assert_int_eq(model_file_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "header is not a JSON object");

    ck_assert_int_eq(model_file_open(&mf, dir), MS_ERR_IO);
    assert_error(dir, "not a regular file");
}
END_TEST

static const struct {
    const char *tensors;
    size_t data_bytes;
    const char *msg;
} tensor_errors[] = {
    {"\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}", 16,
     "tensor a: F32 x (2, 2) is 16 bytes but data_offsets [0, 12] hold 12"},
    {"\"a\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,8]}", 8, "F16 x (3) is 6 bytes"},
    {"\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}",
     12, "tensors a [0, 8] and b [4, 12] overlap"},
    {"\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
     "\"a\":{\"dtype\":\"U8\",\"shape\":[12],\"data_offsets\":[0,12]}",
     12, "tensors a [0, 12] and b [8, 12] overlap"},
    {"\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}", 8,
     "tensor a: data_offsets [0, 16] outside the data region (8 bytes)"},
    {"\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[18446744073709551612,18446744073709551616]}", 8,
     "tensor a: data_offsets must be [begin, end]"},
    {"\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}", 8, "end before begin"},
    {"\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}", 8, "data_offsets must be [begin, end]"},
    {"\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.5,4]}", 8, "data_offsets must be [begin, end]"},
    {"\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}", 8, "tensor a: unsupported dtype 'F8_E4M3'"},
    {"\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}", 8, "tensor a: missing dtype"},
    {"\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}", 8, "tensor a: missing shape"},
    {"\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}", 8, "shape[0] is not a non-negative integer"},
    {"\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}", 8, "9 dimensions"},
    {"\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}", 8,
     "overflows"},
    {"\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}",
     8, "tensor a appears twice"},
    {"\"a\":7", 8, "tensor a: entry is not an object"},
};

START_TEST(test_rejects_tensors)
{
    const char *p = at("t.safetensors");
    uint8_t data[16] = {0};
    ms_model_file *mf;
    for (size_t i = 0; i < sizeof tensor_errors / sizeof *tensor_errors; i++) {
        write_raw(p, tensor_errors[i].tensors, data, tensor_errors[i].data_bytes);
        ck_assert_msg(model_file_open(&mf, p) == MS_ERR_FORMAT, "case %zu accepted", i);
        const char *m = ms_last_error();
        ck_assert_msg(strncmp(m, p, strlen(p)) == 0 && strstr(m, tensor_errors[i].msg),
                      "case %zu: expected '%s', got '%s'", i, tensor_errors[i].msg, m);
    }
    /* Controls: the same shapes with honest ranges load, including an empty
     * tensor sitting inside another's range. */
    write_raw(p,
              "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
              "\"c\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}",
              data, 16);
    ck_assert_msg(model_file_open(&mf, p) == MS_OK, "%s", ms_last_error());
    ck_assert_int_eq(model_file_count(mf), 3);
    model_file_close(mf);
}
END_TEST

START_TEST(test_rejects_metadata)
{
    const char *p = at("meta.safetensors");
    const char *t = "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}";
    uint8_t data[4] = {0};
    ms_model_file *mf;
    struct {
        const char *fmt, *ver, *cfg, *msg;
    } cases[] = {
        {NULL, "1", MIN_CONFIG, "__metadata__ has no format"},
        {"safetensors", "1", MIN_CONFIG, "__metadata__ format is 'safetensors', expected 'mitaseg'"},
        {"mitaseg", NULL, MIN_CONFIG, "no format_version"},
        {"mitaseg", "2", MIN_CONFIG, "unsupported format_version '2'"},
        {"mitaseg", "1", NULL, "__metadata__ has no config"},
        {"mitaseg", "1", "{\"backbone\":{}}", "config: missing key backbone.patch_size"},
        {"mitaseg", "1", "not json", "config: not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *meta = meta_member(cases[i].fmt, cases[i].ver, cases[i].cfg);
        char h[4096];
        snprintf(h, sizeof h, "{%s,%s}", meta, t);
        free(meta);
        write_raw_len(p, strlen(h), h, data, 4);
        ck_assert_msg(model_file_open(&mf, p) == MS_ERR_FORMAT, "case %zu accepted", i);
        assert_error(p, cases[i].msg);
    }
    /* Unknown config value, and a config key with the wrong type, via the file. */
    char *cfg = subst(MIN_CONFIG, "\"pos_grid\":[4,4]", "\"pos_grid\":[4,4],\"attention\":{\"type\":\"foo\"}");
    char *meta = meta_member("mitaseg", "1", cfg);
    char h[4096];
    snprintf(h, sizeof h, "{%s,%s}", meta, t);
    write_raw_len(p, strlen(h), h, data, 4);
    ck_assert_int_eq(model_file_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "config: backbone.attention.type: unknown value 'foo'");
    free(meta);
    free(cfg);

    write_raw_len(p, strlen("{" "\"__metadata__\":5}"), "{\"__metadata__\":5}", NULL, 0);
    ck_assert_int_eq(model_file_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "__metadata__ is not an object");
    write_raw_len(p, 2, "{}", NULL, 0);
    ck_assert_int_eq(model_file_open(&mf, p), MS_ERR_FORMAT);
    assert_error(p, "no __metadata__");
}
END_TEST

/* ------------------------------------------------------------- sweeps */

/* Opens p (as a model or as plain safetensors); if that succeeds, every
 * tensor must read in bounds. */
static void open_and_read_all(const char *p, bool model)
{
    ms_model_file *mf = NULL;
    ms_clear_error();
    ms_status st = model ? model_file_open(&mf, p) : safetensors_open(&mf, p);
    if (st != MS_OK) {
        ck_assert_ptr_null(mf);
        const char *m = ms_last_error();
        ck_assert_msg(strncmp(m, p, strlen(p)) == 0, "message without path: %s", m);
        return;
    }
    for (int i = 0; i < model_file_count(mf); i++) {
        const ms_tensor *t = model_file_tensor(mf, i);
        size_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
        float *buf = malloc((n ? n : 1) * sizeof *buf);
        ms_status rs = model_file_read_f32(mf, t->name, buf, t->ndim, t->shape);
        ck_assert(rs == MS_OK || (t->dtype != MS_DT_F32 && t->dtype != MS_DT_F16 && t->dtype != MS_DT_BF16));
        free(buf);
    }
    model_file_close(mf);
}

static size_t make_sweep_file(const char *p, uint8_t **bytes)
{
    float a[12];
    uint16_t b[6] = {0x3C00, 0x0001, 0x7C00, 0x8000, 0x1234, 0xFFFF};
    rand_fill(a, 12, 3, -1, 1);
    ms_tensor t[] = {
        {.name = "backbone.pos_embed", .dtype = MS_DT_F32, .ndim = 3, .shape = {1, 4, 3}, .data = a, .nbytes = 48},
        {.name = "h", .dtype = MS_DT_F16, .ndim = 2, .shape = {2, 3}, .data = b, .nbytes = 12},
        {.name = "g", .dtype = MS_DT_BF16, .ndim = 1, .shape = {6}, .data = b, .nbytes = 12},
        {.name = "i", .dtype = MS_DT_U8, .ndim = 1, .shape = {5}, .data = b, .nbytes = 5},
    };
    ck_assert_int_eq(write_model(p, t, 4), MS_OK);
    size_t n;
    *bytes = read_bytes(p, &n);
    return n;
}

START_TEST(test_truncation_sweep)
{
    const char *src = at("full.safetensors"), *p = at("cut.safetensors");
    uint8_t *bytes;
    size_t n = make_sweep_file(src, &bytes);
    int ok = 0;
    /* Every length: the header is a few hundred bytes, so this is cheap. */
    for (size_t len = 0; len <= n; len++) {
        write_bytes(p, bytes, len);
        ms_model_file *mf;
        if (model_file_open(&mf, p) == MS_OK) {
            model_file_close(mf);
            ok++;
        }
        open_and_read_all(p, true);
        open_and_read_all(p, false);
    }
    /* Only the whole file is valid: its last tensor ends at the end. */
    ck_assert_int_eq(ok, 1);
    free(bytes);
}
END_TEST

/* Overwrites each header byte with characters that change JSON structure or
 * numbers; whatever parses must still read in bounds. */
START_TEST(test_corruption_sweep)
{
    const char *src = at("full.safetensors"), *p = at("bad.safetensors");
    uint8_t *bytes;
    size_t n = make_sweep_file(src, &bytes);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | bytes[i];
    static const uint8_t subs[] = {'9', '0', '-', '[', ']', '"', ',', 0xff, '\0', 'e'};
    uint8_t *buf = malloc(n);
    for (size_t pos = 0; pos < 8 + hlen; pos++) {
        for (size_t s = 0; s < sizeof subs; s++) {
            memcpy(buf, bytes, n);
            if (buf[pos] == subs[s]) continue;
            buf[pos] = subs[s];
            write_bytes(p, buf, n);
            open_and_read_all(p, true);
            open_and_read_all(p, false);
        }
    }
    free(buf);
    free(bytes);
}
END_TEST

/* Another process rewrites the model in place (truncated to half, then whole
 * again) while the engine loads it: every load either succeeds or fails with a
 * message naming the file; none dies (it did with SIGBUS when the file was
 * mmapped: 8 of 25 runs in the report). */
START_TEST(test_file_changing_under_loader)
{
    const char *p = at("moving.safetensors");
    size_t n;
    uint8_t *bytes = read_bytes(fixture_path("tiny.model.safetensors"), &n);
    write_bytes(p, bytes, n);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        int fd = open(p, O_WRONLY);
        for (;;) {
            if (ftruncate(fd, (off_t)(n / 2)) != 0) _exit(1);
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
            if (pwrite(fd, bytes, n, 0) != (ssize_t)n) _exit(1);
            nanosleep(&ts, NULL);
        }
    }
    ms_engine_options eo = {.device = MS_DEV_CPU, .threads = 1};
    int ok = 0, failed = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        ms_engine *e = NULL;
        if (engine_init(&e, p, &eo) == MS_OK) {
            engine_free(e);
            ok++;
        } else {
            const char *m = ms_last_error();
            ck_assert_msg(strncmp(m, p, strlen(p)) == 0, "message without the path: %s", m);
            failed++;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
    } while ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9 < 1.5);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    free(bytes);
    ck_assert_int_gt(ok + failed, 20);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model_file");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, test_config_defaults);
    tcase_add_test(tc, test_config_full);
    tcase_add_test(tc, test_config_errors);
    suite_add_tcase(s, tc);
    tc = tcase_create("file");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_roundtrip_dtypes);
    tcase_add_test(tc, test_write_errors);
    tcase_add_test(tc, test_plain_safetensors);
    tcase_add_test(tc, test_rejects_container);
    tcase_add_test(tc, test_rejects_tensors);
    tcase_add_test(tc, test_rejects_metadata);
    tcase_add_test(tc, test_truncation_sweep);
    tcase_add_test(tc, test_corruption_sweep);
    tcase_add_test(tc, test_file_changing_under_loader);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
