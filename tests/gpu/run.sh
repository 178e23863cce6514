#!/usr/bin/env bash
# The real-GPU suite, for a machine with an NVIDIA GPU, the CUDA toolkit, CMake and a compiler (no
# package registry needed: nothing from the Kubernetes side is built).
#
#   tests/gpu/run.sh            results under $OUT (or build-gpu/out), a short table printed last
#
# What it checks today: the nvshare-trainer workload, built here against cuda.h and run on the real
# driver: one alone (GPU time vs K x D), two at once on GPU 0, and the managed-memory path.
# Rules it keeps: never asks the GPU for more managed memory than it has free; never touches clocks,
# power, MIG or compute mode.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build="$root/build-gpu"
out=${OUT:-$build/out}
mkdir -p "$out"
cd "$root"

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version --format=csv
  nvcc --version | tail -n 2
} >"$out/machine.txt" 2>&1

if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVSHARE_BUILD_TESTS=OFF \
    >"$out/build.log" 2>&1 || ! cmake --build "$build" --target nvshare-trainer >>"$out/build.log" 2>&1; then
  tail -n 40 "$out/build.log"
  echo "gpu: build failed"
  exit 1
fi
trainer="$build/tests/fakecuda/nvshare-trainer"
unset LD_LIBRARY_PATH  # the trainer must find the real libcuda.so.1

results="$out/results.tsv"
printf 'case\tjob\twall_s\tgpu_s\texpected_gpu_s\tresult\n' >"$results"
field() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1" | tr -d '"'; }
record() {  # case job json expected
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$(field "$3" wall_s)" "$(field "$3" gpu_s)" "$4" \
    "$(field "$3" result)" >>"$results"
}

# 1. one trainer alone: 200 kernels of 5 ms -> 1.0 s of GPU time.
"$trainer" --bytes 1Gi --kernels 200 --kernel-us 5000 --report-meminfo >"$out/alone.json" 2>>"$out/run.log"
record alone trainer "$out/alone.json" 1.000

# 2. two trainers at once on GPU 0 (no scheduler yet: the driver time-slices them).
"$trainer" --bytes 1Gi --kernels 200 --kernel-us 5000 >"$out/pair-a.json" 2>>"$out/run.log" &
a=$!
"$trainer" --bytes 1Gi --kernels 200 --kernel-us 5000 >"$out/pair-b.json" 2>>"$out/run.log" &
b=$!
wait $a $b
record pair A "$out/pair-a.json" 1.000
record pair B "$out/pair-b.json" 1.000

# 3. managed memory placed on the device (2 GiB, far below what the GPU has free).
"$trainer" --managed --bytes 2Gi --kernels 100 --kernel-us 5000 >"$out/managed.json" 2>>"$out/run.log"
record managed trainer "$out/managed.json" 0.500

echo
cat "$out/machine.txt" | head -n 3
column -t -s $'\t' "$results" 2>/dev/null || cat "$results"
