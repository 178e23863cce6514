"""A PyTorch workload for the real-GPU suite: prints one JSON object on stdout.

Modes:
  loop      allocate --gib GiB as three fp32 tensors and run `z = x + y` for --iters iterations
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
        for _ in range(args.iters):
            c = a @ b
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
    t2 = time.monotonic()
    out.update(setup_s=t1 - t0, loop_s=t2 - t1, wall_s=t2 - t0, iters=args.iters,
               result="ok" if ok else "wrong-result")
    print(json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
