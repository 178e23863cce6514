// The device plugin's pure parts: the knob table, placement and Allocate's response.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cdi_validator.h"
#include "deviceplugin/allocate.h"
#include "deviceplugin/cdi_spec.h"
#include "deviceplugin/container_settings.h"
#include "deviceplugin/knobs.h"
#include "deviceplugin/placement.h"

namespace nvshare::deviceplugin {
namespace {

using Env = std::map<std::string, std::string>;

Result<CommandLine> parse(std::vector<std::string> args, Env env = {}) {
  args.insert(args.begin(), "nvshare-device-plugin");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data(),
                            [env](const char* name) -> const char* {
                              auto it = env.find(name);
                              return it == env.end() ? nullptr : it->second.c_str();
                            });
}

std::string error_of(std::vector<std::string> args, Env env = {}) {
  auto parsed = parse(std::move(args), std::move(env));
  return parsed ? std::string("(parsed)") : parsed.error().message;
}

// ---- knobs --------------------------------------------------------------------------------------

TEST(PluginKnobs, EveryDefaultParses) {
  for (const Knob& knob : knobs()) {
    PluginConfig config;
    EXPECT_TRUE(apply_knob(knob, knob.default_value, config)) << knob.name;
  }
}

TEST(PluginKnobs, DefaultsAreTheAgreedOnes) {
  const PluginConfig c = default_config();
  EXPECT_EQ(c.resource_name, "nvshare.com/gpu");
  EXPECT_EQ(c.slots_per_gpu, 10);
  EXPECT_FALSE(c.fail_requests_greater_than_one);
  EXPECT_TRUE(c.gpus.all);
  EXPECT_TRUE(c.memory_capacity.empty());
  EXPECT_EQ(c.kubelet_socket(), "/var/lib/kubelet/device-plugins/kubelet.sock");
  EXPECT_EQ(c.plugin_socket(), "/var/lib/kubelet/device-plugins/nvshare.sock");
  EXPECT_EQ(c.pod_resources_socket, "/var/lib/kubelet/pod-resources/kubelet.sock");
  EXPECT_EQ(c.library_host_path, "/var/lib/nvshare/lib/libnvshare.so");
  EXPECT_EQ(c.library_container_path, "/usr/lib/nvshare/libnvshare.so");
  EXPECT_EQ(c.injection, Injection::kLdPreload);
  EXPECT_TRUE(c.device_list.cdi_cri);
  EXPECT_FALSE(c.device_list.envvar);
  EXPECT_FALSE(c.device_list.volume_mounts);
  EXPECT_EQ(c.cdi_gpu_kind, "nvidia.com/gpu");
  EXPECT_EQ(c.cdi_spec_dir, "/var/run/cdi");
  EXPECT_TRUE(c.cdi_edits);
  EXPECT_TRUE(c.edits_through_cdi());
  EXPECT_EQ(c.ld_so_preload_host_path, "/var/lib/nvshare/preload/ld.so.preload");
  EXPECT_EQ(c.socket_dir, "/var/run/nvshare");
  EXPECT_EQ(c.control_socket, "/var/run/nvshare-control/control.sock");
  EXPECT_EQ(c.node_name, "");
  EXPECT_EQ(c.kubeconfig, "");
  EXPECT_EQ(c.health_interval, std::chrono::seconds(5));
  EXPECT_EQ(c.watch_timeout, std::chrono::seconds(300));
  EXPECT_EQ(c.log_level, LogLevel::kInfo);
}

TEST(PluginKnobs, NamesOfFlagEnvironmentAndHelmValue) {
  const Knob* knob = find_knob("ld-so-preload-host-path");
  ASSERT_NE(knob, nullptr);
  EXPECT_EQ(flag_name(*knob), "--ld-so-preload-host-path");
  EXPECT_EQ(env_name(*knob), "NVSHARE_PLUGIN_LD_SO_PRELOAD_HOST_PATH");
  EXPECT_EQ(helm_value(*knob), "devicePlugin.ldSoPreloadHostPath");
  EXPECT_EQ(helm_value(*find_knob("slots-per-gpu")), "devicePlugin.slotsPerGpu");
  EXPECT_EQ(helm_value(*find_knob("fail-requests-greater-than-one")),
            "devicePlugin.failRequestsGreaterThanOne");
  EXPECT_EQ(helm_value(*find_knob("device-list-strategy")), "devicePlugin.deviceListStrategy");
  EXPECT_EQ(helm_value(*find_knob("metrics-address")), "devicePlugin.metricsAddress");
  EXPECT_EQ(knobs().size(), 25u);
}

TEST(PluginKnobs, MetricsAddressIsHostPortOrEmpty) {
  auto parsed = parse({}, {{"NVSHARE_PLUGIN_METRICS_ADDRESS", ":9403"}});
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed.value().config.metrics_address, ":9403");
  auto none = parse({}, {});
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_EQ(none.value().config.metrics_address, "");  // no endpoint by default
  for (const char* bad : {"9403", "host:", "host:70000", "[::1]:http"}) {
    EXPECT_FALSE(parse({"--metrics-address", bad}, {})) << bad;
  }
}

TEST(PluginKnobs, FlagsWinOverEnvironmentWhichWinsOverDefaults) {
  auto parsed = parse({"--slots-per-gpu", "4", "--injection=ld-so-preload"},
                      {{"NVSHARE_PLUGIN_SLOTS_PER_GPU", "7"},
                       {"NVSHARE_PLUGIN_RESOURCE_NAME", "example.com/shared-gpu"},
                       {"NVSHARE_PLUGIN_HEALTH_INTERVAL", ""}});
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed.value().config.slots_per_gpu, 4);
  EXPECT_EQ(parsed.value().config.resource_name, "example.com/shared-gpu");
  EXPECT_EQ(parsed.value().config.injection, Injection::kLdSoPreload);
  EXPECT_EQ(parsed.value().config.health_interval, std::chrono::seconds(5));  // empty = unset
}

