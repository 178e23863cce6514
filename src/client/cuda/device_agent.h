// GpuAgent: the DeviceAgent of one GPU, the CUDA operations the link thread asks for
// (device_link.h has the contract).
//
//  - drain(): waits for the work queued on the GPU (WorkTracker::drain: never inside a capture).
//  - swap_out() / swap_in(): prefetch every managed allocation of this process on the GPU (the
//    converted device allocations and the application's own managed memory) to the host / back to
//    the GPU, in bulk on the library's private stream, then synchronize that stream. swap_out
//    measures the bandwidth it achieved (the expensive direction, so the one worth reporting).
//    While swapped out, new managed allocations stay on the host until swap_in.
//  - idle_for(): WorkTracker::idle_for (queries only, never synchronizes).
//  - usage(): allocated = the ledger's bytes (context included); resident = allocated minus what a
//    swap moved to the host.
//  - apply_limits(): the scheduler's memory limit replaces the declared one (0: none). A lower
//  limit
//    frees nothing; later allocations fail instead.
// Called only from the link thread; never throws.
#pragma once

#include <cstdint>

#include "client/device_link.h"

namespace nvshare::client::cuda {

struct DeviceState;

class GpuAgent final : public DeviceAgent {
 public:
  explicit GpuAgent(DeviceState& device) : device_(device) {}

  Duration drain() override;
  std::uint64_t swap_out() override;
  std::uint64_t swap_in() override;
  Duration idle_for() override;
  DeviceUsage usage() override;
  void apply_limits(const protocol::Limits& limits) override;
  void limits_unknown() override;

 private:
  std::uint64_t move_managed(bool to_host);
  DeviceState& device_;
};

}  // namespace nvshare::client::cuda
