#!/usr/bin/env bash
# The GPU run, in one call on the lent GPU machine (docs/gpu.md):
#   OUT=/some/dir bash tests/gpu/gpu-run.sh [--phases LIST] [--budget SECONDS]
# LIST: comma-separated, default doctor,backend,sanitize,bench,train:
#   doctor    mitaseg doctor (versions, GPUs, the self-test table)
#   backend   test_kernel_math, test_batch_engine, test_backend
#   sanitize  compute-sanitizer memcheck (backend test, small shapes) and
#             racecheck (its MiTA and attention cases), each bounded
#   bench     bench_gpu_attention (MiTA vs full, N = 1K .. 1M) and images/s of
#             the default model and a DeiT-Small-sized UperNet at 512x512,
#             batch 1 and 8
#   train     tests/gpu/train-phase.sh OUT/train SECONDS with the time left
# The build (for the GPU found) always runs first. Everything must end within
# --budget seconds (default 450: 8 minutes of a fresh machine, less its
# start); the train phase gets what is left less a margin.
# Writes ONE summary, $OUT/summary.md (numbers meant for the README), and
# every log in one file, $OUT/logs.tar.gz (the device tool brings back at most
# 8 files; the logs are written to build-gpu-logs/ and packed at the end).
# Exit 0: every phase run passed, or there is no GPU (then the GPU
# parts are skipped and the summary says so); 1: a failure (or a skip while a
# GPU is present); 2: usage.
# Debian -dev packages missing there: run tests/gpu/fetch-deps.sh here first
# and carry build-gpu-deps/; they are unpacked into a private prefix.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
OUT=${OUT:-/tmp/mitaseg-gpu-run}
PHASES=doctor,backend,sanitize,bench,train
BUDGET=450
while [ $# -gt 0 ]; do
    case $1 in
    --phases) PHASES=${2:?--phases needs a list}; shift 2 ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift 2 ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu-run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for p in ${PHASES//,/ }; do
    case $p in doctor | backend | sanitize | bench | train) ;;
    *) echo "gpu-run.sh: unknown phase '$p' (doctor, backend, sanitize, bench, train)" >&2; exit 2 ;;
    esac
