#include "client/hooks/hook_table.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "common/log.h"

namespace nvshare::client::hooks {
namespace detail {
std::atomic<bool> g_cuda_ready{false};
void* g_real[kHookCount] = {};
DriverApi g_driver;
}  // namespace detail
namespace {

using detail::g_driver;
using detail::g_real;

struct NameEntry {
  std::string_view name;
  HookId id;
};

// Sorted by name at compile time, so the dlsym hook finds a name with a binary search and no
// start-up work.
constexpr auto kSortedNames = [] {
  std::array<NameEntry, kHookCount> entries{};
  for (std::size_t i = 0; i < kHookCount; ++i) {
    entries[i] = {kHooks[i].name, static_cast<HookId>(i)};
  }
  std::sort(entries.begin(), entries.end(),
            [](const NameEntry& a, const NameEntry& b) { return a.name < b.name; });
  return entries;
}();

// Our exported functions. The library is linked -Bsymbolic-functions, so these are our own
// definitions even when another object in the process exports the same names (libcuda itself).
void* const kWrappers[] = {
#define NVSHARE_HOOK(family, name, ...) reinterpret_cast<void*>(&::name),
#define NVSHARE_SUBMIT(family, name, ...) reinterpret_cast<void*>(&::name),
#define NVSHARE_NVML(name, ...) reinterpret_cast<void*>(&::name),
#include "client/hooks/hook_list.def"
#undef NVSHARE_HOOK
#undef NVSHARE_SUBMIT
#undef NVSHARE_NVML
};
static_assert(sizeof(kWrappers) / sizeof(kWrappers[0]) == kHookCount);

struct ReverseEntry {
  const void* address;
  HookId id;
  bool operator<(const ReverseEntry& other) const { return address < other.address; }
};

// One loaded library (libcuda or libnvidia-ml). The fields are written under `mu` before `ready`
// is released, and never change afterwards, so readers need no lock.
struct LoadState {
  std::atomic<bool> ready{false};
  // Recursive: dlopen runs the library's constructors, which may call dlsym, which may come back
  // here on the same thread.
  std::recursive_mutex mu;
  void* handle = nullptr;
  bool warned = false;
};

LoadState g_cuda;  // libcuda: its ready flag is detail::g_cuda_ready
LoadState g_nvml;
NvmlApi g_nvml_api;
std::vector<ReverseEntry> g_reverse;  // sorted; immutable once detail::g_cuda_ready

#if defined(__x86_64__)
constexpr const char* kDlsymVersions[] = {"GLIBC_2.34", "GLIBC_2.2.5"};
#elif defined(__aarch64__)
constexpr const char* kDlsymVersions[] = {"GLIBC_2.34", "GLIBC_2.17"};
#else
constexpr const char* kDlsymVersions[] = {"GLIBC_2.34"};
#endif

NVSHARE_EARLY_SAFE DlsymFn find_real_dlsym() {
  // Our exported dlsym (dlsym_hook.cc): the same symbol, bound to our definition.
  void* const ours = reinterpret_cast<void*>(&::dlsym);
  // RTLD_NEXT finds the definition after ours (glibc's, when we are preloaded); RTLD_DEFAULT covers
  // a process that linked us after libc. Plain loops: nothing here may call instrumented code.
  void* const scopes[] = {RTLD_NEXT, RTLD_DEFAULT};
  constexpr std::size_t kVersions = sizeof kDlsymVersions / sizeof kDlsymVersions[0];
  for (std::size_t s = 0; s < 2; ++s) {
    for (std::size_t v = 0; v < kVersions; ++v) {
      void* found = dlvsym(scopes[s], "dlsym", kDlsymVersions[v]);
      if (found != nullptr && found != ours) return reinterpret_cast<DlsymFn>(found);
    }
  }
  return nullptr;
}

void* resolve(void* handle, const char* name) {
  DlsymFn lookup = real_dlsym();
  return lookup != nullptr && handle != nullptr ? lookup(handle, name) : nullptr;
}

void* open_library(LoadState& state, const char* soname) {
  void* handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr && !state.warned) {
    state.warned = true;
    const char* why = dlerror();
    NVSHARE_DEBUG("cannot load %s: %s", soname, why != nullptr ? why : "unknown error");
  }
  return handle;
}

bool load_nvml() {
  std::lock_guard lock(g_nvml.mu);
  if (g_nvml.ready.load(std::memory_order_acquire)) return true;
  void* handle = open_library(g_nvml, "libnvidia-ml.so.1");
  if (handle == nullptr) return false;
  for (std::size_t i = 0; i < kHookCount; ++i) {
    if (kHooks[i].family == Family::kNvml) g_real[i] = resolve(handle, kHooks[i].name);
  }
  g_nvml_api.init = reinterpret_cast<nvml::InitFn>(resolve(handle, "nvmlInit_v2"));
  g_nvml_api.shutdown = reinterpret_cast<nvml::ShutdownFn>(resolve(handle, "nvmlShutdown"));
  g_nvml_api.get_handle_by_uuid =
      reinterpret_cast<nvml::GetHandleByUuidFn>(resolve(handle, "nvmlDeviceGetHandleByUUID"));
  g_nvml_api.get_uuid = reinterpret_cast<nvml::GetUuidFn>(resolve(handle, "nvmlDeviceGetUUID"));
  g_nvml.handle = handle;
  g_nvml.ready.store(true, std::memory_order_release);
  return true;
}

}  // namespace

