// The paired simulator: real client GrantSession engines (src/client/link/grant_session.h) against
// the real Scheduler (src/scheduler/scheduler.h, one GpuPolicy per GPU) in virtual time.
//
// Everything between them is simulated: frames take 0..delay_max each way (in order per
// connection), the link shell's work takes the time the simulated process needs (a drain waits
// for the GPU work queued, a swap moves the allocation at the client's bandwidth, a launch call
// keeps its thread inside the gate), application threads submit, wait at the gate, go idle and
// come back. Scenarios add scheduler restarts (the state carried over as the daemon's state file
// carries it), dropped connections, limit changes through the control API, clients that hang in a
// drain, and processes that exit.
//
// Properties, checked after every step (docs/architecture.md, "The paired simulation"):
//  - one holder: in exclusive mode at most one client of a GPU holds or drains a grant at a time,
//    and no grant epoch of a scheduler's life is ever held by two clients;
//  - revoke bound: a client that is not hung answers a revoke within the wait for threads inside a
//    submission, the GPU work it had queued, one launch and its swap-out;
//  - limits: a client's limits are never absent or looser than some value its pod has had, and a
//    connected client that is not busy has its pod's current limits once the frame could arrive;
//  - nobody stuck: no application thread waits at the gate longer than the scenario's bound;
//  - caps converge: in the cap scenarios the capped client's billed share is its cap, within
//    tolerance;
//  - time moves: no more than 100,000 steps at one instant (an engine whose next deadline stays in
//    the past would spin its link thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/protocol.h"
#include "scheduler/policy/config.h"

namespace nvshare::linksim {

using protocol::Limits;

inline constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

enum class Load {
  kBusy,    // always has work, keeps a few ms queued
  kBursty,  // bursts of launches, then idle long enough to release
  kHung,    // busy; after some revokes its drain never finishes
};

struct ClientSpec {
  Load load = Load::kBusy;
  int gpu = 0;
  int pod = -1;  // index into Scenario::pods; -1: not in a pod (no limits)
  std::uint64_t bytes = kGiB;
  Duration start{0};
  Duration exit_at{0};                             // 0: runs to the end
  Duration kernel = std::chrono::milliseconds(2);  // GPU time per launch
  Duration launch_call = std::chrono::microseconds(20);
  double swap_bytes_per_s = 10e9;
  int hang_after_revokes = 2;  // kHung
  Duration idle_release = std::chrono::milliseconds(100);
  // In a pod: how long its settings file says the memory limit is pending (0: it has the limit).
  Duration settings_pending{0};
  // kBusy: a pause of host work this long (the GPU idle) after every pause_every of GPU work.
  Duration pause{0};
  Duration pause_every = std::chrono::milliseconds(200);
  Duration idle_from{0};  // 0: never; else no more work from then on (its memory stays)
  // kBusy: one pause of host work this long after once_pause_after of GPU work (a start-up before
  // the loop); 0: none.
  Duration once_pause{0};
  Duration once_pause_after{0};
  // A launch call that takes this long (the driver holds it; the GPU runs dry meanwhile) after
  // every stall_every of GPU work; 0: none.
  Duration stall{0};
  Duration stall_every = std::chrono::milliseconds(500);
  // A wait for the drain bound that ends this long after the work it waited for is done (the
  // driver wakes the thread late; the GPU runs dry meanwhile), after every stall_every of GPU
  // work; 0: none. The thread then spends after_wake on host work before its next launch.
  Duration late_wake{0};
  Duration after_wake{0};
};

struct Restart {
  Duration at{0};
  Duration down{0};  // connections fail for this long
};

struct Drop {
  Duration at{0};
  int client = 0;
};

struct Scenario {
  std::string name;
  std::uint64_t seed = 0;
  policy::PolicyConfig config;
  int gpus = 1;
  std::uint64_t gpu_bytes = 16 * kGiB;
  std::vector<Limits> pods;  // set through the control API before any client starts
  std::vector<ClientSpec> clients;
  std::vector<Restart> restarts;
  std::vector<Drop> drops;
  Duration limit_change_every{0};  // 0: never; else a random pod's limits change about this often
  Duration delay_max = std::chrono::milliseconds(1);
  Duration length = std::chrono::seconds(20);
  // Cap convergence: the first client's billed share must be its cap within this (0: not checked).
  double cap_tolerance_points = 0;
};

struct Result {
  bool ok = true;
  std::string failure;
  std::vector<std::string> trace;  // the last steps (tracing runs)
  std::uint64_t steps = 0;
  std::uint64_t grants = 0;
  std::uint64_t revokes = 0;
  std::uint64_t swaps = 0;
  std::uint64_t room_swap_ins = 0;  // swap-ins into room while waiting (SwapIn with a limit)
  std::uint64_t idle_releases = 0;
  std::uint64_t yields = 0;
  std::uint64_t swap_notices = 0;  // swap notices a client acted on (it readied a swap-out)
  std::uint64_t contended = 0;     // contended notices a holder took (a lower class held back)
  std::uint64_t reconnects = 0;
  std::uint64_t limit_changes = 0;
  std::uint64_t deferred = 0;  // events that arrived while the engine awaited an answer
  Duration worst_wait{0};
  Duration stuck_bound{0};
  double first_share_percent = -1;  // the first client's billed share (cap scenarios)
  // Per client: idle releases while it still had work to come (its pauses were handed over), and
  // the longest time from the end of its work to its release of a grant that had a swap notice
  // (-1: no such release).
  std::vector<int> pause_releases;
  std::vector<Duration> noticed_end_release;
  // Per client: of those pause releases, the ones of a grant with a notice (swap notice or
  // contended) and no yield, and the longest time from the end of its work to such a release (-1:
  // none).
  std::vector<int> noticed_pause_releases;
  std::vector<Duration> noticed_pause_release;
};

inline constexpr const char* kNoticedEndsScenario = "pauses and ends while jobs wait for memory";
inline constexpr const char* kLateWakesScenario =
    "jobs that wait for memory while their waits for the drain bound wake late now and then";
inline constexpr const char* kStalledLaunchesScenario =
    "a high service whose launches the driver holds now and then beside a held-back low trainer";
inline constexpr const char* kContendedPausesScenario =
    "a high service's pauses go to a held-back low trainer";
inline constexpr const char* kOneOffPauseScenario =
    "a high service's one-off pause at its start keeps none of its later pauses from a held-back "
    "low trainer";
inline constexpr const char* kContendedGapsScenario =
    "a high service's short gaps stay its own beside a held-back low trainer";

Scenario random_scenario(std::uint64_t seed);
std::vector<Scenario> named_scenarios();
Result run(const Scenario& scenario, bool trace = false);
std::string describe(const Scenario& scenario);

}  // namespace nvshare::linksim
