#!/usr/bin/env bash
# The real-GPU suite, for a machine with an NVIDIA GPU, the CUDA toolkit, CMake, a compiler and the
# frameworks (PyTorch, CuPy). Nothing from the Kubernetes side is built, so no package registry is needed.
#
#   tests/gpu/run.sh            full results in build-gpu/out (and, when $OUT is set, results.tsv,
#                               machine.txt and gpu-results.tgz of everything under $OUT); a short
#                               table printed last
#
# Every scenario runs the same workload natively and under nvshare (libnvshare.so + nvshare-scheduler) in
# this one call, so the times are comparable. Rules kept: managed memory asked for stays far below what the
# GPU has free (small GPUs are emulated with the scheduler's --capacity); clocks, power, MIG and compute
# mode are never touched.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build="$root/build-gpu"
out="$build/out"
rm -rf "$out"
mkdir -p "$out"
cd "$root"
export PYTHONUNBUFFERED=1
unset LD_LIBRARY_PATH  # the real libcuda.so.1

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=index,name,memory.total,memory.free,driver_version --format=csv
  nvcc --version | tail -n 2
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} >"$out/machine.txt" 2>&1

if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVSHARE_BUILD_TESTS=OFF \
    >"$out/build.log" 2>&1 ||
   ! cmake --build "$build" --target nvshare nvshare-scheduler nvsharectl nvshare-run nvshare-trainer \
    >>"$out/build.log" 2>&1; then
  tail -n 40 "$out/build.log"
  echo "gpu: build failed"
  exit 1
fi
lib="$build/src/client/libnvshare.so"
sched="$build/src/scheduler/nvshare-scheduler"
ctl="$build/src/tools/nvsharectl"
run="$build/src/tools/nvshare-run"
torch_job="python3 $root/tests/gpu/torch_job.py"

results="$out/results.tsv"
printf 'scenario\tjob\tnative_s\tnvshare_s\tratio\tresult\tnote\n' >"$results"
field() { python3 -c 'import json,sys
try:
  d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); v=d.get(sys.argv[2], "")
  print(f"{v:.3f}" if isinstance(v, float) else v)
