// GpuInventory: the physical GPUs of this node and their health, behind an interface so the device
// plugin and the scheduler can run against NVML on a node and against a scripted inventory in
// tests. The scheduler takes each GPU's memory from here, never from its clients.
//
// Contract: list() enumerates the GPUs once (index order); check_health(uuid) says whether that GPU
// answers now: Ok, or an error naming what failed ("GPU is lost", "not found"). A GPU that fails
// and later answers again is reported healthy again: health is a state, never a latch. Both may be
// called from any thread, but not concurrently (each owner calls them from one thread). Only the
// standard library and dlopen: common stays free of other dependencies.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "common/result.h"

namespace nvshare {

struct GpuInfo {
  std::string uuid;
  unsigned index = 0;
  std::uint64_t memory_bytes = 0;  // physical memory
};

// [{"uuid":..., "memory_bytes":...}, ...]: how GPUs travel in the control protocol and the state
// file.
Json gpus_json(const std::vector<GpuInfo>& gpus);

class GpuInventory {
 public:
  virtual ~GpuInventory() = default;
  virtual Result<std::vector<GpuInfo>> list() = 0;
  virtual Status check_health(const std::string& uuid) = 0;
};

// NVML through dlopen("libnvidia-ml.so.1") (the driver's library, found through the loader's search
// path). Errors: the library or a required symbol is missing, or nvmlInit fails. Health: the GPU is
// looked up by UUID and its memory read on every check; any NVML error (GPU lost, not found,
// unknown) makes it unhealthy.
Result<std::unique_ptr<GpuInventory>> open_nvml_inventory();

}  // namespace nvshare
