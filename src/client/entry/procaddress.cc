// cuGetProcAddress and cuGetProcAddress_v2: how the CUDA 11.3+ runtimes (and PyTorch, JAX, CuPy)
// take their whole driver table.
//
// The real driver answers first: it alone knows what (name, cudaVersion, flags) means, e.g.
// cuMemAlloc@3020 is cuMemAlloc_v2, cuCtxCreate@12050 is cuCtxCreate_v4, flags 2 (per-thread
// default stream) picks the _ptsz/_ptds form. Then the pointer it returned is mapped back: when it
// is the real address of a hooked symbol, the caller gets our wrapper of that same symbol instead
// (hook_for_real_address). So versions and flags never have to be re-implemented here, and a
// request can only land in the wrapper of the exact function the driver chose. On driver 580
// (CUDA 13.0) every request PyTorch, JAX and CuPy make returned an exported symbol's address, so
// the map covers them all (tests/client/data/cuda13-driver-requests.tsv).
//
// A hooked base name whose answer is not one of our symbols (a form we do not hook, like the 32-bit
// cuMemAlloc@2000, or a driver that returns unexported addresses) is logged once as an escape.
// With NVSHARE_ENABLE=0 the driver's answer is returned untouched.
#include <atomic>
#include <cstring>

#include "client/cuda/device_state.h"
#include "client/hooks/hook_table.h"
#include "client/hooks/impl.h"
#include "common/log.h"

namespace nvshare::client::hooks {
namespace {

std::atomic<bool> g_escape_warned[kHookCount] = {};

void warn_if_escaped(const char* symbol, int version, cuuint64_t flags, const void* address) {
  for (std::size_t i = 0; i < kHookCount; ++i) {
    if (std::strcmp(kHooks[i].base, symbol) != 0) continue;
    if (!g_escape_warned[i].exchange(true)) {
      NVSHARE_WARN(
          "cuGetProcAddress(%s, %d, flags %llu) returned %p, not a hooked entry point: "
          "calls through it are not intercepted",
          symbol, version, static_cast<unsigned long long>(flags), address);
    }
    return;
  }
}

void redirect(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  if (pfn == nullptr || *pfn == nullptr || symbol == nullptr) return;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  if (std::optional<HookId> id = hook_for_real_address(*pfn, per_thread)) {
    *pfn = wrapper_address(*id);
    return;
  }
  warn_if_escaped(symbol, version, flags, *pfn);
}

}  // namespace

namespace impl {

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  auto fn = real<HookId::cuGetProcAddress>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = fn(symbol, pfn, cudaVersion, flags);
  if (rc == CUDA_SUCCESS) redirect(symbol, pfn, cudaVersion, flags);
  return rc;
}

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
  auto fn = real<HookId::cuGetProcAddress_v2>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = fn(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (rc == CUDA_SUCCESS) redirect(symbol, pfn, cudaVersion, flags);
  return rc;
}

}  // namespace impl
}  // namespace nvshare::client::hooks
