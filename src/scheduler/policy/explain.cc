// What GpuPolicy shows: view() for status tables and explain() for one-sentence answers to "why
// does this client wait (or run)?". Both read state only; numbers are projected to the `now` they
// are given.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "common/quantity.h"
#include "scheduler/policy/gpu_policy.h"

namespace nvshare::policy {
namespace {

Duration from_seconds(double s) {
  return Duration(static_cast<std::int64_t>(std::llround(s * 1e9)));
}

// `value` with `decimals` digits after the point, then `unit` ("2.1 s", "412 ms", "29.6%").
std::string fixed(double value, int decimals, const char* unit) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f%s", decimals, value, unit);
  return buffer;
}

std::string secs(Duration d) { return fixed(to_seconds(d), 1, " s"); }
std::string millis(double s) { return fixed(s * 1e3, 0, " ms"); }
std::string percent(double fraction) { return fixed(fraction * 100, 1, "%"); }
// An effective cap: whole when it is ("30%"), else one decimal ("33.3%").
std::string cap_percent(double fraction) {
  const double p = fraction * 100;
  return fixed(p, std::fabs(p - std::round(p)) < 0.05 ? 0 : 1, "%");
}

std::string client_list(const std::vector<const ClientRecord*>& clients) {
  std::string text;
  for (const ClientRecord* c : clients) {
    if (!text.empty()) text += ", ";
    text += std::to_string(c->id);
  }
  return text;
}

// The clients other than `c` that keep memory parked on the device, of rank `min_rank` or above.
std::vector<const ClientRecord*> parking(const std::vector<ClientRecord>& clients,
                                         const ClientRecord& c, int min_rank) {
  std::vector<const ClientRecord*> out;
  for (const ClientRecord& o : clients) {
    if (o.id != c.id && o.rank() >= min_rank && o.parked_bytes() > 0) out.push_back(&o);
  }
  return out;
}

}  // namespace

GpuView GpuPolicy::view(MonoTime now) const {
  now = std::max(now, now_);
  GpuView v;
  v.capacity_bytes = capacity();
  v.usable_bytes = usable();
  for (const ClientRecord* c : blocking_holders()) v.running_bytes += c->movable_bytes();
  v.running_bytes += pinned_total();
  v.parked_by_rank = parked_by_rank_;
  v.last_epoch = last_epoch_;
  v.unresponsive_holders = unresponsive_count_;
  v.swap_bytes_per_s = swap_.bytes_per_s();
  v.swap_measured = swap_.measured();
  v.queue.assign(queue_.begin(), queue_.end());

  const ClientRecord* next = head();
  const std::optional<TurnPlan> plan = next ? turn_plan(*next) : std::nullopt;
  v.quantum = plan ? quantum_between(*find(plan->runner), *next)
                   : quantum_for(config_, next ? swap_time(*next) : Duration::zero());

  for (const ClientRecord& c : clients_) {
    ClientView cv;
    cv.client = c.id;
    cv.state = c.state;
    if (c.state == ClientState::kWaiting) cv.waiting_for = reason_for(c, next);
    cv.epoch = c.epoch;
    cv.allocated_bytes = c.allocated_bytes;
    cv.resident_bytes = c.resident_bytes;
    cv.pinned_bytes = c.pinned_bytes;
    cv.parked_bytes = c.parked_bytes();
    cv.limits = c.limits;
    cv.effective_cap_percent = effective_cap(c) * 100;
    cv.share_percent = c.usage.share(now, config_.quota_window) * 100;
    cv.held_total = from_seconds(c.usage.total_seconds(now));
    cv.waited_total =
        c.waited_total + (c.state == ClientState::kWaiting ? now - c.waiting_since : Duration{0});
    cv.state_since = c.state_since;
    if (c.quota) cv.budget_left = from_seconds(c.quota->level_at(now));
    if (c.state == ClientState::kRunning && next != nullptr) {
      cv.turn_ends = c.granted_at + quantum_between(c, *next);
    }
    if (c.state == ClientState::kRevoking) cv.unresponsive_at = c.unresponsive_at;
    cv.swapping_out =
        c.swap_out && (c.state == ClientState::kRevoking || c.state == ClientState::kUnresponsive);
    cv.deep_queue_permille = c.deep_queue_permille;
    cv.saturating = c.saturating;
    cv.counters = c.counters;
    if (c.state == ClientState::kWaiting && now > c.wait_reason_since) {
      cv.counters.waited[c.wait_slot()] += now - c.wait_reason_since;
    }
    v.clients.push_back(cv);
  }
  return v;
}

