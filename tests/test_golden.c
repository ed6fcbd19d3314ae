/* The engine against the PyTorch reference (tools/mitaseg_ref.py), stage by
 * stage, on the small random models of tests/fixtures (tools/gen_fixtures.py).
 * Goldens are computed in float64; the engine runs in float32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/engine.h"
#include "app/model_file.h"
#include "testutil.h"

/* Every stage within STAGE_TOL of its largest magnitude. Float32 against a
 * float64 reference: each op adds ~1e-7 relative error and the fixtures are
 * 4 blocks deep with 32..128-long dot products, so 1e-6..1e-5 is expected;
 * measured worst case: 7.4e-6 (the bilinear input resize). 1e-4 leaves room
 * for summation-order differences on other BLAS builds while still catching
 * any real mistake (a wrong tap, scale or resize moves values by >1e-2).
 * MS_GOLDEN_VERBOSE=1 prints every stage's error. */
#ifndef STAGE_TOL
#define STAGE_TOL 1e-4
#endif

typedef struct {
    char name[48];
    float *data;
    size_t n;
    int ndim;
    int64_t shape[4];
} stage;

typedef struct {
    stage s[2048]; /* sliding windows trace every stage once per window */
    int n;
} stage_list;

static void on_trace(void *user, const char *name, const float *data, int ndim,
                     const int64_t *shape)
{
    stage_list *l = user;
    ck_assert_int_lt(l->n, 2048);
    stage *s = &l->s[l->n++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ndim = ndim;
    s->n = 1;
    for (int i = 0; i < ndim; i++) s->n *= (size_t)(s->shape[i] = shape[i]);
    s->data = malloc(s->n * sizeof(float));
    memcpy(s->data, data, s->n * sizeof(float));
}

static void stage_list_free(stage_list *l)
{
    for (int i = 0; i < l->n; i++) free(l->s[i].data);
    l->n = 0;
}

static const ms_tensor *golden(const ms_model_file *g, const char *name)
{
    const ms_tensor *t = model_file_find(g, name);
    ck_assert_msg(t != NULL, "golden has no tensor %s", name);
    return t;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static size_t numel(const ms_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

/* Runs one fixture case and compares every stage, the MiTA records and the mask. */
static void check_case(const char *case_name)
{
    char mpath[4096], gpath[4096];
    snprintf(mpath, sizeof mpath, "%s.model.safetensors", case_name);
    snprintf(gpath, sizeof gpath, "%s.golden.safetensors", case_name);
    /* a case with a '/' is a path (MS_GOLDEN_EXTRA), else a tests/fixtures name */
    bool is_path = strchr(case_name, '/') != NULL;
    char mfull[4096], gfull[4096];
    snprintf(mfull, sizeof mfull, "%s", is_path ? mpath : fixture_path(mpath));
    snprintf(gfull, sizeof gfull, "%s", is_path ? gpath : fixture_path(gpath));
    ms_model_file *g = NULL;
    ck_assert_msg(safetensors_open(&g, gfull) == MS_OK, "%s", ms_last_error());

    ms_engine_options eo = {.device = MS_DEV_CPU, .threads = 2};
    ms_engine *e = NULL;
    ck_assert_msg(engine_init(&e, mfull, &eo) == MS_OK, "%s", ms_last_error());
    stage_list *stages = calloc(1, sizeof *stages);
    engine_set_trace(e, on_trace, stages);

    const ms_tensor *img_t = golden(g, "image");
    ck_assert_int_eq(img_t->dtype, MS_DT_U8);
    ms_image img = {.h = (int)img_t->shape[0], .w = (int)img_t->shape[1],
                    .rgb = (uint8_t *)img_t->data};
    /* Sliding windows: only the final logits and mask are golden (every
     * window traces under the same stage names), and a recording run would
     * take the whole image, so it records nothing. */
    const char *sl = model_file_metadata(g, "slide");
    bool slide = sl && !strcmp(sl, "yes");
    ms_run_options ro = {.attention = -1, .record = !slide};
    const char *att = model_file_metadata(g, "attention");
    if (att) ro.attention = strcmp(att, "full") ? MS_ATTN_MITA : MS_ATTN_FULL;
    ms_result res = {0};
    ck_assert_msg(engine_run(e, &res, &img, &ro) == MS_OK, "%s", ms_last_error());

    /* MiTA records: identical index sets and routes. */
    int mita_layers = 0;
    if (res.attention == MS_ATTN_MITA) {
        for (int i = 0; i < res.depth; i++) {
            char name[64];
            snprintf(name, sizeof name, "layers.%d.topk_idx", i);
            const ms_tensor *ti = golden(g, name);
            ck_assert_int_eq(ti->shape[0], res.heads);
            ck_assert_int_eq(ti->shape[1], res.m);
            ck_assert_int_eq(ti->shape[2], res.k);
            /* Compared as sets: neighbours inside a set can be 2e-5 apart, so
             * their order may differ with another BLAS's summation order. */
            const int32_t *gi = ti->data;
            const int32_t *ei = res.topk_idx + (size_t)i * res.heads * res.m * res.k;
            for (size_t row = 0; row < (size_t)res.heads * res.m; row++) {
                int32_t a[4096], b[4096];
                ck_assert_int_le(res.k, 4096);
                memcpy(a, gi + row * res.k, res.k * sizeof(int32_t));
                memcpy(b, ei + row * res.k, res.k * sizeof(int32_t));
                qsort(a, res.k, sizeof a[0], cmp_i32);
                qsort(b, res.k, sizeof b[0], cmp_i32);
                ck_assert_msg(!memcmp(a, b, res.k * sizeof(int32_t)),
                              "%s layer %d head %zu expert %zu: routed sets differ", case_name, i,
                              row / res.m, row % res.m);
            }
            snprintf(name, sizeof name, "layers.%d.route", i);
            const ms_tensor *tr = golden(g, name);
            const int32_t *gr = tr->data;
            size_t pr = (size_t)res.heads * (res.n + res.ncls); /* the class token last */
            ck_assert_int_eq(numel(tr), pr);
            for (size_t j = 0; j < pr; j++)
                ck_assert_msg(gr[j] == res.route[(size_t)i * pr + j],
                              "%s layer %d route[%zu]: engine %d, reference %d", case_name, i, j,
                              res.route[(size_t)i * pr + j], gr[j]);
            mita_layers++;
        }
    }

    /* Every traced stage against its golden. */
    int compared = 0;
    for (int s = 0; s < stages->n; s++) {
        const stage *st = &stages->s[s];
        if (slide && strcmp(st->name, "logits")) continue;
        const ms_tensor *t = model_file_find(g, st->name);
        ck_assert_msg(t != NULL, "%s: golden lacks stage %s", case_name, st->name);
        ck_assert_int_eq(t->dtype, MS_DT_F32);
        ck_assert_msg(numel(t) == st->n, "%s: stage %s has %zu values, golden %zu", case_name,
                      st->name, st->n, numel(t));
        for (int d = 0; d < st->ndim; d++) ck_assert_int_eq(t->shape[d], st->shape[d]);
        double err = max_abs_diff(st->data, t->data, st->n);
        double mag = max_abs(t->data, st->n);
        if (getenv("MS_GOLDEN_VERBOSE"))
            fprintf(stderr, "%-16s %-14s err %.2e  rel %.2e\n", case_name, st->name, err,
                    err / (mag > 1 ? mag : 1));
        ck_assert_msg(err <= STAGE_TOL * (mag > 1 ? mag : 1),
                      "%s: stage %s off by %.3g (max magnitude %.3g)", case_name, st->name, err,
                      mag);
        compared++;
    }
    ck_assert_msg(compared >= (slide ? 1 : 10), "%s: only %d stages traced", case_name, compared);

    /* Mask: the argmax of the logits; where the reference's top two logits
     * are closer than the logits' tolerance either class is right. */
    const ms_tensor *tm = golden(g, "mask"), *tl = golden(g, "logits");
    const uint8_t *gm = tm->data;
    const float *gl = tl->data;
    size_t px = (size_t)res.h * res.w;
    double lmag = max_abs(gl, numel(tl));
    int mism = 0;
    for (size_t p = 0; p < px; p++) {
        if (gm[p] == res.mask[p]) continue;
        double a = gl[(size_t)gm[p] * px + p], b = gl[(size_t)res.mask[p] * px + p];
        ck_assert_msg(fabs(a - b) <= 2 * STAGE_TOL * (lmag > 1 ? lmag : 1),
                      "%s: mask pixel %zu: engine %d, reference %d", case_name, p, res.mask[p],
                      gm[p]);
        mism++;
    }
    ck_assert_int_le(mism, (int)(px / 1000) + 1);

    /* The dump round-trips what the engine computed. */
    char dpath[4096];
    snprintf(dpath, sizeof dpath, "%s/mitaseg-dump-%d.safetensors",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    ck_assert_msg(result_write_dump(&res, dpath) == MS_OK, "%s", ms_last_error());
    ms_model_file *d = NULL;
    ck_assert_msg(safetensors_open(&d, dpath) == MS_OK, "%s", ms_last_error());
    const ms_tensor *dl = model_file_find(d, "logits"), *dm = model_file_find(d, "mask");
    ck_assert(dl && dm);
    ck_assert_int_eq(dl->shape[0], res.classes);
    ck_assert_int_eq(memcmp(dl->data, res.logits, px * res.classes * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(dm->data, res.mask, px), 0);
    const ms_tensor *droute = model_file_find(d, "layers.0.route");
    ck_assert_int_eq(droute != NULL, mita_layers > 0);
    if (droute) { /* mita-spec 2.7: route has N + 1 entries with a class token */
        ck_assert_int_eq(droute->shape[1], res.n + res.ncls);
        ck_assert_int_eq(memcmp(droute->data, res.route, numel(droute) * sizeof(int32_t)), 0);
    }
    model_file_close(d);
    remove(dpath);

    stage_list_free(stages);
    free(stages);
    result_free(&res);
    engine_free(e);
    model_file_close(g);
}

static const char *const cases[] = {"mita_d", "mita_sqrtd_conv", "full_none", "posgrid",
                                    "small_grid", "pad_resize", "f16", "cls_mita", "cls_full", "mmseg_pad", "slide",
                                    "stem_skips"};

START_TEST(test_case)
{
    check_case(cases[_i]);
}
END_TEST

/* Goldens made elsewhere, in the same format: MS_GOLDEN_EXTRA=DIR/CASE[:...]
 * (DIR/CASE.model.safetensors + DIR/CASE.golden.safetensors). The upstream
 * test (tools/tests/test_upstream.py) writes mmsegmentation's own stages
 * there. Unset: nothing to do. */
START_TEST(test_extra_cases)
{
    const char *env = getenv("MS_GOLDEN_EXTRA");
    if (!env || !*env) return;
    char *list = strdup(env), *save = NULL;
    for (char *c = strtok_r(list, ":", &save); c; c = strtok_r(NULL, ":", &save)) {
        if (getenv("MS_GOLDEN_VERBOSE")) fprintf(stderr, "extra case %s\n", c);
        check_case(c);
    }
    free(list);
}
END_TEST

/* A second run of the same size reuses the plan: identical output. */
START_TEST(test_rerun_identical)
{
    ms_engine_options eo = {.device = MS_DEV_CPU, .threads = 2};
    ms_engine *e = NULL;
    ck_assert_msg(engine_init(&e, fixture_path("mita_d.model.safetensors"), &eo) == MS_OK, "%s",
                  ms_last_error());
    ms_image img = {.w = 37, .h = 29};
    img.rgb = malloc((size_t)img.w * img.h * 3);
    for (int i = 0; i < img.w * img.h * 3; i++) img.rgb[i] = (uint8_t)(i * 37 + 11);
    ms_run_options ro = {.attention = -1, .record = true};
    ms_result a = {0}, b = {0};
    ck_assert(engine_run(e, &a, &img, &ro) == MS_OK);
    ck_assert(engine_run(e, &b, &img, &ro) == MS_OK);
    ck_assert_int_eq(memcmp(a.logits, b.logits, (size_t)a.classes * a.h * a.w * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(a.route, b.route, (size_t)a.depth * a.heads * a.n * 4), 0);
    /* Override of the budget at run time: k and landmarks clamp to the grid. */
    ro.gh = 50, ro.gw = 1, ro.topk = 100000;
    ck_assert(engine_run(e, &b, &img, &ro) == MS_OK);
    ck_assert_int_eq(b.gh, b.hp);
    ck_assert_int_eq(b.gw, 1);
    ck_assert_int_eq(b.k, b.n);
    result_free(&a);
    result_free(&b);
    free(img.rgb);
    engine_free(e);
}
END_TEST

/* Whole runs give the same bits at any thread count (README: "MiTA's
 * choices do not depend on the thread count"): logits, routes, routed sets
 * and shared masses at 1 to 4 threads against 1's, MiTA and full
 * attention, on model at a w x h image with structure (a ramp and a
 * checkerboard: a mask of several classes). */
static void check_same_bits_any_threads(const char *model, int w, int h)
{
    ms_image img = {.w = w, .h = h};
    img.rgb = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *px = img.rgb + ((size_t)y * w + x) * 3;
            px[0] = (uint8_t)(x * 255 / w);
            px[1] = (uint8_t)(((x / 23 + y / 17) % 2) * 200 + 20);
            px[2] = (uint8_t)(y * 255 / h ^ (x * 7));
        }
    for (int attn = 0; attn < 2; attn++) {
        ms_result one = {0};
        for (int t = 1; t <= 4; t++) {
            ms_engine_options eo = {.device = MS_DEV_CPU, .threads = t};
            ms_engine *e = NULL;
            ck_assert_msg(engine_init(&e, model, &eo) == MS_OK, "%s", ms_last_error());
            ms_run_options ro = {.attention = attn ? MS_ATTN_FULL : MS_ATTN_MITA, .record = true};
            ms_result r = {0};
            ck_assert_msg(engine_run(e, &r, &img, &ro) == MS_OK, "%s", ms_last_error());
            engine_free(e);
            if (t == 1) {
                one = r;
                continue;
            }
            size_t px = (size_t)r.h * r.w, tok = (size_t)r.depth * r.heads * (r.n + r.ncls);
            ck_assert_msg(memcmp(r.logits, one.logits, px * r.classes * sizeof(float)) == 0,
                          "%s %s: logits at %d threads differ from 1's", model,
                          attn ? "full" : "mita", t);
            ck_assert_int_eq(memcmp(r.mask, one.mask, px), 0);
            if (!attn) {
                ck_assert_int_eq(memcmp(r.route, one.route, tok * sizeof(int32_t)), 0);
                ck_assert_int_eq(memcmp(r.shared_mass, one.shared_mass, tok * sizeof(float)), 0);
                ck_assert_int_eq(memcmp(r.topk_idx, one.topk_idx,
                                        (size_t)r.depth * r.heads * r.m * r.k * sizeof(int32_t)),
                                 0);
            }
            result_free(&r);
        }
        result_free(&one);
    }
    free(img.rgb);
}

START_TEST(test_same_bits_any_threads)
{
    check_same_bits_any_threads(fixture_path("mita_d.model.safetensors"), 157, 111);
    /* The shipped model at its working size (the stem's convs in several
     * bands), not under ASan (minutes there: the fixture covers the code) */
#ifdef __SANITIZE_ADDRESS__
    return;
#endif
    const char *path = shipped_model_path();
    if (path) check_same_bits_any_threads(path, 480, 360);
}
END_TEST

/* Writes cls_mita's model with one change: config text `from` -> `to`, the
 * tensor `drop` left out, or `reshape` given shape `shape` (its first
 * numel(shape) values). Returns the engine_init status. */
static ms_status init_changed_cls(const char *path, const char *from, const char *to,
                                  const char *drop, const char *reshape, int ndim,
                                  const int64_t *shape)
{
    ms_model_file *mf = NULL;
    ck_assert_msg(model_file_open(&mf, fixture_path("cls_mita.model.safetensors")) == MS_OK, "%s",
                  ms_last_error());
    int n = model_file_count(mf), k = 0;
    ms_tensor *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) {
        const ms_tensor *src = model_file_tensor(mf, i);
        if (drop && !strcmp(src->name, drop)) continue;
        t[k] = *src;
        if (reshape && !strcmp(src->name, reshape)) {
            size_t cnt = 1;
            t[k].ndim = ndim;
            for (int d = 0; d < ndim; d++) cnt *= (size_t)(t[k].shape[d] = shape[d]);
            t[k].nbytes = cnt * sizeof(float);
        }
        k++;
    }
    const char *cfg = model_file_metadata(mf, "config");
    const char *hit = from ? strstr(cfg, from) : NULL;
    ck_assert(!from || hit);
    size_t len = strlen(cfg) + (to ? strlen(to) : 0) + 1;
    char *nc = malloc(len);
    if (hit)
        snprintf(nc, len, "%.*s%s%s", (int)(hit - cfg), cfg, to, hit + strlen(from));
    else
        snprintf(nc, len, "%s", cfg);
    const char *meta[] = {"format", "mitaseg", "format_version", "1", "config", nc, NULL};
    ck_assert_msg(safetensors_write(path, t, k, meta) == MS_OK, "%s", ms_last_error());
    free(nc);
    free(t);
    model_file_close(mf);
    ms_engine_options eo = {.device = MS_DEV_CPU, .threads = 1};
    ms_engine *e = NULL;
    ms_status st = engine_init(&e, path, &eo);
    engine_free(e);
    return st;
}

/* A class token the config and the tensors disagree on is refused with a
 * message naming the file and the tensor (model-format.md). */
START_TEST(test_cls_token_validation)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/mitaseg-cls-%d.safetensors",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    const int64_t row[2] = {1, 24}, pos_no_cls[3] = {1, 35, 24}, cls_wide[3] = {1, 1, 12};
    ck_assert(init_changed_cls(path, NULL, NULL, NULL, NULL, 0, NULL) == MS_OK);
    ck_assert(init_changed_cls(path, "\"cls_token\":true", "\"cls_token\":false", NULL, NULL, 0,
                               NULL) != MS_OK);
    assert_error_names(path, "backbone.cls_token");
    ck_assert(init_changed_cls(path, NULL, NULL, "backbone.cls_token", NULL, 0, NULL) != MS_OK);
    assert_error_names(path, "backbone.cls_token");
    ck_assert(init_changed_cls(path, NULL, NULL, NULL, "backbone.cls_token", 2, row) != MS_OK);
    assert_error_names(path, "backbone.cls_token");
    ck_assert(init_changed_cls(path, NULL, NULL, NULL, "backbone.cls_token", 3, cls_wide) != MS_OK);
    assert_error_names(path, "backbone.cls_token");
    ck_assert(init_changed_cls(path, NULL, NULL, NULL, "backbone.pos_embed", 3, pos_no_cls) !=
              MS_OK);
    assert_error_names(path, "backbone.pos_embed");
    remove(path);
}
END_TEST

START_TEST(test_missing_model)
{
    ms_engine *e = NULL;
    ck_assert(engine_init(&e, "/nonexistent/model.safetensors", NULL) != MS_OK);
    ck_assert(e == NULL);
    ck_assert_ptr_nonnull(strstr(ms_last_error(), "/nonexistent/model.safetensors"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("golden");
    TCase *tc = tcase_create("golden");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_case, 0, (int)(sizeof cases / sizeof cases[0]));
    tcase_add_test(tc, test_rerun_identical);
    tcase_add_test(tc, test_same_bits_any_threads);
    tcase_add_test(tc, test_missing_model);
    tcase_add_test(tc, test_cls_token_validation);
    tcase_add_test(tc, test_extra_cases);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
