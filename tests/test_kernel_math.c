/* The CUDA kernels' per-thread arithmetic, run on the CPU (CI has no GPU).
 * Each CUDA kernel in kernels/ calls MS_HD helpers from
 * kernels/mita_cuda_math.h and kernels/image_cuda_math.h for its per-thread
 * work; these tests call the same helpers in the kernels' order (threads of
 * a block as a loop, barriers as loop boundaries) and compare with the CPU
 * ops. What stays unverified until a GPU runs: the block-level glue (ballot
 * scans, shuffles, shared-memory staging, atomics), cuBLAS/cuDNN calls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/conv.h"
#include "kernels/image_cuda_math.h"
#include "kernels/linear.h"
#include "kernels/mita_cuda_math.h"
#include "kernels/ops.h"
#include "tests/testutil.h"

static ms_backend cpu_backend(void)
{
    ms_backend be;
    memset(&be, 0, sizeof be);
    be.device = MS_DEVICE_CPU;
    backend_set_threads(&be, 1);
    return be;
}

/* Normwise check: max |a - b| <= tol * max |ref| (elementwise relative
 * error is meaningless near zeros). */
static void check_close(const float *got, const float *ref, size_t n, double tol, const char *what)
{
    double err = max_abs_diff(got, ref, n), scale = max_abs(ref, n);
    if (scale < 1e-30) scale = 1e-30;
    ck_assert_msg(err <= tol * scale, "%s: max abs diff %g > %g * max|ref| %g", what, err, tol,
                  scale);
}

/* ---- top-k: the kernel's radix select + ordered compaction + bitonic sort ---- */

/* topk_kernel with the block's threads as sequential loops. */
static void emu_topk(int32_t *dst /* (k) */, const float *p /* (n) */, int n, int k)
{
    uint32_t prefix = 0, mask = 0;
    int need = k;
    unsigned hist[256];
    for (int pass = 0; pass < 4; pass++) {
        int shift = 24 - 8 * pass;
        memset(hist, 0, sizeof hist);
        for (int i = 0; i < n; i++) {
            uint32_t u = topk_key(p[i]);
            if ((u & mask) == prefix) hist[(u >> shift) & 255u]++;
        }
        int dg = topk_pick_digit(hist, &need);
        prefix |= (uint32_t)dg << shift;
        mask |= 255u << shift;
    }
    int take_eq = need, n_gt = k - need, bg = 0, beq = 0;
    int n2 = next_pow2(k);
    uint64_t *cand = calloc((size_t)n2, sizeof *cand);
    ck_assert_ptr_nonnull(cand);
    /* The kernel's ordered block scan visits positions in index order. */
    for (int i = 0; i < n; i++) {
        uint32_t u = topk_key(p[i]);
        if (u > prefix) cand[bg++] = topk_composite(u, i);
        else if (u == prefix && beq < take_eq) cand[n_gt + beq++] = topk_composite(u, i);
    }
    ck_assert_int_eq(bg, n_gt);
    ck_assert_int_eq(beq, take_eq);
    for (int size = 2; size <= n2; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1)
            for (int i = 0; i < n2 / 2; i++) bitonic_step_desc(cand, size, stride, i);
    for (int j = 0; j < k; j++) dst[j] = topk_composite_pos(cand[j]);
    free(cand);
}

static const float *g_sort_scores;
static int cmp_topk(const void *a, const void *b)
{
    int ia = *(const int *)a, ib = *(const int *)b;
    if (topk_before(g_sort_scores[ia], ia, g_sort_scores[ib], ib)) return -1;
    if (topk_before(g_sort_scores[ib], ib, g_sort_scores[ia], ia)) return 1;
    return 0;
}

static void ref_topk(int32_t *dst, const float *p, int n, int k)
{
    int *ord = malloc((size_t)n * sizeof *ord);
    ck_assert_ptr_nonnull(ord);
    for (int i = 0; i < n; i++) ord[i] = i;
    g_sort_scores = p;
    qsort(ord, (size_t)n, sizeof *ord, cmp_topk);
    for (int j = 0; j < k; j++) dst[j] = ord[j];
    free(ord);
}

