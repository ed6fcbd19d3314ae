/* Full attention on the CPU, flash-attention style: each (head, block of
 * queries) walks the keys a block at a time with an online softmax, so the
 * (n, n) scores never exist. Two kernels:
 *
 * - x86-64-v4 or v3 with head dim 32, 64 or 128: attn_fused_rows
 *   (attention_simd.c), register-blocked AVX-512 (or AVX2 + FMA) for both
 *   products with each tile's exact max, K^T packed once per call (v4:
 *   1.1-1.2x less CPU time than the OpenBLAS kernel below on a 2-core
 *   Xeon, N = 1024-16384; v3 on a Zen 3: 2.62 against 2.73 ms at N = 690,
 *   3 heads, 95 against 97-100 at 4096, warm loops of bench_attention);
 * - otherwise (the baseline path) one sgemm makes the score tile, the
 *   online softmax (base 2, one vectorised pass per row: attention_simd.c)
 *   turns it into weights against each query's running reference and
 *   rescales what was accumulated so far only when that reference moves, a
 *   second sgemm adds tile @ V straight into the output. Two sgemms are
 *   about 90 % of the time.
 *
 * Threads take whole (head, query block) items and call single-threaded
 * sgemm: alternating OpenMP loops with multi-threaded OpenBLAS calls per key
 * block makes the two thread pools spin against each other (measured 4-8x
 * slower on a loaded 2-core machine). */
#include "attention_full.h"

#include <cblas.h>

#include "attention_simd.h"
#include "gemm.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static size_t chunk_floats(int qb, int kb) { return (size_t)qb * kb + 3 * (size_t)qb; }

/* The fused kernel's key tile: a multiple of its 64-key chunks, at most
 * MS_ATTN_FUSED_KB (its 6 rows of weights stay in L1). */
static int fused_kb(int kb)
{
    if (kb > MS_ATTN_FUSED_KB) kb = MS_ATTN_FUSED_KB;
    return (kb + 63) / 64 * 64;
}

/* K^T of every head in 64-key chunks, then each thread's rows. */
static size_t fused_floats(int n, int c, int qb, int kb, int chunks)
{
    size_t nch = ((size_t)n + 63) / 64;
    return (size_t)c * nch * 64 + ATTN_FUSED_WS_FLOATS(qb, fused_kb(kb)) * (size_t)chunks;
}

size_t attention_full_scratch_floats(int n, int c, int qb, int kb, int chunks)
{
    /* either kernel's: the path may change between planning and running */
    if (qb > n) qb = n;
    size_t fused = fused_floats(n, c, qb, kb, chunks);
    if (kb > n) kb = n;
    size_t blas = chunk_floats(qb, kb) * (size_t)chunks;
    return fused > blas ? fused : blas;
}

