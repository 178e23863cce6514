#include "client/cuda/device_state.h"

#include <pthread.h>

#include <cinttypes>
#include <cstdio>
#include <new>

#include "client/config.h"
#include "client/hooks/hook_table.h"
#include "client/process_events.h"
#include "common/log.h"
#include "common/quantity.h"

namespace nvshare::client::cuda {
namespace detail {
std::atomic<std::uint64_t> g_context_generation{1};
std::atomic<int> g_enabled{0};
__attribute__((tls_model("initial-exec"))) constinit thread_local ThreadCache t_cache{nullptr, 0,
                                                                                      nullptr};
}  // namespace detail
namespace {

using hooks::driver;
using hooks::HookId;

// Replaced (never destroyed) in a forked child: the parent's threads may have held their locks, and
// the parent's link may still reference the DeviceStates.
std::atomic<DeviceRegistry*> g_registry{nullptr};
std::atomic<AllocationTable*> g_allocations{nullptr};
using detail::g_context_generation;
using detail::g_enabled;
using detail::t_cache;
using detail::ThreadCache;

template <typename T>
T& singleton(std::atomic<T*>& slot) {
  T* existing = slot.load(std::memory_order_acquire);
  if (existing != nullptr) return *existing;
  T* created = new T();
  if (slot.compare_exchange_strong(existing, created, std::memory_order_acq_rel)) return *created;
  delete created;
  return *existing;
}

void after_fork_in_child() {
  hooks::reset_after_fork();
  g_registry.store(new (std::nothrow) DeviceRegistry(), std::memory_order_release);
  g_allocations.store(new (std::nothrow) AllocationTable(), std::memory_order_release);
  g_context_generation.fetch_add(1, std::memory_order_acq_rel);
  t_cache = ThreadCache{nullptr, 0, nullptr};
}

// At exit, at debug level: how each GPU's work tracker saw the process (how often its threads
// waited at the drain bound and why), for whoever tunes the bound against a workload.
// Never waits for a tracker another thread holds.
void log_trackers_at_exit() {
  DeviceRegistry* registry = g_registry.load(std::memory_order_acquire);
  if (registry == nullptr || !log_enabled(LogLevel::kDebug)) return;
  for (CUdevice ordinal = 0; ordinal < kMaxDevices; ++ordinal) {
    const DeviceState* device = registry->find(ordinal);
    if (device == nullptr) continue;
    const std::optional<TrackerStats> stats = device->tracker.stats_if_free();
    if (!stats) continue;
    const TrackerStats& s = *stats;
    NVSHARE_DEBUG(
        "%s: %llu submissions, %llu markers, %llu waits at the bound (%.1f ms counted as pace), "
        "tau %.1f us (%s), %llu lessons, %llu disagreed",
        device->identity.gpu_uuid.c_str(), static_cast<unsigned long long>(s.submissions),
        static_cast<unsigned long long>(s.markers), static_cast<unsigned long long>(s.bound_waits),
        to_ms(device->tracker.bound_waited()), s.gpu_ns_per_submission / 1e3,
        s.tau_trusted ? "trusted" : "not trusted", static_cast<unsigned long long>(s.lessons),
        static_cast<unsigned long long>(s.disagreements));
  }
}

// At exit no thread of the library's may still be calling the driver: host copies being prepared
// stop (a driver call in progress ends first), then the trackers are logged.
void at_exit() {
  DeviceRegistry* registry = g_registry.load(std::memory_order_acquire);
  if (registry != nullptr) {
    for (CUdevice ordinal = 0; ordinal < kMaxDevices; ++ordinal) {
      if (DeviceState* device = registry->find(ordinal)) device->backing.stop_preparing();
    }
  }
  log_trackers_at_exit();
}

void install_process_handlers() {
  on_fork(ProcessStage::kDevices, ForkHandlers{nullptr, nullptr, &after_fork_in_child});
  on_exit(ProcessStage::kDevices, &at_exit);
}

bool device_uuid(CUdevice ordinal, CUuuid* uuid) {
  if (driver().cuDeviceGetUuid_v2 != nullptr &&
      driver().cuDeviceGetUuid_v2(uuid, ordinal) == CUDA_SUCCESS) {
    return true;
  }
  return driver().cuDeviceGetUuid != nullptr &&
         driver().cuDeviceGetUuid(uuid, ordinal) == CUDA_SUCCESS;
}

const char* describe(MemoryMode mode) {
  switch (mode) {
    case MemoryMode::kDevice:
      return "are device-backed (swapped by copies)";
    case MemoryMode::kUnified:
      return "become managed memory";
    case MemoryMode::kPlain:
      return "stay device memory (never swapped)";
  }
  return "?";
}

}  // namespace

DeviceState* detail::slow_lookup(CUcontext ctx, std::uint64_t generation) {
  CUdevice ordinal = 0;
  if (driver().cuCtxGetDevice == nullptr || driver().cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) {
    return nullptr;
  }
  DeviceState* device = devices().get(ordinal);
  if (device == nullptr) return nullptr;
  device->tracker.note_context(ctx);
  t_cache = ThreadCache{ctx, generation, device};
  return device;
}

namespace {}  // namespace

DeviceState::DeviceState(int device_ordinal, DeviceIdentity device_identity, bool managed,
                         std::uint64_t limit, Duration drain_bound)
    : ordinal(device_ordinal),
      identity(std::move(device_identity)),
      managed_allowed(managed),
      backing(device_ordinal),
      ledger(limit),
      tracker(drain_bound, SteadyClock::instance()),
      agent(*this) {}

DeviceState* DeviceRegistry::get(CUdevice ordinal) {
  if (ordinal < 0 || ordinal >= kMaxDevices) return nullptr;
  DeviceState* state = slots_[ordinal].load(std::memory_order_acquire);
  if (state == nullptr) state = create(ordinal);
  // After create_mu_ is released (the link thread settles the registration without any of the
  // hooks' locks). Any thread that finds the GPU here before the scheduler's limits arrived waits
  // for them too, not only the one that linked it; one atomic load once settled.
  if (state != nullptr) state->link->await_registration();
  return state;
}

DeviceState* DeviceRegistry::create(CUdevice ordinal) {
  if (!hooks::ensure_cuda()) return nullptr;
  std::lock_guard lock(create_mu_);
  DeviceState* existing = slots_[ordinal].load(std::memory_order_acquire);
  if (existing != nullptr) return existing;
  CUuuid uuid{};
  std::size_t total = 0;
  auto total_mem = hooks::real<HookId::cuDeviceTotalMem_v2>();
  if (!device_uuid(ordinal, &uuid) || total_mem == nullptr ||
      total_mem(&total, ordinal) != CUDA_SUCCESS) {
    return nullptr;
  }
  int concurrent_managed = 0;
  if (driver().cuDeviceGetAttribute != nullptr) {
    driver().cuDeviceGetAttribute(&concurrent_managed,
                                  CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, ordinal);
  }
  const ClientConfig& config = client_config();
  // Without concurrent managed access a managed buffer may not be touched by the CPU while any
  // kernel runs: converting device memory would break correct programs, so it stays device memory.
  const bool managed = concurrent_managed != 0;
  DeviceIdentity identity{format_uuid(uuid), total};
  auto* state = new (std::nothrow) DeviceState(
      ordinal, identity, managed, config.declared_limits.memory_bytes, config.drain_bound);
  if (state == nullptr) return nullptr;
  state->backing.probe();
  const MemoryMode mode = state->supported_mode(config.memory_mode.value_or(MemoryMode::kDevice));
  state->memory_mode.store(mode, std::memory_order_relaxed);
  install_process_handlers();
  // Starts the registration and returns at once; get() waits for it once create_mu_ is released.
  state->link = &link_device(state->identity, state->agent);
  NVSHARE_INFO("device %d %s (%s): memory limit %s, device allocations %s", ordinal,
               state->identity.gpu_uuid.c_str(), format_bytes(total).c_str(),
               state->ledger.limit() != 0 ? format_bytes(state->ledger.limit()).c_str() : "none",
               describe(mode));
  slots_[ordinal].store(state, std::memory_order_release);
  return state;
}

MemoryMode DeviceState::supported_mode(MemoryMode wanted) const {
  if (wanted == MemoryMode::kDevice && backing.granularity() == 0) wanted = MemoryMode::kUnified;
  if (wanted == MemoryMode::kUnified && !managed_allowed) wanted = MemoryMode::kPlain;
  return wanted;
}

DeviceState* DeviceRegistry::find(CUdevice ordinal) const {
  if (ordinal < 0 || ordinal >= kMaxDevices) return nullptr;
  return slots_[ordinal].load(std::memory_order_acquire);
}

DeviceState* DeviceRegistry::find_by_uuid(std::string_view uuid) const {
  for (const auto& slot : slots_) {
    DeviceState* state = slot.load(std::memory_order_acquire);
    if (state != nullptr && state->identity.gpu_uuid == uuid) return state;
  }
  return nullptr;
}

DeviceState* DeviceRegistry::find_by_context(CUcontext ctx) const {
  for (const auto& slot : slots_) {
    DeviceState* state = slot.load(std::memory_order_acquire);
    if (state != nullptr && (state->primary.load() == ctx || state->tracker.knows_context(ctx))) {
      return state;
    }
  }
  return nullptr;
}

DeviceRegistry& devices() { return singleton(g_registry); }

AllocationTable& allocations() { return singleton(g_allocations); }

bool detail::read_enabled() {
  const int state = client_config().enabled ? 1 : 2;
  g_enabled.store(state, std::memory_order_relaxed);
  return state == 1;
}

void contexts_changed() { g_context_generation.fetch_add(1, std::memory_order_acq_rel); }

std::string format_uuid(const CUuuid& uuid) {
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  char text[48];
  std::snprintf(text, sizeof text,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

}  // namespace nvshare::client::cuda
