// The Kubernetes node agent end to end, without a cluster or a GPU: the real nvshare-device-plugin
// on the simulated NVML, registered with the kubelet simulator (device-plugin and pod-resources
// gRPC on unix sockets) and watching pods in a local server speaking the Kubernetes API
// (tests/k8s/watcher/fake_api_server.h) through a kubeconfig; the real nvshare-scheduler
// (--trust-client-limits, its own sockets); an nvshare-trainer under libnvshare.so on the
// simulated GPU, started with the environment the plugin's Allocate gave its container and the pod
// UID a real pod's cgroup would give (NVSHARE_POD_UID, trusted by the scheduler here).
//
// One scenario, in the order a cluster would see it:
//  (a) the plugin registers and advertises the GPUs' slots; placement, asked as the kubelet asks,
//      weighs GPUs by the memory limits the plugin's pod watcher read from the pods on them (by
//      "namespace/name", as pod-resources names pods); Allocate hands out the library and the
//      scheduler's socket;
//  (b) nvshare.com/gpu-memory-limit: 1Gi on the running trainer's pod (a MODIFIED watch event):
//      within 2 s its cuMemGetInfo reports total = 1Gi, and its next large allocation fails with
//      CUDA_ERROR_OUT_OF_MEMORY;
//  (c) nvshare.com/gpu-core-limit: "30": the scheduler shows the cap within 2 s, and the trainer's
//      share of the GPU over the following 8 s (whole cap periods) is 30% +- 2 points;
//  (d) an invalid value: a Warning event on the pod, the limit in force stays (also through a later
//      valid change of the other annotation); removing the annotation lifts the cap.
// Everything is awaited by polling with deadlines; the latencies and the share are printed on
// "[ MEASURE ]" lines. A failure prints the timeline, the trainer's output, the scheduler's and
// the plugin's logs and the events the API server received.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fake_api_server.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "kubelet_sim.h"

namespace nvshare::e2e {
namespace {

using nlohmann::json;
using nvshare::testing::FakeApiServer;
using nvshare::testing::KubeletSimulator;
using nvshare::testing::make_pod;
using nvshare::testing::SimPod;

constexpr double kMi = 1024.0 * 1024.0;
constexpr double kGi = 1024.0 * kMi;

constexpr const char* kNode = "gpu-node-1";
constexpr const char* kNamespace = "ml";
constexpr const char* kResource = "nvshare.com/gpu";
constexpr const char* kMemoryAnnotation = "nvshare.com/gpu-memory-limit";
constexpr const char* kCoreAnnotation = "nvshare.com/gpu-core-limit";
constexpr int kSlotsPerGpu = 4;

// The pods on the node. The trainer's runs a process; the other two only hold slots (pod-resources)
// and, for one, a memory limit, so that placement has something to weigh.
struct PodSpec {
  const char* uid;
  const char* name;
};
constexpr PodSpec kTrainerPod = {"3f6b1c9e-7a42-4d1e-9c55-0e8f2a6b7d10", "trainer"};
constexpr PodSpec kLoaderPod = {"8d2e4a17-b0c3-4f5e-8a61-93c7d5e2f048", "loader"};
constexpr PodSpec kNotebookPod = {"c41f7e02-5d98-4b3a-a6e1-27f0b8c9d365", "notebook"};

// The trainer: compute-bound 10 ms kernels, 512Mi allocated, cuMemGetInfo sampled every 10 ms, and
// 1Gi more asked for 5 s into its loop (inside the 1Gi-limit phase of the scenario).
constexpr double kKernelS = 0.010;
constexpr long kKernels = 800;
constexpr const char* kLateAllocAfterMs = "5000";

// The scheduler's compute-cap window W (--quota-window): a capped client alone runs c x W and
// pauses (1 - c) x W in each window (docs/scheduling.md). The share is measured over whole such
// periods of at least kShareWindowS (see share_over_periods).
constexpr double kQuotaWindowS = 1.0;
constexpr double kShareWindowS = 8.0;

constexpr double kApplyDeadlineS = 2.0;  // the requirement: annotation -> in force
constexpr double kWaitS = 15.0;          // generous deadline for anything to be observed at all
constexpr double kLatencyPollS = 0.001;  // status polling while a latency is measured

#define ASSERT_OK(expr)                                            \
  do {                                                             \
    const auto& ok_ = (expr);                                      \
    ASSERT_TRUE(ok_.ok()) << #expr << ": " << ok_.error().message; \
  } while (0)

bool wait_until(const std::function<bool()>& predicate, double timeout_s, double poll_s = 0.005) {
  const double deadline = monotonic_s() + timeout_s;
  for (;;) {
    if (predicate()) return true;
    if (monotonic_s() > deadline) return false;
    sleep_s(poll_s);
  }
}

// The pod record with this UID in a `status` response, or nullptr.
const Json* find_pod(const Json& status, const std::string& uid) {
  const Json* pods = status.find("pods");
  if (pods == nullptr || pods->as_array() == nullptr) return nullptr;
  for (const Json& pod : *pods->as_array()) {
    if (json_string(&pod, "pod_uid") == uid) return &pod;
  }
  return nullptr;
}

// A cuMemGetInfo sample the trainer printed (--meminfo-every-ms: one line per change).
struct MeminfoSample {
  double t = 0;
  double free = 0;
  double total = 0;
};

std::vector<MeminfoSample> meminfo_samples(const Trainer& trainer) {
  std::vector<MeminfoSample> out;
  std::istringstream lines(trainer.stderr_text());
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{\"meminfo\":", 0) != 0) continue;
    auto parsed = parse_json(line);
    if (!parsed.ok()) continue;  // a line still being written
    const Json* sample = parsed.value().find("meminfo");
    out.push_back(
        {json_number(sample, "t"), json_number(sample, "free"), json_number(sample, "total")});
  }
  return out;
}

