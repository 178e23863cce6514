#include "simulation.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <functional>
#include <optional>
#include <queue>

#include "rng.h"
#include "scheduler/policy/gpu_policy.h"
#include "sweep_knobs.h"

namespace nvshare::sim {
namespace {

using namespace std::chrono_literals;
using policy::Action;
using policy::ClientId;
using policy::ClientState;
using policy::GpuPolicy;
using policy::GpuView;
using policy::GrantEpoch;
using policy::Mode;
using policy::WaitReason;

double seconds(Duration d) { return static_cast<double>(d.count()) / 1e9; }
Duration from_seconds(double s) { return Duration(static_cast<std::int64_t>(s * 1e9)); }

std::string fmt_time(MonoTime t) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.6f", seconds(t.since_origin));
  return buffer;
}

struct SimClient {
  ClientSpec spec;
  Behaviour behaviour = Behaviour::kComputeBound;
  ClientId id = 0;
  bool connected = false;
  bool wants = false;  // has work: asked for the GPU, or was preempted in the middle of it
  GrantEpoch holding = 0;
  MonoTime hold_since{};
  Duration shared_this_grant{0};  // held beside a lower class during its current (or last) grant
  bool revoked = false;
  MonoTime revoked_at{};
  bool swap_out = false;
  std::uint64_t swap_bytes = 0;  // with swap_out: what the revoke asked it to move (0: all)
  policy::RevokeReason revoke_reason = policy::RevokeReason::kTurn;
  bool unresponsive = false;
  bool hanging = false;
  int revokes_answered = 0;
  GrantEpoch noticed = 0;    // the grant a swap notice was last sent for
  GrantEpoch contended = 0;  // the grant SendContended was last sent for
  MonoTime noticed_at{};
  std::optional<MonoTime> host_copies_at;  // when its host copies are (or were) made
  // Bytes it moved to the host (a swap-out, an eviction); its next grant swaps them back in.
  std::uint64_t on_host = 0;
  // Evictions: the last one asked (its answer is ignored once a grant overtook it), and whether it
  // let one run out (a hung client): its memory no longer counts for the engine until it runs.
  std::uint64_t eviction = 0;
  bool eviction_pending = false;
  std::uint64_t eviction_bytes = 0;      // what the pending one asked for (0: all)
  std::uint32_t evictions_answered = 0;  // reported with its usage, as the library does
  MonoTime eviction_sent_at{};
  // The swap-out or eviction under way moves a chunk at a time and reports after each, as the
  // library does: what it will move in all (for a byte target) and what it moved so far.
  std::uint64_t moving_total = 0;
  std::uint64_t moved_so_far = 0;
  // Room (SendRoom): the last given in this wait, and the swap-in into it under way (room_seq
  // tells a current one from one a grant or an eviction overtook).
  std::uint64_t room = 0;
  std::uint64_t room_bytes = 0;
  std::uint64_t room_seq = 0;
  bool room_busy = false;
  std::uint64_t allocated = 0;
  Limits limits;
  // The current wait.
  MonoTime wait_since{};
  Duration excused_wait{0};  // for quota, or for a higher class (no bound applies)
  std::optional<WaitReason> reason;
  MonoTime reason_since{};
  // The current reason came while its quota bucket was in debt (below zero): it ran past its
  // entitlement (a holder that ignored its revoke), and waits for its bucket whatever the reason
  // says while the capped clients' pauses let it ask.
  bool reason_in_debt = false;
  // A limit change on its way to the client.
  std::optional<Limits> pending_limits;
  MonoTime pending_since{};
  // This connection.
  ConnectionOutcome outcome;
  MonoTime connected_at{};
};

enum class What {
  kConnect,
  kRequest,
  kRelease,
  kUsage,
  kPace,
  kDisconnect,
  kLimitChange,
  kStaleRelease,
  kEvicted,    // an eviction's swap-out is done (epoch: the eviction it answers)
  kSwapStep,   // a chunk of a revoke's swap-out moved (epoch: the grant)
  kEvictStep,  // a chunk of an eviction moved (epoch: the eviction)
  kRoomIn,     // a swap-in into room is done (epoch: room_seq)
};

struct SimEvent {
  MonoTime at;
  std::uint64_t seq = 0;
  What what = What::kRequest;
  int client = -1;
  GrantEpoch epoch = 0;
  bool operator>(const SimEvent& other) const {
    return at != other.at ? at > other.at : seq > other.seq;
  }
};

class World {
 public:
  World(const Scenario& scenario, bool trace)
      : s_(scenario), rng_(scenario.seed * 7919 + 17), engine_(scenario.config), trace_(trace) {
    for (const ClientSpec& spec : s_.clients) {
      SimClient c;
      c.spec = spec;
      c.behaviour = spec.behaviour;
      clients_.push_back(c);
    }
    compute_bound();
  }

  SimResult run() {
    for (int i = 0; i < static_cast<int>(clients_.size()); ++i) {
      schedule(MonoTime{} + clients_[i].spec.start, What::kConnect, i);
    }
    if (s_.limit_change_every > 0s) {
      schedule(MonoTime{} + s_.limit_change_every, What::kLimitChange, -1);
    }
    const MonoTime end = MonoTime{} + s_.length;
    while (result_.ok) {
      const std::optional<MonoTime> deadline = engine_.next_deadline();
      const MonoTime next_event = queue_.empty() ? MonoTime::max() : queue_.top().at;
      const MonoTime t = std::min(deadline.value_or(MonoTime::max()), next_event);
      if (t > end) break;
      advance(t);
      if (deadline && *deadline <= next_event) {
        feed(policy::DeadlineReached{}, "deadline");
      } else {
        const SimEvent e = queue_.top();
        queue_.pop();
        deliver(e);
      }
    }
    if (result_.ok) finish(end);
    result_.trace.assign(trace_lines_.begin(), trace_lines_.end());
    return result_;
  }

 private:
  // ---- time and bookkeeping ----

  void compute_bound() {
    const PolicyConfig& config = s_.config;
    const Duration max_quantum = config.fixed_quantum.value_or(config.quantum_max);
    double slowest = static_cast<double>(config.default_swap_bytes_per_s);
    std::uint64_t largest = 0;
    for (const ClientSpec& c : s_.clients) {
      slowest = std::min(slowest, c.swap_bytes_per_s);
      largest = std::max(largest, c.working_set);
    }
    // Working sets grow up to 1.5x; the engine's grace adds the swap-out estimate at its bandwidth,
    // at most swap_allowance_max (all of it for a client that lies about itself).
    Duration longest_swap = from_seconds(1.5 * static_cast<double>(largest) / slowest);
    for (const ClientSpec& c : s_.clients) {
      if (c.lies()) longest_swap = config.swap_allowance_max;
    }
    longest_swap = std::min(longest_swap, config.swap_allowance_max) + 1ms;
    // docs/scheduling.md, "The starvation bound": N x Q + (2N - 1) x (G + S).
    const std::int64_t n = static_cast<std::int64_t>(s_.clients.size());
    result_.starvation_bound = n * max_quantum + (2 * n - 1) * (config.revoke_grace + longest_swap);
  }

