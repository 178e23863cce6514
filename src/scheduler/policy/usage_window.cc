#include "scheduler/policy/usage_window.h"

#include <algorithm>

namespace nvshare::policy {

void UsageWindow::settle(MonoTime now, Duration keep) {
  if (now > settled_at_ && rate_ > 0) {
    total_s_ += rate_ * to_seconds(now - settled_at_);
    if (!segments_.empty() && segments_.back().end == settled_at_ &&
        segments_.back().rate == rate_) {
      segments_.back().end = now;  // same rate as before: extend rather than grow the list
    } else {
      segments_.push_back({settled_at_, now, rate_});
    }
  }
  settled_at_ = std::max(settled_at_, now);
  while (!segments_.empty() && segments_.front().end + keep < now) segments_.pop_front();
}

double UsageWindow::total_seconds(MonoTime now) const {
  return total_s_ + (now > settled_at_ ? rate_ * to_seconds(now - settled_at_) : 0);
}

double UsageWindow::share(MonoTime now, Duration window) const {
  if (window <= Duration::zero()) return 0;
  const MonoTime from = now - window;
  double billed = 0;
  auto book = [&](MonoTime begin, MonoTime end, double rate) {
    const MonoTime b = std::max(begin, from);
    const MonoTime e = std::min(end, now);
    if (e > b) billed += rate * to_seconds(e - b);
  };
  for (const Segment& s : segments_) book(s.begin, s.end, s.rate);
  if (rate_ > 0) book(settled_at_, now, rate_);
  return billed / to_seconds(window);
}

}  // namespace nvshare::policy
