// PodWatcher: turns the nvshare annotations of the pods on this node into limits in the scheduler.
//
// It lists the pods bound to `node_name` from the Kubernetes API, then watches them (a watch, never
// a poll), resuming from the last resourceVersion it saw when a watch ends or its connection drops,
// relisting when the API server answers 410 Gone, and reconnecting with capped exponential backoff
// with jitter. Pods that request `resource_name` (in any container's limits or requests) are
// managed:
//  - nvshare.com/gpu-memory-limit (a Kubernetes quantity) and nvshare.com/gpu-core-limit (a percent
//    1..100) are pushed to the scheduler's control socket as `set-limits` by pod UID (with the
//    pod's namespace and name) on the event that changed them;
//  - a removed annotation is pushed as "inherit" (this layer no longer sets the field);
//  - an invalid annotation keeps the previous limit of that field and is reported once per value as
//  a
//    Warning Event on the pod (reason InvalidNvshareAnnotation);
//  - a pod that is deleted, leaves the node or finishes (Succeeded/Failed) is forgotten
//  (`forget-pod`);
//  - every status_interval it reads the scheduler's status and posts Warning Events on managed pods
//    whose allocations the memory limit refused or that wait for their compute cap most of the time
//    (pod_alerts.h: reasons GpuMemoryLimitReached and GpuComputeThrottled, each at most once per
//    pod per repeat interval).
// When the scheduler cannot be reached the pushes are retried with backoff, and everything is
// pushed again once it answers (a restarted scheduler remembers nothing).
//
// Threads: start() spawns two threads, one speaking to the API server and one to the control
// socket; neither ever runs on the scheduler's event loop. stop() returns promptly (it wakes
// blocked transfers and waits) and is idempotent; the destructor stops. All const accessors are
// thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/default_paths.h"
#include "common/result.h"
#include "podwatcher/pod_alerts.h"
#include "podwatcher/pod_limits.h"

namespace nvshare::podwatcher {

struct PodWatcherConfig {
  std::string node_name;        // required: pods with spec.nodeName == node_name are watched
  std::string kubeconfig_path;  // "" = in-cluster credentials (service account)
  std::string control_socket = kDefaultControlSocketPath;
  std::string resource_name = "nvshare.com/gpu";
  std::chrono::seconds watch_timeout{300};  // server-side timeoutSeconds of each watch request

  // In-cluster credentials. Empty host/port: read KUBERNETES_SERVICE_HOST /
  // KUBERNETES_SERVICE_PORT. The token file is re-read on every (re)connect, because projected
  // tokens rotate.
  std::string in_cluster_host;
  std::string in_cluster_port;
  std::string service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";

  // Reconnect backoff of the API watch and of the control-socket pushes: doubles from initial up to
  // max, each wait drawn uniformly from [wait/2, wait].
  std::chrono::milliseconds backoff_initial{500};
  std::chrono::milliseconds backoff_max{30000};
  // Limit on one control-socket request, and how often an idle control connection is checked so a
  // restarted scheduler gets every limit again.
  std::chrono::milliseconds control_timeout{5000};
  std::chrono::milliseconds control_check_interval{5000};
  // Limit on connecting to the API server and on a non-watch request.
  std::chrono::milliseconds api_request_timeout{30000};
  // How often the scheduler's status is read for alerts (0: never), and the alerts' rules.
  std::chrono::milliseconds status_interval{10000};
  PodAlertsConfig alerts;
};

// Counters for logs and tests; read with PodWatcher::stats().
struct PodWatcherStats {
  std::uint64_t lists = 0;                // successful pod lists
  std::uint64_t watches = 0;              // watch requests that got a 200 response
  std::uint64_t relists_gone = 0;         // relists caused by 410 Gone
  std::uint64_t api_errors = 0;           // failed requests and dropped connections
  std::uint64_t events_seen = 0;          // watch events processed (BOOKMARKs included)
  std::uint64_t warnings_posted = 0;      // Warning Events created (all reasons)
  std::uint64_t invalid_annotations = 0;  // annotation values refused (each reported once)
  std::uint64_t watch_restarts = 0;       // watches started after the first (reconnects, resumes)
  std::uint64_t alerts_raised = 0;        // GpuMemoryLimitReached / GpuComputeThrottled raised
  std::uint64_t alerts_suppressed = 0;    // the same within their repeat interval, not posted
  std::uint64_t status_reads = 0;         // status answers read for alerts
  std::size_t managed_pods = 0;           // pods on this node requesting the resource, now
  std::uint64_t pushes = 0;               // set-limits / forget-pod requests the scheduler accepted
  std::uint64_t push_failures = 0;        // requests that failed (unreachable or refused)
  std::string resource_version;           // the last resourceVersion seen (list, event or bookmark)
  bool synced = false;                    // the first list completed
};

class PodWatcher {
 public:
  explicit PodWatcher(PodWatcherConfig config);
  ~PodWatcher();
  PodWatcher(const PodWatcher&) = delete;
  PodWatcher& operator=(const PodWatcher&) = delete;

  // Checks the configuration and the credentials (kubeconfig readable and usable, or the in-cluster
  // environment present), then starts the threads. Errors: empty node name, a watch timeout outside
  // 1..86400 s, unusable credentials, already started. Nothing runs after an error.
  Status start();
  // Stops both threads and waits for them; prompt even while a watch is streaming.
  void stop();

  // The memory limits (bytes) currently in force from annotations, by pod UID, for the managed pods
  // on this node. A pod without a (valid) memory annotation is absent.
  std::map<std::string, std::uint64_t> memory_limits_by_pod_uid() const;
  // The same memory limits keyed "namespace/name": the kubelet's pod-resources API, which placement
  // reads, names pods that way and carries no UID. When two managed pods share a name (one deleted
  // and recreated before the deletion was seen), the one whose event came last wins.
  std::map<std::string, std::uint64_t> memory_limits_by_pod_name() const;
  // The limits of the managed pod called `key` ("namespace/name"; the newest when two share it):
  // nullopt until the first list of the node's pods completed, and for a pod the watcher does not
  // manage. Fields the pod does not set are nullopt.
  std::optional<PodLimits> limits_for_pod_name(const std::string& key) const;
  // The same for gpu-core-limit (percent 1..100).
  std::map<std::string, int> core_limits_by_pod_uid() const;
  PodWatcherStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nvshare::podwatcher
