/* The CUDA kernels (kernels/, .cu files), the same source, run on the CPU
 * through the execution layer in tests/cuda_emu (block threads as fibers,
 * barriers, warp collectives with mask checks, per-block shared memory
 * poisoned with NaN, blocks and threads in a random order) and compared with
 * the CPU ops. The host launch code of each op runs too (tiling decisions,
 * scratch layout, cuBLAS argument order through a reference GEMM); cuDNN and
 * the fused cuBLASLt GEMM are not emulated. The first tests show the layer
 * catches what it must: a missing barrier, wrong warp masks, divergent
 * barriers, bad launch configurations. MS_EMU_SEED=<n> repeats an order. */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/attention_full.cu"
#include "kernels/conv.cu"
#include "kernels/cuda_ctx.cu"
#include "kernels/elementwise.cu"
#include "kernels/layernorm.cu"
#include "kernels/linear.cu"
#include "kernels/mita.cu"
#include "kernels/pool.cu"
#include "kernels/resize.cu"

extern "C" {
#include "tests/testutil.h"
}

/* ---- helpers ---- */

static ms_cuda_ctx *g_cu;

/* A CUDA backend on the emulated device (FP32 GEMMs unless fp32 = false). */
static ms_backend emu_backend(bool fp32)
{
    if (!g_cu) {
        ms_status st = cuda_ctx_init(&g_cu, 0);
        ck_assert_msg(st == MS_OK, "cuda_ctx_init: %s", ms_last_error());
    }
    ms_backend be;
    memset(&be, 0, sizeof be);
    be.device = MS_DEVICE_CUDA;
    be.fp32 = fp32;
    be.cuda = g_cu;
    return be;
}

static void ok(ms_status st, const char *what)
{
    ck_assert_msg(st == MS_OK, "%s: %s", what, ms_last_error());
}

static std::vector<float> randv(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f)
{
    std::vector<float> v(n);
    rand_fill(v.data(), n, seed, lo, hi);
    return v;
}

/* Multiples of 1/2 in [-r, r]: sums of their products are exact in FP32 in
 * any order, so GEMM results (and the top-k and routing decisions made on
 * them) are the same bits on both sides, ties included. */
static std::vector<float> dyadic(size_t n, uint32_t seed, int r)
{
    std::vector<float> v(n);
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        v[i] = (float)((int)((s >> 8) % (unsigned)(4 * r + 1)) - 2 * r) * 0.5f;
    }
    return v;
}

static std::vector<float> nans(size_t n) { return std::vector<float>(n, NAN); }

/* Normwise: max |got - ref| <= tol * max |ref|. */
static void check_close(const std::vector<float> &got, const std::vector<float> &ref, double tol,
                        const char *what)
{
    ck_assert_uint_eq(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); i++)
        ck_assert_msg(std::isfinite(got[i]), "%s: element %zu is %g", what, i, got[i]);
    double err = max_abs_diff(got.data(), ref.data(), got.size());
    double scale = std::max(max_abs(ref.data(), ref.size()), 1e-30);
    ck_assert_msg(err <= tol * scale, "%s: max abs diff %g > %g * %g", what, err, tol, scale);
}

static void check_equal(const std::vector<float> &got, const std::vector<float> &ref,
                        const char *what)
{
    ck_assert_uint_eq(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); i++)
        ck_assert_msg(memcmp(&got[i], &ref[i], 4) == 0, "%s: element %zu: %.9g vs %.9g", what, i,
                      got[i], ref[i]);
}

/* The launch must have failed, with a message containing what. */
static void expect_failure(cudaError_t want, const char *what)
{
    cudaError_t e = cudaGetLastError();
    ck_assert_msg(e == want, "launch returned %s, expected %s (%s)", cudaGetErrorName(e),
                  cudaGetErrorName(want), ms_emu::last_failure());
    ck_assert_msg(strstr(ms_emu::last_failure(), what), "failure '%s' does not say '%s'",
                  ms_emu::last_failure(), what);
}

static void expect_success(void)
{
    cudaError_t e = cudaGetLastError();
    ck_assert_msg(e == cudaSuccess, "launch failed: %s", ms_emu::last_failure());
}

/* ---- the layer itself ---- */

/* Each thread writes its slot, then reads its neighbour's: correct only with
 * the barrier between. */
__global__ void toy_neighbour_kernel(int *out /* (blocks, threads) */, int sync)
{
    __shared__ int s[256];
    const int t = threadIdx.x;
    s[t] = t + 1;
    if (sync) __syncthreads();
    out[blockIdx.x * blockDim.x + t] = s[(t + 1) % blockDim.x];
}

START_TEST(test_layer_missing_barrier)
{
    const int blocks = 3, threads = 96;
    std::vector<int> out((size_t)blocks * threads);
    for (uint64_t seed = 1; seed <= 8; seed++) {
        ms_emu::set_seed(seed);
        MS_LAUNCH(toy_neighbour_kernel, blocks, threads, 0, 0)(out.data(), 1);
        expect_success();
        for (int b = 0; b < blocks; b++)
            for (int t = 0; t < threads; t++)
                ck_assert_int_eq(out[(size_t)b * threads + t], (t + 1) % threads + 1);
        /* without the barrier some thread always reads before its
         * neighbour wrote: the poison (-1) */
        MS_LAUNCH(toy_neighbour_kernel, blocks, threads, 0, 0)(out.data(), 0);
        expect_success();
        int stale = 0;
        for (int v : out) stale += v == -1;
        ck_assert_msg(stale > 0, "seed %llu: the missing barrier went unnoticed",
                      (unsigned long long)seed);
    }
}
END_TEST

