#!/usr/bin/env bash
# The real-GPU benchmark suite's entry point, for a machine with an NVIDIA GPU, the CUDA toolkit, CMake,
# a compiler and PyTorch (no package registry needed: nothing from the Kubernetes side is built).
#
#   bench/gpu/run.sh [PHASE[,PHASE...]] [--repeats N]
#       PHASE: overhead (single job, launch-bound, hand-off latency), together (two compute-bound jobs
#       that fit, three idle-ish jobs, caps co-running, a service beside a trainer), turns (two jobs
#       that do not fit, compute caps, deep queues under a cap), memory (swap bandwidth of each memory
#       mode beside native pinned copies, what an allocation costs, how making a host copy stalls
#       the process's own submissions), multi (two GPUs), or all (the
#       default; about 30 minutes on one H200)
#
# Builds libnvshare.so, nvshare-scheduler, nvsharectl, nvshare-launch-bench and nvshare-host-copy-stall
# (Release) in build-bench/,
# runs every scenario of the phases with and without nvshare in this one call, and writes under
# build-bench/out (and $OUT when set): results.json, table.md, benchmarks.json, PNG plots and
# raw.tgz (every job's output, scheduler logs, grant traces). The table is printed last.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
phase=${1:-all}
label=${phase//,/-}  # file names in $OUT: letters, digits, . _ - only
shift || true
build="$root/build-bench"
out="${OUT:-$build/out}"
mkdir -p "$out"
cd "$root"
unset LD_LIBRARY_PATH  # the real libcuda.so.1

if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVSHARE_BUILD_TESTS=OFF \
    -DNVSHARE_WITH_K8S=OFF >"$out/build.log" 2>&1 ||
   ! cmake --build "$build" --target nvshare nvshare-scheduler nvsharectl nvshare-launch-bench nvshare-host-copy-stall \
    >>"$out/build.log" 2>&1; then
  tail -n 40 "$out/build.log"
  echo "bench: build failed"
  exit 1
fi

work="$build/work-$label"
rm -rf "$work"
mkdir -p "$work"
python3 bench/gpu/bench.py --build "$build" --out "$work" --phase "$phase" "$@" 2>&1 |
  tee "$out/bench.log" | grep -E "METRIC|failed|==" || true
cp "$work/results.json" "$out/results-$label.json" 2>/dev/null
mkdir -p "$out/plots"
python3 bench/gpu/report.py "$work/results.json" --markdown "$out/table-$label.md" \
  --json "$out/benchmarks-$label.json" --plots "$work/plots" --raw "$work/raw" >/dev/null
# $OUT returns few files: plots and raw data travel as archives.
tar -czf "$out/plots-$label.tgz" -C "$work" plots 2>/dev/null
tar -czf "$out/raw-$label.tgz" -C "$work" raw 2>/dev/null
rmdir "$out/plots" 2>/dev/null
echo
cat "$out/table-$label.md"
