#!/usr/bin/env bash
# How the program starts: OpenMP's wait policy is PASSIVE without the program
# re-executing itself (libgomp initialised once, valgrind runs it as is), and a
# policy the user set wins.
set -u

. "$(dirname "$0")/common_e2e.sh"

# OMP_DISPLAY_ENV makes libgomp print its settings once per initialisation:
# a re-executing program prints two blocks.
env -u OMP_WAIT_POLICY OMP_DISPLAY_ENV=verbose "$BIN" --help > /dev/null 2> env.txt
check "libgomp initialised once (no re-exec)" test "$(grep -c 'OPENMP DISPLAY ENVIRONMENT BEGIN' env.txt)" -eq 1
check "passive wait policy reaches libgomp (GOMP_SPINCOUNT 0)" grep -q "GOMP_SPINCOUNT = '0'" env.txt
OMP_WAIT_POLICY=ACTIVE OMP_DISPLAY_ENV=verbose "$BIN" --help > /dev/null 2> env2.txt
check "the user's OMP_WAIT_POLICY wins" grep -q "GOMP_SPINCOUNT = '30000000000'" env2.txt

if command -v valgrind > /dev/null; then
    env -u OMP_WAIT_POLICY valgrind -q --error-exitcode=99 "$BIN" info "$MODEL" > vg.txt 2>&1
    rc=$?
    check "runs under valgrind without OMP_WAIT_POLICY (exit $rc)" test $rc -eq 0
    [ $rc -eq 0 ] || tail -5 vg.txt
else
    echo "skip: no valgrind"
fi

echo "$pass passed, $fails failed"
[ "$fails" -eq 0 ]