  void advance(MonoTime t) {
    if (t <= now_) return;
    int holders = 0;
    for (const SimClient& c : clients_) holders += c.connected && c.holding ? 1 : 0;
    for (SimClient& c : clients_) {
      if (c.connected && c.holding) bill(c.outcome, now_, t, holders);
    }
    for (SimClient& c : clients_) {
      if (!c.connected || !c.holding) continue;
      const bool lower_holds = std::any_of(
          clients_.begin(), clients_.end(),
          [&](const SimClient& o) { return o.connected && o.holding && rank(o) < rank(c); });
      if (lower_holds) {
        c.outcome.shared_with_lower += t - now_;
        c.shared_this_grant += t - now_;
      }
    }
    bool someone_waits = false;
    for (const SimClient& c : clients_) someone_waits |= c.connected && c.wants && !c.holding;
    if (holders == 0 && someone_waits) result_.idle_while_waiting += t - now_;
    if (holders >= 2) {
      result_.together += t - now_;
      for (MonoTime from = now_; from < t;) {
        const std::int64_t second = from.since_origin / 1s;
        const MonoTime end = std::min(t, MonoTime{} + std::chrono::seconds(second + 1));
        auto& per = result_.together_per_second;
        if (per.size() <= static_cast<std::size_t>(second)) {
          per.resize(static_cast<std::size_t>(second) + 1, 0.0);
        }
        per[static_cast<std::size_t>(second)] += seconds(end - from);
        from = end;
      }
    }
    now_ = t;
  }

  // Books [from, to) at 1/holders into the total and into the whole seconds it spans.
  static void bill(ConnectionOutcome& o, MonoTime from, MonoTime to, int holders) {
    o.billed_seconds += seconds(to - from) / holders;
    while (from < to) {
      const std::int64_t second = from.since_origin / 1s;
      const MonoTime end = std::min(to, MonoTime{} + std::chrono::seconds(second + 1));
      if (o.billed_per_second.size() <= static_cast<std::size_t>(second)) {
        o.billed_per_second.resize(static_cast<std::size_t>(second) + 1, 0.0);
      }
      o.billed_per_second[static_cast<std::size_t>(second)] += seconds(end - from) / holders;
      from = end;
    }
  }

  void schedule(MonoTime at, What what, int client, GrantEpoch epoch = 0) {
    queue_.push(SimEvent{at, seq_++, what, client, epoch});
  }

  void log(const std::string& line) {
    if (!trace_) return;
    trace_lines_.push_back(fmt_time(now_) + "  " + line);
    if (trace_lines_.size() > trace_kept_) trace_lines_.pop_front();
  }

  void fail(const std::string& what) {
    if (!result_.ok) return;
    result_.ok = false;
    result_.failure = "t=" + fmt_time(now_) + " s: " + what;
    log("FAILED: " + what);
  }

  SimClient* by_id(ClientId id) {
    for (SimClient& c : clients_) {
      if (c.connected && c.id == id) return &c;
    }
    return nullptr;
  }

  std::string name(const SimClient& c) const {
    return "c" + std::to_string(c.id) + "(" + to_string(c.behaviour) + ")";
  }

  void start_wait(SimClient& c) {
    c.wait_since = now_;
    c.excused_wait = 0s;
    c.reason.reset();
    c.reason_in_debt = false;
  }

  static bool excused(std::optional<WaitReason> reason) {
    return reason == WaitReason::kQuota || reason == WaitReason::kPriority;
  }
  static bool excused(const SimClient& c) { return excused(c.reason) || c.reason_in_debt; }

  // Time spent waiting for turn or memory in the current wait (waiting for quota, or for a higher
  // class, which has no bound by design, excluded).
  Duration bounded_wait(const SimClient& c) const {
    Duration other = c.excused_wait;
    if (excused(c)) other += now_ - c.reason_since;
    return (now_ - c.wait_since) - other;
  }

  bool in_debt(ClientId id) const {
    for (const policy::ClientView& v : engine_.view(now_).clients) {
      if (v.client == id) return v.budget_left && *v.budget_left < Duration::zero();
    }
    return false;
  }

  void check_wait(SimClient& c) {
    const Duration waited = bounded_wait(c);
    result_.worst_wait = std::max(result_.worst_wait, waited);
    c.outcome.worst_wait = std::max(c.outcome.worst_wait, now_ - c.wait_since);
    if (waited > result_.starvation_bound) {
      fail(name(c) + " waited " + std::to_string(seconds(waited)) +
           " s for turn or memory, over the bound of " +
           std::to_string(seconds(result_.starvation_bound)) + " s\n" + dump(engine_.view(now_)));
    }
  }

  // ---- the engine ----

  void feed(const policy::Event& event, const std::string& what) {
    log("-> " + what);
    ++result_.engine_events;
    const std::vector<Action> actions = engine_.handle(event, now_);
    bool granted = false;
    for (const Action& a : actions) {
      granted |= std::holds_alternative<policy::SendGrant>(a);
      apply(a);
    }
    check_state(granted);
    if (std::holds_alternative<policy::Released>(event) && stale_pending_ && !actions.empty()) {
      fail("a stale release produced actions");
    }
    stale_pending_ = false;
  }

  void apply(const Action& action) {
    std::visit([&](const auto& a) { on_action(a); }, action);
  }

  void on_action(const policy::SendGrant& a) {
    SimClient* c = by_id(a.client);
    log("<- grant c" + std::to_string(a.client) + " epoch " + std::to_string(a.epoch));
    if (c == nullptr) return fail("grant to unknown client " + std::to_string(a.client));
    if (!c->wants || c->holding) return fail("grant to " + name(*c) + ", which did not wait");
    if (a.epoch <= last_epoch_) return fail("grant epochs must grow");
    last_epoch_ = a.epoch;
    ++result_.grants;
    check_wait(*c);
    if (c->spec.step > 0s && c->shared_this_grant * 10 > c->spec.step) ++c->outcome.steps_slowed;
    c->shared_this_grant = Duration::zero();
    c->holding = a.epoch;
    c->hold_since = now_;
    if (c->on_host > 0) {
      const Duration swap_in =
          from_seconds(static_cast<double>(c->on_host) / c->spec.swap_bytes_per_s);
      result_.swap_time += swap_in;
      result_.handoff_time += swap_in;
      c->on_host = 0;
    }
    end_room(*c);
    c->revoked = false;
    c->unresponsive = false;
    c->hanging = false;
    c->eviction_pending = false;  // the grant overtakes it: its memory is its working set
    const int index = static_cast<int>(c - clients_.data());
    if (c->behaviour == Behaviour::kBursty) {
      schedule(now_ + rng_.between(50ms, 2s), What::kRelease, index, a.epoch);
    } else if (c->behaviour == Behaviour::kIdle) {
      schedule(now_ + rng_.between(10ms, 300ms), What::kRelease, index, a.epoch);
    }
  }

