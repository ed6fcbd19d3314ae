/* MiTA attention on the GPU (spec section 2), one layer, all heads at once:
 *
 *   landmarks    L = adaptive_avgpool(q)                 landmark_kernel
 *   probe        P_h = L_h K_h^T        (M x N)           strided-batched GEMM
 *   routed sets  top-k of each P row                      topk_kernel (block per row)
 *   summaries    Sv_h = softmax_n(P_h s) V_h (M x d)      summary_softmax_kernel + GEMM
 *   routing      R_h = Q_h L_h^T        (N x M), argmax   GEMM + route_kernel
 *   grouping     counting sort of queries by expert       route/scan/scatter kernels
 *   output       joint softmax over M + k logits          routed_kernel (block per
 *                                                         expert chunk, K/V staged)
 *
 * The GEMMs are FP32 in both backend modes: with K = d = 64 and outputs of
 * M x N they do ~14 FLOP per byte, memory-bound even on FP32 CUDA cores, so
 * BF16 would save nothing and would move the top-k and routing decisions
 * (the viewer's records) away from the CPU's. Per-thread arithmetic lives in
 * kernels/mita_cuda_math.h (tested on the CPU). Nothing synchronises. */
#include "cuda_check.h"
#include "mita_cuda_math.h"

#include <float.h>

#define MITA_TOPK_THREADS 512
#define MITA_SOFTMAX_THREADS 512
#define MITA_ROUTED_QB 128 /* queries per routed block (one thread each) */
#define MITA_KT_MAX 64     /* routed keys staged per tile */
/* The summary GEMM (M x d outputs, reduction over N) is split into chunks of
 * N: a GEMM with a 256K-long reduction and 49 x 64 outputs per head would
 * otherwise run on a handful of blocks unless cuBLAS picks split-K. */
#define MITA_SV_CHUNK 4096

/* Scratch layout (offsets in bytes, each part 256-aligned). */
struct mita_layout {
    size_t land, probe, route_s, sv, idx, route, counts, cursor, starts, chunks, order, cand;
    size_t mass; /* shared mass in sequence order, before mita_report_pos */
    size_t part; /* split-N partial summaries */
    size_t total;
};

static mita_layout mita_plan(int n, int c, int heads, int m, int k)
{
    mita_layout L;
    size_t o = 0;
    size_t hm = (size_t)heads * m, hn = (size_t)heads * n;
    L.land = o;    o += cuda_align256((size_t)m * c * sizeof(float));
    L.probe = o;   o += cuda_align256(hm * n * sizeof(float));
    L.route_s = o; o += cuda_align256(hn * m * sizeof(float));
    L.sv = o;      o += cuda_align256((size_t)m * c * sizeof(float));
    L.idx = o;     o += cuda_align256(hm * k * sizeof(int32_t));
    L.route = o;   o += cuda_align256(hn * sizeof(int32_t));
    L.counts = o;  o += cuda_align256(hm * sizeof(int));
    L.cursor = o;  o += cuda_align256(hm * sizeof(int));
    L.starts = o;  o += cuda_align256(hm * sizeof(int));
    L.chunks = o;  o += cuda_align256((hm + 1) * sizeof(int));
    L.order = o;   o += cuda_align256(hn * sizeof(int));
    L.mass = o;    o += cuda_align256(hn * sizeof(float));
    L.cand = o;    o += k > MS_TOPK_SMEM ? cuda_align256(hm * k * sizeof(uint64_t)) : 0;
    size_t nch = ((size_t)n + MITA_SV_CHUNK - 1) / MITA_SV_CHUNK;
    L.part = o;    o += nch > 1 ? cuda_align256(hm * nch * (c / heads) * sizeof(float)) : 0;
    L.total = o;
    return L;
}

extern "C" size_t mita_cuda_scratch_bytes(int hp, int wp, int ncls, int c, int heads, int gh,
                                          int gw, int k)
{
    return mita_plan(ncls + hp * wp, c, heads, gh * gw, k).total;
}

