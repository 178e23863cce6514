// The simulators' sweep knobs, read from the environment (unset, or not a whole number: the
// default):
//  - NVSHARE_SIM_SEED_BASE=<n>: the random scenarios start at seed n+1 instead of 1, for sweeps
//    beyond the seeds every run checks (policy_sim and link_sim);
//  - NVSHARE_SIM_TRACE_LINES=<n>: a replayed failing scenario keeps its last n trace lines
//    (policy_sim; 150).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace nvshare::sim {

inline std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  return end != text && *end == '\0' ? value : fallback;
}

inline std::uint64_t seed_base() { return env_number("NVSHARE_SIM_SEED_BASE", 0); }

inline std::size_t trace_lines() {
  const std::uint64_t lines = env_number("NVSHARE_SIM_TRACE_LINES", 0);
  return lines > 0 ? static_cast<std::size_t>(lines) : 150;
}

}  // namespace nvshare::sim
