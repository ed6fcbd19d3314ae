/* mitaseg segment: images in, one PNG mask per image out.
 *
 * A reader thread decodes the next images, one engine worker thread per
 * device (one on the CPU or a single GPU; one per GPU with --devices 0,1)
 * takes them from the shared input queue, groups up to --batch consecutive
 * same-size images into one forward pass, and a writer thread encodes and
 * writes finished masks; bounded queues join them, so PNG/JPEG work overlaps
 * the model's. The writer is the only thread that prints while the pipeline
 * runs (errors, progress). */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "batch.h"
#include "cli.h"
#include "stats.h"
#include "model_file.h"

#ifdef MS_HAVE_VIEWER
#include "viz/render.h"
#endif

/* --heatmaps canvas: the viewer's strip view at a fixed size, so files from
 * one run line up. */
enum { HEAT_W = 1600, HEAT_H = 900 };

/* --batch bound: the workers' group and image arrays are this long. */
enum { SEG_MAX_BATCH = 256 };

static const char segment_help[] =
    "usage: mitaseg segment INPUT... -o DIR [options]\n"
    "\n"
    "Writes one mask per image under DIR, at the image's size, with the image's\n"
    "base name and .png. INPUT is an image file (PNG or JPEG), a folder (its\n"
    "images; sub-folders with -r, mirrored under DIR), or - to read paths from\n"
    "standard input, one a line.\n"
    "\n"
    "inputs and outputs:\n"
    "  -o, --output DIR        where masks go (created if needed)\n"
    "  -r, --recursive         descend into sub-folders of folder inputs\n"
    "  --list FILE             paths one a line; relative paths are relative to\n"
    "                          FILE's folder (repeatable). Paths from lists and -\n"
    "                          keep their sub-folders under DIR: relative ones as\n"
    "                          written, absolute ones below the folder they share.\n"
    "  --format index|label|color\n"
    "                          index (default): 8-bit palette PNG, pixel = class id,\n"
    "                          palette = the model's colours; label: 8-bit grey class\n"
    "                          ids; color: RGB class colours\n"
    "  --overlay               also write NAME.overlay.png (image 50% class colour)\n"
    "  --heatmaps              also write NAME.heatmaps.png (per-layer expert strip)\n"
    "  --skip-existing         skip images whose outputs all exist (resume a run;\n"
    "                          outputs appear only when complete, via temp + rename)\n"
    "  --dump FILE             (one image) also write the engine's logits, mask and\n"
    "                          MiTA selections as safetensors; -o is then optional\n"
    "  --stats FILE.jsonl      also run full attention on each image and write one\n"
    "                          JSON line per image of MiTA's per-layer statistics\n"
    "                          (pruned fractions, shared-summary share, distinct\n"
    "                          picks, experts' overlap, block-output difference and\n"
    "                          pixels changed against full attention); -o is then\n"
    "                          optional. With --dump, the dump holds the block\n"
    "                          outputs too; with --skip-existing the file's lines\n"
    "                          are kept and the new ones added\n"
    "\n"
    "large images:\n"
    "  --tile SIZE             run SIZExSIZE windows of the input image (each\n"
    "                          resized by the model like a whole image) and average\n"
    "                          the logits where they overlap; by default a large\n"
    "                          image is resized to the model's working size, never\n"
    "                          cropped (a model file with input.slide, e.g. one\n"
    "                          converted from mmseg, runs its own windows there)\n"
    "  --overlap PX            overlap between windows (default SIZE/4)\n"
    "\n"
    "scale and throughput:\n"
    "  --shard I/N             process only the sorted inputs at positions p with\n"
    "                          p % N == I-1 (I is 1-based); N processes given the\n"
    "                          same inputs split them without overlap\n"
    "  --batch B               run up to B consecutive same-size images in one\n"
    "                          forward pass (bigger matrix products; most useful on\n"
    "                          a GPU); an image of another size starts a new batch.\n"
    "                          Decoding and writing overlap the model's work either\n"
    "                          way. --tile runs windows one at a time\n"
    "  --devices LIST          GPUs to use, e.g. 0,1 (counted within\n"
    "                          CUDA_VISIBLE_DEVICES): one engine per GPU, each on\n"
    "                          its own thread, sharing the inputs and the writer.\n"
    "                          Implies --device cuda; an error (exit 2) before any\n"
    "                          work when a listed GPU is not usable. Across machines\n"
    "                          use --shard\n"
    "  -q, --quiet             no progress and no summary (errors still printed)\n"
    "\n"
    "Inputs are never overwritten: an output that would replace an input is an\n"
    "error for that image. A file that cannot be read is reported on one line\n"
    "(\"mitaseg: PATH: reason\") and the run goes on. Exit status: 0 all done, 1 some\n"
    "failed, 2 usage error, 130/143 interrupted by SIGINT/SIGTERM (finished\n"
    "outputs are kept; the images in flight get half a second to finish, then\n"
    "the run stops at once, leaving no temporary file).\n"
    "\n";

typedef enum { FMT_INDEX, FMT_LABEL, FMT_COLOR } out_format;

typedef struct {
    cli_engine_args eng;
    const char *out_dir;
    out_format format;
    bool overlay, heatmaps, recursive, skip_existing, quiet, read_stdin;
    const char *dump;
    const char *stats;    /* --stats FILE.jsonl */
    int tile, overlap;
    int shard_i, shard_n;
    int batch;
    int devices[64];      /* --devices ids (n_devices), in the order given */
    int n_devices;        /* 0: no --devices, one engine on the chosen device */
    const char **inputs;  /* (n_inputs) */
    int n_inputs;
    const char **lists;   /* (n_lists) */
    int n_lists;
} seg_args;

