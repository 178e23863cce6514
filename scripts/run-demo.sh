#!/usr/bin/env bash
# The main job (`make run`): three jobs share one GPU under nvshare.
#
#   scripts/run-demo.sh BUILD_DIR
#
# A private nvshare-scheduler (sockets in a temporary directory, started and stopped here) arbitrates
# one GPU between three nvshare-trainer processes running under libnvshare.so:
#   A  3/8 of the GPU  uncapped       A and B fit together (3/4 of the GPU <= the 90% usable): they
#   B  3/8 of the GPU  uncapped       co-run
#   C  3/4 of the GPU  capped at 30%  does not fit beside A or B: it takes turns with them, every
#                                     hand-off swaps the leaving jobs' memory to the host and the
#                                     next one's back, and C never gets more than 30% of the GPU's
#                                     time
# On the simulated GPU the GPU's size follows this machine's available memory (16Gi at most: see
# below); on a real GPU it is a 4Gi virtual capacity and the jobs are 768Mi, 768Mi and 2.5Gi, since
# each CUDA context also takes about 0.5Gi there.
# The scheduler runs with `--mode auto` (the default, given explicitly): the mode in which jobs that
# fit run together (one at a time while a capped job wants the GPU: caps are enforced by
# time-division). In mode `exclusive` (docs/scheduling.md) A and B would take turns too.
# A line refreshed every 0.5 s shows what `nvsharectl status --json` says; a table at the end gives
# each job's wall time, the GPU time it received and how long it waited, by reason.
#
# Each job's working set also holds its CUDA context, which the library measures with NVML and
# charges (about 0.5Gi on an H200; nothing on the simulated GPU, or 512Mi where NVML is missing). On a
# machine with an NVIDIA GPU (nvidia-smi -L works) it uses that GPU with small jobs (768Mi, 768Mi,
# 2.5Gi) and the scheduler's virtual capacity emulating a 4Gi GPU, and refuses to start unless the GPU
# has 10Gi free (asking a GPU for more managed memory than it has free can hang it).
# Elsewhere it uses the simulated GPU (tests/fakecuda), where kernels take simulated time.
set -euo pipefail

build=${1:-build}
build=$(cd "$build" && pwd)
trainer="$build/tests/fakecuda/nvshare-trainer"
scheduler="$build/src/scheduler/nvshare-scheduler"
ctl="$build/src/tools/nvsharectl"
library="$build/src/client/libnvshare.so"
for f in "$trainer" "$scheduler" "$ctl" "$library"; do
  if [ ! -e "$f" ]; then
    echo "run: $f is not built (the trainer and the library need cuda.h from the CUDA toolkit:" \
      "set CUDA_HOME)" >&2
    exit 1
  fi
done
command -v python3 >/dev/null || { echo "run: python3 is needed (scripts/install-deps.sh test)" >&2; exit 1; }

work=$(mktemp -d /tmp/nvshare-demo-XXXXXX)
scheduler_pid=
cleanup() {
  # The jobs are the monitor's children and die with it; the scheduler is ours to stop.
  if [ -n "$scheduler_pid" ] && kill -0 "$scheduler_pid" 2>/dev/null; then
    kill -TERM "$scheduler_pid" 2>/dev/null || true
    wait "$scheduler_pid" 2>/dev/null || true
  fi
  if [ -n "${NVSHARE_DEMO_KEEP:-}" ]; then
    echo "run: files kept in $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Nothing from the caller's environment may steer the demo's processes elsewhere.
unset LD_PRELOAD NVSHARE_SOCKET NVSHARE_CONTROL_SOCKET NVSHARE_MEMORY_LIMIT NVSHARE_CORE_LIMIT \
  NVSHARE_POD_UID NVSHARE_ENABLE

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0)
  free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 | tr -d ' ')
  where="the real GPU 0 ($gpu_name, ${free_mib} MiB free), emulating a 4Gi GPU with the scheduler's virtual capacity"
  # A, B, C ask for 768Mi + 768Mi + 2.5Gi = 4Gi of managed memory plus three contexts; demand 10Gi free.
  if [ "$free_mib" -lt 10240 ]; then
    echo "run: GPU 0 has only ${free_mib} MiB free; the demo needs 10240 MiB free (4Gi of jobs and their contexts, with margin)" >&2
    exit 1
  fi
  unset LD_LIBRARY_PATH  # the trainer must find the real libcuda.so.1
  # With contexts of about 0.5Gi: A + B = 2.6Gi fit in 3.6Gi usable; C (3Gi) beside either (4.3Gi) does not.
  capacity=4Gi
  mem_a=768Mi mem_b=768Mi mem_c=2560Mi
