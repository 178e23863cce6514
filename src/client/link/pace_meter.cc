#include "client/link/pace_meter.h"

#include <algorithm>

namespace nvshare::client {

std::optional<std::uint16_t> PaceMeter::observe(MonoTime now, bool held, Duration waited_total) {
  if (!started_) {
    started_ = true;
    last_ = now;
    last_waited_ = waited_total;
    held_ = held;
    return std::nullopt;
  }
  const Duration elapsed = std::max(now - last_, Duration::zero());
  const Duration waited = std::max(waited_total - last_waited_, Duration::zero());
  last_ = std::max(now, last_);
  last_waited_ = std::max(waited_total, last_waited_);
  const bool was_held = held_;
  held_ = held;
  if (!was_held) return std::nullopt;
  // A wait is counted when it ends, whole: a window may receive part of the previous one's.
  window_held_ += elapsed;
  window_waited_ += waited;
  if (window_held_ < kPaceWindow) return std::nullopt;
  const double share =
      static_cast<double>(window_waited_.count()) / static_cast<double>(window_held_.count());
  window_held_ = Duration::zero();
  window_waited_ = Duration::zero();
  const auto steps = static_cast<std::uint16_t>(share * 1000 / kPaceStep + 0.5);
  return static_cast<std::uint16_t>(std::min<int>(1000, steps * kPaceStep));
}

std::optional<MonoTime> PaceMeter::window_end() const {
  if (!held_) return std::nullopt;
  return last_ + (kPaceWindow - window_held_);
}

}  // namespace nvshare::client
