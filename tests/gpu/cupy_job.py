"""A CuPy workload for the real-GPU suite: elementwise loop with a checked result, JSON on stdout."""
import argparse
import json
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    import cupy as cp

    t0 = time.monotonic()
    free, total = cp.cuda.runtime.memGetInfo()
    n = int(args.gib * (1 << 30) // 12)
    x = cp.full((n,), 1.5, dtype=cp.float32)
    y = cp.full((n,), 2.25, dtype=cp.float32)
    z = cp.empty_like(x)
    cp.cuda.Device(0).synchronize()
    t1 = time.monotonic()
    for _ in range(args.iters):
        cp.add(x, y, out=z)
    cp.cuda.Device(0).synchronize()
    t2 = time.monotonic()
    ok = bool((z[:1024] == 3.75).all()) and bool((z[-1024:] == 3.75).all())
    print(json.dumps({"mode": "cupy", "cupy": cp.__version__, "mem_free": free, "mem_total": total,
                      "setup_s": t1 - t0, "loop_s": t2 - t1, "wall_s": t2 - t0,
                      "result": "ok" if ok else "wrong-result"}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
