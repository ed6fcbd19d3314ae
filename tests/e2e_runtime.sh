#!/usr/bin/env bash
# How the program starts: libgomp gets the wait policy app/omp_env/omp_env.c
# chooses (MS_OMP_WAIT=passive: PASSIVE; spin: a 10000-round spin; auto:
# one of the two by the machine's load) without the program re-executing
# itself (libgomp initialised once, valgrind runs it as is), and a policy the
# user set wins; OpenBLAS starts no thread pool unless the user asks.
set -u

. "$(dirname "$0")/common_e2e.sh"

# OMP_DISPLAY_ENV makes libgomp print its settings once per initialisation:
# a re-executing program prints two blocks.
unset OMP_WAIT_POLICY GOMP_SPINCOUNT
MS_OMP_WAIT=passive OMP_DISPLAY_ENV=verbose "$BIN" --help > /dev/null 2> env.txt
check "libgomp initialised once (no re-exec)" test "$(grep -c 'OPENMP DISPLAY ENVIRONMENT BEGIN' env.txt)" -eq 1
check "passive wait policy reaches libgomp (GOMP_SPINCOUNT 0)" grep -q "GOMP_SPINCOUNT = '0'" env.txt
MS_OMP_WAIT=spin OMP_DISPLAY_ENV=verbose "$BIN" --help > /dev/null 2> env.txt
check "the short spin reaches libgomp (GOMP_SPINCOUNT 10000)" grep -q "GOMP_SPINCOUNT = '10000'" env.txt
env -u MS_OMP_WAIT OMP_DISPLAY_ENV=verbose "$BIN" --help > /dev/null 2> env.txt
check "auto picks one of the two" grep -q -E "GOMP_SPINCOUNT = '(0|10000)'" env.txt
MS_OMP_WAIT=spin OMP_WAIT_POLICY=ACTIVE OMP_DISPLAY_ENV=verbose "$BIN" --help > /dev/null 2> env2.txt
check "the user's OMP_WAIT_POLICY wins" grep -q "GOMP_SPINCOUNT = '30000000000'" env2.txt
MS_OMP_WAIT=passive GOMP_SPINCOUNT=123 OMP_DISPLAY_ENV=verbose "$BIN" --help > /dev/null 2> env2.txt
check "the user's GOMP_SPINCOUNT wins" grep -q "GOMP_SPINCOUNT = '123'" env2.txt
MS_OMP_WAIT=spin "$BIN" doctor > doctor.txt 2>&1
check "doctor shows the wait policy" grep -q "openmp wait: GOMP_SPINCOUNT=10000" doctor.txt
# OpenBLAS starts no thread pool of its own (omp_env.c sets
# OPENBLAS_NUM_THREADS=1 before OpenBLAS's constructor reads it: the link
# order). With more than one CPU, OpenBLAS's default would start one.
env -u OPENBLAS_NUM_THREADS "$BIN" doctor --no-selftest > doctor.txt 2>&1
check "no OpenBLAS thread pool" grep -q "openblas pool: 0 thread(s) besides the main one (OPENBLAS_NUM_THREADS=1)" doctor.txt
if [ "$(nproc)" -gt 1 ]; then
    OPENBLAS_NUM_THREADS=2 "$BIN" doctor --no-selftest > doctor.txt 2>&1
    check "the user's OPENBLAS_NUM_THREADS wins" grep -q "openblas pool: 1 thread(s) besides the main one (OPENBLAS_NUM_THREADS=2)" doctor.txt
fi

if command -v valgrind > /dev/null; then
    valgrind -q --error-exitcode=99 "$BIN" info "$MODEL" > vg.txt 2>&1
    rc=$?
    check "runs under valgrind without OMP_WAIT_POLICY (exit $rc)" test $rc -eq 0
    [ $rc -eq 0 ] || tail -5 vg.txt
else
    echo "skip: no valgrind"
fi

echo "$pass passed, $fails failed"
[ "$fails" -eq 0 ]
