/* The renderer: view state -> RGBA pixels. Everything it draws comes from its
 * arguments; scratch memory is allocated per call. */
#include "render.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const view_names[VIZ_N_VIEWS] = {"overlay", "heatmap", "strip", "expert", "routing",
                                                    "query",   "diff",    "stats", "sweep"};

const char *viz_view_name(viz_view v)
{
    return (unsigned)v < VIZ_N_VIEWS ? view_names[v] : "?";
}

int viz_view_parse(const char *s)
{
    for (int v = 0; v < VIZ_N_VIEWS; v++)
        if (!strcmp(s, view_names[v])) return v;
    return -1;
}

const char *const viz_help_lines[] = {
    "H, ?, F1\thelp on / off",
    "1 .. 6\tview: overlay, heatmap, strip, expert, routing, query",
    "7 / 8 / 9\tview: difference from full attention, layer statistics, budget sweep",
    "9 (again)\tre-run the budget sweep",
    "X\tdifference view: outlines / split at the pointer",
    "PageDown / PageUp, Space / Backspace\tnext / previous image",
    "Up / Down, wheel\tlayer up / down",
    "Ctrl+wheel, Ctrl+= / Ctrl+-\tzoom about the pointer; drag: pan; 0: fit",
    "Tab / Shift+Tab\thead: all, 0, 1, ... (expert/routing/query: all = head 0)",
    "[ / ]\tprevious / next expert (landmark)",
    "+ / -\ttint opacity",
    "O\tclass outlines on / off",
    "L\tlegend: classes present / all classes",
    "G / Shift+G\tlandmark grid +1 / -1 per side (re-runs)",
    "K / Shift+K\ttop-k x2 / /2 (re-runs)",
    "F\tfull attention / MiTA (re-runs)",
    "R\tback to the model's own budget (re-runs)",
    "T\tflip TTA on / off: the mirror image's logits averaged in (re-runs)",
    "S\tsave the view, the mask and NAME.stats.json next to the image",
    "Esc, Q\tquit",
    "hover\tclass and score under the pointer",
    "click legend entry\thide / show that class",
    "click film strip, chart\tmake that layer current",
    "click image\texpert view: pick the landmark; query view: pick the query",
    "drop a file or folder\topen it",
    NULL,
};

void viz_state_init(viz_state *st)
{
    memset(st, 0, sizeof *st);
    st->view = VIZ_OVERLAY;
    st->head = -1;
    st->query_x = st->query_y = -1;
    st->opacity = 0.5f;
    st->mouse_x = st->mouse_y = -1;
    st->zoom = 1.0f;
}

/* Layers to show: a MiTA record, or a full-attention run (every layer full). */
static bool has_layers(const ms_result *r);
static bool layer_is_mita(const ms_result *r, int l);

static bool has_record(const ms_result *r)
{
    return r && r->depth > 0 && r->heads > 0 && r->layer_mita && r->topk_idx && r->route &&
           r->m > 0 && r->k > 0 && r->n > 0 && r->patch > 0 && r->gh > 0 && r->gw > 0;
}

static bool has_layers(const ms_result *r)
{
    return r && r->depth > 0 && r->depth <= VIZ_MAX_LAYERS &&
           (has_record(r) || r->attention == MS_ATTN_FULL);
}

static bool layer_is_mita(const ms_result *r, int l)
{
    return has_record(r) && l >= 0 && l < r->depth && r->layer_mita[l];
}

const ms_result *viz_result(const viz_state *st)
{
    const ms_result *r = st->res;
    if (!st->img || !r || !r->mask || r->h != st->img->h || r->w != st->img->w) return NULL;
    if (r->rh <= 0 || r->rw <= 0 || r->patch <= 0 || r->hp <= 0 || r->wp <= 0) return NULL;
    return r;
}

int viz_view_head(const viz_state *st)
{
    return st->head < 0 ? 0 : st->head;
}

const ms_result *viz_full(const viz_state *st)
{
    const ms_result *r = viz_result(st), *f = st->full;
    if (!r || !f || !f->mask || f->h != r->h || f->w != r->w) return NULL;
    return f;
}

int viz_split_x(const viz_layout *lay, const viz_state *st)
{
    if (viz_rect_contains(lay->clip, st->mouse_x, st->mouse_y)) return st->mouse_x;
    return lay->clip.x + lay->clip.w / 2;
}

/* ---- colours and primitives ------------------------------------------- */

#include "canvas.h"
#include "plot.h"


/* ---- layout ------------------------------------------------------------ */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Largest rectangle of aspect w:h centred in box. */
static viz_rect fit(viz_rect box, int w, int h)
{
    viz_rect r = box;
    if (w <= 0 || h <= 0 || box.w <= 0 || box.h <= 0) return (viz_rect){box.x, box.y, 0, 0};
    if ((int64_t)box.w * h <= (int64_t)box.h * w) {
        r.w = box.w;
        r.h = (int)((int64_t)box.w * h / w);
    } else {
        r.h = box.h;
        r.w = (int)((int64_t)box.h * w / h);
    }
    if (r.w < 1) r.w = 1;
    if (r.h < 1) r.h = 1;
    r.x = box.x + (box.w - r.w) / 2;
    r.y = box.y + (box.h - r.h) / 2;
    return r;
}

/* Panel rows before the view-specific part: title, layer, head. */
#define PANEL_HEAD_ROWS 4
/* Rows kept at the panel bottom for run facts and the hover readout. */
#define PANEL_FOOT_ROWS 7

static void class_counts(int64_t *cnt /* (256) */, const viz_state *st, const ms_result *r)
{
    memset(cnt, 0, sizeof *cnt * MS_MAX_CLASSES);
    if (st->class_pixels) { /* counted once by the caller: large images stay smooth */
        memcpy(cnt, st->class_pixels, sizeof *cnt * (st->n_classes < MS_MAX_CLASSES ? st->n_classes : MS_MAX_CLASSES));
        return;
    }
    size_t n = (size_t)r->h * r->w;
    for (size_t i = 0; i < n; i++) cnt[r->mask[i]]++;
}

static bool view_zooms(viz_view v) { return v != VIZ_STRIP && v != VIZ_STATS && v != VIZ_SWEEP; }

static viz_rect intersect(viz_rect a, viz_rect b)
{
    int x0 = a.x > b.x ? a.x : b.x, y0 = a.y > b.y ? a.y : b.y;
    int x1 = a.x + a.w < b.x + b.w ? a.x + a.w : b.x + b.w, y1 = a.y + a.h < b.y + b.h ? a.y + a.h : b.y + b.h;
    if (x1 <= x0 || y1 <= y0) return (viz_rect){x0, y0, 0, 0};
    return (viz_rect){x0, y0, x1 - x0, y1 - y0};
}

/* The centre (image pixels) clamped so a zoomed image that is larger than
 * the area always covers it. */
static double clamp_centre(double c, int img, int zoomed, int area)
{
    if (zoomed <= area) return img / 2.0;
    double half = (double)area / 2 * img / zoomed;
    return c < half ? half : c > img - half ? img - half : c;
}

