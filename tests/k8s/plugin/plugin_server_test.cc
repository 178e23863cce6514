// PluginServer in process, against the kubelet simulator and a scripted GPU inventory: registration
// and re-registration, ListAndWatch across health changes, placement from the live pod list,
// Allocate over gRPC, and the memory-capacity push to a stand-in control socket.
#include "deviceplugin/plugin_server.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "deviceplugin/allocate.h"
#include "kubelet_sim.h"

namespace nvshare::deviceplugin {
namespace {

using nvshare::testing::KubeletSimulator;
using nvshare::testing::SimContainer;
using nvshare::testing::SimMount;
using nvshare::testing::SimPod;
using nvshare::testing::TempDir;

constexpr std::uint64_t kGi = 1ull << 30;
constexpr auto kDeadline = std::chrono::seconds(30);

// GPUs whose health the test switches.
struct FakeGpus {
  std::mutex mu;
  std::vector<GpuInfo> gpus;
  std::set<std::string> lost;

  void set_lost(const std::string& uuid, bool lost_now) {
    std::lock_guard lock(mu);
    if (lost_now) {
      lost.insert(uuid);
    } else {
      lost.erase(uuid);
    }
  }
};

class FakeInventory final : public GpuInventory {
 public:
  explicit FakeInventory(std::shared_ptr<FakeGpus> gpus) : gpus_(std::move(gpus)) {}
  Result<std::vector<GpuInfo>> list() override {
    std::lock_guard lock(gpus_->mu);
    return gpus_->gpus;
  }
  Status check_health(const std::string& uuid) override {
    std::lock_guard lock(gpus_->mu);
    if (gpus_->lost.contains(uuid)) return make_error("GPU is lost (15)");
    return Status::Ok();
  }

 private:
  std::shared_ptr<FakeGpus> gpus_;
};

template <typename Predicate>
bool eventually(Predicate predicate, std::chrono::milliseconds deadline = kDeadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < end) {
    if (predicate()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return predicate();
}

class PluginServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = std::make_unique<KubeletSimulator>(dir_.path());
    fake_ = std::make_shared<FakeGpus>();
    fake_->gpus = {GpuInfo{"GPU-aaaa", 0, 16 * kGi}, GpuInfo{"GPU-bbbb", 1, 16 * kGi}};
    config_ = default_config();
    config_.kubelet_dir = sim_->device_plugin_dir();
    config_.pod_resources_socket = sim_->pod_resources_socket();
    config_.slots_per_gpu = 4;
    config_.health_interval = std::chrono::milliseconds(50);
    config_.socket_dir = dir_.path() + "/run";
    config_.ld_so_preload_host_path = dir_.path() + "/ld.so.preload";
    config_.control_socket = dir_.path() + "/control.sock";
    config_.settings_dir = dir_.path() + "/containers";
    config_.cdi_spec_dir = dir_.path() + "/cdi";
    // The node's runtime: NVIDIA's CDI spec names the GPUs by UUID (as the GPU Operator writes
    // it), and both CDI directories are read.
    runtime_.gpu_device_nodes = {{"GPU-aaaa", "/dev/nvidia0"}, {"GPU-bbbb", "/dev/nvidia1"}};
    runtime_.cdi_spec_dirs = {dir_.path() + "/nvidia-cdi", config_.cdi_spec_dir};
    nvshare::testing::write_nvidia_cdi_spec(runtime_.cdi_spec_dirs[0], runtime_.gpu_device_nodes);
  }

  void TearDown() override {
    if (plugin_) plugin_->stop();
    sim_->stop();
  }

  void start_plugin() {
    PluginServerTiming timing;
    timing.socket_check_interval = std::chrono::milliseconds(100);
    timing.register_backoff_initial = std::chrono::milliseconds(20);
    timing.register_backoff_max = std::chrono::milliseconds(200);
    plugin_ =
        std::make_unique<PluginServer>(config_, std::make_unique<FakeInventory>(fake_), timing);
    Status started = plugin_->start();
    ASSERT_TRUE(started) << started.error().message;
  }

