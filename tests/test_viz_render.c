/* The renderer's pixels on a synthetic engine result: overlay blending,
 * hidden classes, pruned positions, the film strip, the expert window,
 * routing colours, hit testing and the colour maps; the difference view, the
 * chart views (stats, sweep) and zoom. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "viz/plot.h"
#include "viz/render.h"

/* A 64x48 image on an 8-pixel patch grid (hp 6, wp 8, n 48), 2x2 landmarks
 * (m 4), k 4, 2 heads. Row 5 of the token grid (tokens 40..47) is never
 * picked, so it is pruned in every MiTA layer. Layer 1 ran full attention. */
enum { IW = 64, IH = 48, PATCH = 8, HP = 6, WP = 8, NT = HP * WP, HEADS = 2, GH = 2, GW = 2, M = 4, K = 4, NCLS = 3 };

static const char names[NCLS][MS_CLASS_NAME] = {"road", "sky", "tree"};
static const uint8_t pal[NCLS][3] = {{200, 30, 30}, {30, 200, 30}, {30, 30, 200}};

typedef struct {
    ms_image img;
    ms_result res;
} fixture;

static int cls_at(int y, int x) { return x < 32 ? 0 : (y < 24 ? 1 : 2); }

static int32_t pick(int l, int h, int e, int j) { return (int32_t)((e * 11 + h * 5 + j * 3 + l) % 40); }
static int32_t routed(int l, int h, int t) { return (int32_t)((t * 7 + h + l) % M); }

static void fixture_make(fixture *f, int depth)
{
    memset(f, 0, sizeof *f);
    f->img.w = IW;
    f->img.h = IH;
    f->img.rgb = malloc(IW * IH * 3);
    for (int y = 0; y < IH; y++)
        for (int x = 0; x < IW; x++) {
            uint8_t *p = f->img.rgb + (y * IW + x) * 3;
            p[0] = (uint8_t)(x * 4);
            p[1] = (uint8_t)(y * 5);
            p[2] = 100;
        }
    ms_result *r = &f->res;
    r->h = r->rh = r->ph = IH;
    r->w = r->rw = r->pw = IW;
    r->patch = PATCH;
    r->hp = HP;
    r->wp = WP;
    r->n = NT;
    r->classes = NCLS;
    r->logits = calloc((size_t)NCLS * IH * IW, sizeof(float));
    r->mask = malloc(IH * IW);
    for (int y = 0; y < IH; y++)
        for (int x = 0; x < IW; x++) {
            int c = cls_at(y, x);
            r->mask[y * IW + x] = (uint8_t)c;
            r->logits[((size_t)c * IH + y) * IW + x] = 2.0f;
        }
    r->depth = depth;
    r->heads = HEADS;
    r->gh = GH;
    r->gw = GW;
    r->m = M;
    r->k = K;
    r->layer_mita = malloc(depth);
    r->topk_idx = malloc(sizeof(int32_t) * depth * HEADS * M * K);
    r->route = malloc(sizeof(int32_t) * depth * HEADS * NT);
    r->shared_mass = malloc(sizeof(float) * depth * HEADS * NT);
    for (int l = 0; l < depth; l++) {
        r->layer_mita[l] = l != 1;
        for (int h = 0; h < HEADS; h++) {
            for (int e = 0; e < M; e++)
                for (int j = 0; j < K; j++) r->topk_idx[((l * HEADS + h) * M + e) * K + j] = pick(l, h, e, j);
            for (int t = 0; t < NT; t++) {
                r->route[(l * HEADS + h) * NT + t] = routed(l, h, t);
                r->shared_mass[(l * HEADS + h) * NT + t] = 0.25f + 0.5f * (t % 2);
            }
        }
    }
    r->attention = MS_ATTN_MITA;
}

static void fixture_free(fixture *f)
{
    free(f->img.rgb);
    free(f->res.logits);
    free(f->res.mask);
    free(f->res.layer_mita);
    free(f->res.topk_idx);
    free(f->res.route);
    free(f->res.shared_mass);
}

static void state_for(viz_state *st, fixture *f)
{
    viz_state_init(st);
    st->img = &f->img;
    st->res = &f->res;
    st->n_classes = NCLS;
    st->class_names = names;
    st->palette = pal;
}

/* Window size whose layout fits the image at exactly 4x: the panel is 150
 * wide (28% of 414 is under the 150 minimum), so the main area's inner box is
 * 256 wide and taller than 192. Checked in test_layout_scale. */
enum { WW = 414, WH = 300, SCALE = 4 };

static uint8_t *render(const viz_state *st)
{
    uint8_t *px = malloc((size_t)WW * WH * 4);
    viz_render(px, WW, WH, st);
    return px;
}

static const uint8_t *at(const uint8_t *px, int x, int y) { return px + ((size_t)y * WW + x) * 4; }

static int blend1(int src, int col, double a) { return (int)lround(src * (1 - a) + col * a); }

/* One 8-bit step: the renderer blends in 1/256 fixed point. */
static void assert_blend(const uint8_t *got, const uint8_t *src, const uint8_t *col, double a, int x, int y)
{
    for (int ch = 0; ch < 3; ch++) {
        int want = blend1(src[ch], col[ch], a);
        ck_assert_msg(abs(got[ch] - want) <= 1, "pixel (%d,%d) ch %d: got %d, want %d", x, y, ch, got[ch], want);
    }
}

static const uint8_t *img_px(const fixture *f, int oy, int ox) { return f->img.rgb + (oy * IW + ox) * 3; }

