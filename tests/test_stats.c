/* The per-layer statistics (app/stats.h) recomputed from a --dump: the fixture
 * model (mita_d) runs an image with MiTA and with full attention, both
 * written as dumps; the dumps are read back and every number is recomputed
 * here the slow, obvious way (sets as sorted index lists, sums in plain
 * loops) and compared with stats_compute on the live results, with
 * stats_compute on the dumps, and with `mitaseg segment --stats` ($MS_BIN).
 * Also: the sweep plan, the JSON, and atomic text output. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "app/engine.h"
#include "app/image_io.h"
#include "app/model_file.h"
#include "app/stats.h"
#include "testutil.h"

#define MODEL "mita_d.model.safetensors"
enum { IW = 61, IH = 43 };

static void setup(void) { test_dir_create("stats"); }
static void teardown(void) { test_dir_remove(); }

static ms_engine *open_engine(void)
{
    ms_engine_options eo = {.device = MS_DEV_CPU, .threads = 2};
    ms_engine *e = NULL;
    ck_assert_msg(engine_init(&e, fixture_path(MODEL), &eo) == MS_OK, "%s", ms_last_error());
    return e;
}

static void make_image(ms_image *img)
{
    img->w = IW, img->h = IH;
    img->rgb = malloc((size_t)IW * IH * 3);
    ck_assert_ptr_nonnull(img->rgb);
    for (int y = 0; y < IH; y++)
        for (int x = 0; x < IW; x++) {
            uint8_t *p = img->rgb + ((size_t)y * IW + x) * 3;
            p[0] = (uint8_t)(x * 4), p[1] = (uint8_t)(y * 5), p[2] = (uint8_t)((x * y) & 255);
        }
}

/* A dump read back: tensors copied out of the mapping. */
typedef struct {
    int depth, heads, m, k, n, dim, classes;
    int32_t *topk;      /* (depth, heads, m, k) */
    int32_t *route;     /* (depth, heads, n) */
    float *mass;        /* (depth, heads, n) */
    float *blocks;      /* (depth, n, dim) */
    uint8_t *mask;      /* (h, w) */
} dump;

static void *copy_tensor(const ms_model_file *mf, const char *name, size_t *nbytes)
{
    const ms_tensor *t = model_file_find(mf, name);
    ck_assert_msg(t != NULL, "dump lacks %s", name);
    void *p = malloc(t->nbytes);
    ck_assert_ptr_nonnull(p);
    memcpy(p, t->data, t->nbytes);
    if (nbytes) *nbytes = t->nbytes;
    return p;
}

static void dump_read(dump *d, const char *path, int depth, bool mita)
{
    memset(d, 0, sizeof *d);
    ms_model_file *mf = NULL;
    ck_assert_msg(safetensors_open(&mf, path) == MS_OK, "%s", ms_last_error());
    ck_assert_str_eq(model_file_metadata(mf, "format"), "mitaseg-dump");
    d->depth = depth;
    d->mask = copy_tensor(mf, "mask", NULL);
    const ms_tensor *b0 = model_file_find(mf, "blocks.0");
    ck_assert_msg(b0 != NULL, "the dump of a run with kept blocks has blocks.0");
    d->n = (int)b0->shape[0], d->dim = (int)b0->shape[1];
    d->blocks = malloc(sizeof(float) * depth * d->n * d->dim);
    ck_assert_ptr_nonnull(d->blocks);
    char name[64];
    for (int l = 0; l < depth; l++) {
        snprintf(name, sizeof name, "blocks.%d", l);
        const ms_tensor *t = model_file_find(mf, name);
        ck_assert_ptr_nonnull(t);
        memcpy(d->blocks + (size_t)l * d->n * d->dim, t->data, t->nbytes);
    }
    if (mita) {
        const ms_tensor *t0 = model_file_find(mf, "layers.0.topk_idx");
        ck_assert_ptr_nonnull(t0);
        d->heads = (int)t0->shape[0], d->m = (int)t0->shape[1], d->k = (int)t0->shape[2];
        size_t per = (size_t)d->heads * d->m * d->k, pr = (size_t)d->heads * d->n;
        d->topk = malloc(sizeof(int32_t) * depth * per);
        d->route = malloc(sizeof(int32_t) * depth * pr);
        d->mass = malloc(sizeof(float) * depth * pr);
        ck_assert(d->topk && d->route && d->mass);
        for (int l = 0; l < depth; l++) {
            snprintf(name, sizeof name, "layers.%d.topk_idx", l);
            memcpy(d->topk + l * per, model_file_find(mf, name)->data, per * sizeof(int32_t));
            snprintf(name, sizeof name, "layers.%d.route", l);
            memcpy(d->route + l * pr, model_file_find(mf, name)->data, pr * sizeof(int32_t));
            snprintf(name, sizeof name, "layers.%d.shared_mass", l);
            const ms_tensor *t = model_file_find(mf, name);
            ck_assert_msg(t != NULL, "dump lacks %s", name);
            memcpy(d->mass + l * pr, t->data, pr * sizeof(float));
        }
    }
    model_file_close(mf);
}

