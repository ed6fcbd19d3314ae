/* mitaseg info: a model file's config, what follows from it, and its tensors.
 * Checks it as the engine would (shapes against the config, finite weights)
 * without keeping the weights or picking a device. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "image_resize.h"
#include "model_file.h"

static const char info_help[] =
    "usage: mitaseg info [MODEL]\n"
    "\n"
    "Prints a model file's config (as stored, pretty-printed), derived facts (token\n"
    "grid at the working size, MiTA cost, parameter count) and its tensor table\n"
    "(name, dtype, shape, bytes). MODEL defaults to --model FILE, $MITASEG_MODEL,\n"
    "or the shipped model. A model the engine would refuse (a tensor that does not\n"
    "fit the config, a NaN or Inf weight) is one error line and exit status 1.\n"
    "\n"
    "options:\n"
    "  --model FILE            the model file (same as MODEL)\n"
    "  --no-tensors            leave out the tensor table\n"
    "  -h, --help              this help\n";

static const char *const dtype_names[] = {"F32", "F16", "BF16", "I32", "U8"};

static const char *dtype_name(ms_dtype d)
{
    return (unsigned)d < sizeof dtype_names / sizeof *dtype_names ? dtype_names[d] : "?";
}

/* 1234567 -> "1,234,567" */
static void fmt_count(char *buf, size_t n, uint64_t v)
{
    char raw[32];
    snprintf(raw, sizeof raw, "%llu", (unsigned long long)v);
    size_t len = strlen(raw), o = 0;
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = raw[i];
    }
    buf[o] = '\0';
}