  std::vector<std::string> preferred(const std::vector<std::string>& available, int size,
                                     const std::vector<std::string>& must_include = {}) {
    auto stub = sim_->plugin();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kDeadline);
    v1beta1::PreferredAllocationRequest request;
    auto* container = request.add_container_requests();
    for (const auto& id : available) container->add_available_deviceids(id);
    for (const auto& id : must_include) container->add_must_include_deviceids(id);
    container->set_allocation_size(size);
    v1beta1::PreferredAllocationResponse response;
    const grpc::Status status = stub->GetPreferredAllocation(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    if (!status.ok() || response.container_responses_size() != 1) return {};
    const auto& ids = response.container_responses(0).deviceids();
    return {ids.begin(), ids.end()};
  }

  std::vector<std::string> all_ids() const {
    std::vector<std::string> ids;
    for (const auto& gpu : fake_->gpus) {
      for (int slot = 0; slot < config_.slots_per_gpu; ++slot) {
        ids.push_back(make_device_id(gpu.uuid, slot));
      }
    }
    return ids;
  }

  TempDir dir_;
  std::unique_ptr<KubeletSimulator> sim_;
  std::shared_ptr<FakeGpus> fake_;
  PluginConfig config_;
  nvshare::testing::SimRuntime runtime_;
  std::unique_ptr<PluginServer> plugin_;
};

std::string gpu_of(const std::string& id) { return parse_device_id(id)->gpu_uuid; }

TEST_F(PluginServerTest, RegistersWithTheKubelet) {
  sim_->start();
  start_plugin();
  ASSERT_TRUE(sim_->wait_for_registrations(1));
  const auto request = sim_->registrations().at(0);
  EXPECT_EQ(request.version(), "v1beta1");
  EXPECT_EQ(request.endpoint(), "nvshare.sock");
  EXPECT_EQ(request.resource_name(), "nvshare.com/gpu");
  EXPECT_TRUE(request.options().get_preferred_allocation_available());
  EXPECT_FALSE(request.options().pre_start_required());

  auto stub = sim_->plugin();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kDeadline);
  v1beta1::DevicePluginOptions options;
  ASSERT_TRUE(stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &options).ok());
  EXPECT_TRUE(options.get_preferred_allocation_available());
}

TEST_F(PluginServerTest, RegistersOnceTheKubeletAppears) {
  start_plugin();  // no kubelet yet
  sim_->start();
  ASSERT_TRUE(sim_->wait_for_registrations(1));
}

TEST_F(PluginServerTest, ReRegistersAndServesAgainAfterTheKubeletRestarts) {
  sim_->start();
  start_plugin();
  ASSERT_TRUE(sim_->wait_for_registrations(1));
  sim_->restart();  // wipes nvshare.sock too
  ASSERT_TRUE(sim_->wait_for_registrations(2));
  ASSERT_TRUE(eventually([&] {
    auto stub = sim_->plugin();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1beta1::DevicePluginOptions options;
    return stub->GetDevicePluginOptions(&context, v1beta1::Empty(), &options).ok();
  }));
  EXPECT_GE(plugin_->stats().serves, 2u);
  EXPECT_EQ(sim_->registrations().back().endpoint(), "nvshare.sock");
}