  void on_action(const policy::SendRevoke& a) {
    SimClient* c = by_id(a.client);
    log("<- revoke c" + std::to_string(a.client) + " epoch " + std::to_string(a.epoch) +
        " reason " + std::string(protocol::to_string(a.reason)) + (a.swap_out ? " swap-out" : ""));
    if (c == nullptr) return fail("revoke to unknown client " + std::to_string(a.client));
    if (c->holding != a.epoch || c->revoked) {
      return fail("revoke of " + name(*c) + " for epoch " + std::to_string(a.epoch) +
                  " it does not hold unrevoked");
    }
    ++result_.revokes;
    result_.quota_revokes += a.reason == policy::RevokeReason::kQuota ? 1 : 0;
    result_.swap_outs += a.swap_out ? 1 : 0;
    c->outcome.swap_outs += a.swap_out ? 1 : 0;
    c->revoked = true;
    c->revoked_at = now_;
    c->swap_out = a.swap_out;
    c->swap_bytes = a.swap_bytes;
    if (a.swap_bytes > 0 && c->spec.chunk == 0) {
      return fail("a byte target sent to " + name(*c) + ", which moves all or nothing");
    }
    c->revoke_reason = a.reason;
    const int index = static_cast<int>(c - clients_.data());
    if (c->behaviour == Behaviour::kHung && c->revokes_answered >= c->spec.hang_after_revokes &&
        !c->outcome.hung) {
      c->hanging = true;
      c->outcome.hung = true;
      if (c->spec.wake_after > 0s)
        schedule(now_ + c->spec.wake_after, What::kRelease, index, a.epoch);
      return;
    }
    ++c->revokes_answered;
    Duration delay = rng_.between(0ms, max_drain(*c));
    if (a.swap_out && a.reason == policy::RevokeReason::kTurn) {
      ++result_.turn_swap_outs;
      if (c->noticed == a.epoch) {
        ++result_.noticed_swap_outs;
        result_.least_notice_lead = std::min(result_.least_notice_lead, now_ - c->noticed_at);
      }
    }
    if (a.swap_out) {
      const Duration prepared = host_copies_left(*c);
      result_.host_copy_waits += prepared;
      delay += prepared;
      delay += start_moving(*c, a.swap_bytes, now_ + delay, What::kSwapStep, a.epoch);
    }
    schedule(now_ + delay, What::kRelease, index, a.epoch);
  }

  // The client that advice for grant `epoch` (a yield, a swap notice) goes to, which must hold
  // that grant unrevoked; null, with the run failed, otherwise.
  SimClient* unrevoked_holder(ClientId client, GrantEpoch epoch, const std::string& what) {
    SimClient* c = by_id(client);
    log("<- " + what + " c" + std::to_string(client) + " epoch " + std::to_string(epoch));
    if (c == nullptr) {
      fail(what + " to unknown client " + std::to_string(client));
      return nullptr;
    }
    if (c->holding != epoch || c->revoked) {
      fail(what + " to " + name(*c) + " for epoch " + std::to_string(epoch) +
           ", which it does not hold unrevoked");
      return nullptr;
    }
    return c;
  }

  void on_action(const policy::SendYield& a) {
    SimClient* c = unrevoked_holder(a.client, a.epoch, "yield");
    if (c == nullptr) return;
    ++result_.yields;
    // A client of steps hands over at the end of the current one (after the library's 200 us of
    // idleness); the others keep their grant until revoked or idle as before.
    if (stepped(*c)) {
      const int index = static_cast<int>(c - clients_.data());
      schedule(now_ + rng_.between(0ms, c->spec.step) + 200us, What::kRelease, index, a.epoch);
    }
  }

  void on_action(const policy::SendSwapNotice& a) {
    SimClient* c = unrevoked_holder(a.client, a.epoch, "swap notice");
    if (c == nullptr) return;
    if (c->noticed == a.epoch) return fail("a second swap notice to " + name(*c) + " for a grant");
    ++result_.swap_notices;
    c->noticed = a.epoch;
    c->noticed_at = now_;
    start_host_copies(*c);
  }

  // Advice to a holder of a higher class that a lower class waits (the library releases at its
  // next pause; the clients here release at the end of a burst or step as ever).
  void on_action(const policy::SendContended& a) {
    SimClient* c = unrevoked_holder(a.client, a.epoch, "contended");
    if (c == nullptr) return;
    if (c->contended == a.epoch) return fail("a second contended to " + name(*c) + " for a grant");
    c->contended = a.epoch;
    ++result_.contended;
    const bool lower_waits = std::any_of(clients_.begin(), clients_.end(), [&](const SimClient& o) {
      return o.connected && o.wants && !o.holding && rank(o) < rank(*c);
    });
    if (!lower_waits) fail("contended sent to " + name(*c) + " while no lower class waits");
  }

  void on_action(const policy::SendEvict& a) {
    SimClient* c = by_id(a.client);
    log("<- evict c" + std::to_string(a.client) +
        (a.bytes > 0 ? " " + std::to_string(a.bytes) + " bytes" : std::string()));
    if (c == nullptr) return fail("evict to unknown client " + std::to_string(a.client));
    if (c->holding) return fail("evict sent to " + name(*c) + ", which holds a grant");
    if (resident(*c) == 0 && !c->spec.lies()) {  // a liar's reports may say anything
      return fail("evict sent to " + name(*c) + ", whose memory is on the host\n" +
                  dump(engine_.view(now_)));
    }
    if (a.bytes > 0 && c->spec.chunk == 0) {
      return fail("a byte target sent to " + name(*c) + ", which moves all or nothing");
    }
    if (c->eviction_pending) return fail("a second evict to " + name(*c) + " before its answer");
    ++result_.evictions;
    c->eviction_pending = true;
    c->eviction_sent_at = now_;
    c->eviction_bytes = a.bytes;
    ++c->eviction;
    end_room(*c);  // it stops bringing memory back: it moves memory out now
    // A hung client never answers: its memory stops counting after the deadline.
    if (c->behaviour == Behaviour::kHung) return;
    const MonoTime from = now_ + host_copies_left(*c);
    const Duration swap = start_moving(*c, a.bytes, from, What::kEvictStep, c->eviction);
    schedule(from + swap, What::kEvicted, static_cast<int>(c - clients_.data()), c->eviction);
  }

