/* The chart views: per-layer statistics (view 8), the budget sweep (view 9)
 * and the depth chart of the difference view's panel, all from the numbers
 * of app/stats.h drawn with plot.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "canvas.h"
#include "plot.h"

/* Okabe-Ito colours for heads, distinct for colour-blind readers too. */
static const uint8_t head_colors[6][3] = {{86, 180, 233}, {230, 159, 0}, {0, 158, 115},
                                          {204, 121, 167}, {240, 228, 66}, {213, 94, 0}};

void viz_head_color(uint8_t rgb[3], int h)
{
    memcpy(rgb, head_colors[(h < 0 ? 0 : h) % 6], 3);
}

/* The charts of the stats view, chart i of 5 (layout boxes lay->chart_box). */
static void stats_chart(viz_chart *ch, const ms_stats *s, int i, int layer, double *scratch /* (heads, depth) */,
                        char *title, size_t tn)
{
    viz_chart_init(ch);
    ch->n = s->depth;
    ch->mark = layer;
    ch->xlabel = "layer";
    ch->title = title;
    switch (i) {
    case 0: {
        snprintf(title, tn, "pruned (no expert picked it)");
        ch->percent = true;
        ch->ymin = 0, ch->ymax = 1;
        int hs = s->heads < VIZ_CHART_SERIES - 1 ? s->heads : VIZ_CHART_SERIES - 1;
        for (int h = 0; h < hs; h++) {
            double *y = scratch + (size_t)h * s->depth;
            for (int l = 0; l < s->depth; l++) y[l] = s->pruned_head[(size_t)l * s->heads + h];
            ch->y[ch->n_series] = y;
            viz_head_color(ch->color[ch->n_series], h);
            ch->thick[ch->n_series] = 1;
            static const char *const hn[] = {"h0", "h1", "h2", "h3", "h4", "h5", "h6"};
            ch->name[ch->n_series] = h < 7 ? hn[h] : NULL;
            ch->n_series++;
        }
        ch->y[ch->n_series] = s->pruned;
        memcpy(ch->color[ch->n_series], col_white, 3);
        ch->thick[ch->n_series] = 2;
        ch->name[ch->n_series++] = "all";
        break;
    }
    case 1:
        snprintf(title, tn, "attention mass on the shared summaries");
        ch->percent = true;
        ch->ymin = 0, ch->ymax = 1;
        ch->y[0] = s->shared_share;
        viz_magma(ch->color[0], 0.82f); /* not the marker's yellow, nor the Jaccard red */
        ch->thick[0] = 2;
        ch->name[0] = "mean over heads, tokens";
        ch->n_series = 1;
        break;
    case 2:
        snprintf(title, tn, "distinct positions picked (of %d picks/head)", s->picks);
        ch->y[0] = s->distinct_all;
        memcpy(ch->color[0], col_white, 3);
        ch->thick[0] = 2;
        ch->name[0] = "any head";
        ch->y[1] = s->distinct;
        viz_head_color(ch->color[1], 0);
        ch->thick[1] = 2;
        ch->name[1] = "per head";
        ch->n_series = 2;
        ch->ref = s->image_tokens;
        ch->ref_label = "all positions";
        break;
    case 3:
        snprintf(title, tn, "overlap of two experts' sets (Jaccard)");
        ch->ymin = 0, ch->ymax = 1;
        ch->y[0] = s->jaccard;
        memcpy(ch->color[0], col_pick, 3);
        ch->thick[0] = 2;
        ch->name[0] = "mean over pairs";
        ch->n_series = 1;
        break;
    default:
        snprintf(title, tn, "block output: MiTA vs full attention (relative L2)");
        ch->y[0] = s->block_diff;
        memcpy(ch->color[0], col_query, 3);
        ch->thick[0] = 2;
        ch->n_series = s->have_blocks ? 1 : 0;
        break;
    }
}