/* ---- kernels ---- */

__global__ void landmark_kernel(float *land /* (m, c) */, const float *qkv, int hp, int wp, int c,
                                int gh, int gw)
{
    long total = (long)gh * gw * c;
    for (long t = blockIdx.x * (long)blockDim.x + threadIdx.x; t < total;
         t += (long)gridDim.x * blockDim.x) {
        int ch = (int)(t % c);
        int mi = (int)(t / c);
        land[t] = mita_landmark_value(qkv, hp, wp, 3 * c, ch, mi / gw, mi % gw, gh, gw);
    }
}

/* Block-wide exclusive scan of two flags (ballots per warp, warp offsets
 * through shared memory). Returns this thread's prefixes and the totals. */
__device__ void block_scan2(int fa, int fb, int *pa, int *pb, int *ta, int *tb, int *s_wa,
                            int *s_wb)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    unsigned ba = __ballot_sync(0xFFFFFFFFu, fa), bb = __ballot_sync(0xFFFFFFFFu, fb);
    unsigned below = (1u << lane) - 1u;
    if (lane == 0) {
        s_wa[warp] = __popc(ba);
        s_wb[warp] = __popc(bb);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int ra = 0, rb = 0;
        for (int w = 0; w < nw; w++) {
            int xa = s_wa[w], xb = s_wb[w];
            s_wa[w] = ra;
            s_wb[w] = rb;
            ra += xa;
            rb += xb;
        }
        s_wa[32] = ra;
        s_wb[32] = rb;
    }
    __syncthreads();
    *pa = s_wa[warp] + __popc(ba & below);
    *pb = s_wb[warp] + __popc(bb & below);
    *ta = s_wa[32];
    *tb = s_wb[32];
    __syncthreads(); /* s_wa/s_wb are reused by the next call */
}

/* One block per (head, landmark) row of P: exact top-k (descending score,
 * ties to the lower position). Radix select over the 32-bit order keys finds
 * the k-th largest key T in 4 passes; an ordered compaction takes every key
 * > T and the lowest-positioned keys == T; a bitonic sort orders them. */
__global__ void __launch_bounds__(MITA_TOPK_THREADS)
    topk_kernel(int32_t *idx_out /* (rows, k) */, uint64_t *gcand /* (rows, k) or NULL */,
                const float *probe /* (rows, n) */, int n, int k)
{
    MS_SHARED_DYN(uint64_t, s_cand);
    __shared__ unsigned hist[256];
    __shared__ int s_digit, s_need;
    __shared__ int s_wa[33], s_wb[33];
    const int row = blockIdx.x, tid = threadIdx.x, bd = blockDim.x;
    const float *p = probe + (size_t)row * n;

    uint32_t prefix = 0, mask = 0;
    int need = k;
    for (int pass = 0; pass < 4; pass++) {
        int shift = 24 - 8 * pass;
        for (int i = tid; i < 256; i += bd) hist[i] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += bd) {
            uint32_t u = topk_key(p[i]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            int nd = need;
            s_digit = topk_pick_digit(hist, &nd);
            s_need = nd;
        }
        __syncthreads();
        prefix |= (uint32_t)s_digit << shift;
        mask |= 255u << shift;
        need = s_need;
    }
    const uint32_t thr = prefix;
    const int take_eq = need, n_gt = k - need;
    uint64_t *cand = k <= MS_TOPK_SMEM ? s_cand : gcand + (size_t)row * k;

    int base_gt = 0, base_eq = 0;
    for (int c0 = 0; c0 < n; c0 += bd) {
        int i = c0 + tid;
        uint32_t u = i < n ? topk_key(p[i]) : 0u;
        int gt = i < n && u > thr, eq = i < n && u == thr;
        int pg, pe, tg, te;
        block_scan2(gt, eq, &pg, &pe, &tg, &te, s_wa, s_wb);
        if (gt) cand[base_gt + pg] = topk_composite(u, i);
        if (eq && base_eq + pe < take_eq) cand[n_gt + base_eq + pe] = topk_composite(u, i);
        base_gt += tg;
        base_eq += te;
        if (base_gt >= n_gt && base_eq >= take_eq) break; /* uniform across the block */
    }
    __syncthreads();
    int32_t *dst = idx_out + (size_t)row * k;
    if (k <= MS_TOPK_SMEM) {
        int n2 = next_pow2(k);
        for (int i = k + tid; i < n2; i += bd) cand[i] = 0; /* sorts last */
        __syncthreads();
        for (int size = 2; size <= n2; size <<= 1)
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                for (int i = tid; i < n2 / 2; i += bd) bitonic_step_desc(cand, size, stride, i);
                __syncthreads();
            }
        for (int i = tid; i < k; i += bd) dst[i] = topk_composite_pos(cand[i]);
    } else {
        /* Rank sort: the composites are distinct, so ranks are a permutation. */
        __threadfence_block();
        for (int i = tid; i < k; i += bd) {
            uint64_t v = cand[i];
            int r = 0;
            for (int j = 0; j < k; j++) r += cand[j] > v;
            dst[r] = topk_composite_pos(v);
        }
    }
}