START_TEST(test_layout_scale)
{
    fixture f;
    fixture_make(&f, 3);
    viz_state st;
    state_for(&st, &f);
    viz_layout lay;
    viz_layout_compute(&lay, WW, WH, &st);
    ck_assert_int_eq(lay.image.w, IW * SCALE);
    ck_assert_int_eq(lay.image.h, IH * SCALE);
    /* aspect kept for another window shape */
    viz_layout_compute(&lay, 1000, 300, &st);
    ck_assert_int_le(abs(lay.image.w * IH - lay.image.h * IW), IW);
    ck_assert_int_le(lay.image.x + lay.image.w, lay.panel.x);
    ck_assert_int_le(lay.image.y + lay.image.h, lay.strip.y);
    fixture_free(&f);
}
END_TEST

START_TEST(test_overlay_blend)
{
    fixture f;
    fixture_make(&f, 3);
    viz_state st;
    state_for(&st, &f);
    st.opacity = 0.37f;
    uint8_t *px = render(&st);
    viz_layout lay;
    viz_layout_compute(&lay, WW, WH, &st);
    int n = 0;
    for (int y = lay.image.y; y < lay.image.y + lay.image.h; y += 7)
        for (int x = lay.image.x; x < lay.image.x + lay.image.w; x += 5) {
            int ox = (x - lay.image.x) / SCALE, oy = (y - lay.image.y) / SCALE;
            assert_blend(at(px, x, y), img_px(&f, oy, ox), pal[cls_at(oy, ox)], 0.37, x, y);
            n++;
        }
    ck_assert_int_gt(n, 1000);
    free(px);

    /* hidden class 1 (sky): its pixels are the image itself, others still tinted */
    viz_class_toggle(&st, 1);
    ck_assert(viz_class_hidden(&st, 1));
    st.opacity = 0.8f;
    px = render(&st);
    int sx = lay.image.x + 50 * SCALE + 1, sy = lay.image.y + 10 * SCALE + 1; /* (10, 50): sky */
    ck_assert_int_eq(cls_at(10, 50), 1);
    ck_assert_mem_eq(at(px, sx, sy), img_px(&f, 10, 50), 3);
    int rx = lay.image.x + 5 * SCALE + 1, ry = lay.image.y + 30 * SCALE + 1; /* (30, 5): road */
    assert_blend(at(px, rx, ry), img_px(&f, 30, 5), pal[0], 0.8, rx, ry);
    free(px);
    fixture_free(&f);
}
END_TEST

START_TEST(test_outlines)
{
    fixture f;
    fixture_make(&f, 3);
    viz_state st;
    state_for(&st, &f);
    st.outlines = true;
    uint8_t *px = render(&st);
    viz_layout lay;
    viz_layout_compute(&lay, WW, WH, &st);
    /* the road/sky boundary at x = 32: the last display column of x = 31 */
    int x = lay.image.x + 32 * SCALE - 1, y = lay.image.y + 5 * SCALE;
    const uint8_t white[3] = {255, 255, 255};
    ck_assert_mem_eq(at(px, x, y), white, 3);
    ck_assert_mem_ne(at(px, x - 2, y), white, 3);
    free(px);
    fixture_free(&f);
}
END_TEST

START_TEST(test_selection_counts)
{
    fixture f;
    fixture_make(&f, 3);
    int count[NT], want[NT];
    for (int head = -1; head < HEADS; head++) {
        memset(want, 0, sizeof want);
        for (int h = 0; h < HEADS; h++) {
            if (head >= 0 && h != head) continue;
            for (int e = 0; e < M; e++)
                for (int j = 0; j < K; j++) want[pick(2, h, e, j)]++;
        }
        int mx = viz_selection_counts(count, &f.res, 2, head);
        int wmx = 0;
        for (int t = 0; t < NT; t++) {
            ck_assert_int_eq(count[t], want[t]);
            if (want[t] > wmx) wmx = want[t];
        }
        ck_assert_int_eq(mx, wmx);
        int tokens;
        double fr = viz_pruned_fraction(&tokens, count, &f.res);
        int pruned = 0;
        for (int t = 0; t < NT; t++) pruned += want[t] == 0;
        ck_assert_int_eq(tokens, NT);
        ck_assert_double_eq_tol(fr, (double)pruned / NT, 1e-12);
        ck_assert_int_ge(pruned, 8); /* row 5 */
    }
    /* the full-attention layer has no selections */
    ck_assert_int_eq(viz_selection_counts(count, &f.res, 1, -1), -1);

    /* class token (mita-spec 2.7: recorded as position n): counted apart,
     * never as a grid token */
    ck_assert_int_eq(viz_cls_picks(&f.res, 2, -1), -1); /* no class token */
    f.res.ncls = 1;
    int32_t *l2 = f.res.topk_idx + (size_t)2 * HEADS * M * K; /* layer 2 */
    l2[0] = NT;                   /* head 0, expert 0 */
    l2[(size_t)M * K + K] = NT;   /* head 1, expert 1 */
    l2[(size_t)M * K + K + 1] = NT - 1;
    ck_assert_int_eq(viz_cls_picks(&f.res, 2, -1), 2);
    ck_assert_int_eq(viz_cls_picks(&f.res, 2, 0), 1);
    ck_assert_int_eq(viz_cls_picks(&f.res, 1, -1), -1); /* full attention there */
    viz_selection_counts(count, &f.res, 2, -1);
    int total = 0;
    for (int t = 0; t < NT; t++) total += count[t];
    ck_assert_int_eq(total, HEADS * M * K - 2);
    fixture_free(&f);
}
END_TEST

