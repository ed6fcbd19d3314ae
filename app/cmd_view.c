/* mitaseg view: the SDL2 window. It only turns events into view-state changes
 * and shows what viz_render draws; the model runs on a worker thread, and a
 * redraw never re-runs it (only budget keys do). */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "file_io.h"

#ifndef MS_HAVE_VIEWER
int cmd_view(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cli_error("view: this build has no viewer (SDL2 and SDL2_ttf were not found)");
    return 2;
}
#else
#include <SDL.h>
#ifdef MS_HAVE_X11
#include <X11/Xlib.h>
#include <X11/Xproto.h> /* X_SendEvent */
#endif

#include "batch.h"
#include "stats.h"
#include "viz/plot.h"
#include "viz/render.h"

static const char view_usage[] =
    "usage: mitaseg view [IMAGE|DIR ...] [--list FILE] [--size WxH] [engine options]\n"
    "\n"
    "Opens the viewer: the segmentation and every layer's expert selections.\n"
    "Several images, folders (their PNG and JPEG files) or --list: PageDown /\n"
    "PageUp (Space / Backspace) move through them. Without any it opens on a\n"
    "screen to drop an image or a folder on. Press H in the window for the keys.\n"
    "\n"
    "options:\n"
    "  --list FILE       images to open, one path a line (relative to FILE's folder)\n"
    "  --size WxH        initial window size (default 1280x800)\n"
    "\n"
    "environment: MITASEG_VIEW_LOG=1 prints what the window does, and\n"
    "MITASEG_VIEW_TEST_DROP=FILE drops FILE on the window at start (for tests).\n";

typedef enum { JOB_NONE = 0, JOB_MAIN, JOB_FULL, JOB_SWEEP, JOB_PREFETCH } job_kind;

/* One model run on the worker thread. The main thread leaves eng, img, out
 * and what the job points to alone until the done event arrives. */
typedef struct {
    job_kind kind;
    ms_engine *eng;
    const ms_image *img;
    ms_result *out;
    ms_run_options opt;
    /* JOB_PREFETCH: decode this file into pre_img first */
    const char *decode_path;
    ms_image *decode_into;
    /* JOB_SWEEP: one budget, compared with full_mask */
    ms_sweep_point *point;
    const uint8_t *full_mask;
    ms_status status;
    char error[512];
    Uint32 done_event;
} job;

typedef struct {
    ms_engine *eng;
    const ms_config *cfg;
    cli_engine_args args;
    /* the image and its results */
    ms_image img;
    bool have_img;
    char path[PATH_MAX];
    ms_result res, work, full;  /* shown, being computed, full-attention reference */
    ms_result full_work, scratch;
    bool have_res, have_full;   /* have_full: full holds this image's full-attention run */
    ms_run_options run;         /* current budget; record always on */
    ms_stats stats;             /* of res (and full); depth 0: none */
    int64_t class_pixels[MS_MAX_CLASSES]; /* of res's mask */
    ms_sweep_point sweep[MS_SWEEP_MAX];
    int n_sweep, sweep_next;    /* sweep_next: the next point to run; n_sweep: planned */
    bool want_sweep;
    /* the images to move through */
    ms_batch_list list;
    int cur;                    /* index in list; -1: an image outside it */
    /* the next image, decoded and run ahead */
    ms_image pre_img;
    ms_result pre_res;
    char pre_path[PATH_MAX];
    ms_run_options pre_opt;
    bool pre_ready, want_pre;
    /* mouse: a drag pans, a press and release without moving clicks */
    bool pressed, dragging;
    int press_x, press_y, last_x, last_y;
    /* worker */
    SDL_Thread *thread;
    job jb;
    bool busy;
    bool want_main, want_full;
    char pending_path[PATH_MAX]; /* dropped or stepped to while busy */
    int pending_index;          /* its list index; -1: outside the list */
    bool keep_view;             /* an image was shown: the next keeps layer, expert */
    /* window */
    SDL_Window *win;
    SDL_Renderer *ren;
    SDL_Texture *tex;
    int tw, th;
    uint8_t *px;                /* (th, tw, 4) */
    viz_font *font, *font_big;
    viz_state st;
    char status[PATH_MAX * 2 + 64];
    char info[512];
    bool log;
    bool first_result;
} viewer;

