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

#include "viz/render.h"

static const char view_usage[] =
    "usage: mitaseg view [IMAGE] [--size WxH] [engine options]\n"
    "\n"
    "Opens the viewer: the segmentation and every layer's expert selections.\n"
    "Without IMAGE it opens on a screen to drop an image on. Press H in the\n"
    "window for the keys.\n"
    "\n"
    "options:\n"
    "  --size WxH        initial window size (default 1280x800)\n"
    "\n"
    "environment: MITASEG_VIEW_LOG=1 prints what the window does, and\n"
    "MITASEG_VIEW_TEST_DROP=FILE drops FILE on the window at start (for tests).\n";

typedef enum { JOB_NONE = 0, JOB_MAIN, JOB_FULL } job_kind;

/* One model run on the worker thread. The main thread leaves eng, img and
 * out alone until the done event arrives. */
typedef struct {
    job_kind kind;
    ms_engine *eng;
    const ms_image *img;
    ms_result *out;
    ms_run_options opt;
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
    bool have_res;
    uint8_t *full_mask;         /* (h, w) full attention's mask for this image; NULL: not yet */
    ms_run_options run;         /* current budget; record always on */
    /* worker */
    SDL_Thread *thread;
    job jb;
    bool busy;
    bool want_main, want_full;
    char pending_path[PATH_MAX]; /* dropped while busy */
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
    vfprintf(stdout, fmt, ap);
    va_end(ap);
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

static int worker_main(void *arg)
{
    job *j = arg;
    j->status = engine_run(j->eng, j->out, j->img, &j->opt);
    if (j->status != MS_OK) snprintf(j->error, sizeof j->error, "%s", ms_last_error());
    SDL_Event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = j->done_event;
    SDL_PushEvent(&ev);
    return 0;
}

/* Starts the next wanted run when the worker is free: the main run first
 * (what the user asked for), then the full-attention reference. */
static void start_next(viewer *v)
{
    if (v->busy || !v->have_img) return;
    job_kind k = v->want_main ? JOB_MAIN : v->want_full ? JOB_FULL : JOB_NONE;
    if (k == JOB_NONE) return;
    v->jb.kind = k;
    v->jb.eng = v->eng;
    v->jb.img = &v->img;
    v->jb.status = MS_OK;
    v->jb.error[0] = '\0';
    if (k == JOB_MAIN) {
        v->want_main = false;
        v->jb.out = &v->work;
        v->jb.opt = v->run;
        v->jb.opt.record = true;
    } else {
        v->want_full = false;
        v->jb.out = &v->full;
        memset(&v->jb.opt, 0, sizeof v->jb.opt);
        v->jb.opt.attention = MS_ATTN_FULL;
        v->jb.opt.tta_flip = v->run.tta_flip; /* compare like with like */
        v->jb.opt.record = false;
    }
    v->thread = SDL_CreateThread(worker_main, "mitaseg-run", &v->jb);
    if (!v->thread) {
        set_status(v, "cannot start the worker thread: %s", SDL_GetError());
        return;
    }
    v->busy = true;
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
    } else if (!v->full_mask) {
        snprintf(cmp, sizeof cmp, "vs full attention: computing...");
    } else {
        size_t n = (size_t)r->h * r->w, changed = 0;
        for (size_t i = 0; i < n; i++) changed += v->full_mask[i] != r->mask[i];
        snprintf(cmp, sizeof cmp, "vs full attention: %.2f%% px changed\n(%zu of %zu pixels)",
                 100.0 * (double)changed / (double)n, changed, n);
    }
    snprintf(v->info, sizeof v->info, "last run: %.0f ms on %s\n%s", r->ms_total, r->device_name, cmp);
}