START_TEST(test_heatmap_pruned)
{
    fixture f;
    fixture_make(&f, 3);
    viz_state st;
    state_for(&st, &f);
    st.view = VIZ_HEATMAP;
    st.layer = 0;
    st.opacity = 0.6f;
    uint8_t *px = render(&st);
    viz_layout lay;
    viz_layout_compute(&lay, WW, WH, &st);
    int count[NT], scratch[NT];
    viz_selection_counts(count, &f.res, 0, -1);
    int mx = viz_selection_max(scratch, &f.res, -1);
    ck_assert_int_gt(mx, 0);
    /* token 41 (row 5, col 1) is pruned: hatch pixels have the pruned colour,
     * the rest is the image in grey */
    ck_assert_int_eq(count[41], 0);
    const uint8_t pruned[3] = {VIZ_PRUNED_R, VIZ_PRUNED_G, VIZ_PRUNED_B};
    int hatch = 0, grey = 0;
    for (int y = 0; y < PATCH * SCALE; y++)
        for (int x = 0; x < PATCH * SCALE; x++) {
            int wx = lay.image.x + 1 * PATCH * SCALE + x, wy = lay.image.y + 5 * PATCH * SCALE + y;
            const uint8_t *p = at(px, wx, wy);
            if (viz_hatch(wx, wy)) {
                ck_assert_mem_eq(p, pruned, 3);
                hatch++;
            } else {
                ck_assert(p[0] == p[1] && p[1] == p[2]);
                ck_assert_mem_ne(p, pruned, 3);
                grey++;
            }
        }
    ck_assert_int_gt(hatch, 100);
    ck_assert_int_gt(grey, 100);
    /* a picked token: the image blended with viridis(sqrt(count / max)) */
    int t = pick(0, 0, 0, 0);
    ck_assert_int_gt(count[t], 0);
    uint8_t heat[3];
    viz_viridis(heat, sqrtf((float)count[t] / (float)mx));
    int wx = lay.image.x + (t % WP) * PATCH * SCALE + 3, wy = lay.image.y + (t / WP) * PATCH * SCALE + 3;
    int ox = (wx - lay.image.x) / SCALE, oy = (wy - lay.image.y) / SCALE;
    assert_blend(at(px, wx, wy), img_px(&f, oy, ox), heat, 0.6, wx, wy);
    free(px);
    fixture_free(&f);
}
END_TEST

/* Tiles along the strip's middle row: each starts where the strip background
 * gives way to a tile border. */
static int count_strip_tiles(const uint8_t *px, const viz_layout *lay)
{
    int y = lay->strip.y + lay->strip.h / 2, tiles = 0;
    bool in = false;
    for (int x = lay->strip.x; x < lay->strip.x + lay->strip.w; x++) {
        const uint8_t *p = at(px, x, y);
        bool bg = p[0] == VIZ_STRIP_BG && p[1] == VIZ_STRIP_BG && p[2] == VIZ_STRIP_BG;
        if (!bg && !in) tiles++;
        in = !bg;
    }
    return tiles;
}

START_TEST(test_strip_tiles)
{
    static const int depths[] = {3, 12};
    for (int di = 0; di < 2; di++) {
        fixture f;
        fixture_make(&f, depths[di]);
        viz_state st;
        state_for(&st, &f);
        st.view = VIZ_HEATMAP;
        st.layer = 2;
        uint8_t *px = render(&st);
        viz_layout lay;
        viz_layout_compute(&lay, WW, WH, &st);
        ck_assert_int_eq(lay.n_tiles, depths[di]);
        ck_assert_int_eq(count_strip_tiles(px, &lay), depths[di]);
        /* the current layer's tile has the white border, the full layer's the orange one */
        const uint8_t white[3] = {255, 255, 255};
        ck_assert_mem_eq(at(px, lay.tile[2].x, lay.tile[2].y + 1), white, 3);
        ck_assert_mem_ne(at(px, lay.tile[1].x, lay.tile[1].y + 1), white, 3);
        /* a click on a tile selects that layer */
        viz_hit h = viz_hit_test(&lay, &st, lay.tile[1].x + 2, lay.tile[1].y + 2);
        ck_assert_int_eq(h.kind, VIZ_HIT_LAYER);
        ck_assert_int_eq(h.value, 1);
        free(px);
        /* the strip view lays every layer out in the main area too */
        st.view = VIZ_STRIP;
        viz_layout_compute(&lay, WW, WH, &st);
        ck_assert_int_eq(lay.n_big, depths[di]);
        for (int l = 1; l < lay.n_big; l++) {
            ck_assert_int_eq(lay.big[l].w, lay.big[0].w);
            ck_assert(lay.big[l].x != lay.big[l - 1].x || lay.big[l].y != lay.big[l - 1].y);
        }
        fixture_free(&f);
    }
}
END_TEST

