/* The renderer: view state -> RGBA pixels. Everything it draws comes from its
 * arguments; scratch memory is allocated per call. */
#include "render.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const view_names[VIZ_N_VIEWS] = {"overlay", "heatmap", "strip",
                                                    "expert",  "routing", "query"};

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
    "Up / Down, wheel\tlayer up / down",
    "Tab / Shift+Tab\thead: all, 0, 1, ... (expert/routing/query: all = head 0)",
    "[ / ]\tprevious / next expert (landmark)",
    "+ / -\ttint opacity",
    "O\tclass outlines on / off",
    "L\tlegend: classes present / all classes",
    "G / Shift+G\tlandmark grid +1 / -1 per side (re-runs)",
    "K / Shift+K\ttop-k x2 / /2 (re-runs)",
    "F\tfull attention / MiTA (re-runs)",
    "R\tback to the model's own budget (re-runs)",
    "S\tsave the view and the mask as PNGs next to the image",
    "Esc, Q\tquit",
    "hover\tclass and score under the pointer",
    "click legend entry\thide / show that class",
    "click film strip\tmake that layer current",
    "click image\texpert view: pick the landmark; query view: pick the query",
    "drop a file\topen that image",
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

/* ---- colours and primitives ------------------------------------------- */

static const uint8_t col_bg[3] = {30, 30, 34};
static const uint8_t col_panel[3] = {22, 22, 26};
static const uint8_t col_status[3] = {14, 14, 16};
static const uint8_t col_text[3] = {235, 235, 235};
static const uint8_t col_dim[3] = {150, 150, 155};
static const uint8_t col_white[3] = {255, 255, 255};
static const uint8_t col_black[3] = {0, 0, 0};
static const uint8_t col_pruned[3] = {VIZ_PRUNED_R, VIZ_PRUNED_G, VIZ_PRUNED_B};
static const uint8_t col_window[3] = {VIZ_WINDOW_R, VIZ_WINDOW_G, VIZ_WINDOW_B};
static const uint8_t col_pick[3] = {VIZ_PICK_R, VIZ_PICK_G, VIZ_PICK_B};
static const uint8_t col_query[3] = {VIZ_QUERY_R, VIZ_QUERY_G, VIZ_QUERY_B};
static const uint8_t col_strip_bg[3] = {VIZ_STRIP_BG, VIZ_STRIP_BG, VIZ_STRIP_BG};
static const uint8_t col_tile_border[3] = {90, 90, 96};
static const uint8_t col_tile_sel[3] = {255, 255, 255};
static const uint8_t col_tile_full[3] = {230, 140, 40};
static const uint8_t col_full_fill[3] = {58, 52, 46};

typedef struct {
    uint8_t *px;
    int W, H;
    const viz_font *font;
    int line_h;
} canvas;

static inline void put(const canvas *c, int x, int y, const uint8_t rgb[3])
{
    if (x < 0 || y < 0 || x >= c->W || y >= c->H) return;
    uint8_t *d = c->px + ((size_t)y * c->W + x) * 4;
    d[0] = rgb[0];
    d[1] = rgb[1];
    d[2] = rgb[2];
    d[3] = 255;
}

/* a in 1/256 steps: |result - exact blend| <= 1 */
static inline void blend3(uint8_t out[3], const uint8_t src[3], const uint8_t col[3], int a)
{
    for (int ch = 0; ch < 3; ch++) out[ch] = (uint8_t)((src[ch] * (256 - a) + col[ch] * a + 128) >> 8);
}

static inline int alpha256(float a)
{
    if (!(a >= 0)) a = 0;
    if (a > 1) a = 1;
    return (int)lrintf(a * 256.0f);
}

static void fill(const canvas *c, viz_rect r, const uint8_t rgb[3])
{
    for (int y = r.y; y < r.y + r.h; y++)
        for (int x = r.x; x < r.x + r.w; x++) put(c, x, y, rgb);
}

static void shade(const canvas *c, viz_rect r, const uint8_t rgb[3], int a)
{
    for (int y = r.y < 0 ? 0 : r.y; y < r.y + r.h && y < c->H; y++)
        for (int x = r.x < 0 ? 0 : r.x; x < r.x + r.w && x < c->W; x++) {
            uint8_t *d = c->px + ((size_t)y * c->W + x) * 4;
            blend3(d, d, rgb, a);
        }
}

static void frame(const canvas *c, viz_rect r, const uint8_t rgb[3], int t)
{
    for (int i = 0; i < t; i++) {
        for (int x = r.x + i; x < r.x + r.w - i; x++) {
            put(c, x, r.y + i, rgb);
            put(c, x, r.y + r.h - 1 - i, rgb);
        }
        for (int y = r.y + i; y < r.y + r.h - i; y++) {
            put(c, r.x + i, y, rgb);
            put(c, r.x + r.w - 1 - i, y, rgb);
        }
    }
}