static void dump_free(dump *d)
{
    free(d->topk), free(d->route), free(d->mass), free(d->blocks), free(d->mask);
}

/* The dump as an engine result: arrays from the dump, image geometry from
 * the live run of the same image (the dump does not store it). */
static void result_from_dump(ms_result *r, const dump *d, const ms_result *geom, bool mita)
{
    *r = *geom;
    r->topk_idx = mita ? d->topk : NULL;
    r->route = mita ? d->route : NULL;
    r->shared_mass = mita ? d->mass : NULL;
    r->blocks = d->blocks;
    r->mask = d->mask;
    r->logits = NULL;
}

/* Independent recomputation: token t shows some of the image when its top-left
 * pixel lies inside the resized image. */
static bool in_image(const ms_result *g, int t)
{
    return (t / g->wp) * g->patch < g->rh && (t % g->wp) * g->patch < g->rw;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* |A n B| / |A u B| of two sorted, duplicate-free lists. */
static double jaccard_sorted(const int32_t *a, const int32_t *b, int k)
{
    int i = 0, j = 0, in = 0;
    while (i < k && j < k) {
        if (a[i] == b[j]) in++, i++, j++;
        else if (a[i] < b[j]) i++;
        else j++;
    }
    int un = 2 * k - in;
    return un ? (double)in / un : 0;
}

typedef struct {
    double pruned, pruned_head[8], share, distinct, distinct_all, jaccard, block;
} layer_ref;

static void recompute_layer(layer_ref *o, const dump *md, const dump *fd, const ms_result *g, int l)
{
    const int H = md->heads, M = md->m, K = md->k, N = md->n;
    ck_assert_int_le(H, 8);
    int *any = calloc((size_t)N, sizeof(int)), *mine = calloc((size_t)N, sizeof(int));
    int32_t *sorted = malloc(sizeof(int32_t) * M * K);
    ck_assert(any && mine && sorted);
    int tokens = 0;
    for (int t = 0; t < N; t++) tokens += in_image(g, t);
    double dsum = 0, jsum = 0, ssum = 0;
    for (int h = 0; h < H; h++) {
        memset(mine, 0, sizeof(int) * N);
        const int32_t *idx = md->topk + ((size_t)l * H + h) * M * K;
        for (int j = 0; j < M * K; j++) mine[idx[j]]++, any[idx[j]]++;
        int distinct = 0, pruned = 0;
        for (int t = 0; t < N; t++) {
            distinct += mine[t] > 0;
            pruned += in_image(g, t) && mine[t] == 0;
        }
        o->pruned_head[h] = (double)pruned / tokens;
        dsum += distinct;
        memcpy(sorted, idx, sizeof(int32_t) * M * K);
        for (int e = 0; e < M; e++) qsort(sorted + e * K, K, sizeof(int32_t), cmp_i32);
        double js = 0;
        int pairs = 0;
        for (int a = 0; a < M; a++)
            for (int b = a + 1; b < M; b++, pairs++) js += jaccard_sorted(sorted + a * K, sorted + b * K, K);
        jsum += pairs ? js / pairs : 0;
        double s = 0;
        for (int t = 0; t < N; t++)
            if (in_image(g, t)) s += md->mass[((size_t)l * H + h) * N + t];
        ssum += s / tokens;
    }
    int distinct_all = 0, pruned_all = 0;
    for (int t = 0; t < N; t++) {
        distinct_all += any[t] > 0;
        pruned_all += in_image(g, t) && any[t] == 0;
    }
    o->pruned = (double)pruned_all / tokens;
    o->distinct = dsum / H;
    o->distinct_all = distinct_all;
    o->jaccard = jsum / H;
    o->share = ssum / H;
    double num = 0, den = 0;
    for (int t = 0; t < N; t++) {
        if (!in_image(g, t)) continue;
        for (int c = 0; c < md->dim; c++) {
            double a = md->blocks[((size_t)l * N + t) * md->dim + c], b = fd->blocks[((size_t)l * N + t) * md->dim + c];
            num += (a - b) * (a - b);
            den += b * b;
        }
    }
    o->block = sqrt(num / den);
    free(any), free(mine), free(sorted);
}

static void assert_close(double got, double want, double tol, const char *what, int l)
{
    ck_assert_msg(fabs(got - want) <= tol, "%s at layer %d: %.9g, recomputed %.9g", what, l, got, want);
}

/* `mitaseg segment --stats` ($MS_BIN, the program) on img with the extra
 * options: its one JSON line, parsed; NULL when $MS_BIN is not set. */
static cJSON *segment_stats(const ms_image *img, const char *extra)
{
    const char *bin = getenv("MS_BIN");
    if (!bin || access(bin, X_OK) != 0) return NULL;
    const char *png = test_path("img.png"), *jl = test_path("s.jsonl");
    ck_assert(image_write_rgb(png, img->rgb, img->w, img->h) == MS_OK);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' segment '%s' --model '%s' --device cpu --threads 2 -q %s --stats '%s'", bin,
             png, fixture_path(MODEL), extra, jl);
    ck_assert_int_eq(system(cmd), 0);
    size_t n = 0;
    char *text = (char *)read_bytes(jl, &n);
    text[n] = '\0'; /* the spare byte */
    ck_assert_msg(n > 0 && text[n - 1] == '\n' && strchr(text, '\n') == text + n - 1, "one line per image");
    cJSON *root = cJSON_Parse(text);
    ck_assert_ptr_nonnull(root);
    free(text);
    return root;
}