/* Lanes below `active` take part in a ballot over `mask`. */
__global__ void toy_ballot_kernel(unsigned *out, unsigned mask, int active)
{
    const int lane = threadIdx.x & 31;
    if (lane < active) out[threadIdx.x] = __ballot_sync(mask, lane & 1);
}

START_TEST(test_layer_warp_masks)
{
    std::vector<unsigned> out(64, 0);
    MS_LAUNCH(toy_ballot_kernel, 2, 64, 0, 0)(out.data(), 0x0000FFFFu, 16);
    expect_success();
    for (int t = 0; t < 64; t++) ck_assert_uint_eq(out[t], (t & 31) < 16 ? 0xAAAAu : 0u);
    /* full mask, half the warp there: lane 16 never arrives */
    MS_LAUNCH(toy_ballot_kernel, 2, 64, 0, 0)(out.data(), 0xFFFFFFFFu, 16);
    expect_failure(cudaErrorLaunchFailure, "has exited without arriving");
    /* half mask, the whole warp there: lanes 16.. leave themselves out */
    MS_LAUNCH(toy_ballot_kernel, 1, 32, 0, 0)(out.data(), 0x0000FFFFu, 32);
    expect_failure(cudaErrorLaunchFailure, "which leaves it out");
    /* a full mask in a partial warp names lanes that do not exist */
    MS_LAUNCH(toy_ballot_kernel, 1, 40, 0, 0)(out.data(), 0xFFFFFFFFu, 32);
    expect_failure(cudaErrorLaunchFailure, "do not exist");
}
END_TEST

/* Lanes below `active` exchange through shared memory, synchronised by
 * __syncwarp(mask) when sync is set. */
__global__ void toy_syncwarp_kernel(int *out, unsigned mask, int active, int sync)
{
    __shared__ int s[32];
    const int lane = threadIdx.x;
    if (lane < active) {
        s[lane] = lane;
        if (sync) __syncwarp(mask);
        out[lane] = s[(lane + 1) % active];
    }
}

START_TEST(test_layer_syncwarp)
{
    std::vector<int> out(32);
    MS_LAUNCH(toy_syncwarp_kernel, 1, 32, 0, 0)(out.data(), 0xFFFFFFFFu, 32, 1);
    expect_success();
    for (int l = 0; l < 32; l++) ck_assert_int_eq(out[l], (l + 1) % 32);
    MS_LAUNCH(toy_syncwarp_kernel, 1, 32, 0, 0)(out.data(), 0xFFFFFFFFu, 32, 0);
    expect_success();
    ck_assert_msg(std::count(out.begin(), out.end(), -1) > 0, "missing __syncwarp unnoticed");
    MS_LAUNCH(toy_syncwarp_kernel, 1, 32, 0, 0)(out.data(), 0xFFFFFFFFu, 20, 1);
    expect_failure(cudaErrorLaunchFailure, "lane 20 has exited without arriving");
}
END_TEST

/* out[t] = the shuffles of t through lanes: down 3, xor 5, index 7, up 2
 * (width 16); votes: any lane 5, all lanes below 40 (thread index). */
__global__ void toy_shuffle_kernel(int *out /* (threads, 6) */, unsigned mask)
{
    const int t = threadIdx.x;
    out[6 * t] = __shfl_down_sync(mask, t, 3);
    out[6 * t + 1] = __shfl_xor_sync(mask, t, 5);
    out[6 * t + 2] = __shfl_sync(mask, t, 7);
    out[6 * t + 3] = __shfl_up_sync(mask, t, 2, 16);
    out[6 * t + 4] = __any_sync(mask, (t & 31) == 5);
    out[6 * t + 5] = __all_sync(mask, t < 40);
}

START_TEST(test_layer_shuffles)
{
    std::vector<int> out(6 * 64);
    MS_LAUNCH(toy_shuffle_kernel, 1, 64, 0, 0)(out.data(), 0xFFFFFFFFu);
    expect_success();
    for (int t = 0; t < 64; t++) {
        int lane = t & 31, w = t - lane;
        ck_assert_int_eq(out[6 * t], lane + 3 < 32 ? t + 3 : t);
        ck_assert_int_eq(out[6 * t + 1], w + (lane ^ 5));
        ck_assert_int_eq(out[6 * t + 2], w + 7);
        ck_assert_int_eq(out[6 * t + 3], lane % 16 >= 2 ? t - 2 : t);
        ck_assert_int_eq(out[6 * t + 4], 1);
        ck_assert_int_eq(out[6 * t + 5], t < 32);
    }
}
END_TEST

/* Barriers that not every thread reaches, or different ones. */
__global__ void toy_divergent_barrier_kernel(int *out, int mode)
{
    if (mode == 0) {
        if (threadIdx.x < 32) __syncthreads();
    } else {
        if (threadIdx.x < 32) {
            __syncthreads();
        } else {
            __syncthreads();
        }
    }
    out[threadIdx.x] = 1;
}

