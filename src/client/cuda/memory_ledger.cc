#include "client/cuda/memory_ledger.h"

#include <algorithm>

namespace nvshare::client::cuda {

bool MemoryLedger::try_charge(std::uint64_t bytes) {
  if (limit_unknown()) return false;
  std::uint64_t used = used_.load(std::memory_order_relaxed);
  for (;;) {
    const std::uint64_t limit = limit_.load(std::memory_order_relaxed);
    if (limit != 0 && (bytes > limit || used > limit - bytes)) return false;
    if (used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed)) return true;
  }
}

void MemoryLedger::charge(std::uint64_t bytes) {
  used_.fetch_add(bytes, std::memory_order_relaxed);
}

void MemoryLedger::refund(std::uint64_t bytes) {
  std::uint64_t used = used_.load(std::memory_order_relaxed);
  while (!used_.compare_exchange_weak(used, used > bytes ? used - bytes : 0,
                                      std::memory_order_relaxed)) {
  }
}

MemoryLedger::View MemoryLedger::view(std::uint64_t limit, std::uint64_t used,
                                      std::uint64_t real_free, std::uint64_t real_total) {
  View v;
  v.total = limit != 0 ? std::min(limit, real_total) : real_total;
  v.free = v.total > used ? v.total - used : 0;
  // Other processes' memory, and ours that the driver counts differently (rounding, pools), can
  // leave less free than the limit suggests: never promise more than the driver has.
  v.free = std::min(v.free, real_free);
  return v;
}

const char* to_string(AllocationKind kind) {
  switch (kind) {
    case AllocationKind::kBacked:
      return "device-backed";
    case AllocationKind::kManagedFromDevice:
      return "managed-from-device";
    case AllocationKind::kManaged:
      return "managed";
    case AllocationKind::kDevice:
      return "device";
    case AllocationKind::kAsync:
      return "async";
    case AllocationKind::kVmm:
      return "vmm";
    case AllocationKind::kHostPinned:
      return "host-pinned";
  }
  return "?";
}

void AllocationTable::add(Space space, std::uint64_t key, const Allocation& allocation) {
  std::lock_guard lock(mu_);
  map(space)[key] = allocation;
}

std::optional<Allocation> AllocationTable::remove(Space space, std::uint64_t key) {
  std::lock_guard lock(mu_);
  auto& entries = map(space);
  auto it = entries.find(key);
  if (it == entries.end()) return std::nullopt;
  Allocation found = it->second;
  entries.erase(it);
  return found;
}

std::optional<Allocation> AllocationTable::find(Space space, std::uint64_t key) const {
  std::lock_guard lock(mu_);
  const auto& entries = map(space);
  auto it = entries.find(key);
  if (it == entries.end()) return std::nullopt;
  return it->second;
}

std::vector<ManagedRange> AllocationTable::managed_ranges(int device) const {
  std::vector<ManagedRange> ranges;
  std::lock_guard lock(mu_);
  for (const auto& [address, allocation] : map(Space::kDeviceAddress)) {
    if (allocation.device == device && prefetchable(allocation.kind)) {
      ranges.push_back({address, allocation.bytes});
    }
  }
  return ranges;
}

std::uint64_t AllocationTable::bytes(int device, AllocationKind kind) const {
  std::uint64_t total = 0;
  std::lock_guard lock(mu_);
  for (const auto& entries : maps_) {
    for (const auto& [key, allocation] : entries) {
      if (allocation.device == device && allocation.kind == kind) total += allocation.bytes;
    }
  }
  return total;
}

}  // namespace nvshare::client::cuda
