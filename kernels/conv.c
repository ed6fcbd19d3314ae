/* Convolutions on the CPU. Every path works a band of output rows at a time
 * per thread (its own slice of the scratch, no barrier between bands) and
 * ends the band with one pass that adds the bias, applies the activation and
 * writes the output while the GEMM's result is still in cache (BatchNorm is
 * folded into weight and bias at load, app/engine.c).
 * - 1x1 stride 1 unpadded: a GEMM on the input itself, in column chunks.
 * - 3x3 stride-1 pad-1 convs of 32+ channels on maps of 12 4x4 tiles or
 *   more (the ConvModules of neck and head): Winograd F(4x4, 3x3), below.
 * - other stride-1 convs (small maps, narrow convs): implicit
 *   GEMM. The band's input rows are copied once, zero-padded, with row
 *   length wp = w + 2 pad; kernel tap (ky, kx) is then a GEMM whose B is that
 *   copy shifted by ky*wp + kx, accumulated into a band result of row length
 *   wp, whose last kw-1 columns are junk that the output pass drops. No
 *   column matrix (kh*kw copies of the input) is built.
 * - anything else (stride-2 stem convs, patch embedding): im2col of the band,
 *   whose interior runs are copied whole, then one GEMM.
 * The transposed conv is a GEMM per band and a scatter that is its output
 * pass. */
#include "conv.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "conv_simd.h"
#include "gemm.h"

/* Output columns per band's GEMM: enough for OpenBLAS's kernels to run at
 * speed, few enough for the band result (co x cols) to stay in cache for
 * the output pass. 512, 1024, 2048 and 4096 timed alike, within the noise of
 * a loaded 2-core machine, on the neck and head shapes (issue 13); -D to
 * retune. */
#ifndef CONV_BAND_COLS
#define CONV_BAND_COLS 1024
#endif

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Threads the bands are spread over: 1 inside a parallel region. */
static int conv_threads(void)
{
#ifdef _OPENMP
    if (!omp_in_parallel()) return omp_get_max_threads();
#endif
    return 1;
}

static int conv_thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* A band split: bands of at most rows rows (band i is rows [i*n/bands,
 * (i+1)*n/bands) of n, so they differ by one row at most), threads, and the
 * scratch floats per thread (slice = per_row * rows + fixed). */
typedef struct {
    int rows, bands, threads;
    size_t slice;
} band_plan;

static int round_up(int a, int m) { return (a + m - 1) / m * m; }

/* Bands are cut for CONV_PLAN_THREADS threads whatever the thread count
 * (as attention_full.c cuts its query blocks), so that a conv's GEMM calls,
 * and so its bits, never follow --threads: OpenBLAS rounds a row otherwise
 * in a call of other columns (the stem's bands changed the last bits at 2
 * threads on Zen 3). Each slice stays within the plan's share of
 * MS_CONV_SCRATCH_FLOATS, so the scratch is at most a slice per thread. */
#define CONV_PLAN_THREADS 2
#define CONV_SLICE_FLOATS (MS_CONV_SCRATCH_FLOATS / CONV_PLAN_THREADS)
/* avail for the sizing functions: a slice (at least one row) per thread */
#define CONV_UNLIMITED ((size_t)-1 / 4)

/* Splits n_rows output rows of row_cols columns into bands of about
 * CONV_BAND_COLS columns, a multiple of CONV_PLAN_THREADS of them (so 2
 * threads' static schedule is balanced), each band's slice within
 * CONV_SLICE_FLOATS and avail; then as many of threads as have a slice in
 * avail (0 if not even one row fits). The bands depend on avail only where
 * it holds less than one slice of the plan: below the callers' sizes. */