START_TEST(test_layer_divergent_barriers)
{
    std::vector<int> out(64);
    MS_LAUNCH(toy_divergent_barrier_kernel, 1, 64, 0, 0)(out.data(), 0);
    expect_failure(cudaErrorLaunchFailure, "threads that have exited");
    MS_LAUNCH(toy_divergent_barrier_kernel, 1, 64, 0, 0)(out.data(), 1);
    expect_failure(cudaErrorLaunchFailure, "different barriers");
}
END_TEST

/* The order in which blocks (and a block's threads) run. */
__global__ void toy_order_kernel(int *ticket, int *block_order, int *thread_order)
{
    int tk = atomicAdd(ticket, 1);
    if (blockIdx.x == 0) thread_order[threadIdx.x] = tk;
    if (threadIdx.x == 0) block_order[blockIdx.x] = tk / (int)blockDim.x;
}

START_TEST(test_layer_random_order)
{
    const int blocks = 40, threads = 64;
    std::vector<int> bo(blocks), to(threads);
    int ticket = 0;
    MS_LAUNCH(toy_order_kernel, blocks, threads, 0, 0)(&ticket, bo.data(), to.data());
    expect_success();
    ck_assert_int_eq(ticket, blocks * threads);
    std::vector<int> bs = bo, ts = to;
    std::sort(bs.begin(), bs.end());
    std::sort(ts.begin(), ts.end());
    int b_moved = 0, t_moved = 0;
    for (int i = 0; i < blocks; i++) {
        ck_assert_int_eq(bs[i], i); /* each block ran once, as a whole */
        b_moved += bo[i] != i;
    }
    for (int i = 0; i < threads; i++) t_moved += to[i] != ts[i];
    ck_assert_msg(b_moved > 0 && t_moved > 0, "blocks or threads ran in index order");
}
END_TEST

START_TEST(test_layer_launch_limits)
{
    std::vector<int> out(2048);
    MS_LAUNCH(toy_neighbour_kernel, 1, 1025, 0, 0)(out.data(), 1);
    expect_failure(cudaErrorInvalidConfiguration, "block (1025,1,1)");
    MS_LAUNCH(toy_neighbour_kernel, dim3(1, 70000), 32, 0, 0)(out.data(), 1);
    expect_failure(cudaErrorInvalidConfiguration, "grid");
    MS_LAUNCH(flash_kernel<0>, 1, 1, 64 * 1024, 0)(nullptr, nullptr, 0, 0, 0, 0, 0.0f);
    expect_failure(cudaErrorInvalidValue, "cudaFuncSetAttribute");
    ck_assert_int_eq(cudaFuncSetAttribute(flash_kernel<0>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, 300000),
                     cudaErrorInvalidValue); /* over the device's opt-in limit */
}
END_TEST

/* ---- grid-stride loops ---- */

/* The element kernels loop when the grid (capped by cuda_blocks) has fewer
 * threads than items: launched here with 3 blocks of 32 threads. */
START_TEST(test_emu_grid_stride)
{
    {
        const size_t n = 1001;
        auto a = randv(n, 30), b = randv(n, 31), got = nans(n), ref = nans(n);
        MS_LAUNCH(add_kernel, 3, 32, 0, 0)(got.data(), a.data(), b.data(), n);
        expect_success();
        add_cpu(ref.data(), a.data(), b.data(), n);
        check_equal(got, ref, "add_kernel, 96 threads");
    }
    {
        const int c = 2, h = 9, w = 7, ho = 13, wo = 11;
        auto in = randv((size_t)c * h * w, 32), got = nans((size_t)c * ho * wo), ref = got;
        MS_LAUNCH(resize_kernel<true>, 3, 32, 0, 0)(got.data(), in.data(), h, w, 0, ho, wo,
            resize_ratio(h, ho, 0.0), resize_ratio(w, wo, 0.0), (long long)c * ho * wo);
        expect_success();
        resize_bicubic_cpu(ref.data(), in.data(), c, h, w, ho, wo);
        check_close(got, ref, 1e-6, "resize_kernel, 96 threads");
    }
    {
        const int heads = 2, chunks = 3, md = 70;
        auto part = randv((size_t)heads * chunks * md, 33), got = nans((size_t)heads * md);
        MS_LAUNCH(sv_reduce_kernel, 3, 32, 0, 0)(got.data(), part.data(), heads, chunks, md);
        expect_success();
        for (int h = 0; h < heads; h++)
            for (int r = 0; r < md; r++) {
                float a = 0.0f;
                for (int ch = 0; ch < chunks; ch++) a += part[((size_t)h * chunks + ch) * md + r];
                ck_assert_float_eq(got[(size_t)h * md + r], a);
            }
    }
    {
        const int heads = 2, n = 150, m = 5;
        auto rs = dyadic((size_t)heads * n * m, 34, 1); /* ties */
        std::vector<int32_t> route((size_t)heads * n, -7);
        std::vector<int> counts((size_t)heads * m, 0), ref((size_t)heads * m, 0);
        MS_LAUNCH(route_kernel, 3, 32, 0, 0)(route.data(), counts.data(), rs.data(), heads, n, m);
        expect_success();
        for (int t = 0; t < heads * n; t++) {
            int e = argmax_first(rs.data() + (size_t)t * m, m, 1);
            ck_assert_int_eq(route[t], e);
            ref[(size_t)(t / n) * m + e]++;
        }
        ck_assert_mem_eq(counts.data(), ref.data(), ref.size() * sizeof(int));
    }
}
END_TEST

/* ---- memory-bound ops ---- */

