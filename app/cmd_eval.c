/* mitaseg eval: mIoU, mAcc and aAcc of the model on labelled images. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "batch.h"
#include "cli.h"
#include "eval.h"
#include "file_io.h"

static const char eval_help[] =
    "usage: mitaseg eval --list FILE [options]\n"
    "       mitaseg eval --images DIR --labels DIR [options]\n"
    "\n"
    "Runs the model on labelled images and accumulates one confusion matrix over\n"
    "the whole set (pixels labelled with the model's ignore index are skipped),\n"
    "then prints per-class IoU and accuracy and aAcc, mIoU, mAcc in percent.\n"
    "Classes absent from both the labels and the predictions are left out of\n"
    "mIoU; mAcc averages over the classes present in the labels.\n"
    "\n"
    "options:\n"
    "  --list FILE             lines 'IMAGE LABEL', paths relative to FILE's folder\n"
    "  --images DIR            images (PNG/JPEG, sub-folders included), paired with\n"
    "  --labels DIR            labels of the same relative name with .png\n"
    "  --json FILE             also write the metrics as JSON (with the confusion\n"
    "                          matrix in pixels)\n"
    "  --confusion             also print the confusion matrix: per labelled class\n"
    "                          (row), the % of its pixels predicted as each class\n"
    "  --worst N               also print the N images of lowest mIoU (every\n"
    "                          image's scores are in --json's per_image)\n"
    "  --limit N               only the first N pairs\n"
    "  --tile SIZE             sliding windows, logits averaged (see segment --help)\n"
    "  --overlap PX            overlap between windows (default SIZE/4)\n"
    "  -q, --quiet             no progress line\n"
    "  -h, --help              this help\n"
    "\n"
    "Labels are 8-bit grey or palette PNGs holding class ids, of the image's size.\n"
    "A pair that cannot be read is reported and left out; the exit status is then 1,\n"
    "as it is when no label pixel could be scored (all ignored or out of range).\n"
    "2: usage error (--json is checked before the run); 130/143: interrupted by\n"
    "SIGINT/SIGTERM (the metrics so far are printed if the pair in flight ends\n"
    "within half a second; else the run stops at once).\n"
    "\n";

typedef struct {
    char *image, *label; /* owned */
} pair;

typedef struct {
    pair *p;
    int n, cap;
} pair_list;

static void pairs_free(pair_list *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->p[i].image);
        free(l->p[i].label);
    }
    free(l->p);
}

static char *join(const char *dir, const char *rel)
{
    if (rel[0] == '/' || !dir || !*dir) return strdup(rel);
    size_t ld = strlen(dir);
    char *s = malloc(ld + strlen(rel) + 2);
    if (s) sprintf(s, "%s%s%s", dir, dir[ld - 1] == '/' ? "" : "/", rel);
    return s;
}

static int pairs_push(pair_list *l, char *image, char *label)
{
    if (!image || !label) goto oom;
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 256;
        pair *p = realloc(l->p, (size_t)cap * sizeof *p);
        if (!p) goto oom;
        l->p = p;
        l->cap = cap;
    }
    l->p[l->n].image = image;
    l->p[l->n++].label = label;
    return 0;
oom:
    free(image);
    free(label);
    cli_error("out of memory");
    return 1;
}