// The trainer's share of the GPU over a window, from its --progress lines: it is alone on its GPU,
// so each kernel is exactly kKernelS of GPU time, and it launches the next one as soon as one
// completes; share = kernels x kKernelS / window, as the cap test of tests/e2e measures it.
//
// A window cut in the middle of a run or of a pause is off by up to c(1 - c)W / length (the bucket
// level at its two ends differs), 2.6 points for 30% over 8 s; so the window is stretched to whole
// periods: from the first resume (a launch after a pause longer than W/4) at or after `begin` to
// the first resume at least `length` later, counting the kernels launched in between. Without such
// pauses (a trainer that is not capped) it is the plain window (begin, begin + length].
struct ShareWindow {
  double begin = 0;
  double end = 0;
  long kernels = 0;
  bool whole_periods = false;
  double percent() const { return 100.0 * static_cast<double>(kernels) * kKernelS / (end - begin); }
};

ShareWindow share_over_periods(const std::vector<Json>& progress, double begin, double length) {
  std::vector<double> resumes;
  for (std::size_t i = 1; i < progress.size(); ++i) {
    const double launch = json_number(&progress[i], "launch_s");
    if (launch - json_number(&progress[i - 1], "done_s") > kQuotaWindowS / 4) {
      resumes.push_back(launch);
    }
  }
  ShareWindow window;
  auto first = std::lower_bound(resumes.begin(), resumes.end(), begin);
  auto last = first == resumes.end() ? resumes.end()
                                     : std::lower_bound(first, resumes.end(), *first + length);
  if (last != resumes.end()) {
    window.begin = *first;
    window.end = *last;
    window.whole_periods = true;
    for (const Json& p : progress) {
      const double launch = json_number(&p, "launch_s");
      window.kernels += launch >= window.begin && launch < window.end;
    }
    return window;
  }
  window.begin = begin;
  window.end = begin + length;
  for (const Json& p : progress) {
    const double done = json_number(&p, "done_s");
    window.kernels += done > window.begin && done <= window.end;
  }
  return window;
}