else
  # The simulated GPU's memory is this machine's: device memory in shared memory, and the host
  # copies of the jobs swapped out beside it (about 1.5 x the capacity at the peak, measured:
  # 23.6 GiB for 16Gi). Sized so that the peak stays within 60% of what is available now, at most
  # 16Gi and at least 2Gi (NVSHARE_DEMO_CAPACITY_GIB chooses it).
  avail_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null || echo 0)
  avail_gib=$((avail_kib / 1048576))
  sim_gib=${NVSHARE_DEMO_CAPACITY_GIB:-$((avail_kib * 6 / 10 * 2 / 3 / 1048576))}
  [ "$sim_gib" -gt 16 ] && sim_gib=16
  if [ "$sim_gib" -lt 2 ]; then
    echo "run: the simulated demo needs about 3 GiB of free memory (a 2Gi simulated GPU and the host" \
      "copies of its jobs); this machine has ${avail_gib} GiB available" >&2
    exit 1
  fi
  sized="sized for this machine: ${avail_gib} GiB of memory available, so a ${sim_gib}Gi simulated GPU"
  sized="$sized (its memory and the swapped jobs' host copies peak at about $((sim_gib * 3 / 2)) GiB)"
  where="the simulated GPU (tests/fakecuda: one ${sim_gib}Gi device, kernels take simulated time, swaps at 16Gi/s)"
  export LD_LIBRARY_PATH="$build/tests/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export NVSHARE_FAKECUDA_DEVICES=1 NVSHARE_FAKECUDA_MEMORY=${sim_gib}Gi
  export NVSHARE_FAKECUDA_STATE="$work/fakecuda.state"
  # The default 8Gi/s would make each 12Gi hand-off 1.5 s; 16Gi/s is closer to what prefetches reach on a
  # recent GPU (measured on an H200: 12.7 GB/s to the host, 49 GB/s back).
  export NVSHARE_FAKECUDA_SWAP_BW=16Gi
  # A, B and C take 3/8, 3/8 and 3/4 of the GPU: A + B (3/4) fit in the 90% usable; C beside either
  # (9/8) does not (still true with 512Mi contexts from 8Gi up; below, the simulated GPU has none).
  capacity=${sim_gib}Gi
  mem_a=$((sim_gib * 384))Mi mem_b=$((sim_gib * 384))Mi mem_c=$((sim_gib * 768))Mi
fi
quantum=4

echo "nvshare demo: running on $where"
[ -n "${sized:-}" ] && echo "  $sized"
echo "  scheduler: private (sockets in $work), mode auto, capacity $capacity (90% usable: 10% reserve)," \
  "turns of ${quantum} s"
printf '  %-2s %-7s %-14s %s\n' \
  A "$mem_a" uncapped "fits beside B" \
  B "$mem_b" uncapped "fits beside A" \
  C "$mem_c" "capped at 30%" "fits beside neither: takes turns with A and B, swapping at each hand-off;" \
  "" "" "" "may use at most 30% of the GPU's time"
echo

# --mode auto (the default, named because the demo depends on it): A and B co-run.
# --trust-client-limits: this is a single host, so the scheduler honours the cap C declares for itself
# (NVSHARE_CORE_LIMIT), as nvshare-run does.
"$scheduler" --socket "$work/scheduler.sock" --control-socket "$work/control.sock" \
  --state-file "$work/state.json" --mode auto --capacity "$capacity" --quantum "$quantum" --trust-client-limits \
  >"$work/scheduler.log" 2>&1 &
scheduler_pid=$!
for _ in $(seq 100); do
  [ -S "$work/scheduler.sock" ] && [ -S "$work/control.sock" ] && break
  kill -0 "$scheduler_pid" 2>/dev/null || break
  sleep 0.05
done
if ! "$ctl" --control-socket "$work/control.sock" version >/dev/null 2>&1; then
  echo "run: nvshare-scheduler did not start:" >&2
  tail -n 20 "$work/scheduler.log" >&2
  exit 1
fi

export NVSHARE_SOCKET="$work/scheduler.sock"
export DEMO_WORK="$work" DEMO_TRAINER="$trainer" DEMO_CTL="$ctl" DEMO_LIBRARY="$library"
export DEMO_MEM_A="$mem_a" DEMO_MEM_B="$mem_b" DEMO_MEM_C="$mem_c"

# The monitor starts the jobs, shows the live line and prints the table; its exit status is the
# demo's (non-zero when a job did not finish with result "ok").
status=0
python3 - <<'PYTHON' || status=$?
import json, os, signal, subprocess, sys, time