TEST_F(PluginServerTest, ListAndWatchReportsHealthChanges) {
  sim_->start();
  start_plugin();
  auto stub = sim_->plugin();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->ListAndWatch(&context, v1beta1::Empty());

  const auto health_of = [](const v1beta1::ListAndWatchResponse& list) {
    std::map<std::string, std::set<std::string>> health;  // GPU -> health values of its slots
    for (const auto& device : list.devices()) health[gpu_of(device.id())].insert(device.health());
    return health;
  };
  v1beta1::ListAndWatchResponse list;
  ASSERT_TRUE(reader->Read(&list));
  EXPECT_EQ(list.devices_size(), 8);
  EXPECT_EQ(health_of(list)["GPU-aaaa"], std::set<std::string>{"Healthy"});
  EXPECT_EQ(health_of(list)["GPU-bbbb"], std::set<std::string>{"Healthy"});

  fake_->set_lost("GPU-bbbb", true);
  ASSERT_TRUE(reader->Read(&list));
  EXPECT_EQ(list.devices_size(), 8);
  EXPECT_EQ(health_of(list)["GPU-aaaa"], std::set<std::string>{"Healthy"});
  EXPECT_EQ(health_of(list)["GPU-bbbb"], std::set<std::string>{"Unhealthy"});

  fake_->set_lost("GPU-bbbb", false);
  ASSERT_TRUE(reader->Read(&list));
  EXPECT_EQ(health_of(list)["GPU-bbbb"], std::set<std::string>{"Healthy"});
  EXPECT_EQ(plugin_->stats().health_changes, 2u);
  context.TryCancel();
}

TEST_F(PluginServerTest, PlacementFollowsTheLivePodList) {
  sim_->start();
  start_plugin();
  std::vector<SimPod> pods;
  std::vector<std::string> used;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::string> available;
    for (const auto& id : all_ids()) {
      if (std::find(used.begin(), used.end(), id) == used.end()) available.push_back(id);
    }
    const auto chosen = preferred(available, 1);
    ASSERT_EQ(chosen.size(), 1u);
    used.push_back(chosen[0]);
    pods.push_back(SimPod{"default", "pod-" + std::to_string(i), "nvshare.com/gpu", chosen});
    sim_->set_pods(pods);
  }
  std::map<std::string, int> per_gpu;
  for (const auto& id : used) ++per_gpu[gpu_of(id)];
  EXPECT_EQ(per_gpu["GPU-aaaa"], 2);
  EXPECT_EQ(per_gpu["GPU-bbbb"], 2);

  // The two pods on GPU-aaaa end: the kubelet lists them no more and offers their slots again.
  std::vector<SimPod> remaining;
  for (const auto& pod : pods) {
    if (gpu_of(pod.device_ids[0]) == "GPU-bbbb") remaining.push_back(pod);
  }
  sim_->set_pods(remaining);
  std::vector<std::string> available;
  for (const auto& id : all_ids()) {
    bool held = false;
    for (const auto& pod : remaining) held |= pod.device_ids[0] == id;
    if (!held) available.push_back(id);
  }
  const auto chosen = preferred(available, 1);
  ASSERT_EQ(chosen.size(), 1u);
  EXPECT_EQ(gpu_of(chosen[0]), "GPU-aaaa");
  EXPECT_GE(sim_->list_calls(), 5u);
}

TEST_F(PluginServerTest, MultiSlotRequestSpreadsOverDistinctGpus) {
  sim_->start();
  start_plugin();
  sim_->set_pods({SimPod{"default", "busy", "nvshare.com/gpu", {"GPU-aaaa__0"}},
                  SimPod{"default", "other-resource", "example.com/thing", {"GPU-bbbb__0"}}});
  const auto chosen = preferred(all_ids(), 2);
  ASSERT_EQ(chosen.size(), 2u);
  EXPECT_NE(gpu_of(chosen[0]), gpu_of(chosen[1]));
}

TEST_F(PluginServerTest, PlacementUsesMemoryLimitsFromTheSource) {
  sim_->start();
  plugin_ = nullptr;
  PluginServerTiming timing;
  plugin_ = std::make_unique<PluginServer>(config_, std::make_unique<FakeInventory>(fake_), timing);
  plugin_->set_memory_limits_source([] {
    return std::map<std::string, std::uint64_t>{{"ns/big", 12 * kGi}, {"ns/small", kGi}};
  });
  ASSERT_TRUE(plugin_->start());
  sim_->set_pods({SimPod{"ns", "big", "nvshare.com/gpu", {"GPU-aaaa__0"}},
                  SimPod{"ns", "small", "nvshare.com/gpu", {"GPU-bbbb__0"}}});
  std::vector<std::string> available;
  for (const auto& id : all_ids()) {
    if (id != "GPU-aaaa__0" && id != "GPU-bbbb__0") available.push_back(id);
  }
  const auto chosen = preferred(available, 1);
  ASSERT_EQ(chosen.size(), 1u);
  EXPECT_EQ(gpu_of(chosen[0]), "GPU-bbbb");
}

