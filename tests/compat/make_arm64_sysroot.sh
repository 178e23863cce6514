#!/usr/bin/env bash
# Makes, once, a Debian arm64 sysroot for cross-compiling the Kubernetes components (gRPC,
# protobuf, libcurl, OpenSSL) for aarch64: debootstrap's first stage (--foreign:
# download and unpack, nothing run, so no emulator is needed), every downloaded package extracted
# into the root, and absolute symbolic links made relative so they resolve inside it. Later runs
# reuse it.
#   tests/compat/make_arm64_sysroot.sh ROOT [SUITE]   (SUITE defaults to the host's, so the host's
#                                                      protoc and grpc_cpp_plugin match its libraries)
# NVSHARE_DEBIAN_MIRROR overrides the archive (default http://deb.debian.org/debian).
set -euo pipefail
root=${1:?usage: make_arm64_sysroot.sh ROOT [SUITE]}
suite=${2:-$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")}
mirror=${NVSHARE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=libgrpc++-dev,protobuf-compiler-grpc,libprotobuf-dev,libcurl4-openssl-dev,libssl-dev
. "$(dirname "$0")/root_cache.sh"
lock_root_cache make_arm64_sysroot "$root"
done_mark="$root/.nvshare-sysroot-complete"
if [ ! -f "$done_mark" ] || [ "$(cat "$done_mark")" != "$suite $packages" ]; then
  echo "make_arm64_sysroot: debootstrap --foreign --arch=arm64 $suite from $mirror (log: $root.log)"
  rm -rf "$root.partial"
  if ! debootstrap --foreign --arch=arm64 --variant=minbase --include="$packages" "$suite" \
      "$root.partial" "$mirror" >"$root.log" 2>&1; then
    echo "make_arm64_sysroot: debootstrap failed:" >&2
    tail -n 30 "$root.log" >&2
    exit 1
  fi
  for deb in "$root.partial"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$root.partial"; done
  rm -f "$root.partial"/var/cache/apt/archives/*.deb
  # Links such as usr/lib/aarch64-linux-gnu/libz.so -> /lib/...: relative, within the root.
  python3 - "$root.partial" <<'PY'
import os, sys
root = sys.argv[1]
for directory, dirs, files in os.walk(root):
    for name in dirs + files:
        path = os.path.join(directory, name)
        if os.path.islink(path) and os.readlink(path).startswith("/"):
            target = os.path.join(root, os.readlink(path).lstrip("/"))
            os.remove(path)
            os.symlink(os.path.relpath(target, directory), path)
PY
  echo "$suite $packages" >"$root.partial/.nvshare-sysroot-complete"
  rm -rf "$root"
  mv "$root.partial" "$root"
fi
echo "make_arm64_sysroot: $suite arm64 at $root: gRPC $(ls "$root"/usr/lib/aarch64-linux-gnu/libgrpc++.so.* | sed -n 's/.*\.so\.//p' | sort -V | tail -1)"