/* ---- stopping ---- */

/* Set when the threads could not start; an interrupt sets cli_interrupted
 * (cli.h), after which the run has half a second to finish the images in flight. */
static volatile sig_atomic_t g_stop;
#define STOPPING() (g_stop || cli_interrupted)

/* ---- jobs and queues ---- */

typedef enum { JOB_RUN, JOB_SKIP, JOB_FAIL } job_kind;

typedef struct {
    int item;               /* index into the full list */
    job_kind kind;
    char *error;            /* JOB_FAIL: the reason (owned) */
    ms_image img;           /* decoded input (kept for --overlay/--heatmaps) */
    uint8_t *mask;          /* (h, w) */
    ms_result *rec;         /* --heatmaps: the engine's record (owned) */
    char *stats_line;       /* --stats: this image's JSON line (owned) */
} job;

typedef struct {
    job **q;                /* (cap) ring */
    int cap, head, count;
    bool closed;
    pthread_mutex_t mu;
    pthread_cond_t can_put, can_get;
} job_queue;

static int queue_init(job_queue *jq, int cap)
{
    memset(jq, 0, sizeof *jq);
    jq->q = calloc((size_t)cap, sizeof *jq->q);
    if (!jq->q) return -1;
    jq->cap = cap;
    pthread_mutex_init(&jq->mu, NULL);
    pthread_cond_init(&jq->can_put, NULL);
    pthread_cond_init(&jq->can_get, NULL);
    return 0;
}

static void queue_free(job_queue *jq)
{
    pthread_mutex_destroy(&jq->mu);
    pthread_cond_destroy(&jq->can_put);
    pthread_cond_destroy(&jq->can_get);
    free(jq->q);
}

static void queue_put(job_queue *jq, job *j)
{
    pthread_mutex_lock(&jq->mu);
    while (jq->count == jq->cap) pthread_cond_wait(&jq->can_put, &jq->mu);
    jq->q[(jq->head + jq->count++) % jq->cap] = j;
    pthread_cond_signal(&jq->can_get);
    pthread_mutex_unlock(&jq->mu);
}

/* NULL once closed and drained. */
static job *queue_get(job_queue *jq)
{
    pthread_mutex_lock(&jq->mu);
    while (jq->count == 0 && !jq->closed) pthread_cond_wait(&jq->can_get, &jq->mu);
    job *j = NULL;
    if (jq->count) {
        j = jq->q[jq->head];
        jq->head = (jq->head + 1) % jq->cap;
        jq->count--;
        pthread_cond_signal(&jq->can_put);
    }
    pthread_mutex_unlock(&jq->mu);
    return j;
}

static void queue_close(job_queue *jq)
{
    pthread_mutex_lock(&jq->mu);
    jq->closed = true;
    pthread_cond_broadcast(&jq->can_get);
    pthread_mutex_unlock(&jq->mu);
}

static void job_free(job *j)
{
    if (!j) return;
    free(j->error);
    image_free(&j->img);
    free(j->mask);
    free(j->stats_line);
    if (j->rec) {
        result_free(j->rec);
        free(j->rec);
    }
    free(j);
}

