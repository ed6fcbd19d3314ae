/* MiTA attention on the CPU (spec section 2), in one parallel region with
 * no barrier inside (each region start and barrier costs wake-ups, and a
 * busy 2-core machine can stretch one to a time slice). The threads take
 * items from one list, in order, each waiting only for the items it reads:
 * the landmarks by grid row (adaptive average pool of q); phase 1, head by
 * head: (head, group of experts): probe P = L K^T for the group's rows,
 * per row the top-k by a search on order-preserving keys, 2^(P s log2(e)
 * - max) and the shared summaries Sv = softmax(P s) V; (head, block of
 * queries): routing logits R = Q L^T and routes. Phase 2: each head's
 * queries, counting-sorted by routed expert, in fixed chunks; each
 * expert's k keys and values are gathered once into
 * contiguous rows (the keys as columns, K_e^T), so that for a block of its
 * queries the routed logits are one GEMM (nq x k), and the joint softmax's
 * output one more, both NN (gemm_small.h: libxsmm's generated kernels,
 * else OpenBLAS's small-matrix ones; the slices below were sized for
 * OpenBLAS's and suit libxsmm's, which take any NN shape): the
 * weights 2^(logit - row max) over [shared | routed] (nq x (M + k), one
 * softmax, in base 2) times [Sv ; V_e] ((M + k) x d), divided by the row's
 * sum as it is scattered out. GEMMs accumulate in float like PyTorch's, so
 * the top-k sets agree with a float32 reference except at (near-)ties.
 * Every item is fixed whatever the thread count, so the results are
 * bit-identical across thread counts. */
#include "mita.h"

#include "gemm.h"
#include "gemm_small.h"
#include "mita_cuda_math.h" /* topk_key, topk_composite */
#include "mita_simd.h"
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h> /* _mm_pause */
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

/* Phase 1 items: queries per routing item (at most). Routing items are
 * small: they keep the other threads busy while one runs a head's experts. */
#define MITA_RB 128
/* Experts are split into groups (phase 1 items) in whole blocks of
 * MITA_SB rows. A group's summary GEMM (rows x d x n) runs in slices of
 * MITA_SKB tokens, summed with beta = 1: at most 49 x 64 x 64
 * multiply-adds a call, so OpenBLAS 0.3.21 runs each with its small-matrix
 * kernel, without packing, whatever n (1 thread, AVX-512 kernels, 49 rows,
 * d = 64: N = 1024 28 us against 36 in blocks of 12 rows; N = 4096 115
 * against 158 in one GEMM; N = 16384 526 against 734). Each output's sum
 * over a slice is in token order whatever the rows in the call, so the
 * results do not depend on the grouping (the thread count). */
#define MITA_SB 12
#define MITA_SKB 64

/* Tokens a slice of all m rows may span and stay on OpenBLAS's
 * small-matrix kernel (its limit is 10^6 multiply-adds, with a margin);
 * from m and d only, not a group's rows, so slices do not depend on the
 * thread count. */
static long small_kernel_tokens(int m, int d) { return 786432L / ((long)m * d); }

/* Tokens per summary slice: MITA_SKB, fewer where m x d is large. */
static int summary_slice(int m, int d)
{
    long t = small_kernel_tokens(m, d);
    return t >= MITA_SKB ? MITA_SKB : t < 8 ? 8 : (int)t;
}

/* Tokens per probe slice: a multiple of 16, at most 256, within
 * small_kernel_tokens. Each slice of K is transposed into (d, slice) so that the probe
 * L K^T is an NN GEMM: OpenBLAS 0.3.21 runs NT products on its general
 * path, which packs K (1 thread, 3 heads: N = 1024 13 % of the layer's
 * samples, 16384 17 %). */
static int probe_slice(int m, int d)
{
    long t = small_kernel_tokens(m, d) / 16 * 16;
    return t > 256 ? 256 : t < 16 ? 16 : (int)t;
}

/* Phase 2 items: about this many expert-sorted queries of one head. A
 * chunk's ends are moved to the nearest expert boundary within half a
 * chunk (mita_chunk_end), so an expert of up to MITA_PC queries is never
 * cut (a cut expert's keys and values are gathered once more: at N =
 * 4096 fixed ends cut 21 of a head's 49). The chunks decide the routed
 * GEMMs' row counts, and OpenBLAS 0.3.21's small-matrix kernel rounds the
 * last of 49 columns differently in a call's last rows when the rows are
 * no multiple of 4: other chunks give other bits (at float rounding; a
 * near-tie route in a later layer can then flip, as finer chunks for the
 * last head did on bench_cpu's DeiT-Tiny model). From n and the routes
 * only, so the same whatever the thread count. */