  void on_action(const policy::SendRoom& a) {
    SimClient* c = by_id(a.client);
    log("<- room c" + std::to_string(a.client) + " " + std::to_string(a.bytes) + " bytes");
    if (c == nullptr) return fail("room to unknown client " + std::to_string(a.client));
    if (c->holding || !c->wants) return fail("room sent to " + name(*c) + ", which does not wait");
    if (c->spec.chunk == 0 || !c->spec.takes_room) {
      return fail("room sent to " + name(*c) + ", which does not take it");
    }
    if (a.bytes <= c->room) return fail("room for " + name(*c) + " no larger than the last");
    if (a.bytes > c->allocated && !c->spec.lies()) {
      return fail("room for " + name(*c) + " larger than its memory");
    }
    // The room never puts the device over usable memory, by the simulation's account: what the
    // others have there, and all the room filled.
    const GpuView view = engine_.view(now_);
    std::uint64_t others = 0;
    for (const SimClient& o : clients_) {
      if (&o == c || !o.connected || o.allocated == 0) continue;
      if (o.spec.lies()) return;  // their word cannot be taken: the check is off
      if (o.holding ? o.unresponsive : given_up(o, view)) continue;
      others += resident(o);
    }
    if (view.usable_bytes > 0 && others + a.bytes > view.usable_bytes) {
      return fail("room for " + name(*c) + " of " + std::to_string(a.bytes) + " bytes beside " +
                  std::to_string(others) + " on the device, " + std::to_string(view.usable_bytes) +
                  " usable\n" + dump(view));
    }
    ++result_.rooms;
    c->room = a.bytes;
    start_room_in(*c);
  }

  void evicted(SimClient& c, std::uint64_t eviction) {
    if (!c.connected || c.holding || !c.eviction_pending || eviction != c.eviction) return;
    c.eviction_pending = false;
    ++c.evictions_answered;
    const std::uint64_t moved = rest_to_move(c, c.eviction_bytes);
    c.on_host += moved;
    result_.swap_time += from_seconds(static_cast<double>(moved) / c.spec.swap_bytes_per_s);
    report_usage(
        c, resident(c), static_cast<std::uint64_t>(c.spec.swap_bytes_per_s),
        "usage after eviction " + name(c) + ", " + std::to_string(resident(c)) + " bytes left");
  }

  // A swap-out (or eviction) for `target` bytes that begins at `from`: a client that moves chunks
  // reports after each chunk but the last (kSwapStep or kEvictStep with `epoch`), the last goes
  // with the release (or the eviction's answer). Returns how long it takes.
  Duration start_moving(SimClient& c, std::uint64_t target, MonoTime from, What step,
                        GrantEpoch epoch) {
    c.moving_total = to_move(c, target);
    c.moved_so_far = 0;
    const int index = static_cast<int>(&c - clients_.data());
    if (c.spec.chunk > 0) {
      for (std::uint64_t done = c.spec.chunk; done < c.moving_total; done += c.spec.chunk) {
        schedule(from + from_seconds(static_cast<double>(done) / c.spec.swap_bytes_per_s), step,
                 index, epoch);
      }
    }
    return from_seconds(static_cast<double>(c.moving_total) / c.spec.swap_bytes_per_s);
  }

  // What the end of a swap-out or eviction still moves: all that is left for a target of 0 (or a
  // client that moves all or nothing), else the rest of what it set out to move.
  static std::uint64_t rest_to_move(const SimClient& c, std::uint64_t target) {
    if (target == 0 || c.spec.chunk == 0) return resident(c);
    return std::min(resident(c), c.moving_total - std::min(c.moving_total, c.moved_so_far));
  }

  void move_step(SimClient& c, bool current) {
    if (!c.connected || !current) return;
    const std::uint64_t step = std::min(
        {c.spec.chunk, c.moving_total - std::min(c.moving_total, c.moved_so_far), resident(c)});
    if (step == 0) return;
    c.moved_so_far += step;
    c.on_host += step;
    result_.swap_time += from_seconds(static_cast<double>(step) / c.spec.swap_bytes_per_s);
    report_usage(c, resident(c), 0, "usage while swapping out " + name(c));
  }

  // Room: what fits of its memory on the host comes back, whole chunks while more stays there,
  // one swap-in at a time.
  void start_room_in(SimClient& c) {
    if (c.room_busy || c.on_host == 0 || c.room <= resident(c)) return;
    std::uint64_t bring = std::min(c.on_host, c.room - resident(c));
    if (bring < c.on_host) bring -= bring % c.spec.chunk;
    if (bring == 0) return;
    c.room_busy = true;
    c.room_bytes = bring;
    schedule(now_ + from_seconds(static_cast<double>(bring) / c.spec.swap_bytes_per_s),
             What::kRoomIn, static_cast<int>(&c - clients_.data()), ++c.room_seq);
  }

  void room_in(SimClient& c, std::uint64_t seq) {
    if (!c.connected || c.holding || !c.room_busy || seq != c.room_seq) return;
    c.room_busy = false;
    const std::uint64_t bring = std::min(c.on_host, c.room_bytes);
    c.on_host -= bring;
    result_.room_bytes += bring;
    result_.swap_time += from_seconds(static_cast<double>(bring) / c.spec.swap_bytes_per_s);
    report_usage(c, resident(c), 0, "usage after room " + name(c));
    start_room_in(c);
  }

  // A grant or an eviction ends the room: a swap-in into it under way counts no more.
  static void end_room(SimClient& c) {
    c.room = 0;
    c.room_busy = false;
    ++c.room_seq;
  }

  // Host copies are made once per connection, from a swap notice or at the first swap-out.
  void start_host_copies(SimClient& c) {
    if (c.host_copies_at || c.spec.host_copy_bytes_per_s <= 0) return;
    c.host_copies_at =
        now_ + from_seconds(static_cast<double>(c.allocated) / c.spec.host_copy_bytes_per_s);
  }

  // What a swap-out starting now waits for its host copies.
  Duration host_copies_left(SimClient& c) {
    start_host_copies(c);
    return c.host_copies_at && *c.host_copies_at > now_ ? *c.host_copies_at - now_ : Duration{0};
  }

  static int rank(const SimClient& c) {
    return static_cast<int>(protocol::effective_priority(c.limits.priority));
  }

  Duration max_drain(const SimClient& c) const {
    const bool changed = c.spec.later_max_drain && c.spec.pace_change_at > 0s &&
                         now_ >= c.connected_at + c.spec.pace_change_at;
    return changed ? *c.spec.later_max_drain : c.spec.max_drain;
  }

