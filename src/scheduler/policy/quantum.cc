#include "scheduler/policy/quantum.h"

#include <algorithm>
#include <cmath>

namespace nvshare::policy {

Duration SwapEstimate::time_to_move(std::uint64_t bytes) const {
  const double seconds = static_cast<double>(bytes) / static_cast<double>(bytes_per_s());
  // Far beyond any quantum bound; keeps the conversion below in range for absurd inputs.
  constexpr double kCapSeconds = 1e9;
  return Duration(static_cast<std::int64_t>(std::ceil(std::min(seconds, kCapSeconds) * 1e9)));
}

Duration quantum_for(const PolicyConfig& config, const SwapEstimate& swap,
                     std::uint64_t bytes_to_move) {
  if (config.fixed_quantum) return *config.fixed_quantum;
  const double swap_ns = static_cast<double>(swap.time_to_move(bytes_to_move).count());
  const double scaled_ns = std::ceil(config.quantum_swap_multiple * swap_ns);
  const double min_ns = static_cast<double>(config.quantum_min.count());
  const double max_ns = static_cast<double>(config.quantum_max.count());
  return Duration(static_cast<std::int64_t>(std::clamp(scaled_ns, min_ns, max_ns)));
}

}  // namespace nvshare::policy
