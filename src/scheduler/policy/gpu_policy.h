// GpuPolicy: the scheduling policy of one GPU, as a deterministic state machine.
//
// Contract
//  - Pure: no I/O, no threads, no clock reads. `now` is an argument; a `now` earlier than one
//    already seen is treated as that earlier time.
//  - handle(event, now) applies one event and returns the actions to carry out, in order.
//  - next_deadline() is the earliest time at which something is due (a quantum ends, a quota
//    budget runs out or refills, a revoke's grace period expires); the caller feeds
//    DeadlineReached{} at or after it. nullopt: nothing is due until the next event. After any
//    handle() it is later than that call's `now`.
//  - Events for unknown clients are ignored (a client can disconnect while its messages are in
//    flight).
//
// Semantics (docs/scheduling.md has the definitions and the reasoning):
//  - Co-running (mode auto): requesters are granted in FIFO order while the working sets of all
//    blocking holders fit in usable = capacity x (1 - reserve). A client's working set is its
//    allocated bytes. A client that does not fit waits (reason memory); later arrivals do not
//    overtake it, except that an idle GPU always grants the head of the queue, so a client larger
//    than the GPU still runs (alone). Pinned memory (a client's bytes another process maps
//    through CUDA IPC, reported with its usage) never moves: every fit check counts the pinned
//    bytes of every client on the GPU, whatever its state, beside the movable working sets of
//    the holders; a client that cannot fit beside the others' pinned bytes even on an idle GPU
//    waits (reason memory) without holding up the clients behind it. Capacity is the configured
//    (virtual) one, else the device's memory (config.device_bytes); while it is unknown nobody runs
//    beside anybody. Runners whose working sets grow past usable are revoked (reason memory, swap
//    out), newest grant first, until the rest fit.
//  - Saturating clients take turns (mode auto): a client whose pace report says it keeps a deep
//    queue (classify_pace) does not run beside another such client; it waits for its turn (reason
//    turn), the holder's turn ends by the fair clocks as below, and two that run together when
//    their reports arrive are separated at once (the one furthest behind stays). Clients that are
//    not saturating (or have not reported) run beside anyone they fit beside, and may pass a head
//    that waits only for such a turn when the head still fits beside them. Time-slicing two
//    saturating contexts costs both throughput that taking turns does not; a client that waits
//    on its results often gains from time-slicing and never hits the bound.
//  - One runner at a time in exclusive mode, and in any mode while a capped client wants the GPU
//    (active, not throttled: caps are enforced by time-division). While the head would fit beside
//    the holder's memory, the holder is asked to yield (hand over once idle) as soon as its fair
//    clock (billed seconds over its entitlement, raised on becoming active to the least clock among
//    active clients, less the slack) is within the slack (kYieldSlack of the turn slice) of the
//    head's: a holder that has had clearly less than the client that would run next keeps its
//    turn, so a job with short idle gaps is not cut short at every gap by one without them. Such a
//    turn moves no memory, so it ends by the fair clocks (revoke, reason turn, nothing to swap)
//    once the holder's clock is kTurnLead of a slice ahead of the head's, at least kShortestTurn of
//    a slice after it began running: turns of about slice x weight instead of a quantum.
//  - Turn-taking: while the head of the queue waits behind runners it cannot run beside, a
//    runner's turn ends one quantum after its grant (fixed, or auto = clamp(k x (swap time of the
//    runner + swap time of the head), min, max)); runners whose turns have ended are
//    revoked (reason turn), earliest turn end first, once enough of them have ended for the head
//    to fit. swap_out is set for a revoked runner when the head cannot fit beside it and what
//    stays on the device.
//  - Room: while memory leaves the device for the head (a revoked holder swapping out, reporting
//    as it goes, or an eviction), a head that takes room is told how much of its memory may be
//    on the device already (send_room), and brings that much back while it waits: its swap-in
//    overlaps the leaver's swap-out instead of following it. What it brings back is parked memory
//    (counted in every fit check, spared by the evictions made for it); the room never counts
//    anything twice, so the device holds no more than usable.
//  - A revoked client that releases goes back to the tail of the queue by itself (it was
//    preempted, not idle); a release nobody asked for (idle release) makes the client idle until
//    it requests again.
//  - Compute caps: core percent < 100 caps a client's share of GPU time with a QuotaLedger. Hold
//    time is billed, 1/n of wall time while n clients hold grants (one, while a cap binds: see one
//    runner at a time above). A cap is a ceiling and an entitlement: effective caps are the caps
//    scaled down proportionally when the caps of the active capped clients on this GPU sum over
//    100% (over kCappedRoomBesideUncapped while an uncapped client is active), and while a capped
//    client is active each active uncapped client is held, by a bucket of its own, to an equal part
//    of what the capped ones leave. A capped client whose budget is spent is revoked (reason
//    quota); a capped client that enters the queue with its bucket below the entry level waits
//    (reason quota), blocking nobody, until the bucket is back at the resume level (one re-queued
//    after a revoke that left its memory on the device waits only when its bucket is spent; a
//    bucket cycles by cap_cycle while its client's memory is on the device, else by the
//    window: QuotaLedger::set_cycle). Time held after
//    the revoke (the drain) is billed too, so overshoot carries forward. An uncapped client is
//    charged only while it is held to an entitlement.
//  - Priority classes (limits.priority: high, normal, low): the queue is ordered by class, then
//    arrival; a head of a higher class has every lower-class runner revoked at once (reason
//    priority), and is granted beside those that leave their memory in place (they drain beside it:
//    their gates are closed); otherwise classes never run side by side; a higher-class holder
//    yields to a waiting lower class at its first idle moment and never loses a turn or a swap to
//    it.
//  - Gangs: a capped client given a resume floor later than now (ResumeNotBefore: the processes
//    of its job on other GPUs pause for their caps, gang.h) pauses too: running, it is revoked
//    (reason quota); waiting for its bucket, it resumes no earlier than the floor. The floor goes
//    at its grant. While it waits only for the floor, its bucket does not rise above its depth.
//    While no gang member on other GPUs runs (peers_paused), a drain after a quota revoke is not
//    billed as it passes; at its release it is billed after all unless a member resumed before it
//    ended (then it waited for them: a collective needs every rank's part).
//  - Grant epochs grow with every grant on this GPU; stale releases are ignored.
//  - Disconnect frees the client's grant and memory at once. A holder that has not released
//    within the grace period after a revoke (plus, when swap_out was asked, its swap allowance:
//    the estimated swap-out time, at most swap_allowance_max) is reported (HolderUnresponsive) and
//    no longer blocks others; it stays billed while it holds the grant, and a later release makes
//    it a normal client again, with a strike: no swap allowance and the shortest auto quantum.
//    A holder revoked while it may still be swapping in (granted while its memory was on the
//    host, within its estimated swap-in, at most swap_allowance_max) has its grace counted from
//    the end of that estimate: it cannot drain before its memory is back.
//  - Nothing a client reports stretches a bound that protects others: a swap time uses its bytes
//    clamped to the device's memory at its bandwidth floored (quantum.h), so a holder that ignores
//    revokes keeps a waiting client out for at most hog_bound(config) (config.h).
#pragma once