START_TEST(test_topk_select)
{
    const int ns[] = {1, 2, 7, 64, 100, 1000, 5000};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        int n = ns[a];
        float *p = malloc((size_t)n * sizeof *p);
        int32_t *got = malloc((size_t)n * sizeof *got), *ref = malloc((size_t)n * sizeof *ref);
        ck_assert(p && got && ref);
        for (int mode = 0; mode < 4; mode++) {
            rand_fill(p, (size_t)n, 100 + (uint32_t)(a * 7 + mode), -3.0f, 3.0f);
            if (mode == 1) /* few distinct values: many ties, lowest positions win */
                for (int i = 0; i < n; i++) p[i] = floorf(p[i]);
            if (mode == 2) /* all equal, with signed zeros (they tie) */
                for (int i = 0; i < n; i++) p[i] = (i & 1) ? 0.0f : -0.0f;
            if (mode == 3) /* huge and tiny magnitudes, both signs */
                for (int i = 0; i < n; i++) p[i] = ldexpf(p[i], (i % 9) * 10 - 40);
            const int ks[] = {1, 3, 49, n / 2, n - 1, n};
            for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++) {
                int k = ks[b];
                if (k < 1 || k > n || k > MS_TOPK_SMEM) continue;
                emu_topk(got, p, n, k);
                ref_topk(ref, p, n, k);
                for (int j = 0; j < k; j++)
                    ck_assert_msg(got[j] == ref[j], "n=%d k=%d mode=%d: rank %d got %d want %d",
                                  n, k, mode, j, got[j], ref[j]);
            }
        }
        free(p);
        free(got);
        free(ref);
    }
}
END_TEST

START_TEST(test_topk_key_order)
{
    const float v[] = {-INFINITY, -1e30f, -2.0f, -1.0f, -1e-30f, 0.0f, 1e-30f, 1.0f, 2.0f,
                       1e30f, INFINITY};
    int nv = (int)(sizeof v / sizeof v[0]);
    for (int i = 0; i + 1 < nv; i++) ck_assert_uint_lt(topk_key(v[i]), topk_key(v[i + 1]));
    ck_assert_uint_eq(topk_key(-0.0f), topk_key(0.0f));
    /* composite: higher key first; equal keys, lower position first */
    ck_assert(topk_composite(topk_key(1.0f), 9) > topk_composite(topk_key(0.5f), 0));
    ck_assert(topk_composite(topk_key(1.0f), 3) > topk_composite(topk_key(1.0f), 4));
    ck_assert_int_eq(topk_composite_pos(topk_composite(topk_key(-7.0f), 123456)), 123456);
}
END_TEST

/* ---- counting sort work list ---- */

START_TEST(test_scan_groups)
{
    enum { H = 3, M = 5, QB = 4 };
    int counts[H * M] = {0, 9, 4, 0, 1, 13, 0, 0, 0, 0, 1, 2, 3, 4, 5};
    int starts[H * M], cs[H * M + 1];
    mita_scan_groups(starts, cs, counts, H, M, QB);
    int chunks = 0;
    for (int h = 0; h < H; h++) {
        int pos = 0;
        for (int e = 0; e < M; e++) {
            ck_assert_int_eq(starts[h * M + e], pos);
            ck_assert_int_eq(cs[h * M + e], chunks);
            pos += counts[h * M + e];
            chunks += (counts[h * M + e] + QB - 1) / QB;
        }
    }
    ck_assert_int_eq(cs[H * M], chunks);
    /* every work item maps to the non-empty group that owns it */
    for (int b = 0; b < chunks; b++) {
        int g = mita_find_group(cs, H * M, b);
        ck_assert_int_gt(counts[g], 0);
        ck_assert_int_le(cs[g], b);
        ck_assert_int_lt(b, cs[g + 1]);
    }
}
END_TEST

/* ---- MiTA: the whole GPU pipeline, emulated, against op_mita on the CPU ---- */

#define EMU_QB 4 /* small query chunks and key tiles so chunking and tiling run */
#define EMU_KT 3

typedef struct {
    int hp, wp, c, heads, gh, gw, k;
    bool shd;
} mita_case;

