#include "gemm_small.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h> /* strcasecmp */

#ifdef MS_HAVE_LIBXSMM
#include <libxsmm.h>
#endif

static const char *const gemm_small_names[MS_GEMM_SMALL_LIB_COUNT] = {"openblas", "libxsmm"};
static pthread_once_t gemm_small_once = PTHREAD_ONCE_INIT;
static ms_gemm_small_lib gemm_small_lib = MS_GEMM_SMALL_OPENBLAS;
static bool gemm_small_xsmm_ok; /* libxsmm built in and generating kernels here */
static char gemm_small_why[160];

#ifdef MS_HAVE_LIBXSMM
/* libxsmm's kernel for c (m, n) = a (m, k) b (k, n), row-major, or NULL.
 * libxsmm is column-major: the row-major product is its c^T = b^T a^T,
 * with b as its first operand. Dispatch finds a generated kernel in
 * libxsmm's registry (thread-safe) or generates it, once per shape. */
static libxsmm_smmfunction xsmm_kernel(int m, int n, int k, int lda, int ldb, int ldc,
                                       bool accumulate)
{
    libxsmm_blasint xm = n, xn = m, xk = k, xlda = ldb, xldb = lda, xldc = ldc;
    float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    int flags = accumulate ? LIBXSMM_GEMM_FLAG_NONE : LIBXSMM_GEMM_FLAG_BETA_0;
    int prefetch = LIBXSMM_PREFETCH_NONE;
    return libxsmm_smmdispatch(xm, xn, xk, &xlda, &xldb, &xldc, &one, &beta, &flags, &prefetch);
}

/* A thread's last kernels by shape, direct-mapped: libxsmm's registry
 * lookup (a CRC of the descriptor, then a compare) was 2.5 % of a MiTA
 * layer's time (Zen 3, N = 1024), where a layer makes a few hundred
 * products of a few dozen shapes. */
#define XSMM_CACHE 64
typedef struct {
    int m, n, k, lda, ldb, ldc; /* m 0: empty */
    bool accumulate;
    libxsmm_smmfunction f;
} xsmm_entry;
static _Thread_local xsmm_entry xsmm_cache[XSMM_CACHE];

static libxsmm_smmfunction xsmm_cached(int m, int n, int k, int lda, int ldb, int ldc,
                                       bool accumulate)
{
    unsigned hsh = (unsigned)m * 73u + (unsigned)n * 151u + (unsigned)k * 23u +
                   (unsigned)lda * 7u + (unsigned)ldb * 3u + (unsigned)ldc + (accumulate ? 37u : 0u);
    xsmm_entry *e = &xsmm_cache[hsh % XSMM_CACHE];
    if (e->m != m || e->n != n || e->k != k || e->lda != lda || e->ldb != ldb || e->ldc != ldc ||
        e->accumulate != accumulate) {
        libxsmm_smmfunction f = xsmm_kernel(m, n, k, lda, ldb, ldc, accumulate);
        if (!f) return NULL; /* not cached: OpenBLAS for this shape, asked again next time */
        *e = (xsmm_entry){m, n, k, lda, ldb, ldc, accumulate, f};
    }
    return e->f;
}
#endif

static void gemm_small_choose(void)
{
#ifdef MS_HAVE_LIBXSMM
    libxsmm_init();
    /* a kernel of MiTA's kind: where libxsmm generates none (a CPU it
     * has no code generator for), it is of no use here */
    gemm_small_xsmm_ok = xsmm_kernel(16, 49, 64, 64, 49, 98, false) != NULL;
    const char *want = getenv("MS_SMALL_GEMM");
    if (want && !*want) want = NULL;
    if (!gemm_small_xsmm_ok) {
        snprintf(gemm_small_why, sizeof gemm_small_why,
                 "libxsmm generates no kernel on this CPU (target %s)", libxsmm_get_target_arch());
    } else if (want && !strcasecmp(want, "openblas")) {
        snprintf(gemm_small_why, sizeof gemm_small_why, "MS_SMALL_GEMM=openblas");
    } else {
        gemm_small_lib = MS_GEMM_SMALL_LIBXSMM;
        if (want && strcasecmp(want, "libxsmm")) { /* neither name: said, not obeyed */
            char shown[41];
            size_t i = 0;
            for (; want[i] && i + 1 < sizeof shown; i++)
                shown[i] = want[i] >= 0x20 && want[i] < 0x7f ? want[i] : '?';
            shown[i] = 0;
            snprintf(gemm_small_why, sizeof gemm_small_why,
                     "libxsmm %s kernels; MS_SMALL_GEMM=%s not understood (openblas or libxsmm)",
                     libxsmm_get_target_arch(), shown);
        } else {
            snprintf(gemm_small_why, sizeof gemm_small_why,
                     "libxsmm %s kernels%s", libxsmm_get_target_arch(),
                     want ? "" : "; MS_SMALL_GEMM=openblas for OpenBLAS");
        }
    }
#else
    snprintf(gemm_small_why, sizeof gemm_small_why,
             "built without libxsmm (Debian: libxsmm-dev)");
#endif
}

static void gemm_small_init(void) { pthread_once(&gemm_small_once, gemm_small_choose); }

ms_gemm_small_lib gemm_small_lib_get(void)
{
    gemm_small_init();
    return gemm_small_lib;
}

const char *gemm_small_lib_why(void)
{
    gemm_small_init();
    return gemm_small_why;
}

const char *gemm_small_lib_name(ms_gemm_small_lib lib)
{
    return (int)lib >= 0 && lib < MS_GEMM_SMALL_LIB_COUNT ? gemm_small_names[lib] : "?";
}

ms_status gemm_small_lib_set(ms_gemm_small_lib lib)
{
    gemm_small_init();
    if (lib == MS_GEMM_SMALL_LIBXSMM && !gemm_small_xsmm_ok)
        return ms_error(MS_ERR_UNSUPPORTED, "small gemm library libxsmm: %s", gemm_small_why);
    if (lib != MS_GEMM_SMALL_OPENBLAS && lib != MS_GEMM_SMALL_LIBXSMM)
        return ms_error(MS_ERR_ARG, "small gemm library %d: unknown", (int)lib);
    gemm_small_lib = lib;
    return MS_OK;
}

void gemm_small_nn(float *c, const float *a, const float *b, int m, int n, int k, int lda,
                   int ldb, int ldc, bool accumulate)
{
    if (m <= 0 || n <= 0) return;
    gemm_small_init();
#ifdef MS_HAVE_LIBXSMM
    if (gemm_small_lib == MS_GEMM_SMALL_LIBXSMM && k > 0) {
        libxsmm_smmfunction f = xsmm_cached(m, n, k, lda, ldb, ldc, accumulate);
        if (f) {
            f(b, a, c);
            return;
        }
    }
#endif
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb,
                accumulate ? 1.0f : 0.0f, c, ldc);
}

int gemm_small_rows(int m, int max_rows)
{
    gemm_small_init();
    if (gemm_small_lib != MS_GEMM_SMALL_LIBXSMM) return m;
    int r = (m + 7) & ~7;
    return r < max_rows ? r : (max_rows > m ? max_rows : m);
}