v1beta1::AllocateResponse allocate(KubeletSimulator& sim, const std::vector<std::string>& ids,
                                   grpc::Status* status_out) {
  auto stub = sim.plugin();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kDeadline);
  v1beta1::AllocateRequest request;
  auto* container = request.add_container_requests();
  for (const auto& id : ids) container->add_devices_ids(id);
  v1beta1::AllocateResponse response;
  *status_out = stub->Allocate(&context, request, &response);
  return response;
}

// The container the runtime starts from one container's Allocate response.
SimContainer started(const v1beta1::AllocateResponse& response,
                     const nvshare::testing::SimRuntime& runtime) {
  EXPECT_EQ(response.container_responses_size(), 1);
  if (response.container_responses_size() != 1) return {};
  auto container = nvshare::testing::start_container(response.container_responses(0), runtime);
  EXPECT_TRUE(container) << container.error().message;
  return container ? container.value() : SimContainer{};
}

struct StrategyCase {
  const char* strategy;
  bool cdi_edits;
};

// Every device-list strategy gives the container exactly its GPUs and nvshare's edits: the library
// and the socket read-only, LD_PRELOAD, and its own settings (read-only: enforcement its
// environment cannot turn off). CDI specs the plugin wrote are loaded (and validated) by the
// simulated runtime.
TEST_F(PluginServerTest, AllocateUnderEachDeviceListStrategy) {
  sim_->start();
  for (const StrategyCase& c :
       {StrategyCase{"cdi-cri", true}, StrategyCase{"cdi-cri", false}, StrategyCase{"envvar", true},
        StrategyCase{"volume-mounts", true}, StrategyCase{"cdi-cri,envvar", true}}) {
    SCOPED_TRACE(std::string(c.strategy) + (c.cdi_edits ? "" : ", cdi-edits false"));
    if (plugin_) plugin_->stop();
    ASSERT_TRUE(apply_knob(*find_knob("device-list-strategy"), c.strategy, config_));
    config_.cdi_edits = c.cdi_edits;
    std::filesystem::remove_all(config_.cdi_spec_dir);
    start_plugin();
    EXPECT_EQ(std::filesystem::exists(config_.cdi_spec_dir + "/nvshare.com-gpu.json"),
              config_.edits_through_cdi());
    grpc::Status status;
    const auto response = allocate(*sim_, {"GPU-aaaa__1", "GPU-bbbb__2"}, &status);
    ASSERT_TRUE(status.ok()) << status.error_message();
    const SimContainer container = started(response, runtime_);
    EXPECT_EQ(container.device_nodes, (std::set<std::string>{"/dev/nvidia0", "/dev/nvidia1"}));
    EXPECT_EQ(container.env.at("LD_PRELOAD"), config_.library_container_path);
    EXPECT_EQ(container.env.at("NVSHARE_SOCKET"), config_.socket_dir + "/scheduler.sock");
    EXPECT_EQ(container.mounts.at(config_.library_container_path),
              (SimMount{config_.library_host_path, true}));
    EXPECT_EQ(container.mounts.at(config_.socket_dir), (SimMount{config_.socket_dir, true}));
    const SimMount settings = container.mounts.at("/etc/nvshare");
    EXPECT_TRUE(settings.read_only);
    EXPECT_EQ(settings.host_path.rfind(config_.settings_dir + "/", 0), 0u);
    EXPECT_TRUE(std::filesystem::exists(settings.host_path + "/client.conf"));
    EXPECT_FALSE(std::filesystem::exists(config_.ld_so_preload_host_path));
  }
}

