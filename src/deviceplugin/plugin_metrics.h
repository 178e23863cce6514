// The device plugin's metrics: GET /metrics on metrics-address (docs/metrics.md, "Device plugin").
//
// Rendered on the endpoint's thread from copies taken through the plugin's thread-safe accessors:
// slots advertised and their health per GPU, slots handed out by Allocate per GPU, refused Allocate
// calls, kubelet registrations, GPU health changes and inventory pushes. Names carry the
// `nvshare_plugin_` prefix; counters end in `_total`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/exposition.h"
#include "deviceplugin/placement.h"
#include "deviceplugin/plugin_server.h"

namespace nvshare::deviceplugin {

struct PluginMetricsInput {
  std::string resource_name;
  std::vector<ManagedGpu> gpus;
  PluginServerStats plugin;
  double start_time_s = 0;  // seconds since the Unix epoch
  std::string version;
};

// The plugin's own families; the pod watcher, when it runs, adds its own to the same exposition
// (podwatcher/watcher_metrics.h).
void render_plugin_metrics(const PluginMetricsInput& input, Exposition& out);

}  // namespace nvshare::deviceplugin
