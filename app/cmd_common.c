/* Option parsing and engine opening shared by the commands. */
#define _GNU_SOURCE /* vasprintf */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "file_io.h"

const char cli_engine_help[] =
    "engine options:\n"
    "  --model FILE            model file (default: the shipped CamVid model,\n"
    "                          or $MITASEG_MODEL)\n"
    "  --attention mita|full   attention in every layer (default: the model's)\n"
    "  --landmarks GHxGW       MiTA landmark grid, e.g. 7x7 (default: the model's)\n"
    "  --topk K                MiTA routed keys per expert (default: the model's)\n"
    "  --short-side N|native   resize each image so its short side is N pixels\n"
    "                          (1..4096; the model's long-side cap still holds),\n"
    "                          or not at all (default: the model's input.short_side)\n"
    "  --device cpu|cuda|auto  where to run (default auto: the GPU when usable)\n"
    "  --threads N             CPU threads (default: all cores)\n"
    "  --fp32                  CUDA: FP32 GEMMs instead of tensor-core FP16/BF16\n"
    "  --max-memory SIZE       refuse, before decoding it, an image whose run would\n"
    "                          hold more than SIZE bytes of host memory (K, M, G,\n"
    "                          T suffixes; default: half of physical memory)\n"
    "  --tta flip|none         flip: average the logits of the image and its mirror\n"
    "                          (about twice the time; MiTA selections from the\n"
    "                          unflipped image). Default none\n";

double cli_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void cli_fputs_escaped(const char *s, FILE *f)
{
    const unsigned char *p = (const unsigned char *)s;
    for (; *p; p++) {
        unsigned c = *p;
        if (c == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) { /* C1 controls, as UTF-8 */
            fprintf(f, "\\xc2\\x%02x", p[1]);
            p++;
        } else if (c == '\n') {
            fputs("\\n", f);
        } else if (c == '\t') {
            fputs("\\t", f);
        } else if (c == '\r') {
            fputs("\\r", f);
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\x%02x", c);
        } else {
            fputc((int)c, f);
        }
    }
}

void cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    fputs("mitaseg: ", stderr);
    cli_fputs_escaped(n >= 0 ? msg : "(out of memory formatting a message)", stderr);
    fputc('\n', stderr);
    free(msg);
}

/* ---- interrupts ---- */

volatile sig_atomic_t cli_interrupted;
static volatile sig_atomic_t g_graceful;
/* The graceful stop's deadline: half a second, so the whole stop stays
 * under a second (timer_settime is async-signal-safe; alarm(1) the fallback). */
static timer_t g_deadline;
static bool g_have_deadline;

static void write_str(const char *s) /* async-signal-safe stderr output */
{
    ssize_t r = write(STDERR_FILENO, s, strlen(s));
    (void)r;
}

static void on_interrupt(int sig)
{
    if (sig != SIGALRM && g_graceful && !cli_interrupted) {
        cli_interrupted = sig;
        struct itimerspec half = {.it_value = {.tv_sec = 0, .tv_nsec = 500000000}};
        if (!g_have_deadline || timer_settime(g_deadline, 0, &half, NULL) != 0) alarm(1);
        return;
    }
    int first = cli_interrupted ? cli_interrupted : sig;
    fio_remove_live_temps();
    write_str(sig == SIGALRM ? "\nmitaseg: interrupted; the work in flight was dropped "
                               "(finished outputs are kept)\n"
                             : "\nmitaseg: interrupted\n");
    _exit(128 + first);
}

void cli_interrupt_init(void)
{
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_SIGNAL;
    sev.sigev_signo = SIGALRM;
    g_have_deadline = timer_create(CLOCK_MONOTONIC, &sev, &g_deadline) == 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sa.sa_flags = SA_RESTART; /* file writes are not cut short */
    sigemptyset(&sa.sa_mask);
    /* SIGHUP (the terminal closed) ends a run like SIGTERM, with 129 */
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGALRM};
    for (int i = 0; i < 4; i++) sigaddset(&sa.sa_mask, sigs[i]);
    for (int i = 0; i < 4; i++) sigaction(sigs[i], &sa, NULL);
}

void cli_interrupt_graceful(void) { g_graceful = 1; }

int cli_interrupt_status(void) { return 128 + cli_interrupted; }

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

/* "4G", "512M", "1.5G", "1000000": bytes (binary suffixes), at least 1 MiB. */
static bool parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v > 0)) return false;
    static const char suffixes[] = "KMGT";
    double mul = 1;
    if (*end) {
        const char *k = strchr(suffixes, *end >= 'a' ? *end - 32 : *end);
        if (!k || !*k) return false;
        for (const char *p = suffixes; p <= k; p++) mul *= 1024;
        end++;
        if (*end == 'B' || *end == 'b') end++;
    }
    if (*end || v * mul < 1048576.0 || v * mul > (double)SIZE_MAX / 2) return false;
    *out = (size_t)(v * mul);
    return true;
}

int cli_parse_engine_arg(cli_engine_args *a, int argc, char **argv, int *i)
{
    const char *opt = argv[*i];
    static const char *const with_value[] = {"--model",   "--attention", "--landmarks",
                                             "--topk",    "--short-side", "--device",
                                             "--threads", "--max-memory", "--tta",
                                             NULL};
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
    } else if (!strcmp(opt, "--short-side")) {
        if (!strcmp(v, "native")) {
            a->run.short_side = -1;
        } else if (!parse_int(v, 1, 4096, &a->run.short_side)) {
            cli_error("--short-side: expected 1..4096 or native, got '%s'", v);
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
    } else if (!strcmp(opt, "--max-memory")) {
        if (!parse_size(v, &a->eng.max_memory)) {
            cli_error("--max-memory: expected a size such as 2G or 512M, got '%s'", v);
            return -1;
        }
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
    return cli_asset_path(buf, sizeof buf, "models/camvid-mita.safetensors");
}

const char *cli_asset_path(char *buf, size_t n, const char *name)
{
    /* Next to the executable's tree first (installed or build dir), then the
     * source tree it was built from. */
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(buf, n, "%.*s/../assets/%s", (int)(n > 128 ? n - 128 : 0), exe, name);
            if (access(buf, R_OK) == 0) return buf;
        }
    }
    snprintf(buf, n, "%s/assets/%s", MS_SOURCE_DIR, name);
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

typedef struct {
    ms_engine *e;
    const ms_run_options *opt;
    int tile;
} image_budget;

/* image_size_check: the run this image will get, within the engine's budget. */
static ms_status check_image_budget(void *user, int w, int h)
{
    const image_budget *b = user;
    size_t px = (size_t)w * h;
    size_t extra = 4 * px; /* the decoded image (RGBA before alpha is dropped) */
    if (b->tile > 0) {
        /* --tile: tile-size runs plus the full-size sum of their logits. */
        extra += (size_t)engine_config(b->e)->n_classes * px * sizeof(float);
        return engine_check_memory(b->e, 1, h < b->tile ? h : b->tile, w < b->tile ? w : b->tile,
                                   b->opt, extra);
    }
    return engine_check_memory(b->e, 1, h, w, b->opt, extra);
}

ms_status cli_read_image(ms_image *img, const char *path, ms_engine *e, const ms_run_options *opt,
                         int tile)
{
    image_budget b = {e, opt, tile};
    return image_read_checked(img, path, check_image_budget, &b);
}
