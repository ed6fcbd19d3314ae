/* MiTA attention on the CPU (spec section 2). Per head: probe GEMM P = L K^T,
 * top-k per landmark with a k-sized heap, shared summaries Sv = softmax(P s) V
 * by GEMM, routing GEMM R = Q L^T. Then everything per query is GEMMs too:
 * the shared part exp(R s s_sh) Sv as one (N x M)(M x d) GEMM per thread;
 * the queries counting-sorted by routed expert, and each expert's k keys and
 * values gathered once into contiguous rows, so its queries' routed logits
 * (nq x k) and outputs (nq x d) are two small GEMMs. The shared and routed
 * partial softmaxes are merged by log-sum-exp per query. GEMMs accumulate in
 * float like PyTorch's, so the top-k sets agree with a float32 reference
 * except at (near-)ties; P and R are computed by the same calls and splits as
 * before the grouping, so routes and routed sets did not change with it. */
#include "mita.h"

#include <cblas.h>

#include "gemm.h"
#include "mita_cuda_math.h" /* mita_scan_groups */
#include "vmath.h"
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

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
    float *m_sh;      /* (n) shared partial softmax: max logit */
    float *l_sh;      /* (n) and sum */
    int *counts;      /* (m) queries per expert */
    int *starts;      /* (m) first position of each expert's queries in order */
    int *fill;        /* (m + 1) scatter cursors, then mita_scan_groups' chunk starts */
    float *thread;    /* (chunks, thread_floats) per-thread gather and tile buffers */
} mita_ws;

static void *carve(uint8_t *base, size_t *off, size_t bytes)
{
    void *p = base ? base + *off : NULL;
    *off += (bytes + 63) & ~(size_t)63;
    return p;
}

/* Per thread: the expert's keys and values (k, d) each, a query block
 * (QB, d), its logits (QB, k) and routed outputs (QB, d); rounded up to
 * whole cache lines so that threads do not share one. */
static size_t thread_floats(int k, int d)
{
    size_t f = 2 * (size_t)k * d + (size_t)MITA_QB * (2 * (size_t)d + (size_t)k);
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
    w->m_sh = carve(b, &off, (size_t)n * sizeof(float));
    w->l_sh = carve(b, &off, (size_t)n * sizeof(float));
    w->counts = carve(b, &off, (size_t)m * sizeof(int));
    w->starts = carve(b, &off, (size_t)m * sizeof(int));
    w->fill = carve(b, &off, ((size_t)m + 1) * sizeof(int));
    w->thread = carve(b, &off, (size_t)chunks * thread_floats(k, d) * sizeof(float));
    return off;
}

size_t mita_scratch_bytes(int hp, int wp, int ncls, int c, int heads, int gh, int gw, int k,
                          int chunks)
{
    mita_ws w;
    return mita_layout(&w, NULL, ncls + hp * wp, c, heads, gh * gw, k, chunks);
}

/* The heap keeps the k best seen so far with the worst at the root. */
static bool heap_worse(const float *score, int a, int b)
{
    return topk_before(score[b], b, score[a], a);
}

static void heap_sift_down(int32_t *heap /* (size) */, int size, int i,
                           const float *score /* (n) */)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, worst = i;
        if (l < size && heap_worse(score, heap[l], heap[worst])) worst = l;
        if (r < size && heap_worse(score, heap[r], heap[worst])) worst = r;
        if (worst == i) return;
        int32_t t = heap[i];
        heap[i] = heap[worst];
        heap[worst] = t;
        i = worst;
    }
}

/* idx = the k best positions of score[0..n) in top-k order, best first.
 * O(n log k); scanning positions in increasing order with a strict "before"
 * keeps the lower position on ties. */
static void topk_row(int32_t *idx /* (k) */, const float *score /* (n) */, int n, int k)
{
    for (int j = 0; j < k; j++) idx[j] = j;
    for (int i = k / 2 - 1; i >= 0; i--) heap_sift_down(idx, k, i, score);
    for (int j = k; j < n; j++) {
        if (topk_before(score[j], j, score[idx[0]], idx[0])) {
            idx[0] = j;
            heap_sift_down(idx, k, 0, score);
        }
    }
    /* Heap sort: the worst goes to the back each time, so the best ends first. */
    for (int size = k - 1; size > 0; size--) {
        int32_t t = idx[0];
        idx[0] = idx[size];
        idx[size] = t;
        heap_sift_down(idx, size, 0, score);
    }
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
            for (int x = x0; x < x1; x++) {
                const float *q = qkv + ((size_t)y * wp + x) * ld;
                for (int ch = 0; ch < c; ch++) l[ch] += q[ch];
            }
        float cnt = (float)((y1 - y0) * (x1 - x0));
        for (int ch = 0; ch < c; ch++) l[ch] /= cnt;
    }
}

/* Shared part of queries [n0, n1) of head h: route e = argmax R[q, :], the
 * partial softmax (m_sh, l_sh) of the logits R s s_sh, whose row of R
 * becomes exp(R s s_sh - m_sh), and the unnormalised shared output
 * exp(R s s_sh - m_sh) Sv into out by one GEMM. */
