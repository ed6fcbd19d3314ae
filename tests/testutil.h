/* Helpers shared by the Check tests: fixtures, random data, comparisons. */
#ifndef MS_TESTUTIL_H
#define MS_TESTUTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

/* Path of a fixture file: $MS_FIXTURES/name (static buffer per call site). */
const char *fixture_path(const char *name);
/* The shipped model ($MS_SRC/assets/models/camvid-mita.safetensors), or
 * NULL with a note on stderr where it is not there (per-thread buffer). */
const char *shipped_model_path(void);
/* Deterministic uniform floats in [lo, hi). */
void rand_fill(float *x, size_t n, uint32_t seed, float lo, float hi);
/* max |a-b| and max |b|. */
double max_abs_diff(const float *a, const float *b, size_t n);
double max_abs(const float *a, size_t n);
/* A fresh temporary folder per test (tmpfs when there is one: the sweeps
 * write thousands of small files, and on a busy disk each costs about a ms). */
extern char test_dir[256];
void test_dir_create(const char *tag);   /* checked fixture setup */
void test_dir_remove(void);              /* checked fixture teardown */
/* test_dir/name; a ring of 8 buffers so a few can be held at once. */
const char *test_path(const char *name);
/* The last error message starts with "path:" and (if what) contains what. */
void assert_error_names(const char *path, const char *what);

/* Whole-file write and read, checked; read_bytes' buffer has a spare byte. */
void write_bytes(const char *path, const void *p, size_t n);
uint8_t *read_bytes(const char *path, size_t *n);

/* Runs a suite with Check, returns the process exit code. */
int run_suite(Suite *s);

#endif
