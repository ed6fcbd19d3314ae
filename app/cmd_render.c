/* mitaseg render: one viewer view, drawn headless into a PNG. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "file_io.h"

#ifndef MS_HAVE_VIEWER
int cmd_render(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cli_error("render: this build has no viewer (SDL2 and SDL2_ttf were not found)");
    return 2;
}
#else
#include "viz/render.h"

static const char render_usage[] =
    "usage: mitaseg render IMAGE -o OUT.png [options] [engine options]\n"
    "\n"
    "Draws one view of the viewer into a PNG, without a window.\n"
    "\n"
    "options:\n"
    "  --view V          overlay|heatmap|strip|expert|routing|query|diff|stats|sweep\n"
    "                    (default overlay; diff, stats and sweep also run full attention,\n"
    "                    sweep runs 7 budgets more)\n"
    "  --layer L         layer, 0-based (default: the last MiTA layer)\n"
    "  --head H          head, 0-based, or 'all' (default all)\n"
    "  --expert E        landmark for the expert view (default: the centre one)\n"
    "  --query X,Y       query pixel for the query view (default: the image centre)\n"
    "  --opacity A       tint opacity 0..1 (default 0.5)\n"
    "  --outlines        class outlines in the overlay\n"
    "  --legend-all      list every class in the legend, not only present ones\n"
    "  --split           diff view: MiTA left, full attention right of the middle\n"
    "  --zoom Z[,X,Y]    magnify Z times (1..64) about image pixel X,Y (default centre)\n"
    "  --size WxH        picture size (default 1280x800)\n"
    "  -o OUT.png        where to write\n";

static bool parse_int_range(const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

/* The picture's status line: what is shown and how it was computed. */
static void describe(char *buf, size_t n, const char *image, const ms_result *r)
{
    const char *base = strrchr(image, '/');
    base = base ? base + 1 : image;
    snprintf(buf, n, "%s  %dx%d (%dx%d tokens)", base, r->w, r->h, r->wp, r->hp);
}

