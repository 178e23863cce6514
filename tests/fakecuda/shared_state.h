// The simulated GPUs' shared state: one file mapped MAP_SHARED by every process that uses the fake
// driver with the same NVSHARE_FAKECUDA_STATE path, so that processes share a simulated GPU the way
// they share a physical one.
//
// Per device (a record keyed by GPU UUID) the file holds:
//  - the virtual clock of generalized processor sharing (README.md, "Time model"): a short history
//  of
//    change points (wall time, virtual time, n), where n is the number of contexts, across all
//    processes, that have GPU work; between two change points virtual time advances at 1/n of wall
//    time, so a kernel of alone-duration D that starts at virtual time V0 ends when the clock reads
//    V0 + D;
//  - a slot per context (pid, process start time, context id) with the memory it holds and whether
//  it
//    is counted in n, so that what a crashed process held can be reaped;
//  - cumulative migration and kernel counters.
//
// Contract:
//  - SharedState::open maps the file, creating and initializing it under flock(2) when it is new or
//  has
//    another layout, so concurrent first opens are safe. The mapping is never unmapped.
//  - Every access to a device record goes through SimDevice, which holds the record's
//  process-shared
//    robust mutex; when a holder died, the next locker reaps dead slots and recomputes n.
//  - Slots are named by SlotRef {index, context id}. Operations on a slot that no longer belongs to
//  this
//    process and context (reaped, released) do nothing, so a late call from a worker thread is
//    harmless.
//  - Memory totals are sums over live slots; they never go negative and a reaped slot returns its
//  memory.
//  - Nothing here throws; nothing allocates while holding a record's mutex except snapshot().
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"

namespace fakecuda {

inline constexpr int kMaxDevices = 32;
inline constexpr int kMaxSlots = 128;
inline constexpr int kHistoryLength = 64;
inline constexpr int kUuidTextSize = 48;

// Nanoseconds of CLOCK_MONOTONIC, which all processes on the host share.
std::int64_t mono_ns();

// A change of n: from wall_ns on, virtual time advances from virtual_ns at 1/active per wall ns.
struct TimePoint {
  std::int64_t wall_ns;
  double virtual_ns;
  std::uint32_t active;
  std::uint32_t reserved;
};

struct SlotRecord {
  std::int32_t pid;  // 0: free
  std::uint32_t counted;
  std::uint64_t
      start_time;  // the pid's start time (clock ticks after boot), to tell a reused pid apart
  std::uint64_t context_id;
  std::uint64_t device_bytes;
  std::uint64_t managed_resident;
  std::uint64_t managed_host;
  std::uint64_t kernels;
};

struct DeviceRecord {
  pthread_mutex_t mutex;
  std::uint32_t generation;  // futex word, bumped at every change point
  std::uint32_t in_use;
  char uuid[kUuidTextSize];
  std::uint64_t total_bytes;
  std::uint64_t migrated_to_host;
  std::uint64_t migrated_to_device;
  std::uint64_t faulted_in;
  std::uint64_t kernels;
  std::uint32_t history_head;  // index of the newest change point
  std::uint32_t history_count;
  TimePoint history[kHistoryLength];
  SlotRecord slots[kMaxSlots];
};

struct SharedHeader {
  std::uint64_t magic;
  std::uint32_t layout_version;
  std::uint32_t reserved;
  pthread_mutex_t registry_mutex;
  DeviceRecord devices[kMaxDevices];
};

struct SlotRef {
  int index = -1;
  std::uint64_t context_id = 0;
  bool valid() const { return index >= 0; }
};

struct MemoryTotals {
  std::uint64_t total = 0;
  std::uint64_t device_bytes = 0;
  std::uint64_t managed_resident = 0;
  std::uint64_t managed_host = 0;
  std::uint64_t used() const { return device_bytes + managed_resident; }
  std::uint64_t free() const { return used() >= total ? 0 : total - used(); }
};

struct SlotSnapshot {
  int pid = 0;
  std::uint64_t context_id = 0;
  bool counted = false;
  std::uint64_t device_bytes = 0;
  std::uint64_t managed_resident = 0;
  std::uint64_t managed_host = 0;
  std::uint64_t kernels = 0;
};

struct DeviceSnapshot {
  std::string uuid;
  MemoryTotals memory;
  std::uint64_t migrated_to_host = 0;
  std::uint64_t migrated_to_device = 0;
  std::uint64_t faulted_in = 0;
  std::uint64_t kernels = 0;
  std::uint32_t active_contexts = 0;
  double virtual_ns = 0;
  std::vector<SlotSnapshot> slots;
};

struct KernelProgress {
  bool done = false;
  std::int64_t finish_wall_ns =
      0;  // when done: the wall time at which the virtual clock reached target
  std::int64_t wake_at_ns = 0;   // otherwise: predicted finish if n stays as it is
  std::uint32_t generation = 0;  // the change-point generation the prediction is based on
};

enum class Migration { kToDevice, kToHost, kFaultIn };

class SimDevice {
 public:
  explicit SimDevice(DeviceRecord* record) : record_(record) {}

