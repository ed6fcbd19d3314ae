#include "gemm_small.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h> /* strcasecmp */

#include "cpu_path.h"

#ifdef MS_HAVE_LIBXSMM
#include <libxsmm.h>
#include <libxsmm_generator.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

static const char *const gemm_small_names[MS_GEMM_SMALL_LIB_COUNT] = {"openblas", "libxsmm"};
static pthread_once_t gemm_small_once = PTHREAD_ONCE_INIT;
static ms_gemm_small_lib gemm_small_lib = MS_GEMM_SMALL_OPENBLAS;
static bool gemm_small_xsmm_ok; /* libxsmm built in and generating kernels here */
static char gemm_small_why[160];

#ifdef MS_HAVE_LIBXSMM
/* libxsmm's code generator, called directly rather than through
 * libxsmm_init and its dispatch: the init's registry took 11 MB of
 * resident memory (+8 % peak RSS on the CamVid model), for a few dozen
 * kernels. The kernels are kept here instead, in a table of at most
 * XSMM_KERNELS (a shape beyond it goes to OpenBLAS), each in pages of its
 * own made executable once written, for the process's life. */
typedef void (*xsmm_fn)(const float *a, const float *b, float *c);

typedef struct {
    int m, n, k, lda, ldb, ldc; /* m 0: empty */
    bool accumulate;
    xsmm_fn f; /* NULL: libxsmm made none for this shape (OpenBLAS) */
} xsmm_entry;

#define XSMM_KERNELS 1024
#define XSMM_CODE_MAX (256 * 1024) /* generator's buffer; a kernel is a few KB */
static xsmm_entry xsmm_table[XSMM_KERNELS];
static int xsmm_count;
static pthread_mutex_t xsmm_lock = PTHREAD_MUTEX_INITIALIZER;
static int xsmm_arch; /* libxsmm_cpuid_x86's answer */

static bool xsmm_same(const xsmm_entry *e, int m, int n, int k, int lda, int ldb, int ldc,
                      bool accumulate)
{
    return e->m == m && e->n == n && e->k == k && e->lda == lda && e->ldb == ldb &&
           e->ldc == ldc && e->accumulate == accumulate;
}

/* Generates the kernel for c (m, n) = a (m, k) b (k, n), row-major, or
 * NULL. libxsmm is column-major: the row-major product is its c^T = b^T
 * a^T, with b as its first operand. */
static xsmm_fn xsmm_generate(int m, int n, int k, int lda, int ldb, int ldc, bool accumulate)
{
    libxsmm_descriptor_blob blob;
    libxsmm_gemm_descriptor *desc = libxsmm_sgemm_descriptor_init(
        &blob, n, m, k, ldb, lda, ldc, 1.0f, accumulate ? 1.0f : 0.0f,
        accumulate ? LIBXSMM_GEMM_FLAG_NONE : LIBXSMM_GEMM_FLAG_BETA_0,
        LIBXSMM_GEMM_PREFETCH_NONE);
    if (!desc) return NULL;
    void *buf = malloc(XSMM_CODE_MAX);
    if (!buf) return NULL;
    libxsmm_generated_code gc;
    memset(&gc, 0, sizeof gc);
    gc.generated_code = buf;
    gc.buffer_size = XSMM_CODE_MAX;
    gc.code_type = 2; /* machine code */
    gc.arch = (unsigned)xsmm_arch;
    libxsmm_generator_gemm_kernel(&gc, desc);
    void *code = NULL;
    if (!gc.last_error && gc.code_size > 0) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        size_t bytes = (gc.code_size + page - 1) / page * page;
        code = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (code == MAP_FAILED) {
            code = NULL;
        } else {
            memcpy(code, buf, gc.code_size);
            if (mprotect(code, bytes, PROT_READ | PROT_EXEC)) {
                munmap(code, bytes);
                code = NULL;
            }
        }
    }
    free(buf);
    xsmm_fn f;
    memcpy(&f, &code, sizeof f); /* object to function pointer, as dlsym's callers do */
    return f;
}

/* The table's kernel for the shape, generated on first use. */
static xsmm_fn xsmm_kernel(int m, int n, int k, int lda, int ldb, int ldc, bool accumulate)
{
    xsmm_fn f = NULL;
    pthread_mutex_lock(&xsmm_lock);
    int i = 0;
    while (i < xsmm_count && !xsmm_same(&xsmm_table[i], m, n, k, lda, ldb, ldc, accumulate)) i++;
    if (i < xsmm_count) {
        f = xsmm_table[i].f;
    } else if (xsmm_count < XSMM_KERNELS) {
        f = xsmm_generate(m, n, k, lda, ldb, ldc, accumulate);
        xsmm_table[xsmm_count++] = (xsmm_entry){m, n, k, lda, ldb, ldc, accumulate, f};
    }
    pthread_mutex_unlock(&xsmm_lock);
    return f;
}