static band_plan band_plan_make(int n_rows, int row_cols, size_t per_row, size_t fixed,
                                int threads, size_t avail)
{
    band_plan p;
    int rows = CONV_BAND_COLS / (row_cols > 0 ? row_cols : 1);
    rows = rows < 1 ? 1 : (rows > n_rows ? n_rows : rows);
    int pt = CONV_PLAN_THREADS < n_rows ? CONV_PLAN_THREADS : n_rows;
    int bands = round_up((n_rows + rows - 1) / rows, pt);
    rows = (n_rows + bands - 1) / bands;
    size_t cap = CONV_SLICE_FLOATS < avail ? CONV_SLICE_FLOATS : avail;
    while (rows > 1 && per_row * rows + fixed > cap) rows--;
    bands = (n_rows + rows - 1) / rows;
    if (round_up(bands, pt) <= n_rows) bands = round_up(bands, pt);
    p.rows = (n_rows + bands - 1) / bands;
    p.bands = bands;
    p.slice = per_row * p.rows + fixed;
    if (threads > bands) threads = bands;
    while (threads > 0 && (size_t)threads * p.slice > avail) threads--;
    p.threads = threads;
    return p;
}

/* Band bi of a plan over n rows: first row and row count. */
static int band_start(const band_plan *p, int n, int bi)
{
    return (int)((long long)bi * n / p->bands);
}

static int band_rows(const band_plan *p, int n, int bi)
{
    return band_start(p, n, bi + 1) - band_start(p, n, bi);
}

/* One row per band on one thread: for a workspace under one row, which the
 * callers' contract rules out (the code before bands per thread did this). */
static band_plan band_plan_one_row(int n_rows, size_t per_row)
{
    band_plan p = {1, n_rows, 1, per_row};
    return p;
}

static bool conv2d_is_pointwise(int kh, int kw, int stride, int pad)
{
    return kh == 1 && kw == 1 && stride == 1 && pad == 0;
}

/* ---------- implicit GEMM (stride 1) ---------- */

/* Per-thread slice: the padded input band (ci planes of rows+kh-1 rows of wp,
 * plus kw floats the last tap's view reads past its end) and the band result
 * (co, rows*wp). Per row and fixed part, each rounded up to 16 floats. */
static void implicit_costs(size_t *per_row, size_t *fixed, int ci, int co, int kh, int kw,
                           int wp)
{
    *per_row = round16((size_t)(ci + co) * wp);
    *fixed = round16((size_t)ci * (kh - 1) * wp + kw) + 32;
}

static size_t implicit_weight_floats(int ci, int co, int kh, int kw)
{
    return round16((size_t)co * ci * kh * kw);
}

static band_plan implicit_plan(int ci, int h, int wd, int co, int kh, int kw, int pad,
                               int threads, size_t avail)
{
    int wp = wd + 2 * pad, ho = conv_out_size(h, kh, 1, pad);
    size_t per_row, fixed;
    implicit_costs(&per_row, &fixed, ci, co, kh, kw, wp);
    return band_plan_make(ho, wp, per_row, fixed, threads, avail);
}

/* Input rows for output rows [y0, y0+rows) into pad (ci, rows+kh-1, wp),
 * zeros outside the image, then kw zeros after the last plane. */
static void implicit_pad_band(float *pad_in /* (ci, rows+kh-1, wp) + kw */,
                              const float *in /* (ci, h, wd) */, int ci, int h, int wd, int kh,
                              int kw, int pad, int y0, int rows)
{
    int wp = wd + 2 * pad, nin = rows + kh - 1;
    for (int c = 0; c < ci; c++) {
        const float *plane = in + (size_t)c * h * wd;
        for (int r = 0; r < nin; r++) {
            float *d = pad_in + ((size_t)c * nin + r) * wp;
            int iy = y0 - pad + r;
            if (iy < 0 || iy >= h) {
                memset(d, 0, (size_t)wp * sizeof(float));
                continue;
            }
            memset(d, 0, (size_t)pad * sizeof(float));
            memcpy(d + pad, plane + (size_t)iy * wd, (size_t)wd * sizeof(float));
            memset(d + pad + wd, 0, (size_t)pad * sizeof(float));
        }
    }
    memset(pad_in + (size_t)ci * nin * wp, 0, (size_t)kw * sizeof(float));
}

