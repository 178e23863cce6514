// PluginServer: the kubelet device plugin for one extended resource (resource-name).
//
// start() enumerates the GPUs (the `gpus` knob selects which), advertises `slots-per-gpu` devices
// per GPU (`<GPU-UUID>__<n>`), serves the DevicePlugin service on <kubelet-dir>/nvshare.sock (a
// stale file there is removed first) and registers with the kubelet on <kubelet-dir>/kubelet.sock.
// A supervisor thread then keeps that true:
//  - it re-registers whenever kubelet.sock is created anew (the kubelet restarted: seen through
//    inotify on the directory and, as a fallback, a periodic check of the socket's identity), and
//    serves again on a fresh nvshare.sock when ours was deleted (a restarting kubelet wipes the
//    directory); registration is retried with capped backoff while the kubelet does not answer;
//  - it polls every GPU's health each health-interval; a change makes every ListAndWatch stream
//    send the new device list (the GPU's slots Unhealthy, or Healthy again);
//  - it pushes the GPU inventory (control API set-gpus: UUIDs and physical memory, where the
//    scheduler takes each GPU's memory from) and, with memory-capacity set, the per-GPU virtual
//    capacities (set-policy `capacity`) to the scheduler until one push succeeds, and again as soon
//    as the control socket is created anew (a restarted scheduler; inotify on its directory).
// GetPreferredAllocation reads the live load from the kubelet's pod-resources API at each call (see
// placement.h); Allocate answers as allocate.h describes, with a settings directory per container
// (container_settings.h, with settings-dir set), which the supervisor completes from pod-resources
// and the pod watcher's limits: every 100 ms while one waits for its pod's limit, else every 2 s.
//
// Threads: gRPC's handler threads and the supervisor share the device state under one mutex.
// stop() ends the streams, the server and the supervisor, removes our socket, and is idempotent;
// the destructor stops.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/gpu_inventory.h"
#include "common/result.h"
#include "deviceplugin/container_settings.h"
#include "deviceplugin/knobs.h"
#include "deviceplugin/placement.h"

namespace nvshare::deviceplugin {

inline constexpr const char* kDevicePluginApiVersion = "v1beta1";
inline constexpr const char* kHealthy = "Healthy";
inline constexpr const char* kUnhealthy = "Unhealthy";

// Memory limits in bytes of the pods on this node, keyed "namespace/name" (pod-resources names pods
// that way). Called at each placement, from a gRPC thread.
using MemoryLimitsSource = std::function<std::map<std::string, std::uint64_t>()>;

struct PluginServerTiming {
  // Longest wait between two checks of the sockets when inotify reports nothing.
  std::chrono::milliseconds socket_check_interval{1000};
  // Registration retry backoff: doubles from initial up to max while the kubelet does not answer.
  std::chrono::milliseconds register_backoff_initial{250};
  std::chrono::milliseconds register_backoff_max{5000};
  std::chrono::milliseconds rpc_timeout{5000};  // Register, pod-resources List, control pushes
};

struct PluginServerStats {
  std::uint64_t registrations = 0;      // successful Register calls
  std::uint64_t register_failures = 0;  // failed attempts
  std::uint64_t serves = 0;             // times the DevicePlugin service started listening
  std::uint64_t health_changes = 0;     // GPU health transitions
  std::uint64_t capacity_pushes = 0;    // inventory (and capacity) pushes a scheduler accepted
  // Allocate: slots handed to containers, by GPU UUID, and calls refused (bad IDs, settings or CDI
  // files that could not be written).
  std::map<std::string, std::uint64_t> allocated_slots;
  std::uint64_t allocate_refusals = 0;
};

class PluginServer {
 public:
  PluginServer(PluginConfig config, std::unique_ptr<GpuInventory> inventory,
               PluginServerTiming timing = {});
  ~PluginServer();
  PluginServer(const PluginServer&) = delete;
  PluginServer& operator=(const PluginServer&) = delete;

  // Errors: the inventory fails, no GPU is selected, a GPU named by the gpus knob does not exist,
  // the socket cannot be served. Registration failing is not an error (it is retried).
  Status start();
  void stop();

  // Set before start().
  void set_memory_limits_source(MemoryLimitsSource source);
  // The pod watcher's limits by "namespace/name", for the containers' settings files; without one,
  // every pod is taken to have no memory limit.
  void set_pod_limits_lookup(PodLimitsLookup lookup);

  std::vector<ManagedGpu> gpus() const;
  PluginServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nvshare::deviceplugin