static void emu_mita(float *out, int32_t *route, int32_t *topk, float *mass, int *empty_groups,
                     const float *qkv, const mita_case *t)
{
    const int n = t->hp * t->wp, c = t->c, c3 = 3 * c, heads = t->heads, m = t->gh * t->gw;
    const int d = c / heads, k = t->k;
    const float s = mita_scale(d), sh = mita_shared_scale(d, t->shd);
    float *land = calloc((size_t)m * c, sizeof(float));
    float *probe = calloc((size_t)heads * m * n, sizeof(float));
    float *rs = calloc((size_t)heads * n * m, sizeof(float));
    float *sv = calloc((size_t)heads * m * d, sizeof(float));
    int *counts = calloc((size_t)heads * m, sizeof(int)), *cursor = calloc((size_t)heads * m, sizeof(int));
    int *starts = calloc((size_t)heads * m, sizeof(int)), *cs = calloc((size_t)heads * m + 1, sizeof(int));
    int *order = calloc((size_t)heads * n, sizeof(int)), *seen = calloc((size_t)heads * n, sizeof(int));
    float *ks = calloc((size_t)EMU_KT * d, sizeof(float)), *vs = calloc((size_t)EMU_KT * d, sizeof(float));
    float *acc = calloc((size_t)d, sizeof(float));
    ck_assert(land && probe && rs && sv && counts && cursor && starts && cs && order && seen && ks &&
              vs && acc);

    /* landmark_kernel: one thread per (landmark, channel) */
    for (int mi = 0; mi < m; mi++)
        for (int ch = 0; ch < c; ch++)
            land[(size_t)mi * c + ch] =
                mita_landmark_value(qkv, t->hp, t->wp, c3, ch, mi / t->gw, mi % t->gw, t->gh, t->gw);
    /* probe and routing GEMMs (cuBLAS on the GPU) */
    for (int h = 0; h < heads; h++)
        for (int mi = 0; mi < m; mi++)
            for (int j = 0; j < n; j++) {
                const float *l = land + (size_t)mi * c + h * d;
                const float *kr = qkv + (size_t)j * c3 + c + h * d;
                const float *qr = qkv + (size_t)j * c3 + h * d;
                float pk = 0.0f, pq = 0.0f;
                for (int i = 0; i < d; i++) {
                    pk += l[i] * kr[i];
                    pq += l[i] * qr[i];
                }
                probe[((size_t)h * m + mi) * n + j] = pk;
                rs[((size_t)h * n + j) * m + mi] = pq;
            }
    /* topk_kernel */
    for (int r = 0; r < heads * m; r++) emu_topk(topk + (size_t)r * k, probe + (size_t)r * n, n, k);
    /* summary_softmax_kernel: 4 threads' partial (max, sum), merged as the
     * block merge does, then the write pass */
    for (int r = 0; r < heads * m; r++) {
        float *p = probe + (size_t)r * n;
        float pm[4], pl[4];
        for (int th = 0; th < 4; th++) {
            pm[th] = -INFINITY;
            pl[th] = 0.0f;
            for (int j = th; j < n; j += 4) softmax_stats_push(&pm[th], &pl[th], p[j] * s);
        }
        float mm = pm[0], ll = pl[0], c1, c2;
        for (int th = 1; th < 4; th++) softmax_merge(&mm, &ll, &c1, &c2, mm, ll, pm[th], pl[th]);
        for (int j = 0; j < n; j++) p[j] = expf(p[j] * s - mm) / ll;
    }
    /* summary GEMM */
    for (int h = 0; h < heads; h++)
        for (int mi = 0; mi < m; mi++)
            for (int i = 0; i < d; i++) {
                float a = 0.0f;
                for (int j = 0; j < n; j++)
                    a += probe[((size_t)h * m + mi) * n + j] * qkv[(size_t)j * c3 + 2 * c + h * d + i];
                sv[((size_t)h * m + mi) * d + i] = a;
            }
    /* route_kernel, scan_kernel, scatter_kernel */
    for (int tq = 0; tq < heads * n; tq++) {
        int e = argmax_first(rs + (size_t)tq * m, m, 1);
        route[tq] = e;
        counts[(tq / n) * m + e]++;
    }
    mita_scan_groups(starts, cs, counts, heads, m, EMU_QB);
    for (int tq = 0; tq < heads * n; tq++) {
        int h = tq / n, g = h * m + route[tq];
        order[(size_t)h * n + starts[g] + cursor[g]++] = tq % n;
    }
    *empty_groups = 0;
    for (int g = 0; g < heads * m; g++) *empty_groups += counts[g] == 0;
    /* routed_kernel: blocks of the bounding grid, threads as a loop */
    int grid = heads * ((n + EMU_QB - 1) / EMU_QB + m);
    for (int b = 0; b < grid; b++) {
        if (b >= cs[heads * m]) continue;
        int g = mita_find_group(cs, heads * m, b);
        int h = g / m, q0 = (b - cs[g]) * EMU_QB;
        int nq = counts[g] - q0 < EMU_QB ? counts[g] - q0 : EMU_QB;
        ck_assert_int_gt(nq, 0);
        for (int tid = 0; tid < nq; tid++) {
            int qi = order[(size_t)h * n + starts[g] + q0 + tid];
            seen[(size_t)h * n + qi]++;
            const float *q = qkv + (size_t)qi * c3 + h * d;
            float mx, l;
            osm_init(&mx, &l, acc, d);
            mita_query_shared(&mx, &l, acc, rs + ((size_t)h * n + qi) * m, m, sh,
                              sv + (size_t)h * m * d, d);
            float m_sh = mx, l_sh = l;
            const int32_t *ids = topk + (size_t)g * k;
            for (int t0 = 0; t0 < k; t0 += EMU_KT) {
                int nt = k - t0 < EMU_KT ? k - t0 : EMU_KT;
                for (int i = 0; i < nt * d; i++) {
                    int j = i / d, ch = i % d;
                    ks[i] = qkv[(size_t)ids[t0 + j] * c3 + c + h * d + ch];
                    vs[i] = qkv[(size_t)ids[t0 + j] * c3 + 2 * c + h * d + ch];
                }
                osm_query_keys(&mx, &l, acc, q, ks, vs, nt, d, s);
            }
            osm_finish(out + (size_t)qi * c + h * d, mass + (size_t)h * n + qi, mx, l, m_sh,
                       l_sh, acc, d);
        }
    }
    for (int i = 0; i < heads * n; i++) ck_assert_int_eq(seen[i], 1);
    free(land); free(probe); free(rs); free(sv); free(counts); free(cursor); free(starts);
    free(cs); free(order); free(seen); free(ks); free(vs); free(acc);
}

