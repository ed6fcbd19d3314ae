#!/usr/bin/env bash
# The GPU check, in one call on the lent GPU machine (docs/gpu.md):
#   OUT=/some/dir bash tests/gpu/device-check.sh
# Builds for the GPU it finds, runs the kernel-math and backend tests, the
# backend test under compute-sanitizer (memcheck; racecheck on the MiTA and
# attention cases) with small shapes, and the attention benchmark; writes
# $OUT/report.txt (short) and $OUT/logs/ (full). Under 5 minutes on an H200.
# Without a GPU it runs to the end with the GPU parts skipped (and says so).
# Debian -dev packages missing there: run tests/gpu/fetch-deps.sh here first
# and carry build-gpu-deps/; they are unpacked into a private prefix.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
OUT=${OUT:-/tmp/mitaseg-device-check}
mkdir -p "$OUT/logs"
REPORT=$OUT/report.txt
: >"$REPORT"
T0=$(date +%s)
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
export MS_FIXTURES="$ROOT/tests/fixtures" OMP_WAIT_POLICY=PASSIVE
JOBS=$(nproc 2>/dev/null || echo 2)
BUILD=$ROOT/${MS_GPU_BUILD:-build-gpu}
STATUS=0

log() { echo "$*" | tee -a "$REPORT"; }
elapsed() { echo $(($(date +%s) - T0)); }
# run NAME TIMEOUT CMD...: output to logs/NAME.log, returns the command's rc.
run() {
    local name=$1 to=$2
    shift 2
    timeout "$to" "$@" >"$OUT/logs/$name.log" 2>&1
}

log "mitaseg device check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"

# ---- the GPU ----
GPU=0
ARCH=90
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    GPU=1
    nvidia-smi >"$OUT/logs/nvidia-smi.log" 2>&1
    log "gpu: $(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader | head -1)"
    CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
    ARCH=$CC
    [ "$CC" = 90 ] && ARCH=90a # the chip's own target, not PTX for an older one
else
    log "gpu: none (nvidia-smi missing or sees no device): GPU parts skipped"
fi
if command -v nvcc >/dev/null 2>&1; then
    log "nvcc: $(nvcc --version | tail -1)"
else
    log "nvcc: missing: CUDA backend not built, GPU parts skipped"
fi

# ---- build dependencies (private prefix from carried .debs if needed) ----
CMAKE_EXTRA=()
missing=""
if ! command -v pkg-config >/dev/null 2>&1; then
    missing="pkg-config"
else
    for m in openblas libcjson check libpng; do
        pkg-config --exists "$m" || missing="$missing $m"
    done
fi
[ -e /usr/include/jpeglib.h ] || ls /usr/include/*/jpeglib.h >/dev/null 2>&1 || missing="$missing libjpeg"
# MS_FORCE_DEPS=1: use the carried .debs even when the system has the
# packages (to test this path on a machine that has them).
[ "${MS_FORCE_DEPS:-0}" = 1 ] && missing="$missing (forced)"
if [ -n "$missing" ]; then
    if ls "$ROOT"/build-gpu-deps/*.deb >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1; then
        PFX=$ROOT/build-gpu-prefix
        rm -rf "$PFX" && mkdir -p "$PFX"
        for deb in "$ROOT"/build-gpu-deps/*.deb; do dpkg -x "$deb" "$PFX"; done
        # .pc files name /usr: point them into the prefix
        find "$PFX" -name '*.pc' -exec sed -i "s|=/usr|=$PFX/usr|g; s| /usr/| $PFX/usr/|g; s|-I/usr|-I$PFX/usr|g; s|-L/usr|-L$PFX/usr|g" {} +
        LIBDIR=$PFX/usr/lib/x86_64-linux-gnu
        export PATH="$PFX/usr/bin:$PATH"
        export PKG_CONFIG_LIBDIR="$LIBDIR/pkgconfig:$LIBDIR/openblas-pthread/pkgconfig:$PFX/usr/share/pkgconfig"
        unset PKG_CONFIG_PATH
        export LD_LIBRARY_PATH="$LIBDIR:$LIBDIR/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        [ -x "$PFX/usr/bin/pkg-config" ] || ln -sf pkgconf "$PFX/usr/bin/pkg-config"
        CMAKE_EXTRA+=("-DCMAKE_PREFIX_PATH=$PFX/usr" "-DCMAKE_INCLUDE_PATH=$PFX/usr/include")
        log "deps: missing:$missing; using carried .debs unpacked in build-gpu-prefix"
    else
        log "deps: missing:$missing; and no build-gpu-deps/*.deb (run tests/gpu/fetch-deps.sh where apt works and carry build-gpu-deps)"
    fi
else
    log "deps: all found on the system"
fi

# cuDNN: the CUDA image may have it only inside PyTorch's wheels
# (site-packages/nvidia/cudnn/{include,lib}); point CMake and the loader there.
if command -v nvcc >/dev/null 2>&1; then
    cudart_inc=$(dirname "$(command -v nvcc)")/../include
    if [ ! -e "$cudart_inc/cudnn.h" ] && [ ! -e /usr/include/cudnn.h ] &&
        ! ls /usr/include/*/cudnn.h >/dev/null 2>&1; then
        dnn_h=$(find /opt /usr/local /usr/lib /root -name cudnn.h -path '*cudnn*' 2>/dev/null | head -1)
        if [ -n "$dnn_h" ]; then
            dnn_inc=$(dirname "$dnn_h")
            dnn_lib=$(ls "$dnn_inc"/../lib/libcudnn.so* "$dnn_inc"/../lib64/libcudnn.so* 2>/dev/null | head -1)
            if [ -n "$dnn_lib" ]; then
                CMAKE_EXTRA+=("-DCUDNN_LIB=$dnn_lib" "-DCMAKE_CUDA_FLAGS=-I$dnn_inc")
                dnn_dir=$(dirname "$dnn_lib")
                export LD_LIBRARY_PATH="$dnn_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                log "cudnn: from $(dirname "$dnn_inc")"
            fi
        else
            log "cudnn: not found (cudnn.h): the build will fail to link"
        fi
    fi
