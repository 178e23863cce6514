// NVSHARE_SIM_SEED_BASE=<n>: the simulators' random scenarios start at seed n+1 instead of 1, for
// sweeps beyond the seeds every run checks. Unset or not a number: 0.
#pragma once

#include <cstdint>
#include <cstdlib>

namespace nvshare::sim {

inline std::uint64_t seed_base() {
  const char* text = std::getenv("NVSHARE_SIM_SEED_BASE");
  if (text == nullptr) return 0;
  char* end = nullptr;
  const unsigned long long base = std::strtoull(text, &end, 10);
  return end != text && *end == '\0' ? base : 0;
}

}  // namespace nvshare::sim