#define MITA_PC 192

/* The joint softmax runs in base 2: its scales take log2(e). */
#define MITA_LOG2E 1.44269504088896341f

/* Queries per routed GEMM block: the (QB, k) logit tile and (QB, d) output
 * stay in L2 next to the expert's keys and values. */
#define MITA_QB 128

/* Row strides of the routing logits (m) and the routed logits' keys (k):
 * whole 8-float vectors, so that gemm_small_cols can compute padded
 * columns; fixed whatever the library, so the sizes are too. */
static int mita_pad8(int n) { return (n + 7) & ~7; }

void mita_clamp(int *gh, int *gw, int *k, int hp, int wp, const ms_mita_params *p)
{
    int n = p->ncls + hp * wp;
    *gh = p->gh < 1 ? 1 : (p->gh > hp ? hp : p->gh);
    *gw = p->gw < 1 ? 1 : (p->gw > wp ? wp : p->gw);
    *k = p->topk < 1 ? 1 : (p->topk > n ? n : p->topk);
}

typedef struct {
    float *scores;  /* (heads, n, pad8(m)) routing logits R */
    float *sv;      /* (heads, m, d) shared summaries */
    int32_t *idx;   /* (heads, m, k) routed sets, best first */
    int32_t *route; /* (heads, n) expert of each query */
    float *land;    /* (m, c) landmarks, all heads */
    float *landt;   /* (c, pad8(m)) the same, transposed, 0 past m: R = Q L^T as an NN GEMM */
    float *thread;  /* (chunks, thread_layout bytes) sort and work buffers */
    atomic_int *next; /* the next item to take */
    atomic_int *done; /* (heads + 1) phase 1 items finished per head, then landmark rows */
} mita_ws;

/* One thread's share of the workspace. */
typedef struct {
    int32_t *order; /* (n) queries of one head sorted by expert (stable) */
    int *counts;    /* (m) queries per expert */
    int *starts;    /* (m) first position of each expert's queries in order */
    int *fill;      /* (m) counting sort cursors */
    float *work;    /* phase 1: probe rows, top-k keys; phase 2: routed buffers */
} mita_thread;

static void *carve(uint8_t *base, size_t *off, size_t bytes)
{
    void *p = base ? base + *off : NULL;
    *off += (bytes + 63) & ~(size_t)63;
    return p;
}

/* Top-k scratch of one row (floats): keys (n), selected keys (n + 16:
 * the ranking's padding) and positions (n), 64-bit keys for a sort (2k,
 * 8-byte aligned). */
size_t mita_topk_floats(int n, int k)
{
    return 3 * (size_t)n + 16 + 1 + 2 * (size_t)k;
}

/* Rows of an expert block, the unit of the groups. */
static int summary_rows(int m) { return m < MITA_SB ? m : MITA_SB; }

/* Expert blocks per head: m in blocks of summary_rows. */
static int summary_blocks(int m)
{
    int sb = summary_rows(m);
    return (m + sb - 1) / sb;
}

/* Expert items per head: at least one per thread, else as few as possible
 * (one probe GEMM over all m landmarks runs 30 % faster than over 16 of
 * them three times: K is packed once); whole summary blocks each. */
static int expert_groups(int m, int heads, int chunks)
{
    int blocks = summary_blocks(m), g = (chunks + heads - 1) / heads;
    return g < 1 ? 1 : (g > blocks ? blocks : g);
}

/* Experts [*e0, *e1) of group j of groups: summary blocks [j B / groups,
 * (j + 1) B / groups) of the B blocks. */
static void expert_group_rows(int *e0, int *e1, int j, int groups, int m)
{
    int sb = summary_rows(m), blocks = summary_blocks(m);
    int b0 = (int)((long)blocks * j / groups), b1 = (int)((long)blocks * (j + 1) / groups);
    *e0 = b0 * sb;
    *e1 = b1 * sb < m ? b1 * sb : m;
}

/* Per-thread work buffer: phase 1, a group's probe rows (g, n), their
 * sums, one row's top-k scratch, a transposed slice of K (d, slice) and
 * the slice's positions; phase 2, the expert's keys (d, pad8(k)), the
 * summaries and its values (m + k, d), a query block (QB, d), its logits
 * (QB, m + pad8(k)), outputs (QB, d), shared masses and 1 / sums (QB). */