fi

# ---- configure and build (the viewer is not needed; warnings are CI's job,
# a newer compiler here must not stop the check) ----
if run cmake 120 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMS_WERROR=OFF -DMS_VIEWER=OFF "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" "${CMAKE_EXTRA[@]}"; then
    cuda_on=$(grep -o 'CUDA backend [A-Z]*' "$OUT/logs/cmake.log" | tail -1)
    log "configure: ok ($cuda_on, CUDA arch $ARCH)"
else
    log "configure: FAILED (tail of logs/cmake.log below)"
    tail -15 "$OUT/logs/cmake.log" | tee -a "$REPORT"
    log "elapsed: $(elapsed) s"
    exit 1
fi
if run build 240 ninja -C "$BUILD" -j"$JOBS" test_backend test_kernel_math bench_gpu_attention; then
    log "build: ok ($(grep -c 'warning' "$OUT/logs/build.log") warning lines)"
else
    log "build: FAILED (tail of logs/build.log below)"
    grep -E 'error|FAILED' "$OUT/logs/build.log" | head -20 | tee -a "$REPORT"
    log "elapsed: $(elapsed) s"
    exit 1
fi
# the rest of the project, for the record (not needed by this check)
run build-all 120 ninja -C "$BUILD" -j"$JOBS" -k 0 && log "build (all targets): ok" ||
    log "build (all targets): some targets failed, see logs/build-all.log"

# Registers, shared memory and spills of the CUDA kernels (no device time).
if command -v nvcc >/dev/null 2>&1; then
    gen="-gencode=arch=compute_${ARCH},code=sm_${ARCH}"
    for f in mita attention_full; do
        nvcc -c -std=c++17 $gen -Xptxas -v -I"$ROOT/kernels" -DMS_HAVE_CUDA "$ROOT/kernels/$f.cu" \
            -o /dev/null >"$OUT/logs/ptxas-$f.log" 2>&1
    done
    log "ptxas (routed/flash kernels: registers, spills):"
    grep -h -A3 -E "Compiling entry function '.*(routed_kernel|flash_kernel)" "$OUT"/logs/ptxas-*.log |
        grep -E 'entry|registers|spill' |
        sed -E "s/ptxas info *: //; s/Compiling entry function '_Z[0-9]+([a-z_]+)ILi([0-9]+)E[^']*'/\\1<\\2>/" |
        paste - - - | sed 's/^/  /' | tee -a "$REPORT"
fi

# ---- tests ----
run test_kernel_math 120 "$BUILD/test_kernel_math"
rc=$?
log "test_kernel_math: $([ $rc = 0 ] && echo pass || echo "FAIL (rc $rc)"): $(grep -E '^[0-9]+%' "$OUT/logs/test_kernel_math.log")"
[ $rc = 0 ] || STATUS=1

