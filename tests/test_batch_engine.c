/* engine_run_batch: several same-size images in one forward pass give each
 * image the result engine_run gives it alone, on the fixture models with MiTA
 * (mita_d) and full attention (full_none). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/engine.h"
#include "app/image_resize.h"
#include "testutil.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* Batched against single logits, relative to the largest |logit|. The batch
 * runs the backbone's linears as one GEMM over B*N rows instead of N: OpenBLAS
 * picks blocking and edge micro-kernels by the row count, and gemm_cpu splits
 * rows into per-thread slabs at different boundaries, so a row's dot products
 * may be summed in another order (float32 reassociation, ~1e-7 relative per
 * op). Measured here: at most 5e-7 of the largest logit (0 for B=1); 1e-5
 * still catches a wrong slice or stride, which moves logits at the 1e-1 level. */
#define BATCH_TOL 1e-5
/* On CUDA (FP32 GEMMs) cuBLAS may also pick another algorithm, split-K
 * included, for the taller matrices; still float32 rounding, but summed over
 * more reorderings: 1e-4, and MiTA routes may then flip at near-ties, so up to
 * 1% of route entries and routed sets may differ. */
#define BATCH_TOL_CUDA 1e-4

/* stem_skips: the stem outputs the neck takes are kept per image of the batch */
static const char *const models[] = {"mita_d.model.safetensors", "full_none.model.safetensors",
                                     "stem_skips.model.safetensors"};

/* NULL (and a note) when CUDA is asked for but not usable here: a build
 * without CUDA, or a machine without a GPU. With a GPU present
 * (ms_gpu_present), not using it fails the test. */
static ms_engine *open_engine_on(const char *name, ms_device_choice dev)
{
    ms_engine_options eo = {.device = dev, .threads = 2, .fp32 = true};
    ms_engine *e = NULL;
    ms_status st = engine_init(&e, fixture_path(name), &eo);
    if (dev == MS_DEV_CUDA && st == MS_ERR_UNSUPPORTED) {
#ifdef MS_HAVE_CUDA
        ck_assert_msg(!ms_gpu_present(), "a GPU is present but CUDA is not usable: %s",
                      ms_last_error());
#endif
        fprintf(stderr, "note: no CUDA here (%s); the GPU batch case is not run\n",
                ms_last_error());
        return NULL;
    }
    ck_assert_msg(st == MS_OK, "%s", ms_last_error());
    return e;
}

static ms_engine *open_engine(const char *name) { return open_engine_on(name, MS_DEV_CPU); }

static void make_image(ms_image *img, int w, int h, uint32_t seed)
{
    img->w = w, img->h = h;
    img->rgb = malloc((size_t)w * h * 3);
    ck_assert_ptr_nonnull(img->rgb);
    uint32_t s = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < (size_t)w * h * 3; i++) {
        s = s * 1664525u + 1013904223u;
        img->rgb[i] = (uint8_t)(s >> 24);
    }
}

/* Largest minus second-largest logit at pixel p of (K, h, w) logits. */
static double top2_gap(const float *logits, int K, size_t px, size_t p)
{
    double a = -INFINITY, b = -INFINITY;
    for (int c = 0; c < K; c++) {
        double v = logits[(size_t)c * px + p];
        if (v > a) b = a, a = v;
        else if (v > b) b = v;
    }
    return a - b;
}

static int cmp_i32(const void *x, const void *y)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* got equals want as engine_run's result: geometry, logits within tol,
 * masks equal except where the top two logits are within the tolerance, and
 * the MiTA records (routed index sets, routes) equal but for a fraction
 * rec_slack of them. */