START_TEST(test_expert_window)
{
    fixture f;
    fixture_make(&f, 3);
    viz_state st;
    state_for(&st, &f);
    st.view = VIZ_EXPERT;
    st.layer = 2;
    const uint8_t win[3] = {VIZ_WINDOW_R, VIZ_WINDOW_G, VIZ_WINDOW_B};
    viz_layout lay;
    viz_layout_compute(&lay, WW, WH, &st);
    for (int e = 0; e < M; e++) {
        st.expert = e;
        uint8_t *px = render(&st);
        int r0, r1, c0, c1;
        mita_landmark_window(&r0, &r1, &c0, &c1, e, HP, WP, GH, GW);
        int x0 = lay.image.x + c0 * PATCH * SCALE, x1 = lay.image.x + c1 * PATCH * SCALE - 1;
        int y0 = lay.image.y + r0 * PATCH * SCALE, y1 = lay.image.y + r1 * PATCH * SCALE - 1;
        int ym = (y0 + y1) / 2, xm = (x0 + x1) / 2;
        /* 2-pixel outline on the window's edge tokens, inside the window */
        ck_assert_mem_eq(at(px, x0, ym), win, 3);
        ck_assert_mem_eq(at(px, x0 + 1, ym), win, 3);
        ck_assert_mem_eq(at(px, x1, ym), win, 3);
        ck_assert_mem_eq(at(px, xm, y0), win, 3);
        ck_assert_mem_eq(at(px, xm, y1 - 1), win, 3);
        ck_assert_mem_ne(at(px, x0 + 2, ym), win, 3);
        if (x0 > lay.image.x) ck_assert_mem_ne(at(px, x0 - 1, ym), win, 3);
        /* a query routed to this expert is tinted; one routed elsewhere is not */
        const int32_t *route = f.res.route + (2 * HEADS + 0) * NT;
        int in = -1, out = -1;
        for (int t = 0; t < NT; t++) {
            bool picked = false;
            for (int j = 0; j < K; j++) picked |= pick(2, 0, e, j) == t;
            if (picked || t / WP == r0 || t / WP == r1 - 1 || t % WP == c0 || t % WP == c1 - 1) continue;
            if (route[t] == e && in < 0) in = t;
            if (route[t] != e && out < 0) out = t;
        }
        ck_assert(in >= 0 && out >= 0);
        const uint8_t qc[3] = {VIZ_QUERY_R, VIZ_QUERY_G, VIZ_QUERY_B};
        int wx = lay.image.x + (in % WP) * PATCH * SCALE + 9, wy = lay.image.y + (in / WP) * PATCH * SCALE + 9;
        int ox = (wx - lay.image.x) / SCALE, oy = (wy - lay.image.y) / SCALE;
        assert_blend(at(px, wx, wy), img_px(&f, oy, ox), qc, 0.5, wx, wy);
        wx = lay.image.x + (out % WP) * PATCH * SCALE + 9;
        wy = lay.image.y + (out / WP) * PATCH * SCALE + 9;
        ox = (wx - lay.image.x) / SCALE;
        oy = (wy - lay.image.y) / SCALE;
        ck_assert_mem_eq(at(px, wx, wy), img_px(&f, oy, ox), 3);
        free(px);
    }
    /* clicking inside a landmark's cell names that landmark */
    viz_hit h = viz_hit_test(&lay, &st, lay.image.x + 7 * PATCH * SCALE + 3, lay.image.y + 4 * PATCH * SCALE + 3);
    ck_assert_int_eq(h.kind, VIZ_HIT_IMAGE);
    ck_assert_int_eq(h.landmark, 3);
    ck_assert_int_eq(h.token, 4 * WP + 7);
    fixture_free(&f);
}
END_TEST

START_TEST(test_routing_and_query)
{
    fixture f;
    fixture_make(&f, 3);
    viz_state st;
    state_for(&st, &f);
    st.view = VIZ_ROUTING;
    st.layer = 0;
    st.head = 1;
    st.opacity = 0.7f;
    uint8_t *px = render(&st);
    viz_layout lay;
    viz_layout_compute(&lay, WW, WH, &st);
    int t = 2 * WP + 5;
    int wx = lay.image.x + 5 * PATCH * SCALE + 10, wy = lay.image.y + 2 * PATCH * SCALE + 10;
    uint8_t ec[3];
    viz_expert_color(ec, routed(0, 1, t));
    assert_blend(at(px, wx, wy), img_px(&f, (wy - lay.image.y) / SCALE, (wx - lay.image.x) / SCALE), ec, 0.7,
                 wx, wy);
    free(px);
    /* distinct colours for the experts of a 7x7 grid */
    for (int a = 0; a < 49; a++)
        for (int b = 0; b < a; b++) {
            uint8_t ca[3], cb[3];
            viz_expert_color(ca, a);
            viz_expert_color(cb, b);
            ck_assert_mem_ne(ca, cb, 3);
        }

    /* query view: the window of the query's expert is outlined and its picks marked */
    st.view = VIZ_QUERY;
    st.query_x = 5 * PATCH + 2;
    st.query_y = 2 * PATCH + 2;
    px = render(&st);
    int e = routed(0, 1, t);
    int r0, r1, c0, c1;
    mita_landmark_window(&r0, &r1, &c0, &c1, e, HP, WP, GH, GW);
    const uint8_t win[3] = {VIZ_WINDOW_R, VIZ_WINDOW_G, VIZ_WINDOW_B};
    int y0 = lay.image.y + r0 * PATCH * SCALE;
    ck_assert_mem_eq(at(px, lay.image.x + c0 * PATCH * SCALE + 20, y0), win, 3);
    const uint8_t pickc[3] = {VIZ_PICK_R, VIZ_PICK_G, VIZ_PICK_B};
    int p = pick(0, 1, e, 0);
    /* the pick's own 1-pixel outline sits on its first display column */
    int px0 = lay.image.x + (p % WP) * PATCH * SCALE, py0 = lay.image.y + (p / WP) * PATCH * SCALE;
    bool on_window = (p % WP) == c0 || (p / WP) == r0 || (p % WP) == c1 - 1 || (p / WP) == r1 - 1;
    if (!on_window) ck_assert_mem_eq(at(px, px0, py0 + 12), pickc, 3);
    free(px);
    fixture_free(&f);
}
END_TEST

