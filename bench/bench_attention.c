/* Full attention on the CPU (op_attention_full) for bench/bench_attention.py:
 * one layer's attention, qkv (N, 3C) in, (N, C) out, at the N the driver asks.
 *
 *   bench_attention --c C --heads H --threads T
 *
 * Worker protocol (stdin lines, one JSON line answered for each):
 *   run N        one timed call at N tokens (the first call at a new N
 *                allocates and fills qkv with a fixed pseudo-random pattern
 *                and runs once untimed) -> {"ms": T, "cpu_ms": CPU time of
 *                all threads}
 *   dump N PATH  writes qkv (N, 3C) then out (N, C), raw little-endian
 *                float32, of the last call at N -> {"ok": true}
 * It prints {"ready": ...} first and exits at EOF. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "kernels/cpu_path.h"
#include "kernels/ops.h"

static double clock_ms(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Uniform in [-a, a]; a fixed sequence so every build times the same input. */
static void fill(float *x, size_t n, float a)
{
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = a * (2.0f * (float)((s >> 40) * (1.0 / (1ull << 24))) - 1.0f);
    }
}

int main(int argc, char **argv)
{
    int c = 192, heads = 3, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--c")) c = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) heads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_attention [--c C] [--heads H] [--threads T]\n");
            return 2;
        }
    }
    if (c <= 0 || heads <= 0 || c % heads || threads <= 0) {
        fprintf(stderr, "bench_attention: bad --c/--heads/--threads\n");
        return 2;
    }
    ms_backend be;
    memset(&be, 0, sizeof be);
    be.device = MS_DEVICE_CPU;
    backend_set_threads(&be, threads);
    printf("{\"ready\": true, \"cpu_path\": \"%s\", \"openblas\": \"%s\", \"core\": \"%s\"}\n",
           cpu_path_name(cpu_path_get()), openblas_get_config(), openblas_get_corename());
    fflush(stdout);

    float *qkv = NULL, *out = NULL;
    int cur_n = 0;
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        int n = 0, pos = 0;
        bool dump = !strncmp(line, "dump ", 5);
        if ((!strncmp(line, "run ", 4) || dump) &&
            sscanf(line + (dump ? 5 : 4), "%d %n", &n, &pos) == 1 && n > 0 && n <= (1 << 20)) {
            if (n != cur_n) {
                free(qkv);
                free(out);
                qkv = malloc((size_t)n * 3 * c * sizeof(float));
                out = malloc((size_t)n * c * sizeof(float));
                if (!qkv || !out) {
                    fprintf(stderr, "bench_attention: out of memory at N=%d\n", n);
                    return 1;
                }
                fill(qkv, (size_t)n * 3 * c, 2.0f);
                if (op_attention_full(&be, out, qkv, n, c, heads) != MS_OK) break;
                cur_n = n;
            }
            if (dump) {
                const char *path = line + 5 + pos;
                FILE *f = fopen(path, "wb");
                bool ok = f && fwrite(qkv, sizeof(float), (size_t)n * 3 * c, f) ==
                                   (size_t)n * 3 * c &&
                          fwrite(out, sizeof(float), (size_t)n * c, f) == (size_t)n * c;
                if (f && fclose(f)) ok = false;
                if (!ok) {
                    fprintf(stderr, "bench_attention: cannot write %s\n", path);
                    return 1;
                }
                printf("{\"ok\": true}\n");
            } else {
                double t0 = clock_ms(CLOCK_MONOTONIC), c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
                if (op_attention_full(&be, out, qkv, n, c, heads) != MS_OK) break;
                printf("{\"ms\": %.3f, \"cpu_ms\": %.3f}\n", clock_ms(CLOCK_MONOTONIC) - t0,
                       clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0);
            }
        } else {
            fprintf(stderr, "bench_attention: unknown command: '%s'\n", line);
            return 2;
        }
        fflush(stdout);
    }
    if (!feof(stdin)) {
        fprintf(stderr, "bench_attention: %s\n",
                ferror(stdin) ? "stdin read error" : ms_last_error());
        return 1;
    }
    free(qkv);
    free(out);
    return 0;
}
