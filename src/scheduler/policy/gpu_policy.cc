// The event handlers and the scheduling pass of GpuPolicy (views and explanations: explain.cc).
//
// Every handle() has the same shape: settle billing up to `now` at the rates that were in force,
// apply the event, then run one scheduling pass that brings the state to a fixed point for `now`
// (nothing due at `now` is left undone, which is why next_deadline() is always in the future), and
// finally set the rates that hold until the next call.
#include "scheduler/policy/gpu_policy.h"

#include <algorithm>
#include <cmath>
#include <span>

namespace nvshare::policy {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// The order in which runners keep the GPU when some must leave: a higher class before a lower
// one, and within a class the earlier grant first (the last ones in this order leave first).
bool keeps_longer(const ClientRecord* a, const ClientRecord* b) {
  return a->rank() != b->rank() ? a->rank() > b->rank() : a->epoch < b->epoch;
}

}  // namespace

std::string_view to_string(ClientState state) {
  switch (state) {
    case ClientState::kIdle:
      return "idle";
    case ClientState::kWaiting:
      return "waiting";
    case ClientState::kRunning:
      return "running";
    case ClientState::kRevoking:
      return "revoking";
    case ClientState::kUnresponsive:
      return "unresponsive";
  }
  return "unknown";
}

GpuPolicy::GpuPolicy(PolicyConfig config)
    : config_(config), swap_(config_.default_swap_bytes_per_s) {
  interference_s_ = interference_burst_s();
}

ClientRecord* GpuPolicy::find(ClientId client) {
  for (ClientRecord& c : clients_) {
    if (c.id == client) return &c;
  }
  return nullptr;
}

const ClientRecord* GpuPolicy::find(ClientId client) const {
  for (const ClientRecord& c : clients_) {
    if (c.id == client) return &c;
  }
  return nullptr;
}

std::vector<Action> GpuPolicy::handle(const Event& event, MonoTime now) {
  now = std::max(now, now_);
  settle(now);
  std::vector<Action> out;
  std::visit(Overloaded{
                 [&](const Registered& e) { on_registered(e, now, out); },
                 [&](const Requested& e) { on_requested(e, now); },
                 [&](const Released& e) { on_released(e, now); },
                 [&](const UsageReported& e) { on_usage(e); },
                 [&](const LimitsChanged& e) { on_limits(e, out); },
                 [&](const Disconnected& e) { on_disconnected(e); },
                 [&](const ResumeNotBefore& e) {
                   if (ClientRecord* c = find(e.client)) on_gang(*c, e, now);
                 },
                 [&](const DeadlineReached&) {},
             },
             event);
  schedule(now, out);
  return out;
}

std::optional<MonoTime> GpuPolicy::gang_pause_ends(ClientId client) const {
  const ClientRecord* c = find(client);
  if (c == nullptr || !c->capped() || !c->quota) return std::nullopt;
  if (c->state != ClientState::kWaiting || !c->throttled) return std::nullopt;
  if (c->quota->refilled()) return now_;
  return c->quota->refilled_at();
}

std::optional<GangState> GpuPolicy::gang_state(ClientId client) const {
  const ClientRecord* c = find(client);
  if (c == nullptr) return std::nullopt;
  return GangState{gang_pause_ends(client), draining_for_quota(*c), c->resume_floor,
                   c->gang_peers_paused};
}

void GpuPolicy::on_gang(ClientRecord& c, const ResumeNotBefore& e, MonoTime now) {
  const bool was = drain_waits_for_gang(c);
  c.resume_floor = e.at;
  c.gang_peers_paused = e.peers_paused;
  const bool is = drain_waits_for_gang(c);
  if (!was && is) c.gang_unbilled_since = now;
  if (was && !is) {
    // A member resumed while this one still drained: what it drained was waiting for them.
    c.gang_unbilled += now - c.gang_unbilled_since;
    c.gang_drain_waited = true;
  }
}

void GpuPolicy::settle_gang_drain(ClientRecord& c, MonoTime now) {
  if (drain_waits_for_gang(c)) c.gang_unbilled += now - c.gang_unbilled_since;
  // A drain that ended while the others were all still stopped did not wait for them: billed.
  if (!c.gang_drain_waited && c.quota && c.gang_unbilled > Duration::zero()) {
    c.quota->charge(to_seconds(c.gang_unbilled));
  }
  c.gang_unbilled = Duration::zero();
  c.gang_drain_waited = false;
}

bool GpuPolicy::draining_for_quota(const ClientRecord& c) {
  return c.capped() && c.state == ClientState::kRevoking && c.revoke_reason == RevokeReason::kQuota;
}

bool GpuPolicy::drain_waits_for_gang(const ClientRecord& c) const {
  return c.gang_peers_paused && draining_for_quota(c);
}

bool GpuPolicy::held_by_floor(const ClientRecord& c) const {
  return c.capped() && c.resume_floor && *c.resume_floor > now_;
}

std::vector<Action> GpuPolicy::reconfigure(const PolicyConfig& config, MonoTime now) {
  if (!validate(config).ok()) return {};
  now = std::max(now, now_);
  settle(now);
  config_ = config;
  swap_.set_default(config_.default_swap_bytes_per_s);
  interference_s_ = std::min(interference_s_, interference_burst_s());
  std::vector<Action> out;
  schedule(now, out);
  return out;
}

// ---- events -------------------------------------------------------------------------------------

void GpuPolicy::on_registered(const Registered& e, MonoTime now, std::vector<Action>& out) {
  ClientRecord* c = find(e.client);
  if (c == nullptr) c = &clients_.emplace_back(e.client, now);
  c->limits = e.limits;
  c->evictable = e.evictable;
  c->partial_swap = e.partial_swap;
  c->takes_room = e.takes_room && e.partial_swap;
  recount_parked(*c);
  if (!c->capped()) {
    c->quota.reset();
    c->throttled = false;
  }
  // The client learns the limits in force from the scheduler, not from what it declared.
  out.push_back(SendLimits{c->id, c->limits});
}

void GpuPolicy::on_requested(const Requested& e, MonoTime now) {
  ClientRecord* c = find(e.client);
  if (c == nullptr || c->state != ClientState::kIdle) return;
  if (c->stepping) c->gaps.add(now - c->state_since);
  catch_up_fair_clock(*c);
  enqueue(*c, now);
}

void GpuPolicy::on_released(const Released& e, MonoTime now) {
  ClientRecord* c = find(e.client);
  if (c == nullptr || !c->holds() || e.epoch != c->epoch) return;  // stale: another grant's release
  restart_floor(*c, now);
  if (c->state == ClientState::kRunning) {
    ++c->counters.idle_releases;
    observe_step(*c, now);
    set_state(*c, ClientState::kIdle, now);  // released unasked: idle until it requests again
  } else {
    ++c->counters.releases;
    charge_interference(*c, now);
    settle_gang_drain(*c, now);
    // Answered a revoke: it was preempted and still has work.
    enqueue(*c, now, /*memory_in_place=*/!c->swap_out);
  }
}

