#!/usr/bin/env bash
# Cross-compiles every component for 64-bit Arm with Debian's cross toolchain: the GPU-node
# programs (the scheduler, nvsharectl, nvshare-run, libnvshare.so; the simulated driver and the
# trainer) into BUILD_DIR, then checks the glibc floor of what runs in users' containers with the
# Arm objdump; given an arm64 sysroot (make_arm64_sysroot.sh), also the Kubernetes components (the
# device plugin with its pod watcher: gRPC, protobuf, libcurl) into BUILD_DIR-k8s.
#   tests/compat/cross_build.sh SOURCE_DIR BUILD_DIR CUDA_INCLUDE_DIR [SYSROOT]
set -euo pipefail
src=${1:?usage: cross_build.sh SOURCE_DIR BUILD_DIR CUDA_INCLUDE_DIR [SYSROOT]}
build=${2:?}
cuda=${3:?}
sysroot=${4:-}
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
[ -n "$sysroot" ] || exit 0
export NVSHARE_AARCH64_SYSROOT=$sysroot
if [ ! -f "$build-k8s/build.ninja" ]; then
  cmake -S "$src" -B "$build-k8s" -G Ninja \
    -DCMAKE_TOOLCHAIN_FILE="$src/cmake/toolchains/aarch64-linux-gnu-sysroot.cmake" \
    -DNVSHARE_BUILD_TESTS=OFF -DNVSHARE_WITH_K8S=ON -DNVSHARE_CUDA_INCLUDE_DIR="$cuda" >/dev/null
fi
cmake --build "$build-k8s" -j "$(nproc 2>/dev/null || echo 2)" --target nvshare-device-plugin
f=src/deviceplugin/nvshare-device-plugin
if ! aarch64-linux-gnu-objdump -f "$build-k8s/$f" | grep -q 'architecture: aarch64'; then
  echo "cross build: $build-k8s/$f is not an aarch64 binary" >&2
  exit 1
fi
if ! aarch64-linux-gnu-objdump -p "$build-k8s/$f" | grep -q 'NEEDED *libgrpc++'; then
  echo "cross build: $build-k8s/$f does not link gRPC" >&2
  exit 1
fi
echo "cross build: $f (gRPC, pod watcher): aarch64"
