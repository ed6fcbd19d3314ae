#include "gemm.h"

#include <cblas.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h> /* strcasecmp */
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_path.h"

/* oneDNN's dnnl_sgemm (row-major; the same in oneDNN 2.x and 3.x; it
 * returns a status enum, non-zero for bad arguments or a packing buffer
 * it could not allocate), from
 * libdnnl loaded on first use: a program that multiplies nothing maps
 * none of its 40 MB. */
typedef int (*dnnl_sgemm_fn)(char transa, char transb, int64_t m, int64_t n, int64_t k,
                             float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                             float beta, float *c, int64_t ldc);

static const char *const gemm_lib_names[MS_GEMM_LIB_COUNT] = {"openblas", "onednn"};
/* 2.x first: the release whose bits the splits below were measured on */
static const char *const gemm_dnnl_sonames[] = {"libdnnl.so.2", "libdnnl.so.3"};
/* dnnl_cpu_isa_avx512_core's bits, which every later ISA of oneDNN 2.x and
 * 3.x includes */
#define GEMM_DNNL_ISA_AVX512_CORE 0x27

static pthread_once_t gemm_once = PTHREAD_ONCE_INIT;   /* OpenBLAS single-threaded */
static pthread_once_t gemm_choose_once = PTHREAD_ONCE_INIT; /* the library chosen */
static ms_gemm_lib gemm_lib = MS_GEMM_OPENBLAS;
static dnnl_sgemm_fn gemm_dnnl;      /* NULL: oneDNN not loaded or not usable */
static char gemm_why[256];           /* why the library in use is the one */

/* One small product of each kind the engine makes (A B, A B^T, A^T B):
 * oneDNN generates its kernels on the first (35-60 ms). */
static void *gemm_warm(void *arg)
{
    (void)arg;
#ifdef _OPENMP
    omp_set_num_threads(1); /* no thread team of its own */
#endif
    float a[64 * 64] = {0}, b[64 * 64] = {0}, c[64 * 64];
    gemm_dnnl('N', 'N', 64, 64, 64, 1.0f, a, 64, b, 64, 0.0f, c, 64);
    gemm_dnnl('N', 'T', 64, 64, 64, 1.0f, a, 64, b, 64, 1.0f, c, 64);
    gemm_dnnl('T', 'N', 64, 64, 64, 1.0f, a, 64, b, 64, 1.0f, c, 64);
    return NULL;
}

/* oneDNN where it loads and runs its AVX-512 kernels (on its AVX2 ones a
 * row's bits depend on where a call's rows start, at nearly every cut:
 * results would follow the thread count), unless MS_GEMM=openblas. On
 * AVX-512 its sgemm ran the backbone's and the head's products 5-25 %
 * faster than OpenBLAS's Cooperlake kernels (Zen 4, 2 threads). */
