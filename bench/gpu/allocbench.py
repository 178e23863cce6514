"""Cost of an allocation and its free through the driver API (cuMemAlloc_v2 + cuMemFree_v2 by
ctypes on the primary context of GPU 0), per size: natively, or under whatever LD_PRELOAD and
NVSHARE_MEMORY_MODE say. Prints one JSON object: microseconds per allocate+free pair, by size in
bytes, and "result"."""
import ctypes
import json
import time

SIZES = (4096, 2 << 20, 64 << 20, 1 << 30)


def main() -> int:
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    if cuda.cuInit(0) != 0 or cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) != 0 \
            or cuda.cuCtxSetCurrent(ctx) != 0:
        print(json.dumps({"result": "no-gpu"}))
        return 1
    cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    out = {"result": "ok", "us_per_pair": {}}
    for size in SIZES:
        p = ctypes.c_uint64()
        n = 200 if size < (1 << 30) else 20
        start = time.monotonic()
        for _ in range(n):
            if cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)) != 0 \
                    or cuda.cuMemFree_v2(p.value) != 0:
                out["result"] = f"failed at {size} bytes"
                break
        out["us_per_pair"][str(size)] = (time.monotonic() - start) / n * 1e6
    print(json.dumps(out))
    return 0 if out["result"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