except Exception: print("")' "$1" "$2"; }
ratio() { python3 -c 'import sys
try: print(f"{float(sys.argv[2])/float(sys.argv[1]):.3f}")
except Exception: print("")' "$1" "$2"; }
record() {  # scenario job native.json nvshare.json key note
  local n s
  n=$(field "$3" "$5"); s=$(field "$4" "$5")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$n" "$s" "$(ratio "$n" "$s")" \
    "$(field "$3" result)/$(field "$4" result)" "$6" >>"$results"
}

# A private scheduler per scenario: start_scheduler NAME [flags...]; its socket is $sock.
start_scheduler() {
  local name=$1
  shift
  dir="$out/$name"
  mkdir -p "$dir"
  sock="$dir/s.sock"
  ctl_sock="$dir/c.sock"
  "$sched" --socket "$sock" --control-socket "$ctl_sock" --state-file "$dir/state.json" \
    --trust-client-limits "$@" \
    >"$dir/scheduler.log" 2>&1 &
  sched_pid=$!
  for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
}
stop_scheduler() {
  "$ctl" --control-socket "$ctl_sock" status --json >"$dir/status.json" 2>&1 || true
  kill "$sched_pid" 2>/dev/null
  wait "$sched_pid" 2>/dev/null
}
under() { "$run" --socket "$sock" "$@"; }

# 1. PyTorch, one memory-bound job (z = x + y, 12 GiB of tensors).
$torch_job --gib 12 --iters 1500 >"$out/single.native.json" 2>"$out/single.native.err"
start_scheduler single
under -- $torch_job --gib 12 --iters 1500 >"$out/single.nvshare.json" 2>"$out/single.nvshare.err"
stop_scheduler
record single torch "$out/single.native.json" "$out/single.nvshare.json" loop_s "memory-bound loop"

# 2. Two PyTorch jobs at once that fit together.
$torch_job --gib 8 --iters 1500 >"$out/pair.native.a.json" 2>&1 &
a=$!
$torch_job --gib 8 --iters 1500 >"$out/pair.native.b.json" 2>&1 &
b=$!
wait $a $b
start_scheduler pair
under -- $torch_job --gib 8 --iters 1500 >"$out/pair.nvshare.a.json" 2>"$out/pair.nvshare.a.err" &
a=$!
under -- $torch_job --gib 8 --iters 1500 >"$out/pair.nvshare.b.json" 2>"$out/pair.nvshare.b.err" &
b=$!
wait $a $b
stop_scheduler
record pair A "$out/pair.native.a.json" "$out/pair.nvshare.a.json" wall_s "two that fit, run together"
record pair B "$out/pair.native.b.json" "$out/pair.nvshare.b.json" wall_s "two that fit, run together"

# 3. Two 14 GiB jobs under a 24 GiB virtual capacity: they cannot run together, so they take turns and
#    swap (native: the same two jobs at once on the real 141 GB GPU).
$torch_job --gib 14 --iters 1500 >"$out/turns.native.a.json" 2>&1 &
a=$!
$torch_job --gib 14 --iters 1500 >"$out/turns.native.b.json" 2>&1 &
b=$!
wait $a $b
start_scheduler turns --capacity 24Gi --quantum 2
under -- $torch_job --gib 14 --iters 1500 >"$out/turns.nvshare.a.json" 2>"$out/turns.nvshare.a.err" &
a=$!
under -- $torch_job --gib 14 --iters 1500 >"$out/turns.nvshare.b.json" 2>"$out/turns.nvshare.b.err" &
b=$!
wait $a $b
stop_scheduler
record turns A "$out/turns.native.a.json" "$out/turns.nvshare.a.json" wall_s "24Gi capacity, 2 x 14Gi"
record turns B "$out/turns.native.b.json" "$out/turns.nvshare.b.json" wall_s "24Gi capacity, 2 x 14Gi"

# 3b. An idle job's memory is evicted for the next: A (10 GiB) runs its loop, then idles 8 s holding
#     its tensors; B (10 GiB) asks for the GPU meanwhile under a 16Gi virtual capacity, so A is asked
#     to move to the host what does not fit beside B, and B runs once it has. A then checks every tensor (its memory
#     swapped back in). Native: the same two, B started 2 s after A.
$torch_job --gib 10 --iters 300 --pause-s 8 >"$out/evict.native.a.json" 2>&1 &
a=$!
sleep 2
$torch_job --gib 10 --iters 1500 >"$out/evict.native.b.json" 2>&1
wait $a
start_scheduler evict --capacity 16Gi
NVSHARE_TRACE_FILE="$out/evict/trace.jsonl" under -- $torch_job --gib 10 --iters 300 --pause-s 8 \
  >"$out/evict.nvshare.a.json" 2>"$out/evict.nvshare.a.err" &
a=$!
sleep 2
NVSHARE_TRACE_FILE="$out/evict/trace.jsonl" under -- $torch_job --gib 10 --iters 1500 \
  >"$out/evict.nvshare.b.json" 2>"$out/evict.nvshare.b.err"
wait $a
stop_scheduler
record evict "A (idles, evicted)" "$out/evict.native.a.json" "$out/evict.nvshare.a.json" wall_s \
  "tensors checked after the pause"
record evict "B" "$out/evict.native.b.json" "$out/evict.nvshare.b.json" wall_s "16Gi capacity, 2 x 10 GiB"
evicted=$(python3 -c 'import json,sys
moved=0
for line in open(sys.argv[1]):
  e=json.loads(line)
  if e.get("event")=="evicted": moved+=e.get("swap_bytes",0)
print(moved)' "$out/evict/trace.jsonl" 2>/dev/null)
# A partial swap-out moves what does not fit, not all of A: at least the overflow of 2 x 10 GiB over
# 16Gi (4 GiB), at most A's memory.
printf 'evict\tbytes evicted\t\t%s\t\t%s\texpect 4 GiB (4294967296) to 11 GiB (11811160064)\n' \
  "${evicted:-}" "$([ "${evicted:-0}" -ge 4294967296 ] 2>/dev/null &&
    [ "${evicted:-0}" -le 11811160064 ] && echo ok || echo missing)" >>"$results"

# 4. A 4Gi memory limit: torch.cuda.mem_get_info reports it and a 5 GiB tensor raises OutOfMemoryError.
$torch_job --mode limit --gib 5 >"$out/limit.native.json" 2>"$out/limit.native.err"
start_scheduler limit
under --memory-limit 4Gi -- $torch_job --mode limit --gib 5 >"$out/limit.nvshare.json" \
  2>"$out/limit.nvshare.err"
under --memory-limit 4Gi -- $torch_job --mode limit --gib 3 >"$out/limit3.nvshare.json" \
  2>"$out/limit3.nvshare.err"
stop_scheduler
record limit "total" "$out/limit.native.json" "$out/limit.nvshare.json" mem_total "4Gi = 4294967296"
record limit "5GiB allocated" "$out/limit.native.json" "$out/limit.nvshare.json" allocated "expect False under 4Gi"
record limit "3GiB allocated" "$out/limit.native.json" "$out/limit3.nvshare.json" allocated "expect True under 4Gi"

# 5. A 50% compute cap on one job (expect about twice the native loop time).
start_scheduler cap
under --core-limit 50 -- $torch_job --gib 12 --iters 3000 >"$out/cap.nvshare.json" 2>"$out/cap.nvshare.err"
stop_scheduler
$torch_job --gib 12 --iters 3000 >"$out/cap.native.json" 2>"$out/cap.native.err"
record cap50 torch "$out/cap.native.json" "$out/cap.nvshare.json" loop_s "expect ratio ~2.0"

# 6. CuPy under the library.
python3 "$root/tests/gpu/cupy_job.py" --gib 6 --iters 1500 >"$out/cupy.native.json" 2>"$out/cupy.native.err"
start_scheduler cupy
under -- python3 "$root/tests/gpu/cupy_job.py" --gib 6 --iters 1500 >"$out/cupy.nvshare.json" \
  2>"$out/cupy.nvshare.err"
stop_scheduler
record cupy cupy "$out/cupy.native.json" "$out/cupy.nvshare.json" loop_s "elementwise loop"

# 7. The driver-API trainer (200 x 5 ms kernels = 1.0 s of GPU time).
"$build/tests/fakecuda/nvshare-trainer" --bytes 1Gi --kernels 200 --kernel-us 5000 >"$out/trainer.native.json" 2>&1
start_scheduler trainer
under -- "$build/tests/fakecuda/nvshare-trainer" --bytes 1Gi --kernels 200 --kernel-us 5000 \
  >"$out/trainer.nvshare.json" 2>"$out/trainer.nvshare.err"
stop_scheduler
record trainer trainer "$out/trainer.native.json" "$out/trainer.nvshare.json" gpu_s "driver API"

# 7b. A deep queue under a 30% cap: 2 iterations of 30 x 100 ms kernels (3 s of GPU work queued,
#     then one synchronization). The cap holds when the wall time is 1 / 0.30 = 3.33 x native.
deep=(--bytes 1Gi --kernels 2 --kernels-per-iter 30 --kernel-us 100000)
"$build/tests/fakecuda/nvshare-trainer" "${deep[@]}" >"$out/deep.native.json" 2>&1
start_scheduler deep
under --core-limit 30 -- "$build/tests/fakecuda/nvshare-trainer" "${deep[@]}" \
  >"$out/deep.nvshare.json" 2>"$out/deep.nvshare.err"
stop_scheduler
record capdeep trainer "$out/deep.native.json" "$out/deep.nvshare.json" wall_s \
  "30% cap, 3 s queued per sync: expect ratio ~3.33"

# 7c. Caps as entitlements: PyTorch matmul jobs capped at 20% and 45% and an uncapped one run together
#     for 40 s (the GPU time-slices among them). A job's share is the matmuls it completed in the
#     common window over what one job completes alone in that time (tests/gpu/shares.py): expect 20,
#     45 and 35 (the rest). The native column is the expected share.
$torch_job --matmul --iters 500 --progress-every 5 >"$out/entitle.alone.json" 2>"$out/entitle.alone.err"
alone_rate=$(python3 -c 'import json,sys
d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(d["iters"]/d["loop_s"])' \
  "$out/entitle.alone.json" 2>/dev/null || echo 0)
start_scheduler entitle
pids=()
for job in cap20:20 cap45:45 uncapped:100; do
  IFS=: read -r name cap <<<"$job"
  limit=()
  [ "$cap" -lt 100 ] && limit=(--core-limit "$cap")
  under "${limit[@]}" -- $torch_job --matmul --seconds 40 --progress-every 5 \
    >"$out/entitle.$name.json" 2>"$out/entitle.$name.err" &
  pids+=($!)
done
wait "${pids[@]}"
stop_scheduler
python3 "$root/tests/gpu/shares.py" "$alone_rate" cap20="$out/entitle.cap20.err" \
  cap45="$out/entitle.cap45.err" uncapped="$out/entitle.uncapped.err" >"$out/entitle.tsv"
while IFS=$'\t' read -r name share window; do
  case $name in cap20) want=20 ;; cap45) want=45 ;; *) want=35 ;; esac
  printf 'entitle\t%s\t%s\t%s\t%s\t%s/%s\t%s\n' "$name" "$want" "$share" "$(ratio "$want" "$share")" \
    "$(field "$out/entitle.alone.json" result)" "$(field "$out/entitle.$name.json" result)" \
    "share % over ${window} s (alone ${alone_rate} matmul/s): want / got" >>"$results"
