import ctypes, ctypes.util, time, json
import torch
torch.zeros(1, device="cuda")
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
cuda.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
N = 4 << 30
d = torch.ones(N // 4, device="cuda")
res = {}
def timed(name, fn):
    torch.cuda.synchronize(); s = time.monotonic(); r = fn(); torch.cuda.synchronize()
    res[name] = round(N / (time.monotonic() - s) / 1e9, 2); return r
for huge in (0, 1):
    a = libc.mmap(None, N, 3, 0x22, -1, 0)
    if huge: libc.madvise(a, N, 14)
    timed(f"d2h_fresh_pageable_huge{huge}", lambda: cuda.cuMemcpyDtoH_v2(a, d.data_ptr(), N))
    timed(f"d2h_again_pageable_huge{huge}", lambda: cuda.cuMemcpyDtoH_v2(a, d.data_ptr(), N))
    timed(f"register_touched_huge{huge}", lambda: cuda.cuMemHostRegister_v2(a, N, 1))
    timed(f"d2h_registered_huge{huge}", lambda: cuda.cuMemcpyDtoH_v2(a, d.data_ptr(), N))
    timed(f"h2d_registered_huge{huge}", lambda: cuda.cuMemcpyHtoD_v2(d.data_ptr(), a, N))
b = libc.mmap(None, N, 3, 0x22, -1, 0); libc.madvise(b, N, 14)
cuda.cuMemcpyDtoH_v2(b, d.data_ptr(), N)
timed("h2d_pageable_huge", lambda: cuda.cuMemcpyHtoD_v2(d.data_ptr(), b, N))
print(json.dumps(res))
