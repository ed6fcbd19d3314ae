/* MiTA on the CPU, grouped by routed expert (kernels/mita.c), against a plain
 * per-query reference written here: the algorithm as the engine ran it
 * before the grouping (spec section 2: per query its routed keys' dot
 * products, one joint softmax), in double, top-k by repeated selection.
 * Odd sizes, head dims that are no multiple of 8, 1 to 6 heads, class token
 * on and off, experts with no query, all queries in one expert, k = n,
 * exact ties, 1 to 4 threads (bit-identical; 4 on 2 cores also has a
 * thread wait for an item that a descheduled one holds);
 * the top-k row alone against a full sort of its keys (ties, signed zeros,
 * infinities, NaNs, k up to n), and the vector row helpers
 * (kernels/mita_simd.c: keys, counts, ranking, routes, joint softmax,
 * gathers) on
 * every CPU path against plain loops. CMake runs this file once more with
 * MS_CPU_PATH=base. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_path.h"
#include "kernels/gemm_small.h"
#include "kernels/mita.h"
#include "kernels/mita_cuda_math.h" /* topk_key, topk_composite */
#include "kernels/mita_simd.h"
#include "kernels/ops.h"
#include "testutil_ops.h"

typedef struct {
    int hp, wp, ncls, heads, d, gh, gw, k; /* gh, gw, k as given (clamped here) */
    bool scale_d;
} mita_case;

typedef struct {
    int n, m, k, c;
    double *out;    /* (n, c) */
    int32_t *topk;  /* (heads, m, k), reported positions */
    int32_t *route; /* (heads, n), reported order */
    double *mass;   /* (heads, n), reported order */
} ref_result;

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n, sz);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* The reference. qkv: (ncls + hp*wp, 3c), class token first. */
static ref_result mita_reference(const float *qkv, const mita_case *tc)
{
    ms_mita_params p = {tc->gh, tc->gw, tc->k, tc->scale_d, tc->ncls};
    int gh, gw, k;
    mita_clamp(&gh, &gw, &k, tc->hp, tc->wp, &p);
    int hp = tc->hp, wp = tc->wp, nc = tc->ncls, d = tc->d, c = tc->heads * d;
    int n = nc + hp * wp, m = gh * gw, ld = 3 * c;
    double s = 1.0 / sqrt(d), s_sh = tc->scale_d ? s : 1.0;
    ref_result r = {n, m, k, c, xcalloc((size_t)n * c, sizeof(double)),
                    xcalloc((size_t)tc->heads * m * k, sizeof(int32_t)),
                    xcalloc((size_t)tc->heads * n, sizeof(int32_t)),
                    xcalloc((size_t)tc->heads * n, sizeof(double))};
    double *land = xcalloc((size_t)m * c, sizeof(double));
    double *P = xcalloc((size_t)m * n, sizeof(double));
    double *sv = xcalloc((size_t)m * d, sizeof(double));
    double *lg = xcalloc((size_t)m + k, sizeof(double));
    bool *taken = xcalloc((size_t)n, sizeof(bool));
    for (int i = 0; i < gh; i++)
        for (int j = 0; j < gw; j++) {
            int y0 = i * hp / gh, y1 = ((i + 1) * hp + gh - 1) / gh;
            int x0 = j * wp / gw, x1 = ((j + 1) * wp + gw - 1) / gw;
            for (int ch = 0; ch < c; ch++) {
                double a = 0;
                for (int y = y0; y < y1; y++)
                    for (int x = x0; x < x1; x++) a += qkv[(size_t)(nc + y * wp + x) * ld + ch];
                land[(i * gw + j) * c + ch] = a / ((y1 - y0) * (x1 - x0));
            }
        }
    for (int h = 0; h < tc->heads; h++) {
        const int hd = h * d;
        for (int e = 0; e < m; e++) {
            for (int t = 0; t < n; t++) {
                const float *kt = qkv + (size_t)t * ld + c + hd;
                double dot = 0;
                for (int j = 0; j < d; j++) dot += land[e * c + hd + j] * kt[j];
                P[(size_t)e * n + t] = dot;
            }
            for (int t = 0; t < n; t++) taken[t] = false;
            for (int j = 0; j < k; j++) { /* best score, ties to the lower position */
                int best = -1;
                for (int t = 0; t < n; t++)
                    if (!taken[t] && (best < 0 || P[(size_t)e * n + t] > P[(size_t)e * n + best]))
                        best = t;
                taken[best] = true;
                r.topk[((size_t)h * m + e) * k + j] = best;
            }
            double mx = -INFINITY, sum = 0;
            for (int t = 0; t < n; t++) mx = fmax(mx, P[(size_t)e * n + t] * s);
            for (int j = 0; j < d; j++) sv[e * d + j] = 0;
            for (int t = 0; t < n; t++) {
                double wt = exp(P[(size_t)e * n + t] * s - mx);
                sum += wt;
                const float *vt = qkv + (size_t)t * ld + 2 * c + hd;
                for (int j = 0; j < d; j++) sv[e * d + j] += wt * vt[j];
            }
            for (int j = 0; j < d; j++) sv[e * d + j] /= sum;
        }
        for (int q = 0; q < n; q++) {
            const float *qv = qkv + (size_t)q * ld + hd;
            int e = 0;
            for (int mi = 0; mi < m; mi++) {
                double dot = 0;
                for (int j = 0; j < d; j++) dot += qv[j] * land[mi * c + hd + j];
                lg[mi] = dot;
                if (dot > lg[e]) e = mi;
            }
            for (int mi = 0; mi < m; mi++) lg[mi] *= s * s_sh;
            const int32_t *ids = r.topk + ((size_t)h * m + e) * k;
            for (int j = 0; j < k; j++) {
                double dot = 0;
                for (int t = 0; t < d; t++) dot += qv[t] * qkv[(size_t)ids[j] * ld + c + hd + t];
                lg[m + j] = dot * s;
            }
            double mx = -INFINITY, sum = 0, sum_sh = 0;
            for (int j = 0; j < m + k; j++) mx = fmax(mx, lg[j]);
            for (int j = 0; j < m + k; j++) sum += exp(lg[j] - mx);
            for (int j = 0; j < m; j++) sum_sh += exp(lg[j] - mx);
            int at = mita_report_pos(q, nc, n);
            r.route[(size_t)h * n + at] = e;
            r.mass[(size_t)h * n + at] = sum_sh / sum;
            for (int t = 0; t < d; t++) {
                double acc = 0;
                for (int j = 0; j < m; j++) acc += exp(lg[j] - mx) * sv[j * d + t];
                for (int j = 0; j < k; j++)
                    acc += exp(lg[m + j] - mx) * qkv[(size_t)ids[j] * ld + 2 * c + hd + t];
                r.out[(size_t)q * c + hd + t] = acc / sum;
            }
        }
        for (int i = 0; i < m * k; i++) /* report the class token as position N */
            r.topk[(size_t)h * m * k + i] = mita_report_pos(r.topk[(size_t)h * m * k + i], nc, n);
    }
    free(land), free(P), free(sv), free(lg), free(taken);
    return r;
}

