#!/usr/bin/env bash
# The GPU run script (tests/gpu/gpu-run.sh) rehearsed without a GPU, as on
# the development machine: it must run to the end, say what it skipped and
# why, write one summary and one log pack, and exit 0 only because there is
# no GPU. Built with -DMS_CUDA=OFF to keep CI time small (a CUDA build is the
# slow part; the real run builds CUDA on the GPU machine). Also: with a
# stand-in nvidia-smi reporting a driver older than the toolkit it stops
# before building, naming both versions; bad options are usage errors.
# Skipped (77) on a machine that has a GPU: there the real run is the test.
set -u
SRC=${MS_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
RUN=$SRC/tests/gpu/gpu-run.sh
if command -v nvidia-smi >/dev/null 2>&1 && [ -n "$(nvidia-smi -L 2>/dev/null)" ]; then
    echo "skip: this machine has a GPU"
    exit 77
fi
T=$(mktemp -d /tmp/ms_e2e_gpu_run.XXXXXX)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/check_e2e.sh"

bash "$RUN" --phases bogus >"$T/u.out" 2>"$T/u.err"
check "unknown phase: exit 2, one line" bash -c "test $? -eq 2 && test \$(wc -l < '$T/u.err') -eq 1"
bash "$RUN" --frobnicate >/dev/null 2>&1
check "unknown option: exit 2" test $? -eq 2

# A stand-in nvidia-smi: an H200 whose driver supports CUDA 12.4.
mkdir -p "$T/bin"
cat >"$T/bin/nvidia-smi" <<'SMI'
#!/bin/bash
case "$*" in
-L) echo "GPU 0: NVIDIA H200 (UUID: GPU-standin)" ;;
*name,compute_cap,memory.total*) echo "NVIDIA H200, 9.0, 143771 MiB" ;;
*compute_cap*) echo "9.0" ;;
*driver_version*) echo "550.54.15" ;;
*) echo "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |" ;;
esac
SMI
chmod +x "$T/bin/nvidia-smi"
t0=$(date +%s)
PATH="$T/bin:$PATH" OUT="$T/old" MS_GPU_BUILD="$T/build-old" MS_GPU_LOGS="$T/logs-old" \
    bash "$RUN" >"$T/old.out" 2>&1
rc=$?
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    check "driver older than the toolkit: exit 1" test $rc -eq 1
    check "  ... says so with both versions" \
        grep -Eq 'FAIL: the driver supports CUDA 12.4, older than the toolkit.s [0-9]+\.[0-9]+' "$T/old/summary.md"
    check "  ... before building (no build folder, $(($(date +%s) - t0)) s)" test ! -e "$T/build-old"
else
    check "GPU but no toolkit: exit 1, said, nothing built" bash -c \
        "test $rc -eq 1 && grep -q 'no CUDA toolkit' '$T/old/summary.md' && test ! -e '$T/build-old'"
fi

# The rehearsal: no GPU, CPU-only build, the phases that need no GPU to run.
t0=$(date +%s)
OUT="$T/out" MS_GPU_BUILD="$T/build" MS_GPU_LOGS="$T/logs" MS_GPU_CMAKE_ARGS="-DMS_CUDA=OFF" \
    bash "$RUN" --phases doctor,backend,sanitize,bench,train >"$T/run.out" 2>&1
rc=$?
S=$T/out/summary.md
echo "rehearsal: $(($(date +%s) - t0)) s"
check "rehearsal: exit 0" test $rc -eq 0
check "rehearsal: one summary and one log pack, nothing else in OUT" \
    bash -c "test \"\$(ls '$T/out' | tr '\n' ' ')\" = 'logs.tar.gz summary.md '"
check "rehearsal: says there is no GPU" grep -q '^- gpu: none' "$S"
check "rehearsal: build ok" grep -q '^- build: ok' "$S"
check "rehearsal: doctor passed, its table in the summary" \
    bash -c "grep -q '^- doctor: pass' '$S' && grep -Eq '^model +cpu +python reference .* pass' '$S'"
check "rehearsal: CPU tests passed" \
    bash -c "grep -q '^- test_kernel_math: pass' '$S' && grep -q '^- test_batch_engine: pass' '$S'"
check "rehearsal: test_backend skipped, with its reason" grep -Eq '^- test_backend: skipped: .+' "$S"
check "rehearsal: sanitizers and benchmarks skipped: no GPU" \
    bash -c "grep -q '^- sanitize: skipped: no GPU' '$S' && grep -q '^- bench: skipped: no GPU' '$S'"
check "rehearsal: train skipped with a reason" grep -Eq '^- train: skipped: (train-phase.sh missing|no GPU)' "$S"
check "rehearsal: last line: ok because no GPU, skips listed" \
    grep -Eq '^elapsed: [0-9]+ s of a 450 s budget; logs in logs.tar.gz; skipped: .*test_backend.*sanitize bench train; status: ok \(a rehearsal: no GPU here' "$S"
check "rehearsal: the log pack holds the build and test logs" \
    bash -c "tar tzf '$T/out/logs.tar.gz' | grep -q 'build.log' && tar tzf '$T/out/logs.tar.gz' | grep -q 'test_backend.log'"

[ $fails -eq 0 ] || { echo "$fails failed"; tail -30 "$S" 2>/dev/null; exit 1; }
echo "all passed"