START_TEST(test_emu_elementwise)
{
    ms_backend be = emu_backend(true);
    {
        const size_t n = 1000;
        auto a = randv(n, 1), b = randv(n, 2), got = nans(n), ref = nans(n);
        ok(add_cuda(&be, got.data(), a.data(), b.data(), n), "add_cuda");
        add_cpu(ref.data(), a.data(), b.data(), n);
        check_equal(got, ref, "add");
    }
    const int tr[][2] = {{1, 1}, {45, 70}, {32, 33}, {100, 3}};
    for (auto &rc : tr) {
        size_t n = (size_t)rc[0] * rc[1];
        auto in = randv(n, 3), got = nans(n), ref = nans(n);
        ok(transpose_cuda(&be, got.data(), in.data(), rc[0], rc[1]), "transpose_cuda");
        transpose_cpu(ref.data(), in.data(), rc[0], rc[1]);
        check_equal(got, ref, "transpose");
    }
    const int sm[][2] = {{3, 1}, {2, 37}, {3, 300}, {2, 1500}}; /* 64, 256, 512 threads */
    for (auto &rc : sm) {
        size_t n = (size_t)rc[0] * rc[1];
        auto got = randv(n, 4, -8.0f, 8.0f);
        /* a spike in the row's last warp: a max taken over fewer threads
         * (softmax itself does not depend on the shift) overflows exp */
        for (int r = 0; r < rc[0]; r++)
            got[(size_t)r * rc[1] + std::max(rc[1] - 1 - r, 0)] = 120.0f;
        auto ref = got;
        ok(softmax_rows_cuda(&be, got.data(), rc[0], rc[1]), "softmax_rows_cuda");
        softmax_rows_cpu(ref.data(), rc[0], rc[1]);
        check_close(got, ref, 1e-5, "softmax_rows"); /* 1500-term sums in another order */
    }
    {
        const int c = 3, h = 7, w = 9, ho = 5, wo = 4;
        auto in = randv((size_t)c * h * w, 5), got = nans((size_t)c * ho * wo), ref = got;
        ok(crop_cuda(&be, got.data(), in.data(), c, h, w, ho, wo), "crop_cuda");
        crop_cpu(ref.data(), in.data(), c, h, w, ho, wo);
        check_equal(got, ref, "crop");
    }
    {
        const int c = 5, h = 7, w = 11;
        auto in = dyadic((size_t)c * h * w, 6, 1); /* many ties */
        std::vector<uint8_t> got((size_t)h * w, 0xEE), ref((size_t)h * w);
        ok(argmax_cuda(&be, got.data(), in.data(), c, h, w), "argmax_cuda");
        argmax_cpu(ref.data(), in.data(), c, h, w);
        ck_assert_mem_eq(got.data(), ref.data(), got.size());
    }
    {
        const int h = 5, w = 7, hp = 8, wp = 9;
        const float mean[3] = {0.4f, 0.5f, 0.6f}, stdv[3] = {0.2f, 0.25f, 0.3f};
        auto in = randv((size_t)3 * h * w, 7, 0.0f, 1.0f);
        auto got = nans((size_t)3 * hp * wp), ref = got;
        ok(normalize_pad_cuda(&be, got.data(), in.data(), h, w, hp, wp, mean, stdv),
           "normalize_pad_cuda");
        normalize_pad_cpu(ref.data(), in.data(), h, w, hp, wp, mean, stdv);
        check_equal(got, ref, "normalize_pad");
    }
    { /* sliding-window logits (mmseg slide_inference): windows summed in
       * place, then divided by the count covering each pixel; strides that
       * leave a last window flush with the edge */
        const int c = 3, h = 11, w = 13, wh = 5, ww = 6, sh = 3, sw = 4;
        const int ny = slide_windows(h, wh, sh), nx = slide_windows(w, ww, sw);
        auto got = nans((size_t)c * h * w), ref = got;
        for (int wi = 0; wi < ny * nx; wi++) {
            auto win = randv((size_t)c * wh * ww, 40 + wi);
            int y0 = slide_start(wi / nx, h, wh, sh), x0 = slide_start(wi % nx, w, ww, sw);
            ok(window_add_cuda(&be, got.data(), win.data(), c, h, w, wh, ww, y0, x0, wi == 0),
               "window_add_cuda");
            window_add_cpu(ref.data(), win.data(), c, h, w, wh, ww, y0, x0, wi == 0);
        }
        check_equal(got, ref, "window_add");
        ok(window_average_cuda(&be, got.data(), c, h, w, wh, ww, sh, sw), "window_average_cuda");
        window_average_cpu(ref.data(), c, h, w, wh, ww, sh, sw);
        check_equal(got, ref, "window_average");
    }
}
END_TEST

START_TEST(test_emu_layernorm)
{
    ms_backend be = emu_backend(true);
    const int shapes[][2] = {{1, 1}, {9, 31}, {17, 96}, {3, 200}};
    for (auto &s : shapes) {
        const int n = s[0], c = s[1];
        /* a large mean, as in a residual stream */
        auto in = randv((size_t)n * c, 8, 90.0f, 110.0f), w = randv(c, 9), b = randv(c, 10);
        auto got = nans((size_t)n * c), ref = got;
        ok(layernorm_cuda(&be, got.data(), in.data(), w.data(), b.data(), n, c, 1e-6f),
           "layernorm_cuda");
        layernorm_cpu(ref.data(), in.data(), w.data(), b.data(), n, c, 1e-6f);
        /* float sums (GPU) against double (CPU) over up to 200 values near 100 */
        check_close(got, ref, 2e-5, "layernorm");
    }
}
END_TEST