void GpuPolicy::on_usage(const UsageReported& e) {
  ClientRecord* c = find(e.client);
  if (c == nullptr) return;
  c->allocated_bytes = e.allocated_bytes;
  c->resident_bytes = e.resident_bytes;
  pinned_total_ -= c->pinned_bytes;
  c->pinned_bytes = std::min(e.pinned_bytes, e.allocated_bytes);
  pinned_total_ += c->pinned_bytes;
  if (e.swap_bytes_per_s > 0) c->swap_bytes_per_s = e.swap_bytes_per_s;
  swap_.observe(e.swap_bytes_per_s);
  if (e.deep_queue_permille) {
    c->deep_queue_permille = std::min<std::uint16_t>(*e.deep_queue_permille, 1000);
    c->saturating = classify_pace(c->saturating, *c->deep_queue_permille);
  }
  // An eviction answered (or moot): nothing parked any more, or the client counts one more answer.
  // One answered after its deadline: what it kept counts again (it moved what it was asked to, if
  // late; the strike stays).
  const bool answered = c->partial_swap && e.evictions_answered != c->evictions_answered;
  c->evictions_answered = e.evictions_answered;
  if (answered) c->evict_ignored = false;
  recount_parked(*c);
  if (c->parked_bytes() == 0 || answered) c->evict_until.reset();
}

void GpuPolicy::on_limits(const LimitsChanged& e, std::vector<Action>& out) {
  ClientRecord* c = find(e.client);
  if (c == nullptr) return;
  const bool was_capped = c->capped();
  const int was_rank = c->rank();
  c->limits = e.limits;
  recount_parked(*c);
  if (c->rank() != was_rank && c->state == ClientState::kWaiting) {
    // A new class: its place in the queue is at the back of that class.
    queue_.erase(std::remove(queue_.begin(), queue_.end(), c->id), queue_.end());
    place_in_queue(*c);
  }
  if (c->capped() != was_capped) {
    // A new bucket either way: an entitlement's balance is not a cap's.
    c->quota.reset();
    c->throttled = false;
  }
  // A client that becomes capped gets its bucket in update_caps(), at its effective cap.
  out.push_back(SendLimits{c->id, c->limits});
}

void GpuPolicy::on_disconnected(const Disconnected& e) {
  queue_.erase(std::remove(queue_.begin(), queue_.end(), e.client), queue_.end());
  if (const ClientRecord* c = find(e.client)) {
    pinned_total_ -= c->pinned_bytes;
    parked_by_rank_[static_cast<std::size_t>(c->parked_counted_rank)] -= c->parked_counted;
  }
  clients_.erase(std::remove_if(clients_.begin(), clients_.end(),
                                [&](const ClientRecord& c) { return c.id == e.client; }),
                 clients_.end());
}

// ---- the scheduling pass ------------------------------------------------------------------------

void GpuPolicy::settle(MonoTime now) {
  for (ClientRecord& c : clients_) {
    if (now > now_) c.fair_s += c.usage.rate() * to_seconds(now - now_) / fair_weight(c);
    if (c.quota) c.quota->settle(now);
    c.usage.settle(now, config_.quota_window);
  }
  if (now > now_) {
    interference_s_ =
        std::min(interference_burst_s(),
                 interference_s_ + config_.priority_interference * to_seconds(now - now_));
  }
  now_ = now;
  update_fair_floor();
}

void GpuPolicy::schedule(MonoTime now, std::vector<Action>& out) {
  update_caps();
  expire_grace(now, out);
  expire_evictions(now);
  release_throttles();
  hold_back_lower_classes(now);
  revoke_spent_quota(now, out);
  revoke_overflow(now, out);
  revoke_saturating_pairs(now, out);
  revoke_for_priority(now, out);
  grant_in_order(now, out);
  revoke_fair_turns(now, out);
  revoke_ended_turns(now, out);
  evict_for_runners(now, out);
  evict_for_head(now, out);
  send_room(out);
  send_wait_reasons(out);
  send_yields(out);
  send_contended(out);
  send_swap_notices(out);
  update_rates();
  next_deadline_ = compute_deadline();
}

double GpuPolicy::effective_cap(const ClientRecord& c) const {
  if (!c.capped()) return c.active() ? uncapped_share_ : 1;
  const double nominal = c.cap_percent() / 100.0;
  return c.active() ? nominal * cap_scale_ : nominal;
}

// Entitlements: the active capped clients' caps, scaled down when they sum over what they may have
// together (all of the GPU, or kCappedRoomBesideUncapped of it while an uncapped client is
// active); each active uncapped client, while a capped one is active, an equal part of the rest.
// Idle clients reserve nothing.
void GpuPolicy::update_caps() {
  int sum = 0;
  int uncapped = 0;
  for (const ClientRecord& c : clients_) {
    if (!c.active()) continue;
    if (c.capped()) {
      sum += c.cap_percent();
    } else {
      ++uncapped;
    }
  }
  const double capped = sum / 100.0;
  const double room = uncapped > 0 ? kCappedRoomBesideUncapped : 1.0;
  cap_scale_ = capped > room ? room / capped : 1.0;
  uncapped_share_ = sum > 0 && uncapped > 0 ? (1.0 - capped * cap_scale_) / uncapped : 1.0;
  for (ClientRecord& c : clients_) {
    const double cap = effective_cap(c);
    if (cap >= 1.0) {
      // An uncapped client with nothing to leave to capped ones runs unmetered.
      if (!c.capped()) {
        c.quota.reset();
        c.throttled = false;
      }
      continue;
    }
    if (c.quota) {
      c.quota->set_rates(cap, c.quota->billed_rate(), config_.quota_window, c.active());
      c.quota->set_cycle(quota_cycle(c));
    } else {
      c.quota.emplace(cap, config_.quota_window, quota_cycle(c), now_);
    }
  }
}

// A pause costs a client whose memory stays on the device a round trip, so its bucket runs it in
// short cycles (cap_cycle): its share is then close to its cap over a few seconds, not only over a
// few windows. One whose memory went to the host pays a swap-in for every run, so its cycle is the
// whole window.
Duration GpuPolicy::quota_cycle(const ClientRecord& c) const {
  return c.memory_on_device() ? std::min(config_.cap_cycle, config_.quota_window)
                              : config_.quota_window;
}

// Shared time is billed 1/n to each of the n holders that block. An unresponsive holder is not
// one of their n: it may be computing or only still swapping out, and billing the others as though
// it computed would let a capped client run far over its cap beside a slow swap-out. It is billed
// 1/n of all the holders, as though it computed.
void GpuPolicy::update_rates() {
  int blocking = 0;
  int holders = 0;
  for (const ClientRecord& c : clients_) {
    blocking += c.blocks() ? 1 : 0;
    holders += c.holds() ? 1 : 0;
  }
  entitlement_binds_ = capped_client_wants_gpu();
  for (ClientRecord& c : clients_) {
    const int sharers = c.blocks() ? blocking : holders;
    // A quota revoke's drain while the gang's other members pause waits for them, not for the GPU.
    const double rate = c.holds() && !drain_waits_for_gang(c) ? 1.0 / sharers : 0.0;
    c.usage.set_rate(rate);
    // Waiting only for its gang's floor, it is owed nothing beyond its depth.
    const bool wants = c.active() && !(c.throttled && held_by_floor(c) && c.quota->refilled());
    if (c.quota) c.quota->set_rates(effective_cap(c), rate, config_.quota_window, wants);
  }
}

