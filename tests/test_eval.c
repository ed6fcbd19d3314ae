/* Confusion matrix and metrics against a hand-computed example. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/eval.h"
#include "testutil.h"

/* 5 classes; 255 is ignored; 9 is past the classes. Counted pixels (label, pred):
 *   (0,0) (0,0) (0,1) (0,4)  (1,1) (1,2)  (2,2) (2,1)
 * Class 3 is in neither labels nor predictions; class 4 is predicted, never
 * labelled.
 *   label px: 4 2 2 0 0   pred px: 2 3 2 0 1   tp: 2 1 1 0 0
 *   IoU: 2/4, 1/4, 1/3, -, 0      Acc: 2/4, 1/2, 1/2, -, -
 *   mIoU = (1/2 + 1/4 + 1/3 + 0) / 4 = 13/48; mAcc = 1/2; aAcc = 4/8. */
static const uint8_t label_a[] = {0, 0, 255, 0, 1};
static const uint8_t pred_a[] = {0, 0, 3, 1, 1};
static const uint8_t label_b[] = {0, 1, 9, 2, 2};
static const uint8_t pred_b[] = {4, 2, 0, 2, 1};

/* Ratios of small integers in double: exact to a few ulp. */
#define EPS 1e-12

static void fill(ms_confusion *c)
{
    ck_assert_int_eq(confusion_init(c, 5, 255), MS_OK);
    confusion_add(c, label_a, pred_a, sizeof label_a);
    confusion_add(c, label_b, pred_b, sizeof label_b);
}

START_TEST(matrix)
{
    ms_confusion c;
    fill(&c);
    ck_assert_int_eq(c.images, 2);
    ck_assert_uint_eq(c.ignored, 1);
    ck_assert_uint_eq(c.out_of_range, 1);
    const uint64_t want[5][5] = {
        {2, 1, 0, 0, 1}, {0, 1, 1, 0, 0}, {0, 1, 1, 0, 0}, {0}, {0}};
    for (int l = 0; l < 5; l++)
        for (int q = 0; q < 5; q++) ck_assert_uint_eq(c.cm[l * 5 + q], want[l][q]);
    /* an image at a time (cleared between), merged: the same matrix and
     * counters (eval's per-image scores) */
    ms_confusion one, sum;
    ck_assert_int_eq(confusion_init(&one, 5, 255), MS_OK);
    ck_assert_int_eq(confusion_init(&sum, 5, 255), MS_OK);
    confusion_add(&one, label_a, pred_a, sizeof label_a);
    confusion_merge(&sum, &one);
    confusion_clear(&one);
    confusion_add(&one, label_b, pred_b, sizeof label_b);
    confusion_merge(&sum, &one);
    ck_assert_mem_eq(sum.cm, c.cm, 25 * sizeof *c.cm);
    ck_assert_uint_eq(sum.ignored, c.ignored);
    ck_assert_uint_eq(sum.out_of_range, c.out_of_range);
    ck_assert_int_eq(sum.images, 2);
    confusion_free(&one);
    confusion_free(&sum);
    confusion_free(&c);
}
END_TEST

START_TEST(metrics)
{
    ms_confusion c;
    fill(&c);
    ms_metrics m;
    ck_assert_int_eq(metrics_compute(&m, &c), MS_OK);
    ck_assert_uint_eq(m.labelled, 8);
    ck_assert_double_eq_tol(m.iou[0], 0.5, EPS);
    ck_assert_double_eq_tol(m.iou[1], 0.25, EPS);
    ck_assert_double_eq_tol(m.iou[2], 1.0 / 3, EPS);
    ck_assert(isnan(m.iou[3]));
    ck_assert_double_eq_tol(m.iou[4], 0.0, EPS);
    ck_assert_double_eq_tol(m.acc[0], 0.5, EPS);
    ck_assert_double_eq_tol(m.acc[1], 0.5, EPS);
    ck_assert(isnan(m.acc[3]));
    ck_assert(isnan(m.acc[4]));
    ck_assert_int_eq(m.n_iou, 4);
    ck_assert_int_eq(m.n_acc, 3);
    ck_assert_double_eq_tol(m.miou, 13.0 / 48, EPS);
    ck_assert_double_eq_tol(m.macc, 0.5, EPS);
    ck_assert_double_eq_tol(m.aacc, 0.5, EPS);
    metrics_free(&m);
    confusion_free(&c);
}
END_TEST

START_TEST(perfect_and_empty)
{
    ms_confusion c;
    ck_assert_int_eq(confusion_init(&c, 3, -1), MS_OK);
    ms_metrics m;
    ck_assert_int_eq(metrics_compute(&m, &c), MS_OK);
    ck_assert(isnan(m.miou) && isnan(m.aacc) && isnan(m.macc)); /* nothing counted */
    metrics_free(&m);
    const uint8_t l[] = {0, 2, 2, 255}; /* no ignore index: 255 is out of range */
    confusion_add(&c, l, l, 4);
    ck_assert_uint_eq(c.out_of_range, 1);
    ck_assert_uint_eq(c.ignored, 0);
    ck_assert_int_eq(metrics_compute(&m, &c), MS_OK);
    ck_assert_double_eq_tol(m.miou, 1.0, EPS); /* class 1 absent: excluded, not 0 */
    ck_assert_double_eq_tol(m.macc, 1.0, EPS);
    ck_assert_int_eq(m.n_iou, 2);
    metrics_free(&m);
    confusion_free(&c);
    ck_assert_int_eq(confusion_init(&c, 0, -1), MS_ERR_ARG);
}
END_TEST