std::string GpuPolicy::explain(ClientId client, MonoTime now) const {
  now = std::max(now, now_);
  const ClientRecord* c = find(client);
  if (c == nullptr) return {};
  const std::string who = "client " + std::to_string(c->id);
  switch (c->state) {
    case ClientState::kIdle:
      return who + " is idle: it holds no grant and has not asked for one (idle for " +
             secs(now - c->state_since) + ")";
    case ClientState::kWaiting:
      return explain_waiting(*c, now);
    case ClientState::kRunning:
    case ClientState::kRevoking:
    case ClientState::kUnresponsive:
      return explain_holding(*c, now);
  }
  return {};
}

// "capped at 30% (effective 30%), used 29.6% over the last 2.0 s", or for an uncapped client held
// to what capped ones leave: "uncapped, entitled to 35% beside capped clients, used ..."
std::string GpuPolicy::describe_quota(const ClientRecord& c, MonoTime now) const {
  const std::string limit = c.capped() ? "capped at " + std::to_string(c.limits.core_percent) +
                                             "% (effective " + cap_percent(effective_cap(c)) + ")"
                                       : "uncapped, entitled to " + cap_percent(effective_cap(c)) +
                                             " beside capped clients";
  return limit + ", used " + percent(c.usage.share(now, config_.quota_window)) + " over the last " +
         secs(config_.quota_window);
}

std::string GpuPolicy::describe_parked(const ClientRecord& c) const {
  const std::vector<const ClientRecord*> parked = parking(clients_, c, 0);
  std::vector<const ClientRecord*> asked;
  std::uint64_t bytes = 0;
  for (const ClientRecord* o : parked) {
    bytes += o->parked_bytes();
    if (o->evict_until) asked.push_back(o);
  }
  if (parked.empty()) return "";
  std::string text = "; client" + std::string(parked.size() > 1 ? "s " : " ") +
                     client_list(parked) + (parked.size() > 1 ? " keep " : " keeps ") +
                     format_bytes(bytes) + " on the GPU without a grant";
  if (!asked.empty()) {
    text += ", and client" + std::string(asked.size() > 1 ? "s " : " ") + client_list(asked) +
            (asked.size() > 1 ? " were" : " was") + " asked to move it to the host";
  }
  return text;
}

std::string GpuPolicy::describe_room(const ClientRecord& c) {
  if (c.room_sent == 0) return "";
  return "; given room for " + format_bytes(c.room_sent) + " of its memory while it waits (" +
         format_bytes(c.parked_bytes()) + " of it back on the GPU)";
}

