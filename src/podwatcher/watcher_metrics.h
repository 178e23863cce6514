// The pod watcher's families of the device plugin's metrics (docs/metrics.md, "Device plugin"):
// whether it has listed the node's pods, the pods it manages, its API traffic (lists, watch
// restarts, relists, errors), the annotation values it refused, the limits it pushed to the
// scheduler, and the Warning Events and alerts it raised. Names carry the `nvshare_plugin_` prefix
// of the program it runs in.
#pragma once

#include "common/exposition.h"
#include "podwatcher/pod_watcher.h"

namespace nvshare::podwatcher {

void render_watcher_metrics(const PodWatcherStats& stats, Exposition& out);

}  // namespace nvshare::podwatcher
