#!/usr/bin/env bash
# Makes, once, an older distribution's root for the older-userland test: `debootstrap
# --variant=minbase SUITE` from the Debian archive into ROOT (a few minutes the first time); later
# runs reuse it. Prints the glibc the root has.
#   tests/compat/make_root.sh ROOT [SUITE]      (SUITE defaults to bullseye: Debian 11, glibc 2.31)
# NVSHARE_DEBIAN_MIRROR overrides the archive (default http://deb.debian.org/debian).
set -euo pipefail
root=${1:?usage: make_root.sh ROOT [SUITE]}
suite=${2:-bullseye}
mirror=${NVSHARE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ "$(id -u)" != 0 ]; then
  echo "make_root: needs root (debootstrap and chroot); CI runs as root" >&2
  exit 1
fi
. "$(dirname "$0")/root_cache.sh"
lock_root_cache make_root "$root"
done_mark="$root/.nvshare-root-complete"
if [ ! -f "$done_mark" ]; then
  echo "make_root: debootstrap --variant=minbase $suite from $mirror (log: $root.log)"
  rm -rf "$root.partial"
  if ! debootstrap --variant=minbase "$suite" "$root.partial" "$mirror" >"$root.log" 2>&1; then
    echo "make_root: debootstrap failed:" >&2
    tail -n 30 "$root.log" >&2
    exit 1
  fi
  touch "$root.partial/.nvshare-root-complete"
  rm -rf "$root"
  mv "$root.partial" "$root"
fi
echo "make_root: $suite at $root: $(chroot "$root" getconf GNU_LIBC_VERSION)"