std::string GpuPolicy::explain_waiting(const ClientRecord& c, MonoTime now) const {
  const std::string who = "client " + std::to_string(c.id);
  const std::string waited = " (waiting " + secs(now - c.waiting_since) + ")";
  const ClientRecord* next = head();
  const std::vector<const ClientRecord*> holders = blocking_holders();

  if (c.throttled) {
    const double level = c.quota->level_at(now);
    const double rising = c.quota->cap();
    const double to_go = std::max(0.0, (c.quota->resume_level() - level) / rising);
    std::string text = who + " waits for quota: " + describe_quota(c, now) + ", budget " +
                       millis(level) + "; it may run again at " + millis(c.quota->resume_level()) +
                       ", in " + fixed(to_go, 1, " s");
    if (c.capped() && c.resume_floor && *c.resume_floor > now &&
        to_seconds(*c.resume_floor - now) > to_go) {
      text += "; its job's processes on other GPUs pause too, and it resumes with them in " +
              fixed(to_seconds(*c.resume_floor - now), 2, " s");
    }
    return text + waited;
  }

  if (c.held_back) {
    const std::optional<MonoTime> repaid_at = interference_repaid_at();
    const double repaid =
        repaid_at ? to_seconds(*repaid_at - now) : to_seconds(config_.priority_floor);
    const double floor =
        held_since_ ? to_seconds(*held_since_ + config_.priority_floor - now) : 0.0;
    return who + " waits for a higher class: it is " + std::string(to_string(c.priority())) +
           " and its kernels that ran on after it was preempted delayed a higher class's steps " +
           "past the interference budget (" + millis(interference_s_) + " left of " +
           millis(interference_burst_s()) + "); it runs in the higher classes' idle moments " +
           "again in " + fixed(std::max(0.0, std::min(repaid, floor)), 2, " s") + waited;
  }

  if (reason_for(c, next) == WaitReason::kPriority) {
    std::vector<const ClientRecord*> above;
    for (const ClientRecord* h : holders) {
      if (h->rank() > c.rank()) above.push_back(h);
    }
    const bool holding = !above.empty();
    if (!holding && next != nullptr && next->rank() > c.rank()) above.push_back(next);
    if (above.empty()) {  // memory a higher class keeps on the device
      const std::vector<const ClientRecord*> parked = parking(clients_, c, c.rank() + 1);
      return who + " waits for a higher class's memory: it is " +
             std::string(to_string(c.priority())) + ", needs " + format_bytes(c.allocated_bytes) +
             ", and client" + (parked.size() > 1 ? "s " : " ") + client_list(parked) + " keep" +
             (parked.size() > 1 ? " " : "s ") + format_bytes(parked_above(c)) +
             " on the GPU without a grant; a lower class never moves a higher class's memory" +
             waited;
    }
    const std::string theirs(to_string(above.front()->priority()));
    return who + " waits for a higher class: it is " + std::string(to_string(c.priority())) +
           " and client" + (above.size() > 1 ? "s " : " ") + client_list(above) + " (" + theirs +
           ") " +
           (holding ? (above.size() > 1 ? "hold the GPU" : "holds the GPU") : "waits ahead of it") +
           "; it runs in the time the higher classes leave (a holder of a higher class hands "
           "over at its first idle moment)" +
           waited;
  }

  if (next == nullptr || (&c != next && !fits_beside_kept(c))) {
    // Skipped: it cannot fit even on an idle GPU beside the memory no eviction of its moves.
    return who + " waits for memory: it needs " + format_bytes(c.allocated_bytes) + " and " +
           format_bytes(usable() - std::min(usable(), pinned_total() + parked_above(c))) + " of " +
           format_bytes(usable()) +
           " usable can be free beside the memory other processes map (CUDA IPC) or a higher "
           "class keeps on the device; it does not hold up those behind it" +
           describe_parked(c) + waited;
  }
  if (&c != next) {
    std::size_t position = 0;
    for (ClientId id : queue_) {
      ++position;
      if (id == c.id) break;
    }
    std::string text = who + " waits for its turn: it is queued behind client " +
                       std::to_string(next->id) + " (first in line), position " +
                       std::to_string(position) + " of " + std::to_string(queue_.size());
    if (reason_for(c, next) == WaitReason::kMemory) {
      const std::uint64_t used =
          sum_working_sets(holders) + pinned_total() + parked_total() - c.parked_bytes();
      text += "; it needs " + format_bytes(c.allocated_bytes) + " and " +
              format_bytes(usable() - std::min(usable(), used)) + " of " + format_bytes(usable()) +
              " usable is free";
    }
    return text + waited;
  }

  // The head: blocked by the holders.
  std::string running;
  for (const ClientRecord* h : holders) {
    if (!running.empty()) running += ", ";
    running += secs(now - h->granted_at);
  }
  std::string text;
  if (reason_for(c, &c) == WaitReason::kTurn) {
    if (one_at_a_time()) {
      const char* why = config_.mode == Mode::kExclusive
                            ? "this GPU runs one client at a time (exclusive)"
                            : "while a compute cap binds this GPU runs one client at a time";
      text = who + " waits for its turn: " + why + " and client" +
             (holders.size() > 1 ? "s " : " ") + client_list(holders) + " hold" +
             (holders.size() > 1 ? "" : "s") + " it (for " + running + ")";
    } else {
      std::vector<const ClientRecord*> turns;
      for (const ClientRecord* h : holders) {
        if (takes_turns_with(*h, c)) turns.push_back(h);
      }
      text = who + " waits for its turn: it keeps a deep queue (" + describe_pace(c) +
             "), and so does client" + (turns.size() > 1 ? "s " : " ") + client_list(turns) +
             "; saturating clients take turns rather than time-slice (running for " + running + ")";
    }
  } else {
    const std::uint64_t used =
        sum_working_sets(holders) + pinned_total() + parked_total() - c.parked_bytes();
    text = who + " waits for memory: it needs " + format_bytes(c.allocated_bytes) + " but " +
           format_bytes(usable() - std::min(usable(), used)) + " of " + format_bytes(usable()) +
           " usable is free";
    if (!holders.empty()) {
      text += " beside client" + std::string(holders.size() > 1 ? "s " : " ") +
              client_list(holders) + " (running for " + running + ")";
    }
    text += describe_parked(c);
  }
  text += describe_room(c);
  const std::optional<TurnPlan> plan = turn_plan(c);
  if (yield_target() == &c) {
    // Nothing to swap: a runner whose fair turn ends before the quantum makes way first.
    const ClientRecord* first = nullptr;
    MonoTime at = plan ? plan->at : MonoTime::max();
    for (const ClientRecord* h : holders) {
      if (h->state != ClientState::kRunning) continue;
      const MonoTime ends = fair_turn_end(*h, c);
      if (ends >= at) continue;
      first = h;
      at = ends;
    }
    if (first != nullptr) {
      return text + "; its turn comes when client " + std::to_string(first->id) +
             "'s fair turn ends, in " + secs(std::max(at, now) - now) + waited;
    }
  }
  if (plan) {
    const ClientRecord& r = *find(plan->runner);
    text += "; its turn comes when client " + std::to_string(r.id) + "'s quantum of " +
            secs(quantum_between(r, c)) + " ends in " + secs(plan->at - now);
  } else {
    for (const ClientRecord* h : holders) {
      if (h->state != ClientState::kRevoking) continue;
      text += "; it runs once client " + std::to_string(h->id) + " releases (revoked " +
              secs(now - h->revoked_at) + " ago, stops blocking in " +
              secs(h->unresponsive_at - now) + ")";
      break;
    }
  }
  return text + waited;
}