TEST(PluginKnobs, NodeNameFallsBackToDownwardApi) {
  auto parsed = parse({}, {{"NODE_NAME", "node-a"}});
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed.value().config.node_name, "node-a");
  parsed = parse({"--node-name", "node-b"}, {{"NODE_NAME", "node-a"}});
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed.value().config.node_name, "node-b");
}

TEST(PluginKnobs, DurationsAcceptSecondsWithOrWithoutUnit) {
  auto parsed = parse({"--health-interval", "0.5", "--watch-timeout=60"});
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed.value().config.health_interval, std::chrono::milliseconds(500));
  EXPECT_EQ(parsed.value().config.watch_timeout, std::chrono::seconds(60));
  parsed = parse({"--health-interval", "2s", "--watch-timeout=30s"});
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed.value().config.health_interval, std::chrono::seconds(2));
  EXPECT_EQ(parsed.value().config.watch_timeout, std::chrono::seconds(30));
}

TEST(PluginKnobs, GpuSelection) {
  auto parsed = parse({"--gpus", "GPU-aaa,1"});
  ASSERT_TRUE(parsed) << parsed.error().message;
  const GpuSelection& gpus = parsed.value().config.gpus;
  EXPECT_FALSE(gpus.all);
  EXPECT_TRUE(gpus.selects("GPU-aaa", 5));
  EXPECT_TRUE(gpus.selects("GPU-bbb", 1));
  EXPECT_FALSE(gpus.selects("GPU-bbb", 0));
}

TEST(PluginKnobs, MemoryCapacityQuantitiesFactorsAndPerGpu) {
  auto parsed = parse({"--memory-capacity", "1.5x,GPU-aaa=16Gi,1=2x"});
  ASSERT_TRUE(parsed) << parsed.error().message;
  const MemoryCapacitySpec& spec = parsed.value().config.memory_capacity;
  const std::uint64_t gi = 1ull << 30;
  EXPECT_EQ(spec.for_gpu("GPU-aaa", 0, 80 * gi), 16 * gi);
  EXPECT_EQ(spec.for_gpu("GPU-bbb", 1, 80 * gi), 160 * gi);
  EXPECT_EQ(spec.for_gpu("GPU-ccc", 2, 80 * gi), 120 * gi);
  EXPECT_EQ(MemoryCapacitySpec{}.for_gpu("GPU-ccc", 2, 80 * gi), 80 * gi);
  parsed = parse({"--memory-capacity", "80Gi"});
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed.value().config.memory_capacity.for_gpu("GPU-x", 0, 1), 80 * gi);
}

TEST(PluginKnobs, DeviceListStrategyIsASetOfKnownStrategies) {
  auto parsed = parse({"--device-list-strategy", "envvar,cdi-cri"}, {});
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_TRUE(parsed.value().config.device_list.cdi_cri);
  EXPECT_TRUE(parsed.value().config.device_list.envvar);
  EXPECT_FALSE(parsed.value().config.device_list.volume_mounts);
  parsed = parse({"--device-list-strategy", "volume-mounts"}, {});
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_FALSE(parsed.value().config.device_list.cdi_cri);
  EXPECT_FALSE(parsed.value().config.edits_through_cdi());
  EXPECT_NE(error_of({"--device-list-strategy", ""}).find("name at least one"), std::string::npos);
  EXPECT_NE(error_of({"--device-list-strategy", "cdi-annotations"})
                .find("\"cdi-annotations\" is not one of cdi-cri, envvar, volume-mounts"),
            std::string::npos);
  EXPECT_NE(error_of({"--device-list-strategy", "envvar,envvar"}).find("named twice"),
            std::string::npos);
  EXPECT_NE(error_of({"--device-list-strategy", "envvar,volume-mounts"}).find("name one of them"),
            std::string::npos);
  EXPECT_NE(error_of({"--cdi-gpu-kind", "nvidia.com"}).find("not a CDI kind"), std::string::npos);
  EXPECT_NE(error_of({"--cdi-gpu-kind", "nvidia.com/gpu/0"}).find("holds '/'"), std::string::npos);
  EXPECT_NE(error_of({"--cdi-gpu-kind", "-x.com/gpu"}).find("must start with a letter"),
            std::string::npos);
  EXPECT_NE(error_of({"--cdi-spec-dir", "cdi"}).find("not an absolute path"), std::string::npos);
  EXPECT_NE(error_of({"--cdi-edits", "yes please"}).find("flag --cdi-edits"), std::string::npos);
}