const char* to_string(Family family) {
  switch (family) {
    case Family::kInit:
      return "init";
    case Family::kContext:
      return "context";
    case Family::kMemory:
      return "memory";
    case Family::kMemInfo:
      return "meminfo";
    case Family::kCapture:
      return "capture";
    case Family::kLaunch:
      return "launch";
    case Family::kCopy:
      return "copy";
    case Family::kMemset:
      return "memset";
    case Family::kPrefetch:
      return "prefetch";
    case Family::kNvml:
      return "nvml";
  }
  return "?";
}

std::optional<HookId> find_hook(std::string_view name) {
  auto it = std::lower_bound(
      kSortedNames.begin(), kSortedNames.end(), name,
      [](const NameEntry& entry, std::string_view wanted) { return entry.name < wanted; });
  if (it == kSortedNames.end() || it->name != name) return std::nullopt;
  return it->id;
}

void* wrapper_address(HookId id) { return kWrappers[static_cast<std::size_t>(id)]; }

bool detail::load_cuda() {
  std::lock_guard lock(g_cuda.mu);
  if (detail::g_cuda_ready.load(std::memory_order_acquire)) return true;
  void* handle = open_library(g_cuda, "libcuda.so.1");
  if (handle == nullptr) return false;
  std::vector<ReverseEntry> reverse;
  for (std::size_t i = 0; i < kHookCount; ++i) {
    if (kHooks[i].family == Family::kNvml) continue;
    g_real[i] = resolve(handle, kHooks[i].name);
    if (g_real[i] != nullptr) reverse.push_back({g_real[i], static_cast<HookId>(i)});
  }
  std::sort(reverse.begin(), reverse.end());
  g_reverse = std::move(reverse);
#define NVSHARE_DRIVER_RESOLVE(name) \
  g_driver.name = reinterpret_cast<decltype(g_driver.name)>(resolve(handle, #name));
  NVSHARE_DRIVER_FUNCTIONS(NVSHARE_DRIVER_RESOLVE)
#undef NVSHARE_DRIVER_RESOLVE
  g_cuda.handle = handle;
  detail::g_cuda_ready.store(true, std::memory_order_release);
  return true;
}

bool ensure_nvml() { return g_nvml.ready.load(std::memory_order_acquire) || load_nvml(); }

void* real_address(HookId id) {
  const bool loaded = is_nvml(id) ? ensure_nvml() : ensure_cuda();
  return loaded ? g_real[static_cast<std::size_t>(id)] : nullptr;
}

std::optional<HookId> hook_for_real_address(const void* address, bool per_thread) {
  if (address == nullptr || !ensure_cuda()) return std::nullopt;
  auto [first, last] =
      std::equal_range(g_reverse.begin(), g_reverse.end(), ReverseEntry{address, HookId::kCount});
  if (first == last) return std::nullopt;
  for (auto it = first; it != last; ++it) {
    if (info(it->id).per_thread == per_thread) return it->id;
  }
  return first->id;
}

const NvmlApi& nvml_api() { return g_nvml_api; }

NVSHARE_EARLY_SAFE DlsymFn real_dlsym() {
  // The builtins, not std::atomic: its member functions are not early-safe.
  static constinit DlsymFn cached = nullptr;
  DlsymFn fn = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);
  if (fn == nullptr) {
    fn = find_real_dlsym();
    __atomic_store_n(&cached, fn, __ATOMIC_RELEASE);
  }
  return fn;
}

const char* error_name(CUresult rc) {
  const char* name = nullptr;
  if (g_driver.cuGetErrorName != nullptr && g_driver.cuGetErrorName(rc, &name) == CUDA_SUCCESS &&
      name != nullptr) {
    return name;
  }
  return "CUDA_ERROR_UNKNOWN";
}

void reset_after_fork() {
  // The parent's mutexes are abandoned, not destroyed: another thread may have held them.
  new (&g_cuda.mu) std::recursive_mutex();
  new (&g_nvml.mu) std::recursive_mutex();
}

}  // namespace nvshare::client::hooks
