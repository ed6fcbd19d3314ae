/* Line charts (plot.h). */
#include "plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canvas.h"

static const uint8_t col_axis[3] = {VIZ_CHART_AXIS, VIZ_CHART_AXIS, VIZ_CHART_AXIS};
static const uint8_t col_grid[3] = {52, 52, 58};
static const uint8_t col_mark[3] = {VIZ_CHART_MARK_R, VIZ_CHART_MARK_G, VIZ_CHART_MARK_B};

void viz_chart_init(viz_chart *ch)
{
    memset(ch, 0, sizeof *ch);
    ch->ref = NAN;
    ch->mark = -1;
}

static int line_h(const viz_font *f) { return f ? viz_font_height(f) + 2 : 14; }

viz_rect viz_chart_area(viz_rect box, const viz_font *font, bool xlabel)
{
    int lh = line_h(font);
    int left = font ? viz_text_width(font, "100.0%") + 8 : 30; /* the widest tick label */
    int top = lh + 6, bottom = lh + 6 + (xlabel ? lh : 0);
    viz_rect a = {box.x + left, box.y + top, box.w - left - 10, box.h - top - bottom};
    if (a.w < 1) a.w = 1;
    if (a.h < 1) a.h = 1;
    return a;
}

int viz_chart_x(viz_rect area, int n, int i)
{
    return n > 0 ? area.x + (int)(((2 * (int64_t)i + 1) * area.w) / (2 * n)) : area.x;
}

int viz_chart_hit(viz_rect area, int n, int x, int y)
{
    if (n < 1 || !viz_rect_contains(area, x, y)) return -1;
    int i = (int)((int64_t)(x - area.x) * n / area.w);
    return i < 0 ? 0 : i >= n ? n - 1 : i;
}

