"""One benchmark job (PyTorch): prints one JSON object on stdout.

Kinds:
  membound  z = x + y on three 28000x28000 fp32 tensors (about 9.4 GB): memory-bandwidth bound
  matmul    c = a @ b on 8192x8192 fp32 tensors: compute bound (--chain N: N of them an iteration)
  idle      a short kernel (a 1024x1024 matmul) then --host-ms of host work (a sleep) per iteration
  graph     a CUDA graph of --graph-kernels matmul kernels (as matmul), one replay per iteration
  serve     a latency-sensitive service: each step is the forward pass of an 8-layer MLP (4096 wide,
            batch --batch, GELU) then a synchronize; steps back to back (or --think-ms apart, or in
            bursts of --burst-ms with --pause-ms between); reports p50/p99 step latency

Work is either a number of iterations (--iters) or a wall-time window (--seconds: as many iterations
as fit; the rate is what a capped job achieves). --devices runs the loop on several GPUs from one
process (each iteration launches on every device, then waits for all).

Start barrier: with --ready FILE --go FILE the job allocates and warms up, writes FILE, and starts
its loop only once the go file exists, so jobs started together begin their loops together.

Times are time.monotonic() (CLOCK_MONOTONIC), comparable with other processes and with the library's
trace. The job also reports the interpreter's garbage collections of GC_REPORT_MS or longer inside its
loop (gc_pauses: start, milliseconds, generation): the host stalls a bounded queue of GPU work cannot
hide. The job checks its own numbers, so a run that computes garbage reports result "wrong-result".
"""
import argparse
import gc
import json
import os
import sys
import time

from start_barrier import wait_for_go


GC_REPORT_MS = 2.0  # collections at least this long are listed in gc_pauses


