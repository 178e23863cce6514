#!/usr/bin/env python3
"""Shares of a GPU from progress logs of jobs that ran together, over their common window.

shares.py ALONE_RATE NAME=LOG... prints one line per job: NAME<TAB>share percent<TAB>window s.
Progress lines are JSON objects with "progress" and "done_s" (monotonic seconds), and "iters" (work
done so far) where the job reports it; a line without "iters" counts one unit of work. The window
starts 5 s after the last job's first progress line and ends at the first job's last one; a job's
share is the work it completed inside the window over what it completes alone in that time
(ALONE_RATE units per second, measured alone).
"""
import json
import sys


def progress(path):
    out = []
    done = 0
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith('{"progress"'):
                continue
            p = json.loads(line)
            done = p["iters"] if "iters" in p else done + 1
            out.append((p["done_s"], done))
    return out


def work_until(points, t):
    done = 0
    for at, work in points:
        if at > t:
            break
        done = work
    return done


def main():
    rate = float(sys.argv[1])
    logs = {}
    for arg in sys.argv[2:]:
        name, path = arg.split("=", 1)
        logs[name] = progress(path)
    if any(not p for p in logs.values()) or rate <= 0:
        for name in logs:
            print(f"{name}\t\t0")
        return
    begin = max(p[0][0] for p in logs.values()) + 5.0
    end = min(p[-1][0] for p in logs.values())
    for name, p in logs.items():
        work = work_until(p, end) - work_until(p, begin)
        share = 100.0 * work / (rate * (end - begin)) if end > begin else 0.0
        print(f"{name}\t{share:.1f}\t{end - begin:.1f}")


if __name__ == "__main__":
    main()
