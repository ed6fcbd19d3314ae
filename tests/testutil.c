#define _XOPEN_SOURCE 700 /* nftw */
#include "testutil.h"
#include "testutil_ops.h"

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/common.h"
#include "kernels/cpu_path.h"
#ifdef _OPENMP
#include <omp.h>
#endif

const char *fixture_path(const char *name)
{
    static _Thread_local char buf[4096];
    const char *dir = getenv("MS_FIXTURES");
    snprintf(buf, sizeof buf, "%s/%s", dir ? dir : "tests/fixtures", name);
    return buf;
}

const char *shipped_model_path(void)
{
    static _Thread_local char buf[4096];
    snprintf(buf, sizeof buf, "%s/assets/models/camvid-mita.safetensors",
             getenv("MS_SRC") ? getenv("MS_SRC") : ".");
    FILE *f = fopen(buf, "rb");
    if (!f) {
        fprintf(stderr, "note: %s not found; default-model case not run\n", buf);
        return NULL;
    }
    fclose(f);
    return buf;
}

void rand_fill(float *x, size_t n, uint32_t seed, float lo, float hi)
{
    uint64_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = lo + (hi - lo) * (float)((s >> 40) / 16777216.0);
    }
}

double max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

double max_abs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

int run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

char test_dir[256];

void test_dir_create(const char *tag)
{
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(test_dir, sizeof test_dir, "%s/ms_test_%s_XXXXXX", base, tag);
    ck_assert_ptr_nonnull(mkdtemp(test_dir));
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

void test_dir_remove(void) { nftw(test_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

const char *test_path(const char *name)
{
    static char p[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", test_dir, name);
    return p[k];
}

void assert_error_names(const char *path, const char *what)
{
    const char *m = ms_last_error();
    ck_assert_msg(strncmp(m, path, strlen(path)) == 0 && m[strlen(path)] == ':',
                  "message does not start with the path: %s", m);
    if (what) ck_assert_msg(strstr(m, what) != NULL, "expected '%s' in: %s", what, m);
}

void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(p, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

uint8_t *read_bytes(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    uint8_t *p = malloc(*n + 1);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(fread(p, 1, *n, f), *n);
    fclose(f);
    return p;
}

ms_backend cpu_backend(void)
{
    ms_backend be;
    memset(&be, 0, sizeof be);
    be.device = MS_DEVICE_CPU;
    return be;
}

float *falloc(size_t n)
{
    float *p = ms_calloc(n ? n : 1, sizeof(float));
    ck_assert_ptr_nonnull(p);
    return p;
}

double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    ck_assert_ptr_nonnull(p);
    return p;
}

float *frand(size_t n, uint32_t seed, float lo, float hi)
{
    float *p = falloc(n);
    rand_fill(p, n, seed, lo, hi);
    return p;
}

void check_close(const float *got, const double *want, size_t n, double tol, const char *what)
{
    double err = 0, mx = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= err)) {
            err = isnan(e) ? INFINITY : e;
            at = i;
        }
        if (fabs(want[i]) > mx) mx = fabs(want[i]);
    }
    ck_assert_msg(err <= tol * (1.0 + mx), "%s: max error %.3g at %zu (got %.7g want %.7g), bound %.3g",
                  what, err, at, (double)got[at], want[at], tol * (1.0 + mx));
}

double naive_act(double x, ms_act act)
{
    if (act == MS_ACT_RELU) return x > 0 ? x : 0;
    if (act == MS_ACT_GELU) return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    return x;
}

void set_threads(int t)
{
#ifdef _OPENMP
    omp_set_num_threads(t);
#else
    (void)t;
#endif
}

int cpu_path_count(void)
{
    int n = 1; /* the paths are ordered: a CPU runs every path below its best */
    while (n < MS_CPU_PATH_COUNT && cpu_path_supported((ms_cpu_path)n)) n++;
    return n;
}
