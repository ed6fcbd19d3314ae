/* Memory-bound ops on the CPU. */
#include "elementwise.h"

#include <string.h>

#include "elementwise_simd.h"
#include "vmath.h"

/* Elements per work item of the flat ops: large enough to amortise the call,
 * small enough to spread over the threads. */
#define EW_CHUNK 16384

void add_cpu(float *out, const float *a, const float *b, size_t n)
{
    size_t chunks = (n + EW_CHUNK - 1) / EW_CHUNK;
#pragma omp parallel for schedule(static) if (n >= MS_PAR_MIN)
    for (size_t k = 0; k < chunks; k++) {
        size_t i = k * EW_CHUNK;
        ew_add(out + i, a + i, b + i, n - i < EW_CHUNK ? n - i : EW_CHUNK);
    }
}

/* Tiles so that both the reads and the writes stay in cache. */
#define TRANSPOSE_TILE 32

void transpose_cpu(float *out, const float *in, int rows, int cols)
{
    int tiles_r = (rows + TRANSPOSE_TILE - 1) / TRANSPOSE_TILE;
    int tiles_c = (cols + TRANSPOSE_TILE - 1) / TRANSPOSE_TILE;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)rows * cols >= MS_PAR_MIN)
    for (int tr = 0; tr < tiles_r; tr++) {
        for (int tc = 0; tc < tiles_c; tc++) {
            int r1 = (tr + 1) * TRANSPOSE_TILE < rows ? (tr + 1) * TRANSPOSE_TILE : rows;
            int c1 = (tc + 1) * TRANSPOSE_TILE < cols ? (tc + 1) * TRANSPOSE_TILE : cols;
            for (int r = tr * TRANSPOSE_TILE; r < r1; r++)
                for (int c = tc * TRANSPOSE_TILE; c < c1; c++)
                    out[(size_t)c * rows + r] = in[(size_t)r * cols + c];
        }
    }
}

void softmax_rows_cpu(float *x, int rows, int cols)
{
#pragma omp parallel for schedule(static) if ((size_t)rows * cols >= MS_PAR_MIN)
    for (int i = 0; i < rows; i++) {
        float *row = x + (size_t)i * cols;
        float mx = row[argmax_first(row, cols, 1)];
        float sum = vm_exp_sum(row, cols, 1.0f, mx); /* exp(x - max) */
        ew_scale(row, (size_t)cols, 1.0f / sum);
    }
}

void crop_cpu(float *out, const float *in, int c, int h, int w, int ho, int wo)
{
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)c * ho * wo >= MS_PAR_MIN)
    for (int ch = 0; ch < c; ch++)
        for (int y = 0; y < ho; y++)
            memcpy(out + ((size_t)ch * ho + y) * wo, in + ((size_t)ch * h + y) * w,
                   (size_t)wo * sizeof(float));
}

void argmax_cpu(uint8_t *out, const float *in, int c, int h, int w)
{
    /* runs of pixels, the classes' planes read contiguously within each */
    long plane = (long)h * w, runs = (plane + EW_ARGMAX_PIXELS - 1) / EW_ARGMAX_PIXELS;
#pragma omp parallel for schedule(static) if (plane * c >= MS_PAR_MIN)
    for (long r = 0; r < runs; r++) {
        long i = r * EW_ARGMAX_PIXELS;
        ew_argmax_planes(out + i, in + i, c, plane,
                         (int)(plane - i < EW_ARGMAX_PIXELS ? plane - i : EW_ARGMAX_PIXELS));
    }
}

void normalize_pad_cpu(float *out, const float *in, int h, int w, int hp, int wp,
                       const float mean[3], const float stdv[3])
{
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)3 * hp * wp >= MS_PAR_MIN)
    for (int ch = 0; ch < 3; ch++) {
        for (int y = 0; y < hp; y++) {
            float *o = out + ((size_t)ch * hp + y) * wp;
            const float *src = in + ((size_t)ch * h + y) * w;
            int x = 0;
            if (y < h)
                for (; x < w; x++) o[x] = normalize_value(src[x], mean[ch], stdv[ch]);
            for (; x < wp; x++) o[x] = 0.0f;
        }
    }
}

void window_add_cpu(float *acc, const float *win, int c, int h, int w, int wh, int ww, int y0,
                    int x0, bool first)
{
    if (first) memset(acc, 0, (size_t)c * h * w * sizeof(float));
    for (int ch = 0; ch < c; ch++)
        for (int y = 0; y < wh; y++) {
            float *dst = acc + ((size_t)ch * h + y0 + y) * w + x0;
            const float *src = win + ((size_t)ch * wh + y) * ww;
            for (int x = 0; x < ww; x++) dst[x] += src[x];
        }
}

void window_average_cpu(float *acc, int c, int h, int w, int wh, int ww, int sh, int sw)
{
    for (int y = 0; y < h; y++) {
        int cy = slide_count(y, h, wh, sh);
        for (int x = 0; x < w; x++) {
            float cnt = (float)(cy * slide_count(x, w, ww, sw));
            for (int ch = 0; ch < c; ch++) acc[((size_t)ch * h + y) * w + x] /= cnt;
        }
    }
}
