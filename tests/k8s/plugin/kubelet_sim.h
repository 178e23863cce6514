// A kubelet simulator for device plugin tests: the kubelet's side of the device-plugin and
// pod-resources gRPC APIs, on unix sockets in a test's own directory.
//
//  - Registration on <dir>/device-plugins/kubelet.sock records every RegisterRequest.
//  - PodResourcesLister on <dir>/pod-resources.sock answers List() with the pods the test sets.
//  - restart() behaves like a restarting kubelet: the registration server stops, every socket in
//    the device-plugins directory is deleted (the plugin's included) and kubelet.sock is served
//    anew.
//  - plugin() is a DevicePlugin client of the plugin's socket, as the kubelet dials it back.
//  - start_container() is what the kubelet and the container runtime (containerd or CRI-O with
//    the NVIDIA Container Toolkit) make of an Allocate response: its environment and mounts, its
//    CDI devices resolved from the spec directories (each spec checked by cdi_validator.h, as a
//    runtime's CDI cache does; an unresolvable name fails the container), and the GPUs the
//    NVIDIA runtime adds for NVIDIA_VISIBLE_DEVICES, as UUIDs or as volume mounts, when it
//    honours them (Bottlerocket and CDI-only nodes do not).
// Waits poll with generous deadlines; nothing depends on timing to pass.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/result.h"
#include "k8s/deviceplugin/v1beta1/api.grpc.pb.h"
#include "k8s/podresources/v1/api.grpc.pb.h"

namespace nvshare::testing {

// A temporary directory removed with its contents at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct SimPod {
  std::string ns;
  std::string name;
  std::string resource;
  std::vector<std::string> device_ids;
};

// The node's container runtime, as start_container() emulates it.
struct SimRuntime {
  std::vector<std::string> cdi_spec_dirs;               // where it reads CDI specs
  std::map<std::string, std::string> gpu_device_nodes;  // GPU UUID -> /dev/nvidiaN
  bool nvidia_envvar = true;                            // honours NVIDIA_VISIBLE_DEVICES=<UUIDs>
  bool nvidia_volume_mounts = true;  // accept-nvidia-visible-devices-as-volume-mounts
};

struct SimMount {
  std::string host_path;
  bool read_only = false;
  bool operator==(const SimMount&) const = default;
};

// A started container, as its processes see it.
struct SimContainer {
  std::map<std::string, std::string> env;
  std::map<std::string, SimMount> mounts;  // by container path
  std::set<std::string> device_nodes;      // GPU device nodes
};

Result<SimContainer> start_container(const v1beta1::ContainerAllocateResponse& response,
                                     const SimRuntime& runtime);

// Writes a CDI spec of kind nvidia.com/gpu naming each GPU by UUID (as `nvidia-ctk cdi generate
// --device-name-strategy=uuid` does): the device node and NVIDIA_VISIBLE_DEVICES=void.
void write_nvidia_cdi_spec(const std::string& dir, const std::map<std::string, std::string>& nodes);

class KubeletSimulator {
 public:
  explicit KubeletSimulator(std::string dir);
  ~KubeletSimulator();

  void start();    // serves both APIs
  void restart();  // stop, wipe the device-plugins directory, serve kubelet.sock again
  void stop();

  std::string device_plugin_dir() const { return dir_ + "/device-plugins"; }
  std::string kubelet_socket() const { return device_plugin_dir() + "/kubelet.sock"; }
  std::string plugin_socket() const { return device_plugin_dir() + "/nvshare.sock"; }
  std::string pod_resources_socket() const { return dir_ + "/pod-resources.sock"; }

  void set_pods(std::vector<SimPod> pods);
  std::uint64_t list_calls() const;

  // Waits until at least `count` registrations were received; false at the deadline.
  bool wait_for_registrations(std::size_t count,
                              std::chrono::milliseconds deadline = std::chrono::seconds(30));
  std::vector<v1beta1::RegisterRequest> registrations() const;

  // A client of the plugin's socket (a new channel each call).
  std::unique_ptr<v1beta1::DevicePlugin::Stub> plugin() const;

 private:
  class RegistrationService;
  class PodResourcesService;

  void serve_registration();

  std::string dir_;
  std::unique_ptr<RegistrationService> registration_;
  std::unique_ptr<PodResourcesService> pod_resources_;
  std::unique_ptr<grpc::Server> registration_server_;
  std::unique_ptr<grpc::Server> pod_resources_server_;
};

}  // namespace nvshare::testing