static char *fmt_dup(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *fmt_dup(const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s) vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

static void job_fail(job *j, const char *msg)
{
    j->kind = JOB_FAIL;
    free(j->error);
    j->error = fmt_dup("%s", msg);
}

/* ---- the plan: every input's outputs, decided before anything runs ---- */

enum { OUT_MASK, OUT_OVERLAY, OUT_HEAT, N_OUT };
static const char *const out_suffix[N_OUT] = {".png", ".overlay.png", ".heatmaps.png"};

typedef struct {
    ms_batch_list list;
    char **out;             /* (list.n, N_OUT), NULL where not requested */
    char **plan_error;      /* (list.n) reason this input will not run, or NULL */
    int *order;             /* (n_todo) items of this shard, in list order */
    int n_todo;
} seg_plan;

static void plan_free(seg_plan *p)
{
    for (int i = 0; i < p->list.n; i++) {
        if (p->out)
            for (int k = 0; k < N_OUT; k++) free(p->out[i * N_OUT + k]);
        if (p->plan_error) free(p->plan_error[i]);
    }
    free(p->out);
    free(p->plan_error);
    free(p->order);
    batch_list_free(&p->list);
}

/* ---- shared state of one run ---- */

typedef struct {
    const seg_args *a;
    seg_plan *plan;
    const ms_config *cfg;   /* engine 0's; every engine loads the same model */
    ms_engine *e0;          /* engine 0: the reader checks each image's memory
                             * against it before decoding */
    ms_run_options run_opt; /* segment_run_options */
    job_queue read_q, write_q;
    /* writer-owned counters */
    int done, failed, skipped, total;
    double t0;
    double last_line;
    bool tty;
    ms_text_out stats_out;  /* --stats lines, in the writer's order */
#ifdef MS_HAVE_VIEWER
    viz_font *font;         /* --heatmaps labels; NULL: none */
#endif
    bool bar_shown;
    int unread;             /* images the reader could not take on (out of memory) */
} seg_run;

static void fmt_eta(char *buf, size_t n, double s)
{
    if (!(s >= 0) || s > 359999) {
        snprintf(buf, n, "--:--");
        return;
    }
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%d:%02d", t / 60, t % 60);
}

static void clear_bar(seg_run *r)
{
    if (r->bar_shown) {
        fputs("\r\033[K", stderr);
        r->bar_shown = false;
    }
}

static void show_progress(seg_run *r, bool final)
{
    if (r->a->quiet) return;
    int processed = r->done + r->failed + r->skipped;
    double el = cli_now_s() - r->t0;
    int worked = r->done + r->failed;
    double rate = el > 0 ? worked / el : 0;
    char eta[32];
    fmt_eta(eta, sizeof eta, rate > 0 ? (r->total - processed) / rate : -1);
    if (r->tty) {
        int width = 30, fill = r->total ? (int)((long)width * processed / r->total) : width;
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        fprintf(stderr, "\r\033[K[%s] %d/%d  %.1f images/s  ETA %s", bar, processed, r->total,
                rate, eta);
        r->bar_shown = true;
        if (final) clear_bar(r);
        fflush(stderr);
    } else if (!final && (el - r->last_line >= 5.0)) {
        /* Logs: a line every 5 s, not one per image. */
        fprintf(stderr, "mitaseg: %d/%d images, %.1f images/s, ETA %s\n", processed, r->total,
                rate, eta);
        r->last_line = el;
    }
}

static void report_error(seg_run *r, const char *path, const char *msg)
{
    clear_bar(r);
    /* Library messages about a file already start with its path. */
    size_t lp = strlen(path);
    if (!strncmp(msg, path, lp) && msg[lp] == ':') cli_error("%s", msg);
    else cli_error("%s: %s", path, msg);
}

/* ---- reader ---- */

static bool outputs_done(const seg_plan *p, int item)
{
    for (int k = 0; k < N_OUT; k++) {
        const char *o = p->out[item * N_OUT + k];
        if (o && !batch_output_done(o)) return false;
    }
    return true;
}

static void *reader_main(void *arg)
{
    seg_run *r = arg;
    seg_plan *p = r->plan;
    for (int t = 0; t < p->n_todo && !STOPPING(); t++) {
        int it = p->order[t];
        job *j = calloc(1, sizeof *j);
        if (!j) { /* out of memory: stop feeding; the main thread reports what was not read */
            r->unread = p->n_todo - t;
            break;
        }
        j->item = it;
        j->kind = JOB_RUN;
        if (p->plan_error[it]) {
            job_fail(j, p->plan_error[it]);
        } else if (r->a->skip_existing && r->a->out_dir && outputs_done(p, it)) {
            j->kind = JOB_SKIP;
        } else if (cli_read_image(&j->img, p->list.items[it].path, r->e0, &r->run_opt,
                                  r->a->tile) != MS_OK) {
            job_fail(j, ms_last_error());
        }
        queue_put(&r->read_q, j);
    }
    queue_close(&r->read_q);
    return NULL;
}

/* ---- writer ---- */

static ms_status write_outputs(seg_run *r, job *j)
{
    const seg_plan *p = r->plan;
    const ms_config *cfg = r->cfg;
    int w = j->img.w, h = j->img.h;
    size_t n = (size_t)w * h;
    const char *mpath = p->out[j->item * N_OUT + OUT_MASK];
    if (!mpath) return MS_OK; /* --dump only */
    MS_TRY(batch_make_parent_dirs(mpath));
    ms_status st = MS_OK;
    uint8_t *rgb = NULL;
    if (r->a->format == FMT_COLOR || r->a->overlay) {
        rgb = malloc(n * 3);
        MS_CHECK_ALLOC(rgb, n * 3);
    }
    switch (r->a->format) {
    case FMT_INDEX:
        st = image_write_indexed(mpath, j->mask, w, h, (const uint8_t(*)[3])cfg->palette,
                                 cfg->n_classes);
        break;
    case FMT_LABEL:
        st = image_write_gray(mpath, j->mask, w, h);
        break;
    case FMT_COLOR:
        batch_colorize(rgb, j->mask, n, (const uint8_t(*)[3])cfg->palette, cfg->n_classes);
        st = image_write_rgb(mpath, rgb, w, h);
        break;
    }
    if (st == MS_OK && r->a->overlay) {
        batch_blend(rgb, j->img.rgb, j->mask, n, (const uint8_t(*)[3])cfg->palette,
                    cfg->n_classes);
        st = image_write_rgb(p->out[j->item * N_OUT + OUT_OVERLAY], rgb, w, h);
    }
#ifdef MS_HAVE_VIEWER
    if (st == MS_OK && r->a->heatmaps) {
        viz_state vs;
        viz_state_init(&vs);
        vs.img = &j->img;
        vs.res = j->rec;
        vs.n_classes = cfg->n_classes;
        vs.class_names = (const char(*)[MS_CLASS_NAME])cfg->class_names;
        vs.palette = (const uint8_t(*)[3])cfg->palette;
        vs.view = VIZ_STRIP;
        vs.font = r->font;
        vs.status = r->plan->list.items[j->item].path;
        uint8_t *rgba = malloc((size_t)HEAT_W * HEAT_H * 4);
        if (!rgba) {
            st = ms_error(MS_ERR_OOM, "out of memory: a %dx%d heatmap canvas", HEAT_W, HEAT_H);
        } else {
            viz_render(rgba, HEAT_W, HEAT_H, &vs);
            st = image_write_rgba(p->out[j->item * N_OUT + OUT_HEAT], rgba, HEAT_W, HEAT_H);
            free(rgba);
        }
    }
#endif
    free(rgb);
    return st;
}

static void *writer_main(void *arg)
{
    seg_run *r = arg;
    job *j;
    while ((j = queue_get(&r->write_q)) != NULL) {
        const char *path = r->plan->list.items[j->item].path;
        if (j->kind == JOB_SKIP) {
            r->skipped++;
        } else if (j->kind == JOB_FAIL) {
            report_error(r, path, j->error ? j->error : "failed");
            r->failed++;
        } else if (write_outputs(r, j) != MS_OK ||
                   (j->stats_line && text_out_line(&r->stats_out, j->stats_line) != MS_OK)) {
            report_error(r, path, ms_last_error());
            r->failed++;
        } else {
            r->done++;
        }
        job_free(j);
        show_progress(r, false);
    }
    return NULL;
}

/* ---- engines ---- */

/* One engine and the thread that feeds it. */
typedef struct {
    seg_run *r;
    ms_engine *e;
    ms_result *res;         /* (a->batch) results, reused batch after batch */
    ms_result full;         /* --stats: the full-attention run of one image */
    ms_stats stats;
    pthread_t thread;
    bool started;
} seg_worker;

/* What segment asks of the engine: the record for --dump, --heatmaps and
 * --stats, every block's output for --stats,
 * full-size logits only for --dump and --tile (the mask alone is written
 * otherwise, so none are kept: memory stays bounded for huge images). */
static ms_run_options segment_run_options(const seg_args *a)
{
    ms_run_options opt = a->eng.run;
    opt.record = a->dump != NULL || a->heatmaps || a->stats;
    opt.keep_blocks = a->stats != NULL;
    opt.mask_only = a->dump == NULL && a->tile == 0;
    return opt;
}

/* Runs n same-size images (n == 1 with --tile) through the engine and gives
 * each job its mask (and, for --heatmaps, its record). */
static ms_status segment_group(job **group, int n, seg_worker *w, const seg_args *a)
{
    for (int b = 0; b < n; b++) {
        size_t px = (size_t)group[b]->img.w * group[b]->img.h;
        group[b]->mask = malloc(px ? px : 1);
        MS_CHECK_ALLOC(group[b]->mask, px);
    }
    ms_run_options opt = segment_run_options(a);
    if (a->tile > 0)
        return batch_segment_tiled(group[0]->mask, w->e, &w->res[0], &opt, &group[0]->img,
                                   a->tile, a->overlap);
    const ms_image *imgs[SEG_MAX_BATCH];
    for (int b = 0; b < n; b++) imgs[b] = &group[b]->img;
    MS_TRY(engine_run_batch(w->e, w->res, imgs, n, &opt));
    for (int b = 0; b < n; b++) {
        job *j = group[b];
        ms_result *res = &w->res[b];
        if (res->w != j->img.w || res->h != j->img.h)
            return ms_error(MS_ERR_ARG, "engine returned a %dx%d mask for a %dx%d image", res->w,
                            res->h, j->img.w, j->img.h);
        memcpy(j->mask, res->mask, (size_t)j->img.w * j->img.h);
        if (a->dump) MS_TRY(result_write_dump(res, a->dump));
        if (a->stats) {
            ms_run_options fo = stats_compare_options(&opt, MS_ATTN_FULL, 0, 0, 0);
            fo.keep_blocks = true;
            MS_TRY(engine_run(w->e, &w->full, &j->img, &fo));
            MS_TRY(stats_compute(&w->stats, res, &w->full));
            const ms_config *cfg = engine_config(w->e);
            MS_TRY(stats_to_json(&j->stats_line, &w->stats, res, w->r->plan->list.items[j->item].path,
                                 cfg->class_names, NULL, 0, false));
        }
        if (a->heatmaps) {
            /* The viewer's strip needs the record after res is reused: hand it over. */
            j->rec = malloc(sizeof *j->rec);
            MS_CHECK_ALLOC(j->rec, sizeof *j->rec);
            *j->rec = *res;
            memset(res, 0, sizeof *res);
        }
    }
    return MS_OK;
}

/* Runs a group and passes its jobs on to the writer. */
static void finish_group(job **group, int n, seg_worker *w)
{
    const seg_args *a = w->r->a;
    if (STOPPING()) { /* interrupted: drop what is not started */
        for (int b = 0; b < n; b++) job_free(group[b]);
        return;
    }
    if (segment_group(group, n, w, a) != MS_OK) {
        const char *msg = ms_last_error(); /* per thread: this worker's error */
        for (int b = 0; b < n; b++) job_fail(group[b], msg);
    }
    for (int b = 0; b < n; b++) {
        job *j = group[b];
        if (!a->overlay && !a->heatmaps && j->kind == JOB_RUN) {
            /* only the size is needed from here on */
            free(j->img.rgb);
            j->img.rgb = NULL;
        }
        queue_put(&w->r->write_q, j);
    }
}

/* A worker: takes decoded images from the shared input queue, groups up to
 * --batch consecutive same-size ones (another size, or the end of the input,
 * closes the group), runs each group in one forward pass. Skipped and failed
 * jobs go straight to the writer. */
static void *worker_main(void *arg)
{
    seg_worker *w = arg;
    seg_run *r = w->r;
    const int cap = r->a->tile > 0 ? 1 : r->a->batch;
    job *group[SEG_MAX_BATCH];
    int n = 0;
    job *next = NULL; /* taken from the queue, starts the next group */
    for (;;) {
        job *j = next ? next : queue_get(&r->read_q);
        next = NULL;
        if (!j) break;
        if (STOPPING()) { /* interrupted: drop what is not started */
            job_free(j);
            continue;
        }
        if (j->kind != JOB_RUN) {
            queue_put(&r->write_q, j);
            continue;
        }
        group[0] = j;
        n = 1;
        while (n < cap && !STOPPING()) {
            job *k = queue_get(&r->read_q);
            if (!k) break;
            if (k->kind != JOB_RUN) {
                queue_put(&r->write_q, k);
            } else if (k->img.w != j->img.w || k->img.h != j->img.h) {
                next = k;
                break;
            } else {
                group[n++] = k;
            }
        }
        finish_group(group, n, w);
    }
    return NULL;
}

/* Opens one engine per --devices GPU (or the one engine of the engine
 * options) before any image is read. Returns 0, else the exit status after
 * printing why. */
static int open_engines(seg_worker *workers, int n_workers, const seg_args *a)
{
    if (a->n_devices == 0) return cli_open_engine(&workers[0].e, &a->eng, a->quiet) ? 1 : 0;
    const char *path = cli_model_path(&a->eng);
    for (int i = 0; i < n_workers; i++) {
        ms_engine_options eo = a->eng.eng;
        /* One budget for the run, shared by the engines. */
        if (!eo.max_memory) eo.max_memory = engine_default_memory_budget();
        eo.max_memory /= (size_t)n_workers;
        eo.device = MS_DEV_CUDA;
        eo.device_index = a->devices[i];
        ms_status st = engine_init(&workers[i].e, path, &eo);
        if (st != MS_OK) {
            /* A missing GPU is a usage problem of this machine, not of an image. */
            cli_error("segment: --devices: GPU %d: %s", a->devices[i], ms_last_error());
            return st == MS_ERR_UNSUPPORTED ? 2 : 1;
        }
    }
    return 0;
}

/* ---- argument parsing ---- */

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char msg[1024]; /* paths in it are escaped like every message's */
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cli_error("segment: %s (see mitaseg segment --help)", msg);
    return 2;
}