static void fmt_bytes(char *buf, size_t n, double b)
{
    if (b >= 1024.0 * 1024 * 1024) snprintf(buf, n, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024) snprintf(buf, n, "%.2f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0) snprintf(buf, n, "%.1f KiB", b / 1024.0);
    else snprintf(buf, n, "%.0f B", b);
}

/* The engine's geometry (app/engine.c plan_geometry): resize so the short
 * side is short_side (round half up; the long side capped at long_side), pad
 * to pad_multiple and whole patches. */
static void print_grid(const ms_config *c, int w, int h, const char *what)
{
    int rh, rw;
    image_keep_ratio_size(&rh, &rw, h, w, c->short_side, c->long_side);
    int m = c->pad_multiple > 0 ? c->pad_multiple : 1, p = c->patch_size;
    int ph = (rh + m - 1) / m * m, pw = (rw + m - 1) / m * m;
    ph = (ph + p - 1) / p * p;
    pw = (pw + p - 1) / p * p;
    int hp = ph / p, wp = pw / p, n = hp * wp;
    /* image sizes W x H as image tools print them; grids rows x cols as the
     * --landmarks option takes them */
    printf("  %-22s %dx%d -> %dx%d resized -> %dx%d padded -> %d x %d tokens (N = %d)", what,
           w, h, rw, rh, pw, ph, hp, wp, n);
    if (c->attn.type == MS_ATTN_MITA) {
        int gh = c->attn.gh < hp ? c->attn.gh : hp, gw = c->attn.gw < wp ? c->attn.gw : wp;
        int mm = gh * gw, k = c->attn.topk < n ? c->attn.topk : n;
        /* per head: probe M N d, summary M N d, routing N M d, routed N k d
         * against N^2 d for full attention (mita-spec.md section 2) */
        double ratio = (3.0 * mm + k) / n;
        printf(", MiTA %dx%d landmarks, k = %d: %.0f%% of full attention's score work",
               gh, gw, k, 100.0 * ratio);
    }
    printf("\n");
}

int cmd_info(int argc, char **argv)
{
    cli_engine_args ea;
    cli_engine_args_init(&ea);
    bool tensors = true;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(info_help, stdout);
            return 0;
        }
        if (!strcmp(o, "--no-tensors")) { tensors = false; continue; }
        if (!strcmp(o, "--model")) {
            if (i + 1 >= argc) { cli_error("info: --model needs a value"); return 2; }
            ea.model = argv[++i];
            continue;
        }
        if (o[0] == '-' && o[1]) {
            cli_error("info: unknown option '%s' (see mitaseg info --help)", o);
            return 2;
        }
        if (ea.model) {
            cli_error("info: one model at a time (got '%s' and '%s')", ea.model, o);
            return 2;
        }
        ea.model = o;
    }
    const char *path = cli_model_path(&ea);
    ms_model_file *mf;
    if (model_file_open(&mf, path) != MS_OK) {
        cli_error("%s", ms_last_error());
        return 1;
    }
    /* What the engine would refuse (a tensor the config does not fit, a
     * non-finite weight), info refuses too. */
    if (engine_check_model(mf) != MS_OK) {
        cli_error("%s", ms_last_error());
        model_file_close(mf);
        return 1;
    }
    const ms_config *c = model_file_config(mf);

    fputs("model: ", stdout);
    cli_fputs_escaped(model_file_path(mf), stdout);
    printf("\n\nconfig:\n");
    cJSON *j = cJSON_Parse(c->json);
    char *pretty = j ? cJSON_Print(j) : NULL;
    puts(pretty ? pretty : c->json);
    free(pretty);
    cJSON_Delete(j);

    int nt = model_file_count(mf);
    uint64_t params = 0, other = 0;
    double stored = 0;
    for (int i = 0; i < nt; i++) {
        const ms_tensor *t = model_file_tensor(mf, i);
        uint64_t el = 1;
        for (int d = 0; d < t->ndim; d++) el *= (uint64_t)t->shape[d];
        /* I32/U8 tensors are not weights (model-format.md) */
        if (t->dtype == MS_DT_F32 || t->dtype == MS_DT_F16 || t->dtype == MS_DT_BF16) {
            params += el;
            stored += (double)t->nbytes;
        } else {
            other += el;
        }
    }

    printf("\nderived:\n");
    int d = c->num_heads ? c->embed_dim / c->num_heads : 0;
    printf("  backbone               ViT, %d blocks, dim %d, %d heads of %d, MLP x%d, patch %d, %s stem",
           c->depth, c->embed_dim, c->num_heads, d, c->mlp_ratio, c->patch_size,
           c->stem == MS_STEM_CONV ? "conv" : "patch");
    if (c->stem == MS_STEM_CONV) {
        printf(" (");
        for (int i = 0; i < c->n_stem; i++) printf("%s%d", i ? "-" : "", c->stem_channels[i]);
        printf(")");
    }
    printf("\n  taps                   blocks %d, %d, %d, %d%s\n", c->out_indices[0],
           c->out_indices[1], c->out_indices[2], c->out_indices[3],
           c->final_norm ? " (final LayerNorm on the last)" : "");
    if (c->attn.type == MS_ATTN_MITA)
        printf("  attention              MiTA: %dx%d landmarks (M = %d), top-k %d, shared logit q.l/%s\n",
               c->attn.gh, c->attn.gw, c->attn.gh * c->attn.gw, c->attn.topk,
               c->attn.shared_scale_d ? "d" : "sqrt(d)");
    else
        printf("  attention              full (MiTA can be chosen at run time: --attention mita)\n");
    static const char *const necks[] = {"mln", "fpn-deconv", "none"};
    printf("  neck, head             %s (%d channels", necks[c->neck], c->neck_channels);
    if (c->n_stem_skips)
        printf("; levels 0-%d add the conv stem's output of their size", c->n_stem_skips - 1);
    printf("), UperHead %d channels, pool scales", c->head_channels);
    for (int i = 0; i < c->n_pool; i++) printf(" %d", c->pool_scales[i]);
    printf("\n  classes                %d", c->n_classes);
    if (c->ignore_index >= 0) printf(", ignore index %d", c->ignore_index);
    printf("\n  position embedding     trained at a %d x %d token grid (rows x cols; bicubic to others)\n",
           c->pos_grid[0], c->pos_grid[1]);
    if (c->short_side > 0 && c->long_side > 0)
        printf("  working size           short side %d, long side at most %d, padded to a "
               "multiple of %d\n", c->short_side, c->long_side, c->pad_multiple);
    else if (c->short_side > 0)
        printf("  working size           short side %d, padded to a multiple of %d\n",
               c->short_side, c->pad_multiple);
    else
        printf("  working size           the image's own, padded to a multiple of %d\n",
               c->pad_multiple);
    if (c->resize_cv2_uint8)
        printf("  input resize           the 8-bit image, as OpenCV's INTER_LINEAR (cv2_uint8)\n");
    if (c->short_side > 0) {
        int s = c->short_side;
        print_grid(c, s, s, "square image:");
        print_grid(c, (s * 4 + 1) / 3, s, "4:3 image:");
        print_grid(c, (s * 16 + 4) / 9, s, "16:9 image:");
    } else {
        print_grid(c, 512, 512, "512x512 image:");
        print_grid(c, 960, 720, "960x720 image:");
    }
    char cnt[48], by[32], by32[32];
    fmt_count(cnt, sizeof cnt, params);
    fmt_bytes(by, sizeof by, stored);
    fmt_bytes(by32, sizeof by32, (double)params * 4);
    printf("  parameters             %s (%s stored, %s as F32 in memory)\n", cnt, by, by32);
    if (other) {
        fmt_count(cnt, sizeof cnt, other);
        printf("  other tensors          %s integer elements\n", cnt);
    }
    if (c->provenance && *c->provenance) { /* free text from the file: escaped */
        fputs("  provenance             ", stdout);
        cli_fputs_escaped(c->provenance, stdout);
        putchar('\n');
    }

    if (tensors) {
        printf("\ntensors (%d):\n", nt);
        int wname = 4;
        for (int i = 0; i < nt; i++) {
            int l = (int)strlen(model_file_tensor(mf, i)->name);
            if (l > wname) wname = l;
        }
        printf("  %-*s  %-5s %-22s %12s\n", wname, "name", "dtype", "shape", "bytes");
        for (int i = 0; i < nt; i++) {
            const ms_tensor *t = model_file_tensor(mf, i);
            char shape[128];
            size_t o = 0;
            shape[o++] = '(';
            for (int k = 0; k < t->ndim && o < sizeof shape - 24; k++)
                o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%lld", k ? ", " : "",
                                      (long long)t->shape[k]);
            snprintf(shape + o, sizeof shape - o, "%s", t->ndim == 1 ? ",)" : ")");
            printf("  %-*s  %-5s %-22s %12zu\n", wname, t->name, dtype_name(t->dtype), shape,
                   t->nbytes);
        }
    }
    model_file_close(mf);
    return 0;
}