std::vector<std::string> first_device_list(KubeletSimulator& kubelet) {
  auto stub = kubelet.plugin();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto reader = stub->ListAndWatch(&context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse list;
  std::vector<std::string> devices;
  if (reader->Read(&list)) {
    for (const auto& device : list.devices()) {
      if (device.health() == "Healthy") devices.push_back(device.id());
    }
  }
  context.TryCancel();
  return devices;
}

class NodeAgentE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed";
    t0_ = monotonic_s();
    // In a directory of its own: a container mounts it writable beside the read-only socket
    // directory (the test's directory).
    std::filesystem::create_directories(dir_.path() + "/sim");
    state_ = dir_.path() + "/sim/fakecuda.state";
    auto api = FakeApiServer::start({.token = "e2e-token"});
    ASSERT_TRUE(api.ok()) << api.error().message;
    api_ = std::move(api).value();
    kubeconfig_ = dir_.path() + "/kubeconfig";
    std::ofstream(kubeconfig_) << api_->kubeconfig("e2e-token");
    kubelet_ = std::make_unique<KubeletSimulator>(dir_.path() + "/kubelet");
    kubelet_->start();
  }

  void TearDown() override {
    if (trainer_ && trainer_->running()) trainer_->kill(SIGKILL);
    if (HasFailure()) {
      std::string out = "\n===== node agent e2e failure context (" + dir_.path() + ") =====\n";
      out += "--- timeline:\n" + timeline_;
      if (trainer_) out += trainer_->describe() + "\n";
      if (scheduler_) out += "--- scheduler log:\n" + tail(scheduler_->log(), 100) + "\n";
      out += "--- device plugin log:\n" + tail(read_file(plugin_log()), 100) + "\n";
      out += "--- events posted to the API server:\n";
      for (const json& event : api_->posted_events()) out += event.dump() + "\n";
      std::fprintf(stderr, "%s\n", out.c_str());
    }
    plugin_.reset();
    trainer_.reset();
    kubelet_.reset();
    scheduler_.reset();
    api_.reset();
  }

  std::string plugin_log() const { return dir_.path() + "/device-plugin.log"; }

  // The environment of every process that loads the simulated driver or NVML: one state file, two
  // 16Gi GPUs.
  Env gpu_env() const {
    return {{"LD_LIBRARY_PATH", programs().fakecuda_dir},
            {"NVSHARE_FAKECUDA_STATE", state_},
            {"NVSHARE_FAKECUDA_DEVICES", "2"},
            {"NVSHARE_FAKECUDA_MEMORY", "16Gi"}};
  }

  void start_plugin() {
    const std::vector<std::string> argv = {NVSHARE_DEVICE_PLUGIN_BIN,
                                           "--kubelet-dir",
                                           kubelet_->device_plugin_dir(),
                                           "--pod-resources-socket",
                                           kubelet_->pod_resources_socket(),
                                           "--node-name",
                                           kNode,
                                           "--kubeconfig",
                                           kubeconfig_,
                                           "--control-socket",
                                           scheduler_->control_socket(),
                                           "--socket-dir",
                                           dir_.path(),
                                           "--settings-dir",
                                           dir_.path() + "/containers",
                                           "--cdi-spec-dir",
                                           dir_.path() + "/cdi",
                                           "--library-host-path",
                                           programs().library,
                                           "--library-container-path",
                                           programs().library,
                                           "--slots-per-gpu",
                                           std::to_string(kSlotsPerGpu),
                                           "--health-interval",
                                           "1",
                                           "--metrics-address",
                                           "127.0.0.1:" + std::to_string(metrics_port_),
                                           "--log-level",
                                           "debug"};
    auto plugin = Process::spawn(argv, gpu_env(), plugin_log(), plugin_log());
    ASSERT_OK(plugin);
    plugin_ = std::move(plugin).value();
  }

  // A pod of this node requesting the resource, with these annotations.
  static json pod(const PodSpec& spec, const std::map<std::string, std::string>& annotations) {
    return make_pod(spec.uid, spec.name, kNode, annotations, true, kResource, kNamespace);
  }

  // Changes the trainer pod's annotations (a MODIFIED event) and returns when it was made.
  double annotate_trainer(const std::map<std::string, std::string>& annotations) {
    std::string shown;
    for (const auto& [key, value] : annotations) shown += " " + key + "=\"" + value + "\"";
    const double at = monotonic_s();
    api_->modify_pod(pod(kTrainerPod, annotations));
    note("annotations of " + std::string(kNamespace) + "/" + kTrainerPod.name + " set to {" +
         shown + " }");
    return at;
  }

  Result<Json> status() { return scheduler_->status(); }

  // Waits for the trainer to end; its report when it exited 0 with result "ok", else null (the
  // failure recorded).
  Json finished_report(double timeout_s) {
    auto code = trainer_->wait(timeout_s);
    if (!code.ok()) {
      ADD_FAILURE() << "the trainer did not end: " << code.error().message;
      return Json();
    }
    note("trainer exited with status " + std::to_string(code.value()));
    EXPECT_EQ(code.value(), 0);
    auto report = trainer_->report();
    if (!report.ok()) {
      ADD_FAILURE() << report.error().message;
      return Json();
    }
    EXPECT_EQ(json_string(&report.value(), "result"), "ok") << report.value().dump();
    return report.value();
  }

  // Waits until the trainer's progress lines reach a period past the share window that starts at
  // `settled_at`, or it ends; returns the scheduler's last share_percent of it (`refresh` updates
  // `client`).
  double wait_for_share_window(double settled_at, const std::function<bool()>& refresh,
                               const Json& client) {
    double share = -1;
    EXPECT_TRUE(wait_until(
        [&] {
          if (!trainer_->running()) return true;
          if (refresh()) share = json_number(&client, "share_percent");
          const auto progress = trainer_->progress();
          return !progress.empty() && json_number(&progress.back(), "launch_s") >
                                          settled_at + kShareWindowS + 2.5 * kQuotaWindowS;
        },
        kShareWindowS + kWaitS, 0.25));
    return share;
  }

  // Waits for the plugin's registration and its 2 x kSlotsPerGpu healthy slots (into `devices`);
  // returns the GPUs' UUIDs in NVML order.
  std::vector<std::string> wait_for_slots(std::vector<std::string>& devices) {
    std::vector<std::string> gpus;
    if (!kubelet_->wait_for_registrations(1, std::chrono::seconds(30))) {
      ADD_FAILURE() << "the device plugin never registered with the kubelet";
      return gpus;
    }
    note("device plugin registered");
    if (!wait_until(
            [&] {
              devices = first_device_list(*kubelet_);
              return devices.size() == 2 * kSlotsPerGpu;
            },
            kWaitS, 0.05)) {
      ADD_FAILURE() << "the plugin did not advertise 2 x " << kSlotsPerGpu << " healthy slots";
      return gpus;
    }
    for (const std::string& id : devices) {
      const std::string uuid = id.substr(0, id.rfind("__"));
      if (std::find(gpus.begin(), gpus.end(), uuid) == gpus.end()) gpus.push_back(uuid);
    }
    return gpus;
  }

  // The plugin's Allocate answer for one container of one slot, as the kubelet asks for it.
  std::optional<v1beta1::ContainerAllocateResponse> allocate(const std::string& slot) {
    auto stub = kubelet_->plugin();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1beta1::AllocateRequest request;
    request.add_container_requests()->add_devices_ids(slot);
    v1beta1::AllocateResponse response;
    const grpc::Status rpc = stub->Allocate(&context, request, &response);
    if (!rpc.ok() || response.container_responses_size() != 1) {
      ADD_FAILURE() << "Allocate: " << rpc.error_message();
      return std::nullopt;
    }
    return response.container_responses(0);
  }

  void note(const std::string& what) {
    char when[32];
    std::snprintf(when, sizeof when, "%+8.3f s ", monotonic_s() - t0_);
    timeline_ += when + what + "\n";
  }

  void measure(const std::string& what, double value, const std::string& unit) {
    std::printf("[ MEASURE ] %s = %.4g %s\n", what.c_str(), value, unit.c_str());
    std::fflush(stdout);
    RecordProperty(what, std::to_string(value) + " " + unit);
    note("measured " + what + " = " + std::to_string(value) + " " + unit);
  }

  TempDir dir_;
  double t0_ = 0;
  std::string state_;
  std::string kubeconfig_;
  std::string timeline_;
  std::unique_ptr<FakeApiServer> api_;
  std::unique_ptr<KubeletSimulator> kubelet_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Process> plugin_;
  int metrics_port_ = free_port();  // the plugin's GET /metrics
  std::unique_ptr<Trainer> trainer_;
};