static void ref_free(ref_result *r) { free(r->out), free(r->topk), free(r->route), free(r->mass); }

typedef struct {
    float *out, *mass;
    int32_t *topk, *route;
} got_result;

/* mita_cpu with `chunks` threads. */
static got_result mita_run(const float *qkv, const mita_case *tc, const ref_result *r, int chunks)
{
    ms_mita_params p = {tc->gh, tc->gw, tc->k, tc->scale_d, tc->ncls};
    int gh, gw, k;
    mita_clamp(&gh, &gw, &k, tc->hp, tc->wp, &p);
    got_result g = {xcalloc((size_t)r->n * r->c, sizeof(float)),
                    xcalloc((size_t)tc->heads * r->n, sizeof(float)),
                    xcalloc((size_t)tc->heads * r->m * k, sizeof(int32_t)),
                    xcalloc((size_t)tc->heads * r->n, sizeof(int32_t))};
    void *ws =
        malloc(mita_scratch_bytes(tc->hp, tc->wp, tc->ncls, r->c, tc->heads, gh, gw, k, chunks));
    ck_assert_ptr_nonnull(ws);
    ms_mita_record rec = {g.topk, g.route, g.mass};
    mita_cpu(g.out, qkv, tc->hp, tc->wp, tc->ncls, r->c, tc->heads, gh, gw, k, tc->scale_d, &rec,
             ws, chunks);
    free(ws);
    return g;
}

static void got_free(got_result *g) { free(g->out), free(g->mass), free(g->topk), free(g->route); }

/* Fails unless max|got - want| <= tol * (1 + max|want|). */
static void check_close_case(const float *got, const double *want, size_t n, double tol,
                        const char *what, int cs)
{
    double err = 0, mx = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= err)) err = isnan(e) ? INFINITY : e, at = i;
        mx = fmax(mx, fabs(want[i]));
    }
    ck_assert_msg(err <= tol * (1.0 + mx), "case %d %s: error %.3g at %zu (got %.7g want %.7g)", cs,
                  what, err, at, (double)got[at], want[at]);
}

/* Routes and routed sets exact, outputs and masses to float tolerance;
 * returns how many (head, expert) pairs got no query. */