static void assert_same_result(const ms_result *got, const ms_result *want, double tol,
                               double rec_slack, const char *what)
{
    ck_assert_int_eq(got->h, want->h);
    ck_assert_int_eq(got->w, want->w);
    ck_assert_int_eq(got->n, want->n);
    ck_assert_int_eq(got->attention, want->attention);
    size_t px = (size_t)want->h * want->w, nl = (size_t)want->classes * px;
    double scale = max_abs(want->logits, nl), diff = max_abs_diff(got->logits, want->logits, nl);
    ck_assert_msg(scale > 0, "%s: all-zero logits", what);
    ck_assert_msg(diff <= tol * scale, "%s: logits differ by %g (largest %g)", what, diff, scale);
    for (size_t p = 0; p < px; p++)
        if (got->mask[p] != want->mask[p])
            ck_assert_msg(top2_gap(want->logits, want->classes, px, p) <= 2 * tol * scale,
                          "%s: mask differs at pixel %zu away from a tie", what, p);
    ck_assert_int_eq(!!got->topk_idx, !!want->topk_idx);
    if (!want->topk_idx) return;
    ck_assert_int_eq(got->m, want->m);
    ck_assert_int_eq(got->k, want->k);
    ck_assert_int_eq(memcmp(got->layer_mita, want->layer_mita, (size_t)want->depth), 0);
    size_t sets = (size_t)want->depth * want->heads * want->m, k = (size_t)want->k;
    int32_t *a = malloc(k * sizeof *a), *b = malloc(k * sizeof *b);
    size_t set_diff = 0;
    for (size_t s = 0; s < sets; s++) {
        /* one expert's routed positions, compared as sets (order among equal
         * scores is not part of the contract) */
        memcpy(a, got->topk_idx + s * k, k * sizeof *a);
        memcpy(b, want->topk_idx + s * k, k * sizeof *b);
        qsort(a, k, sizeof *a, cmp_i32);
        qsort(b, k, sizeof *b, cmp_i32);
        set_diff += memcmp(a, b, k * sizeof *a) != 0;
    }
    free(a);
    free(b);
    ck_assert_msg((double)set_diff <= rec_slack * (double)sets, "%s: %zu of %zu topk sets differ",
                  what, set_diff, sets);
    size_t nr = (size_t)want->depth * want->heads * want->n, route_diff = 0;
    for (size_t i = 0; i < nr; i++) route_diff += got->route[i] != want->route[i];
    ck_assert_msg((double)route_diff <= rec_slack * (double)nr, "%s: %zu of %zu routes differ",
                  what, route_diff, nr);
}

/* B = 1, 2, 3 images of one size against each image run alone; odd sizes so
 * the models' resize and padding paths run. On the CPU the records must be
 * identical. */
static void check_batch_matches_single(const char *model, ms_device_choice dev)
{
    ms_engine *e = open_engine_on(model, dev);
    if (!e) return;
    double tol = dev == MS_DEV_CUDA ? BATCH_TOL_CUDA : BATCH_TOL;
    double slack = dev == MS_DEV_CUDA ? 0.01 : 0.0;
    ms_run_options ro = {.attention = -1, .record = true};
    enum { MAXB = 3, W = 45, H = 37 };
    ms_image img[MAXB];
    ms_result single[MAXB];
    memset(single, 0, sizeof single);
    for (int b = 0; b < MAXB; b++) {
        make_image(&img[b], W, H, (uint32_t)(b + 1));
        ck_assert_msg(engine_run(e, &single[b], &img[b], &ro) == MS_OK, "%s", ms_last_error());
    }
    /* Different images give different logits: a batch that ran image 0
     * everywhere would not pass. */
    size_t nl = (size_t)single[0].classes * W * H;
    ck_assert(max_abs_diff(single[0].logits, single[1].logits, nl) >
              0.01 * max_abs(single[0].logits, nl));
    for (int B = 1; B <= MAXB; B++) {
        const ms_image *ptrs[MAXB];
        ms_result res[MAXB];
        memset(res, 0, sizeof res);
        for (int b = 0; b < B; b++) ptrs[b] = &img[b];
        ck_assert_msg(engine_run_batch(e, res, ptrs, B, &ro) == MS_OK, "%s", ms_last_error());
        for (int b = 0; b < B; b++) {
            char what[96];
            snprintf(what, sizeof what, "%s %s B=%d image %d", model,
                     dev == MS_DEV_CUDA ? "cuda" : "cpu", B, b);
            assert_same_result(&res[b], &single[b], tol, slack, what);
        }
        /* The second batch of this size and count reuses the plan and the
         * results' buffers, and gives the same bytes. */
        float *logits0 = res[0].logits;
        float *first = malloc(nl * sizeof(float));
        memcpy(first, res[B - 1].logits, nl * sizeof(float));
        ck_assert(engine_run_batch(e, res, ptrs, B, &ro) == MS_OK);
        ck_assert_ptr_eq(res[0].logits, logits0);
        ck_assert_int_eq(memcmp(first, res[B - 1].logits, nl * sizeof(float)), 0);
        free(first);
        for (int b = 0; b < B; b++) result_free(&res[b]);
    }
    for (int b = 0; b < MAXB; b++) {
        result_free(&single[b]);
        free(img[b].rgb);
    }
    engine_free(e);
}

