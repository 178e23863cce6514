#include "scheduler/policy/usage_window.h"

#include <algorithm>

namespace nvshare::policy {

void UsageWindow::settle(MonoTime now, Duration keep) {
  if (now > settled_at_ && rate_ > 0) {
    if (!segments_.empty() && segments_.back().end == settled_at_ &&
        segments_.back().rate == rate_) {
      segments_.back().end = now;  // same rate as before: extend rather than grow the list
    } else {
      segments_.push_back({settled_at_, now, rate_, total_s_});
    }
    total_s_ += rate_ * to_seconds(now - settled_at_);
  }
  settled_at_ = std::max(settled_at_, now);
  while (!segments_.empty() && segments_.front().end + keep < now) segments_.pop_front();
}

double UsageWindow::total_seconds(MonoTime now) const {
  return total_s_ + (now > settled_at_ ? rate_ * to_seconds(now - settled_at_) : 0);
}

double UsageWindow::total_at(MonoTime t) const {
  if (t >= settled_at_) return total_seconds(t);
  // The first segment still running at t; none: t falls after every segment, in a gap at rate 0.
  const auto it = std::partition_point(segments_.begin(), segments_.end(),
                                       [t](const Segment& s) { return s.end <= t; });
  if (it == segments_.end()) return total_s_;
  if (t <= it->begin) return it->before;
  return it->before + it->rate * to_seconds(t - it->begin);
}

double UsageWindow::share(MonoTime now, Duration window) const {
  if (window <= Duration::zero()) return 0;
  return (total_at(now) - total_at(now - window)) / to_seconds(window);
}

}  // namespace nvshare::policy