static void vlog(const viewer *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void vlog(const viewer *v, const char *fmt, ...)
{
    if (!v->log) return;
    va_list ap;
    va_start(ap, fmt);
    char line[PATH_MAX * 2 + 64];
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    cli_fputs_escaped(line, stdout); /* paths: one line each, whatever their bytes */
    fputc('\n', stdout);
    fflush(stdout);
}

static void set_status(viewer *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_status(viewer *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->status, sizeof v->status, fmt, ap);
    va_end(ap);
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

#ifdef MS_HAVE_X11
/* SDL's X11 backend wakes a waiting event loop with an XSendEvent to the
 * window over a second connection, for every event queued meanwhile (the
 * Escape key itself, a finished run). At quit the window can be destroyed
 * before the server reads that request; the BadWindow that comes back is
 * fatal under Xlib's default handler, so the viewer exited 1 at Escape now
 * and then (e2e_viewer, about 1 run in 7). A send to a window that is gone
 * is harmless: ignored. Every other error goes to the handler before. */
static XErrorHandler g_x_error_before;

static int view_x_error(Display *d, XErrorEvent *e)
{
    if (e->error_code == BadWindow && e->request_code == X_SendEvent) return 0;
    return g_x_error_before ? g_x_error_before(d, e) : 0;
}
#endif

static int worker_main(void *arg)
{
    job *j = arg;
    j->status = MS_OK;
    if (j->decode_path) {
        image_free(j->decode_into);
        j->status = image_read(j->decode_into, j->decode_path);
    }
    if (j->status == MS_OK) {
        if (j->kind == JOB_SWEEP)
            j->status = stats_run_sweep_point(j->point, j->eng, j->out, j->img, j->full_mask, &j->opt);
        else
            j->status = engine_run(j->eng, j->out, j->img, &j->opt);
    }
    if (j->status != MS_OK) snprintf(j->error, sizeof j->error, "%s", ms_last_error());
    SDL_Event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = j->done_event;
    SDL_PushEvent(&ev);
    return 0;
}

/* The run options of the main run at the current budget. */
static ms_run_options main_options(const viewer *v)
{
    ms_run_options o = v->run;
    o.record = true;
    o.keep_blocks = true;
    return o;
}

static bool same_options(const ms_run_options *a, const ms_run_options *b)
{
    return a->attention == b->attention && a->gh == b->gh && a->gw == b->gw && a->topk == b->topk &&
           a->short_side == b->short_side && a->tta_flip == b->tta_flip;
}

/* Index of the image after the current one in the list; -1: none. */
static int next_index(const viewer *v)
{
    if (v->list.n < 2 || v->cur < 0) return -1;
    return (v->cur + 1) % v->list.n;
}

/* Starts the next wanted run when the worker is free: the main run first
 * (what the user asked for), then the full-attention reference, the budget
 * sweep's next point, and last the next image ahead. */
static void start_next(viewer *v)
{
    if (v->busy || !v->have_img) return;
    bool sweep_ok = v->want_sweep && v->have_full && v->have_res && v->sweep_next < v->n_sweep;
    job_kind k = v->want_main ? JOB_MAIN : v->want_full ? JOB_FULL : sweep_ok ? JOB_SWEEP
                 : v->want_pre && next_index(v) >= 0 ? JOB_PREFETCH : JOB_NONE;
    if (k == JOB_NONE) return;
    job *j = &v->jb;
    j->kind = k;
    j->eng = v->eng;
    j->img = &v->img;
    j->status = MS_OK;
    j->error[0] = '\0';
    j->decode_path = NULL;
    j->decode_into = NULL;
    if (k == JOB_MAIN) {
        v->want_main = false;
        j->out = &v->work;
        j->opt = main_options(v);
    } else if (k == JOB_FULL) {
        v->want_full = false;
        j->out = &v->full_work;
        j->opt = stats_compare_options(&v->run, MS_ATTN_FULL, 0, 0, 0);
        j->opt.keep_blocks = true;
    } else if (k == JOB_SWEEP) {
        j->point = &v->sweep[v->sweep_next];
        j->full_mask = v->full.mask;
        j->out = &v->scratch;
        j->opt = v->run; /* the shown run's, for stats_run_sweep_point */
    } else {
        v->want_pre = false;
        v->pre_ready = false;
        snprintf(v->pre_path, sizeof v->pre_path, "%s", v->list.items[next_index(v)].path);
        v->pre_opt = main_options(v);
        j->decode_path = v->pre_path;
        j->decode_into = &v->pre_img;
        j->img = &v->pre_img;
        j->out = &v->pre_res;
        j->opt = v->pre_opt;
    }
    v->thread = SDL_CreateThread(worker_main, "mitaseg-run", j);
    if (!v->thread) {
        set_status(v, "cannot start the worker thread: %s", SDL_GetError());
        return;
    }
    v->busy = true;
}

/* "12 / 101  " when moving through several images, else "". */
static const char *position(const viewer *v)
{
    static char buf[48];
    buf[0] = '\0';
    if (v->list.n > 1 && v->cur >= 0) snprintf(buf, sizeof buf, "%d / %d  ", v->cur + 1, v->list.n);
    return buf;
}

static void update_info(viewer *v)
{
    if (!v->have_res) {
        v->info[0] = '\0';
        return;
    }
    const ms_result *r = &v->res;
    char cmp[160];
    if (r->attention == MS_ATTN_FULL) {
        snprintf(cmp, sizeof cmp, "full attention run (F: MiTA)");
    } else if (!v->have_full) {
        snprintf(cmp, sizeof cmp, "vs full attention: computing...");
    } else {
        size_t n = (size_t)r->h * r->w, changed = 0;
        for (size_t i = 0; i < n; i++) changed += v->full.mask[i] != r->mask[i];
        snprintf(cmp, sizeof cmp, "vs full attention: %.2f%% px changed\n(%zu of %zu pixels; 7: where)",
                 100.0 * (double)changed / (double)n, changed, n);
    }
    snprintf(v->info, sizeof v->info, "last run: %.0f ms on %s\n%s", r->ms_total, r->device_name, cmp);
}

/* Statistics of the shown run against the full run when there is one. */
static void update_stats(viewer *v)
{
    stats_free(&v->stats);
    if (!v->have_res || v->res.attention != MS_ATTN_MITA) return;
    if (stats_compute(&v->stats, &v->res, v->have_full ? &v->full : NULL) != MS_OK) {
        set_status(v, "statistics: %s", ms_last_error());
        stats_free(&v->stats);
    }
}

/* Keeps the selections valid for the current result. */
static void clamp_state(viewer *v)
{
    viz_state *st = &v->st;
    const ms_result *r = &v->res;
    if (!v->have_res) return;
    if (r->depth > 0) {
        if (v->first_result && !v->keep_view) {
            st->layer = r->depth - 1;
            while (st->layer > 0 && r->layer_mita && !r->layer_mita[st->layer]) st->layer--;
        }
        if (st->layer >= r->depth) st->layer = r->depth - 1;
        if (st->layer < 0) st->layer = 0;
        if (st->head >= r->heads) st->head = -1;
        if (st->expert >= r->m || (v->first_result && !v->keep_view)) st->expert = (r->gh / 2) * r->gw + r->gw / 2;
    }
    if (st->query_x >= r->w || st->query_y >= r->h) st->query_x = st->query_y = -1;
    v->first_result = false;
}

/* Plans the budget sweep around the shown run's budget. */
static void sweep_plan(viewer *v)
{
    const ms_result *r = &v->res;
    v->n_sweep = stats_sweep_plan(v->sweep, r->gh, r->gw, r->k, r->hp, r->wp, r->n);
    v->sweep_next = 0;
}

/* The main run of the current image is in v->res: status, full run, stats. */
static void main_ready(viewer *v)
{
    v->have_res = true;
    memset(v->class_pixels, 0, sizeof v->class_pixels);
    for (size_t i = 0; i < (size_t)v->res.h * v->res.w; i++) v->class_pixels[v->res.mask[i]]++;
    clamp_state(v);
    set_status(v, "%s%s: %dx%d (%dx%d tokens), %s %dx%d k %d%s, %.0f ms", position(v),
               base_name(v->path), v->res.w, v->res.h, v->res.wp, v->res.hp,
               v->res.attention == MS_ATTN_FULL ? "full attention" : "MiTA", v->res.gh, v->res.gw,
               v->res.k, v->res.tta_flip ? ", flip TTA" : "", v->res.ms_total);
    if (!v->have_full && v->res.attention != MS_ATTN_FULL) v->want_full = true;
    /* the sweep belongs to one budget and image */
    v->n_sweep = v->sweep_next = 0;
    if (v->want_sweep && v->res.attention == MS_ATTN_MITA) sweep_plan(v);
    else v->want_sweep = false;
    update_stats(v);
    /* run the next image ahead (again, when the budget changed since) */
    ms_run_options now = main_options(v);
    v->want_pre = next_index(v) >= 0 && !(v->pre_ready && same_options(&v->pre_opt, &now));
    vlog(v, "ready %.0f ms layers %d tokens %dx%d%s", v->res.ms_total, v->res.depth, v->res.wp, v->res.hp,
         v->res.tta_flip ? " tta flip" : "");
}

static void on_job_done(viewer *v)
{
    SDL_WaitThread(v->thread, NULL);
    v->thread = NULL;
    v->busy = false;
    job *j = &v->jb;
    if (j->status != MS_OK) {
        if (j->kind == JOB_PREFETCH) {
            /* said when the user gets there */
            v->pre_ready = false;
            vlog(v, "prefetch error %s", j->error);
        } else {
            set_status(v, "%s: %s", base_name(v->path), j->error);
            vlog(v, "error %s", j->error);
        }
        if (j->kind == JOB_SWEEP) v->want_sweep = false;
    } else if (j->kind == JOB_MAIN) {
        ms_result t = v->res;
        v->res = v->work;
        v->work = t;
        main_ready(v);
    } else if (j->kind == JOB_FULL && j->opt.tta_flip != v->run.tta_flip) {
        /* T was pressed meanwhile: a reference of the other kind; run it again */
        v->want_full = v->have_res && v->res.attention == MS_ATTN_MITA;
    } else if (j->kind == JOB_FULL) {
        ms_result t = v->full;
        v->full = v->full_work;
        v->full_work = t;
        v->have_full = true;
        update_stats(v);
        vlog(v, "full ready");
    } else if (j->kind == JOB_SWEEP) {
        v->sweep_next++;
        if (v->sweep_next >= v->n_sweep) {
            v->want_sweep = false;
            set_status(v, "%sbudget sweep done: %d runs", position(v), v->n_sweep);
            vlog(v, "sweep done %d", v->n_sweep);
        }
    } else if (j->kind == JOB_PREFETCH) {
        v->pre_ready = true;
        vlog(v, "prefetched %s", v->pre_path);
    }
    update_info(v);
}

/* Makes path the current image (list index idx, -1 outside the list). The
 * view, layer, head, expert and budget stay. */
static bool load_image(viewer *v, const char *path, int idx)
{
    bool pre = v->pre_ready && !strcmp(v->pre_path, path);
    ms_run_options now = main_options(v);
    if (pre) {
        image_free(&v->img);
        v->img = v->pre_img;
        memset(&v->pre_img, 0, sizeof v->pre_img);
    } else {
        ms_image img = {0};
        if (cli_read_image(&img, path, v->eng, &now, 0) != MS_OK) {
            /* the shown image stays; the position moves on, so the next
             * PageDown gets past an unreadable file */
            if (idx >= 0 && v->list.n > 1) {
                v->cur = idx;
                set_status(v, "%d / %d  %s", idx + 1, v->list.n, ms_last_error());
            } else {
                set_status(v, "%s", ms_last_error());
            }
            vlog(v, "error %s", ms_last_error());
            return false;
        }
        image_free(&v->img);
        v->img = img;
    }
    v->have_img = true;
    v->cur = idx;
    snprintf(v->path, sizeof v->path, "%s", path);
    v->keep_view = v->have_res || v->keep_view;
    v->have_res = false;
    v->have_full = false;
    stats_free(&v->stats);
    v->n_sweep = v->sweep_next = 0;
    v->want_sweep = false;
    v->first_result = true;
    v->st.query_x = v->st.query_y = -1;
    viz_zoom_fit(&v->st);
    v->want_full = false;
    v->want_pre = false;
    char title[PATH_MAX + 16];
    snprintf(title, sizeof title, "mitaseg - %s", base_name(path));
    SDL_SetWindowTitle(v->win, title);
    vlog(v, "image %d %d %s", idx + 1, v->list.n, path);
    if (pre && same_options(&v->pre_opt, &now)) {
        /* run ahead with this budget: no wait */
        ms_result t = v->res;
        v->res = v->pre_res;
        v->pre_res = t;
        v->pre_ready = false;
        v->want_main = false;
        main_ready(v);
    } else {
        v->pre_ready = false;
        v->want_main = true;
        set_status(v, "%s%s: running the model...", position(v), base_name(path));
    }
    update_info(v);
    start_next(v);
    return true;
}

/* True for the names S writes: NAME.mask.png and NAME.view-VIEW-L<n>.png. */
static bool is_saved_output(const char *path)
{
    const char *b = base_name(path), *v = strstr(b, ".view-");
    size_t n = strlen(b);
    if (n > 9 && !strcmp(b + n - 9, ".mask.png")) return true;
    if (!v || n < 4 || strcmp(b + n - 4, ".png")) return false;
    const char *l = strrchr(b, '-'); /* "-L<digits>.png" */
    if (!l || l < v || l[1] != 'L' || !(l[2] >= '0' && l[2] <= '9')) return false;
    for (const char *c = l + 2; c < b + n - 4; c++)
        if (*c < '0' || *c > '9') return false;
    return true;
}

/* Leaves out of folder listings what S saved there (a view of a saved
 * mask is no use); files named explicitly stay. */
static void drop_saved_outputs(ms_batch_list *l, char *const *named, int n_named)
{
    int k = 0;
    for (int i = 0; i < l->n; i++) {
        bool explicit_file = false;
        for (int j = 0; j < n_named; j++) explicit_file |= !strcmp(named[j], l->items[i].path);
        if (!explicit_file && is_saved_output(l->items[i].path)) {
            free(l->items[i].path);
            free(l->items[i].rel);
            continue;
        }
        l->items[k++] = l->items[i];
    }
    l->n = k;
}

/* Opens a dropped or given folder, list or file as the image list. */
static bool open_list(viewer *v, char *const *paths, int n, const char *list_file)
{
    ms_batch_list l;
    batch_list_init(&l);
    ms_status st = MS_OK;
    for (int i = 0; i < n && st == MS_OK; i++) st = batch_add_path(&l, paths[i], false);
    if (st == MS_OK && list_file) st = batch_add_list_file(&l, list_file, false);
    if (st == MS_OK) drop_saved_outputs(&l, paths, n);
    if (st != MS_OK) {
        set_status(v, "%s", ms_last_error());
        vlog(v, "error %s", ms_last_error());
        batch_list_free(&l);
        return false;
    }
    batch_sort_unique(&l);
    if (l.n == 0) {
        set_status(v, "%s: no PNG or JPEG images there", n ? paths[0] : list_file);
        vlog(v, "error no images");
        batch_list_free(&l);
        return false;
    }
    batch_list_free(&v->list);
    v->list = l;
    v->pre_ready = false;
    return load_image(v, v->list.items[0].path, 0);
}

/* Moves by d images through the list (wrapping around). */
static void step_image(viewer *v, int d)
{
    if (v->list.n < 2) {
        set_status(v, "one image open: give a folder or several images to move through them");
        return;
    }
    int i = ((v->cur < 0 ? 0 : v->cur) + d % v->list.n + v->list.n) % v->list.n;
    if (v->busy) {
        /* opens when the current run ends; a prefetch of this image finishes first */
        snprintf(v->pending_path, sizeof v->pending_path, "%s", v->list.items[i].path);
        v->pending_index = i;
        set_status(v, "%d / %d  %s: opens when the current run ends", i + 1, v->list.n,
                   base_name(v->list.items[i].path));
        return;
    }
    load_image(v, v->list.items[i].path, i);
}

/* Opens a pending or dropped path: index >= 0 a list entry, -2 a dropped
 * file or folder, which becomes the list. */
static void open_path(viewer *v, const char *path, int index)
{
    if (index == -2) {
        char *p = (char *)path;
        open_list(v, &p, 1, NULL);
    } else {
        load_image(v, path, index == -2 ? -1 : index);
    }
}

/* ---- saving ------------------------------------------------------------ */

/* False when the paths would not fit. */
static bool save_paths(char *view_path, char *mask_path, char *stats_path, size_t n, const viewer *v)
{
    char dir[PATH_MAX], stem[PATH_MAX];
    const char *slash = strrchr(v->path, '/');
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - v->path), v->path);
    else snprintf(dir, sizeof dir, ".");
    if (!dir[0]) snprintf(dir, sizeof dir, "/");
    snprintf(stem, sizeof stem, "%s", base_name(v->path));
    char *dot = strrchr(stem, '.');
    if (dot && dot != stem) *dot = '\0';
    /* next to the image when its folder is writable, else here */
    if (access(dir, W_OK) != 0) snprintf(dir, sizeof dir, ".");
    int a = snprintf(view_path, n, "%s/%s.view-%s-L%d.png", dir, stem, viz_view_name(v->st.view), v->st.layer);
    int b = snprintf(mask_path, n, "%s/%s.mask.png", dir, stem);
    int c = snprintf(stats_path, n, "%s/%s.stats.json", dir, stem);
    return a > 0 && b > 0 && c > 0 && (size_t)a < n && (size_t)b < n && (size_t)c < n;
}