/* Keeps the selections valid for the current result. */
static void clamp_state(viewer *v)
{
    viz_state *st = &v->st;
    const ms_result *r = &v->res;
    if (!v->have_res) return;
    if (r->depth > 0) {
        if (v->first_result) {
            st->layer = r->depth - 1;
            while (st->layer > 0 && r->layer_mita && !r->layer_mita[st->layer]) st->layer--;
        }
        if (st->layer >= r->depth) st->layer = r->depth - 1;
        if (st->layer < 0) st->layer = 0;
        if (st->head >= r->heads) st->head = -1;
        if (st->expert >= r->m || v->first_result) st->expert = (r->gh / 2) * r->gw + r->gw / 2;
    }
    if (st->query_x >= r->w || st->query_y >= r->h) st->query_x = st->query_y = -1;
    v->first_result = false;
}

static void on_job_done(viewer *v)
{
    SDL_WaitThread(v->thread, NULL);
    v->thread = NULL;
    v->busy = false;
    job *j = &v->jb;
    if (j->status != MS_OK) {
        set_status(v, "%s: %s", base_name(v->path), j->error);
        vlog(v, "error %s", j->error);
    } else if (j->kind == JOB_MAIN) {
        ms_result t = v->res;
        v->res = v->work;
        v->work = t;
        v->have_res = true;
        clamp_state(v);
        set_status(v, "%s: %dx%d, %s %dx%d k %d%s, %.0f ms", base_name(v->path), v->res.w, v->res.h,
                   v->res.attention == MS_ATTN_FULL ? "full attention" : "MiTA", v->res.gh, v->res.gw,
                   v->res.k, v->res.tta_flip ? ", flip TTA" : "", v->res.ms_total);
        if (!v->full_mask && v->res.attention != MS_ATTN_FULL) v->want_full = true;
        vlog(v, "ready %.0f ms layers %d%s", v->res.ms_total, v->res.depth,
             v->res.tta_flip ? " tta flip" : "");
    } else if (j->kind == JOB_FULL) {
        size_t n = (size_t)v->full.h * v->full.w;
        free(v->full_mask);
        v->full_mask = malloc(n);
        if (v->full_mask) memcpy(v->full_mask, v->full.mask, n);
        vlog(v, "full ready");
    }
    update_info(v);
}

static bool load_image(viewer *v, const char *path)
{
    ms_image img = {0};
    if (image_read(&img, path) != MS_OK) {
        set_status(v, "%s", ms_last_error());
        vlog(v, "error %s", ms_last_error());
        return false;
    }
    image_free(&v->img);
    v->img = img;
    v->have_img = true;
    snprintf(v->path, sizeof v->path, "%s", path);
    v->have_res = false;
    free(v->full_mask);
    v->full_mask = NULL;
    v->first_result = true;
    v->st.query_x = v->st.query_y = -1;
    v->want_main = true;
    v->want_full = false;
    char title[PATH_MAX + 16];
    snprintf(title, sizeof title, "mitaseg - %s", base_name(path));
    SDL_SetWindowTitle(v->win, title);
    set_status(v, "%s: running the model...", base_name(path));
    update_info(v);
    start_next(v);
    return true;
}

/* ---- saving ------------------------------------------------------------ */

/* False when the paths would not fit. */
static bool save_paths(char *view_path, char *mask_path, size_t n, const viewer *v)
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
    return a > 0 && b > 0 && (size_t)a < n && (size_t)b < n;
}

static bool same_file(const char *a, const char *b)
{
    char ra[PATH_MAX], rb[PATH_MAX];
    if (!realpath(a, ra) || !realpath(b, rb)) return false;
    return !strcmp(ra, rb);
}