/* Queries [q0, q0+nq) of head h. */
static void attention_block(float *out /* (n, c) */, const float *qkv /* (n, 3c) */, int n, int c,
                            int d, int h, int q0, int nq, int kb, float *ws /* (nq*kb + 3nq) */)
{
    int ld = 3 * c;
    /* logits in log2 units: the softmax takes powers of 2 (attention_simd.h) */
    float s = 1.44269504088896341f / sqrtf((float)d);
    float *tile = ws;                     /* (nq, kb) scores, then probabilities */
    float *mrun = ws + (size_t)nq * kb;   /* (nq) running reference max (attention_simd.h) */
    float *lrun = mrun + nq;              /* (nq) running sum of 2^(value - reference) */
    float *corr = lrun + nq;              /* (nq) this tile's rescale of each output row */
    float *o = out + (size_t)q0 * c + (size_t)h * d; /* (nq, d), row stride c */
    for (int i = 0; i < nq; i++) {
        mrun[i] = -INFINITY;
        lrun[i] = 0.0f;
    }
    for (int k0 = 0; k0 < n; k0 += kb) {
        int nk = n - k0 < kb ? n - k0 : kb;
        /* tile = s * Q[q0:q0+nq] K[k0:k0+nk]^T, s = log2(e) / sqrt(d) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, d, s,
                    qkv + (size_t)q0 * ld + (size_t)h * d, ld,
                    qkv + (size_t)k0 * ld + c + (size_t)h * d, ld, 0.0f, tile, nk);
        /* one pass per row (after the first tile): exponentials, max, sum;
         * the output rows are rescaled only where the reference max moved
         * (the first tile overwrites them: beta 0) */
        int left = attn_tile_softmax(tile, nq, nk, mrun, lrun, corr);
        for (int i = 0; left > 0 && i < nq; i++) {
            if (corr[i] == corr[i]) continue; /* not NaN: done */
            /* a logit far above the running max (it moved by over 2^64 in
             * one tile), a NaN or an infinity: the row's logits again */
            float *row = tile + (size_t)i * nk;
            cblas_sgemv(CblasRowMajor, CblasNoTrans, nk, d, s,
                        qkv + (size_t)k0 * ld + c + (size_t)h * d, ld,
                        qkv + (size_t)(q0 + i) * ld + (size_t)h * d, 1, 0.0f, row, 1);
            attn_row_softmax(row, nk, &mrun[i], &lrun[i], &corr[i]);
            left--;
        }
        if (k0 > 0) attn_scale_rows(o, nq, d, c, corr);
        /* o = (k0 > 0) o + tile @ V[k0:k0+nk] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, d, nk, 1.0f, tile, nk,
                    qkv + (size_t)k0 * ld + 2 * c + (size_t)h * d, ld, k0 > 0 ? 1.0f : 0.0f, o,
                    c);
    }
    for (int i = 0; i < nq; i++) corr[i] = 1.0f / lrun[i];
    attn_scale_rows(o, nq, d, c, corr);
}

/* Query blocks per head: the fewest of at most qb queries, or up to 4x as
 * many where (head, block) items would leave one of 2 threads idle at the
 * end: at n = 690 (a CamVid frame) one block per head is 3 items, a third
 * of the second thread's time idle; 2 blocks per head are 6 items. Cut for
 * 2 threads whatever the thread count, so that the blocks, and so the
 * bits, never depend on it (OpenBLAS's sums depend on the rows of a
 * call: with the blocks cut for 3 or 4 threads some outputs differed in the
 * last bit). More threads than items idle here: on many cores a CamVid
 * frame's attention (6 items) uses 6 of them. Smaller blocks for all
 * cost 3-7 % on 2 threads (128 queries, N = 690-4096). */
static int query_blocks(int n, int heads, int qb)
{
    const int chunks = 2;
    int nb0 = (n + qb - 1) / qb, best = nb0;
    double best_use = 0.0;
    for (int nb = nb0; nb <= 4 * nb0 && nb <= n; nb++) {
        int items = heads * nb, rounds = (items + chunks - 1) / chunks;
        double use = (double)items / ((double)rounds * chunks); /* busy share of thread time */
        if (use > best_use + 1e-9) {
            best_use = use;
            best = nb;
        }
        if (use >= 0.9) break;
    }
    return best;
}

void attention_full_cpu(float *out, const float *qkv, int n, int c, int heads, int qb, int kb,
                        float *ws, int chunks)
{
    if (qb > n) qb = n;
    if (kb > n) kb = n;
    int d = c / heads;
    size_t stride = chunk_floats(qb, kb); /* per thread, as scratch_floats counted */
    int qblocks = query_blocks(n, heads, qb);
    qb = (n + qblocks - 1) / qblocks;
    qblocks = (n + qb - 1) / qb;
    int items = heads * qblocks;
    if (attn_fused_has(d)) {
        int nch = (n + 63) / 64, fkb = fused_kb(kb);
        float *kt = ws; /* (heads, nch, d, 64) */
        float *rws = ws + (size_t)c * nch * 64;
#pragma omp parallel num_threads(chunks) if (n >= MS_PAR_MIN_TOKENS)
        {
            int t = 0;
#ifdef _OPENMP
            t = omp_get_thread_num();
#endif
#pragma omp for schedule(static)
            for (int hb = 0; hb < heads * nch; hb++)
                attn_pack_kt(kt + (size_t)hb * d * 64, qkv, n, c, d, hb / nch, hb % nch);
#pragma omp for schedule(dynamic)
            for (int it = 0; it < items; it++) {
                int h = it / qblocks, q0 = (it % qblocks) * qb;
                int nq = n - q0 < qb ? n - q0 : qb;
                attn_fused_rows(out, qkv, kt + (size_t)h * nch * d * 64, n, c, d, h, q0, nq, fkb,
                                rws + ATTN_FUSED_WS_FLOATS(qb, fkb) * (size_t)t);
            }
        }
        return;
    }
    gemm_init_threads(); /* single-threaded BLAS inside the parallel region */
#pragma omp parallel num_threads(chunks) if (n >= MS_PAR_MIN_TOKENS)
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        float *tws = ws + stride * (size_t)t;
#pragma omp for schedule(dynamic)
        for (int it = 0; it < items; it++) {
            int h = it / qblocks, q0 = (it % qblocks) * qb;
            int nq = n - q0 < qb ? n - q0 : qb;
            attention_block(out, qkv, n, c, d, h, q0, nq, kb, tws);
        }
    }
}
