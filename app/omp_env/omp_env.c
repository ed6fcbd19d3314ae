/* libgomp's idle threads spin by default, which on a desktop (the viewer's
 * own threads, other programs) or a shared machine steals the cores the next
 * parallel loop needs: a DeiT-Tiny forward on 2 busy cores took 1.7-3.3 s
 * spinning and 1.1 s passive. libgomp reads the policy once, in its own
 * constructor, before main runs (and libc resets the environment after the
 * executable's .preinit_array, so that is too early). This one-function
 * shared object is linked right after libgomp: the loader runs the
 * constructors of independent libraries in reverse order of the executable's
 * NEEDED list, so this runs after libc's and before libgomp's.
 * tests/e2e_runtime.sh checks that libgomp sees the policy (GOMP_SPINCOUNT 0)
 * and that it is initialised once (the program never re-executes itself).
 * A policy the user chose wins. */
#include <stdlib.h>

__attribute__((constructor)) static void omp_env_set_passive(void)
{
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
}