TEST(PluginKnobs, ErrorsNameTheKnobTheSourceAndWhatIsAccepted) {
  EXPECT_EQ(error_of({"--slots-per-gpu", "0"}), "flag --slots-per-gpu: 0 is outside 1..1000");
  EXPECT_EQ(error_of({"--slots-per-gpu=1001"}), "flag --slots-per-gpu: 1001 is outside 1..1000");
  EXPECT_EQ(error_of({}, {{"NVSHARE_PLUGIN_SLOTS_PER_GPU", "ten"}}),
            "environment variable NVSHARE_PLUGIN_SLOTS_PER_GPU: \"ten\" is not an integer");
  EXPECT_EQ(error_of({"--injection", "preload"}),
            "flag --injection: \"preload\" is not one of ld-preload, ld-so-preload");
  EXPECT_EQ(error_of({"--no-such-knob", "1"}), "unknown flag --no-such-knob (see --help)");
  EXPECT_EQ(error_of({"--slots-per-gpu"}), "flag --slots-per-gpu needs a value (see --help)");
  EXPECT_EQ(error_of({"stray"}), "unexpected argument \"stray\" (see --help)");
  EXPECT_NE(error_of({"--resource-name", "gpu"}).find("<domain>/<name>"), std::string::npos);
  EXPECT_NE(error_of({"--resource-name", "kubernetes.io/gpu"}).find("reserved"), std::string::npos);
  EXPECT_NE(error_of({"--resource-name", "nvshare.com/-gpu"}).find("start and end"),
            std::string::npos);
  EXPECT_NE(error_of({"--gpus", ""}).find("use `all`"), std::string::npos);
  EXPECT_NE(error_of({"--gpus", "GPU-a,,1"}).find("empty item"), std::string::npos);
  EXPECT_NE(error_of({"--gpus", "tesla"}).find("neither a GPU index nor a GPU UUID"),
            std::string::npos);
  EXPECT_NE(error_of({"--gpus", "1,1"}).find("given twice"), std::string::npos);
  EXPECT_NE(error_of({"--memory-capacity", "16GB"}).find("flag --memory-capacity: "),
            std::string::npos);
  EXPECT_NE(error_of({"--memory-capacity", "0"}).find("is zero"), std::string::npos);
  EXPECT_NE(error_of({"--memory-capacity", "0x"}).find("outside 0.01..1000"), std::string::npos);
  EXPECT_NE(error_of({"--memory-capacity", "1Gi,2Gi"}).find("given twice"), std::string::npos);
  EXPECT_NE(error_of({"--memory-capacity", "=1Gi"}).find("names no GPU"), std::string::npos);
  EXPECT_NE(error_of({"--kubelet-dir", "relative/dir"}).find("not an absolute path"),
            std::string::npos);
  EXPECT_NE(error_of({"--kubelet-dir", "/" + std::string(100, 'd')}).find("unix socket path"),
            std::string::npos);
  EXPECT_NE(error_of({"--health-interval", "0"}).find("outside 0.1..3600"), std::string::npos);
  EXPECT_NE(error_of({"--health-interval", "5m"}).find("not a decimal number"), std::string::npos);
  EXPECT_NE(error_of({"--watch-timeout", "1.5"}).find("not an integer"), std::string::npos);
  EXPECT_NE(error_of({"--log-level", "loud"}).find("error, warn, info, debug, trace"),
            std::string::npos);
}

// socket-dir is mounted into every GPU container and the control socket admits root: a layout
// that puts the control socket there is reported, however it is spelled (and still parses, with a
// warning: outside a cluster nothing mounts socket-dir).
TEST(PluginKnobs, AControlSocketInTheSocketDirectoryIsReported) {
  const auto layout_error = [](Env env) {
    auto parsed = parse({}, std::move(env));
    if (!parsed) return "(not parsed) " + parsed.error().message;
    Status s = check_socket_layout(parsed.value().config);
    return s ? std::string("(ok)") : s.error().message;
  };
  EXPECT_EQ(layout_error({}), "(ok)");  // the defaults keep them apart
  for (const std::string& control :
       {"/var/run/nvshare/control.sock", "/var/run/nvshare/sub/control.sock",
        "/var/run/nvshare-control/../nvshare/control.sock", "/var/run//nvshare/./control.sock"}) {
    const std::string error = layout_error({{"NVSHARE_PLUGIN_CONTROL_SOCKET", control}});
    EXPECT_NE(error.find("control-socket " + control + " lies in socket-dir /var/run/nvshare"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("default /var/run/nvshare-control/control.sock"), std::string::npos);
  }
  EXPECT_NE(layout_error({{"NVSHARE_PLUGIN_SOCKET_DIR", "/run/gpu/"},
                          {"NVSHARE_PLUGIN_CONTROL_SOCKET", "/run/gpu/control.sock"}})
                .find("lies in socket-dir"),
            std::string::npos);
  // A sibling whose name merely starts like the socket directory is another directory.
  EXPECT_EQ(layout_error({{"NVSHARE_PLUGIN_CONTROL_SOCKET", "/var/run/nvshare2/control.sock"}}),
            "(ok)");
  EXPECT_EQ(layout_error({{"NVSHARE_PLUGIN_SOCKET_DIR", "/run/a"},
                          {"NVSHARE_PLUGIN_CONTROL_SOCKET", "/run/control.sock"}}),
            "(ok)");
}

TEST(PluginKnobs, HelpListsEveryKnob) {
  const std::string help = help_text("nvshare-device-plugin");
  for (const Knob& knob : knobs()) {
    EXPECT_NE(help.find(flag_name(knob) + " VALUE"), std::string::npos) << knob.name;
    EXPECT_NE(help.find(env_name(knob)), std::string::npos) << knob.name;
  }
}

TEST(PluginKnobs, ConfigurationDocumentIsCurrent) {
  std::ifstream in(NVSHARE_CONFIGURATION_DOC);
  ASSERT_TRUE(in.good()) << "cannot read " << NVSHARE_CONFIGURATION_DOC;
  std::stringstream text;
  text << in.rdbuf();
  const std::string table = config_doc_table();
  EXPECT_NE(text.str().find(table), std::string::npos)
      << "docs/configuration.md is out of date; regenerate its device plugin table with "
         "`nvshare-device-plugin --print-config-doc`:\n"
      << table;
}

// ---- placement ----------------------------------------------------------------------------------

constexpr std::uint64_t kGi = 1ull << 30;

std::vector<ManagedGpu> two_gpus(int slots = 4) {
  return {ManagedGpu{"GPU-a", 0, 16 * kGi, slots, true},
          ManagedGpu{"GPU-b", 1, 16 * kGi, slots, true}};
}

std::vector<std::string> all_ids(const std::vector<ManagedGpu>& gpus) {
  std::vector<std::string> ids;
  for (const ManagedGpu& gpu : gpus) {
    for (int slot = 0; slot < gpu.slots; ++slot) ids.push_back(make_device_id(gpu.uuid, slot));
  }
  return ids;
}

std::vector<std::string> without(std::vector<std::string> ids,
                                 const std::vector<std::string>& used) {
  std::erase_if(ids, [&](const std::string& id) {
    return std::find(used.begin(), used.end(), id) != used.end();
  });
  return ids;
}

std::string gpu_of(const std::string& id) { return parse_device_id(id)->gpu_uuid; }

TEST(Placement, DeviceIdsRoundTrip) {
  EXPECT_EQ(make_device_id("GPU-a", 7), "GPU-a__7");
  auto parsed = parse_device_id("GPU-1234-abcd__12");
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->gpu_uuid, "GPU-1234-abcd");
  EXPECT_EQ(parsed->slot, 12);
  for (const char* bad : {"GPU-a", "GPU-a__", "__3", "GPU-a__x", "GPU-a__-1", "GPU-a__01"}) {
    EXPECT_FALSE(parse_device_id(bad)) << bad;
  }
}

