// Placement: which advertised slots a container should get, as pure functions of the live state.
//
// Device IDs are `<GPU-UUID>__<n>`: slot n of that GPU. The load of a GPU is measured at call time
// from two live sources and never accumulated across calls:
//  - the pods the kubelet's pod-resources List() shows holding slots of the GPU (a pod counts once
//    per GPU however many of its slots lie there), plus the memory limits those pods hold when
//    known;
//  - slots of the GPU that are neither available (the kubelet's available_deviceIDs) nor held by a
//    listed pod nor unhealthy: a container allocated a moment ago that List() does not show yet.
//    Each counts as one more pod.
// preferred_devices then fills the request GPU by GPU, one slot per GPU (a multi-slot request asks
// for that many GPUs, so its slots lie on distinct GPUs or the request fails): the GPU with the
// fewest live pods first, then the smallest share of its capacity held, then GPU order; within a
// GPU the lowest free slot number.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace nvshare::deviceplugin {

struct DeviceId {
  std::string gpu_uuid;
  int slot = 0;
};

std::string make_device_id(std::string_view gpu_uuid, int slot);
// Splits `<uuid>__<n>`; nullopt when the text is not of that form.
std::optional<DeviceId> parse_device_id(std::string_view id);

struct ManagedGpu {
  std::string uuid;
  unsigned index = 0;
  std::uint64_t capacity_bytes = 0;  // virtual capacity (memory-capacity), else physical
  int slots = 0;
  bool healthy = true;
  std::uint64_t memory_bytes = 0;  // physical, as NVML reports it
};

// One pod from pod-resources: its key ("namespace/name") and the device IDs of the plugin's
// resource its containers hold (all of them, and per container).
struct LivePod {
  std::string key;
  std::vector<std::string> device_ids;
  std::vector<std::vector<std::string>> containers;
};

struct GpuLoad {
  int pods = 0;
  std::uint64_t memory_held = 0;  // sum of the known memory limits of those pods
};

// The load of every managed GPU (a map entry for each). `memory_limits` maps pod keys to memory
// limits in bytes (pods absent hold nothing known). `available` is the kubelet's available list, or
// nullopt when unknown (then only the listed pods count).
std::map<std::string, GpuLoad> compute_load(
    const std::vector<ManagedGpu>& gpus, const std::vector<LivePod>& pods,
    const std::map<std::string, std::uint64_t>& memory_limits,
    const std::optional<std::vector<std::string>>& available);

struct PlacementRequest {
  std::vector<std::string> available;
  std::vector<std::string> must_include;
  int size = 0;
};

// The preferred device IDs: every must-include ID first, then the choice described above among
// `available`. Errors: a size below 1, a must-include ID of more than `size` IDs, must-include IDs
// that share a GPU, or fewer GPUs with an available slot than asked for. IDs this plugin does not
// manage are never chosen.
Result<std::vector<std::string>> preferred_devices(const std::vector<ManagedGpu>& gpus,
                                                   const std::map<std::string, GpuLoad>& load,
                                                   const PlacementRequest& request);

}  // namespace nvshare::deviceplugin
