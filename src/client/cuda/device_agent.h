// GpuAgent: the DeviceAgent of one GPU, the CUDA operations the link thread asks for
// (device_link.h has the contract).
//
//  - drain(): waits for the work queued on the GPU (WorkTracker::drain: never inside a capture).
//  - swap_in(limit): room while waiting for the grant: only device-backed ranges come back, at
//    most `limit` bytes (DeviceBacking::swap_in with a limit); the GPU stays swapped out (new
//    allocations stay off it) and the managed memory stays where it is, until the grant's
//    swap_in().
//  - swap_out() / swap_in(): move every swappable allocation of this process on the GPU to the
//    host / back, on the library's private stream: device-backed ones by copies
//    (device_backing.h), managed ones (converted device allocations in the unified mode and the
//    application's own managed memory) by bulk prefetch; then synchronize that stream. swap_out
//    moves only what fits in the host room (client/host_room.h), read once per swap-out: host
//    copies first, then managed ranges in address order; the rest stays on the GPU. It measures
//    the bandwidth it achieved (the expensive direction, so the one worth reporting). While
//    swapped out, new allocations stay off the GPU until swap_in.
//  - prepare_swap_out(bytes): makes, on a thread of its own, the host copies of the device-backed
//    allocations that a swap-out of `bytes` would copy into (DeviceBacking::prepare_host_copies;
//    0: all), one such thread per GPU at a time.
//  - idle_for(): WorkTracker::idle_for (queries only, never synchronizes).
//  - queue_waited(): WorkTracker::bound_waited.
//  - usage(): allocated = the ledger's bytes (context included); resident = allocated minus what a
//    swap moved to the host; pinned = what a swap-out would leave on the GPU (DeviceBacking::plan:
//    exported for CUDA IPC, or beyond the host room, read at most every kHostRoomRefresh; and the
//    managed ranges beyond what the host copies leave of the room), or, while swapped out, what
//    the swap-out left there.
//  - apply_limits(): the scheduler's memory limit replaces the declared one (0: none). A lower
//  limit
//    frees nothing; later allocations fail instead.
// Called only from the link thread; never throws.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>

#include "client/device_link.h"
#include "common/priority.h"

namespace nvshare::client::cuda {

struct DeviceState;

// The drain bound of a `low` client (at most; a shorter configured bound stays).
inline constexpr Duration kLowDrainBound = std::chrono::milliseconds(2);
// The drain bound of a capped client (at most): it is revoked once per cap cycle (a quarter second
// by default, of which a 10% client runs 25 ms), and what it has queued then runs on as overshoot
// that its next pause repays; the processes of one job on several GPUs (gangs) pause together, and
// the drain of the rank that is behind is time the rank ahead waits in.
inline constexpr Duration kCappedDrainBound = std::chrono::milliseconds(10);
// How long a reading of the host room (client/host_room.h) serves usage reports.
inline constexpr Duration kHostRoomRefresh = std::chrono::seconds(1);

class GpuAgent final : public DeviceAgent {
 public:
  explicit GpuAgent(DeviceState& device);

  Duration drain() override;
  std::uint64_t swap_out(std::uint64_t target = 0) override;
  std::uint64_t swap_in(std::uint64_t limit = 0) override;
  void prepare_swap_out(std::uint64_t bytes) override;
  Duration idle_for() override;
  DeviceUsage usage() override;
  Duration queue_waited() override;
  std::uint64_t threads_at_bound() override;
  void apply_limits(const protocol::Limits& limits) override;
  void limits_unknown() override;
  // The scheduler's memory mode (a protocol::Limits code) for allocations from now on, unless the
  // process chose its own (NVSHARE_MEMORY_MODE); no word from the scheduler means device. What
  // is already allocated stays as it is.
  void apply_memory_mode(std::uint8_t code);
  // The drain bound the limits imply: the configured one, at most kLowDrainBound for a low client
  // and kCappedDrainBound for a capped one.
  void apply_drain_bound(const protocol::Limits& limits);
  // Where the host room is read from: client::host_room() unless a test gives its own.
  using HostRoomSource = std::uint64_t (*)();
  void set_host_room_source(HostRoomSource source);

 private:
  // To the host: at least `target` bytes (0: all). Back: at most `target` bytes of the
  // device-backed ranges, staying swapped out (0: all of it, managed memory too).
  std::uint64_t move(bool to_host, std::uint64_t target);
  std::uint64_t recent_host_room();
  // Of the managed ranges, in address order, the bytes that do not fit in `room`.
  std::uint64_t managed_beyond(std::uint64_t room) const;
  DeviceState& device_;
  // The class, cap and drain bound last logged, from the default (normal, uncapped, the configured
  // bound), which needs no line: limits arrive with the welcome and again at every change, and
  // each setting is said once.
  std::tuple<Priority, unsigned, Duration> drain_logged_;
  HostRoomSource room_source_;
  std::optional<MonoTime> room_read_at_;
  std::uint64_t room_ = 0;
  std::uint64_t managed_left_ = 0;  // managed bytes the last swap-out left on the GPU
  bool managed_out_ = false;        // the managed allocations were moved out since the last swap-in
};

}  // namespace nvshare::client::cuda