// Pods arrive one at a time; each lands on the GPU with fewer live pods.
TEST(Placement, SinglePodsSpreadTwoAndTwoThenRefillTheEmptiedGpu) {
  const auto gpus = two_gpus();
  std::vector<LivePod> pods;
  std::vector<std::string> used;
  for (int i = 0; i < 4; ++i) {
    const auto available = without(all_ids(gpus), used);
    const auto load = compute_load(gpus, pods, {}, available);
    auto chosen = preferred_devices(gpus, load, {available, {}, 1});
    ASSERT_TRUE(chosen) << chosen.error().message;
    ASSERT_EQ(chosen.value().size(), 1u);
    pods.push_back(LivePod{"default/p" + std::to_string(i), chosen.value(), {chosen.value()}});
    used.push_back(chosen.value()[0]);
  }
  std::map<std::string, int> per_gpu;
  for (const LivePod& pod : pods) ++per_gpu[gpu_of(pod.device_ids[0])];
  EXPECT_EQ(per_gpu["GPU-a"], 2);
  EXPECT_EQ(per_gpu["GPU-b"], 2);

  // Both pods on GPU-a end: the kubelet lists them no more and offers their slots again.
  std::vector<LivePod> remaining;
  for (const LivePod& pod : pods) {
    if (gpu_of(pod.device_ids[0]) == "GPU-b") remaining.push_back(pod);
  }
  used.clear();
  for (const LivePod& pod : remaining) used.push_back(pod.device_ids[0]);
  const auto available = without(all_ids(gpus), used);
  auto chosen =
      preferred_devices(gpus, compute_load(gpus, remaining, {}, available), {available, {}, 1});
  ASSERT_TRUE(chosen);
  EXPECT_EQ(gpu_of(chosen.value()[0]), "GPU-a");
}

TEST(Placement, MultiSlotRequestSpreadsOverDistinctGpus) {
  std::vector<ManagedGpu> gpus = two_gpus();
  gpus.push_back(ManagedGpu{"GPU-c", 2, 16 * kGi, 4, true});
  const auto available = all_ids(gpus);
  auto chosen = preferred_devices(gpus, compute_load(gpus, {}, {}, available), {available, {}, 3});
  ASSERT_TRUE(chosen);
  std::set<std::string> distinct;
  for (const std::string& id : chosen.value()) distinct.insert(gpu_of(id));
  EXPECT_EQ(distinct.size(), 3u);

  // More slots than GPUs: a slot count is a GPU count, so there is no placement.
  chosen = preferred_devices(gpus, compute_load(gpus, {}, {}, available), {available, {}, 5});
  ASSERT_FALSE(chosen);
  EXPECT_NE(chosen.error().message.find("only 3 of 5"), std::string::npos)
      << chosen.error().message;
  EXPECT_NE(chosen.error().message.find("distinct GPUs"), std::string::npos);

  // Every GPU but one is full: two slots cannot be placed, whatever slots that GPU has free.
  const std::vector<std::string> one_gpu_free = {"GPU-c__0", "GPU-c__1", "GPU-c__2"};
  EXPECT_FALSE(
      preferred_devices(gpus, compute_load(gpus, {}, {}, one_gpu_free), {one_gpu_free, {}, 2}));
  // Must-include devices on one GPU are refused too.
  EXPECT_FALSE(preferred_devices(gpus, compute_load(gpus, {}, {}, available),
                                 {available, {"GPU-a__0", "GPU-a__1"}, 2}));
}

TEST(Placement, MustIncludeComesFirstAndCountsForSpreading) {
  const auto gpus = two_gpus();
  const auto available = all_ids(gpus);
  auto chosen =
      preferred_devices(gpus, compute_load(gpus, {}, {}, available), {available, {"GPU-b__3"}, 2});
  ASSERT_TRUE(chosen);
  ASSERT_EQ(chosen.value().size(), 2u);
  EXPECT_EQ(chosen.value()[0], "GPU-b__3");
  EXPECT_EQ(gpu_of(chosen.value()[1]), "GPU-a");
}

TEST(Placement, MemoryHeldBreaksTiesBetweenEquallyBusyGpus) {
  const auto gpus = two_gpus();
  const std::vector<LivePod> pods = {{"ns/big", {"GPU-a__0"}, {}}, {"ns/small", {"GPU-b__0"}, {}}};
  const std::map<std::string, std::uint64_t> limits = {{"ns/big", 12 * kGi}, {"ns/small", 2 * kGi}};
  const auto available = without(all_ids(gpus), {"GPU-a__0", "GPU-b__0"});
  const auto load = compute_load(gpus, pods, limits, available);
  EXPECT_EQ(load.at("GPU-a").pods, 1);
  EXPECT_EQ(load.at("GPU-a").memory_held, 12 * kGi);
  auto chosen = preferred_devices(gpus, load, {available, {}, 1});
  ASSERT_TRUE(chosen);
  EXPECT_EQ(gpu_of(chosen.value()[0]), "GPU-b");
}

TEST(Placement, SlotsAllocatedButNotYetListedCountAsPods) {
  const auto gpus = two_gpus();
  // GPU-a__0 was just allocated: not available, not in the pod list yet.
  const auto available = without(all_ids(gpus), {"GPU-a__0"});
  const auto load = compute_load(gpus, {}, {}, available);
  EXPECT_EQ(load.at("GPU-a").pods, 1);
  EXPECT_EQ(load.at("GPU-b").pods, 0);
  auto chosen = preferred_devices(gpus, load, {available, {}, 1});
  ASSERT_TRUE(chosen);
  EXPECT_EQ(gpu_of(chosen.value()[0]), "GPU-b");
}