START_TEST(test_batch_matches_single)
{
    check_batch_matches_single(models[_i], MS_DEV_CPU);
}
END_TEST

/* The same on a GPU where there is one (the device check runs this). */
START_TEST(test_batch_matches_single_cuda)
{
    check_batch_matches_single(models[_i], MS_DEV_CUDA);
}
END_TEST

/* Different sizes, no images, a missing image: MS_ERR_ARG, nothing run. */
START_TEST(test_batch_rejects)
{
    ms_engine *e = open_engine(models[0]);
    ms_image a, b;
    make_image(&a, 32, 24, 1);
    make_image(&b, 24, 32, 2);
    const ms_image *ptrs[2] = {&a, &b};
    ms_result res[2];
    memset(res, 0, sizeof res);
    ck_assert_int_eq(engine_run_batch(e, res, ptrs, 2, NULL), MS_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "one size"));
    ck_assert_ptr_null(res[0].logits);
    ck_assert_int_eq(engine_run_batch(e, res, ptrs, 0, NULL), MS_ERR_ARG);
    ptrs[1] = NULL;
    ck_assert_int_eq(engine_run_batch(e, res, ptrs, 2, NULL), MS_ERR_ARG);
    free(a.rgb);
    free(b.rgb);
    engine_free(e);
}
END_TEST

/* run options' short_side: the working size follows it run by run in one
 * engine (a plan per working size, not per image size), native leaves the
 * image as it is, and going back to a size gives the same bytes. */
START_TEST(test_short_side_option)
{
    ms_engine *e = open_engine(models[0]);
    ms_image img;
    enum { W = 45, H = 37 };
    make_image(&img, W, H, 3);
    const int sides[] = {24, 48, -1, 24};
    ms_result res[4];
    memset(res, 0, sizeof res);
    for (int i = 0; i < 4; i++) {
        ms_run_options ro = {.attention = -1, .short_side = sides[i]};
        ck_assert_msg(engine_run(e, &res[i], &img, &ro) == MS_OK, "%s", ms_last_error());
        int rh, rw;
        image_keep_ratio_size(&rh, &rw, H, W, sides[i] > 0 ? sides[i] : 0, 0);
        ck_assert_int_eq(res[i].rh, rh);
        ck_assert_int_eq(res[i].rw, rw);
        ck_assert_int_eq(res[i].h, H);
        ck_assert_int_eq(res[i].w, W);
    }
    ck_assert_int_eq(res[0].rh, 24);
    ck_assert_int_eq(res[1].rh, 48);
    ck_assert_int_eq(res[2].rh, H);
    size_t nl = (size_t)res[0].classes * W * H;
    ck_assert(max_abs_diff(res[0].logits, res[1].logits, nl) > 0.0f);
    ck_assert_int_eq(memcmp(res[0].logits, res[3].logits, nl * sizeof(float)), 0);
    for (int i = 0; i < 4; i++) result_free(&res[i]);
    free(img.rgb);
    engine_free(e);
}
END_TEST

