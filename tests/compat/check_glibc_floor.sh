#!/usr/bin/env bash
# Fails when a binary needs a glibc symbol version above MAX: the loader of an older glibc would
# refuse it. Lists each binary's highest version and every symbol above MAX.
#   tests/compat/check_glibc_floor.sh MAX BINARY...        (MAX like 2.28)
# OBJDUMP names the objdump to use (a cross build's, for another architecture's binaries).
set -euo pipefail
max=${1:?usage: check_glibc_floor.sh MAX BINARY...}
shift
objdump=${OBJDUMP:-objdump}
status=0
for binary in "$@"; do
  if [ ! -f "$binary" ]; then
    echo "glibc floor: $binary: missing" >&2
    status=1
    continue
  fi
  # Every versioned glibc reference, as "VERSION SYMBOL".
  refs=$("$objdump" -T "$binary" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\(?GLIBC_[0-9.]+\)?$/) { v = $i; gsub(/[()]/, "", v); print v, $NF } }')
  highest=$(printf '%s\n' "$refs" | awk '{ print $1 }' | sed 's/^GLIBC_//' | sort -uV | tail -n 1)
  over=$(printf '%s\n' "$refs" | awk -v max="$max" '
    function newer(a, b,   x, y, i, n) {
      n = split(a, x, "."); split(b, y, ".")
      for (i = 1; i <= 3; i++) { if ((x[i] + 0) != (y[i] + 0)) return (x[i] + 0) > (y[i] + 0) }
      return 0
    }
    { v = $1; sub(/^GLIBC_/, "", v); if (newer(v, max)) print "  " $2 " needs GLIBC_" v }')
  if [ -n "$over" ]; then
    echo "glibc floor: $binary needs glibc $highest, above $max:"
    echo "$over"
    status=1
  else
    echo "glibc floor: $binary: highest version GLIBC_$highest (at most $max)"
  fi
done
exit $status