#include <array>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/policy/client_record.h"
#include "scheduler/policy/config.h"
#include "scheduler/policy/events.h"
#include "scheduler/policy/gang.h"
#include "scheduler/policy/quantum.h"

namespace nvshare::policy {

std::string_view to_string(ClientState state);

// What status and explain show about one client.
struct ClientView {
  ClientId client = 0;
  ClientState state = ClientState::kIdle;
  std::optional<WaitReason> waiting_for;
  GrantEpoch epoch = 0;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t resident_bytes = 0;
  std::uint64_t pinned_bytes = 0;  // stays on the device when it swaps out (CUDA IPC)
  // Kept on the device without a grant (idle or waiting, memory not swapped out): counted in fit
  // checks, evicted when the head needs the room.
  std::uint64_t parked_bytes = 0;
  Limits limits;
  double effective_cap_percent = 100;  // after proportional scaling
  double share_percent = 0;            // GPU time billed over the last quota window, % of wall time
  Duration held_total{0};              // hold time billed so far (1/n while co-running)
  Duration waited_total{0};            // time spent waiting, all reasons
  MonoTime state_since{};
  // Capped clients: the bucket level (negative while overshoot is repaid).
  std::optional<Duration> budget_left;
  // Running while the head of the queue cannot run beside it: when its turn ends.
  std::optional<MonoTime> turn_ends;
  // Revoking: when it stops blocking others if it has not released by then.
  std::optional<MonoTime> unresponsive_at;
  // Revoking or unresponsive after a revoke that asked for a swap-out: it may be copying its memory
  // to the host (an unresponsive one too, when the copy is slower than its grace and allowance).
  bool swapping_out = false;
  // Its pace as last reported (per mille of its held time with a deep queue), and whether that
  // makes it saturating (mode auto: it takes turns with other saturating clients).
  std::optional<std::uint16_t> deep_queue_permille;
  bool saturating = false;
  ClientCounters counters;  // the wait in progress included
};

struct GpuView {
  std::uint64_t capacity_bytes = 0;  // effective capacity (virtual or reported); 0: unknown
  std::uint64_t usable_bytes = 0;    // capacity x (1 - reserve)
  std::uint64_t running_bytes = 0;   // working sets of the blocking holders (running, revoking)
  // The parked bytes the fit checks count, by class (index: rank), as the policy keeps them.
  std::array<std::uint64_t, ClientRecord::kRanks> parked_by_rank{};
  GrantEpoch last_epoch = 0;
  std::uint64_t unresponsive_holders = 0;  // count since start
  Duration quantum{0};                     // the quantum that applies now
  std::uint64_t swap_bytes_per_s = 0;      // bandwidth the swap estimate uses
  bool swap_measured = false;              // false: the configured default
  std::vector<ClientId> queue;             // waiting clients, FIFO order
  std::vector<ClientView> clients;         // in registration order
};

// One runner at a time, when a hand-off to the head moves no memory, turns follow fair clocks
// (docs/scheduling.md, "Turns by fair clocks"), in fractions of the turn slice: a holder's turn
// ends once its clock is kTurnLead ahead of the head's, and not before kShortestTurn after it began
// (a hand-off costs a drain and a round trip); from kYieldSlack behind the head's it is asked to
// yield (hand over at its next idle moment). A client that becomes active starts no further than
// the slack below the least clock among active clients. The slack is less than the lead, so a
// client that idles between steps and one that never idles advance their clocks alike.
inline constexpr double kTurnLead = 0.5;
inline constexpr double kYieldSlack = 0.25;
inline constexpr double kShortestTurn = 0.1;

// A lower class's kernels that still run when a higher class takes the GPU delay the higher class's
// step by up to their length (the GPU time-slices the two contexts). A delay within this fraction
// of the higher class's step (step_estimate) is free; a longer one is charged against the
// interference budget (PolicyConfig::priority_interference), as at least one cycle of that class
// (a step and its median gap): the budget bounds the share of its steps that are slowed. The
// moving average of steps gives each new step this weight.
inline constexpr double kPriorityFreeDelay = 0.10;
inline constexpr double kStepEstimateWeight = 0.25;
// A lower-class grant counts for the floor when its client drained at least this long after its
// revoke (it had work in flight) or released by itself.
inline constexpr Duration kFloorGrantUsed = std::chrono::milliseconds(1);

// Room (SendRoom) is given in steps of at least this much, unless it covers all the head's memory:
// each one is a frame and a swap-in of its own in the client.
inline constexpr std::uint64_t kRoomStep = 64ull << 20;

// What the caps of capped clients may take together while an uncapped client is active: the rest
// is the uncapped clients' floor, so that caps summing to 100% or more never starve them.
inline constexpr double kCappedRoomBesideUncapped = 0.9;

class GpuPolicy {
 public:
  explicit GpuPolicy(PolicyConfig config = {});

