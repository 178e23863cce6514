# Shared by make_root.sh and make_arm64_sysroot.sh: checks that debootstrap is there and takes the
# lock of ROOT (held until the script exits), so concurrent tests make a root once.
#   . tests/compat/root_cache.sh; lock_root_cache NAME ROOT
lock_root_cache() {
  local name=$1 root=$2
  if ! command -v debootstrap >/dev/null; then
    echo "$name: debootstrap is missing (scripts/install-deps.sh test installs it)" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$root")"
  exec 9>"$root.lock"
  flock 9
}