TEST(Placement, APodCountsOncePerGpuAndForeignDevicesAreIgnored) {
  const auto gpus = two_gpus();
  const std::vector<LivePod> pods = {{"ns/two-slots", {"GPU-a__0", "GPU-a__1", "GPU-b__0"}, {}},
                                     {"ns/other", {"GPU-zzz__0", "not-a-device"}, {}}};
  const auto load = compute_load(gpus, pods, {}, std::nullopt);
  EXPECT_EQ(load.at("GPU-a").pods, 1);
  EXPECT_EQ(load.at("GPU-b").pods, 1);
  EXPECT_EQ(load.size(), 2u);
}

TEST(Placement, RejectsImpossibleRequests) {
  const auto gpus = two_gpus(1);
  const auto available = all_ids(gpus);
  const auto load = compute_load(gpus, {}, {}, available);
  EXPECT_FALSE(preferred_devices(gpus, load, {available, {}, 0}));
  EXPECT_FALSE(preferred_devices(gpus, load, {available, {"GPU-a__0", "GPU-b__0"}, 1}));
  auto chosen = preferred_devices(gpus, load, {available, {}, 3});
  ASSERT_FALSE(chosen);
  EXPECT_NE(chosen.error().message.find("only 2 of 3"), std::string::npos);
  // Unknown IDs in the available list are never chosen.
  EXPECT_FALSE(preferred_devices(gpus, load, {{"GPU-zzz__0", "GPU-a__9"}, {}, 1}));
}

// ---- Allocate ---------------------------------------------------------------------------------

// Edits in the response (envvar): the library, the socket and the injection as mounts and
// variables.
PluginConfig allocate_config(Injection injection) {
  PluginConfig config = default_config();
  config.device_list = DeviceListStrategy{false, true, false};
  config.injection = injection;
  config.library_host_path = "/host/lib/libnvshare.so";
  config.library_container_path = "/usr/lib/nvshare/libnvshare.so";
  config.ld_so_preload_host_path = "/host/ld.so.preload";
  config.socket_dir = "/run/nvshare";
  return config;
}

std::map<std::string, std::pair<std::string, bool>> mounts_of(
    const v1beta1::ContainerAllocateResponse& response) {
  std::map<std::string, std::pair<std::string, bool>> mounts;  // container path -> host, ro
  for (const auto& mount : response.mounts()) {
    mounts[mount.container_path()] = {mount.host_path(), mount.read_only()};
  }
  return mounts;
}

TEST(Allocate, LdPreloadMode) {
  const auto gpus = two_gpus();
  auto response =
      container_allocation(allocate_config(Injection::kLdPreload), gpus, {"GPU-b__1", "GPU-a__0"});
  ASSERT_TRUE(response) << response.error().message;
  const auto& envs = response.value().envs();
  EXPECT_EQ(envs.at("NVIDIA_VISIBLE_DEVICES"), "GPU-b,GPU-a");
  EXPECT_EQ(envs.at("LD_PRELOAD"), "/usr/lib/nvshare/libnvshare.so");
  EXPECT_EQ(envs.at("NVSHARE_SOCKET"), "/run/nvshare/scheduler.sock");
  EXPECT_EQ(envs.size(), 3u);
  const auto mounts = mounts_of(response.value());
  EXPECT_EQ(mounts.size(), 2u);
  EXPECT_EQ(mounts.at("/usr/lib/nvshare/libnvshare.so"),
            std::make_pair(std::string("/host/lib/libnvshare.so"), true));
  // Read-only: connecting to scheduler.sock needs no write access, and a writable mount would let
  // a container replace the socket for every other pod on the node.
  EXPECT_EQ(mounts.at("/run/nvshare"), std::make_pair(std::string("/run/nvshare"), true));
}

TEST(Allocate, LdSoPreloadMode) {
  const auto gpus = two_gpus();
  auto response =
      container_allocation(allocate_config(Injection::kLdSoPreload), gpus, {"GPU-a__3"});
  ASSERT_TRUE(response) << response.error().message;
  const auto& envs = response.value().envs();
  EXPECT_EQ(envs.at("NVIDIA_VISIBLE_DEVICES"), "GPU-a");
  EXPECT_EQ(envs.count("LD_PRELOAD"), 0u);
  EXPECT_EQ(envs.at("NVSHARE_SOCKET"), "/run/nvshare/scheduler.sock");
  const auto mounts = mounts_of(response.value());
  EXPECT_EQ(mounts.size(), 3u);
  EXPECT_EQ(mounts.at("/run/nvshare"), std::make_pair(std::string("/run/nvshare"), true));
  EXPECT_EQ(mounts.at("/etc/ld.so.preload"),
            std::make_pair(std::string("/host/ld.so.preload"), true));
  EXPECT_EQ(mounts.at("/usr/lib/nvshare/libnvshare.so"),
            std::make_pair(std::string("/host/lib/libnvshare.so"), true));
}