START_TEST(test_legend_hit_and_modes)
{
    fixture f;
    fixture_make(&f, 3);
    viz_state st;
    state_for(&st, &f);
    viz_layout lay;
    viz_layout_compute(&lay, WW, WH, &st);
    ck_assert_int_eq(lay.n_legend, NCLS); /* all three present */
    for (int i = 0; i < lay.n_legend; i++) {
        viz_hit h = viz_hit_test(&lay, &st, lay.legend[i].x + 3, lay.legend[i].y + 3);
        ck_assert_int_eq(h.kind, VIZ_HIT_LEGEND);
        ck_assert_int_eq(h.value, lay.legend_class[i]);
    }
    /* a mask without class 2: present mode lists two, all mode three */
    for (int i = 0; i < IW * IH; i++)
        if (f.res.mask[i] == 2) f.res.mask[i] = 1;
    viz_layout_compute(&lay, WW, WH, &st);
    ck_assert_int_eq(lay.n_legend, 2);
    st.legend_all = true;
    viz_layout_compute(&lay, WW, WH, &st);
    ck_assert_int_eq(lay.n_legend, 3);
    /* parse/name round trip */
    for (int v = 0; v < VIZ_N_VIEWS; v++) ck_assert_int_eq(viz_view_parse(viz_view_name(v)), v);
    ck_assert_int_eq(viz_view_parse("nope"), -1);
    fixture_free(&f);
}
END_TEST

START_TEST(test_degenerate_states)
{
    /* start screen, result of another image, tiny windows: no crash, and the
     * image shows untinted while its result is missing */
    fixture f;
    fixture_make(&f, 3);
    viz_state st;
    state_for(&st, &f);
    st.img = NULL;
    uint8_t *px = render(&st);
    free(px);
    state_for(&st, &f);
    ms_image other = f.img;
    other.w = 32;
    st.img = &other;
    ck_assert_ptr_null(viz_result(&st));
    st.img = &f.img;
    st.res = NULL;
    px = render(&st);
    viz_layout lay;
    viz_layout_compute(&lay, WW, WH, &st);
    ck_assert_mem_eq(at(px, lay.image.x + 2, lay.image.y + 2), img_px(&f, 0, 0), 3);
    free(px);
    st.res = &f.res;
    for (int v = 0; v < VIZ_N_VIEWS; v++) {
        st.view = v;
        st.help = v % 2;
        st.query_x = st.query_y = 3;
        uint8_t small[8 * 8 * 4];
        viz_render(small, 8, 8, &st);
        uint8_t *big = malloc(1600 * 900 * 4);
        viz_render(big, 1600, 900, &st);
        free(big);
    }
    fixture_free(&f);
}
END_TEST

START_TEST(test_full_attention_run)
{
    /* a run without a record (full attention everywhere): the strip still
     * has one tile per layer, all marked full, and nothing is pruned */
    fixture f;
    fixture_make(&f, 3);
    free(f.res.layer_mita);
    free(f.res.topk_idx);
    free(f.res.route);
    free(f.res.shared_mass);
    f.res.layer_mita = NULL;
    f.res.topk_idx = f.res.route = NULL;
    f.res.shared_mass = NULL;
    f.res.attention = MS_ATTN_FULL;
    viz_state st;
    state_for(&st, &f);
    st.view = VIZ_HEATMAP;
    uint8_t *px = render(&st);
    viz_layout lay;
    viz_layout_compute(&lay, WW, WH, &st);
    ck_assert_int_eq(lay.n_tiles, 3);
    ck_assert_int_eq(count_strip_tiles(px, &lay), 3);
    /* the image shows untinted and unhatched */
    ck_assert_mem_eq(at(px, lay.image.x + 5 * SCALE + 2, lay.image.y + 44 * SCALE + 1), img_px(&f, 44, 5), 3);
    free(px);
    for (int v = 0; v < VIZ_N_VIEWS; v++) {
        st.view = v;
        px = render(&st);
        free(px);
    }
    fixture_free(&f);
}
END_TEST


/* A full-attention result of the fixture image: MiTA's mask but class 2 in
 * the rectangle x 8..23, y 8..15 (MiTA: class 0 there). */
static void full_make(ms_result *fr, const fixture *f)
{
    *fr = f->res;
    fr->topk_idx = fr->route = NULL;
    fr->shared_mass = NULL;
    fr->layer_mita = NULL;
    fr->attention = MS_ATTN_FULL;
    fr->mask = malloc(IW * IH);
    memcpy(fr->mask, f->res.mask, IW * IH);
    for (int y = 8; y < 16; y++)
        for (int x = 8; x < 24; x++) fr->mask[y * IW + x] = 2;
}

static void dim_of(uint8_t out[3], const uint8_t *src)
{
    int g = (src[0] * 77 + src[1] * 150 + src[2] * 29) >> 8;
    out[0] = out[1] = out[2] = (uint8_t)(g * 2 / 5);
}

