/* Drawing primitives over an RGBA buffer, shared by the renderer's files
 * (render.c, plot.c): colours, clipped pixels, rectangles, text. Internal to
 * viz/. */
#ifndef MS_VIZ_CANVAS_H
#define MS_VIZ_CANVAS_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "render.h"

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

static inline void fill(const canvas *c, viz_rect r, const uint8_t rgb[3])
{
    for (int y = r.y; y < r.y + r.h; y++)
        for (int x = r.x; x < r.x + r.w; x++) put(c, x, y, rgb);
}

static inline void shade(const canvas *c, viz_rect r, const uint8_t rgb[3], int a)
{
    for (int y = r.y < 0 ? 0 : r.y; y < r.y + r.h && y < c->H; y++)
        for (int x = r.x < 0 ? 0 : r.x; x < r.x + r.w && x < c->W; x++) {
            uint8_t *d = c->px + ((size_t)y * c->W + x) * 4;
            blend3(d, d, rgb, a);
        }
}

static inline void frame(const canvas *c, viz_rect r, const uint8_t rgb[3], int t)
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

static inline int text(const canvas *c, int x, int y, const char *s, const uint8_t rgb[3])
{
    return viz_text_draw(c->px, c->W, c->H, c->font, x, y, s, rgb);
}

static inline int text_w(const canvas *c, const char *s) { return viz_text_width(c->font, s); }

/* Shortens buf (size bytes) in place to at most w pixels, ending in ".."
 * when cut. */
static inline void text_fit(const canvas *c, char *buf, size_t size, int w)
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
static inline void text_in(const canvas *c, int w, int x, int y, const char *s, const uint8_t rgb[3])
{
    char buf[300];
    snprintf(buf, sizeof buf, "%s", s);
    text_fit(c, buf, sizeof buf, w);
    text(c, x, y, buf, rgb);
}

/* Text with a dark one-pixel shadow, for labels over pictures. */
static inline void text_shadow(const canvas *c, int x, int y, const char *s, const uint8_t rgb[3])
{
    text(c, x + 1, y + 1, s, col_black);
    text(c, x, y, s, rgb);
}

/* The chart views (charts.c). */
void viz_head_color(uint8_t rgb[3], int h);
void viz_draw_stats_view(const canvas *c, const viz_layout *lay, const viz_state *st, int layer);
void viz_draw_sweep_view(const canvas *c, const viz_layout *lay, const viz_state *st);
void viz_draw_depth_chart(const canvas *c, const viz_layout *lay, const viz_state *st, int layer);
/* Panel lines of the stats and sweep views from (x, y), w wide; returns y after. */
int viz_panel_stats(const canvas *c, int x, int y, int w, const viz_state *st, int layer);

#endif
