/* MiTA attention on the CPU (spec section 2). Per head: probe GEMM P = L K^T,
 * top-k per landmark with a k-sized heap, shared summaries Sv = softmax(P s) V
 * by GEMM, routing GEMM R = Q L^T, then per query the shared and routed
 * partial softmaxes merged by log-sum-exp. GEMMs accumulate in float like
 * PyTorch's, so the top-k sets agree with a float32 reference except at
 * (near-)ties. */
#include "mita.h"

#include <cblas.h>

#include "gemm.h"
#include "vmath.h"
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

void mita_clamp(int *gh, int *gw, int *k, int hp, int wp, const ms_mita_params *p)
{
    int n = p->ncls + hp * wp;
    *gh = p->gh < 1 ? 1 : (p->gh > hp ? hp : p->gh);
    *gw = p->gw < 1 ? 1 : (p->gw > wp ? wp : p->gw);
    *k = p->topk < 1 ? 1 : (p->topk > n ? n : p->topk);
}

typedef struct {
    float *land;    /* (m, c) landmarks, all heads */
    float *scores;  /* (m, n) probe P of the current head, then (n, m) routing R */
    float *sv;      /* (m, d) shared summaries of the current head */
    float *rowsum;  /* (m) softmax sums of the summaries */
    int32_t *idx;   /* (m, k) routed sets of the current head, best first */
    float *chunk;   /* (chunks, max(m, k) + d) per-chunk logits and routed accumulator */
} mita_ws;

static void *carve(uint8_t *base, size_t *off, size_t bytes)
{
    void *p = base ? base + *off : NULL;
    *off += (bytes + 63) & ~(size_t)63;
    return p;
}

static int chunk_floats(int m, int k, int d) { return (m > k ? m : k) + d; }

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
    w->chunk = carve(b, &off, (size_t)chunks * chunk_floats(m, k, d) * sizeof(float));
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

/* Queries [n0, n1) of head h: route, joint softmax over M shared + k routed
 * logits (two partial softmaxes merged), output and record. The d-loops are
 * marked simd: -O2 does not vectorise them otherwise (they dominate). */
static void mita_queries(float *out /* (n, c) */, const float *qkv /* (n, 3c) */,
                         const mita_ws *w, int n, int ncls, int c, int heads,
                         int h, int m, int k, bool shared_scale_d, const ms_mita_record *rec,
                         float *buf /* (max(m, k) + d) */, int n0, int n1)
{
    int d = c / heads;
    size_t ld = 3 * (size_t)c;
    float s = mita_scale(d), s_shared = mita_shared_scale(d, shared_scale_d);
    float *logit = buf;                          /* (max(m, k)) */
    float *acc_b = buf + (m > k ? m : k);        /* (d) routed accumulator */
    for (int qi = n0; qi < n1; qi++) {
        const float *r = w->scores + (size_t)qi * m; /* R[qi, :] */
        const float *q = qkv + (size_t)qi * ld + (size_t)h * d;
        float *acc_a = out + (size_t)qi * c + (size_t)h * d; /* shared accumulator */
        int e = argmax_first(r, m, 1);

        /* shared part: logits R s s_sh over the M summaries */
        float m_a = r[e] * s_shared, l_a = 0.0f;
        for (int j = 0; j < d; j++) acc_a[j] = 0.0f;
        for (int mi = 0; mi < m; mi++) {
            float p = expf(r[mi] * s_shared - m_a);
            l_a += p;
            const float *sv = w->sv + (size_t)mi * d;
#pragma omp simd
            for (int j = 0; j < d; j++) acc_a[j] += p * sv[j];
        }

        /* routed part: logits q.k s over expert e's positions */
        const int32_t *ids = w->idx + (size_t)e * k;
        float m_b = -INFINITY, l_b = 0.0f;
        for (int t = 0; t < k; t++) {
            const float *kv = qkv + (size_t)ids[t] * ld + c + (size_t)h * d;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int j = 0; j < d; j++) dot += q[j] * kv[j];
            logit[t] = dot * s;
            if (logit[t] > m_b) m_b = logit[t];
        }
        for (int j = 0; j < d; j++) acc_b[j] = 0.0f;
        for (int t = 0; t < k; t++) {
            float p = expf(logit[t] - m_b);
            l_b += p;
            const float *vv = qkv + (size_t)ids[t] * ld + 2 * (size_t)c + (size_t)h * d;
#pragma omp simd
            for (int j = 0; j < d; j++) acc_b[j] += p * vv[j];
        }

        float mm, l, c_a, c_b;
        softmax_merge(&mm, &l, &c_a, &c_b, m_a, l_a, m_b, l_b);
        float inv = 1.0f / l;
        for (int j = 0; j < d; j++) acc_a[j] = (acc_a[j] * c_a + acc_b[j] * c_b) * inv;
        size_t at = (size_t)h * n + mita_report_pos(qi, ncls, n);
        if (rec && rec->route) rec->route[at] = e;
        if (rec && rec->shared_mass) rec->shared_mass[at] = l_a * c_a * inv;
    }
}

void mita_cpu(float *out, const float *qkv, int hp, int wp, int ncls, int c, int heads, int gh,
              int gw, int k, bool shared_scale_d, const ms_mita_record *rec, void *ws, int chunks)
{
    int n = ncls + hp * wp, m = gh * gw, d = c / heads, ld = 3 * c;
    mita_ws w;
    mita_layout(&w, ws, n, c, heads, m, k, chunks);
    mita_landmarks(w.land, qkv + (size_t)ncls * ld, hp, wp, c, gh, gw);
    float s = mita_scale(d);
    int cf = chunk_floats(m, k, d);

    /* One parallel region for all heads; each thread runs single-threaded
     * GEMMs on its share (see attention_full.c for why): probe columns,
     * summary rows, routing rows. Results can differ by an ulp between
     * thread counts (OpenBLAS rounds a GEMM's edge tiles differently). */
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
        float *buf = w.chunk + (size_t)t * cf;
        for (int h = 0; h < heads; h++) {
            const float *qh = qkv + (size_t)h * d;
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
            /* routing logits R = Q L^T (n, m) of my queries, in the probe's buffer */
            if (n1 > n0) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n1 - n0, m, d, 1.0f,
                            qh + (size_t)n0 * ld, ld, lh, c, 0.0f, w.scores + (size_t)n0 * m, m);
                mita_queries(out, qkv, &w, n, ncls, c, heads, h, m, k, shared_scale_d, rec, buf, n0,
                             n1);
            }
#pragma omp barrier /* the next head's probe overwrites R */
        }
    }
}