TEST_F(NodeAgentE2eTest, AnnotationsReachARunningTrainer) {
  // ---- the node: scheduler, pods, device plugin ----------------------------------------------
  scheduler_ = std::make_unique<Scheduler>(
      dir_.path(),
      std::vector<std::string>{"--trust-client-limits", "--quota-window",
                               std::to_string(static_cast<int>(kQuotaWindowS * 1000))});
  ASSERT_OK(scheduler_->start());
  note("scheduler listening");
  api_->add_pod(pod(kTrainerPod, {}));
  api_->add_pod(pod(kLoaderPod, {{kMemoryAnnotation, "8Gi"}}));
  api_->add_pod(pod(kNotebookPod, {}));
  ASSERT_NO_FATAL_FAILURE(start_plugin());

  // (a) Registration, and the advertised slots: 2 GPUs x 4.
  std::vector<std::string> devices;
  const std::vector<std::string> gpus = wait_for_slots(devices);
  ASSERT_EQ(gpus.size(), 2u);
  const v1beta1::RegisterRequest registration = kubelet_->registrations().at(0);
  EXPECT_EQ(registration.version(), "v1beta1");
  EXPECT_EQ(registration.resource_name(), kResource);
  EXPECT_EQ(registration.endpoint(), "nvshare.sock");

  // The loader (8Gi limit) holds a slot of GPU 0, the notebook (no limit) one of GPU 1: one pod
  // on each, so only the memory the pods hold tells the GPUs apart. Placement reads that through
  // the plugin's pod watcher; once the scheduler has the loader's limit, the watcher has it too
  // (it records a limit before pushing it).
  kubelet_->set_pods({{kNamespace, kLoaderPod.name, kResource, {gpus[0] + "__0"}},
                      {kNamespace, kNotebookPod.name, kResource, {gpus[1] + "__0"}}});
  ASSERT_TRUE(wait_until(
      [&] {
        auto s = status();
        return s.ok() &&
               json_number(find_pod(s.value(), kLoaderPod.uid), "memory_limit_bytes") == 8 * kGi;
      },
      kWaitS))
      << "the loader pod's 8Gi annotation never reached the scheduler";
  note("the scheduler has the pods' limits");
  std::string chosen;
  {
    auto stub = kubelet_->plugin();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1beta1::PreferredAllocationRequest request;
    auto* container = request.add_container_requests();
    for (const std::string& id : devices) {
      if (id != gpus[0] + "__0" && id != gpus[1] + "__0") container->add_available_deviceids(id);
    }
    container->set_allocation_size(1);
    v1beta1::PreferredAllocationResponse response;
    const grpc::Status rpc = stub->GetPreferredAllocation(&context, request, &response);
    ASSERT_TRUE(rpc.ok()) << rpc.error_message();
    ASSERT_EQ(response.container_responses_size(), 1);
    ASSERT_EQ(response.container_responses(0).deviceids_size(), 1);
    chosen = response.container_responses(0).deviceids(0);
  }
  note("preferred allocation: " + chosen);
  EXPECT_EQ(chosen, gpus[1] + "__1")
      << "placement did not weigh the 8Gi the loader pod holds on GPU 0 (memory limits by pod "
         "name not reaching placement)";
  const std::string gpu_uuid = chosen.substr(0, chosen.rfind("__"));
  const long gpu_index = std::find(gpus.begin(), gpus.end(), gpu_uuid) - gpus.begin();

  const auto answer = allocate(chosen);
  ASSERT_TRUE(answer.has_value());
  const v1beta1::ContainerAllocateResponse& allocation = *answer;
  // The runtime resolves the CDI names (the default strategy, cdi-cri) from NVIDIA's spec and
  // the spec the plugin wrote.
  nvshare::testing::SimRuntime runtime;
  runtime.gpu_device_nodes = {{gpus[0], "/dev/nvidia0"}, {gpus[1], "/dev/nvidia1"}};
  runtime.cdi_spec_dirs = {dir_.path() + "/nvidia-cdi", dir_.path() + "/cdi"};
  nvshare::testing::write_nvidia_cdi_spec(runtime.cdi_spec_dirs[0], runtime.gpu_device_nodes);
  auto started = nvshare::testing::start_container(allocation, runtime);
  ASSERT_TRUE(started) << started.error().message;
  const auto& envs = started.value().env;
  ASSERT_TRUE(envs.count("LD_PRELOAD") == 1 && envs.count("NVSHARE_SOCKET") == 1);
  EXPECT_EQ(envs.at("LD_PRELOAD"), programs().library);
  EXPECT_EQ(envs.at("NVSHARE_SOCKET"), scheduler_->socket());
  EXPECT_EQ(started.value().device_nodes,
            std::set<std::string>{"/dev/nvidia" + std::to_string(gpu_index)});
  kubelet_->set_pods({{kNamespace, kLoaderPod.name, kResource, {gpus[0] + "__0"}},
                      {kNamespace, kNotebookPod.name, kResource, {gpus[1] + "__0"}},
                      {kNamespace, kTrainerPod.name, kResource, {chosen}}});

  // ---- the trainer, in the container the allocation describes --------------------------------
  // The simulated driver has no device nodes (the container runtime's business): the allocated
  // GPU is picked by index instead.
  const std::string trace = dir_.path() + "/handoff.jsonl";
  Env container_env = {{"LD_PRELOAD", envs.at("LD_PRELOAD")},
                       {"NVSHARE_SOCKET", envs.at("NVSHARE_SOCKET")},
                       {"NVSHARE_POD_UID", kTrainerPod.uid},
                       {"NVSHARE_TRACE_FILE", trace}};
  trainer_ = std::make_unique<Trainer>(
      TrainerOptions("trainer",
                     {"--device", std::to_string(gpu_index), "--bytes", "512Mi", "--kernels",
                      std::to_string(kKernels), "--kernel-us",
                      std::to_string(static_cast<long>(kKernelS * 1e6)), "--meminfo-every-ms", "10",
                      "--alloc-after-ms", kLateAllocAfterMs, "--alloc-bytes", "1Gi", "--progress"},
                     container_env, /*preload=*/false),
      dir_.path());
  Env trainer_env = gpu_env();
  trainer_env["NVSHARE_LOG_LEVEL"] = "info";
  ASSERT_OK(trainer_->start(trainer_env));
  note("trainer started, pid " + std::to_string(trainer_->pid()));
  Json client;  // the trainer's client in the last status
  auto refresh_client = [&] {
    auto s = status();
    if (!s.ok()) return false;
    const Json* c = find_client(s.value(), trainer_->pid());
    if (c == nullptr) return false;
    client = *c;
    return true;
  };
  ASSERT_TRUE(wait_until(
      [&] {
        return refresh_client() && json_string(&client, "state") == "running" &&
               trainer_->progress().size() >= 3;
      },
      kWaitS))
      << "the trainer never showed up running in the scheduler";
  note("trainer running: " + client.dump());
  EXPECT_EQ(json_string(&client, "pod_uid"), kTrainerPod.uid);
  EXPECT_TRUE(client.find("memory_limit_bytes") != nullptr &&
              client.find("memory_limit_bytes")->is_null())
      << client.dump();
  EXPECT_EQ(json_number(&client, "core_limit_percent"), 100) << client.dump();

  // ---- (b) the memory limit ------------------------------------------------------------------
  const double memory_set_at = annotate_trainer({{kMemoryAnnotation, "1Gi"}});
  double memory_in_scheduler_at = -1;
  double memory_in_meminfo_at = -1;  // the trainer's own sample time
  ASSERT_TRUE(wait_until(
      [&] {
        if (memory_in_scheduler_at < 0) {
          auto s = status();
          if (s.ok() &&
              json_number(find_client(s.value(), trainer_->pid()), "memory_limit_bytes") == kGi) {
            memory_in_scheduler_at = monotonic_s();
          }
        }
        if (memory_in_meminfo_at < 0) {
          for (const MeminfoSample& m : meminfo_samples(*trainer_)) {
            if (m.t > memory_set_at && m.total == kGi) {
              memory_in_meminfo_at = m.t;
              break;
            }
          }
        }
        return memory_in_scheduler_at >= 0 && memory_in_meminfo_at >= 0;
      },
      kWaitS, kLatencyPollS))
      << "the 1Gi limit was not seen: scheduler at " << memory_in_scheduler_at
      << ", cuMemGetInfo at " << memory_in_meminfo_at;
  note("1Gi in the scheduler and in cuMemGetInfo");
  measure("memory annotation -> limit in the scheduler's status",
          (memory_in_scheduler_at - memory_set_at) * 1000, "ms");
  measure("memory annotation -> trainer's cuMemGetInfo total = 1Gi",
          (memory_in_meminfo_at - memory_set_at) * 1000, "ms");
  EXPECT_LT(memory_in_scheduler_at - memory_set_at, kApplyDeadlineS);
  EXPECT_LT(memory_in_meminfo_at - memory_set_at, kApplyDeadlineS);
  {
    auto s = status();
    ASSERT_OK(s);
    const Json* record = find_pod(s.value(), kTrainerPod.uid);
    ASSERT_NE(record, nullptr) << s.value().dump();
    EXPECT_EQ(json_string(record, "namespace"), kNamespace);
    EXPECT_EQ(json_string(record, "name"), kTrainerPod.name);
    EXPECT_EQ(json_number(record, "memory_limit_bytes"), kGi) << record->dump();
  }

  // ---- (c) the compute cap -------------------------------------------------------------------
  const double core_set_at =
      annotate_trainer({{kMemoryAnnotation, "1Gi"}, {kCoreAnnotation, "30"}});
  double core_applied_at = -1;
  ASSERT_TRUE(wait_until(
      [&] {
        if (refresh_client() && json_number(&client, "core_limit_percent") == 30) {
          core_applied_at = monotonic_s();
        }
        return core_applied_at >= 0;
      },
      kWaitS, kLatencyPollS))
      << "the 30% cap never reached the scheduler: " << client.dump();
  note("30% cap in the scheduler");
  measure("core annotation -> cap in the scheduler's status",
          (core_applied_at - core_set_at) * 1000, "ms");
  EXPECT_LT(core_applied_at - core_set_at, kApplyDeadlineS);

  // The share, from one quota window after the cap is in force (a new bucket starts half full) over
  // whole periods; the progress lines must reach a period past the window's end.
  const double settled_at = core_applied_at + kQuotaWindowS;
  const double scheduler_share = wait_for_share_window(settled_at, refresh_client, client);
  ASSERT_TRUE(trainer_->running()) << "the trainer ended before the share window did";
  const auto progress = trainer_->progress();
  const ShareWindow window = share_over_periods(progress, settled_at, kShareWindowS);
  long plain_kernels = 0;  // the same over the plain window, for comparison
  for (const Json& p : progress) {
    const double done = json_number(&p, "done_s");
    plain_kernels += done > settled_at && done <= settled_at + kShareWindowS;
  }
  note("share window [" + std::to_string(window.begin - t0_) + ", " +
       std::to_string(window.end - t0_) + "] s" +
       (window.whole_periods ? " (whole periods): " : " (no pauses seen): ") +
       std::to_string(window.kernels) + " kernels");
  measure("window after the cap took effect (whole periods)", window.end - window.begin, "s");
  measure("trainer's GPU share under the 30% annotation", window.percent(), "%");
  measure("trainer's GPU share over a plain 8 s window",
          100.0 * static_cast<double>(plain_kernels) * kKernelS / kShareWindowS, "%");
  measure("scheduler's share_percent at the end of the window", scheduler_share, "%");
  // The cap governs the time the trainer holds the GPU (its hand-off trace: grant to release);
  // its kernels get no more than that (its own launches and synchronizations, slower under the
  // sanitizers, take some of the held time).
  const double held = held_share(trace, trainer_->pid(), window.begin, window.end);
  measure("trainer's held share under the 30% annotation", held, "%");
  EXPECT_NEAR(held, 30.0, 2.0) << "held over [" << window.begin << ", " << window.end << "]";
  EXPECT_LE(window.percent(), 32.0)
      << window.kernels << " kernels of " << kKernelS * 1000 << " ms in "
      << window.end - window.begin << " s" << (window.whole_periods ? "" : " (no pauses seen)");

  // ---- (d) an invalid value ------------------------------------------------------------------
  // Other Warning events may come too (an allocation refused by the 1Gi limit): these are the
  // annotation's.
  auto invalid_events = [&] {
    std::vector<json> found;
    for (const json& e : api_->posted_events()) {
      if (e["reason"] == "InvalidNvshareAnnotation") found.push_back(e);
    }
    return found;
  };
  annotate_trainer({{kMemoryAnnotation, "1Gi"}, {kCoreAnnotation, "150"}});
  ASSERT_TRUE(wait_until([&] { return !invalid_events().empty(); }, kWaitS))
      << "no Warning event for gpu-core-limit \"150\"";
  note("Warning event posted");
  {
    const json event = invalid_events().at(0);
    EXPECT_EQ(event["type"], "Warning");
    EXPECT_EQ(event["reason"], "InvalidNvshareAnnotation");
    EXPECT_EQ(event["involvedObject"]["kind"], "Pod");
    EXPECT_EQ(event["involvedObject"]["uid"], kTrainerPod.uid);
    EXPECT_EQ(event["involvedObject"]["namespace"], kNamespace);
    EXPECT_EQ(event["involvedObject"]["name"], kTrainerPod.name);
    const std::string message = event.value("message", "");
    EXPECT_NE(message.find(kCoreAnnotation), std::string::npos) << message;
    EXPECT_NE(message.find("\"150\""), std::string::npos) << message;
  }
  // The cap in force stays: in the scheduler now, and through a later valid change of the memory
  // annotation (a push that would carry a dropped cap).
  ASSERT_TRUE(refresh_client());
  EXPECT_EQ(json_number(&client, "core_limit_percent"), 30) << client.dump();
  const double memory_raised_at =
      annotate_trainer({{kMemoryAnnotation, "2Gi"}, {kCoreAnnotation, "150"}});
  ASSERT_TRUE(wait_until(
      [&] { return refresh_client() && json_number(&client, "memory_limit_bytes") == 2 * kGi; },
      kWaitS))
      << "the 2Gi change next to the invalid cap never reached the scheduler: " << client.dump();
  note("2Gi in the scheduler");
  EXPECT_EQ(json_number(&client, "core_limit_percent"), 30) << client.dump();
  {
    auto s = status();
    ASSERT_OK(s);
    const Json* record = find_pod(s.value(), kTrainerPod.uid);
    EXPECT_EQ(json_number(record, "core_limit_percent"), 30) << s.value().dump();
  }
  EXPECT_EQ(invalid_events().size(), 1u) << "the same invalid value was reported again";

  // Removing the annotation lifts the cap; the trainer finishes uncapped.
  annotate_trainer({{kMemoryAnnotation, "2Gi"}});
  ASSERT_TRUE(wait_until(
      [&] { return refresh_client() && json_number(&client, "core_limit_percent") == 100; },
      kWaitS))
      << "removing the core annotation did not lift the cap: " << client.dump();
  note("cap lifted");
  const Json report = finished_report(60);
  ASSERT_FALSE(report.is_null());

  // (b), continued: the large allocation the trainer made while the 1Gi limit was in force.
  const Json* late = report.find("late_alloc");
  ASSERT_NE(late, nullptr) << report.dump();
  const double late_at = json_number(late, "t");
  EXPECT_GT(late_at, memory_in_meminfo_at) << "the allocation came before the 1Gi limit";
  EXPECT_LT(late_at, memory_raised_at) << "the allocation came after the limit was raised";
  EXPECT_EQ(json_string(late, "result"), "CUDA_ERROR_OUT_OF_MEMORY")
      << "512Mi allocated + 1Gi more must not fit under a 1Gi limit";
  // cuMemGetInfo said 1Gi from the change until the raise, the invalid value included.
  for (const MeminfoSample& m : meminfo_samples(*trainer_)) {
    if (m.t >= memory_in_meminfo_at && m.t < memory_raised_at) {
      EXPECT_EQ(m.total, kGi) << "at t=" << m.t - t0_ << " s";
    }
  }
  const auto samples = meminfo_samples(*trainer_);
  EXPECT_TRUE(std::any_of(samples.begin(), samples.end(), [&](const MeminfoSample& m) {
    return m.total == 2 * kGi;
  })) << "the trainer never saw the 2Gi limit";

  // The plugin's metrics tell the same story: its slots, the trainer's allocation, the refused
  // annotation value and the Events it posted.
  auto scraped = http_get(metrics_port_, "/metrics");
  ASSERT_OK(scraped);
  EXPECT_EQ(scraped.value().status, 200);
  std::map<std::string, double> metric;  // first sample of each family, and per-GPU sums
  double slots = 0, allocated = 0;
  std::istringstream lines(scraped.value().body);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::string name = line.substr(0, line.find_first_of("{ "));
    const double value = std::stod(line.substr(line.rfind(' ') + 1));
    metric.try_emplace(name, value);
    if (name == "nvshare_plugin_slots") slots += value;
    if (name == "nvshare_plugin_allocated_slots_total") allocated += value;
  }
  EXPECT_EQ(slots, 2 * kSlotsPerGpu) << scraped.value().body;
  EXPECT_GE(allocated, 1) << scraped.value().body;
  EXPECT_EQ(metric["nvshare_plugin_annotation_errors_total"], 1) << scraped.value().body;
  EXPECT_GE(metric["nvshare_plugin_events_posted_total"], 1) << scraped.value().body;
  EXPECT_GE(metric["nvshare_plugin_managed_pods"], 1) << scraped.value().body;
  EXPECT_EQ(metric["nvshare_plugin_watcher_synced"], 1) << scraped.value().body;
  EXPECT_GE(metric["nvshare_plugin_registrations_total"], 1) << scraped.value().body;
  auto lint = promtool_check(dir_.path(), scraped.value().body);
  ASSERT_OK(lint);
  EXPECT_EQ(lint.value().exit_code, 0) << lint.value().out << lint.value().err;

  plugin_->kill(SIGTERM);
  auto plugin_exit = plugin_->wait(10);
  ASSERT_OK(plugin_exit);
  EXPECT_EQ(plugin_exit.value(), 0);
}

