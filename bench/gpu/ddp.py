#!/usr/bin/env python3
"""One rank of a PyTorch DistributedDataParallel run over NCCL, for bench.py's `ddp` scenario.

    RANK=r WORLD_SIZE=n MASTER_ADDR=127.0.0.1 MASTER_PORT=p python3 ddp.py --steps N [--seed S]

Rank r trains on GPU r: an MLP (8 layers of 4096, GELU) on synthetic regression data drawn from
the seed and the rank, SGD, TF32 off so runs at the same seed compute the same numbers. Prints one
JSON line: the loss averaged over the ranks at every step (an all-reduce), the time of the steps
after the first 10 (warm-up), what mem_get_info reported and the result.
"""
import argparse
import json
import os
import sys
import time

from start_barrier import wait_for_go


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--ready", default="")
    ap.add_argument("--go", default="")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    t_start = time.monotonic()
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    torch.manual_seed(args.seed)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[rank])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator(device=device).manual_seed(args.seed * 1000 + rank)
    teacher = torch.randn(args.width, 1, device=device, generator=torch.Generator(device=device).manual_seed(args.seed))
    free, total = torch.cuda.mem_get_info(device)

    def step():
        x = torch.randn(args.batch, args.width, device=device, generator=g)
        y = torch.tanh(x @ teacher / args.width ** 0.5)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        return mean / world

    step()
    torch.cuda.synchronize(device)
    wait_for_go(args.ready, args.go)
    dist.barrier()
    losses = []
    t1 = time.monotonic()
    t_warm = None
    # When each step was submitted: the library keeps at most its drain bound queued, so a step is
    # submitted within that of the GPU running it (no synchronization per step).
    stamps = []
    for i in range(args.steps):
        losses.append(step())
        stamps.append(time.monotonic())
        if i == 9:
            torch.cuda.synchronize(device)
            t_warm = time.monotonic()
    torch.cuda.synchronize(device)
    t2 = time.monotonic()
    values = [float(v) for v in torch.stack(losses).cpu()]
    ok = all(v == v for v in values) and values[-1] < values[0]
    out = {"rank": rank, "tag": args.tag, "pid": os.getpid(), "torch": torch.__version__,
           "mem_free": free, "mem_total": total, "losses": values, "start": t_start,
           "loop_start": t1, "loop_end": t2, "loop_s": t2 - t1,
           "steady_s": t2 - t_warm if t_warm else None,
           "steady_rate": (args.steps - 10) / (t2 - t_warm) if t_warm and t2 > t_warm else None,
           # The second half of the steps: past a capped process's first burst (its bucket's
           # depth), the rate its cap gives it.
           "late_rate": ((args.steps - args.steps // 2) / (t2 - stamps[args.steps // 2 - 1])
                         if args.steps >= 2 and t2 > stamps[args.steps // 2 - 1] else None),
           "result": "ok" if ok else "loss-did-not-fall"}
    dist.destroy_process_group()
    print(json.dumps(out), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