/* The image rectangle at the state's zoom (extending past inner when zoomed). */
static viz_rect zoomed_image(viz_rect inner, const viz_state *st)
{
    viz_rect f = fit(inner, st->img->w, st->img->h);
    if (!(st->zoom > 1.0f) || !view_zooms(st->view)) return f;
    float z = st->zoom > VIZ_ZOOM_MAX ? VIZ_ZOOM_MAX : st->zoom;
    int zw = (int)lround((double)f.w * z), zh = (int)lround((double)f.h * z);
    double cx = clamp_centre(st->center_x, st->img->w, zw, inner.w);
    double cy = clamp_centre(st->center_y, st->img->h, zh, inner.h);
    viz_rect r = {inner.x + inner.w / 2 - (int)lround(cx * zw / st->img->w),
                  inner.y + inner.h / 2 - (int)lround(cy * zh / st->img->h), zw, zh};
    if (zw <= inner.w) r.x = inner.x + (inner.w - zw) / 2;
    if (zh <= inner.h) r.y = inner.y + (inner.h - zh) / 2;
    return r;
}

static viz_rect main_inner(const viz_layout *lay)
{
    return (viz_rect){lay->main.x + 4, lay->main.y + 4, lay->main.w - 8, lay->main.h - 8};
}

void viz_zoom_fit(viz_state *st)
{
    st->zoom = 1.0f;
    if (st->img) st->center_x = st->img->w / 2.0, st->center_y = st->img->h / 2.0;
}

void viz_zoom_at(viz_state *st, const viz_layout *lay, float z, int wx, int wy)
{
    if (!st->img || lay->image.w < 1 || lay->image.h < 1 || !view_zooms(st->view)) return;
    viz_rect inner = main_inner(lay), f = fit(inner, st->img->w, st->img->h);
    if (!viz_rect_contains(lay->clip, wx, wy)) wx = inner.x + inner.w / 2, wy = inner.y + inner.h / 2;
    /* the image point under the pointer stays under it */
    double px = (double)(wx - lay->image.x) * st->img->w / lay->image.w;
    double py = (double)(wy - lay->image.y) * st->img->h / lay->image.h;
    float nz = st->zoom * z;
    if (nz < 1.0f) nz = 1.0f;
    if (nz > VIZ_ZOOM_MAX) nz = VIZ_ZOOM_MAX;
    double zw = (double)f.w * nz, zh = (double)f.h * nz;
    double x0 = wx - px * zw / st->img->w, y0 = wy - py * zh / st->img->h;
    st->zoom = nz;
    st->center_x = clamp_centre((inner.x + inner.w / 2 - x0) * st->img->w / zw, st->img->w, (int)lround(zw), inner.w);
    st->center_y = clamp_centre((inner.y + inner.h / 2 - y0) * st->img->h / zh, st->img->h, (int)lround(zh), inner.h);
}

void viz_pan(viz_state *st, const viz_layout *lay, int dx, int dy)
{
    if (!st->img || !(st->zoom > 1.0f) || lay->image.w < 1 || !view_zooms(st->view)) return;
    viz_rect inner = main_inner(lay);
    st->center_x = clamp_centre(st->center_x - (double)dx * st->img->w / lay->image.w, st->img->w, lay->image.w, inner.w);
    st->center_y = clamp_centre(st->center_y - (double)dy * st->img->h / lay->image.h, st->img->h, lay->image.h, inner.h);
}

void viz_layout_compute(viz_layout *lay, int W, int H, const viz_state *st)
{
    memset(lay, 0, sizeof *lay);
    lay->W = W;
    lay->H = H;
    lay->line_h = st->font ? viz_font_height(st->font) + 2 : 14;
    int lh = lay->line_h;
    lay->status = (viz_rect){0, H - (lh + 6), W, lh + 6};
    if (!st->img) {
        lay->main = (viz_rect){0, 0, W, lay->status.y};
        return;
    }
    const ms_result *r = viz_result(st);
    int pw = clampi(W * 28 / 100, 150, 300);
    if (pw > W / 2) pw = W / 2;
    int avail_h = lay->status.y;
    int sh = has_layers(r) ? clampi(avail_h * 16 / 100, 40, 130) : 0;
    lay->panel = (viz_rect){W - pw, 0, pw, avail_h};
    lay->strip = (viz_rect){0, avail_h - sh, W - pw, sh};
    lay->main = (viz_rect){0, 0, W - pw, avail_h - sh};
    viz_rect inner = {lay->main.x + 4, lay->main.y + 4, lay->main.w - 8, lay->main.h - 8};
    lay->image = zoomed_image(inner, st);
    lay->clip = intersect(lay->image, inner);
    lay->depth_chart = -1;

    if (!r) return;
    if (has_layers(r)) {
        int n = r->depth;
        int pad = 4, gap = 4;
        int th = sh - 2 * pad;
        int tw = (int)((int64_t)th * r->w / r->h);
        if (n * tw + (n - 1) * gap > lay->strip.w - 2 * pad) {
            tw = (lay->strip.w - 2 * pad - (n - 1) * gap) / n;
            th = (int)((int64_t)tw * r->h / r->w);
        }
        if (tw >= 3 && th >= 3) {
            lay->n_tiles = n;
            int y = lay->strip.y + (sh - th) / 2;
            for (int l = 0; l < n; l++)
                lay->tile[l] = (viz_rect){lay->strip.x + pad + l * (tw + gap), y, tw, th};
        }
        if (st->view == VIZ_STRIP) {
            /* the grid of columns that gives the largest tiles */
            int best = 0, best_cols = 1;
            for (int cols = 1; cols <= n; cols++) {
                int rows = (n + cols - 1) / cols;
                int cw = (inner.w - (cols - 1) * gap) / cols;
                int ch = (inner.h - rows * (lh + gap)) / rows;
                if (cw < 2 || ch < 2) continue;
                viz_rect f = fit((viz_rect){0, 0, cw, ch}, r->w, r->h);
                if (f.w * f.h > best) {
                    best = f.w * f.h;
                    best_cols = cols;
                }
            }
            if (best > 0) {
                int cols = best_cols, rows = (n + cols - 1) / cols;
                int cw = (inner.w - (cols - 1) * gap) / cols;
                int ch = (inner.h - rows * (lh + gap)) / rows;
                viz_rect f = fit((viz_rect){0, 0, cw, ch}, r->w, r->h);
                int gw = cols * f.w + (cols - 1) * gap, gh = rows * (f.h + lh + gap) - gap;
                int x0 = inner.x + (inner.w - gw) / 2, y0 = inner.y + (inner.h - gh) / 2;
                lay->n_big = n;
                for (int l = 0; l < n; l++)
                    lay->big[l] = (viz_rect){x0 + (l % cols) * (f.w + gap),
                                             y0 + (l / cols) * (f.h + lh + gap) + lh, f.w, f.h};
            }
        }
    }
    int foot_y = lay->panel.y + lay->panel.h - PANEL_FOOT_ROWS * lh - 6;
    if (st->view == VIZ_STATS && has_record(r)) {
        /* five charts, two columns */
        int cols = 2, rows = 3, gap = 6;
        int cw = (inner.w - gap) / cols, ch = (inner.h - 2 * gap) / rows;
        for (int i = 0; i < 5; i++) {
            lay->chart_box[i] = (viz_rect){inner.x + (i % cols) * (cw + gap), inner.y + (i / cols) * (ch + gap),
                                           i == 4 ? 2 * cw + gap : cw, ch};
            lay->chart[i] = viz_chart_area(lay->chart_box[i], st->font, true);
        }
        lay->n_charts = 5;
    } else if ((st->view == VIZ_DIFF && has_layers(r)) || (st->view == VIZ_HEATMAP && has_record(r) && st->stats)) {
        int chh = clampi(lay->panel.h / 4, 90, 170);
        viz_rect box = {lay->panel.x + 2, foot_y - chh, lay->panel.w - 4, chh};
        lay->chart_box[0] = box;
        lay->chart[0] = viz_chart_area(box, st->font, true);
        lay->n_charts = 1;
        lay->depth_chart = 0;
    }
    if (st->view == VIZ_OVERLAY) {
        int64_t cnt[MS_MAX_CLASSES];
        class_counts(cnt, st, r);
        lay->legend_y = lay->panel.y + 6 + (PANEL_HEAD_ROWS + 1) * lh;
        int y = lay->legend_y;
        int y_end = lay->panel.y + lay->panel.h - PANEL_FOOT_ROWS * lh - 6;
        for (int c = 0; c < st->n_classes && c < MS_MAX_CLASSES; c++) {
            if (!st->legend_all && cnt[c] == 0) continue;
            if (y + lh > y_end) {
                lay->legend_more++;
                continue;
            }
            lay->legend[lay->n_legend] = (viz_rect){lay->panel.x + 6, y, lay->panel.w - 12, lh};
            lay->legend_class[lay->n_legend++] = c;
            y += lh;
        }
    }
}