// cdi-cri (the default): GPUs and nvshare's edits are CDI device names; the runtime applies the
// specs, so the response carries no mount and no variable.
TEST(Allocate, CdiCriNamesTheGpusAndNvsharesDevices) {
  PluginConfig config = allocate_config(Injection::kLdPreload);
  config.device_list = DeviceListStrategy{};
  auto response =
      container_allocation(config, two_gpus(), {"GPU-b__1", "GPU-a__0"}, "/host/containers/00ab");
  ASSERT_TRUE(response) << response.error().message;
  std::vector<std::string> names;
  for (const auto& device : response.value().cdi_devices()) names.push_back(device.name());
  EXPECT_EQ(names,
            (std::vector<std::string>{"nvidia.com/gpu=GPU-b", "nvidia.com/gpu=GPU-a",
                                      "nvshare.com/gpu=client", "nvshare.com/gpu=container-00ab"}));
  EXPECT_TRUE(response.value().envs().empty());
  EXPECT_EQ(response.value().mounts_size(), 0);
  EXPECT_EQ(allocated_gpus(response.value()), "nvidia.com/gpu=GPU-b,nvidia.com/gpu=GPU-a");

  // cdi-edits false: GPUs by CDI, nvshare's edits in the response; a custom GPU kind.
  config.cdi_edits = false;
  config.cdi_gpu_kind = "example.com/accelerator";
  response = container_allocation(config, two_gpus(), {"GPU-a__2"}, "/host/containers/00ab");
  ASSERT_TRUE(response) << response.error().message;
  ASSERT_EQ(response.value().cdi_devices_size(), 1);
  EXPECT_EQ(response.value().cdi_devices(0).name(), "example.com/accelerator=GPU-a");
  EXPECT_EQ(response.value().envs().count("NVIDIA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(response.value().envs().at("LD_PRELOAD"), "/usr/lib/nvshare/libnvshare.so");
  EXPECT_EQ(mounts_of(response.value()).at("/etc/nvshare"),
            std::make_pair(std::string("/host/containers/00ab"), true));
}

// volume-mounts: NVIDIA_VISIBLE_DEVICES points at a directory of /dev/null mounts named by UUID.
TEST(Allocate, VolumeMountsNameTheGpusByMountedPaths) {
  PluginConfig config = allocate_config(Injection::kLdPreload);
  config.device_list = DeviceListStrategy{false, false, true};
  auto response = container_allocation(config, two_gpus(), {"GPU-a__0", "GPU-b__3"});
  ASSERT_TRUE(response) << response.error().message;
  EXPECT_EQ(response.value().envs().at("NVIDIA_VISIBLE_DEVICES"),
            "/var/run/nvidia-container-devices");
  const auto mounts = mounts_of(response.value());
  EXPECT_EQ(mounts.at("/var/run/nvidia-container-devices/GPU-a"),
            std::make_pair(std::string("/dev/null"), true));
  EXPECT_EQ(mounts.at("/var/run/nvidia-container-devices/GPU-b"),
            std::make_pair(std::string("/dev/null"), true));
  EXPECT_EQ(response.value().cdi_devices_size(), 0);
  EXPECT_EQ(allocated_gpus(response.value()), "GPU-a,GPU-b");
}

// The specs the plugin writes hold to the CDI specification (cdi_validator.h), in both injection
// modes, with the version their features need.
TEST(CdiSpec, SpecsValidateAgainstTheCdiSpecification) {
  for (Injection injection : {Injection::kLdPreload, Injection::kLdSoPreload}) {
    const PluginConfig config = allocate_config(injection);
    const std::string client = cdi_spec_text(kCdiClientDevice, client_edits(config));
    auto parsed = nvshare::testing::validate_cdi_spec(client);
    ASSERT_TRUE(parsed) << parsed.error().message << "\n" << client;
    EXPECT_EQ(*parsed.value().find("kind")->as_string(), "nvshare.com/gpu");
    EXPECT_EQ(*parsed.value().find("cdiVersion")->as_string(), kCdiVersion);
    EXPECT_EQ(nvshare::testing::minimum_cdi_version(parsed.value()), "0.3.0");
  }
  const std::string id = "0000019a2b3c0001";
  const std::string text =
      cdi_spec_text(container_cdi_device(id), settings_edits("/var/lib/nvshare/containers/" + id));
  auto parsed = nvshare::testing::validate_cdi_spec(text);
  ASSERT_TRUE(parsed) << parsed.error().message << "\n" << text;
  EXPECT_EQ(*(*parsed.value().find("devices")->as_array())[0].find("name")->as_string(),
            "container-" + id);
  EXPECT_TRUE(check_cdi_kind(kCdiKind));
  EXPECT_EQ(container_cdi_spec_path("/var/run/cdi", id),
            "/var/run/cdi/nvshare.com-gpu_container-" + id + ".json");
}

// The validator itself refuses what the specification refuses.
TEST(CdiSpec, TheValidatorRefusesWhatTheSpecificationRefuses) {
  using nvshare::testing::validate_cdi_spec;
  const auto refused = [](const std::string& text, const std::string& why) {
    auto parsed = validate_cdi_spec(text);
    if (parsed) return ::testing::AssertionFailure() << "accepted: " << text;
    if (parsed.error().message.find(why) == std::string::npos) {
      return ::testing::AssertionFailure() << parsed.error().message << " (wanted " << why << ")";
    }
    return ::testing::AssertionSuccess();
  };
  const std::string edits = R"("containerEdits":{"env":["A=1"]})";
  const auto spec = [&](const std::string& version, const std::string& kind,
                        const std::string& devices) {
    return R"({"cdiVersion":")" + version + R"(","kind":")" + kind + R"(","devices":[)" + devices +
           "]}";
  };
  const std::string device = R"({"name":"gpu0",)" + edits + "}";
  EXPECT_TRUE(validate_cdi_spec(spec("0.5.0", "vendor.com/gpu", device)));
  EXPECT_TRUE(refused(spec("0.9.9", "vendor.com/gpu", device), "invalid version"));
  EXPECT_TRUE(refused(spec("0.5.0", "vendor.com", device), "no vendor"));
  EXPECT_TRUE(refused(spec("0.5.0", "vendor.com/gpu-", device), "end with a letter or digit"));
  EXPECT_TRUE(refused(spec("0.5.0", "vendor.com/gpu", ""), "no devices"));
  EXPECT_TRUE(refused(spec("0.5.0", "vendor.com/gpu", device + "," + device), "defined twice"));
  EXPECT_TRUE(refused(spec("0.5.0", "vendor.com/gpu", R"({"name":"a/b",)" + edits + "}"),
                      "invalid character"));
  EXPECT_TRUE(refused(spec("0.5.0", "vendor.com/gpu", R"({"name":"a","containerEdits":{}})"),
                      "empty containerEdits"));
  EXPECT_TRUE(
      refused(spec("0.5.0", "vendor.com/gpu", R"({"name":"a","containerEdits":{"env":["=1"]}})"),
              "invalid environment variable"));
  EXPECT_TRUE(refused(spec("0.5.0", "vendor.com/gpu",
                           R"({"name":"a","containerEdits":{"mounts":[{"hostPath":"/x"}]}})"),
                      "empty container path"));
  EXPECT_TRUE(refused(spec("0.5.0", "vendor.com/gpu",
                           R"({"name":"a","containerEdits":{"deviceNodes":[{"path":"/dev/x",)"
                           R"("permissions":"rx"}]}})"),
                      "invalid permissions"));
  EXPECT_TRUE(refused(spec("0.5.0", "vendor.com/gpu",
                           R"({"name":"a","containerEdits":{"hooks":[{"hookName":"later",)"
                           R"("path":"/x"}]}})"),
                      "invalid hook name"));
  EXPECT_TRUE(refused(spec("0.5.0", "vendor.com/gpu", R"({"name":"a","extra":1,)" + edits + "}"),
                      "unknown field \"extra\""));
  // Version rules: a feature needs the version that brought it.
  EXPECT_TRUE(refused(spec("0.3.0", "vendor.com/gpu", R"({"name":"0gpu",)" + edits + "}"),
                      "at least v0.5.0"));
  EXPECT_TRUE(refused(spec("0.5.0", "vendor.com/gpu.x", device), "at least v0.6.0"));
  EXPECT_TRUE(refused(spec("0.3.0", "vendor.com/gpu",
                           R"({"name":"a","containerEdits":{"mounts":[{"hostPath":"/x",)"
                           R"("containerPath":"/y","type":"bind"}]}})"),
                      "at least v0.4.0"));
  EXPECT_TRUE(refused(
      spec("0.6.0", "vendor.com/gpu", R"({"name":"a","containerEdits":{"additionalGids":[5]}})"),
      "at least v0.7.0"));
}

TEST(CdiSpec, StaleContainerSpecsAreRemovedLiveOnesKept) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("nvshare-cdi-" + std::to_string(::getpid())))
          .string();
  for (const std::string id : {"aaaa", "bbbb"}) {
    ASSERT_TRUE(
        write_cdi_spec(container_cdi_spec_path(dir, id),
                       cdi_spec_text(container_cdi_device(id), settings_edits("/s/" + id))));
  }
  ASSERT_TRUE(write_cdi_spec(client_cdi_spec_path(dir), "{}"));
  std::ofstream(dir + "/nvidia.json") << "{}";
  remove_stale_container_specs(dir, {"bbbb"});
  EXPECT_FALSE(std::filesystem::exists(container_cdi_spec_path(dir, "aaaa")));
  EXPECT_TRUE(std::filesystem::exists(container_cdi_spec_path(dir, "bbbb")));
  EXPECT_TRUE(std::filesystem::exists(client_cdi_spec_path(dir)));
  EXPECT_TRUE(std::filesystem::exists(dir + "/nvidia.json"));
  EXPECT_FALSE(std::filesystem::exists(client_cdi_spec_path(dir) + ".tmp"));
  std::filesystem::remove_all(dir);
}

