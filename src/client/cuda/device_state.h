// Per-GPU state of the CUDA-facing half, and how an application thread finds it.
//
// DeviceState (one per GPU the process touches, created on first use and never destroyed, because
// the link keeps a reference to its agent) holds the GPU's identity, its memory ledger, its work
// tracker, the DeviceAgent the link thread drives, and the DeviceLink that gates submissions.
//
// current_device() is the hot path of every gated call: the calling thread's current context (one
// driver TLS read) is compared with a per-thread cache of (context, generation) -> DeviceState; on
// a hit that is all. The generation moves whenever a context may have ended (destroy, primary
// release or reset, fork), so a context address reused by a new context on another GPU is never
// mistaken for the old one. On a miss the device is asked of the driver and the registry.
//
// Contract: nothing here is created while the library is disabled (NVSHARE_ENABLE=0). After fork()
// the child starts with an empty registry and allocation table (the parent's objects are abandoned,
// not destroyed: the parent's link may still reference them) and re-creates state lazily.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "client/cuda/device_agent.h"
#include "client/cuda/device_backing.h"
#include "client/cuda/memory_ledger.h"
#include "client/cuda/work_tracker.h"
#include "client/device_link.h"
#include "client/hooks/cuda_api.h"
#include "client/hooks/hook_table.h"
#include "common/memory_mode.h"

namespace nvshare::client::cuda {

inline constexpr int kMaxDevices = 64;

struct DeviceState {
  DeviceState(int device_ordinal, DeviceIdentity device_identity, bool managed, std::uint64_t limit,
              Duration drain_bound);
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;

  const int ordinal;
  const DeviceIdentity identity;
  // Managed memory may stand in for device memory (the GPU has concurrent managed access).
  const bool managed_allowed;
  // How new device allocations are backed: the configured mode where the GPU supports it
  // (device-backed needs the virtual memory management API, unified needs managed_allowed), else
  // the next one (device -> unified -> plain). Set once the backing was probed.
  std::atomic<MemoryMode> memory_mode{MemoryMode::kPlain};
  // `wanted` where this GPU supports it, else the next mode that it does.
  MemoryMode supported_mode(MemoryMode wanted) const;
  DeviceBacking backing;
  MemoryLedger ledger;
  WorkTracker tracker;
  GpuAgent agent;
  DeviceLink* link = nullptr;  // set once, right after construction

  // Swapped out (all or part of it: swap_out with a target); managed memory moved to the host by
  // swap-outs since the last swap_in (and allocated since, while out). The device-backed bytes
  // off the device are the backing's (DeviceBacking::unbacked_bytes).
  std::atomic<bool> swapped_out{false};
  std::atomic<std::uint64_t> swapped_bytes{0};
  std::atomic<std::uint64_t> swap_bytes_per_s{0};
  // A thread prepares host copies for an announced swap-out (GpuAgent::prepare_swap_out).
  std::atomic<bool> preparing_host_copies{false};
  // The primary context, once retained through us.
  std::atomic<CUcontext> primary{nullptr};

  // The context's own memory: charged once, at the first context this process makes on the GPU
  // (context_footprint.h says how it is measured).
  std::mutex footprint_mu;
  std::atomic<bool> footprint_charged{false};
  std::uint64_t footprint_bytes = 0;  // under footprint_mu
};

class DeviceRegistry {
 public:
  // The state of a GPU by CUdevice ordinal, created on first use (needs cuInit done); null when the
  // driver cannot describe the device. Waits (bounded) for the GPU's registration with the
  // scheduler (DeviceLink::await_registration), so the scheduler's limits hold from the first
  // allocation: call it with no lock held.
  DeviceState* get(CUdevice ordinal);
  DeviceState* find(CUdevice ordinal) const;
  DeviceState* find_by_uuid(std::string_view uuid) const;
  // The GPU that knows `ctx` (it submitted or allocated there), or null.
  DeviceState* find_by_context(CUcontext ctx) const;

 private:
  DeviceState* create(CUdevice ordinal);  // links the GPU under create_mu_, never waits

  std::atomic<DeviceState*> slots_[kMaxDevices] = {};
  std::mutex create_mu_;
};

DeviceRegistry& devices();
AllocationTable& allocations();

struct CurrentDevice {
  DeviceState* device = nullptr;  // null: no current context, or the library is disabled
  CUcontext ctx = nullptr;
};

// What the hot path below reads inline (device_state.cc).
namespace detail {
// 0: not read yet, 1: enabled, 2: disabled.
extern std::atomic<int> g_enabled;
bool read_enabled();
// Moves whenever a context may have ended (contexts_changed()).
extern std::atomic<std::uint64_t> g_context_generation;
struct ThreadCache {
  CUcontext ctx;
  std::uint64_t generation;
  DeviceState* device;
};
// Trivially constructible, so a thread's first access needs no initialization guard. Initial-exec:
// the library is loaded with the process (LD_PRELOAD, /etc/ld.so.preload), so its thread-local
// block is static and every gated call reads the cache without a __tls_get_addr call (24 bytes
// also fit the surplus glibc keeps for a library opened later).
extern __attribute__((tls_model("initial-exec"))) constinit thread_local ThreadCache t_cache;
// A cache miss: asks the driver for the context's device and fills the cache.
DeviceState* slow_lookup(CUcontext ctx, std::uint64_t generation);
}  // namespace detail

// Whether the library does anything (NVSHARE_ENABLE); read once.
inline bool library_enabled() {
  const int state = detail::g_enabled.load(std::memory_order_relaxed);
  return state == 0 ? detail::read_enabled() : state == 1;
}

inline CurrentDevice current_device() {
  if (!library_enabled() || !hooks::ensure_cuda()) return {};
  const auto get_current = hooks::driver().cuCtxGetCurrent;
  CUcontext ctx = nullptr;
  if (get_current == nullptr || get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr) return {};
  const std::uint64_t generation = detail::g_context_generation.load(std::memory_order_acquire);
  const detail::ThreadCache& cache = detail::t_cache;
  if (ctx == cache.ctx && generation == cache.generation) return {cache.device, ctx};
  return {detail::slow_lookup(ctx, generation), ctx};
}

// A context may have ended: every thread's cached context -> device mapping is revalidated.
void contexts_changed();

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
std::string format_uuid(const CUuuid& uuid);

}  // namespace nvshare::client::cuda