viz_hit viz_hit_test(const viz_layout *lay, const viz_state *st, int x, int y)
{
    viz_hit h = {VIZ_HIT_NONE, -1, -1, -1, -1, -1};
    for (int i = 0; i < lay->n_legend; i++)
        if (viz_rect_contains(lay->legend[i], x, y)) {
            h.kind = VIZ_HIT_LEGEND;
            h.value = lay->legend_class[i];
            return h;
        }
    for (int l = 0; l < lay->n_tiles; l++)
        if (viz_rect_contains(lay->tile[l], x, y)) {
            h.kind = VIZ_HIT_LAYER;
            h.value = l;
            return h;
        }
    for (int i = 0; i < lay->n_charts; i++) {
        const ms_result *r = viz_result(st);
        int l = r ? viz_chart_hit(lay->chart[i], r->depth, x, y) : -1;
        if (l >= 0) {
            h.kind = VIZ_HIT_LAYER;
            h.value = l;
            return h;
        }
    }
    if (st->view == VIZ_STATS || st->view == VIZ_SWEEP) return h;
    if (st->view == VIZ_STRIP) {
        for (int l = 0; l < lay->n_big; l++)
            if (viz_rect_contains(lay->big[l], x, y)) {
                h.kind = VIZ_HIT_LAYER;
                h.value = l;
                return h;
            }
        return h;
    }
    if (st->img && viz_rect_contains(lay->clip, x, y) && lay->image.w > 0 && lay->image.h > 0) {
        h.kind = VIZ_HIT_IMAGE;
        h.img_x = (int)((int64_t)(x - lay->image.x) * st->img->w / lay->image.w);
        h.img_y = (int)((int64_t)(y - lay->image.y) * st->img->h / lay->image.h);
        const ms_result *r = viz_result(st);
        if (r) {
            h.token = viz_token_of_pixel(r, h.img_y, h.img_x);
            if (has_record(r)) h.landmark = viz_landmark_of_token(r, h.token / r->wp, h.token % r->wp);
        }
    }
    return h;
}

/* ---- the picture ------------------------------------------------------- */

/* Per-call scratch: display column/row -> original pixel and token, and each
 * token row/column's extent on screen. */
typedef struct {
    viz_rect rect;          /* the visible part of image */
    viz_rect image;         /* the whole (zoomed) image on screen */
    int *ox, *oy;           /* (rect.w), (rect.h) original pixel */
    int *tc, *tr;           /* token column / row; -1 without a result */
    int *c0, *c1, *r0, *r1; /* (wp), (hp): display extent of each token column/row, -1 if none */
} pixmap;

static void pixmap_free(pixmap *p)
{
    free(p->ox);
    free(p->oy);
    free(p->tc);
    free(p->tr);
    free(p->c0);
    free(p->c1);
    free(p->r0);
    free(p->r1);
    memset(p, 0, sizeof *p);
}

static bool pixmap_init(pixmap *p, viz_rect rect, viz_rect image, const ms_image *img, const ms_result *r)
{
    memset(p, 0, sizeof *p);
    p->rect = rect;
    p->image = image;
    int wp = r ? r->wp : 1, hp = r ? r->hp : 1;
    size_t w = rect.w > 0 ? (size_t)rect.w : 1, h = rect.h > 0 ? (size_t)rect.h : 1;
    p->ox = malloc(w * sizeof(int));
    p->tc = malloc(w * sizeof(int));
    p->oy = malloc(h * sizeof(int));
    p->tr = malloc(h * sizeof(int));
    p->c0 = malloc((size_t)wp * sizeof(int));
    p->c1 = malloc((size_t)wp * sizeof(int));
    p->r0 = malloc((size_t)hp * sizeof(int));
    p->r1 = malloc((size_t)hp * sizeof(int));
    if (!p->ox || !p->tc || !p->oy || !p->tr || !p->c0 || !p->c1 || !p->r0 || !p->r1) {
        pixmap_free(p);
        return false;
    }
    for (int i = 0; i < wp; i++) p->c0[i] = p->c1[i] = -1;
    for (int i = 0; i < hp; i++) p->r0[i] = p->r1[i] = -1;
    for (int x = 0; x < rect.w; x++) {
        p->ox[x] = (int)((int64_t)(rect.x + x - image.x) * img->w / image.w);
        p->tc[x] = r ? (int)((int64_t)p->ox[x] * r->rw / r->w) / r->patch : -1;
        if (r) {
            if (p->c0[p->tc[x]] < 0) p->c0[p->tc[x]] = rect.x + x;
            p->c1[p->tc[x]] = rect.x + x + 1;
        }
    }
    for (int y = 0; y < rect.h; y++) {
        p->oy[y] = (int)((int64_t)(rect.y + y - image.y) * img->h / image.h);
        p->tr[y] = r ? (int)((int64_t)p->oy[y] * r->rh / r->h) / r->patch : -1;
        if (r) {
            if (p->r0[p->tr[y]] < 0) p->r0[p->tr[y]] = rect.y + y;
            p->r1[p->tr[y]] = rect.y + y + 1;
        }
    }
    return true;
}

/* Screen rectangle of tokens [tr0, tr1) x [tc0, tc1), clipped to the visible
 * (non-padding) ones; w = 0 when none is visible. */
static viz_rect token_span(const pixmap *p, const ms_result *r, int tr0, int tr1, int tc0, int tc1)
{
    int x0 = -1, x1 = -1, y0 = -1, y1 = -1;
    for (int c = tc0; c < tc1 && c < r->wp; c++)
        if (p->c0[c] >= 0) {
            if (x0 < 0) x0 = p->c0[c];
            x1 = p->c1[c];
        }
    for (int rr = tr0; rr < tr1 && rr < r->hp; rr++)
        if (p->r0[rr] >= 0) {
            if (y0 < 0) y0 = p->r0[rr];
            y1 = p->r1[rr];
        }
    if (x0 < 0 || y0 < 0) return (viz_rect){0, 0, 0, 0};
    return (viz_rect){x0, y0, x1 - x0, y1 - y0};
}

