#include "kubelet_sim.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "cdi_validator.h"

namespace nvshare::testing {

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "nvshare-dp-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  if (std::getenv("NVSHARE_KEEP_TEST_DIRS") != nullptr) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

class KubeletSimulator::RegistrationService final : public v1beta1::Registration::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    {
      std::lock_guard lock(mu);
      requests.push_back(*request);
    }
    cv.notify_all();
    return grpc::Status::OK;
  }

  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<v1beta1::RegisterRequest> requests;
};

class KubeletSimulator::PodResourcesService final : public v1::PodResourcesLister::Service {
 public:
  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* response) override {
    std::lock_guard lock(mu);
    ++calls;
    for (const SimPod& pod : pods) {
      v1::PodResources* out = response->add_pod_resources();
      out->set_namespace_(pod.ns);
      out->set_name(pod.name);
      v1::ContainerResources* container = out->add_containers();
      container->set_name("main");
      v1::ContainerDevices* devices = container->add_devices();
      devices->set_resource_name(pod.resource);
      for (const std::string& id : pod.device_ids) devices->add_device_ids(id);
    }
    return grpc::Status::OK;
  }

  mutable std::mutex mu;
  std::vector<SimPod> pods;
  std::uint64_t calls = 0;
};

KubeletSimulator::KubeletSimulator(std::string dir)
    : dir_(std::move(dir)),
      registration_(std::make_unique<RegistrationService>()),
      pod_resources_(std::make_unique<PodResourcesService>()) {
  std::filesystem::create_directories(device_plugin_dir());
}

KubeletSimulator::~KubeletSimulator() { stop(); }

void KubeletSimulator::serve_registration() {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + kubelet_socket(), grpc::InsecureServerCredentials());
  builder.RegisterService(registration_.get());
  registration_server_ = builder.BuildAndStart();
  if (!registration_server_) throw std::runtime_error("cannot serve " + kubelet_socket());
}

void KubeletSimulator::start() {
  serve_registration();
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + pod_resources_socket(), grpc::InsecureServerCredentials());
  builder.RegisterService(pod_resources_.get());
  pod_resources_server_ = builder.BuildAndStart();
  if (!pod_resources_server_) throw std::runtime_error("cannot serve " + pod_resources_socket());
}

void KubeletSimulator::restart() {
  if (registration_server_) {
    registration_server_->Shutdown(std::chrono::system_clock::now());
    registration_server_->Wait();
    registration_server_.reset();
  }
  for (const auto& entry : std::filesystem::directory_iterator(device_plugin_dir())) {
    std::error_code ignored;
    std::filesystem::remove(entry.path(), ignored);
  }
  serve_registration();
}

void KubeletSimulator::stop() {
  for (auto* server : {&registration_server_, &pod_resources_server_}) {
    if (*server) {
      (*server)->Shutdown(std::chrono::system_clock::now());
      (*server)->Wait();
      server->reset();
    }
  }
}

void KubeletSimulator::set_pods(std::vector<SimPod> pods) {
  std::lock_guard lock(pod_resources_->mu);
  pod_resources_->pods = std::move(pods);
}

std::uint64_t KubeletSimulator::list_calls() const {
  std::lock_guard lock(pod_resources_->mu);
  return pod_resources_->calls;
}

bool KubeletSimulator::wait_for_registrations(std::size_t count,
                                              std::chrono::milliseconds deadline) {
  std::unique_lock lock(registration_->mu);
  return registration_->cv.wait_for(lock, deadline,
                                    [&] { return registration_->requests.size() >= count; });
}

std::vector<v1beta1::RegisterRequest> KubeletSimulator::registrations() const {
  std::lock_guard lock(registration_->mu);
  return registration_->requests;
}

std::unique_ptr<v1beta1::DevicePlugin::Stub> KubeletSimulator::plugin() const {
  return v1beta1::DevicePlugin::NewStub(
      grpc::CreateChannel("unix:" + plugin_socket(), grpc::InsecureChannelCredentials()));
}

}  // namespace nvshare::testing

