// The swap-time model behind the turn-taking quantum.
//
// A hand-off between a runner and a waiter that cannot fit beside it moves memory both ways (the
// runner out to host, the waiter back in). The quantum is a multiple of that cost so that swapping
// never dominates: with k = 5 a hand-off costs at most about 1/(k+1) of the GPU's time. Bandwidth
// comes from what clients measured on this GPU; until one has measured, a conservative default
// applies.
//
// Contract: pure arithmetic, no state beyond the last measured bandwidth. Durations are rounded up
// to whole nanoseconds so an estimate is never optimistic.
#pragma once

#include <cstdint>

#include "common/clock.h"
#include "scheduler/policy/config.h"

namespace nvshare::policy {

// Swap bandwidth of one GPU: the latest non-zero measurement any client reported, else the default.
class SwapEstimate {
 public:
  explicit SwapEstimate(std::uint64_t default_bytes_per_s) : default_(default_bytes_per_s) {}

  // A client's measured swap bandwidth; 0 (not measured yet) is ignored.
  void observe(std::uint64_t bytes_per_s) {
    if (bytes_per_s > 0) measured_ = bytes_per_s;
  }
  void set_default(std::uint64_t default_bytes_per_s) { default_ = default_bytes_per_s; }

  bool measured() const { return measured_ > 0; }
  std::uint64_t bytes_per_s() const { return measured_ > 0 ? measured_ : default_; }

  // How long moving `bytes` takes at that bandwidth (rounded up).
  Duration time_to_move(std::uint64_t bytes) const;

 private:
  std::uint64_t default_;
  std::uint64_t measured_ = 0;
};

// The quantum for a hand-off that moves `bytes_to_move` (out and in together): the fixed quantum
// when configured, else clamp(k x time_to_move(bytes_to_move), quantum_min, quantum_max).
Duration quantum_for(const PolicyConfig& config, const SwapEstimate& swap,
                     std::uint64_t bytes_to_move);

}  // namespace nvshare::policy