work = os.environ["DEMO_WORK"]
ctl = [os.environ["DEMO_CTL"], "--control-socket", os.path.join(work, "control.sock")]
tty = sys.stdout.isatty()

# name, memory, extra environment, kernels, kernel_us, start delay (s)
JOBS = [
    # Staggered starts: the library measures a context's footprint as the GPU's used memory before and
    # after creating it, which another process creating its context at the same instant would inflate.
    ("A", os.environ["DEMO_MEM_A"], {}, 300, 20000, 0.0),
    ("B", os.environ["DEMO_MEM_B"], {}, 200, 20000, 0.5),
    # C arrives when A and B already share the GPU.
    ("C", os.environ["DEMO_MEM_C"], {"NVSHARE_CORE_LIMIT": "30"}, 150, 20000, 1.5),
]


class Job:
    def __init__(self, name, memory, env, kernels, kernel_us, delay):
        self.name, self.memory, self.env = name, memory, env
        self.kernels, self.kernel_us, self.delay = kernels, kernel_us, delay
        self.proc = None
        self.started = self.ended = None
        self.report = None
        self.last = None  # the scheduler's last view of this client
        self.by_state = {}  # seconds seen per state ("waiting:memory", "running", ...)
        self.err_path = os.path.join(work, f"job-{name}.stderr")

    def start(self):
        env = dict(os.environ)
        env.update(self.env)
        env["LD_PRELOAD"] = os.environ["DEMO_LIBRARY"]
        args = [os.environ["DEMO_TRAINER"], "--bytes", self.memory, "--kernels", str(self.kernels),
                "--kernel-us", str(self.kernel_us), "--progress"]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                     stderr=open(self.err_path, "w"), text=True)

    def progress(self):
        try:
            with open(self.err_path) as f:
                done = sum(1 for line in f if line.startswith('{"progress":'))
        except OSError:
            done = 0
        return done / self.kernels

    def poll(self):
        if self.proc and self.ended is None and self.proc.poll() is not None:
            self.ended = time.monotonic()
            out = self.proc.stdout.read()
            try:
                self.report = json.loads(out.strip().splitlines()[0])
            except (ValueError, IndexError):
                self.report = {"result": ended_how(self.proc.returncode), "raw": out}


def ended_how(code):
    """What a job that printed no report ended by: its signal (SIGKILL most often the kernel's
    out-of-memory killer) or its exit status."""
    if code < 0:
        name = signal.Signals(-code).name
        hint = ": out of memory? (dmesg names the OOM killer's victims)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with status {code} without a report"


def status():
    try:
        out = subprocess.run(ctl + ["status", "--json"], capture_output=True, text=True, timeout=5)
        return json.loads(out.stdout) if out.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        return None


def clients_by_pid(st):
    out = {}
    for gpu in (st or {}).get("gpus", []):
        for c in gpu.get("clients", []):
            out[c.get("pid")] = c
    return out


def state_key(c):
    s = c.get("state", "?")
    return f"waiting:{c.get('waiting_for')}" if s == "waiting" else s


def describe(job):
    if job.proc is None:
        return f"{job.name} not started"
    if job.ended is not None:
        return f"{job.name} done ({(job.report or {}).get('result')})"
    c = job.last
    pct = f"{100 * job.progress():3.0f}%"
    if c is None:
        return f"{job.name} {pct} starting"
    s = c["state"] + (f"({c['waiting_for']})" if c["state"] == "waiting" else "")
    if c.get("swapping_out"):
        # A revoked holder copying its memory to the host; past its grace it is late, not hung.
        s = {"revoking": "swapping-out", "unresponsive": "late-swap-out"}.get(c["state"], s)
    extra = ""
    if c.get("core_limit_percent", 100) < 100:
        extra = f" cap {c['core_limit_percent']}% share {c.get('share_percent', 0):.0f}%"
    return f"{job.name} {pct} {s}{extra}"


jobs = [Job(*j) for j in JOBS]
t0 = time.monotonic()
last_print = -1.0
last_sample = None
gpu_view = {}
try:
    while True:
        now = time.monotonic()
        for j in jobs:
            if j.proc is None and now - t0 >= j.delay:
                j.start()
            j.poll()
        st = status()
        now = time.monotonic()
        by_pid = clients_by_pid(st)
        for j in jobs:
            if j.proc is None or j.ended is not None:
                continue
            c = by_pid.get(j.proc.pid)
            # Time between two samples is charged to the state seen at the first of them.
            if last_sample is not None and j.last is not None:
                k = state_key(j.last)
                j.by_state[k] = j.by_state.get(k, 0) + (now - last_sample)
            if c is not None:
                j.last = c
        if st and st.get("gpus"):
            gpu_view = st["gpus"][0]
        last_sample = now
        if all(j.ended is not None for j in jobs):
            break
        if now - last_print >= (0.5 if tty else 3.0):
            last_print = now
            line = f"[{now - t0:5.1f}s] " + " | ".join(describe(j) for j in jobs)
            if gpu_view:
                line += f" | on GPU {gpu_view.get('running_bytes', 0) / 2**30:.1f}Gi"
            if tty:
                print("\r\033[K" + line, end="", flush=True)
            else:
                print(line, flush=True)
        time.sleep(0.1)
