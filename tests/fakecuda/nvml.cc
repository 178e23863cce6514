// The simulated libnvidia-ml.so.1: the few NVML calls that read the simulated GPUs' memory (what
// nvidia-smi and the client library's context-footprint measurement ask), from the same
// configuration and shared state file as the simulated libcuda.so.1.
//
// Devices are the ones NVSHARE_FAKECUDA_* configures for this process, in the same order and with
// the same UUIDs. Memory: total = the device's memory, used = device allocations (contexts' own
// memory included) + managed bytes resident, over every process sharing the state file, free = the
// rest; reserved reads 0. Only nvml* symbols are exported (libnvidia-ml.map).
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "client/hooks/nvml_api.h"
#include "config.h"
#include "shared_state.h"

struct nvmlDevice_st {
  fakecuda::DeviceConfig config;
  fakecuda::DeviceRecord* record = nullptr;
};

namespace {

constexpr nvmlReturn_t kDriverNotLoaded = 9;

std::mutex g_mu;
int g_init_count = 0;
bool g_loaded = false;
// Loaded once per process and kept: handles stay valid across shutdown/init, as in real NVML.
std::vector<std::unique_ptr<nvmlDevice_st>>* g_devices = nullptr;

nvmlReturn_t load() {
  std::lock_guard lock(g_mu);
  if (!g_loaded) {
    auto config = fakecuda::load_config();
    if (!config.ok()) return kDriverNotLoaded;
    auto state = fakecuda::SharedState::open(config.value().state_path, /*create=*/true);
    if (!state.ok()) return kDriverNotLoaded;
    auto devices = new std::vector<std::unique_ptr<nvmlDevice_st>>();
    for (const fakecuda::DeviceConfig& device : config.value().devices) {
      auto record = state.value()->device(device.uuid, device.total_bytes);
      if (!record.ok()) return kDriverNotLoaded;
      devices->push_back(std::make_unique<nvmlDevice_st>(nvmlDevice_st{device, record.value()}));
    }
    g_devices = devices;
    g_loaded = true;
  }
  ++g_init_count;
  return NVML_SUCCESS;
}

bool initialized() {
  std::lock_guard lock(g_mu);
  return g_init_count > 0;
}

nvmlReturn_t check(nvmlDevice_t device) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  for (const auto& known : *g_devices) {
    if (known.get() == device) return NVML_SUCCESS;
  }
  return NVML_ERROR_INVALID_ARGUMENT;
}

fakecuda::MemoryTotals memory(nvmlDevice_t device) {
  fakecuda::SimDevice sim(device->record);
  sim.maybe_reap();
  return sim.memory();
}

}  // namespace

extern "C" {

nvmlReturn_t nvmlInit_v2() { return load(); }
nvmlReturn_t nvmlInit() { return load(); }
nvmlReturn_t nvmlInitWithFlags(unsigned int /*flags*/) { return load(); }

nvmlReturn_t nvmlShutdown() {
  std::lock_guard lock(g_mu);
  if (g_init_count == 0) return NVML_ERROR_UNINITIALIZED;
  --g_init_count;
  return NVML_SUCCESS;
}

const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_FOUND:
      return "Not Found";
    case kDriverNotLoaded:
      return "Driver Not Loaded";
    default:
      return "Unknown Error";
  }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *count = static_cast<unsigned int>(g_devices->size());
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int* count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (device == nullptr || index >= g_devices->size()) return NVML_ERROR_INVALID_ARGUMENT;
  *device = (*g_devices)[index].get();
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (uuid == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  for (const auto& known : *g_devices) {
    if (known->config.uuid == uuid) {
      *device = known.get();
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  if (nvmlReturn_t rc = check(device); rc != NVML_SUCCESS) return rc;
  if (uuid == nullptr || length <= device->config.uuid.size()) return NVML_ERROR_INVALID_ARGUMENT;
  std::memcpy(uuid, device->config.uuid.c_str(), device->config.uuid.size() + 1);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  if (nvmlReturn_t rc = check(device); rc != NVML_SUCCESS) return rc;
  if (name == nullptr || length == 0) return NVML_ERROR_INVALID_ARGUMENT;
  std::snprintf(name, length, "NVIDIA H100 (nvshare fakecuda)");
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* out) {
  if (nvmlReturn_t rc = check(device); rc != NVML_SUCCESS) return rc;
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  const fakecuda::MemoryTotals m = memory(device);
  out->total = m.total;
  out->used = m.used() < m.total ? m.used() : m.total;
  out->free = m.free();
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* out) {
  if (nvmlReturn_t rc = check(device); rc != NVML_SUCCESS) return rc;
  if (out == nullptr || out->version != nvmlMemory_v2) return NVML_ERROR_INVALID_ARGUMENT;
  const fakecuda::MemoryTotals m = memory(device);
  out->total = m.total;
  out->reserved = 0;
  out->used = m.used() < m.total ? m.used() : m.total;
  out->free = m.free();
  return NVML_SUCCESS;
}

}  // extern "C"
