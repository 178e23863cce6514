// The policy simulator: one GpuPolicy driven in virtual time by simulated clients.
//
// Clients react to the engine's actions with realistic latencies (a drain of 0..50 ms and the
// swap-out time before a release, idle gaps before asking again, crashes, hangs), and the simulator
// advances time to min(next client event, next_deadline()). After every handle() it checks the
// properties listed in docs/scheduling.md ("What the simulator checks"); the first violation stops
// the run and is reported with the simulated time. A run is a pure function of its scenario, so a
// failure is replayed from the scenario's name and seed, with tracing on, to print what led to it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scenario.h"

namespace nvshare::sim {

// One connection of one simulated client, as the simulator measured it (not as the engine reports
// it).
struct ConnectionOutcome {
  std::string label;          // "client 3 (compute, 30%)"
  Limits limits;              // at connect
  bool cap_changed = false;   // its core percent changed during the connection
  bool hung = false;          // it ignored a revoke at some point
  double seconds = 0;         // connected time
  double billed_seconds = 0;  // GPU time: 1/n of wall time while it was one of n grant holders
  // The same, per whole second of simulated time since the start: [k] is what it was billed in
  // [k s, k + 1 s) (seconds before it connected are 0).
  std::vector<double> billed_per_second;
  Duration worst_wait{0};       // its longest wait from a request (or a preemption) to a grant
  std::uint64_t swap_outs = 0;  // revokes that asked it to move its memory to the host
  // Time it held the GPU while a client of a lower class held it too (draining beside it).
  Duration shared_with_lower{0};
  // Its grants that a lower class's drain overlapped for more than a tenth of its step (a client
  // of steps: each is a step that drain slowed), counted at its next grant.
  std::uint64_t steps_slowed = 0;
};

struct SimResult {
  bool ok = true;
  std::string failure;             // the first violated property
  std::vector<std::string> trace;  // the last events before the end or the failure (tracing runs)

  std::uint64_t engine_events = 0;
  std::uint64_t grants = 0;
  std::uint64_t revokes = 0;
  std::uint64_t quota_revokes = 0;
  std::uint64_t swap_outs = 0;
  std::uint64_t yields = 0;  // soft revokes sent (exclusive mode, someone waits and fits)
  std::uint64_t swap_notices = 0;
  std::uint64_t contended = 0;  // holders told that a lower class held back waits (SendContended)
  std::uint64_t evictions = 0;  // memory kept on the device without a grant, asked out
  std::uint64_t turn_swap_outs = 0;              // revokes for a turn that asked for a swap-out
  std::uint64_t noticed_swap_outs = 0;           // of which a swap notice announced
  Duration least_notice_lead = Duration::max();  // from a notice to its swap-out revoke
  Duration host_copy_waits{0};   // swap-outs waiting for host copies (ClientSpec::host_copy_...)
  std::uint64_t rooms = 0;       // room given to a waiting head (SendRoom)
  std::uint64_t room_bytes = 0;  // brought back into it before a grant
  // Memory moved for hand-offs: each swap-out and each swap-in that followed (into room while
  // waiting, or at the grant), at the client's bandwidth. handoff_time adds the drains: each such
  // swap-out from revoke to release (drain, host copies, swap-out) and each swap-in at a grant
  // (one into room overlaps a swap-out: it is not added).
  Duration swap_time{0};
  Duration handoff_time{0};
  std::uint64_t unresponsive = 0;
  std::uint64_t stale_releases = 0;
  std::uint64_t limit_changes = 0;
  Duration starvation_bound{0};  // N x Q + (2N - 1) x (G + S), docs/scheduling.md
  Duration worst_wait{0};  // longest wait for turn or memory (time waiting for quota excluded)
  Duration worst_limit_latency{0};
  Duration idle_while_waiting{0};  // no grant holder while somebody waited (for quota, necessarily)
  Duration together{0};            // two or more clients held grants
  // The same per whole second of simulated time: [k] is how much of [k s, k + 1 s) it was.
  std::vector<double> together_per_second;
  std::vector<ConnectionOutcome> connections;
};

SimResult run_simulation(const Scenario& scenario, bool trace = false);

// One line: the scenario's policy and clients, for failure reports.
std::string describe(const Scenario& scenario);

}  // namespace nvshare::sim
