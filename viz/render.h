/* viz/: turns a view state (image, engine result, selections, window size)
 * into RGBA pixels. viz_render is pure: it draws only from its arguments, so
 * the SDL window (app/cmd_view.c), the headless `mitaseg render` and the tests
 * share it. Text goes through viz/text.h (SDL2_ttf glyphs blitted into the
 * buffer; no window needed). Library code: no printing. */
#ifndef MS_VIZ_RENDER_H
#define MS_VIZ_RENDER_H

#include <math.h>

#include "app/engine.h"
#include "app/stats.h"
#include "colormap.h"
#include "text.h"

typedef enum {
    VIZ_OVERLAY = 0,    /* segmentation over the image */
    VIZ_HEATMAP,        /* selection count per position at one layer */
    VIZ_STRIP,          /* every layer's heatmap side by side */
    VIZ_EXPERT,         /* one landmark: window, picks, routed queries */
    VIZ_ROUTING,        /* each patch coloured by its expert */
    VIZ_QUERY,          /* one query: its expert, what it read, mass split */
    VIZ_DIFF,           /* pixels whose class differs from full attention's */
    VIZ_STATS,          /* per-layer statistics as charts */
    VIZ_SWEEP,          /* agreement and time against the budget */
    VIZ_N_VIEWS
} viz_view;

const char *viz_view_name(viz_view v);
/* "overlay", "heatmap", ...; -1 when unknown. */
int viz_view_parse(const char *s);

typedef struct {
    const ms_image *img;        /* NULL: start screen */
    const ms_result *res;       /* NULL (or another image's size): not run yet */
    int n_classes;
    const char (*class_names)[MS_CLASS_NAME];   /* (n_classes) */
    const uint8_t (*palette)[3];                /* (n_classes) */
    viz_view view;
    int layer;                  /* 0..depth-1 */
    int head;                   /* -1: all heads */
    int expert;                 /* 0..m-1 */
    int query_x, query_y;       /* original-image pixel; -1: none */
    float opacity;              /* tint opacity, 0..1 */
    bool outlines;              /* class boundaries in the overlay */
    bool legend_all;            /* legend lists every class, not only present ones */
    uint64_t hidden[4];         /* class c not tinted when bit c is set */
    int mouse_x, mouse_y;       /* window pixel for the hover readout; -1: none */
    const char *status;         /* status line; may be NULL */
    const char *info;           /* run facts for the panel, '\n'-separated; may be NULL */
    bool help;                  /* help overlay */
    bool busy;                  /* inference running: busy indicator */
    int busy_tick;              /* animation phase of the indicator */
    /* MiTA against full attention (NULL / 0: not computed yet) */
    const ms_result *full;      /* full-attention run of the same image */
    const ms_stats *stats;      /* statistics of res (and full) */
    const int64_t *class_pixels; /* (n_classes) pixels of each class in res's mask;
                                  * NULL: counted per frame */
    const ms_sweep_point *sweep;
    int n_sweep;
    bool diff_split;            /* difference view: MiTA left of split_x, full right */
    /* zoom about (center_x, center_y), an original-image point kept at the
     * middle of the main area; zoom 1 fits the image */
    float zoom;
    double center_x, center_y;
    const viz_font *font;       /* NULL: no text drawn */
    const viz_font *font_big;   /* start screen; NULL: font */
} viz_state;

void viz_state_init(viz_state *st);
static inline bool viz_class_hidden(const viz_state *st, int c)
{
    return c >= 0 && c < 256 && ((st->hidden[c >> 6] >> (c & 63)) & 1);
}
static inline void viz_class_toggle(viz_state *st, int c)
{
    if (c >= 0 && c < 256) st->hidden[c >> 6] ^= (uint64_t)1 << (c & 63);
}

/* The result, when it belongs to st->img and holds a MiTA record. */
const ms_result *viz_result(const viz_state *st);
/* The full-attention result when it belongs to the same image as the result. */
const ms_result *viz_full(const viz_state *st);
/* The head the per-head views (expert, routing, query) show: st->head, or 0
 * for all heads. */
int viz_view_head(const viz_state *st);

typedef struct { int x, y, w, h; } viz_rect;

static inline bool viz_rect_contains(viz_rect r, int x, int y)
{
    return x >= r.x && y >= r.y && x < r.x + r.w && y < r.y + r.h;
}

#define VIZ_MAX_LAYERS 64

/* Where everything goes in a W x H window: the image keeps its aspect ratio
 * in the main area, a side panel on the right (legend, stats), a film strip
 * of per-layer heatmaps below, a status line at the bottom. */
typedef struct {
    int W, H;
    viz_rect main;              /* area the image is fitted into */
    viz_rect image;             /* the image itself (zoomed: may extend past main) */
    viz_rect clip;              /* the visible part of image */
    viz_rect panel;
    viz_rect strip;
    viz_rect status;
    int n_tiles;                /* film strip: one per layer */
    viz_rect tile[VIZ_MAX_LAYERS];
    int n_big;                  /* strip view: one per layer in the main area */
    viz_rect big[VIZ_MAX_LAYERS];
    int n_legend;               /* overlay view: clickable legend entries */
    viz_rect legend[MS_MAX_CLASSES];
    int legend_class[MS_MAX_CLASSES];
    int legend_more;            /* entries that did not fit */
    int legend_y;               /* panel y where the legend starts */
    int n_charts;               /* per-layer charts (plot areas; a click picks a layer) */
    viz_rect chart_box[8], chart[8];
    int depth_chart;            /* the panel's per-layer chart (diff view: block
                                 * differences; heatmap: pruned); -1: none */
    int line_h;                 /* text line height */
} viz_layout;

