#include "client/cuda/device_agent.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "client/config.h"
#include "client/cuda/device_state.h"
#include "client/cuda/placement.h"
#include "client/hooks/hook_table.h"
#include "client/host_room.h"
#include "common/log.h"
#include "common/quantity.h"

namespace nvshare::client::cuda {

namespace {

std::uint64_t system_host_room() { return host_room(); }

// The GPU's managed ranges (by address); none when the list cannot be made.
std::vector<ManagedRange> managed_ranges_of(int ordinal) {
  try {
    return allocations().managed_ranges(ordinal);
  } catch (...) {
    return {};
  }
}

}  // namespace

GpuAgent::GpuAgent(DeviceState& device)
    : device_(device),
      drain_logged_(Priority::kNormal, 100u, client_config().drain_bound),
      room_source_(&system_host_room) {}

void GpuAgent::set_host_room_source(HostRoomSource source) {
  room_source_ = source != nullptr ? source : &system_host_room;
  room_read_at_.reset();
}

Duration GpuAgent::drain() { return device_.tracker.drain(); }

Duration GpuAgent::idle_for() { return device_.tracker.idle_for(); }

Duration GpuAgent::queue_waited() { return device_.tracker.bound_waited(); }

std::uint64_t GpuAgent::threads_at_bound() { return device_.tracker.threads_at_bound(); }

std::uint64_t GpuAgent::move(bool to_host, std::uint64_t target) {
  std::vector<ManagedRange> ranges = managed_ranges_of(device_.ordinal);
  std::uint64_t moved = 0;
  std::uint64_t managed_moved = 0;
  std::uint64_t left = 0;  // managed bytes kept on the GPU: no room on the host
  Duration took{};
  const Clock& clock = SteadyClock::instance();
  const bool ran = device_.tracker.with_any_context([&](CUcontext, CUstream stream) {
    const MonoTime start = clock.now();
    // Device-backed allocations by copies (the backing synchronizes), managed ones by prefetch,
    // both within the host room.
    std::uint64_t room = to_host ? room_source_() : 0;
    const BackingSwap backed = to_host ? device_.backing.swap_out(stream, room, target)
                                       : device_.backing.swap_in(stream, target);
    room -= std::min(room, backed.host_copies_made);
    moved += backed.bytes;
    // Managed allocations move all together, once, where the device-backed ones did not meet the
    // target; a swap-in brings back whatever is on the host.
    const bool managed_too =
        to_host ? !managed_out_ && (target == 0 || backed.bytes < target) : target == 0;
    if (!managed_too) ranges.clear();
    if (to_host && managed_too) managed_out_ = true;
    for (const ManagedRange& range : ranges) {
      if (to_host && !take_room(room, range.bytes)) {
        left += range.bytes;
        continue;
      }
      const CUresult rc = prefetch(range.address, range.bytes, to_host, device_.ordinal, stream);
      if (rc == CUDA_SUCCESS) {
        moved += range.bytes;
        managed_moved += range.bytes;
      } else {
        NVSHARE_DEBUG("swap: prefetch of %s failed: %s", format_bytes(range.bytes).c_str(),
                      hooks::error_name(rc));
      }
    }
    if (!ranges.empty() && hooks::driver().cuStreamSynchronize != nullptr) {
      hooks::driver().cuStreamSynchronize(stream);
    }
    took = clock.now() - start;
  });
  if (!ran) return 0;
  if (!to_host && target > 0) {  // room: still swapped out
    NVSHARE_DEBUG("swap in ahead of the grant: %s in %.1f ms", format_bytes(moved).c_str(),
                  to_ms(took));
    return moved;
  }
  if (left > 0) {
    NVSHARE_WARN(
        "swap out: %s of managed memory stays on the GPU: it would not fit in the memory this "
        "process may still take (its cgroup's limit, or the host's)",
        format_bytes(left).c_str());
  }
  if (!to_host) {
    managed_left_ = 0;
    managed_out_ = false;
  } else if (!ranges.empty()) {
    managed_left_ = left;
  }
  if (to_host) {
    // A swap-out after one that moved part of the memory moves more of what stayed. The backing
    // knows which of its ranges are off the device; the managed bytes moved are counted here.
    device_.swapped_out.store(true, std::memory_order_release);
    device_.swapped_bytes.fetch_add(managed_moved, std::memory_order_relaxed);
    if (moved > 0 && took.count() > 0) {
      device_.swap_bytes_per_s.store(static_cast<std::uint64_t>(static_cast<double>(moved) * 1e9 /
                                                                static_cast<double>(took.count())),
                                     std::memory_order_relaxed);
    }
  } else {
    device_.swapped_out.store(false, std::memory_order_release);
    device_.swapped_bytes.store(0, std::memory_order_relaxed);
  }
  NVSHARE_DEBUG("swap %s: %s in %.1f ms", to_host ? "out" : "in", format_bytes(moved).c_str(),
                to_ms(took));
  return moved;
}

std::uint64_t GpuAgent::swap_out(std::uint64_t target) { return move(/*to_host=*/true, target); }

std::uint64_t GpuAgent::swap_in(std::uint64_t limit) { return move(/*to_host=*/false, limit); }

void GpuAgent::prepare_swap_out(std::uint64_t target) {
  if (device_.preparing_host_copies.exchange(true, std::memory_order_acq_rel)) return;
  DeviceState* device = &device_;  // never destroyed (device_state.h)
  try {
    std::thread([device, room = room_source_, target] {
      const auto start = std::chrono::steady_clock::now();
      const std::uint64_t bytes = device->backing.prepare_host_copies(room(), target);
      if (bytes > 0) {
        NVSHARE_DEBUG(
            "%s: host copies of %s prepared for the announced swap-out in %.1f ms",
            device->identity.gpu_uuid.c_str(), format_bytes(bytes).c_str(),
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count());
      }
      device->preparing_host_copies.store(false, std::memory_order_release);
    }).detach();
  } catch (...) {
    device_.preparing_host_copies.store(false, std::memory_order_release);
  }
}

std::uint64_t GpuAgent::recent_host_room() {
  const MonoTime now = SteadyClock::instance().now();
  if (!room_read_at_ || now - *room_read_at_ >= kHostRoomRefresh) {
    room_ = room_source_();
    room_read_at_ = now;
  }
  return room_;
}

DeviceUsage GpuAgent::usage() {
  DeviceUsage usage;
  usage.allocated_bytes = device_.ledger.used();
  // Off the device: the device-backed ranges not mapped (swapped out, or reserved while out) and
  // the managed memory moved to the host.
  const std::uint64_t swapped =
      device_.backing.unbacked_bytes() + device_.swapped_bytes.load(std::memory_order_relaxed);
  usage.resident_bytes = usage.allocated_bytes > swapped ? usage.allocated_bytes - swapped : 0;
  usage.swap_bytes_per_s = device_.swap_bytes_per_s.load(std::memory_order_relaxed);
  usage.refused_allocations = device_.ledger.refused();
  if (device_.swapped_out.load(std::memory_order_acquire)) {
    // What stayed mapped moves at a later swap-out where its host copy fits (a swap-out asked for
    // part of the memory leaves ranges that never got one); the managed memory it left stays.
    usage.pinned_bytes = device_.backing.plan(recent_host_room()).unmovable + managed_left_;
  } else {
    const std::uint64_t room = recent_host_room();
    const HostCopyPlan plan = device_.backing.plan(room);
    usage.pinned_bytes = plan.unmovable + managed_beyond(room - std::min(room, plan.to_make));
  }
  return usage;
}

std::uint64_t GpuAgent::managed_beyond(std::uint64_t room) const {
  std::uint64_t beyond = 0;
  for (const ManagedRange& range : managed_ranges_of(device_.ordinal)) {
    if (!take_room(room, range.bytes)) beyond += range.bytes;
  }
  return beyond;
}

void GpuAgent::apply_limits(const protocol::Limits& limits) {
  if (limits.memory_bytes != device_.ledger.limit()) {
    NVSHARE_INFO(
        "%s: memory limit %s (was %s)", device_.identity.gpu_uuid.c_str(),
        limits.memory_bytes != 0 ? format_bytes(limits.memory_bytes).c_str() : "none",
        device_.ledger.limit() != 0 ? format_bytes(device_.ledger.limit()).c_str() : "none");
  }
  device_.ledger.set_limit(limits.memory_bytes);
  apply_memory_mode(limits.memory_mode);
  apply_drain_bound(limits);
}

// A low client keeps at most kLowDrainBound of GPU work queued (the configured bound if that is
// shorter): a higher class that asks for the GPU waits no longer than that for the hand-over. A
// capped one keeps at most kCappedDrainBound: its revokes come every cap cycle.
void GpuAgent::apply_drain_bound(const protocol::Limits& limits) {
  const Priority priority = protocol::effective_priority(limits.priority);
  Duration bound = client_config().drain_bound;
  if (priority == Priority::kLow) bound = std::min(bound, kLowDrainBound);
  if (limits.core_percent < 100) bound = std::min(bound, kCappedDrainBound);
  if (bound != device_.tracker.drain_bound()) device_.tracker.set_drain_bound(bound);
  const auto setting = std::make_tuple(priority, static_cast<unsigned>(limits.core_percent), bound);
  if (drain_logged_ == setting) return;
  drain_logged_ = setting;
  NVSHARE_INFO("%s: priority %s, core %u%%, drain bound %.1f ms", device_.identity.gpu_uuid.c_str(),
               std::string(to_string(priority)).c_str(), limits.core_percent,
               static_cast<double>(bound.count()) / 1e6);
}

void GpuAgent::apply_memory_mode(std::uint8_t code) {
  if (client_config().memory_mode) return;  // the process chose its mode itself
  const std::optional<MemoryMode> given = protocol::memory_mode_of(code);
  const MemoryMode mode = device_.supported_mode(given.value_or(MemoryMode::kDevice));
  const MemoryMode before = device_.memory_mode.exchange(mode, std::memory_order_relaxed);
  if (before == mode) return;
  NVSHARE_INFO("%s: memory mode %s from now on (%s; was %s)", device_.identity.gpu_uuid.c_str(),
               std::string(to_string(mode)).c_str(), given ? "the scheduler's" : "the default",
               std::string(to_string(before)).c_str());
}

void GpuAgent::limits_unknown() {
  NVSHARE_WARN(
      "%s: this pod's memory limit is not known yet; allocations fail until the scheduler "
      "or the container's nvshare settings give it",
      device_.identity.gpu_uuid.c_str());
  device_.ledger.set_limit_unknown(true);
}

}  // namespace nvshare::client::cuda
