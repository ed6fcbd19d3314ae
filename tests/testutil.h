/* Helpers shared by the Check tests: fixtures, random data, comparisons. */
#ifndef MS_TESTUTIL_H
#define MS_TESTUTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

/* Path of a fixture file: $MS_FIXTURES/name (static buffer per call site). */
const char *fixture_path(const char *name);
/* Deterministic uniform floats in [lo, hi). */
void rand_fill(float *x, size_t n, uint32_t seed, float lo, float hi);
/* max |a-b| and max |b|. */
double max_abs_diff(const float *a, const float *b, size_t n);
double max_abs(const float *a, size_t n);
/* Runs a suite with Check, returns the process exit code. */
int run_suite(Suite *s);

#endif