void viz_layout_compute(viz_layout *lay, int W, int H, const viz_state *st);

typedef enum {
    VIZ_HIT_NONE = 0,
    VIZ_HIT_IMAGE,      /* img_x, img_y: original pixel; token; landmark */
    VIZ_HIT_LEGEND,     /* value: class */
    VIZ_HIT_LAYER       /* value: layer (film strip tile or strip-view tile) */
} viz_hit_kind;

typedef struct {
    viz_hit_kind kind;
    int value;
    int img_x, img_y;
    int token;          /* -1 without a result */
    int landmark;       /* landmark cell of the token; -1 without a record */
} viz_hit;

viz_hit viz_hit_test(const viz_layout *lay, const viz_state *st, int x, int y);
/* Difference view, split mode: the divider's window x (the pointer when it
 * is over the image, else the middle). */
int viz_split_x(const viz_layout *lay, const viz_state *st);

/* Zoom steps: factor z about window point (wx, wy) of the image, keeping the
 * image point under it in place; zoom stays in 1 .. VIZ_ZOOM_MAX. */
#define VIZ_ZOOM_MAX 64.0f
void viz_zoom_at(viz_state *st, const viz_layout *lay, float z, int wx, int wy);
/* Pans by (dx, dy) window pixels. */
void viz_pan(viz_state *st, const viz_layout *lay, int dx, int dy);
/* Back to the fitted image. */
void viz_zoom_fit(viz_state *st);

/* Draws st into rgba (W x H, row-major, R G B A bytes, A = 255). */
void viz_render(uint8_t *rgba /* (H, W, 4) */, int W, int H, const viz_state *st);

/* Token geometry (engine.h): original pixel (y, x) -> resized
 * (y*rh/h, x*rw/w) -> token (ry/patch, rx/patch). */
static inline int viz_token_of_pixel(const ms_result *r, int y, int x)
{
    int ry = (int)((int64_t)y * r->rh / r->h), rx = (int)((int64_t)x * r->rw / r->w);
    return (ry / r->patch) * r->wp + rx / r->patch;
}
/* True when token n covers some of the resized image (not only padding). */
static inline bool viz_token_in_image(const ms_result *r, int n)
{
    return (n / r->wp) * r->patch < r->rh && (n % r->wp) * r->patch < r->rw;
}
/* The landmark whose pooling cell holds token (tr, tc): floor(tr*gh/hp),
 * which always lies inside that landmark's (possibly wider) window. */
static inline int viz_landmark_of_token(const ms_result *r, int tr, int tc)
{
    return (tr * r->gh / r->hp) * r->gw + tc * r->gw / r->wp;
}

/* count[t] = how many (head, expert) routed sets of this layer contain token t
 * (head -1: all heads). Returns the largest count; -1 when the layer ran full
 * attention or there is no record. */
int viz_selection_counts(int *count /* (n) */, const ms_result *r, int layer, int head);
/* How many (head, expert) routed sets of this layer (head -1: all heads)
 * contain the class token (recorded as position n, mita-spec 2.7); -1 when the
 * model has no class token, the layer ran full attention or there is no record. */
int viz_cls_picks(const ms_result *r, int layer, int head);
/* Fraction of the image's tokens with count 0; tokens: how many in the image. */
double viz_pruned_fraction(int *tokens, const int *count /* (n) */, const ms_result *r);
/* Largest selection count over every MiTA layer (the heatmaps' shared scale,
 * so layers compare); scratch holds n ints. */
int viz_selection_max(int *scratch /* (n) */, const ms_result *r, int head);

/* Heatmap colour level of a selection count: sqrt(count / max), since
 * counts are heavy-tailed and a linear map leaves most positions in the
 * darkest colours. */
static inline float viz_heat_level(int count, int max)
{
    return max > 0 && count > 0 ? sqrtf((float)count / (float)max) : 0.f;
}

/* Probability of the argmax class at an original pixel (softmax of logits). */
float viz_pixel_score(const ms_result *r, int y, int x);

/* Fixed colours the tests check. */
#define VIZ_PRUNED_R 170    /* hatch lines over positions no expert picked */
#define VIZ_PRUNED_G 170
#define VIZ_PRUNED_B 170
#define VIZ_WINDOW_R 255    /* pooling-window outline */
#define VIZ_WINDOW_G 214
#define VIZ_WINDOW_B 0
#define VIZ_PICK_R 255      /* routed picks */
#define VIZ_PICK_G 64
#define VIZ_PICK_B 64
#define VIZ_QUERY_R 64      /* queries routed to the expert */
#define VIZ_QUERY_G 160
#define VIZ_QUERY_B 255
#define VIZ_STRIP_BG 24     /* grey level behind the film strip tiles */

/* Hatch pattern: sparse diagonal lines over pruned positions (window
 * coordinates), sparse so that a mostly pruned layer still shows the image. */
static inline bool viz_hatch(int x, int y) { return (x + y) % 8 == 0; }

/* Help overlay lines: "key\tdescription". */
extern const char *const viz_help_lines[];

#endif