static void conv2d_implicit(float *out /* (co, ho, wo) */, const float *in /* (ci, h, wd) */,
                            const float *w /* (co, ci, kh, kw) */, const float *b, int ci, int h,
                            int wd, int co, int kh, int kw, int pad, ms_act act,
                            float *ws /* (ws_floats) */, band_plan p)
{
    const int taps = kh * kw, wp = wd + 2 * pad;
    const int ho = conv_out_size(h, kh, 1, pad), wo = conv_out_size(wd, kw, 1, pad);
    const size_t plane = (size_t)ho * wo;
    float *wt = ws; /* (taps, co, ci): tap t's weights as a GEMM operand */
    float *slices = ws + implicit_weight_floats(ci, co, kh, kw);
#pragma omp parallel num_threads(p.threads) if (p.threads > 1)
    {
#pragma omp for schedule(static)
        for (int o = 0; o < co; o++) /* w[o] is read from L1, each write a run */
            for (int t = 0; t < taps; t++) {
                float *d = wt + ((size_t)t * co + o) * ci;
                const float *src = w + (size_t)o * ci * taps + t;
                for (int c = 0; c < ci; c++) d[c] = src[(size_t)c * taps];
            }
        float *pad_in = slices + (size_t)conv_thread_id() * p.slice;
#pragma omp for schedule(static)
        for (int bi = 0; bi < p.bands; bi++) {
            int y0 = band_start(&p, ho, bi), rows = band_rows(&p, ho, bi);
            int nin = rows + kh - 1, n = rows * wp;
            float *acc = pad_in + round16((size_t)ci * nin * wp + kw); /* (co, rows*wp) */
            implicit_pad_band(pad_in, in, ci, h, wd, kh, kw, pad, y0, rows);
            for (int t = 0; t < taps; t++) {
                const float *bt = pad_in + (size_t)(t / kw) * wp + t % kw;
                /* acc (co, n) += wt[t] (co, ci) @ band shifted (ci, n; row stride nin*wp) */
                gemm_cpu(acc, wt + (size_t)t * co * ci, bt, co, n, ci, false, false, ci, nin * wp,
                         n, 1.0f, t ? 1.0f : 0.0f);
            }
            for (int o = 0; o < co; o++)
                for (int r = 0; r < rows; r++)
                    conv_bias_act_row(out + o * plane + (size_t)(y0 + r) * wo,
                                      acc + (size_t)o * n + (size_t)r * wp, wo, b ? b[o] : 0.0f,
                                      act);
        }
    }
}

/* ---------- Winograd F(4x4, 3x3) (3x3, stride 1, pad 1) ----------
 *
 * Lavin & Gray's minimal filtering: output tile (4x4) t = A^T [(G g G^T) .*
 * (B^T d B)] A over a 6x6 input tile d that starts one row and column above
 * it (the pad). Per band of tile rows, the input tiles are transformed into
 * V (36, ci, tiles), the 36 element-wise products become 36 GEMMs M_k (co,
 * tiles) = U_k (co, ci) @ V_k (ci, tiles), and the output pass applies A^T
 * m A, the bias and the activation (transforms: conv_simd.c). 36 GEMMs of
 * ci*co*tiles multiply-adds replace the implicit GEMM's 9 of ci*co*16*tiles:
 * 4x fewer (F(2x2, 3x3), used before, saved 2.25x), for more rounding in the
 * transforms' sums (the coefficients up to 8 of A^T and 1/24 of G): within
 * the float tolerances of tests/test_ops_conv.c and the goldens; measured on
 * CamVid in the README. Convs under 32 channels or 12 tiles keep the
 * implicit GEMM: measured (2 threads) Winograd was 1.8-2.5x faster from 12
 * tiles up (11x15 to 23x30 maps, 128-704 channels: the PPM bottleneck and
 * the coarse FPN levels) and as fast or slower at 4 tiles. */
#ifndef WINO_MIN_CH
#define WINO_MIN_CH 32
#endif
#ifndef WINO_MIN_TILES
#define WINO_MIN_TILES 12
#endif
/* floats between consecutive V_k (and M_k): at power-of-two sizes the 36
 * streams the transforms write and read would otherwise share cache sets */