static int check_case(const float *qkv, const mita_case *tc, int cs)
{
    ref_result r = mita_reference(qkv, tc);
    int empty = 0;
    float *one = NULL; /* the 1-thread outputs: more threads give the same bits */
    for (int chunks = 1; chunks <= 4; chunks++) {
        got_result g = mita_run(qkv, tc, &r, chunks);
        if (chunks == 1) {
            one = falloc((size_t)r.n * r.c);
            memcpy(one, g.out, (size_t)r.n * r.c * sizeof(float));
        } else {
            ck_assert_mem_eq(g.out, one, (size_t)r.n * r.c * sizeof(float));
        }
        for (size_t i = 0; i < (size_t)tc->heads * r.m * r.k; i++)
            ck_assert_msg(g.topk[i] == r.topk[i], "case %d, %d threads: topk[%zu] = %d, want %d",
                          cs, chunks, i, g.topk[i], r.topk[i]);
        for (size_t i = 0; i < (size_t)tc->heads * r.n; i++)
            ck_assert_msg(g.route[i] == r.route[i], "case %d, %d threads: route[%zu] = %d, want %d",
                          cs, chunks, i, g.route[i], r.route[i]);
        check_close_case(g.out, r.out, (size_t)r.n * r.c, 2e-5, "out", cs);
        check_close_case(g.mass, r.mass, (size_t)tc->heads * r.n, 1e-5, "shared mass", cs);
        got_free(&g);
    }
    ms_free(one);
    for (int h = 0; h < tc->heads; h++)
        for (int e = 0; e < r.m; e++) {
            bool used = false;
            for (int q = 0; q < r.n; q++) used |= r.route[(size_t)h * r.n + q] == e;
            empty += !used;
        }
    ref_free(&r);
    return empty;
}

static float *qkv_random(const mita_case *tc, uint32_t seed)
{
    int n = tc->ncls + tc->hp * tc->wp, c = tc->heads * tc->d;
    float *x = xcalloc((size_t)n * 3 * c, sizeof(float));
    rand_fill(x, (size_t)n * 3 * c, seed, -2.0f, 2.0f);
    return x;
}

START_TEST(test_mita_grouped_vs_per_query)
{
    /* hp, wp, ncls, heads, d, gh, gw, k, shared scale d */
    const mita_case cases[] = {
        {7, 13, 0, 1, 12, 3, 4, 9, true},   /* one head, N = 91 */
        {7, 13, 1, 2, 20, 3, 4, 9, false},  /* class token */
        {5, 9, 1, 3, 5, 7, 7, 49, true},    /* d = 5, grid < 7x7, k = n (46) */
        {9, 11, 0, 4, 12, 7, 7, 49, true},  /* default M, k; many experts */
        {6, 7, 1, 5, 4, 2, 3, 200, false},  /* k > n: clamped to n (43) */
        {11, 23, 1, 6, 12, 7, 7, 9, true},  /* 6 heads, 254 tokens */
        {46, 46, 0, 1, 8, 7, 7, 49, true},  /* 2116 tokens */
        {23, 31, 0, 2, 20, 5, 6, 13, false}, /* 713 tokens, more than a query block per expert */
        {1, 1, 1, 2, 4, 7, 7, 49, true},    /* one grid token and the class token */
    };
    int empty = 0;
    for (int cs = 0; cs < (int)(sizeof cases / sizeof cases[0]); cs++) {
        float *qkv = qkv_random(&cases[cs], 500u + (uint32_t)cs);
        empty += check_case(qkv, &cases[cs], cs);
        free(qkv);
    }
    ck_assert_int_gt(empty, 0); /* experts with no query were covered */
}
END_TEST

START_TEST(test_mita_all_queries_one_expert)
{
    /* Queries positive multiples of one vector u, the tokens of landmark
     * 0's window (only theirs) 10x larger: every query's largest logit is
     * with landmark 0, so one expert takes all queries, more than one query
     * block of them (n = 301). */
    const mita_case tc = {15, 20, 1, 3, 12, 4, 5, 11, true};
    int n = tc.ncls + tc.hp * tc.wp, c = tc.heads * tc.d;
    float *qkv = qkv_random(&tc, 600u);
    int y1 = tc.hp / tc.gh, x1 = tc.wp / tc.gw; /* window 0 = [0, y1) x [0, x1), no overlap */
    for (int t = 0; t < n; t++) {
        int g = t - tc.ncls, hot = g >= 0 && g / tc.wp < y1 && g % tc.wp < x1;
        for (int ch = 0; ch < c; ch++) {
            float u = 1.0f + (float)(ch % 5) * 0.25f, noise = qkv[(size_t)t * 3 * c + ch] * 0.01f;
            qkv[(size_t)t * 3 * c + ch] = (hot ? 10.0f : 0.5f) * u + noise;
        }
    }
    ref_result r = mita_reference(qkv, &tc);
    for (int i = 0; i < tc.heads * n; i++) ck_assert_int_eq(r.route[i], 0);
    ref_free(&r);
    check_case(qkv, &tc, 100);
    free(qkv);
}
END_TEST