START_TEST(test_mita_pipeline)
{
    const mita_case cases[] = {
        {5, 7, 16, 2, 3, 3, 4, true},     /* small, d = 8 */
        {2, 3, 8, 1, 2, 2, 6, false},     /* k = n */
        {9, 11, 32, 2, 7, 7, 49, true},   /* default M and k, n = 99: empty experts */
        {13, 10, 24, 3, 4, 5, 17, false}, /* d = 8, overlapping windows */
        {1, 1, 4, 1, 1, 1, 1, true},      /* one token */
    };
    int empty_total = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const mita_case *t = &cases[ci];
        int n = t->hp * t->wp, m = t->gh * t->gw;
        size_t nqkv = (size_t)n * 3 * t->c;
        float *qkv = malloc(nqkv * sizeof(float));
        float *out = calloc((size_t)n * t->c, sizeof(float)), *ref = calloc((size_t)n * t->c, sizeof(float));
        float *mass = calloc((size_t)t->heads * n, sizeof(float)), *rmass = calloc((size_t)t->heads * n, sizeof(float));
        int32_t *route = calloc((size_t)t->heads * n, 4), *rroute = calloc((size_t)t->heads * n, 4);
        int32_t *topk = calloc((size_t)t->heads * m * t->k, 4), *rtopk = calloc((size_t)t->heads * m * t->k, 4);
        ck_assert(qkv && out && ref && mass && rmass && route && rroute && topk && rtopk);
        rand_fill(qkv, nqkv, 7 + (uint32_t)ci, -1.5f, 1.5f);

        int empty = 0;
        emu_mita(out, route, topk, mass, &empty, qkv, t);
        empty_total += empty;

        ms_backend be = cpu_backend();
        ms_mita_params p = {t->gh, t->gw, t->k, t->shd};
        ms_mita_record rec = {rtopk, rroute, rmass};
        ck_assert_int_eq(op_mita(&be, ref, qkv, t->hp, t->wp, t->c, t->heads, &p, &rec), MS_OK);

        for (int i = 0; i < t->heads * m * t->k; i++)
            ck_assert_msg(topk[i] == rtopk[i], "case %zu: topk[%d] %d vs cpu %d", ci, i, topk[i],
                          rtopk[i]);
        for (int i = 0; i < t->heads * n; i++)
            ck_assert_msg(route[i] == rroute[i], "case %zu: route[%d] %d vs cpu %d", ci, i,
                          route[i], rroute[i]);
        /* FP32 throughout, only summation orders differ: 1e-5 of the range */
        check_close(out, ref, (size_t)n * t->c, 1e-5, "mita out");
        check_close(mass, rmass, (size_t)t->heads * n, 1e-5, "mita shared mass");
        free(qkv); free(out); free(ref); free(mass); free(rmass);
        free(route); free(rroute); free(topk); free(rtopk);
    }
    ck_assert_int_gt(empty_total, 0); /* experts with no query were exercised */
}
END_TEST

