// QuotaLedger: the token bucket behind a compute cap (docs/scheduling.md, "Compute caps").
//
// The level is in seconds of billed GPU time. It refills at the client's effective cap c (a
// fraction of wall time) and is charged at the client's billing rate w (1/n while it is one of n
// grant holders on the GPU, 0 otherwise), so it moves at (c - w) per second and does not rise above
// the depth c x window while the client does not want the GPU (idle time earns no burst). While it
// wants the GPU (waiting for its turn behind others) it keeps rising: what it is owed while others
// hold the GPU is kept, not lost to the depth. It may fall below zero: that is overshoot (the drain
// after a revoke) carried forward, repaid before the client runs again, which is what makes the
// long-run share equal the cap.
//
// Thresholds: the bucket is spent at level <= 0 (the grant is revoked, reason quota). The resume
// level is R = c x (1 - c) x cycle: a client throttled by its bucket runs again once the level is
// back at R, so a client alone runs c x cycle and pauses (1 - c) x cycle in every cycle. The cycle
// is the window, or shorter (set_cycle) where a pause costs no swap. A
// client entering the queue is throttled only below the entry level R / 2, where new buckets
// start: a new client runs at once, and because the level then stays within [-overshoot, R] the
// billed share over any interval T is within (R / 2 + overshoot) / T of the cap (R <= cycle / 4).
//
// Contract: rates are piecewise constant; the owner calls settle(now) before changing them and
// before reading level(). Time must not go backwards.
#pragma once

#include <algorithm>
#include <optional>

#include "common/mono_time.h"

namespace nvshare::policy {

class QuotaLedger {
 public:
  // Levels within this of a threshold count as at it (deadlines are rounded to whole nanoseconds).
  static constexpr double kEpsilonSeconds = 1e-6;

  // A new bucket for a client capped at `cap` (0 < cap <= 1) that cycles every `cycle` (at most
  // the window) starts at the entry level of that cycle, so the client can run at once but cannot
  // open with a burst longer than half its resume level.
  QuotaLedger(double cap, Duration window, Duration cycle, MonoTime now);

  // Books the time since the last settle at the rates then in force.
  void settle(MonoTime now);
  // New effective cap, billing rate and window from the last settle on, and whether the client
  // wants the GPU. When it does not, or when the depth shrinks (a lower cap, a shorter window), the
  // level is clamped to the depth.
  void set_rates(double cap, double billed_rate, Duration window, bool wants_gpu);
  // The on/off cycle of a throttled client (the window when never set; at most the window).
  void set_cycle(Duration cycle) { cycle_s_ = to_seconds(cycle); }

  // Bills `seconds` of hold time at once (settle first): time that was not billed as it passed.
  void charge(double seconds) { level_ -= seconds; }

  double level() const { return level_; }  // seconds, as of the last settle
  double level_at(MonoTime now) const;     // projected to `now` without settling
  double cap() const { return cap_; }
  double billed_rate() const { return billed_rate_; }
  double depth() const { return cap_ * window_s_; }
  double resume_level() const { return cap_ * (1 - cap_) * std::min(cycle_s_, window_s_); }
  double entry_level() const { return resume_level() / 2; }

  bool spent() const { return level_ <= kEpsilonSeconds; }
  bool refilled() const { return level_ >= resume_level() - kEpsilonSeconds; }
  bool may_enter() const { return level_ >= entry_level() - kEpsilonSeconds; }
  // When the level reaches 0 (resp. the resume level) at the current rates; nullopt when it is not
  // moving that way. A time at or before the last settle means "already".
  std::optional<MonoTime> spent_at() const;
  std::optional<MonoTime> refilled_at() const;

 private:
  double cap_;
  double billed_rate_ = 0;
  double window_s_;
  double cycle_s_;
  double level_;
  bool wants_gpu_ = false;
  MonoTime settled_at_;
};

}  // namespace nvshare::policy
