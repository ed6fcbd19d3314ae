/* Per-layer MiTA statistics (stats.h). */
#include "stats.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void stats_free(ms_stats *st)
{
    if (!st) return;
    free(st->mita), free(st->pruned), free(st->pruned_head), free(st->shared_share);
    free(st->distinct), free(st->distinct_all), free(st->jaccard), free(st->block_diff);
    free(st->changed_mita), free(st->changed_full);
    memset(st, 0, sizeof *st);
}

/* Token n covers some of the resized image, not only padding (as the viewer). */
static bool token_in_image(const ms_result *r, int n)
{
    return (n / r->wp) * r->patch < r->rh && (n % r->wp) * r->patch < r->rw;
}

static bool has_record(const ms_result *r)
{
    return r && r->attention == MS_ATTN_MITA && r->depth > 0 && r->heads > 0 && r->layer_mita &&
           r->topk_idx && r->route && r->m > 0 && r->k > 0 && r->n > 0 && r->wp > 0 && r->patch > 0;
}

static int popcount64(uint64_t x) { return __builtin_popcountll(x); }

/* One layer: pruned fractions, distinct picks, Jaccard, shared share. words
 * = bitset words per token set; sets (m, words) and seen/any (words) scratch. */
static void layer_stats(ms_stats *st, const ms_result *r, int l, uint64_t *sets, uint64_t *seen,
                        uint64_t *any, int words)
{
    const int H = r->heads, M = r->m, K = r->k, N = r->n;
    memset(any, 0, (size_t)words * sizeof *any);
    double distinct_sum = 0, jac_sum = 0, share_sum = 0;
    for (int h = 0; h < H; h++) {
        memset(sets, 0, (size_t)M * words * sizeof *sets);
        memset(seen, 0, (size_t)words * sizeof *seen);
        const int32_t *idx = r->topk_idx + ((size_t)l * H + h) * M * K; /* (m, k) */
        for (int e = 0; e < M; e++)
            for (int j = 0; j < K; j++) {
                int t = idx[(size_t)e * K + j];
                if (t < 0 || t >= N) continue;
                sets[(size_t)e * words + t / 64] |= (uint64_t)1 << (t % 64);
            }
        for (int e = 0; e < M; e++)
            for (int w = 0; w < words; w++) seen[w] |= sets[(size_t)e * words + w];
        int distinct = 0, pruned = 0;
        for (int w = 0; w < words; w++) {
            distinct += popcount64(seen[w]);
            any[w] |= seen[w];
        }
        for (int t = 0; t < N; t++)
            if (token_in_image(r, t) && !((seen[t / 64] >> (t % 64)) & 1)) pruned++;
        st->pruned_head[(size_t)l * H + h] = st->image_tokens ? (double)pruned / st->image_tokens : 0;
        distinct_sum += distinct;
        /* mean over the m(m-1)/2 pairs; one expert alone overlaps nothing */
        double jac = 0;
        long pairs = 0;
        for (int a = 0; a < M; a++)
            for (int b = a + 1; b < M; b++) {
                int in = 0, un = 0;
                const uint64_t *sa = sets + (size_t)a * words, *sb = sets + (size_t)b * words;
                for (int w = 0; w < words; w++) {
                    in += popcount64(sa[w] & sb[w]);
                    un += popcount64(sa[w] | sb[w]);
                }
                jac += un ? (double)in / un : 0;
                pairs++;
            }
        jac_sum += pairs ? jac / pairs : 0;
        if (r->shared_mass) {
            /* rows of N + ncls: the class token (last) is not a position */
            const float *sm = r->shared_mass + ((size_t)l * H + h) * (N + r->ncls);
            double s = 0;
            for (int t = 0; t < N; t++)
                if (token_in_image(r, t)) s += sm[t];
            share_sum += st->image_tokens ? s / st->image_tokens : 0;
        }
    }
    int distinct_all = 0, pruned_all = 0;
    for (int w = 0; w < words; w++) distinct_all += popcount64(any[w]);
    for (int t = 0; t < N; t++)
        if (token_in_image(r, t) && !((any[t / 64] >> (t % 64)) & 1)) pruned_all++;
    st->pruned[l] = st->image_tokens ? (double)pruned_all / st->image_tokens : 0;
    st->distinct[l] = distinct_sum / H;
    st->distinct_all[l] = distinct_all;
    st->jaccard[l] = jac_sum / H;
    st->shared_share[l] = r->shared_mass ? share_sum / H : NAN;
}