// A client record of a pod's process in a `status` response, or nullptr.
const Json* find_pod_client(const Json& status, const std::string& pod_uid) {
  const Json* gpus = status.find("gpus");
  if (gpus == nullptr || gpus->as_array() == nullptr) return nullptr;
  for (const Json& gpu : *gpus->as_array()) {
    const Json* clients = gpu.find("clients");
    if (clients == nullptr || clients->as_array() == nullptr) continue;
    for (const Json& c : *clients->as_array()) {
      if (json_string(&c, "pod_uid") == pod_uid) return &c;
    }
  }
  return nullptr;
}

// NVIDIA's CDI spec for the simulated GPUs: kind nvidia.com/gpu, one device per UUID, without
// device nodes (the simulated driver needs none, and a runtime refuses to add a node that is not
// there).
void write_simulated_nvidia_cdi_spec(const std::string& dir, const std::vector<std::string>& gpus) {
  json spec = {{"cdiVersion", "0.5.0"},
               {"kind", "nvidia.com/gpu"},
               {"containerEdits", {{"env", {"NVIDIA_VISIBLE_DEVICES=void"}}}},
               {"devices", json::array()}};
  for (const std::string& uuid : gpus) {
    spec["devices"].push_back(
        {{"name", uuid}, {"containerEdits", {{"env", {"NVSHARE_TEST_CDI_GPU=" + uuid}}}}});
  }
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/nvidia.json") << spec.dump(2) << '\n';
}

