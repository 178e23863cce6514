#include "kubelet_sim.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>

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