START_TEST(test_diff_view)
{
    fixture f;
    fixture_make(&f, 3);
    ms_result fr;
    full_make(&fr, &f);
    viz_state st;
    state_for(&st, &f);
    st.view = VIZ_DIFF;
    /* without the full run: the image dimmed, nothing coloured */
    uint8_t *px = render(&st);
    viz_layout lay;
    viz_layout_compute(&lay, WW, WH, &st);
    int ix = lay.image.x + 12 * SCALE + 1, iy = lay.image.y + 10 * SCALE + 1; /* image (12, 10) */
    uint8_t d[3];
    dim_of(d, img_px(&f, 10, 12));
    ck_assert_mem_eq(at(px, ix, iy), d, 3);
    free(px);
    /* with it: inside the changed rectangle MiTA's colour, on its rim full
     * attention's, outside the dimmed image */
    st.full = &fr;
    ck_assert_ptr_eq(viz_full(&st), &fr);
    px = render(&st);
    ck_assert_mem_eq(at(px, ix, iy), pal[0], 3);
    ck_assert_mem_eq(at(px, lay.image.x + 8 * SCALE, iy), pal[2], 3);               /* left rim */
    ck_assert_mem_eq(at(px, lay.image.x + 24 * SCALE - 1, iy), pal[2], 3);          /* right rim */
    ck_assert_mem_eq(at(px, lay.image.x + 16 * SCALE, lay.image.y + 8 * SCALE), pal[2], 3); /* top */
    dim_of(d, img_px(&f, 30, 12));
    ck_assert_mem_eq(at(px, ix, lay.image.y + 30 * SCALE + 1), d, 3);
    free(px);
    /* split: full attention's colour right of the divider (the pointer), MiTA's left */
    st.diff_split = true;
    st.mouse_x = lay.image.x + 16 * SCALE;
    st.mouse_y = iy;
    ck_assert_int_eq(viz_split_x(&lay, &st), st.mouse_x);
    px = render(&st);
    ck_assert_mem_eq(at(px, lay.image.x + 10 * SCALE + 1, iy), pal[0], 3);
    ck_assert_mem_eq(at(px, lay.image.x + 20 * SCALE + 1, iy), pal[2], 3);
    free(px);
    /* another image's full run is not used */
    fr.w = IW - 1;
    ck_assert_ptr_null(viz_full(&st));
    fr.w = IW;
    /* the panel's depth chart: a click on layer 2's point selects it */
    ck_assert_int_eq(lay.depth_chart, 0);
    ck_assert_int_eq(lay.n_charts, 1);
    viz_rect a = lay.chart[0];
    for (int l = 0; l < 3; l++) {
        viz_hit h = viz_hit_test(&lay, &st, viz_chart_x(a, 3, l), a.y + a.h / 2);
        ck_assert_int_eq(h.kind, VIZ_HIT_LAYER);
        ck_assert_int_eq(h.value, l);
    }
    free(fr.mask);
    fixture_free(&f);
}
END_TEST

/* True when some pixel of column x in [y0, y1) has colour rgb. */
static bool column_has(const uint8_t *px, int x, int y0, int y1, const uint8_t rgb[3])
{
    for (int y = y0; y < y1; y++)
        if (!memcmp(at(px, x, y), rgb, 3)) return true;
    return false;
}

START_TEST(test_stats_view)
{
    fixture f;
    fixture_make(&f, 4);
    ms_stats s = {0};
    ck_assert(stats_compute(&s, &f.res, NULL) == MS_OK);
    ck_assert(!s.mita[1] && s.mita[2]); /* layer 1 of the fixture ran full attention */
    /* the statistics' pruned fractions are the heatmap's */
    int cnt[NT];
    for (int l = 0; l < 4; l++)
        for (int h = -1; h < HEADS && s.mita[l]; h++) {
            ck_assert(viz_selection_counts(cnt, &f.res, l, h) >= 0);
            double want = viz_pruned_fraction(NULL, cnt, &f.res);
            double got = h < 0 ? s.pruned[l] : s.pruned_head[l * HEADS + h];
            ck_assert_msg(fabs(got - want) < 1e-12, "layer %d head %d: %g vs heatmap %g", l, h, got, want);
        }
    ck_assert(s.pruned[0] > 0); /* row 5 of the token grid is never picked */
    viz_state st;
    state_for(&st, &f);
    st.view = VIZ_STATS;
    st.stats = &s;
    st.layer = 2;
    enum { BW = 1000, BH = 700 };
    uint8_t *px = malloc((size_t)BW * BH * 4);
    viz_render(px, BW, BH, &st);
    viz_layout lay;
    viz_layout_compute(&lay, BW, BH, &st);
    ck_assert_int_eq(lay.n_charts, 5);
    const uint8_t mark[3] = {VIZ_CHART_MARK_R, VIZ_CHART_MARK_G, VIZ_CHART_MARK_B};
    const uint8_t white[3] = {255, 255, 255};
#define PX(x, y) (px + ((size_t)(y) * BW + (x)) * 4)
    for (int i = 0; i < 4; i++) {
        viz_rect a = lay.chart[i];
        /* the current layer marked, and not another */
        bool marked = false, other = false;
        for (int y = a.y; y < a.y + a.h; y++) {
            marked |= !memcmp(PX(viz_chart_x(a, 4, 2), y), mark, 3);
            other |= !memcmp(PX(viz_chart_x(a, 4, 0), y), mark, 3);
        }
        ck_assert_msg(marked && !other, "chart %d: layer 2 marked only", i);
        /* a click on layer 3's bin selects layer 3 */
        viz_hit h = viz_hit_test(&lay, &st, viz_chart_x(a, 4, 3) + 1, a.y + 3);
        ck_assert_int_eq(h.kind, VIZ_HIT_LAYER);
        ck_assert_int_eq(h.value, 3);
    }
    /* chart 0: the "all heads" pruned fraction as a white point at its value
     * (y axis 0..1); layer 1 ran full attention: no point there */
    viz_rect a = lay.chart[0];
    for (int l = 0; l < 4; l++) {
        int x = viz_chart_x(a, 4, l);
        if (!s.mita[l]) {
            ck_assert(!column_has(px, x, a.y, a.y + a.h, white));
            continue;
        }
        int y = a.y + a.h - 1 - (int)lround(s.pruned[l] * (a.h - 1));
        ck_assert_msg(!memcmp(PX(x, y), white, 3), "layer %d: no white point at (%d,%d)", l, x, y);
    }
    /* chart 4 (block differences) waits for the full run: no series drawn */
    const uint8_t q[3] = {VIZ_QUERY_R, VIZ_QUERY_G, VIZ_QUERY_B};
    ck_assert(!column_has(px, viz_chart_x(lay.chart[4], 4, 0), lay.chart[4].y, lay.chart[4].y + lay.chart[4].h, q));
#undef PX
    free(px);
    /* the heatmap view's panel chart: every layer's pruned fraction, clickable */
    st.view = VIZ_HEATMAP;
    viz_layout_compute(&lay, BW, BH, &st);
    ck_assert_int_eq(lay.n_charts, 1);
    ck_assert_int_eq(lay.depth_chart, 0);
    ck_assert(viz_rect_contains(lay.panel, lay.chart[0].x, lay.chart[0].y));
    viz_hit h = viz_hit_test(&lay, &st, viz_chart_x(lay.chart[0], 4, 3), lay.chart[0].y + 2);
    ck_assert(h.kind == VIZ_HIT_LAYER && h.value == 3);
    st.stats = NULL; /* without statistics: no chart */
    viz_layout_compute(&lay, BW, BH, &st);
    ck_assert_int_eq(lay.n_charts, 0);
    stats_free(&s);
    fixture_free(&f);
}
END_TEST