static void pixel_rgb(uint8_t out[3], const ms_image *img, int oy, int ox)
{
    const uint8_t *s = img->rgb + ((size_t)oy * img->w + ox) * 3;
    out[0] = s[0];
    out[1] = s[1];
    out[2] = s[2];
}

/* The pruned look: the image in dimmed grey under light diagonal hatching. */
static void pruned_rgb(uint8_t out[3], const uint8_t src[3], int x, int y)
{
    if (viz_hatch(x, y)) {
        memcpy(out, col_pruned, 3);
        return;
    }
    int g = (src[0] * 77 + src[1] * 150 + src[2] * 29) >> 8;
    out[0] = out[1] = out[2] = (uint8_t)(g * 2 / 5);
}

static void heat_rgb(uint8_t out[3], int count, int max)
{
    viz_viridis(out, viz_heat_level(count, max));
}

static void window_outline(const canvas *c, const pixmap *p, const ms_result *r, int e)
{
    int r0, r1, c0, c1;
    mita_landmark_window(&r0, &r1, &c0, &c1, e, r->hp, r->wp, r->gh, r->gw);
    viz_rect w = token_span(p, r, r0, r1, c0, c1);
    if (w.w > 0) {
        frame(c, (viz_rect){w.x - 1, w.y - 1, w.w + 2, w.h + 2}, col_black, 1);
        frame(c, w, col_window, 2);
    }
}

/* Landmark cell boundaries (floor(i*hp/gh)), faint, over the image. */
static void landmark_grid(const canvas *c, const pixmap *p, const ms_result *r)
{
    viz_rect im = p->rect;
    for (int i = 1; i < r->gh; i++) {
        int tr = i * r->hp / r->gh;
        int y = tr < r->hp ? p->r0[tr] : -1;
        if (y < 0) continue;
        for (int x = im.x; x < im.x + im.w; x++) {
            uint8_t *d = c->px + ((size_t)y * c->W + x) * 4;
            blend3(d, d, col_white, 90);
        }
    }
    for (int j = 1; j < r->gw; j++) {
        int tc = j * r->wp / r->gw;
        int x = tc < r->wp ? p->c0[tc] : -1;
        if (x < 0) continue;
        for (int y = im.y; y < im.y + im.h; y++) {
            uint8_t *d = c->px + ((size_t)y * c->W + x) * 4;
            blend3(d, d, col_white, 90);
        }
    }
}

/* Picked positions: tinted and outlined. */
static void mark_picks(const canvas *c, const pixmap *p, const ms_result *r, const int32_t *idx,
                       int a)
{
    for (int j = 0; j < r->k; j++) {
        int t = idx[j];
        if (t < 0 || t >= r->n) continue;
        viz_rect s = token_span(p, r, t / r->wp, t / r->wp + 1, t % r->wp, t % r->wp + 1);
        if (s.w <= 0) continue;
        shade(c, s, col_pick, a);
        frame(c, s, col_pick, 1);
    }
}

static const int32_t *expert_idx(const ms_result *r, int layer, int head, int e)
{
    return r->topk_idx + (((size_t)layer * r->heads + head) * r->m + e) * r->k;
}

static const int32_t *route_of(const ms_result *r, int layer, int head)
{
    return r->route + ((size_t)layer * r->heads + head) * (r->n + r->ncls); /* class token last */
}

/* Draws one layer's heatmap into rect (film strip and strip view tiles). */
static void draw_heat_tile(const canvas *c, viz_rect rect, const ms_image *img, const ms_result *r,
                           const int *count, int max)
{
    uint8_t *tok_rgb = malloc((size_t)r->n * 3); /* (n, 3) */
    if (!tok_rgb) return;
    for (int t = 0; t < r->n; t++) heat_rgb(tok_rgb + 3 * t, count[t], max);
    for (int y = 0; y < rect.h; y++) {
        int oy = (int)((int64_t)y * img->h / rect.h);
        for (int x = 0; x < rect.w; x++) {
            int ox = (int)((int64_t)x * img->w / rect.w);
            int t = viz_token_of_pixel(r, oy, ox);
            static const uint8_t base[3] = {40, 40, 40};
            const uint8_t *rgb = count[t] > 0 ? tok_rgb + 3 * t
                                 : viz_hatch(rect.x + x, rect.y + y) ? col_pruned : base;
            put(c, rect.x + x, rect.y + y, rgb);
        }
    }
    free(tok_rgb);
}

static void draw_full_tile(const canvas *c, viz_rect rect)
{
    fill(c, rect, col_full_fill);
    const char *s = "full";
    int tw = text_w(c, s);
    if (tw < rect.w) text(c, rect.x + (rect.w - tw) / 2, rect.y + (rect.h - c->line_h) / 2, s, col_tile_full);
}

typedef struct {
    const ms_result *r;     /* NULL: no result */
    bool rec;               /* MiTA record present */
    bool layers;            /* layers to show (record or full-attention run) */
    bool layer_mita;        /* current layer ran MiTA */
    int layer, head, vhead; /* head: -1 all; vhead: per-head views */
    int *count;             /* (n) current layer's selection counts */
    int max;                /* shared heatmap scale */
    int pruned_tokens, image_tokens;
    int split_x;            /* difference view's divider (window x) */
} view_ctx;

