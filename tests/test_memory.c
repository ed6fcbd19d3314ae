/* Bounded memory: a mask_only run (what segment and eval use) gives exactly
 * the mask of a run that keeps full-size logits, without those logits; a run
 * whose plan exceeds the engine's memory budget is refused before anything is
 * allocated, with a message giving the sizes, and the engine still runs what
 * fits afterwards. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/engine.h"
#include "testutil.h"

static ms_engine *open_engine(const char *path, size_t max_memory)
{
    ms_engine_options eo = {.device = MS_DEV_CPU, .threads = 2, .max_memory = max_memory};
    ms_engine *e = NULL;
    ck_assert_msg(engine_init(&e, path, &eo) == MS_OK, "%s", ms_last_error());
    return e;
}

static ms_image make_image(int w, int h, uint32_t seed)
{
    ms_image img = {.w = w, .h = h, .rgb = malloc((size_t)w * h * 3)};
    /* Smooth gradients plus noise: large regions, so classes change across it. */
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) {
                seed = seed * 1664525u + 1013904223u;
                int v = (c == 0 ? x * 255 / w : c == 1 ? y * 255 / h : (x + y) * 127 / (w + h)) +
                        (int)(seed >> 28) - 8;
                img.rgb[((size_t)y * w + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    return img;
}

/* mask_only and the full-logits path agree byte for byte. */
static void check_same_mask(const char *model, int w, int h)
{
    ms_engine *e = open_engine(model, 0);
    ms_image img = make_image(w, h, (uint32_t)(w * 31 + h));
    ms_result full = {0}, lean = {0};
    ms_run_options opt = {.attention = -1};
    ck_assert_msg(engine_run(e, &full, &img, &opt) == MS_OK, "%s", ms_last_error());
    opt.mask_only = true;
    ck_assert_msg(engine_run(e, &lean, &img, &opt) == MS_OK, "%s", ms_last_error());
    ck_assert_ptr_null(lean.logits);
    ck_assert_ptr_nonnull(full.logits);
    ck_assert_int_eq(lean.w, w);
    ck_assert_int_eq(lean.h, h);
    size_t px = (size_t)w * h, differ = 0;
    int classes_seen[256] = {0}, n_seen = 0;
    for (size_t i = 0; i < px; i++) {
        differ += full.mask[i] != lean.mask[i];
        if (!classes_seen[lean.mask[i]]++) n_seen++;
    }
    ck_assert_msg(differ == 0, "%s %dx%d: %zu of %zu mask pixels differ", model, w, h, differ, px);
    ck_assert_msg(n_seen > 1, "%s %dx%d: one class only; the comparison proves little", model, w, h);
    /* Reusing the lean result for a full run brings the logits back. */
    opt.mask_only = false;
    ck_assert_int_eq(engine_run(e, &lean, &img, &opt), MS_OK);
    ck_assert_ptr_nonnull(lean.logits);
    ck_assert_int_eq(memcmp(lean.logits, full.logits, px * full.classes * sizeof(float)), 0);
    result_free(&full);
    result_free(&lean);
    image_free(&img);
    engine_free(e);
}

START_TEST(test_mask_only_same_mask_resized)
{
    /* short_side 40: the logits are resized back up, in 64-row bands (203
     * rows: three whole bands and a partial one). */
    check_same_mask(fixture_path("tiny.model.safetensors"), 150, 203);
    check_same_mask(fixture_path("tiny.model.safetensors"), 301, 17);
}
END_TEST

START_TEST(test_mask_only_same_mask_native)
{
    /* No short side: the logits are cropped at the image's own size. */
    check_same_mask(fixture_path("mita_d.model.safetensors"), 70, 45);
}
END_TEST

START_TEST(test_mask_only_same_mask_default_model)
{
    /* The shipped model (short side 360), upsampled to a 500x301 image. Not
     * under ASan (a minute there); the fixture cases cover the code. */
#ifdef __SANITIZE_ADDRESS__
    return;
#endif
    const char *path = shipped_model_path();
    if (path) check_same_mask(path, 500, 301);
}
END_TEST

START_TEST(test_budget_refuses_before_allocating)
{
    ms_engine *e = open_engine(fixture_path("tiny.model.safetensors"), (size_t)64 << 20);
    ck_assert_uint_eq(engine_memory_budget(e), (size_t)64 << 20);
    ms_run_options opt = {.attention = -1, .mask_only = true};
    /* 5000x4000: the input staging alone is 240 MB. Checked without pixels. */
    ms_clear_error();
    ck_assert_int_eq(engine_check_memory(e, 1, 4000, 5000, &opt, 0), MS_ERR_OOM);
    const char *m = ms_last_error();
    ck_assert_msg(strstr(m, "a 5000x4000 image would need about") &&
                      strstr(m, "over the memory budget of 64 MiB"),
                  "%s", m);
    /* A small image fits; the caller's own bytes count too. */
    ck_assert_int_eq(engine_check_memory(e, 1, 40, 50, &opt, 0), MS_OK);
    ck_assert_int_eq(engine_check_memory(e, 1, 40, 50, &opt, (size_t)64 << 20), MS_ERR_OOM);

    /* engine_run itself refuses the big image (its plan is never allocated)
     * and still runs a small one afterwards. */
    ms_image big = {.w = 5000, .h = 4000, .rgb = calloc((size_t)5000 * 4000, 3)};
    ms_result res = {0};
    ck_assert_int_eq(engine_run(e, &res, &big, &opt), MS_ERR_OOM);
    ck_assert_msg(strstr(ms_last_error(), "memory budget"), "%s", ms_last_error());
    ms_image small = make_image(50, 40, 1);
    ck_assert_msg(engine_run(e, &res, &small, &opt) == MS_OK, "%s", ms_last_error());
    result_free(&res);
    image_free(&small);
    image_free(&big);
    engine_free(e);
}
END_TEST

START_TEST(test_default_budget_is_half_of_memory)
{
    size_t b = engine_default_memory_budget();
    ck_assert_uint_gt(b, (size_t)64 << 20);
    ms_engine *e = open_engine(fixture_path("tiny.model.safetensors"), 0);
    ck_assert_uint_eq(engine_memory_budget(e), b);
    engine_free(e);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("memory");
    TCase *tc = tcase_create("memory");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_mask_only_same_mask_resized);
    tcase_add_test(tc, test_mask_only_same_mask_native);
    tcase_add_test(tc, test_mask_only_same_mask_default_model);
    tcase_add_test(tc, test_budget_refuses_before_allocating);
    tcase_add_test(tc, test_default_budget_is_half_of_memory);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