// Capped clients first: whether one of them wants the GPU decides whether the uncapped clients'
// entitlements bind.
void GpuPolicy::release_throttles() {
  for (ClientRecord& c : clients_) {
    if (c.capped() && c.state == ClientState::kWaiting && c.throttled && c.quota->refilled() &&
        !held_by_floor(c)) {
      c.throttled = false;
    }
  }
  entitlement_binds_ = capped_client_wants_gpu();
  // A waiting uncapped client is throttled exactly while its entitlement binds and its bucket is
  // below the level it may enter at (or, once throttled, below the resume level).
  for (ClientRecord& c : clients_) {
    if (c.capped() || c.state != ClientState::kWaiting) continue;
    if (!binds(c)) {
      c.throttled = false;
    } else if (!c.throttled) {
      c.throttled = !c.quota->may_enter();
    } else if (c.quota->refilled()) {
      c.throttled = false;
    }
  }
}

bool GpuPolicy::capped_client_wants_gpu() const {
  return std::any_of(clients_.begin(), clients_.end(), [](const ClientRecord& c) {
    return c.capped() && c.active() && !c.throttled;
  });
}

bool GpuPolicy::one_at_a_time() const {
  return config_.mode == Mode::kExclusive || entitlement_binds_;
}

bool GpuPolicy::binds(const ClientRecord& c) const {
  return c.quota && (c.capped() || entitlement_binds_);
}

void GpuPolicy::expire_grace(MonoTime now, std::vector<Action>& out) {
  for (ClientRecord& c : clients_) {
    if (c.state != ClientState::kRevoking || c.unresponsive_at > now) continue;
    set_state(c, ClientState::kUnresponsive, now);
    // A grant the priority floor let through ends here for the floor: the next may follow a floor
    // from now (the floor's clock restarts), not from the late release of this one.
    if (c.floor_grant) {
      c.floor_grant = false;
      if (held_since_) held_since_ = now;
    }
    ++c.strikes;
    ++unresponsive_count_;
    out.push_back(HolderUnresponsive{c.id, c.epoch});
  }
}

void GpuPolicy::expire_evictions(MonoTime now) {
  for (ClientRecord& c : clients_) {
    if (!c.evict_until || *c.evict_until > now) continue;
    c.evict_until.reset();
    c.evict_ignored = true;
    ++c.strikes;
    recount_parked(c);
  }
}

void GpuPolicy::evict_for_head(MonoTime now, std::vector<Action>& out) {
  const ClientRecord* next = head();
  if (next == nullptr || fits_on_idle_gpu(*next)) return;
  const std::uint64_t need = next->movable_bytes() + pinned_total() + parked_total();
  if (need <= usable()) return;  // it waits for the pinned memory, which no eviction moves
  evict_parked(need - usable(), next->rank(), next->id, now, out);
}

void GpuPolicy::evict_for_runners(MonoTime now, std::vector<Action>& out) {
  if (capacity() == 0) return;
  const std::vector<const ClientRecord*> holders = blocking_holders();
  if (holders.empty()) return;
  // A holder swapping out counts by what is left of it: the head may already be bringing its
  // memory back into the room that leaves (send_room).
  std::uint64_t need = pinned_total() + parked_total();
  for (const ClientRecord* h : holders) need += on_device(*h);
  if (need <= usable()) return;
  int top = 0;
  for (const ClientRecord* h : holders) top = std::max(top, h->rank());
  const ClientRecord* next = head();
  evict_parked(need - usable(), top, next != nullptr ? next->id : 0, now, out);
}

std::uint64_t GpuPolicy::on_device(const ClientRecord& holder) {
  const std::uint64_t movable = holder.movable_bytes();
  if (holder.state == ClientState::kRunning || !holder.swap_out) return movable;
  const std::uint64_t resident =
      holder.resident_bytes - std::min(holder.pinned_bytes, holder.resident_bytes);
  return std::min(movable, resident);
}

bool GpuPolicy::memory_leaving() const {
  return std::any_of(clients_.begin(), clients_.end(), [](const ClientRecord& c) {
    return (c.holds() && c.state != ClientState::kRunning && c.swap_out) || c.evict_until;
  });
}

void GpuPolicy::send_room(std::vector<Action>& out) {
  if (capacity() == 0 || !memory_leaving()) return;
  const ClientRecord* next = head();
  if (next == nullptr || !next->takes_room || next->state != ClientState::kWaiting ||
      next->movable_bytes() == 0) {
    return;
  }
  // Everything on the device but the head's own parked memory: pinned memory, what others park,
  // and the holders' memory (all of them: an unresponsive holder's is still there).
  std::uint64_t taken = pinned_total() + parked_total() - next->parked_bytes();
  for (const ClientRecord& c : clients_) {
    if (c.holds()) taken += on_device(c);
  }
  if (taken >= usable()) return;
  const std::uint64_t own = next->movable_bytes() + next->parked_bytes();
  const std::uint64_t room = std::min(own, usable() - taken);
  const std::uint64_t had = std::max(next->room_sent, next->parked_bytes());
  if (room <= had || (room < own && room - had < kRoomStep)) return;
  ClientRecord& head = *find(next->id);
  head.room_sent = room;
  ++head.counters.rooms;
  out.push_back(SendRoom{head.id, room});
}

void GpuPolicy::evict_parked(std::uint64_t excess, int max_rank, ClientId spared, MonoTime now,
                             std::vector<Action>& out) {
  // The lowest class first; within a class, idle clients (they do not even want the GPU), then
  // waiters from the tail of the queue (they run last), the largest first.
  std::vector<ClientRecord*> parked;
  for (ClientRecord& c : clients_) {
    // A lower class never moves a higher class's memory off the device.
    if (c.id == spared || c.parked_bytes() == 0 || c.rank() > max_rank) continue;
    if (c.evict_until) {  // already asked: what it moves counts
      const std::uint64_t asked = c.evict_bytes == 0 ? c.parked_bytes() : c.evict_bytes;
      excess -= std::min(excess, std::min(asked, c.parked_bytes()));
      continue;
    }
    parked.push_back(&c);
  }
  const auto last_to_run = [this](const ClientRecord* c) {
    if (c->state == ClientState::kIdle) return queue_.size();
    const auto at = std::find(queue_.begin(), queue_.end(), c->id);
    return static_cast<std::size_t>(at - queue_.begin());
  };
  std::sort(parked.begin(), parked.end(), [&](const ClientRecord* a, const ClientRecord* b) {
    if (a->rank() != b->rank()) return a->rank() < b->rank();  // the lowest class first
    const std::size_t pa = last_to_run(a);
    const std::size_t pb = last_to_run(b);
    if (pa != pb) return pa > pb;
    return a->parked_bytes() != b->parked_bytes() ? a->parked_bytes() > b->parked_bytes()
                                                  : a->id < b->id;
  });
  for (ClientRecord* c : parked) {
    if (excess == 0) break;
    // A client that takes byte targets moves only the excess; another, all it parks.
    const std::uint64_t moved =
        c->partial_swap ? std::min(excess, c->parked_bytes()) : c->parked_bytes();
    excess -= std::min(excess, moved);
    c->evict_bytes = moved < c->parked_bytes() ? moved : 0;
    // Whole allocations move, so a byte target may move up to all of it: the deadline is that of
    // all of it.
    c->evict_until = now + config_.revoke_grace +
                     std::min(client_swap_time(config_, c->parked_bytes(), c->swap_bytes_per_s,
                                               config_.device_bytes),
                              config_.swap_allowance_max);
    ++c->counters.evictions;
    c->room_sent = 0;
    out.push_back(SendEvict{c->id, c->evict_bytes});
  }
}

