// What GpuPolicy remembers about one client (internal to the policy engine).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "common/last_values.h"
#include "common/mono_time.h"
#include "scheduler/policy/events.h"
#include "scheduler/policy/quota.h"
#include "scheduler/policy/usage_window.h"

namespace nvshare::policy {

enum class ClientState { kIdle, kWaiting, kRunning, kRevoking, kUnresponsive };

// Holds a grant epoch (is billed as one of the n holders).
inline bool holds(ClientState state) {
  return state == ClientState::kRunning || state == ClientState::kRevoking ||
         state == ClientState::kUnresponsive;
}

// The reasons ClientCounters counts, in the order status and metrics list them (a yield is counted
// apart: it takes nothing back).
inline constexpr std::array<WaitReason, 4> kWaitReasons = {
    WaitReason::kMemory, WaitReason::kTurn, WaitReason::kQuota, WaitReason::kPriority};
inline constexpr std::array<RevokeReason, 5> kRevokeReasons = {
    RevokeReason::kTurn, RevokeReason::kQuota, RevokeReason::kMemory, RevokeReason::kAdmin,
    RevokeReason::kPriority};

// What happened to a client since it registered, for monitoring (metrics, status). Counted by the
// engine as it decides; nothing depends on them.
struct ClientCounters {
  std::uint64_t grants = 0;
  std::array<std::uint64_t, 7> revokes{};  // indexed by RevokeReason (kTurn..kPriority)
  std::uint64_t yields = 0;                // asked to hand over when idle
  std::uint64_t swap_notices = 0;          // told a swap-out is coming (SendSwapNotice)
  std::uint64_t evictions = 0;             // asked to move its parked memory out (SendEvict)
  std::uint64_t rooms = 0;                 // given room to bring memory back while waiting
  std::uint64_t contended = 0;             // told a held-back lower class waits for it
  std::uint64_t releases = 0;              // answers to revokes
  std::uint64_t idle_releases = 0;         // released unasked (idle)
  // Time waited, by the reason it was given (WaitReason as the index); index 0 is waiting before
  // any reason was given (the moment between a request and its grant or first wait reason).
  std::array<Duration, 5> waited{};
  static_assert(static_cast<std::size_t>(WaitReason::kPriority) <
                std::tuple_size_v<decltype(waited)>);
  static_assert(static_cast<std::size_t>(RevokeReason::kPriority) <
                std::tuple_size_v<decltype(revokes)>);

  std::uint64_t revokes_for(RevokeReason r) const { return revokes[static_cast<std::size_t>(r)]; }
  Duration waited_for(WaitReason r) const { return waited[static_cast<std::size_t>(r)]; }
};

struct ClientRecord {
  ClientRecord(ClientId client_id, MonoTime now) : id(client_id), state_since(now), usage(now) {}

  ClientId id;
  Limits limits;
  std::uint64_t allocated_bytes = 0;  // the working set, as reported
  std::uint64_t resident_bytes = 0;
  // Of allocated_bytes, what stays on the device whatever the client's state (CUDA IPC memory
  // another process maps): counted for every client in every fit check, never moved by a swap.
  std::uint64_t pinned_bytes = 0;
  std::uint64_t swap_bytes_per_s = 0;  // its last non-zero measured swap bandwidth, as reported
  // Whether it can be asked to move memory it keeps while it holds no grant (SendEvict, protocol
  // version 9). Only such a client's parked memory counts: an older one is never asked.
  bool evictable = true;
  // An eviction is pending: when it stops counting if the client has not answered by then.
  std::optional<MonoTime> evict_until;
  // It let an eviction run out: its parked memory no longer counts until its next grant.
  bool evict_ignored = false;
  // It moves only the bytes a revoke or an eviction asks for (Registered::partial_swap).
  bool partial_swap = false;
  // It can be given room to bring memory back while it waits (Registered::takes_room), and the
  // room last given in this wait (SendRoom; 0: none since its grant or its last eviction).
  bool takes_room = false;
  std::uint64_t room_sent = 0;
  // The eviction pending: the bytes asked (0: all). A partial_swap client's usage report answers it
  // when its count of evictions answered moves; another's when nothing is parked any more.
  std::uint64_t evict_bytes = 0;
  std::uint32_t evictions_answered = 0;  // the count last reported
  // What the policy's parked sums hold for it (GpuPolicy::recount_parked): its parked_bytes() and
  // rank() when they were last counted.
  std::uint64_t parked_counted = 0;
  int parked_counted_rank = 0;
  // Times it ignored a revoke past its grace. A client with a strike gets no swap allowance and
  // (auto quantum) the shortest quantum from then on: it cannot hold others out twice as long.
  int strikes = 0;