/* Block-wide merge of per-thread partial softmaxes (m, l). */
__device__ void block_softmax_stats(float *m, float *l, float *s_m, float *s_l)
{
    for (int off = 16; off > 0; off >>= 1) {
        float m2 = __shfl_down_sync(0xFFFFFFFFu, *m, off);
        float l2 = __shfl_down_sync(0xFFFFFFFFu, *l, off);
        float c1, c2;
        softmax_merge(m, l, &c1, &c2, *m, *l, m2, l2);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if (lane == 0) {
        s_m[warp] = *m;
        s_l[warp] = *l;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mm = s_m[0], ll = s_l[0];
        for (int w = 1; w < nw; w++) {
            float c1, c2;
            softmax_merge(&mm, &ll, &c1, &c2, mm, ll, s_m[w], s_l[w]);
        }
        s_m[32] = mm;
        s_l[32] = ll;
    }
    __syncthreads();
    *m = s_m[32];
    *l = s_l[32];
}

/* One block per (head, landmark) row: P <- softmax_n(P s) in place, the
 * max and sum streamed in one pass (online softmax), then one write pass. */
__global__ void __launch_bounds__(MITA_SOFTMAX_THREADS)
    summary_softmax_kernel(float *probe /* (rows, n) */, int n, float s)
{
    __shared__ float s_m[33], s_l[33];
    float *p = probe + (size_t)blockIdx.x * n;
    float m = -INFINITY, l = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) softmax_stats_push(&m, &l, p[i] * s);
    block_softmax_stats(&m, &l, s_m, s_l);
    float inv = 1.0f / l;
    for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = expf(p[i] * s - m) * inv;
}

/* Sv[h, m, i] = sum over chunks of the split-N partial summaries. */
__global__ void sv_reduce_kernel(float *sv /* (heads, m, d) */,
                                 const float *part /* (heads, chunks, m, d) */, int heads,
                                 int chunks, int md)
{
    long total = (long)heads * md;
    for (long t = blockIdx.x * (long)blockDim.x + threadIdx.x; t < total;
         t += (long)gridDim.x * blockDim.x) {
        long h = t / md, r = t - h * md;
        const float *p = part + (size_t)h * chunks * md + r;
        float a = 0.0f;
        for (int ch = 0; ch < chunks; ch++) a += p[(size_t)ch * md];
        sv[t] = a;
    }
}