void GpuPolicy::revoke_spent_quota(MonoTime now, std::vector<Action>& out) {
  for (ClientRecord& c : clients_) {
    if (c.state != ClientState::kRunning || !binds(c) || (!c.quota->spent() && !held_by_floor(c))) {
      continue;
    }
    // Memory must move only if the client that runs next cannot sit beside it.
    const ClientRecord* next = head();
    SwapOrder order;
    if (next != nullptr) {
      std::vector<const ClientRecord*> staying = blocking_holders();
      remove_client(staying, &c);
      std::uint64_t resident = next->movable_bytes();
      if (config_.mode == Mode::kAuto) resident += sum_working_sets(staying);
      order = order_for(c, resident);
    }
    revoke(c, RevokeReason::kQuota, order, now, out);
  }
}

void GpuPolicy::revoke_overflow(MonoTime now, std::vector<Action>& out) {
  if (config_.mode != Mode::kAuto) return;
  std::vector<ClientRecord*> running;
  for (ClientRecord& c : clients_) {
    if (c.state == ClientState::kRunning) running.push_back(&c);
  }
  std::sort(running.begin(), running.end(), keeps_longer);
  std::uint64_t total = 0;
  for (const ClientRecord* c : running) total += c->movable_bytes();
  // Working sets grew after the grants: the lowest class leaves first, and within a class the
  // newest grants, until the others fit again.
  while (running.size() > 1 && !fits_ignoring_parked(total)) {
    ClientRecord* newest = running.back();
    running.pop_back();
    total -= newest->movable_bytes();
    // It does not fit beside the others: it swaps out, all of it or (a client that takes byte
    // targets) what does not fit. Only the last leaver can keep bytes: keeping any means the
    // others fit with room to spare, which ends the loop.
    std::uint64_t resident = total;
    revoke(*newest, RevokeReason::kMemory, order_for(*newest, resident), now, out);
  }
}

// Clients that were granted side by side and have since reported a deep queue: all but the one
// furthest behind by its fair clock leave (reason turn, nothing to swap) and take turns from now
// on.
void GpuPolicy::revoke_saturating_pairs(MonoTime now, std::vector<Action>& out) {
  std::vector<ClientRecord*> saturating;
  for (ClientRecord& c : clients_) {
    if (c.state == ClientState::kRunning && c.saturating) saturating.push_back(&c);
  }
  if (saturating.size() < 2) return;
  const auto behind = std::min_element(
      saturating.begin(), saturating.end(), [](const ClientRecord* a, const ClientRecord* b) {
        return a->fair_s != b->fair_s ? a->fair_s < b->fair_s : a->epoch < b->epoch;
      });
  for (ClientRecord* c : saturating) {
    if (c != *behind) revoke(*c, RevokeReason::kTurn, SwapOrder{}, now, out);
  }
}

// A client of a higher class waits at the head: every runner of a lower class leaves now, whatever
// its turn or clock. Memory stays on the device for each leaver that still fits beside the head
// and what else stays resident, the higher classes' leavers first; the others swap out.
void GpuPolicy::revoke_for_priority(MonoTime now, std::vector<Action>& out) {
  const ClientRecord* next = head();
  if (next == nullptr) return;
  std::vector<ClientRecord*> leaving;
  for (ClientRecord& c : clients_) {
    if (c.state == ClientState::kRunning && c.rank() < next->rank()) leaving.push_back(&c);
  }
  if (leaving.empty()) return;
  std::sort(leaving.begin(), leaving.end(), keeps_longer);
  std::uint64_t resident = next->movable_bytes() + resident_besides(leaving);
  for (ClientRecord* r : leaving) {
    const SwapOrder order = order_for(*r, resident);
    revoke(*r, RevokeReason::kPriority, order, now, out);
  }
}

// Priority classes: a lower class runs in a higher class's idle moments only while the delays its
// draining kernels cause the higher class stay within the budget; out of budget it waits until the
// budget is repaid, or for priority_floor at most.
void GpuPolicy::hold_back_lower_classes(MonoTime now) {
  // Present: wants or holds the GPU, or handed it over at an idle moment of its steps less than a
  // floor ago (its next step is coming: its idle moments are what a lower class runs in). A holder
  // that ignored its revoke is not: it has stopped blocking, and holds nobody back either.
  // A client above every holder is not held back either: it takes the GPU from a lower class.
  int top = -1;
  int lowest_holder = static_cast<int>(Priority::kHigh) + 1;
  for (const ClientRecord& c : clients_) {
    const bool between_steps = c.stepping && now - c.state_since < config_.priority_floor;
    const bool present = c.active() && c.state != ClientState::kUnresponsive;
    if (present || between_steps) top = std::max(top, c.rank());
    if (c.blocks()) lowest_holder = std::min(lowest_holder, c.rank());
  }
  hold_top_ = top;
  const auto holds_back = [&](const ClientRecord& c) {
    return c.state == ClientState::kWaiting && !c.throttled && c.rank() < top &&
           c.rank() <= lowest_holder && interference_s_ < 0;
  };
  // One at a time: not while a grant the floor let through is still held (by a holder that still
  // blocks: one that ignored its revoke would stop the floor for good).
  const bool floor_grant_held =
      std::any_of(clients_.begin(), clients_.end(),
                  [](const ClientRecord& c) { return c.blocks() && c.floor_grant; });
  if (std::none_of(clients_.begin(), clients_.end(), holds_back)) {
    // A grant the floor let through keeps the floor's clock until it is released (restart_floor).
    if (!floor_grant_held) held_since_.reset();
  } else {
    if (!held_since_) held_since_ = now;
    // Nobody asks the holders to yield now: their grants span steps, and their releases measure
    // none.
    for (ClientRecord& c : clients_) {
      if (c.holds()) c.step_grant = false;
    }
  }
  // The floor lets the lower classes run in their order: a floor after holding back began (or
  // after the release of the last grant it let through, if that grant was used), the first of
  // them in the queue that could run (the highest class, the longest wait) is let through.
  const ClientRecord* first = nullptr;
  if (held_since_ && !floor_grant_held && now - *held_since_ >= config_.priority_floor) {
    for (ClientId id : queue_) {
      const ClientRecord* c = find(id);
      if (holds_back(*c) && fits_beside_kept(*c)) {
        first = c;
        break;
      }
    }
  }
  for (ClientRecord& c : clients_) c.held_back = holds_back(c) && &c != first;
}

