/* MiTA attention on the CPU (spec section 2). Per head: probe GEMM P = L K^T,
 * top-k per landmark by selection on composite keys, shared summaries
 * Sv = softmax(P s) V by GEMM, routing GEMM R = Q L^T and routes. Then the
 * queries are
 * counting-sorted by routed expert; each expert's k keys and values are
 * gathered once into contiguous rows, so that for a block of its queries the
 * routed logits are one GEMM (nq x k), and the joint softmax's output one
 * more: the weights [shared | routed] (nq x (M + k)), each partial softmax
 * scaled by its log-sum-exp merge factor, times [Sv ; V_e] ((M + k) x d).
 * GEMMs accumulate in float like PyTorch's, so the top-k sets agree with a
 * float32 reference except at (near-)ties; P and R come from the same calls
 * and splits as before the grouping, so routes and routed sets did not
 * change with it. */
#include "mita.h"

#include <cblas.h>

#include "gemm.h"
#include "mita_cuda_math.h" /* mita_scan_groups */
#include "mita_simd.h"
#include "vmath.h"
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Top-k prefilter sample: at most this many times k scores of the row (and
 * at most a quarter of it), so that few scores pass its threshold and the
 * vector pass skips most blocks of the row. */
#define MITA_TOPK_SAMPLE 64

/* Queries per routed GEMM block: the (QB, k) logit tile and (QB, d) output
 * stay in L2 next to the expert's keys and values. */
#define MITA_QB 128

void mita_clamp(int *gh, int *gw, int *k, int hp, int wp, const ms_mita_params *p)
{
    int n = p->ncls + hp * wp;
    *gh = p->gh < 1 ? 1 : (p->gh > hp ? hp : p->gh);
    *gw = p->gw < 1 ? 1 : (p->gw > wp ? wp : p->gw);
    *k = p->topk < 1 ? 1 : (p->topk > n ? n : p->topk);
}

typedef struct {
    float *land;      /* (m, c) landmarks, all heads */
    float *scores;    /* (m, n) probe P of the current head, then (n, m) routing R */
    float *sv;        /* (m, d) shared summaries of the current head */
    float *rowsum;    /* (m) softmax sums of the summaries */
    int32_t *idx;     /* (m, k) routed sets of the current head, best first */
    int32_t *route;   /* (n) expert of each query, current head */
    int32_t *order;   /* (n) queries sorted by expert (counting sort, stable) */
    int *counts;      /* (m) queries per expert */
    int *starts;      /* (m) first position of each expert's queries in order */
    int *fill;        /* (m + 1) mita_scan_groups' chunk starts (unused), then cursors */
    float *thread;    /* (chunks, thread_floats) per-thread gather and tile buffers */
} mita_ws;

static void *carve(uint8_t *base, size_t *off, size_t bytes)
{
    void *p = base ? base + *off : NULL;
    *off += (bytes + 63) & ~(size_t)63;
    return p;
}

/* Per thread, in the top-k phase: keys (n uint64), candidate scores and
 * positions (n each); in the routed phase: the expert's keys (k, d), the
 * summaries and its values (m + k, d), a query block (QB, d), its logits
 * (QB, m + k) and outputs (QB, d). Rounded up to whole cache lines so that
 * threads share none. */
static size_t thread_floats(int n, int m, int k, int d)
{
    size_t topk = 4 * (size_t)n;
    size_t routed = ((size_t)m + 2 * (size_t)k) * d + (size_t)MITA_QB * (2 * (size_t)d + m + k);
    size_t f = topk > routed ? topk : routed;
    return (f + 15) & ~(size_t)15;
}

/* Lays the workspace out at base (NULL: only measures); returns its bytes. */
static size_t mita_layout(mita_ws *w, void *base, int n, int c, int heads, int m, int k,
                          int chunks)
{
    uint8_t *b = (uint8_t *)base;
    int d = c / heads;
    size_t off = 0;
    w->land = carve(b, &off, (size_t)m * c * sizeof(float));
    w->scores = carve(b, &off, (size_t)m * n * sizeof(float));
    w->sv = carve(b, &off, (size_t)m * d * sizeof(float));
    w->rowsum = carve(b, &off, (size_t)m * sizeof(float));
    w->idx = carve(b, &off, (size_t)m * k * sizeof(int32_t));
    w->route = carve(b, &off, (size_t)n * sizeof(int32_t));
    w->order = carve(b, &off, (size_t)n * sizeof(int32_t));
    w->counts = carve(b, &off, (size_t)m * sizeof(int));
    w->starts = carve(b, &off, (size_t)m * sizeof(int));
    w->fill = carve(b, &off, ((size_t)m + 1) * sizeof(int));
    w->thread = carve(b, &off, (size_t)chunks * thread_floats(n, m, k, d) * sizeof(float));
    return off;
}