START_TEST(test_stats_from_dump)
{
    ms_engine *e = open_engine();
    ms_image img = {0};
    make_image(&img);
    ms_result mr = {0}, fr = {0};
    ms_run_options mo = {.attention = MS_ATTN_MITA, .record = true, .keep_blocks = true};
    ms_run_options fo = {.attention = MS_ATTN_FULL, .keep_blocks = true};
    ck_assert_msg(engine_run(e, &mr, &img, &mo) == MS_OK, "%s", ms_last_error());
    ck_assert_msg(engine_run(e, &fr, &img, &fo) == MS_OK, "%s", ms_last_error());
    ck_assert_ptr_nonnull(mr.blocks);
    ck_assert_int_gt(mr.dim, 0);
    ck_assert_ptr_null(fr.topk_idx);
    const char *mp = test_path("mita.safetensors"), *fp = test_path("full.safetensors");
    ck_assert_msg(result_write_dump(&mr, mp) == MS_OK, "%s", ms_last_error());
    ck_assert_msg(result_write_dump(&fr, fp) == MS_OK, "%s", ms_last_error());

    ms_stats live = {0}, back = {0};
    ck_assert_msg(stats_compute(&live, &mr, &fr) == MS_OK, "%s", ms_last_error());
    dump md, fd;
    dump_read(&md, mp, mr.depth, true);
    dump_read(&fd, fp, fr.depth, false);
    ck_assert_int_eq(md.k, mr.k);
    ck_assert_int_eq(md.m, mr.m);
    ms_result mdr, fdr;
    result_from_dump(&mdr, &md, &mr, true);
    result_from_dump(&fdr, &fd, &fr, false);
    ck_assert_msg(stats_compute(&back, &mdr, &fdr) == MS_OK, "%s", ms_last_error());
    ck_assert(live.have_full && live.have_blocks && back.have_blocks);
    ck_assert_int_eq(live.picks, mr.m * mr.k);

    bool some_pruned = false, some_overlap = false;
    for (int l = 0; l < mr.depth; l++) {
        layer_ref ref;
        recompute_layer(&ref, &md, &fd, &mr, l);
        const ms_stats *ss[2] = {&live, &back};
        for (int i = 0; i < 2; i++) {
            const ms_stats *s = ss[i];
            ck_assert(s->mita[l]);
            assert_close(s->pruned[l], ref.pruned, 1e-12, "pruned", l);
            for (int h = 0; h < mr.heads; h++)
                assert_close(s->pruned_head[(size_t)l * mr.heads + h], ref.pruned_head[h], 1e-12, "pruned per head", l);
            assert_close(s->distinct[l], ref.distinct, 1e-12, "distinct", l);
            assert_close(s->distinct_all[l], ref.distinct_all, 1e-12, "distinct (any head)", l);
            assert_close(s->jaccard[l], ref.jaccard, 1e-12, "Jaccard", l);
            assert_close(s->shared_share[l], ref.share, 1e-9, "shared share", l);
            assert_close(s->block_diff[l], ref.block, 1e-9, "block rel. L2", l);
        }
        some_pruned |= ref.pruned_head[0] > 0;
        some_overlap |= ref.jaccard > 0;
        /* the counts are bounded by what the layer can hold */
        ck_assert(ref.distinct_all <= mr.n && ref.distinct <= mr.m * mr.k);
        ck_assert(ref.block > 0); /* MiTA is not full attention */
    }
    ck_assert_msg(some_pruned && some_overlap, "the fixture run should prune and overlap somewhere");
    int64_t changed = 0;
    for (int i = 0; i < IW * IH; i++) changed += md.mask[i] != fd.mask[i];
    ck_assert_int_eq(live.changed, changed);
    ck_assert_int_eq(back.changed, changed);
    ck_assert_int_eq(live.pixels, IW * IH);
    int64_t by_m = 0, by_f = 0;
    for (int c = 0; c < live.classes; c++) by_m += live.changed_mita[c], by_f += live.changed_full[c];
    ck_assert_int_eq(by_m, changed);
    ck_assert_int_eq(by_f, changed);

    /* segment --stats writes the same numbers ($MS_BIN: the program) */
    cJSON *root = segment_stats(&img, "");
    if (root) {
        const char *bin = getenv("MS_BIN"), *png = test_path("img.png"); /* segment_stats wrote it */
        char cmd[2048];
        cJSON *layers = cJSON_GetObjectItem(root, "layers");
        ck_assert_int_eq(cJSON_GetArraySize(layers), mr.depth);
        for (int l = 0; l < mr.depth; l++) {
            cJSON *o = cJSON_GetArrayItem(layers, l);
            layer_ref ref;
            recompute_layer(&ref, &md, &fd, &mr, l);
            /* the JSON rounds to 1e-6 */
            assert_close(cJSON_GetObjectItem(o, "pruned")->valuedouble, ref.pruned, 1e-6, "jsonl pruned", l);
            assert_close(cJSON_GetObjectItem(o, "jaccard")->valuedouble, ref.jaccard, 1e-6, "jsonl jaccard", l);
            assert_close(cJSON_GetObjectItem(o, "distinct_all")->valuedouble, ref.distinct_all, 1e-6, "jsonl distinct", l);
            assert_close(cJSON_GetObjectItem(o, "shared_share")->valuedouble, ref.share, 1e-5, "jsonl share", l);
            assert_close(cJSON_GetObjectItem(o, "block_rel_l2")->valuedouble, ref.block, 1e-5, "jsonl block", l);
        }
        cJSON *vf = cJSON_GetObjectItem(root, "vs_full");
        ck_assert_int_eq((int64_t)cJSON_GetObjectItem(vf, "changed")->valuedouble, changed);
        cJSON_Delete(root);
        /* refused: a full-attention run (nothing to compare), the file onto an
         * input, with --tile; each exit 2 and the input untouched */
        const char *bad[] = {"--attention full --stats '%s'", "--stats '%s'", "--tile 32 --stats '%s'"};
        for (int i = 0; i < 3; i++) {
            char opts[600];
            snprintf(opts, sizeof opts, bad[i], i == 1 ? png : test_path("bad.jsonl"));
            snprintf(cmd, sizeof cmd, "'%s' segment '%s' --model '%s' --device cpu -q %s 2>/dev/null", bin, png,
                     fixture_path(MODEL), opts);
            int rc = system(cmd);
            ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "case %d: exit %d", i, WEXITSTATUS(rc));
        }
        ms_image again = {0};
        ck_assert(image_read(&again, png) == MS_OK && again.w == IW &&
                  !memcmp(again.rgb, img.rgb, (size_t)IW * IH * 3));
        image_free(&again);
        struct stat sb;
        ck_assert_int_ne(stat(test_path("bad.jsonl"), &sb), 0);
    } else {
        fprintf(stderr, "note: MS_BIN not set; segment --stats not compared\n");
    }

    dump_free(&md), dump_free(&fd);
    stats_free(&live), stats_free(&back);
    result_free(&mr), result_free(&fr);
    image_free(&img);
    engine_free(e);
}
END_TEST

