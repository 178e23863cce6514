// LimitsLedger: the limits the pods on this node should have in the scheduler (desired) against
// the limits the scheduler has accepted (pushed), and the control requests that close the gap.
//
// The watcher sets the desired limits of managed pods and removes pods that are gone; the pusher
// takes next_command(), sends it, and reports the outcome with mark_done(). Because mark_done()
// records what the command carried (not what is desired by then), a change that arrives while a
// command is in flight is pushed by the next command. mark_all_unpushed() says the scheduler may
// have forgotten everything (it restarted or could not be reached): every managed pod is pushed in
// full again, and pods waiting to be forgotten are dropped (a fresh scheduler does not know them).
// Pure and single-threaded: the caller locks.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/json.h"
#include "control/requests.h"
#include "podwatcher/pod_limits.h"

namespace nvshare::podwatcher {

struct ControlCommand {
  enum class Kind { kSetLimits, kForgetPod };
  Kind kind = Kind::kSetLimits;
  std::string pod_uid;
  std::string namespace_name;
  std::string name;
  // kSetLimits: which fields to send; a sent field whose limit is nullopt is sent as "inherit"
  // (this layer no longer sets it).
  bool send_memory = false;
  bool send_core = false;
  bool send_memory_mode = false;
  bool send_priority = false;
  PodLimits limits;

  // The control-socket request (docs/control-api.md).
  control::Request to_request() const;
};

class LimitsLedger {
 public:
  // Sets the desired limits of a managed pod (namespace and name are recorded with it).
  void set_desired(const std::string& pod_uid, const std::string& namespace_name,
                   const std::string& name, const PodLimits& limits);
  // The pod is gone (deleted, finished, no longer managed): forget it in the scheduler.
  void remove(const std::string& pod_uid);

  // The next request to send, or nullopt when the scheduler is up to date.
  std::optional<ControlCommand> next_command() const;
  // The scheduler accepted `command` (or refused it for good: it is not retried).
  void mark_done(const ControlCommand& command);
  void mark_all_unpushed();

  bool has_desired(const std::string& pod_uid) const { return desired_.contains(pod_uid); }
  std::optional<PodLimits> desired(const std::string& pod_uid) const;
  std::map<std::string, std::uint64_t> memory_limits() const;
  std::map<std::string, int> core_limits() const;
  std::size_t managed_pods() const { return desired_.size(); }

 private:
  struct Desired {
    std::string namespace_name;
    std::string name;
    PodLimits limits;
  };
  std::map<std::string, Desired> desired_;
  std::map<std::string, PodLimits> pushed_;  // pods the scheduler has a record of
};

}  // namespace nvshare::podwatcher