static void save_view(viewer *v)
{
    if (!v->have_img || !v->have_res) {
        set_status(v, "nothing to save yet");
        return;
    }
    char vp[PATH_MAX], mp[PATH_MAX], sp[PATH_MAX];
    if (!save_paths(vp, mp, sp, sizeof vp, v)) {
        set_status(v, "not saving: the output path is too long");
        return;
    }
    /* The names always add a suffix, but a file viewed (or the model) could
     * carry one: all are checked against every input before any is written. */
    if (fio_check_output(vp) != MS_OK || fio_check_output(mp) != MS_OK || fio_check_output(sp) != MS_OK) {
        set_status(v, "not saving: %s", ms_last_error());
        vlog(v, "error %s", ms_last_error());
        return;
    }
    int W = v->tw, H = v->th;
    uint8_t *px = malloc((size_t)W * H * 4);
    if (!px) {
        set_status(v, "out of memory saving the view");
        return;
    }
    viz_state st = v->st; /* as shown, without help or hover */
    st.help = false;
    st.mouse_x = st.mouse_y = -1;
    st.busy = false;
    viz_render(px, W, H, &st);
    for (size_t i = 0; i < (size_t)W * H; i++) memmove(px + i * 3, px + i * 4, 3);
    ms_status s1 = image_write_rgb(vp, px, W, H);
    free(px);
    if (s1 != MS_OK) {
        set_status(v, "%s", ms_last_error());
        vlog(v, "error %s", ms_last_error());
        return;
    }
    ms_status s2 = image_write_indexed(mp, v->res.mask, v->res.w, v->res.h,
                                       (const uint8_t(*)[3])v->cfg->palette, v->cfg->n_classes);
    if (s2 != MS_OK) {
        set_status(v, "%s", ms_last_error());
        vlog(v, "error %s", ms_last_error());
        return;
    }
    /* the numbers behind the chart views (a MiTA run only) */
    char *json = NULL;
    if (v->stats.depth > 0) {
        if (stats_to_json(&json, &v->stats, &v->res, base_name(v->path), v->cfg->class_names, v->sweep,
                          v->sweep_next, true) != MS_OK ||
            stats_write_text(sp, json) != MS_OK) {
            free(json);
            set_status(v, "%s", ms_last_error());
            vlog(v, "error %s", ms_last_error());
            return;
        }
        free(json);
        set_status(v, "saved %s, %s and %s", vp, mp, sp);
        vlog(v, "saved-stats %s", sp);
    } else {
        set_status(v, "saved %s and %s", vp, mp);
    }
    vlog(v, "saved %s %s", vp, mp);
}

