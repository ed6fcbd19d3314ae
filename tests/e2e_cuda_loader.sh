#!/usr/bin/env bash
# End-to-end tests of the CUDA backend loaded on first use
# (kernels/cuda_loader.c): the program links no CUDA library; a CPU run maps
# none (nor does --device auto without an NVIDIA GPU); --device cuda and
# doctor load libmitaseg_cuda.so (which loads without a GPU: the runtime then
# reports no device); a backend that cannot be loaded fails --device cuda
# with one line naming it, sends --device auto to the CPU, and is doctor's
# no-GPU reason.
set -u
. "$(dirname "$0")/common_e2e.sh"

"$PY" "$HELPER" img in/a.png 40 32 1 >/dev/null || { echo "FAIL cannot make the input"; exit 1; }

cuda_libs='libcudart|libcublas|libcudnn|libmitaseg_cuda'
ldd "$BIN" >ldd.txt 2>&1
check "ldd: the program links no CUDA library" bash -c "! grep -Eq '$cuda_libs' ldd.txt"

# LD_DEBUG=files lists every object the dynamic loader maps, dlopen included
mapped() { LD_DEBUG=files LD_DEBUG_OUTPUT="$PWD/ld_$1" "${@:2}"; cat "ld_$1".* 2>/dev/null; }

mapped cpu "$BIN" segment --threads 1 --device cpu in/a.png -o o_cpu >cpu.txt 2>&1
rc=$?
check "--device cpu: exit 0" test $rc -eq 0
check "--device cpu: maps no CUDA library" bash -c "! grep -Eq '$cuda_libs' cpu.txt"
check "--device cpu: the mask written" test -s o_cpu/a.png

"$BIN" segment --threads 1 --device cuda in/a.png -o o_probe >probe.txt 2>&1
if grep -q 'this build has no CUDA backend' probe.txt; then
    echo "skip: the rest needs a CUDA build"
    [ "$fails" -eq 0 ] || exit 1
    exit 77
fi

if [ ! -e /dev/nvidia0 ] && ! ls /proc/driver/nvidia/gpus/* >/dev/null 2>&1 &&
    [ "${MS_EXPECT_GPU:-0}" != 1 ]; then
    mapped auto "$BIN" segment --threads 1 in/a.png -o o_auto0 >auto0.txt 2>&1
    check "no GPU, default --device auto: maps no CUDA library" \
        bash -c "! grep -Eq '$cuda_libs' auto0.txt"
    check "no GPU, default --device auto: says why it runs on the CPU" \
        grep -q 'running on the CPU: no NVIDIA GPU on this machine' auto0.txt
fi

mapped cuda "$BIN" segment --threads 1 --device cuda in/a.png -o o_cuda >cuda.txt 2>&1
check "--device cuda: loads libmitaseg_cuda.so" grep -q 'libmitaseg_cuda\.so' cuda.txt
check "--device cuda: which brings the CUDA runtime" grep -q 'libcudart' cuda.txt

mapped doctor "$BIN" doctor >doctor.txt 2>&1
check "doctor: loads libmitaseg_cuda.so" grep -q 'libmitaseg_cuda\.so' doctor.txt

missing=$T/nowhere/libmitaseg_cuda.so
if [ ! -e /dev/nvidia0 ]; then
    MITASEG_CUDA_LIB=$missing "$BIN" doctor >doctor.txt 2>&1
    rc=$?
    check "backend missing, doctor: exit 0 without a GPU" test $rc -eq 0
    check "backend missing, doctor: says why on the gpus line" \
        grep -q "^gpus: none: cannot load the CUDA backend $missing: .*; the CPU is used" \
        doctor.txt
    check "backend missing, doctor: no made-up versions" \
        bash -c "! grep -q '^cuda runtime' doctor.txt"
fi
MITASEG_CUDA_LIB=$missing "$BIN" segment --threads 1 --device cuda in/a.png -o o_miss \
    >/dev/null 2>err.txt
rc=$?
check "backend missing, --device cuda: exit 1" test $rc -eq 1
check "backend missing, --device cuda: one line" test "$(wc -l <err.txt)" -eq 1
check "backend missing, --device cuda: names the library and why" \
    grep -q "cannot load the CUDA backend $missing: .*No such file" err.txt
check "backend missing, --device cuda: no output" test ! -e o_miss/a.png

# (MS_EXPECT_GPU=1: auto tries the GPU even where there is none)
MITASEG_CUDA_LIB=$missing MS_EXPECT_GPU=1 "$BIN" segment --threads 1 --device auto in/a.png \
    -o o_auto >/dev/null 2>err.txt
rc=$?
check "backend missing, --device auto: exit 0" test $rc -eq 0
check "backend missing, --device auto: says it runs on the CPU and why" \
    grep -q "running on the CPU: cannot load the CUDA backend $missing" err.txt
check "backend missing, --device auto: same mask as --device cpu" cmp -s o_auto/a.png o_cpu/a.png

# a file that is not a library: the loader's own reason, not a crash
echo "not a library" >bad.so
MITASEG_CUDA_LIB=$PWD/bad.so "$BIN" segment --threads 1 --device cuda in/a.png -o o_bad \
    >/dev/null 2>err.txt
rc=$?
check "backend not a library: exit 1, names it" \
    bash -c "test $rc -eq 1 && grep -q 'cannot load the CUDA backend $PWD/bad.so: ' err.txt"

echo "$pass passed, $fails failed"
[ "$fails" -eq 0 ]
