// UsageWindow: the GPU time billed to one client, in total and over the last window.
//
// Every client is measured (status shows an uncapped client's share too); only capped clients are
// also charged against a QuotaLedger. The rate is 1/n while the client is one of n grant holders,
// else 0.
//
// Contract: the owner calls settle(now) before changing the rate; time must not go backwards.
// Memory is bounded by the number of rate changes within `keep` of the last settle; share() over a
// window no longer than `keep` is exact and takes O(log segments) (each segment knows the total
// billed before it), so a status or metrics snapshot of many busy clients stays cheap.
#pragma once

#include <deque>

#include "common/mono_time.h"

namespace nvshare::policy {

class UsageWindow {
 public:
  explicit UsageWindow(MonoTime now) : settled_at_(now) {}

  // Books [last settle, now) at the current rate and forgets segments that ended before now - keep.
  void settle(MonoTime now, Duration keep);
  void set_rate(double rate) { rate_ = rate; }
  double rate() const { return rate_; }

  // Billed seconds since the start, projected to `now`.
  double total_seconds(MonoTime now) const;
  // Billed seconds within (now - window, now] divided by the window (0..1).
  double share(MonoTime now, Duration window) const;

 private:
  struct Segment {
    MonoTime begin;
    MonoTime end;
    double rate;
    double before;  // billed seconds before `begin`
  };
  // Billed seconds up to `t` (at or after the oldest segment kept).
  double total_at(MonoTime t) const;
  std::deque<Segment> segments_;
  double rate_ = 0;
  double total_s_ = 0;
  MonoTime settled_at_;
};

}  // namespace nvshare::policy