  static bool stepped(const SimClient& c) {
    return c.behaviour == Behaviour::kComputeBound && c.spec.step > 0s;
  }

  void on_action(const policy::SendWait& a) {
    SimClient* c = by_id(a.client);
    log("<- wait c" + std::to_string(a.client) + " " + std::string(protocol::to_string(a.reason)));
    if (c == nullptr) return fail("wait to unknown client " + std::to_string(a.client));
    if (!c->wants || c->holding) return fail("wait sent to " + name(*c) + ", which does not wait");
    if (c->reason == a.reason) return fail("wait reason repeated without a change");
    if (excused(*c)) c->excused_wait += now_ - c->reason_since;
    c->reason = a.reason;
    c->reason_since = now_;
    c->reason_in_debt = in_debt(a.client);
  }

  void on_action(const policy::SendLimits& a) {
    SimClient* c = by_id(a.client);
    log("<- limits c" + std::to_string(a.client));
    if (c == nullptr) return fail("limits to unknown client " + std::to_string(a.client));
    if (a.limits != c->limits) return fail("limits sent to " + name(*c) + " are not the ones set");
    if (c->pending_limits && *c->pending_limits == a.limits) {
      const Duration latency = now_ - c->pending_since;
      result_.worst_limit_latency = std::max(result_.worst_limit_latency, latency);
      if (latency > 1s) fail("limit change reached " + name(*c) + " after more than 1 s");
      c->pending_limits.reset();
    }
  }

  void on_action(const policy::HolderUnresponsive& a) {
    SimClient* c = by_id(a.client);
    log("<- unresponsive c" + std::to_string(a.client));
    if (c == nullptr) return fail("unresponsive: unknown client " + std::to_string(a.client));
    if (c->holding != a.epoch || !c->revoked || c->unresponsive) {
      return fail("unresponsive reported for " + name(*c) + ", which is not an unanswered revoke");
    }
    if (now_ - c->revoked_at < s_.config.revoke_grace) {
      return fail("unresponsive reported for " + name(*c) + " before its grace period ended");
    }
    // Whatever it reported, a holder stops blocking within the grace and the largest allowance,
    // counted from the revoke or, revoked while it may still swap in, from the end of the largest
    // swap-in estimate.
    const MonoTime from = std::max(c->revoked_at, c->hold_since + s_.config.swap_allowance_max);
    if (now_ - from > s_.config.revoke_grace + s_.config.swap_allowance_max) {
      return fail("unresponsive reported for " + name(*c) + " after grace + swap_allowance_max");
    }
    c->unresponsive = true;
    ++result_.unresponsive;
  }

  // ---- properties after every handle() ----

  // What is on the device by the simulation's account: holders' memory and the memory of clients
  // without a grant that did not swap out, within usable unless one client's is all there is.
  // Clients whose word the engine cannot take are left out: those that lie about their memory (the
  // check is off), holders that ignored a revoke, and clients whose eviction ran past its deadline
  // (hung, or slower than the swap allowance): the engine stops counting both, by design.
  bool device_fits(const GpuView& view) const {
    if (view.usable_bytes == 0) return true;  // capacity unknown: nothing is judged to fit or not
    std::uint64_t bytes = 0;
    int present = 0;
    for (const SimClient& c : clients_) {
      if (!c.connected || c.allocated == 0) continue;
      if (c.spec.lies()) return true;
      if (c.holding ? c.unresponsive : given_up(c, view)) continue;
      if (resident(c) == 0) continue;
      bytes += resident(c);
      ++present;
    }
    return present <= 1 || bytes <= view.usable_bytes;
  }

  // Whether `v` (of class `rank`) cannot fit on the device beside the memory that clients of a
  // higher class keep there without a grant (no eviction of its moves that memory).
  static bool kept_out_by_higher_class(const GpuView& view, const policy::ClientView& v, int rank) {
    std::uint64_t kept = 0;
    for (const policy::ClientView& o : view.clients) {
      if (static_cast<int>(protocol::effective_priority(o.limits.priority)) > rank) {
        kept += o.parked_bytes;
      }
    }
    return kept > 0 && v.allocated_bytes + kept > view.usable_bytes;
  }

  // An eviction the engine no longer waits for: pending here, its memory no longer parked there.
  static bool given_up(const SimClient& c, const GpuView& view) {
    if (!c.eviction_pending) return false;
    for (const policy::ClientView& v : view.clients) {
      if (v.client == c.id) return v.parked_bytes == 0;
    }
    return false;
  }

