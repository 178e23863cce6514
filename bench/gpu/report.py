"""Turns bench.py's results into the benchmark table, the JSON for programs and the plots.

    python3 bench/gpu/report.py RESULTS.json [RESULTS.json ...] --markdown OUT.md --json OUT.json
                                [--plots DIR] [--raw DIR ...]

Several results files (one per call of bench/gpu/run.sh) merge into one table; a metric measured in
more than one keeps the latest. --raw names the raw/ directories whose library traces become
schedule plots (which job held the GPU when); the cap plot comes from the caps metric.
"""
import argparse
import json
import os
import sys
from pathlib import Path

from bench import read_trace  # the trace format has one reader

# The goal table's rows, in order: metric name -> the row's words. Extra metrics follow.
ROWS = [
    ("single_membound_time_ratio", "single memory-bound job, time / native"),
    ("launch_interleaved_time_per_launch_ratio", "launch-bound, the library's launch path / the driver's, interleaved in one process (gate active; native column: the same function twice)"),
    ("launch_async_time_per_launch_ratio", "launch-bound, time per launch / native (gate active), paired processes"),
    ("pair_fit_efficiency_auto", "two compute-bound jobs that fit: aggregate efficiency (mode auto, the default)"),
    ("pair_fit_efficiency_exclusive", "two compute-bound jobs that fit: aggregate efficiency (mode exclusive)"),
    ("idle3_makespan_ratio_auto", "three idle-ish jobs: makespan / one alone (mode auto, the default)"),
    ("idle3_makespan_ratio_exclusive", "three idle-ish jobs: makespan / one alone (mode exclusive)"),
    ("latency_serve_steps_ratio_auto", "service beside a trainer: service steps/s / alone (mode auto)"),
    ("latency_serve_p99_ratio_auto", "service beside a trainer: service p99 step latency / alone (mode auto)"),
    ("latency_trainer_ratio_auto", "service beside a trainer: trainer rate / alone (mode auto)"),
    ("latency_serve_steps_ratio_exclusive", "service beside a trainer: service steps/s / alone (mode exclusive)"),
    ("latency_serve_p99_ratio_exclusive", "service beside a trainer: service p99 / alone (mode exclusive)"),
    ("latency_trainer_ratio_exclusive", "service beside a trainer: trainer rate / alone (mode exclusive; starvation case)"),
    ("notfit_makespan_over_serial", "two jobs that do not fit: makespan / serial sum"),
    ("cap_error_max_points_exclusive", "cap error (points), worst of every mix (mode exclusive)"),
    ("cap_error_single_job_max_points", "cap error (points), one job alone at 10..90%"),
    ("cap_error_max_points_shared_gpu_exclusive", "cap error (points), jobs sharing a GPU, mode exclusive"),
    ("cap_error_max_points_auto", "cap error (points), jobs sharing a GPU, mode auto"),
    ("cap_deep_queue_error_points", "cap error (points), 30% cap, ~3 s queued per synchronize (kernels, CUDA graphs)"),
    ("release_to_grant_p99_yield_ms", "release -> next grant, no swap, p99 (ms)"),
    ("release_to_grant_p99_ms", "release -> next grant at quantum ends, p99 (ms)"),
    ("two_gpu_independent_time_ratio", "two GPUs: a job on each, makespan / native"),
    ("two_gpu_one_process_time_ratio", "two GPUs: one process on both, time / native"),
    ("two_gpu_cap_error_max_points", "two GPUs: 30% on one and 60% on the other, cap error (points)"),
    ("ddp_time_ratio", "DDP over NCCL, two GPUs: time / native"),
    ("ddp_loss_max_relative_difference", "DDP: loss curve vs native at the same seed (max relative difference)"),
    ("ddp_cap50_error_max_points", "DDP: each rank capped at 50%, cap error (points)"),
    ("ddp_memory_limit_seen_gib", "DDP: total memory each rank sees under a 16Gi limit (GiB)"),
    ("priority_half_idle_serve_steps_ratio", "priority: high service (half idle) beside a low trainer, steps/s / alone"),
    ("priority_half_idle_serve_p99_ratio", "priority: high service (half idle), p99 step latency / alone"),
    ("priority_half_idle_trainer_ratio", "priority: low trainer beside the half-idle service, rate / alone"),
    ("priority_half_idle_handover_p99_ms", "priority: high service's wait from request to grant, p99 (ms)"),
    ("priority_busy_serve_steps_ratio", "priority: high service that never idles, steps/s / alone"),
    ("priority_busy_serve_p99_ratio", "priority: high service that never idles, p99 / alone"),
    ("priority_busy_trainer_ratio", "priority: low trainer beside the busy service, rate / alone"),
    ("priority_busy_handover_p99_ms", "priority: busy service's wait from request to grant, p99 (ms)"),
    ("priority_half_idle_trainer_min_5s_iters", "priority: low trainer's fewest iterations in any 5 s (service half idle)"),
    ("priority_bursts_serve_steps_ratio", "priority: high service in 1 s bursts (half idle), steps/s / alone"),
    ("priority_bursts_serve_p99_ratio", "priority: high service in 1 s bursts, p99 step latency / alone"),
    ("priority_bursts_trainer_ratio", "priority: low trainer beside the bursty service, rate / alone"),
    ("priority_bursts_trainer_min_5s_iters", "priority: low trainer's fewest iterations in any 5 s (bursty service)"),
    ("priority_bursts_handover_p99_ms", "priority: bursty service's wait from request to grant, p99 (ms)"),
    ("priority_bursts_low_drain_at_return_ms", "priority: the trainer's work still running when the bursty service comes back, p50 (ms)"),
    ("priority_bursts_serve_seconds_over_p99_goal", "priority: seconds of the bursty service's steps whose own p99 is over 1.10 x alone"),
    ("priority_half_idle_short_serve_steps_ratio", "priority: half-idle service beside a low trainer of short kernels, steps/s / alone"),
    ("priority_half_idle_short_serve_p99_ratio", "priority: half-idle service beside a trainer of short kernels, p99 / alone"),
    ("priority_half_idle_short_trainer_ratio", "priority: low trainer of short kernels beside the half-idle service, rate / alone"),
    ("priority_half_idle_short_trainer_min_5s_iters", "priority: low trainer of short kernels, fewest iterations in any 5 s"),
    ("priority_half_idle_short_low_drain_at_return_ms", "priority: the short-kernel trainer's work still running when the service comes back, p50 (ms)"),
    ("priority_oversubscribed_serve_steps_ratio", "priority, not fitting together: high service steps/s / alone"),
    ("priority_oversubscribed_serve_p99_ratio", "priority, not fitting together: high service p99 / alone"),
    ("priority_oversubscribed_trainer_ratio", "priority, not fitting together: low trainer rate / alone"),
    ("priority_oversubscribed_high_swap_outs", "priority, not fitting together: the service's swap-outs"),
    ("single_matmul_time_ratio", "single compute-bound job, time / native"),
    ("launch_call_time_per_launch_ratio", "launch call alone (CPU time, the GPU keeping up) / native"),
    ("launch_inproc_time_per_launch_ratio", "launch path in-process (library / driver, same process; native column: the same function twice)"),
    ("launch_sync_time_per_launch_ratio", "launch then synchronize, time / native"),
    ("release_to_grant_p50_ms", "release -> next grant at quantum ends, p50 (ms)"),
    ("revoke_to_release_p50_ms", "revoke -> release (drain), p50 (ms)"),
    ("revoke_to_release_p99_ms", "revoke -> release (drain), p99 (ms)"),
]