START_TEST(test_stats_needs_record)
{
    ms_engine *e = open_engine();
    ms_image img = {0};
    make_image(&img);
    ms_result fr = {0};
    ms_run_options fo = {.attention = MS_ATTN_FULL};
    ck_assert(engine_run(e, &fr, &img, &fo) == MS_OK);
    ms_stats s = {0};
    ck_assert_int_eq(stats_compute(&s, &fr, NULL), MS_ERR_ARG);
    /* without a full run: no comparison, the per-layer numbers still there */
    ms_result mr = {0};
    ms_run_options mo = {.attention = MS_ATTN_MITA, .record = true};
    ck_assert(engine_run(e, &mr, &img, &mo) == MS_OK);
    ck_assert_ptr_null(mr.blocks);
    ck_assert(stats_compute(&s, &mr, NULL) == MS_OK);
    ck_assert(!s.have_full && !s.have_blocks);
    ck_assert(isnan(s.block_diff[0]) && isfinite(s.pruned[0]));
    char *json = NULL;
    ck_assert(stats_to_json(&json, &s, &mr, "x.png", NULL, NULL, 0, false) == MS_OK);
    cJSON *root = cJSON_Parse(json);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(root, "vs_full")));
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "layers"), 0), "block_rel_l2")));
    ck_assert_ptr_null(cJSON_GetObjectItem(root, "sweep"));
    cJSON_Delete(root);
    free(json);
    stats_free(&s);
    result_free(&mr), result_free(&fr);
    image_free(&img);
    engine_free(e);
}
END_TEST