  void check_state(bool granted) {
    if (!result_.ok) return;
    const std::optional<MonoTime> deadline = engine_.next_deadline();
    const GpuView view = engine_.view(now_);
    if (deadline && *deadline <= now_) {
      return fail("next_deadline() " + fmt_time(*deadline) + " is not in the future\n" +
                  dump(view));
    }

    // The parked sums the fit checks use, kept as clients change, are each class's parked bytes.
    std::array<std::uint64_t, policy::ClientRecord::kRanks> parked{};
    for (const policy::ClientView& v : view.clients) {
      parked[static_cast<std::size_t>(protocol::effective_priority(v.limits.priority))] +=
          v.parked_bytes;
    }
    if (parked != view.parked_by_rank) return fail("the parked sums went astray\n" + dump(view));

    std::uint64_t running_bytes = 0;
    std::uint64_t blocking_bytes = 0;
    int running = 0;
    int saturating_running = 0;
    int blocking = 0;
    bool capped_holder = false;
    bool grantable_waits = false;
    bool held_back_waits = false;
    int lowest_runner = 3;    // rank of the lowest class running (3: none)
    int highest_waiter = -1;  // rank of the highest class waiting for turn or memory (-1: none)
    int holder_ranks = 0;     // bit per class among blocking holders
    int holding = 0;          // blocking holders, those draining for a higher class included
    for (const policy::ClientView& v : view.clients) {
      const SimClient* c = by_id(v.client);
      if (c == nullptr)
        return fail("engine knows client " + std::to_string(v.client) + ", which left");
      const ClientState expected = !c->holding
                                       ? (c->wants ? ClientState::kWaiting : ClientState::kIdle)
                                   : !c->revoked     ? ClientState::kRunning
                                   : c->unresponsive ? ClientState::kUnresponsive
                                                     : ClientState::kRevoking;
      if (v.state != expected) {
        return fail(name(*c) + " is " + std::string(to_string(v.state)) + " in the engine but " +
                    std::string(to_string(expected)) + " in the simulation");
      }
      const int rank = static_cast<int>(protocol::effective_priority(v.limits.priority));
      if (v.state == ClientState::kRunning) lowest_runner = std::min(lowest_runner, rank);
      // One that cannot fit beside the memory a higher class keeps on the device waits for that
      // class: it neither stops a lower class running nor counts as held back.
      const bool kept_out = kept_out_by_higher_class(view, v, rank);
      if (v.state == ClientState::kWaiting && v.waiting_for != WaitReason::kQuota && !kept_out) {
        highest_waiter = std::max(highest_waiter, rank);
      }
      if (v.state == ClientState::kRunning) {
        running_bytes += v.allocated_bytes;
        ++running;
        saturating_running += v.saturating ? 1 : 0;
      }
      if (v.state == ClientState::kRunning || v.state == ClientState::kRevoking) {
        blocking_bytes += v.allocated_bytes;
        ++holding;
        // A lower class revoked for priority with its memory in place drains beside the higher
        // class it made way for: its memory counts, its presence does not.
        const bool drains = v.state == ClientState::kRevoking &&
                            c->revoke_reason == policy::RevokeReason::kPriority && !c->swap_out;
        if (!drains) {
          ++blocking;
          capped_holder |= v.limits.core_percent < 100;
          holder_ranks |= 1 << rank;
        }
      }
      // A lower class held back for a higher one between its steps (the interference budget is
      // spent) leaves the GPU idle on purpose, for at most the priority floor (below). One that
      // waits for the memory a higher class keeps on the device waits as long as it is kept there.
      if (v.state == ClientState::kWaiting && v.waiting_for == WaitReason::kPriority) {
        if (!kept_out) held_back_waits = true;
      } else if (v.state == ClientState::kWaiting && v.waiting_for != WaitReason::kQuota) {
        grantable_waits = true;
      }
    }
    // The device itself never goes over usable memory by a grant: the holders' memory and what
    // clients without a grant keep there (parked), unless one client's memory is all there is.
    if (granted && !device_fits(view)) {
      std::string on_device;
      for (const SimClient& c : clients_) {
        if (c.connected && resident(c) > 0)
          on_device += " " + name(c) + (c.holding ? "(holds)" : "");
      }
      return fail("a grant put the device over usable memory; on it:" + on_device + "\n" +
                  dump(view));
    }
    if (s_.config.mode == Mode::kAuto) {
      // Never over capacity: runners fit in usable, unless one runs alone.
      if (running > 1 && running_bytes > view.usable_bytes) {
        return fail("runners use " + std::to_string(running_bytes) + " bytes of " +
                    std::to_string(view.usable_bytes) + " usable");
      }
      if (granted && holding > 1 && blocking_bytes > view.usable_bytes) {
        return fail("a grant put holders over usable memory");
      }
    } else if (blocking > 1) {
      return fail("exclusive mode with " + std::to_string(blocking) + " holders");
    }
    // Saturating clients take turns (mode auto): never two of them running together.
    if (saturating_running > 1) {
      return fail(std::to_string(saturating_running) + " saturating clients run together\n" +
                  dump(view));
    }
    // Caps are enforced by time-division in every mode: a grant never leaves a capped client
    // holding beside another.
    if (granted && capped_holder && blocking > 1) {
      return fail("a grant left a capped client holding beside " + std::to_string(blocking - 1) +
                  " other(s)\n" + dump(view));
    }
    // Priority classes: a higher class that waits has every lower-class runner revoked at once, and
    // a grant never leaves two classes holding together.
    if (highest_waiter > lowest_runner) {
      return fail("a lower class runs while a higher one waits\n" + dump(view));
    }
    if (granted && (holder_ranks & (holder_ranks - 1)) != 0) {
      return fail("a grant left two classes holding together\n" + dump(view));
    }
    // Work conservation: nobody holds the GPU while a client that could run waits, except while
    // memory that clients without a grant keep on the device is being evicted for it, each
    // eviction for at most the grace and the largest swap allowance (then it stops counting).
    const Duration eviction_bound = s_.config.revoke_grace + s_.config.swap_allowance_max + 1ms;
    const bool evicting = std::any_of(clients_.begin(), clients_.end(), [&](const SimClient& c) {
      return c.connected && c.eviction_pending && !c.holding &&
             now_ - c.eviction_sent_at <= eviction_bound;
    });
    if (holding == 0 && grantable_waits && !evicting) {
      return fail("idle GPU while a grantable client waits\n" + dump(view));
    }
    if (holding == 0 && held_back_waits && !evicting) {
      if (!idle_for_priority_since_) idle_for_priority_since_ = now_;
      if (now_ - *idle_for_priority_since_ > s_.config.priority_floor + 1ms) {
        return fail("idle GPU for longer than the priority floor while a lower class waits\n" +
                    dump(view));
      }
    } else {
      idle_for_priority_since_.reset();
    }
  }

  // The engine's view, for failure reports.
  std::string dump(const GpuView& view) const {
    std::string text = "engine: usable " + std::to_string(view.usable_bytes) + ", running " +
                       std::to_string(view.running_bytes) + ", queue";
    for (ClientId id : view.queue) text += " c" + std::to_string(id);
    for (const policy::ClientView& v : view.clients) {
      text += "\n  c" + std::to_string(v.client) + " " + std::string(to_string(v.state)) +
              " epoch " + std::to_string(v.epoch) + " ws " + std::to_string(v.allocated_bytes) +
              " cap " + std::to_string(v.effective_cap_percent);
      if (v.resident_bytes < v.allocated_bytes)
        text += " resident " + std::to_string(v.resident_bytes);
      if (v.parked_bytes > 0) text += " parked " + std::to_string(v.parked_bytes);
      if (const auto p = protocol::priority_of(v.limits.priority)) {
        text += " class " + std::string(to_string(*p));
      }
      if (v.waiting_for) text += " waiting for " + std::string(protocol::to_string(*v.waiting_for));
      if (v.budget_left) text += " budget " + std::to_string(seconds(*v.budget_left));
      if (v.turn_ends) text += " turn ends " + fmt_time(*v.turn_ends);
      if (v.unresponsive_at) text += " unresponsive at " + fmt_time(*v.unresponsive_at);
      text += "\n    " + engine_.explain(v.client, now_);
    }
    return text;
  }

  // ---- client events ----