done
want() { case ",$PHASES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# MS_GPU_BUILD / MS_GPU_LOGS: other folders (relative to the repository, or
# absolute); MS_GPU_CMAKE_ARGS: extra configure arguments (the e2e test
# rehearses with -DMS_CUDA=OFF, which builds in a fraction of the time).
abs() { case $1 in /*) echo "$1" ;; *) echo "$ROOT/$1" ;; esac; }
LOGS=$(abs "${MS_GPU_LOGS:-build-gpu-logs}")
mkdir -p "$LOGS" "$OUT" || exit 1
rm -f "$LOGS"/*.log # the last run's (only logs: the folder may be anything)
SUM=$OUT/summary.md
T0=$(date +%s)
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
export MS_FIXTURES="$ROOT/tests/fixtures" OMP_WAIT_POLICY=PASSIVE
JOBS=$(nproc 2>/dev/null || echo 2)
BUILD=$(abs "${MS_GPU_BUILD:-build-gpu}")
STATUS=0
SKIPPED=""

elapsed() { echo $(($(date +%s) - T0)); }
left() { echo $((BUDGET - $(elapsed))); }
say() { echo "$*" | tee -a "$SUM"; }
fail() { STATUS=1; say "$*"; }
skip() { SKIPPED="$SKIPPED $1"; say "- $1: skipped: $2"; }
# run NAME TIMEOUT CMD...: output to $LOGS/NAME.log; the command's rc, 124 on timeout.
run() {
    local name=$1 to=$2
    shift 2
    [ "$to" -gt 0 ] || return 124
    timeout -k 5 "$to" "$@" >"$LOGS/$name.log" 2>&1
}
# verdict RC: pass / timeout / FAIL (rc N)
verdict() {
    case $1 in 0) echo pass ;; 124 | 137) echo timeout ;; *) echo "FAIL (rc $1)" ;; esac
}
# bounded TIMEOUT: the timeout, cut to the time left less a margin
bounded() {
    local t=$1 l
    l=$(($(left) - 15))
    [ "$l" -lt "$t" ] && t=$l
    [ "$t" -lt 0 ] && t=0
    echo "$t"
}
finish() {
    say ""
    local why=""
    [ $GPU = 0 ] && [ $STATUS = 0 ] && why=" (a rehearsal: no GPU here, so the GPU parts were skipped)"
    tar czf "$OUT/logs.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null ||
        say "(packing the logs failed)"
    say "elapsed: $(elapsed) s of a $BUDGET s budget; logs in logs.tar.gz; skipped:${SKIPPED:- nothing}; status: $([ $STATUS = 0 ] && echo ok || echo FAILURES)$why"
    exit $STATUS
}

: >"$SUM"
say "# mitaseg GPU run, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say ""
say "phases: $PHASES; commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"

# ---- the machine: GPU, driver and toolkit versions first ----
say ""
say "## Machine"
GPU=0
ARCH=90
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
    [ -n "$(nvidia-smi -L 2>/dev/null)" ]; then
    GPU=1
    export MS_EXPECT_GPU=1 # the tests and benchmarks: a GPU they cannot use is a failure
    nvidia-smi >"$LOGS/nvidia-smi.log" 2>&1
    say "- gpu: $(nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader | head -1)"
    CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
    ARCH=$CC
    [ "$CC" = 90 ] && ARCH=90a # the chip's own target, not PTX for an older one
    DRV=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
    DRV_CUDA=$(grep -o 'CUDA Version: *[0-9.]*' "$LOGS/nvidia-smi.log" | grep -o '[0-9.]*$')
    say "- driver: $DRV (supports CUDA ${DRV_CUDA:-unknown})"
else
    say "- gpu: none (nvidia-smi missing or sees no device): the GPU parts are skipped"
fi
say "- cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $JOBS cores"
NVCC_CUDA=""
if command -v nvcc >/dev/null 2>&1; then
    NVCC_CUDA=$(nvcc --version | grep -o 'release [0-9.]*' | grep -o '[0-9.]*$')
    say "- nvcc (CUDA toolkit): $NVCC_CUDA"
else
    say "- nvcc: missing: the CUDA backend is not built"
    if [ $GPU = 1 ]; then
        fail "- FAIL: a GPU is present but there is no CUDA toolkit to build for it"
        finish
    fi
fi
cudnn_h=$(ls /usr/include/cudnn_version.h /usr/include/*/cudnn_version.h \
    "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")"/../include/cudnn_version.h 2>/dev/null | head -1)
[ -n "$cudnn_h" ] && say "- cuDNN headers: $(awk '/define CUDNN_(MAJOR|MINOR|PATCHLEVEL) /{printf "%s%s", s, $3; s="."}' "$cudnn_h")"
# A driver older than the toolkit cannot run what it builds: refuse now,
# before minutes of building, with both versions.
if [ $GPU = 1 ] && [ -n "$NVCC_CUDA" ] && [ -n "${DRV_CUDA:-}" ]; then
    older=$(awk -v d="$DRV_CUDA" -v r="$NVCC_CUDA" 'BEGIN{split(d,a,".");split(r,b,".");
        print (a[1] < b[1] || (a[1] == b[1] && a[2] < b[2])) ? 1 : 0}')
    if [ "$older" = 1 ]; then
        fail "- FAIL: the driver supports CUDA $DRV_CUDA, older than the toolkit's $NVCC_CUDA: nothing built here would run; use a toolkit <= $DRV_CUDA or a newer driver"
        finish
    fi
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
        say "- deps: missing:$missing; using the carried .debs unpacked in build-gpu-prefix"
    else
        say "- deps: missing:$missing; and no build-gpu-deps/*.deb (run tests/gpu/fetch-deps.sh where apt works and carry build-gpu-deps)"
    fi
else
    say "- deps: all found on the system"
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
                say "- cuDNN: from $(dirname "$dnn_inc")"
            fi
        else
            say "- cuDNN: not found (cudnn.h): the build will fail to link"
        fi
    fi
fi

# ---- configure and build (the viewer is not needed; warnings are CI's job,
# a newer compiler there must not stop the run) ----
say ""
say "## Build"
if run cmake 120 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMS_WERROR=OFF -DMS_VIEWER=OFF "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" "${CMAKE_EXTRA[@]}" \
    ${MS_GPU_CMAKE_ARGS:-}; then
    cuda_on=$(grep -o 'CUDA backend [A-Z]*' "$LOGS/cmake.log" | tail -1)
    say "- configure: ok ($cuda_on, CUDA arch $ARCH)"
    if [ $GPU = 1 ] && [ "$cuda_on" != "CUDA backend ON" ]; then
        fail "- FAIL: a GPU is present but the build has no CUDA backend (see build-gpu-logs/cmake.log in logs.tar.gz)"
        finish
    fi
else
    fail "- configure: FAILED (build-gpu-logs/cmake.log in logs.tar.gz):"
    tail -15 "$LOGS/cmake.log" | sed 's/^/      /' | tee -a "$SUM"
    finish
fi
TARGETS=(mitaseg test_kernel_math test_batch_engine test_backend bench_gpu_attention bench_engine)
if run build "$(bounded 300)" ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]}"; then
    say "- build: ok in $(elapsed) s since start ($(grep -c 'warning' "$LOGS/build.log") warning lines)"