START_TEST(test_sweep_plan)
{
    ms_sweep_point p[MS_SWEEP_MAX];
    int n = stats_sweep_plan(p, 7, 7, 49, 23, 30, 690);
    ck_assert_int_eq(n, 7);
    const int ks[] = {12, 24, 49, 98, 196, 49, 49}, gs[] = {7, 7, 7, 7, 7, 6, 8};
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(p[i].k, ks[i]);
        ck_assert_int_eq(p[i].gh, gs[i]);
        ck_assert(!p[i].done);
    }
    ck_assert_str_eq(p[2].label, "k");
    /* budgets outside 1..n and grids outside the token grid are left out */
    n = stats_sweep_plan(p, 1, 1, 2, 1, 1, 4);
    ck_assert_int_eq(n, 3); /* k/2 = 1, k = 2, 2k = 4; k/4 = 0 and 4k = 8 out; no grid 0 or 2 */
    ck_assert_int_eq(p[0].k, 1);
    ck_assert_int_eq(p[2].k, 4);
    /* a sweep point run: agreement with full attention's mask */
    ms_engine *e = open_engine();
    ms_image img = {0};
    make_image(&img);
    ms_result fr = {0}, sc = {0};
    ms_run_options fo = {.attention = MS_ATTN_FULL};
    ck_assert(engine_run(e, &fr, &img, &fo) == MS_OK);
    n = stats_sweep_plan(p, 3, 3, 8, fr.hp, fr.wp, fr.n);
    ck_assert_int_ge(n, 5);
    for (int i = 0; i < n; i++) {
        ck_assert_msg(stats_run_sweep_point(&p[i], e, &sc, &img, fr.mask, &fo) == MS_OK, "%s", ms_last_error());
        size_t same = 0;
        for (int q = 0; q < IW * IH; q++) same += sc.mask[q] == fr.mask[q];
        ck_assert(p[i].done && p[i].ms > 0);
        assert_close(p[i].agreement, (double)same / (IW * IH), 1e-12, "agreement", i);
        ck_assert_int_eq(sc.k, p[i].k < fr.n ? p[i].k : fr.n);
    }
    result_free(&fr), result_free(&sc);
    image_free(&img);
    engine_free(e);
}
END_TEST