/* A thread's kernels by shape, in front of the table and its lock: a
 * layer makes a few hundred products of a few hundred shapes (MiTA's
 * routed blocks at every row count; libxsmm's own registry lookup, a CRC
 * of the descriptor, was 2.5 % of a MiTA layer's time on a Zen 3). Open
 * addressing (a direct-mapped cache of 256 lost 84 of those shapes to
 * collisions), emptied when three quarters full. */
#define XSMM_CACHE 1024 /* a power of 2 */
static _Thread_local xsmm_entry xsmm_cache[XSMM_CACHE];
static _Thread_local int xsmm_cache_used;

static xsmm_fn xsmm_cached(int m, int n, int k, int lda, int ldb, int ldc, bool accumulate)
{
    const int v[7] = {m, n, k, lda, ldb, ldc, accumulate};
    uint32_t h = 0;
    for (int i = 0; i < 7; i++) h = (h * 31u + (uint32_t)v[i]) * 0x9E3779B1u;
    for (unsigned i = h >> 22;; i = (i + 1) & (XSMM_CACHE - 1)) {
        xsmm_entry *e = &xsmm_cache[i];
        if (xsmm_same(e, m, n, k, lda, ldb, ldc, accumulate)) return e->f;
        if (e->m != 0) continue; /* m >= 1 in every entry */
        if (xsmm_cache_used >= XSMM_CACHE / 4 * 3) {
            memset(xsmm_cache, 0, sizeof xsmm_cache);
            xsmm_cache_used = 0;
            e = &xsmm_cache[h >> 22];
        }
        xsmm_fn f = xsmm_kernel(m, n, k, lda, ldb, ldc, accumulate);
        *e = (xsmm_entry){m, n, k, lda, ldb, ldc, accumulate, f};
        xsmm_cache_used++;
        return f;
    }
}
#endif

static void gemm_small_choose(void)
{
#ifdef MS_HAVE_LIBXSMM
    xsmm_arch = libxsmm_cpuid_x86(NULL);
    /* AVX2 and later only (as the v3 path), and a kernel of MiTA's kind
     * must come out */
    gemm_small_xsmm_ok = xsmm_arch >= LIBXSMM_X86_AVX2 && cpu_path_supported(MS_CPU_PATH_V3) &&
                         xsmm_kernel(16, 49, 64, 64, 49, 98, false) != NULL;
    const char *arch = libxsmm_cpuid_name(xsmm_arch);
    const char *want = getenv("MS_SMALL_GEMM");
    if (want && !*want) want = NULL;
    if (!gemm_small_xsmm_ok) {
        snprintf(gemm_small_why, sizeof gemm_small_why,
                 "libxsmm generates no kernel on this CPU (target %s)", arch ? arch : "?");
    } else if (want && !strcasecmp(want, "openblas")) {
        snprintf(gemm_small_why, sizeof gemm_small_why, "MS_SMALL_GEMM=openblas");
    } else {
        gemm_small_lib = MS_GEMM_SMALL_LIBXSMM;
        if (want && strcasecmp(want, "libxsmm")) { /* neither name: said, not obeyed */
            char shown[41];
            ms_copy_printable(shown, sizeof shown, want);
            snprintf(gemm_small_why, sizeof gemm_small_why,
                     "libxsmm %s kernels; MS_SMALL_GEMM=%s not understood (openblas or libxsmm)",
                     arch, shown);
        } else {
            snprintf(gemm_small_why, sizeof gemm_small_why, "libxsmm %s kernels%s", arch,
                     want ? "" : "; MS_SMALL_GEMM=openblas for OpenBLAS");
        }
    }
#else
    snprintf(gemm_small_why, sizeof gemm_small_why, "built without libxsmm (Debian: libxsmm-dev)");
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
        xsmm_fn f = xsmm_cached(m, n, k, lda, ldb, ldc, accumulate);
        if (f) {
            f(b, a, c);
            return;
        }
    }
#endif
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb,
                accumulate ? 1.0f : 0.0f, c, ldc);
}

void gemm_small_prepare(int m, int n, int k, int lda, int ldb, int ldc, bool accumulate)
{
    if (m <= 0 || n <= 0 || k <= 0) return;
    gemm_small_init();
#ifdef MS_HAVE_LIBXSMM
    if (gemm_small_lib == MS_GEMM_SMALL_LIBXSMM) xsmm_kernel(m, n, k, lda, ldb, ldc, accumulate);
#else
    (void)lda, (void)ldb, (void)ldc, (void)accumulate;
#endif
}

int gemm_small_kernels_made(void)
{
#ifdef MS_HAVE_LIBXSMM
    pthread_mutex_lock(&xsmm_lock);
    int made = xsmm_count;
    pthread_mutex_unlock(&xsmm_lock);
    return made;
#else
    return 0;
#endif
}

int gemm_small_cols(int n, int max_cols)
{
    gemm_small_init();
    if (gemm_small_lib != MS_GEMM_SMALL_LIBXSMM) return n;
    int r = (n + 7) & ~7;
    return r < max_cols ? r : (max_cols > n ? max_cols : n);
}
