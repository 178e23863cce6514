// PodAlerts: which Warning Events to post on a pod from what the scheduler reports about it.
//
// The pod watcher samples the scheduler's status (every status-interval) and totals, per pod, the
// allocations its processes' memory limits refused and the time they waited for their compute cap.
// Two conditions are worth a person's attention, on the pod itself where `kubectl describe pod`
// shows them:
//  - GpuMemoryLimitReached: allocations were refused since the previous sample (the application
//    saw CUDA_ERROR_OUT_OF_MEMORY from its limit, not from the GPU);
//  - GpuComputeThrottled: over the last throttle window (60 s), the pod's processes waited for
//  their
//    cap at least throttle_fraction (half) of the time: the cap, not the GPU, sets its speed.
// Each reason is posted at most once per pod per repeat interval (10 minutes); what falls inside it
// is counted as suppressed. A pod absent from a sample is forgotten (its processes are gone).
//
// Contract: pure (time is an argument); totals that go down (a process exited) start a new baseline
// and raise nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "common/json.h"
#include "common/mono_time.h"

namespace nvshare::podwatcher {

inline constexpr const char* kMemoryLimitReason = "GpuMemoryLimitReached";
inline constexpr const char* kThrottledReason = "GpuComputeThrottled";

// One pod's totals over its live processes, as one status reports them.
struct PodUsage {
  std::string pod_uid;
  std::uint64_t refused_allocations = 0;
  double quota_wait_s = 0;
  int core_limit_percent = 100;  // the cap its processes run under (the lowest)
  std::uint64_t memory_limit_bytes = 0;
};

struct PodAlert {
  std::string pod_uid;
  std::string reason;
  std::string message;
};

struct PodAlertsConfig {
  Duration throttle_window = std::chrono::seconds(60);
  double throttle_fraction = 0.5;
  Duration repeat_after = std::chrono::minutes(10);
};

// The per-pod totals in the body of a status answer (clients of every GPU with a pod UID).
std::vector<PodUsage> pod_usage_from_status(const Json& body);

class PodAlerts {
 public:
  explicit PodAlerts(PodAlertsConfig config = {}) : config_(config) {}

  std::vector<PodAlert> observe(const std::vector<PodUsage>& pods, MonoTime now);
  std::uint64_t suppressed() const { return suppressed_; }

 private:
  struct Sample {
    MonoTime at;
    double quota_wait_s;
  };
  struct PodState {
    std::uint64_t refused = 0;
    std::deque<Sample> waits;  // samples within the throttle window, oldest first
    std::map<std::string, MonoTime> last_posted;  // by reason
  };

  // Whether `reason` may be posted on the pod now (and records it when so).
  bool due(PodState& state, const std::string& reason, MonoTime now);

  PodAlertsConfig config_;
  std::map<std::string, PodState> pods_;
  std::uint64_t suppressed_ = 0;
};

}  // namespace nvshare::podwatcher