  std::vector<Action> handle(const Event& event, MonoTime now);
  std::optional<MonoTime> next_deadline() const { return next_deadline_; }
  // Whether the client is being revoked (a release from it answers the revoke).
  bool revoking(ClientId client) const {
    const ClientRecord* c = find(client);
    return c != nullptr &&
           (c->state == ClientState::kRevoking || c->state == ClientState::kUnresponsive);
  }

  // What gang.h couples across GPUs. A capped client pausing for its cap (released, waiting for
  // its bucket): when the bucket is back at the resume level by its own refill (now when it already
  // is). nullopt for any other client: one still draining after its quota revoke delays nobody
  // (its drain may wait for the very members it would delay).
  std::optional<MonoTime> gang_pause_ends(ClientId client) const;
  // Its pause end, whether it drains for quota, its resume floor (ResumeNotBefore) and what it was
  // told about its peers; nullopt for an unknown client.
  std::optional<GangState> gang_state(ClientId client) const;

  // Replaces the configuration; takes effect for the next decisions (may grant or revoke at once).
  // A configuration that fails validate() is ignored.
  std::vector<Action> reconfigure(const PolicyConfig& config, MonoTime now);
  const PolicyConfig& config() const { return config_; }

  GpuView view(MonoTime now) const;
  // One sentence with the numbers: why the client runs or waits. Empty for an unknown client.
  std::string explain(ClientId client, MonoTime now) const;

