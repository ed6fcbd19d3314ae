/* Flip test-time augmentation (ms_run_options.tta_flip, --tta flip):
 * - golden: the engine's TTA logits and mask against the PyTorch reference
 *   (tools/mitaseg_ref.py segment(tta="flip"), float64) on the pad_resize
 *   fixture, whose odd size, resize and right/bottom padding make the mirror
 *   pass differ from the unflipped one at the borders;
 * - flip-equivariance: TTA of the mirror image = mirror of the TTA result;
 * - the MiTA record is the unflipped pass's; TTA in a batch equals TTA one
 *   image at a time; TTA differs from no TTA (it is not a no-op). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "app/engine.h"
#include "app/model_file.h"
#include "testutil.h"

/* Float32 engine against a float64 reference (see test_golden.c's STAGE_TOL). */
#define TOL 1e-4

static ms_engine *open_engine(const char *model)
{
    ms_engine_options eo = {.device = MS_DEV_CPU, .threads = 2};
    ms_engine *e = NULL;
    ck_assert_msg(engine_init(&e, fixture_path(model), &eo) == MS_OK, "%s", ms_last_error());
    return e;
}

static ms_image mirror_image(const ms_image *src)
{
    ms_image m = {.w = src->w, .h = src->h, .rgb = malloc((size_t)src->w * src->h * 3)};
    ck_assert_ptr_nonnull(m.rgb);
    for (int y = 0; y < src->h; y++)
        for (int x = 0; x < src->w; x++)
            memcpy(m.rgb + ((size_t)y * m.w + x) * 3, src->rgb + ((size_t)y * m.w + (m.w - 1 - x)) * 3, 3);
    return m;
}

START_TEST(test_tta_golden)
{
    ms_model_file *g = NULL;
    ck_assert_msg(safetensors_open(&g, fixture_path("pad_resize.tta.golden.safetensors")) == MS_OK, "%s",
                  ms_last_error());
    const ms_tensor *ti = model_file_find(g, "image"), *tl = model_file_find(g, "logits"),
                    *tm = model_file_find(g, "mask");
    ck_assert(ti && tl && tm);
    ms_image img = {.h = (int)ti->shape[0], .w = (int)ti->shape[1], .rgb = (uint8_t *)ti->data};
    ms_engine *e = open_engine("pad_resize.model.safetensors");
    ms_run_options ro = {.attention = -1, .tta_flip = true};
    ms_result res = {0}, plain = {0};
    ck_assert_msg(engine_run(e, &res, &img, &ro) == MS_OK, "%s", ms_last_error());
    ck_assert(res.tta_flip);
    size_t px = (size_t)img.w * img.h, n = px * res.classes;
    ck_assert_int_eq((int)tl->shape[0], res.classes);
    const float *gl = tl->data;
    double mag = max_abs(gl, n);
    double err = max_abs_diff(res.logits, gl, n);
    ck_assert_msg(err <= TOL * (mag > 1 ? mag : 1), "TTA logits: max error %g (max |logit| %g)", err, mag);
    /* mask: where the reference's top two are closer than the tolerance either is right */
    const uint8_t *gm = tm->data;
    for (size_t p = 0; p < px; p++) {
        if (gm[p] == res.mask[p]) continue;
        double a = gl[(size_t)gm[p] * px + p], b = gl[(size_t)res.mask[p] * px + p];
        ck_assert_msg(fabs(a - b) <= 2 * TOL * (mag > 1 ? mag : 1), "mask pixel %zu: engine %d, reference %d",
                      p, res.mask[p], gm[p]);
    }
    /* not a no-op: without TTA the logits differ by far more than the tolerance */
    ro.tta_flip = false;
    ck_assert(engine_run(e, &plain, &img, &ro) == MS_OK);
    ck_assert(!plain.tta_flip);
    ck_assert_msg(max_abs_diff(plain.logits, gl, n) > 100 * TOL * (mag > 1 ? mag : 1),
                  "the TTA golden equals the plain logits: the fixture does not test TTA");
    result_free(&res);
    result_free(&plain);
    engine_free(e);
    model_file_close(g);
}
END_TEST