def fmt(v, unit=""):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if unit == "ms" or unit == "points":
        return f"{v:.2f}"
    return f"{v:.3f}"


def load(paths):
    merged, machine = {}, None
    for p in paths:
        data = json.loads(Path(p).read_text())
        machine = data.get("machine", machine)
        for m in data.get("metrics", []):
            m = dict(m)
            m["machine"] = data.get("machine", {})
            merged[m["name"]] = m
    return merged, machine


def machine_words(m):
    gpu = m.get("gpu") or "unknown GPU"
    count = len([line for line in (m.get("gpus") or "").splitlines() if line.strip()])
    if count > 1:
        gpu = f"{count}x {gpu}"
    return f"{gpu}, driver {m.get('driver', '?')}, {m.get('cuda', '?')}, torch {m.get('torch', '?')}"


def markdown(metrics, machine):
    lines = [
        f"Measured on {machine_words(machine)}; {machine.get('date', '?')}.",
        "",
        "| metric | native | nvshare | goal | met |",
        "|---|---|---|---|---|",
    ]
    names = [n for n, _ in ROWS] + sorted(n for n in metrics if n not in dict(ROWS))
    words = dict(ROWS)
    for n in names:
        m = metrics.get(n)
        if not m:
            continue
        native = m.get("native")
        lines.append(f"| {words.get(n, n)} | {fmt(native, m.get('unit'))} | "
                     f"{fmt(m.get('value'), m.get('unit'))} | {m.get('goal', '')} | "
                     f"{'-' if m.get('met') is None else ('yes' if m['met'] else 'no')} |")
    return "\n".join(lines) + "\n"