#define WINO_SKEW 16
/* V and M of a band in about this many floats (at least one tile row): the
 * larger the band, the more tiles each GEMM's packed U_k serves (bands of
 * one tile row, 30 tiles at a 480-wide level, ran UPerHead's 512-channel
 * fusion conv about 20 % slower); 4 MB keeps the scratch near what F(2x2,
 * 3x3) used. */
#ifndef WINO_BAND_FLOATS
#define WINO_BAND_FLOATS ((size_t)1 << 20)
#endif
/* At most this many floats of transformed weights at a time: wider convs
 * take their input channels in chunks whose GEMMs accumulate into M (the
 * 512-channel fusion conv of UPerHead would otherwise hold 9.4 MB of U). */
#ifndef WINO_U_FLOATS
#define WINO_U_FLOATS ((size_t)1 << 20)
#endif

static int wino_tiles(int n) { return (n + 3) / 4; }

static bool conv2d_is_wino(int ci, int h, int wd, int co, int kh, int kw, int stride, int pad)
{
    return kh == 3 && kw == 3 && stride == 1 && pad == 1 && ci >= WINO_MIN_CH &&
           co >= WINO_MIN_CH && (long long)wino_tiles(h) * wino_tiles(wd) >= WINO_MIN_TILES;
}

/* The whole team works one band at a time (transforms split by channel, the
 * 36 GEMMs by k), so V and M exist once. Scratch: the transformed weights of
 * one chunk of kc input channels (36 co kc), a zero row, per thread the
 * vertical transform of six rows (6 wp, wp = 4 tw + 2) and four output rows
 * (16 tw), then V and M of the band (36 (kc + co) nt, plus skews). Chunks
 * run one after another over all bands, each adding to the output. */
typedef struct {
    int rows, bands, threads; /* tile rows per band (the last may have fewer) */
    int kc, chunks;           /* input channels per chunk (the last may have fewer) */
} wino_plan;

static size_t wino_thread_floats(int tw)
{
    return round16((size_t)6 * (4 * tw + 2)) + round16((size_t)16 * tw);
}

static size_t wino_band_floats(int kc, int co, int tw, int rows)
{
    return round16((size_t)36 * (kc + co) * tw * rows + 2 * 36 * WINO_SKEW);
}

static size_t wino_fixed_floats(int kc, int co, int wd, int threads)
{
    return round16((size_t)36 * co * kc) + round16((size_t)wd) +
           (size_t)threads * wino_thread_floats(wino_tiles(wd));
}

/* rows = 0: ws_floats holds not even one tile row */
static wino_plan wino_plan_make(int ci, int h, int wd, int co, int threads, size_t ws_floats)
{
    wino_plan p = {0, 0, threads, ci, 1};
    size_t u = (size_t)36 * co * ci;
    if (u > WINO_U_FLOATS) {
        p.chunks = (int)((u + WINO_U_FLOATS - 1) / WINO_U_FLOATS);
        if (p.chunks > ci) p.chunks = ci;
        p.kc = (ci + p.chunks - 1) / p.chunks;
        p.chunks = (ci + p.kc - 1) / p.kc;
    }
    int th = wino_tiles(h), tw = wino_tiles(wd);
    size_t fixed = wino_fixed_floats(p.kc, co, wd, threads);
    size_t one = wino_band_floats(p.kc, co, tw, 1);
    size_t row = (size_t)36 * (p.kc + co) * tw;
    if (ws_floats < fixed + one) return p;
    size_t fit = (ws_floats - fixed - one) / row + 1;
    size_t want = WINO_BAND_FLOATS / row > 1 ? WINO_BAND_FLOATS / row : 1;
    int rows = (int)(fit < want ? fit : want);
    if (rows > th) rows = th;
    p.bands = (th + rows - 1) / rows;
    p.rows = (th + p.bands - 1) / p.bands; /* as even as the band count allows */
    return p;
}