static int read_list(pair_list *l, const char *path)
{
    FILE *f;
    if (fio_fopen_list(&f, path) != MS_OK) {
        cli_error("%s", ms_last_error());
        return 1;
    }
    char *dir = strdup(path);
    if (!dir) { fclose(f); cli_error("out of memory"); return 1; }
    char *slash = strrchr(dir, '/');
    if (slash) slash[slash == dir ? 1 : 0] = '\0';
    else dir[0] = '\0';
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if ((size_t)len != strlen(line)) {
            cli_error("%s:%ld: NUL byte in a line", path, lineno);
            rc = 2;
            break;
        }
        char *save, *img = strtok_r(line, " \t\r\n", &save);
        if (!img || img[0] == '#') continue;
        char *lab = strtok_r(NULL, " \t\r\n", &save);
        if (!lab || strtok_r(NULL, " \t\r\n", &save)) {
            cli_error("%s:%ld: expected 'IMAGE LABEL'", path, lineno);
            rc = 2;
            break;
        }
        if ((rc = pairs_push(l, join(dir, img), join(dir, lab))) != 0) break;
    }
    free(line);
    free(dir);
    fclose(f);
    if (!rc && l->n == 0) {
        cli_error("%s: no 'IMAGE LABEL' lines", path);
        rc = 2;
    }
    return rc;
}

/* Images below images_dir paired with labels_dir/<same relative name>.png
 * (or the same name as is, when that exists). */
static int pair_dirs(pair_list *l, const char *images_dir, const char *labels_dir, int *listed_bad)
{
    ms_batch_list bl;
    batch_list_init(&bl);
    if (batch_add_path(&bl, images_dir, true) != MS_OK) {
        cli_error("%s", ms_last_error());
        batch_list_free(&bl);
        return 1;
    }
    batch_sort_unique(&bl);
    int rc = 0;
    /* what could not be listed (an unreadable sub-folder) is reported, and
     * makes the run's status 1 like a pair that cannot be read */
    for (int i = 0; i < bl.n_bad; i++) cli_error("%s", bl.bad[i]);
    *listed_bad = bl.n_bad;
    for (int i = 0; i < bl.n && !rc; i++) {
        char *lab = NULL;
        if (batch_output_path(&lab, labels_dir, bl.items[i].rel, ".png") != MS_OK) {
            cli_error("%s", ms_last_error());
            rc = 1;
            break;
        }
        struct stat sb;
        if (stat(lab, &sb) != 0) {
            char *same = join(labels_dir, bl.items[i].rel);
            if (same && stat(same, &sb) == 0) {
                free(lab);
                lab = same;
            } else {
                free(same);
            }
        }
        rc = pairs_push(l, strdup(bl.items[i].path), lab);
    }
    batch_list_free(&bl);
    if (!rc && l->n == 0) {
        cli_error("%s: no images", images_dir);
        rc = 2;
    }
    return rc;
}

/* One pair's pixels into one (cleared first). */
static ms_status eval_pair(ms_confusion *one, ms_engine *e, ms_result *res, uint8_t **mask,
                           size_t *mask_cap, const pair *p, const ms_run_options *opt, int tile,
                           int overlap, double *ms_engine_total)
{
    ms_image img = {0};
    uint8_t *lab = NULL;
    int lw, lh;
    ms_status st = cli_read_image(&img, p->image, e, opt, tile);
    if (st != MS_OK) return st;
    st = image_read_label(&lab, &lw, &lh, p->label);
    if (st == MS_OK && (lw != img.w || lh != img.h))
        st = ms_error(MS_ERR_FORMAT, "%s: label is %dx%d but its image %s is %dx%d", p->label,
                      lw, lh, p->image, img.w, img.h);
    if (st == MS_OK) {
        const uint8_t *pred;
        double t0 = cli_now_s();
        if (tile > 0) {
            size_t n = (size_t)img.w * img.h;
            if (n > *mask_cap) {
                free(*mask);
                *mask = malloc(n);
                *mask_cap = *mask ? n : 0;
            }
            if (!*mask) {
                st = ms_error(MS_ERR_OOM, "out of memory: a %dx%d mask", img.w, img.h);
            } else {
                st = batch_segment_tiled(*mask, e, res, opt, &img, tile, overlap);
            }
            pred = *mask;
        } else {
            st = engine_run(e, res, &img, opt);
            pred = res->mask;
            if (st == MS_OK && (res->w != img.w || res->h != img.h))
                st = ms_error(MS_ERR_ARG, "engine returned %dx%d for a %dx%d image", res->w,
                              res->h, img.w, img.h);
        }
        *ms_engine_total += (cli_now_s() - t0) * 1e3;
        if (st == MS_OK) {
            confusion_clear(one);
            confusion_add(one, lab, pred, (size_t)img.w * img.h);
        }
    }
    free(lab);
    image_free(&img);
    return st;
}