START_TEST(json)
{
    ms_confusion c;
    fill(&c);
    ms_metrics m;
    ck_assert_int_eq(metrics_compute(&m, &c), MS_OK);
    const char names[5][64] = {"Sky", "Road", "Car", "Tree", "Sign"};
    const char *meta[] = {"model", "m.safetensors", "images", "2", "landmarks", "0x0", NULL};
    char path[] = "/tmp/ms_test_eval_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    const ms_image_score scores[2] = {{"a.png", "a_L.png", 0.25, 0.5, 4},
                                      {"b.png", "b_L.png", NAN, NAN, 0}};
    ck_assert_int_eq(metrics_write_json(path, &m, &c, names, meta, scores, 2), MS_OK);
    FILE *f = fopen(path, "r");
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    unlink(path);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "model")->valuestring, "m.safetensors");
    ck_assert_double_eq(cJSON_GetObjectItem(j, "images")->valuedouble, 2);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "landmarks")->valuestring, "0x0"); /* not hex 0 */
    /* percent with 4 decimals: 13/48 = 27.083333...% */
    ck_assert_double_eq_tol(cJSON_GetObjectItem(j, "mIoU")->valuedouble, 27.0833, 1e-9);
    ck_assert_double_eq_tol(cJSON_GetObjectItem(j, "aAcc")->valuedouble, 50.0, 1e-9);
    cJSON *cls = cJSON_GetObjectItem(j, "classes");
    ck_assert_int_eq(cJSON_GetArraySize(cls), 5);
    cJSON *tree = cJSON_GetArrayItem(cls, 3);
    ck_assert_str_eq(cJSON_GetObjectItem(tree, "name")->valuestring, "Tree");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(tree, "IoU")));
    cJSON *sign = cJSON_GetArrayItem(cls, 4);
    ck_assert_double_eq(cJSON_GetObjectItem(sign, "IoU")->valuedouble, 0);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(sign, "Acc")));
    ck_assert_double_eq(cJSON_GetObjectItem(sign, "pred_pixels")->valuedouble, 1);
    /* the matrix itself (the one test "matrix" checks): row = label,
     * column = prediction, every cell */
    const double want[5][5] = {
        {2, 1, 0, 0, 1}, {0, 1, 1, 0, 0}, {0, 1, 1, 0, 0}, {0}, {0}};
    cJSON *conf = cJSON_GetObjectItem(j, "confusion");
    ck_assert_int_eq(cJSON_GetArraySize(conf), 5);
    for (int l = 0; l < 5; l++) {
        cJSON *row = cJSON_GetArrayItem(conf, l);
        ck_assert_int_eq(cJSON_GetArraySize(row), 5);
        for (int q = 0; q < 5; q++)
            ck_assert_double_eq(cJSON_GetArrayItem(row, q)->valuedouble, want[l][q]);
    }
    cJSON *px = cJSON_GetObjectItem(j, "pixels");
    ck_assert_double_eq(cJSON_GetObjectItem(px, "ignored")->valuedouble, 1);
    /* per image, in the order given; undefined scores are null */
    cJSON *per = cJSON_GetObjectItem(j, "per_image");
    ck_assert_int_eq(cJSON_GetArraySize(per), 2);
    cJSON *a = cJSON_GetArrayItem(per, 0), *b2 = cJSON_GetArrayItem(per, 1);
    ck_assert_str_eq(cJSON_GetObjectItem(a, "image")->valuestring, "a.png");
    ck_assert_str_eq(cJSON_GetObjectItem(a, "label")->valuestring, "a_L.png");
    ck_assert_double_eq(cJSON_GetObjectItem(a, "mIoU")->valuedouble, 25);
    ck_assert_double_eq(cJSON_GetObjectItem(a, "aAcc")->valuedouble, 50);
    ck_assert_double_eq(cJSON_GetObjectItem(a, "labelled")->valuedouble, 4);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(b2, "mIoU")));
    ck_assert_double_eq(cJSON_GetObjectItem(px, "label_out_of_range")->valuedouble, 1);
    cJSON_Delete(j);
    /* an unwritable place: an error naming it */
    ck_assert_int_eq(metrics_write_json("/nonexistent/dir/m.json", &m, &c, names, NULL, NULL, 0),
                     MS_ERR_IO);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "/nonexistent/dir/m.json"));
    metrics_free(&m);
    confusion_free(&c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("eval");
    TCase *tc = tcase_create("eval");
    tcase_add_test(tc, matrix);
    tcase_add_test(tc, metrics);
    tcase_add_test(tc, perfect_and_empty);
    tcase_add_test(tc, json);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
