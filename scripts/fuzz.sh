#!/usr/bin/env bash
# Runs every libFuzzer target of the build (tests/fuzz/targets.txt) for N seconds each and reports
# its executions.
#   scripts/fuzz.sh BUILD_DIR SECONDS
set -euo pipefail
build=${1:-build}
seconds=${2:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -f "$build/tests/fuzz/targets.txt" ]; then
  echo "fuzz: no fuzz targets in $build (they need clang: install clang and rebuild)" >&2
  exit 1
fi
IFS=';' read -r -a targets < "$build/tests/fuzz/targets.txt"
status=0
for t in "${targets[@]}"; do
  bin="$build/tests/fuzz/$t"
  if [ ! -x "$bin" ]; then
    echo "fuzz: $bin not built (fuzz targets need clang: install clang and rebuild)" >&2
    exit 1
  fi
  corpus="$build/tests/fuzz/corpus/$t"
  mkdir -p "$corpus"
  log="$build/tests/fuzz/$t.log"
  echo "fuzz: $t for ${seconds}s"
  if "$bin" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$build/tests/fuzz/" \
      "$corpus" "$root/tests/fuzz/corpus/$t" >"$log" 2>&1; then
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    echo "fuzz: $t ok: ${runs:-?} executions in ${seconds}s, no crash"
  else
    echo "fuzz: $t FAILED (see $log)" >&2
    tail -n 20 "$log" >&2
    status=1
  fi
done
exit $status