 private:
  // When the head's turn comes: the earliest turn end at which enough runners have ended their
  // turns for the head to fit, and the runner whose turn end that is.
  struct TurnPlan {
    MonoTime at;
    ClientId runner;
  };
  // What a revoked holder moves to the host: nothing, all of its memory, or (a client that takes
  // byte targets) at least `bytes` of it, the rest staying parked on the device.
  struct SwapOrder {
    bool swap_out = false;
    std::uint64_t bytes = 0;  // with swap_out: 0, all
  };
  // A runner the head's turn plan sends away, and what it must move to the host.
  struct PlannedLeaver {
    const ClientRecord* runner;
    SwapOrder order;
  };

  ClientRecord* find(ClientId client);
  const ClientRecord* find(ClientId client) const;

  // Event handlers; each may append actions.
  void on_registered(const Registered& e, MonoTime now, std::vector<Action>& out);
  void on_requested(const Requested& e, MonoTime now);
  void on_released(const Released& e, MonoTime now);
  void on_usage(const UsageReported& e);
  void on_limits(const LimitsChanged& e, std::vector<Action>& out);
  void on_disconnected(const Disconnected& e);

  // Books billing and quota up to `now` at the rates in force since the last call.
  void settle(MonoTime now);
  // Re-evaluates everything after an event: caps, grace, quota, memory, grants, turns, wait
  // reasons.
  void schedule(MonoTime now, std::vector<Action>& out);
  void update_caps();
  // The on/off cycle of a client's bucket: a slice while its memory is on the device, else the
  // quota window.
  Duration quota_cycle(const ClientRecord& c) const;
  void expire_grace(MonoTime now, std::vector<Action>& out);
  // An eviction left unanswered past its deadline: the client's parked memory stops counting
  // (until its next grant), with a strike.
  void expire_evictions(MonoTime now);
  // The head cannot fit, even on an otherwise idle GPU, beside the memory other clients keep
  // parked: enough of them are asked to move it out (the lowest class first, never a class above
  // the head's; within a class idle clients, then waiters from the tail of the queue, the largest
  // first), counting those already asked.
  void evict_for_head(MonoTime now, std::vector<Action>& out);
  // The holders' working sets grew (allocations after their grants) past what fits beside the
  // memory others keep parked: parked memory is moved out for them the same way (the classes of
  // the holders and below, never the head's), so the device holds no more than usable.
  void evict_for_runners(MonoTime now, std::vector<Action>& out);
  // What a holder has on the device: its movable bytes, or, revoked with a swap-out, what its
  // reports say is left of them (it reports as it goes).
  static std::uint64_t on_device(const ClientRecord& holder);
  // Memory is leaving the device: a revoked holder swaps out, or an eviction is pending.
  bool memory_leaving() const;
  // While memory leaves the device, the head (a client that takes room, waiting with memory on the
  // host) is told how much of its memory may be on the device already: usable less everything
  // else there (pinned, parked, the holders' as on_device() says). Sent as the room grows by
  // kRoomStep, or covers all of its memory; never less than it was told in this wait.
  void send_room(std::vector<Action>& out);
  // Asks clients keeping parked memory, of class max_rank or below, never `spared`, to move out
  // at least `excess` bytes (those already asked count), in the order above.
  void evict_parked(std::uint64_t excess, int max_rank, ClientId spared, MonoTime now,
                    std::vector<Action>& out);
  void revoke_spent_quota(MonoTime now, std::vector<Action>& out);
  void revoke_overflow(MonoTime now, std::vector<Action>& out);
  // Mode auto: at most one saturating client runs; others that run beside it are revoked.
  void revoke_saturating_pairs(MonoTime now, std::vector<Action>& out);
  // A higher class waits at the head: every runner of a lower class is revoked (reason priority).
  void revoke_for_priority(MonoTime now, std::vector<Action>& out);
  // A waiting client of a lower class than a present one (waiting, holding, or between its steps)
  // is held back while the interference budget is spent; a floor after holding back began, or
  // after the last grant the floor let through was used, the first of them in the queue runs.
  void hold_back_lower_classes(MonoTime now);
  // A released holder: a step of a higher class that ended (its estimate), or a lower class that
  // drained beside a higher one (its delay, charged to the budget unless free).
  void observe_step(ClientRecord& c, MonoTime now);
  static Duration cycle_of(const ClientRecord& c);
  void charge_interference(const ClientRecord& c, MonoTime now);
  void restart_floor(const ClientRecord& c, MonoTime now);
  // The budget's most (a burst): priority_floor's worth of its rate.
  double interference_burst_s() const;
  // When the spent budget is back at 0 (none while it refills at no rate), rounded up.
  std::optional<MonoTime> interference_repaid_at() const;
  void grant_in_order(MonoTime now, std::vector<Action>& out);
  void revoke_ended_turns(MonoTime now, std::vector<Action>& out);
  // The runners that leave for the head's turn (earliest turn end first, up to plan.runner), each
  // swapping out unless it still fits beside the head and what else stays resident.
  std::vector<PlannedLeaver> planned_leavers(const ClientRecord& head, const TurnPlan& plan) const;
  // Each holder of a class above a held-back one is told so, once per grant.
  void send_contended(std::vector<Action>& out);
  // Each runner that the head's planned turn will revoke with a swap-out is told, once per grant.
  void send_swap_notices(std::vector<Action>& out);
  // One runner at a time, the head fitting beside the holders: revokes (reason turn, nothing to
  // swap) each runner whose fair turn has ended.
  void revoke_fair_turns(MonoTime now, std::vector<Action>& out);
  void send_wait_reasons(std::vector<Action>& out);
  void send_yields(std::vector<Action>& out);
  // The head, when it waits for turns alone (it fits beside the holders' memory but takes turns
  // with some of them): those holders' turns end by the fair clocks and yields may be due.
  const ClientRecord* yield_target() const;
  // A running holder not yet asked to yield for its current grant.
  static bool yield_unsent(const ClientRecord& c);
  // When a running holder is due to yield to `next`: once its fair clock is within the slack of
  // next's.
  MonoTime yield_time(const ClientRecord& holder, const ClientRecord& next) const;
  // When a running holder's fair turn ends, `next` waiting: once its fair clock is the lead ahead
  // of next's, and no earlier than the shortest turn after it began running.
  MonoTime fair_turn_end(const ClientRecord& holder, const ClientRecord& next) const;
  // When a running holder's fair clock will have gained `seconds` at its present rate (now when
  // it needs none; MonoTime::max() when it gains nothing).
  MonoTime when_clock_gains(const ClientRecord& holder, double seconds) const;
  // What a client's fair clock is divided by: its entitlement (effective_cap), at least 1%.
  double fair_weight(const ClientRecord& c) const;
  // Raises the floor to the least fair clock among active clients (it never goes down).
  void update_fair_floor();
  // A client that becomes active starts no lower than the floor less the slack: idle time earns
  // no precedence.
  void catch_up_fair_clock(ClientRecord& c);
  // kYieldSlack and kTurnLead of the turn slice, in seconds of fair clock.
  double fair_slack_s() const;
  double fair_lead_s() const;
  void update_rates();
  std::optional<MonoTime> compute_deadline() const;

