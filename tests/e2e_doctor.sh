#!/usr/bin/env bash
# End-to-end tests of `mitaseg doctor`: the facts it prints, the self-test
# table (every op, the bundled tiny model against its golden), exit codes,
# and that a self-test failure is reported as one (a golden that does not
# belong to the model, a missing golden). On a machine without a GPU it
# must say why no GPU is used.
set -u
BIN=${MS_BIN:?MS_BIN must name the mitaseg binary}
FIX=${MS_FIXTURES:-$(dirname "$0")/fixtures}
T=$(mktemp -d /tmp/ms_e2e_doctor.XXXXXX)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/check_e2e.sh"

"$BIN" doctor >"$T/out" 2>"$T/err"
rc=$?
check "doctor: exit 0" test $rc -eq 0
check "doctor: CPU line with threads" grep -Eq '^cpu: .*[0-9]+ threads used' "$T/out"
check "doctor: CPU features line" grep -q '^cpu features:' "$T/out"
# the best path this CPU runs, from its flags (kernels/cpu_path.c also asks
# the OS to save the AVX-512 state: the kernel lists the flags only then)
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
has() { for f in "$@"; do case "$flags" in *" $f "*) ;; *) return 1 ;; esac; done; }
best=base
if [ "$(uname -m)" = x86_64 ] && has avx2 fma bmi1 bmi2 f16c movbe abm; then
    best=v3
    has avx512f avx512bw avx512cd avx512dq avx512vl && best=v4
fi
check "doctor: CPU kernel path line: the best path here ($best)" \
    grep -Eq "^cpu kernels: $best path \(" "$T/out"
MS_CPU_PATH=base "$BIN" doctor >"$T/out_base" 2>&1
check "doctor: MS_CPU_PATH=base takes the baseline kernels" grep -q '^cpu kernels: base path' "$T/out_base"
if [ "$best" = v4 ]; then
    MS_CPU_PATH=v3 "$BIN" doctor >"$T/out_v3" 2>&1
    check "doctor: MS_CPU_PATH=v3 takes the v3 kernels and says a faster one runs" \
        grep -q '^cpu kernels: v3 path (x86-64-v3: AVX2, FMA); a faster one runs here' "$T/out_v3"
fi
check "doctor: OpenBLAS build" grep -Eq '^openblas: OpenBLAS [0-9]' "$T/out"
# the GEMM library: oneDNN on AVX-512 where libdnnl is installed, else
# OpenBLAS with the reason; MS_GEMM=openblas asks for OpenBLAS
dnnl=no
ldc=$(command -v ldconfig || echo /sbin/ldconfig)
"$ldc" -p 2>/dev/null | grep -Eq '[[:space:]]libdnnl\.so\.[23] ' && dnnl=yes
if [ "$best" = v4 ] && [ "$dnnl" = yes ] && [ -z "${MS_GEMM:-}" ]; then
    check "doctor: oneDNN for the GEMMs on this AVX-512 CPU" \
        grep -Eq '^gemm: onednn \(libdnnl\.so\.[23], AVX-512 kernels; MS_GEMM=openblas for OpenBLAS\)$' "$T/out"
elif [ -z "${MS_GEMM:-}" ]; then
    check "doctor: OpenBLAS for the GEMMs, and why ($best, oneDNN installed: $dnnl)" \
        grep -Eq '^gemm: openblas \((no AVX-512 here|oneDNN not found)' "$T/out"
fi
MS_GEMM=openblas "$BIN" doctor --no-selftest >"$T/out_gemm" 2>&1
check "doctor: MS_GEMM=openblas takes OpenBLAS and says so" \
    grep -q '^gemm: openblas (MS_GEMM=openblas)$' "$T/out_gemm"
if [ "$best" = v4 ] && [ "$dnnl" = yes ]; then
    MS_GEMM=$'open\tblas' "$BIN" doctor --no-selftest >"$T/out_gemm_bad" 2>&1
    check "doctor: an MS_GEMM it does not know is named (printable) and not obeyed" \
        grep -q '^gemm: onednn (libdnnl\.so\.[23], AVX-512 kernels; MS_GEMM=open?blas not understood (openblas or onednn))$' "$T/out_gemm_bad"
fi
# MiTA's small products: libxsmm's generated kernels where the build found
# it (pkg-config, as CMake does) on an AVX2 or later CPU, else OpenBLAS
# with the reason; MS_SMALL_GEMM=openblas asks for OpenBLAS
if [ "$best" != base ] && pkg-config --exists libxsmm 2>/dev/null && [ -z "${MS_SMALL_GEMM:-}" ]; then
    check "doctor: libxsmm for MiTA's small products" \
        grep -Eq '^small gemm: libxsmm \(libxsmm [a-z0-9_]+ kernels; MS_SMALL_GEMM=openblas for OpenBLAS\)$' "$T/out"