/* ---- full attention: the flash kernel's per-query loop ---- */

START_TEST(test_flash_query)
{
    const int shapes[][3] = {{1, 8, 1}, {13, 24, 3}, {130, 64, 1}, {70, 32, 2}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int n = shapes[si][0], c = shapes[si][1], heads = shapes[si][2], d = c / heads;
        float *qkv = malloc((size_t)n * 3 * c * sizeof(float));
        float *out = calloc((size_t)n * c, sizeof(float)), *ref = calloc((size_t)n * c, sizeof(float));
        float *ks = malloc((size_t)EMU_KT * d * sizeof(float)), *vs = malloc((size_t)EMU_KT * d * sizeof(float));
        float *acc = malloc((size_t)d * sizeof(float));
        ck_assert(qkv && out && ref && ks && vs && acc);
        rand_fill(qkv, (size_t)n * 3 * c, 31 + (uint32_t)si, -2.0f, 2.0f);
        float s = mita_scale(d);
        for (int h = 0; h < heads; h++)
            for (int qi = 0; qi < n; qi++) {
                float mx, l;
                osm_init(&mx, &l, acc, d);
                for (int k0 = 0; k0 < n; k0 += EMU_KT) {
                    int nt = n - k0 < EMU_KT ? n - k0 : EMU_KT;
                    for (int i = 0; i < nt * d; i++) {
                        const float *row = qkv + (size_t)(k0 + i / d) * 3 * c + h * d + i % d;
                        ks[i] = row[c];
                        vs[i] = row[2 * c];
                    }
                    osm_query_keys(&mx, &l, acc, qkv + (size_t)qi * 3 * c + h * d, ks, vs, nt, d, s);
                }
                osm_finish(out + (size_t)qi * c + h * d, NULL, mx, l, mx, 0.0f, acc, d);
            }
        ms_backend be = cpu_backend();
        ck_assert_int_eq(op_attention_full(&be, ref, qkv, n, c, heads), MS_OK);
        check_close(out, ref, (size_t)n * c, 1e-5, "flash out");
        free(qkv); free(out); free(ref); free(ks); free(vs); free(acc);
    }
}
END_TEST

/* ---- image kernels: one helper call per output element ---- */