START_TEST(test_tta_flip_equivariant)
{
    ms_engine *e = open_engine("mita_sqrtd_conv.model.safetensors");
    ms_image img = {.w = 83, .h = 45, .rgb = malloc(83 * 45 * 3)};
    ck_assert_ptr_nonnull(img.rgb);
    for (int i = 0; i < img.w * img.h * 3; i++) img.rgb[i] = (uint8_t)((i * 97 + (i / 7) * 13) & 255);
    ms_image mir = mirror_image(&img);
    ms_run_options ro = {.attention = -1, .tta_flip = true};
    ms_result a = {0}, b = {0};
    ck_assert(engine_run(e, &a, &img, &ro) == MS_OK);
    ck_assert(engine_run(e, &b, &mir, &ro) == MS_OK);
    int w = a.w, h = a.h;
    double mag = max_abs(a.logits, (size_t)a.classes * w * h), worst = 0;
    int mism = 0;
    for (int c = 0; c < a.classes; c++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                double d = fabs(a.logits[((size_t)c * h + y) * w + x] - b.logits[((size_t)c * h + y) * w + (w - 1 - x)]);
                if (d > worst) worst = d;
            }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) mism += a.mask[(size_t)y * w + x] != b.mask[(size_t)y * w + (w - 1 - x)];
    /* the same sums in another order (the image and its mirror swap batch slots) */
    ck_assert_msg(worst <= 1e-5 * (mag > 1 ? mag : 1), "TTA(mirror) vs mirror(TTA): %g (max |logit| %g)", worst,
                  mag);
    ck_assert_int_le(mism, w * h / 1000 + 1);
    result_free(&a);
    result_free(&b);
    free(mir.rgb);
    free(img.rgb);
    engine_free(e);
}
END_TEST

/* The record comes from the unflipped image; a batch of TTA runs equals the
 * runs one at a time. */
START_TEST(test_tta_record_and_batch)
{
    ms_engine *e = open_engine("mita_d.model.safetensors");
    ms_image im[2];
    for (int k = 0; k < 2; k++) {
        im[k] = (ms_image){.w = 56, .h = 48, .rgb = malloc(56 * 48 * 3)};
        ck_assert_ptr_nonnull(im[k].rgb);
        for (int i = 0; i < 56 * 48 * 3; i++) im[k].rgb[i] = (uint8_t)((i * (31 + 8 * k) + k * 5) & 255);
    }
    ms_run_options plain = {.attention = -1, .record = true}, tta = plain;
    tta.tta_flip = true;
    ms_result p = {0}, t = {0}, bt[2] = {{0}, {0}};
    ck_assert(engine_run(e, &p, &im[0], &plain) == MS_OK);
    ck_assert(engine_run(e, &t, &im[0], &tta) == MS_OK);
    size_t routes = (size_t)p.depth * p.heads * p.n;
    /* the fixture's route gap (>= 1e-3) makes the decisions robust to the
     * batch-of-two GEMM rounding */
    ck_assert_int_eq(memcmp(p.route, t.route, routes * sizeof(int32_t)), 0);
    const ms_image *pair[2] = {&im[0], &im[1]};
    ck_assert(engine_run_batch(e, bt, pair, 2, &tta) == MS_OK);
    size_t n = (size_t)t.classes * t.h * t.w;
    double mag = max_abs(t.logits, n);
    ck_assert(max_abs_diff(bt[0].logits, t.logits, n) <= 1e-5 * (mag > 1 ? mag : 1));
    ck_assert_int_eq(memcmp(bt[0].route, t.route, routes * sizeof(int32_t)), 0);
    /* mask_only (segment's default) still averages: the same mask */
    ms_run_options tta_mask = tta;
    tta_mask.mask_only = true;
    ms_result m = {0};
    ck_assert(engine_run(e, &m, &im[0], &tta_mask) == MS_OK);
    ck_assert_int_eq(memcmp(m.mask, t.mask, (size_t)t.h * t.w), 0);
    result_free(&m);
    ms_result one = {0};
    ck_assert(engine_run(e, &one, &im[1], &tta) == MS_OK);
    ck_assert(max_abs_diff(bt[1].logits, one.logits, n) <= 1e-5 * (mag > 1 ? mag : 1));
    ck_assert_int_eq(memcmp(bt[1].route, one.route, routes * sizeof(int32_t)), 0);
    result_free(&p), result_free(&t), result_free(&bt[0]), result_free(&bt[1]), result_free(&one);
    free(im[0].rgb), free(im[1].rgb);
    engine_free(e);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tta");
    TCase *tc = tcase_create("tta");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_tta_golden);
    tcase_add_test(tc, test_tta_flip_equivariant);
    tcase_add_test(tc, test_tta_record_and_batch);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