done <"$out/entitle.tsv"

# 7d. CUDA IPC: torch.multiprocessing hands a CUDA tensor and an interprocess event's IPC handle to a
#     child process, which checks the values, writes new ones and records the event; the parent
#     checks what the child wrote (tests/gpu/ipc_job.py). Under the library the tensor is
#     device-backed memory, shared through the scheduler.
python3 "$root/tests/gpu/ipc_job.py" >"$out/ipc.native.json" 2>"$out/ipc.native.err"
start_scheduler ipc
under -- python3 "$root/tests/gpu/ipc_job.py" >"$out/ipc.nvshare.json" 2>"$out/ipc.nvshare.err"
stop_scheduler
record ipc torch.multiprocessing "$out/ipc.native.json" "$out/ipc.nvshare.json" elapsed_s \
  "tensor + IPC event to a child: values checked both ways"

# 7e. (Two or more GPUs.) CUDA IPC between processes on different GPUs: the child of 7d computes on
#     GPU 1 with the tensor that stays on GPU 0, writing back across GPUs; and the driver-API trainer
#     maps GPU 0's exported buffer in a context of GPU 1 (it reads 5a, the exporter then sees a5).
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
  python3 "$root/tests/gpu/ipc_job.py" --peer-device 1 >"$out/ipcpeer.native.json" 2>"$out/ipcpeer.native.err"
  start_scheduler ipcpeer
  under -- python3 "$root/tests/gpu/ipc_job.py" --peer-device 1 >"$out/ipcpeer.nvshare.json" \
    2>"$out/ipcpeer.nvshare.err"
  stop_scheduler
  record ipcpeer torch.multiprocessing "$out/ipcpeer.native.json" "$out/ipcpeer.nvshare.json" elapsed_s \
    "tensor on GPU 0, child computes on GPU 1"
  trainer="$build/tests/fakecuda/nvshare-trainer"
  for how in native nvshare; do
    rm -f "$out/ipcpeer.handle" "$out/ipcpeer.done"
    wrap=()
    if [ "$how" = nvshare ]; then start_scheduler ipcpeer-trainer; wrap=(under --); fi
    "${wrap[@]}" "$trainer" --device 0 --bytes 64Mi --kernels 1 --ipc-export "$out/ipcpeer.handle" \
      --ipc-wait "$out/ipcpeer.done" >"$out/ipcpeer.export.$how.json" 2>"$out/ipcpeer.export.$how.err" &
    exporter=$!
    "${wrap[@]}" "$trainer" --device 1 --kernels 0 --ipc-import "$out/ipcpeer.handle" \
      --ipc-done "$out/ipcpeer.done" >"$out/ipcpeer.import.$how.json" 2>"$out/ipcpeer.import.$how.err"
    wait "$exporter"
    [ "$how" = nvshare ] && stop_scheduler
  done
  record ipcpeer "trainer read on GPU 1" "$out/ipcpeer.import.native.json" \
    "$out/ipcpeer.import.nvshare.json" ipc_read "expect 5a/5a"
  record ipcpeer "trainer saw on GPU 0" "$out/ipcpeer.export.native.json" \
    "$out/ipcpeer.export.nvshare.json" ipc_seen "expect a5/a5"