static void draw_image(const canvas *c, const pixmap *p, const viz_state *st, const view_ctx *v)
{
    const ms_image *img = st->img;
    const ms_result *r = v->r;
    int a = alpha256(st->opacity);
    viz_rect im = p->rect;
    int e = st->expert;
    const ms_result *full = st->view == VIZ_DIFF ? viz_full(st) : NULL;
    int split_x = v->split_x;
    const int32_t *route = NULL;
    if (v->rec && v->layer_mita) route = route_of(r, v->layer, v->vhead);
    /* per-token tint colours, computed once rather than per pixel */
    uint8_t *tok_rgb = NULL; /* (n, 3) */
    if (route && (st->view == VIZ_HEATMAP || st->view == VIZ_ROUTING)) {
        tok_rgb = malloc((size_t)r->n * 3);
        if (!tok_rgb) return;
        for (int t = 0; t < r->n; t++) {
            if (st->view == VIZ_HEATMAP) heat_rgb(tok_rgb + 3 * t, v->count[t], v->max);
            else viz_expert_color(tok_rgb + 3 * t, route[t]);
        }
    }
    for (int y = 0; y < im.h; y++) {
        int oy = p->oy[y];
        for (int x = 0; x < im.w; x++) {
            int ox = p->ox[x];
            uint8_t rgb[3];
            pixel_rgb(rgb, img, oy, ox);
            int wx = im.x + x, wy = im.y + y;
            if (r) {
                int t = p->tr[y] * r->wp + p->tc[x];
                int cls = r->mask[(size_t)oy * r->w + ox];
                switch (st->view) {
                case VIZ_OVERLAY:
                    if (cls < st->n_classes && !viz_class_hidden(st, cls))
                        blend3(rgb, rgb, st->palette[cls], a);
                    break;
                case VIZ_HEATMAP:
                    if (v->layer_mita) {
                        if (v->count[t] > 0) {
                            blend3(rgb, rgb, tok_rgb + 3 * t, a);
                        } else {
                            pruned_rgb(rgb, rgb, wx, wy);
                        }
                    }
                    break;
                case VIZ_EXPERT:
                    if (route && route[t] == e) blend3(rgb, rgb, col_query, a);
                    break;
                case VIZ_ROUTING:
                    if (route) blend3(rgb, rgb, tok_rgb + 3 * t, a);
                    break;
                case VIZ_DIFF: {
                    /* the image dimmed; changed pixels in MiTA's class colour
                     * (split: full attention's right of the divider) */
                    int g = (rgb[0] * 77 + rgb[1] * 150 + rgb[2] * 29) >> 8;
                    rgb[0] = rgb[1] = rgb[2] = (uint8_t)(g * 2 / 5);
                    if (full) {
                        int fc = full->mask[(size_t)oy * r->w + ox];
                        int show = st->diff_split && wx >= split_x ? fc : cls;
                        if (fc != cls && show < st->n_classes) memcpy(rgb, st->palette[show], 3);
                    }
                    break;
                }
                default:
                    break;
                }
            }
            put(c, wx, wy, rgb);
        }
    }
    free(tok_rgb);
    if (!r) return;
    if (st->view == VIZ_OVERLAY && st->outlines) {
        /* a boundary pixel: its class differs from the right or lower
         * neighbour's on screen, and one of the two classes is shown */
        for (int y = 0; y < im.h; y++)
            for (int x = 0; x < im.w; x++) {
                int k0 = r->mask[(size_t)p->oy[y] * r->w + p->ox[x]];
                int kr = x + 1 < im.w ? r->mask[(size_t)p->oy[y] * r->w + p->ox[x + 1]] : k0;
                int kd = y + 1 < im.h ? r->mask[(size_t)p->oy[y + 1] * r->w + p->ox[x]] : k0;
                int k1 = kr != k0 ? kr : kd;
                if (k1 == k0) continue;
                if (viz_class_hidden(st, k0) && viz_class_hidden(st, k1)) continue;
                put(c, im.x + x, im.y + y, col_white);
            }
    }
    if (full && !st->diff_split) {
        /* full attention's class as a one-pixel outline around each changed
         * region: a changed pixel with an unchanged 4-neighbour on screen */
#define CHANGED(yy, xx) (r->mask[(size_t)p->oy[yy] * r->w + p->ox[xx]] != full->mask[(size_t)p->oy[yy] * r->w + p->ox[xx]])
        for (int y = 0; y < im.h; y++)
            for (int x = 0; x < im.w; x++) {
                if (!CHANGED(y, x)) continue;
                bool edge = x == 0 || y == 0 || x + 1 == im.w || y + 1 == im.h || !CHANGED(y, x - 1) ||
                            !CHANGED(y, x + 1) || !CHANGED(y - 1, x) || !CHANGED(y + 1, x);
                int fc = full->mask[(size_t)p->oy[y] * r->w + p->ox[x]];
                if (edge && fc < st->n_classes) put(c, im.x + x, im.y + y, st->palette[fc]);
            }
#undef CHANGED
    } else if (full) {
        for (int y = im.y; y < im.y + im.h; y++) put(c, split_x, y, col_white);
        text_shadow(c, split_x - text_w(c, "MiTA") - 6, im.y + 4, "MiTA", col_white);
        text_shadow(c, split_x + 6, im.y + 4, "full attention", col_white);
    }
    if (!v->rec || !v->layer_mita) return;
    if (st->view == VIZ_EXPERT && e >= 0 && e < r->m) {
        landmark_grid(c, p, r);
        mark_picks(c, p, r, expert_idx(r, v->layer, v->vhead, e), a > 64 ? a : 64);
        window_outline(c, p, r, e);
    } else if (st->view == VIZ_ROUTING) {
        landmark_grid(c, p, r);
    } else if (st->view == VIZ_QUERY && st->query_x >= 0 && st->query_y >= 0 &&
               st->query_x < img->w && st->query_y < img->h) {
        int t = viz_token_of_pixel(r, st->query_y, st->query_x);
        int qe = route[t];
        if (qe >= 0 && qe < r->m) {
            mark_picks(c, p, r, expert_idx(r, v->layer, v->vhead, qe), a > 64 ? a : 64);
            window_outline(c, p, r, qe);
        }
        viz_rect s = token_span(p, r, t / r->wp, t / r->wp + 1, t % r->wp, t % r->wp + 1);
        if (s.w > 0) {
            frame(c, (viz_rect){s.x - 2, s.y - 2, s.w + 4, s.h + 4}, col_black, 1);
            frame(c, (viz_rect){s.x - 1, s.y - 1, s.w + 2, s.h + 2}, col_query, 2);
        }
        /* crosshair on the exact pixel */
        viz_rect fi = p->image;
        int qx = fi.x + (int)(((int64_t)st->query_x * fi.w + fi.w / 2) / img->w);
        int qy = fi.y + (int)(((int64_t)st->query_y * fi.h + fi.h / 2) / img->h);
        for (int d = -6; d <= 6; d++) {
            if (d > -2 && d < 2) continue;
            put(c, qx + d, qy, col_white);
            put(c, qx, qy + d, col_white);
        }
    }
}

static void draw_layer_label(const canvas *c, viz_rect tile, const ms_result *r, int l, bool big,
                             int *scratch, int head)
{
    char buf[64];
    if (!layer_is_mita(r, l)) {
        snprintf(buf, sizeof buf, big ? "L%d  full attention" : "L%d", l);
    } else if (big) {
        int tokens;
        viz_selection_counts(scratch, r, l, head);
        double f = viz_pruned_fraction(&tokens, scratch, r);
        snprintf(buf, sizeof buf, "L%d  pruned %.1f%%", l, 100.0 * f);
    } else {
        snprintf(buf, sizeof buf, "L%d", l);
    }
    if (big) text(c, tile.x, tile.y - c->line_h, buf, col_text);
    else if (text_w(c, buf) + 4 <= tile.w) text_shadow(c, tile.x + 3, tile.y + 2, buf, col_white);
}

static void draw_tiles(const canvas *c, const viz_layout *lay, const viz_state *st, const view_ctx *v,
                       int *scratch)
{
    const ms_result *r = v->r;
    fill(c, lay->strip, col_strip_bg);
    for (int pass = 0; pass < 2; pass++) {
        int n = pass ? lay->n_big : lay->n_tiles;
        if (pass && st->view != VIZ_STRIP) break;
        for (int l = 0; l < n; l++) {
            viz_rect t = pass ? lay->big[l] : lay->tile[l];
            viz_rect in = {t.x + 1, t.y + 1, t.w - 2, t.h - 2};
            if (layer_is_mita(r, l)) {
                viz_selection_counts(scratch, r, l, v->head);
                draw_heat_tile(c, in, st->img, r, scratch, v->max);
            } else {
                draw_full_tile(c, in);
            }
            const uint8_t *bc = l == v->layer ? col_tile_sel : layer_is_mita(r, l) ? col_tile_border : col_tile_full;
            frame(c, t, bc, 1);
            draw_layer_label(c, t, r, l, pass == 1, scratch, v->head);
        }
    }
}

/* ---- panel ------------------------------------------------------------- */

typedef struct {
    const canvas *c;
    int x, y, w;
} pen;

