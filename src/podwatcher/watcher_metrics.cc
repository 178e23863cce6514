#include "podwatcher/watcher_metrics.h"

namespace nvshare::podwatcher {

void render_watcher_metrics(const PodWatcherStats& w, Exposition& e) {
  e.scalar("nvshare_plugin_watcher_synced", "gauge",
           "1 once the pod watcher has listed this node's pods (limits are authoritative).",
           std::uint64_t{w.synced ? 1u : 0u});
  e.scalar("nvshare_plugin_managed_pods", "gauge", "Pods on this node that request the resource.",
           std::uint64_t{w.managed_pods});
  e.scalar("nvshare_plugin_pod_lists_total", "counter", "Successful lists of this node's pods.",
           w.lists);
  e.scalar("nvshare_plugin_watch_restarts_total", "counter",
           "Pod watches started after the first: resumed after a timeout, reconnected after an "
           "error, or restarted after a relist.",
           w.watch_restarts);
  e.scalar("nvshare_plugin_watch_relists_total", "counter",
           "Relists because the API server no longer had the watched version (410 Gone).",
           w.relists_gone);
  e.scalar("nvshare_plugin_api_errors_total", "counter",
           "Failed API server requests and dropped watch connections.", w.api_errors);
  e.scalar("nvshare_plugin_annotation_errors_total", "counter",
           "Annotation values refused (each value reported once as a Warning Event; the previous "
           "limit stays).",
           w.invalid_annotations);
  e.scalar("nvshare_plugin_limit_pushes_total", "counter",
           "set-limits and forget-pod requests the scheduler accepted.", w.pushes);
  e.scalar("nvshare_plugin_limit_push_failures_total", "counter",
           "Pushes to the scheduler that failed (unreachable or refused).", w.push_failures);
  e.scalar("nvshare_plugin_events_posted_total", "counter", "Warning Events created on pods.",
           w.warnings_posted);
  e.scalar("nvshare_plugin_alerts_total", "counter",
           "GpuMemoryLimitReached and GpuComputeThrottled conditions raised on pods.",
           w.alerts_raised);
  e.scalar("nvshare_plugin_alerts_suppressed_total", "counter",
           "The same conditions within their repeat interval, not posted again.",
           w.alerts_suppressed);
}

}  // namespace nvshare::podwatcher