/* ---- events ------------------------------------------------------------ */

/* Effective budget of the shown run, for the budget keys to step from. */
static void budget_change(viewer *v, int dgrid, int kmul, bool kdiv, bool toggle_full, bool reset)
{
    if (!v->have_img) return;
    const ms_result *r = &v->res;
    int gh = v->run.gh ? v->run.gh : (v->have_res && r->gh ? r->gh : v->cfg->attn.gh);
    int gw = v->run.gw ? v->run.gw : (v->have_res && r->gw ? r->gw : v->cfg->attn.gw);
    int k = v->run.topk ? v->run.topk : (v->have_res && r->k ? r->k : v->cfg->attn.topk);
    if (reset) { /* the budget only: the working size and TTA stay as the user chose */
        v->run.attention = -1;
        v->run.gh = v->run.gw = v->run.topk = 0;
    } else if (toggle_full) {
        bool full_now = v->have_res ? r->attention == MS_ATTN_FULL : v->run.attention == MS_ATTN_FULL;
        v->run.attention = full_now ? MS_ATTN_MITA : MS_ATTN_FULL;
    } else if (dgrid) {
        int hp = v->have_res ? r->hp : 1 << 20, wp = v->have_res ? r->wp : 1 << 20;
        gh += dgrid;
        gw += dgrid;
        if (gh < 1 || gw < 1 || (dgrid > 0 && (gh > hp || gw > wp))) {
            set_status(v, "landmark grid stays %dx%d (1 .. token grid %dx%d)", gh - dgrid, gw - dgrid, hp, wp);
            return;
        }
        v->run.gh = gh;
        v->run.gw = gw;
        if (v->run.attention == MS_ATTN_FULL) v->run.attention = MS_ATTN_MITA;
    } else {
        int nk = kdiv ? k / 2 : k * kmul;
        int n = v->have_res ? r->n + r->ncls : INT_MAX; /* k clamps to the keys, class token included */
        if (nk < 1 || nk > n || nk == k) {
            set_status(v, "top-k stays %d (1 .. %d)", k, n);
            return;
        }
        v->run.topk = nk;
        if (v->run.attention == MS_ATTN_FULL) v->run.attention = MS_ATTN_MITA;
    }
    v->run.record = true;
    v->want_main = true;
    set_status(v, "re-running with %s%s...",
               v->run.attention == MS_ATTN_FULL ? "full attention" : "MiTA",
               v->busy ? " (after the current run)" : "");
    start_next(v);
}

