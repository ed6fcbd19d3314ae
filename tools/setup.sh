#!/usr/bin/env bash
# Installs the Debian packages mitaseg needs and builds it into build/.
# Usage: bash tools/setup.sh [--dev]    (as root, or with sudo available)
#   --dev  also what the tests and tools need: Check, Xvfb + xdotool for the
#          viewer test, PyTorch for the reference model and training, Slurm,
#          munge and GNU parallel for the cluster test, python3-venv for the
#          ONNX Runtime virtualenv (tools/ort_venv.py: benchmark, export test),
#          valgrind, clang with libFuzzer and libomp for tests/fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake ninja-build pkg-config
      libopenblas-dev libpng-dev libjpeg62-turbo-dev libcjson-dev check
      libsdl2-dev libsdl2-ttf-dev libx11-dev fonts-dejavu-core)
# Optional: installed where the release has it, skipped with a note where
# not. oneDNN makes the large GEMMs on AVX-512 CPUs, loaded at run time
# (kernels/gemm.h; libdnnl2 on Debian 12, libdnnl3 later); without it
# OpenBLAS does.
optional=(libdnnl2 libdnnl3)
# libxsmm generates MiTA's small-GEMM kernels (kernels/gemm_small.h; Debian
# ships it as a static library, so it is a build dependency); without it
# OpenBLAS makes them.
want_xsmm=libxsmm-dev
if [ "${1:-}" = "--dev" ]; then
  pkgs+=(xvfb xdotool imagemagick python3 python3-torch python3-numpy python3-pil python3-venv
         slurmctld slurmd slurm-client munge parallel
         python3-pip python3-torchvision python3-scipy python3-matplotlib
         valgrind clang libclang-rt-dev libomp-dev)
fi
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# the release has a candidate for it (read whole: grep -q would cut
# apt-cache off, SIGPIPE under pipefail)
candidate() {
  local cand
  cand=$(apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: //p')
  [ -n "$cand" ] && [ "$cand" != "(none)" ]
}
missing=()
for p in "${pkgs[@]}"; do
  installed "$p" || missing+=("$p")
done
have_optional=no
for p in "${optional[@]}"; do
  installed "$p" && have_optional=yes
done
have_xsmm=no
installed "$want_xsmm" && have_xsmm=yes
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
if [ ${#missing[@]} -gt 0 ] || [ "$have_optional" = no ] || [ "$have_xsmm" = no ]; then
  $SUDO apt-get update -qq
fi
if [ "$have_xsmm" = no ]; then
  if candidate "$want_xsmm"; then
    missing+=("$want_xsmm")
  else
    echo "setup: no $want_xsmm here: OpenBLAS makes MiTA's small products"
  fi
fi
if [ "$have_optional" = no ]; then
  for p in "${optional[@]}"; do
    if candidate "$p"; then
      missing+=("$p")
      have_optional=yes
      break
    fi
  done
  [ "$have_optional" = yes ] || echo "setup: no oneDNN package here (${optional[*]}): OpenBLAS makes every GEMM"
fi
if [ ${#missing[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# nvcc is optional: without it the CUDA backend is left out of the build.
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${MS_CMAKE_ARGS:-}
ninja -C build
