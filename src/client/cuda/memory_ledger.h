// Memory accounting of the client library: how much of a GPU this process holds, under which limit,
// and which allocations it is made of.
//
// MemoryLedger (one per GPU) counts bytes against the limit:
//  - try_charge() counts an allocation before it is made, atomically, only when it fits: used +
//    bytes <= limit (limit 0: none). An allocation of exactly the remaining bytes fits; one byte
//    more does not. Nothing is counted when it does not fit.
//  - charge() counts unconditionally (the context's own memory, which exists whatever the limit).
//  - set_limit() never frees anything: a limit below `used` only makes later allocations fail.
//  - set_limit_unknown(true): the limit this process must keep is not known yet (a managed
//    container whose settings say pending and no scheduler has said): try_charge() fails and view()
//    shows nothing free, until set_limit() or set_limit_unknown(false). Limits never fail open.
//  - view() is what cuMemGetInfo and NVML report: total = min(limit, physical), free = total -
//  used,
//    and never more free than the driver says is free.
// AllocationTable (one per process) remembers each live allocation (which GPU, how big, what kind)
// so that frees refund the right ledger and swaps find the managed ranges of a GPU.
//
// Both are thread-safe and never throw except std::bad_alloc from the table's containers (the hooks
// catch it). No CUDA calls here: the unit tests drive them directly.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace nvshare::client::cuda {

class MemoryLedger {
 public:
  explicit MemoryLedger(std::uint64_t limit_bytes = 0) : limit_(limit_bytes) {}

  [[nodiscard]] bool try_charge(std::uint64_t bytes);
  // Allocations refused by the limit so far (reported to the scheduler with the usage).
  void note_refused() { refused_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  void charge(std::uint64_t bytes);
  void refund(std::uint64_t bytes);  // clamps at zero

  void set_limit(std::uint64_t bytes) {
    limit_.store(bytes, std::memory_order_relaxed);
    unknown_.store(false, std::memory_order_release);
  }
  void set_limit_unknown(bool unknown) { unknown_.store(unknown, std::memory_order_release); }
  bool limit_unknown() const { return unknown_.load(std::memory_order_acquire); }
  std::uint64_t limit() const { return limit_.load(std::memory_order_relaxed); }
  std::uint64_t used() const { return used_.load(std::memory_order_relaxed); }

  struct View {
    std::uint64_t free = 0;
    std::uint64_t total = 0;
  };
  // limit 0 means none; real_* are what the driver reported.
  static View view(std::uint64_t limit, std::uint64_t used, std::uint64_t real_free,
                   std::uint64_t real_total);
  View view(std::uint64_t real_free, std::uint64_t real_total) const {
    View v = view(limit(), used(), real_free, real_total);
    if (limit_unknown()) v.free = 0;
    return v;
  }

 private:
  std::atomic<std::uint64_t> used_{0};
  std::atomic<std::uint64_t> limit_;
  std::atomic<bool> unknown_{false};
  std::atomic<std::uint64_t> refused_{0};
};

enum class AllocationKind : std::uint8_t {
  kBacked,             // cuMemAlloc/Pitch as device memory mapped at a fixed address (swappable)
  kManagedFromDevice,  // cuMemAlloc/Pitch turned into managed memory on the device (swappable)
  kManaged,            // the application's own cuMemAllocManaged (swappable)
  kDevice,             // device memory (memory mode plain, small, or the other backings failed)
  kAsync,              // stream-ordered allocations from memory pools
  kVmm,                // cuMemCreate physical allocations
  kHostPinned,         // cuMemAllocHost / cuMemHostAlloc: accounted, never limited
};
const char* to_string(AllocationKind kind);
// Managed memory: a swap prefetches it.
inline bool prefetchable(AllocationKind kind) {
  return kind == AllocationKind::kManagedFromDevice || kind == AllocationKind::kManaged;
}
inline bool swappable(AllocationKind kind) {
  return prefetchable(kind) || kind == AllocationKind::kBacked;
}

struct Allocation {
  int device = -1;  // CUdevice ordinal; -1 for host memory
  std::uint64_t bytes = 0;
  AllocationKind kind = AllocationKind::kDevice;
};

struct ManagedRange {
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
};

class AllocationTable {
 public:
  // Keys live in separate spaces: device addresses (cuMemAlloc*, managed, async), VMM handles and
  // host pointers can collide numerically.
  enum class Space : std::uint8_t { kDeviceAddress, kVmmHandle, kHostAddress };

  void add(Space space, std::uint64_t key, const Allocation& allocation);
  std::optional<Allocation> remove(Space space, std::uint64_t key);
  std::optional<Allocation> find(Space space, std::uint64_t key) const;
  // The managed (prefetchable) allocations of a GPU, by address.
  std::vector<ManagedRange> managed_ranges(int device) const;
  std::uint64_t bytes(int device, AllocationKind kind) const;

 private:
  std::map<std::uint64_t, Allocation>& map(Space space) { return maps_[static_cast<int>(space)]; }
  const std::map<std::uint64_t, Allocation>& map(Space space) const {
    return maps_[static_cast<int>(space)];
  }

  mutable std::mutex mu_;
  std::map<std::uint64_t, Allocation> maps_[3];
};

}  // namespace nvshare::client::cuda
