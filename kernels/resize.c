/* Resizes on the CPU. Bilinear is done separably: for a run of output rows of
 * one channel and a tile of output columns, the column taps are computed once,
 * each input row the run needs is blended horizontally once into a small row
 * cache, and each output row is a vectorised weighted sum of two cached rows
 * (resize_simd.c). The taps are bilinear_taps, shared with the CUDA kernel. */
#include "resize.h"

#include "resize_simd.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* Output columns per tile: the taps and the two cached rows of a tile live on
 * the stack (6 * 4 * RS_TILE bytes) and stay in L1/L2. */
#define RS_TILE 512

/* Output rows [r0, r1) of channel plane `in` (h, w) into `out` (rows of wo,
 * row r at out + r * wo), columns [x_begin, x_begin + tw). */
static void resize_bilinear_run(float *out, const float *in /* (h, w) */, int h, int w, int wo,
                                int y_begin, int r0, int r1, int x_begin, int tw, float rh,
                                float rw)
{
    int x0[RS_TILE], x1[RS_TILE];
    float wx0[RS_TILE], wx1[RS_TILE], cache[2][RS_TILE];
    int cached[2] = {-1, -1}; /* input row held by each cache slot */
    for (int x = 0; x < tw; x++)
        bilinear_taps(&x0[x], &x1[x], &wx0[x], &wx1[x], x_begin + x, rw, w);
    for (int r = r0; r < r1; r++) {
        int y0, y1;
        float wy0, wy1;
        bilinear_taps(&y0, &y1, &wy0, &wy1, y_begin + r, rh, h);
        /* the slot of y0, filled unless cached, in the slot y1 does not hold */
        int s0 = cached[0] == y0 ? 0 : (cached[1] == y0 ? 1 : -1);
        if (s0 < 0) {
            s0 = cached[0] == y1 ? 1 : 0;
            rs_hpass(cache[s0], in + (size_t)y0 * w, x0, x1, wx0, wx1, tw);
            cached[s0] = y0;
        }
        int s1 = cached[0] == y1 ? 0 : (cached[1] == y1 ? 1 : -1);
        if (s1 < 0) {
            s1 = 1 - s0;
            rs_hpass(cache[s1], in + (size_t)y1 * w, x0, x1, wx0, wx1, tw);
            cached[s1] = y1;
        }
        rs_vblend(out + (size_t)r * wo + x_begin, cache[s0], cache[s1], wy0, wy1, tw);
    }
}

void resize_bilinear_cpu(float *out, const float *in, int c, int h, int w, int ho, int wo,
                         int y_begin, int y_end, double scale_h, double scale_w)
{
    float rh = resize_ratio(h, ho, scale_h), rw = resize_ratio(w, wo, scale_w);
    const int rows = y_end - y_begin;
    /* Work items: (channel, run of rows); about four per thread so that few
     * channels still spread, runs long enough to reuse the cached rows. */
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    int runs = (4 * threads + c - 1) / c;
    if (runs > rows) runs = rows;
    int run_rows = (rows + runs - 1) / runs;
    runs = (rows + run_rows - 1) / run_rows;
    long items = (long)c * runs;
#pragma omp parallel for schedule(static) if ((size_t)c * rows * wo >= MS_PAR_MIN)
    for (long it = 0; it < items; it++) {
        int ch = (int)(it / runs), r0 = (int)(it % runs) * run_rows;
        int r1 = r0 + run_rows < rows ? r0 + run_rows : rows;
        const float *plane = in + (size_t)ch * h * w;
        float *o = out + (size_t)ch * rows * wo;
        for (int xb = 0; xb < wo; xb += RS_TILE)
            resize_bilinear_run(o, plane, h, w, wo, y_begin, r0, r1, xb,
                                wo - xb < RS_TILE ? wo - xb : RS_TILE, rh, rw);
    }
}

void resize_bicubic_cpu(float *out, const float *in, int c, int h, int w, int ho, int wo)
{
    float rh = resize_ratio(h, ho, 0.0), rw = resize_ratio(w, wo, 0.0);
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)c * ho * wo >= MS_PAR_MIN)
    for (int ch = 0; ch < c; ch++) {
        for (int y = 0; y < ho; y++) {
            int iy[4], ix[4];
            float wy[4], wx[4];
            bicubic_taps(iy, wy, y, rh, h);
            const float *plane = in + (size_t)ch * h * w;
            float *o = out + ((size_t)ch * ho + y) * wo;
            for (int x = 0; x < wo; x++) {
                bicubic_taps(ix, wx, x, rw, w);
                float acc = 0.0f;
                for (int i = 0; i < 4; i++) {
                    const float *r = plane + (size_t)iy[i] * w;
                    acc += wy[i] * (wx[0] * r[ix[0]] + wx[1] * r[ix[1]] + wx[2] * r[ix[2]] +
                                    wx[3] * r[ix[3]]);
                }
                o[x] = acc;
            }
        }
    }
}