ms_status stats_compute(ms_stats *st, const ms_result *r, const ms_result *full)
{
    stats_free(st);
    if (!has_record(r)) return ms_error(MS_ERR_ARG, "statistics need a MiTA run with its record");
    const int D = r->depth, H = r->heads;
    st->depth = D, st->heads = H, st->m = r->m, st->k = r->k, st->n = r->n;
    st->picks = r->m * r->k;
    st->classes = r->classes;
    for (int t = 0; t < r->n; t++) st->image_tokens += token_in_image(r, t);
    int words = (r->n + 63) / 64;
    st->mita = calloc((size_t)D, 1);
    st->pruned = calloc((size_t)D, sizeof(double));
    st->pruned_head = calloc((size_t)D * H, sizeof(double));
    st->shared_share = calloc((size_t)D, sizeof(double));
    st->distinct = calloc((size_t)D, sizeof(double));
    st->distinct_all = calloc((size_t)D, sizeof(double));
    st->jaccard = calloc((size_t)D, sizeof(double));
    st->block_diff = calloc((size_t)D, sizeof(double));
    st->changed_mita = calloc(r->classes > 0 ? (size_t)r->classes : 1, sizeof(int64_t));
    st->changed_full = calloc(r->classes > 0 ? (size_t)r->classes : 1, sizeof(int64_t));
    uint64_t *sets = malloc((size_t)r->m * words * sizeof(uint64_t)); /* (m, words) */
    uint64_t *seen = malloc((size_t)words * sizeof(uint64_t));
    uint64_t *any = malloc((size_t)words * sizeof(uint64_t));
    if (!st->mita || !st->pruned || !st->pruned_head || !st->shared_share || !st->distinct ||
        !st->distinct_all || !st->jaccard || !st->block_diff || !st->changed_mita || !st->changed_full ||
        !sets || !seen || !any) {
        free(sets), free(seen), free(any);
        stats_free(st);
        return ms_error(MS_ERR_OOM, "out of memory: statistics of %d layers", D);
    }
    for (int l = 0; l < D; l++) {
        st->block_diff[l] = NAN;
        st->mita[l] = r->layer_mita[l] != 0;
        if (st->mita[l]) {
            layer_stats(st, r, l, sets, seen, any, words);
        } else {
            st->pruned[l] = st->shared_share[l] = st->distinct[l] = NAN;
            st->distinct_all[l] = st->jaccard[l] = NAN;
            for (int h = 0; h < H; h++) st->pruned_head[(size_t)l * H + h] = NAN;
        }
    }
    free(sets), free(seen), free(any);

    if (full && full->mask && r->mask && full->h == r->h && full->w == r->w) {
        st->have_full = true;
        st->pixels = (int64_t)r->h * r->w;
        for (int64_t i = 0; i < st->pixels; i++) {
            int a = r->mask[i], b = full->mask[i];
            if (a == b) continue;
            st->changed++;
            if (a < st->classes) st->changed_mita[a]++;
            if (b < st->classes) st->changed_full[b]++;
        }
        if (r->blocks && full->blocks && r->dim > 0 && full->dim == r->dim && full->n == r->n &&
            full->depth == D) {
            st->have_blocks = true;
            size_t per = (size_t)r->n * r->dim;
            for (int l = 0; l < D; l++) {
                const float *a = r->blocks + l * per, *b = full->blocks + l * per; /* (n, dim) */
                double num = 0, den = 0;
                for (int t = 0; t < r->n; t++) {
                    if (!token_in_image(r, t)) continue;
                    for (int c = 0; c < r->dim; c++) {
                        double d = (double)a[(size_t)t * r->dim + c] - b[(size_t)t * r->dim + c];
                        num += d * d;
                        den += (double)b[(size_t)t * r->dim + c] * b[(size_t)t * r->dim + c];
                    }
                }
                st->block_diff[l] = den > 0 ? sqrt(num / den) : 0;
            }
        }
    }
    return MS_OK;
}

int stats_sweep_plan(ms_sweep_point *pts, int gh, int gw, int k, int hp, int wp, int n)
{
    static const struct { const char *label; int num, den; } ks[] = {
        {"k/4", 1, 4}, {"k/2", 1, 2}, {"k", 1, 1}, {"2k", 2, 1}, {"4k", 4, 1}};
    int c = 0;
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        int kk = k * ks[i].num / ks[i].den;
        if (kk < 1 || kk > n) continue;
        if (c > 0 && pts[c - 1].k == kk && pts[c - 1].gh == gh) continue;
        pts[c] = (ms_sweep_point){.gh = gh, .gw = gw, .k = kk};
        snprintf(pts[c].label, sizeof pts[c].label, "%s", ks[i].label);
        c++;
    }
    for (int d = -1; d <= 1; d += 2) {
        int a = gh + d, b = gw + d;
        if (a < 1 || b < 1 || a > hp || b > wp) continue;
        pts[c] = (ms_sweep_point){.gh = a, .gw = b, .k = k};
        snprintf(pts[c].label, sizeof pts[c].label, "grid%+d", d);
        c++;
    }
    return c;
}