else
    fail "- build: FAILED (build-gpu-logs/build.log in logs.tar.gz):"
    grep -E 'error|FAILED' "$LOGS/build.log" | head -20 | sed 's/^/      /' | tee -a "$SUM"
    finish
fi
if [ $GPU = 1 ] && command -v nvcc >/dev/null 2>&1; then
    # registers, shared memory and spills of the custom kernels (no device time)
    gen="-gencode=arch=compute_${ARCH},code=sm_${ARCH}"
    for f in mita attention_full; do # side by side: mita.cu alone takes a while
        nvcc -c -std=c++17 $gen -Xptxas -v -I"$ROOT" -I"$ROOT/kernels" ${dnn_inc:+-I"$dnn_inc"} -DMS_HAVE_CUDA \
            "$ROOT/kernels/$f.cu" -o /dev/null >"$LOGS/ptxas-$f.log" 2>&1 &
    done
    wait
    say "- ptxas (routed/flash kernels per head dim: registers, spills):"
    grep -h -A3 -E "Compiling entry function '.*(routed_kernel|flash_kernel)" "$LOGS"/ptxas-*.log |
        grep -E 'entry|registers|spill' |
        sed -E "s/ptxas info *: //; s/Compiling entry function '_Z[0-9]+([a-z_]+)ILi([0-9]+)E[^']*'/\\1<\\2>/" |
        paste - - - | sed 's/^/    /' | tee -a "$SUM"
fi

# ---- doctor ----
if want doctor; then
    say ""
    say "## Doctor (\`mitaseg doctor\`), at $(elapsed) s"
    run doctor "$(bounded 60)" "$BUILD/mitaseg" doctor
    rc=$?
    say "- doctor: $(verdict $rc)"
    { echo '```'; cat "$LOGS/doctor.log"; echo '```'; } >>"$SUM"
    [ $rc = 0 ] || STATUS=1
    if [ $GPU = 1 ] && ! grep -q '^linear .*cuda:0 tensor cores' "$LOGS/doctor.log"; then
        fail "- FAIL: a GPU is present but the doctor's self-test did not run on it"
    fi
fi

# ---- backend tests ----
# test_backend exits 77 only without a GPU (with MS_EXPECT_GPU=1 it fails).
if want backend; then
    say ""
    say "## Backend tests, at $(elapsed) s"
    for t in test_kernel_math test_batch_engine test_backend; do
        run "$t" "$(bounded 240)" "$BUILD/$t"
        rc=$?
        line=$(grep -E '^[0-9]+%' "$LOGS/$t.log" | tail -1)
        if [ $rc = 77 ] && [ $GPU = 0 ]; then
            skip "$t" "$(grep -m1 '^skipped' "$LOGS/$t.log" | sed 's/^skipped: //')"
            continue
        fi
        note=""
        grep -q '^note: no CUDA here' "$LOGS/$t.log" && note=" (its CUDA case not run: no GPU)"
        [ -n "$note" ] && SKIPPED="$SKIPPED $t(cuda)"
        say "- $t: $(verdict $rc) $line$note"
        if [ $rc != 0 ]; then
            STATUS=1
            grep -E ':F:|:E:|^FAIL' "$LOGS/$t.log" | head -15 | sed 's/^/    /' | tee -a "$SUM"
        fi
    done
    # the agreement lines of test_backend (FP32 vs CPU, tensor cores vs CPU with tc rounding)
    grep -hE '^(e2e |conv2d |conv_transpose2x2 |cuda: )' "$LOGS/test_backend.log" 2>/dev/null |
        sed 's/^/    /' | tee -a "$SUM"
fi