static size_t work_floats(int n, int m, int k, int d, int g)
{
    size_t probe = (size_t)g * (n + 1) + mita_topk_floats(n, k) +
                   (size_t)probe_slice(m, d) * (d + 1);
    size_t kp = (size_t)mita_pad8(k);
    size_t routed = (kp + m + k) * d + (size_t)MITA_QB * (2 * (size_t)d + m + kp + 2);
    return probe > routed ? probe : routed;
}

/* Lays thread t's share out at base (NULL: only measures); returns its
 * bytes (whole cache lines, so that threads share none). */
static size_t thread_layout(mita_thread *th, void *base, int n, int c, int heads, int m, int k,
                            int chunks)
{
    int d = c / heads, groups = expert_groups(m, heads, chunks), sb = summary_rows(m);
    int rows = (summary_blocks(m) + groups - 1) / groups * sb; /* a group's most */
    uint8_t *b = (uint8_t *)base;
    size_t off = 0;
    th->order = carve(b, &off, (size_t)n * sizeof(int32_t));
    th->counts = carve(b, &off, (size_t)m * sizeof(int));
    th->starts = carve(b, &off, (size_t)m * sizeof(int));
    th->fill = carve(b, &off, (size_t)m * sizeof(int));
    th->work = carve(b, &off,
                     work_floats(n, m, k, d, rows < m ? rows : m) * sizeof(float));
    return off;
}

/* Lays the workspace out at base (NULL: only measures); returns its bytes. */
static size_t mita_layout(mita_ws *w, void *base, int n, int c, int heads, int m, int k,
                          int chunks)
{
    uint8_t *b = (uint8_t *)base;
    int d = c / heads;
    size_t off = 0;
    mita_thread th;
    w->scores = carve(b, &off, (size_t)heads * n * mita_pad8(m) * sizeof(float));
    w->sv = carve(b, &off, (size_t)heads * m * d * sizeof(float));
    w->idx = carve(b, &off, (size_t)heads * m * k * sizeof(int32_t));
    w->route = carve(b, &off, (size_t)heads * n * sizeof(int32_t));
    w->land = carve(b, &off, (size_t)m * c * sizeof(float));
    w->landt = carve(b, &off, (size_t)mita_pad8(m) * c * sizeof(float));
    w->thread =
        carve(b, &off, (size_t)chunks * thread_layout(&th, NULL, n, c, heads, m, k, chunks));
    w->next = carve(b, &off, sizeof(atomic_int));
    w->done = carve(b, &off, ((size_t)heads + 1) * sizeof(atomic_int));
    return off;
}

static mita_thread thread_share(const mita_ws *w, int t, int n, int c, int heads, int m, int k,
                                int chunks)
{
    mita_thread th;
    size_t bytes = thread_layout(&th, NULL, n, c, heads, m, k, chunks);
    thread_layout(&th, (uint8_t *)w->thread + (size_t)t * bytes, n, c, heads, m, k, chunks);
    return th;
}

size_t mita_scratch_bytes(int hp, int wp, int ncls, int c, int heads, int gh, int gw, int k,
                          int chunks)
{
    mita_ws w;
    return mita_layout(&w, NULL, ncls + hp * wp, c, heads, gh * gw, k, chunks);
}

/* Descending order of composite keys (mita_cuda_math.h: topk_composite):
 * higher score first, ties to the lower position (topk_before). */
static int u64_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

/* The k-th largest of key[0..n) (1 <= k <= n; all keys in [kmin, kmax])
 * by search on the key value: the largest t with at least k keys >= t, and
 * in *above how many keys are > t, or -1 where exactly k keys are >= t
 * (then they are the k winners). Each step is one vector count of the row,
 * no data-dependent branch per element. The first probe is `guess` (where
 * inside the bracket), the next ones interpolate the counts linearly
 * between the bracket's ends (in key units) while that at least halves
 * the bracket, else bisect. At N = 690, k = 49: 6.3 counts a row on the
 * CamVid model's layers (5.4 on random data) with the normal guess of
 * topk_guess, 11.7 (9.3) without; 12.4 (11.4) by bisection alone. */
