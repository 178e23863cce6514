#include "scheduler/policy/quantum.h"

#include <algorithm>
#include <cmath>

namespace nvshare::policy {

Duration time_to_move(std::uint64_t bytes, std::uint64_t bytes_per_s) {
  const double seconds =
      static_cast<double>(bytes) / static_cast<double>(std::max<std::uint64_t>(bytes_per_s, 1));
  // Far beyond any bound; keeps the conversion below in range for absurd inputs.
  constexpr double kCapSeconds = 1e9;
  return Duration(static_cast<std::int64_t>(std::ceil(std::min(seconds, kCapSeconds) * 1e9)));
}

Duration client_swap_time(const PolicyConfig& config, std::uint64_t allocated_bytes,
                          std::uint64_t reported_bytes_per_s, std::uint64_t bound_bytes) {
  const std::uint64_t bytes =
      bound_bytes > 0 ? std::min(allocated_bytes, bound_bytes) : allocated_bytes;
  const std::uint64_t rate =
      reported_bytes_per_s > 0 ? reported_bytes_per_s : config.default_swap_bytes_per_s;
  return time_to_move(bytes, std::max(rate, config.swap_bandwidth_floor));
}

Duration quantum_for(const PolicyConfig& config, Duration swap_time) {
  if (config.fixed_quantum) return *config.fixed_quantum;
  const double swap_ns = static_cast<double>(swap_time.count());
  const double scaled_ns = std::ceil(config.quantum_swap_multiple * swap_ns);
  const double min_ns = static_cast<double>(config.quantum_min.count());
  const double max_ns = static_cast<double>(config.quantum_max.count());
  return Duration(static_cast<std::int64_t>(std::clamp(scaled_ns, min_ns, max_ns)));
}

}  // namespace nvshare::policy
