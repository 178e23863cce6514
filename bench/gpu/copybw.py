"""Native copy bandwidth between device memory and pinned host memory (PyTorch), the yardstick of
the library's swap bandwidth: --gib of device tensors copied to pinned host tensors and back,
--repeats times, each direction timed on its own, then both at once (the GB/s each way while
the other runs). Prints one JSON object: the best and median
GB/s (1e9 bytes/s) each way, and how long pinning the host memory took."""
import argparse
import json
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--chunks", type=int, default=3, help="tensors the bytes are split into")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import torch

    n = int(args.gib * (1 << 30) / 4 / args.chunks)
    device = [torch.full((n,), 1.5, device="cuda") for _ in range(args.chunks)]
    t0 = time.monotonic()
    host = [torch.empty(n, pin_memory=True) for _ in range(args.chunks)]
    pin_s = time.monotonic() - t0
    stream = torch.cuda.Stream()
    bytes_moved = 4 * n * args.chunks
    rates = {"d2h": [], "h2d": []}
    for _ in range(args.repeats):
        for way in ("d2h", "h2d"):
            torch.cuda.synchronize()
            t = time.monotonic()
            with torch.cuda.stream(stream):
                for d, h in zip(device, host):
                    (h.copy_(d, non_blocking=True) if way == "d2h" else d.copy_(h, non_blocking=True))
            stream.synchronize()
            rates[way].append(bytes_moved / (time.monotonic() - t) / 1e9)
    # Both ways at once, as a hand-off that overlaps one job's swap-out with the next one's
    # swap-in moves them: chunk 0 out on one stream while chunk 1 comes in on another.
    duplex = []
    if args.chunks >= 2:
        back = torch.cuda.Stream()
        for _ in range(args.repeats):
            torch.cuda.synchronize()
            t = time.monotonic()
            with torch.cuda.stream(stream):
                host[0].copy_(device[0], non_blocking=True)
            with torch.cuda.stream(back):
                device[1].copy_(host[1], non_blocking=True)
            stream.synchronize()
            back.synchronize()
            duplex.append(4 * n / (time.monotonic() - t) / 1e9)
    if duplex:
        rates["duplex_each_way"] = duplex
    ok = bool(torch.all(device[0] == 1.5).item())
    out = {"result": "ok" if ok else "wrong-result", "bytes": bytes_moved, "pin_s": pin_s}
    for way, r in rates.items():
        r.sort()
        out[f"{way}_gbps_best"] = r[-1]
        out[f"{way}_gbps_median"] = r[len(r) // 2]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
