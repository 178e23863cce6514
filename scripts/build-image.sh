#!/usr/bin/env bash
# `make image`: builds the node image from deploy/docker/Dockerfile with podman (or docker).
#
#   scripts/build-image.sh [TAG]        (default nvshare:<version>; NVSHARE_IMAGE_TOOL=docker|podman)
#
# The context is the repository's files as git lists them (tracked and untracked, not ignored), so
# no build directory goes in. The Dockerfile's two base images come from their registry when the
# tool can pull them; when it cannot (a host with no registry but Debian's), they are made here:
#   debian:12-slim  a Debian 12 root made with debootstrap (minbase) from the Debian archive, cached
#                   in NVSHARE_IMAGE_CACHE (default /var/cache/nvshare-image), imported as
#                   localhost/nvshare-base/debian:12-slim
#   the CUDA image  only its cuda.h is used: a one-file image holding this machine's cuda.h
#                   (CUDA_HOME, else /usr/local/cuda), imported as localhost/nvshare-base/cuda-headers
# The build stage installs its -dev packages from the Debian archive, so that must be reachable.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^project(nvshare VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
tag=${1:-nvshare:${version:-0.0.0}}
tool=${NVSHARE_IMAGE_TOOL:-}
if [ -z "$tool" ]; then
  if command -v podman >/dev/null 2>&1; then tool=podman
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then tool=docker
  else
    echo "image: neither podman nor a running docker engine was found (apt-get install podman)" >&2
    exit 1
  fi
fi
cache=${NVSHARE_IMAGE_CACHE:-/var/cache/nvshare-image}
debian_image=debian:12-slim
cuda_image=nvidia/cuda:13.0.2-devel-ubuntu24.04

have_or_pull() {  # IMAGE: present locally, or pulled within two minutes
  "$tool" image inspect "$1" >/dev/null 2>&1 && return 0
  timeout 120 "$tool" pull -q "$1" >/dev/null 2>&1
}

if ! have_or_pull "$debian_image"; then
  debian_image=localhost/nvshare-base/debian:12-slim
  if ! "$tool" image inspect "$debian_image" >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || { echo "image: making the Debian base needs root (debootstrap)" >&2; exit 1; }
    root="$cache/bookworm-$(dpkg --print-architecture)"
    if [ ! -f "$root/.complete" ]; then
      echo "image: no registry answers for debian:12-slim; making it with debootstrap (a few minutes)"
      rm -rf "$root"
      mkdir -p "$cache"
      debootstrap --variant=minbase bookworm "$root" "${NVSHARE_DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
        >"$root.log" 2>&1 || { tail -n 20 "$root.log" >&2; exit 1; }
      rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
      touch "$root/.complete"
    fi
    tar --exclude=./.complete -C "$root" -c . | "$tool" import - "$debian_image" >/dev/null
  fi
fi
if ! have_or_pull "$cuda_image"; then
  header="${CUDA_HOME:-/usr/local/cuda}/include/cuda.h"
  [ -f "$header" ] || { echo "image: no CUDA image and no $header (set CUDA_HOME)" >&2; exit 1; }
  cuda_image=localhost/nvshare-base/cuda-headers
  work=$(mktemp -d)
  mkdir -p "$work/usr/local/cuda/include"
  cp "$header" "$work/usr/local/cuda/include/cuda.h"
  tar -C "$work" -c . | "$tool" import - "$cuda_image" >/dev/null
  rm -rf "$work"
fi

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -c | tar -x -C "$context"
echo "image: building $tag with $tool (bases $debian_image, $cuda_image)"
start=$(date +%s)
"$tool" build --network host -f "$context/deploy/docker/Dockerfile" \
  --build-arg "DEBIAN_IMAGE=$debian_image" --build-arg "CUDA_HEADERS_IMAGE=$cuda_image" \
  -t "$tag" "$context"
echo "image: $tag built in $(( $(date +%s) - start )) s"
# What it holds answers (the limits as the DaemonSets' containers run: no raised rlimits).
"$tool" run --rm --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$tag" \
  /usr/bin/nvshare-scheduler --version