static void line(pen *p, const uint8_t rgb[3], const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void line(pen *p, const uint8_t rgb[3], const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    text_fit(p->c, buf, sizeof buf, p->w);
    text(p->c, p->x, p->y, buf, rgb);
    p->y += p->c->line_h;
}

static void colourbar(pen *p, int max)
{
    const canvas *c = p->c;
    int w = p->w, h = 10;
    for (int x = 0; x < w; x++) {
        uint8_t rgb[3];
        viz_viridis(rgb, (float)(x + 1) / (float)w);
        for (int y = 0; y < h; y++) put(c, p->x + x, p->y + y, rgb);
    }
    p->y += h + 2;
    /* ticks at both ends and the middle (level 0.5 is count max/4) */
    char buf[32];
    text(c, p->x, p->y, "1", col_dim);
    snprintf(buf, sizeof buf, "%d", max);
    text(c, p->x + w - text_w(c, buf), p->y, buf, col_dim);
    if (max >= 8) {
        snprintf(buf, sizeof buf, "%d", (max + 2) / 4);
        text(c, p->x + w / 2 - text_w(c, buf) / 2, p->y, buf, col_dim);
        put(c, p->x + w / 2, p->y - 2, col_dim);
        put(c, p->x + w / 2, p->y - 1, col_dim);
    }
    p->y += c->line_h;
    /* the pruned swatch, with the same hatching as the picture */
    for (int y = 0; y < 12; y++)
        for (int x = 0; x < 24; x++) {
            uint8_t rgb[3] = {40, 40, 40};
            if (viz_hatch(p->x + x, p->y + y)) memcpy(rgb, col_pruned, 3);
            put(c, p->x + x, p->y + y, rgb);
        }
    text(c, p->x + 30, p->y - 1, "pruned: no expert picked it", col_text);
    p->y += c->line_h + 2;
}

static void draw_panel(const canvas *c, const viz_layout *lay, const viz_state *st, const view_ctx *v)
{
    fill(c, lay->panel, col_panel);
    const ms_result *r = v->r;
    pen p = {c, lay->panel.x + 8, lay->panel.y + 6, lay->panel.w - 16};
    line(&p, col_text, "%d %s view", (int)st->view + 1, viz_view_name(st->view));
    if (v->layers) {
        line(&p, col_text, "layer %d of %d: %s", v->layer, r->depth, v->layer_mita ? "MiTA" : "full attention");
        if (v->head < 0 && (st->view == VIZ_EXPERT || st->view == VIZ_ROUTING || st->view == VIZ_QUERY))
            line(&p, col_dim, "heads: all (showing head 0)");
        else if (v->head < 0)
            line(&p, col_dim, "heads: all %d", r->heads);
        else
            line(&p, col_dim, "head %d of %d", v->head, r->heads);
        if (v->rec) line(&p, col_dim, "landmarks %dx%d, k %d", r->gh, r->gw, r->k);
        else line(&p, col_dim, "full-attention run: no selections");
    } else if (r) {
        line(&p, col_dim, "no MiTA record");
        p.y += 3 * c->line_h;
    } else {
        line(&p, col_dim, st->busy ? "running..." : "no result yet");
        p.y += 3 * c->line_h;
    }
    if (!r) goto foot;
    switch (st->view) {
    case VIZ_OVERLAY: {
        line(&p, col_dim, st->legend_all ? "all classes (L: present)" : "classes present (L: all)");
        int64_t cnt[MS_MAX_CLASSES];
        class_counts(cnt, st, r);
        double total = (double)r->h * r->w;
        for (int i = 0; i < lay->n_legend; i++) {
            viz_rect e = lay->legend[i];
            int cls = lay->legend_class[i];
            bool hid = viz_class_hidden(st, cls);
            viz_rect sw = {e.x, e.y + (e.h - 12) / 2, 12, 12};
            if (!hid) fill(c, sw, st->palette[cls]);
            /* hidden: an empty square; a grey rim keeps dark swatches visible */
            frame(c, sw, hid ? col_dim : col_tile_border, 1);
            char name[MS_CLASS_NAME + 4], pct[32];
            snprintf(pct, sizeof pct, hid ? "hidden" : "%.1f%%", 100.0 * cnt[cls] / total);
            snprintf(name, sizeof name, "%s", st->class_names[cls]);
            text_fit(c, name, sizeof name, e.w - 18 - text_w(c, pct) - 6);
            text(c, e.x + 18, e.y, name, hid ? col_dim : col_text);
            text(c, e.x + e.w - text_w(c, pct), e.y, pct, col_dim);
        }
        if (lay->legend_more) {
            p.y = lay->n_legend ? lay->legend[lay->n_legend - 1].y + c->line_h : lay->legend_y;
            line(&p, col_dim, "+%d more", lay->legend_more);
        }
        break;
    }
    case VIZ_HEATMAP:
    case VIZ_STRIP:
        if (!v->layers) break;
        if (v->rec) {
            line(&p, col_dim, "routed sets holding each position");
            colourbar(&p, v->max);
        }
        if (v->layer_mita)
            line(&p, col_text, "layer %d pruned: %.1f%%", v->layer,
                 v->image_tokens ? 100.0 * v->pruned_tokens / v->image_tokens : 0.0);
        if (v->layer_mita) line(&p, col_dim, "(%d of %d tokens)", v->pruned_tokens, v->image_tokens);
        else line(&p, col_dim, "full attention: nothing pruned");
        if (v->layer_mita) {
            int cp = viz_cls_picks(r, v->layer, v->head);
            if (cp >= 0) line(&p, col_text, "class token picked by %d expert%s", cp, cp == 1 ? "" : "s");
        }
        if (st->view == VIZ_HEATMAP) viz_draw_depth_chart(c, lay, st, v->layer);
        break;
    case VIZ_EXPERT:
        if (!v->rec || !v->layer_mita) break;
        if (st->expert >= 0 && st->expert < r->m) {
            int r0, r1, c0, c1, q = 0;
            mita_landmark_window(&r0, &r1, &c0, &c1, st->expert, r->hp, r->wp, r->gh, r->gw);
            const int32_t *route = route_of(r, v->layer, v->vhead);
            for (int t = 0; t < r->n; t++) q += route[t] == st->expert && viz_token_in_image(r, t);
            line(&p, col_text, "expert %d (cell %d,%d)", st->expert, st->expert / r->gw, st->expert % r->gw);
            line(&p, col_window, "window rows %d-%d, cols %d-%d", r0, r1 - 1, c0, c1 - 1);
            line(&p, col_pick, "%d positions picked", r->k);
            line(&p, col_query, "%d %s routed here", q, q == 1 ? "query" : "queries");
        }
        line(&p, col_dim, "[ ]: cycle, click: pick a cell");
        break;
    case VIZ_ROUTING: {
        if (!v->rec || !v->layer_mita) break;
        line(&p, col_dim, "expert of each patch; key:");
        int cell = clampi((p.w) / (r->gw > 0 ? r->gw : 1), 4, 18);
        for (int i = 0; i < r->gh; i++)
            for (int j = 0; j < r->gw; j++) {
                uint8_t ec[3];
                viz_expert_color(ec, i * r->gw + j);
                fill(c, (viz_rect){p.x + j * cell, p.y + i * cell, cell - 1, cell - 1}, ec);
            }
        p.y += r->gh * cell + 4;
        break;
    }
    case VIZ_QUERY:
        if (!v->rec || !v->layer_mita) break;
        if (st->query_x < 0 || st->query_y < 0 || st->query_x >= r->w || st->query_y >= r->h) {
            line(&p, col_dim, "click a pixel to pick a query");
            break;
        } else {
            int t = viz_token_of_pixel(r, st->query_y, st->query_x);
            int qe = route_of(r, v->layer, v->vhead)[t];
            line(&p, col_query, "query (%d,%d): token (%d,%d)", st->query_x, st->query_y, t / r->wp, t % r->wp);
            if (qe >= 0 && qe < r->m) line(&p, col_window, "routed to expert %d (cell %d,%d)", qe, qe / r->gw, qe % r->gw);
            line(&p, col_pick, "read %d raw positions", r->k);
            if (r->shared_mass) {
                float s = r->shared_mass[((size_t)v->layer * r->heads + v->vhead) * (r->n + r->ncls) + t];
                line(&p, col_text, "attention mass:");
                int bw = p.w, sw = (int)lrintf(s * bw);
                uint8_t shc[3], roc[3];
                viz_magma(shc, 0.35f);
                memcpy(roc, col_pick, 3);
                fill(c, (viz_rect){p.x, p.y, sw, 12}, shc);
                fill(c, (viz_rect){p.x + sw, p.y, bw - sw, 12}, roc);
                p.y += 16;
                line(&p, col_text, "shared %.1f%%  routed %.1f%%", 100.0 * s, 100.0 * (1 - s));
            }
        }
        break;
    case VIZ_DIFF: {
        const ms_result *f = viz_full(st);
        if (!f) {
            line(&p, col_dim, r->attention == MS_ATTN_FULL ? "this run is full attention (F: MiTA)"
                                                           : "full attention: computing...");
            break;
        }
        int64_t changed = 0, total = (int64_t)r->h * r->w;
        int64_t by_m[MS_MAX_CLASSES] = {0}, by_f[MS_MAX_CLASSES] = {0};
        const ms_stats *s = st->stats;
        if (s && s->have_full && s->pixels == total && s->classes <= MS_MAX_CLASSES) {
            /* counted once with the statistics */
            changed = s->changed;
            memcpy(by_m, s->changed_mita, sizeof(int64_t) * s->classes);
            memcpy(by_f, s->changed_full, sizeof(int64_t) * s->classes);
        } else {
            for (int64_t i = 0; i < total; i++)
                if (r->mask[i] != f->mask[i]) changed++, by_m[r->mask[i]]++, by_f[f->mask[i]]++;
        }
        line(&p, col_text, "%lld px differ from full (%.2f%%)", (long long)changed,
             total ? 100.0 * changed / total : 0.0);
        line(&p, col_dim, st->diff_split ? "X: outlines" : "fill MiTA, outline full (X: split)");
        int y_end = lay->depth_chart >= 0 ? lay->chart_box[lay->depth_chart].y - 2 : lay->panel.y + lay->panel.h;
        if (changed && p.y + c->line_h <= y_end) {
            /* right-aligned columns: MiTA's count, full attention's count */
            int colw = text_w(c, "0000000"), rf = p.x + p.w, rm = rf - colw;
            text(c, p.x + 18, p.y, "class", col_dim);
            text(c, rm - text_w(c, "MiTA"), p.y, "MiTA", col_dim);
            text(c, rf - text_w(c, "full"), p.y, "full", col_dim);
            p.y += c->line_h;
            for (int cl = 0; cl < st->n_classes && cl < MS_MAX_CLASSES; cl++) {
                if (!by_m[cl] && !by_f[cl]) continue;
                if (p.y + c->line_h > y_end) break;
                fill(c, (viz_rect){p.x, p.y + (c->line_h - 12) / 2, 12, 12}, st->palette[cl]);
                char name[MS_CLASS_NAME + 4], nb[32];
                snprintf(name, sizeof name, "%s", st->class_names[cl]);
                text_fit(c, name, sizeof name, rm - colw - p.x - 18);
                text(c, p.x + 18, p.y, name, col_text);
                snprintf(nb, sizeof nb, "%lld", (long long)by_m[cl]);
                text(c, rm - text_w(c, nb), p.y, nb, col_text);
                snprintf(nb, sizeof nb, "%lld", (long long)by_f[cl]);
                text(c, rf - text_w(c, nb), p.y, nb, col_text);
                p.y += c->line_h;
            }
        }
        viz_draw_depth_chart(c, lay, st, v->layer);
        break;
    }
    case VIZ_STATS:
    case VIZ_SWEEP:
        p.y = viz_panel_stats(c, p.x, p.y, p.w, st, v->layer);
        break;
    default:
        break;
    }
foot:;
    /* run facts and hover readout at the bottom */
    int y = lay->panel.y + lay->panel.h - PANEL_FOOT_ROWS * c->line_h - 4;
    if (st->info) {
        char buf[256];
        const char *s = st->info;
        int rows = 0;
        while (*s && rows < PANEL_FOOT_ROWS - 3) {
            size_t len = strcspn(s, "\n");
            snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf - 1 ? len : sizeof buf - 1), s);
            text_fit(c, buf, sizeof buf, p.w);
            text(c, p.x, y, buf, col_dim);
            y += c->line_h;
            rows++;
            s += len + (s[len] == '\n');
        }
    }
    y = lay->panel.y + lay->panel.h - 3 * c->line_h - 4;
    if (!r) return;
    viz_hit h = viz_hit_test(lay, st, st->mouse_x, st->mouse_y);
    char buf[160];
    if (h.kind == VIZ_HIT_IMAGE && h.img_x >= 0) {
        int cls = r->mask[(size_t)h.img_y * r->w + h.img_x];
        snprintf(buf, sizeof buf, "(%d,%d) token %d", h.img_x, h.img_y, h.token);
        text_in(c, p.w, p.x, y, buf, col_dim);
        const ms_result *f = st->view == VIZ_DIFF ? viz_full(st) : NULL;
        if (!f) {
            snprintf(buf, sizeof buf, "%s  %.2f", cls < st->n_classes ? st->class_names[cls] : "?",
                     (double)viz_pixel_score(r, h.img_y, h.img_x));
            text_in(c, p.w, p.x, y + c->line_h, buf, col_text);
        }
        if (f) {
            int fc = f->mask[(size_t)h.img_y * r->w + h.img_x];
            snprintf(buf, sizeof buf, "MiTA %s %.2f", cls < st->n_classes ? st->class_names[cls] : "?",
                     (double)viz_pixel_score(r, h.img_y, h.img_x));
            text_in(c, p.w, p.x, y + c->line_h, buf, fc != cls ? col_text : col_dim);
            snprintf(buf, sizeof buf, "full %s %.2f", fc < st->n_classes ? st->class_names[fc] : "?",
                     (double)viz_pixel_score(f, h.img_y, h.img_x));
            text_in(c, p.w, p.x, y + 2 * c->line_h, buf, fc != cls ? col_text : col_dim);
        } else if (v->rec && v->layer_mita && h.token >= 0) {
            snprintf(buf, sizeof buf, "picked by %d, expert %d", v->count[h.token],
                     route_of(r, v->layer, v->vhead)[h.token]);
            text_in(c, p.w, p.x, y + 2 * c->line_h, buf, col_dim);
        }
    } else if (h.kind == VIZ_HIT_LAYER) {
        snprintf(buf, sizeof buf, "layer %d: click to select", h.value);
        text_in(c, p.w, p.x, y + c->line_h, buf, col_dim);
    } else if (h.kind == VIZ_HIT_LEGEND) {
        snprintf(buf, sizeof buf, "click: %s %s", viz_class_hidden(st, h.value) ? "show" : "hide",
                 st->class_names[h.value]);
        text_in(c, p.w, p.x, y + c->line_h, buf, col_dim);
    }
}

