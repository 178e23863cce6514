"""A PyTorch workload for the real-GPU suite: prints one JSON object on stdout.

Modes:
  loop      allocate --gib GiB as three fp32 tensors and run `z = x + y` for --iters iterations
            (--matmul: 8192 x 8192 matmuls instead, for --iters or --seconds, with progress lines);
            --pause-s: then idle that long, holding the tensors, and check them all again (memory the
            library moved away meanwhile must come back intact)
  limit     report torch.cuda.mem_get_info(), then try to allocate --gib GiB and report whether PyTorch
            raised its out-of-memory error
The script checks its own numerical result so a run under the library that computes garbage fails.
"""
import argparse
import json
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["loop", "limit"], default="loop")
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--matmul", action="store_true", help="compute-bound matmul loop instead")
    ap.add_argument("--seconds", type=float, default=0,
                    help="matmul: run for this long instead of --iters iterations")
    ap.add_argument("--pause-s", type=float, default=0,
                    help="loop: idle this long after the loop, then check every tensor again")
    ap.add_argument("--progress-every", type=int, default=0,
                    help="matmul: synchronize every N iterations and print a progress line on "
                         "stderr: {\"progress\":i,\"done_s\":t,\"iters\":i} (monotonic time)")
    args = ap.parse_args()

    import torch

    out = {"mode": args.mode, "torch": torch.__version__, "cuda": torch.version.cuda}
    t0 = time.monotonic()
    dev = torch.device("cuda:0")
    free, total = torch.cuda.mem_get_info(dev)
    out.update(mem_free=free, mem_total=total)

    if args.mode == "limit":
        n = int(args.gib * (1 << 30) // 4)
        try:
            t = torch.empty(n, dtype=torch.float32, device=dev)
            t.fill_(1.0)
            torch.cuda.synchronize()
            out["allocated"] = True
            del t
        except torch.OutOfMemoryError as e:  # what the limit must produce
            out["allocated"] = False
            out["oom"] = str(e).splitlines()[0][:200]
        out["result"] = "ok"
        print(json.dumps(out))
        return 0

    if args.matmul:
        n = 8192
        a = torch.randn(n, n, device=dev)
        b = torch.randn(n, n, device=dev)
        torch.cuda.synchronize()
        t1 = time.monotonic()
        every = args.progress_every
        i = 0
        while (i < args.iters) if args.seconds <= 0 else (time.monotonic() - t1 < args.seconds):
            c = a @ b
            i += 1
            if every > 0 and i % every == 0:
                torch.cuda.synchronize()
                print(json.dumps({"progress": i, "done_s": time.monotonic(), "iters": i}),
                      file=sys.stderr, flush=True)
        args.iters = i
        torch.cuda.synchronize()
        ref = (a[:4].double() @ b[:, :4].double()).float()
        ok = torch.allclose(c[:4, :4], ref, rtol=1e-2, atol=1e-1)
    else:
        n = int(args.gib * (1 << 30) // 12)  # three tensors
        x = torch.full((n,), 1.5, device=dev)
        y = torch.full((n,), 2.25, device=dev)
        z = torch.empty_like(x)
        torch.cuda.synchronize()
        t1 = time.monotonic()
        for _ in range(args.iters):
            torch.add(x, y, out=z)
        torch.cuda.synchronize()
        ok = bool((z[:1024] == 3.75).all()) and bool((z[-1024:] == 3.75).all())
        if args.pause_s > 0:
            time.sleep(args.pause_s)
            t_check = time.monotonic()
            ok = ok and bool((x == 1.5).all()) and bool((y == 2.25).all()) and bool((z == 3.75).all())
            out["after_pause_check_s"] = time.monotonic() - t_check
    t2 = time.monotonic()
    out.update(setup_s=t1 - t0, loop_s=t2 - t1, wall_s=t2 - t0, iters=args.iters,
               result="ok" if ok else "wrong-result")
    print(json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