START_TEST(test_emu_pool_resize)
{
    ms_backend be = emu_backend(true);
    const int c = 3, h = 13, w = 7;
    auto in = randv((size_t)c * h * w, 11);
    {
        const int gh = 4, gw = 3;
        auto got = nans((size_t)c * gh * gw), ref = got;
        ok(adaptive_avgpool_cuda(&be, got.data(), in.data(), c, h, w, gh, gw), "avgpool");
        adaptive_avgpool_cpu(ref.data(), in.data(), c, h, w, gh, gw);
        check_close(got, ref, 1e-6, "adaptive_avgpool");
    }
    {
        auto got = nans((size_t)c * (h / 2) * (w / 2)), ref = got;
        ok(maxpool2x2_cuda(&be, got.data(), in.data(), c, h, w), "maxpool2x2_cuda");
        maxpool2x2_cpu(ref.data(), in.data(), c, h, w);
        check_equal(got, ref, "maxpool2x2");
    }
    const int sizes[][2] = {{11, 16}, {5, 3}, {1, 1}};
    for (auto &s : sizes) {
        auto got = nans((size_t)c * s[0] * s[1]), ref = got;
        ok(resize_bilinear_cuda(&be, got.data(), in.data(), c, h, w, s[0], s[1], 0, s[0], 0.0,
                                0.0),
           "bilinear");
        resize_bilinear_cpu(ref.data(), in.data(), c, h, w, s[0], s[1], 0, s[0], 0.0, 0.0);
        check_close(got, ref, 1e-6, "resize_bilinear");
        if (s[0] > 2) { /* a band of rows (mask_only's banded argmax) */
            auto band = nans((size_t)c * 2 * s[1]), bref = band;
            ok(resize_bilinear_cuda(&be, band.data(), in.data(), c, h, w, s[0], s[1], 1, 3, 0.0,
                                    0.0),
               "bilinear rows");
            resize_bilinear_cpu(bref.data(), in.data(), c, h, w, s[0], s[1], 1, 3, 0.0, 0.0);
            check_close(band, bref, 1e-6, "resize_bilinear rows 1..3");
        }
        ok(resize_bilinear_cuda(&be, got.data(), in.data(), c, h, w, s[0], s[1], 0, s[0], 0.8,
                                1.3),
           "bilinear scaled");
        resize_bilinear_cpu(ref.data(), in.data(), c, h, w, s[0], s[1], 0, s[0], 0.8, 1.3);
        check_close(got, ref, 1e-6, "resize_bilinear with scales");
        ok(resize_bicubic_cuda(&be, got.data(), in.data(), c, h, w, s[0], s[1]), "bicubic");
        resize_bicubic_cpu(ref.data(), in.data(), c, h, w, s[0], s[1]);
        check_close(got, ref, 1e-6, "resize_bicubic");
    }
}
END_TEST

/* ---- convolution epilogues, linear ---- */

START_TEST(test_emu_conv)
{
    const int ci = 5, h = 3, wd = 4, co = 6;
    auto in = randv((size_t)ci * h * wd, 12), w = randv((size_t)ci * co * 4, 13),
         b = randv(co, 14);
    /* the reference outside FP32 mode: the CPU op on BF16-rounded operands
     * (as the CPU's tc_round) */
    std::vector<float> in16(in.size()), w16(w.size());
    for (size_t i = 0; i < in.size(); i++) in16[i] = bf16_round(in[i]);
    for (size_t i = 0; i < w.size(); i++) w16[i] = bf16_round(w[i]);
    std::vector<float> cws(conv_transpose2x2_scratch_floats(ci, h, wd, co));
    const ms_act acts[] = {MS_ACT_NONE, MS_ACT_RELU, MS_ACT_GELU};
    for (int fp32 = 0; fp32 < 2; fp32++) {
        ms_backend be = emu_backend(fp32 != 0);
        std::vector<float> g(
            conv_transpose2x2_cuda_scratch_bytes(ci, h, wd, co, fp32 != 0) / sizeof(float) + 64);
        float *ga = (float *)(((uintptr_t)g.data() + 255) & ~(uintptr_t)255);
        for (ms_act act : acts)
            for (int with_b = 0; with_b < 2; with_b++) {
                const float *bp = with_b ? b.data() : NULL;
                auto got = nans((size_t)co * 4 * h * wd), ref = got;
                ok(conv_transpose2x2_cuda(&be, got.data(), in.data(), w.data(), bp, ci, h, wd, co,
                                          act, ga),
                   "conv_transpose2x2_cuda");
                conv_transpose2x2_cpu(ref.data(), fp32 ? in.data() : in16.data(),
                                      fp32 ? w.data() : w16.data(), bp, ci, h, wd, co, act,
                                      cws.data(), cws.size());
                check_close(got, ref, 1e-6, "conv_transpose2x2"); /* 5-term sums */
            }
    }
    /* conv2d's TF32 operand copies (cuDNN itself is not emulated) */
    {
        auto x = randv(1000, 16, -1e3f, 1e3f), got = nans(x.size()), ref = x;
        MS_LAUNCH(round_operand_kernel, cuda_blocks(x.size(), CV_THREADS), CV_THREADS, 0,
                  0)(got.data(), x.data(), (long long)x.size(), 0);
        expect_success();
        for (float &v : ref) v = tf32_round(v);
        check_equal(got, ref, "round_operand tf32");
    }
    /* conv2d's bias + activation kernel after cuDNN (cuDNN itself is not
     * emulated): out = act(x + b[channel]) */
    const long long plane = 7 * 5;
    for (ms_act act : acts) {
        auto x = randv((size_t)co * plane, 15), got = x, ref = x;
        MS_LAUNCH(chan_bias_act_kernel, cuda_blocks((size_t)(co * plane), CV_THREADS), CV_THREADS,
                  0, 0)(got.data(), b.data(), plane, co * plane, (int)act);
        expect_success();
        for (long long t = 0; t < co * plane; t++) ref[t] = act_apply(x[t] + b[t / plane], act);
        check_equal(got, ref, "chan_bias_act");
    }
}
END_TEST