static uint32_t kth_key(int *above, const uint32_t *key /* (n) */, int n, int k, uint32_t kmin,
                        uint32_t kmax, uint32_t guess)
{
    uint64_t lo = kmin, hi = (uint64_t)kmax + 1; /* count(>= lo) >= k > count(>= hi) */
    int c_lo = n, c_hi = 0;
    bool interp = true;
    while (hi - lo > 1) {
        uint64_t span = hi - lo, mid;
        if (guess > lo && guess < hi) {
            mid = guess;
            guess = 0;
        } else if (interp) { /* in [lo + 1, hi - 1]: (c_lo - k) / (c_lo - c_hi) < 1 */
            double f = (double)(c_lo - k) / (double)(c_lo - c_hi);
            mid = lo + 1 + (uint64_t)(f * (double)(span - 1));
        } else {
            mid = lo + span / 2;
        }
        int cnt = mita_count_at_least_u32(key, n, (uint32_t)mid);
        if (cnt == k) {
            *above = -1;
            return (uint32_t)mid;
        }
        if (cnt > k) lo = mid, c_lo = cnt;
        else hi = mid, c_hi = cnt;
        interp = (hi - lo) * 2 <= span;
    }
    *above = c_hi;
    return (uint32_t)lo;
}

/* The search's first probe: the k-th largest of n draws of a normal law
 * with the row's mean and deviation (sum, sumsq), mean + z sd with z the
 * upper k/n quantile (Abramowitz and Stegun 26.2.23, |error| < 4.5e-4);
 * 0 (no guess) where k/n >= 1/2 or the sums are not finite. Probe scores
 * are dot products, near normal across a row: the guess lands close. */
static uint32_t topk_guess(int n, int k, float sum, float sumsq)
{
    double p = (double)k / n, mu = (double)sum / n, var = (double)sumsq / n - mu * mu;
    if (!(p < 0.5) || !isfinite(mu) || !isfinite(var)) return 0;
    double t = sqrt(-2.0 * log(p));
    double z = t - (2.515517 + 0.802853 * t + 0.010328 * t * t) /
                       (1.0 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t * t * t);
    return topk_key((float)(mu + z * sqrt(var > 0.0 ? var : 0.0)));
}

/* idx = the k best positions of score[0..n) in top-k order, best first,
 * 1 <= k <= n. Keys: topk_key, whose order is the scores' (NaNs ordered by
 * their bits, -0 = +0). The k-th largest key t (kth_key) splits the row:
 * the winners are the keys > t and, ties to the lower position, the first
 * of those = t; then they are sorted by (key, position). The search
 * counts over candidates above a guess from the row's mean and deviation
 * (no sample to sort: a strided sample's threshold that kept about 4k
 * candidates, tried before, was slower at every N from 690 to 16384).
 * Returns the row's largest score, for the exp that follows. */
float mita_topk_row(int32_t *idx /* (k) */, const float *score /* (n) */, int n, int k,
                    float *buf /* (mita_topk_floats(n, k)) */)
{
    uint32_t *key = (uint32_t *)buf;               /* (n) */
    uint32_t *wkey = key + n;                      /* (n + 16) keys >= the k-th, then winners' */
    int32_t *wpos = (int32_t *)(wkey + n + 16);    /* (n) their positions */
    uintptr_t at = ((uintptr_t)(buf + 3 * (size_t)n + 16) + 7) & ~(uintptr_t)7;
    uint64_t *u64 = (uint64_t *)at;                /* (k) composite keys, 8-byte aligned */
    uint32_t kmin, kmax;
    float sum, sumsq;
    mita_keys(key, score, n, &kmin, &kmax, &sum, &sumsq);
    /* Candidates: the keys >= a guess at the (2k + 32)-th largest (the
     * normal law's, as the search's first probe), in one pass; the search
     * then counts among them only. Where fewer than k get in (the guess
     * was too high), it counts over the whole row. */
    const uint32_t *ck = key;
    int cn = n, ns = -1, above, ties = k, w = 0;
    uint32_t cmin = kmin, lo = topk_guess(n, 2 * k + 32, sum, sumsq);
    if (lo > kmin) {
        ns = mita_collect_at_least_u32(wkey, wpos, key, n, lo);
        if (ns >= k) ck = wkey, cn = ns, cmin = lo;
    }
    uint32_t t = kth_key(&above, ck, cn, k, cmin, kmax, topk_guess(n, k, sum, sumsq));
    if (above >= 0) ties = k - above; /* keys = t that still get in */
    /* the keys >= t, in position order: from the row, or the candidates' */
    if (ck == key) ns = mita_collect_at_least_u32(wkey, wpos, key, n, t);
    else ns = mita_compact_at_least_u32(wkey, wpos, ns, t);
    if (above < 0) { /* exactly k of them (the common case): all */
        w = ns;
    } else {
        for (int i = 0; i < ns && w < k; i++)
            if (wkey[i] > t || ties-- > 0) { /* ascending position: the first ties win */
                wkey[w] = wkey[i];
                wpos[w++] = wpos[i];
            }
    }
    if (k <= 128) {
        int kp = (k + 15) & ~15;
        for (int j = k; j < kp; j++) wkey[j] = 0; /* no key is above them */
        mita_rank_desc(idx, wkey, wpos, k, kp);
    } else {
        for (int j = 0; j < k; j++) u64[j] = topk_composite(wkey[j], wpos[j]);
        qsort(u64, (size_t)k, sizeof *u64, u64_desc);
        for (int j = 0; j < k; j++) idx[j] = topk_composite_pos(u64[j]);
    }
    return topk_key_value(kmax);
}