static int text(const canvas *c, int x, int y, const char *s, const uint8_t rgb[3])
{
    return viz_text_draw(c->px, c->W, c->H, c->font, x, y, s, rgb);
}

static int text_w(const canvas *c, const char *s) { return viz_text_width(c->font, s); }

/* Shortens buf (size bytes) in place to at most w pixels, ending in ".."
 * when cut. */
static void text_fit(const canvas *c, char *buf, size_t size, int w)
{
    size_t n = strlen(buf);
    if (!c->font || text_w(c, buf) <= w || size < 3) return;
    char tmp[300];
    while (n > 0) {
        n--;
        snprintf(tmp, sizeof tmp, "%.*s..", (int)n, buf);
        if (text_w(c, tmp) <= w) break;
    }
    if (n + 3 > size) n = size - 3;
    snprintf(buf + n, size - n, "..");
}

/* Draws s cut to w pixels. */
static void text_in(const canvas *c, int w, int x, int y, const char *s, const uint8_t rgb[3])
{
    char buf[300];
    snprintf(buf, sizeof buf, "%s", s);
    text_fit(c, buf, sizeof buf, w);
    text(c, x, y, buf, rgb);
}

/* Text with a dark one-pixel shadow, for labels over pictures. */
static void text_shadow(const canvas *c, int x, int y, const char *s, const uint8_t rgb[3])
{
    text(c, x + 1, y + 1, s, col_black);
    text(c, x, y, s, rgb);
}

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

static void class_counts(int64_t *cnt /* (256) */, const ms_result *r)
{
    memset(cnt, 0, sizeof *cnt * MS_MAX_CLASSES);
    size_t n = (size_t)r->h * r->w;
    for (size_t i = 0; i < n; i++) cnt[r->mask[i]]++;
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
    lay->image = fit(inner, st->img->w, st->img->h);

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
    if (st->view == VIZ_OVERLAY) {
        int64_t cnt[MS_MAX_CLASSES];
        class_counts(cnt, r);
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
    if (st->view == VIZ_STRIP) {
        for (int l = 0; l < lay->n_big; l++)
            if (viz_rect_contains(lay->big[l], x, y)) {
                h.kind = VIZ_HIT_LAYER;
                h.value = l;
                return h;
            }
        return h;
    }
    if (st->img && viz_rect_contains(lay->image, x, y)) {
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
    viz_rect rect;
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

static bool pixmap_init(pixmap *p, viz_rect rect, const ms_image *img, const ms_result *r)
{
    memset(p, 0, sizeof *p);
    p->rect = rect;
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
        p->ox[x] = (int)((int64_t)x * img->w / rect.w);
        p->tc[x] = r ? (int)((int64_t)p->ox[x] * r->rw / r->w) / r->patch : -1;
        if (r) {
            if (p->c0[p->tc[x]] < 0) p->c0[p->tc[x]] = rect.x + x;
            p->c1[p->tc[x]] = rect.x + x + 1;
        }
    }
    for (int y = 0; y < rect.h; y++) {
        p->oy[y] = (int)((int64_t)y * img->h / rect.h);
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
} view_ctx;

static void draw_image(const canvas *c, const pixmap *p, const viz_state *st, const view_ctx *v)
{
    const ms_image *img = st->img;
    const ms_result *r = v->r;
    int a = alpha256(st->opacity);
    viz_rect im = p->rect;
    int e = st->expert;
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
        int qx = im.x + (int)(((int64_t)st->query_x * im.w + im.w / 2) / img->w);
        int qy = im.y + (int)(((int64_t)st->query_y * im.h + im.h / 2) / img->h);
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
        class_counts(cnt, r);
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
        snprintf(buf, sizeof buf, "%s  %.2f", cls < st->n_classes ? st->class_names[cls] : "?",
                 (double)viz_pixel_score(r, h.img_y, h.img_x));
        text_in(c, p.w, p.x, y + c->line_h, buf, col_text);
        if (v->rec && v->layer_mita && h.token >= 0) {
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
    const char *l1 = "Drop an image on this window";
    const char *l2 = "or pass a path: mitaseg view IMAGE.png";
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
    if (st->view != VIZ_STRIP || !v.layers) {
        pixmap p;
        if (pixmap_init(&p, lay.image, st->img, v.r)) {
            draw_image(&c, &p, st, &v);
            pixmap_free(&p);
        }
        if (v.layers && !v.layer_mita && st->view != VIZ_OVERLAY) {
            char buf[80];
            snprintf(buf, sizeof buf, "layer %d ran full attention: every position read", v.layer);
            text_shadow(&c, lay.image.x + 8, lay.image.y + 6, buf, col_tile_full);
        }
    }
    if (v.layers) draw_tiles(&c, &lay, st, &v, scratch);
    draw_panel(&c, &lay, st, &v);
    draw_status(&c, &lay, st);
    if (st->help) draw_help(&c, &lay);
    free(v.count);
    free(scratch);
}
