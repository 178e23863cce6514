#!/usr/bin/env bash
# Cross-compiles every GPU-node component for 64-bit Arm (the scheduler, nvsharectl, nvshare-run,
# libnvshare.so; the simulated driver and the trainer) with Debian's cross toolchain, then checks the
# glibc floor of what runs in users' containers with the Arm objdump.
#   tests/compat/cross_build.sh SOURCE_DIR BUILD_DIR CUDA_INCLUDE_DIR
set -euo pipefail
src=${1:?usage: cross_build.sh SOURCE_DIR BUILD_DIR CUDA_INCLUDE_DIR}
build=${2:?}
cuda=${3:?}
for tool in aarch64-linux-gnu-g++ aarch64-linux-gnu-objdump; do
  if ! command -v "$tool" >/dev/null; then
    echo "cross build: $tool is missing (scripts/install-deps.sh test installs g++-aarch64-linux-gnu)" >&2
    exit 1
  fi
done
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$src/cmake/toolchains/aarch64-linux-gnu.cmake" \
    -DNVSHARE_BUILD_TESTS=OFF -DNVSHARE_WITH_K8S=OFF -DNVSHARE_CUDA_INCLUDE_DIR="$cuda" >/dev/null
fi
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)"
for f in src/scheduler/nvshare-scheduler src/tools/nvsharectl src/tools/nvshare-run src/client/libnvshare.so \
    tests/fakecuda/libcuda.so.1 tests/fakecuda/nvshare-trainer; do
  if ! aarch64-linux-gnu-objdump -f "$build/$f" | grep -q 'architecture: aarch64'; then
    echo "cross build: $build/$f is not an aarch64 binary" >&2
    exit 1
  fi
  echo "cross build: $f: aarch64"
done
OBJDUMP=aarch64-linux-gnu-objdump bash "$src/tests/compat/check_glibc_floor.sh" 2.28 \
  "$build/src/client/libnvshare.so" "$build/tests/fakecuda/libcuda.so.1" \
  "$build/tests/fakecuda/libnvidia-ml.so.1" "$build/tests/fakecuda/nvshare-trainer"