START_TEST(test_mita_exact_ties)
{
    /* Integer queries, all equal: the landmarks are that vector exactly,
     * every probe and routing logit an exact integer sum. Keys take one of
     * four integer rows, so scores tie in large classes and the top k cut
     * through a class (lower positions win); every query ties across all
     * experts (route 0), up to n = 2116. */
    const mita_case cases[] = {
        {20, 23, 0, 2, 12, 3, 3, 9, true},
        {20, 23, 1, 3, 5, 7, 7, 49, false},
        {1, 1, 1, 1, 8, 2, 2, 2, true},
        {25, 46, 1, 1, 9, 7, 7, 49, true},
        {45, 47, 1, 1, 9, 7, 7, 49, true},
    };
    for (int cs = 0; cs < (int)(sizeof cases / sizeof cases[0]); cs++) {
        const mita_case *tc = &cases[cs];
        int n = tc->ncls + tc->hp * tc->wp, c = tc->heads * tc->d;
        float *qkv = qkv_random(tc, 700u + (uint32_t)cs); /* values stay random */
        for (int t = 0; t < n; t++) {
            int cls = (int)((t * 2654435761u) >> 7) % 4;
            for (int ch = 0; ch < c; ch++) {
                qkv[(size_t)t * 3 * c + ch] = (float)(1 + ch % 3);
                qkv[(size_t)t * 3 * c + c + ch] = (float)((cls * 7 + ch) % 5 - 2);
            }
        }
        check_case(qkv, tc, 200 + cs);
        ref_result r = mita_reference(qkv, tc);
        for (int i = 0; i < tc->heads * n; i++) ck_assert_int_eq(r.route[i], 0);
        ref_free(&r);
        free(qkv);
    }
}
END_TEST

START_TEST(test_mita_op_threads)
{
    /* Through op_mita (the workspace sized by mita_scratch_bytes from the
     * backend's thread count), 1 to 5 threads: same routes and sets, and
     * the same bits as with 1 (5 threads on 3 heads split each head's
     * experts in two). */
    const mita_case tc = {13, 17, 0, 3, 12, 7, 7, 49, true};
    int n = tc.hp * tc.wp, c = tc.heads * tc.d;
    float *qkv = qkv_random(&tc, 800u);
    ref_result r = mita_reference(qkv, &tc);
    ms_mita_params p = {tc.gh, tc.gw, tc.k, tc.scale_d, 0};
    float *one = xcalloc((size_t)n * c, sizeof(float));
    for (int threads = 1; threads <= 5; threads++) {
        ms_backend be = {.device = MS_DEVICE_CPU, .threads = threads};
        got_result g = {xcalloc((size_t)n * c, sizeof(float)),
                        xcalloc((size_t)tc.heads * n, sizeof(float)),
                        xcalloc((size_t)tc.heads * r.m * r.k, sizeof(int32_t)),
                        xcalloc((size_t)tc.heads * n, sizeof(int32_t))};
        ms_mita_record rec = {g.topk, g.route, g.mass};
        ck_assert_int_eq(op_mita(&be, g.out, qkv, tc.hp, tc.wp, c, tc.heads, &p, &rec), MS_OK);
        ck_assert_mem_eq(g.topk, r.topk, (size_t)tc.heads * r.m * r.k * sizeof(int32_t));
        ck_assert_mem_eq(g.route, r.route, (size_t)tc.heads * n * sizeof(int32_t));
        check_close_case(g.out, r.out, (size_t)n * c, 2e-5, "op out", threads);
        if (threads == 1) memcpy(one, g.out, (size_t)n * c * sizeof(float));
        ck_assert_mem_eq(g.out, one, (size_t)n * c * sizeof(float));
        got_free(&g);
    }
    free(one);
    ref_free(&r);
    free(qkv);
}
END_TEST

START_TEST(test_mita_prepare_routed_kernels)
{
    /* After op_mita_prepare and a first run at a size, runs on other
     * inputs of that size (other routes: other block sizes) make no
     * kernel: the routed blocks' are all made ahead. */
    const mita_case tc = {13, 17, 0, 3, 12, 7, 7, 49, true};
    int n = tc.hp * tc.wp, c = tc.heads * tc.d;
    ms_mita_params p = {tc.gh, tc.gw, tc.k, tc.scale_d, 0};
    ms_backend be = {.device = MS_DEVICE_CPU, .threads = 2};
    float *out = xcalloc((size_t)n * c, sizeof(float));
    op_mita_prepare(&be, c, tc.heads, &p);
    int made = -1;
    for (uint32_t seed = 900u; seed < 906u; seed++) {
        float *qkv = qkv_random(&tc, seed);
        ck_assert_int_eq(op_mita(&be, out, qkv, tc.hp, tc.wp, c, tc.heads, &p, NULL), MS_OK);
        if (made < 0) made = gemm_small_kernels_made();
        else ck_assert_int_eq(gemm_small_kernels_made(), made);
        free(qkv);
    }
    if (gemm_small_lib_get() == MS_GEMM_SMALL_LIBXSMM) /* the routed blocks' 1-128 rows, two products */
        ck_assert_int_ge(made, 2 * 128);
    free(out);
}
END_TEST

