// The device plugin's metrics: GET /metrics on metrics-address (docs/metrics.md, "Device plugin").
//
// Rendered on the endpoint's thread from copies taken through the plugin's and the pod watcher's
// thread-safe accessors: slots advertised and their health per GPU, slots handed out by Allocate
// per GPU, refused Allocate calls, kubelet registrations, the pod watcher's API traffic (watch
// restarts, errors, relists), the annotation values it refused, the limits pushed to the scheduler
// and the Warning Events posted. Names carry the `nvshare_plugin_` prefix; counters end in
// `_total`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deviceplugin/placement.h"
#include "deviceplugin/plugin_server.h"

namespace nvshare::deviceplugin {

// The pod watcher's counters (podwatcher/pod_watcher.h), when it runs.
struct WatcherCounters {
  std::uint64_t lists = 0;
  std::uint64_t watch_restarts = 0;
  std::uint64_t relists_gone = 0;
  std::uint64_t api_errors = 0;
  std::uint64_t invalid_annotations = 0;
  std::uint64_t pushes = 0;
  std::uint64_t push_failures = 0;
  std::uint64_t warnings_posted = 0;
  std::uint64_t alerts_raised = 0;
  std::uint64_t alerts_suppressed = 0;
  std::uint64_t managed_pods = 0;
  bool synced = false;
};

struct PluginMetricsInput {
  std::string resource_name;
  std::vector<ManagedGpu> gpus;
  PluginServerStats plugin;
  std::optional<WatcherCounters> watcher;  // nullopt: no pod watcher (no node name)
  double start_time_s = 0;                 // seconds since the Unix epoch
  std::string version;
};

std::string render_plugin_metrics(const PluginMetricsInput& input);

}  // namespace nvshare::deviceplugin
