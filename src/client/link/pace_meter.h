// PaceMeter: how a client uses the GPU while it holds its grant, for the scheduler's choice between
// running it beside others and having it take turns (docs/scheduling.md, "Saturating clients take
// turns").
//
// Contract
//  - Pure: observe() is given the time, whether the grant is held from now on, and the cumulative
//    time the process's submitting threads have waited for the drain bound (WorkTracker), and
//    returns a window's figure when one completes.
//  - A window is kPaceWindow of held time (time outside the grant is skipped: a job waiting for
//    its turn is neither deep nor shallow). Its figure is the share of that time, per mille, spent
//    waiting for the drain bound (more than the bound queued, more to queue), rounded to
//    kPaceStep and at most 1000 (several threads waiting at once, or a wait that began in the
//    previous window, are counted in full when the wait ends).
//  - Waits that happen while the grant is not held (the gate open because the scheduler is away)
//    are not counted.
#pragma once

#include <cstdint>
#include <optional>

#include "common/mono_time.h"

namespace nvshare::client {

inline constexpr Duration kPaceWindow = std::chrono::milliseconds(500);
inline constexpr std::uint16_t kPaceStep = 50;  // per mille; small changes send nothing

class PaceMeter {
 public:
  // The interval since the previous call is counted as held when the previous call said so.
  std::optional<std::uint16_t> observe(MonoTime now, bool held, Duration waited_total);
  // When the current window completes if the grant stays held (nullopt while not held).
  std::optional<MonoTime> window_end() const;

 private:
  bool started_ = false;
  bool held_ = false;
  MonoTime last_{};
  Duration last_waited_{0};
  Duration window_held_{0};
  Duration window_waited_{0};
};

}  // namespace nvshare::client