START_TEST(test_sweep_view)
{
    fixture f;
    fixture_make(&f, 3);
    viz_state st;
    state_for(&st, &f);
    st.view = VIZ_SWEEP;
    ms_sweep_point sw[3] = {{.label = "k/2", .gh = 2, .gw = 2, .k = 2, .done = true, .agreement = 0.95, .ms = 10},
                            {.label = "k", .gh = 2, .gw = 2, .k = 4, .done = true, .agreement = 0.99, .ms = 20},
                            {.label = "2k", .gh = 2, .gw = 2, .k = 8, .done = false}};
    st.sweep = sw;
    st.n_sweep = 3;
    enum { BW = 900, BH = 600 };
    uint8_t *px = malloc((size_t)BW * BH * 4);
    viz_render(px, BW, BH, &st);
    viz_layout lay;
    viz_layout_compute(&lay, BW, BH, &st);
    viz_rect inner = {lay.main.x + 4, lay.main.y + 4, lay.main.w - 8, lay.main.h - 8};
    int hh = (inner.h - 8) / 2;
    viz_rect a0 = viz_chart_area((viz_rect){inner.x, inner.y, inner.w, hh}, NULL, true);
    viz_rect a1 = viz_chart_area((viz_rect){inner.x, inner.y + hh + 8, inner.w, hh}, NULL, true);
    const uint8_t q[3] = {VIZ_QUERY_R, VIZ_QUERY_G, VIZ_QUERY_B};
    uint8_t w[3];
    viz_magma(w, 0.65f); /* the time series' colour */
#define PX(x, y) (px + ((size_t)(y) * BW + (x)) * 4)
    /* agreement axis: 94% .. 100% (a point below 95% rounds the axis down) */
    for (int i = 0; i < 2; i++) {
        int x = viz_chart_x(a0, 3, i);
        int y = a0.y + a0.h - 1 - (int)lround((sw[i].agreement - 0.94) / 0.06 * (a0.h - 1));
        ck_assert_msg(!memcmp(PX(x, y), q, 3), "agreement point %d", i);
    }
    /* time axis 0 .. 20 ms (nice top of the data): point 1 at the top */
    ck_assert(!memcmp(PX(viz_chart_x(a1, 3, 1), a1.y), w, 3));
    /* the pending run has no point */
    ck_assert(!column_has(px, viz_chart_x(a0, 3, 2), a0.y, a0.y + a0.h, q));
#undef PX
    free(px);
    fixture_free(&f);
}
END_TEST