void GpuPolicy::observe_step(ClientRecord& c, MonoTime now) {
  const bool yielded = c.yield_epoch == c.epoch;
  if (yielded && c.step_grant) {
    const Duration step = now - c.granted_at;
    c.step_estimate =
        c.step_estimate == Duration::zero()
            ? step
            : std::chrono::duration_cast<Duration>(c.step_estimate * (1 - kStepEstimateWeight) +
                                                   step * kStepEstimateWeight);
  }
  c.stepping = yielded;
}

// A step and the median of its last gaps (a pause now and then does not make its cycle long).
Duration GpuPolicy::cycle_of(const ClientRecord& c) {
  const std::span<const Duration> kept = c.gaps.kept();
  if (kept.empty()) return c.step_estimate;
  std::array<Duration, ClientRecord::kGapsKept> gaps{};
  const auto end = std::copy(kept.begin(), kept.end(), gaps.begin());
  const auto mid = gaps.begin() + static_cast<std::ptrdiff_t>(kept.size() / 2);
  std::nth_element(gaps.begin(), mid, end);
  return c.step_estimate + *mid;
}

// A delay beyond the free share slows at least the higher class's next step, so it is charged a
// cycle of that class at least: the budget then bounds the share of its steps that are slowed
// (what its tail latency feels), not only the time, however short each delay is.
void GpuPolicy::charge_interference(const ClientRecord& c, MonoTime now) {
  if (c.revoke_reason != RevokeReason::kPriority || c.swap_out) return;
  // The shortest step of a higher class that is present: the one a delay costs most.
  const ClientRecord* shortest = nullptr;
  for (const ClientRecord& h : clients_) {
    if (h.rank() > c.rank() && h.active() && h.step_estimate > Duration::zero() &&
        (shortest == nullptr || h.step_estimate < shortest->step_estimate)) {
      shortest = &h;
    }
  }
  const Duration delay = now - c.revoked_at;
  Duration charge = delay;  // no step known to compare with: its length
  if (shortest != nullptr) {
    if (to_seconds(delay) <= kPriorityFreeDelay * to_seconds(shortest->step_estimate)) return;
    charge = std::max(delay, cycle_of(*shortest));
  }
  interference_s_ -= to_seconds(charge);
}

// A lower class's grant while holding back is on starts the next floor once it was used: the
// client went idle by itself, or had work in flight when it was revoked. A grant revoked before the
// client could submit anything (the higher class came back at once) leaves the floor passed, so the
// next idle moment goes to the lower class again.
void GpuPolicy::restart_floor(const ClientRecord& c, MonoTime now) {
  if (!held_since_ || !c.floor_grant) return;
  const bool used = c.state == ClientState::kRunning || now - c.revoked_at >= kFloorGrantUsed;
  if (used) held_since_ = now;
}

double GpuPolicy::interference_burst_s() const {
  return config_.priority_interference * to_seconds(config_.priority_floor);
}

std::optional<MonoTime> GpuPolicy::interference_repaid_at() const {
  if (config_.priority_interference <= 0) return std::nullopt;
  // Rounded up, and a microsecond more: the budget is back at 0 by then, not a hair below.
  const double s = std::max(0.0, -interference_s_ / config_.priority_interference);
  return now_ + Duration(static_cast<std::int64_t>(std::ceil(s * 1e9))) + 1us;
}

void GpuPolicy::grant_in_order(MonoTime now, std::vector<Action>& out) {
  const ClientRecord* blocked = nullptr;  // a head that waits only for its turn among saturating
  for (std::size_t i = 0; i < queue_.size();) {
    ClientRecord* c = find(queue_[i]);
    // Waits for its bucket, or for memory others pinned, not for anyone's turn: must not hold up
    // those behind it.
    if (c->throttled || c->held_back || !fits_beside_kept(*c)) {
      ++i;
      continue;
    }
    const std::vector<const ClientRecord*> holders = blocking_holders();
    if (blocked == nullptr) {
      if (can_run_beside(holders, *c)) {
        queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
        grant(*c, now, out);
        continue;
      }
      // FIFO: nobody overtakes the head, except past one that waits for its turn among saturating
      // clients, by a client that runs beside the holders and leaves the head room to run.
      if (one_at_a_time() || !waits_only_for_turn(holders, *c)) break;
      blocked = c;
      ++i;
      continue;
    }
    if (c->rank() == blocked->rank() && can_run_beside(holders, *c) &&
        fits(sum_working_sets(holders) + c->movable_bytes() + blocked->movable_bytes())) {
      queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
      grant(*c, now, out);
      continue;
    }
    break;
  }
}

void GpuPolicy::revoke_ended_turns(MonoTime now, std::vector<Action>& out) {
  const ClientRecord* next = head();
  if (next == nullptr) return;
  const std::optional<TurnPlan> plan = turn_plan(*next);
  if (!plan || plan->at > now) return;
  for (const PlannedLeaver& l : planned_leavers(*next, *plan)) {
    revoke(*find(l.runner->id), RevokeReason::kTurn, l.order, now, out);
  }
}

std::vector<GpuPolicy::PlannedLeaver> GpuPolicy::planned_leavers(const ClientRecord& head,
                                                                 const TurnPlan& plan) const {
  std::vector<const ClientRecord*> leaving;
  for (const ClientRecord* r : runners_by_turn_end(head)) {
    leaving.push_back(r);
    if (r->id == plan.runner) break;
  }
  // Memory stays on the device for each leaver that still fits beside the head and whatever else
  // stays resident (runners that stay, revoked holders not swapping out); the others swap out, all
  // of it or, a client that takes byte targets, the part that does not fit.
  std::uint64_t resident = head.movable_bytes() + resident_besides(leaving);
  std::vector<PlannedLeaver> planned;
  for (const ClientRecord* r : leaving)
    planned.push_back(PlannedLeaver{r, order_for(*r, resident)});
  return planned;
}

// A held-back lower class waits for the holders of a higher class to leave an idle moment, and is
// given none while holding back is on (their grants span steps: no yields). Each such holder is
// told once per grant, and releases at its next pause rather than after its whole idle release:
// the pauses between a service's bursts go to the lower class, the gaps between its steps do not.
void GpuPolicy::send_contended(std::vector<Action>& out) {
  int held_back_rank = -1;  // the highest class held back
  for (const ClientRecord& c : clients_) {
    if (c.held_back) held_back_rank = std::max(held_back_rank, c.rank());
  }
  if (held_back_rank < 0) return;
  for (ClientRecord& c : clients_) {
    if (c.state == ClientState::kRunning && c.rank() > held_back_rank &&
        c.contended_epoch != c.epoch) {
      c.contended_epoch = c.epoch;
      ++c.counters.contended;
      out.push_back(SendContended{c.id, c.epoch});
    }
  }
}