static void mita_shared(float *out /* (n, c) */, const mita_ws *w, int c, int d, int h, int m,
                        float s_shared, int n0, int n1)
{
    for (int qi = n0; qi < n1; qi++) {
        float *r = w->scores + (size_t)qi * m; /* R[qi, :] */
        int e = argmax_first(r, m, 1);
        float mx = r[e] * s_shared;
        w->route[qi] = e;
        w->m_sh[qi] = mx;
        w->l_sh[qi] = vm_exp_sum(r, m, s_shared, mx);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n1 - n0, d, m, 1.0f,
                w->scores + (size_t)n0 * m, m, w->sv, d, 0.0f, out + (size_t)n0 * c + (size_t)h * d,
                c);
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

/* Routed part of the sorted queries order[p0, p1) of head h, expert by
 * expert in blocks of up to QB: gather the expert's keys and values once,
 * logits = Q K^T s and outputs = softmax(logits) V by GEMM, merge with the
 * shared part in out, normalise, record. */
static void mita_routed(float *out /* (n, c) */, const float *qkv /* (n, 3c) */,
                        const mita_ws *w, int n, int ncls, int c, int d, int h, int k,
                        const ms_mita_record *rec, float *buf /* (thread_floats) */, int p0,
                        int p1)
{
    size_t ld = 3 * (size_t)c;
    float s = mita_scale(d);
    float *ke = buf;                               /* (k, d) the expert's keys */
    float *ve = ke + (size_t)k * d;                /* (k, d) and values */
    float *qb = ve + (size_t)k * d;                /* (QB, d) query block */
    float *lg = qb + (size_t)MITA_QB * d;          /* (QB, k) logits, then weights */
    float *ob = lg + (size_t)MITA_QB * k;          /* (QB, d) routed outputs */
    int have = -1;                                 /* expert whose rows are in ke, ve */
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
                memcpy(ve + (size_t)t * d, row + 2 * (size_t)c, (size_t)d * sizeof(float));
            }
            have = e;
        }
        for (int r = 0; r < nb; r++)
            memcpy(qb + (size_t)r * d, qkv + (size_t)w->order[p + r] * ld + (size_t)h * d,
                   (size_t)d * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, k, d, s, qb, d, ke, d, 0.0f, lg,
                    k);
        float l_b[MITA_QB], m_b[MITA_QB];
        for (int r = 0; r < nb; r++) {
            float *row = lg + (size_t)r * k;
            m_b[r] = row[argmax_first(row, k, 1)];
            l_b[r] = vm_exp_sum(row, k, 1.0f, m_b[r]);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, d, k, 1.0f, lg, k, ve, d, 0.0f,
                    ob, d);
        for (int r = 0; r < nb; r++) {
            int qi = w->order[p + r];
            float mm, l, c_a, c_b;
            softmax_merge(&mm, &l, &c_a, &c_b, w->m_sh[qi], w->l_sh[qi], m_b[r], l_b[r]);
            float inv = 1.0f / l;
            float *acc = out + (size_t)qi * c + (size_t)h * d;
            const float *o = ob + (size_t)r * d;
#pragma omp simd
            for (int j = 0; j < d; j++) acc[j] = (acc[j] * c_a + o[j] * c_b) * inv;
            size_t at = (size_t)h * n + mita_report_pos(qi, ncls, n);
            if (rec && rec->route) rec->route[at] = e;
            if (rec && rec->shared_mass) rec->shared_mass[at] = w->l_sh[qi] * c_a * inv;
        }
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
    size_t tf = thread_floats(k, d);

    /* One parallel region for all heads; each thread runs single-threaded
     * GEMMs on its share (see attention_full.c for why): probe columns,
     * summary rows, routing and shared rows, then an equal share of the
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
            const float *qh = qkv + (size_t)h * d;
            const float *kh = qkv + c + (size_t)h * d;
            const float *vh = qkv + 2 * (size_t)c + (size_t)h * d;
            const float *lh = w.land + (size_t)h * d;

            /* probe P = L K^T (m, n), my columns. The previous head's routed
             * part reads idx, route, order and the softmax stats, not
             * scores, so no barrier is needed before this. */
            if (n1 > n0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n1 - n0, d, 1.0f, lh, c,
                            kh + (size_t)n0 * ld, ld, 0.0f, w.scores + n0, n);
#pragma omp barrier
            /* per expert: routed set, then the row becomes exp(P s - max) */
#pragma omp for schedule(dynamic)
            for (int mi = 0; mi < m; mi++) {
                float *row = w.scores + (size_t)mi * n;
                int32_t *idx = w.idx + (size_t)mi * k;
                topk_row(idx, row, n, k);
                if (rec && rec->topk_idx) {
                    int32_t *dst = rec->topk_idx + ((size_t)h * m + mi) * k;
                    for (int j = 0; j < k; j++) dst[j] = mita_report_pos(idx[j], ncls, n);
                }
                float mx = row[argmax_first(row, n, 1)] * s;
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
            /* routing logits R = Q L^T (n, m) of my queries, in the probe's
             * buffer; routes and the shared part */
            if (n1 > n0) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n1 - n0, m, d, 1.0f,
                            qh + (size_t)n0 * ld, ld, lh, c, 0.0f, w.scores + (size_t)n0 * m, m);
                mita_shared(out, &w, c, d, h, m, s_shared, n0, n1);
            }
#pragma omp barrier
#pragma omp single
            mita_sort_queries(&w, n, m);
            /* routed part: an equal share of the sorted queries each */
            mita_routed(out, qkv, &w, n, ncls, c, d, h, k, rec, buf, n0, n1);
        }
    }
}