size_t mita_scratch_bytes(int hp, int wp, int ncls, int c, int heads, int gh, int gw, int k,
                          int chunks)
{
    mita_ws w;
    return mita_layout(&w, NULL, ncls + hp * wp, c, heads, gh * gw, k, chunks);
}

/* Top-k on composite keys (mita_cuda_math.h: topk_composite): one uint64
 * per score whose descending order is topk_before's (higher score first,
 * ties to the lower position), all distinct, so selection needs no tie
 * rules: select the k largest, then sort those. */

static void u64_swap(uint64_t *a, int i, int j)
{
    uint64_t t = a[i];
    a[i] = a[j];
    a[j] = t;
}

static int u64_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

/* Reorders a[0..n) so that its k largest come first (in any order),
 * 1 <= k <= n. Quickselect with a median-of-three pivot; after 64 rounds
 * (adversarial input) a sort finishes it. */
static void u64_select_desc(uint64_t *a, int n, int k)
{
    int lo = 0, hi = n - 1;
    for (int round = 0; lo < hi; round++) {
        if (round == 64) {
            qsort(a + lo, (size_t)(hi - lo + 1), sizeof *a, u64_desc);
            return;
        }
        int mid = lo + (hi - lo) / 2;
        if (a[mid] > a[lo]) u64_swap(a, mid, lo);
        if (a[hi] > a[lo]) u64_swap(a, hi, lo);
        if (a[hi] > a[mid]) u64_swap(a, hi, mid); /* a[lo] >= a[mid] >= a[hi] */
        uint64_t pivot = a[mid];
        int i = lo, j = hi;
        while (i <= j) { /* Hoare partition, descending */
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) u64_swap(a, i++, j--);
        }
        /* a[lo..j] >= pivot >= a[i..hi], j < i, and pivots between */
        if (k <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else return;
    }
}

/* Sorts a[0..n) descending (the k winners: insertion sort unless many). */
static void u64_sort_desc(uint64_t *a, int n)
{
    if (n > 64) {
        qsort(a, (size_t)n, sizeof *a, u64_desc);
        return;
    }
    for (int i = 1; i < n; i++) {
        uint64_t v = a[i];
        int j = i - 1;
        for (; j >= 0 && a[j] < v; j--) a[j + 1] = a[j];
        a[j + 1] = v;
    }
}

/* idx = the k best positions of score[0..n) in top-k order, best first,
 * 1 <= k <= n. Where n is large against k, the k-th best of a strided
 * sample is a threshold t that at least k scores reach, so every score
 * below t is below the row's k-th best and out of its top k: only the
 * scores >= t (about k n / sample of them, found by a vector pass) get
 * keys. */
static void topk_row(int32_t *idx /* (k) */, const float *score /* (n) */, int n, int k,
                     uint64_t *key /* (n) */, float *val /* (n) */, int32_t *pos /* (n) */)
{
    int nc = n, sample = n / 4 < MITA_TOPK_SAMPLE * k ? n / 4 : MITA_TOPK_SAMPLE * k;
    if (sample >= 2 * k) {
        int stride = n / sample;
        for (int i = 0; i < sample; i++)
            key[i] = topk_composite(topk_key(score[(size_t)i * stride]), i * stride);
        u64_select_desc(key, sample, k);
        uint64_t kth = key[0];
        for (int i = 1; i < k; i++) kth = key[i] < kth ? key[i] : kth;
        nc = mita_collect_at_least(val, pos, score, n, score[topk_composite_pos(kth)]);
        if (nc < k) nc = n; /* NaNs in the row: no threshold */
    }
    if (nc == n)
        for (int i = 0; i < n; i++) key[i] = topk_composite(topk_key(score[i]), i);
    else
        for (int i = 0; i < nc; i++) key[i] = topk_composite(topk_key(val[i]), pos[i]);
    u64_select_desc(key, nc, k);
    u64_sort_desc(key, k);
    for (int j = 0; j < k; j++) idx[j] = topk_composite_pos(key[j]);
}

/* L = adaptive average pool of q (all c channels) to (gh, gw); qkv: the grid
 * tokens only (spec 2.7: the class token is not pooled). */
static void mita_landmarks(float *land /* (gh*gw, c) */, const float *qkv /* (hp*wp, 3c) */,
                           int hp, int wp, int c, int gh, int gw)
{
    size_t ld = 3 * (size_t)c;
#pragma omp parallel for schedule(static)
    for (int mi = 0; mi < gh * gw; mi++) {
        int gy = mi / gw, gx = mi % gw;
        int y0 = adaptive_pool_start(gy, hp, gh), y1 = adaptive_pool_end(gy, hp, gh);
        int x0 = adaptive_pool_start(gx, wp, gw), x1 = adaptive_pool_end(gx, wp, gw);
        float *l = land + (size_t)mi * c;
        for (int ch = 0; ch < c; ch++) l[ch] = 0.0f;
        for (int y = y0; y < y1; y++)
            for (int x = x0; x < x1; x++) mita_add(l, qkv + ((size_t)y * wp + x) * ld, c);
        float cnt = (float)((y1 - y0) * (x1 - x0));
        for (int ch = 0; ch < c; ch++) l[ch] /= cnt;
    }
}