START_TEST(test_zoom_pixel_exact)
{
    fixture f;
    fixture_make(&f, 3);
    viz_state st;
    state_for(&st, &f);
    st.opacity = 0.5f;
    st.zoom = 4.0f;
    st.center_x = 20, st.center_y = 15;
    uint8_t *px = render(&st);
    viz_layout lay;
    viz_layout_compute(&lay, WW, WH, &st);
    ck_assert_int_eq(lay.image.w, IW * SCALE * 4);
    ck_assert_int_eq(lay.image.h, IH * SCALE * 4);
    ck_assert(lay.clip.w > 0 && lay.clip.w < lay.image.w);
    /* every visible screen pixel is its own image pixel's colour blend, and
     * hit testing names that pixel */
    for (int y = lay.clip.y; y < lay.clip.y + lay.clip.h; y += 7)
        for (int x = lay.clip.x; x < lay.clip.x + lay.clip.w; x += 5) {
            int ox = (x - lay.image.x) / (SCALE * 4), oy = (y - lay.image.y) / (SCALE * 4);
            assert_blend(at(px, x, y), img_px(&f, oy, ox), pal[cls_at(oy, ox)], 0.5, x, y);
            viz_hit h = viz_hit_test(&lay, &st, x, y);
            ck_assert_int_eq(h.kind, VIZ_HIT_IMAGE);
            ck_assert(h.img_x == ox && h.img_y == oy);
        }
    /* the middle of the main area shows the centre pixel */
    viz_rect inner = {lay.main.x + 4, lay.main.y + 4, lay.main.w - 8, lay.main.h - 8};
    viz_hit h = viz_hit_test(&lay, &st, inner.x + inner.w / 2, inner.y + inner.h / 2);
    ck_assert(abs(h.img_x - 20) <= 1 && abs(h.img_y - 15) <= 1);
    /* outside the clip (the panel) is not the image */
    ck_assert_int_ne(viz_hit_test(&lay, &st, lay.panel.x + 5, lay.clip.y + 5).kind, VIZ_HIT_IMAGE);
    free(px);
    /* zooming about a point keeps the image point under it */
    int wx = inner.x + inner.w / 2 + 13, wy = inner.y + inner.h / 2 - 9;
    viz_hit before = viz_hit_test(&lay, &st, wx, wy);
    viz_zoom_at(&st, &lay, 1.5f, wx, wy);
    ck_assert(fabsf(st.zoom - 6.0f) < 1e-4f);
    viz_layout_compute(&lay, WW, WH, &st);
    viz_hit after = viz_hit_test(&lay, &st, wx, wy);
    ck_assert(after.img_x == before.img_x && after.img_y == before.img_y);
    /* a drag pans: 24 window pixels left moves the centre 1 image pixel right at 6x4 = 24 px/pixel */
    double cx = st.center_x;
    viz_pan(&st, &lay, -24, 0);
    ck_assert(fabs(st.center_x - (cx + 1.0)) < 1e-6);
    /* the centre is kept so the image covers the area */
    viz_pan(&st, &lay, 100000, 100000);
    viz_layout_compute(&lay, WW, WH, &st);
    ck_assert_int_eq(lay.image.x, inner.x);
    ck_assert_int_eq(lay.image.y, inner.y);
    /* zoom bounds; fit */
    viz_zoom_at(&st, &lay, 1000.f, wx, wy);
    ck_assert(st.zoom == VIZ_ZOOM_MAX);
    viz_zoom_fit(&st);
    viz_layout_compute(&lay, WW, WH, &st);
    ck_assert_int_eq(lay.image.w, IW * SCALE);
    /* views without the image do not zoom */
    st.view = VIZ_STATS;
    st.zoom = 3;
    viz_layout_compute(&lay, WW, WH, &st);
    ck_assert_int_le(lay.image.w, IW * SCALE);
    fixture_free(&f);
}
END_TEST

START_TEST(test_colormaps)
{
    /* published table entries 0, 128 and 255 (#440154 #21918c #fde725;
     * #000004 #b73779 #fcfdbf); the polynomial fits stray up to about 0.02
     * (5 levels) from the table, worst at the ends */
    static const struct { int v; float t; uint8_t rgb[3]; } ref[] = {
        {0, 0.0f, {68, 1, 84}},    {0, 128.f / 255, {33, 145, 140}},  {0, 1.0f, {253, 231, 37}},
        {1, 0.0f, {0, 0, 4}},      {1, 128.f / 255, {183, 55, 121}}, {1, 1.0f, {252, 253, 191}},
    };
    for (size_t i = 0; i < sizeof ref / sizeof ref[0]; i++) {
        uint8_t got[3];
        if (ref[i].v == 0) viz_viridis(got, ref[i].t);
        else viz_magma(got, ref[i].t);
        for (int ch = 0; ch < 3; ch++)
            ck_assert_msg(abs(got[ch] - ref[i].rgb[ch]) <= 5, "map %d t %.3f ch %d: %d vs %d", ref[i].v,
                          (double)ref[i].t, ch, got[ch], ref[i].rgb[ch]);
    }
    /* viridis lightness rises monotonically (perceptual ordering) */
    double prev = -1;
    for (int i = 0; i <= 64; i++) {
        uint8_t c[3];
        viz_viridis(c, i / 64.f);
        double lum = 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
        ck_assert(lum > prev);
        prev = lum;
    }
}
END_TEST

START_TEST(test_text)
{
    viz_font *font = NULL;
    if (viz_font_open(&font, viz_font_path(), 13) != MS_OK) {
        /* fonts-dejavu-core missing: nothing to check here */
        return;
    }
    fixture f;
    fixture_make(&f, 3);
    viz_state st;
    state_for(&st, &f);
    st.status = "hello status";
    uint8_t *plain = render(&st);
    st.font = font;
    uint8_t *withtext = render(&st);
    viz_layout lay;
    viz_layout_compute(&lay, WW, WH, &st);
    int diff = 0;
    for (int y = lay.status.y; y < lay.status.y + lay.status.h; y++)
        for (int x = 0; x < 120; x++) diff += memcmp(at(plain, x, y), at(withtext, x, y), 3) != 0;
    ck_assert_int_gt(diff, 20);
    ck_assert_int_gt(viz_text_width(font, "abc"), viz_text_width(font, "a"));
    ck_assert_int_gt(viz_font_height(font), 8);
    free(plain);
    free(withtext);
    viz_font_free(font);
    fixture_free(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("viz_render");
    TCase *tc = tcase_create("render");
    tcase_add_test(tc, test_layout_scale);
    tcase_add_test(tc, test_overlay_blend);
    tcase_add_test(tc, test_outlines);
    tcase_add_test(tc, test_selection_counts);
    tcase_add_test(tc, test_heatmap_pruned);
    tcase_add_test(tc, test_strip_tiles);
    tcase_add_test(tc, test_expert_window);
    tcase_add_test(tc, test_routing_and_query);
    tcase_add_test(tc, test_legend_hit_and_modes);
    tcase_add_test(tc, test_degenerate_states);
    tcase_add_test(tc, test_full_attention_run);
    tcase_add_test(tc, test_diff_view);
    tcase_add_test(tc, test_stats_view);
    tcase_add_test(tc, test_sweep_view);
    tcase_add_test(tc, test_zoom_pixel_exact);
    tcase_add_test(tc, test_colormaps);
    tcase_add_test(tc, test_text);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