// As soon as the head's turn is planned, each runner that will leave for it with a swap-out is
// told (once per grant), so that it readies the swap while its turn lasts.
void GpuPolicy::send_swap_notices(std::vector<Action>& out) {
  const ClientRecord* next = head();
  if (next == nullptr) return;
  const std::optional<TurnPlan> plan = turn_plan(*next);
  if (!plan) return;
  for (const PlannedLeaver& l : planned_leavers(*next, *plan)) {
    ClientRecord& c = *find(l.runner->id);
    if (!l.order.swap_out || c.state != ClientState::kRunning || c.swap_notice_epoch == c.epoch) {
      continue;
    }
    c.swap_notice_epoch = c.epoch;
    ++c.counters.swap_notices;
    out.push_back(SendSwapNotice{c.id, c.epoch, l.order.bytes});
  }
}

void GpuPolicy::send_wait_reasons(std::vector<Action>& out) {
  const ClientRecord* next = head();
  for (ClientId id : queue_) {
    ClientRecord& c = *find(id);
    const std::optional<WaitReason> reason = reason_for(c, next);
    if (reason && reason != c.wait_reason) {
      book_wait(c, now_);
      c.wait_reason = reason;
      out.push_back(SendWait{c.id, *reason});
    }
  }
}

// One runner at a time (exclusive mode, or a cap binds): while the head of the queue waits for its
// turn and would fit beside the holders' memory (the hand-off moves nothing), each holder is asked
// once per grant to give the GPU back as soon as it is idle, from the moment its fair clock is
// within the slack of the head's. A busy holder keeps its quantum; one that pauses (host work
// between short kernels, a finished job) hands over at once instead of after its idle release,
// unless it has had clearly less of the GPU than the head: a job whose steps leave short idle gaps
// is not handed over at every gap to one that leaves none.
void GpuPolicy::send_yields(std::vector<Action>& out) {
  const ClientRecord* next = yield_target();
  if (next == nullptr) return;
  for (ClientRecord& c : clients_) {
    if (yield_unsent(c) && takes_turns_with(c, *next) && yield_time(c, *next) <= now_) {
      c.yield_epoch = c.epoch;
      ++c.counters.yields;
      out.push_back(SendYield{c.id, c.epoch});
    }
  }
}

const ClientRecord* GpuPolicy::yield_target() const {
  const ClientRecord* next = head();
  if (next == nullptr) return nullptr;
  return waits_only_for_turn(blocking_holders(), *next) ? next : nullptr;
}

bool GpuPolicy::yield_unsent(const ClientRecord& c) {
  return c.state == ClientState::kRunning && c.yield_epoch != c.epoch;
}

MonoTime GpuPolicy::yield_time(const ClientRecord& holder, const ClientRecord& next) const {
  // A higher class hands its idle moments to a lower one at once, whatever the clocks.
  if (holder.rank() > next.rank()) return now_;
  // The slack keeps a holder that is a little behind (a short burst, then idle) from holding an
  // idle GPU until its idle release; a waiting head's clock stands still while the holder's runs
  // at its billing rate.
  return when_clock_gains(holder, next.fair_s - holder.fair_s - fair_slack_s());
}

// A turn of one runner at a time that moves no memory ends by the fair clocks, long before the
// quantum that exists to pay for swaps: a holder that never idles gives the GPU up once it is the
// lead ahead of the head, so the clients' shares follow their weights over a few slices, not over
// a few quanta. The quantum still ends a turn that the clocks have not (revoke_ended_turns).
void GpuPolicy::revoke_fair_turns(MonoTime now, std::vector<Action>& out) {
  const ClientRecord* next = yield_target();
  if (next == nullptr) return;
  for (ClientRecord& c : clients_) {
    if (c.state == ClientState::kRunning && c.rank() <= next->rank() &&
        takes_turns_with(c, *next) && fair_turn_end(c, *next) <= now) {
      revoke(c, RevokeReason::kTurn, SwapOrder{}, now, out);
    }
  }
}

MonoTime GpuPolicy::fair_turn_end(const ClientRecord& holder, const ClientRecord& next) const {
  const Duration shortest =
      std::chrono::duration_cast<Duration>(config_.turn_slice * kShortestTurn);
  const MonoTime earliest = std::max(holder.granted_at, holder.runs_from) + shortest;
  return std::max(earliest, when_clock_gains(holder, next.fair_s + fair_lead_s() - holder.fair_s));
}

MonoTime GpuPolicy::when_clock_gains(const ClientRecord& holder, double seconds) const {
  const double rate = holder.usage.rate() / fair_weight(holder);
  if (seconds <= 1e-6) return now_;
  if (rate <= 0) return MonoTime::max();
  return now_ + Duration(static_cast<std::int64_t>(std::ceil(seconds / rate * 1e9)));
}

double GpuPolicy::fair_weight(const ClientRecord& c) const {
  return std::max(effective_cap(c), 0.01);
}

void GpuPolicy::update_fair_floor() {
  std::optional<double> least;
  for (const ClientRecord& c : clients_) {
    if (c.active() && (!least || c.fair_s < *least)) least = c.fair_s;
  }
  if (least) fair_floor_s_ = std::max(fair_floor_s_, *least);
}

// Up to the slack below the floor (settle() keeps the floor current): a holder that answered a
// yield a little behind and asks again at once keeps what it was owed, so that it does not lose the
// slack at every hand-over.
void GpuPolicy::catch_up_fair_clock(ClientRecord& c) {
  const double start = fair_floor_s_ - fair_slack_s();
  c.fair_s = std::max(c.fair_s, start);
}

double GpuPolicy::fair_slack_s() const { return kYieldSlack * to_seconds(config_.turn_slice); }

double GpuPolicy::fair_lead_s() const { return kTurnLead * to_seconds(config_.turn_slice); }

std::optional<MonoTime> GpuPolicy::compute_deadline() const {
  std::optional<MonoTime> best;
  auto consider = [&](std::optional<MonoTime> t) {
    if (t && *t != MonoTime::max() && (!best || *t < *best)) best = t;
  };
  for (const ClientRecord& c : clients_) {
    if (c.state == ClientState::kRevoking) consider(c.unresponsive_at);
    consider(c.evict_until);
    if (c.state == ClientState::kRunning && binds(c)) consider(c.quota->spent_at());
    if (c.state == ClientState::kWaiting && c.throttled && c.quota) {
      std::optional<MonoTime> refilled = c.quota->refilled_at();
      if (refilled && c.capped() && c.resume_floor) refilled = std::max(*refilled, *c.resume_floor);
      consider(refilled);
    }
    if (c.held_back) {
      if (*held_since_ + config_.priority_floor > now_) {
        consider(*held_since_ + config_.priority_floor);
      }
      consider(interference_repaid_at());
    }
  }
  if (const ClientRecord* next = head()) {
    if (const std::optional<TurnPlan> plan = turn_plan(*next)) consider(plan->at);
  }
  if (const ClientRecord* next = yield_target()) {
    for (const ClientRecord& c : clients_) {
      if (c.state != ClientState::kRunning || !takes_turns_with(c, *next)) continue;
      if (yield_unsent(c)) consider(yield_time(c, *next));
      if (c.rank() <= next->rank()) consider(fair_turn_end(c, *next));
    }
  }
  return best;
}

// ---- transitions --------------------------------------------------------------------------------