/* Row gy of L = adaptive average pool of q (all c channels) to (gh, gw);
 * qkv: the grid tokens only (spec 2.7: the class token is not pooled).
 * Row 0 also zeroes L^T's padding. */
static void mita_landmarks(float *land /* (gh*gw, c) */, float *landt /* (c, mp) */,
                           const float *qkv /* (hp*wp, 3c) */, int hp, int wp, int c, int gh,
                           int gw, int gy)
{
    size_t ld = 3 * (size_t)c;
    int m = gh * gw, mp = mita_pad8(m);
    for (int ch = 0; gy == 0 && ch < c; ch++)
        for (int mi = m; mi < mp; mi++) landt[(size_t)ch * mp + mi] = 0.0f;
    for (int mi = gy * gw; mi < (gy + 1) * gw; mi++) {
        int gx = mi % gw;
        int y0 = adaptive_pool_start(gy, hp, gh), y1 = adaptive_pool_end(gy, hp, gh);
        int x0 = adaptive_pool_start(gx, wp, gw), x1 = adaptive_pool_end(gx, wp, gw);
        float *l = land + (size_t)mi * c;
        for (int ch = 0; ch < c; ch++) l[ch] = 0.0f;
        for (int y = y0; y < y1; y++)
            mita_add_rows(l, qkv + ((size_t)y * wp + x0) * ld, ld, x1 - x0, c);
        float cnt = (float)((y1 - y0) * (x1 - x0));
#pragma omp simd /* -O2: GCC 12 vectorises only with the pragma; apart from the strided copy */
        for (int ch = 0; ch < c; ch++) l[ch] /= cnt;
        for (int ch = 0; ch < c; ch++) landt[(size_t)ch * mp + mi] = l[ch];
    }
}

/* Experts [e0, e1) of head h: probe rows P = L K^T, per row the routed
 * set, then exp(P s - max) (as a power of 2) and the shared summaries
 * Sv = softmax_n(P s) V. */
static void mita_experts(const mita_ws *w, const float *qkv /* (n, 3c) */,
                         const float *land /* (m, c) */, int n, int ncls, int c, int d, int h,
                         int m, int k, int e0, int e1, const ms_mita_record *rec,
                         float *work /* (work_floats) */)
{
    size_t ld = 3 * (size_t)c;
    int g = e1 - e0;
    float s2 = mita_scale(d) * MITA_LOG2E;
    float *p = work;                              /* (g, n) probe rows, then exp */
    float *sum = p + (size_t)g * n;               /* (g) their sums */
    float *tk = sum + g;                          /* top-k scratch */
    int ps = probe_slice(m, d);
    float *kt = tk + mita_topk_floats(n, k);      /* (d, ps) a slice of K^T */
    int32_t *at = (int32_t *)(kt + (size_t)ps * d); /* (ps) 0, 1, ... */
    for (int i = 0; i < ps; i++) at[i] = i;
    for (int t0 = 0; t0 < n; t0 += ps) {
        int nt = n - t0 < ps ? n - t0 : ps;
        mita_gather_rows_t(kt, ps, qkv + (size_t)t0 * ld + c + (size_t)h * d, ld, at, nt, d);
        gemm_small_nn(p + t0, land + (size_t)e0 * c + (size_t)h * d, kt, g, nt, d, c, ps, n,
                      false);
    }
    for (int e = e0; e < e1; e++) {
        float *row = p + (size_t)(e - e0) * n;
        int32_t *idx = w->idx + ((size_t)h * m + e) * k;
        float mx = mita_topk_row(idx, row, n, k, tk) * s2; /* base 2: exp(P s - max) */
        if (rec && rec->topk_idx) {
            int32_t *dst = rec->topk_idx + ((size_t)h * m + e) * k;
            for (int j = 0; j < k; j++) dst[j] = mita_report_pos(idx[j], ncls, n);
        }
        sum[e - e0] = mita_exp2_sum(row, n, s2, mx);
    }
    float *sv = w->sv + ((size_t)h * m + e0) * d;
    int skb = summary_slice(m, d);
    for (int t0 = 0; t0 < n; t0 += skb)
        gemm_small_nn(sv, p + t0, qkv + (size_t)t0 * ld + 2 * (size_t)c + (size_t)h * d, g, d,
                      n - t0 < skb ? n - t0 : skb, n, (int)ld, d, t0 > 0);
    for (int e = 0; e < g; e++) {
        float se = sum[e];
#pragma omp simd /* scalar divisions were 1 % of the layer's samples (N = 1024) */
        for (int j = 0; j < d; j++) sv[(size_t)e * d + j] /= se;
    }
}

