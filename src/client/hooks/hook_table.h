// The hook table: every intercepted entry point, generated from hook_list.def, and the real
// functions behind them.
//
// What it provides:
//  - HookId (one enumerator per row, named after the symbol) and kHooks (name, cuGetProcAddress
//  base
//    name and version, per-thread flag, family) in the list's order.
//  - find_hook(): symbol name -> HookId (binary search over a table sorted at compile time), for
//    the dlsym hook.
//  - wrapper_address(): our exported function for a HookId.
//  - real<id>(): the driver's (or NVML's) function for a HookId, typed exactly as cuda.h declares
//    it. The first call loads libcuda.so.1 (or libnvidia-ml.so.1) with dlopen and resolves every
//    hooked name at once; later calls cost one atomic load. Null when the library or the symbol is
//    missing (an older driver): callers return CUDA_ERROR_NOT_FOUND then.
//  - hook_for_real_address(): the reverse map the cuGetProcAddress hook uses: given the pointer the
//    real driver returned, which hooked entry point it is.
//  - driver(): the unhooked driver functions the library calls itself (context stack, events,
//    streams, advice), resolved with the rest.
//  - real_dlsym(): glibc's dlsym, found with dlvsym so that our exported dlsym is never called by
//    us; safe to call before anything is initialized.
//
// Contract: loading happens at most once per library (also across fork: the child keeps the
// parent's table, which stays valid). Nothing here calls a hooked function, so the library never
// re-enters itself. Thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "client/hooks/cuda_api.h"

