"""The real-GPU benchmark suite: every scenario with and without nvshare, in one call.

    python3 bench/gpu/bench.py --build BUILD --out DIR [--phase overhead|together|turns|multi|all] [--repeats N]

Writes DIR/results.json (machine, every run's raw JSON, every metric) and DIR/raw/<scenario>/ (each
job's stdout/stderr, the scheduler's log and status, the library's grant trace). bench/gpu/report.py
turns one or more results.json into the markdown table, docs/benchmarks.json and the plots.

Rules kept on a shared GPU machine: the managed memory asked for stays far below what the GPU has
free (a small GPU is emulated with the scheduler's --capacity), and clocks, power, MIG and compute
mode are never touched.

Each metric is a dict: name, value, goal (text), met (bool or None), unit, native (the same figure
without nvshare where one exists), detail (the runs it came from).
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "workload.py"
DDP = HERE / "ddp.py"
COPYBW = HERE / "copybw.py"
ALLOCBENCH = HERE / "allocbench.py"
GIB = 1 << 30


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, file=sys.stderr, flush=True)


def read_trace(path):
    """The library's grant trace (NVSHARE_TRACE_FILE) as events sorted by time; [] when absent."""
    events = []
    if os.path.exists(path):
        for line in open(path):
            try:
                events.append(json.loads(line))
            except ValueError:
                pass  # a line cut short by a killed process
    events.sort(key=lambda e: e["t"])
    return events


def median(values):
    return statistics.median(values) if values else None


def worst_error(rows, expected=None):
    """The largest |error| of `rows` (points), or None unless all `expected` rows (default: every
    row) have one."""
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    want = len(rows) if expected is None else expected
    return max(errors) if errors and len(errors) == want else None