START_TEST(test_emu_linear)
{
    const int n = 7, cin = 13, cout = 9;
    auto in = randv((size_t)n * cin, 16), w = randv((size_t)cout * cin, 17), b = randv(cout, 18);
    auto res = randv((size_t)n * cout, 19);
    /* the reference for BF16 mode: the same CPU op on BF16-rounded operands */
    std::vector<float> in16(in.size()), w16(w.size());
    for (size_t i = 0; i < in.size(); i++) in16[i] = bf16_round(in[i]);
    for (size_t i = 0; i < w.size(); i++) w16[i] = bf16_round(w[i]);
    std::vector<uint8_t> ws(linear_cuda_scratch_bytes(n, cin, false) + 256);
    void *wsa = (void *)(((uintptr_t)ws.data() + 255) & ~(uintptr_t)255);
    const ms_act acts[] = {MS_ACT_NONE, MS_ACT_RELU, MS_ACT_GELU};
    for (int fp32 = 0; fp32 < 2; fp32++) {
        ms_backend be = emu_backend(fp32 != 0);
        const float *ri = fp32 ? in.data() : in16.data(), *rw = fp32 ? w.data() : w16.data();
        for (ms_act act : acts)
            for (int with_b = 0; with_b < 2; with_b++) {
                const float *bp = with_b ? b.data() : NULL;
                auto got = nans((size_t)n * cout), ref = got;
                ok(linear_cuda(&be, got.data(), in.data(), w.data(), bp, n, cin, cout, act, false,
                               wsa),
                   "linear_cuda");
                linear_cpu(ref.data(), ri, rw, bp, n, cin, cout, act, false);
                check_close(got, ref, 1e-6, "linear"); /* 13-term sums */
            }
        auto got = res, ref = res;
        ok(linear_cuda(&be, got.data(), in.data(), w.data(), b.data(), n, cin, cout, MS_ACT_NONE,
                       true, wsa),
           "linear_cuda residual");
        linear_cpu(ref.data(), ri, rw, b.data(), n, cin, cout, MS_ACT_NONE, true);
        check_close(got, ref, 1e-6, "linear residual");
        ok(cuda_ctx_forget_weights(g_cu), "forget weights");
    }
}
END_TEST

/* ---- top-k ---- */

/* Positions by descending score, ties to the lower position. */
static std::vector<int> topk_ref(const float *p, int n, int k)
{
    std::vector<int> ix(n);
    for (int i = 0; i < n; i++) ix[i] = i;
    std::stable_sort(ix.begin(), ix.end(), [&](int a, int b) { return p[a] > p[b]; });
    ix.resize(k);
    return ix;
}

static void run_topk(const std::vector<float> &probe, int rows, int n, int k, const char *what)
{
    std::vector<int32_t> idx((size_t)rows * k, -7);
    std::vector<uint64_t> cand(k > MS_TOPK_SMEM ? (size_t)rows * k : 0, ~0ull);
    size_t smem = k <= MS_TOPK_SMEM ? (size_t)next_pow2(k) * sizeof(uint64_t) : 0; /* <= 32 KB */
    MS_LAUNCH(topk_kernel, rows, MITA_TOPK_THREADS, smem, 0)(idx.data(),
        cand.empty() ? nullptr : cand.data(), probe.data(), n, k);
    expect_success();
    for (int r = 0; r < rows; r++) {
        std::vector<int> ref = topk_ref(probe.data() + (size_t)r * n, n, k);
        for (int j = 0; j < k; j++)
            ck_assert_msg(idx[(size_t)r * k + j] == ref[j],
                          "%s: n=%d k=%d row %d rank %d: position %d, expected %d", what, n, k, r,
                          j, idx[(size_t)r * k + j], ref[j]);
    }
}

START_TEST(test_emu_topk)
{
    const int cases[][3] = {/* rows, n, k */
                            {1, 1, 1},    {2, 37, 37},  {3, 100, 7},  {2, 513, 64},
                            {1, 1000, 100}, {1, 700, 700}, {2, 1500, 1}};
    for (auto &c : cases) {
        const int rows = c[0], n = c[1], k = c[2];
        run_topk(randv((size_t)rows * n, 20 + n), rows, n, k, "distinct");
        run_topk(dyadic((size_t)rows * n, 21 + n, 1), rows, n, k, "5 values, ties");
    }
    /* signed zeros tie; infinities order */
    std::vector<float> z = {0.0f, -0.0f, 1.0f, -INFINITY, INFINITY, -0.0f, 0.0f, -1.0f, 1.0f};
    run_topk(z, 1, (int)z.size(), 6, "zeros and infinities");
    /* all equal: the k lowest positions */
    run_topk(std::vector<float>(777, 0.25f), 1, 777, 300, "all equal");
    /* k above MS_TOPK_SMEM: candidates in device memory, rank sort */
    const int n = MS_TOPK_SMEM + 100, k = MS_TOPK_SMEM + 3;
    run_topk(dyadic((size_t)n, 22, 6), 1, n, k, "rank sort");
}
END_TEST

