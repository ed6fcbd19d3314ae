/* The OpenCV-exact uint8 resize (app/image_resize.c, input.resize
 * "cv2_uint8") against goldens made by OpenCV's own cv2.resize(INTER_LINEAR)
 * (tools/tests/gen_resize_golden.py; MS_RESIZE_GOLDEN=FILE tests another set,
 * as tools/tests/test_upstream.py does with a larger sweep): byte for byte.
 * Also mmcv's keep-ratio sizes, the config fields, and the engine staging the
 * resized image (its "input" stage is the golden's bytes, normalised). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backbone/config.h"
#include "app/engine.h"
#include "app/image_resize.h"
#include "app/model_file.h"
#include "testutil.h"

static const char *golden_path(void)
{
    const char *p = getenv("MS_RESIZE_GOLDEN");
    return p && *p ? p : fixture_path("cv2_resize.golden.safetensors");
}

/* Resizes src (h, w, 3) to (dh, dw, 3) with fresh scratch; caller frees. */
static uint8_t *resize_u8(const uint8_t *src, int w, int h, int dw, int dh)
{
    size_t nb = image_resize_u8_scratch(w, h, dw, dh);
    void *scratch = malloc(nb ? nb : 1);
    uint8_t *dst = malloc((size_t)dw * dh * 3);
    ck_assert(scratch && dst);
    memset(scratch, 0xA5, nb); /* no reliance on zeroed scratch */
    image_resize_u8_rgb(dst, src, w, h, dw, dh, scratch);
    free(scratch);
    return dst;
}

START_TEST(test_matches_opencv)
{
    ms_model_file *g = NULL;
    ck_assert_msg(safetensors_open(&g, golden_path()) == MS_OK, "%s", ms_last_error());
    int checked = 0, area = 0, up = 0, down = 0;
    for (int t = 0; t < model_file_count(g); t++) {
        const ms_tensor *d = model_file_tensor(g, t);
        int i, j;
        if (sscanf(d->name, "dst.%d.%d", &i, &j) != 2) continue;
        char sname[32];
        snprintf(sname, sizeof sname, "src.%d", i);
        const ms_tensor *s = model_file_find(g, sname);
        ck_assert_msg(s, "%s without %s", d->name, sname);
        ck_assert(s->dtype == MS_DT_U8 && d->dtype == MS_DT_U8 && s->ndim == 3 && d->ndim == 3);
        int h = (int)s->shape[0], w = (int)s->shape[1], dh = (int)d->shape[0], dw = (int)d->shape[1];
        uint8_t *got = resize_u8(s->data, w, h, dw, dh);
        const uint8_t *want = d->data;
        for (size_t k = 0; k < (size_t)dh * dw * 3; k++)
            ck_assert_msg(got[k] == want[k],
                          "%dx%d -> %dx%d: pixel (%zu, %zu) channel %zu is %d, OpenCV %d", w, h,
                          dw, dh, k / 3 / dw, k / 3 % dw, k % 3, got[k], want[k]);
        free(got);
        checked++;
        area += 2 * dh == h && 2 * dw == w;
        up += dh > h && dw > w;
        down += dh < h && dw < w;
    }
    model_file_close(g);
    /* the set really covers the branches */
    ck_assert_int_ge(checked, 50);
    ck_assert_int_ge(area, 1);
    ck_assert_int_ge(up, 5);
    ck_assert_int_ge(down, 5);
}
END_TEST

/* An unchanged size is a copy; a 1x1 source fills the output. */
START_TEST(test_copy_and_single_pixel)
{
    uint8_t src[2 * 3 * 3];
    for (int i = 0; i < 18; i++) src[i] = (uint8_t)(i * 13 + 7);
    uint8_t *same = resize_u8(src, 3, 2, 3, 2);
    ck_assert(memcmp(same, src, sizeof src) == 0);
    free(same);
    uint8_t one[3] = {9, 200, 255};
    uint8_t *big = resize_u8(one, 1, 1, 5, 4);
    for (int p = 0; p < 20; p++)
        for (int c = 0; c < 3; c++) ck_assert_int_eq(big[p * 3 + c], one[c]);
    free(big);
}
END_TEST

/* mmcv.rescale_size with scale (long, short), computed by hand:
 * s = min(long/max(h,w), short/min(h,w)); int(x*s + 0.5). */