START_TEST(test_image_pixels)
{
    ms_backend be = cpu_backend();
    enum { C = 3, H = 13, W = 9 };
    float in[C * H * W];
    rand_fill(in, C * H * W, 5, -4.0f, 4.0f);

    /* adaptive avg pool, overlapping windows and grids up to the input size */
    const int grids[][2] = {{4, 5}, {7, 7}, {13, 9}, {1, 1}};
    for (size_t gi = 0; gi < 4; gi++) {
        int gh = grids[gi][0], gw = grids[gi][1];
        float ref[C * H * W], got[C * H * W];
        ck_assert_int_eq(op_adaptive_avgpool(&be, ref, in, C, H, W, gh, gw), MS_OK);
        for (int ch = 0; ch < C; ch++)
            for (int i = 0; i < gh; i++)
                for (int j = 0; j < gw; j++)
                    got[(ch * gh + i) * gw + j] = adaptive_pool_pixel(in + ch * H * W, H, W, gh, gw, i, j);
        check_close(got, ref, (size_t)C * gh * gw, 1e-6, "adaptive pool");
    }
    { /* 2x2 max pool, odd sizes (floor) */
        float ref[C * (H / 2) * (W / 2)], got[C * (H / 2) * (W / 2)];
        ck_assert_int_eq(op_maxpool2x2(&be, ref, in, C, H, W), MS_OK);
        for (int ch = 0; ch < C; ch++)
            for (int y = 0; y < H / 2; y++)
                for (int x = 0; x < W / 2; x++)
                    got[(ch * (H / 2) + y) * (W / 2) + x] = maxpool2x2_pixel(in + ch * H * W, W, y, x);
        check_close(got, ref, sizeof got / sizeof got[0], 0.0, "maxpool");
    }
    /* resizes: to sizes (up and down) and by scale factors */
    const int sizes[][2] = {{27, 20}, {5, 4}, {13, 9}, {1, 1}};
    for (size_t si = 0; si < 4; si++) {
        int ho = sizes[si][0], wo = sizes[si][1];
        float *ref = malloc((size_t)C * ho * wo * sizeof(float)), *got = malloc((size_t)C * ho * wo * sizeof(float));
        ck_assert(ref && got);
        for (int cubic = 0; cubic < 2; cubic++) {
            double sc = 0.0;
            if (cubic) ck_assert_int_eq(op_resize_bicubic(&be, ref, in, C, H, W, ho, wo), MS_OK);
            else ck_assert_int_eq(op_resize_bilinear(&be, ref, in, C, H, W, ho, wo, sc, sc), MS_OK);
            float rh = resize_ratio(H, ho, sc), rw = resize_ratio(W, wo, sc);
            for (int ch = 0; ch < C; ch++)
                for (int y = 0; y < ho; y++)
                    for (int x = 0; x < wo; x++)
                        got[((size_t)ch * ho + y) * wo + x] =
                            cubic ? bicubic_pixel(in + ch * H * W, H, W, rh, rw, y, x)
                                  : bilinear_pixel(in + ch * H * W, H, W, rh, rw, y, x);
            check_close(got, ref, (size_t)C * ho * wo, 1e-6, cubic ? "bicubic" : "bilinear");
        }
        free(ref);
        free(got);
    }
    { /* bilinear by scale factor 2 (ho = floor(h * 2)) */
        int ho = 2 * H, wo = 2 * W;
        float *ref = malloc((size_t)C * ho * wo * sizeof(float)), *got = malloc((size_t)C * ho * wo * sizeof(float));
        ck_assert(ref && got);
        ck_assert_int_eq(op_resize_bilinear(&be, ref, in, C, H, W, ho, wo, 2.0, 2.0), MS_OK);
        float rh = resize_ratio(H, ho, 2.0), rw = resize_ratio(W, wo, 2.0);
        for (int ch = 0; ch < C; ch++)
            for (int y = 0; y < ho; y++)
                for (int x = 0; x < wo; x++)
                    got[((size_t)ch * ho + y) * wo + x] = bilinear_pixel(in + ch * H * W, H, W, rh, rw, y, x);
        check_close(got, ref, (size_t)C * ho * wo, 1e-6, "bilinear scale");
        free(ref);
        free(got);
    }
    { /* normalize_pad */
        enum { HP = 16, WP = 12 };
        float img[3 * H * W], ref[3 * HP * WP], got[3 * HP * WP];
        rand_fill(img, 3 * H * W, 9, 0.0f, 255.0f);
        const float mean[3] = {123.675f, 116.28f, 103.53f}, stdv[3] = {58.395f, 57.12f, 57.375f};
        ck_assert_int_eq(op_normalize_pad(&be, ref, img, H, W, HP, WP, mean, stdv), MS_OK);
        for (int ch = 0; ch < 3; ch++)
            for (int y = 0; y < HP; y++)
                for (int x = 0; x < WP; x++)
                    got[(ch * HP + y) * WP + x] = normalize_pad_pixel(img, H, W, ch, y, x, mean[ch], stdv[ch]);
        check_close(got, ref, 3 * HP * WP, 1e-6, "normalize_pad");
    }
}
END_TEST