  // Queues a client that wants the GPU; throttled by its bucket below the entry level, or, when it
  // was preempted with its memory left on the device, only when its bucket is spent.
  void enqueue(ClientRecord& c, MonoTime now, bool memory_in_place = false);
  void place_in_queue(const ClientRecord& c);
  void grant(ClientRecord& c, MonoTime now, std::vector<Action>& out);
  void revoke(ClientRecord& c, RevokeReason reason, SwapOrder order, MonoTime now,
              std::vector<Action>& out);
  // What `leaver` must move for `resident` bytes (the head's, and what else stays on the device)
  // to fit beside what it keeps: nothing when all of it fits, else all of it, or, for a client that
  // takes byte targets, the part that does not fit. Adds what it keeps to `resident`.
  SwapOrder order_for(const ClientRecord& leaver, std::uint64_t& resident) const;
  void set_state(ClientRecord& c, ClientState state, MonoTime now);
  static void book_wait(ClientRecord& c, MonoTime now);

  // Memory and turn arithmetic.
  // What stays on the device beside the head when `leaving` leave: the runners that stay (mode
  // auto) and revoked holders that keep their memory there.
  template <typename Leaver>
  std::uint64_t resident_besides(const std::vector<Leaver*>& leaving) const;
  std::uint64_t capacity() const;
  std::uint64_t usable() const;
  // Whether `movable` bytes (sums of movable_bytes()) fit beside every client's pinned bytes and
  // the memory clients without a grant keep parked on the device.
  bool fits(std::uint64_t movable) const;
  // The same, the parked memory aside (runners whose working sets grew: parked memory is evicted
  // for a head, never a reason to revoke a runner).
  bool fits_ignoring_parked(std::uint64_t movable) const;
  std::uint64_t pinned_total() const { return pinned_total_; }
  // Σ parked_bytes() over the clients of this GPU, and over those of a higher class than `c`.
  std::uint64_t parked_total() const;
  std::uint64_t parked_above(const ClientRecord& c) const;
  // Counts `c`'s parked bytes, at its class, in place of what was counted for it before: called
  // after every change to what parked_bytes() and rank() depend on (its state, memory, limits,
  // eviction), so that the sums above stay O(1) on every decision's path.
  void recount_parked(ClientRecord& c);
  // Whether `c` could run at all beside the memory that no eviction it may ask for moves: pinned
  // memory, and what clients of a higher class keep parked. It fits beside it, or nobody but
  // itself keeps any (then, as ever, an idle GPU takes it however large it is). Those that cannot
  // wait without holding up the queue.
  bool fits_beside_kept(const ClientRecord& c) const;
  // Whether `c` could run on an otherwise idle GPU now: beside the pinned memory (as above) and
  // beside what other clients keep parked, or alone when nobody else parks any.
  bool fits_on_idle_gpu(const ClientRecord& c) const;
  // Whether `head` may run now beside the holders that stay: an idle GPU takes anyone; otherwise
  // it must take turns with none of them and fit beside their memory.
  bool can_run_beside(const std::vector<const ClientRecord*>& staying,
                      const ClientRecord& head) const;
  // Whether `next` waits for `holder`'s turn to end rather than running beside it: one runner at a
  // time, or (mode auto) both are saturating.
  bool takes_turns_with(const ClientRecord& holder, const ClientRecord& next) const;
  // A holder of a lower class than `head`, revoked for priority with its memory left in place: it
  // drains beside the head instead of before it.
  static bool drains_for(const ClientRecord& holder, const ClientRecord& head);
  // `head` fits beside the holders' memory but takes turns with some of them: a hand-off to it
  // moves nothing (yields and fair turns apply). Without a cap binding, that is a turn among
  // saturating clients, and clients behind it that run beside the holders may pass it.
  bool waits_only_for_turn(const std::vector<const ClientRecord*>& holders,
                           const ClientRecord& head) const;
  std::vector<const ClientRecord*> blocking_holders() const;
  const ClientRecord* head() const;  // first waiter not throttled (blocked, after schedule())
  std::optional<WaitReason> reason_for(const ClientRecord& c, const ClientRecord* head) const;
  Duration quantum_between(const ClientRecord& runner, const ClientRecord& head) const;
  // A client's swap time, from its bounded figures (quantum.h).
  Duration swap_time(const ClientRecord& c) const;
  // How long a grant's swap-in may take: the swap time of a client whose memory is on the host,
  // at most swap_allowance_max, none after a strike.
  Duration swap_in_estimate(const ClientRecord& c) const;
  // How long past the grace a revoked holder may take: its swap time when it must swap out (all of
  // it, whatever the byte target: whole allocations move), at most swap_allowance_max, none after
  // a strike.
  Duration swap_allowance(const ClientRecord& c, SwapOrder order) const;
  std::vector<const ClientRecord*> runners_by_turn_end(const ClientRecord& head) const;
  std::optional<TurnPlan> turn_plan(const ClientRecord& head) const;
  // Fraction of the GPU's time: a capped client's scaled cap, an uncapped one's entitlement (1
  // while no capped client is active).
  double effective_cap(const ClientRecord& c) const;
  bool capped_client_wants_gpu() const;
  void release_throttles();
  // Revoked and throttled by its bucket now: a capped client, or an uncapped one whose
  // entitlement binds.
  bool binds(const ClientRecord& c) const;
  // A capped client whose resume floor lies ahead: it pauses with its gang.
  bool held_by_floor(const ClientRecord& c) const;
  // A capped client revoked for quota that has not released yet.
  static bool draining_for_quota(const ClientRecord& c);
  // Revoked for quota while no member of its gang on other GPUs runs: its drain is not billed as
  // it passes.
  bool drain_waits_for_gang(const ClientRecord& c) const;
  // ResumeNotBefore: the floor and the peers' state, and the unbilled drain that follows from it.
  void on_gang(ClientRecord& c, const ResumeNotBefore& e, MonoTime now);
  // At a release after a revoke: the unbilled drain is billed now unless a member resumed before
  // it ended (it waited for them).
  void settle_gang_drain(ClientRecord& c, MonoTime now);
  // One runner at a time: exclusive mode, or any mode while entitlements bind (a capped client
  // wants the GPU). A GPU that time-slices gives co-running processes shares nobody controls, so
  // a cap is enforced by time-division, where the time held is the time had.
  bool one_at_a_time() const;