/* T: flip TTA on or off for the runs from now on; the full-attention
 * reference then runs again with it (like with like). */
static void tta_toggle(viewer *v)
{
    if (!v->have_img) return;
    v->run.tta_flip = !v->run.tta_flip;
    v->have_full = false; /* main_ready asks for it again */
    v->want_main = true;
    set_status(v, "re-running with flip TTA %s%s...", v->run.tta_flip ? "on" : "off",
               v->busy ? " (after the current run)" : "");
    start_next(v);
}

static void sync_state(viewer *v);

/* Zooms by z about window pixel (x, y) (the middle when off the image). */
static void zoom_by(viewer *v, float z, int x, int y)
{
    sync_state(v);
    viz_layout lay;
    viz_layout_compute(&lay, v->tw, v->th, &v->st);
    viz_zoom_at(&v->st, &lay, z, x, y);
    vlog(v, "zoom %.2f", (double)v->st.zoom);
}

static void on_key(viewer *v, const SDL_KeyboardEvent *ke, bool *quit)
{
    SDL_Keycode k = ke->keysym.sym;
    bool shift = (ke->keysym.mod & KMOD_SHIFT) != 0;
    bool ctrl = (ke->keysym.mod & (KMOD_CTRL | KMOD_GUI)) != 0;
    viz_state *st = &v->st;
    const ms_result *r = v->have_res ? &v->res : NULL;
    switch (k) {
    case SDLK_ESCAPE:
    case SDLK_q:
        *quit = true;
        return;
    case SDLK_h:
    case SDLK_F1:
    case SDLK_QUESTION:
        st->help = !st->help;
        return;
    case SDLK_SLASH:
        if (shift) st->help = !st->help;
        return;
    case SDLK_1: case SDLK_2: case SDLK_3: case SDLK_4: case SDLK_5: case SDLK_6: case SDLK_7: case SDLK_8:
        st->view = (viz_view)(k - SDLK_1);
        vlog(v, "view %s", viz_view_name(st->view));
        return;
    case SDLK_KP_1: case SDLK_KP_2: case SDLK_KP_3: case SDLK_KP_4: case SDLK_KP_5: case SDLK_KP_6:
    case SDLK_KP_7: case SDLK_KP_8:
        st->view = (viz_view)(k - SDLK_KP_1);
        vlog(v, "view %s", viz_view_name(st->view));
        return;
    case SDLK_9:
    case SDLK_KP_9:
        /* the sweep view; pressed there (or with no sweep yet), (re)runs it */
        if (st->view == VIZ_SWEEP || v->n_sweep == 0) {
            if (!r || r->attention != MS_ATTN_MITA) {
                set_status(v, "the budget sweep needs a MiTA run (F: MiTA)");
            } else if (!v->want_sweep) {
                v->want_sweep = true;
                sweep_plan(v);
                set_status(v, "%sbudget sweep: %d runs in the background%s", position(v), v->n_sweep,
                           v->have_full ? "" : " after the full-attention run");
                start_next(v);
            }
        }
        st->view = VIZ_SWEEP;
        vlog(v, "view %s", viz_view_name(st->view));
        return;
    case SDLK_x:
        st->diff_split = !st->diff_split;
        return;
    case SDLK_0:
    case SDLK_KP_0:
        viz_zoom_fit(st);
        vlog(v, "zoom %.2f", (double)st->zoom);
        return;
    case SDLK_PAGEDOWN:
    case SDLK_SPACE:
        step_image(v, 1);
        return;
    case SDLK_PAGEUP:
    case SDLK_BACKSPACE:
        step_image(v, -1);
        return;
    case SDLK_UP:
        if (r && st->layer + 1 < r->depth) st->layer++;
        vlog(v, "layer %d", st->layer);
        return;
    case SDLK_DOWN:
        if (st->layer > 0) st->layer--;
        vlog(v, "layer %d", st->layer);
        return;
    case SDLK_TAB:
        if (r && r->heads > 0) {
            /* -1 (all), 0 .. heads-1 */
            int n = r->heads + 1, i = st->head + 1;
            i = (i + (shift ? n - 1 : 1)) % n;
            st->head = i - 1;
        }
        return;
    case SDLK_LEFTBRACKET:
    case SDLK_RIGHTBRACKET:
        if (r && r->m > 0) st->expert = (st->expert + (k == SDLK_RIGHTBRACKET ? 1 : r->m - 1)) % r->m;
        return;
    case SDLK_PLUS:
    case SDLK_EQUALS:
    case SDLK_KP_PLUS:
        if (ctrl) {
            zoom_by(v, 1.25f, st->mouse_x, st->mouse_y);
            return;
        }
        st->opacity = st->opacity + 0.1f > 1.f ? 1.f : st->opacity + 0.1f;
        set_status(v, "opacity %.0f%%", 100.0 * st->opacity);
        return;
    case SDLK_MINUS:
    case SDLK_KP_MINUS:
        if (ctrl) {
            zoom_by(v, 0.8f, st->mouse_x, st->mouse_y);
            return;
        }
        st->opacity = st->opacity - 0.1f < 0.f ? 0.f : st->opacity - 0.1f;
        set_status(v, "opacity %.0f%%", 100.0 * st->opacity);
        return;
    case SDLK_o:
        st->outlines = !st->outlines;
        return;
    case SDLK_l:
        st->legend_all = !st->legend_all;
        return;
    case SDLK_s:
        save_view(v);
        return;
    case SDLK_g:
        budget_change(v, shift ? -1 : 1, 0, false, false, false);
        return;
    case SDLK_k:
        budget_change(v, 0, 2, shift, false, false);
        return;
    case SDLK_f:
        budget_change(v, 0, 0, false, true, false);
        return;
    case SDLK_r:
        budget_change(v, 0, 0, false, false, true);
        return;
    case SDLK_t:
        tta_toggle(v);
        return;
    default:
        return;
    }
}

