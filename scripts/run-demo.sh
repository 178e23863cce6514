#!/usr/bin/env bash
# The main job (`make run`). Until the client library lands it shows the workload nvshare will share: the nvshare-trainer alone, then two trainers at once on the same GPU, on the real GPU when
# one is present and on the simulated GPU otherwise.
#   scripts/run-demo.sh BUILD_DIR
set -euo pipefail
build=${1:-build}
trainer="$build/tests/fakecuda/nvshare-trainer"
if [ ! -x "$trainer" ]; then
  echo "run: $trainer is not built (it needs cuda.h from the CUDA toolkit: set CUDA_HOME)" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  where="real GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader -i 0)"
else
  where="simulated GPU (tests/fakecuda: one 16Gi device, kernels take simulated time)"
  export LD_LIBRARY_PATH="$build/tests/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export NVSHARE_FAKECUDA_DEVICES=1 NVSHARE_FAKECUDA_MEMORY=16Gi
  export NVSHARE_FAKECUDA_STATE="$work/fakecuda.state"
fi

echo "nvshare: running on the $where"
echo "nvshare: the client library is not built yet, so no process is under the scheduler's control;"
echo "nvshare: this shows the workload it will share: one trainer alone, then two at once."
args=(--bytes 256Mi --kernels 100 --kernel-us 10000)

field() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1" | tr -d '"'; }
row() { printf '%-22s %8s %8s %10s %s\n' "$@"; }

"$trainer" "${args[@]}" >"$work/alone.json"
"$trainer" "${args[@]}" >"$work/a.json" &
a=$!
"$trainer" "${args[@]}" >"$work/b.json" &
b=$!
wait "$a" "$b"

echo
row job "wall s" "GPU s" "iters/s" result
for j in alone a b; do
  case $j in alone) name="trainer alone" ;; a) name="trainer A (beside B)" ;; b) name="trainer B (beside A)" ;; esac
  row "$name" "$(field "$work/$j.json" wall_s)" "$(field "$work/$j.json" gpu_s)" \
    "$(field "$work/$j.json" iters_per_s)" "$(field "$work/$j.json" result)"
done