#ifdef _OPENMP
typedef struct {
    ms_engine *e;
    ms_image img;
    int team; /* OpenMP's team size on the running thread, seen from the trace */
    ms_status st;
} thread_run;

static void on_trace_team(void *user, const char *name, const float *data, int ndim,
                          const int64_t *shape)
{
    (void)name, (void)data, (void)ndim, (void)shape;
    ((thread_run *)user)->team = omp_get_max_threads();
}

static void *run_on_thread(void *arg)
{
    thread_run *t = arg;
    ms_result res;
    memset(&res, 0, sizeof res);
    t->st = engine_run(t->e, &res, &t->img, NULL);
    result_free(&res);
    return NULL;
}

/* A run on another thread than engine_init's uses the engine's thread
 * count there too (OpenMP's is per thread): asked for one more than the
 * cores, which a new thread would not get by default. */
START_TEST(test_engine_threads_on_worker)
{
    int want = omp_get_num_procs() + 1;
    ms_engine_options eo = {.device = MS_DEV_CPU, .threads = want, .fp32 = true};
    thread_run t = {.team = -1};
    ck_assert_msg(engine_init(&t.e, fixture_path(models[0]), &eo) == MS_OK, "%s",
                  ms_last_error());
    make_image(&t.img, 32, 24, 3);
    engine_set_trace(t.e, on_trace_team, &t);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, run_on_thread, &t), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_msg(t.st == MS_OK, "%s", ms_last_error());
    ck_assert_int_eq(t.team, want);
    free(t.img.rgb);
    engine_free(t.e);
}
END_TEST
#endif

typedef struct {
    int logits_calls;
    float *copies[2];
    size_t n;
} trace_log;

static void on_trace(void *user, const char *name, const float *data, int ndim,
                     const int64_t *shape)
{
    trace_log *t = user;
    if (strcmp(name, "logits")) return;
    ck_assert_int_eq(ndim, 3);
    size_t n = (size_t)shape[0] * shape[1] * shape[2];
    ck_assert_int_lt(t->logits_calls, 2);
    t->copies[t->logits_calls] = malloc(n * sizeof(float));
    memcpy(t->copies[t->logits_calls], data, n * sizeof(float));
    t->n = n;
    t->logits_calls++;
}

/* In a batch the trace reports each per-image stage once per image, in order,
 * with the single-image names and shapes. */
START_TEST(test_batch_trace)
{
    ms_engine *e = open_engine(models[0]);
    trace_log t = {0};
    engine_set_trace(e, on_trace, &t);
    ms_image a, b;
    make_image(&a, 30, 20, 3);
    make_image(&b, 30, 20, 4);
    const ms_image *ptrs[2] = {&a, &b};
    ms_result res[2];
    memset(res, 0, sizeof res);
    ck_assert(engine_run_batch(e, res, ptrs, 2, NULL) == MS_OK);
    ck_assert_int_eq(t.logits_calls, 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(t.n, (size_t)res[i].classes * res[i].h * res[i].w);
        ck_assert_int_eq(memcmp(t.copies[i], res[i].logits, t.n * sizeof(float)), 0);
        free(t.copies[i]);
        result_free(&res[i]);
    }
    free(a.rgb);
    free(b.rgb);
    engine_free(e);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("batch_engine");
    TCase *tc = tcase_create("batch_engine");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_batch_matches_single, 0, (int)(sizeof models / sizeof models[0]));
    tcase_add_loop_test(tc, test_batch_matches_single_cuda, 0,
                        (int)(sizeof models / sizeof models[0]));
    tcase_add_test(tc, test_batch_rejects);
    tcase_add_test(tc, test_batch_trace);
    tcase_add_test(tc, test_short_side_option);
#ifdef _OPENMP
    tcase_add_test(tc, test_engine_threads_on_worker);
#endif
    suite_add_tcase(s, tc);
    return run_suite(s);
}