static void draw_status(const canvas *c, const viz_layout *lay, const viz_state *st)
{
    fill(c, lay->status, col_status);
    int ty = lay->status.y + 3;
    const char *right = "H: help";
    char buf[32];
    if (st->busy) {
        static const char *const spin[] = {"|", "/", "-", "\\"};
        snprintf(buf, sizeof buf, "running %s", spin[(st->busy_tick & 0x7fffffff) % 4]);
        right = buf;
        /* a moving bar along the status line's top edge */
        int bw = lay->status.w / 6 > 8 ? lay->status.w / 6 : 8;
        int x0 = (int)((st->busy_tick * 7L) % (lay->status.w + bw)) - bw;
        fill(c, (viz_rect){x0, lay->status.y, bw, 2}, col_window);
    }
    int rw = text_w(c, right);
    if (st->status) text(c, 6, ty, st->status, col_text);
    text(c, lay->status.w - rw - 8, ty, right, st->busy ? col_window : col_dim);
}

static void draw_help(const canvas *c, const viz_layout *lay)
{
    int rows = 0, kw = 0, dw = 0;
    for (; viz_help_lines[rows]; rows++) {
        const char *s = viz_help_lines[rows];
        const char *tab = strchr(s, '\t');
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(tab ? tab - s : (long)strlen(s)), s);
        int a = text_w(c, key), b = tab ? text_w(c, tab + 1) : 0;
        if (a > kw) kw = a;
        if (b > dw) dw = b;
    }
    int w = kw + dw + 48, h = (rows + 2) * c->line_h + 16;
    if (w > lay->W - 8) w = lay->W - 8;
    if (h > lay->H - 8) h = lay->H - 8;
    viz_rect box = {(lay->W - w) / 2, (lay->H - h) / 2, w, h};
    shade(c, box, col_black, 220);
    frame(c, box, col_dim, 1);
    int y = box.y + 8;
    text(c, box.x + 16, y, "mitaseg viewer: keys and mouse", col_window);
    y += c->line_h * 3 / 2;
    for (int i = 0; i < rows && y + c->line_h < box.y + box.h; i++) {
        const char *s = viz_help_lines[i];
        const char *tab = strchr(s, '\t');
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(tab ? tab - s : (long)strlen(s)), s);
        text(c, box.x + 16, y, key, col_text);
        if (tab) text(c, box.x + 32 + kw, y, tab + 1, col_dim);
        y += c->line_h;
    }
}