/* The runs compared with a shown run (its full-attention reference, the
 * sweep's points) run at the shown run's working size and with its TTA:
 * a reference at the model's own size has another token grid, so the
 * block differences could not be taken and the changed pixels would
 * count the resize too. */
START_TEST(test_compare_at_shown_working_size)
{
    ms_engine *e = open_engine();
    ms_image img = {0};
    make_image(&img);
    ms_result mr = {0}, fr = {0}, own = {0}, sc = {0};
    ms_run_options shown = {.attention = -1, .short_side = 96, .tta_flip = true, .record = true,
                            .keep_blocks = true, .mask_only = true};
    ck_assert_msg(engine_run(e, &mr, &img, &shown) == MS_OK, "%s", ms_last_error());
    ms_run_options fo = stats_compare_options(&shown, MS_ATTN_FULL, 0, 0, 0);
    ck_assert_int_eq(fo.attention, MS_ATTN_FULL);
    ck_assert_int_eq(fo.short_side, 96);
    ck_assert(fo.tta_flip && !fo.record && !fo.keep_blocks && !fo.mask_only);
    ck_assert(fo.gh == 0 && fo.gw == 0 && fo.topk == 0);
    fo.keep_blocks = true;
    ck_assert_msg(engine_run(e, &fr, &img, &fo) == MS_OK, "%s", ms_last_error());
    ck_assert(fr.attention == MS_ATTN_FULL && fr.tta_flip);
    ck_assert_int_eq(fr.hp, mr.hp);
    ck_assert_int_eq(fr.wp, mr.wp);
    /* the model's own working size is another grid: the test compares something */
    ms_run_options own_opt = {.attention = MS_ATTN_FULL, .keep_blocks = true};
    ck_assert(engine_run(e, &own, &img, &own_opt) == MS_OK);
    ck_assert_int_ne(own.n, mr.n);
    ms_stats st = {0};
    ck_assert_msg(stats_compute(&st, &mr, &fr) == MS_OK, "%s", ms_last_error());
    ck_assert(st.have_full && st.have_blocks);
    for (int l = 0; l < st.depth; l++) ck_assert(isfinite(st.block_diff[l]));
    /* segment --stats compares the same two runs ($MS_BIN: the program) */
    cJSON *root = segment_stats(&img, "--short-side 96 --tta flip");
    if (root) {
        char size[32], grid[32];
        snprintf(size, sizeof size, "%dx%d", mr.rw, mr.rh);
        snprintf(grid, sizeof grid, "%dx%d", mr.wp, mr.hp);
        ck_assert_str_eq(cJSON_GetObjectItem(root, "working_size")->valuestring, size);
        ck_assert_str_eq(cJSON_GetObjectItem(root, "token_grid")->valuestring, grid);
        ck_assert_str_eq(cJSON_GetObjectItem(root, "tta")->valuestring, "flip");
        ck_assert_int_eq(mr.rh, 96); /* the short side asked for */
        cJSON *layers = cJSON_GetObjectItem(root, "layers");
        ck_assert_int_eq(cJSON_GetArraySize(layers), st.depth);
        for (int l = 0; l < st.depth; l++) {
            cJSON *b = cJSON_GetObjectItem(cJSON_GetArrayItem(layers, l), "block_rel_l2");
            ck_assert_msg(cJSON_IsNumber(b), "layer %d: no block difference", l);
            assert_close(b->valuedouble, st.block_diff[l], 1e-5, "jsonl block", l);
        }
        cJSON *vf = cJSON_GetObjectItem(root, "vs_full");
        ck_assert_int_eq((int64_t)cJSON_GetObjectItem(vf, "changed")->valuedouble, st.changed);
        cJSON_Delete(root);
    }
    /* a sweep point: MiTA at its budget, the shown run's size and TTA */
    ms_sweep_point p[MS_SWEEP_MAX];
    int n = stats_sweep_plan(p, mr.gh, mr.gw, mr.k, mr.hp, mr.wp, mr.n);
    ck_assert_int_ge(n, 1);
    ck_assert_msg(stats_run_sweep_point(&p[0], e, &sc, &img, fr.mask, &shown) == MS_OK, "%s",
                  ms_last_error());
    ck_assert(sc.attention == MS_ATTN_MITA && sc.tta_flip);
    ck_assert_int_eq(sc.hp, mr.hp);
    ck_assert_int_eq(sc.wp, mr.wp);
    ck_assert_int_eq(sc.k, p[0].k);
    stats_free(&st);
    result_free(&mr), result_free(&fr), result_free(&own), result_free(&sc);
    image_free(&img);
    engine_free(e);
}
END_TEST

