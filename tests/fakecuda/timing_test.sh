#!/usr/bin/env bash
# Timing accuracy of the simulated GPU, with real processes: nvshare-trainer runs against the
# simulated libcuda.so.1 and the results are checked against the time model (README.md):
#   a) one trainer alone, K kernels of D us: gpu_s within 2% of K*D;
#   b) two trainers on the same simulated GPU, started together: each wall_s within 10% of twice the
#      alone wall_s;
#   c) two trainers on two simulated GPUs: each wall_s within 10% of the alone wall_s.
# Each case uses its own state file, so it never meets other tests' processes.
#
# usage: timing_test.sh BUILD_DIR
set -euo pipefail

build=${1:?usage: timing_test.sh BUILD_DIR}
dir="$build/tests/fakecuda"
trainer="$dir/nvshare-trainer"
stat="$dir/nvshare-fakecuda-stat"
export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset NVSHARE_FAKECUDA_DEVICES NVSHARE_FAKECUDA_UUIDS NVSHARE_FAKECUDA_MEMORY

tmp=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

kernels=200
kernel_us=5000
failures=0

# field JSON NAME: one field of a JSON object.
field() { python3 -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# within WHAT VALUE EXPECTED TOLERANCE: checks |VALUE / EXPECTED - 1| <= TOLERANCE.
within() {
  local check='import sys; v, e, t = map(float, sys.argv[1:]); sys.exit(abs(v / e - 1) > t)'
  if python3 -c "$check" "$2" "$3" "$4"; then
    printf 'ok    %-48s %.4f vs %.4f (ratio %.4f, tolerance %s)\n' "$1" "$2" "$3" \
      "$(python3 -c "print($2 / $3)")" "$4"
  else
    printf 'FAIL  %-48s %.4f vs %.4f (ratio %.4f, tolerance %s)\n' "$1" "$2" "$3" \
      "$(python3 -c "print($2 / $3)")" "$4"
    failures=$((failures + 1))
  fi
}

# result OUTPUT_FILE: the trainer's JSON, after checking it succeeded.
result() {
  local json
  json=$(cat "$1")
  if [[ "$(field "$json" result)" != ok ]]; then
    echo "FAIL  trainer reported: $json"
    exit 1
  fi
  echo "$json"
}

run_trainer() {  # run_trainer OUTPUT_FILE ARGS...
  local out=$1
  shift
  "$trainer" --kernels "$kernels" --kernel-us "$kernel_us" "$@" >"$out" &
  pids+=($!)
}

wait_all() {
  local pid
  for pid in "${pids[@]}"; do wait "$pid"; done
  pids=()
}

# a) alone.
export NVSHARE_FAKECUDA_STATE="$tmp/alone.state"
run_trainer "$tmp/alone.json"
wait_all
alone=$(result "$tmp/alone.json")
alone_wall=$(field "$alone" wall_s)
expected_gpu=$(python3 -c "print($kernels * $kernel_us / 1e6)")
within "alone: gpu_s vs K*D" "$(field "$alone" gpu_s)" "$expected_gpu" 0.02

# b) two trainers on one simulated GPU.
export NVSHARE_FAKECUDA_STATE="$tmp/shared.state"
run_trainer "$tmp/shared0.json"
run_trainer "$tmp/shared1.json"
wait_all
for i in 0 1; do
  shared=$(result "$tmp/shared$i.json")
  within "same GPU: trainer $i wall_s vs 2x alone" "$(field "$shared" wall_s)" \
    "$(python3 -c "print(2 * $alone_wall)")" 0.10
done
state=$("$stat")
device0='import json, sys; d = json.loads(sys.argv[1])["devices"][0]'
kernels_run=$(python3 -c "$device0; print(d['kernels'])" "$state")
contexts_left=$(python3 -c "$device0; print(len(d['contexts']))" "$state")
if [[ "$kernels_run" != "$((2 * kernels))" || "$contexts_left" != 0 ]]; then
  echo "FAIL  state after the shared run: $state"
  failures=$((failures + 1))
fi

# c) two trainers on two simulated GPUs.
export NVSHARE_FAKECUDA_STATE="$tmp/two.state"
export NVSHARE_FAKECUDA_DEVICES=2
run_trainer "$tmp/two0.json" --device 0
run_trainer "$tmp/two1.json" --device 1
wait_all
for i in 0 1; do
  two=$(result "$tmp/two$i.json")
  within "two GPUs: trainer $i wall_s vs alone" "$(field "$two" wall_s)" "$alone_wall" 0.10
done

if ((failures > 0)); then
  echo "$failures timing check(s) failed"
  exit 1
fi
echo "all timing checks passed"
