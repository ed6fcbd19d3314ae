#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

const char *fixture_path(const char *name)
{
    static _Thread_local char buf[4096];
    const char *dir = getenv("MS_FIXTURES");
    snprintf(buf, sizeof buf, "%s/%s", dir ? dir : "tests/fixtures", name);
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
