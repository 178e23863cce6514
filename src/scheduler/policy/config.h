// Policy knobs of one GPU. Defaults are the documented ones (docs/configuration.md); the daemon
// builds a PolicyConfig from its flags and environment, and `nvsharectl set-policy` changes it at
// run time.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

#include "common/mono_time.h"
#include "common/result.h"

namespace nvshare::policy {

using namespace std::chrono_literals;

enum class Mode {
  kAuto,       // clients whose working sets fit together run together
  kExclusive,  // one runner at a time (alias "serial")
};

Result<Mode> parse_mode(std::string_view text);
std::string_view to_string(Mode mode);

struct PolicyConfig {
  Mode mode = Mode::kAuto;
  // Fraction of capacity kept free when deciding who fits together.
  double reserve_fraction = 0.10;
  // Virtual capacity; when unset, the GPU's physical memory (device_bytes).
  std::optional<std::uint64_t> capacity_bytes;
  // Physical memory of the GPU, from the device (NVML, the --gpus list or the device plugin's
  // inventory). Set by the scheduler, not a knob; never taken from a client. 0: unknown, and then
  // nobody runs beside anybody unless capacity_bytes is set.
  std::uint64_t device_bytes = 0;

  // Turn-taking quantum: fixed when set, otherwise clamp(k x estimated swap time, min, max). With
  // k = 50 a hand-off that moves memory costs about 2% of the GPU's time (1 / (k + 1)) while the
  // quantum is under its maximum.
  std::optional<Duration> fixed_quantum;
  double quantum_swap_multiple = 50.0;
  Duration quantum_min = 5s;
  Duration quantum_max = 15s;
  // One runner at a time (exclusive mode, or while a cap binds), when a hand-off moves no memory:
  // the length of the turns clients take by their fair clocks. A client's turn lasts about
  // slice x its weight (its share of the GPU while it is entitled to one, else 1), at least a
  // tenth of a slice, and a quantum at most.
  Duration turn_slice = 500ms;
  // A capped client whose memory stays on the device is paused in cycles of this length (at most
  // the quota window): it runs cap x cycle and waits the rest. Shorter cycles keep its share close
  // to its cap over shorter spans (its bucket swings by cap x (1 - cap) x cycle) at the price of
  // more hand-offs.
  Duration cap_cycle = 250ms;
  // Swap bandwidth assumed for a client until it reports a measured one (conservative: host paging
  // at its slowest measured rate on an H200 was 2.2 GB/s).
  std::uint64_t default_swap_bytes_per_s = 2'000'000'000;
  // A client's reported bandwidth counts as at least this, so a report of 1 byte/s cannot stretch
  // its quantum or its swap allowance.
  std::uint64_t swap_bandwidth_floor = 1'000'000'000;

  // Priority classes: how much of the time a lower class's kernels, still running after it was
  // preempted for a higher class, may overlap the higher class's steps (the GPU time-slices them,
  // so the higher class's step is slowed for that long). A delay within kPriorityFreeDelay of the
  // higher class's step costs nothing; longer ones are charged against a budget that refills at
  // this fraction of wall time (bursts up to priority_floor's worth). A lower class out of budget
  // does not run in a higher class's idle moments, except that a floor after holding back began
  // (or after the last floor grant that was used) the first held-back client is let through.
  double priority_interference = 0.005;
  Duration priority_floor = 4s;

  // Compute caps: token bucket depth and the window "effective share" is measured over.
  Duration quota_window = 2000ms;
  // A holder that has not released this long after a revoke stops blocking others...
  Duration revoke_grace = 5s;
  // ...plus, when it was asked to swap out, the estimated time to move its memory, at most this.
  Duration swap_allowance_max = 10s;
};

// The longest a holder that ignores revokes can keep a waiting client out, whatever it reports:
// one quantum (the fixed one, else quantum_max) or, revoked during its estimated swap-in, the
// largest swap allowance, whichever is longer; then the grace and the largest swap allowance
// (docs/scheduling.md, "Bounds that no client can stretch"). 30 s with the defaults.
Duration hog_bound(const PolicyConfig& config);

// Checks ranges (reserve in [0, 0.9], quanta positive and min <= max, window >= 10 ms, ...).
Status validate(const PolicyConfig& config);

}  // namespace nvshare::policy