/* Routing logits R = Q L^T of queries [n0, n1) of head h, in the probe's
 * buffer, and their routes e = argmax R[q, :] (ties to the lower expert). */
static void mita_route(const mita_ws *w, const float *qkv /* (n, 3c) */, int c, int d, int h,
                       int m, int n0, int n1)
{
    size_t ld = 3 * (size_t)c;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n1 - n0, m, d, 1.0f,
                qkv + (size_t)n0 * ld + (size_t)h * d, (int)ld, w->land + (size_t)h * d, c, 0.0f,
                w->scores + (size_t)n0 * m, m);
    for (int qi = n0; qi < n1; qi++) w->route[qi] = argmax_first(w->scores + (size_t)qi * m, m, 1);
}

/* Counting sort of the queries by expert (stable: ascending query within an
 * expert): counts, starts, order. */
static void mita_sort_queries(const mita_ws *w, int n, int m)
{
    for (int e = 0; e < m; e++) w->counts[e] = 0;
    for (int qi = 0; qi < n; qi++) w->counts[w->route[qi]]++;
    mita_scan_groups(w->starts, w->fill, w->counts, 1, m, MITA_QB);
    for (int e = 0; e < m; e++) w->fill[e] = w->starts[e];
    for (int qi = 0; qi < n; qi++) w->order[w->fill[w->route[qi]]++] = qi;
}

/* Joint softmax of one query over its m shared logits (row[0..m) = R[q, :],
 * scaled by s_sh here) and k routed logits (row[m..m+k), already scaled):
 * the two partial softmaxes, merged by log-sum-exp, become the row's final
 * weights. Returns the shared mass. */
static float mita_weights(float *row /* (m + k) */, int m, int k, int e, float s_shared)
{
    float m_a = row[e] * s_shared; /* e: the argmax of R[q, :] */
    float l_a = vm_exp_sum(row, m, s_shared, m_a);
    float m_b = mita_max(row + m, k);
    float l_b = vm_exp_sum(row + m, k, 1.0f, m_b);
    float mm, l, c_a, c_b;
    softmax_merge(&mm, &l, &c_a, &c_b, m_a, l_a, m_b, l_b);
    float inv = 1.0f / l;
    mita_scale_row(row, m, c_a * inv);
    mita_scale_row(row + m, k, c_b * inv);
    return l_a * c_a * inv;
}

/* Sorted queries order[p0, p1) of head h, expert by expert in blocks of up
 * to QB: gather the expert's keys and values once; logits = Q K^T s by one
 * GEMM beside the block's rows of R; joint softmax weights; out = weights
 * [Sv ; V_e] by one more; record. */
static void mita_routed(float *out /* (n, c) */, const float *qkv /* (n, 3c) */,
                        const mita_ws *w, int n, int ncls, int c, int d, int h, int m, int k,
                        float s_shared, const ms_mita_record *rec,
                        float *buf /* (thread_floats) */, int p0, int p1)
{
    size_t ld = 3 * (size_t)c;
    int mk = m + k;
    float s = mita_scale(d);
    float *ke = buf;                       /* (k, d) the expert's keys */
    float *sve = ke + (size_t)k * d;       /* (m + k, d) summaries, then its values */
    float *qb = sve + (size_t)mk * d;      /* (QB, d) query block */
    float *lg = qb + (size_t)MITA_QB * d;  /* (QB, m + k) logits, then weights */
    float *ob = lg + (size_t)MITA_QB * mk; /* (QB, d) outputs */
    if (p1 > p0) memcpy(sve, w->sv, (size_t)m * d * sizeof(float));
    int have = -1; /* expert whose rows are in ke, sve */
    for (int p = p0; p < p1;) {
        int e = w->route[w->order[p]];
        int end = w->starts[e] + w->counts[e];
        if (end > p1) end = p1;
        if (end > p + MITA_QB) end = p + MITA_QB;
        int nb = end - p;
        if (e != have) {
            const int32_t *ids = w->idx + (size_t)e * k;
            for (int t = 0; t < k; t++) {
                const float *row = qkv + (size_t)ids[t] * ld + (size_t)h * d;
                memcpy(ke + (size_t)t * d, row + c, (size_t)d * sizeof(float));
                memcpy(sve + ((size_t)m + t) * d, row + 2 * (size_t)c, (size_t)d * sizeof(float));
            }
            have = e;
        }
        for (int r = 0; r < nb; r++) {
            int qi = w->order[p + r];
            memcpy(qb + (size_t)r * d, qkv + (size_t)qi * ld + (size_t)h * d,
                   (size_t)d * sizeof(float));
            memcpy(lg + (size_t)r * mk, w->scores + (size_t)qi * m, (size_t)m * sizeof(float));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, k, d, s, qb, d, ke, d, 0.0f,
                    lg + m, mk);
        for (int r = 0; r < nb; r++) {
            float mass = mita_weights(lg + (size_t)r * mk, m, k, e, s_shared);
            size_t at = (size_t)h * n + mita_report_pos(w->order[p + r], ncls, n);
            if (rec && rec->route) rec->route[at] = e;
            if (rec && rec->shared_mass) rec->shared_mass[at] = mass;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, d, mk, 1.0f, lg, mk, sve, d,
                    0.0f, ob, d);
        for (int r = 0; r < nb; r++)
            memcpy(out + (size_t)w->order[p + r] * c + (size_t)h * d, ob + (size_t)r * d,
                   (size_t)d * sizeof(float));
        p = end;
    }
}

