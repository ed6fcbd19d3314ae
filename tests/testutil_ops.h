/* Helpers shared by the op tests (test_ops*.c): allocations, random data,
 * the tolerance check and naive references; defined in testutil.c. */
#ifndef MS_TESTUTIL_OPS_H
#define MS_TESTUTIL_OPS_H

#include "kernels/ops.h"
#include "testutil.h"

/* A CPU backend with defaults. */
ms_backend cpu_backend(void);
/* Checked zeroed allocations (ms_calloc / calloc; n = 0 gives a pointer). */
float *falloc(size_t n);
double *dalloc(size_t n);
/* falloc'd uniform floats in [lo, hi) (rand_fill). */
float *frand(size_t n, uint32_t seed, float lo, float hi);
/* Fails unless max|got - want| <= tol * (1 + max|want|); a NaN always fails. */
void check_close(const float *got, const double *want, size_t n, double tol, const char *what);
/* The activation in double: the naive reference. */
double naive_act(double x, ms_act act);
/* OpenMP threads for what follows. */
void set_threads(int t);
/* How many CPU paths this build and CPU run (kernels/cpu_path.h): paths
 * 0 .. count-1. */
int cpu_path_count(void);

#endif