START_TEST(test_convt_scatter)
{
    ms_backend be = cpu_backend();
    enum { CI = 5, CO = 3, H = 4, W = 7 };
    float in[CI * H * W], w[CI * CO * 4], b[CO], g[4 * CO * H * W];
    float ref[CO * 4 * H * W], got[CO * 4 * H * W];
    rand_fill(in, CI * H * W, 11, -1.0f, 1.0f);
    rand_fill(w, CI * CO * 4, 12, -1.0f, 1.0f);
    rand_fill(b, CO, 13, -1.0f, 1.0f);
    /* the GEMM G = W^T X of conv_transpose2x2_cuda */
    for (int r = 0; r < 4 * CO; r++)
        for (int p = 0; p < H * W; p++) {
            float a = 0.0f;
            for (int ci = 0; ci < CI; ci++) a += w[ci * 4 * CO + r] * in[ci * H * W + p];
            g[r * H * W + p] = a;
        }
    for (int act = 0; act < 3; act++)
        for (int withb = 0; withb < 2; withb++) {
            const float *bb = withb ? b : NULL;
            ck_assert_int_eq(op_conv_transpose2x2(&be, ref, in, w, bb, CI, H, W, CO, (ms_act)act), MS_OK);
            for (long t = 0; t < CO * 4 * H * W; t++) got[t] = convt2x2_pixel(g, bb, H, W, t, (ms_act)act);
            check_close(got, ref, CO * 4 * H * W, 1e-5, "conv_transpose2x2");
        }
}
END_TEST

/* ---- f32_to_bf16_kernel (linear's BF16 operands): bf16_from_f32 ---- */

static float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Independent reference for finite and infinite x: the two BF16 neighbours
 * of |x| by exact distance (doubles hold both values and their difference
 * exactly), the nearer one, at a tie the one with an even last mantissa
 * bit. Above the largest finite BF16 the upper neighbour is 2^128, whose
 * bits are infinity's: IEEE's overflow rule under round-to-nearest-even. */
static uint16_t bf16_reference(uint32_t u)
{
    float x = f32_of_bits(u);
    if (isinf(x)) return (uint16_t)(u >> 16);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint16_t lo = (uint16_t)((u & 0x7FFFFFFFu) >> 16); /* truncation: |lo| <= |x| */
    double ax = fabs((double)x), vlo = (double)f32_of_bits((uint32_t)lo << 16);
    int e = (lo >> 7) & 0xFF; /* the binade's spacing; subnormals share e = 1's */
    double vhi = vlo + ldexp(1.0, (e ? e : 1) - 127 - 7);
    uint16_t hi = (uint16_t)(lo + 1);
    double dlo = ax - vlo, dhi = vhi - ax;
    uint16_t r = dlo < dhi ? lo : (dhi < dlo ? hi : ((lo & 1) ? hi : lo));
    return (uint16_t)(r | sign);
}

static void check_bf16(uint32_t u)
{
    uint16_t got = bf16_from_f32(f32_of_bits(u));
    if (isnan(f32_of_bits(u))) { /* any NaN, same sign */
        ck_assert_msg((got & 0x7F80u) == 0x7F80u && (got & 0x7Fu) != 0 &&
                          (got & 0x8000u) == ((u >> 16) & 0x8000u),
                      "bf16(NaN %08x) = %04x", u, got);
        return;
    }
    uint16_t want = bf16_reference(u);
    ck_assert_msg(got == want, "bf16(%08x = %a) = %04x, want %04x", u, (double)f32_of_bits(u),
                  got, want);
}

/* mita_cuda takes n * 3c past 2^31 (ViT-B, c = 768, from 932K tokens): the
 * index math the kernels share, at such a size. A 1024 x 1024 token grid at
 * c = 768 is 2.4e9 floats (9.7 GB): mapped without reserving memory, only the
 * pages the test writes are backed; the rest reads as zeros. */