void viz_draw_stats_view(const canvas *c, const viz_layout *lay, const viz_state *st, int layer)
{
    const ms_stats *s = st->stats;
    if (!s || s->depth < 1) {
        text(c, lay->main.x + 12, lay->main.y + 12, st->busy ? "computing the statistics..." : "no statistics yet", col_dim);
        return;
    }
    double scratch[VIZ_CHART_SERIES * VIZ_MAX_LAYERS];
    if (s->depth > VIZ_MAX_LAYERS) return;
    for (int i = 0; i < lay->n_charts; i++) {
        viz_chart ch;
        char title[96];
        stats_chart(&ch, s, i, layer, scratch, title, sizeof title);
        fill(c, lay->chart_box[i], col_panel);
        viz_chart_draw(c->px, c->W, c->H, c->font, lay->chart_box[i], &ch);
        if (i == 4 && !s->have_blocks) {
            viz_rect a = lay->chart[i];
            const char *m = "waiting for the full-attention run...";
            text(c, a.x + (a.w - text_w(c, m)) / 2, a.y + a.h / 2 - c->line_h / 2, m, col_dim);
        }
    }
}

void viz_draw_depth_chart(const canvas *c, const viz_layout *lay, const viz_state *st, int layer)
{
    if (lay->depth_chart < 0) return;
    viz_rect box = lay->chart_box[lay->depth_chart];
    const ms_stats *s = st->stats;
    viz_chart ch;
    char title[96];
    int n = st->res ? st->res->depth : 0;
    if (st->view == VIZ_HEATMAP) {
        /* the pruned fractions of every layer, as in the stats view */
        if (!s || s->depth != n || n > VIZ_MAX_LAYERS) return;
        double scratch[VIZ_CHART_SERIES * VIZ_MAX_LAYERS];
        stats_chart(&ch, s, 0, layer, scratch, title, sizeof title);
        ch.title = "pruned";
        ch.xlabel = "layer (click to select)";
        viz_chart_draw(c->px, c->W, c->H, c->font, box, &ch);
        return;
    }
    viz_chart_init(&ch);
    ch.title = "block output vs full (rel. L2)";
    ch.xlabel = "layer (click to select)";
    ch.n = n;
    ch.mark = layer;
    if (s && s->have_blocks && s->depth == ch.n) {
        ch.y[0] = s->block_diff;
        memcpy(ch.color[0], col_query, 3);
        ch.thick[0] = 2;
        ch.n_series = 1;
    }
    viz_chart_draw(c->px, c->W, c->H, c->font, box, &ch);
    if (!ch.n_series) {
        viz_rect a = lay->chart[lay->depth_chart];
        text(c, a.x + 6, a.y + a.h / 2 - c->line_h / 2, "full run pending...", col_dim);
    }
}

/* Sweep: tick labels "k=12" or "6x6" per point. */
static void sweep_ticks(char (*lab)[16], const char **ptr, const viz_state *st)
{
    for (int i = 0; i < st->n_sweep; i++) {
        const ms_sweep_point *p = &st->sweep[i];
        if (!strncmp(p->label, "grid", 4)) snprintf(lab[i], 16, "%dx%d", p->gh, p->gw);
        else snprintf(lab[i], 16, "k=%d", p->k);
        ptr[i] = lab[i];
    }
}

/* The point of the sweep that is the run's own budget ("k"). */
static int sweep_home(const viz_state *st)
{
    for (int i = 0; i < st->n_sweep; i++)
        if (!strcmp(st->sweep[i].label, "k")) return i;
    return -1;
}