int cmd_render(int argc, char **argv)
{
    cli_engine_args ea;
    cli_engine_args_init(&ea);
    const char *image = NULL, *out = NULL;
    int view = VIZ_OVERLAY, layer = -1, head = -1, expert = -1, qx = -1, qy = -1;
    int W = 1280, H = 800;
    float opacity = 0.5f;
    bool outlines = false, legend_all = false, head_set = false, split = false;
    float zoom = 1.0f;
    int zx = -1, zy = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int rc = cli_parse_engine_arg(&ea, argc, argv, &i);
        if (rc < 0) return 2;
        if (rc > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(render_usage, stdout);
            fputs(cli_engine_help, stdout);
            return 0;
        }
        if (!strcmp(a, "--outlines")) { outlines = true; continue; }
        if (!strcmp(a, "--legend-all")) { legend_all = true; continue; }
        if (!strcmp(a, "--split")) { split = true; continue; }
        bool takes = !strcmp(a, "--view") || !strcmp(a, "--layer") || !strcmp(a, "--head") ||
                     !strcmp(a, "--expert") || !strcmp(a, "--query") || !strcmp(a, "--opacity") ||
                     !strcmp(a, "--size") || !strcmp(a, "-o") || !strcmp(a, "--zoom");
        if (takes) {
            if (i + 1 >= argc) {
                cli_error("%s needs a value", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--view")) {
                view = viz_view_parse(v);
                if (view < 0) {
                    cli_error("--view: expected overlay, heatmap, strip, expert, routing, query, diff, stats or "
                              "sweep, got '%s'", v);
                    return 2;
                }
            } else if (!strcmp(a, "--layer")) {
                if (!parse_int_range(v, 0, 1 << 20, &layer)) {
                    cli_error("--layer: expected a layer number (0-based), got '%s'", v);
                    return 2;
                }
            } else if (!strcmp(a, "--head")) {
                head_set = true;
                if (!strcmp(v, "all")) head = -1;
                else if (!parse_int_range(v, 0, 1 << 20, &head)) {
                    cli_error("--head: expected a head number (0-based) or 'all', got '%s'", v);
                    return 2;
                }
            } else if (!strcmp(a, "--expert")) {
                if (!parse_int_range(v, 0, 1 << 20, &expert)) {
                    cli_error("--expert: expected a landmark number (0-based), got '%s'", v);
                    return 2;
                }
            } else if (!strcmp(a, "--query")) {
                int n = 0;
                if (sscanf(v, "%d,%d%n", &qx, &qy, &n) != 2 || v[n] || qx < 0 || qy < 0) {
                    cli_error("--query: expected X,Y (pixels), got '%s'", v);
                    return 2;
                }
            } else if (!strcmp(a, "--opacity")) {
                char *end;
                opacity = strtof(v, &end);
                if (end == v || *end || !(opacity >= 0 && opacity <= 1)) {
                    cli_error("--opacity: expected a number in 0..1, got '%s'", v);
                    return 2;
                }
            } else if (!strcmp(a, "--zoom")) {
                int n = 0, m = 0;
                if (sscanf(v, "%f%n,%d,%d%n", &zoom, &n, &zx, &zy, &m) >= 1 && (v[n] == '\0' || (m > 0 && !v[m])) &&
                    zoom >= 1 && zoom <= VIZ_ZOOM_MAX && (m == 0 || (zx >= 0 && zy >= 0))) {
                    if (m == 0) zx = zy = -1;
                } else {
                    cli_error("--zoom: expected Z or Z,X,Y with Z in 1..64 and pixels X,Y, got '%s'", v);
                    return 2;
                }
            } else if (!strcmp(a, "--size")) {
                int n = 0;
                if (sscanf(v, "%dx%d%n", &W, &H, &n) != 2 || v[n] || W < 64 || H < 64 || W > 16384 ||
                    H > 16384) {
                    cli_error("--size: expected WxH between 64x64 and 16384x16384, got '%s'", v);
                    return 2;
                }
            } else {
                out = v;
            }
            continue;
        }
        if (a[0] == '-' && a[1]) {
            cli_error("render: unknown option '%s' (see mitaseg render --help)", a);
            return 2;
        }
        if (image) {
            cli_error("render: one image at a time ('%s' and '%s')", image, a);
            return 2;
        }
        image = a;
    }
    if (!image || !out) {
        fputs(render_usage, stderr);
        return 2;
    }

    ms_engine *eng = NULL;
    if (cli_open_engine(&eng, &ea, false)) return 1;
    bool against_full = view == VIZ_DIFF || view == VIZ_STATS || view == VIZ_SWEEP;
    ms_run_options ro = ea.run;
    ro.record = true;
    ro.keep_blocks = against_full;
    ms_image img = {0};
    if (cli_read_image(&img, image, eng, &ro, 0) != MS_OK) {
        cli_error("%s", ms_last_error());
        engine_free(eng);
        return 1;
    }
    /* The image and the model are inputs now: -o may be neither, and must
     * be writable, before the model runs. */
    if (fio_check_writable(out) != MS_OK) {
        cli_error("render: -o: %s", ms_last_error());
        engine_free(eng);
        image_free(&img);
        return 2;
    }
    const ms_config *cfg = engine_config(eng);
    ms_result res, full, scratch;
    memset(&res, 0, sizeof res);
    memset(&full, 0, sizeof full);
    memset(&scratch, 0, sizeof scratch);
    ms_stats stats;
    memset(&stats, 0, sizeof stats);
    ms_sweep_point sweep[MS_SWEEP_MAX];
    int n_sweep = 0;
    int rc = 1;
    uint8_t *px = NULL;
    viz_font *font = NULL;
    if (engine_run(eng, &res, &img, &ro) != MS_OK) {
        cli_error("%s: %s", image, ms_last_error());
        goto done;
    }
    if (against_full && res.attention == MS_ATTN_MITA) {
        /* the reference (and the sweep below) at the shown run's working size and TTA */
        ms_run_options fo = stats_compare_options(&ro, MS_ATTN_FULL, 0, 0, 0);
        fo.keep_blocks = true;
        if (engine_run(eng, &full, &img, &fo) != MS_OK || stats_compute(&stats, &res, &full) != MS_OK) {
            cli_error("%s: %s", image, ms_last_error());
            goto done;
        }
        if (view == VIZ_SWEEP) {
            n_sweep = stats_sweep_plan(sweep, res.gh, res.gw, res.k, res.hp, res.wp, res.n);
            for (int i = 0; i < n_sweep; i++)
                if (stats_run_sweep_point(&sweep[i], eng, &scratch, &img, full.mask, &ro) != MS_OK) {
                    cli_error("%s: sweep %s: %s", image, sweep[i].label, ms_last_error());
                    goto done;
                }
        }
    } else if (res.attention == MS_ATTN_MITA && stats_compute(&stats, &res, NULL) != MS_OK) {
        cli_error("%s: %s", image, ms_last_error());
        goto done;
    } else if (against_full) {
        fprintf(stderr, "mitaseg: this run is full attention: nothing to compare (the %s view stays empty)\n",
                viz_view_name((viz_view)view));
    }
    /* check the selections against what this run has */
    if (layer >= res.depth) {
        cli_error("--layer %d: out of range, this model has layers 0..%d", layer, res.depth - 1);
        rc = 2;
        goto done;
    }
    if (layer < 0) {
        layer = res.depth - 1;
        while (layer > 0 && res.layer_mita && !res.layer_mita[layer]) layer--;
    }
    if (head_set && head >= res.heads) {
        cli_error("--head %d: out of range, this model has heads 0..%d (or 'all')", head, res.heads - 1);
        rc = 2;
        goto done;
    }
    if (expert >= res.m) {
        cli_error("--expert %d: out of range, this run has landmarks 0..%d (%dx%d)", expert, res.m - 1,
                  res.gh, res.gw);
        rc = 2;
        goto done;
    }
    if (expert < 0) expert = (res.gh / 2) * res.gw + res.gw / 2;
    if (qx >= img.w || qy >= img.h) {
        cli_error("--query %d,%d: outside the %dx%d image (x 0..%d, y 0..%d)", qx, qy, img.w, img.h,
                  img.w - 1, img.h - 1);
        rc = 2;
        goto done;
    }
    if (zx >= img.w || zy >= img.h) {
        cli_error("--zoom: centre %d,%d outside the %dx%d image", zx, zy, img.w, img.h);
        rc = 2;
        goto done;
    }
    if (qx < 0) {
        qx = img.w / 2;
        qy = img.h / 2;
    }
    if (view != VIZ_OVERLAY && res.depth > 0 && (!res.layer_mita || !res.layer_mita[layer]))
        fprintf(stderr, "mitaseg: layer %d ran full attention: it has no selections to show\n", layer);
    if (viz_font_open(&font, viz_font_path(), 13) != MS_OK) {
        cli_error("drawing without text: %s", ms_last_error());
        font = NULL;
    }
    viz_state st;
    viz_state_init(&st);
    st.img = &img;
    st.res = &res;
    st.n_classes = cfg->n_classes;
    st.class_names = cfg->class_names;
    st.palette = cfg->palette;
    st.view = (viz_view)view;
    st.layer = layer;
    st.head = head;
    st.expert = expert;
    st.query_x = qx;
    st.query_y = qy;
    st.opacity = opacity;
    st.outlines = outlines;
    st.legend_all = legend_all;
    st.font = font;
    st.full = full.mask ? &full : NULL;
    st.stats = stats.depth ? &stats : NULL;
    st.sweep = sweep;
    st.n_sweep = n_sweep;
    st.diff_split = split;
    st.zoom = zoom;
    st.center_x = zx >= 0 ? zx + 0.5 : img.w / 2.0;
    st.center_y = zy >= 0 ? zy + 0.5 : img.h / 2.0;
    char status[256], info[256];
    describe(status, sizeof status, image, &res);
    const char *model = cli_model_path(&ea), *slash = strrchr(model, '/');
    snprintf(info, sizeof info, "%s\nran on %s in %.0f ms%s", slash ? slash + 1 : model, res.device_name,
             res.ms_total, res.tta_flip ? " (flip TTA)" : "");
    st.status = status;
    st.info = info;
    px = malloc((size_t)W * H * 4);
    if (!px) {
        cli_error("out of memory for a %dx%d picture", W, H);
        goto done;
    }
    viz_render(px, W, H, &st);
    /* RGB: the alpha is always opaque, and the file is a quarter smaller */
    for (size_t i = 0; i < (size_t)W * H; i++) memmove(px + i * 3, px + i * 4, 3);
    if (image_write_rgb(out, px, W, H) != MS_OK) {
        cli_error("%s", ms_last_error());
        goto done;
    }
    rc = 0;
done:
    free(px);
    viz_font_free(font);
    result_free(&res);
    result_free(&full);
    result_free(&scratch);
    stats_free(&stats);
    engine_free(eng);
    image_free(&img);
    return rc;
}
#endif
