#include "scheduler/policy/config.h"

#include <cmath>
#include <string>

namespace nvshare::policy {

Result<Mode> parse_mode(std::string_view text) {
  if (text == "auto") return Mode::kAuto;
  // "serial" is the name earlier releases used for one-at-a-time scheduling.
  if (text == "exclusive" || text == "serial") return Mode::kExclusive;
  return make_error("policy mode \"" + std::string(text) +
                    "\": expected auto, exclusive or serial");
}

std::string_view to_string(Mode mode) {
  switch (mode) {
    case Mode::kAuto:
      return "auto";
    case Mode::kExclusive:
      return "exclusive";
  }
  return "unknown";
}

Status validate(const PolicyConfig& config) {
  // Written so that NaN fails every range check.
  if (!(config.reserve_fraction >= 0 && config.reserve_fraction <= 0.9)) {
    return make_error("reserve fraction must be within 0..0.9");
  }
  if (config.capacity_bytes && *config.capacity_bytes == 0) {
    return make_error("capacity must be positive when set");
  }
  if (config.fixed_quantum && *config.fixed_quantum <= Duration::zero()) {
    return make_error("fixed quantum must be positive");
  }
  if (!(config.quantum_swap_multiple > 0 && std::isfinite(config.quantum_swap_multiple))) {
    return make_error("quantum swap multiple must be a positive number");
  }
  if (config.quantum_min <= Duration::zero()) return make_error("quantum minimum must be positive");
  if (config.quantum_min > config.quantum_max) {
    return make_error("quantum minimum must not exceed the maximum");
  }
  if (config.turn_slice < std::chrono::milliseconds(10)) {
    return make_error("turn slice must be at least 10 ms");
  }
  if (config.cap_cycle < std::chrono::milliseconds(10)) {
    return make_error("cap cycle must be at least 10 ms");
  }
  if (config.default_swap_bytes_per_s == 0) {
    return make_error("default swap bandwidth must be positive");
  }
  if (config.quota_window < std::chrono::milliseconds(10)) {
    return make_error("quota window must be at least 10 ms");
  }
  if (!(config.priority_interference >= 0 && config.priority_interference <= 1)) {
    return make_error("priority interference must be within 0..1");
  }
  if (config.priority_floor < std::chrono::milliseconds(10)) {
    return make_error("priority floor must be at least 10 ms");
  }
  if (config.swap_bandwidth_floor == 0) return make_error("swap bandwidth floor must be positive");
  if (config.revoke_grace <= Duration::zero()) return make_error("revoke grace must be positive");
  if (config.swap_allowance_max < Duration::zero()) {
    return make_error("swap allowance must not be negative");
  }
  return Status::Ok();
}

Duration hog_bound(const PolicyConfig& config) {
  // A turn counts from the end of the holder's estimated swap-in (at most the allowance).
  return std::max(config.fixed_quantum.value_or(config.quantum_max), config.swap_allowance_max) +
         config.revoke_grace + config.swap_allowance_max;
}

}  // namespace nvshare::policy