START_TEST(test_keep_ratio_size)
{
    int rh, rw;
    image_keep_ratio_size(&rh, &rw, 70, 100, 72, 2048); /* s = 72/70 */
    ck_assert_int_eq(rh, 72);
    ck_assert_int_eq(rw, 103);                          /* 102.857 + 0.5 */
    image_keep_ratio_size(&rh, &rw, 100, 1000, 512, 2048); /* the long side wins: s = 2.048 */
    ck_assert_int_eq(rh, 205);                             /* 204.8 + 0.5 */
    ck_assert_int_eq(rw, 2048);
    image_keep_ratio_size(&rh, &rw, 100, 1000, 512, 0);    /* no cap: s = 5.12 */
    ck_assert_int_eq(rh, 512);
    ck_assert_int_eq(rw, 5120);
    image_keep_ratio_size(&rh, &rw, 512, 683, 512, 2048);  /* ADE20K-like: unchanged */
    ck_assert_int_eq(rh, 512);
    ck_assert_int_eq(rw, 683);
    image_keep_ratio_size(&rh, &rw, 1, 10000, 4, 8);       /* at least one pixel */
    ck_assert_int_eq(rh, 1);
    ck_assert_int_eq(rw, 8);
    image_keep_ratio_size(&rh, &rw, 59, 77, 0, 100);       /* no short side: native */
    ck_assert_int_eq(rh, 59);
    ck_assert_int_eq(rw, 77);
    image_keep_ratio_size(&rh, &rw, 3, 5, 5, 0);           /* 8.333 -> 8 */
    ck_assert_int_eq(rh, 5);
    ck_assert_int_eq(rw, 8);
}
END_TEST

#define CFG_HEAD                                                                                \
    "{\"backbone\":{\"patch_size\":16,\"embed_dim\":32,\"depth\":2,\"num_heads\":2,"          \
    "\"pos_grid\":[4,4]},\"classes\":[\"a\"],\"palette\":[[1,2,3]],\"input\":"

START_TEST(test_config_fields)
{
    ms_config c;
    ck_assert_msg(config_parse(&c, CFG_HEAD "{}}") == MS_OK, "%s", ms_last_error());
    ck_assert(!c.resize_cv2_uint8);
    ck_assert_int_eq(c.long_side, 0);
    config_free(&c);
    ck_assert_msg(config_parse(&c, CFG_HEAD "{\"short_side\":512,\"long_side\":2048,"
                                          "\"resize\":\"cv2_uint8\"}}") == MS_OK,
                  "%s", ms_last_error());
    ck_assert(c.resize_cv2_uint8);
    ck_assert_int_eq(c.long_side, 2048);
    config_free(&c);
    ck_assert(config_parse(&c, CFG_HEAD "{\"resize\":\"float\",\"long_side\":null}}") == MS_OK);
    ck_assert(!c.resize_cv2_uint8);
    ck_assert_int_eq(c.long_side, 0);
    config_free(&c);
    ck_assert(config_parse(&c, CFG_HEAD "{\"resize\":\"bicubic\"}}") != MS_OK);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "input.resize"));
    ck_assert(config_parse(&c, CFG_HEAD "{\"resize\":1}}") != MS_OK);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "input.resize"));
    ck_assert(config_parse(&c, CFG_HEAD "{\"long_side\":0}}") != MS_OK);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "input.long_side"));
}
END_TEST

/* ---- the engine stages the OpenCV-resized bytes -------------------------- */

typedef struct {
    float *input[2]; /* (3, ph, pw): image 0 of the batch, and image 1 (flip TTA's mirror) */
    int64_t shape[3];
} input_capture;

static void on_trace(void *user, const char *name, const float *data, int ndim,
                     const int64_t *shape)
{
    input_capture *cap = user;
    int i = cap->input[0] ? 1 : 0;
    if (strcmp(name, "input") != 0 || cap->input[i] || ndim != 3) return;
    size_t n = (size_t)(shape[0] * shape[1] * shape[2]);
    cap->input[i] = malloc(n * sizeof(float));
    memcpy(cap->input[i], data, n * sizeof(float));
    memcpy(cap->shape, shape, sizeof cap->shape);
}

/* tiny.model.safetensors with its config's input section replaced. */
static const char *model_with_input(const char *input_json)
{
    ms_model_file *mf = NULL;
    ck_assert_msg(model_file_open(&mf, fixture_path("tiny.model.safetensors")) == MS_OK, "%s",
                  ms_last_error());
    const char *cfg = model_file_metadata(mf, "config");
    const char *at = strstr(cfg, "\"input\":{");
    ck_assert_ptr_nonnull(at);
    const char *end = strchr(at, '}');
    size_t n = strlen(cfg) + strlen(input_json) + 1;
    char *json = malloc(n);
    snprintf(json, n, "%.*s\"input\":%s%s", (int)(at - cfg), cfg, input_json, end + 1);
    int nt = model_file_count(mf);
    ms_tensor *t = malloc((size_t)nt * sizeof *t);
    for (int i = 0; i < nt; i++) t[i] = *model_file_tensor(mf, i);
    const char *meta[] = {"format", model_file_metadata(mf, "format"), "format_version",
                          model_file_metadata(mf, "format_version"), "config", json, NULL};
    static char path[512];
    snprintf(path, sizeof path, "%s/cv2.model.safetensors", test_dir);
    ck_assert_msg(safetensors_write(path, t, nt, meta) == MS_OK, "%s", ms_last_error());
    free(t);
    free(json);
    model_file_close(mf);
    return path;
}