static void print_pct(double v)
{
    if (isnan(v)) printf(" %7s", "-");
    else printf(" %7.2f", 100.0 * v);
}

/* Rows = labelled class, columns = predicted class (by number), each cell
 * the % of the row's pixels; '.' for none, '-' for a row never labelled.
 * The last column is the class's predicted pixels over its labelled ones:
 * above 1, the class is painted where it is not. */
static void print_confusion(const ms_confusion *c, const ms_metrics *m,
                            const char (*names)[64])
{
    const int nc = c->n_classes;
    printf("\nconfusion: %% of each labelled class's pixels (row) predicted as each "
           "class (column)\n%-24s", "");
    for (int q = 0; q < nc; q++) printf(" %5d", q);
    printf("  pred/label\n");
    for (int l = 0; l < nc; l++) {
        char name[20];
        snprintf(name, sizeof name, "%s", names[l]);
        printf("%3d %-20s", l, name);
        for (int q = 0; q < nc; q++) {
            uint64_t v = c->cm[(size_t)l * nc + q];
            if (!m->label_px[l]) printf(" %5s", "-");
            else if (!v) printf(" %5s", ".");
            else printf(" %5.1f", 100.0 * (double)v / (double)m->label_px[l]);
        }
        if (m->label_px[l])
            printf("  %10.2f\n", (double)m->pred_px[l] / (double)m->label_px[l]);
        else
            printf("  %10s\n", "-");
    }
}

typedef struct {
    const ms_image_score *s;
    int at; /* list order, for ties */
} ranked_score;

/* mIoU ascending, undefined (no class in label or prediction) last; ties
 * in list order. */
static int score_cmp(const void *a, const void *b)
{
    const ranked_score *x = a, *y = b;
    bool nx = isnan(x->s->miou), ny = isnan(y->s->miou);
    if (nx != ny) return nx ? 1 : -1;
    if (!nx && x->s->miou != y->s->miou) return x->s->miou < y->s->miou ? -1 : 1;
    return (x->at > y->at) - (x->at < y->at);
}

/* The n images of lowest mIoU, with their aAcc. */
static void print_worst(const ms_image_score *scores, int n_scores, int n)
{
    ranked_score *r = malloc((size_t)(n_scores > 0 ? n_scores : 1) * sizeof *r);
    if (!r) return;
    for (int i = 0; i < n_scores; i++) r[i] = (ranked_score){scores + i, i};
    qsort(r, (size_t)n_scores, sizeof *r, score_cmp);
    if (n > n_scores) n = n_scores;
    printf("\n%d image%s of lowest mIoU\n%7s %7s  %s\n", n, n == 1 ? "" : "s", "mIoU", "aAcc",
           "image");
    for (int i = 0; i < n; i++) {
        print_pct(r[i].s->miou);
        print_pct(r[i].s->aacc);
        fputs("  ", stdout);
        cli_fputs_escaped(r[i].s->image, stdout);
        putchar('\n');
    }
    free(r);
}