void viz_draw_sweep_view(const canvas *c, const viz_layout *lay, const viz_state *st)
{
    viz_rect inner = {lay->main.x + 4, lay->main.y + 4, lay->main.w - 8, lay->main.h - 8};
    if (st->n_sweep < 1) {
        text(c, inner.x + 8, inner.y + 8, "press 9 to run the budget sweep (in the background)", col_dim);
        return;
    }
    int n = st->n_sweep > MS_SWEEP_MAX ? MS_SWEEP_MAX : st->n_sweep, done = 0;
    double agree[MS_SWEEP_MAX], ms[MS_SWEEP_MAX];
    char lab[MS_SWEEP_MAX][16];
    const char *ticks[MS_SWEEP_MAX];
    sweep_ticks(lab, ticks, st);
    for (int i = 0; i < n; i++) {
        agree[i] = st->sweep[i].done ? st->sweep[i].agreement : NAN;
        ms[i] = st->sweep[i].done ? st->sweep[i].ms : NAN;
        done += st->sweep[i].done;
    }
    char t0[96], t1[96];
    snprintf(t0, sizeof t0, "pixels agreeing with full attention (%d of %d runs)", done, n);
    snprintf(t1, sizeof t1, "time per run (ms)");
    int gap = 8, hh = (inner.h - gap) / 2;
    for (int k = 0; k < 2; k++) {
        viz_chart ch;
        viz_chart_init(&ch);
        ch.title = k ? t1 : t0;
        ch.xlabel = "budget: top-k at the run's landmark grid, then the grid at the run's k";
        ch.n = n;
        ch.xtick = ticks;
        ch.mark = sweep_home(st);
        ch.y[0] = k ? ms : agree;
        if (k) viz_magma(ch.color[0], 0.65f); /* not the marker's yellow */
        else memcpy(ch.color[0], col_query, 3);
        ch.thick[0] = 2;
        ch.n_series = 1;
        for (int i = 1; i < n; i++) /* the grid points are another sweep: no line into them */
            if (!strncmp(st->sweep[i].label, "grid", 4) && strncmp(st->sweep[i - 1].label, "grid", 4)) ch.break_at = i;
        if (!k) {
            /* zoom the agreement axis on the data: it is usually above 95% */
            double lo = 1;
            for (int i = 0; i < n; i++)
                if (isfinite(agree[i]) && agree[i] < lo) lo = agree[i];
            ch.percent = true;
            ch.ymax = 1;
            ch.ymin = lo > 0.9 ? floor(lo * 100 - 0.5) / 100 : floor(lo * 10) / 10;
            if (ch.ymin >= ch.ymax) ch.ymin = ch.ymax - 0.01;
        }
        viz_rect box = {inner.x, inner.y + k * (hh + gap), inner.w, hh};
        fill(c, box, col_panel);
        viz_chart_draw(c->px, c->W, c->H, c->font, box, &ch);
    }
}

/* Panel lines of the chart views; returns the pen y after them. */
int viz_panel_stats(const canvas *c, int x, int y, int w, const viz_state *st, int layer)
{
    const ms_stats *s = st->stats;
    char buf[160];
#define LINE(col, ...)                                   \
    do {                                                 \
        snprintf(buf, sizeof buf, __VA_ARGS__);          \
        text_fit(c, buf, sizeof buf, w);                 \
        text(c, x, y, buf, col);                         \
        y += c->line_h;                                  \
    } while (0)
    if (st->view == VIZ_SWEEP) {
        LINE(col_dim, "budget sweep vs full attention");
        for (int i = 0; i < st->n_sweep; i++) {
            const ms_sweep_point *p = &st->sweep[i];
            if (p->done)
                LINE(i == sweep_home(st) ? col_text : col_dim, "%-6s %dx%d k %d: %.2f%%, %.0f ms", p->label, p->gh,
                     p->gw, p->k, 100 * p->agreement, p->ms);
            else
                LINE(col_dim, "%-6s %dx%d k %d: pending", p->label, p->gh, p->gw, p->k);
        }
        if (!st->n_sweep) LINE(col_dim, "9: run it");
        return y;
    }
    if (!s || layer < 0 || layer >= s->depth) return y;
    if (!s->mita[layer]) {
        LINE(col_dim, "layer %d ran full attention", layer);
        return y;
    }
    LINE(col_text, "pruned: %.1f%% (any head)", 100 * s->pruned[layer]);
    for (int h = 0; h < s->heads && h < 6; h++) {
        uint8_t hc[3];
        viz_head_color(hc, h);
        LINE(hc, "  head %d: %.1f%%", h, 100 * s->pruned_head[(size_t)layer * s->heads + h]);
    }
    LINE(col_text, "shared share: %.1f%%", 100 * s->shared_share[layer]);
    LINE(col_text, "distinct: %.0f per head", s->distinct[layer]);
    LINE(col_dim, "  %.0f any head, of %d picks", s->distinct_all[layer], s->picks);
    LINE(col_text, "Jaccard: %.3f", s->jaccard[layer]);
    if (s->have_blocks) LINE(col_text, "block rel. L2: %.4f", s->block_diff[layer]);
    else LINE(col_dim, "block rel. L2: full run pending");
#undef LINE
    return y;
}