START_TEST(test_mita_row_helpers_paths)
{
    /* The row max and the rows' add on every path the CPU runs, at lengths
     * with and without tails, against plain loops. */
    ms_cpu_path start = cpu_path_get();
    int n_paths = cpu_path_count();
    float x[203], acc[203], want[203];
    for (int pi = 0; pi < n_paths; pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        for (int n = 1; n <= 203; n += (n < 40 ? 1 : 27)) {
            for (int i = 0; i < n; i++) x[i] = (float)((i * 37 + n) % 29) * 0.5f - 7.0f;
            float mx = x[0];
            for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
            ck_assert(mita_max(x, n) == mx);
            for (int i = 0; i < n; i++) acc[i] = want[i] = (float)i * 0.25f;
            mita_add_rows(acc, x, 0, 1, n);
            for (int i = 0; i < n; i++) ck_assert(acc[i] == want[i] + x[i]);
            /* rows in order: 3 rows 5 apart (overlapping, ld < n) */
            int rows = (n - 1) / 5 < 3 ? (n - 1) / 5 : 3;
            for (int i = 0; i < n; i++) acc[i] = want[i] = (float)i * 0.25f;
            mita_add_rows(acc, x, 5, rows, n - 5 * rows);
            for (int i = 0; i < n - 5 * rows; i++) {
                for (int r = 0; r < rows; r++) want[i] += x[r * 5 + i];
                ck_assert(acc[i] == want[i]);
            }
        }
    }
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

START_TEST(test_mita_paths_agree)
{
    /* Every CPU path against the base one: identical routes and routed sets
     * (all their row helpers are exact), outputs to float rounding (exp and
     * GEMM sums). */
    int n_paths = cpu_path_count();
    if (n_paths < 2) return;
    ms_cpu_path start = cpu_path_get();
    const mita_case tc = {19, 21, 1, 3, 20, 7, 7, 49, true};
    float *qkv = qkv_random(&tc, 900u);
    ref_result r = mita_reference(qkv, &tc);
    got_result g[MS_CPU_PATH_COUNT];
    for (int pi = 0; pi < n_paths; pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        g[pi] = mita_run(qkv, &tc, &r, 2);
    }
    double *o = xcalloc((size_t)r.n * r.c, sizeof(double));
    for (size_t i = 0; i < (size_t)r.n * r.c; i++) o[i] = g[0].out[i];
    for (int pi = 1; pi < n_paths; pi++) {
        ck_assert_mem_eq(g[0].topk, g[pi].topk, (size_t)tc.heads * r.m * r.k * sizeof(int32_t));
        ck_assert_mem_eq(g[0].route, g[pi].route, (size_t)tc.heads * r.n * sizeof(int32_t));
        char what[32];
        snprintf(what, sizeof what, "%s vs base", cpu_path_name((ms_cpu_path)pi));
        check_close_case(g[pi].out, o, (size_t)r.n * r.c, 1e-5, what, 0);
    }
    free(o);
    for (int pi = 0; pi < n_paths; pi++) got_free(&g[pi]);
    ref_free(&r);
    free(qkv);
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST


/* ---------- the top-k row and the row helpers of the fast path ---------- */

static int u64_cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

/* Row kinds for the top-k: random, few values (ties in large classes),
 * signed zeros, infinities and NaNs of both signs, all equal, increasing,
 * values spread over many binades (the key search's bracket), and clusters
 * of equal values at the top. */
static void topk_fill(float *x, int n, int kind, uint32_t seed)
{
    rand_fill(x, (size_t)n, seed, -3.0f, 3.0f);
    for (int i = 0; i < n; i++) {
        uint32_t h = (uint32_t)i * 2654435761u + seed;
        switch (kind) {
        case 1: x[i] = (float)((int)(h >> 29) % 4 - 1); break;
        case 2: x[i] = (h >> 30) == 0 ? -0.0f : ((h >> 30) == 1 ? 0.0f : x[i]); break;
        case 3: {
            uint32_t r = (h >> 27) % 8;
            x[i] = r == 0 ? INFINITY : r == 1 ? -INFINITY : r == 2 ? NAN : r == 3 ? -NAN : x[i];
            break;
        }
        case 4: x[i] = 1.5f; break;
        case 5: x[i] = (float)i * 0.25f; break;
        case 6: x[i] = ldexpf((h & 1) ? 1.0f : -1.0f, (int)(h >> 24) % 200 - 100); break;
        case 7: x[i] = (h >> 28) < 3 ? 7.0f : x[i]; break;
        default: break;
        }
    }
}

START_TEST(test_mita_topk_rows_paths)
{
    /* mita_topk_row against sorting every (topk_key, position) composite:
     * the exact order (higher first, ties to the lower position, NaNs by
     * their bits), on every CPU path; rows up to 4100, k from 1 to n, past
     * 128 (a sort, not the ranking); and the row's largest score. */
    const int ns[] = {1, 2, 7, 49, 50, 97, 690, 1024, 2049, 3001, 4100};
    const int ks[] = {1, 2, 7, 48, 49, 128, 129, 400};
    ms_cpu_path start = cpu_path_get();
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
            int n = ns[a];
            float *x = falloc((size_t)n);
            uint64_t *ref = calloc((size_t)n, sizeof *ref);
            int32_t *idx = calloc((size_t)n, sizeof *idx);
            ck_assert_ptr_nonnull(ref);
            ck_assert_ptr_nonnull(idx);
            for (int kind = 0; kind < 8; kind++) {
                topk_fill(x, n, kind, 1000u + (uint32_t)(n * 8 + kind));
                for (int i = 0; i < n; i++) ref[i] = topk_composite(topk_key(x[i]), i);
                qsort(ref, (size_t)n, sizeof *ref, u64_cmp_desc);
                for (size_t b = 0; b <= sizeof ks / sizeof ks[0]; b++) {
                    int k = b < sizeof ks / sizeof ks[0] ? ks[b] : n; /* last: k = n */
                    if (k > n) continue;
                    float *buf = falloc(mita_topk_floats(n, k));
                    float mx = mita_topk_row(idx, x, n, k, buf);
                    /* the row's largest score, by key (its bits for a NaN) */
                    ck_assert_msg(topk_key(mx) == (uint32_t)(ref[0] >> 32),
                                  "path %d n %d k %d kind %d: max %g", pi, n, k, kind, mx);
                    for (int j = 0; j < k; j++)
                        ck_assert_msg(idx[j] == topk_composite_pos(ref[j]),
                                      "path %d n %d k %d kind %d: idx[%d] = %d, want %d", pi, n,
                                      k, kind, j, idx[j], topk_composite_pos(ref[j]));
                    ms_free(buf);
                }
            }
            ms_free(x);
            free(ref);
            free(idx);
        }
    }
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

START_TEST(test_mita_fast_helpers_paths)
{
    /* The top-k's key helpers, the ranking, the joint softmax and the row
     * gathers on every path against plain loops, at lengths with and
     * without vector tails. */
    ms_cpu_path start = cpu_path_get();
    enum { N = 203 };
    float x[N], got[N * 3];
    uint32_t key[N + 8], kv[N];
    int32_t pos[N], idx[N], rows[N];
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        for (int n = 1; n <= N; n += (n < 40 ? 1 : 27)) {
            topk_fill(x, n, n % 8, 77u + (uint32_t)n);
            uint32_t lo, hi;
            float s1, s2;
            mita_keys(key, x, n, &lo, &hi, &s1, &s2);
            uint32_t want_lo = UINT32_MAX, want_hi = 0;
            double w1 = 0, w2 = 0;
            for (int i = 0; i < n; i++) {
                ck_assert_uint_eq(key[i], topk_key(x[i]));
                want_lo = key[i] < want_lo ? key[i] : want_lo;
                want_hi = key[i] > want_hi ? key[i] : want_hi;
                w1 += x[i], w2 += (double)x[i] * x[i];
            }
            ck_assert_uint_eq(lo, want_lo);
            ck_assert_uint_eq(hi, want_hi);
            if (w2 < 1e30) { /* the guess's sums, to float rounding */
                ck_assert(fabs(s1 - w1) <= 1e-5 * (1.0 + w2));
                ck_assert(fabs(s2 - w2) <= 1e-5 * (1.0 + w2));
            }
            for (int s = 0; s < n; s += 1 + n / 9) { /* thresholds: keys of the row */
                uint32_t t = key[s];
                int cnt = 0;
                for (int i = 0; i < n; i++) cnt += key[i] >= t;
                ck_assert_int_eq(mita_count_at_least_u32(key, n, t), cnt);
                int nc = mita_collect_at_least_u32(kv, pos, key, n, t), w = 0;
                ck_assert_int_eq(nc, cnt);
                for (int i = 0; i < n; i++)
                    if (key[i] >= t) {
                        ck_assert_int_eq(pos[w], i);
                        ck_assert_uint_eq(kv[w++], key[i]);
                    }
                /* the same, in place over (key, position) pairs */
                for (int i = 0; i < n; i++) kv[i] = key[i], pos[i] = 5000 - i;
                ck_assert_int_eq(mita_compact_at_least_u32(kv, pos, n, t), cnt);
                w = 0;
                for (int i = 0; i < n; i++)
                    if (key[i] >= t) {
                        ck_assert_int_eq(pos[w], 5000 - i);
                        ck_assert_uint_eq(kv[w++], key[i]);
                    }
            }
            /* ranking: descending key, ties to the lower entry */
            int np = (n + 7) & ~7;
            for (int i = n; i < np; i++) key[i] = 0;
            for (int i = 0; i < n; i++) pos[i] = 1000 + i;
            mita_rank_desc(idx, key, pos, n, np);
            for (int j = 0; j < n; j++) {
                int best = -1;
                for (int i = 0; i < n; i++) { /* the j-th: selection by hand */
                    bool used = false;
                    for (int q = 0; q < j; q++) used |= idx[q] == 1000 + i;
                    if (!used && (best < 0 || key[i] > key[best])) best = i;
                }
                ck_assert_int_eq(idx[j], 1000 + best);
            }
            /* routes: each row's first maximum, as argmax_first (rows of
             * the kinds above: ties, signed zeros, NaNs, infinities); in
             * rows padded to ld by +infinity, which must not count */
            for (int m = 1; m <= 70 && m <= n; m += (m < 17 ? 1 : 13)) {
                int nr = n / m;
                mita_argmax_rows(idx, x, nr, m, m);
                for (int r = 0; r < nr; r++)
                    ck_assert_msg(idx[r] == argmax_first(x + (size_t)r * m, m, 1),
                                  "path %d n %d m %d row %d: %d, want %d", pi, n, m, r, idx[r],
                                  argmax_first(x + (size_t)r * m, m, 1));
                int ld = ((m + 7) & ~7) + 4; /* past a vector's end */
                float *xp = falloc((size_t)nr * ld);
                for (int r = 0; r < nr; r++)
                    for (int i = 0; i < ld; i++)
                        xp[(size_t)r * ld + i] = i < m ? x[(size_t)r * m + i] : INFINITY;
                mita_argmax_rows(idx, xp, nr, m, ld);
                for (int r = 0; r < nr; r++)
                    ck_assert_msg(idx[r] == argmax_first(x + (size_t)r * m, m, 1),
                                  "path %d n %d m %d ld %d row %d: %d", pi, n, m, ld, r, idx[r]);
                ms_free(xp);
            }
            /* gathers and the scaled scatter */
            for (int i = 0; i < n; i++) rows[i] = (i * 7 + 3) % n;
            float src[N * 3], fac[N];
            rand_fill(src, (size_t)n * 3, 5u + (uint32_t)n, -1.0f, 1.0f);
            rand_fill(fac, (size_t)n, 6u + (uint32_t)n, -2.0f, 2.0f);
            mita_gather_rows(got, 2, src, 3, rows, n, 2, 1.0f);
            for (int r = 0; r < n; r++)
                for (int t = 0; t < 2; t++)
                    ck_assert(got[r * 2 + t] == src[rows[r] * 3 + t]);
            mita_gather_rows(got, 2, src, 3, rows, n, 2, -0.375f);
            for (int r = 0; r < n; r++)
                for (int t = 0; t < 2; t++)
                    ck_assert(got[r * 2 + t] == src[rows[r] * 3 + t] * -0.375f);
            /* transposed: rows as columns of a (d, n + 3) block, at d with
             * and without an 8-wide tail; the 3 columns past n untouched */
            const int ds[] = {1, 8, 13, 64};
            for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
                int d = ds[di];
                size_t dld = (size_t)n + 3;
                float *src2 = frand((size_t)n * 70, 9u + (uint32_t)n, -1.0f, 1.0f);
                float *dst2 = frand((size_t)d * dld, 10u, 5.0f, 6.0f), *keep = falloc((size_t)d * dld);
                memcpy(keep, dst2, (size_t)d * dld * sizeof(float));
                mita_gather_rows_t(dst2, dld, src2, 70, rows, n, d);
                for (int t = 0; t < d; t++)
                    for (size_t r = 0; r < dld; r++)
                        ck_assert_msg(dst2[t * dld + r] ==
                                          (r < (size_t)n ? src2[rows[r] * 70 + t] : keep[t * dld + r]),
                                      "path %d n %d d %d: [%d][%zu]", pi, n, d, t, r);
                free(src2), free(dst2), free(keep);
            }
            for (int i = 0; i < n * 3; i++) got[i] = -9.0f;
            for (int i = 0; i < n; i++) rows[i] = n - 1 - i; /* a permutation */
            mita_scatter_rows_scaled(got, 3, src, 3, rows, fac, n, 2);
            for (int r = 0; r < n; r++) {
                for (int t = 0; t < 2; t++)
                    ck_assert(got[rows[r] * 3 + t] == src[r * 3 + t] * fac[r]);
                ck_assert(got[rows[r] * 3 + 2] == -9.0f);
            }
        }
    }
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