class GcPauses:
    """Records the interpreter's collections of GC_REPORT_MS or longer (gc.callbacks)."""

    def __init__(self):
        self.pauses = []
        self._began = None
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        now = time.monotonic()
        if phase == "start":
            self._began = now
        elif self._began is not None:
            ms = (now - self._began) * 1000.0
            if ms >= GC_REPORT_MS:
                self.pauses.append([round(self._began, 6), round(ms, 3), info.get("generation")])
            self._began = None

    def stop(self):
        gc.callbacks.remove(self._callback)
        return self.pauses


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["membound", "matmul", "idle", "serve", "graph"], required=True)
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=0.0)
    ap.add_argument("--devices", default="0", help="comma-separated CUDA device indexes")
    ap.add_argument("--side", type=int, default=0, help="matrix side (default per kind)")
    ap.add_argument("--host-ms", type=float, default=20.0, help="idle: host work per iteration")
    ap.add_argument("--batch", type=int, default=256, help="serve: rows per forward pass")
    ap.add_argument("--think-ms", type=float, default=0.0,
                    help="serve: host time between steps (a service waiting for requests)")
    ap.add_argument("--burst-ms", type=float, default=0.0,
                    help="serve: steps for this long, then --pause-ms without requests, and again")
    ap.add_argument("--pause-ms", type=float, default=0.0)
    ap.add_argument("--graph-kernels", type=int, default=10, help="graph: kernels per graph")
    ap.add_argument("--chain", type=int, default=1,
                    help="matmul: kernels per iteration (queued back to back, one wait at its end)")
    ap.add_argument("--ready", default="")
    ap.add_argument("--go", default="")
    ap.add_argument("--skip-s", type=float, default=0.0,
                    help="--seconds: also report the rate over the window after this many seconds")
    ap.add_argument("--tag", default="")
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    t_start = time.monotonic()
    import torch

    devices = [torch.device(f"cuda:{int(d)}") for d in args.devices.split(",")]
    out = {"kind": args.kind, "tag": args.tag, "pid": os.getpid(), "devices": args.devices,
           "torch": torch.__version__, "cuda": torch.version.cuda}
    free, total = torch.cuda.mem_get_info(devices[0])
    out.update(mem_free=free, mem_total=total)

    state = []
    for dev in devices:
        if args.kind == "membound":
            side = args.side or 28000
            x = torch.full((side, side), 1.5, device=dev)
            y = torch.full((side, side), 2.25, device=dev)
            z = torch.empty_like(x)
            state.append((x, y, z))
        elif args.kind == "serve":
            side = args.side or 4096
            g = torch.Generator(device=dev).manual_seed(7)
            layers = [torch.randn(side, side, device=dev, generator=g) / side ** 0.5 for _ in range(8)]
            x = torch.randn(args.batch, side, device=dev, generator=g)
            state.append((x, layers))
        else:
            side = args.side or (8192 if args.kind in ("matmul", "graph") else 1024)
            g = torch.Generator(device=dev).manual_seed(7)
            a = torch.randn(side, side, device=dev, generator=g) / side ** 0.5
            b = torch.randn(side, side, device=dev, generator=g)
            c = torch.empty_like(a)
            state.append((a, b, c))
    out["side"] = side
    out["chain"] = args.chain

    def forward(x, layers):
        for w in layers:
            x = torch.nn.functional.gelu(x @ w)
        return x

    def step():
        for tensors in state:
            if args.kind == "serve":
                tensors[0].copy_(forward(*tensors) * 0.5 + tensors[0] * 0.5)
            elif args.kind == "membound":
                torch.add(tensors[0], tensors[1], out=tensors[2])
            else:
                for _ in range(args.chain if args.kind == "matmul" else 1):
                    torch.matmul(tensors[0], tensors[1], out=tensors[2])

    def sync():
        for dev in devices:
            torch.cuda.synchronize(dev)

    step()  # warm up (cuBLAS handles, kernels loaded)
    sync()
    if args.kind == "graph":
        # Capture the matmul step --graph-kernels times into one graph; an iteration replays it.
        plain_step = step
        side_stream = torch.cuda.Stream(devices[0])
        side_stream.wait_stream(torch.cuda.current_stream(devices[0]))
        with torch.cuda.stream(side_stream):
            plain_step()
        torch.cuda.current_stream(devices[0]).wait_stream(side_stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(args.graph_kernels):
                plain_step()
        out["graph_kernels"] = args.graph_kernels

        def step():
            graph.replay()

        step()
        sync()
    out["setup_s"] = time.monotonic() - t_start
    wait_for_go(args.ready, args.go)

    host_s = args.host_ms / 1000.0
    # Wait for completed work every `batch` iterations in a timed window, so the count is of
    # finished iterations without a host-device round trip per kernel.
    batch = 1 if args.kind != "membound" else 8
    iters = 0
    step_ms = []  # serve: each step's latency
    step_at = []  # serve: when each step began, seconds into the loop
    done_at = []  # --seconds: when each synchronized batch of iterations was done, into the loop
    skip_mark = None  # (time, iterations) at the first completion after --skip-s
    gc_pauses = GcPauses()
    t1 = time.monotonic()
    burst_from = t1
    deadline = t1 + args.seconds if args.seconds > 0 else None
    while True:
        if deadline is None and iters >= args.iters:
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
        t_step = time.monotonic()
        step()
        iters += 1
        if args.kind == "serve":
            sync()
            step_ms.append((time.monotonic() - t_step) * 1000.0)
            step_at.append(t_step - t1)
            if args.think_ms > 0:
                time.sleep(args.think_ms / 1000.0)
            if args.burst_ms > 0 and (time.monotonic() - burst_from) * 1000.0 >= args.burst_ms:
                time.sleep(args.pause_ms / 1000.0)
                burst_from = time.monotonic()
        elif args.kind == "idle":
            sync()
            time.sleep(host_s)
        elif deadline is not None and iters % batch == 0:
            sync()
            done_at.append((time.monotonic() - t1, iters))
        if skip_mark is None and args.skip_s > 0 and deadline is not None:
            now = time.monotonic()
            if now - t1 >= args.skip_s and iters % batch == 0:
                skip_mark = (now, iters)
    sync()
    t2 = time.monotonic()
    out["gc_pauses"] = gc_pauses.stop()
    if skip_mark is not None and t2 > skip_mark[0]:
        out.update(steady_t0=skip_mark[0], steady_t1=t2,  # CLOCK_MONOTONIC, as the grant trace
                   steady_s=t2 - skip_mark[0], steady_iters=iters - skip_mark[1],
                   steady_rate=(iters - skip_mark[1]) / (t2 - skip_mark[0]))

    if step_ms:
        ordered = sorted(step_ms)
        out.update(p50_ms=ordered[len(ordered) // 2],
                   p99_ms=ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))])
        # Each second's p99 and step count: a loss at start-up and a steady one look alike in the
        # totals.
        by_s = {}
        for at, ms in zip(step_at, step_ms):
            by_s.setdefault(int(at), []).append(ms)
        out["p99_by_s_ms"] = [round(sorted(v)[min(len(v) - 1, int(0.99 * len(v)))], 3)
                              for _, v in sorted(by_s.items())]
        out["steps_by_s"] = [len(v) for _, v in sorted(by_s.items())]

    if done_at:
        # Iterations finished in each whole second of the loop (the last partial second left out).
        per_s, last = [], 0
        for at, n in done_at:
            while len(per_s) <= int(at):
                per_s.append(0)
            per_s[int(at)] += n - last
            last = n
        out["iters_by_s"] = per_s[:int(done_at[-1][0])] if len(per_s) > 1 else per_s
    out["reserved_bytes"] = sum(torch.cuda.memory_reserved(dev) for dev in devices)

    ok = True
    for tensors in state:
        if args.kind == "serve":
            ok = ok and bool(torch.isfinite(tensors[0]).all())
        elif args.kind == "membound":
            ok = ok and bool((tensors[2][:2, :64] == 3.75).all()) and bool(
                (tensors[2][-2:, -64:] == 3.75).all())
        else:
            ref = tensors[0][:4].double() @ tensors[1][:, :4].double()
            ok = ok and bool(torch.allclose(tensors[2][:4, :4].double(), ref, rtol=1e-2, atol=1e-2))
    out.update(loop_start=t1, loop_end=t2, loop_s=t2 - t1, iters=iters,
               rate=iters / (t2 - t1) if t2 > t1 else 0.0, start=t_start,
               result="ok" if ok else "wrong-result")
    print(json.dumps(out), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