static void run_input(input_capture *cap, const char *model, const ms_image *img, bool flip)
{
    ms_engine *e = NULL;
    ms_engine_options eo = {.device = MS_DEV_CPU, .threads = 1};
    ck_assert_msg(engine_init(&e, model, &eo) == MS_OK, "%s", ms_last_error());
    engine_set_trace(e, on_trace, cap);
    ms_result r = {0};
    ms_run_options ro = {.attention = MS_ATTN_FULL, .tta_flip = flip};
    ck_assert_msg(engine_run(e, &r, img, &ro) == MS_OK, "%s", ms_last_error());
    result_free(&r);
    engine_free(e);
}

START_TEST(test_engine_stages_opencv_bytes)
{
    /* golden src.6 (34x50) and its cv2 resize to mmcv's keep-ratio size for
     * short side 72: 72x106 */
    ms_model_file *g = NULL;
    ck_assert_msg(safetensors_open(&g, fixture_path("cv2_resize.golden.safetensors")) == MS_OK,
                  "%s", ms_last_error());
    const ms_tensor *src = model_file_find(g, "src.6"), *want = NULL;
    ck_assert_ptr_nonnull(src);
    ck_assert_int_eq(src->shape[0], 34);
    ck_assert_int_eq(src->shape[1], 50);
    for (int t = 0; t < model_file_count(g) && !want; t++) {
        const ms_tensor *d = model_file_tensor(g, t);
        if (strncmp(d->name, "dst.6.", 6) == 0 && d->shape[0] == 72 && d->shape[1] == 106) want = d;
    }
    ck_assert_ptr_nonnull(want);
    ms_image img = {.w = 50, .h = 34, .rgb = (uint8_t *)src->data};
    static const float mean[3] = {123.675f, 116.28f, 103.53f}, stdv[3] = {58.395f, 57.12f, 57.375f};
    const uint8_t *px = want->data;
    for (int flip = 0; flip < 2; flip++) {
        for (int mode = 0; mode < 2; mode++) {
            input_capture cap = {0};
            run_input(&cap, model_with_input(mode ? "{\"short_side\":72,\"resize\":\"cv2_uint8\"}"
                                                  : "{\"short_side\":72}"),
                      &img, flip);
            ck_assert_ptr_nonnull(cap.input[0]);
            ck_assert(!flip == !cap.input[1]);
            int ph = (int)cap.shape[1], pw = (int)cap.shape[2];
            ck_assert_int_ge(ph, 72);
            ck_assert_int_ge(pw, 106);
            /* image 0: the unflipped pass; image 1 (flip TTA): OpenCV's bytes
             * mirrored (resized first, then flipped, as mmseg's TTA does) */
            double worst = 0;
            for (int i = 0; i < (flip ? 2 : 1); i++)
                for (int c = 0; c < 3; c++)
                    for (int y = 0; y < 72; y++)
                        for (int x = 0; x < 106; x++) {
                            int sx = i ? 105 - x : x;
                            float v = ((float)px[((size_t)y * 106 + sx) * 3 + c] - mean[c]) / stdv[c];
                            double d = fabs(cap.input[i][((size_t)c * ph + y) * pw + x] - v);
                            if (d > worst) worst = d;
                        }
            /* one level of uint8 is 1/57 after normalising */
            if (mode)
                ck_assert_msg(worst < 1e-5, "cv2_uint8: input differs from OpenCV's by %g", worst);
            else
                ck_assert_msg(worst > 1e-3, "float resize should not round to OpenCV's bytes");
            free(cap.input[0]);
            free(cap.input[1]);
        }
    }
    model_file_close(g);
}
END_TEST

static void setup(void) { test_dir_create("image_resize"); }
static void teardown(void) { test_dir_remove(); }

int main(void)
{
    Suite *s = suite_create("image_resize");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_matches_opencv);
    tcase_add_test(tc, test_copy_and_single_pixel);
    tcase_add_test(tc, test_keep_ratio_size);
    tcase_add_test(tc, test_config_fields);
    tcase_add_test(tc, test_engine_stages_opencv_bytes);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