std::string GpuPolicy::explain_holding(const ClientRecord& c, MonoTime now) const {
  const std::string who = "client " + std::to_string(c.id);
  if (c.state == ClientState::kUnresponsive) {
    const std::string late =
        c.swap_out ? " (it was asked to swap out: its copy to the host may be slower than its "
                     "grace and swap allowance, or it hangs)"
                   : "";
    return who + " ignored a revoke (" + std::string(protocol::to_string(c.revoke_reason)) +
           ") for " + secs(now - c.revoked_at) + late +
           " and no longer blocks others; it is billed while it holds grant " +
           std::to_string(c.epoch) + " as though it computed, the others all their time";
  }
  if (c.state == ClientState::kRevoking) {
    return who + " is giving its grant back: revoked (" +
           std::string(protocol::to_string(c.revoke_reason)) + ") " + secs(now - c.revoked_at) +
           " ago" + (c.swap_out ? ", swapping out" : "") + "; it stops blocking others in " +
           secs(c.unresponsive_at - now) + " if it has not released by then";
  }

  std::vector<const ClientRecord*> others = blocking_holders();
  remove_client(others, &c);
  std::string text = who + " runs";
  if (others.empty()) {
    text += " alone";
  } else {
    text += " beside client" + std::string(others.size() > 1 ? "s " : " ") + client_list(others);
  }
  text += " (for " + secs(now - c.granted_at) + ", " + format_bytes(c.allocated_bytes) + "; " +
          format_bytes(sum_working_sets(blocking_holders()) + pinned_total()) + " of " +
          format_bytes(usable()) + " usable in use): ";
  if (c.quota) {
    text += describe_quota(c, now) + ", budget " + millis(c.quota->level_at(now)) + " left";
  } else {
    text += "uncapped, used " + percent(c.usage.share(now, config_.quota_window)) +
            " over the last " + secs(config_.quota_window);
  }
  const ClientRecord* next = head();
  if (next != nullptr && yield_target() == next && !takes_turns_with(c, *next)) {
    text += "; client " + std::to_string(next->id) +
            " waits for a turn among saturating clients and this one runs beside them";
  } else if (next != nullptr) {
    const MonoTime ends = c.granted_at + quantum_between(c, *next);
    text += "; client " + std::to_string(next->id) + " waits, so its quantum of " +
            secs(quantum_between(c, *next)) +
            (ends > now ? " ends in " + secs(ends - now) : std::string(" has ended"));
  }
  return text + describe_yield(c, now);
}

// "deep queue 96% of its time holding the GPU", or "pace not reported yet".
std::string GpuPolicy::describe_pace(const ClientRecord& c) const {
  if (!c.deep_queue_permille) return "pace not reported yet";
  return "deep queue " + fixed(*c.deep_queue_permille / 10.0, 0, "%") +
         " of its time holding the GPU";
}

// One runner at a time, a hand-off that moves no memory: whether the holder hands over at its next
// idle moment, or keeps its turn until it has had its fair part beside the head; and when its fair
// turn ends.
std::string GpuPolicy::describe_yield(const ClientRecord& c, MonoTime now) const {
  const ClientRecord* next = yield_target();
  if (next == nullptr || c.state != ClientState::kRunning || !takes_turns_with(c, *next)) return {};
  std::string text;
  if (!yield_unsent(c)) {
    text = "; it was asked to hand over as soon as it is idle";
  } else {
    const MonoTime at = yield_time(c, *next);
    text =
        "; it keeps its turn through idle moments until it has had its fair part beside client " +
        std::to_string(next->id) +
        (at == MonoTime::max() ? std::string() : ", in " + secs(std::max(at, now) - now));
  }
  const MonoTime ends = fair_turn_end(c, *next);
  if (ends == MonoTime::max()) return text;
  return text + "; its fair turn beside client " + std::to_string(next->id) + " ends in " +
         secs(std::max(ends, now) - now);
}

}  // namespace nvshare::policy
