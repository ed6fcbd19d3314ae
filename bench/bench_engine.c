/* Times engine_run on a synthetic image (engine_run_batch on --batch B
 * copies of it): warm-up once (plan + arena sizing), then --repeat runs.
 * Prints one JSON line. --stages adds the time per stage,
 * taken at the engine's trace points (on CUDA each point waits for the
 * stream and copies the stage out, so the sum exceeds a plain run a little).
 * --image runs a real image instead. --serve is bench/bench_cpu.py's worker
 * mode: after loading it prints {"ready": ...} and then answers each stdin
 * line "run" with {"ms": T} (one timed engine_run) and "dump PATH" with the
 * last result's --dump file, until EOF, so the driver can interleave it with
 * other contenders run by run. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "app/engine.h"
#include "kernels/cpu_path.h"
#include "kernels/gemm.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Stage groups by trace name prefix; time since the previous trace point is
 * charged to the stage that point ends. */
static const char *const stage_names[] = {"preprocess", "stem", "blocks", "neck", "head",
                                          "postprocess"};
enum { N_STAGES = 6 };
typedef struct {
    double last, ms[N_STAGES];
} stage_clock;

static int stage_of(const char *name)
{
    if (!strcmp(name, "input") || !strcmp(name, "pos_embed")) return 0;
    if (!strcmp(name, "embed")) return 1;
    if (!strncmp(name, "blocks.", 7) || !strncmp(name, "taps.", 5)) return 2;
    if (!strncmp(name, "neck.", 5)) return 3;
    if (!strncmp(name, "head.", 5)) return 4;
    return 5;
}

/* The worker loop of --serve. Returns the exit status. */
static int serve(ms_engine *e, ms_result *res, const ms_image *img, const ms_run_options *ro)
{
#ifdef MS_HAVE_CUDA
    const char *cuda = "true"; /* linked and loaded at start: part of the RSS */
#else
    const char *cuda = "false";
#endif
    printf("{\"ready\": true, \"openblas\": \"%s\", \"core\": \"%s\", \"cuda_linked\": %s, "
           "\"cpu_path\": \"%s\", \"gemm\": \"%s\"}\n",
           openblas_get_config(), openblas_get_corename(), cuda, cpu_path_name(cpu_path_get()),
           gemm_lib_name(gemm_lib_get()));
    fflush(stdout);
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (!strcmp(line, "run")) {
            double t0 = now_ms();
            if (engine_run(e, res, img, ro) != MS_OK) break;
            printf("{\"ms\": %.3f}\n", now_ms() - t0);
        } else if (!strncmp(line, "dump ", 5) && res->logits) {
            if (result_write_dump(res, line + 5) != MS_OK) break;
            printf("{\"ok\": true}\n");
        } else {
            fprintf(stderr, "bench_engine: unknown command (or dump before run): '%s'\n", line);
            return 2;
        }
        fflush(stdout);
    }
    if (ferror(stdin) || !feof(stdin)) {
        fprintf(stderr, "bench_engine: %s\n", ferror(stdin) ? "stdin read error" : ms_last_error());
        return 1;
    }
    return 0;
}