void GpuPolicy::set_state(ClientRecord& c, ClientState state, MonoTime now) {
  if (c.state == ClientState::kWaiting) {
    c.waited_total += now - c.waiting_since;
    book_wait(c, now);
  }
  c.state = state;
  c.state_since = now;
  recount_parked(c);
}

// Books the wait since the reason last changed to that reason.
void GpuPolicy::book_wait(ClientRecord& c, MonoTime now) {
  if (now > c.wait_reason_since) c.counters.waited[c.wait_slot()] += now - c.wait_reason_since;
  c.wait_reason_since = now;
}

void GpuPolicy::enqueue(ClientRecord& c, MonoTime now, bool memory_in_place) {
  set_state(c, ClientState::kWaiting, now);
  c.waiting_since = now;
  c.wait_reason.reset();
  c.wait_reason_since = now;
  // Granting a nearly empty bucket could buy a swap-in for a few milliseconds of work; a client
  // preempted with its memory left in place costs none, so any budget left is worth a grant.
  c.throttled = binds(c) && ((!c.quota->may_enter() && (!memory_in_place || c.quota->spent())) ||
                             held_by_floor(c));
  place_in_queue(c);
}

// Class first, then arrival: behind everyone of its class and above, ahead of lower classes.
void GpuPolicy::place_in_queue(const ClientRecord& c) {
  const auto below = std::find_if(queue_.begin(), queue_.end(),
                                  [&](ClientId id) { return find(id)->rank() < c.rank(); });
  queue_.insert(below, c.id);
}

void GpuPolicy::grant(ClientRecord& c, MonoTime now, std::vector<Action>& out) {
  set_state(c, ClientState::kRunning, now);
  ++c.counters.grants;
  c.step_grant = c.stepping;
  c.stepping = false;
  c.floor_grant = held_since_ && c.rank() < hold_top_;
  c.epoch = ++last_epoch_;
  c.granted_at = now;
  c.runs_from = now + swap_in_estimate(c);
  c.wait_reason.reset();
  c.throttled = false;
  c.resume_floor.reset();
  c.swap_out = false;
  // Its memory is its working set now, and on the device once it has swapped in (the estimate
  // above is taken first): counted as there from now on, until a report says otherwise. An
  // eviction on its way is overtaken by the grant.
  c.resident_bytes = std::max(c.resident_bytes, c.allocated_bytes);
  c.room_sent = 0;
  c.evict_until.reset();
  c.evict_ignored = false;
  recount_parked(c);
  out.push_back(SendGrant{c.id, c.epoch});
}

void GpuPolicy::revoke(ClientRecord& c, RevokeReason reason, SwapOrder order, MonoTime now,
                       std::vector<Action>& out) {
  set_state(c, ClientState::kRevoking, now);
  ++c.counters.revokes[static_cast<std::size_t>(reason)];
  c.revoked_at = now;
  c.revoke_reason = reason;
  c.swap_out = order.swap_out;
  c.swap_bytes = order.swap_out ? order.bytes : 0;
  c.gang_unbilled = Duration::zero();
  c.gang_drain_waited = false;
  if (drain_waits_for_gang(c)) c.gang_unbilled_since = now;
  // A holder revoked while it still swaps in must finish that before it can drain.
  c.unresponsive_at = std::max(now, c.runs_from) + config_.revoke_grace + swap_allowance(c, order);
  out.push_back(SendRevoke{c.id, c.epoch, reason, c.swap_out, c.swap_bytes});
}

GpuPolicy::SwapOrder GpuPolicy::order_for(const ClientRecord& leaver,
                                          std::uint64_t& resident) const {
  const std::uint64_t movable = leaver.movable_bytes();
  if (fits(resident + movable)) {
    resident += movable;
    return {};
  }
  if (!leaver.partial_swap) return {true, 0};
  // What may stay beside the rest: usable less pinned, parked and resident bytes.
  const std::uint64_t taken = resident + pinned_total() + parked_total();
  const std::uint64_t kept = std::min(movable, usable() - std::min(usable(), taken));
  resident += kept;
  return {true, movable - kept};
}

// ---- memory and turn arithmetic -----------------------------------------------------------------

template <typename Leaver>
std::uint64_t GpuPolicy::resident_besides(const std::vector<Leaver*>& leaving) const {
  std::uint64_t resident = 0;
  for (const ClientRecord& c : clients_) {
    if (std::find(leaving.begin(), leaving.end(), &c) != leaving.end()) continue;
    if (c.state == ClientState::kRunning && config_.mode == Mode::kAuto) {
      resident += c.movable_bytes();
    } else if (c.state == ClientState::kRevoking) {
      resident += c.kept_at_release();
    }
  }
  return resident;
}

std::uint64_t GpuPolicy::capacity() const {
  return config_.capacity_bytes.value_or(config_.device_bytes);
}

Duration GpuPolicy::swap_time(const ClientRecord& c) const {
  // A swap moves at most what the device holds, whatever the client says it allocated.
  const std::uint64_t bound = config_.device_bytes > 0 ? config_.device_bytes : capacity();
  return client_swap_time(config_, c.movable_bytes(), c.swap_bytes_per_s, bound);
}

Duration GpuPolicy::swap_in_estimate(const ClientRecord& c) const {
  // Only a client whose memory is on the host (it said so after its last swap-out) swaps in; the
  // estimate is bounded like the swap allowance, and a client with a strike gets none.
  if (c.memory_on_device() || c.strikes > 0) return Duration::zero();
  return std::min(swap_time(c), config_.swap_allowance_max);
}

Duration GpuPolicy::swap_allowance(const ClientRecord& c, SwapOrder order) const {
  // Moving a large working set to host legitimately takes a while; that is not unresponsiveness.
  // But only once: a client that already ignored a revoke gets the grace alone.
  // A byte target moves whole allocations, up to all of them: the allowance is that of all.
  if (!order.swap_out || c.strikes > 0) return Duration::zero();
  return std::min(swap_time(c), config_.swap_allowance_max);
}

std::uint64_t GpuPolicy::usable() const {
  // Rounded up to a whole byte (less a hair of floating-point noise), so 90% of 20Gi is 18Gi
  // exactly and 90% of 24Gi shows as the 21.6Gi a user expects rather than 21.5Gi.
  const double usable =
      std::ceil(static_cast<double>(capacity()) * (1 - config_.reserve_fraction) - 1e-6);
  return usable >= 1.8e19 ? capacity() : static_cast<std::uint64_t>(usable);
}

bool GpuPolicy::fits(std::uint64_t movable) const {
  return fits_ignoring_parked(movable + parked_total());
}

bool GpuPolicy::fits_ignoring_parked(std::uint64_t movable) const {
  return capacity() > 0 && movable + pinned_total() <= usable();
}

std::uint64_t GpuPolicy::parked_above(const ClientRecord& c) const {
  std::uint64_t parked = 0;
  for (std::size_t r = static_cast<std::size_t>(c.rank()) + 1; r < parked_by_rank_.size(); ++r) {
    parked += parked_by_rank_[r];
  }
  return parked;
}

std::uint64_t GpuPolicy::parked_total() const {
  std::uint64_t parked = 0;
  for (std::uint64_t bytes : parked_by_rank_) parked += bytes;
  return parked;
}

