/* MiTA on the CPU, grouped by routed expert (kernels/mita.c), against a plain
 * per-query reference written here: the algorithm as the engine ran it
 * before the grouping (spec section 2: per query its routed keys' dot
 * products, one joint softmax), in double, top-k by repeated selection.
 * Odd sizes, head dims that are no multiple of 8, 1 to 6 heads, class token
 * on and off, experts with no query, all queries in one expert, k = n,
 * exact ties (also past the top-k's sampled prefilter), 1 and 2 threads, and
 * the vector row helpers (kernels/mita_simd.c) on both CPU paths against
 * plain loops. CMake runs this file once more with MS_CPU_PATH=base. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_path.h"
#include "kernels/mita.h"
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
    for (int chunks = 1; chunks <= 2; chunks++) {
        got_result g = mita_run(qkv, tc, &r, chunks);
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
        {11, 23, 1, 6, 12, 7, 7, 9, true},  /* 6 heads; 253 tokens: sampled top-k prefilter */
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
     * experts (route 0). n = 460 and 1151 take the sampled prefilter, whose
     * threshold then lands on a tied score. */
    const mita_case cases[] = {
        {20, 23, 0, 2, 12, 3, 3, 9, true},
        {20, 23, 1, 3, 5, 7, 7, 49, false},
        {1, 1, 1, 1, 8, 2, 2, 2, true},
        {25, 46, 1, 1, 9, 7, 7, 49, true},
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
     * backend's thread count), 1 and 2 threads: same routes and sets. */
    const mita_case tc = {13, 17, 0, 3, 12, 7, 7, 49, true};
    int n = tc.hp * tc.wp, c = tc.heads * tc.d;
    float *qkv = qkv_random(&tc, 800u);
    ref_result r = mita_reference(qkv, &tc);
    ms_mita_params p = {tc.gh, tc.gw, tc.k, tc.scale_d, 0};
    for (int threads = 1; threads <= 2; threads++) {
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
        got_free(&g);
    }
    ref_free(&r);
    free(qkv);
}
END_TEST

START_TEST(test_mita_row_helpers_paths)
{
    /* The vector helpers on every path the CPU runs, at lengths with and
     * without tails, against plain loops; thresholds hit exactly. */
    ms_cpu_path start = cpu_path_get();
    int n_paths = cpu_path_supported(MS_CPU_PATH_V3) ? 2 : 1;
    float x[203], acc[203], want[203], val[203];
    int32_t pos[203];
    for (int pi = 0; pi < n_paths; pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        for (int n = 1; n <= 203; n += (n < 40 ? 1 : 27)) {
            for (int i = 0; i < n; i++) x[i] = (float)((i * 37 + n) % 29) * 0.5f - 7.0f;
            float mx = x[0];
            for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
            ck_assert(mita_max(x, n) == mx);
            for (float t = -8.0f; t <= 8.0f; t += 0.5f) { /* includes every value of x */
                int first = n, nc = 0;
                for (int i = n - 1; i >= 0; i--) first = x[i] > t ? i : first;
                ck_assert_int_eq(mita_first_above(x, n, t), first);
                int got = mita_collect_at_least(val, pos, x, n, t);
                for (int i = 0; i < n; i++)
                    if (x[i] >= t) {
                        ck_assert_int_lt(nc, got);
                        ck_assert_int_eq(pos[nc], i);
                        ck_assert(val[nc++] == x[i]);
                    }
                ck_assert_int_eq(got, nc);
            }
            for (int i = 0; i < n; i++) acc[i] = want[i] = (float)i * 0.25f;
            mita_add(acc, x, n);
            for (int i = 0; i < n; i++) ck_assert(acc[i] == want[i] + x[i]);
            mita_scale_row(acc, n, 0.75f);
            for (int i = 0; i < n; i++) ck_assert(acc[i] == (want[i] + x[i]) * 0.75f);
        }
    }
    ck_assert_int_eq(cpu_path_set(start), MS_OK);
}
END_TEST

START_TEST(test_mita_paths_agree)
{
    /* The two CPU paths: identical routes and routed sets (all their row
     * helpers are exact), outputs to float rounding (exp and GEMM sums). */
    if (!cpu_path_supported(MS_CPU_PATH_V3)) return;
    ms_cpu_path start = cpu_path_get();
    const mita_case tc = {19, 21, 1, 3, 20, 7, 7, 49, true};
    float *qkv = qkv_random(&tc, 900u);
    ref_result r = mita_reference(qkv, &tc);
    got_result g[2];
    for (int pi = 0; pi < 2; pi++) {
        ck_assert_int_eq(cpu_path_set((ms_cpu_path)pi), MS_OK);
        g[pi] = mita_run(qkv, &tc, &r, 2);
    }
    ck_assert_mem_eq(g[0].topk, g[1].topk, (size_t)tc.heads * r.m * r.k * sizeof(int32_t));
    ck_assert_mem_eq(g[0].route, g[1].route, (size_t)tc.heads * r.n * sizeof(int32_t));
    double *o = xcalloc((size_t)r.n * r.c, sizeof(double));
    for (size_t i = 0; i < (size_t)r.n * r.c; i++) o[i] = g[0].out[i];
    check_close_case(g[1].out, o, (size_t)r.n * r.c, 1e-5, "v3 vs base", 0);
    free(o);
    got_free(&g[0]), got_free(&g[1]);
    ref_free(&r);
    free(qkv);
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
    suite_add_tcase(s, tc);
    return run_suite(s);
}
