#!/usr/bin/env bash
# Installs the Debian packages a make target needs, and only those that are missing.
#
#   scripts/install-deps.sh build   compiler, CMake, Ninja (enough for the GPU-node components)
#   scripts/install-deps.sh test    build + GoogleTest, clang and its libFuzzer runtime, python3,
#                                   debootstrap (the older-userland test), the aarch64 cross compiler, and
#                                   the Kubernetes agent's libraries (gRPC, protobuf, libcurl, nlohmann-json)
#
# Runs apt-get non-interactively when root; otherwise prints the exact command to run and exits 1.
# On a system without dpkg it only checks that the tools are on PATH.
set -euo pipefail

profile=${1:-build}
packages=(cmake ninja-build g++ make pkg-config)
case "$profile" in
  build) ;;
  test) packages+=(libgtest-dev libgmock-dev clang libclang-rt-14-dev python3 debootstrap
                   debian-archive-keyring g++-aarch64-linux-gnu
                   libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
                   libcurl4-openssl-dev nlohmann-json3-dev) ;;
  *) echo "install-deps: unknown profile '$profile' (build, test)" >&2; exit 2 ;;
esac

if ! command -v dpkg-query >/dev/null 2>&1; then
  for tool in cmake ninja c++; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install-deps: '$tool' not found; install it" >&2; exit 1; }
  done
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing Debian packages: ${missing[*]}" >&2
  echo "install-deps: run as root:  sudo sh -c '$cmd'" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