/* ---- MiTA ---- */

struct mita_case {
    int hp, wp, c, heads, gh, gw, k;
    bool shared_d;
    int q_const; /* q the same in every token: every query routes to expert 0 */
    int ncls;    /* class tokens before the grid (0 or 1) */
};

/* mita_cuda on the emulated device against mita_cpu: the routed sets and
 * routes exactly (the GEMMs are exact on these inputs), the output and the
 * shared mass to FP32 rounding. */
static void run_mita(const mita_case &t, size_t smem_optin, size_t routed_smem = 0)
{
    const int n = t.ncls + t.hp * t.wp, c = t.c, m = t.gh * t.gw, k = t.k, heads = t.heads;
    char what[160];
    snprintf(what, sizeof what, "mita %dx%d%s c=%d heads=%d m=%dx%d k=%d optin=%zu", t.hp, t.wp,
             t.ncls ? "+cls" : "", c, heads, t.gh, t.gw, k, smem_optin);
    std::vector<float> qkv = dyadic((size_t)n * 3 * c, 23 + n + c, 2);
    if (t.q_const)
        for (int i = 1; i < n; i++)
            memcpy(&qkv[(size_t)i * 3 * c], &qkv[0], (size_t)c * sizeof(float));
    ms_backend be = emu_backend(true);
    const size_t optin0 = g_cu->smem_optin;
    g_cu->smem_optin = smem_optin;
    ms_emu::set_smem_optin(smem_optin);

    std::vector<uint8_t> ws(mita_cuda_scratch_bytes(t.hp, t.wp, t.ncls, c, heads, t.gh, t.gw, k) + 256,
                            0xFF);
    void *wsa = (void *)(((uintptr_t)ws.data() + 255) & ~(uintptr_t)255);
    std::vector<int32_t> idx((size_t)heads * m * k, -7), route((size_t)heads * n, -7);
    std::vector<float> mass = nans((size_t)heads * n), out = nans((size_t)n * c);
    ms_mita_record rec = {idx.data(), route.data(), mass.data()};
    ms_emu::clear_launches();
    ms_status st = mita_cuda(&be, out.data(), qkv.data(), t.hp, t.wp, t.ncls, c, heads, t.gh, t.gw, k,
                             t.shared_d, &rec, wsa);
    g_cu->smem_optin = optin0;
    ms_emu::set_smem_optin(optin0);
    ck_assert_msg(st == MS_OK, "%s: %s", what, ms_last_error());
    if (routed_smem) { /* the tiling the host code chose */
        const ms_emu::launch_record &r = ms_emu::launches().back();
        ck_assert_msg(strncmp(r.name, "routed_kernel", 13) == 0 && r.smem == routed_smem,
                      "%s: last launch %s with %zu bytes of shared memory, expected the routed "
                      "kernel with %zu",
                      what, r.name, r.smem, routed_smem);
    }

    std::vector<uint8_t> cws(mita_scratch_bytes(t.hp, t.wp, t.ncls, c, heads, t.gh, t.gw, k, 1) + 64);
    void *cwsa = (void *)(((uintptr_t)cws.data() + 63) & ~(uintptr_t)63);
    std::vector<int32_t> ridx(idx.size()), rroute(route.size());
    std::vector<float> rmass(mass.size()), rout(out.size());
    ms_mita_record rrec = {ridx.data(), rroute.data(), rmass.data()};
    mita_cpu(rout.data(), qkv.data(), t.hp, t.wp, t.ncls, c, heads, t.gh, t.gw, k, t.shared_d, &rrec,
             cwsa, 1);

    for (size_t i = 0; i < idx.size(); i++)
        ck_assert_msg(idx[i] == ridx[i],
                      "%s: routed set entry %zu (head %zu, expert %zu): %d vs %d", what, i,
                      i / ((size_t)m * k), i / k % m, idx[i], ridx[i]);
    for (size_t i = 0; i < route.size(); i++)
        ck_assert_msg(route[i] == rroute[i], "%s: route of query %zu: %d vs %d", what, i,
                      route[i], rroute[i]);
    /* softmaxes over up to M + k exact logits, summed in another order */
    check_close(out, rout, 2e-5, what);
    check_close(mass, rmass, 2e-5, what);
    if (n <= 64) { /* without a record (no shared mass written): the same output */
        std::vector<float> out2 = nans(out.size());
        ok(mita_cuda(&be, out2.data(), qkv.data(), t.hp, t.wp, t.ncls, c, heads, t.gh, t.gw, k,
                     t.shared_d, NULL, wsa),
           what);
        check_equal(out2, out, what);
    }
}

