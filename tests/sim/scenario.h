// Scenarios for the policy simulator: who the clients are, how they behave, and the GPU's policy.
//
// A scenario is plain data, built deterministically from a seed (random_scenario) or by name
// (named_scenarios, cap_cases), so a failure is reproduced by its name and seed alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/policy/config.h"
#include "scheduler/policy/events.h"

namespace nvshare::sim {

using policy::Limits;
using policy::PolicyConfig;

inline constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

enum class Behaviour {
  kComputeBound,  // always has work: holds until revoked, wants the GPU back at once
  kBursty,        // bursts of work between idle gaps; releases by itself when a burst ends
  kIdle,          // rarely asks, holds briefly
  kHung,          // stops answering revokes after a few of them (may wake up much later)
  kCrashing,  // compute-bound, disconnects at a random moment (and may come back as a new client)
};
const char* to_string(Behaviour behaviour);

struct ClientSpec {
  Behaviour behaviour = Behaviour::kComputeBound;
  std::uint64_t working_set = kGiB;
  Limits limits;
  Duration start{0};               // when it connects
  double swap_bytes_per_s = 10e9;  // its true swap bandwidth (reported after each swap)
  // How fast it makes the host copies of its memory before its first swap-out (0: they cost
  // nothing). A swap notice starts them; a swap-out waits for what is left of them.
  double host_copy_bytes_per_s = 0;
  Duration max_drain = std::chrono::milliseconds(50);  // release after 0..max_drain on revoke
  // kComputeBound: 0, it never goes idle; else its work comes in steps this long, each followed by
  // a short idle gap (a synchronize, host work). Asked to yield, it releases at the end of its step
  // and asks again after the gap.
  Duration step{0};
  bool grows = false;          // changes its allocation now and then
  int hang_after_revokes = 0;  // kHung: answers this many revokes, then ignores one
  Duration wake_after{0};      // kHung: releases this long after hanging (0: never)
  Duration crash_at{0};        // kCrashing: when it disconnects
  bool reconnects = false;     // kCrashing: comes back as a new client afterwards
  // A client that lies about itself (0: tells the truth): the allocated bytes it reports whatever
  // it holds, and the swap bandwidth it reports after each swap.
  std::uint64_t reported_bytes = 0;
  std::uint64_t reported_swap_bytes_per_s = 0;
  // Its pace, reported with its usage (per mille of its held time with a deep queue; none: it
  // reports none, as an older client does), and from pace_change_at after it connects another one
  // (a job whose behaviour changes; pace_change_at 0: never).
  std::optional<std::uint16_t> pace;
  Duration pace_change_at{0};
  std::optional<std::uint16_t> later_pace;
  // From pace_change_at on, its drains take up to this instead of max_drain (its kernels changed
  // length).
  std::optional<Duration> later_max_drain;
  // It takes byte targets (protocol version 10): asked for part of its memory, it moves whole
  // allocations of this size, at least what was asked; 0: every swap-out moves all of it.
  std::uint64_t chunk = 0;
  // With a chunk: it takes room (protocol version 12), bringing memory back while it waits.
  bool takes_room = true;
  bool lies() const { return reported_bytes != 0 || reported_swap_bytes_per_s != 0; }
};

struct Scenario {
  std::string name;
  std::uint64_t seed = 0;
  PolicyConfig config;
  std::vector<ClientSpec> clients;
  Duration length = std::chrono::seconds(30);
  Duration limit_change_every{0};  // 0: none; else a random client's limits change about this often
  bool stale_releases = false;     // clients repeat some releases late, with their old epochs
};

// Seeded random mix of behaviours, sizes, caps and policy settings (small quanta and grace so that
// turn-taking and failures happen many times within a short simulated run).
Scenario random_scenario(std::uint64_t seed);

// Hand-written situations: hung holder, crash while holding, limits changed mid-run, oversize
// client, exclusive alternation, many bursty clients, and a few more.
std::vector<Scenario> named_scenarios();

// Cap accuracy: compute-bound clients that all fit together, run for 60 s from t = 0.
struct CapCase {
  std::string category;  // "alone", "two, sum<=100", ..., "mixed with uncapped"
  Scenario scenario;
};
std::vector<CapCase> cap_cases();

// Fair turns: exclusive mode, compute-bound clients that all want the GPU all the time, some with
// idle gaps between steps (they honour yields) and some without, for 120 s from t = 0.
std::vector<Scenario> fair_turn_cases();

// Mode auto with pace reports: compute-bound clients that all fit, some saturating (a deep queue),
// some not, some switching between the two, for 60 s from t = 0.
std::vector<Scenario> saturating_cases();
// Jobs that do not fit together (10 GiB each under 16 GiB) take turns with swaps, each making the
// host copies of its memory at 4.6 GB/s before its first swap-out: 2 and 3 jobs, started together
// or apart, in modes auto and exclusive.
std::vector<Scenario> swap_turn_cases();

// Jobs that do not fit together and whose hand-offs cost less than the longest quantum allows
// (2 and 3 jobs of 4 GiB under 6 GiB, swapping at 50 or 100 GB/s, modes auto and exclusive), for
// the share of the GPU's time their swaps take.
std::vector<Scenario> swap_share_cases();

// Priority classes (mode auto and exclusive): a `high` client beside `low` ones, each case with
// what the test expects of it.
struct PriorityCase {
  Scenario scenario;
  Duration high_wait_bound{0};  // the high client's longest wait for a grant
  // The low client's GPU time in each whole 5 s window from low_runs_from on, at least (0: no
  // check), and before low_waits_until (0: no check) at most low_before.
  double low_per_window = 0;
  Duration low_runs_from{0};
  Duration low_waits_until{0};
  double low_before = 0;
  // The time the high client held the GPU while a lower class also held it (its kernels still
  // draining beside the high client's steps), at most (negative: no check).
  double high_shared_max = -1;
  // The high client's steps that a lower class's drain slowed (by more than a tenth of a step), at
  // most (negative: no check).
  double high_slowed_max = -1;
};
std::vector<PriorityCase> priority_cases();

}  // namespace nvshare::sim
