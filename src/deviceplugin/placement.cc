#include "deviceplugin/placement.h"

#include <algorithm>
#include <charconv>
#include <tuple>

namespace nvshare::deviceplugin {
namespace {

constexpr std::string_view kSlotSeparator = "__";

const ManagedGpu* find_gpu(const std::vector<ManagedGpu>& gpus, const std::string& uuid) {
  for (const ManagedGpu& gpu : gpus) {
    if (gpu.uuid == uuid) return &gpu;
  }
  return nullptr;
}

// The ID names a slot of a managed GPU.
bool managed(const std::vector<ManagedGpu>& gpus, const std::optional<DeviceId>& id) {
  if (!id) return false;
  const ManagedGpu* gpu = find_gpu(gpus, id->gpu_uuid);
  return gpu != nullptr && id->slot < gpu->slots;
}

}  // namespace

std::string make_device_id(std::string_view gpu_uuid, int slot) {
  return std::string(gpu_uuid) + std::string(kSlotSeparator) + std::to_string(slot);
}

std::optional<DeviceId> parse_device_id(std::string_view id) {
  const std::size_t separator = id.rfind(kSlotSeparator);
  if (separator == std::string_view::npos || separator == 0) return std::nullopt;
  const std::string_view number = id.substr(separator + kSlotSeparator.size());
  int slot = 0;
  const auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), slot);
  if (number.empty() || ec != std::errc() || ptr != number.data() + number.size() || slot < 0 ||
      (number.size() > 1 && number.front() == '0')) {
    return std::nullopt;
  }
  return DeviceId{std::string(id.substr(0, separator)), slot};
}

std::map<std::string, GpuLoad> compute_load(
    const std::vector<ManagedGpu>& gpus, const std::vector<LivePod>& pods,
    const std::map<std::string, std::uint64_t>& memory_limits,
    const std::optional<std::vector<std::string>>& available) {
  std::map<std::string, GpuLoad> load;
  for (const ManagedGpu& gpu : gpus) load[gpu.uuid];

  std::set<std::string> held_ids;
  for (const LivePod& pod : pods) {
    std::set<std::string> pod_gpus;
    for (const std::string& id : pod.device_ids) {
      auto parsed = parse_device_id(id);
      if (!managed(gpus, parsed)) continue;
      held_ids.insert(id);
      pod_gpus.insert(parsed->gpu_uuid);
    }
    const auto limit = memory_limits.find(pod.key);
    for (const std::string& uuid : pod_gpus) {
      GpuLoad& entry = load[uuid];
      ++entry.pods;
      if (limit != memory_limits.end()) entry.memory_held += limit->second;
    }
  }

  if (available) {
    const std::set<std::string> free_ids(available->begin(), available->end());
    for (const ManagedGpu& gpu : gpus) {
      if (!gpu.healthy) continue;  // the kubelet leaves unhealthy slots out of the available list
      for (int slot = 0; slot < gpu.slots; ++slot) {
        const std::string id = make_device_id(gpu.uuid, slot);
        if (!free_ids.contains(id) && !held_ids.contains(id)) ++load[gpu.uuid].pods;
      }
    }
  }
  return load;
}

Result<std::vector<std::string>> preferred_devices(const std::vector<ManagedGpu>& gpus,
                                                   const std::map<std::string, GpuLoad>& load,
                                                   const PlacementRequest& request) {
  if (request.size < 1) {
    return make_error("allocation size " + std::to_string(request.size) + " is below 1");
  }
  if (request.must_include.size() > static_cast<std::size_t>(request.size)) {
    return make_error(std::to_string(request.must_include.size()) +
                      " must-include devices exceed the allocation size " +
                      std::to_string(request.size));
  }

  std::vector<std::string> chosen;
  std::set<std::string> taken;
  std::map<std::string, int> chosen_per_gpu;
  for (const std::string& id : request.must_include) {
    if (!taken.insert(id).second) continue;
    chosen.push_back(id);
    auto parsed = parse_device_id(id);
    if (parsed && ++chosen_per_gpu[parsed->gpu_uuid] > 1) {
      return make_error("must-include devices name GPU " + parsed->gpu_uuid +
                        " twice: a container's slots must lie on distinct GPUs");
    }
  }

  // Free slots per managed GPU, lowest slot first.
  std::map<std::string, std::set<int>> free_slots;
  for (const std::string& id : request.available) {
    auto parsed = parse_device_id(id);
    if (!managed(gpus, parsed) || taken.contains(id)) continue;
    free_slots[parsed->gpu_uuid].insert(parsed->slot);
  }

  while (chosen.size() < static_cast<std::size_t>(request.size)) {
    const ManagedGpu* best = nullptr;
    auto best_key = std::make_tuple(0, 0, 0.0, 0u);
    for (const ManagedGpu& gpu : gpus) {
      auto slots = free_slots.find(gpu.uuid);
      if (slots == free_slots.end() || slots->second.empty()) continue;
      if (chosen_per_gpu[gpu.uuid] > 0) continue;  // one slot per GPU and container
      const auto found = load.find(gpu.uuid);
      const GpuLoad gpu_load = found != load.end() ? found->second : GpuLoad{};
      const double held_share =
          gpu.capacity_bytes == 0
              ? 0.0
              : static_cast<double>(gpu_load.memory_held) / static_cast<double>(gpu.capacity_bytes);
      const auto key =
          std::make_tuple(chosen_per_gpu[gpu.uuid], gpu_load.pods, held_share, gpu.index);
      if (best == nullptr || key < best_key) {
        best = &gpu;
        best_key = key;
      }
    }
    if (best == nullptr) {
      return make_error("only " + std::to_string(chosen.size()) + " of " +
                        std::to_string(request.size) +
                        " requested devices are available on distinct GPUs (a container's slots "
                        "must lie on distinct GPUs)");
    }
    std::set<int>& slots = free_slots[best->uuid];
    const int slot = *slots.begin();
    slots.erase(slots.begin());
    chosen.push_back(make_device_id(best->uuid, slot));
    ++chosen_per_gpu[best->uuid];
  }
  return chosen;
}

}  // namespace nvshare::deviceplugin