elif [ -z "${MS_SMALL_GEMM:-}" ]; then
    check "doctor: OpenBLAS for MiTA's small products, and why" \
        grep -Eq '^small gemm: openblas \((built without libxsmm|libxsmm generates no kernel)' "$T/out"
fi
MS_SMALL_GEMM=openblas "$BIN" doctor --no-selftest >"$T/out_small" 2>&1
check "doctor: MS_SMALL_GEMM=openblas takes OpenBLAS and says so" \
    grep -Eq '^small gemm: openblas \((MS_SMALL_GEMM=openblas|built without libxsmm|libxsmm generates no kernel)' "$T/out_small"
if grep -q '^small gemm: libxsmm' "$T/out"; then
    MS_SMALL_GEMM=$'xs\tmm' "$BIN" doctor --no-selftest >"$T/out_small_bad" 2>&1
    check "doctor: an MS_SMALL_GEMM it does not know is named (printable) and not obeyed" \
        grep -Eq '^small gemm: libxsmm \(libxsmm [a-z0-9_]+ kernels; MS_SMALL_GEMM=xs\?mm not understood \(openblas or libxsmm\)\)$' "$T/out_small_bad"
fi
# a core named by OPENBLAS_CORETYPE is said to be (the environment as it
# is: tests leave it alone, since some machines set it because older
# OpenBLAS builds fail on their CPU)
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
    check "doctor: names OPENBLAS_CORETYPE's choice" \
        grep -Fq "(chosen by OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE in the environment)" "$T/out"
else
    check "doctor: no OPENBLAS_CORETYPE in the environment, none named" \
        bash -c "! grep -q 'chosen by OPENBLAS_CORETYPE' '$T/out'"
fi
# With no core named, mitaseg asks OpenBLAS for the one for this CPU's
# instruction set (app/omp_env/omp_env.c; OpenBLAS's own table falls back to
# its oldest kernels on a CPU model newer than its build). Facts only
# (--no-selftest): no GEMM runs without the machine's OPENBLAS_CORETYPE.
vendor=$(grep -m1 '^vendor_id' /proc/cpuinfo 2>/dev/null | awk '{print $3}')
want_core=""
if [ "$best" = v4 ]; then
    want_core=SkylakeX
    has avx512_bf16 && want_core=Cooperlake
elif [ "$best" = v3 ]; then
    want_core=Haswell
    [ "$vendor" = AuthenticAMD ] && want_core=Zen
fi
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$BIN" doctor --no-selftest >"$T/out_auto" 2>&1
if [ -n "$want_core" ]; then
    check "doctor: mitaseg asks for OpenBLAS's $want_core kernels and says so" \
        grep -Eq "^openblas: .*; core $want_core \(chosen by mitaseg for this CPU's instruction set: OPENBLAS_CORETYPE=$want_core; MS_OPENBLAS_CORE=openblas leaves it to OpenBLAS\)" "$T/out_auto"
    check "doctor: OpenBLAS's kernels fit the CPU, no note" bash -c "! grep -q '^openblas note' '$T/out_auto'"
else
    check "doctor: no core for this CPU, OpenBLAS chose" \
        grep -Eq '^openblas: .*\(chosen by OpenBLAS\)' "$T/out_auto"
fi
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE MS_OPENBLAS_CORE=openblas "$BIN" doctor --no-selftest \
    >"$T/out_own" 2>&1
check "doctor: MS_OPENBLAS_CORE=openblas leaves the choice to OpenBLAS" \
    bash -c "grep -Eq '^openblas: .*\(chosen by OpenBLAS\)$' '$T/out_own' && ! grep -q 'chosen by mitaseg' '$T/out_own'"
# On an AVX-512 CPU, a core without AVX-512 kernels gets a note naming the
# one that has them; OpenBLAS's AVX-512 core gets none.
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
avx512=1
for f in avx512f avx512cd avx512bw avx512dq avx512vl; do
    [[ " $flags " == *" $f "* ]] || avx512=0
done
OPENBLAS_CORETYPE=Haswell "$BIN" doctor --no-selftest >"$T/out_hsw" 2>&1
if [ $avx512 = 1 ]; then
    check "doctor: Haswell's kernels on an AVX-512 CPU are noted" \
        grep -q "^openblas note: this CPU runs AVX-512 but OpenBLAS runs Haswell's kernels, at half its sgemm rate or less; OPENBLAS_CORETYPE=$want_core runs its AVX-512 ones (or unset it" "$T/out_hsw"
    OPENBLAS_CORETYPE=SkylakeX "$BIN" doctor --no-selftest >"$T/out_skx" 2>&1
    check "doctor: OpenBLAS's AVX-512 kernels, no note" \
        bash -c "grep -q 'core SkylakeX' '$T/out_skx' && ! grep -q '^openblas note' '$T/out_skx'"