/* Top-1 routing (ties to the lower expert) and the per-group histogram. */
__global__ void route_kernel(int32_t *route /* (heads, n) */, int *counts /* (heads, m) */,
                             const float *rs /* (heads, n, m) */, int heads, int n, int m)
{
    long total = (long)heads * n;
    for (long t = blockIdx.x * (long)blockDim.x + threadIdx.x; t < total;
         t += (long)gridDim.x * blockDim.x) {
        int e = argmax_first(rs + t * m, m, 1);
        route[t] = e;
        atomicAdd(&counts[(t / n) * m + e], 1);
    }
}

__global__ void scan_kernel(int *starts, int *chunk_starts, int *cursor, const int *counts,
                            int heads, int m, int qb)
{
    mita_scan_groups(starts, chunk_starts, counts, heads, m, qb);
    for (int g = 0; g < heads * m; g++) cursor[g] = 0;
}

/* Counting sort's scatter: order[h, starts[g] + j] = the j-th query of group
 * g (j by arrival; the order within a group does not change any result). */
__global__ void scatter_kernel(int *order /* (heads, n) */, int *cursor, const int32_t *route,
                               const int *starts, int heads, int n, int m)
{
    long total = (long)heads * n;
    for (long t = blockIdx.x * (long)blockDim.x + threadIdx.x; t < total;
         t += (long)gridDim.x * blockDim.x) {
        int h = (int)(t / n), q = (int)(t % n);
        int g = h * m + route[t];
        int pos = atomicAdd(&cursor[g], 1);
        order[(size_t)h * n + starts[g] + pos] = q;
    }
}

/* One block per chunk of up to blockDim queries routed to one (head, expert):
 * stages the M summaries (tiles of mt, one tile unless large M x d would not
 * fit the shared memory) and the expert's keys/values (tiles of kt) in
 * shared memory; each thread runs its query's joint softmax over the M
 * shared and k routed logits. DT > 0: head dim known at compile time
 * (per-thread arrays in registers); DT == 0: any d <= MS_MITA_DMAX. */
template <int DT>
__global__ void __launch_bounds__(MITA_ROUTED_QB)
    routed_kernel(float *out /* (n, c) */, float *mass /* (heads, n) or NULL */,
                  const float *qkv /* (n, 3c) */, const float *rs /* (heads, n, m) */,
                  const float *sv_all /* (heads, m, d) */, const int32_t *idx /* (heads, m, k) */,
                  const int *order, const int *starts, const int *counts,
                  const int *chunk_starts, int heads, int n, int m, int c, int d_rt, int k,
                  int mt, int kt, float s, float sh_scale)
{
    const int d = DT > 0 ? DT : d_rt;
    MS_SHARED_DYN(float, smem);
    float *sv = smem;                     /* (mt, d) */
    float *ks = sv + (size_t)mt * d;      /* (kt, d) */
    float *vs = ks + (size_t)kt * d;      /* (kt, d) */
    const int groups = heads * m, b = blockIdx.x, tid = threadIdx.x;
    if (b >= chunk_starts[groups]) return; /* uniform: the grid is an upper bound */
    const int g = mita_find_group(chunk_starts, groups, b);
    const int h = g / m, q0 = (b - chunk_starts[g]) * blockDim.x;
    const int nq = min((int)blockDim.x, counts[g] - q0);
    const size_t c3 = 3 * (size_t)c;

    const int qi = tid < nq ? order[(size_t)h * n + starts[g] + q0 + tid] : -1;
    float q[DT > 0 ? DT : MS_MITA_DMAX], acc[DT > 0 ? DT : MS_MITA_DMAX];
    float mx, l;
    osm_init(&mx, &l, acc, d);
    if (qi >= 0) {
        const float *qr = qkv + mita_qkv_index(qi, (int)c3, (long)h * d);
        MS_UNROLL
        for (int i = 0; i < d; i++) q[i] = qr[i];
    }
    /* the same logits in the same order as one pass over all M */
    for (int e0 = 0; e0 < m; e0 += mt) {
        const int ne = min(mt, m - e0);
        __syncthreads(); /* the previous tile is consumed */
        for (int i = tid; i < ne * d; i += blockDim.x)
            sv[i] = sv_all[((size_t)h * m + e0) * d + i];
        __syncthreads();
        if (qi >= 0)
            mita_query_shared(&mx, &l, acc, rs + ((size_t)h * n + qi) * m + e0, ne, sh_scale, sv,
                              d);
    }
    const float m_sh = mx, l_sh = l;
    const int32_t *ids = idx + (size_t)g * k;
    for (int t0 = 0; t0 < k; t0 += kt) {
        int nt = min(kt, k - t0);
        __syncthreads(); /* the previous tile is consumed */
        for (int i = tid; i < nt * d; i += blockDim.x) {
            int j = i / d, ch = i - j * d;
            const float *row = qkv + mita_qkv_index(ids[t0 + j], (int)c3, (long)h * d + ch);
            ks[i] = row[c];
            vs[i] = row[2 * (size_t)c];
        }
        __syncthreads();
        if (qi >= 0) osm_query_keys(&mx, &l, acc, q, ks, vs, nt, d, s);
    }
    if (qi >= 0)
        osm_finish(out + (size_t)qi * c + (size_t)h * d, mass ? mass + (size_t)h * n + qi : NULL,
                   mx, l, m_sh, l_sh, acc, d);
}

