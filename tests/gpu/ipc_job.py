"""CUDA IPC through torch.multiprocessing, for the real-GPU suite: prints one JSON object on stdout.

The parent fills a CUDA tensor (--mib MiB of float32) and hands it, with the IPC handle of an
interprocess CUDA event, to a child process (start method spawn) over a queue. The child checks
every value it received against what the parent wrote, multiplies the tensor by 3 in place (the
parent's memory), records the shared event and reports. The parent waits on the event and checks
that it sees the child's values. "result" is "ok" only when both checks hold.

--peer-device D: the child reads the tensor into GPU D and computes there, writing back across
GPUs (the memory stays on the parent's GPU 0): IPC between processes on different GPUs.
"""
import argparse
import json
import sys
import time


def child(inbox, outbox, peer_device):
    import torch

    try:
        shared, event_handle, n = inbox.get()
        where = torch.device(f"cuda:{peer_device}") if peer_device >= 0 else shared.device
        expected = torch.arange(n, dtype=torch.float32, device=where) * 2
        local = shared.to(where)
        read_ok = bool(torch.equal(local, expected))
        shared.copy_(local * 3)
        event = torch.cuda.Event.from_ipc_handle(shared.device, event_handle)
        event.record()
        torch.cuda.synchronize()
        outbox.put({"read_ok": read_ok})
        del shared
        inbox.get()  # the parent is done with the tensor: release it only now
    except Exception as e:  # reported, not raised: the parent prints the one JSON object
        outbox.put({"error": f"{type(e).__name__}: {e}"})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--peer-device", type=int, default=-1)
    args = ap.parse_args()

    import torch
    import torch.multiprocessing as mp

    out = {"torch": torch.__version__, "mib": args.mib, "peer_device": args.peer_device}
    t0 = time.monotonic()
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=child, args=(inbox, outbox, args.peer_device))
    worker.start()
    try:
        n = args.mib * (1 << 20) // 4
        tensor = torch.arange(n, dtype=torch.float32, device="cuda:0") * 2
        event = torch.cuda.Event(interprocess=True)
        torch.cuda.synchronize()
        inbox.put((tensor, event.ipc_handle(), n))
        answer = outbox.get(timeout=120)
        out.update(answer)
        event.synchronize()
        expected = torch.arange(n, dtype=torch.float32, device="cuda:0") * 6
        out["write_ok"] = bool(torch.equal(tensor, expected))
        inbox.put("done")
        worker.join(timeout=60)
        out["child_exit"] = worker.exitcode
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
        worker.kill()
    out["elapsed_s"] = time.monotonic() - t0
    good = out.get("read_ok") and out.get("write_ok") and out.get("child_exit") == 0
    out["result"] = "ok" if good and "error" not in out else "error"
    print(json.dumps(out))
    return 0 if out["result"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
