#include "scheduler/policy/quota.h"

#include <algorithm>
#include <cmath>

namespace nvshare::policy {
namespace {

// Rates closer to zero than this count as zero: caps scaled to exactly 1/n (say 73% x 100/146
// beside one other holder) must not produce a deadline centuries away from rounding noise.
constexpr double kStillRate = 1e-9;
// Deadlines are capped well inside the range of MonoTime.
constexpr double kFarSeconds = 1e9;

// Rounded up, so that at the returned time the threshold has been reached.
MonoTime after_seconds(MonoTime from, double s) {
  return from +
         Duration(static_cast<std::int64_t>(std::ceil(std::clamp(s, 0.0, kFarSeconds) * 1e9)));
}

}  // namespace

QuotaLedger::QuotaLedger(double cap, Duration window, Duration cycle, MonoTime now)
    : cap_(cap),
      window_s_(to_seconds(window)),
      cycle_s_(to_seconds(cycle)),
      level_(0),
      settled_at_(now) {
  level_ = entry_level();
}

double QuotaLedger::level_at(MonoTime now) const {
  if (now <= settled_at_) return level_;
  const double moved = level_ + (cap_ - billed_rate_) * to_seconds(now - settled_at_);
  // A rising level stops at the depth unless the client wants the GPU; a level already above it
  // is kept.
  if (moved <= level_ || wants_gpu_) return moved;
  return std::min(moved, std::max(level_, depth()));
}

void QuotaLedger::settle(MonoTime now) {
  if (now <= settled_at_) return;
  level_ = level_at(now);
  settled_at_ = now;
}

void QuotaLedger::set_rates(double cap, double billed_rate, Duration window, bool wants_gpu) {
  const double old_depth = depth();
  cap_ = cap;
  billed_rate_ = billed_rate;
  window_s_ = to_seconds(window);
  wants_gpu_ = wants_gpu;
  // What a waiting client is owed past the depth it keeps, unless the terms shrink.
  if (!wants_gpu || depth() < old_depth) level_ = std::min(level_, depth());
}

std::optional<MonoTime> QuotaLedger::spent_at() const {
  if (spent()) return settled_at_;
  const double falling = billed_rate_ - cap_;
  if (falling <= kStillRate) return std::nullopt;
  return after_seconds(settled_at_, level_ / falling);
}

std::optional<MonoTime> QuotaLedger::refilled_at() const {
  if (refilled()) return settled_at_;
  const double rising = cap_ - billed_rate_;
  if (rising <= kStillRate) return std::nullopt;
  return after_seconds(settled_at_, (resume_level() - level_) / rising);
}

}  // namespace nvshare::policy