TEST(Allocate, UnknownIdsAreRejectedByName) {
  const auto gpus = two_gpus();
  const PluginConfig config = allocate_config(Injection::kLdPreload);
  auto response = container_allocation(config, gpus, {"GPU-a__0", "GPU-zzz__0", "GPU-b__4"});
  ASSERT_FALSE(response);
  EXPECT_NE(response.error().message.find("\"GPU-zzz__0\", \"GPU-b__4\""), std::string::npos)
      << response.error().message;
  EXPECT_FALSE(container_allocation(config, gpus, {}));
}

// Two slots of one GPU would give the container one GPU where it asked for two: refused, saying
// how many GPUs the node has.
TEST(Allocate, TwoSlotsOfOneGpuAreRefused) {
  const std::vector<ManagedGpu> one_gpu = {ManagedGpu{"GPU-a", 0, 16 * kGi, 4, true}};
  const PluginConfig config = allocate_config(Injection::kLdPreload);
  auto response = container_allocation(config, one_gpu, {"GPU-a__0", "GPU-a__1"});
  ASSERT_FALSE(response);
  const std::string& message = response.error().message;
  EXPECT_NE(message.find("2 nvshare.com/gpu slots for one container lie on 1 GPU(s)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("this node has 1"), std::string::npos) << message;
  EXPECT_FALSE(check_device_ids(config, one_gpu, {"GPU-a__2", "GPU-a__3"}));
  EXPECT_TRUE(container_allocation(config, one_gpu, {"GPU-a__3"}));
}

TEST(Allocate, FailRequestsGreaterThanOneRefusesEveryMultiSlotRequest) {
  const auto gpus = two_gpus();
  PluginConfig config = allocate_config(Injection::kLdPreload);
  EXPECT_TRUE(container_allocation(config, gpus, {"GPU-a__0", "GPU-b__0"}));
  config.fail_requests_greater_than_one = true;
  auto response = container_allocation(config, gpus, {"GPU-a__0", "GPU-b__0"});
  ASSERT_FALSE(response);
  EXPECT_NE(response.error().message.find("fail-requests-greater-than-one"), std::string::npos)
      << response.error().message;
  EXPECT_TRUE(container_allocation(config, gpus, {"GPU-b__2"}));
}

TEST(Allocate, WritesTheLdSoPreloadFile) {
  char pattern[] = "/tmp/nvshare-dp-unit-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  PluginConfig config = allocate_config(Injection::kLdSoPreload);
  config.ld_so_preload_host_path = std::string(pattern) + "/sub/ld.so.preload";
  ASSERT_TRUE(write_ld_so_preload(config));
  std::ifstream in(config.ld_so_preload_host_path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "/usr/lib/nvshare/libnvshare.so\n");
  std::filesystem::remove_all(pattern);
}

}  // namespace
}  // namespace nvshare::deviceplugin