  std::string uuid() const;
  std::uint64_t total_bytes() const { return record_->total_bytes; }

  // A free slot for this process's context; invalid when the table is full.
  SlotRef acquire_slot(std::uint64_t context_id);
  // Frees the slot's memory and removes it from n.
  void release_slot(SlotRef slot);

  // Counts the slot in n (or stops counting it) from `since`: the wall time at which the caller's
  // state changed, which may have passed while its thread was waking up. The change is dated no
  // earlier than the newest change point (history is append-only) and no later than now. Returns
  // the virtual time at that date.
  double set_counted(SlotRef slot, bool counted, std::int64_t since);
  // The virtual time at a past wall time (the oldest known value when older than the history).
  double virtual_at(std::int64_t wall_ns);
  // Whether the virtual clock has reached target; counts a completed kernel against the slot.
  KernelProgress poll_kernel(SlotRef slot, double target);
  // Sleeps until the generation differs from `generation` or until deadline_ns (CLOCK_MONOTONIC).
  void wait_for_change(std::uint32_t generation, std::int64_t deadline_ns);

  // Reserves device memory (cuMemAlloc); false when it would exceed the device's capacity.
  bool reserve_device_memory(SlotRef slot, std::uint64_t bytes);
  void release_device_memory(SlotRef slot, std::uint64_t bytes);
  void add_managed(SlotRef slot, std::uint64_t resident, std::uint64_t host);
  void remove_managed(SlotRef slot, std::uint64_t resident, std::uint64_t host);
  // Moves managed bytes between host and device and counts them (clamped to what the slot has).
  void migrate(SlotRef slot, std::uint64_t bytes, Migration kind);

  MemoryTotals memory();
  DeviceSnapshot snapshot();
  // Frees the slots of processes that are gone. maybe_reap does it at most every 200 ms per
  // process.
  int reap_dead_slots();
  void maybe_reap();

 private:
  class Lock;
  SlotRecord* owned(SlotRef slot);
  double virtual_now(std::int64_t now) const;
  std::int64_t wall_at(double target) const;
  void push_change(std::int64_t now, std::uint32_t active);
  int reap_locked();
  void recover_locked();

  DeviceRecord* record_;
  std::atomic<std::int64_t> last_reap_ns_{0};
};

class SharedState {
 public:
  // Maps the state file, creating it when `create` (the stat tool opens without creating).
  // The object only wraps the mapping, which stays for the life of the process (device records
  // point into it): destroying the object unmaps nothing.
  static nvshare::Result<std::unique_ptr<SharedState>> open(const std::string& path, bool create);

  // The record of the device with this UUID, registered with total_bytes when new (the first
  // process to register a UUID decides its capacity).
  nvshare::Result<DeviceRecord*> device(const std::string& uuid, std::uint64_t total_bytes);
  // Records of every registered device, in registration order.
  std::vector<DeviceRecord*> devices();

 private:
  explicit SharedState(SharedHeader* header) : header_(header) {}
  SharedHeader* header_;
};

// The calling process's start time as /proc/self/stat reports it (0 when unreadable).
std::uint64_t process_start_time(int pid);

}  // namespace fakecuda