static void on_click(viewer *v, int x, int y)
{
    sync_state(v);
    viz_layout lay;
    viz_layout_compute(&lay, v->tw, v->th, &v->st);
    viz_hit h = viz_hit_test(&lay, &v->st, x, y);
    viz_state *st = &v->st;
    switch (h.kind) {
    case VIZ_HIT_LEGEND:
        viz_class_toggle(st, h.value);
        set_status(v, "%s %s", viz_class_hidden(st, h.value) ? "hid" : "showing", v->cfg->class_names[h.value]);
        vlog(v, "class %d %s", h.value, viz_class_hidden(st, h.value) ? "hidden" : "shown");
        break;
    case VIZ_HIT_LAYER:
        st->layer = h.value;
        vlog(v, "layer %d", st->layer);
        break;
    case VIZ_HIT_IMAGE:
        if (st->view == VIZ_EXPERT && h.landmark >= 0) {
            st->expert = h.landmark;
        } else if (st->view == VIZ_QUERY) {
            st->query_x = h.img_x;
            st->query_y = h.img_y;
        }
        break;
    default:
        break;
    }
}

/* Logs where the legend entries and strip tiles are, so a test can click them. */
static void log_layout(viewer *v)
{
    if (!v->log || !v->have_res) return;
    sync_state(v);
    viz_layout lay;
    viz_layout_compute(&lay, v->tw, v->th, &v->st);
    for (int i = 0; i < lay.n_legend; i++)
        vlog(v, "layout legend %d %d %d", lay.legend_class[i], lay.legend[i].x + lay.legend[i].w / 2,
             lay.legend[i].y + lay.legend[i].h / 2);
    for (int l = 0; l < lay.n_tiles; l++)
        vlog(v, "layout tile %d %d %d", l, lay.tile[l].x + lay.tile[l].w / 2, lay.tile[l].y + lay.tile[l].h / 2);
    /* chart points of layer l: "layout chart I L X Y" */
    for (int i = 0; i < lay.n_charts; i++)
        for (int l = 0; l < v->res.depth; l++)
            vlog(v, "layout chart %d %d %d %d", i, l, viz_chart_x(lay.chart[i], v->res.depth, l),
                 lay.chart[i].y + lay.chart[i].h / 2);
    vlog(v, "layout image %d %d %d %d", lay.image.x, lay.image.y, lay.image.w, lay.image.h);
}

/* Window coordinates to drawable pixels (they differ on high-DPI screens). */
static void to_pixels(const viewer *v, int x, int y, int *px, int *py)
{
    int ww, wh;
    SDL_GetWindowSize(v->win, &ww, &wh);
    *px = ww > 0 && v->tw ? x * v->tw / ww : x;
    *py = wh > 0 && v->th ? y * v->th / wh : y;
}

static bool ensure_texture(viewer *v)
{
    int w, h;
    if (SDL_GetRendererOutputSize(v->ren, &w, &h) != 0) SDL_GetWindowSize(v->win, &w, &h);
    if (w < 1) w = 1;
    if (h < 1) h = 1;
    if (v->tex && w == v->tw && h == v->th) return true;
    if (v->tex) SDL_DestroyTexture(v->tex);
    v->tex = SDL_CreateTexture(v->ren, SDL_PIXELFORMAT_RGBA32, SDL_TEXTUREACCESS_STREAMING, w, h);
    uint8_t *px = realloc(v->px, (size_t)w * h * 4);
    if (!v->tex || !px) {
        if (px) v->px = px;
        return false;
    }
    v->px = px;
    v->tw = w;
    v->th = h;
    return true;
}

