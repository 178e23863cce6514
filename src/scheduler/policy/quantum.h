// The swap-time model behind the turn-taking quantum and the revoke deadline.
//
// A hand-off between a runner and a waiter that cannot fit beside it moves memory both ways (the
// runner out to host, the waiter back in). The quantum is a multiple of that cost so that swapping
// never dominates: a hand-off costs at most about 1/(k+1) of the GPU's time (k = 50: 2%) while the
// quantum is under its maximum.
//
// Every figure here comes from what a client reports about itself, so each is bounded before it
// is used (docs/scheduling.md, "Bounds that no client can stretch"): bytes are clamped to what the
// GPU can hold (a swap moves at most the device's memory), a bandwidth counts as at least the
// configured floor, and the results are bounded again by quantum_max and swap_allowance_max.
//
// Contract: pure arithmetic. Durations are rounded up to whole nanoseconds so an estimate is never
// optimistic, and capped (1e9 s) so that absurd inputs stay in range.
#pragma once

#include <cstdint>

#include "common/mono_time.h"
#include "scheduler/policy/config.h"

namespace nvshare::policy {

// Swap bandwidth of one GPU for status: the latest non-zero measurement any client reported, else
// the default. Shown only; time bounds use each client's own (floored) figure.
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

 private:
  std::uint64_t default_;
  std::uint64_t measured_ = 0;
};

// How long moving `bytes` takes at `bytes_per_s` (> 0), rounded up and capped at 1e9 s.
Duration time_to_move(std::uint64_t bytes, std::uint64_t bytes_per_s);

// The swap time of one client as every bound uses it: min(allocated, bound_bytes) at
// max(reported, floor), the configured default while it has reported none (0). bound_bytes 0
// means no clamp.
Duration client_swap_time(const PolicyConfig& config, std::uint64_t allocated_bytes,
                          std::uint64_t reported_bytes_per_s, std::uint64_t bound_bytes);

// The quantum for a hand-off whose memory moves in `swap_time` (out and in together): the fixed
// quantum when configured, else clamp(k x swap_time, quantum_min, quantum_max).
Duration quantum_for(const PolicyConfig& config, Duration swap_time);

}  // namespace nvshare::policy
