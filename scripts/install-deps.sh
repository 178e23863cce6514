#!/usr/bin/env bash
# Installs what a make target needs, and only what is missing.
#
#   scripts/install-deps.sh run     CMake (3.20 or newer), Ninja, a C++ compiler, make, python3: the
#                                   main job (`make run`), on a GPU host or on the simulated GPU
#   scripts/install-deps.sh build   the same
#   scripts/install-deps.sh test    run + GoogleTest, clang and its libFuzzer runtime, debootstrap (the
#                                   older-userland test), the aarch64 cross compiler, npm (it fetches the
#                                   real helm for the chart's tests), Prometheus and promtool (the
#                                   metrics tests), and the Kubernetes
#                                   agent's libraries (gRPC, protobuf, libcurl) and nlohmann-json
#                                   (the fake API server of its tests), podman and runc (the
#                                   `containers` label: the real container path from CDI specs)
#
# A tool counts as present when its command is on PATH, wherever it came from (CMake and Ninja from
# pip, a compiler from a toolkit); a library when dpkg knows its package. Nothing present is asked for,
# so a host without a package registry that has the tools needs none. What is missing is installed
# with apt-get when root (Debian and Ubuntu use the same names for all of it; clang's libFuzzer
# runtime is found by clang's version), otherwise the exact command to run is printed and this exits 1.
set -euo pipefail

profile=${1:-build}

# command=package pairs: the command proves the package is not needed.
tools=(cmake=cmake ninja=ninja-build c++=g++ make=make python3=python3)
libraries=()
case "$profile" in
  run | build) ;;
  test)
    tools+=(pkg-config=pkg-config clang++=clang debootstrap=debootstrap
            aarch64-linux-gnu-g++=g++-aarch64-linux-gnu protoc=protobuf-compiler
            grpc_cpp_plugin=protobuf-compiler-grpc npm=npm prometheus=prometheus
            promtool=prometheus podman=podman runc=runc unshare=util-linux)
    libraries+=(libgtest-dev libgmock-dev debian-archive-keyring libgrpc++-dev libprotobuf-dev
                libcurl4-openssl-dev libssl-dev nlohmann-json3-dev)
    ;;
  *) echo "install-deps: unknown profile '$profile' (run, build, test)" >&2; exit 2 ;;
esac

missing=()
for pair in "${tools[@]}"; do
  command -v "${pair%%=*}" >/dev/null 2>&1 || missing+=("${pair#*=}")
done
if command -v dpkg-query >/dev/null 2>&1; then
  for p in "${libraries[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
elif [ ${#libraries[@]} -gt 0 ]; then
  echo "install-deps: no dpkg here: make sure these libraries (or your system's equivalents) are" \
    "installed: ${libraries[*]}" >&2
fi

# clang's libFuzzer runtime: libclang-rt-N-dev on Debian 12 and Ubuntu 24.04, inside
# libclang-common-N-dev on Ubuntu 22.04. Asked for once clang itself is there.
fuzzer_runtime() {
  command -v clang >/dev/null 2>&1 || return 0
  local arch runtime major
  arch=$(uname -m)
  runtime=$(clang -print-file-name="libclang_rt.fuzzer-$arch.a" 2>/dev/null || true)
  [ -f "$runtime" ] && return 0
  runtime=$(clang -print-file-name="$arch-unknown-linux-gnu/libclang_rt.fuzzer.a" 2>/dev/null || true)
  [ -f "$runtime" ] && return 0
  major=$(clang -dumpversion | cut -d. -f1)
  for p in "libclang-rt-$major-dev" "libclang-common-$major-dev"; do
    if apt-cache show "$p" >/dev/null 2>&1; then
      echo "$p"
      return 0
    fi
  done
  echo "install-deps: clang $major has no libFuzzer runtime and apt knows no package with it" >&2
}

install() {
  [ $# -eq 0 ] && return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: missing: $* (no apt-get here: install them with your system's tools)" >&2
    exit 1
  fi
  local cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $*"
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages: $*" >&2
    echo "install-deps: run as root:  sudo sh -c '$cmd'" >&2
    exit 1
  fi
  echo "install-deps: installing $*" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

install "${missing[@]}"
if [ "$profile" = test ]; then
  runtime_package=$(fuzzer_runtime)
  # shellcheck disable=SC2086
  install $runtime_package
fi

version=$(cmake --version | head -n 1 | awk '{print $3}')
if [ "$(printf '%s\n3.20\n' "$version" | sort -V | head -n 1)" != 3.20 ]; then
  echo "install-deps: CMake $version is older than 3.20; install a newer one (for example" \
    "'python3 -m pip install cmake')" >&2
  exit 1
fi