  // explain() pieces (explain.cc).
  std::string explain_waiting(const ClientRecord& c, MonoTime now) const;
  std::string explain_holding(const ClientRecord& c, MonoTime now) const;
  std::string describe_quota(const ClientRecord& c, MonoTime now) const;
  std::string describe_yield(const ClientRecord& c, MonoTime now) const;
  std::string describe_pace(const ClientRecord& c) const;
  // "; clients 2, 3 keep 8Gi on the GPU without a grant[, and ... asked to move it to the host]",
  // or "" when no client but `c` parks memory.
  std::string describe_parked(const ClientRecord& c) const;
  // "; given room for 9Gi of its memory while it waits (8Gi of it back on the GPU)", or "".
  static std::string describe_room(const ClientRecord& c);

  PolicyConfig config_;
  SwapEstimate swap_;
  std::vector<ClientRecord> clients_;  // registration order
  std::deque<ClientId> queue_;         // waiting clients, FIFO
  // Σ pinned_bytes over clients_, kept where a client's pinned bytes change (its usage, its
  // disconnect): fits() is on every decision's path.
  std::uint64_t pinned_total_ = 0;
  // Σ parked_bytes() by rank, kept by recount_parked().
  std::array<std::uint64_t, ClientRecord::kRanks> parked_by_rank_{};
  GrantEpoch last_epoch_ = 0;
  std::uint64_t unresponsive_count_ = 0;
  double cap_scale_ = 1;       // applied to the caps of active capped clients
  double uncapped_share_ = 1;  // each active uncapped client's entitlement
  // An uncapped client's entitlement binds only while a capped client wants the GPU (active and
  // not throttled): in the gaps capped clients cannot use, uncapped ones run anyway. They are
  // billed all the time, so what they take in the gaps they repay, by waiting, when a capped
  // client wants the GPU again; their bucket (and its debt) goes when no capped client is active.
  bool entitlement_binds_ = false;
  // The least fair clock among active clients, as last seen: where a client that becomes active
  // starts at the earliest.
  double fair_floor_s_ = 0;
  // The interference budget (seconds; below 0 while a charge is repaid): lower classes run in a
  // higher class's idle moments while it is not negative.
  double interference_s_ = 0;
  // Since when lower classes are held back without a used floor grant (the floor counts from here),
  // and the class they are held back for.
  std::optional<MonoTime> held_since_;
  int hold_top_ = -1;
  MonoTime now_{};
  std::optional<MonoTime> next_deadline_;
};

}  // namespace nvshare::policy