ms_run_options stats_compare_options(const ms_run_options *shown, int attention, int gh, int gw, int k)
{
    return (ms_run_options){.attention = attention, .gh = gh, .gw = gw, .topk = k,
                            .short_side = shown->short_side, .tta_flip = shown->tta_flip};
}

ms_status stats_run_sweep_point(ms_sweep_point *pt, ms_engine *e, ms_result *scratch, const ms_image *img,
                                const uint8_t *full_mask, const ms_run_options *shown)
{
    ms_run_options o = stats_compare_options(shown, MS_ATTN_MITA, pt->gh, pt->gw, pt->k);
    /* twice: the first run at a new budget also sizes and allocates its
     * activation plan, which is not the time of a run */
    MS_TRY(engine_run(e, scratch, img, &o));
    MS_TRY(engine_run(e, scratch, img, &o));
    size_t n = (size_t)img->h * img->w, same = 0;
    for (size_t i = 0; i < n; i++) same += scratch->mask[i] == full_mask[i];
    pt->agreement = n ? (double)same / n : 1.0;
    pt->ms = scratch->ms_total;
    pt->done = true;
    return MS_OK;
}

/* ---- JSON --------------------------------------------------------------- */

static cJSON *num(double v)
{
    if (!isfinite(v)) return cJSON_CreateNull();
    return cJSON_CreateNumber(round(v * 1e6) / 1e6);
}

static bool add(cJSON *obj, const char *key, cJSON *item)
{
    if (!item) return false;
    cJSON_AddItemToObject(obj, key, item);
    return true;
}

static bool add_arr(cJSON *arr, cJSON *item)
{
    if (!item) return false;
    cJSON_AddItemToArray(arr, item);
    return true;
}

ms_status stats_to_json(char **out, const ms_stats *st, const ms_result *r, const char *image,
                        const char (*names)[MS_CLASS_NAME], const ms_sweep_point *sweep, int n_sweep,
                        bool pretty)
{
    *out = NULL;
    cJSON *root = cJSON_CreateObject(), *layers = cJSON_CreateArray();
    char grid[32], size[32], tokens[32];
    snprintf(grid, sizeof grid, "%dx%d", r->gh, r->gw);
    snprintf(size, sizeof size, "%dx%d", r->rw, r->rh);
    snprintf(tokens, sizeof tokens, "%dx%d", r->wp, r->hp);
    bool ok = root && layers && add(root, "image", cJSON_CreateString(image ? image : "")) &&
              add(root, "width", cJSON_CreateNumber(r->w)) && add(root, "height", cJSON_CreateNumber(r->h)) &&
              add(root, "working_size", cJSON_CreateString(size)) &&
              add(root, "token_grid", cJSON_CreateString(tokens)) &&
              add(root, "tta", cJSON_CreateString(r->tta_flip ? "flip" : "none")) &&
              add(root, "landmarks", cJSON_CreateString(grid)) && add(root, "topk", cJSON_CreateNumber(r->k)) &&
              add(root, "tokens", cJSON_CreateNumber(st->n)) &&
              add(root, "image_tokens", cJSON_CreateNumber(st->image_tokens)) &&
              add(root, "heads", cJSON_CreateNumber(st->heads)) &&
              add(root, "picks_per_head", cJSON_CreateNumber(st->picks)) &&
              add(root, "ms", num(r->ms_total));
    if (ok) cJSON_AddItemToObject(root, "layers", layers);
    else cJSON_Delete(layers);
    for (int l = 0; ok && l < st->depth; l++) {
        cJSON *o = cJSON_CreateObject(), *ph = cJSON_CreateArray();
        ok = o && ph && add_arr(layers, o) && add(o, "layer", cJSON_CreateNumber(l)) &&
             add(o, "mita", cJSON_CreateBool(st->mita[l]));
        if (!ok) {
            cJSON_Delete(ph);
            break;
        }
        cJSON_AddItemToObject(o, "pruned_per_head", ph);
        for (int h = 0; ok && h < st->heads; h++) ok = add_arr(ph, num(st->pruned_head[(size_t)l * st->heads + h]));
        ok = ok && add(o, "pruned", num(st->pruned[l])) && add(o, "shared_share", num(st->shared_share[l])) &&
             add(o, "distinct", num(st->distinct[l])) && add(o, "distinct_all", num(st->distinct_all[l])) &&
             add(o, "jaccard", num(st->jaccard[l])) &&
             add(o, "block_rel_l2", num(st->have_blocks ? st->block_diff[l] : NAN));
    }
    if (ok && st->have_full) {
        cJSON *vf = cJSON_CreateObject(), *cls = cJSON_CreateArray();
        ok = vf && cls && add(root, "vs_full", vf);
        if (ok) cJSON_AddItemToObject(vf, "classes", cls);
        else cJSON_Delete(cls);
        ok = ok && add(vf, "pixels", cJSON_CreateNumber((double)st->pixels)) &&
             add(vf, "changed", cJSON_CreateNumber((double)st->changed)) &&
             add(vf, "agreement", num(st->pixels ? 1.0 - (double)st->changed / st->pixels : 1.0));
        for (int c = 0; ok && c < st->classes; c++) {
            if (!st->changed_mita[c] && !st->changed_full[c]) continue;
            cJSON *o = cJSON_CreateObject();
            ok = o && add_arr(cls, o) && add(o, "class", cJSON_CreateNumber(c)) &&
                 add(o, "name", cJSON_CreateString(names ? names[c] : "")) &&
                 add(o, "changed_mita", cJSON_CreateNumber((double)st->changed_mita[c])) &&
                 add(o, "changed_full", cJSON_CreateNumber((double)st->changed_full[c]));
        }
    } else if (ok) {
        ok = add(root, "vs_full", cJSON_CreateNull());
    }
    if (ok && n_sweep > 0) {
        cJSON *sw = cJSON_CreateArray();
        ok = sw && add(root, "sweep", sw);
        for (int i = 0; ok && i < n_sweep; i++) {
            cJSON *o = cJSON_CreateObject();
            snprintf(grid, sizeof grid, "%dx%d", sweep[i].gh, sweep[i].gw);
            ok = o && add_arr(sw, o) && add(o, "label", cJSON_CreateString(sweep[i].label)) &&
                 add(o, "landmarks", cJSON_CreateString(grid)) && add(o, "topk", cJSON_CreateNumber(sweep[i].k)) &&
                 add(o, "agreement", num(sweep[i].done ? sweep[i].agreement : NAN)) &&
                 add(o, "ms", num(sweep[i].done ? sweep[i].ms : NAN));
        }
    }
    char *s = ok ? (pretty ? cJSON_Print(root) : cJSON_PrintUnformatted(root)) : NULL;
    cJSON_Delete(root);
    if (!s) return ms_error(MS_ERR_OOM, "out of memory: building the statistics JSON");
    *out = s;
    return MS_OK;
}