/* Routing logits R = Q L^T of queries [q0, q1) of head h and their routes
 * e = argmax R[q, :] (ties to the lower expert). With L^T stored, an NN
 * GEMM: OpenBLAS runs it with its small-matrix kernel, where Q L^T took
 * the packing path; libxsmm's computes L^T's padding columns too. */
static void mita_route(const mita_ws *w, const float *qkv /* (n, 3c) */,
                       const float *landt /* (c, mp) */, int n, int c, int d, int h, int m,
                       int q0, int q1)
{
    size_t ld = 3 * (size_t)c;
    int mp = mita_pad8(m);
    float *r = w->scores + ((size_t)h * n + q0) * mp;
    gemm_small_nn(r, qkv + (size_t)q0 * ld + (size_t)h * d, landt + (size_t)h * d * mp, q1 - q0,
                  gemm_small_cols(m, mp), d, (int)ld, mp, mp, false);
    mita_argmax_rows(w->route + (size_t)h * n + q0, r, q1 - q0, m, mp);
}

/* Waits until *count reaches want: spins briefly (the items waited for
 * are in progress on other threads), then yields the core, which the
 * thread waited for may need on a busy machine. */
static void mita_wait_count(atomic_int *count, int want)
{
    for (int spins = 0; atomic_load_explicit(count, memory_order_acquire) < want; spins++) {
        if (spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
            _mm_pause();
#endif
        } else {
            sched_yield();
        }
    }
}

/* Counting sort of head h's queries by expert (stable: ascending query
 * within an expert) into the thread's counts, starts, order. */
static void mita_sort_queries(const mita_thread *th, const int32_t *route /* (n) */, int n, int m)
{
    for (int e = 0; e < m; e++) th->counts[e] = 0;
    for (int qi = 0; qi < n; qi++) th->counts[route[qi]]++;
    for (int e = 0, at = 0; e < m; e++) {
        th->starts[e] = th->fill[e] = at;
        at += th->counts[e];
    }
    for (int qi = 0; qi < n; qi++) th->order[th->fill[route[qi]]++] = qi;
}

/* Where a phase 2 chunk ends (the next one starts), given its end q in
 * sorted positions at a fixed n j / chunks: the boundary of the expert
 * around q nearest q, where that is within MITA_PC / 2, else q. Monotone
 * in q, so the chunks tile [0, n). */
static int mita_chunk_end(const mita_thread *th, const int32_t *route /* (n) */, int n, int q)
{
    if (q <= 0 || q >= n) return q;
    int e = route[th->order[q]];
    int lo = th->starts[e], hi = lo + th->counts[e];
    if (q - lo <= hi - q) return q - lo <= MITA_PC / 2 ? lo : q;
    return hi - q <= MITA_PC / 2 ? hi : q;
}

/* The shapes of mita_routed's two products for a block of nb queries, in
 * gemm_small_nn's order (rows, columns, inner, lda, ldb, ldc), for it and
 * mita_cpu_prepare: the routed logits qb K_e^T into lg past the shared
 * logits (whole vectors: K_e^T's zero padding gives the columns past k,
 * ignored), and the output weights [Sv ; V_e]. */
typedef struct {
    int m, n, k, lda, ldb, ldc;
} mita_gemm_shape;

static mita_gemm_shape mita_logits_shape(int nb, int m, int k, int d)
{
    int kp = mita_pad8(k);
    return (mita_gemm_shape){nb, gemm_small_cols(k, kp), d, d, kp, m + kp};
}

static mita_gemm_shape mita_output_shape(int nb, int m, int k, int d)
{
    return (mita_gemm_shape){nb, d, m + k, m + mita_pad8(k), d, d};
}

/* Sorted queries order[p0, p1) of head h (th: that head's counting sort),
 * expert by expert in blocks of up to QB: gather the expert's keys and
 * values once; logits = Q K^T s / s_sh by one GEMM beside the block's
 * rows of R (the same units); joint softmax weights; out = weights
 * [Sv ; V_e] by one more, divided by the sums as it is scattered; record. */