void GpuPolicy::recount_parked(ClientRecord& c) {
  parked_by_rank_[static_cast<std::size_t>(c.parked_counted_rank)] -= c.parked_counted;
  c.parked_counted = c.parked_bytes();
  c.parked_counted_rank = c.rank();
  parked_by_rank_[static_cast<std::size_t>(c.parked_counted_rank)] += c.parked_counted;
}

bool GpuPolicy::can_run_beside(const std::vector<const ClientRecord*>& staying,
                               const ClientRecord& head) const {
  // An idle GPU takes the head however large, unless memory other clients pinned leaves it too
  // little room (it waits, without holding up the queue, until that memory is freed) or memory
  // others keep parked does (it waits for their eviction).
  if (staying.empty()) return fits_on_idle_gpu(head);
  // A lower class revoked for the head's, its memory left in place, gives the GPU up at once: its
  // gate is closed, and the kernels it still has in flight (one kernel cannot be taken back) are
  // time-sliced by the GPU beside the head's instead of making the head wait for them. Its memory
  // still counts.
  std::vector<const ClientRecord*> blocking;
  for (const ClientRecord* c : staying) {
    if (!drains_for(*c, head)) blocking.push_back(c);
  }
  if (blocking.empty()) return fits(sum_working_sets(staying) + head.movable_bytes());
  if (one_at_a_time()) return false;
  // Classes never run side by side: a lower one would slow a higher one's every kernel.
  if (std::any_of(blocking.begin(), blocking.end(),
                  [&](const ClientRecord* c) { return c->rank() != head.rank(); })) {
    return false;
  }
  if (std::any_of(blocking.begin(), blocking.end(),
                  [&](const ClientRecord* c) { return takes_turns_with(*c, head); })) {
    return false;
  }
  return fits(sum_working_sets(staying) + head.movable_bytes());
}

bool GpuPolicy::drains_for(const ClientRecord& holder, const ClientRecord& head) {
  return holder.state == ClientState::kRevoking &&
         holder.revoke_reason == RevokeReason::kPriority && !holder.swap_out &&
         holder.rank() < head.rank();
}

bool GpuPolicy::takes_turns_with(const ClientRecord& holder, const ClientRecord& next) const {
  return one_at_a_time() || holder.rank() != next.rank() || (holder.saturating && next.saturating);
}

bool GpuPolicy::waits_only_for_turn(const std::vector<const ClientRecord*>& holders,
                                    const ClientRecord& head) const {
  return !holders.empty() && fits(sum_working_sets(holders) + head.movable_bytes()) &&
         !can_run_beside(holders, head);
}

std::vector<const ClientRecord*> GpuPolicy::blocking_holders() const {
  std::vector<const ClientRecord*> holders;
  for (const ClientRecord& c : clients_) {
    if (c.blocks()) holders.push_back(&c);
  }
  return holders;
}

bool GpuPolicy::fits_beside_kept(const ClientRecord& c) const {
  const std::uint64_t kept_above = parked_above(c);
  return (pinned_total() == c.pinned_bytes && kept_above == 0) ||
         fits_ignoring_parked(c.movable_bytes() + c.parked_bytes() + kept_above);
}

bool GpuPolicy::fits_on_idle_gpu(const ClientRecord& c) const {
  // While the capacity is unknown nothing can be judged to fit: parked memory holds nobody up.
  return fits_beside_kept(c) &&
         (capacity() == 0 || parked_total() == c.parked_bytes() || fits(c.movable_bytes()));
}

const ClientRecord* GpuPolicy::head() const {
  for (ClientId id : queue_) {
    const ClientRecord* c = find(id);
    if (!c->throttled && !c->held_back && fits_beside_kept(*c)) return c;
  }
  return nullptr;
}

std::optional<WaitReason> GpuPolicy::reason_for(const ClientRecord& c,
                                                const ClientRecord* head) const {
  if (c.state != ClientState::kWaiting) return std::nullopt;
  if (c.throttled) return WaitReason::kQuota;
  if (c.held_back) return WaitReason::kPriority;
  const std::vector<const ClientRecord*> holders = blocking_holders();
  const auto above = [&](const ClientRecord* o) { return o != nullptr && o->rank() > c.rank(); };
  if (above(head) || std::any_of(holders.begin(), holders.end(), above)) {
    return WaitReason::kPriority;
  }
  // Memory a higher class keeps on the device keeps it out even of an idle GPU after every
  // eviction it may ask for: it waits for that class (without holding up those behind it).
  if (!fits_beside_kept(c) && parked_above(c) > 0) return WaitReason::kPriority;
  // Nobody holds the GPU and it cannot run yet: it waits for memory that others keep there.
  if (holders.empty() && !fits_on_idle_gpu(c)) return WaitReason::kMemory;
  if (config_.mode == Mode::kExclusive) return WaitReason::kTurn;
  if (&c != head && can_run_beside(holders, c)) return WaitReason::kTurn;  // behind the head
  // For its turn when it would fit beside the holders (one at a time while a cap binds, or among
  // saturating clients), else for memory.
  if (fits(sum_working_sets(holders) + c.movable_bytes())) return WaitReason::kTurn;
  return WaitReason::kMemory;
}

Duration GpuPolicy::quantum_between(const ClientRecord& runner, const ClientRecord& head) const {
  if (!config_.fixed_quantum && runner.strikes > 0) return config_.quantum_min;
  return quantum_for(config_, swap_time(runner) + swap_time(head));
}

std::vector<const ClientRecord*> GpuPolicy::runners_by_turn_end(const ClientRecord& head) const {
  // A higher class's runners never leave for a lower class's turn.
  std::vector<const ClientRecord*> runners;
  for (const ClientRecord& c : clients_) {
    if (c.state == ClientState::kRunning && c.rank() <= head.rank()) runners.push_back(&c);
  }
  // When the head fits beside all of them, only those it takes turns with have to leave.
  if (fits(sum_working_sets(runners) + head.movable_bytes())) {
    std::erase_if(runners, [&](const ClientRecord* r) { return !takes_turns_with(*r, head); });
  }
  std::sort(runners.begin(), runners.end(), [&](const ClientRecord* a, const ClientRecord* b) {
    const MonoTime ea = a->granted_at + quantum_between(*a, head);
    const MonoTime eb = b->granted_at + quantum_between(*b, head);
    return ea != eb ? ea < eb : a->epoch < b->epoch;
  });
  return runners;
}

std::optional<GpuPolicy::TurnPlan> GpuPolicy::turn_plan(const ClientRecord& head) const {
  // Revoked holders are already leaving; only runners can still be asked to.
  std::vector<const ClientRecord*> staying;
  for (const ClientRecord& c : clients_) {
    if (c.state == ClientState::kRunning) staying.push_back(&c);
  }
  if (can_run_beside(staying, head)) return std::nullopt;  // the pending releases are enough
  for (const ClientRecord* r : runners_by_turn_end(head)) {
    remove_client(staying, r);
    if (can_run_beside(staying, head))
      return TurnPlan{r->granted_at + quantum_between(*r, head), r->id};
  }
  return std::nullopt;
}

}  // namespace nvshare::policy