namespace nvshare::client::hooks {

enum class Family : std::uint8_t {
  kInit,
  kContext,
  kMemory,
  kMemInfo,
  kCapture,
  kLaunch,
  kCopy,
  kMemset,
  kPrefetch,
  kNvml,
};
const char* to_string(Family family);

enum class HookId : std::uint16_t {
#define NVSHARE_HOOK(family, name, ...) name,
#define NVSHARE_SUBMIT(family, name, ...) name,
#define NVSHARE_NVML(name, ...) name,
#include "client/hooks/hook_list.def"
#undef NVSHARE_HOOK
#undef NVSHARE_SUBMIT
#undef NVSHARE_NVML
  kCount
};
inline constexpr std::size_t kHookCount = static_cast<std::size_t>(HookId::kCount);

struct HookInfo {
  const char* name;  // the exported symbol
  const char* base;  // what cuGetProcAddress callers ask for
  int version;       // the CUDA version that introduced this form (0 for NVML)
  bool per_thread;   // the _ptsz / _ptds form
  Family family;
  bool submit;  // generated gate wrapper (launches, copies, memsets, prefetches)
};

inline constexpr HookInfo kHooks[] = {
#define NVSHARE_HOOK(family, name, base, version, per_thread, ...) \
  {#name, #base, version, per_thread != 0, Family::family, false},
#define NVSHARE_SUBMIT(family, name, base, version, per_thread, ...) \
  {#name, #base, version, per_thread != 0, Family::family, true},
#define NVSHARE_NVML(name, ...) {#name, #name, 0, false, Family::kNvml, false},
#include "client/hooks/hook_list.def"
#undef NVSHARE_HOOK
#undef NVSHARE_SUBMIT
#undef NVSHARE_NVML
};
static_assert(sizeof(kHooks) / sizeof(kHooks[0]) == kHookCount);

inline const HookInfo& info(HookId id) { return kHooks[static_cast<std::size_t>(id)]; }
inline bool is_nvml(HookId id) { return info(id).family == Family::kNvml; }

std::optional<HookId> find_hook(std::string_view name);
void* wrapper_address(HookId id);

// The exact function type of each hooked symbol, from its declaration.
template <HookId id>
struct HookType;
#define NVSHARE_HOOK(family, name, ...) \
  template <>                           \
  struct HookType<HookId::name> {       \
    using Fn = decltype(&::name);       \
  };
#define NVSHARE_SUBMIT(family, name, ...) NVSHARE_HOOK(family, name)
#define NVSHARE_NVML(name, ...) NVSHARE_HOOK(kNvml, name)
#include "client/hooks/hook_list.def"
#undef NVSHARE_HOOK
#undef NVSHARE_SUBMIT
#undef NVSHARE_NVML

struct DriverApi;

namespace detail {
// Written once by the loader (hook_table.cc) before g_cuda_ready is released and never changed
// afterwards: every gated call reads them inline, without a call into the table.
extern std::atomic<bool> g_cuda_ready;
extern void* g_real[kHookCount];
extern DriverApi g_driver;
bool load_cuda();
}  // namespace detail

// Loads libcuda.so.1 / libnvidia-ml.so.1 and resolves their hooked symbols (once). False when the
// library cannot be loaded.
inline bool ensure_cuda() {
  return detail::g_cuda_ready.load(std::memory_order_acquire) || detail::load_cuda();
}
bool ensure_nvml();
// The real function behind a hook (loading its library first); null when absent.
void* real_address(HookId id);

template <HookId id>
typename HookType<id>::Fn real() {
  using Fn = typename HookType<id>::Fn;
  if constexpr (kHooks[static_cast<std::size_t>(id)].family == Family::kNvml) {
    return reinterpret_cast<Fn>(real_address(id));
  } else {
    return ensure_cuda() ? reinterpret_cast<Fn>(detail::g_real[static_cast<std::size_t>(id)])
                         : nullptr;
  }
}

// Which hooked entry point a real driver (or NVML) function pointer is. When the driver exports one
// function under several hooked names, the one whose per-thread flag matches is preferred.
std::optional<HookId> hook_for_real_address(const void* address, bool per_thread);

// Driver functions the library calls for itself. Not hooked, so never gated or counted.
#define NVSHARE_DRIVER_FUNCTIONS(X) \
  X(cuCtxGetCurrent)                \
  X(cuCtxGetDevice)                 \
  X(cuCtxPushCurrent_v2)            \
  X(cuCtxPopCurrent_v2)             \
  X(cuCtxSynchronize)               \
  X(cuDeviceGetUuid_v2)             \
  X(cuDeviceGetUuid)                \
  X(cuDeviceGetAttribute)           \
  X(cuDevicePrimaryCtxGetState)     \
  X(cuEventCreate)                  \
  X(cuEventDestroy_v2)              \
  X(cuEventRecord)                  \
  X(cuEventQuery)                   \
  X(cuEventSynchronize)             \
  X(cuCtxRecordEvent)               \
  X(cuStreamCreate)                 \
  X(cuStreamDestroy_v2)             \
  X(cuStreamSynchronize)            \
  X(cuStreamIsCapturing)            \
  X(cuMemAdvise)                    \
  X(cuMemAdvise_v2)                 \
  X(cuMemAddressReserve)            \
  X(cuMemAddressFree)               \
  X(cuMemMap)                       \
  X(cuMemUnmap)                     \
  X(cuMemSetAccess)                 \
  X(cuMemGetAllocationGranularity)  \
  X(cuMemHostRegister_v2)           \
  X(cuMemHostUnregister)            \
  X(cuMemExportToShareableHandle)   \
  X(cuMemImportFromShareableHandle) \
  X(cuGetErrorName)

struct DriverApi {
#define NVSHARE_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
  NVSHARE_DRIVER_FUNCTIONS(NVSHARE_DRIVER_MEMBER)
#undef NVSHARE_DRIVER_MEMBER
};
// Valid (all members possibly null) once ensure_cuda() returned true.
inline const DriverApi& driver() { return detail::g_driver; }

// NVML functions the library calls for itself; valid once ensure_nvml() returned true.
struct NvmlApi {
  nvml::InitFn init = nullptr;
  nvml::ShutdownFn shutdown = nullptr;
  nvml::GetHandleByUuidFn get_handle_by_uuid = nullptr;
  nvml::GetUuidFn get_uuid = nullptr;
};
const NvmlApi& nvml_api();

// Code that may run before the process is initialized, even before a sanitizer runtime has set up
// its shadow memory (the exported dlsym's path for names we do not hook): no sanitizer
// instrumentation, and only constant-initialized data.
#define NVSHARE_EARLY_SAFE __attribute__((no_sanitize("address", "undefined")))

using DlsymFn = void* (*)(void*, const char*);
// Early-safe (NVSHARE_EARLY_SAFE).
DlsymFn real_dlsym();

// "CUDA_ERROR_OUT_OF_MEMORY" for logs (never calls a hooked function).
const char* error_name(CUresult rc);

// In a forked child: fresh loader locks (a parent thread may have held one at fork). The loaded
// table itself stays valid.
void reset_after_fork();

}  // namespace nvshare::client::hooks
