"""The start barrier bench.py gives its jobs: a job writes its `ready` file once set up, then waits
for the `go` file, which bench.py writes when every job of a run is ready."""
import os
import time


def wait_for_go(ready: str, go: str) -> None:
    if ready:
        with open(ready, "w") as f:
            f.write(str(os.getpid()))
    if go:
        while not os.path.exists(go):
            time.sleep(0.001)