  void deliver(const SimEvent& e) {
    if (e.what == What::kLimitChange) return change_limits();
    SimClient& c = clients_[e.client];
    switch (e.what) {
      case What::kConnect:
        return connect(c, e.client);
      case What::kRequest:
        if (!c.connected || c.wants || c.holding) return;
        c.wants = true;
        start_wait(c);
        return feed(policy::Requested{c.id}, "request " + name(c));
      case What::kRelease:
        return release(c, e.client, e.epoch);
      case What::kUsage:
        return grow(c, e.client);
      case What::kPace:
        if (!c.connected) return;
        return report_usage(c, resident(c), 0, "pace " + name(c));
      case What::kDisconnect:
        return disconnect(c, e.client);
      case What::kStaleRelease:
        if (!c.connected) return;
        ++result_.stale_releases;
        // Thresholds within rounding of a deadline may already count as reached; a deadline call at
        // the same instant settles those first, so the release itself must then change nothing.
        feed(policy::DeadlineReached{}, "deadline (early)");
        stale_pending_ = true;
        return feed(policy::Released{c.id, e.epoch, 0ms, 0ms}, "stale release " + name(c));
      case What::kLimitChange:
        return;
      case What::kEvicted:
        return evicted(c, e.epoch);
      case What::kSwapStep:
        return move_step(c, c.holding == e.epoch && c.revoked && !c.hanging);
      case What::kEvictStep:
        return move_step(c, !c.holding && c.eviction_pending && c.eviction == e.epoch);
      case What::kRoomIn:
        return room_in(c, e.epoch);
    }
  }

  // What is on the device, as the library reports it: what it allocated less what it moved out.
  static std::uint64_t resident(const SimClient& c) {
    return c.allocated - std::min(c.on_host, c.allocated);
  }

  // What a swap-out or eviction asked for `target` bytes moves: whole chunks of the client's
  // memory on the device, at least the target where there is that much; all of it for a target of
  // 0 (or a client that moves all or nothing).
  static std::uint64_t to_move(const SimClient& c, std::uint64_t target) {
    const std::uint64_t there = resident(c);
    if (target == 0 || c.spec.chunk == 0) return there;
    const std::uint64_t chunks = (target + c.spec.chunk - 1) / c.spec.chunk;
    return std::min(there, chunks * c.spec.chunk);
  }

  void connect(SimClient& c, int index) {
    c.id = next_id_++;
    c.connected = true;
    c.connected_at = now_;
    c.wants = false;
    c.holding = 0;
    c.reason.reset();
    c.reason_in_debt = false;
    c.allocated = 0;  // until its first usage report, below
    c.limits = c.spec.limits;
    c.noticed = 0;
    c.host_copies_at.reset();
    c.on_host = 0;
    c.eviction_pending = false;
    c.evictions_answered = 0;
    c.moving_total = 0;
    c.moved_so_far = 0;
    end_room(c);
    c.outcome = ConnectionOutcome{};
    const std::optional<Priority> priority = protocol::priority_of(c.limits.priority);
    c.outcome.label = "client " + std::to_string(c.id) + " (" + to_string(c.behaviour) + ", " +
                      std::to_string(c.limits.core_percent) + "%" +
                      (priority ? ", " + std::string(to_string(*priority)) : "") + ")";
    c.outcome.limits = c.limits;
    feed(policy::Registered{c.id, c.limits, true, c.spec.chunk > 0,
                            c.spec.chunk > 0 && c.spec.takes_room},
         "register " + name(c));
    c.allocated = c.spec.working_set;
    report_usage(c, c.allocated, 0, "usage " + name(c));
    if (c.behaviour == Behaviour::kIdle) {
      schedule(now_ + rng_.between(500ms, 5s), What::kRequest, index);
    } else {
      schedule(now_, What::kRequest, index);
    }
    if (c.spec.grows) schedule(now_ + rng_.between(500ms, 3s), What::kUsage, index);
    if (c.spec.pace_change_at > 0s) schedule(now_ + c.spec.pace_change_at, What::kPace, index);
    if (c.behaviour == Behaviour::kCrashing) {
      schedule(std::max(now_, MonoTime{} + c.spec.crash_at), What::kDisconnect, index);
    }
  }

  void release(SimClient& c, int index, GrantEpoch epoch) {
    if (!c.connected || c.holding != epoch) return;  // already released (or a new grant)
    const bool answered_revoke = c.revoked;
    const bool swapped = c.revoked && c.swap_out;
    const Duration held = now_ - c.hold_since;
    const Duration drained = c.revoked ? now_ - c.revoked_at : 0s;
    // As the library does, the usage that shows the memory moved goes before the release.
    if (swapped) {
      const std::uint64_t moved = rest_to_move(c, c.swap_bytes);
      result_.swap_time += from_seconds(static_cast<double>(moved) / c.spec.swap_bytes_per_s);
      result_.handoff_time += drained;
      c.on_host += moved;
      report_usage(c, resident(c), static_cast<std::uint64_t>(c.spec.swap_bytes_per_s),
                   "usage after swap " + name(c));
    }
    c.holding = 0;
    c.revoked = false;
    c.unresponsive = false;
    c.hanging = false;
    // The engine puts a preempted client back in the queue; a voluntary release makes it idle.
    c.wants = answered_revoke;
    if (answered_revoke) start_wait(c);
    feed(policy::Released{c.id, epoch, held, drained},
         std::string(answered_revoke ? "release " : "idle release ") + name(c));
    if (!answered_revoke) {
      const Duration gap = c.behaviour == Behaviour::kIdle ? rng_.between(3s, 10s)
                           : stepped(c)                    ? rng_.between(100us, 1ms)
                                                           : rng_.between(50ms, 2s);
      schedule(now_ + gap, What::kRequest, index);
    }
    if (s_.stale_releases && rng_.chance(0.3)) {
      schedule(now_ + rng_.between(1ms, 500ms), What::kStaleRelease, index, epoch);
    }
  }

  void grow(SimClient& c, int index) {
    if (!c.connected) return;
    const std::uint64_t before = c.allocated;
    c.allocated = static_cast<std::uint64_t>(static_cast<double>(c.spec.working_set) *
                                             rng_.uniform(0.5, 1.5));
    // Swapped out (all or part), as the library: a new allocation is only reserved until the next
    // swap-in, and a free takes what is on the host first.
    if (!c.holding && c.on_host > 0) {
      c.on_host = c.allocated > before ? c.on_host + (c.allocated - before)
                                       : c.on_host - std::min(c.on_host, before - c.allocated);
    }
    report_usage(c, resident(c), 0, "grow " + name(c));
    schedule(now_ + rng_.between(500ms, 3s), What::kUsage, index);
  }

  // What the client says of itself: the truth, or its lies (ClientSpec::reported_*).
  void report_usage(const SimClient& c, std::uint64_t resident, std::uint64_t swap_bytes_per_s,
                    const std::string& what) {
    const std::uint64_t allocated = c.spec.reported_bytes ? c.spec.reported_bytes : c.allocated;
    if (c.spec.reported_bytes) resident = c.spec.reported_bytes;
    if (c.spec.reported_swap_bytes_per_s) swap_bytes_per_s = c.spec.reported_swap_bytes_per_s;
    feed(policy::UsageReported{c.id, allocated, resident, swap_bytes_per_s, pace_of(c), 0,
                               c.evictions_answered},
         what);
  }