fi

# 8. A container with the settings the device plugin mounts at /etc/nvshare (memory-limit 4Gi), whose
#    environment says NVSHARE_ENABLE=0 and which no scheduler answers: PyTorch still sees 4Gi and a
#    5 GiB tensor fails. Needs root and a mount namespace (the settings are bind-mounted read-only).
settings="$out/settings"
mkdir -p "$settings"
chmod 755 "$settings"
printf 'enforce=1\nsocket=%s\nregister-wait-ms=1000\nmemory-limit=4294967296\n' \
  "$out/nobody-listens.sock" >"$settings/client.conf"
chmod 644 "$settings/client.conf"
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
  made_mount_point=
  [ -d /etc/nvshare ] || { mkdir /etc/nvshare && made_mount_point=1; }
  for gib in 5 3; do
    unshare -m sh -c "mount --bind '$settings' /etc/nvshare && mount -o remount,bind,ro /etc/nvshare &&
      NVSHARE_ENABLE=0 NVSHARE_SOCKET=/tmp/elsewhere.sock LD_PRELOAD='$lib' \
      $torch_job --mode limit --gib $gib" >"$out/enforced$gib.json" 2>"$out/enforced$gib.err"
  done
  [ -n "$made_mount_point" ] && rmdir /etc/nvshare
  record enforced "total" "$out/limit.native.json" "$out/enforced5.json" mem_total "settings 4Gi, ENABLE=0, no scheduler"
  record enforced "5GiB allocated" "$out/limit.native.json" "$out/enforced5.json" allocated "expect False"
  record enforced "3GiB allocated" "$out/limit.native.json" "$out/enforced3.json" allocated "expect True"
else
  echo "scenario 8 (settings file) skipped: it needs root and mount namespaces" >&2
fi

if [ -n "${OUT:-}" ]; then
  cp "$results" "$out/machine.txt" "$OUT/"
  tar czf "$OUT/gpu-results.tgz" -C "$build" out
fi
echo
head -n 5 "$out/machine.txt"
column -t -s $'\t' "$results" 2>/dev/null || cat "$results"