else
    check "doctor: no AVX-512, no note" bash -c "! grep -q '^openblas note' '$T/out_hsw'"
fi
ops="linear layernorm add transpose softmax_rows attention_full mita conv2d conv_transpose2x2
adaptive_avgpool maxpool2x2 resize_bilinear resize_bicubic crop argmax normalize_pad"
missing=""
for op in $ops; do
    grep -Eq "^$op +cpu +cpu, 1 thread +[0-9.e+-]+ +[0-9.e+-]+ +pass" "$T/out" || missing="$missing $op"
done
check "doctor: a passing CPU row for every op (missing:${missing:- none})" test -z "$missing"
check "doctor: the bundled model against the Python reference" \
    grep -Eq '^model +cpu +python reference +[0-9.e+-]+ +1e-03 +pass: mask 100.00% equal' "$T/out"
check "doctor: summary line" grep -Eq '^self-test: all passed \([0-9]+ rows, 0 failed' "$T/out"
# where oneDNN makes the GEMMs, a product on it against OpenBLAS; none else
if grep -q '^gemm: onednn' "$T/out"; then
    check "doctor: a oneDNN GEMM row against OpenBLAS" \
        grep -Eq '^gemm +cpu, onednn +openblas +[0-9.e+-]+ +1e-04 +pass' "$T/out"
fi
MS_GEMM=openblas "$BIN" doctor >"$T/out_gemm_rows" 2>&1
check "doctor: no oneDNN row on OpenBLAS" bash -c "! grep -q '^gemm  ' '$T/out_gemm_rows'"
if [ -e /dev/nvidia0 ] || [ -d /proc/driver/nvidia/gpus ] || [ "${MS_EXPECT_GPU:-0}" = 1 ]; then
    check "doctor: a GPU row per mode" grep -Eq '^linear +cuda:0 tensor cores +cpu, tc rounding' "$T/out"
else
    # no GPU: says why, in one of the two ways (no CUDA in the build, or no device/driver)
    check "doctor: says why no GPU is used" \
        grep -Eq '^(gpus: none: .+; the CPU is used|cuda: this build has no CUDA backend)' "$T/out"
    check "doctor: no GPU rows" bash -c "! grep -q 'cuda:0' '$T/out'"
    # a GPU said to be present that CUDA cannot use is a failure (CUDA builds)
    MS_EXPECT_GPU=1 "$BIN" doctor --no-selftest >"$T/out7" 2>&1
    rc=$?
    if grep -q '^cuda: this build has no CUDA backend' "$T/out7"; then
        check "GPU present, CPU-only build: exit 0, said" \
            bash -c "test $rc -eq 0 && grep -q 'this machine has a GPU' '$T/out7'"
    else
        check "GPU present but unusable: exit 1, said" \
            bash -c "test $rc -eq 1 && grep -q '^gpus: a GPU is present, but CUDA cannot use it' '$T/out7'"
    fi
fi

"$BIN" doctor --no-selftest >"$T/out2" 2>&1
check "--no-selftest: exit 0, facts, no table" \
    bash -c "test $? -eq 0 && grep -q '^openblas:' '$T/out2' && ! grep -q '^self-test' '$T/out2'"

# a golden from another model: the model row fails, exit 1
"$BIN" doctor --selftest-golden "$FIX/mita_d.golden.safetensors" >"$T/out3" 2>&1
rc=$?
check "foreign golden: exit 1" test $rc -eq 1
check "foreign golden: model row FAIL" grep -Eq '^model +cpu .* FAIL' "$T/out3"
check "foreign golden: summary FAILED" grep -Eq '^self-test: FAILED \([0-9]+ rows, 1 failed' "$T/out3"

"$BIN" doctor --selftest-golden "$T/missing.safetensors" >"$T/out4" 2>&1
rc=$?
check "missing golden: exit 1, the row names the file" \
    bash -c "test $rc -eq 1 && grep -Eq '^model +cpu .*FAIL: .*missing.safetensors' '$T/out4'"

"$BIN" doctor --bogus >"$T/out5" 2>"$T/err5"
rc=$?
check "unknown option: exit 2, one line on stderr" \
    bash -c "test $rc -eq 2 && test \$(wc -l < '$T/err5') -eq 1 && grep -q -- '--bogus' '$T/err5'"
"$BIN" doctor --help >"$T/out6" 2>&1
check "--help: exit 0, usage" bash -c "test $? -eq 0 && grep -q '^usage: mitaseg doctor' '$T/out6'"
"$BIN" --help | grep -q '^  doctor'
check "mitaseg --help lists doctor" test $? -eq 0

[ $fails -eq 0 ] || { echo "$fails failed"; exit 1; }
echo "all passed"