/* Points the view state at what the viewer holds now. */
static void sync_state(viewer *v)
{
    viz_state *st = &v->st;
    st->img = v->have_img ? &v->img : NULL;
    st->res = v->have_res ? &v->res : NULL;
    st->busy = v->busy;
    st->status = v->status;
    st->info = v->info;
    st->full = v->have_full ? &v->full : NULL;
    st->stats = v->stats.depth > 0 ? &v->stats : NULL;
    st->class_pixels = v->have_res ? v->class_pixels : NULL;
    st->sweep = v->sweep;
    st->n_sweep = v->n_sweep;
}

static void redraw(viewer *v)
{
    if (!ensure_texture(v)) return;
    viz_state *st = &v->st;
    sync_state(v);
    viz_render(v->px, v->tw, v->th, st);
    SDL_UpdateTexture(v->tex, NULL, v->px, v->tw * 4);
    SDL_RenderClear(v->ren);
    SDL_RenderCopy(v->ren, v->tex, NULL, NULL);
    SDL_RenderPresent(v->ren);
}

static void viewer_free(viewer *v)
{
    if (v->thread) SDL_WaitThread(v->thread, NULL);
    result_free(&v->res);
    result_free(&v->work);
    result_free(&v->full);
    result_free(&v->full_work);
    result_free(&v->scratch);
    result_free(&v->pre_res);
    image_free(&v->pre_img);
    stats_free(&v->stats);
    batch_list_free(&v->list);
    image_free(&v->img);
    free(v->px);
    viz_font_free(v->font);
    viz_font_free(v->font_big);
    if (v->tex) SDL_DestroyTexture(v->tex);
    if (v->ren) SDL_DestroyRenderer(v->ren);
    if (v->win) SDL_DestroyWindow(v->win);
    engine_free(v->eng);
}

int cmd_view(int argc, char **argv)
{
    static viewer vw; /* large (paths); one per process */
    viewer *v = &vw;
    memset(v, 0, sizeof *v);
    cli_engine_args_init(&v->args);
    char **images = calloc((size_t)argc + 1, sizeof *images);
    int n_images = 0;
    const char *list_file = NULL;
    if (!images) {
        cli_error("out of memory");
        return 1;
    }
    int W = 1280, H = 800;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int rc = cli_parse_engine_arg(&v->args, argc, argv, &i);
        if (rc < 0) return 2;
        if (rc > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(view_usage, stdout);
            fputs(cli_engine_help, stdout);
            free(images);
            return 0;
        }
        if (!strcmp(a, "--list")) {
            if (i + 1 >= argc) {
                cli_error("--list needs a file");
                free(images);
                return 2;
            }
            list_file = argv[++i];
            continue;
        }
        if (!strcmp(a, "--size")) {
            int n = 0;
            if (i + 1 >= argc || sscanf(argv[i + 1], "%dx%d%n", &W, &H, &n) != 2 || argv[i + 1][n] || W < 200 ||
                H < 150 || W > 16384 || H > 16384) {
                cli_error("--size: expected WxH, at least 200x150");
                free(images);
                return 2;
            }
            i++;
            continue;
        }
        if (a[0] == '-' && a[1]) {
            cli_error("view: unknown option '%s' (see mitaseg view --help)", a);
            free(images);
            return 2;
        }
        images[n_images++] = (char *)a;
    }
    const char *lg = getenv("MITASEG_VIEW_LOG");
    v->log = lg && *lg && strcmp(lg, "0");
    v->run = v->args.run;
    v->run.record = true;

    batch_list_init(&v->list);
    v->cur = -1;
    /* the images first: a bad path or an empty folder is one line, before any window */
    if (n_images > 0 || list_file) {
        ms_status ls = MS_OK;
        for (int i = 0; i < n_images && ls == MS_OK; i++) ls = batch_add_path(&v->list, images[i], false);
        if (ls == MS_OK && list_file) ls = batch_add_list_file(&v->list, list_file, false);
        if (ls != MS_OK) {
            cli_error("%s", ms_last_error());
            batch_list_free(&v->list);
            free(images);
            return 1;
        }
        drop_saved_outputs(&v->list, images, n_images);
        batch_sort_unique(&v->list);
        if (v->list.n == 0) {
            cli_error("view: %s: no PNG or JPEG images there", n_images ? images[0] : list_file);
            batch_list_free(&v->list);
            free(images);
            return 1;
        }
    }
    free(images);
    if (cli_open_engine(&v->eng, &v->args, false)) {
        batch_list_free(&v->list);
        return 1;
    }
    v->cfg = engine_config(v->eng);

    if (SDL_Init(SDL_INIT_VIDEO) != 0) {
        cli_error("view: cannot open a window: %s (no display? try mitaseg render)", SDL_GetError());
        engine_free(v->eng);
        return 1;
    }
#ifdef MS_HAVE_X11
    const char *driver = SDL_GetCurrentVideoDriver();
    if (driver && !strcmp(driver, "x11")) g_x_error_before = XSetErrorHandler(view_x_error);