namespace nvshare::testing {
namespace {

constexpr std::string_view kVolumeMountsDir = "/var/run/nvidia-container-devices";

struct CdiDevice {
  std::string spec_file;
  const Json* spec_edits = nullptr;
  const Json* device_edits = nullptr;
};

void apply_cdi_edits(const Json& edits, SimContainer& container) {
  if (const Json* env = edits.find("env")) {
    for (const Json& entry : *env->as_array()) {
      const std::string& text = *entry.as_string();
      const std::size_t eq = text.find('=');
      container.env[text.substr(0, eq)] = text.substr(eq + 1);
    }
  }
  if (const Json* mounts = edits.find("mounts")) {
    for (const Json& mount : *mounts->as_array()) {
      bool read_only = false;
      if (const Json* options = mount.find("options")) {
        for (const Json& option : *options->as_array()) read_only |= *option.as_string() == "ro";
      }
      container.mounts[*mount.find("containerPath")->as_string()] =
          SimMount{*mount.find("hostPath")->as_string(), read_only};
    }
  }
  if (const Json* nodes = edits.find("deviceNodes")) {
    for (const Json& node : *nodes->as_array()) {
      container.device_nodes.insert(*node.find("path")->as_string());
    }
  }
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// The NVIDIA runtime's part: NVIDIA_VISIBLE_DEVICES as UUIDs or as volume mounts.
Status add_nvidia_visible_devices(const SimRuntime& runtime, SimContainer& container) {
  const auto visible = container.env.find("NVIDIA_VISIBLE_DEVICES");
  if (visible == container.env.end() || visible->second == "void") return Status::Ok();
  std::vector<std::string> uuids;
  if (visible->second == kVolumeMountsDir) {
    if (!runtime.nvidia_volume_mounts) return Status::Ok();
    const std::string prefix = std::string(kVolumeMountsDir) + "/";
    for (const auto& [path, mount] : container.mounts) {
      if (path.rfind(prefix, 0) == 0) uuids.push_back(path.substr(prefix.size()));
    }
  } else {
    if (!runtime.nvidia_envvar) return Status::Ok();
    uuids = split_commas(visible->second);
  }
  for (const std::string& uuid : uuids) {
    const auto node = runtime.gpu_device_nodes.find(uuid);
    if (node == runtime.gpu_device_nodes.end()) {
      return make_error("nvidia-container-cli: unknown device " + uuid);
    }
    container.device_nodes.insert(node->second);
  }
  return Status::Ok();
}

}  // namespace

Result<SimContainer> start_container(const v1beta1::ContainerAllocateResponse& response,
                                     const SimRuntime& runtime) {
  SimContainer container;
  for (const auto& [name, value] : response.envs()) container.env[name] = value;
  for (const v1beta1::Mount& mount : response.mounts()) {
    container.mounts[mount.container_path()] = SimMount{mount.host_path(), mount.read_only()};
  }
  // The runtime's CDI cache: every spec file of every directory, each validated.
  std::vector<std::pair<std::string, Json>> specs;  // file, parsed spec
  std::map<std::string, CdiDevice> devices;         // qualified name
  for (const std::string& dir : runtime.cdi_spec_dirs) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string path = entry.path().string();
      if (!path.ends_with(".json")) continue;
      std::ifstream in(path);
      std::stringstream text;
      text << in.rdbuf();
      auto spec = validate_cdi_spec(text.str());
      if (!spec) return make_error("CDI spec " + path + ": " + spec.error().message);
      specs.emplace_back(path, std::move(spec).value());
    }
  }
  for (const auto& [file, spec] : specs) {
    const std::string& kind = *spec.find("kind")->as_string();
    for (const Json& device : *spec.find("devices")->as_array()) {
      const std::string name = kind + "=" + *device.find("name")->as_string();
      if (devices.count(name) != 0) {
        return make_error("CDI device " + name + " is defined by " + devices[name].spec_file +
                          " and " + file);
      }
      devices[name] = CdiDevice{file, spec.find("containerEdits"), device.find("containerEdits")};
    }
  }
  std::set<const Json*> applied_spec_edits;
  std::string unresolved;
  for (const v1beta1::CDIDevice& requested : response.cdi_devices()) {
    const auto it = devices.find(requested.name());
    if (it == devices.end()) {
      unresolved += (unresolved.empty() ? "" : ", ") + requested.name();
      continue;
    }
    if (it->second.spec_edits != nullptr &&
        applied_spec_edits.insert(it->second.spec_edits).second) {
      apply_cdi_edits(*it->second.spec_edits, container);
    }
    apply_cdi_edits(*it->second.device_edits, container);
  }
  if (!unresolved.empty()) return make_error("unresolvable CDI devices " + unresolved);
  if (Status s = add_nvidia_visible_devices(runtime, container); !s) return s.error();
  return container;
}

void write_nvidia_cdi_spec(const std::string& dir,
                           const std::map<std::string, std::string>& nodes) {
  Json devices = Json::array();
  for (const auto& [uuid, node] : nodes) {
    Json device_node = Json::object();
    device_node.set("path", node);
    Json edits = Json::object();
    edits.set("deviceNodes", Json(Json::Array{device_node}));
    Json device = Json::object();
    device.set("name", uuid);
    device.set("containerEdits", std::move(edits));
    devices.push_back(std::move(device));
  }
  Json spec_edits = Json::object();
  spec_edits.set("env", Json(Json::Array{Json("NVIDIA_VISIBLE_DEVICES=void")}));
  Json spec = Json::object();
  spec.set("cdiVersion", "0.5.0");
  spec.set("kind", "nvidia.com/gpu");
  spec.set("devices", std::move(devices));
  spec.set("containerEdits", std::move(spec_edits));
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/nvidia.json") << spec.dump_pretty() << '\n';
}

}  // namespace nvshare::testing