void mita_cpu(float *out, const float *qkv, int hp, int wp, int ncls, int c, int heads, int gh,
              int gw, int k, bool shared_scale_d, const ms_mita_record *rec, void *ws, int chunks)
{
    int n = ncls + hp * wp, m = gh * gw, d = c / heads, ld = 3 * c;
    mita_ws w;
    mita_layout(&w, ws, n, c, heads, m, k, chunks);
    mita_landmarks(w.land, qkv + (size_t)ncls * ld, hp, wp, c, gh, gw);
    float s = mita_scale(d), s_shared = mita_shared_scale(d, shared_scale_d);
    size_t tf = thread_floats(n, m, k, d);

    /* One parallel region for all heads; each thread runs single-threaded
     * GEMMs on its share (see attention_full.c for why): probe columns,
     * summary rows, routing rows, then an equal share of the
     * expert-sorted queries. Results can differ by an ulp between thread
     * counts (OpenBLAS rounds a GEMM's edge tiles differently). */
    gemm_init_threads(); /* single-threaded BLAS inside the parallel region */
#pragma omp parallel num_threads(chunks)
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        int n0 = (int)((long)n * t / nt), n1 = (int)((long)n * (t + 1) / nt); /* my tokens */
        int m0 = m * t / nt, m1 = m * (t + 1) / nt;                           /* my experts */
        float *buf = w.thread + (size_t)t * tf;
        for (int h = 0; h < heads; h++) {
            const float *kh = qkv + c + (size_t)h * d;
            const float *vh = qkv + 2 * (size_t)c + (size_t)h * d;
            const float *lh = w.land + (size_t)h * d;

            /* probe P = L K^T (m, n), my columns */
            if (n1 > n0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n1 - n0, d, 1.0f, lh, c,
                            kh + (size_t)n0 * ld, ld, 0.0f, w.scores + n0, n);
#pragma omp barrier
            /* per expert: routed set, then the row becomes exp(P s - max) */
#pragma omp for schedule(dynamic)
            for (int mi = 0; mi < m; mi++) {
                float *row = w.scores + (size_t)mi * n;
                int32_t *idx = w.idx + (size_t)mi * k;
                topk_row(idx, row, n, k, (uint64_t *)buf, buf + 2 * (size_t)n,
                         (int32_t *)(buf + 3 * (size_t)n));
                if (rec && rec->topk_idx) {
                    int32_t *dst = rec->topk_idx + ((size_t)h * m + mi) * k;
                    for (int j = 0; j < k; j++) dst[j] = mita_report_pos(idx[j], ncls, n);
                }
                float mx = mita_max(row, n) * s;
                w.rowsum[mi] = vm_exp_sum(row, n, s, mx);
            }
            /* shared summaries Sv = softmax_n(P s) V, my experts */
            if (m1 > m0) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m1 - m0, d, n, 1.0f,
                            w.scores + (size_t)m0 * n, n, vh, ld, 0.0f, w.sv + (size_t)m0 * d, d);
                for (int mi = m0; mi < m1; mi++)
                    for (int j = 0; j < d; j++) w.sv[(size_t)mi * d + j] /= w.rowsum[mi];
            }
#pragma omp barrier
            /* routing logits R = Q L^T (n, m) and routes of my queries */
            if (n1 > n0) mita_route(&w, qkv, c, d, h, m, n0, n1);
#pragma omp barrier
#pragma omp single
            mita_sort_queries(&w, n, m);
            /* routed part: an equal share of the sorted queries each */
            mita_routed(out, qkv, &w, n, ncls, c, d, h, m, k, s_shared, rec, buf, n0, n1);
#pragma omp barrier /* the next head's probe overwrites R */
        }
    }
}