static void save_view(viewer *v)
{
    if (!v->have_img || !v->have_res) {
        set_status(v, "nothing to save yet");
        return;
    }
    char vp[PATH_MAX], mp[PATH_MAX];
    if (!save_paths(vp, mp, sizeof vp, v)) {
        set_status(v, "not saving: the output path is too long");
        return;
    }
    /* the names always add a suffix, but never risk the input */
    if (same_file(vp, v->path) || same_file(mp, v->path)) {
        set_status(v, "not saving: %s would overwrite the input", vp);
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
    set_status(v, "saved %s and %s", vp, mp);
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
    if (reset) {
        memset(&v->run, 0, sizeof v->run);
        v->run.attention = -1;
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
        int n = v->have_res ? r->n : INT_MAX;
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

static void on_key(viewer *v, const SDL_KeyboardEvent *ke, bool *quit)
{
    SDL_Keycode k = ke->keysym.sym;
    bool shift = (ke->keysym.mod & KMOD_SHIFT) != 0;
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
    case SDLK_1: case SDLK_2: case SDLK_3: case SDLK_4: case SDLK_5: case SDLK_6:
        st->view = (viz_view)(k - SDLK_1);
        return;
    case SDLK_KP_1: case SDLK_KP_2: case SDLK_KP_3: case SDLK_KP_4: case SDLK_KP_5: case SDLK_KP_6:
        st->view = (viz_view)(k - SDLK_KP_1);
        return;
    case SDLK_UP:
    case SDLK_PAGEUP:
        if (r && st->layer + 1 < r->depth) st->layer++;
        vlog(v, "layer %d", st->layer);
        return;
    case SDLK_DOWN:
    case SDLK_PAGEDOWN:
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
        st->opacity = st->opacity + 0.1f > 1.f ? 1.f : st->opacity + 0.1f;
        set_status(v, "opacity %.0f%%", 100.0 * st->opacity);
        return;
    case SDLK_MINUS:
    case SDLK_KP_MINUS:
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
    default:
        return;
    }
}

static void sync_state(viewer *v);

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
    free(v->full_mask);
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
    const char *image = NULL;
    int W = 1280, H = 800;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int rc = cli_parse_engine_arg(&v->args, argc, argv, &i);
        if (rc < 0) return 2;
        if (rc > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(view_usage, stdout);
            fputs(cli_engine_help, stdout);
            return 0;
        }
        if (!strcmp(a, "--size")) {
            int n = 0;
            if (i + 1 >= argc || sscanf(argv[i + 1], "%dx%d%n", &W, &H, &n) != 2 || argv[i + 1][n] || W < 200 ||
                H < 150 || W > 16384 || H > 16384) {
                cli_error("--size: expected WxH, at least 200x150");
                return 2;
            }
            i++;
            continue;
        }
        if (a[0] == '-' && a[1]) {
            cli_error("view: unknown option '%s' (see mitaseg view --help)", a);
            return 2;
        }
        if (image) {
            cli_error("view: one image at a time ('%s' and '%s'); drop others on the window", image, a);
            return 2;
        }
        image = a;
    }
    const char *lg = getenv("MITASEG_VIEW_LOG");
    v->log = lg && *lg && strcmp(lg, "0");
    v->run = v->args.run;
    v->run.record = true;

    if (cli_open_engine(&v->eng, &v->args, false)) return 1;
    v->cfg = engine_config(v->eng);

    if (SDL_Init(SDL_INIT_VIDEO) != 0) {
        cli_error("view: cannot open a window: %s (no display? try mitaseg render)", SDL_GetError());
        engine_free(v->eng);
        return 1;
    }
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
        fprintf(stderr, "mitaseg: drawing without text: %s\n", ms_last_error());
    }
    viz_state_init(&v->st);
    v->st.n_classes = v->cfg->n_classes;
    v->st.class_names = v->cfg->class_names;
    v->st.palette = v->cfg->palette;
    v->st.font = v->font;
    v->st.font_big = v->font_big;
    set_status(v, "drop an image on the window (H: help)");
    if (image) load_image(v, image);
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
                    load_image(v, p);
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
                dirty = true;
                break;
            case SDL_MOUSEBUTTONDOWN:
                if (ev.button.button == SDL_BUTTON_LEFT) {
                    int x, y;
                    to_pixels(v, ev.button.x, ev.button.y, &x, &y);
                    on_click(v, x, y);
                    dirty = true;
                }
                break;
            case SDL_MOUSEWHEEL:
                if (v->have_res && ev.wheel.y > 0 && v->st.layer + 1 < v->res.depth) v->st.layer++;
                if (ev.wheel.y < 0 && v->st.layer > 0) v->st.layer--;
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
                    set_status(v, "%s: opens when the current run ends", base_name(ev.drop.file));
                } else {
                    load_image(v, ev.drop.file);
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