static void gemm_choose(void)
{
    const char *want = getenv("MS_GEMM");
    if (want && !*want) want = NULL;
    if (want && !strcasecmp(want, "openblas")) {
        snprintf(gemm_why, sizeof gemm_why, "MS_GEMM=openblas");
        return;
    }
    if (!cpu_path_supported(MS_CPU_PATH_V4)) {
        snprintf(gemm_why, sizeof gemm_why, "no AVX-512 here, which oneDNN's sgemm needs to be "
                                            "used (its bits follow the thread count without it)");
        return;
    }
    const char *from = NULL;
    for (size_t i = 0; i < sizeof gemm_dnnl_sonames / sizeof *gemm_dnnl_sonames && !from; i++) {
        void *h = dlopen(gemm_dnnl_sonames[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        int (*isa)(void) = (int (*)(void))dlsym(h, "dnnl_get_effective_cpu_isa");
        gemm_dnnl = (dnnl_sgemm_fn)dlsym(h, "dnnl_sgemm");
        if (gemm_dnnl && isa && (isa() & GEMM_DNNL_ISA_AVX512_CORE) == GEMM_DNNL_ISA_AVX512_CORE) {
            from = gemm_dnnl_sonames[i];
        } else {
            snprintf(gemm_why, sizeof gemm_why, "%s does not run its AVX-512 kernels here (%s)",
                     gemm_dnnl_sonames[i], gemm_dnnl ? "DNNL_MAX_CPU_ISA?" : "no dnnl_sgemm");
            gemm_dnnl = NULL;
            dlclose(h);
            return;
        }
    }
    if (!from) {
        snprintf(gemm_why, sizeof gemm_why, "oneDNN not found (%s or %s; Debian: libdnnl2)",
                 gemm_dnnl_sonames[0], gemm_dnnl_sonames[1]);
        return;
    }
    gemm_lib = MS_GEMM_ONEDNN;
    if (!want)
        snprintf(gemm_why, sizeof gemm_why, "%s, AVX-512 kernels; MS_GEMM=openblas for OpenBLAS",
                 from);
    else if (!strcasecmp(want, "onednn"))
        snprintf(gemm_why, sizeof gemm_why, "%s, AVX-512 kernels", from);
    else { /* neither name: said (printable, cut short), not obeyed */
        char shown[41];
        ms_copy_printable(shown, sizeof shown, want);
        snprintf(gemm_why, sizeof gemm_why,
                 "%s, AVX-512 kernels; MS_GEMM=%s not understood (openblas or onednn)", from,
                 shown);
    }
}

static void gemm_set_single(void) { openblas_set_num_threads(1); }
void gemm_init_threads(void) { pthread_once(&gemm_once, gemm_set_single); }

/* oneDNN is looked for at the first product or question, not when the
 * threads are set up: a run with no product on the CPU (on the GPU, say)
 * maps none of it. */
static void gemm_init_lib(void)
{
    gemm_init_threads();
    pthread_once(&gemm_choose_once, gemm_choose);
}

bool gemm_warm_begin(pthread_t *thread)
{
    gemm_init_lib();
    return gemm_lib == MS_GEMM_ONEDNN && pthread_create(thread, NULL, gemm_warm, NULL) == 0;
}

void gemm_warm_end(pthread_t thread) { pthread_join(thread, NULL); }

ms_gemm_lib gemm_lib_get(void)
{
    gemm_init_lib();
    return gemm_lib;
}

const char *gemm_lib_name(ms_gemm_lib lib)
{
    return (int)lib >= 0 && lib < MS_GEMM_LIB_COUNT ? gemm_lib_names[lib] : "?";
}

const char *gemm_lib_why(void)
{
    gemm_init_lib();
    return gemm_why;
}

ms_status gemm_lib_set(ms_gemm_lib lib)
{
    gemm_init_lib();
    if (lib == MS_GEMM_ONEDNN && !gemm_dnnl)
        return ms_error(MS_ERR_UNSUPPORTED, "gemm library onednn: %s", gemm_why);
    if (lib != MS_GEMM_OPENBLAS && lib != MS_GEMM_ONEDNN)
        return ms_error(MS_ERR_ARG, "gemm library %d: unknown", (int)lib);
    gemm_lib = lib;
    return MS_OK;
}

/* One single-threaded product. oneDNN threads a call made outside a
 * parallel region over omp_get_max_threads() and may then split k, which
 * would make the bits depend on the thread count: its calls run with one
 * thread (inside a parallel region it runs sequentially by itself). */
static void gemm_one(ms_gemm_lib lib, float *c, const float *a, const float *b, int m, int n,
                     int k, bool ta, bool tb, int lda, int ldb, int ldc, float alpha, float beta)
{
    if (lib == MS_GEMM_ONEDNN && gemm_dnnl) {
#ifdef _OPENMP
        int outer = omp_in_parallel() ? 0 : omp_get_max_threads();
        if (outer > 1) omp_set_num_threads(1); /* this thread's setting only */
#endif
        int st = gemm_dnnl(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta,
                           c, ldc);
#ifdef _OPENMP
        if (outer > 1) omp_set_num_threads(outer);
#endif
        /* a status only where its packing buffer could not be allocated
         * (the arguments are valid): OpenBLAS makes the product instead
         * of leaving it unwritten */
        if (st == 0) return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* OpenBLAS's micro-kernels round a row differently in a full tile and in
 * a call's tail (Haswell/Zen sgemm: tiles of 12 rows; SkylakeX/Cooperlake:
 * 16), so a row's result depends on where a call starts. Cut at multiples
 * of 48, the least common multiple, every row lands in the same kind of
 * tile as in one call over all rows, and the results do not depend on the
 * thread count (on Haswell kernels, cuts at multiples of 16 changed 1255 of
 * 19488 outputs of a 203 x 96 x 64 product). */
#define GEMM_ALIGN 48
/* OpenBLAS 0.3.21 (SkylakeX and Cooperlake cores) runs calls of at most
 * 10^6 multiply-adds on other kernels (its small-matrix ones), and
 * oneDNN 2.6's sgemm, which gives a row the same bits wherever a call
 * starts, runs calls of 1 row or column (its gemv) and A B^T of fewer than
 * 16 rows on other paths (every cut of 100-2000 x 49-5000 products, AVX-512
 * kernels): a product larger than that is cut into parts that are too. */
#define GEMM_MIN_PART 16
/* Columns are never cut where the thread count says: on OpenBLAS's
 * Haswell/Zen sgemm a call computes its first block of 320 columns
 * otherwise than the blocks after it, so the columns of a part that starts
 * past 0 differ from the same columns of one call over all (every cut of a
 * 128 x 5000 x 192 product). A wide product is instead always made as
 * GEMM_COL_CHUNKS calls of at least GEMM_COL_MIN columns (fixed by the
 * shape; 12 shares evenly over 2, 3, 4 and 6 threads), so its bits are the
 * same at every thread count, one thread included. */
#define GEMM_COL_CHUNKS 12
#define GEMM_COL_MIN 64

int gemm_min_part(double other_macs)
{
    double rows = floor(MS_GEMM_SMALL_MACS / (other_macs > 1 ? other_macs : 1)) + 1;
    return rows > 1 << 30 ? 1 << 30 : rows < GEMM_MIN_PART ? GEMM_MIN_PART : (int)rows;
}

int gemm_split_at(int len, int part, int parts, int min_part)
{
    if (part >= parts) return len;
    long align = ((long)min_part + GEMM_ALIGN - 1) / GEMM_ALIGN * GEMM_ALIGN; /* >= min_part */
    long at = ((long)len * part / parts + align / 2) / align * align;
    return at > 0 && at > (long)len - min_part ? len : (int)at;
}

int gemm_split_threads(int *min_part, int len, double other_macs)
{
    int threads = 1;
#ifdef _OPENMP
    if (!omp_in_parallel()) threads = omp_get_max_threads();
#endif
    *min_part = gemm_min_part(other_macs);
    /* Small products, or already inside a parallel region: one call. */
    if (threads <= 1 || (double)len * other_macs <= MS_GEMM_SMALL_MACS ||
        gemm_split_at(len, 1, threads, *min_part) >= len)
        return 1;
    return threads;
}

void gemm_cpu(float *c, const float *a, const float *b, int m, int n, int k, bool ta, bool tb,
              int lda, int ldb, int ldc, float alpha, float beta)
{
    gemm_init_lib();
    gemm_cpu_lib(gemm_lib, c, a, b, m, n, k, ta, tb, lda, ldb, ldc, alpha, beta);
}

int gemm_col_chunks(int n, double other_macs)
{
    if ((double)n * other_macs <= MS_GEMM_SMALL_MACS || n < 2 * GEMM_COL_MIN) return 1;
    int chunks = n / GEMM_COL_MIN;
    return chunks < GEMM_COL_CHUNKS ? chunks : GEMM_COL_CHUNKS;
}

int gemm_col_at(int n, int chunk, int chunks)
{
    if (chunk >= chunks) return n;
    return (int)((long)n * chunk / chunks / 16 * 16); /* 64-byte aligned column starts */
}

void gemm_cpu_whole(float *c, const float *a, const float *b, int m, int n, int k, bool ta,
                    bool tb, int lda, int ldb, int ldc, float alpha, float beta)
{
    gemm_init_lib();
    gemm_one(gemm_lib, c, a, b, m, n, k, ta, tb, lda, ldb, ldc, alpha, beta);
}

void gemm_cpu_lib(ms_gemm_lib lib, float *c, const float *a, const float *b, int m, int n, int k,
                  bool ta, bool tb, int lda, int ldb, int ldc, float alpha, float beta)
{
    gemm_init_lib();
    if (m >= n) {
        /* One slab of rows per thread, cut at gemm_split_at's boundaries. */
        int min_part, threads = gemm_split_threads(&min_part, m, (double)n * k);
        if (threads <= 1) {
            gemm_one(lib, c, a, b, m, n, k, ta, tb, lda, ldb, ldc, alpha, beta);
            return;
        }
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int s = 0; s < threads; s++) {
            int i0 = gemm_split_at(m, s, threads, min_part);
            int cnt = gemm_split_at(m, s + 1, threads, min_part) - i0;
            if (cnt <= 0) continue;
            const float *as = ta ? a + i0 : a + (size_t)i0 * lda;
            gemm_one(lib, c + (size_t)i0 * ldc, as, b, cnt, n, k, ta, tb, lda, ldb, ldc, alpha,
                     beta);
        }
        return;
    }
    /* Wider than tall: column chunks that depend on the shape alone, each
     * one call, whatever the thread count (see GEMM_COL_CHUNKS); the
     * threads share them out. */
    int chunks = gemm_col_chunks(n, (double)m * k), threads = 1;
#ifdef _OPENMP
    if (chunks > 1 && !omp_in_parallel()) threads = omp_get_max_threads();
#endif
    if (threads > chunks) threads = chunks;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int s = 0; s < threads; s++)
        for (int q = s * chunks / threads; q < (s + 1) * chunks / threads; q++) {
            int j0 = gemm_col_at(n, q, chunks), cnt = gemm_col_at(n, q + 1, chunks) - j0;
            const float *bs = tb ? b + (size_t)j0 * ldb : b + j0;
            gemm_one(lib, c + j0, a, bs, m, cnt, k, ta, tb, lda, ldb, ldc, alpha, beta);
        }
}