  ClientState state = ClientState::kIdle;
  MonoTime state_since;

  // The current grant (or the last one, once released).
  GrantEpoch epoch = 0;
  MonoTime granted_at{};
  // When it can run: the grant, or, granted while swapped out, the grant plus its estimated
  // swap-in (at most swap_allowance_max). A revoke's grace counts from here at the earliest.
  MonoTime runs_from{};
  // Set while revoking: why, whether memory must move, and when the holder stops blocking others.
  MonoTime revoked_at{};
  RevokeReason revoke_reason = RevokeReason::kTurn;
  bool swap_out = false;
  std::uint64_t swap_bytes = 0;  // with swap_out, what it was asked to move (0: all)
  MonoTime unresponsive_at{};
  GrantEpoch yield_epoch = 0;        // the grant a yield was sent for (once per grant)
  GrantEpoch swap_notice_epoch = 0;  // the grant a swap notice was sent for (once per grant)
  GrantEpoch contended_epoch = 0;    // the grant SendContended was sent for (once per grant)

  // Set while waiting.
  MonoTime waiting_since{};
  std::optional<WaitReason> wait_reason;  // the reason last sent for this wait
  MonoTime wait_reason_since{};           // when it was sent (or the wait began)
  bool throttled = false;  // waits until its quota bucket is back at the resume level
  // Waits while a higher class is present: the interference budget is spent (GpuPolicy,
  // hold_back_lower_classes).
  bool held_back = false;
  bool floor_grant = false;  // its grant came while lower classes were held back
  // Its steps, as the scheduler sees them while it hands its idle moments to a lower class: a grant
  // that followed a release at an idle moment after a yield (step_grant) lasts from the request to
  // the next such release. step_estimate: their moving average (0: none seen yet).
  // gaps: the last kGapsKept idle moments between those steps (a release at an idle moment to the
  // next request); its cycle is a step and the median gap.
  static constexpr std::size_t kGapsKept = 8;
  bool stepping = false;
  bool step_grant = false;
  Duration step_estimate{0};
  LastValues<Duration, kGapsKept> gaps;
  // A capped client's pause ends no earlier than this (ResumeNotBefore); cleared at its grant.
  std::optional<MonoTime> resume_floor;
  // Its gang's members on other GPUs have all stopped, one at least pausing (ResumeNotBefore).
  bool gang_peers_paused = false;
  // Its drain after a quota revoke while they were stopped: not billed as it passed, and billed at
  // its release unless a member resumed before it ended (then it waited for them).
  Duration gang_unbilled{0};
  MonoTime gang_unbilled_since{};
  bool gang_drain_waited = false;
  Duration waited_total{0};
  ClientCounters counters;

  std::optional<QuotaLedger> quota;  // capped clients only
  UsageWindow usage;
  // Its fair clock (the yields while one runner runs at a time): billed seconds divided by its
  // entitlement (its effective cap, 1 for an uncapped client while no capped one is active), raised
  // when it becomes active so that time spent idle earns it no precedence over clients that kept
  // wanting the GPU.
  double fair_s = 0;
  // Its pace, as it last reported it: saturating while it keeps a deep queue (classify_pace), so
  // that in mode auto it takes turns with other saturating clients instead of time-slicing with
  // them. Unknown (no report yet, or an older client): not saturating, it runs beside others.
  std::optional<std::uint16_t> deep_queue_permille;
  bool saturating = false;