static bool parse_pos_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

/* --devices LIST: distinct GPU ids, one engine each. Needs the CUDA backend;
 * whether the GPUs exist is checked when the engines open (open_engines). */
static int parse_devices(seg_args *a, const char *list)
{
    int n = 0;
    const char *s = list;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v > 1023 || (*end && *end != ',') || n == 64)
            return usage_error("--devices: expected GPU ids like 0 or 0,1, got '%s'", list);
        for (int k = 0; k < n; k++)
            if (a->devices[k] == (int)v)
                return usage_error("--devices %s: GPU %ld listed twice", list, v);
        a->devices[n++] = (int)v;
        s = *end ? end + 1 : end;
    }
    if (n == 0) return usage_error("--devices: empty list");
    if (a->eng.eng.device == MS_DEV_CPU)
        return usage_error("--devices selects GPUs; it cannot be combined with --device cpu");
#ifndef MS_HAVE_CUDA
    cli_error("segment: --devices %s: this build has no CUDA backend (GPUs cannot be used)",
              list);
    return 2;
#else
    a->n_devices = n;
    a->eng.eng.device = MS_DEV_CUDA;
    return 0;
#endif
}

/* 0 on success, -1 after --help (exit 0), else the exit status. */
static int parse_args(seg_args *a, int argc, char **argv)
{
    memset(a, 0, sizeof *a);
    cli_engine_args_init(&a->eng);
    a->format = FMT_INDEX;
    a->overlap = -1;
    a->batch = 1;
    a->inputs = calloc((size_t)argc, sizeof *a->inputs);
    a->lists = calloc((size_t)argc, sizeof *a->lists);
    if (!a->inputs || !a->lists) {
        cli_error("out of memory");
        return 1;
    }
    const char *devices = NULL;
    bool opts_done = false;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (opts_done || o[0] != '-' || !strcmp(o, "-")) {
            if (!opts_done && !strcmp(o, "-")) {
                if (a->read_stdin) return usage_error("'-' given twice");
                a->read_stdin = true;
            } else {
                a->inputs[a->n_inputs++] = o;
            }
            continue;
        }
        if (!strcmp(o, "--")) { opts_done = true; continue; }
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(segment_help, stdout);
            fputs(cli_engine_help, stdout);
            return -1;
        }
        int k = cli_parse_engine_arg(&a->eng, argc, argv, &i);
        if (k < 0) return 2;
        if (k > 0) continue;
        /* flags */
        if (!strcmp(o, "-r") || !strcmp(o, "--recursive")) { a->recursive = true; continue; }
        if (!strcmp(o, "--overlay")) { a->overlay = true; continue; }
        if (!strcmp(o, "--heatmaps")) { a->heatmaps = true; continue; }
        if (!strcmp(o, "--skip-existing")) { a->skip_existing = true; continue; }
        if (!strcmp(o, "-q") || !strcmp(o, "--quiet")) { a->quiet = true; continue; }
        /* options with a value */
        static const char *const valued[] = {"-o", "--output", "--format", "--list", "--dump", "--stats",
                                             "--tile", "--overlap", "--shard", "--batch",
                                             "--devices", NULL};
        bool known = false;
        for (int q = 0; valued[q]; q++) known |= !strcmp(o, valued[q]);
        if (!known) return usage_error("unknown option '%s'", o);
        if (i + 1 >= argc) return usage_error("%s needs a value", o);
        const char *v = argv[++i];
        if (!strcmp(o, "-o") || !strcmp(o, "--output")) {
            if (!*v) return usage_error("-o: empty folder name");
            a->out_dir = v;
        } else if (!strcmp(o, "--format")) {
            if (!strcmp(v, "index")) a->format = FMT_INDEX;
            else if (!strcmp(v, "label")) a->format = FMT_LABEL;
            else if (!strcmp(v, "color") || !strcmp(v, "colour")) a->format = FMT_COLOR;
            else return usage_error("--format: expected index, label or color, got '%s'", v);
        } else if (!strcmp(o, "--list")) {
            a->lists[a->n_lists++] = v;
        } else if (!strcmp(o, "--dump")) {
            a->dump = v;
        } else if (!strcmp(o, "--stats")) {
            a->stats = v;
        } else if (!strcmp(o, "--tile")) {
            if (!parse_pos_int(v, 16, 65536, &a->tile))
                return usage_error("--tile: expected a size in pixels (16..65536), got '%s'", v);
        } else if (!strcmp(o, "--overlap")) {
            if (!parse_pos_int(v, 0, 65535, &a->overlap))
                return usage_error("--overlap: expected pixels >= 0, got '%s'", v);
        } else if (!strcmp(o, "--shard")) {
            if (batch_parse_shard(&a->shard_i, &a->shard_n, v) != MS_OK)
                return usage_error("%s", ms_last_error());
        } else if (!strcmp(o, "--batch")) {
            if (!parse_pos_int(v, 1, SEG_MAX_BATCH, &a->batch))
                return usage_error("--batch: expected 1..%d, got '%s'", SEG_MAX_BATCH, v);
        } else if (!strcmp(o, "--devices")) {
            devices = v;
        }
    }
    if (a->n_inputs == 0 && a->n_lists == 0 && !a->read_stdin)
        return usage_error("no input images (give files, folders, --list FILE or -)");
    if (!a->out_dir && !a->dump && !a->stats) return usage_error("-o DIR is required");
    struct stat sb;
    if (a->out_dir && stat(a->out_dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return usage_error("-o %s: exists and is not a folder", a->out_dir);
    if (a->overlap >= 0 && a->tile == 0) return usage_error("--overlap needs --tile");
    if (a->tile > 0) {
        if (a->overlap < 0) a->overlap = a->tile / 4;
        if (a->overlap >= a->tile)
            return usage_error("--overlap %d must be smaller than --tile %d", a->overlap, a->tile);
        if (a->dump) return usage_error("--dump records one forward pass; it cannot be combined with --tile");
        if (a->heatmaps) return usage_error("--heatmaps shows one forward pass; it cannot be combined with --tile");
        if (a->stats) return usage_error("--stats describes one forward pass; it cannot be combined with --tile");
    }
    if (!a->out_dir && (a->overlay || a->heatmaps || a->skip_existing || a->format != FMT_INDEX))
        return usage_error("--overlay, --heatmaps, --format and --skip-existing need -o DIR");
#ifndef MS_HAVE_VIEWER
    if (a->heatmaps) {
        cli_error("segment: --heatmaps is not available in this build (no headless renderer)");
        return 2;
    }
#endif
    if (devices) {
        int rc = parse_devices(a, devices);
        if (rc) return rc;
    }
    return 0;
}

/* ---- planning ---- */

static int cmp_cstr(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

/* Temporary files that killed runs (kill -9, a power loss) left in the
 * folders this run writes to: removed once, before anything is written
 * (fio_remove_stale_temps only takes this program's names of dead PIDs). */
static void remove_stale_temps(const seg_plan *p, const seg_args *a)
{
    int n = p->list.n * N_OUT + 1, m = 0;
    char **dirs = malloc((size_t)n * sizeof *dirs);
    if (!dirs) return; /* only tidying: never worth failing the run */
    const char *prev = NULL; /* outputs are in sorted order: most share the last one's folder */
    size_t prev_len = 0;
    for (int i = 0; i < p->list.n * N_OUT && a->out_dir; i++) {
        const char *o = p->out[i];
        const char *slash = o ? strrchr(o, '/') : NULL;
        size_t len = slash ? (size_t)(slash - o) + (slash == o) : 0;
        if (!o || (prev && len == prev_len && !memcmp(o, prev, len))) continue;
        prev = o;
        prev_len = len;
        if ((dirs[m] = slash ? strndup(o, len) : strdup("."))) m++;
    }
    if (a->dump) {
        const char *slash = strrchr(a->dump, '/');
        if ((dirs[m] = slash ? strndup(a->dump, (size_t)(slash - a->dump) + (slash == a->dump))
                             : strdup(".")))
            m++;
    }
    qsort(dirs, (size_t)m, sizeof *dirs, cmp_cstr);
    for (int i = 0; i < m; i++)
        if (i == 0 || strcmp(dirs[i], dirs[i - 1])) fio_remove_stale_temps(dirs[i]);
    for (int i = 0; i < m; i++) free(dirs[i]);
    free(dirs);
}

/* Enumerates, sorts, maps outputs, applies the input and collision rules,
 * then the shard. Enumeration errors are reported and counted as failures. */
static int build_plan(seg_plan *p, const seg_args *a, int *enum_failed)
{
    memset(p, 0, sizeof *p);
    batch_list_init(&p->list);
    if (a->out_dir) batch_list_skip_dir(&p->list, a->out_dir);
    *enum_failed = 0;
    for (int i = 0; i < a->n_inputs; i++)
        if (batch_add_path(&p->list, a->inputs[i], a->recursive) != MS_OK) {
            cli_error("%s", ms_last_error());
            ++*enum_failed;
        }
    for (int i = 0; i < a->n_lists; i++)
        if (batch_add_list_file(&p->list, a->lists[i], a->recursive) != MS_OK) {
            cli_error("%s", ms_last_error());
            ++*enum_failed;
        }
    if (a->read_stdin &&
        batch_add_stream(&p->list, stdin, "standard input", NULL, a->recursive) != MS_OK) {
        cli_error("%s", ms_last_error());
        ++*enum_failed;
    }
    /* Entries that could not be added (a NUL byte in a list line, an
     * unreadable sub-folder): each reported and counted, none dropped. */
    for (int i = 0; i < p->list.n_bad; i++) cli_error("%s", p->list.bad[i]);
    *enum_failed += p->list.n_bad;
    if (batch_place_loose(&p->list) != MS_OK) {
        cli_error("%s", ms_last_error());
        return 1;
    }
    batch_sort_unique(&p->list);
    /* Every input is remembered before anything is written, so no output
     * (of any shard, nor the --dump) replaces any of them. */
    if (batch_note_inputs(&p->list) != MS_OK) {
        cli_error("%s", ms_last_error());
        return 1;
    }
    int n = p->list.n;
    p->out = calloc((size_t)(n ? n : 1) * N_OUT, sizeof *p->out);
    p->plan_error = calloc((size_t)(n ? n : 1), sizeof *p->plan_error);
    p->order = calloc((size_t)(n ? n : 1), sizeof *p->order);
    if (!p->out || !p->plan_error || !p->order) {
        cli_error("out of memory planning %d images", n);
        return 1;
    }
    if (a->dump && n > 1) {
        cli_error("segment: --dump writes one image's record, but %d images were given", n);
        return 2;
    }
    if (a->out_dir) {
        bool want[N_OUT] = {true, a->overlay, a->heatmaps};
        for (int i = 0; i < n; i++)
            for (int k = 0; k < N_OUT; k++)
                if (want[k] && batch_output_path(&p->out[i * N_OUT + k], a->out_dir,
                                                 p->list.items[i].rel, out_suffix[k]) != MS_OK) {
                    cli_error("%s", ms_last_error());
                    return 1;
                }
        /* Never onto an input, checked against every input (not just this
         * shard's), so no shard overwrites what another one reads. */
        for (int i = 0; i < n; i++)
            for (int k = 0; k < N_OUT && !p->plan_error[i]; k++) {
                const char *o = p->out[i * N_OUT + k];
                if (o && fio_check_output(o) != MS_OK)
                    p->plan_error[i] = fmt_dup("%s", ms_last_error());
            }
        /* Two inputs, one output name (a.jpg and a.png): the first in sorted
         * order wins, the others fail with a message naming both. */
        int *dup = malloc((size_t)(n ? n : 1) * N_OUT * sizeof *dup);
        char **flat = malloc((size_t)(n ? n : 1) * N_OUT * sizeof *flat);
        int *owner = malloc((size_t)(n ? n : 1) * N_OUT * sizeof *owner);
        int m = 0;
        if (!dup || !flat || !owner) {
            free(dup); free(flat); free(owner);
            cli_error("out of memory planning %d images", n);
            return 1;
        }
        for (int i = 0; i < n; i++)
            for (int k = 0; k < N_OUT; k++)
                if (p->out[i * N_OUT + k]) {
                    flat[m] = p->out[i * N_OUT + k];
                    owner[m++] = i;
                }
        if (batch_find_collisions(dup, flat, m) == MS_OK)
            for (int q = 0; q < m; q++) {
                int i = owner[q];
                if (dup[q] < 0 || owner[dup[q]] == i || p->plan_error[i]) continue;
                p->plan_error[i] = fmt_dup("its output %s is also the output of %s; rename one",
                                           flat[q], p->list.items[owner[dup[q]]].path);
            }
        free(dup);
        free(flat);
        free(owner);
    }
    for (int i = 0; i < n; i++)
        if (a->shard_n == 0 || batch_in_shard(i, a->shard_i, a->shard_n)) p->order[p->n_todo++] = i;
    remove_stale_temps(p, a);
    return 0;
}

/* ---- the command ---- */

int cmd_segment(int argc, char **argv)
{
    seg_args a;
    int rc = parse_args(&a, argc, argv);
    if (rc) {
        free(a.inputs);
        free(a.lists);
        return rc < 0 ? 0 : rc;
    }
    seg_plan plan;
    int enum_failed = 0;
    rc = build_plan(&plan, &a, &enum_failed);
    if (rc) goto out_plan;
    if (plan.n_todo == 0) {
        if (!a.quiet)
            fprintf(stderr, "mitaseg: no images to segment%s\n",
                    plan.list.n ? " in this shard" : "");
        rc = enum_failed ? 1 : 0;
        goto out_plan;
    }
    if (a.stats) {
        /* the statistics file is an output too: never onto an input */
        struct stat ss;
        for (int i = 0; stat(a.stats, &ss) == 0 && i < plan.list.n; i++)
            if (plan.list.items[i].exists && plan.list.items[i].dev == ss.st_dev &&
                plan.list.items[i].ino == ss.st_ino) {
                cli_error("segment: --stats %s is one of the input images; not overwriting it", a.stats);
                rc = 2;
                goto out_plan;
            }
    }
    int n_workers = a.n_devices > 0 ? a.n_devices : 1;
    seg_worker *workers = calloc((size_t)n_workers, sizeof *workers);
    if (!workers) {
        cli_error("out of memory");
        rc = 1;
        goto out_plan;
    }
    rc = open_engines(workers, n_workers, &a);
    if (rc) goto out_workers;
    /* The model is an input now too: --dump is checked against it and every
     * image before the run, not after it. */
    if (a.dump && fio_check_writable(a.dump) != MS_OK) {
        cli_error("segment: --dump: %s", ms_last_error());
        rc = 2;
        goto out_workers;
    }
    /* -o made and tried once: a folder that cannot be written is one line
     * before the run, not one line per image after it. */
    if (a.out_dir) {
        char *probe = NULL;
        ms_status st = batch_output_path(&probe, a.out_dir, "probe", ".png");
        if (st == MS_OK) st = batch_make_parent_dirs(probe);
        if (st == MS_OK) st = fio_check_writable(probe);
        free(probe);
        if (st != MS_OK) {
            cli_error("segment: -o %s: %s", a.out_dir, ms_last_error());
            rc = 2;
            goto out_workers;
        }
    }
    const ms_config *cfg = engine_config(workers[0].e);
    if ((a.heatmaps || a.stats) && (a.eng.run.attention >= 0 ? a.eng.run.attention : (int)cfg->attn.type) !=
                                       MS_ATTN_MITA) {
        if (a.stats) {
            cli_error("segment: --stats describes MiTA against full attention, but this run uses full "
                      "attention (add --attention mita)");
            rc = 2;
            goto out_workers;
        }
        cli_error("segment: --heatmaps draws MiTA expert selections, but this run uses full "
                  "attention (add --attention mita)");
        rc = 2;
        goto out_workers;
    }

    seg_run r;
    memset(&r, 0, sizeof r);
    r.a = &a;
    r.plan = &plan;
    r.cfg = cfg;
    r.e0 = workers[0].e;
    r.run_opt = segment_run_options(&a);
    r.total = plan.n_todo;
    r.tty = isatty(STDERR_FILENO);
    r.total += enum_failed;
    r.failed = enum_failed;
    /* Decoded ahead / written behind: a batch per engine, so the next batches
     * are ready when an engine finishes one. */
    int depth = a.batch * n_workers > 2 ? a.batch * n_workers : 2;
    bool queues = queue_init(&r.read_q, depth) == 0;
    if (!queues || queue_init(&r.write_q, depth)) {
        if (queues) queue_free(&r.read_q);
        cli_error("out of memory");
        rc = 1;
        goto out_workers;
    }
    for (int i = 0; i < n_workers; i++) {
        workers[i].r = &r;
        workers[i].res = calloc((size_t)a.batch, sizeof *workers[i].res);
        if (!workers[i].res) {
            cli_error("out of memory");
            queue_free(&r.read_q);
            queue_free(&r.write_q);
            rc = 1;
            goto out_workers;
        }
    }
#ifdef MS_HAVE_VIEWER
    /* Without the font the strip is drawn without labels. */
    if (a.heatmaps && viz_font_open(&r.font, viz_font_path(), 14) != MS_OK) r.font = NULL;
#endif
    /* --skip-existing resumes a run: the lines of the images done stay */
    if (a.stats && text_out_open(&r.stats_out, a.stats, a.skip_existing) != MS_OK) {
        cli_error("%s", ms_last_error());
        queue_free(&r.read_q);
        queue_free(&r.write_q);
        rc = 1;
        goto out_workers;
    }
    cli_interrupt_graceful();
    r.t0 = cli_now_s();
    pthread_t reader, writer;
    bool have_reader = pthread_create(&reader, NULL, reader_main, &r) == 0;
    bool have_writer = have_reader && pthread_create(&writer, NULL, writer_main, &r) == 0;
    int started = 0;
    for (int i = 0; i < n_workers && have_writer; i++)
        started += workers[i].started =
            pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]) == 0;
    if (!have_writer || started == 0) {
        cli_error("cannot start threads");
        g_stop = 1;
        if (have_reader) /* drain, so the reader is never stuck on a full queue */
            for (job *j; (j = queue_get(&r.read_q)) != NULL;) job_free(j);
    }
    for (int i = 0; i < n_workers; i++)
        if (workers[i].started) pthread_join(workers[i].thread, NULL);
    queue_close(&r.write_q);
    if (have_reader) pthread_join(reader, NULL);
    if (have_writer) pthread_join(writer, NULL);
    /* Dropped after the signal, or never read by the reader. */
    int not_started = plan.n_todo - (r.done + r.failed - enum_failed + r.skipped);
    if (r.unread) { /* never silently: each counts as failed */
        clear_bar(&r);
        cli_error("out of memory: %d image%s not read", r.unread, r.unread == 1 ? "" : "s");
        r.failed += r.unread;
        not_started -= r.unread;
    }
    show_progress(&r, true);
    double el = cli_now_s() - r.t0; /* the pipeline's time: throughput, not model loading */
    if (!a.quiet || STOPPING()) {
        clear_bar(&r);
        fprintf(stderr, "%ssegmented %d image%s, %d failed, %d skipped", STOPPING() ? "interrupted: " : "",
                r.done, r.done == 1 ? "" : "s", r.failed, r.skipped);
        if (STOPPING()) fprintf(stderr, ", %d not started", not_started);
        fprintf(stderr, " in %.1f s (%.1f images/s)\n", el, el > 0 ? r.done / el : 0.0);
    }
    queue_free(&r.read_q);
    queue_free(&r.write_q);
#ifdef MS_HAVE_VIEWER
    if (r.font) viz_font_free(r.font);
#endif
    rc = !have_writer || started == 0 ? 1 : cli_interrupted ? cli_interrupt_status() : r.failed ? 1 : 0;
    /* the lines of the images done, interrupted or not */
    if (a.stats && text_out_close(&r.stats_out, true) != MS_OK) {
        cli_error("%s", ms_last_error());
        rc = 1;
    }
out_workers:
    for (int i = 0; i < n_workers; i++) {
        if (workers[i].res)
            for (int b = 0; b < a.batch; b++) result_free(&workers[i].res[b]);
        free(workers[i].res);
        result_free(&workers[i].full);
        stats_free(&workers[i].stats);
        engine_free(workers[i].e);
    }
    free(workers);
out_plan:
    plan_free(&plan);
    free(a.inputs);
    free(a.lists);
    return rc;
}
