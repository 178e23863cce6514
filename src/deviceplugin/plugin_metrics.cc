#include "deviceplugin/plugin_metrics.h"

#include "common/exposition.h"

namespace nvshare::deviceplugin {
namespace {

void counter(Exposition& e, std::string_view name, std::string_view help, std::uint64_t value) {
  e.family(name, "counter", help);
  e.sample(Labels(), value);
}

void gauge(Exposition& e, std::string_view name, std::string_view help, std::uint64_t value) {
  e.family(name, "gauge", help);
  e.sample(Labels(), value);
}

void render_watcher(Exposition& e, const WatcherCounters& w) {
  gauge(e, "nvshare_plugin_watcher_synced",
        "1 once the pod watcher has listed this node's pods (limits are authoritative).",
        w.synced ? 1 : 0);
  gauge(e, "nvshare_plugin_managed_pods", "Pods on this node that request the resource.",
        w.managed_pods);
  counter(e, "nvshare_plugin_pod_lists_total", "Successful lists of this node's pods.", w.lists);
  counter(e, "nvshare_plugin_watch_restarts_total",
          "Pod watches started after the first: resumed after a timeout, reconnected after an "
          "error, or restarted after a relist.",
          w.watch_restarts);
  counter(e, "nvshare_plugin_watch_relists_total",
          "Relists because the API server no longer had the watched version (410 Gone).",
          w.relists_gone);
  counter(e, "nvshare_plugin_api_errors_total",
          "Failed API server requests and dropped watch connections.", w.api_errors);
  counter(e, "nvshare_plugin_annotation_errors_total",
          "Annotation values refused (each value reported once as a Warning Event; the previous "
          "limit stays).",
          w.invalid_annotations);
  counter(e, "nvshare_plugin_limit_pushes_total",
          "set-limits and forget-pod requests the scheduler accepted.", w.pushes);
  counter(e, "nvshare_plugin_limit_push_failures_total",
          "Pushes to the scheduler that failed (unreachable or refused).", w.push_failures);
  counter(e, "nvshare_plugin_events_posted_total", "Warning Events created on pods.",
          w.warnings_posted);
  counter(e, "nvshare_plugin_alerts_total",
          "GpuMemoryLimitReached and GpuComputeThrottled conditions raised on pods.",
          w.alerts_raised);
  counter(e, "nvshare_plugin_alerts_suppressed_total",
          "The same conditions within their repeat interval, not posted again.",
          w.alerts_suppressed);
}

}  // namespace

std::string render_plugin_metrics(const PluginMetricsInput& input) {
  Exposition e;
  e.family("nvshare_plugin_build_info", "gauge", "The device plugin's version (value 1).");
  e.sample(Labels().add("version", input.version).add("resource", input.resource_name),
           std::uint64_t{1});
  e.family("nvshare_plugin_start_time_seconds", "gauge",
           "When the device plugin started, in seconds since the Unix epoch.");
  e.sample(Labels(), input.start_time_s);

  e.family("nvshare_plugin_slots", "gauge",
           "Slots (devices of the resource) advertised to the kubelet per GPU.");
  for (const ManagedGpu& gpu : input.gpus) {
    e.sample(Labels().add("gpu", gpu.uuid).add("index", std::to_string(gpu.index)),
             static_cast<std::uint64_t>(gpu.slots));
  }
  e.family("nvshare_plugin_gpu_healthy", "gauge",
           "1 while the GPU's slots are advertised Healthy, 0 while Unhealthy.");
  for (const ManagedGpu& gpu : input.gpus) {
    e.sample(Labels().add("gpu", gpu.uuid).add("index", std::to_string(gpu.index)),
             std::uint64_t{gpu.healthy ? 1u : 0u});
  }
  e.family("nvshare_plugin_allocated_slots_total", "counter",
           "Slots Allocate handed to containers, per GPU.");
  for (const ManagedGpu& gpu : input.gpus) {
    auto it = input.plugin.allocated_slots.find(gpu.uuid);
    e.sample(Labels().add("gpu", gpu.uuid).add("index", std::to_string(gpu.index)),
             it == input.plugin.allocated_slots.end() ? std::uint64_t{0} : it->second);
  }
  counter(e, "nvshare_plugin_allocate_refusals_total",
          "Allocate calls refused (unknown device IDs, or a container's settings that could not "
          "be written).",
          input.plugin.allocate_refusals);
  counter(e, "nvshare_plugin_registrations_total", "Successful registrations with the kubelet.",
          input.plugin.registrations);
  counter(e, "nvshare_plugin_registration_failures_total",
          "Failed attempts to register with the kubelet.", input.plugin.register_failures);
  counter(e, "nvshare_plugin_health_changes_total", "GPU health transitions.",
          input.plugin.health_changes);
  counter(e, "nvshare_plugin_inventory_pushes_total",
          "GPU inventory (and capacity) pushes the scheduler accepted.",
          input.plugin.capacity_pushes);
  if (input.watcher) render_watcher(e, *input.watcher);
  return e.take();
}

}  // namespace nvshare::deviceplugin