START_TEST(test_emu_mita)
{
    const size_t optin = 232448; /* H100/H200 */
    const mita_case cases[] = {
        /* N = 30, two heads of d = 32, 2x2 windows */
        {6, 5, 64, 2, 4, 4, 7, false, 0},
        /* k = N, d = 16 (generic head dim) */
        {3, 3, 16, 1, 2, 2, 9, true, 0},
        /* a class token (mita-spec 2.7): landmarks pool the grid only, the
         * token is a key (k = all 10 tokens) and a query, records number it N */
        {3, 3, 16, 1, 2, 2, 10, true, 0, 1},
        /* a class token with two heads of d = 32, k < N (pooling windows of
         * 2x2 grid tokens keep the landmarks, and so every GEMM, exact) */
        {6, 5, 64, 2, 3, 4, 7, false, 0, 1},
        /* every query the same as the class token's, so every landmark is
         * too: all routes tie and every query, the class token's included,
         * goes to expert 0; the other experts get none */
        {4, 4, 64, 2, 2, 2, 6, false, 1, 1},
        /* d = 128; k = N = 25 */
        {5, 5, 128, 1, 4, 4, 25, false, 0},
        /* more experts than tokens per expert: most experts get no query;
         * two heads of d = 48 */
        {7, 6, 96, 2, 6, 5, 3, true, 0},
        /* k = 100 > 64: the routed keys in two tiles (64 + 36) */
        {12, 12, 32, 1, 6, 6, 100, false, 0},
        /* N > MITA_SV_CHUNK (split summary GEMM: one full chunk and the
         * rest, per head), all queries to expert 0: one group of 33 chunks,
         * three empty experts, in each of two heads */
        {64, 65, 128, 2, 2, 2, 20, false, 1},
        /* N = 2 MITA_SV_CHUNK: full chunks only */
        {128, 64, 32, 2, 2, 2, 5, true, 1},
        /* k > MS_TOPK_SMEM: candidates in the scratch, rank sort; d = 4 */
        {64, 65, 4, 1, 2, 2, MS_TOPK_SMEM + 1, false, 1},
    };
    for (const mita_case &t : cases) run_mita(t, optin);
}
END_TEST

START_TEST(test_emu_mita_tiles)
{
    /* 49 summaries of d = 256 (49 KB) exceed the default 48 KB: the opt-in
     * limit of an H200 (key tiles 64 + 6), then a device limited to 48 KB,
     * where the routed kernel stages the summaries in tiles (32 + 17) next
     * to key tiles of 8 (8 x 8 + 6) */
    const mita_case t = {14, 14, 256, 1, 7, 7, 70, false, 0};
    const size_t row = 256 * sizeof(float);
    run_mita(t, 232448, 49 * row + 64 * 2 * row);
    run_mita(t, 48 * 1024, 32 * row + 8 * 2 * row);
}
END_TEST

/* ---- full attention ---- */

START_TEST(test_emu_attention_full)
{
    ms_backend be = emu_backend(true);
    const int cases[][3] = {/* n, c, heads */
                            {1, 32, 1},  {70, 64, 2},  {200, 64, 1},
                            {30, 256, 2}, {50, 40, 5}, {65, 256, 1}};
    for (auto &t : cases) {
        const int n = t[0], c = t[1], heads = t[2];
        auto qkv = randv((size_t)n * 3 * c, 24 + n, -2.0f, 2.0f);
        auto got = nans((size_t)n * c), ref = got;
        ok(attention_full_cuda(&be, got.data(), qkv.data(), n, c, heads, NULL),
           "attention_full_cuda");
        std::vector<float> ws(attention_full_scratch_floats(n, c, MS_ATTN_QB, MS_ATTN_KB, 1));
        attention_full_cpu(ref.data(), qkv.data(), n, c, heads, MS_ATTN_QB, MS_ATTN_KB, ws.data(),
                           1);
        char what[64];
        snprintf(what, sizeof what, "attention n=%d c=%d heads=%d", n, c, heads);
        check_close(got, ref, 2e-5, what); /* FP32, n-term softmax sums */
    }
}
END_TEST

int main(void)
{
    fprintf(stderr, "cuda_emu: MS_EMU_SEED=%llu\n", (unsigned long long)ms_emu::seed());
    Suite *s = suite_create("cuda_emu");
    TCase *tl = tcase_create("layer");
    tcase_add_test(tl, test_layer_missing_barrier);
    tcase_add_test(tl, test_layer_warp_masks);
    tcase_add_test(tl, test_layer_shuffles);
    tcase_add_test(tl, test_layer_syncwarp);
    tcase_add_test(tl, test_layer_divergent_barriers);
    tcase_add_test(tl, test_layer_random_order);
    tcase_add_test(tl, test_layer_launch_limits);
    suite_add_tcase(s, tl);
    TCase *tk = tcase_create("kernels");
    tcase_set_timeout(tk, 300); /* the sanitizer build on a loaded machine */
    tcase_add_test(tk, test_emu_grid_stride);
    tcase_add_test(tk, test_emu_elementwise);
    tcase_add_test(tk, test_emu_layernorm);
    tcase_add_test(tk, test_emu_pool_resize);
    tcase_add_test(tk, test_emu_conv);
    tcase_add_test(tk, test_emu_linear);
    tcase_add_test(tk, test_emu_topk);
    tcase_add_test(tk, test_emu_mita);
    tcase_add_test(tk, test_emu_mita_tiles);
    tcase_add_test(tk, test_emu_attention_full);
    suite_add_tcase(s, tk);
    return run_suite(s);
}
