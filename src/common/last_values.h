// The last N values of a series (a ring), for rules judged over a client's recent behaviour: the
// pauses a holder waits out (client/link/grant_session.h) and the gaps between a higher class's
// steps (scheduler/policy/gpu_policy.h).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace nvshare {

template <typename T, std::size_t N>
class LastValues {
 public:
  static_assert(N > 0);

  void add(T value) { values_[seen_++ % N] = value; }

  // The values kept: the last N added, or all of them while fewer came; in no particular order.
  std::span<const T> kept() const {
    return {values_.data(), static_cast<std::size_t>(std::min<std::uint64_t>(seen_, N))};
  }

 private:
  std::array<T, N> values_{};
  std::uint64_t seen_ = 0;
};

}  // namespace nvshare