START_TEST(test_text_out_atomic)
{
    const char *path = test_path("out.jsonl");
    write_bytes(path, "old\n", 4);
    ms_text_out o;
    ck_assert(text_out_open(&o, path, false) == MS_OK);
    ck_assert(text_out_line(&o, "{\"a\":1}") == MS_OK);
    /* until closed the old file stands */
    size_t n = 0;
    char *t = (char *)read_bytes(path, &n);
    ck_assert_int_eq(n, 4);
    free(t);
    ck_assert(text_out_close(&o, false) == MS_OK);
    t = (char *)read_bytes(path, &n);
    ck_assert(n == 4 && !memcmp(t, "old\n", 4)); /* dropped: nothing replaced */
    free(t);
    ck_assert(text_out_open(&o, path, false) == MS_OK);
    ck_assert(text_out_line(&o, "x") == MS_OK && text_out_line(&o, "y") == MS_OK);
    ck_assert(text_out_close(&o, true) == MS_OK);
    t = (char *)read_bytes(path, &n);
    ck_assert(n == 4 && !memcmp(t, "x\ny\n", 4));
    free(t);
    /* keep_lines (a resumed run): the old lines first, then the new */
    ck_assert(text_out_open(&o, path, true) == MS_OK);
    ck_assert(text_out_line(&o, "z") == MS_OK);
    ck_assert(text_out_close(&o, true) == MS_OK);
    t = (char *)read_bytes(path, &n);
    ck_assert(n == 6 && !memcmp(t, "x\ny\nz\n", 6));
    free(t);
    /* a last line without its newline gets one */
    write_bytes(path, "p", 1);
    ck_assert(text_out_open(&o, path, true) == MS_OK);
    ck_assert(text_out_line(&o, "q") == MS_OK);
    ck_assert(text_out_close(&o, true) == MS_OK);
    t = (char *)read_bytes(path, &n);
    ck_assert(n == 4 && !memcmp(t, "p\nq\n", 4));
    free(t);
    /* no temp file left behind */
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    struct stat sb;
    ck_assert_int_ne(stat(tmp, &sb), 0);
    /* a folder that does not exist: one error naming the path */
    const char *bad = test_path("no/such/dir/s.json");
    ck_assert_int_eq(stats_write_text(bad, "{}"), MS_ERR_IO);
    assert_error_names(bad, NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("stats");
    TCase *tc = tcase_create("stats");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_stats_from_dump);
    tcase_add_test(tc, test_stats_needs_record);
    tcase_add_test(tc, test_sweep_plan);
    tcase_add_test(tc, test_compare_at_shown_working_size);
    tcase_add_test(tc, test_text_out_atomic);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
