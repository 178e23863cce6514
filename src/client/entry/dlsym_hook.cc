// The exported dlsym: frameworks look driver functions up on a libcuda handle themselves (PyTorch
// for 93 names, JAX for 147, CuPy for 43 on CUDA 13), and NVML bindings on a libnvidia-ml handle.
//
// Only hooked names are ever answered differently, and only when the answer would have been the
// driver's (or NVML's) own function:
//  - RTLD_DEFAULT / RTLD_NEXT: our wrapper (with RTLD_DEFAULT that is what the lookup finds anyway,
//    since we are loaded first; with RTLD_NEXT a caller looking past itself reaches the driver
//    through us).
//  - any other handle: the real lookup runs; if it found the real function of that hooked name (or
//    our wrapper), the caller gets our wrapper; a same-named symbol of some other library is
//    returned as found.
// Every other name goes to glibc's dlsym by a tail call, so glibc still sees the caller's return
// address: RTLD_NEXT stays relative to the caller, not to this library. glibc's dlsym is found
// with dlvsym (GLIBC_2.34 where dlsym moved into libc, else GLIBC_2.2.5 on x86_64 / GLIBC_2.17 on
// aarch64).
//
// That path runs before anything is initialized: a sanitizer runtime looks its interceptors up
// with dlsym while it starts, before its shadow memory exists and before any constructor of ours.
// So the exported function and what it calls for a name that is not hooked (the name test, the
// real dlsym) are built without sanitizer instrumentation and touch only constant-initialized
// data (NVSHARE_EARLY_SAFE); hooked names, which nobody looks up that early, take the ordinary
// path.
#include <dlfcn.h>

#include <cstring>

#include "client/cuda/device_state.h"
#include "client/hooks/hook_table.h"

namespace nvshare::client::hooks {
namespace {

NVSHARE_EARLY_SAFE bool may_be_hooked(const char* name) {
  return name != nullptr &&
         ((name[0] == 'c' && name[1] == 'u') ||
          (name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l'));
}

void* resolve_hooked(void* handle, const char* name, HookId id) noexcept {
  DlsymFn lookup = real_dlsym();
  try {
    if (!cuda::library_enabled()) return lookup != nullptr ? lookup(handle, name) : nullptr;
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT) return wrapper_address(id);
    void* found = lookup != nullptr ? lookup(handle, name) : nullptr;
    if (found == nullptr || found == wrapper_address(id)) return found;
    return found == real_address(id) ? wrapper_address(id) : found;
  } catch (...) {
    return lookup != nullptr ? lookup(handle, name) : nullptr;
  }
}

// Answers a hooked name; false when `name` is not one (the caller then asks glibc).
bool answer_hooked(void* handle, const char* name, void** answer) noexcept {
  const std::optional<HookId> id = find_hook(name);
  if (!id) return false;
  *answer = resolve_hooked(handle, name, *id);
  return true;
}

// The ordinary path for cu* and nvml* names; never inlined into the early-safe caller.
__attribute__((noinline)) void* lookup_maybe_hooked(void* handle, const char* name,
                                                    bool* answered) noexcept {
  void* answer = nullptr;
  *answered = answer_hooked(handle, name, &answer);
  return answer;
}

}  // namespace
}  // namespace nvshare::client::hooks

// Defined under another C++ name and exported as "dlsym" by its assembler label: glibc's
// declaration carries nonnull and noexcept attributes that would let the compiler drop our checks
// and would forbid the tail call below.
extern "C" void* nvshare_exported_dlsym(void* handle, const char* name) __asm__("dlsym");

extern "C" __attribute__((visibility("default"))) NVSHARE_EARLY_SAFE void* nvshare_exported_dlsym(
    void* handle, const char* name) {
  namespace h = ::nvshare::client::hooks;
  if (h::may_be_hooked(name)) {
    bool answered = false;
    void* answer = h::lookup_maybe_hooked(handle, name, &answered);
    if (answered) return answer;
  }
  const h::DlsymFn real = h::real_dlsym();
  if (real == nullptr) return nullptr;
#if defined(__clang__) && __has_cpp_attribute(clang::musttail)
  [[clang::musttail]] return real(handle, name);
#else
  return real(handle, name);  // GCC turns this into a sibling call at -O2
#endif
}
