#!/usr/bin/env bash
# Start-up cost side by side: `mitaseg --help` wall time and a one-image CPU
# segment's peak RSS, for each program given (say a CUDA build and a
# -DMS_CUDA=OFF one). Runs are interleaved (A B A B ...) so a loaded machine
# slows every program alike; prints min and median.
#   bash bench/bench_startup.sh build/mitaseg build-cpu/mitaseg [runs=20]
# The targets (issue 13): --help under 20 ms; a CUDA build's CPU RSS within
# 5 % of the CPU-only build's.
set -eu
[ $# -ge 1 ] || { echo "usage: $0 MITASEG... [runs]" >&2; exit 2; }
runs=20
bins=()
for a in "$@"; do
    if [[ $a =~ ^[0-9]+$ ]]; then runs=$a; else bins+=("$a"); fi
done
src=$(cd "$(dirname "$0")/.." && pwd)
model=${MITASEG_MODEL:-$src/tests/fixtures/tiny.model.safetensors}
T=$(mktemp -d /tmp/ms_bench_startup.XXXXXX)
trap 'rm -rf "$T"' EXIT
"${MS_PYTHON:-/usr/bin/python3}" "$src/tests/e2e_images.py" img "$T/in.png" 512 384 1 >/dev/null

stats() {
    sort -n | awk '{v[NR] = $1} END {printf "min %8.2f  median %8.2f", v[1], v[int((NR + 1) / 2)]}'
}
for i in $(seq "$runs"); do
    for j in "${!bins[@]}"; do
        t0=$(date +%s%N)
        "${bins[$j]}" --help >/dev/null
        t1=$(date +%s%N)
        echo "scale=3; ($t1 - $t0) / 1000000" | bc >>"$T/help.$j"
        /usr/bin/time -f %M "${bins[$j]}" segment --threads 1 --device "${MS_BENCH_DEVICE:-cpu}" \
            --model "$model" "$T/in.png" -o "$T/out.$j" 2>>"$T/rss.$j" >/dev/null
        rm -rf "$T/out.$j"
    done
done
for j in "${!bins[@]}"; do
    echo "${bins[$j]}"
    echo "  --help wall ms:   $(stats <"$T/help.$j")"
    # /usr/bin/time prints the segment's own stderr first; %M is the last line of each run
    echo "  segment RSS MiB:  $(grep -E '^[0-9]+$' "$T/rss.$j" | awk '{print $1 / 1024}' | stats)"
done