/* V[:, c, :] for one input channel's tile rows [ty0, ty0+trows) (k stride
 * kst): the six input rows of each tile row read in place (zero outside the
 * image), their vertical transform into t. */
static void wino_input_channel(float *v /* (36, kst): channel c's (trows, tw) */, size_t kst,
                               float *t /* (6, wp) */, const float *plane /* (h, wd) */,
                               const float *zero /* (wd) */, int h, int wd, int ty0, int trows)
{
    const int tw = wino_tiles(wd);
    for (int r = 0; r < trows; r++) {
        const float *d[6];
        for (int i = 0; i < 6; i++) {
            int iy = 4 * (ty0 + r) - 1 + i;
            d[i] = iy >= 0 && iy < h ? plane + (size_t)iy * wd : zero;
        }
        wino43_input_row(v + (size_t)r * tw, kst, d, t, wd, tw);
    }
}

/* Output rows of one output channel's tile rows [ty0, ty0+trows) from M; a
 * last tile reaching past the image drops its extra rows and columns. The
 * chunks of input channels add up after the (linear) output transform:
 * the first chunk writes, later ones add, the last one adds the bias and
 * applies the activation. */
static void wino_output_channel(float *out /* (h, wd) */, const float *m /* (36, kst) */,
                                size_t kst, float *tmp /* (4, 4 tw) */, float bias, int h,
                                int wd, ms_act act, int ty0, int trows, bool first, bool last)
{
    const int tw = wino_tiles(wd);
    for (int r = 0; r < trows; r++) {
        wino43_output_row(tmp, m + (size_t)r * tw, kst, tw);
        for (int i = 0, y = 4 * (ty0 + r); i < 4 && y < h; i++, y++) {
            float *o = out + (size_t)y * wd;
            const float *src = tmp + (size_t)i * 4 * tw;
            if (first && last) conv_bias_act_row(o, src, wd, bias, act);
            else if (first) memcpy(o, src, (size_t)wd * sizeof(float));
            else conv_acc_bias_act_row(o, src, wd, bias, last ? act : MS_ACT_NONE, last);
        }
    }
}

/* U_k of input channels [c0, c0+nc): u (36, co, nc), k stride co nc */
static void wino_weights(float *u, const float *w /* (co, ci, 3, 3) */, int ci, int co, int c0,
                         int nc)
{
#pragma omp for schedule(static)
    for (int o = 0; o < co; o++)
        wino43_weights_row(u + (size_t)o * nc, (size_t)co * nc, w + ((size_t)o * ci + c0) * 9,
                           nc);
}

static void conv2d_wino(float *out /* (co, h, wd) */, const float *in /* (ci, h, wd) */,
                        const float *w /* (co, ci, 3, 3) */, const float *b, int ci, int h,
                        int wd, int co, ms_act act, float *ws /* (ws_floats) */, wino_plan p)
{
    const int th = wino_tiles(h), tw = wino_tiles(wd);
    const size_t plane = (size_t)h * wd;
    float *u = ws;                                       /* (36, co, kc) */
    float *zero = u + round16((size_t)36 * co * p.kc); /* (wd) */
    float *threads = zero + round16((size_t)wd);
    float *v = threads + (size_t)p.threads * wino_thread_floats(tw); /* (36, kc, nt) */
    memset(zero, 0, (size_t)wd * sizeof(float));
#pragma omp parallel num_threads(p.threads) if (p.threads > 1)
    {
        float *t = threads + (size_t)conv_thread_id() * wino_thread_floats(tw); /* (6, wp) */
        float *tmp = t + round16((size_t)6 * (4 * tw + 2));                      /* (4, 4 tw) */
        for (int ch = 0; ch < p.chunks; ch++) {
            int c0 = ch * p.kc, nc = ci - c0 < p.kc ? ci - c0 : p.kc;
            wino_weights(u, w, ci, co, c0, nc);
            for (int bi = 0; bi < p.bands; bi++) {
                int ty0 = bi * p.rows, trows = th - ty0 < p.rows ? th - ty0 : p.rows;
                int nt = trows * tw;
                size_t kv = (size_t)nc * nt + WINO_SKEW, km = (size_t)co * nt + WINO_SKEW;
                float *m = v + 36 * ((size_t)p.kc * nt + WINO_SKEW); /* (36, co, nt) */
#pragma omp for schedule(static)
                for (int c = 0; c < nc; c++)
                    wino_input_channel(v + (size_t)c * nt, kv, t, in + (c0 + c) * plane, zero, h,
                                       wd, ty0, trows);
#pragma omp for schedule(static)
                for (int k = 0; k < 36; k++)
                    /* M_k (co, nt) = U_k (co, nc) @ V_k (nc, nt) */
                    gemm_cpu(m + k * km, u + (size_t)k * co * nc, v + k * kv, co, nt, nc, false,
                             false, nc, nt, nt, 1.0f, 0.0f);
#pragma omp for schedule(static)
                for (int o = 0; o < co; o++)
                    wino_output_channel(out + o * plane, m + (size_t)o * nt, km, tmp,
                                        b ? b[o] : 0.0f, h, wd, act, ty0, trows, ch == 0,
                                        ch == p.chunks - 1);
            }
        }
    }
}

