/* Option parsing and engine opening shared by the commands. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

const char cli_engine_help[] =
    "engine options:\n"
    "  --model FILE            model file (default: the shipped CamVid model,\n"
    "                          or $MITASEG_MODEL)\n"
    "  --attention mita|full   attention in every layer (default: the model's)\n"
    "  --landmarks GHxGW       MiTA landmark grid, e.g. 7x7 (default: the model's)\n"
    "  --topk K                MiTA routed keys per expert (default: the model's)\n"
    "  --device cpu|cuda|auto  where to run (default auto: the GPU when usable)\n"
    "  --threads N             CPU threads (default: all cores)\n"
    "  --fp32                  CUDA: FP32 GEMMs instead of tensor-core FP16/BF16\n"
    "  --tta flip|none         flip: average the logits of the image and its mirror\n"
    "                          (about twice the time; MiTA selections from the\n"
    "                          unflipped image). Default none\n";

double cli_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("mitaseg: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void cli_engine_args_init(cli_engine_args *a)
{
    memset(a, 0, sizeof *a);
    a->eng.device = MS_DEV_AUTO;
    a->run.attention = -1;
}

static bool parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

int cli_parse_engine_arg(cli_engine_args *a, int argc, char **argv, int *i)
{
    const char *opt = argv[*i];
    static const char *const with_value[] = {"--model", "--attention", "--landmarks",
                                             "--topk", "--device", "--threads", "--tta", NULL};
    if (!strcmp(opt, "--fp32")) {
        a->eng.fp32 = true;
        return 1;
    }
    bool known = false;
    for (int k = 0; with_value[k]; k++) known |= !strcmp(opt, with_value[k]);
    if (!known) return 0;
    if (*i + 1 >= argc) {
        cli_error("%s needs a value", opt);
        return -1;
    }
    const char *v = argv[++*i];
    if (!strcmp(opt, "--model")) {
        a->model = v;
    } else if (!strcmp(opt, "--attention")) {
        if (!strcmp(v, "mita")) a->run.attention = MS_ATTN_MITA;
        else if (!strcmp(v, "full")) a->run.attention = MS_ATTN_FULL;
        else { cli_error("--attention: expected mita or full, got '%s'", v); return -1; }
    } else if (!strcmp(opt, "--landmarks")) {
        int gh, gw, n = 0;
        if (sscanf(v, "%dx%d%n", &gh, &gw, &n) != 2 || v[n] || gh < 1 || gw < 1 ||
            gh > 1024 || gw > 1024) {
            cli_error("--landmarks: expected GHxGW (e.g. 7x7), got '%s'", v);
            return -1;
        }
        a->run.gh = gh;
        a->run.gw = gw;
    } else if (!strcmp(opt, "--topk")) {
        if (!parse_int(v, 1, INT_MAX, &a->run.topk)) {
            cli_error("--topk: expected a positive integer, got '%s'", v);
            return -1;
        }
    } else if (!strcmp(opt, "--device")) {
        if (!strcmp(v, "cpu")) a->eng.device = MS_DEV_CPU;
        else if (!strcmp(v, "cuda")) a->eng.device = MS_DEV_CUDA;
        else if (!strcmp(v, "auto")) a->eng.device = MS_DEV_AUTO;
        else { cli_error("--device: expected cpu, cuda or auto, got '%s'", v); return -1; }
    } else if (!strcmp(opt, "--tta")) {
        if (!strcmp(v, "flip")) a->run.tta_flip = true;
        else if (!strcmp(v, "none")) a->run.tta_flip = false;
        else { cli_error("--tta: expected flip or none, got '%s'", v); return -1; }
    } else if (!strcmp(opt, "--threads")) {
        if (!parse_int(v, 1, 1024, &a->eng.threads)) {
            cli_error("--threads: expected 1..1024, got '%s'", v);
            return -1;
        }
    }
    return 1;
}

const char *cli_model_path(const cli_engine_args *a)
{
    static char buf[PATH_MAX];
    if (a->model) return a->model;
    const char *env = getenv("MITASEG_MODEL");
    if (env && *env) return env;
    /* Next to the executable's tree first (installed or build dir), then the
     * source tree it was built from. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(buf, sizeof buf, "%.*s/../assets/models/camvid-mita.safetensors",
                     (int)(sizeof buf - 64), exe);
            if (access(buf, R_OK) == 0) return buf;
        }
    }
    snprintf(buf, sizeof buf, "%s/assets/models/camvid-mita.safetensors", MS_SOURCE_DIR);
    return buf;
}

int cli_open_engine(ms_engine **e, const cli_engine_args *a, bool quiet)
{
    const char *path = cli_model_path(a);
    if (engine_init(e, path, &a->eng) != MS_OK) {
        cli_error("%s", ms_last_error());
        return 1;
    }
    const char *why = engine_fallback_reason(*e);
    if (why && !quiet) fprintf(stderr, "mitaseg: running on the CPU: %s\n", why);
    return 0;
}
