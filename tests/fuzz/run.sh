#!/usr/bin/env bash
# Builds the libFuzzer harnesses with clang (ASan + UBSan, build-fuzz/),
# makes their seed corpora (make_corpus.py) and runs each for SECONDS
# (default 60); any crash, leak, sanitizer report or timeout fails the run
# and leaves the input as build-fuzz/fuzz-work/crash-*. The corpora grow in
# build-fuzz/fuzz-work/<harness>/ from run to run. A long run:
#   bash tests/fuzz/run.sh 3600
# Exit 77 (skipped) without clang's libFuzzer.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
command -v clang > /dev/null || { echo "skip: no clang"; exit 77; }
echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' > /tmp/ms_fuzz_probe.$$.c
if ! clang -fsanitize=fuzzer /tmp/ms_fuzz_probe.$$.c -o /tmp/ms_fuzz_probe.$$ 2> /dev/null; then
    rm -f /tmp/ms_fuzz_probe.$$*
    echo "skip: clang has no libFuzzer"
    exit 77
fi
rm -f /tmp/ms_fuzz_probe.$$*

CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMS_FUZZ=ON -DMS_CUDA=OFF -DMS_VIEWER=OFF > /dev/null
ninja -C build-fuzz -j"$(nproc)" fuzz_model fuzz_image
/usr/bin/python3 tests/fuzz/make_corpus.py build-fuzz/fuzz-seeds > /dev/null

status=0
for h in model image; do
    work=build-fuzz/fuzz-work/$h
    mkdir -p "$work"
    log=build-fuzz/fuzz-work/$h.log
    # -timeout: one input may take 20 s at most; -rss_limit_mb: the process.
    if ! (cd build-fuzz/fuzz-work && ASAN_OPTIONS=detect_leaks=1 \
          "../fuzz_$h" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 \
          -print_final_stats=1 "$h" "../fuzz-seeds/$h") > "$log" 2>&1; then
        status=1
        echo "FAIL fuzz_$h:"
        grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$log" | head -20
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
    echo "fuzz_$h: ${runs:-?} executions in ${seconds} s, ${cov:-no coverage line} (edges, features), corpus $(ls "$work" | wc -l) inputs"
done
exit $status