START_TEST(test_mita_joint_softmax_paths)
{
    /* Rows of m shared logits (their max at column e, as R's at the route)
     * and k routed ones against the softmax in double (2^(x scale)), with
     * odd m, k; a NaN or an infinite logit, shared or routed, makes the
     * row's 1 / sum NaN. The summaries' mita_exp2_sum likewise. Rows
     * padded to ld: the padding (NaN) neither read nor written. */
    const int mks[][2] = {{1, 1}, {3, 5}, {49, 49}, {9, 200}, {64, 16}};
    ms_cpu_path start = cpu_path_get();
    for (int pi = 0; pi < cpu_path_count(); pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        for (int cp = 0; cp < 2 * (int)(sizeof mks / sizeof mks[0]); cp++) {
            int c = cp / 2, m = mks[c][0], k = mks[c][1], mk = m + k, nb = 6, e = m / 2;
            int ld = cp % 2 ? m + ((k + 7) & ~7) + 1 : mk;
            float *lg = frand((size_t)nb * ld, 40u + (uint32_t)c, -20.0f, 20.0f);
            for (int r = 0; r < nb; r++)
                for (int i = mk; i < ld; i++) lg[(size_t)r * ld + i] = NAN;
            /* the shared max at e, the runner-up next to it: a shift other
             * than the row's max would clamp both (2^126) and weigh them
             * alike */
            for (int r = 0; r < nb; r++) {
                lg[(size_t)r * ld + e] += 400.0f;
                if (m > 1) lg[(size_t)r * ld + (e + 1) % m] = lg[(size_t)r * ld + e] - 1.0f;
            }
            double *want = dalloc((size_t)nb * mk), wmass[6];
            float inv[6], mass[6], scale = 0.37f;
            lg[(size_t)1 * ld + mk - 1] = 500.0f; /* a routed logit far above the rest */
            for (int r = 0; r < nb; r++) {
                double mx = -INFINITY, sum = 0, sa = 0;
                for (int i = 0; i < mk; i++) mx = fmax(mx, (double)lg[r * ld + i] * scale);
                for (int i = 0; i < mk; i++) {
                    double ex = exp2((double)lg[r * ld + i] * scale - mx);
                    want[r * mk + i] = ex;
                    sum += ex;
                    sa += i < m ? ex : 0;
                }
                for (int i = 0; i < mk; i++) want[r * mk + i] /= sum;
                wmass[r] = sa / sum;
            }
            lg[(size_t)3 * ld + m] = NAN;
            lg[(size_t)4 * ld + m + k / 2] = INFINITY;
            lg[(size_t)5 * ld + (m - 1) / 2] = m > 1 ? INFINITY : NAN; /* a shared one */
            mita_joint_softmax(lg, ld, inv, mass, e, nb, m, k, scale);
            for (int r = 0; r < nb; r++)
                for (int i = mk; i < ld; i++) ck_assert(isnan(lg[(size_t)r * ld + i]));
            for (int r = 0; r < nb; r++) {
                if (r >= 3) {
                    ck_assert_msg(isnan(inv[r]), "path %d m %d k %d row %d: inv %g", pi, m, k,
                                  r, inv[r]);
                    continue;
                }
                for (int i = 0; i < mk; i++)
                    ck_assert_msg(fabs(lg[r * ld + i] * inv[r] - want[r * mk + i]) <= 2e-6,
                                  "path %d m %d k %d row %d: weight %d %.8g, want %.8g", pi, m,
                                  k, r, i, lg[r * ld + i] * inv[r], want[r * mk + i]);
                ck_assert(fabs(mass[r] - wmass[r]) <= 2e-6);
            }
            mita_joint_softmax(lg, ld, inv, NULL, e, 1, m, k, scale); /* no mass asked */
            /* the summaries' row exp: 2^(x scale - shift) and its sum */
            float *row = frand((size_t)mk, 60u + (uint32_t)c, -20.0f, 20.0f), mx = row[0];
            for (int i = 1; i < mk; i++) mx = fmaxf(mx, row[i]);
            double sum = 0;
            for (int i = 0; i < mk; i++) sum += exp2((double)row[i] * scale - mx * scale);
            float *ex = falloc((size_t)mk);
            memcpy(ex, row, (size_t)mk * sizeof(float));
            ck_assert(fabs(mita_exp2_sum(ex, mk, scale, mx * scale) - sum) <= 2e-6 * sum);
            for (int i = 0; i < mk; i++)
                ck_assert(fabs(ex[i] - exp2((double)row[i] * scale - mx * scale)) <= 2e-7);
            row[mk / 2] = NAN;
            ck_assert(isnan(mita_exp2_sum(row, mk, scale, mx * scale)));
            ms_free(row);
            ms_free(ex);
            ms_free(lg);
            ms_free(want);
        }
    }
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_mita");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_mita_grouped_vs_per_query);
    tcase_add_test(tc, test_mita_all_queries_one_expert);
    tcase_add_test(tc, test_mita_exact_ties);
    tcase_add_test(tc, test_mita_op_threads);
    tcase_add_test(tc, test_mita_row_helpers_paths);
    tcase_add_test(tc, test_mita_paths_agree);
    tcase_add_test(tc, test_mita_topk_rows_paths);
    tcase_add_test(tc, test_mita_fast_helpers_paths);
    tcase_add_test(tc, test_mita_joint_softmax_paths);
    tcase_add_test(tc, test_mita_prepare_routed_kernels);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