/* With a class token the kernels work in sequence order (class token at 0);
 * the records number it N, after the grid (spec 2.7, mita_report_pos). */
__global__ void record_report_kernel(ms_mita_record rec, const int32_t *idx /* (heads, m, k) */,
                                     const int32_t *route /* (heads, n) */,
                                     const float *mass /* (heads, n) */, int heads, int n,
                                     int mk, int ncls)
{
    long n_idx = (long)heads * mk, total = n_idx + (long)heads * n;
    for (long t = blockIdx.x * (long)blockDim.x + threadIdx.x; t < total;
         t += (long)gridDim.x * blockDim.x) {
        if (t < n_idx) {
            if (rec.topk_idx) rec.topk_idx[t] = mita_report_pos(idx[t], ncls, n);
            continue;
        }
        long u = t - n_idx, h = u / n;
        size_t at = (size_t)h * n + mita_report_pos((int)(u - h * n), ncls, n);
        if (rec.route) rec.route[at] = route[u];
        if (rec.shared_mass) rec.shared_mass[at] = mass[u];
    }
}

/* ---- host ---- */

/* Stage timing for the benchmark (bench/bench_gpu_attention.c declares
 * it): when set, mita_cuda records an event after each stage, waits for the
 * last one and writes the stage times in ms. Off (NULL) by default: then
 * nothing synchronises. */
enum { MITA_STAGES = 8 };
static float *g_mita_profile;
static cudaEvent_t g_mita_ev[MITA_STAGES + 1];

extern "C" void mita_cuda_profile(float *stage_ms /* (8) or NULL */) { g_mita_profile = stage_ms; }

static ms_status prof_mark(cudaStream_t st, int i)
{
    if (!g_mita_profile) return MS_OK;
    if (!g_mita_ev[i]) CUDA_CHECK(cudaEventCreate(&g_mita_ev[i]));
    CUDA_CHECK(cudaEventRecord(g_mita_ev[i], st));
    return MS_OK;
}

static ms_status prof_finish(void)
{
    if (!g_mita_profile) return MS_OK;
    CUDA_CHECK(cudaEventSynchronize(g_mita_ev[MITA_STAGES]));
    for (int i = 0; i < MITA_STAGES; i++)
        CUDA_CHECK(cudaEventElapsedTime(&g_mita_profile[i], g_mita_ev[i], g_mita_ev[i + 1]));
    return MS_OK;
}

