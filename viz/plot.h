/* Line charts drawn by the renderer (no plotting library): axes, ticks, tick
 * labels, a title with a legend, an optional dashed reference line and a
 * marked point (the current layer). Points sit at the centres of n equal
 * bins, so a click maps to a point by its bin. Library code: no printing. */
#ifndef MS_VIZ_PLOT_H
#define MS_VIZ_PLOT_H

#include "render.h"

#define VIZ_CHART_SERIES 8

typedef struct {
    const char *title;                  /* above the plot, with the legend */
    const char *xlabel;                 /* under the tick labels; NULL: none */
    int n;                              /* points per series */
    int n_series;
    const double *y[VIZ_CHART_SERIES];  /* (n) each; NaN: no point */
    uint8_t color[VIZ_CHART_SERIES][3];
    int thick[VIZ_CHART_SERIES];        /* line width, 1 or 2 */
    const char *name[VIZ_CHART_SERIES]; /* legend entry; NULL: not listed */
    const char *const *xtick;           /* (n) tick labels; NULL: the index */
    double ymin, ymax;                  /* ymax <= ymin: 0 .. the data's top */
    bool percent;                       /* y tick labels as percentages of 1 */
    double ref;                         /* dashed horizontal line; NaN: none */
    const char *ref_label;
    int mark;                           /* point marked by a vertical bar; -1: none */
    int break_at;                       /* no line into this point (a new group); 0: none */
} viz_chart;

void viz_chart_init(viz_chart *ch);
/* The plot area (inside the axes) of a chart drawn into box. */
viz_rect viz_chart_area(viz_rect box, const viz_font *font, bool xlabel);
/* Window x of point i of n in area. */
int viz_chart_x(viz_rect area, int n, int i);
/* The point whose bin holds window (x, y) in area; -1 outside. */
int viz_chart_hit(viz_rect area, int n, int x, int y);
/* Draws the chart into box of the (H, W, 4) buffer. */
void viz_chart_draw(uint8_t *rgba /* (H, W, 4) */, int W, int H, const viz_font *font, viz_rect box,
                    const viz_chart *ch);

/* Fixed colours the tests check. */
#define VIZ_CHART_MARK_R 255    /* the marked point's bar */
#define VIZ_CHART_MARK_G 214
#define VIZ_CHART_MARK_B 0
#define VIZ_CHART_AXIS 160      /* grey level of the axes */

#endif