static void mita_routed(float *out /* (n, c) */, const float *qkv /* (n, 3c) */,
                        const mita_ws *w, const mita_thread *th, int n, int ncls, int c, int d,
                        int h, int m, int k, float s_shared, const ms_mita_record *rec, int p0,
                        int p1)
{
    size_t ld = 3 * (size_t)c;
    int mk = m + k, mp = mita_pad8(m), kp = mita_pad8(k), lgld = m + kp;
    /* routed logits q.k s in the shared ones' units q.l: the softmax then
     * scales both by s_sh log2(e) (base 2) */
    float s = mita_scale(d) / s_shared, s_shared2 = s_shared * MITA_LOG2E;
    const int32_t *route = w->route + (size_t)h * n;
    const float *scores = w->scores + (size_t)h * n * mp; /* (n, mp) */
    float *ke = th->work;                  /* (d, kp) the expert's keys, transposed */
    float *sve = ke + (size_t)kp * d;      /* (m + k, d) summaries, then its values */
    float *qb = sve + (size_t)mk * d;      /* (QB, d) query block */
    float *lg = qb + (size_t)MITA_QB * d;  /* (QB, m + kp) logits, then weights */
    float *ob = lg + (size_t)MITA_QB * lgld; /* (QB, d) outputs */
    float *mass = ob + (size_t)MITA_QB * d; /* (QB) shared masses */
    float *inv = mass + MITA_QB;            /* (QB) 1 / softmax sums */
    if (p1 <= p0) return;
    memcpy(sve, w->sv + (size_t)h * m * d, (size_t)m * d * sizeof(float));
    for (int t = 0; t < d; t++) /* the keys' padding: the logits' columns past k, ignored */
        for (int j = k; j < kp; j++) ke[(size_t)t * kp + j] = 0.0f;
    int have = -1; /* expert whose rows are in ke, sve */
    for (int p = p0; p < p1;) {
        int e = route[th->order[p]];
        int end = th->starts[e] + th->counts[e];
        if (end > p1) end = p1;
        if (end > p + MITA_QB) end = p + MITA_QB;
        int nb = end - p;
        const int32_t *qs = th->order + p; /* the block's queries */
        if (e != have) {
            const int32_t *ids = w->idx + ((size_t)h * m + e) * k;
            mita_gather_rows_t(ke, kp, qkv + c + (size_t)h * d, ld, ids, k, d);
            mita_gather_rows(sve + (size_t)m * d, d, qkv + 2 * (size_t)c + (size_t)h * d, ld, ids,
                             k, d, 1.0f);
            have = e;
        }
        /* the queries times s, not the product (gemm_small_nn has alpha 1):
         * exact where s is a power of 2 (d = 64: 1 or 8) */
        mita_gather_rows(qb, d, qkv + (size_t)h * d, ld, qs, nb, d, s);
        mita_gather_rows(lg, lgld, scores, mp, qs, nb, m, 1.0f);
        mita_gemm_shape gl = mita_logits_shape(nb, m, k, d);
        gemm_small_nn(lg + m, qb, ke, gl.m, gl.n, gl.k, gl.lda, gl.ldb, gl.ldc, false);
        mita_joint_softmax(lg, lgld, inv, rec && rec->shared_mass ? mass : NULL, e, nb, m, k,
                           s_shared2);
        for (int r = 0; rec && r < nb; r++) {
            size_t at = (size_t)h * n + mita_report_pos(qs[r], ncls, n);
            if (rec->route) rec->route[at] = e;
            if (rec->shared_mass) rec->shared_mass[at] = mass[r];
        }
        mita_gemm_shape go = mita_output_shape(nb, m, k, d);
        gemm_small_nn(ob, lg, sve, go.m, go.n, go.k, go.lda, go.ldb, go.ldc, false);
        mita_scatter_rows_scaled(out + (size_t)h * d, c, ob, d, qs, inv, nb, d);
        p = end;
    }
}

void mita_cpu_prepare(int c, int heads, int gh, int gw, int k)
{
    int d = c / heads, m = gh * gw;
    for (int nb = 1; nb <= MITA_QB; nb++) {
        mita_gemm_shape g[2] = {mita_logits_shape(nb, m, k, d), mita_output_shape(nb, m, k, d)};
        for (int i = 0; i < 2; i++)
            gemm_small_prepare(g[i].m, g[i].n, g[i].k, g[i].lda, g[i].ldb, g[i].ldc, false);
    }
}