static void on_stage(void *user, const char *name, const float *data, int ndim,
                     const int64_t *shape)
{
    (void)data, (void)ndim, (void)shape;
    stage_clock *c = user;
    double t = now_ms();
    c->ms[stage_of(name)] += t - c->last;
    c->last = t;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *image = NULL;
    int w = 512, h = 512, repeat = 3, threads = 0, batch = 1;
    bool stages = false, serving = false;
    ms_engine_options eo = {.device = MS_DEV_CPU};
    ms_run_options ro = {.attention = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) model = v, i++;
        else if (!strcmp(a, "--size") && v) { if (sscanf(v, "%dx%d", &w, &h) != 2) return 2; i++; }
        else if (!strcmp(a, "--repeat") && v) repeat = atoi(v), i++;
        else if (!strcmp(a, "--threads") && v) threads = atoi(v), i++;
        else if (!strcmp(a, "--batch") && v) batch = atoi(v), i++;
        else if (!strcmp(a, "--attention") && v) { ro.attention = strcmp(v, "full") ? MS_ATTN_MITA : MS_ATTN_FULL; i++; }
        else if (!strcmp(a, "--device") && v) { eo.device = strcmp(v, "cuda") ? MS_DEV_CPU : MS_DEV_CUDA; i++; }
        else if (!strcmp(a, "--record")) ro.record = true;
        else if (!strcmp(a, "--stages")) stages = true;
        else if (!strcmp(a, "--image") && v) image = v, i++;
        else if (!strcmp(a, "--serve")) serving = true;
        else {
            fprintf(stderr, "usage: bench_engine --model FILE [--size WxH] [--repeat N] [--threads N]"
                            " [--batch B] [--attention mita|full] [--device cpu|cuda] [--record]"
                            " [--stages] [--image FILE] [--serve]\n");
            return 2;
        }
    }
    if (!model || w < 1 || h < 1 || repeat < 1 || batch < 1 || batch > 256) return 2;
    eo.threads = threads;
    ms_engine *e;
    if (engine_init(&e, model, &eo) != MS_OK) {
        fprintf(stderr, "bench_engine: %s\n", ms_last_error());
        return 1;
    }
    ms_image img = {.w = w, .h = h};
    if (image) {
        if (image_read(&img, image) != MS_OK) {
            fprintf(stderr, "bench_engine: %s\n", ms_last_error());
            engine_free(e);
            return 1;
        }
    } else {
        if (!(img.rgb = malloc((size_t)w * h * 3))) {
            fprintf(stderr, "bench_engine: out of memory for a %dx%d image\n", w, h);
            engine_free(e);
            return 1;
        }
        uint32_t s = 12345;
        for (size_t i = 0; i < (size_t)w * h * 3; i++) img.rgb[i] = (uint8_t)((s = s * 1664525u + 1013904223u) >> 24);
    }
    /* --batch B: B copies of the image in one engine_run_batch */
    ms_result *rs = calloc((size_t)batch, sizeof *rs);
    const ms_image **imgs = malloc((size_t)batch * sizeof *imgs);
    if (!rs || !imgs) {
        fprintf(stderr, "bench_engine: out of memory for a batch of %d\n", batch);
        image_free(&img);
        engine_free(e);
        return 1;
    }
    for (int b = 0; b < batch; b++) imgs[b] = &img;
    ms_result res = {0};
    if (serving) {
        int rc = serve(e, &res, &img, &ro);
        result_free(&res);
        free(rs);
        free(imgs);
        image_free(&img);
        engine_free(e);
        return rc;
    }
    double t0 = now_ms();
    if (engine_run_batch(e, rs, imgs, batch, &ro) != MS_OK) {
        fprintf(stderr, "bench_engine: %s\n", ms_last_error());
        return 1;
    }
    double first = now_ms() - t0, best = 1e30, sum = 0;
    stage_clock sc = {0};
    if (stages) engine_set_trace(e, on_stage, &sc);
    for (int r = 0; r < repeat; r++) {
        t0 = now_ms();
        sc.last = t0;
        if (engine_run_batch(e, rs, imgs, batch, &ro) != MS_OK) {
            fprintf(stderr, "bench_engine: %s\n", ms_last_error());
            return 1;
        }
        double t = now_ms() - t0;
        sum += t;
        if (t < best) best = t;
    }
    const ms_result *r0 = &rs[0];
    printf("{\"first_ms\": %.3f, \"mean_ms\": %.3f, \"min_ms\": %.3f, \"images_per_s\": %.3f, "
           "\"batch\": %d, \"device\": \"%s\", \"tokens\": %d, \"attention\": \"%s\"",
           first, sum / repeat, best, 1e3 * repeat * batch / sum, batch, r0->device_name, r0->n,
           r0->attention == MS_ATTN_MITA ? "mita" : "full");
    if (stages) {
        printf(", \"stages_ms\": {");
        for (int i = 0; i < N_STAGES; i++)
            printf("%s\"%s\": %.3f", i ? ", " : "", stage_names[i], sc.ms[i] / repeat);
        printf("}");
    }
    printf("}\n");
    for (int b = 0; b < batch; b++) result_free(&rs[b]);
    free(rs);
    free(imgs);
    image_free(&img);
    engine_free(e);
    return 0;
}
