// A GpuPolicy on a manual timeline, with helpers that read actions, for the policy unit tests.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <vector>

#include "scheduler/policy/gpu_policy.h"

namespace nvshare::policy::testing {

using namespace std::chrono_literals;

inline constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

// Actions of one type, in order.
template <typename T>
std::vector<T> only(const std::vector<Action>& actions) {
  std::vector<T> out;
  for (const Action& a : actions) {
    if (const T* t = std::get_if<T>(&a)) out.push_back(*t);
  }
  return out;
}

inline bool granted(const std::vector<Action>& actions, ClientId client) {
  for (const SendGrant& g : only<SendGrant>(actions)) {
    if (g.client == client) return true;
  }
  return false;
}

inline std::optional<SendRevoke> revoke_of(const std::vector<Action>& actions, ClientId client) {
  for (const SendRevoke& r : only<SendRevoke>(actions)) {
    if (r.client == client) return r;
  }
  return std::nullopt;
}

inline std::optional<WaitReason> wait_of(const std::vector<Action>& actions, ClientId client) {
  std::optional<WaitReason> reason;
  for (const SendWait& w : only<SendWait>(actions)) {
    if (w.client == client) reason = w.reason;
  }
  return reason;
}

// Quota deadlines come from floating-point arithmetic rounded up to whole nanoseconds.
#define EXPECT_TIME_NEAR(got, want)                                                            \
  do {                                                                                         \
    const std::optional<MonoTime> got_ = (got);                                                \
    const MonoTime want_ = (want);                                                             \
    ASSERT_TRUE(got_.has_value());                                                             \
    EXPECT_LE(std::chrono::abs(got_->since_origin - want_.since_origin),                       \
              std::chrono::microseconds(1))                                                    \
        << "got " << got_->since_origin.count() << " ns, want " << want_.since_origin.count(); \
  } while (0)

class Harness {
 public:
  // No default: each test names the mode it is about (most are about co-running: auto).
  explicit Harness(PolicyConfig config) : policy(std::move(config)) {}

  std::vector<Action> feed(const Event& event) {
    last = policy.handle(event, now);
    for (const SendRevoke& r : only<SendRevoke>(last)) swap_asked[r.client] = r.swap_out;
    return last;
  }

  // Registers a client with a working set.
  std::vector<Action> add(ClientId id, std::uint64_t working_set, std::uint8_t core_percent = 100) {
    std::vector<Action> out = feed(Registered{id, Limits{0, core_percent}});
    feed(UsageReported{id, working_set, working_set, 0, {}});
    return out;
  }
  // Registers a client whose memory is on the host (it will have to come in for it to run), not
  // parked on the device.
  std::vector<Action> add_on_host(ClientId id, std::uint64_t working_set) {
    std::vector<Action> out = add(id, working_set);
    swapped_out(id);
    return out;
  }
  std::vector<Action> request(ClientId id) { return feed(Requested{id}); }
  std::vector<Action> add_and_request(ClientId id, std::uint64_t working_set,
                                      std::uint8_t core_percent = 100) {
    add(id, working_set, core_percent);
    return request(id);
  }
  // Releases the client's current grant. After a revoke that asked for a swap-out, first reports
  // its memory moved to the host (all but the pinned bytes), as the library does.
  std::vector<Action> release(ClientId id) {
    if (swap_asked[id] && state(id) != ClientState::kRunning) swapped_out(id);
    swap_asked[id] = false;
    return feed(Released{id, epoch(id), 0ms, 0ms});
  }

  // A client without a grant moved its memory to the host (all but the pinned bytes), as the
  // library does when evicted; returns the actions of its usage report.
  std::vector<Action> swapped_out(ClientId id) {
    const ClientView c = client(id);
    return feed(UsageReported{id, c.allocated_bytes, c.pinned_bytes, 0, {}, c.pinned_bytes});
  }
  // Answers every eviction in `actions`; returns the actions of the answers, in order.
  std::vector<Action> answer_evictions(const std::vector<Action>& actions) {
    std::vector<Action> all;
    for (const SendEvict& e : only<SendEvict>(actions)) {
      for (const Action& a : swapped_out(e.client)) all.push_back(a);
    }
    return all;
  }
  // Moves time forward to `now + d`, firing every deadline on the way; returns all actions.
  std::vector<Action> advance(Duration d) {
    const MonoTime target = now + d;
    std::vector<Action> all;
    while (policy.next_deadline() && *policy.next_deadline() <= target) {
      EXPECT_GT(*policy.next_deadline(), now) << "a deadline must lie in the future";
      now = *policy.next_deadline();
      for (const Action& a : feed(DeadlineReached{})) all.push_back(a);
    }
    now = target;
    return all;
  }
  // Moves time to the next deadline and fires it.
  std::vector<Action> fire() {
    EXPECT_TRUE(policy.next_deadline().has_value());
    if (!policy.next_deadline()) return {};
    now = *policy.next_deadline();
    return feed(DeadlineReached{});
  }

  ClientView client(ClientId id) const {
    for (const ClientView& c : policy.view(now).clients) {
      if (c.client == id) return c;
    }
    ADD_FAILURE() << "no client " << id;
    return {};
  }
  ClientState state(ClientId id) const { return client(id).state; }
  GrantEpoch epoch(ClientId id) const { return client(id).epoch; }

  GpuPolicy policy;
  MonoTime now{100s};
  std::vector<Action> last;
  std::map<ClientId, bool> swap_asked;  // the last revoke of each client asked for a swap-out
};

// The default configuration in the given mode on a 24 GiB GPU (its memory as the device reports
// it), 10% reserve, except that capped clients cycle by 0.5 s (the turn slice): the times these
// tests work out assume it (Caps.TheDefaultCycleIsAQuarterSecond pins the default). Auto unless
// named, since the tests that build on these helpers are mostly about who runs together.
inline PolicyConfig device_gpu(Mode mode = Mode::kAuto) {
  PolicyConfig config;
  config.mode = mode;
  config.device_bytes = 24 * kGiB;
  config.cap_cycle = config.turn_slice;
  return config;
}

// Registers a client that takes byte targets (protocol version 10), and room where `takes_room`
// (version 12), its `bytes` on the device.
inline void add_partial(Harness& h, ClientId id, std::uint64_t bytes, bool takes_room = false) {
  h.feed(Registered{id, Limits{}, /*evictable=*/true, /*partial_swap=*/true, takes_room});
  h.feed(UsageReported{id, bytes, bytes, 0, {}});
}

// The client reports `resident` of its memory on the device (it moved the rest out, or back).
inline std::vector<Action> keeps(Harness& h, ClientId id, std::uint64_t resident) {
  return h.feed(UsageReported{id, h.client(id).allocated_bytes, resident, 0, {}});
}

// Advances 100 ms at a time (20 s at most) until `id` is revoked; returns everything the engine did
// at that step (nothing when it never was).
inline std::vector<Action> until_revoked(Harness& h, ClientId id) {
  for (int i = 0; i < 200; ++i) {
    std::vector<Action> step = h.advance(std::chrono::milliseconds(100));
    if (revoke_of(step, id)) return step;
  }
  return {};
}

// A configuration with a known capacity: 20 GiB virtual on the 24 GiB GPU, 10% reserve, so 18 GiB
// usable.
inline PolicyConfig virtual_gpu(Mode mode = Mode::kAuto) {
  PolicyConfig config = device_gpu(mode);
  config.capacity_bytes = 20 * kGiB;
  return config;
}

}  // namespace nvshare::policy::testing