#endif
    SDL_EventState(SDL_DROPFILE, SDL_ENABLE);
    Uint32 done_event = SDL_RegisterEvents(1);
    v->jb.done_event = done_event;
    int rc = 1;
    v->win = SDL_CreateWindow("mitaseg", SDL_WINDOWPOS_CENTERED, SDL_WINDOWPOS_CENTERED, W, H,
                              SDL_WINDOW_RESIZABLE);
    if (!v->win) {
        cli_error("view: SDL_CreateWindow: %s", SDL_GetError());
        goto out;
    }
    SDL_SetWindowMinimumSize(v->win, 320, 240);
    v->ren = SDL_CreateRenderer(v->win, -1, SDL_RENDERER_PRESENTVSYNC);
    if (!v->ren) v->ren = SDL_CreateRenderer(v->win, -1, SDL_RENDERER_SOFTWARE);
    if (!v->ren) {
        cli_error("view: SDL_CreateRenderer: %s", SDL_GetError());
        goto out;
    }
    if (viz_font_open(&v->font, viz_font_path(), 13) != MS_OK ||
        viz_font_open(&v->font_big, viz_font_path(), 22) != MS_OK) {
        cli_error("drawing without text: %s", ms_last_error());
    }
    viz_state_init(&v->st);
    v->st.n_classes = v->cfg->n_classes;
    v->st.class_names = v->cfg->class_names;
    v->st.palette = v->cfg->palette;
    v->st.font = v->font;
    v->st.font_big = v->font_big;
    set_status(v, "drop an image or a folder on the window (H: help)");
    if (v->list.n > 0) load_image(v, v->list.items[0].path, 0);
    vlog(v, "window %u", (unsigned)SDL_GetWindowID(v->win));
    /* Tests: a file drop delivered through SDL's event queue as the window
     * system would (xdotool cannot synthesise X drag-and-drop). */
    const char *drop = getenv("MITASEG_VIEW_TEST_DROP");
    if (drop && *drop) {
        SDL_Event d = {.type = SDL_DROPFILE};
        d.drop.file = SDL_strdup(drop);
        d.drop.windowID = SDL_GetWindowID(v->win);
        if (d.drop.file && SDL_PushEvent(&d) != 1) SDL_free(d.drop.file);
    }

    /* Ctrl-C or SIGTERM ends the viewer at once in main()'s handler
     * (installed before SDL_Init, so SDL leaves the signals to it): there
     * is nothing to finish, as a run in flight only fills the window, and
     * the handler removes a save being written. A graceful stop would wait
     * for this loop to look, behind a redraw or a run (over a second on a
     * loaded machine). */
    bool quit = false, dirty = true;
    while (!quit) {
        if (dirty) {
            redraw(v);
            dirty = false;
        }
        SDL_Event ev;
        /* while busy, wake up to animate the indicator */
        if (!SDL_WaitEventTimeout(&ev, v->busy ? 120 : 1000)) {
            if (v->busy) {
                v->st.busy_tick++;
                dirty = true;
            }
            continue;
        }
        do {
            if (ev.type == done_event) {
                on_job_done(v);
                if (v->pending_path[0]) {
                    char p[sizeof v->pending_path];
                    memcpy(p, v->pending_path, sizeof p);
                    v->pending_path[0] = '\0';
                    open_path(v, p, v->pending_index);
                } else {
                    start_next(v);
                }
                dirty = true;
                log_layout(v);
                continue;
            }
            switch (ev.type) {
            case SDL_QUIT:
                quit = true;
                break;
            case SDL_KEYDOWN: {
                int layer = v->st.layer;
                viz_view view = v->st.view;
                bool legend_all = v->st.legend_all;
                on_key(v, &ev.key, &quit);
                if (layer != v->st.layer || view != v->st.view || legend_all != v->st.legend_all) log_layout(v);
                dirty = true;
                break;
            }
            case SDL_MOUSEMOTION:
                to_pixels(v, ev.motion.x, ev.motion.y, &v->st.mouse_x, &v->st.mouse_y);
                if (v->pressed && (ev.motion.state & SDL_BUTTON_LMASK)) {
                    int dx = v->st.mouse_x - v->last_x, dy = v->st.mouse_y - v->last_y;
                    if (!v->dragging && abs(v->st.mouse_x - v->press_x) + abs(v->st.mouse_y - v->press_y) > 3)
                        v->dragging = true;
                    if (v->dragging && (dx || dy)) {
                        sync_state(v);
                        viz_layout lay;
                        viz_layout_compute(&lay, v->tw, v->th, &v->st);
                        viz_pan(&v->st, &lay, dx, dy);
                    }
                    v->last_x = v->st.mouse_x, v->last_y = v->st.mouse_y;
                }
                dirty = true;
                break;
            case SDL_MOUSEBUTTONDOWN:
                if (ev.button.button == SDL_BUTTON_LEFT) {
                    to_pixels(v, ev.button.x, ev.button.y, &v->press_x, &v->press_y);
                    v->last_x = v->press_x, v->last_y = v->press_y;
                    v->pressed = true;
                    v->dragging = false;
                }
                break;
            case SDL_MOUSEBUTTONUP:
                /* a click is a press and release in place; a drag panned */
                if (ev.button.button == SDL_BUTTON_LEFT && v->pressed) {
                    v->pressed = false;
                    if (v->dragging) {
                        vlog(v, "panned to %.1f %.1f", v->st.center_x, v->st.center_y);
                    } else {
                        on_click(v, v->press_x, v->press_y);
                    }
                    v->dragging = false;
                    dirty = true;
                }
                break;
            case SDL_MOUSEWHEEL:
                if (SDL_GetModState() & (KMOD_CTRL | KMOD_GUI)) {
                    if (ev.wheel.y) zoom_by(v, ev.wheel.y > 0 ? 1.25f : 0.8f, v->st.mouse_x, v->st.mouse_y);
                } else {
                    if (v->have_res && ev.wheel.y > 0 && v->st.layer + 1 < v->res.depth) v->st.layer++;
                    if (ev.wheel.y < 0 && v->st.layer > 0) v->st.layer--;
                }
                dirty = true;
                break;
            case SDL_WINDOWEVENT:
                if (ev.window.event == SDL_WINDOWEVENT_LEAVE) v->st.mouse_x = v->st.mouse_y = -1;
                if (ev.window.event == SDL_WINDOWEVENT_SIZE_CHANGED) {
                    dirty = true;
                    ensure_texture(v);
                    log_layout(v);
                }
                if (ev.window.event == SDL_WINDOWEVENT_EXPOSED) dirty = true;
                break;
            case SDL_DROPFILE:
                if (v->busy) {
                    snprintf(v->pending_path, sizeof v->pending_path, "%s", ev.drop.file);
                    v->pending_index = -2; /* a dropped path: file or folder */
                    set_status(v, "%s: opens when the current run ends", base_name(ev.drop.file));
                } else {
                    open_path(v, ev.drop.file, -2);
                }
                SDL_free(ev.drop.file);
                dirty = true;
                break;
            default:
                break;
            }
        } while (!quit && SDL_PollEvent(&ev));
    }
    rc = 0;
out:
    viewer_free(v);
    SDL_Quit();
    return rc;
}
#endif
