// Gangs: the processes of one job on several GPUs, whose pauses under their caps are aligned.
//
// Data-parallel training runs one process per GPU, and every step ends in a collective that waits
// for all of them. Each GPU's policy runs its clients' caps on its own; alone on their GPUs, two
// ranks capped at 50% run half of every cycle, but nothing puts their halves at the same time.
// Once they fall out of phase, each runs while the other pauses, its collective spins on the GPU
// waiting for the peer (billed, no progress), and a revoke's drain waits for the peer's next turn:
// measured on two H200s, 50% caps on two DDP ranks gave 3.8% and 13.2% of their native speed.
//
// The rule: the capped members of a gang pause together and resume together. While a member on
// another GPU pauses for its cap (released after its quota revoke, waiting for its bucket), a
// member is given a resume floor (ResumeNotBefore) at the latest time any of them may run again: a
// running member pauses too (revoked for quota, nothing to swap), a paused one waits for the floor
// as well as for its own bucket. The gang thus runs as long as its member with the least budget
// and pauses until its member with the least budget has refilled: ranks with equal caps progress
// at their cap. Only members with the same cap form a gang (a pod's processes get the pod's).
//
// A pause at the same instant is not a pause at the same collective: ranks run up to a step apart,
// so the rank ahead has queued a collective that cannot end until its peers submit their part,
// which they do only once they run again. So a member still draining after its quota revoke delays
// nobody (were it to, its peers would wait for its drain and its drain for them), and while no
// member on the other GPUs runs (peers_paused) its drain is not billed as it passes: it ends a few
// milliseconds after they resume, with its bucket as full as theirs, and it runs with them. A drain
// that ends before any of them resumed waited for nobody, and is billed at its release.
// Measured on two H200s before this rule: 50% ranks at 2.1-2.7% of native, one drain 5 s long.
//
// Bounds: only capped members are paused or delayed, by at most the other members' pauses (each at
// most (1 - cap) x its cycle), and a member that is not pausing (running, draining, waiting for
// memory or a turn, idle, gone, or unresponsive to its revoke) delays nobody; a gang is what the
// kernel says (the same pod, or off Kubernetes the same uid and cgroup), so a process can delay
// only its own job's. What a member waits beyond its own refill does not raise its bucket above its
// depth. Unbilled drain: at most the other members' pause, once per pause, and only a drain that
// was still running when one of them resumed.
//
// Contract: pure; members of one GPU do not constrain each other (they share that GPU's policy).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/mono_time.h"
#include "scheduler/policy/events.h"

namespace nvshare::policy {

// Floors this close to `now` are left out: a member due to resume within it does not pause others.
inline constexpr Duration kGangSlack = std::chrono::milliseconds(1);

struct GangMember {
  std::string gpu;
  ClientId client = 0;
  // Pausing for its cap (released, waiting for its bucket or its floor): when it may run again at
  // the earliest (GpuPolicy::gang_pause_ends).
  std::optional<MonoTime> pause_ends;
  // Revoked for its cap and still draining.
  bool draining = false;
};

// What one GPU's policy says of a member, and what it was last told (ResumeNotBefore).
struct GangState {
  std::optional<MonoTime> pause_ends;
  bool draining = false;
  std::optional<MonoTime> floor;
  bool peers_paused = false;
};

// For each member, in order: its resume floor: the latest pause end among the members on other
// GPUs, when that is later than now + kGangSlack; nullopt otherwise.
std::vector<std::optional<MonoTime>> gang_resume_floors(const std::vector<GangMember>& members,
                                                        MonoTime now);

// For each member, in order: whether no member on another GPU runs: each pauses for its cap or
// drains after its quota revoke, and at least one pauses. A member's queued work may then be
// waiting for theirs (a collective that the pausing one has not submitted its part of): its drain
// is not billed.
std::vector<bool> gang_peers_paused(const std::vector<GangMember>& members);

// Brings a gang to its fixed point: each pass reads every member's state (`state_of(gpu, client)`:
// std::optional<GangState>, nullopt for a member its GPU does not know) and gives each member whose
// floor or peers_paused changed a ResumeNotBefore (`tell(gpu, event)`). A floor can revoke a
// member, which changes what the others are told, so passes repeat until nothing changes (each pass
// that changes something moves a member towards pausing: at most one per member, and one more).
template <typename StateOf, typename Tell>
void align_gang(const std::vector<std::pair<std::string, ClientId>>& ids, MonoTime now,
                StateOf&& state_of, Tell&& tell) {
  for (std::size_t pass = 0; pass <= ids.size(); ++pass) {
    std::vector<GangMember> members;
    members.reserve(ids.size());
    for (const auto& [gpu, client] : ids) {
      const std::optional<GangState> state = state_of(gpu, client);
      members.push_back(
          {gpu, client, state ? state->pause_ends : std::nullopt, state && state->draining});
    }
    const std::vector<std::optional<MonoTime>> floors = gang_resume_floors(members, now);
    const std::vector<bool> paused = gang_peers_paused(members);
    bool changed = false;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::optional<GangState> state = state_of(ids[i].first, ids[i].second);
      if (!state || (state->floor == floors[i] && state->peers_paused == paused[i])) continue;
      changed = true;
      tell(ids[i].first, ResumeNotBefore{ids[i].second, floors[i], paused[i]});
    }
    if (!changed) return;
  }
}

}  // namespace nvshare::policy