int cmd_eval(int argc, char **argv)
{
    cli_engine_args ea;
    cli_engine_args_init(&ea);
    const char *list = NULL, *images = NULL, *labels = NULL, *json = NULL;
    int tile = 0, overlap = -1, limit = 0, worst = 0;
    bool quiet = false, confusion = false;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(eval_help, stdout);
            fputs(cli_engine_help, stdout);
            return 0;
        }
        int k = cli_parse_engine_arg(&ea, argc, argv, &i);
        if (k < 0) return 2;
        if (k > 0) continue;
        if (!strcmp(o, "-q") || !strcmp(o, "--quiet")) { quiet = true; continue; }
        if (!strcmp(o, "--confusion")) { confusion = true; continue; }
        static const char *const valued[] = {"--list", "--images", "--labels", "--json",
                                             "--tile", "--overlap", "--limit", "--worst", NULL};
        bool known = false;
        for (int q = 0; valued[q]; q++) known |= !strcmp(o, valued[q]);
        if (!known) {
            cli_error("eval: unexpected argument '%s' (see mitaseg eval --help)", o);
            return 2;
        }
        if (i + 1 >= argc) {
            cli_error("eval: %s needs a value", o);
            return 2;
        }
        const char *v = argv[++i];
        char *end;
        long n = 0;
        bool counted = !strcmp(o, "--limit") || !strcmp(o, "--worst");
        if (!strcmp(o, "--tile") || !strcmp(o, "--overlap") || counted) {
            errno = 0;
            n = strtol(v, &end, 10);
            if (errno || end == v || *end || n < 0 || n > INT_MAX ||
                (!strcmp(o, "--tile") && n < 16) || (counted && n < 1)) {
                cli_error("eval: %s: bad value '%s'", o, v);
                return 2;
            }
        }
        if (!strcmp(o, "--list")) list = v;
        else if (!strcmp(o, "--images")) images = v;
        else if (!strcmp(o, "--labels")) labels = v;
        else if (!strcmp(o, "--json")) json = v;
        else if (!strcmp(o, "--tile")) tile = (int)n;
        else if (!strcmp(o, "--overlap")) overlap = (int)n;
        else if (!strcmp(o, "--limit")) limit = (int)n;
        else if (!strcmp(o, "--worst")) worst = (int)n;
    }
    if (!list == !(images || labels) || (!list && !(images && labels))) {
        cli_error("eval: give either --list FILE or both --images DIR and --labels DIR "
                  "(see mitaseg eval --help)");
        return 2;
    }
    if (overlap >= 0 && !tile) {
        cli_error("eval: --overlap needs --tile");
        return 2;
    }
    if (tile && overlap < 0) overlap = tile / 4;
    if (tile && overlap >= tile) {
        cli_error("eval: --overlap %d must be smaller than --tile %d", overlap, tile);
        return 2;
    }

    pair_list pl = {0};
    int listed_bad = 0;
    int rc = list ? read_list(&pl, list) : pair_dirs(&pl, images, labels, &listed_bad);
    if (rc) {
        pairs_free(&pl);
        return rc;
    }
    int n_all = limit && limit < pl.n ? limit : pl.n;
    /* Every image and label is an input: --json may replace none of them,
     * and is checked (and tried) before the run, not after it. */
    for (int i = 0; i < pl.n && json; i++) {
        struct stat sb;
        const char *both[2] = {pl.p[i].image, pl.p[i].label};
        for (int k = 0; k < 2; k++)
            if (stat(both[k], &sb) == 0 && fio_note_input(both[k], &sb) != MS_OK) {
                cli_error("%s", ms_last_error());
                pairs_free(&pl);
                return 1;
            }
    }

    ms_engine *e;
    if (cli_open_engine(&e, &ea, quiet)) {
        pairs_free(&pl);
        return 1;
    }
    if (json && fio_check_writable(json) != MS_OK) {
        cli_error("eval: --json: %s", ms_last_error());
        engine_free(e);
        pairs_free(&pl);
        return 2;
    }
    const ms_config *cfg = engine_config(e);
    ms_confusion cm, one; /* the set's and one image's */
    ms_image_score *scores = calloc(n_all > 0 ? (size_t)n_all : 1, sizeof *scores);
    int n_scores = 0;
    if (!scores || confusion_init(&cm, cfg->n_classes, cfg->ignore_index) != MS_OK) {
        cli_error("%s", scores ? ms_last_error() : "out of memory: per-image scores");
        free(scores);
        engine_free(e);
        pairs_free(&pl);
        return 1;
    }
    if (confusion_init(&one, cfg->n_classes, cfg->ignore_index) != MS_OK) {
        cli_error("%s", ms_last_error());
        confusion_free(&cm);
        free(scores);
        engine_free(e);
        pairs_free(&pl);
        return 1;
    }
    cli_interrupt_graceful(); /* the pair in flight gets half a second, then the metrics so far */

    ms_result res;
    memset(&res, 0, sizeof res);
    /* Only the mask is scored: no full-size logits unless --tile sums them. */
    ms_run_options run = ea.run;
    run.mask_only = tile == 0;
    uint8_t *mask = NULL;
    size_t mask_cap = 0;
    int failed = 0, done = 0;
    double ms_engine_total = 0, t0 = cli_now_s(), last = 0;
    bool tty = isatty(STDERR_FILENO);
    for (int i = 0; i < n_all && !cli_interrupted; i++) {
        if (eval_pair(&one, e, &res, &mask, &mask_cap, &pl.p[i], &run, tile, overlap,
                      &ms_engine_total) != MS_OK) {
            if (tty && !quiet) fputs("\r\033[K", stderr);
            const char *msg = ms_last_error();
            size_t li = strlen(pl.p[i].image), ll = strlen(pl.p[i].label);
            bool named = (!strncmp(msg, pl.p[i].image, li) && msg[li] == ':') ||
                         (!strncmp(msg, pl.p[i].label, ll) && msg[ll] == ':');
            if (named) cli_error("%s", msg);
            else cli_error("%s: %s", pl.p[i].image, msg);
            failed++;
        } else {
            ms_metrics mi; /* the image's own scores, for --worst and per_image */
            if (metrics_compute(&mi, &one) != MS_OK) {
                cli_error("%s: %s", pl.p[i].image, ms_last_error());
                failed++;
            } else {
                done++;
                confusion_merge(&cm, &one);
                scores[n_scores++] = (ms_image_score){pl.p[i].image, pl.p[i].label, mi.miou,
                                                      mi.aacc, mi.labelled};
                metrics_free(&mi);
            }
        }
        double el = cli_now_s() - t0;
        if (!quiet && (tty || el - last >= 5.0)) {
            double rate = el > 0 ? (i + 1) / el : 0;
            double eta = rate > 0 ? (n_all - i - 1) / rate : 0;
            fprintf(stderr, "%s%d/%d images, %.2f images/s, ETA %d:%02d%s", tty ? "\r\033[K" : "mitaseg: ",
                    i + 1, n_all, rate, (int)eta / 60, (int)eta % 60, tty ? "" : "\n");
            fflush(stderr);
            last = el;
        }
    }
    if (tty && !quiet) fputs("\r\033[K", stderr);
    double el = cli_now_s() - t0;

    ms_metrics m;
    rc = 0;
    if (metrics_compute(&m, &cm) != MS_OK) {
        cli_error("%s", ms_last_error());
        rc = 1;
        goto out;
    }
    const char *model = cli_model_path(&ea);
    fputs("model: ", stdout);
    cli_fputs_escaped(model, stdout);
    putchar('\n');
    printf("device: %s, attention: %s", res.device_name[0] ? res.device_name : "-",
           res.attention == MS_ATTN_MITA ? "mita" : "full");
    if (res.attention == MS_ATTN_MITA && done) printf(" (landmarks %dx%d, k %d)", res.gh, res.gw, res.k);
    if (tile) printf(", tiles %d overlap %d", tile, overlap);
    if (ea.run.tta_flip) printf(", flip TTA");
    /* the working size's short side: the model's unless --short-side */
    char ss[32];
    int ssv = engine_short_side(cfg, &ea.run);
    if (ssv > 0)
        snprintf(ss, sizeof ss, "%d", ssv);
    else
        snprintf(ss, sizeof ss, "native");
    if (ea.run.short_side) printf(", short side %s", ss);
    printf("\n\n%-24s %7s %7s\n", "class", "IoU", "Acc");
    for (int k = 0; k < cfg->n_classes; k++) {
        printf("%-24s", cfg->class_names[k]);
        print_pct(m.iou[k]);
        print_pct(m.acc[k]);
        printf("\n");
    }
    printf("\n%-24s", "aAcc");
    print_pct(m.aacc);
    printf("\n%-24s", "mIoU");
    print_pct(m.miou);
    printf("\n%-24s", "mAcc");
    print_pct(m.macc);
    putchar('\n');
    /* each section: a blank line, then its lines */
    if (confusion) print_confusion(&cm, &m, cfg->class_names);
    if (worst) print_worst(scores, n_scores, worst);
    printf("\n%d image%s evaluated%s", done, done == 1 ? "" : "s",
           cli_interrupted ? " (interrupted)" : "");
    if (failed) printf(", %d failed", failed);
    printf(" in %.1f s (%.2f images/s; model %.1f ms/image)\n", el, el > 0 ? done / el : 0.0,
           done ? ms_engine_total / done : 0.0);
    if (cm.out_of_range)
        cli_error("warning: %llu labelled pixels hold values >= %d classes (not the ignore "
                  "index); they were skipped", (unsigned long long)cm.out_of_range, cfg->n_classes);
    /* Images were read but no pixel could be scored: the metrics mean
     * nothing, which is an error, not a row of dashes with exit 0. */
    bool nothing_scored = done > 0 && m.labelled == 0;
    if (nothing_scored)
        cli_error("eval: no labelled pixel to score in %d image%s: every label pixel is the "
                  "ignore index or >= %d classes (are these the labels of this model?)",
                  done, done == 1 ? "" : "s", cfg->n_classes);
    if (json) {
        char imgs[32], fl[32], secs[32], mspi[32], lm[32], topk[32];
        snprintf(imgs, sizeof imgs, "%d", done);
        snprintf(fl, sizeof fl, "%d", failed);
        snprintf(secs, sizeof secs, "%.3f", el);
        snprintf(mspi, sizeof mspi, "%.3f", done ? ms_engine_total / done : 0.0);
        snprintf(lm, sizeof lm, "%dx%d", res.gh, res.gw);
        snprintf(topk, sizeof topk, "%d", res.k);
        char tiles[32];
        snprintf(tiles, sizeof tiles, "%d", tile);
        bool mita = res.attention == MS_ATTN_MITA && done;
        const char *meta[] = {"model", model,
                              "source", list ? list : images,
                              "device", res.device_name,
                              "attention", res.attention == MS_ATTN_MITA ? "mita" : "full",
                              "images", imgs, "failed", fl, "seconds", secs,
                              "ms_per_image", mspi,
                              "interrupted", cli_interrupted ? "yes" : "no", "tile", tiles,
                              "tta", ea.run.tta_flip ? "flip" : "none", "short_side", ss,
                              /* MiTA facts last: NULL ends the list for full attention */
                              mita ? "landmarks" : NULL, lm, "topk", topk, NULL};
        if (metrics_write_json(json, &m, &cm, (const char(*)[64])cfg->class_names, meta, scores,
                               n_scores) != MS_OK) {
            cli_error("%s", ms_last_error());
            rc = 1;
        }
    }
    metrics_free(&m);
    if (!rc)
        rc = cli_interrupted ? cli_interrupt_status()
                             : (failed || listed_bad || done == 0 || nothing_scored) ? 1 : 0;
out:
    confusion_free(&cm);
    confusion_free(&one);
    free(scores);
    free(mask);
    result_free(&res);
    engine_free(e);
    pairs_free(&pl);
    return rc;
}
