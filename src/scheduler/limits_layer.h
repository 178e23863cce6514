// LimitsLayer: one layer of limits (a pod's, a process's, a client's own declaration), each field
// set or inherited from the layer below.
#pragma once

#include <cstdint>
#include <optional>

namespace nvshare::scheduler {

struct LimitsLayer {
  std::optional<std::uint64_t> memory_bytes;  // 0: no memory limit; nullopt: inherit
  std::optional<std::uint8_t> core_percent;   // 100: uncapped; nullopt: inherit
  // A protocol::Limits memory mode code (1..3); nullopt: inherit. Not a bound: a client's own
  // layer cannot hold one (the process's own choice is NVSHARE_MEMORY_MODE).
  std::optional<std::uint8_t> memory_mode;
  // A protocol::Limits priority code (1..3); nullopt: inherit. Not a bound either, but a claim on
  // others' GPU time: a client's own layer holds one only when the scheduler trusts clients.
  std::optional<std::uint8_t> priority;
  bool empty() const { return !memory_bytes && !core_percent && !memory_mode && !priority; }
  bool operator==(const LimitsLayer&) const = default;
};

}  // namespace nvshare::scheduler