finally:
    for j in jobs:
        if j.proc and j.proc.poll() is None:
            j.proc.kill()
if tty:
    print()

total = time.monotonic() - t0
print(f"\nall jobs done in {total:.1f} s\n")
hdr = ("job", "memory", "cap", "wall s", "GPU work s", "GPU time s", "of wall", "waited s",
       "waited by reason", "result")
rows = []
for j in jobs:
    r = j.report or {}
    c = j.last or {}
    work_s = j.kernels * j.kernel_us / 1e6
    reasons = {k.split(":", 1)[1]: v for k, v in j.by_state.items() if k.startswith("waiting:")}
    swap = j.by_state.get("revoking", 0)
    why = ", ".join(f"{k} {v:.1f}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]) if v >= 0.05)
    if swap >= 0.05:
        why += (", " if why else "") + f"draining/swapping out {swap:.1f}"
    wall = (j.ended or 0) - (j.started or 0)
    held = c.get("held_ms", 0) / 1000
    rows.append((j.name, j.memory, f"{j.env['NVSHARE_CORE_LIMIT']}%" if "NVSHARE_CORE_LIMIT" in j.env else "-",
                 f"{wall:.1f}", f"{work_s:.1f}", f"{held:.1f}", f"{100 * held / wall:.0f}%" if wall > 0 else "-",
                 f"{c.get('waited_ms', 0) / 1000:.1f}", why or "-", r.get("result", "?")))
widths = [max(len(str(x[i])) for x in rows + [hdr]) for i in range(len(hdr))]
for row in [hdr] + rows:
    print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
print("""
  wall s      from start to exit of the process
  GPU work s  the job's kernels (K x D): the GPU time it needs when alone
  GPU time s  the scheduler's billed hold time (shared time counts 1/n while n jobs run together),
              from its last status before the job exited; it includes swapping in after a grant
  of wall     GPU time / wall time (C's cap keeps it at or under 30%)
  waited s    the scheduler's waited_ms; by reason: sampled from nvsharectl status every 0.1 s
              (memory: did not fit beside the running jobs; turn: queued behind another job;
              quota: its compute cap's budget was spent, or, uncapped, its part of what
              a capped job leaves while that job wants the GPU)""")
if gpu_view:
    print(f"\nGPU {gpu_view.get('uuid')}: {gpu_view.get('last_epoch')} grants, swap bandwidth "
          f"{gpu_view.get('swap_bytes_per_s', 0) / 2**30:.1f} GiB/s "
          f"({'measured by the clients' if gpu_view.get('swap_measured') else 'assumed'})")
failed = [j.name for j in jobs if (j.report or {}).get("result") != "ok"]
if failed:
    for j in jobs:
        if j.name in failed:
            print(f"\njob {j.name} failed: {json.dumps(j.report)}", file=sys.stderr)
            with open(j.err_path) as f:
                lines = [l for l in f if not l.startswith('{"progress":')]
            sys.stderr.write("".join(lines[-20:]))
    sys.exit(1)
PYTHON

if [ -n "${NVSHARE_FAKECUDA_STATE:-}" ] && [ -x "$build/tests/fakecuda/nvshare-fakecuda-stat" ]; then
  "$build/tests/fakecuda/nvshare-fakecuda-stat" --state "$NVSHARE_FAKECUDA_STATE" >"$work/stat.json"
  python3 - "$work/stat.json" <<'PYTHON'
import json, sys
d = json.load(open(sys.argv[1]))["devices"][0]
g = 2 ** 30
print(f"simulated GPU: {d['migrated_to_host'] / g:.1f} GiB swapped out to the host and "
      f"{d['migrated_to_device'] / g:.1f} GiB moved to the device by bulk prefetches, "
      f"{d['faulted_in'] / g:.1f} GiB demand-faulted, {d['kernels']} kernels")
PYTHON
fi
if [ "$status" -ne 0 ]; then
  echo "run: the demo failed; the scheduler's log ends with:" >&2
  tail -n 30 "$work/scheduler.log" >&2
fi
exit "$status"