size_t conv2d_winograd_scratch_floats(int ci, int h, int wd, int co)
{
    int threads = conv_threads(), tw = wino_tiles(wd);
    wino_plan p = wino_plan_make(ci, h, wd, co, threads, (size_t)-1 / 2);
    return wino_fixed_floats(p.kc, co, wd, threads) + wino_band_floats(p.kc, co, tw, p.rows);
}

/* false (nothing written) if ws holds less than the weights and one band */
static bool conv2d_winograd_try(float *out, const float *in, const float *w, const float *b,
                                int ci, int h, int wd, int co, ms_act act, float *ws,
                                size_t ws_floats)
{
    wino_plan p = wino_plan_make(ci, h, wd, co, conv_threads(), ws_floats);
    if (p.rows < 1) return false;
    conv2d_wino(out, in, w, b, ci, h, wd, co, act, ws, p);
    return true;
}

void conv2d_winograd_cpu(float *out, const float *in, const float *w, const float *b, int ci,
                         int h, int wd, int co, ms_act act, float *ws, size_t ws_floats)
{
    if (!conv2d_winograd_try(out, in, w, b, ci, h, wd, co, act, ws, ws_floats))
        conv2d_im2col_cpu(out, in, w, b, ci, h, wd, co, 3, 3, 1, 1, act, ws, ws_floats);
}

/* ---------- im2col ---------- */

/* Columns of output rows [y0, y0+rows): col[(c*kh+ky)*kw+kx][pixel]. Each
 * (c, ky, kx, row) is zeros, a run of input, zeros: the run is copied whole
 * at stride 1, gathered otherwise. */
static void im2col_band(float *col /* (ci*kh*kw, rows*wo) */, const float *in /* (ci, h, wd) */,
                        int ci, int h, int wd, int kh, int kw, int stride, int pad, int wo, int y0,
                        int rows)
{
    size_t npix = (size_t)rows * wo;
    for (int c = 0; c < ci; c++) {
        const float *plane = in + (size_t)c * h * wd;
        for (int k = 0; k < kh * kw; k++) {
            int ky = k / kw, kx = k % kw;
            /* output x reads input x*stride - pad + kx: inside for x in [x0, x1) */
            int x0 = pad - kx > 0 ? (pad - kx + stride - 1) / stride : 0;
            int x1 = wd + pad - kx > 0 ? (wd + pad - kx + stride - 1) / stride : 0;
            if (x1 > wo) x1 = wo;
            if (x0 > x1) x0 = x1;
            float *dst = col + ((size_t)c * kh * kw + k) * npix;
            for (int r = 0; r < rows; r++) {
                int iy = (y0 + r) * stride - pad + ky;
                float *d = dst + (size_t)r * wo;
                if (iy < 0 || iy >= h) {
                    memset(d, 0, (size_t)wo * sizeof(float));
                    continue;
                }
                memset(d, 0, (size_t)x0 * sizeof(float));
                if (x1 > x0) {
                    const float *src = plane + (size_t)iy * wd + (x0 * stride - pad + kx);
                    if (stride == 1)
                        memcpy(d + x0, src, (size_t)(x1 - x0) * sizeof(float));
                    else
                        for (int x = 0; x < x1 - x0; x++) d[x0 + x] = src[(size_t)x * stride];
                }
                memset(d + x1, 0, (size_t)(wo - x1) * sizeof(float));
            }
        }
    }
}