def programs_json(metrics):
    out = []
    for n, m in metrics.items():
        mach = m.get("machine", {})
        out.append({"name": n, "value": m.get("value"), "goal": m.get("goal"), "met": m.get("met"),
                    "unit": m.get("unit", ""), "native": m.get("native"),
                    "machine": machine_words(mach), "date": mach.get("date")})
    return out


def schedule_plot(trace_files, png, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = sorted((e for f in trace_files for e in read_trace(f)), key=lambda e: e["t"])
    if not events:
        return False
    t0 = events[0]["t"]
    rows = sorted({(e["gpu"], e["pid"]) for e in events})
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(rows) + 1.5))
    for y, (gpu, pid) in enumerate(rows):
        mine = [e for e in events if e["gpu"] == gpu and e["pid"] == pid]
        held, start = [], None
        for e in mine:
            if e["event"] == "grant":
                start = e["t"]
            elif e["event"] in ("release", "idle-release") and start is not None:
                held.append((start - t0, e["t"] - start))
                start = None
        if start is not None:
            held.append((start - t0, mine[-1]["t"] - start + 0.01))
        ax.broken_barh(held, (y - 0.35, 0.7), color=f"C{y % 10}")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"pid {pid} ({gpu[:12]})" for gpu, pid in rows])
    ax.set_xlabel("seconds (holding the grant)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def cap_plot(metrics, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list((metrics.get("cap_error_max_points_auto") or metrics.get("cap_error_max_points") or
                 {}).get("detail", {}).get("rows", []))
    rows += list((metrics.get("cap_error_max_points_shared_gpu_exclusive") or {}).get("detail", {}).get("rows", []))
    rows += [dict(r, caps=f"GPU{r['gpu']}:{r['cap']}") for r in
             (metrics.get("two_gpu_cap_error_max_points") or {}).get("detail", {}).get("rows", [])]
    rows = [r for r in rows if r.get("share") is not None]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(11, 4))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r.get("target", r["cap"]) for r in rows], 0.4, label="cap (effective)")
    ax.bar([i + 0.2 for i in x], [r["share"] for r in rows], 0.4, label="achieved share")
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"{r['caps']}\n(job {r['cap']}%)" for r in rows], fontsize=7)
    ax.set_ylabel("% of the GPU")
    ax.legend()
    ax.set_title("Compute caps: effective cap vs achieved share (steady window)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("--markdown")
    ap.add_argument("--json")
    ap.add_argument("--plots")
    ap.add_argument("--raw", nargs="*", default=[])
    args = ap.parse_args()
    metrics, machine = load(args.results)
    table = markdown(metrics, machine or {})
    if args.markdown:
        Path(args.markdown).write_text(table)
    if args.json:
        Path(args.json).write_text(json.dumps(programs_json(metrics), indent=1) + "\n")
    if args.plots:
        os.makedirs(args.plots, exist_ok=True)
        try:
            cap_plot(metrics, os.path.join(args.plots, "caps.png"))
            for raw in args.raw:
                for name, pattern, title in (
                        ("notfit", "trace0.jsonl", "Two jobs that do not fit (16Gi virtual capacity): turns with swap"),
                        ("pair_fit", "trace-exclusive.jsonl", "Two compute-bound jobs, mode exclusive"),
                        ("pair_fit", "trace-auto.jsonl", "Two compute-bound jobs, mode auto"),
                        ("idle3", "trace-exclusive.jsonl", "Three idle-ish jobs, mode exclusive"),
                        ("handoff", "trace0.jsonl", "Hand-off: exclusive, 0.25 s quantum"),
                        ("caps", "trace.jsonl", "Capped jobs")):
                    f = Path(raw) / name / pattern
                    if f.exists():
                        schedule_plot([f], os.path.join(args.plots, f"schedule-{name}-{pattern.split('.')[0]}.png"), title)
        except ImportError as e:
            print(f"report: no plots ({e})", file=sys.stderr)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