START_TEST(test_mita_index_64bit)
{
    const int hp = 1024, wp = 1024, c = 768, c3 = 3 * c, gh = 64, gw = 64;
    const long n = (long)hp * wp;
    ck_assert((double)n * c3 > (double)INT32_MAX);
    /* exact offsets past 2^31 (the last token's last v channel) */
    ck_assert_uint_eq(mita_qkv_index(n - 1, c3, c3 - 1), (size_t)2415919103ull);
    ck_assert_uint_eq(mita_qkv_index(932000, c3, 2 * c), (size_t)932000 * 2304 + 1536);
    size_t bytes = (size_t)n * c3 * sizeof(float);
    float *qkv = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (qkv == MAP_FAILED) {
        printf("note: cannot map %zu bytes of address space; 64-bit index case not run\n", bytes);
        return;
    }
    /* the last landmark's window: tokens (1008..1023, 1008..1023); q channel
     * c - 1 there holds its token's row number; everywhere else zeros */
    const int ch = c - 1;
    double want = 0;
    for (int y = 1008; y < 1024; y++)
        for (int x = 1008; x < 1024; x++) {
            qkv[mita_qkv_index((long)y * wp + x, c3, ch)] = (float)y;
            want += y;
        }
    want /= 16.0 * 16.0;
    float got = mita_landmark_value(qkv, hp, wp, c3, ch, gh - 1, gw - 1, gh, gw);
    ck_assert_double_eq_tol(got, want, 1e-3);
    /* a landmark whose window holds none of them reads the zeros */
    ck_assert_float_eq(mita_landmark_value(qkv, hp, wp, c3, ch, 0, 0, gh, gw), 0.0f);
    munmap(qkv, bytes);
}
END_TEST

START_TEST(test_bf16_round)
{
    /* hand-checked cases: ties to even, subnormals, overflow, NaN */
    const struct { uint32_t in; uint16_t out; } fixed[] = {
        {0x00000000u, 0x0000}, {0x80000000u, 0x8000}, {0x3F800000u, 0x3F80},
        {0x3F808000u, 0x3F80}, /* 1 + 2^-8: tie, kept part even: down */
        {0x3F818000u, 0x3F82}, /* tie, kept part odd: up */
        {0x3F808001u, 0x3F81}, {0x3F807FFFu, 0x3F80}, {0xBF818000u, 0xBF82},
        {0x00000001u, 0x0000}, /* smallest subnormal */
        {0x00008000u, 0x0000}, {0x00018000u, 0x0002}, {0x00008001u, 0x0001},
        {0x007FFFFFu, 0x0080}, /* largest subnormal rounds up to the smallest normal */
        {0x807FFFFFu, 0x8080},
        {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX overflows to infinity */
        {0x7F7F8000u, 0x7F80}, /* tie above the largest finite BF16 (odd): infinity */
        {0x7F7F7FFFu, 0x7F7F}, {0x7F800000u, 0x7F80}, {0xFF800000u, 0xFF80},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        uint16_t got = bf16_from_f32(f32_of_bits(fixed[i].in));
        ck_assert_msg(got == fixed[i].out, "bf16(%08x) = %04x, want %04x", fixed[i].in, got,
                      fixed[i].out);
        check_bf16(fixed[i].in); /* and the reference agrees with the hand values */
        ck_assert_int_eq(bf16_reference(fixed[i].in), fixed[i].out);
    }
    const uint32_t nans[] = {0x7FC00000u, 0x7F800001u, 0x7FBFFFFFu, 0xFFFFFFFFu, 0xFF800001u,
                             0x7F80FFFFu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) check_bf16(nans[i]);
    /* every BF16 value's neighbourhood: exact, just below/at/above the tie,
     * and the top of the interval, for all 65536 upper halves (every sign,
     * exponent incl. subnormals, infinities and NaNs) */
    const uint32_t lows[] = {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu};
    for (uint32_t hi = 0; hi < 0x10000u; hi++)
        for (size_t j = 0; j < sizeof lows / sizeof lows[0]; j++) check_bf16(hi << 16 | lows[j]);
    /* and random bit patterns */
    uint32_t r = 0x2545F491u;
    for (int i = 0; i < 200000; i++) {
        r ^= r << 13;
        r ^= r >> 17;
        r ^= r << 5;
        check_bf16(r);
    }
}
END_TEST

static Suite *kernel_math_suite(void)
{
    Suite *s = suite_create("kernel_math");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_topk_key_order);
    tcase_add_test(tc, test_topk_select);
    tcase_add_test(tc, test_scan_groups);
    tcase_add_test(tc, test_mita_pipeline);
    tcase_add_test(tc, test_flash_query);
    tcase_add_test(tc, test_image_pixels);
    tcase_add_test(tc, test_convt_scatter);
    tcase_add_test(tc, test_bf16_round);
    tcase_add_test(tc, test_mita_index_64bit);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return run_suite(kernel_math_suite()); }