void conv2d_im2col_cpu(float *out, const float *in, const float *w, const float *b, int ci,
                       int h, int wd, int co, int kh, int kw, int stride, int pad, ms_act act,
                       float *ws, size_t ws_floats)
{
    int ho = conv_out_size(h, kh, stride, pad), wo = conv_out_size(wd, kw, stride, pad);
    int kdim = ci * kh * kw;
    size_t plane = (size_t)ho * wo;
    band_plan p = band_plan_make(ho, wo, (size_t)kdim * wo, 0, conv_threads(), ws_floats);
    if (p.threads < 1) p = band_plan_one_row(ho, (size_t)kdim * wo); /* below the contract */
#pragma omp parallel for schedule(static) num_threads(p.threads) if (p.threads > 1)
    for (int bi = 0; bi < p.bands; bi++) {
        int y0 = band_start(&p, ho, bi), rows = band_rows(&p, ho, bi);
        int npix = rows * wo;
        float *col = ws + (size_t)conv_thread_id() * p.slice;
        im2col_band(col, in, ci, h, wd, kh, kw, stride, pad, wo, y0, rows);
        /* out[:, band] (co, npix; row stride ho*wo) = w (co, kdim) @ col (kdim, npix) */
        float *ob = out + (size_t)y0 * wo;
        gemm_cpu(ob, w, col, co, npix, kdim, false, false, kdim, npix, (int)plane, 1.0f, 0.0f);
        if (b || act != MS_ACT_NONE)
            for (int o = 0; o < co; o++)
                conv_bias_act_row(ob + o * plane, ob + o * plane, npix, b ? b[o] : 0.0f, act);
    }
}

/* ---------- 1x1 ---------- */

static void conv2d_pointwise(float *out /* (co, n) */, const float *in /* (ci, n) */,
                             const float *w /* (co, ci) */, const float *b, int ci, int n,
                             int co, ms_act act)
{
    if (!b && act == MS_ACT_NONE) {
        gemm_cpu(out, w, in, co, n, ci, false, false, ci, n, n, 1.0f, 0.0f);
        return;
    }
    /* column chunks, each GEMM followed by its output pass in place */
    band_plan p = band_plan_make(n, 1, 0, 0, conv_threads(), 0);
#pragma omp parallel for schedule(static) num_threads(p.threads > 0 ? p.threads : 1)
    for (int bi = 0; bi < p.bands; bi++) {
        int j0 = band_start(&p, n, bi), cols = band_rows(&p, n, bi);
        gemm_cpu(out + j0, w, in + j0, co, cols, ci, false, false, ci, n, n, 1.0f, 0.0f);
        for (int o = 0; o < co; o++)
            conv_bias_act_row(out + (size_t)o * n + j0, out + (size_t)o * n + j0, cols,
                              b ? b[o] : 0.0f, act);
    }
}

/* ---------- dispatch ---------- */

size_t conv2d_scratch_floats(int ci, int h, int wd, int co, int kh, int kw, int stride, int pad)
{
    if (conv2d_is_pointwise(kh, kw, stride, pad)) return 0;
    int threads = conv_threads();
    if (conv2d_is_wino(ci, h, wd, co, kh, kw, stride, pad))
        return conv2d_winograd_scratch_floats(ci, h, wd, co);
    if (stride == 1) {
        band_plan p = implicit_plan(ci, h, wd, co, kh, kw, pad, threads, CONV_UNLIMITED);
        return implicit_weight_floats(ci, co, kh, kw) + (size_t)p.threads * p.slice;
    }
    int ho = conv_out_size(h, kh, stride, pad), wo = conv_out_size(wd, kw, stride, pad);
    size_t row = (size_t)ci * kh * kw * wo; /* im2col columns of one output row */
    band_plan p = band_plan_make(ho, wo, row, 0, threads, CONV_UNLIMITED);
    return (size_t)p.threads * p.slice;
}