/* Item i of the list after the landmarks: phase 1 of head 0, then for each
 * head h >= 1 phase 1 of h followed by phase 2 of h - 1, then phase 2 of
 * the last head. Returns the phase; *h its head, *j the item within that
 * head's phase (a phase 1 item, or a phase 2 chunk). */
static int mita_item_phase(int *h, int *j, int i, int heads, int per_head, int pchunks)
{
    if (i < per_head) {
        *h = 0, *j = i;
        return 1;
    }
    i -= per_head;
    int s = i / (per_head + pchunks), r = i % (per_head + pchunks); /* block s: head s + 1's */
    if (s + 1 < heads && r < per_head) {
        *h = s + 1, *j = r;
        return 1;
    }
    *h = s, *j = s + 1 < heads ? r - per_head : r; /* the last block holds phase 2 only */
    return 2;
}

void mita_cpu(float *out, const float *qkv, int hp, int wp, int ncls, int c, int heads, int gh,
              int gw, int k, bool shared_scale_d, const ms_mita_record *rec, void *ws, int chunks)
{
    int n = ncls + hp * wp, m = gh * gw, d = c / heads, ld = 3 * c;
    mita_ws w;
    mita_layout(&w, ws, n, c, heads, m, k, chunks);
    float s_shared = mita_shared_scale(d, shared_scale_d);
    int groups = expert_groups(m, heads, chunks), blocks = (n + MITA_RB - 1) / MITA_RB;
    int pchunks = (n + MITA_PC / 2) / MITA_PC;
    if (pchunks < 1) pchunks = 1;
    int per_head = groups + blocks, total = gh + heads * (per_head + pchunks);

    /* Each thread runs single-threaded GEMMs on its items (see
     * attention_full.c for why). */
    gemm_init_threads(); /* single-threaded BLAS inside the parallel region */
    atomic_init(w.next, 0);
    for (int h = 0; h <= heads; h++) atomic_init(&w.done[h], 0);
#pragma omp parallel num_threads(chunks) if (n >= MS_PAR_MIN_TOKENS)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        mita_thread th = thread_share(&w, t, n, c, heads, m, k, chunks);
        int sorted = -1; /* the head whose order th holds */
        /* One list of items, taken in order: the landmarks by grid row;
         * then head by head, phase 1 of head h (its expert groups, then
         * its routing blocks) followed by phase 2 of head h - 1 (its
         * expert-sorted queries in fixed chunks). An item waits only for
         * the items it reads: phase 1 for the landmarks, phase 2 for its
         * head's phase 1, which the lag of one head has mostly finished.
         * Items are taken in order, so the wait is for items in progress
         * on other threads (at the barrier there was between the phases,
         * threads waited for 7-8 % of the layer's samples at N = 1024;
         * each thread pooling every landmark itself, 7 % at N = 16384).
         * A head's phase 2 right after its phase 1, not after every
         * head's, finds its q, k, v and routing logits in the caches
         * (6 heads, N = 4096: 30 MB of them in all). */
        for (int it; (it = atomic_fetch_add_explicit(w.next, 1, memory_order_relaxed)) < total;) {
            if (it < gh) {
                mita_landmarks(w.land, w.landt, qkv + (size_t)ncls * ld, hp, wp, c, gh, gw, it);
                atomic_fetch_add_explicit(&w.done[heads], 1, memory_order_release);
                continue;
            }
            int h, j;
            if (mita_item_phase(&h, &j, it - gh, heads, per_head, pchunks) == 1) {
                mita_wait_count(&w.done[heads], gh);
                if (j < groups) {
                    int e0, e1;
                    expert_group_rows(&e0, &e1, j, groups, m);
                    mita_experts(&w, qkv, w.land, n, ncls, c, d, h, m, k, e0, e1, rec, th.work);
                } else {
                    mita_route(&w, qkv, w.landt, n, c, d, h, m,
                               (int)((long)n * (j - groups) / blocks),
                               (int)((long)n * (j - groups + 1) / blocks));
                }
                atomic_fetch_add_explicit(&w.done[h], 1, memory_order_release);
                continue;
            }
            mita_wait_count(&w.done[h], per_head);
            const int32_t *route = w.route + (size_t)h * n;
            if (h != sorted) mita_sort_queries(&th, route, n, m);
            sorted = h;
            int q0 = mita_chunk_end(&th, route, n, (int)((long)n * j / pchunks));
            int q1 = mita_chunk_end(&th, route, n, (int)((long)n * (j + 1) / pchunks));
            mita_routed(out, qkv, &w, &th, n, ncls, c, d, h, m, k, s_shared, rec, q0, q1);
        }
    }
}