ms_status text_out_open(ms_text_out *o, const char *path, bool keep_lines)
{
    memset(o, 0, sizeof *o);
    /* the one atomic writer: refuses an input, short temp name, fsyncs */
    MS_TRY(fio_atomic_begin(&o->a, path));
    FILE *old = keep_lines ? fopen(path, "r") : NULL;
    if (old) {
        /* the lines already there come first (a resumed run adds to them) */
        char buf[1 << 16];
        size_t n;
        int lastc = '\n';
        bool ok = true;
        while (ok && (n = fread(buf, 1, sizeof buf, old)) > 0) {
            ok = fwrite(buf, 1, n, o->a.f) == n;
            lastc = buf[n - 1];
        }
        ok = ok && !ferror(old);
        if (ok && lastc != '\n') ok = fputc('\n', o->a.f) != EOF; /* a cut last line ends */
        fclose(old);
        if (!ok) {
            ms_status st = ms_error(MS_ERR_IO, "%s: cannot carry its lines over: %s", path, strerror(errno));
            text_out_close(o, false);
            return st;
        }
    }
    return MS_OK;
}

ms_status text_out_line(ms_text_out *o, const char *line)
{
    if (!o->a.f) return ms_error(MS_ERR_ARG, "text_out_line: not open");
    if (fputs(line, o->a.f) < 0 || fputc('\n', o->a.f) == EOF)
        return ms_error(MS_ERR_IO, "%s: write failed: %s", o->a.path, strerror(errno));
    return MS_OK;
}

ms_status text_out_close(ms_text_out *o, bool keep)
{
    if (!o->a.f) return MS_OK;
    ms_status st = MS_OK;
    if (keep) st = fio_atomic_commit(&o->a);
    else fio_atomic_abort(&o->a);
    memset(o, 0, sizeof *o);
    return st;
}

ms_status stats_write_text(const char *path, const char *text)
{
    ms_text_out o;
    MS_TRY(text_out_open(&o, path, false));
    ms_status st = text_out_line(&o, text);
    ms_status st2 = text_out_close(&o, st == MS_OK);
    return st != MS_OK ? st : st2;
}