  bool capped() const { return limits.core_percent < 100; }
  // Its priority class (normal unless its limits name one); higher ranks first.
  Priority priority() const { return protocol::effective_priority(limits.priority); }
  int rank() const { return static_cast<int>(priority()); }
  static constexpr std::size_t kRanks = static_cast<std::size_t>(Priority::kHigh) + 1;
  // The cap in percent, 1..100 (0 never reaches us from the wire; treated as the smallest cap).
  int cap_percent() const { return std::max<int>(1, limits.core_percent); }
  bool holds() const { return policy::holds(state); }
  // The slot of counters.waited the wait in progress is booked to.
  std::size_t wait_slot() const { return wait_reason ? static_cast<std::size_t>(*wait_reason) : 0; }
  // Keeps others out: its memory counts and, in exclusive mode, its presence. An unresponsive
  // holder has stopped blocking.
  bool blocks() const { return state == ClientState::kRunning || state == ClientState::kRevoking; }
  // Counted when caps are scaled: everyone who wants the GPU or holds it.
  bool active() const { return state != ClientState::kIdle; }
  // Its memory is on the device, as it last reported (none of it was swapped out to the host).
  bool memory_on_device() const { return resident_bytes >= allocated_bytes; }
  // Memory it keeps on the device while it holds no grant (idle, waiting: it released at an idle
  // moment, after a turn that moved no memory, or has not run yet): its movable bytes, as long as
  // it reports none of them swapped out. Counted in every fit check beside the pinned bytes, and
  // moved out by an eviction when the head needs the room.
  // A client that moves only what it is asked to (partial_swap) parks whatever it reports resident
  // beyond its pinned bytes; another parks all or nothing.
  std::uint64_t parked_bytes() const {
    if (holds() || !evictable || evict_ignored) return 0;
    const std::uint64_t on_device = partial_swap         ? std::min(resident_bytes, allocated_bytes)
                                    : memory_on_device() ? allocated_bytes
                                                         : 0;
    return on_device - std::min(pinned_bytes, on_device);
  }
  // What would have to come onto the device for it to run (or stays, for a holder): its working
  // set less its pinned and parked bytes, which are on the device already.
  std::uint64_t movable_bytes() const {
    return allocated_bytes - std::min(pinned_bytes, allocated_bytes) - parked_bytes();
  }
  // What a revoking holder leaves on the device when it releases: all its movable bytes when it
  // was not asked to swap out, what a byte target leaves when it was, else nothing.
  std::uint64_t kept_at_release() const {
    if (!swap_out) return movable_bytes();
    if (swap_bytes == 0) return 0;
    return movable_bytes() - std::min(swap_bytes, movable_bytes());
  }
};

// Saturating from kSaturatingFrom per mille of deep queue on, no longer below kSaturatingUntil: the
// gap keeps a client near the line from switching its GPU between turns and time-slicing at every
// report.
inline constexpr std::uint16_t kSaturatingFrom = 350;
inline constexpr std::uint16_t kSaturatingUntil = 150;
inline bool classify_pace(bool was_saturating, std::uint16_t deep_queue_permille) {
  return deep_queue_permille >= (was_saturating ? kSaturatingUntil : kSaturatingFrom);
}

// The movable parts of the clients' working sets; fit checks add every client's pinned bytes
// (GpuPolicy::fits).
inline std::uint64_t sum_working_sets(const std::vector<const ClientRecord*>& clients) {
  std::uint64_t sum = 0;
  for (const ClientRecord* c : clients) sum += c->movable_bytes();
  return sum;
}

inline void remove_client(std::vector<const ClientRecord*>& clients, const ClientRecord* c) {
  clients.erase(std::remove(clients.begin(), clients.end(), c), clients.end());
}

}  // namespace nvshare::policy