namespace nvshare::deviceplugin {
namespace {

class ContainerSettingsTest : public ::testing::Test {
 protected:
  ContainerSettingsTest() {
    char tmpl[] = "/tmp/nvshare-settings-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    options_.dir = dir_ + "/containers";
    options_.socket = "/var/run/nvshare/scheduler.sock";
    options_.register_wait = std::chrono::seconds(5);
    options_.unclaimed_after = std::chrono::seconds(600);
    options_.gone_after = std::chrono::seconds(30);
  }
  ~ContainerSettingsTest() override { std::filesystem::remove_all(dir_); }

  static std::string text(const std::string& dir) {
    std::ifstream in(dir + "/client.conf");
    std::stringstream out;
    out << in.rdbuf();
    return out.str();
  }
  static PodLimitsLookup lookup(std::map<std::string, KnownPodLimits> known) {
    return [known](const std::string& key) -> std::optional<KnownPodLimits> {
      auto it = known.find(key);
      return it == known.end() ? std::nullopt : std::optional<KnownPodLimits>(it->second);
    };
  }

  std::string dir_;
  ContainerSettingsOptions options_;
  MonoTime now_{std::chrono::seconds(1000)};
};

TEST_F(ContainerSettingsTest, AContainerIsClaimedByTheDevicesItHolds) {
  ContainerSettings settings(options_);
  ASSERT_TRUE(settings.prepare(now_).ok());
  auto a = settings.create({"GPU-b__1", "GPU-a__0"}, now_);
  auto b = settings.create({"GPU-a__1"}, now_);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a.value(), b.value());
  EXPECT_EQ(settings.pending(), 2u);
  EXPECT_NE(text(a.value()).find("devices=GPU-a__0,GPU-b__1\n"), std::string::npos);
  EXPECT_NE(text(a.value()).find("register-wait-ms=5000\n"), std::string::npos);
  // The kubelet lists the same devices in another order; the watcher knows one pod only.
  const std::vector<LiveContainer> live = {{"ml/one", {"GPU-a__0", "GPU-b__1"}},
                                           {"ml/two", {"GPU-a__1"}}};
  settings.resolve(live, lookup({{"ml/one", KnownPodLimits{4096}}}), now_);
  EXPECT_NE(text(a.value()).find("memory-limit=4096\n"), std::string::npos) << text(a.value());
  EXPECT_NE(text(a.value()).find("pod=ml/one\n"), std::string::npos);
  EXPECT_NE(text(b.value()).find("memory-limit=pending\n"), std::string::npos);
  EXPECT_EQ(settings.pending(), 1u);
  settings.resolve(live, lookup({{"ml/one", KnownPodLimits{4096}}, {"ml/two", {}}}), now_);
  EXPECT_NE(text(b.value()).find("memory-limit=none\n"), std::string::npos);
  EXPECT_EQ(settings.pending(), 0u);
}

TEST_F(ContainerSettingsTest, ANewerAllocationOfTheSameDevicesWinsAndOldOnesGo) {
  std::vector<std::string> removed;  // what the owner hears, to remove what lives beside each
  options_.removed = [&](const std::string& id) { removed.push_back(id); };
  ContainerSettings settings(options_);
  ASSERT_TRUE(settings.prepare(now_).ok());
  auto first = settings.create({"GPU-a__0"}, now_);
  auto retry = settings.create({"GPU-a__0"}, now_ + std::chrono::seconds(1));
  auto never = settings.create({"GPU-a__3"}, now_);
  ASSERT_TRUE(first.ok() && retry.ok() && never.ok());
  settings.resolve({{"ml/p", {"GPU-a__0"}}}, lookup({{"ml/p", {}}}),
                   now_ + std::chrono::seconds(2));
  EXPECT_FALSE(std::filesystem::exists(first.value()));  // superseded by the retry
  EXPECT_NE(text(retry.value()).find("pod=ml/p\n"), std::string::npos);
  // Never claimed for longer than unclaimed_after: gone.
  settings.resolve({{"ml/p", {"GPU-a__0"}}}, lookup({{"ml/p", {}}}), now_ + std::chrono::hours(1));
  EXPECT_FALSE(std::filesystem::exists(never.value()));
  // The pod ends: kept for gone_after, then removed.
  const MonoTime end = now_ + std::chrono::hours(2);
  settings.resolve({}, lookup({}), end);
  EXPECT_TRUE(std::filesystem::exists(retry.value()));
  settings.resolve({}, lookup({}), end + std::chrono::seconds(31));
  EXPECT_FALSE(std::filesystem::exists(retry.value()));
  EXPECT_EQ(settings.size(), 0u);
  const auto id = [](const std::string& dir) {
    return std::filesystem::path(dir).filename().string();
  };
  EXPECT_EQ(removed,
            (std::vector<std::string>{id(first.value()), id(never.value()), id(retry.value())}));
}

TEST_F(ContainerSettingsTest, ARestartedPluginKeepsServingWhatItLeft) {
  std::string claimed;
  {
    ContainerSettings settings(options_);
    ASSERT_TRUE(settings.prepare(now_).ok());
    claimed = settings.create({"GPU-a__0"}, now_).value();
    settings.resolve({{"ml/p", {"GPU-a__0"}}}, lookup({{"ml/p", KnownPodLimits{1024}}}), now_);
  }
  ContainerSettings again(options_);
  ASSERT_TRUE(again.prepare(now_).ok());
  EXPECT_EQ(again.size(), 1u);
  EXPECT_EQ(again.pending(), 0u);
  again.resolve({{"ml/p", {"GPU-a__0"}}}, lookup({{"ml/p", KnownPodLimits{2048}}}), now_);
  EXPECT_NE(text(claimed).find("memory-limit=2048\n"), std::string::npos);
}

}  // namespace
}  // namespace nvshare::deviceplugin