void conv2d_cpu(float *out, const float *in, const float *w, const float *b, int ci, int h,
                int wd, int co, int kh, int kw, int stride, int pad, ms_act act, float *ws,
                size_t ws_floats)
{
    if (conv2d_is_pointwise(kh, kw, stride, pad)) {
        conv2d_pointwise(out, in, w, b, ci, h * wd, co, act);
        return;
    }
    if (conv2d_is_wino(ci, h, wd, co, kh, kw, stride, pad) &&
        conv2d_winograd_try(out, in, w, b, ci, h, wd, co, act, ws, ws_floats))
        return;
    if (stride == 1) {
        size_t wf = implicit_weight_floats(ci, co, kh, kw);
        if (ws_floats > wf) {
            band_plan p = implicit_plan(ci, h, wd, co, kh, kw, pad, conv_threads(),
                                        ws_floats - wf);
            if (p.threads > 0) {
                conv2d_implicit(out, in, w, b, ci, h, wd, co, kh, kw, pad, act, ws, p);
                return;
            }
        }
    }
    /* strided, or a workspace too small for the implicit GEMM (callers that
     * size it by conv2d_scratch_floats never are) */
    conv2d_im2col_cpu(out, in, w, b, ci, h, wd, co, kh, kw, stride, pad, act, ws, ws_floats);
}

/* ---------- 2x2 stride-2 transposed conv ---------- */

size_t conv_transpose2x2_scratch_floats(int ci, int h, int wd, int co)
{
    size_t row = (size_t)4 * co * wd; /* GEMM result of one input row */
    band_plan p = band_plan_make(h, wd, row, 0, conv_threads(), CONV_UNLIMITED);
    return (size_t)p.threads * p.slice;
}

void conv_transpose2x2_cpu(float *out, const float *in, const float *w, const float *b, int ci,
                           int h, int wd, int co, ms_act act, float *ws, size_t ws_floats)
{
    int wo = 2 * wd;
    size_t plane_out = (size_t)4 * h * wd;
    band_plan p = band_plan_make(h, wd, (size_t)4 * co * wd, 0, conv_threads(), ws_floats);
    if (p.threads < 1) p = band_plan_one_row(h, (size_t)4 * co * wd); /* below the contract */
#pragma omp parallel for schedule(static) num_threads(p.threads) if (p.threads > 1)
    for (int bi = 0; bi < p.bands; bi++) {
        int y0 = band_start(&p, h, bi), rows = band_rows(&p, h, bi);
        int npix = rows * wd;
        float *t = ws + (size_t)conv_thread_id() * p.slice; /* (4co, npix) */
        /* t = w^T, w stored (ci, 4co), @ in[:, band] (ci, npix; row stride h*wd) */
        gemm_cpu(t, w, in + (size_t)y0 * wd, 4 * co, npix, ci, true, false, 4 * co, h * wd, npix,
                 1.0f, 0.0f);
        /* out[o, 2y+dy, 2x+dx] = t[(o*2+dy)*2+dx, (y-y0)*wd + x] */
        for (int o = 0; o < co; o++)
            for (int r = 0; r < rows; r++)
                for (int dy = 0; dy < 2; dy++) {
                    const float *t0 = t + (size_t)(o * 4 + dy * 2) * npix + (size_t)r * wd;
                    conv_bias_act_interleave(out + o * plane_out + (size_t)(2 * (y0 + r) + dy) * wo,
                                             t0, t0 + npix, wd, b ? b[o] : 0.0f, act);
                }
    }
}
