// The exported wrappers: one extern "C" function per row of hook_list.def, with the driver's exact
// name and signature (so direct linking, LD_PRELOAD and /etc/ld.so.preload all land here), and the
// same functions the dlsym and cuGetProcAddress hooks hand out.
//
//  - NVSHARE_SUBMIT rows: the gate (cuda/submit.h) around the real call.
//  - NVSHARE_HOOK / NVSHARE_NVML rows: hooks::impl::<name> (hand-written by family).
//  - NVSHARE_ENABLE=0: straight to the real function.
// Every body runs inside guarded(): no C++ exception crosses the C ABI. A function the loaded
// driver does not have (an older driver) answers CUDA_ERROR_NOT_FOUND, as the driver's own lookup
// would.
#include <cxxabi.h>

#include <new>

#include "client/cuda/submit.h"
#include "client/hooks/hook_table.h"
#include "client/hooks/impl.h"

namespace nvshare::client::hooks {
namespace {

template <typename Body>
CUresult guarded(Body&& body) {
  try {
    return body();
  } catch (abi::__forced_unwind&) {
    throw;  // thread cancellation must unwind the caller too
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

template <typename Body>
nvmlReturn_t guarded_nvml(Body&& body) {
  try {
    return body();
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    return NVML_ERROR_UNKNOWN;
  }
}

}  // namespace
}  // namespace nvshare::client::hooks

#define NVSHARE_EXPORT __attribute__((visibility("default")))

#define NVSHARE_HOOK(family, name, base, version, per_thread, params, args) \
  extern "C" NVSHARE_EXPORT CUresult CUDAAPI name params {                  \
    namespace h = ::nvshare::client::hooks;                                 \
    if (!::nvshare::client::cuda::library_enabled()) {                      \
      auto real_fn = h::real<h::HookId::name>();                            \
      return real_fn != nullptr ? real_fn args : CUDA_ERROR_NOT_FOUND;      \
    }                                                                       \
    return h::guarded([&]() -> CUresult { return h::impl::name args; });    \
  }

#define NVSHARE_SUBMIT(family, name, base, version, per_thread, stream, params, args)     \
  extern "C" NVSHARE_EXPORT CUresult CUDAAPI name params {                                \
    namespace h = ::nvshare::client::hooks;                                               \
    auto real_fn = h::real<h::HookId::name>();                                            \
    if (real_fn == nullptr) return CUDA_ERROR_NOT_FOUND;                                  \
    return h::guarded([&]() -> CUresult {                                                 \
      return ::nvshare::client::cuda::submit(stream, per_thread != 0,                     \
                                             [&]() -> CUresult { return real_fn args; }); \
    });                                                                                   \
  }

#define NVSHARE_NVML(name, params, args)                                          \
  extern "C" NVSHARE_EXPORT nvmlReturn_t name params {                            \
    namespace h = ::nvshare::client::hooks;                                       \
    if (!::nvshare::client::cuda::library_enabled()) {                            \
      auto real_fn = h::real<h::HookId::name>();                                  \
      return real_fn != nullptr ? real_fn args : NVML_ERROR_FUNCTION_NOT_FOUND;   \
    }                                                                             \
    return h::guarded_nvml([&]() -> nvmlReturn_t { return h::impl::name args; }); \
  }

#include "client/hooks/hook_list.def"