template <int DT>
static ms_status launch_routed(ms_cuda_ctx *cu, unsigned grid, size_t smem, float *out,
                               float *mass, const float *qkv, const float *rs, const float *sv,
                               const int32_t *idx, const int *order, const int *starts,
                               const int *counts, const int *chunks, int heads, int n, int m,
                               int c, int d, int k, int mt, int kt, float s, float sh)
{
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(routed_kernel<DT>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    MS_LAUNCH(routed_kernel<DT>, grid, MITA_ROUTED_QB, smem, cu->stream)(out, mass, qkv, rs, sv,
        idx, order, starts, counts, chunks, heads, n, m, c, d, k, mt, kt, s, sh);
    CUDA_CHECK_LAUNCH("routed_kernel");
    return MS_OK;
}

extern "C" ms_status mita_cuda(ms_backend *be, float *out, const float *qkv, int hp, int wp,
                               int ncls, int c, int heads, int gh, int gw, int k,
                               bool shared_scale_d, const ms_mita_record *rec, void *ws)
{
    ms_cuda_ctx *cu = cuda_ctx_of(be);
    const int n = ncls + hp * wp, m = gh * gw, d = heads > 0 ? c / heads : 0;
    if (n <= 0 || heads <= 0 || d * heads != c || m <= 0 || k <= 0 || k > n)
        return ms_error(MS_ERR_ARG, "mita_cuda: bad sizes n=%d c=%d heads=%d m=%d k=%d", n, c,
                        heads, m, k);
    if (d > MS_MITA_DMAX)
        return ms_error(MS_ERR_UNSUPPORTED, "mita_cuda: head dim %d > %d", d, MS_MITA_DMAX);
    /* Indexing is 64-bit (mita_qkv_index, size_t offsets, cuBLAS strides as
     * long long), so n * 3c may pass 2^31; what stays bounded is the M x N
     * probe and routing matrices per head. */
    if ((size_t)heads * m * n > ((size_t)1 << 40))
        return ms_error(MS_ERR_UNSUPPORTED, "mita_cuda: n=%d too large", n);

    /* Routed tile: as many keys (up to 64) as fit next to the summaries in
     * the default 48 KB of shared memory; when the summaries alone crowd
     * that out (large M or d), opt in to the device's larger limit; when
     * they do not fit even there (e.g. 32x32 landmarks at d = 64), stage
     * them in tiles of mt next to a key tile of up to 64 (at most half of
     * the memory). */
    const size_t rowd = (size_t)d * sizeof(float), row2 = 2 * rowd;
    size_t limit = 48 * 1024;
    int mt = m, kt = k < MITA_KT_MAX ? k : MITA_KT_MAX;
    while (kt > 16 && mt * rowd + kt * row2 > limit) kt /= 2;
    if (mt * rowd + kt * row2 > limit) {
        limit = cu->smem_optin;
        kt = k < MITA_KT_MAX ? k : MITA_KT_MAX;
        while (kt > 1 && mt * rowd + kt * row2 > limit) kt /= 2;
        if (mt * rowd + kt * row2 > limit) {
            kt = k < MITA_KT_MAX ? k : MITA_KT_MAX;
            while (kt > 1 && kt * row2 > limit / 2) kt /= 2;
            mt = limit > kt * row2 ? (int)((limit - kt * row2) / rowd) : 0;
            if (mt < 1)
                return ms_error(MS_ERR_UNSUPPORTED,
                                "mita_cuda: head dim %d needs %zu bytes of shared memory, the "
                                "device has %zu",
                                d, rowd + row2, cu->smem_optin);
        }
    }
    const size_t smem = mt * rowd + kt * row2;

    mita_layout L = mita_plan(n, c, heads, m, k);
    uint8_t *base = (uint8_t *)ws;
    float *land = (float *)(base + L.land);
    float *probe = (float *)(base + L.probe);
    float *rs = (float *)(base + L.route_s);
    float *sv = (float *)(base + L.sv);
    /* with a class token the records are renumbered at the end, from scratch */
    const ms_mita_record *direct = ncls ? NULL : rec;
    int32_t *idx = direct && direct->topk_idx ? direct->topk_idx : (int32_t *)(base + L.idx);
    int32_t *route = direct && direct->route ? direct->route : (int32_t *)(base + L.route);
    int *counts = (int *)(base + L.counts), *cursor = (int *)(base + L.cursor);
    int *starts = (int *)(base + L.starts), *chunks = (int *)(base + L.chunks);
    int *order = (int *)(base + L.order);
    uint64_t *cand = k > MS_TOPK_SMEM ? (uint64_t *)(base + L.cand) : NULL;
    float *mass = direct ? direct->shared_mass : rec ? (float *)(base + L.mass) : NULL;
    const float *qp = qkv, *kp = qkv + c, *vp = qkv + 2 * c;
    const int c3 = 3 * c;
    const float s = mita_scale(d), sh = mita_shared_scale(d, shared_scale_d);
    cudaStream_t st = cu->stream;

    MS_TRY(prof_mark(st, 0));
    /* 1. landmarks */
    MS_LAUNCH(landmark_kernel, cuda_blocks((size_t)m * c, 256), 256, 0, st)(
        land, qkv + (size_t)ncls * c3, hp, wp, c, gh, gw);
    CUDA_CHECK_LAUNCH("landmark_kernel");
    MS_TRY(prof_mark(st, 1));
    /* 2. probe, per head: P_h (M x N row-major) = col-major (N x M) = K_h^T' L_h. */
    MS_TRY(cuda_gemm_batched(cu, true, CUBLAS_OP_T, CUBLAS_OP_N, n, m, d, 1.0f, kp, c3, d, land,
                             c, d, 0.0f, probe, n, (long long)m * n, heads));
    MS_TRY(prof_mark(st, 2));
    /* 3. routed sets */
    size_t tk_smem = k <= MS_TOPK_SMEM ? (size_t)next_pow2(k) * sizeof(uint64_t) : 0;
    MS_LAUNCH(topk_kernel, heads * m, MITA_TOPK_THREADS, tk_smem, st)(idx, cand, probe, n, k);
    CUDA_CHECK_LAUNCH("topk_kernel");
    MS_TRY(prof_mark(st, 3));
    /* 4. summaries: P <- softmax(P s), then Sv_h (M x d) = P_h V_h; col-major
     * (d x M) = V_h' (d x N, ld 3c) * P_h' (N x M, ld N). */
    MS_LAUNCH(summary_softmax_kernel, heads * m, MITA_SOFTMAX_THREADS, 0, st)(probe, n, s);
    CUDA_CHECK_LAUNCH("summary_softmax_kernel");
    MS_TRY(prof_mark(st, 4));
    const int nch = (n + MITA_SV_CHUNK - 1) / MITA_SV_CHUNK;
    if (nch == 1) {
        MS_TRY(cuda_gemm_batched(cu, true, CUBLAS_OP_N, CUBLAS_OP_N, d, m, n, 1.0f, vp, c3, d,
                                 probe, n, (long long)m * n, 0.0f, sv, d, (long long)m * d,
                                 heads));
    } else {
        /* per head: the full chunks as one batch, the remainder alone; then
         * sum the partials */
        float *part = (float *)(base + L.part);
        const int full = n / MITA_SV_CHUNK, rem = n - full * MITA_SV_CHUNK;
        const long long md = (long long)m * d;
        for (int h = 0; h < heads; h++) {
            const float *vh = vp + (size_t)h * d, *ph = probe + (size_t)h * m * n;
            float *parth = part + (size_t)h * nch * md;
            MS_TRY(cuda_gemm_batched(cu, true, CUBLAS_OP_N, CUBLAS_OP_N, d, m, MITA_SV_CHUNK,
                                     1.0f, vh, c3, (long long)MITA_SV_CHUNK * c3, ph, n,
                                     MITA_SV_CHUNK, 0.0f, parth, d, md, full));
            if (rem > 0)
                MS_TRY(cuda_gemm_batched(cu, true, CUBLAS_OP_N, CUBLAS_OP_N, d, m, rem, 1.0f,
                                         vh + (size_t)full * MITA_SV_CHUNK * c3, c3, 0,
                                         ph + (size_t)full * MITA_SV_CHUNK, n, 0, 0.0f,
                                         parth + (size_t)full * md, d, 0, 1));
        }
        MS_LAUNCH(sv_reduce_kernel, cuda_blocks((size_t)heads * md, 256), 256, 0, st)(sv, part,
            heads, nch, (int)md);
        CUDA_CHECK_LAUNCH("sv_reduce_kernel");
    }
    MS_TRY(prof_mark(st, 5));
    /* 5. routing scores R_h (N x M row-major) = col-major (M x N) = L_h^T' Q_h. */
    MS_TRY(cuda_gemm_batched(cu, true, CUBLAS_OP_T, CUBLAS_OP_N, m, n, d, 1.0f, land, c, d, qp,
                             c3, d, 0.0f, rs, m, (long long)n * m, heads));
    MS_TRY(prof_mark(st, 6));
    /* 6. argmax routing and counting sort by expert */
    CUDA_CHECK(cudaMemsetAsync(counts, 0, (size_t)heads * m * sizeof(int), st));
    MS_LAUNCH(route_kernel, cuda_blocks((size_t)heads * n, 256), 256, 0, st)(route, counts, rs,
        heads, n, m);
    CUDA_CHECK_LAUNCH("route_kernel");
    MS_LAUNCH(scan_kernel, 1, 1, 0, st)(starts, chunks, cursor, counts, heads, m, MITA_ROUTED_QB);
    CUDA_CHECK_LAUNCH("scan_kernel");
    MS_LAUNCH(scatter_kernel, cuda_blocks((size_t)heads * n, 256), 256, 0, st)(order, cursor, route,
        starts, heads, n, m);
    CUDA_CHECK_LAUNCH("scatter_kernel");
    MS_TRY(prof_mark(st, 7));
    /* 7. joint softmax per expert chunk; the grid bounds the chunk count:
     * sum_g ceil(cnt_g/QB) <= heads * (ceil(n/QB) + m). */
    size_t grid = (size_t)heads * ((n + MITA_ROUTED_QB - 1) / MITA_ROUTED_QB + m);
    if (grid > 0x7FFFFFFFu) return ms_error(MS_ERR_UNSUPPORTED, "mita_cuda: grid too large");
    ms_status rst;
    if (d == 32)
        rst = launch_routed<32>(cu, (unsigned)grid, smem, out, mass, qkv, rs, sv, idx, order,
                                 starts, counts, chunks, heads, n, m, c, d, k, mt, kt, s, sh);
    else if (d == 64)
        rst = launch_routed<64>(cu, (unsigned)grid, smem, out, mass, qkv, rs, sv, idx, order,
                                 starts, counts, chunks, heads, n, m, c, d, k, mt, kt, s, sh);
    else if (d == 128)
        rst = launch_routed<128>(cu, (unsigned)grid, smem, out, mass, qkv, rs, sv, idx, order,
                                  starts, counts, chunks, heads, n, m, c, d, k, mt, kt, s, sh);
    else
        rst = launch_routed<0>(cu, (unsigned)grid, smem, out, mass, qkv, rs, sv, idx, order,
                               starts, counts, chunks, heads, n, m, c, d, k, mt, kt, s, sh);
    MS_TRY(rst);
    if (ncls && rec) {
        size_t total = (size_t)heads * ((size_t)m * k + n);
        MS_LAUNCH(record_report_kernel, cuda_blocks(total, 256), 256, 0, st)(
            *rec, idx, route, mass, heads, n, m * k, ncls);
        CUDA_CHECK_LAUNCH("record_report_kernel");
    }
    MS_TRY(prof_mark(st, 8));
    return prof_finish();
}