static void draw_start(const canvas *c, const viz_layout *lay, const viz_state *st)
{
    canvas big = *c;
    if (st->font_big) {
        big.font = st->font_big;
        big.line_h = viz_font_height(st->font_big) + 4;
    }
    const char *l1 = "Drop an image or a folder on this window";
    const char *l2 = "or give paths: mitaseg view IMAGE.png, FOLDER, --list FILE";
    int y = lay->main.h / 2 - big.line_h;
    text(&big, (lay->W - text_w(&big, l1)) / 2, y, l1, col_text);
    text(c, (lay->W - text_w(c, l2)) / 2, y + big.line_h + 6, l2, col_dim);
    /* a dashed drop frame */
    viz_rect f = {lay->W / 8, lay->main.h / 4, lay->W * 3 / 4, lay->main.h / 2};
    for (int x = f.x; x < f.x + f.w; x++)
        if ((x / 8) % 2 == 0) {
            put(c, x, f.y, col_dim);
            put(c, x, f.y + f.h - 1, col_dim);
        }
    for (int yy = f.y; yy < f.y + f.h; yy++)
        if ((yy / 8) % 2 == 0) {
            put(c, f.x, yy, col_dim);
            put(c, f.x + f.w - 1, yy, col_dim);
        }
}

void viz_render(uint8_t *rgba, int W, int H, const viz_state *st)
{
    if (!rgba || W <= 0 || H <= 0) return;
    viz_layout lay;
    viz_layout_compute(&lay, W, H, st);
    canvas c = {rgba, W, H, st->font, lay.line_h};
    fill(&c, (viz_rect){0, 0, W, H}, col_bg);
    if (!st->img) {
        draw_start(&c, &lay, st);
        draw_status(&c, &lay, st);
        if (st->help) draw_help(&c, &lay);
        return;
    }
    view_ctx v = {0};
    v.r = viz_result(st);
    v.rec = v.r && has_record(v.r);
    v.layers = v.r && has_layers(v.r);
    v.layer = v.layers ? clampi(st->layer, 0, v.r->depth - 1) : 0;
    v.head = v.rec && st->head < v.r->heads ? st->head : -1;
    v.vhead = v.head < 0 ? 0 : v.head;
    int *scratch = NULL;
    if (v.rec) {
        v.layer_mita = v.r->layer_mita[v.layer] != 0;
        v.count = calloc((size_t)v.r->n, sizeof(int));
        scratch = calloc((size_t)v.r->n, sizeof(int));
        if (!v.count || !scratch) {
            v.rec = false;
            v.layer_mita = false;
        } else {
            v.max = viz_selection_max(scratch, v.r, v.head);
            if (viz_selection_counts(v.count, v.r, v.layer, v.head) >= 0) {
                double f = viz_pruned_fraction(&v.image_tokens, v.count, v.r);
                v.pruned_tokens = (int)lrint(f * v.image_tokens);
            }
        }
    }
    v.split_x = viz_split_x(&lay, st);
    if (st->view == VIZ_STATS && v.r) {
        viz_draw_stats_view(&c, &lay, st, v.layer);
    } else if (st->view == VIZ_SWEEP && v.r) {
        viz_draw_sweep_view(&c, &lay, st);
    } else if (st->view != VIZ_STRIP || !v.layers) {
        pixmap p;
        if (lay.clip.w > 0 && pixmap_init(&p, lay.clip, lay.image, st->img, v.r)) {
            draw_image(&c, &p, st, &v);
            pixmap_free(&p);
        }
        if (st->zoom > 1.0f && view_zooms(st->view)) {
            char zb[48];
            snprintf(zb, sizeof zb, "zoom %.1fx  (0: fit)", (double)st->zoom);
            text_shadow(&c, lay.clip.x + lay.clip.w - text_w(&c, zb) - 8, lay.clip.y + lay.clip.h - c.line_h - 4, zb,
                        col_white);
        }
        if (v.layers && !v.layer_mita && st->view != VIZ_OVERLAY && st->view != VIZ_DIFF) {
            char buf[80];
            snprintf(buf, sizeof buf, "layer %d ran full attention: every position read", v.layer);
            text_shadow(&c, lay.clip.x + 8, lay.clip.y + 6, buf, col_tile_full);
        }
    }
    if (v.layers) draw_tiles(&c, &lay, st, &v, scratch);
    draw_panel(&c, &lay, st, &v);
    draw_status(&c, &lay, st);
    if (st->help) draw_help(&c, &lay);
    free(v.count);
    free(scratch);
}