# ---- sanitizers (bounded: a run past its time says "timeout", not "fail") ----
if want sanitize; then
    say ""
    say "## compute-sanitizer (backend test, MS_BACKEND_SMALL=1), at $(elapsed) s"
    if [ $GPU = 0 ]; then
        skip sanitize "no GPU"
    elif ! command -v compute-sanitizer >/dev/null 2>&1; then
        fail "- FAIL: compute-sanitizer not installed on a GPU machine"
    else
        san() { # NAME TIMEOUT TOOL [CASE]
            local name=$1 to=$2 tool=$3 case_=${4:-}
            MS_BACKEND_SMALL=1 CK_RUN_CASE=$case_ run "$name" "$(bounded "$to")" compute-sanitizer \
                --tool "$tool" --report-api-errors no --error-exitcode 9 "$BUILD/test_backend"
            local rc=$?
            say "- $name: $(verdict $rc), $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/$name.log" | tail -1)"
            case $rc in 0) ;; 124 | 137) SKIPPED="$SKIPPED $name(timeout)" ;; *) STATUS=1 ;; esac
        }
        san memcheck 120 memcheck
        san racecheck-mita 60 racecheck mita
        san racecheck-attention 45 racecheck attention
    fi
fi

# ---- benchmarks ----
if want bench; then
    say ""
    say "## Attention scaling (bench_gpu_attention: one layer, C = 384, 6 heads, d = 64, M = 49, k = 49), at $(elapsed) s"
    if [ $GPU = 0 ]; then
        skip bench "no GPU"
    else
        run bench_gpu_attention "$(bounded 150)" "$BUILD/bench_gpu_attention"
        rc=$?
        say "- bench_gpu_attention: $(verdict $rc)"
        { echo '```'; cat "$LOGS/bench_gpu_attention.log"; echo '```'; } >>"$SUM"
        [ $rc = 0 ] || STATUS=1

        say ""
        say "## Images per second (bench_engine --device cuda, 512x512, mean of 10 after warm-up)"
        py=""
        for p in /usr/bin/python3 python3; do
            if "$p" -c "import torch" >/dev/null 2>&1; then py=$p; break; fi
        done
        models=""
        [ -f "$ROOT/assets/models/camvid-mita.safetensors" ] &&
            models="default=$ROOT/assets/models/camvid-mita.safetensors"
        if [ -n "$py" ] && run make_deit_small 60 "$py" "$ROOT/bench/make_bench_model.py" \
            deit-small 512 "$LOGS/deit-small.safetensors"; then
            models="$models deit-small=$LOGS/deit-small.safetensors"
        else
            say "- DeiT-Small-sized model: not made (no PyTorch or make_bench_model.py failed: build-gpu-logs/make_deit_small.log)"
        fi
        say ""
        say "| model | attention | batch | tokens | images/s | mean ms per batch |"
        say "| --- | --- | --- | --- | --- | --- |"
        i=0
        for mm in $models; do
            name=${mm%%=*} mdl=${mm#*=}
            for att in mita full; do
                for b in 1 8; do
                    i=$((i + 1))
                    if run "bench_engine-$i" "$(bounded 60)" "$BUILD/bench_engine" --model "$mdl" \
                        --size 512x512 --repeat 10 --batch "$b" --device cuda --attention "$att"; then
                        js=$(tail -1 "$LOGS/bench_engine-$i.log")
                        row=$(echo "$js" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("%d | %.1f | %.2f" % (d["tokens"], d["images_per_s"], d["mean_ms"]))' 2>/dev/null || echo "? | ? | ?")
                        say "| $name | $att | $b | $row |"
                    else
                        say "| $name | $att | $b | $(verdict $?): $(tail -1 "$LOGS/bench_engine-$i.log") | | |"
                        STATUS=1
                    fi
                done
            done
        done
        rm -f "$LOGS/deit-small.safetensors"
    fi
fi

# ---- training, with the time left ----
if want train; then
    say ""
    say "## Training (tests/gpu/train-phase.sh), at $(elapsed) s"
    tleft=$(($(left) - 30))
    if [ ! -f "$ROOT/tests/gpu/train-phase.sh" ]; then
        skip train "train-phase.sh missing"
    elif [ $GPU = 0 ]; then
        skip train "no GPU"
    elif [ $tleft -lt 60 ]; then
        skip train "only ${tleft} s left"
    else
        say "- training for $tleft s"
        run train $((tleft + 20)) bash "$ROOT/tests/gpu/train-phase.sh" "$OUT/train" "$tleft"
        rc=$?
        say "- train-phase.sh: $(verdict $rc); $(ls "$OUT/train" 2>/dev/null | tr '\n' ' ')"
        tail -5 "$LOGS/train.log" | sed 's/^/    /' | tee -a "$SUM"
        [ $rc = 0 ] || STATUS=1
    fi
fi

finish