def percentile(values, p):
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Scheduler:
    """A private nvshare-scheduler for one scenario (its own sockets and log)."""

    def __init__(self, bench, workdir, flags):
        self.bench, self.dir, self.flags = bench, workdir, flags
        self.socket = str(workdir / "s.sock")
        self.control = str(workdir / "c.sock")
        self.trace = str(workdir / "trace.jsonl")

    def __enter__(self):
        self.log = open(self.dir / "scheduler.log", "w")
        self.proc = subprocess.Popen(
            [self.bench.sched, "--socket", self.socket, "--control-socket", self.control,
             "--state-file", str(self.dir / "state.json"),
             "--trust-client-limits", "--log-level", "info", *self.flags],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not os.path.exists(self.socket):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"scheduler did not start: {(self.dir / 'scheduler.log').read_text()}")
            time.sleep(0.02)
        self.paces, self.sampling = {}, True
        self.sampler = threading.Thread(target=self.sample_paces, daemon=True)
        self.sampler.start()
        return self

    def sample_paces(self):
        """Twice a second: each client's reported pace and whether the scheduler counts it as
        saturating (logged when the scheduler stops)."""
        while self.sampling:
            try:
                status = json.loads(self.status())
                for gpu in status.get("gpus", []):
                    for c in gpu.get("clients", []):
                        seen = self.paces.setdefault(c.get("pid"), [])
                        seen.append((c.get("deep_queue_percent"), c.get("saturating"),
                                     c.get("state")))
            except Exception:
                pass
            time.sleep(0.5)

    def env(self, extra=None):
        env = {"LD_PRELOAD": self.bench.lib, "NVSHARE_SOCKET": self.socket,
               "NVSHARE_TRACE_FILE": self.trace,
               "NVSHARE_LOG_LEVEL": self.bench.library_log_level}
        env.update(extra or {})
        return env

    def status(self):
        r = subprocess.run([self.bench.ctl, "--control-socket", self.control, "status", "--json"],
                           capture_output=True, text=True, timeout=10)
        return r.stdout

    def ctl(self, args):
        r = subprocess.run([self.bench.ctl, "--control-socket", self.control, *args],
                           capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            raise RuntimeError(f"nvsharectl {' '.join(args)}: {r.stdout} {r.stderr}")
        return r.stdout

    def __exit__(self, *exc):
        self.sampling = False
        for pid, seen in self.paces.items():
            known = [p for p, _, _ in seen if p is not None]
            sat = sum(1 for _, x, _ in seen if x)
            log(f"pace pid {pid}: {len(seen)} samples, deep queue median "
                f"{median(known) if known else None}%, saturating in {sat}, states "
                f"{''.join((st or '?')[0] for _, _, st in seen)}")
        try:
            (self.dir / "status.json").write_text(self.status())
        except Exception as e:  # the status is for reading afterwards; a failure is not the run's
            (self.dir / "status.json").write_text(str(e))
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def trace_events(self):
        return read_trace(self.trace)


class Bench:
    def __init__(self, args):
        b = Path(args.build).resolve()
        self.lib = str(b / "src/client/libnvshare.so")
        self.sched = str(b / "src/scheduler/nvshare-scheduler")
        self.ctl = str(b / "src/tools/nvsharectl")
        self.launch_bin = str(b / "bench/gpu/nvshare-launch-bench")
        self.copystall_bin = str(b / "bench/gpu/nvshare-host-copy-stall")
        self.out = Path(args.out).resolve()
        self.swap_variants = args.swap_variants.split(",")
        self.library_log_level = args.library_log_level
        self.priority_shapes = args.priority_shapes.split(",")
        self.raw = self.out / "raw"
        self.raw.mkdir(parents=True, exist_ok=True)
        self.repeats = args.repeats
        self.job_seconds = args.job_seconds
        self.runs = {}      # scenario -> list of run records
        self.metrics = []
        self.traces = {}    # scenario -> trace events
        self.calibration = {}

    # ---- running jobs -------------------------------------------------------------------------

    def scenario_dir(self, name):
        d = self.raw / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    def run_jobs(self, name, jobs, env=None, barrier=True, timeout=300):
        """Starts every job at once; with a barrier their loops begin together. Returns each job's
        JSON (with "exit" and "job" added). `jobs`: list of (argv-list, extra-env)."""
        d = self.raw / name
        d.mkdir(parents=True, exist_ok=True)
        n = len(list(d.glob("job*.out")))
        go = d / f"go{n}"
        procs = []
        for i, (argv, extra) in enumerate(jobs):
            e = dict(os.environ)
            for k in list(e):
                if k.startswith("NVSHARE_") or k == "LD_PRELOAD":
                    del e[k]
            e.update(env or {})
            e.update(extra or {})
            e["PYTHONUNBUFFERED"] = "1"
            cmd = list(argv)
            if barrier and cmd[0] == sys.executable:
                cmd += ["--ready", str(d / f"ready{n}_{i}"), "--go", str(go)]
            tag = f"job{n + i}"
            procs.append((subprocess.Popen(cmd, env=e, stdout=open(d / f"{tag}.out", "w"),
                                           stderr=open(d / f"{tag}.err", "w")), tag))
        if barrier:
            deadline = time.monotonic() + timeout
            while not all((d / f"ready{n}_{i}").exists() for i in range(len(jobs))):
                if any(p.poll() is not None for p, _ in procs) or time.monotonic() > deadline:
                    break
                time.sleep(0.005)
            go.write_text("go")
        results = []
        for p, tag in procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            text = (d / f"{tag}.out").read_text().strip().splitlines()
            try:
                r = json.loads(text[-1])
            except (ValueError, IndexError):
                r = {"result": "no-output", "stderr": (d / f"{tag}.err").read_text()[-2000:]}
            r["exit"] = p.returncode
            r["job"] = tag
            results.append(r)
        self.runs.setdefault(name, []).extend(results)
        bad = [r for r in results if r.get("result") != "ok"]
        if bad:
            log(f"{name}: job failed: {json.dumps(bad[0])[:600]}")
        return results

    def torch_job(self, kind, iters=0, seconds=0.0, devices="0", skip_s=0.0, tag=""):
        argv = [sys.executable, str(WORKLOAD), "--kind", kind, "--devices", devices, "--tag", tag]
        argv += ["--iters", str(iters)] if iters else ["--seconds", str(seconds)]
        if skip_s:
            argv += ["--skip-s", str(skip_s)]
        return argv

    def sized(self, kind, devices="0"):
        """A job of `kind` sized to run about job_seconds alone (from the calibration run)."""
        rate = self.calibration[kind]
        return self.torch_job(kind, iters=max(10, round(rate * self.job_seconds)), devices=devices)

    def calibrate(self, kinds):
        self.scenario_dir("calibration")
        for kind in kinds:
            r = self.run_jobs("calibration", [(self.torch_job(kind, seconds=3.0), None)])[0]
            self.calibration[kind] = r.get("rate") or 1.0
            log(f"calibration {kind}: {self.calibration[kind]:.1f} iterations/s")

    def metric(self, name, value, goal, met, unit="", native=None, **detail):
        m = {"name": name, "value": value, "goal": goal, "met": met, "unit": unit,
             "native": native, "detail": detail}
        self.metrics.append(m)
        log(f"METRIC {name} = {value if value is None else round(value, 4)} "
            f"(native {native}) goal {goal} met {met}")
        return m

    @staticmethod
    def makespan(results):
        ok = [r for r in results if r.get("result") == "ok"]
        if len(ok) != len(results):
            return None
        return max(r["loop_end"] for r in ok) - min(r["loop_start"] for r in ok)

    @staticmethod
    def ok(results):
        return all(r.get("result") == "ok" for r in results)

    # ---- scenarios ----------------------------------------------------------------------------

    def single(self):
        """One job alone: memory-bound (the goal's row) and compute-bound, native vs nvshare,
        interleaved so drift hits both alike."""
        for kind in ("membound", "matmul"):
            name = f"single_{kind}"
            d = self.scenario_dir(name)
            native, shared = [], []
            for _ in range(self.repeats):
                native += self.run_jobs(name, [(self.sized(kind), None)])
                with Scheduler(self, d, []) as s:
                    shared += self.run_jobs(name, [(self.sized(kind), None)], env=s.env())
            n = median([r["loop_s"] for r in native if r.get("result") == "ok"])
            v = median([r["loop_s"] for r in shared if r.get("result") == "ok"])
            ratio = v / n if n and v else None
            self.native_single = getattr(self, "native_single", {})
            self.native_single[kind] = n
            goal = "<= 1.01" if kind == "membound" else "(no goal; reported)"
            self.metric(f"single_{kind}_time_ratio", ratio, goal,
                        (ratio is not None and ratio <= 1.01) if kind == "membound" else None,
                        "x native", native=1.0,
                        native_loop_s=[r.get("loop_s") for r in native],
                        nvshare_loop_s=[r.get("loop_s") for r in shared])

    def launch(self):
        """Time per launch of an empty kernel, native and under nvshare with the gate active (the
        process holds the grant). Launch timings on these hosts move by several percent from one
        process to the next (the CPU the process lands on, the host's other work), far more than
        the library's cost, so native and nvshare processes alternate in rounds (at least 8), each
        repeats its loops 5 times, and each round compares the best repetition of its two
        processes: the figure is the median of the rounds' ratios. The ratio of the best
        repetitions over all rounds and the medians are kept beside it.
        Two measures: `async`, launches back to back then one synchronize (what a launch-bound
        program pays), and `call`, the CPU time of the launch calls alone, in bursts the GPU keeps
        up with."""
        name = "launch"
        d = self.scenario_dir(name)
        rounds = []
        argv = [self.launch_bin, "--launches", "100000", "--repeats", "5"]
        for _ in range(max(8, 2 * self.repeats)):
            native = self.run_jobs(name, [(argv, None)], barrier=False)
            with Scheduler(self, d, []) as s:
                shared = self.run_jobs(name, [(argv, None)], env=s.env(), barrier=False)
            if all(r.get("result") == "ok" for r in native + shared):
                rounds.append((native[0], shared[0]))
        # The gate was active: every nvshare run was granted the GPU by the scheduler.
        granted = {e["pid"] for e in Scheduler(self, d, []).trace_events() if e["event"] == "grant"}
        gated = len(granted) >= len(rounds)
        for key, goal in (("async_ns_all", "(no goal; reported: paired processes differ by 5-10% "
                                           "on these hosts, the goal is judged interleaved)"),
                          ("call_ns_all", "(no goal; reported)"),
                          ("sync_ns_all", "(no goal; reported)")):
            paired = [min(v[key]) / min(n[key]) for n, v in rounds]
            n = [x for r, _ in rounds for x in r[key]]
            v = [x for _, r in rounds for x in r[key]]
            ratio = median(paired) if paired else None
            kind = key.split("_")[0]
            self.metric(f"launch_{kind}_time_per_launch_ratio", ratio, goal,
                        None,
                        "x native", native=1.0, rounds=len(rounds),
                        round_ratios=[round(x, 4) for x in paired],
                        best_ratio=min(v) / min(n) if n and v else None,
                        native_best_ns=min(n) if n else None,
                        nvshare_best_ns=min(v) if v else None,
                        median_ratio=median(v) / median(n) if n and v else None,
                        native_ns=n, nvshare_ns=v, gate_active=gated,
                        ctx_get_current_ns=[r.get("ctx_get_current_ns") for r, _ in rounds])

        # In-process pairs (see launch_bench.cc): the linked launch against the driver's own in
        # the same process; in nvshare processes that is the library's whole launch path, in native
        # ones the same function twice (the method's own noise).
        def in_process(key):
            """The nvshare processes' ratios under `key`, and the native ones'."""
            return ([x for _, r in rounds if r.get("inproc_interposed") for x in r.get(key, [])],
                    [x for r, _ in rounds for x in r.get(key, [])])

        shared_pairs, native_pairs = in_process("inproc_ratios")
        ratio = median(shared_pairs) if shared_pairs else None
        self.metric("launch_inproc_time_per_launch_ratio", ratio,
                    "(no goal; reported: the library's launch path against the driver's, "
                    "same process)", None, "x driver", native=median(native_pairs)
                    if native_pairs else None, pairs=len(shared_pairs),
                    nvshare_ratios=shared_pairs, native_ratios=native_pairs)
        # Interleaved (launch_bench.cc): the same two functions alternating in blocks of 1,000
        # launches within one loop, so that what drifts between loops and processes weighs on both;
        # natively the figure is the method's own error. The goal applies to this figure: the
        # library's launch path against the driver's, gate active.
        shared_blocks, native_blocks = in_process("interleaved_ratios")
        ratio = median(shared_blocks) if shared_blocks else None
        self.metric("launch_interleaved_time_per_launch_ratio", ratio,
                    "<= 1.02, gate active (the library's launch path against the driver's, "
                    "interleaved in one process)", ratio is not None and ratio <= 1.02 and gated,
                    "x driver", native=median(native_blocks) if native_blocks else None,
                    repetitions=len(shared_blocks), nvshare_ratios=shared_blocks,
                    native_ratios=native_blocks, gate_active=gated)

    MODES = ("auto", "exclusive")

    def makespan_per_mode(self, name, jobs):
        """Runs `jobs` together under a scheduler in each mode; returns {mode: makespan or None}.
        Each mode's grant trace goes to trace-<mode>.jsonl in the scenario's directory."""
        d = self.raw / name
        out = {}
        for mode in self.MODES:
            extra = {"NVSHARE_TRACE_FILE": str(d / f"trace-{mode}.jsonl")}
            with Scheduler(self, d, ["--mode", mode]) as s:
                out[mode] = self.makespan(
                    self.run_jobs(name, [(argv, extra) for argv, _ in jobs], env=s.env()))
        return out

    def pair_fit(self):
        """Two compute-bound jobs that fit together, started together: sum of native single
        times / makespan. Native (time-sliced by the driver), nvshare auto (co-run) and nvshare
        exclusive (turns without swap)."""
        name = "pair_fit"
        self.scenario_dir(name)
        single = self.native_single["matmul"]
        jobs = [(self.sized("matmul"), None)] * 2
        eff = {"native": [], **{m: [] for m in self.MODES}}
        for _ in range(self.repeats):
            spans = {"native": self.makespan(self.run_jobs(name, jobs)),
                     **self.makespan_per_mode(name, jobs)}
            for key, span in spans.items():
                if span:
                    eff[key].append(2 * single / span)
        best = max(self.MODES, key=lambda m: median(eff[m]) or 0)
        for mode in self.MODES:
            v = median(eff[mode])
            self.metric(f"pair_fit_efficiency_{mode}", v, ">= 0.99", v is not None and v >= 0.99,
                        "", native=median(eff["native"]), runs=eff, best_mode=best)

    def idle3(self):
        """Three idle-ish jobs (short kernel, 20 ms host work per iteration): makespan / one
        alone."""
        name = "idle3"
        self.scenario_dir(name)
        alone = []
        for _ in range(self.repeats):
            r = self.run_jobs(name, [(self.sized("idle"), None)])
            if self.ok(r):
                alone.append(r[0]["loop_s"])
        a = median(alone)
        jobs = [(self.sized("idle"), None)] * 3
        ratios = {"native": [], **{m: [] for m in self.MODES}}
        for _ in range(self.repeats):
            spans = {"native": self.makespan(self.run_jobs(name, jobs)),
                     **self.makespan_per_mode(name, jobs)}
            for key, span in spans.items():
                if span:
                    ratios[key].append(span / a)
        for mode in self.MODES:
            v = median(ratios[mode])
            self.metric(f"idle3_makespan_ratio_{mode}", v, "<= 1.05", v is not None and v <= 1.05,
                        "x one alone", native=median(ratios["native"]), runs=ratios,
                        alone_s=alone)

    def notfit(self):
        """Two memory-bound jobs (about 9.4 GB each) under a 16Gi virtual capacity: they cannot
        run together, so they take turns with swap. Makespan / sum of native single times."""
        name = "notfit"
        d = self.scenario_dir(name)
        single = self.native_single["membound"]
        ratios, swaps = [], []
        for i in range(max(2, self.repeats - 1)):
            trace = str(d / f"trace{i}.jsonl")
            with Scheduler(self, d, ["--capacity", "16Gi"]) as s:
                r = self.run_jobs(name, [(self.sized("membound"), {"NVSHARE_TRACE_FILE": trace})] * 2, env=s.env())
            if self.makespan(r):
                ratios.append(self.makespan(r) / (2 * single))
            events = read_trace(trace)
            swaps.append({"revokes": sum(e["event"] == "revoke" for e in events),
                          "swap_in_ms": [e.get("ms") for e in events if e["event"] == "grant" and e.get("ms") is not None]})
        v = median(ratios)
        self.metric("notfit_makespan_over_serial", v, "<= 1.05", v is not None and v <= 1.05,
                    "x serial", native=None, runs=ratios, swaps=swaps,
                    note="natively the pair does not fit: it thrashes or fails")

    def swap(self):
        """Swap bandwidth of each memory mode beside native pinned copies. Per mode, two membound
        jobs (about 9.4 GB each, twice the usual length, so that each swaps more than once) under a
        16Gi virtual capacity take turns with swap; every release
        and grant the library traced with a swap gives its bytes and time. Native: copybw.py, the
        same bytes between device tensors and pinned host tensors. Also the makespan over the serial
        sum and the hand-off time (release to the next grant, swap-in included); and the device mode
        once more with turns of up to 30 s (--quantum-max 30), for what longer turns save."""
        name = "swap"
        d = self.scenario_dir(name)
        native = self.run_jobs(name, [([sys.executable, str(COPYBW), "--gib", "8.8"], None)],
                               barrier=False)[0]
        single = 2 * self.native_single["membound"]
        long_job = self.torch_job("membound", iters=2 * max(10, round(self.calibration["membound"] * self.job_seconds)))
        # The third variant trades turn latency for fewer hand-offs: turns up to 30 s.
        variants = (("device", "device", []), ("unified", "unified", []),
                    ("device", "device_quantum_max_30", ["--quantum-max", "30"]))
        for mode, label, flags in variants:
            if label not in self.swap_variants:
                continue
            outs, ins, ratios, releases, gaps, first_out = [], [], [], [], [], []
            overlapped_ins = []  # swap-ins into room, while the other job's swap-out runs
            room_bytes, grant_in_bytes = 0, 0  # swapped in ahead of the grant (room) / at it
            for i in range(2):
                trace = str(d / f"trace-{label}-{i}.jsonl")
                with Scheduler(self, d, ["--capacity", "16Gi", *flags]) as s:
                    r = self.run_jobs(name, [(long_job,
                                              {"NVSHARE_TRACE_FILE": trace,
                                               "NVSHARE_MEMORY_MODE": mode})] * 2, env=s.env())
                if self.makespan(r):
                    ratios.append(self.makespan(r) / (2 * single))
                events = read_trace(trace)
                seen_out = set()
                for e in events:
                    if e.get("swap_bytes", 0) <= 0 or e.get("swap_ms", 0) <= 0:
                        continue
                    gbps = e["swap_bytes"] / (e["swap_ms"] / 1e3) / 1e9
                    if e["event"] in ("release", "evicted"):
                        # A revoke's swap-out, or an eviction's (the holder released at a pause
                        # and the waiting job needs its memory).
                        (outs if e["pid"] in seen_out else first_out).append(gbps)
                        seen_out.add(e["pid"])
                    elif e["event"] == "grant":
                        ins.append(gbps)  # after the other's swap-out: one direction alone
                        grant_in_bytes += e["swap_bytes"]
                    elif e["event"] == "room":
                        # A swap-in into room (protocol version 12): both directions at once.
                        overlapped_ins.append(gbps)
                        room_bytes += e["swap_bytes"]
                drains, waits = handoff_latencies(events)
                releases += drains  # revoke -> release: drain and swap-out
                gaps += waits       # release -> the other's grant: its swap-in included
            for way, rates, key in (("out", outs, "d2h"), ("in", ins, "h2d")):
                if label != mode:
                    break  # the same mode again: its bandwidths are the first run's
                v, ref = median(rates), native.get(f"{key}_gbps_median")
                ratio = v / ref if v and ref else None
                goal = ">= 0.8 x native pinned copies" if mode == "device" else "reported"
                self.metric(f"swap_{way}_gbps_{mode}", v, goal,
                            (ratio is not None and ratio >= 0.8) if mode == "device" else v is not None,
                            "GB/s", native=ref, over_native=ratio, runs=rates,
                            first_swap_out=first_out if way == "out" else None)
            if label == mode and overlapped_ins:
                v, ref = median(overlapped_ins), native.get("duplex_each_way_gbps_median")
                ratio = v / ref if v and ref else None
                self.metric(f"swap_in_overlapped_gbps_{mode}", v,
                            ">= 0.8 x native copies both ways at once",
                            ratio is not None and ratio >= 0.8, "GB/s", native=ref,
                            over_native=ratio, runs=overlapped_ins)
            v = median(ratios)
            goal = "<= 1.02" if label == "device" else "reported"
            self.metric(f"swap_notfit_makespan_over_serial_{label}", v, goal,
                        v is not None and (v <= 1.02 if label == "device" else True), "x serial",
                        runs=ratios, handoffs=len(releases),
                        revoke_to_release_ms_p50=percentile(releases, 50),
                        release_to_grant_ms_p50=percentile(gaps, 50),
                        release_to_grant_ms_p99=percentile(gaps, 99),
                        swapped_in_ahead_gb=room_bytes / 1e9,
                        swapped_in_at_grants_gb=grant_in_bytes / 1e9)
        self.metric("native_pin_s_8_8gib", native.get("pin_s"), "reported", True, "s")
        # What an overlapped hand-off can reach: each direction's bandwidth while the other runs.
        self.metric("native_duplex_gbps_each_way", native.get("duplex_each_way_gbps_median"),
                    "reported", True, "GB/s", d2h_alone=native.get("d2h_gbps_median"),
                    h2d_alone=native.get("h2d_gbps_median"))

    def copystall(self):
        """How making a host copy stalls the process's own submissions (host_copy_stall.cc: the
        driver alone, 3 GiB per phase, two rounds). Per way of registering: the longest batch of
        about 2 ms of memsets that overlapped it, and how many ran (the thread's progress)."""
        name = "copystall"
        d = self.scenario_dir(name)
        out = d / "phases.jsonl"
        with open(out, "w") as f:
            rc = subprocess.run([self.copystall_bin, "3"], stdout=f, stderr=subprocess.STDOUT,
                                timeout=120).returncode
        phases = {}
        for line in out.read_text().splitlines():
            try:
                p = json.loads(line)
            except ValueError:
                continue
            phases.setdefault(p["phase"], []).append(p)
        if rc != 0 or not phases:
            log(f"copystall failed (exit {rc})")
            return
        labels = {"register whole": "whole", "register in 64 MiB chunks": "chunks",
                  "register in 64 MiB chunks, 2000 us apart": "chunks_paced"}
        for phase, key in labels.items():
            runs = phases.get(phase, [])
            self.metric(f"copystall_longest_batch_ms_{key}",
                        max((r["longest_batch_ms"] for r in runs), default=None), "reported",
                        bool(runs), "ms", native=None, runs=runs,
                        unhindered=phases.get("nothing"))

    def alloc(self):
        """What an allocation and its free cost in each memory mode beside native (allocbench.py:
        cuMemAlloc + cuMemFree pairs of 4 KiB to 1 GiB, no scheduler: the library runs fail-open),
        interleaved, three rounds; the median per size."""
        name = "alloc"
        self.scenario_dir(name)
        env_of = {"native": None}
        for mode in ("device", "unified", "plain"):
            env_of[mode] = {"LD_PRELOAD": self.lib, "NVSHARE_MEMORY_MODE": mode,
                            "NVSHARE_LOG_LEVEL": "warn",
                            "NVSHARE_SOCKET": str(self.raw / name / "nobody.sock")}
        seen = {k: {} for k in env_of}
        for _ in range(3):
            for key, env in env_of.items():
                r = self.run_jobs(name, [([sys.executable, str(ALLOCBENCH)], env)], barrier=False)[0]
                for size, us in (r.get("us_per_pair") or {}).items():
                    seen[key].setdefault(size, []).append(us)
        for mode in ("device", "unified", "plain"):
            for size, runs in seen[mode].items():
                native = median(seen["native"].get(size, []))
                self.metric(f"alloc_free_us_{mode}_{size}", median(runs), "reported",
                            bool(runs), "us", native=native, runs=runs)

    def cap_mixes(self, name, configs, flags, label=""):
        """Runs each mix of caps (a list of percents, None for an uncapped job) as compute-bound jobs
        started together under a scheduler with `flags`; returns one row per job: the
        achieved share (rate over the steady window after the first quota window, over the native
        rate) and its error against its entitlement (docs/scheduling.md), in points."""
        d = self.scenario_dir(name)
        window, skip = 10.0, 2.0
        base = self.run_jobs(name, [(self.torch_job("matmul", seconds=window, skip_s=skip), None)])
        native_rate = base[0].get("steady_rate") or self.calibration["matmul"]
        rows = []
        for caps in configs:
            total = sum(c for c in caps if c)
            uncapped = any(c is None for c in caps)
            jobs = [(self.torch_job("matmul", seconds=window, skip_s=skip),
                     {"NVSHARE_CORE_LIMIT": str(c)} if c else {}) for c in caps]
            with Scheduler(self, d, flags) as s:
                res = self.run_jobs(name, jobs, env=s.env())
                events = s.trace_events()
            # Caps are entitlements (docs/scheduling.md): scaled to fit 100% (90% beside an
            # uncapped job), and the uncapped jobs split the rest.
            room = 90.0 if uncapped else 100.0
            scale = room / total if total > room else 1.0
            n_uncapped = sum(1 for c in caps if c is None)
            for c, r in zip(caps, res):
                target = c * scale if c else (100.0 - total * scale) / n_uncapped
                ok = r.get("result") == "ok"
                share = 100.0 * r.get("steady_rate", 0) / native_rate if ok else None
                whole = 100.0 * r.get("rate", 0) / native_rate if ok else None
                held = held_share(events, r) if ok else None
                rows.append({"caps": "+".join(str(x) if x else "uncapped" for x in caps) + label,
                             "cap": c or 100, "target": target, "share": share, "whole_share": whole,
                             "held_share": held,
                             "error": None if share is None else share - target})
                log(f"cap {rows[-1]}")
        worst = worst_error(rows)
        return worst, rows, {"native_rate": native_rate, "window_s": window, "skip_s": skip}

    def caps(self):
        """Compute caps in mode exclusive (capped jobs take turns): every single cap and every mix
        sharing a GPU."""
        configs = [[10], [25], [30], [50], [75], [90], [30, 60], [50, 50], [80, 80], [30, None],
                   [20, 45, None], [10, 30, 50]]
        v, rows, how = self.cap_mixes("caps", configs, ["--mode", "exclusive"])
        self.metric("cap_error_max_points_exclusive", v, "<= 2", v is not None and v <= 2,
                    "points", native=None, rows=rows, **how)

    def caps_auto(self):
        """The mixes that share one GPU, again in mode auto (the default: one at a time while a
        cap binds, as in exclusive; co-running only when no capped job wants the GPU)."""
        configs = [[30, 60], [50, 50], [80, 80], [30, None], [20, 45, None], [10, 30, 50]]
        v, rows, how = self.cap_mixes("caps_auto", configs, ["--mode", "auto"], " auto")
        self.metric("cap_error_max_points_auto", v, "<= 2", v is not None and v <= 2, "points",
                    rows=rows, **how)

    def latency(self):
        """A latency-sensitive service (serve: forward + synchronize, back to back) beside a
        compute-bound trainer (matmul), started together for a window: natively (time-sliced by
        the driver) and under nvshare in each mode. Each job's rate over its rate alone, and the
        service's p99 step latency over its p99 alone. Goals: in the default mode the service's
        steps/s and p99 and the trainer's rate at least as good as native time-slicing; in every
        mode nobody starves (each job at least 0.25 of its rate alone)."""
        name = "latency"
        self.scenario_dir(name)
        window = self.job_seconds
        serve = self.torch_job("serve", seconds=window)
        train = self.torch_job("matmul", seconds=window)
        alone = {"serve": [], "train": [], "p99": []}
        for _ in range(self.repeats):
            r = self.run_jobs(name, [(serve, None)])[0]
            if r.get("result") == "ok":
                alone["serve"].append(r["rate"])
                alone["p99"].append(r["p99_ms"])
            r = self.run_jobs(name, [(train, None)])[0]
            if r.get("result") == "ok":
                alone["train"].append(r["rate"])
        base = {k: median(v) for k, v in alone.items()}
        runs = {"native": [], **{m: [] for m in self.MODES}}
        for _ in range(self.repeats):
            runs["native"].append(self.run_jobs(name, [(serve, None), (train, None)]))
            for mode in self.MODES:
                with Scheduler(self, self.raw / name, ["--mode", mode]) as s:
                    # At debug level each client says at exit how often it waited at the drain
                    # bound and why (raw/latency/job*.err).
                    runs[mode].append(self.run_jobs(name, [(serve, None), (train, None)],
                                                    env=s.env({"NVSHARE_LOG_LEVEL": "debug"})))
        figures = {}
        for key, rs in runs.items():
            good = [r for r in rs if self.ok(r)]
            figures[key] = {
                "serve_steps": median([r[0]["rate"] / base["serve"] for r in good]) if base["serve"] else None,
                "serve_p99": median([r[0]["p99_ms"] / base["p99"] for r in good]) if base["p99"] else None,
                "trainer": median([r[1]["rate"] / base["train"] for r in good]) if base["train"] else None,
            }
        nat = figures["native"]
        for mode in self.MODES:
            f = figures[mode]
            values = [f["serve_steps"], f["serve_p99"], f["trainer"]]
            known = all(v is not None for v in values) and all(v is not None for v in nat.values())
            starve = known and min(f["serve_steps"], f["trainer"]) >= 0.25
            if mode == "auto":
                met = known and f["serve_steps"] >= nat["serve_steps"] and \
                    f["serve_p99"] <= nat["serve_p99"] and f["trainer"] >= nat["trainer"]
                goal = ">= native steps/s, <= native p99, trainer >= native"
            else:
                met = starve
                goal = "nobody starves: each >= 0.25 of alone"
            for key in ("serve_steps", "serve_p99", "trainer"):
                self.metric(f"latency_{key}_ratio_{mode}", f[key], goal, met, "x alone",
                            native=nat[key], starvation_free=starve, alone=base, figures=figures)

    def priority(self):
        """Priority classes: the service (serve) `high` beside the compute-bound trainer (matmul)
        `low`, and the same pair natively (time-sliced by the driver). Two shapes of service: one
        that waits for requests between steps as long as a step takes alone (it leaves about half
        the GPU idle: the goals' case), and one that never idles. Reported: the service's steps/s
        and p99 step latency over alone, the trainer's rate over alone, and the hand-over: how long
        the service waited from its request for the GPU (after an idle moment) to its grant
        (grant trace, p50 and p99), and the trainer's fewest iterations in any 5 s of its run;
        and, for the p99's sake, the trainer's drains after the service's returns (its work still
        in flight beside the service's first steps) and the seconds of steps whose own p99 is over
        the goal. A third shape runs the half-idle pair on a GPU too small for both (virtual
        capacity 1.2 x the larger job's memory): the service is never swapped out for the
        trainer. A fourth runs the service in 1 s bursts with 1 s pauses (half idle at a coarse
        grain). A fifth runs the half-idle service beside a trainer of short kernels (2048² fp32
        matmuls, eight queued back to back between waits, as a training step queues many short
        kernels), its rate over its own alone rate.
        Classes come from pod records set through the control API, as the device plugin sets
        them from the pod annotation."""
        name = "priority"
        self.scenario_dir(name)
        window = self.job_seconds
        train = self.torch_job("matmul", seconds=window)
        short_train = train + ["--side", "2048", "--chain", "8"]
        alone_serve = self.torch_job("serve", seconds=window)
        base = {"serve": [], "p99": [], "p50": [], "train": [], "short_train": []}
        memory = []
        for _ in range(self.repeats):
            r = self.run_jobs(name, [(alone_serve, None)])[0]
            if r.get("result") == "ok":
                base["serve"].append(r["rate"])
                base["p99"].append(r["p99_ms"])
                base["p50"].append(r["p50_ms"])
                memory.append(r.get("reserved_bytes", 0))
            r = self.run_jobs(name, [(train, None)])[0]
            if r.get("result") == "ok":
                base["train"].append(r["rate"])
                memory.append(r.get("reserved_bytes", 0))
            if "half_idle_short" in self.priority_shapes:
                r = self.run_jobs(name, [(short_train, None)])[0]
                if r.get("result") == "ok":
                    base["short_train"].append(r["rate"])
        if not base["p50"] or not base["train"]:
            return
        think = median(base["p50"])
        # Each job's memory as its allocator reserved it, plus what the library and the context
        # add; 1.2 x the larger one fits either alone, not both.
        capacity = int(1.2 * max(memory)) + (512 << 20)
        # The service's shapes: idle between steps as long as a step (half idle at a fine grain),
        # never idle, the half-idle pair not fitting together, and half idle at a coarse grain
        # (1 s of steps back to back, then 1 s without requests); and half idle at a fine grain
        # beside the trainer of short kernels.
        idle_steps = ["--think-ms", f"{think:.3f}"]
        shapes = {"half_idle": idle_steps, "busy": [], "oversubscribed": idle_steps,
                  "bursts": ["--burst-ms", "1000", "--pause-ms", "1000"],
                  "half_idle_short": idle_steps}
        with_goals = ("half_idle", "bursts", "half_idle_short")
        pods = {"high": "be0c0000-0000-4000-8000-00000000000a",
                "low": "be0c0000-0000-4000-8000-00000000000b"}
        for shape, shape_args in shapes.items():
            if shape not in self.priority_shapes:
                continue
            serve = alone_serve + shape_args
            short = shape == "half_idle_short"
            trainer, trainer_key = (short_train, "short_train") if short else (train, "train")
            if not base[trainer_key]:
                continue
            alone = base if not shape_args else None
            if shape_args:
                # The service alone with its idle time: the reference for its steps/s and p99.
                alone = {"serve": [], "p99": [], "train": base[trainer_key]}
                for _ in range(self.repeats):
                    r = self.run_jobs(name, [(serve, None)])[0]
                    if r.get("result") == "ok":
                        alone["serve"].append(r["rate"])
                        alone["p99"].append(r["p99_ms"])
            ref = {k: median(v) for k, v in alone.items() if k in ("serve", "p99", "train") and v}
            runs = {"native": [], "priority": []}
            waits = []
            drains = []
            swaps_of_high = 0
            knobs = ["--capacity", str(capacity)] if shape == "oversubscribed" else []
            for _ in range(self.repeats):
                runs["native"].append(self.run_jobs(name, [(serve, None), (trainer, None)]))
                d = self.raw / name / f"{shape}-{len(runs['priority'])}"
                d.mkdir(parents=True, exist_ok=True)
                with Scheduler(self, d, knobs) as s:
                    for cls, uid in pods.items():
                        s.ctl(["set-limits", "--pod-uid", uid, "--priority", cls])
                    res = self.run_jobs(name, [(serve, {"NVSHARE_POD_UID": pods["high"]}),
                                               (trainer, {"NVSHARE_POD_UID": pods["low"]})],
                                        env=s.env())
                    runs["priority"].append(res)
                    if res and res[0].get("pid"):
                        events = s.trace_events()  # read once for every figure below
                        high = res[0]["pid"]
                        waits += request_to_grant_ms(events, high)
                        if len(res) > 1 and res[1].get("pid"):
                            # The service's timed loop only: its warm-up hands the GPU back and
                            # forth.
                            drains += drains_at_returns(events, high, res[1]["pid"],
                                                        res[0].get("loop_start"),
                                                        res[0].get("loop_end"))
                        if shape == "oversubscribed":
                            swaps_of_high += swap_outs_of(events, high)
            figures = {}
            for key, rs in runs.items():
                good = [r for r in rs if self.ok(r)]
                figures[key] = {
                    "serve_steps": median([r[0]["rate"] / ref["serve"] for r in good]) if good else None,
                    "serve_p99": median([r[0]["p99_ms"] / ref["p99"] for r in good]) if good else None,
                    "trainer": median([r[1]["rate"] / ref["train"] for r in good]) if good else None,
                }
            f, nat = figures["priority"], figures["native"]
            # The trainer's fewest iterations in any 5 whole seconds of its window, under nvshare
            # (goal: never 0 while the service leaves half the GPU idle).
            fewest = [min_window(r[1].get("iters_by_s", []), 5) for r in runs["priority"]
                      if self.ok(r)]
            fewest = [v for v in fewest if v is not None]
            native_fewest = [min_window(r[1].get("iters_by_s", []), 5) for r in runs["native"]
                             if self.ok(r)]
            native_fewest = [v for v in native_fewest if v is not None]
            self.metric(f"priority_{shape}_trainer_min_5s_iters", min(fewest) if fewest else None,
                        "> 0 (any 5 s)" if shape in with_goals else "(no goal; reported)",
                        (min(fewest) > 0) if fewest and shape in with_goals else None,
                        "iterations", per_run=fewest, native=min(native_fewest, default=None))
            if shape == "oversubscribed":
                self.metric("priority_oversubscribed_high_swap_outs", swaps_of_high, "0", swaps_of_high == 0,
                            "swap-outs", capacity_bytes=capacity, memory_bytes=memory)
            goals = {"serve_steps": (">= 0.95 of alone", lambda v: v >= 0.95),
                     "serve_p99": ("<= 1.10 x alone", lambda v: v <= 1.10),
                     "trainer": (">= 0.50 of alone (service half idle)", lambda v: v >= 0.50)}
            for key, (goal, test) in goals.items():
                value = f[key]
                met = test(value) if value is not None and shape in with_goals else None
                self.metric(f"priority_{shape}_{key}_ratio", value,
                            goal if shape in with_goals else "(no goal; reported)", met,
                            "x alone", native=nat[key], shape_args=shape_args, alone=ref,
                            figures=figures)
            # Why the service's p99 is what it is: the trainer's work still running when the
            # service came back (it slows the service's first steps), and the seconds of steps
            # whose own p99 was over the goal.
            # A drain under 1 ms had nothing in flight (the service came back at once).
            long_drains = [d for d in drains if d >= 1.0]
            self.metric(f"priority_{shape}_low_drain_at_return_ms",
                        percentile(long_drains, 50) if long_drains else None, "(reported)", None,
                        "ms", max_ms=max(long_drains) if long_drains else None,
                        with_work=len(long_drains), returns=len(drains),
                        all_p50_ms=percentile(drains, 50) if drains else None,
                        all_p90_ms=percentile(drains, 90) if drains else None)
            over, busy = 0, 0
            if ref.get("p99"):
                for r in runs["priority"]:
                    if self.ok(r):
                        by_s = list(zip(r[0].get("p99_by_s_ms", []), r[0].get("steps_by_s", [])))
                        o, b = seconds_over(by_s, 1.10 * ref["p99"])
                        over, busy = over + o, busy + b
            self.metric(f"priority_{shape}_serve_seconds_over_p99_goal", over if busy else None,
                        "(reported)", None, "seconds", of_seconds=busy)
            self.metric(f"priority_{shape}_handover_p99_ms", percentile(waits, 99) if waits else None,
                        "<= 2 ms (p99)" if shape in with_goals else "(no goal; reported)",
                        (percentile(waits, 99) <= 2.0) if waits and shape in with_goals else None,
                        "ms", p50_ms=percentile(waits, 50) if waits else None, samples=len(waits))

    def capdeep(self):
        """A deep queue under a 30% cap: about 3 s of GPU work queued, then one synchronize, as
        plain kernels (8192² matmuls) and as CUDA-graph replays (10 matmuls a graph). The share is
        the native time over the capped time; the cap holds when it is 30%."""
        name = "capdeep"
        self.scenario_dir(name)
        per_kernel = 1.0 / self.calibration["matmul"]
        kernels = max(10, round(3.0 / per_kernel))
        variants = {"kernels": self.torch_job("matmul", iters=kernels),
                    "graphs": self.torch_job("graph", iters=max(1, kernels // 10))}
        rows = []
        for variant, argv in variants.items():
            native, capped = [], []
            for _ in range(self.repeats):
                native += self.run_jobs(name, [(argv, None)])
                with Scheduler(self, self.raw / name, []) as s:
                    capped += self.run_jobs(name, [(argv, {"NVSHARE_CORE_LIMIT": "30"})],
                                            env=s.env())
            n = median([r["loop_s"] for r in native if r.get("result") == "ok"])
            c = median([r["loop_s"] for r in capped if r.get("result") == "ok"])
            share = 100.0 * n / c if n and c else None
            rows.append({"variant": variant, "native_s": n, "capped_s": c,
                         "share": share, "error": None if share is None else share - 30.0})
            log(f"capdeep {rows[-1]}")
        worst = worst_error(rows)
        self.metric("cap_deep_queue_error_points", worst, "<= 2", worst is not None and worst <= 2,
                    "points", native=None, rows=rows, kernels=kernels)

    def handoff(self):
        """Hand-off latency without swap: two compute-bound jobs in exclusive mode with a 0.25 s
        quantum; from the library's trace: revoke -> release (drain) and release -> the other
        job's grant."""
        name = "handoff"
        d = self.scenario_dir(name)
        drains, gaps = [], []
        for i in range(max(1, self.repeats - 1)):
            trace = str(d / f"trace{i}.jsonl")
            with Scheduler(self, d, ["--mode", "exclusive", "--quantum", "0.25"]) as s:
                self.run_jobs(name, [(self.torch_job("matmul", seconds=8.0), {"NVSHARE_TRACE_FILE": trace})] * 2, env=s.env())
            events = read_trace(trace)
            d_, g_ = handoff_latencies(events)
            drains += d_
            gaps += g_
        p50, p99 = percentile(gaps, 50), percentile(gaps, 99)
        self.metric("release_to_grant_p99_ms", p99, "<= 5", p99 is not None and p99 <= 5, "ms",
                    p50=p50, samples=len(gaps))
        self.metric("release_to_grant_p50_ms", p50, "(reported)", None, "ms", samples=len(gaps))
        self.metric("revoke_to_release_p50_ms", percentile(drains, 50), "(reported)", None, "ms",
                    samples=len(drains))
        self.metric("revoke_to_release_p99_ms", percentile(drains, 99), "(reported)", None, "ms",
                    samples=len(drains))

    def multi(self):
        """Two GPUs: independent jobs on each, 30% on one and 60% on the other, and one process
        using both."""
        name = "multi"
        d = self.scenario_dir(name)
        jobs = [(self.sized("membound", "0"), None), (self.sized("membound", "1"), None)]
        nat, sh = [], []
        for _ in range(self.repeats):
            nat.append(self.makespan(self.run_jobs(name, jobs)))
            with Scheduler(self, d, []) as s:
                sh.append(self.makespan(self.run_jobs(name, jobs, env=s.env())))
        n, v = median([x for x in nat if x]), median([x for x in sh if x])
        ratio = v / n if n and v else None
        self.metric("two_gpu_independent_time_ratio", ratio, "<= 1.01", ratio is not None and ratio <= 1.01,
                    "x native", native=1.0, native_s=nat, nvshare_s=sh)
        # One process driving both GPUs.
        nat, sh = [], []
        for _ in range(self.repeats):
            r = self.run_jobs(name, [(self.sized("membound", "0,1"), None)])
            nat.append(r[0].get("loop_s"))
            with Scheduler(self, d, []) as s:
                r = self.run_jobs(name, [(self.sized("membound", "0,1"), None)], env=s.env())
                sh.append(r[0].get("loop_s"))
        n, v = median([x for x in nat if x]), median([x for x in sh if x])
        ratio = v / n if n and v else None
        self.metric("two_gpu_one_process_time_ratio", ratio, "<= 1.01", ratio is not None and ratio <= 1.01,
                    "x native", native=1.0, native_s=nat, nvshare_s=sh)
        # Caps on two GPUs: 30% on GPU 0, 60% on GPU 1, at once.
        window, skip = 10.0, 2.0
        base = self.run_jobs(name, [(self.torch_job("matmul", seconds=window, skip_s=skip, devices=str(g)), None) for g in (0, 1)])
        rows = []
        with Scheduler(self, d, []) as s:
            res = self.run_jobs(name, [(self.torch_job("matmul", seconds=window, skip_s=skip, devices="0"), {"NVSHARE_CORE_LIMIT": "30"}),
                                       (self.torch_job("matmul", seconds=window, skip_s=skip, devices="1"), {"NVSHARE_CORE_LIMIT": "60"})], env=s.env())
        for cap, b, r in zip((30, 60), base, res):
            share = 100.0 * r.get("steady_rate", 0) / b["steady_rate"] if r.get("result") == "ok" and b.get("steady_rate") else None
            rows.append({"gpu": len(rows), "cap": cap, "share": share,
                         "error": None if share is None else share - cap})
        v = worst_error(rows, expected=2)
        self.metric("two_gpu_cap_error_max_points", v, "<= 2", v is not None and v <= 2, "points", rows=rows)


    def multi_notfit(self):
        """Two GPUs, two memory-bound jobs on each that cannot run together there (16Gi virtual
        capacity): each GPU's pair takes turns with swap on its own. Makespan per GPU over the serial
        sum of native single times, and each GPU's release-to-grant gaps while the other swaps."""
        name = "multi_notfit"
        d = self.scenario_dir(name)
        single = self.native_single["membound"]
        rows, gaps = [], {"0": [], "1": []}
        for i in range(max(1, self.repeats - 1)):
            trace = str(d / f"trace{i}.jsonl")
            jobs = [(self.sized("membound", g), {"NVSHARE_TRACE_FILE": trace}) for g in ("0", "0", "1", "1")]
            with Scheduler(self, d, ["--capacity", "16Gi"]) as s:
                r = self.run_jobs(name, jobs, env=s.env())
            events = read_trace(trace)
            uuids = sorted({e["gpu"] for e in events})
            for g, pair in (("0", r[:2]), ("1", r[2:])):
                span = self.makespan(pair)
                rows.append({"gpu": g, "repeat": i, "makespan_over_serial": span / (2 * single) if span else None})
            for k, uuid in enumerate(uuids[:2]):
                _, g_ = handoff_latencies([e for e in events if e["gpu"] == uuid])
                gaps[str(k)] += g_
        v = max((x["makespan_over_serial"] for x in rows), default=None) if all(x["makespan_over_serial"] for x in rows) else None
        self.metric("two_gpu_notfit_makespan_over_serial", v, "<= 1.05 on each GPU", v is not None and v <= 1.05,
                    "x serial", native=None, rows=rows,
                    note="the worst GPU of every repeat; natively each pair does not fit")
        worst = max((percentile(g_, 99) or 0) for g_ in gaps.values()) if all(gaps.values()) else None
        self.metric("two_gpu_notfit_release_to_grant_p99_ms", worst, "<= 5 on each GPU", worst is not None and worst <= 5,
                    "ms", per_gpu={k: {"p50": percentile(v_, 50), "p99": percentile(v_, 99), "samples": len(v_)} for k, v_ in gaps.items()},
                    note="a hand-off on one GPU while the other GPU's pair swaps")

    def ddp_ranks(self, steps, extra=None, world=2):
        """One DDP run (ddp.py), one rank per GPU; returns the ranks' JSON."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        jobs = []
        for rank in range(world):
            env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NCCL_NVLS_ENABLE": "0"}
            env.update(extra or {})
            jobs.append(([sys.executable, str(DDP), "--steps", str(steps)], env))
        return self.run_jobs("ddp", jobs, timeout=600)

    def ddp(self):
        """PyTorch DDP over NCCL on two GPUs, one rank per GPU: the loss curve and the time beside
        native at the same seed; then each rank with a memory limit and a 50% cap."""
        name = "ddp"
        d = self.scenario_dir(name)
        steps = 300
        nat, sh, curves = [], [], {}
        for i in range(self.repeats):
            r = self.ddp_ranks(steps)
            nat.append(self.makespan(r))
            curves.setdefault("native", r[0].get("losses"))
            with Scheduler(self, d, []) as s:
                r = self.ddp_ranks(steps, s.env())
                sh.append(self.makespan(r))
                curves.setdefault("nvshare", r[0].get("losses"))
        n, v = median([x for x in nat if x]), median([x for x in sh if x])
        ratio = v / n if n and v else None
        self.metric("ddp_time_ratio", ratio, "<= 1.02", ratio is not None and ratio <= 1.02,
                    "x native", native=1.0, native_s=nat, nvshare_s=sh)
        a, b = curves.get("native"), curves.get("nvshare")
        diff = max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b)) if a and b else None
        self.metric("ddp_loss_max_relative_difference", diff, "== 0 (same seed)",
                    diff is not None and diff == 0.0, "", steps=steps,
                    native_first_last=[a[0], a[-1]] if a else None,
                    nvshare_first_last=[b[0], b[-1]] if b else None)

    def ddp_cap(self):
        """Each DDP rank capped at 50% with a 16Gi memory limit: the share of native throughput per
        GPU over the second half of 600 steps (the first half includes the burst a full bucket
        allows: its depth, cap x the quota window), beside the same over the whole run; the ranks'
        grant trace is kept in the raw data."""
        name = "ddp_cap"
        d = self.scenario_dir(name)
        steps = 600
        base = self.ddp_ranks(steps)
        trace = str(d / "trace.jsonl")
        with Scheduler(self, d, []) as s:
            capped = self.ddp_ranks(steps, s.env({"NVSHARE_CORE_LIMIT": "50",
                                                  "NVSHARE_MEMORY_LIMIT": "16Gi",
                                                  "NVSHARE_TRACE_FILE": trace}))
        rows = []
        for b_, c_ in zip(base, capped):
            ok = c_.get("result") == "ok"
            share = (100.0 * c_["late_rate"] / b_["late_rate"]
                     if ok and b_.get("late_rate") and c_.get("late_rate") else None)
            whole = (100.0 * c_["steady_rate"] / b_["steady_rate"]
                     if ok and b_.get("steady_rate") and c_.get("steady_rate") else None)
            rows.append({"rank": b_.get("rank"), "cap": 50, "share": share, "share_whole_run": whole,
                         "mem_total_seen": c_.get("mem_total"),
                         "error": None if share is None else share - 50})
        v = worst_error(rows)
        self.metric("ddp_cap50_error_max_points", v, "<= 2", v is not None and v <= 2, "points",
                    rows=rows)
        seen = [r["mem_total_seen"] for r in rows]
        self.metric("ddp_memory_limit_seen_gib", max(seen) / 2**30 if seen and all(seen) else None,
                    "== 16 (the limit)", bool(seen) and all(x == 16 * 2**30 for x in seen), "GiB",
                    per_rank=seen)


def held_share(events, result):
    """The percent of a job's steady window (its steady_t0..steady_t1) during which its process
    held a grant, from the grant trace: what the scheduler gave it, whatever the GPU made of it.
    None without a window or a pid."""
    t0, t1, pid = result.get("steady_t0"), result.get("steady_t1"), result.get("pid")
    if t0 is None or t1 is None or pid is None or t1 <= t0:
        return None
    held, since = 0.0, None
    for e in sorted((e for e in events if e["pid"] == pid), key=lambda e: e["t"]):
        if e["event"] == "grant" and since is None:
            since = e["t"]
        elif e["event"] in ("release", "idle-release", "handback") and since is not None:
            held += max(0.0, min(e["t"], t1) - max(since, t0))
            since = None
    if since is not None:
        held += max(0.0, t1 - max(since, t0))
    return 100.0 * held / (t1 - t0)


def handoff_latencies(events):
    """From one trace: drain times (revoke -> release, ms, as the library measured) and, for each
    release while another process was waiting for the same GPU, the time until that GPU's next
    grant to another process (ms). A process waits from its request, or from its answer to a
    revoke (the scheduler re-queues it), until its grant; an idle release leaves it not waiting."""
    drains, gaps = [], []
    events = sorted(events, key=lambda e: e["t"])
    waiting = set()  # (gpu, pid)
    for i, e in enumerate(events):
        key = (e["gpu"], e["pid"])
        if e["event"] in ("release", "idle-release"):
            if e["event"] == "release" and e.get("ms") is not None:
                drains.append(e["ms"])
            if any(g == e["gpu"] and p != e["pid"] for g, p in waiting):
                for f in events[i + 1:]:
                    if f["event"] == "grant" and f["gpu"] == e["gpu"] and f["pid"] != e["pid"]:
                        gaps.append((f["t"] - e["t"]) * 1000.0)
                        break
        if e["event"] in ("request", "release"):
            waiting.add(key)
        elif e["event"] in ("grant", "idle-release", "handback"):
            waiting.discard(key)
    return drains, gaps


def request_to_grant_ms(events, pid):
    """Each wait of `pid` from a request to its next grant, in ms (grant trace)."""
    out, asked = [], None
    for e in events:
        if e.get("pid") != pid:
            continue
        if e["event"] == "request":
            asked = e["t"]
        elif e["event"] == "grant" and asked is not None:
            out.append((e["t"] - asked) * 1000.0)
            asked = None
    return out


def drains_at_returns(events, high, low, since=None, until=None):
    """How long `low` took to release after each return of `high` that revoked it, in ms (grant
    trace; events from `since` to `until` only, when given): its work still in flight when the
    higher class came back, which runs on beside the higher class's first steps (time-sliced by the
    GPU)."""
    out, returned, revoked = [], False, False
    for e in events:
        if (since is not None and e["t"] < since) or (until is not None and e["t"] > until):
            continue
        pid, what = e.get("pid"), e["event"]
        if pid == high and what == "request":
            returned, revoked = True, False
        elif pid == low and what == "revoke" and returned:
            revoked = True
        elif pid == low and what == "release" and revoked:
            out.append(e.get("ms", 0.0))
            returned, revoked = False, False
        elif pid == high and what in ("release", "idle-release"):
            returned = False
    return out


def seconds_over(p99_by_s, limit):
    """Of the seconds in which a service made more than two steps (its pauses' seconds hold one or
    two), how many had a p99 over `limit`, and how many there were."""
    busy = [p for p, n in p99_by_s if n > 2]
    return sum(1 for p in busy if p > limit), len(busy)


def swap_outs_of(events, pid):
    """How many of `pid`'s releases moved memory to the host (grant trace)."""
    return sum(1 for e in events if e.get("pid") == pid and e["event"] == "release" and
               e.get("swap_bytes", 0) > 0)


def min_window(per_s, width):
    """The smallest sum of `width` consecutive entries of `per_s`; None when it is shorter."""
    if len(per_s) < width:
        return None
    return min(sum(per_s[i:i + width]) for i in range(len(per_s) - width + 1))


def machine_info():
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception:
            return ""
    return {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "gpu": sh("nvidia-smi --query-gpu=name --format=csv,noheader | head -1"),
        "gpus": sh("nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader"),
        "driver": sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1"),
        "cuda": sh("nvcc --version | tail -n 2 | head -1"),
        "torch": sh(f"{sys.executable} -c 'import torch; print(torch.__version__)'"),
        "cpu": sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"),
        "cores": os.cpu_count(),
    }


# Groups of scenarios that fit in one call of a few minutes each.
PHASES = {
    "overhead": ["single", "launch", "handoff"],
    "together": ["pair_fit", "idle3", "caps_auto", "latency", "priority"],
    "turns": ["notfit", "caps", "capdeep"],
    "memory": ["swap", "alloc", "copystall"],
    "multi": ["multi", "multi_notfit", "ddp", "ddp_cap"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--phase", default="all", help="overhead, together, turns, multi, all, or scenario names (comma-separated)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--job-seconds", type=float, default=10.0)
    ap.add_argument("--swap-variants", default="device,unified,device_quantum_max_30",
                    help="the swap scenario's variants to run (comma-separated)")
    ap.add_argument("--priority-shapes", default="half_idle,busy,oversubscribed,bursts,half_idle_short",
                    help="the priority scenario's service shapes to run (comma-separated)")
    ap.add_argument("--library-log-level", default="warn",
                    help="NVSHARE_LOG_LEVEL of the jobs run under a scheduler (their stderr is kept)")
    args = ap.parse_args()
    bench = Bench(args)
    if args.phase == "all":
        scenarios = [x for p in PHASES.values() for x in p]
    else:
        scenarios = []
        for p in args.phase.split(","):
            scenarios += PHASES.get(p, [p])
    info = machine_info()
    log("machine", json.dumps(info))
    results = {"machine": info, "scenarios": scenarios, "metrics": bench.metrics, "runs": bench.runs,
               "calibration": bench.calibration, "job_seconds": args.job_seconds,
               "repeats": args.repeats}
    needs = set()
    if any(s in scenarios for s in ("single", "pair_fit", "notfit", "caps", "caps_auto", "multi",
                                    "multi_notfit", "capdeep", "swap")):
        needs |= {"membound", "matmul"}
    if "idle3" in scenarios:
        needs.add("idle")
    if "latency" in scenarios:
        needs.add("matmul")
    bench.calibrate(sorted(needs))
    if "single" not in scenarios and any(s in scenarios for s in ("pair_fit", "notfit", "multi_notfit", "swap")):
        # The efficiency and serial-sum rows divide by native single times: measure them.
        bench.native_single = {}
        for kind in ("membound", "matmul"):
            r = [x["loop_s"] for x in bench.run_jobs("native_single", [(bench.sized(kind), None)]) if x.get("result") == "ok"]
            bench.native_single[kind] = median(r)
    for s in scenarios:
        started = time.monotonic()
        log(f"== {s}")
        try:
            getattr(bench, s)()
        except Exception as e:  # one broken scenario must not lose the others' figures
            log(f"{s}: {type(e).__name__}: {e}")
            bench.metric(f"{s}_failed", None, "runs", False, error=f"{type(e).__name__}: {e}")
        log(f"== {s} took {time.monotonic() - started:.0f} s")
        (bench.out / "results.json").write_text(json.dumps(results, indent=1))
    (bench.out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
