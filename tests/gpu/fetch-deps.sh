#!/usr/bin/env bash
# Run HERE (the Debian 12 dev machine), not on the GPU machine: downloads the
# Debian -dev packages the build needs into build-gpu-deps/ (ignored by git,
# /build*/), so the device tool can carry them (carry: ["build-gpu-deps"]).
# tests/gpu/gpu-run.sh unpacks them with dpkg -x into a private prefix
# only when the GPU machine lacks them. Debian 12 libraries need glibc <= 2.36,
# so they run on the GPU image's newer glibc.
set -euo pipefail
cd "$(dirname "$0")/../.." || exit 1
mkdir -p build-gpu-deps
cd build-gpu-deps
apt-get download \
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0 libgfortran5 \
  libcjson-dev libcjson1 \
  check libsubunit-dev libsubunit0 \
  libpng-dev libpng16-16 zlib1g-dev \
  libjpeg62-turbo-dev libjpeg62-turbo \
  pkgconf pkgconf-bin libpkgconf3
ls -la