/* A step of 1, 2 or 5 times a power of ten giving about `want` intervals. */
static double nice_step(double range, int want)
{
    if (!(range > 0)) return 1;
    double raw = range / want, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static void seg(const canvas *c, int x0, int y0, int x1, int y1, const uint8_t rgb[3], int thick, int dash)
{
    int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy, i = 0;
    for (;;) {
        if (!dash || (i / dash) % 2 == 0)
            for (int t = 0; t < thick; t++) {
                put(c, x0, y0 + t, rgb);
                if (thick > 1) put(c, x0 + t, y0, rgb);
            }
        i++;
        if (x0 == x1 && y0 == y1) break;
        int e2 = 2 * err;
        if (e2 >= dy) err += dy, x0 += sx;
        if (e2 <= dx) err += dx, y0 += sy;
    }
}

static void fmt_tick(char *buf, size_t n, double v, double step, bool percent)
{
    if (percent) {
        double p = v * 100, ps = step * 100;
        snprintf(buf, n, ps >= 1 ? "%.0f%%" : "%.1f%%", p);
    } else if (fabs(v) >= 10000) {
        snprintf(buf, n, "%.0fk", v / 1000);
    } else {
        snprintf(buf, n, step >= 1 ? "%.0f" : step >= 0.1 ? "%.1f" : step >= 0.01 ? "%.2f" : "%.3f", v);
    }
}

void viz_chart_draw(uint8_t *rgba, int W, int H, const viz_font *font, viz_rect box, const viz_chart *ch)
{
    canvas cv = {rgba, W, H, font, line_h(font)};
    const canvas *c = &cv;
    viz_rect a = viz_chart_area(box, font, ch->xlabel != NULL);
    if (box.w < 40 || box.h < 30 || ch->n < 1) return;
    /* y range: given, or 0 .. the top of the data (and the reference) */
    double y0 = ch->ymin, y1 = ch->ymax;
    if (!(y1 > y0)) {
        y0 = 0, y1 = 0;
        for (int s = 0; s < ch->n_series; s++)
            for (int i = 0; i < ch->n; i++)
                if (ch->y[s] && isfinite(ch->y[s][i])) {
                    if (ch->y[s][i] > y1) y1 = ch->y[s][i];
                    if (ch->y[s][i] < y0) y0 = ch->y[s][i];
                }
        if (isfinite(ch->ref) && ch->ref > y1) y1 = ch->ref;
        double st = nice_step(y1 - y0, 4);
        y1 = y1 > y0 ? ceil(y1 / st - 1e-9) * st : y0 + 1;
    }
    int want = a.h / (c->line_h * 2); /* tick labels a line apart at least */
    double step = nice_step(y1 - y0, want < 1 ? 1 : want > 4 ? 4 : want);
#define YPIX(v) (a.y + a.h - 1 - (int)lround(((v) - y0) / (y1 - y0) * (a.h - 1)))
    /* grid and y ticks */
    char buf[64];
    for (double v = ceil(y0 / step - 1e-9) * step; v <= y1 + step * 1e-6; v += step) {
        int y = YPIX(v);
        for (int x = a.x; x < a.x + a.w; x++) put(c, x, y, col_grid);
        put(c, a.x - 3, y, col_axis), put(c, a.x - 2, y, col_axis);
        fmt_tick(buf, sizeof buf, fabs(v) < step * 1e-6 ? 0 : v, step, ch->percent);
        text(c, a.x - 5 - text_w(c, buf), y - c->line_h / 2, buf, col_dim);
    }
    /* x ticks: every point, or every 2nd, 5th... when the labels would touch */
    int every = 1, widest = 0;
    for (int i = 0; i < ch->n; i++) {
        if (ch->xtick) snprintf(buf, sizeof buf, "%s", ch->xtick[i]);
        else snprintf(buf, sizeof buf, "%d", i);
        if (text_w(c, buf) > widest) widest = text_w(c, buf);
    }
    static const int steps[] = {1, 2, 5, 10, 20, 50};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        every = steps[s];
        if ((int64_t)(widest + 6) * ch->n / every <= a.w) break;
    }
    for (int i = 0; i < ch->n; i += every) {
        int x = viz_chart_x(a, ch->n, i);
        put(c, x, a.y + a.h, col_axis), put(c, x, a.y + a.h + 1, col_axis);
        if (ch->xtick) snprintf(buf, sizeof buf, "%s", ch->xtick[i]);
        else snprintf(buf, sizeof buf, "%d", i);
        text(c, x - text_w(c, buf) / 2, a.y + a.h + 3, buf, i == ch->mark ? col_mark : col_dim);
    }
    if (ch->xlabel) text(c, a.x + (a.w - text_w(c, ch->xlabel)) / 2, a.y + a.h + 3 + c->line_h, ch->xlabel, col_dim);
    if (ch->break_at > 0 && ch->break_at < ch->n) { /* a faint divider between the groups */
        int x = (viz_chart_x(a, ch->n, ch->break_at - 1) + viz_chart_x(a, ch->n, ch->break_at)) / 2;
        for (int y = a.y; y < a.y + a.h; y++) put(c, x, y, col_axis);
    }
    /* axes */
    for (int x = a.x - 1; x < a.x + a.w; x++) put(c, x, a.y + a.h, col_axis);
    for (int y = a.y; y <= a.y + a.h; y++) put(c, a.x - 1, y, col_axis);
    /* the marked point: a bar behind the data */
    if (ch->mark >= 0 && ch->mark < ch->n) {
        int x = viz_chart_x(a, ch->n, ch->mark);
        for (int y = a.y; y < a.y + a.h; y++)
            if ((y / 3) % 2 == 0) put(c, x, y, col_mark);
    }
    if (isfinite(ch->ref) && ch->ref >= y0 && ch->ref <= y1) {
        int y = YPIX(ch->ref);
        seg(c, a.x, y, a.x + a.w - 1, y, col_text, 1, 4);
        if (ch->ref_label) text(c, a.x + a.w - text_w(c, ch->ref_label) - 2, y - c->line_h, ch->ref_label, col_text);
    }
    /* series: thin ones first, so the thick summary line stays on top */
    for (int pass = 1; pass <= 2; pass++)
        for (int s = 0; s < ch->n_series; s++) {
            int th = ch->thick[s] > 1 ? 2 : 1;
            if (th != pass || !ch->y[s]) continue;
            int px = -1, py = -1;
            for (int i = 0; i < ch->n; i++) {
                double v = ch->y[s][i];
                if (!isfinite(v)) {
                    px = -1;
                    continue;
                }
                if (v < y0) v = y0;
                if (v > y1) v = y1;
                int x = viz_chart_x(a, ch->n, i), y = YPIX(v);
                if (px >= 0 && (i != ch->break_at || i == 0)) seg(c, px, py, x, y, ch->color[s], th, 0);
                fill(c, (viz_rect){x - th, y - th, 2 * th + 1, 2 * th + 1}, ch->color[s]);
                px = x, py = y;
            }
        }
#undef YPIX
    /* title and legend on one line; the legend is cut when it does not fit */
    int x = box.x + 4, ty = box.y + 2;
    if (ch->title) x = text(c, x, ty, ch->title, col_text) + 12;
    for (int s = 0; s < ch->n_series; s++) {
        if (!ch->name[s]) continue;
        int need = 14 + text_w(c, ch->name[s]) + 10;
        if (x + need > box.x + box.w) break;
        fill(c, (viz_rect){x, ty + c->line_h / 2 - 2, 10, ch->thick[s] > 1 ? 4 : 2}, ch->color[s]);
        x = text(c, x + 14, ty, ch->name[s], col_dim) + 10;
    }
}