// A runtime that ignores NVIDIA_VISIBLE_DEVICES (Bottlerocket for unprivileged containers, nodes
// whose runtime is not NVIDIA's): cdi-cri still gives the container its GPU; envvar gives none.
TEST_F(PluginServerTest, CdiCriWorksWhereTheRuntimeIgnoresTheVariable) {
  runtime_.nvidia_envvar = false;
  runtime_.nvidia_volume_mounts = false;
  sim_->start();
  start_plugin();
  grpc::Status status;
  auto container = started(allocate(*sim_, {"GPU-bbbb__0"}, &status), runtime_);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(container.device_nodes, std::set<std::string>{"/dev/nvidia1"});
  plugin_->stop();
  config_.device_list = DeviceListStrategy{false, true, false};
  start_plugin();
  container = started(allocate(*sim_, {"GPU-bbbb__1"}, &status), runtime_);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(container.device_nodes.empty());
}

// Without NVIDIA's CDI spec on the node the runtime cannot resolve the GPU's name: the container
// fails to start, naming it (the plugin's own devices resolve).
TEST_F(PluginServerTest, AMissingNvidiaCdiSpecFailsTheContainerByName) {
  runtime_.cdi_spec_dirs = {config_.cdi_spec_dir};
  sim_->start();
  start_plugin();
  grpc::Status status;
  const auto response = allocate(*sim_, {"GPU-aaaa__0"}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  auto container = nvshare::testing::start_container(response.container_responses(0), runtime_);
  ASSERT_FALSE(container);
  EXPECT_EQ(container.error().message, "unresolvable CDI devices nvidia.com/gpu=GPU-aaaa");
}

// A container's CDI spec lives as long as its settings directory: one left by a previous run whose
// directory is gone is removed at start.
TEST_F(PluginServerTest, ContainerCdiSpecsWithoutSettingsAreRemoved) {
  const std::string stale = container_cdi_spec_path(config_.cdi_spec_dir, "00000000deadbeef");
  ASSERT_TRUE(write_cdi_spec(
      stale, cdi_spec_text(container_cdi_device("00000000deadbeef"), settings_edits("/gone"))));
  sim_->start();
  start_plugin();
  grpc::Status status;
  const auto response = allocate(*sim_, {"GPU-aaaa__0"}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string live = started(response, runtime_).mounts.at("/etc/nvshare").host_path;
  const std::string live_spec = container_cdi_spec_path(
      config_.cdi_spec_dir, std::filesystem::path(live).filename().string());
  EXPECT_TRUE(eventually([&] { return !std::filesystem::exists(stale); }));
  EXPECT_TRUE(std::filesystem::exists(live_spec));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Allocate cannot know the pod, so the settings start pending; once the kubelet's pod-resources
// names the container holding those devices and the pod watcher knows its limit, the file gets it,
// and follows later changes. Another container's devices never take it.
TEST_F(PluginServerTest, ContainerSettingsGetTheirPodsMemoryLimit) {
  std::mutex mu;
  std::map<std::string, KnownPodLimits> known;  // what the pod watcher knows, by namespace/name
  sim_->start();
  plugin_ = nullptr;
  PluginServerTiming timing;
  timing.socket_check_interval = std::chrono::milliseconds(100);
  plugin_ = std::make_unique<PluginServer>(config_, std::make_unique<FakeInventory>(fake_), timing);
  plugin_->set_pod_limits_lookup([&](const std::string& key) -> std::optional<KnownPodLimits> {
    std::lock_guard lock(mu);
    auto it = known.find(key);
    return it == known.end() ? std::nullopt : std::optional<KnownPodLimits>(it->second);
  });
  ASSERT_TRUE(plugin_->start().ok());
  grpc::Status status;
  const auto response = allocate(*sim_, {"GPU-aaaa__0"}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string host_dir = started(response, runtime_).mounts["/etc/nvshare"].host_path;
  ASSERT_FALSE(host_dir.empty());
  const std::string file = host_dir + "/client.conf";
  std::string text = read_text(file);
  EXPECT_NE(text.find("enforce=1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("socket=" + config_.socket_dir + "/scheduler.sock\n"), std::string::npos);
  EXPECT_NE(text.find("memory-limit=pending\n"), std::string::npos) << text;
  EXPECT_EQ(std::filesystem::status(file).permissions() & std::filesystem::perms::others_write,
            std::filesystem::perms::none);

  // The kubelet gives the devices to ml/trainer; the watcher does not know the pod yet: pending.
  sim_->set_pods({{"ml", "other", "nvshare.com/gpu", {"GPU-bbbb__0"}},
                  {"ml", "trainer", "nvshare.com/gpu", {"GPU-aaaa__0"}}});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_NE(read_text(file).find("memory-limit=pending\n"), std::string::npos);
  {
    std::lock_guard lock(mu);
    known["ml/other"] = KnownPodLimits{8 * kGi};
    known["ml/trainer"] = KnownPodLimits{kGi};
  }
  ASSERT_TRUE(eventually([&] {
    return read_text(file).find("memory-limit=" + std::to_string(kGi) + "\n") != std::string::npos;
  })) << read_text(file);
  EXPECT_NE(read_text(file).find("pod=ml/trainer\n"), std::string::npos);
  {
    std::lock_guard lock(mu);
    known["ml/trainer"] = KnownPodLimits{std::nullopt};  // annotation removed
  }
  ASSERT_TRUE(
      eventually([&] { return read_text(file).find("memory-limit=none\n") != std::string::npos; },
                 std::chrono::seconds(5)))
      << read_text(file);
  // The pod goes: its container's directory goes after a while (30 s), not at once.
  sim_->set_pods({});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(std::filesystem::exists(file));
}

TEST_F(PluginServerTest, AllocateInLdSoPreloadMode) {
  config_.injection = Injection::kLdSoPreload;
  sim_->start();
  start_plugin();
  // Written at start, one line: the library's path in the container.
  EXPECT_TRUE(std::filesystem::exists(config_.ld_so_preload_host_path));
  grpc::Status status;
  const auto response = allocate(*sim_, {"GPU-bbbb__3"}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const SimContainer container = started(response, runtime_);
  EXPECT_EQ(container.device_nodes, std::set<std::string>{"/dev/nvidia1"});
  EXPECT_EQ(container.env.count("LD_PRELOAD"), 0u);
  EXPECT_EQ(container.mounts.at("/etc/ld.so.preload"),
            (SimMount{config_.ld_so_preload_host_path, true}));
}

TEST_F(PluginServerTest, AllocateRejectsUnknownDeviceIds) {
  sim_->start();
  start_plugin();
  grpc::Status status;
  allocate(*sim_, {"GPU-aaaa__0", "GPU-cccc__0"}, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("GPU-cccc__0"), std::string::npos)
      << status.error_message();
  allocate(*sim_, {"GPU-aaaa__4"}, &status);  // slot 4 of 4 slots
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// `nvshare.com/gpu: 2` on a node with one GPU: placement finds no two GPUs, and when the kubelet
// picks two slots of that GPU itself, Allocate refuses them, saying why.
TEST_F(PluginServerTest, TwoSlotRequestOnAOneGpuNodeIsRefusedClearly) {
  config_.gpus.all = false;
  config_.gpus.indexes = {0};
  sim_->start();
  start_plugin();
  ASSERT_EQ(plugin_->gpus().size(), 1u);
  {
    auto stub = sim_->plugin();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kDeadline);
    v1beta1::PreferredAllocationRequest request;
    auto* container = request.add_container_requests();
    for (int slot = 0; slot < config_.slots_per_gpu; ++slot) {
      container->add_available_deviceids(make_device_id("GPU-aaaa", slot));
    }
    container->set_allocation_size(2);
    v1beta1::PreferredAllocationResponse response;
    const grpc::Status status = stub->GetPreferredAllocation(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("distinct GPUs"), std::string::npos)
        << status.error_message();
  }
  grpc::Status status;
  allocate(*sim_, {"GPU-aaaa__0", "GPU-aaaa__1"}, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("each slot of a container must be a distinct GPU"),
            std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("this node has 1"), std::string::npos)
      << status.error_message();
  allocate(*sim_, {"GPU-aaaa__1"}, &status);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(PluginServerTest, StartFailsForAGpuThatIsNotThere) {
  config_.gpus.all = false;
  config_.gpus.uuids = {"GPU-zzzz"};
  plugin_ = std::make_unique<PluginServer>(config_, std::make_unique<FakeInventory>(fake_));
  Status started = plugin_->start();
  ASSERT_FALSE(started);
  EXPECT_NE(started.error().message.find("GPU-zzzz"), std::string::npos);
}

TEST_F(PluginServerTest, ManagesOnlySelectedGpusWithTheirCapacity) {
  config_.gpus.all = false;
  config_.gpus.indexes = {1};
  config_.memory_capacity.all = CapacityValue{std::nullopt, 1.5};
  sim_->start();
  start_plugin();
  const auto gpus = plugin_->gpus();
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].uuid, "GPU-bbbb");
  EXPECT_EQ(gpus[0].capacity_bytes, 24 * kGi);
}

// A stand-in for the scheduler's control socket: answers every request line with {"ok":true} and
// records the lines.
class FakeControlSocket {
 public:
  explicit FakeControlSocket(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path.c_str());
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeControlSocket() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::vector<std::string> lines() {
    std::lock_guard lock(mu_);
    return lines_;
  }

 private:
  void serve() {
    while (!stop_) {
      pollfd listen_fd{fd_, POLLIN, 0};
      if (::poll(&listen_fd, 1, 50) <= 0) continue;
      const int client = ::accept(fd_, nullptr, nullptr);
      if (client < 0) continue;
      std::string line;
      char ch = 0;
      while (::read(client, &ch, 1) == 1 && ch != '\n') line += ch;
      {
        std::lock_guard lock(mu_);
        lines_.push_back(line);
      }
      const std::string reply = "{\"ok\":true,\"gpus\":[]}\n";
      (void)!::write(client, reply.data(), reply.size());
      ::close(client);
    }
  }

  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> lines_;
};

TEST_F(PluginServerTest, PushesTheInventoryAndTheMemoryCapacityToTheScheduler) {
  config_.memory_capacity.all = CapacityValue{std::nullopt, 2.0};
  config_.memory_capacity.by_uuid["GPU-bbbb"] = CapacityValue{4 * kGi, 1.0};
  FakeControlSocket control(config_.control_socket);
  sim_->start();
  start_plugin();
  ASSERT_TRUE(eventually([&] { return plugin_->stats().capacity_pushes >= 1; }));
  const auto lines = control.lines();
  ASSERT_EQ(lines.size(), 2u);
  // The GPUs and their physical memory, which the scheduler takes as each GPU's memory...
  EXPECT_EQ(lines[0], "{\"cmd\":\"set-gpus\",\"gpus\":[{\"uuid\":\"GPU-aaaa\",\"memory_bytes\":" +
                          std::to_string(16 * kGi) + "},{\"uuid\":\"GPU-bbbb\",\"memory_bytes\":" +
                          std::to_string(16 * kGi) + "}]}");
  // ...then the virtual capacity.
  EXPECT_NE(lines[1].find("\"cmd\":\"set-policy\""), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("\"capacity\":\"GPU-aaaa=" + std::to_string(32 * kGi) +
                          ",GPU-bbbb=" + std::to_string(4 * kGi) + "\""),
            std::string::npos)
      << lines[1];
}

}  // namespace
}  // namespace nvshare::deviceplugin
