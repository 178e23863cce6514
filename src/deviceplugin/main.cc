// nvshare-device-plugin: configuration (knobs.h), the NVML inventory, the kubelet device plugin
// (plugin_server.h) and, when built with src/podwatcher, the pod watcher that turns pod annotations
// into limits in the scheduler. Runs until SIGTERM or SIGINT.
//
// Exit status: 0 after SIGTERM/SIGINT or for --help/--version/--print-config-doc; 1 when it cannot
// start (no NVML, no GPU, the socket cannot be served, the pod watcher cannot start); 2 for a
// configuration error.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <string>

#include "common/exposition.h"
#include "common/gpu_inventory.h"
#include "common/log.h"
#include "common/metrics_endpoint.h"
#include "deviceplugin/knobs.h"
#include "deviceplugin/plugin_metrics.h"
#include "deviceplugin/plugin_server.h"

#ifdef NVSHARE_WITH_PODWATCHER
#include "podwatcher/pod_watcher.h"
#include "podwatcher/watcher_metrics.h"
#endif

namespace {

using namespace nvshare;
using namespace nvshare::deviceplugin;

int run(const PluginConfig& config) {
  // Signals are taken synchronously by this thread; every thread started later inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto inventory = open_nvml_inventory();
  if (!inventory) {
    NVSHARE_ERROR("%s", inventory.error().message.c_str());
    return 1;
  }
#ifdef NVSHARE_WITH_PODWATCHER
  // Declared before the plugin so that it outlives every placement call that reads it.
  std::unique_ptr<podwatcher::PodWatcher> watcher;
#endif
  PluginServer plugin(config, std::move(inventory).value());

#ifdef NVSHARE_WITH_PODWATCHER
  if (config.node_name.empty()) {
    NVSHARE_WARN(
        "no node name (node-name knob or NODE_NAME): pod annotations are not watched, so no "
        "per-pod limits reach the scheduler");
  } else {
    podwatcher::PodWatcherConfig watch;
    watch.node_name = config.node_name;
    watch.kubeconfig_path = config.kubeconfig;
    watch.control_socket = config.control_socket;
    watch.resource_name = config.resource_name;
    watch.watch_timeout = std::chrono::duration_cast<std::chrono::seconds>(config.watch_timeout);
    watcher = std::make_unique<podwatcher::PodWatcher>(watch);
    // Placement weighs GPUs by the memory limits of the pods on them, read live from the watcher
    // by "namespace/name" (pod-resources names pods that way, without UIDs).
    plugin.set_memory_limits_source(
        [&source = *watcher] { return source.memory_limits_by_pod_name(); });
    // Each container's settings file gets its pod's memory limit from the watcher too.
    plugin.set_pod_limits_lookup(
        [&source = *watcher](const std::string& key) -> std::optional<KnownPodLimits> {
          const std::optional<podwatcher::PodLimits> limits = source.limits_for_pod_name(key);
          if (!limits) return std::nullopt;
          return KnownPodLimits{limits->memory_bytes};
        });
    if (Status s = watcher->start(); !s) {
      NVSHARE_ERROR("pod watcher: %s", s.error().message.c_str());
      return 1;
    }
    NVSHARE_INFO("watching the pods of node %s", config.node_name.c_str());
  }
#else
  NVSHARE_INFO("built without the pod watcher: pod annotations are not watched");
#endif

  if (Status s = plugin.start(); !s) {
    NVSHARE_ERROR("%s", s.error().message.c_str());
    return 1;
  }

  // Declared after the plugin and the watcher: stopped first, so no scrape reads them gone.
  std::unique_ptr<MetricsEndpoint> metrics;
  if (!config.metrics_address.empty()) {
    const double started = static_cast<double>(std::time(nullptr));
    // Runs on the endpoint's thread for as long as `metrics` lives: what it reads by reference
    // (the configuration, the plugin, the watcher) outlives it; the start time is its own copy.
    auto render = [&, started]() -> Result<std::string> {
      PluginMetricsInput input;
      input.resource_name = config.resource_name;
      input.gpus = plugin.gpus();
      input.plugin = plugin.stats();
      input.start_time_s = started;
      input.version = NVSHARE_VERSION;
      Exposition exposition;
      render_plugin_metrics(input, exposition);
#ifdef NVSHARE_WITH_PODWATCHER
      if (watcher) podwatcher::render_watcher_metrics(watcher->stats(), exposition);
#endif
      return exposition.take();
    };
    auto started_endpoint =
        MetricsEndpoint::start(config.metrics_address, "nvshare-device-plugin", render);
    if (!started_endpoint) {
      NVSHARE_ERROR("%s", started_endpoint.error().message.c_str());
      return 1;
    }
    metrics = std::move(started_endpoint).value();
    NVSHARE_INFO("metrics at http://%s/metrics", metrics->address().c_str());
  }

  int received = 0;
  while (sigwait(&signals, &received) != 0) {
  }
  NVSHARE_INFO("signal %d: stopping", received);
  metrics.reset();
  plugin.stop();
#ifdef NVSHARE_WITH_PODWATCHER
  if (watcher) watcher->stop();
#endif
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  log_init("nvshare-device-plugin");
  auto parsed = parse_command_line(argc, argv, [](const char* name) { return std::getenv(name); });
  if (!parsed) {
    std::fprintf(stderr, "nvshare-device-plugin: %s\n", parsed.error().message.c_str());
    return 2;
  }
  const CommandLine& command_line = parsed.value();
  if (command_line.help) {
    std::fputs(help_text("nvshare-device-plugin").c_str(), stdout);
    return 0;
  }
  if (command_line.version) {
    std::printf("nvshare-device-plugin %s (kubelet device plugin API %s)\n", NVSHARE_VERSION,
                kDevicePluginApiVersion);
    return 0;
  }
  if (command_line.print_config_doc) {
    std::fputs(config_doc_table().c_str(), stdout);
    return 0;
  }
  if (command_line.print_knobs) {
    std::fputs(knobs_json().c_str(), stdout);
    return 0;
  }
  log_set_level(command_line.config.log_level);
  return run(command_line.config);
}
