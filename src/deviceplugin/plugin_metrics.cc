#include "deviceplugin/plugin_metrics.h"

namespace nvshare::deviceplugin {
namespace {

Labels gpu_labels(const ManagedGpu& gpu) {
  return Labels().add("gpu", gpu.uuid).add("index", std::to_string(gpu.index));
}

}  // namespace

void render_plugin_metrics(const PluginMetricsInput& input, Exposition& e) {
  e.family("nvshare_plugin_build_info", "gauge", "The device plugin's version (value 1).");
  e.sample(Labels().add("version", input.version).add("resource", input.resource_name),
           std::uint64_t{1});
  e.scalar("nvshare_plugin_start_time_seconds", "gauge",
           "When the device plugin started, in seconds since the Unix epoch.", input.start_time_s);

  e.family("nvshare_plugin_slots", "gauge",
           "Slots (devices of the resource) advertised to the kubelet per GPU.");
  for (const ManagedGpu& gpu : input.gpus) {
    e.sample(gpu_labels(gpu), static_cast<std::uint64_t>(gpu.slots));
  }
  e.family("nvshare_plugin_gpu_healthy", "gauge",
           "1 while the GPU's slots are advertised Healthy, 0 while Unhealthy.");
  for (const ManagedGpu& gpu : input.gpus) {
    e.sample(gpu_labels(gpu), std::uint64_t{gpu.healthy ? 1u : 0u});
  }
  e.family("nvshare_plugin_allocated_slots_total", "counter",
           "Slots Allocate handed to containers, per GPU.");
  for (const ManagedGpu& gpu : input.gpus) {
    auto it = input.plugin.allocated_slots.find(gpu.uuid);
    e.sample(gpu_labels(gpu),
             it == input.plugin.allocated_slots.end() ? std::uint64_t{0} : it->second);
  }
  e.scalar("nvshare_plugin_allocate_refusals_total", "counter",
           "Allocate calls refused (unknown device IDs, or a container's settings that could not "
           "be written).",
           input.plugin.allocate_refusals);
  e.scalar("nvshare_plugin_registrations_total", "counter",
           "Successful registrations with the kubelet.", input.plugin.registrations);
  e.scalar("nvshare_plugin_registration_failures_total", "counter",
           "Failed attempts to register with the kubelet.", input.plugin.register_failures);
  e.scalar("nvshare_plugin_health_changes_total", "counter", "GPU health transitions.",
           input.plugin.health_changes);
  e.scalar("nvshare_plugin_inventory_pushes_total", "counter",
           "GPU inventory (and capacity) pushes the scheduler accepted.",
           input.plugin.capacity_pushes);
}

}  // namespace nvshare::deviceplugin