# The batched forward on the GPU against single-image runs (and the CPU).
run test_batch_engine 120 "$BUILD/test_batch_engine"
rc=$?
log "test_batch_engine: $([ $rc = 0 ] && echo pass || echo "FAIL (rc $rc)"): $(grep -E '^[0-9]+%' "$OUT/logs/test_batch_engine.log")"
[ $rc = 0 ] || STATUS=1

run test_backend 240 "$BUILD/test_backend"
rc=$?
case $rc in
0) log "test_backend: pass: $(grep -E '^[0-9]+%' "$OUT/logs/test_backend.log")" ;;
77) log "test_backend: $(head -1 "$OUT/logs/test_backend.log")" ;;
*)
    log "test_backend: FAIL (rc $rc):"
    grep -E '^[0-9]+%|:F:|:E:' "$OUT/logs/test_backend.log" | head -20 | sed 's/^/  /' | tee -a "$REPORT"
    STATUS=1
    ;;
esac

if [ $GPU = 1 ] && [ $rc != 77 ]; then
    if command -v compute-sanitizer >/dev/null 2>&1; then
        MS_BACKEND_SMALL=1 run memcheck 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
            "$BUILD/test_backend"
        rc=$?
        log "memcheck (small shapes): rc $rc, $(grep -E 'ERROR SUMMARY' "$OUT/logs/memcheck.log" | tail -1)"
        [ $rc = 0 ] || STATUS=1
        for case_ in mita attention; do
            MS_BACKEND_SMALL=1 CK_RUN_CASE=$case_ run "racecheck-$case_" 90 compute-sanitizer \
                --tool racecheck --report-api-errors no --error-exitcode 9 "$BUILD/test_backend"
            rc=$?
            log "racecheck ($case_): rc $rc, $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/logs/racecheck-$case_.log" | tail -1)"
            [ $rc = 0 ] || STATUS=1
        done
    else
        log "compute-sanitizer: not installed, skipped"
    fi
else
    log "compute-sanitizer: skipped (no GPU run)"
fi

# ---- benchmarks ----
run bench_gpu_attention 180 "$BUILD/bench_gpu_attention"
rc=$?
log "bench_gpu_attention (rc $rc):"
sed 's/^/  /' "$OUT/logs/bench_gpu_attention.log" | tail -25 | tee -a "$REPORT"
[ $rc = 0 ] || STATUS=1

# End-to-end images/s on the GPU at batch 1, MiTA and full attention, with
# the time per stage: the shipped model at CamVid's 480x360, a DeiT-Small-sized
# UperNet at 512x512 (random weights, written with the machine's PyTorch),
# and any model in $MS_BENCH_MODELS at 512x512.
py=""
for p in /usr/bin/python3 python3; do
    if "$p" -c "import torch" >/dev/null 2>&1; then py=$p; break; fi
done
benches=""
[ -f "$ROOT/assets/models/camvid-mita.safetensors" ] &&
    benches="$ROOT/assets/models/camvid-mita.safetensors@480x360"
if [ -n "$py" ] && "$py" "$ROOT/bench/make_bench_model.py" deit-small 512 \
        "$OUT/logs/deit-small.safetensors" >/dev/null 2>&1; then
    benches="$benches $OUT/logs/deit-small.safetensors@512x512"
fi
for mdl in ${MS_BENCH_MODELS:-}; do benches="$benches $mdl@512x512"; done
if [ $GPU = 1 ] && [ -x "$BUILD/bench_engine" ] && [ -n "${benches// /}" ]; then
    log "bench_engine (cuda, batch 1, mean of 10 after warm-up; stages_ms per stage):"
    i=0
    for b in $benches; do
        mdl=${b%@*} size=${b##*@}
        for att in mita full; do
            i=$((i + 1))
            run "bench_engine-$i" 90 "$BUILD/bench_engine" --model "$mdl" --size "$size" \
                --repeat 10 --device cuda --attention "$att" --stages
            log "  $(basename "$mdl") $size $att: $(tail -1 "$OUT/logs/bench_engine-$i.log")"
        done
    done
    rm -f "$OUT/logs/deit-small.safetensors"
else
    log "bench_engine: skipped (no GPU, no bench_engine, or no model to run)"
fi

log "elapsed: $(elapsed) s; status: $([ $STATUS = 0 ] && echo ok || echo FAILURES)"
exit $STATUS