  // The pace it reports now: its first one, or its later one from pace_change_at on.
  std::optional<std::uint16_t> pace_of(const SimClient& c) const {
    const bool changed =
        c.spec.pace_change_at > 0s && now_ >= c.connected_at + c.spec.pace_change_at;
    return changed ? c.spec.later_pace : c.spec.pace;
  }

  void disconnect(SimClient& c, int index) {
    if (!c.connected) return;
    if (c.wants && !c.holding) check_wait(c);
    close_connection(c);
    feed(policy::Disconnected{c.id}, "disconnect c" + std::to_string(c.id));
    if (c.spec.reconnects) {
      c.behaviour = Behaviour::kComputeBound;  // the restarted process does not crash again
      schedule(now_ + rng_.between(200ms, 3s), What::kConnect, index);
    }
  }

  void close_connection(SimClient& c) {
    c.outcome.seconds = seconds(now_ - c.connected_at);
    result_.connections.push_back(c.outcome);
    c.connected = false;
    c.holding = 0;
    c.wants = false;
  }

  void change_limits() {
    ++result_.limit_changes;
    std::vector<SimClient*> connected;
    for (SimClient& c : clients_) {
      if (c.connected) connected.push_back(&c);
    }
    schedule(now_ + rng_.between(s_.limit_change_every / 2, s_.limit_change_every * 3 / 2),
             What::kLimitChange, -1);
    if (connected.empty()) return;
    SimClient& c = *connected[rng_.next() % connected.size()];
    Limits limits;
    limits.core_percent = rng_.chance(0.4) ? 100 : static_cast<std::uint8_t>(rng_.range(5, 95));
    limits.memory_bytes = rng_.chance(0.5) ? 0 : c.allocated + kGiB;
    // A scenario that mixes classes changes them too (from a stream of its own, so that the other
    // draws stay what they were).
    limits.priority = c.limits.priority;
    if (mixes_classes_ && class_rng_.chance(0.3)) {
      limits.priority = static_cast<std::uint8_t>(class_rng_.range(0, 3));
    }
    c.outcome.cap_changed |= limits.core_percent != c.limits.core_percent;
    c.limits = limits;
    c.pending_limits = limits;
    c.pending_since = now_;
    feed(policy::LimitsChanged{c.id, limits}, "limits " + name(c));
  }

  // ---- the end of the run ----

  void finish(MonoTime end) {
    advance(end);
    for (SimClient& c : clients_) {
      if (!c.connected) continue;
      if (c.wants && !c.holding) check_wait(c);
      if (c.pending_limits && now_ - c.pending_since > 1s)
        fail("a limit change never reached " + name(c));
      close_connection(c);
    }
    // A capped client never gets more than its cap plus one bucket and one drain (it may get less).
    const double window = seconds(s_.config.quota_window);
    for (std::size_t i = 0; i < result_.connections.size() && result_.ok; ++i) {
      const ConnectionOutcome& o = result_.connections[i];
      if (o.limits.core_percent >= 100 || o.cap_changed || o.hung) continue;
      double longest_release = 0.05;
      for (const ClientSpec& spec : s_.clients) {
        longest_release =
            std::max(longest_release,
                     0.05 + 1.5 * static_cast<double>(spec.working_set) / spec.swap_bytes_per_s);
      }
      const double cap = o.limits.core_percent / 100.0;
      const double allowed = cap * o.seconds + cap * window + longest_release + 1e-6;
      if (o.billed_seconds > allowed) {
        fail(o.label + " was billed " + std::to_string(o.billed_seconds) + " s in " +
             std::to_string(o.seconds) + " s, over its cap's allowance of " +
             std::to_string(allowed));
      }
    }
  }

  const Scenario& s_;
  Rng rng_;
  Rng class_rng_{s_.seed ^ 0x5e7c1a55ULL};
  bool mixes_classes_ = std::any_of(s_.clients.begin(), s_.clients.end(),
                                    [](const ClientSpec& c) { return c.limits.priority != 0; });
  GpuPolicy engine_;
  bool trace_;
  MonoTime now_{};
  // Since when nobody has held the GPU while a lower class waits for a higher one (held back).
  std::optional<MonoTime> idle_for_priority_since_;
  std::priority_queue<SimEvent, std::vector<SimEvent>, std::greater<>> queue_;
  std::uint64_t seq_ = 0;
  std::vector<SimClient> clients_;
  ClientId next_id_ = 1;
  GrantEpoch last_epoch_ = 0;
  bool stale_pending_ = false;
  SimResult result_;
  std::deque<std::string> trace_lines_;
  // The last 150 lines go with a failure; NVSHARE_SIM_TRACE_LINES=<n> keeps more (a replay of one
  // seed, to read all of it).
  std::size_t trace_kept_ = trace_lines();
};

}  // namespace

SimResult run_simulation(const Scenario& scenario, bool trace) {
  World world(scenario, trace);
  return world.run();
}

std::string describe(const Scenario& s) {
  const PolicyConfig& c = s.config;
  std::string text = s.name + " seed " + std::to_string(s.seed) + ": mode " +
                     std::string(policy::to_string(c.mode)) + ", capacity " +
                     (c.capacity_bytes ? std::to_string(*c.capacity_bytes / kGiB) + "Gi"
                                       : std::string("reported")) +
                     ", reserve " + std::to_string(c.reserve_fraction) + ", quantum " +
                     (c.fixed_quantum ? std::to_string(seconds(*c.fixed_quantum)) + " s fixed"
                                      : "auto " + std::to_string(seconds(c.quantum_min)) + ".." +
                                            std::to_string(seconds(c.quantum_max)) + " s") +
                     ", window " + std::to_string(seconds(c.quota_window)) + " s, grace " +
                     std::to_string(seconds(c.revoke_grace)) + " s; clients:";
  for (const ClientSpec& spec : s.clients) {
    text +=
        " [" + std::string(to_string(spec.behaviour)) + " " +
        std::to_string(static_cast<double>(spec.working_set) / kGiB).substr(0, 4) + "Gi " +
        std::to_string(spec.limits.core_percent) + "% start " +
        std::to_string(seconds(spec.start)).substr(0, 4) + "s" +
        (spec.step > 0s ? " step " + std::to_string(seconds(spec.step) * 1e3).substr(0, 5) + "ms"
                        : std::string()) +
        (spec.chunk > 0
             ? " moves " + std::to_string(static_cast<double>(spec.chunk) / kGiB).substr(0, 4) +
                   "Gi at a time"
             : std::string()) +
        "]";
  }
  return text;
}

}  // namespace nvshare::sim
