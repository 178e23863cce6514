// What the per-GPU policy engine consumes (events) and produces (actions).
//
// The engine is a sans-I/O state machine: the daemon turns socket traffic and timer expiries into
// events, feeds them with the current time, and carries out the actions it gets back (frames to
// send, counters to bump). Tests and simulations do the same in virtual time.
#pragma once

#include <cstdint>
#include <optional>
#include <variant>

#include "common/mono_time.h"
#include "common/protocol.h"

namespace nvshare::policy {

using ClientId = std::uint64_t;
using GrantEpoch = std::uint64_t;
using protocol::Limits;
using protocol::RevokeReason;
using protocol::WaitReason;

// ---- events -------------------------------------------------------------------------------------

// A client opened a session on this GPU. `limits` are the limits in force for it (from the control
// API, or its own declaration when the daemon trusts clients). The GPU's memory is not the
// client's to say: it comes from the device (PolicyConfig::device_bytes).
struct Registered {
  ClientId client = 0;
  Limits limits;
  // It can be asked to move memory it keeps on the device while it holds no grant (SendEvict).
  bool evictable = true;
  // It moves only as many bytes as a revoke or an eviction asks for (protocol version 10), keeping
  // the rest on the device; otherwise every swap-out moves all of its memory.
  bool partial_swap = false;
  // It can be given room to bring its memory back while it waits (SendRoom, protocol version 12).
  bool takes_room = false;
};

// The client wants to run. A client that already runs, waits or is being revoked is unaffected (a
// revoked client goes back to the queue by itself when it releases).
struct Requested {
  ClientId client = 0;
};

// The client gave its grant back, after a revoke or by itself (idle release). A release whose epoch
// is not the client's current grant is ignored. `held` and `drained` are what the client measured,
// for status; billing uses the engine's own times (grant to release).
struct Released {
  ClientId client = 0;
  GrantEpoch epoch = 0;
  Duration held{0};
  Duration drained{0};
};

// Memory footprint on this GPU and the swap bandwidth the client last measured (0: none yet). What
// the client says of itself: the engine bounds both before any deadline depends on them. With them,
// when the client measured it, its pace: of the time it held its grant over its last pace window,
// the share (per mille) it had more GPU work queued than its drain bound (it was waiting to queue
// more). Whatever it says, it can only choose between running beside others and taking turns with
// others that say the same: neither stretches a bound that protects anyone.
struct UsageReported {
  ClientId client = 0;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t resident_bytes = 0;
  std::uint64_t swap_bytes_per_s = 0;
  std::optional<std::uint16_t> deep_queue_permille;
  // Of allocated_bytes, what cannot be swapped out (memory mapped by another process); the engine
  // clamps it to allocated_bytes.
  std::uint64_t pinned_bytes = 0;
  // The evictions it has answered so far (protocol version 10; read for partial_swap clients).
  std::uint32_t evictions_answered = 0;
};

// New limits from the control API. The engine forwards them to the client at once.
struct LimitsChanged {
  ClientId client = 0;
  Limits limits;
};

// The session ended: everything the client held is freed now.
struct Disconnected {
  ClientId client = 0;
};

// The processes of one job on other GPUs (gang.h) pause for their caps and run again no earlier
// than `at`: a capped client pauses with them until then (running, it is revoked for quota; waiting
// for its bucket, it also waits for `at`), so that the job's processes run at the same time.
// nullopt, or a time already past: no floor. Only capped clients are affected; the floor goes at
// the client's next grant. `peers_paused`: every member on another GPU has released and waits for
// its cap; while it is so, this client's drain after a quota revoke is not billed (its queued work
// waits for theirs: a collective cannot end until every rank has submitted its part).
struct ResumeNotBefore {
  ClientId client = 0;
  std::optional<MonoTime> at;
  bool peers_paused = false;
};

// The time returned by next_deadline() has come (the engine re-evaluates everything due by `now`).
struct DeadlineReached {};

using Event = std::variant<Registered, Requested, Released, UsageReported, LimitsChanged,
                           Disconnected, ResumeNotBefore, DeadlineReached>;

// ---- actions ------------------------------------------------------------------------------------

struct SendGrant {
  ClientId client = 0;
  GrantEpoch epoch = 0;
};

struct SendRevoke {
  ClientId client = 0;
  GrantEpoch epoch = 0;
  RevokeReason reason = RevokeReason::kTurn;
  bool swap_out = false;  // the next runner does not fit beside this one: move memory to host first
  std::uint64_t swap_bytes = 0;  // with swap_out: at least this many (partial_swap clients); 0: all
};

// Someone waits for this holder and would fit beside its memory (exclusive mode): the holder may
// give the grant back as soon as it is idle instead of holding it to the end of its quantum. Sent
// once per grant; the holder answers with an ordinary release (or none, if it stays busy).
struct SendYield {
  ClientId client = 0;
  GrantEpoch epoch = 0;
};

// The head of the queue cannot run beside this runner's memory and waits for its turn to end: that
// revoke will ask for a swap-out. Sent once per grant, as soon as such a turn is planned, so the
// client readies the swap (host copies) while it still runs. Advice only: the revoke is unchanged.
struct SendSwapNotice {
  ClientId client = 0;
  GrantEpoch epoch = 0;
  std::uint64_t bytes = 0;  // the swap-out the turn plans (SwapOrder::bytes); 0: all
};

// A client that holds no grant keeps memory on the device (its parked bytes) that the head of the
// queue needs: it is asked to move it to the host. It answers with a usage report that shows its
// memory swapped out; until then, and at most for the revoke grace plus its swap allowance, that
// memory still counts.
struct SendEvict {
  ClientId client = 0;
  std::uint64_t bytes = 0;  // at least this many (partial_swap clients); 0: all
};

// The head of the queue waits for memory that is leaving the device (a revoked holder swapping
// out, or an eviction), and part of the room it needs is free already: up to `bytes` of its
// movable memory may be on the device now (the whole room, not an increment). It brings back what
// fits while it waits, so that its grant has less to swap in.
struct SendRoom {
  ClientId client = 0;
  std::uint64_t bytes = 0;
};

// A holder of a higher class holds up a lower class that is given none of its idle moments (held
// back by the interference budget): it is told so once per grant, and releases at its next pause
// instead of after its idle release, so the lower class runs in the pauses between its bursts.
struct SendContended {
  ClientId client = 0;
  GrantEpoch epoch = 0;
};

struct SendWait {
  ClientId client = 0;
  WaitReason reason = WaitReason::kTurn;
};

struct SendLimits {
  ClientId client = 0;
  Limits limits;
};

// A holder ignored a revoke for longer than the grace period and no longer blocks others.
struct HolderUnresponsive {
  ClientId client = 0;
  GrantEpoch epoch = 0;
};

using Action = std::variant<SendGrant, SendRevoke, SendYield, SendSwapNotice, SendEvict, SendRoom,
                            SendContended, SendWait, SendLimits, HolderUnresponsive>;

}  // namespace nvshare::policy