// The real container path, label `containers` (root, podman with runc, a Debian 11 root in
// NVSHARE_CONTAINERS_ROOT): podman resolves the CDI names of the plugin's real Allocate answer from
// the spec the plugin wrote (and NVIDIA's, for the GPU), and runs the trainer in a Debian 11
// container. Podman reads CDI specs from /etc/cdi and /var/run/cdi, so it runs in a mount namespace
// of its own where those are the test's directories. In force inside: the pod's memory limit from
// its first allocation, a live change of it, a 30% cap; the container's own environment (enable 0,
// a higher memory limit, another socket) widens none of them.
TEST_F(NodeAgentE2eTest, PodmanRunsTheTrainerFromTheAllocateAnswer) {
  const char* container_root = std::getenv("NVSHARE_CONTAINERS_ROOT");
  if (container_root == nullptr || *container_root == '\0') {
    GTEST_SKIP() << "NVSHARE_CONTAINERS_ROOT is not set (the `containers` label sets it)";
  }
  ASSERT_EQ(::geteuid(), 0u) << "podman with runc and CDI needs root";
  for (const char* tool : {"podman", "runc", "unshare"}) {
    ASSERT_NE(on_path(tool), tool) << tool << " is not installed (scripts/install-deps.sh test)";
  }
  scheduler_ = std::make_unique<Scheduler>(
      dir_.path(),
      std::vector<std::string>{"--trust-client-limits", "--quota-window",
                               std::to_string(static_cast<int>(kQuotaWindowS * 1000))});
  ASSERT_OK(scheduler_->start());
  api_->add_pod(pod(kTrainerPod, {{kMemoryAnnotation, "1Gi"}}));
  ASSERT_NO_FATAL_FAILURE(start_plugin());
  std::vector<std::string> devices;
  const std::vector<std::string> gpus = wait_for_slots(devices);
  ASSERT_EQ(gpus.size(), 2u);
  const std::string slot = gpus[1] + "__0";
  const auto allocation = allocate(slot);
  ASSERT_TRUE(allocation.has_value());
  kubelet_->set_pods({{kNamespace, kTrainerPod.name, kResource, {slot}}});
  ASSERT_GT(allocation->cdi_devices_size(), 0)
      << "the default strategy (cdi-cri) names CDI devices";
  const std::string nvidia_cdi = dir_.path() + "/nvidia-cdi";
  write_simulated_nvidia_cdi_spec(nvidia_cdi, gpus);

  // podman in a mount namespace where /var/run/cdi is the plugin's spec directory and /etc/cdi
  // NVIDIA's; the root is an overlay, so the cached root is never written.
  std::vector<std::string> launcher = {
      on_path("unshare"),
      "--mount",
      "--propagation",
      "private",
      "sh",
      "-c",
      "mkdir -p /run/cdi /etc/cdi && mount --bind \"$0\" /run/cdi && "
      "mount --bind \"$1\" /etc/cdi && shift && exec \"$@\"",
      dir_.path() + "/cdi",
      nvidia_cdi,
      on_path("podman"),
      "run",
      "--rm",
      "--runtime",
      on_path("runc"),
      "--network",
      "none",
      "--ulimit",
      "nofile=1024:1024",
      "--ulimit",
      "nproc=1024:1024",
      "--rootfs"};
  const auto mount_same = [&](const std::string& path, bool writable) {
    launcher.insert(launcher.end(), {"-v", path + ":" + path + (writable ? ":rw" : ":ro")});
  };
  mount_same(std::filesystem::path(programs().trainer).parent_path().string(), false);
  mount_same(std::filesystem::path(programs().library).parent_path().string(), false);
  mount_same(dir_.path() + "/sim", true);  // the simulated GPU's state
  // The simulated GPU shares its time between processes by their pids: the host's. (The scheduler
  // needs nothing of this: the kernel gives it the host pid of a peer in any namespace.)
  launcher.insert(launcher.end(), {"--pid", "host"});
  const std::map<std::string, std::string> env = {
      {"LD_LIBRARY_PATH", programs().fakecuda_dir},
      {"NVSHARE_FAKECUDA_STATE", state_},
      {"NVSHARE_FAKECUDA_DEVICES", "2"},
      {"NVSHARE_FAKECUDA_MEMORY", "16Gi"},
      {"NVSHARE_POD_UID", kTrainerPod.uid},  // trusted here: the container's cgroup is podman's
      {"NVSHARE_LOG_LEVEL", "info"},
      {"NVSHARE_TRACE_FILE", dir_.path() + "/sim/handoff.jsonl"},
      // The workload's own attempts to widen what was set for it.
      {"NVSHARE_ENABLE", "0"},
      {"NVSHARE_MEMORY_LIMIT", "8Gi"},
      {"NVSHARE_SOCKET", "/tmp/elsewhere.sock"}};
  for (const auto& [name, value] : env)
    launcher.insert(launcher.end(), {"--env", name + "=" + value});
  for (const v1beta1::CDIDevice& device : allocation->cdi_devices()) {
    launcher.insert(launcher.end(), {"--device", device.name()});
  }
  launcher.push_back(std::string(container_root) +
                     ":O");  // --rootfs: the root takes the image's place

  // The runtime and the root, first on their own: a Debian 11 container got the CDI edits.
  {
    std::vector<std::string> probe = launcher;
    probe.insert(probe.end(), {"sh", "-c", "cat /etc/debian_version; env"});
    auto ran = run_command(probe, dir_.path(), 60);
    ASSERT_OK(ran);
    ASSERT_EQ(ran.value().exit_code, 0) << ran.value().out << ran.value().err;
    EXPECT_EQ(ran.value().out.rfind("11.", 0), 0u) << ran.value().out;
    EXPECT_NE(ran.value().out.find("\nLD_PRELOAD=" + programs().library + "\n"), std::string::npos)
        << ran.value().out;
    EXPECT_NE(ran.value().out.find("\nNVSHARE_TEST_CDI_GPU=" + gpus[1] + "\n"), std::string::npos)
        << ran.value().out;
    note("podman ran a Debian 11 container with the plugin's CDI edits");
  }

  TrainerOptions options(
      "podman trainer",
      {"--device", "1", "--bytes", "512Mi", "--kernels", std::to_string(kKernels), "--kernel-us",
       std::to_string(static_cast<long>(kKernelS * 1e6)), "--meminfo-every-ms", "10",
       "--alloc-after-ms", "200", "--alloc-bytes", "1Gi", "--progress"},
      {}, /*preload=*/false);
  options.launcher = launcher;
  trainer_ = std::make_unique<Trainer>(std::move(options), dir_.path());
  ASSERT_OK(trainer_->start({}));
  note("podman started, pid " + std::to_string(trainer_->pid()));
  Json client;
  auto refresh_client = [&] {
    auto s = status();
    if (!s.ok()) return false;
    const Json* c = find_pod_client(s.value(), kTrainerPod.uid);
    if (c == nullptr) return false;
    client = *c;
    return true;
  };
  ASSERT_TRUE(wait_until([&] { return refresh_client() && trainer_->progress().size() >= 3; }, 60))
      << "the containerized trainer never registered and ran";
  note("trainer registered: " + client.dump());
  EXPECT_EQ(json_number(&client, "memory_limit_bytes"), kGi) << client.dump();

  // The pod's 1Gi from the first sample on, whatever the container's environment says.
  ASSERT_TRUE(wait_until([&] { return !meminfo_samples(*trainer_).empty(); }, kWaitS));
  EXPECT_EQ(meminfo_samples(*trainer_).front().total, kGi);

  // A live change (once the trainer has made its 1Gi allocation, 200 ms into its run), then a cap.
  const double first_sample = meminfo_samples(*trainer_).front().t;
  ASSERT_TRUE(wait_until(
      [&] {
        const auto progress = trainer_->progress();
        return !progress.empty() && json_number(&progress.back(), "launch_s") > first_sample + 1.0;
      },
      kWaitS));
  const double raised_at = annotate_trainer({{kMemoryAnnotation, "2Gi"}});
  double seen_at = -1;
  ASSERT_TRUE(wait_until(
      [&] {
        for (const MeminfoSample& m : meminfo_samples(*trainer_)) {
          if (m.t > raised_at && m.total == 2 * kGi) seen_at = m.t;
        }
        return seen_at > 0;
      },
      kWaitS, kLatencyPollS))
      << "the 2Gi change never reached the container's cuMemGetInfo";
  measure("memory annotation -> cuMemGetInfo in the container", (seen_at - raised_at) * 1000, "ms");
  EXPECT_LT(seen_at - raised_at, kApplyDeadlineS);

  const double capped_at = annotate_trainer({{kMemoryAnnotation, "2Gi"}, {kCoreAnnotation, "30"}});
  ASSERT_TRUE(wait_until(
      [&] { return refresh_client() && json_number(&client, "core_limit_percent") == 30; }, kWaitS))
      << "the 30% cap never reached the scheduler: " << client.dump();
  const double settled_at = monotonic_s() + kQuotaWindowS;
  const double scheduler_share = wait_for_share_window(settled_at, refresh_client, client);
  ASSERT_TRUE(trainer_->running()) << "the trainer ended before the share window did";
  const ShareWindow window = share_over_periods(trainer_->progress(), settled_at, kShareWindowS);
  // The time it held the GPU, from its hand-off trace (the host's pid: the container shares it).
  const double held =
      held_share(dir_.path() + "/sim/handoff.jsonl",
                 static_cast<pid_t>(json_number(&client, "pid")), window.begin, window.end);
  measure("containerized trainer's GPU share under the 30% annotation", window.percent(), "%");
  measure("containerized trainer's held share under it", held, "%");
  measure("scheduler's share_percent of it at the end", scheduler_share, "%");
  EXPECT_LE(window.percent(), 32.0) << "applied " << capped_at - t0_ << " s into the run";
  EXPECT_NEAR(held, 30.0, 2.0) << "held over [" << window.begin << ", " << window.end << "]";

  annotate_trainer({{kMemoryAnnotation, "2Gi"}});  // lifts the cap: the trainer finishes
  const Json report = finished_report(90);
  ASSERT_FALSE(report.is_null());
  const Json* late = report.find("late_alloc");
  ASSERT_NE(late, nullptr) << report.dump();
  EXPECT_LT(json_number(late, "t"), raised_at);
  EXPECT_EQ(json_string(late, "result"), "CUDA_ERROR_OUT_OF_MEMORY")
      << "512Mi + 1Gi under the pod's 1Gi, though the container's environment said 8Gi";
}

}  // namespace
}  // namespace nvshare::e2e
