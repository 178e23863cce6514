#include "common/gpu_inventory.h"

#include <dlfcn.h>

// NVML's ABI, the few declarations used here (written from the public API reference; the driver
// package ships nvml.h, the build machine need not have it). The structs are NVML's own, at global
// scope under their C names, so that a function called through one of these pointer types has the
// type it was defined with (UBSan's function check compares them).
struct nvmlDevice_st;
struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

namespace nvshare {
namespace {

using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlErrorGpuIsLost = 15;
using nvmlDevice_t = ::nvmlDevice_st*;
using nvmlMemory_t = ::nvmlMemory_st;
constexpr unsigned kUuidBufferSize = 96;

using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using ErrorStringFn = const char* (*)(nvmlReturn_t);
using GetCountFn = nvmlReturn_t (*)(unsigned*);
using GetHandleByIndexFn = nvmlReturn_t (*)(unsigned, nvmlDevice_t*);
using GetHandleByUuidFn = nvmlReturn_t (*)(const char*, nvmlDevice_t*);
using GetUuidFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned);
using GetMemoryInfoFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);

class NvmlInventory final : public GpuInventory {
 public:
  ~NvmlInventory() override {
    if (initialized_) shutdown_();
    // The library stays loaded: NVML may keep threads of its own.
  }

  Status open() {
    library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library_ == nullptr) {
      const char* why = dlerror();
      return make_error(std::string("cannot load libnvidia-ml.so.1 (is the NVIDIA driver "
                                    "installed and visible to this container?): ") +
                        (why != nullptr ? why : "unknown error"));
    }
    if (Status s = bind(init_, "nvmlInit_v2"); !s) return s;
    if (Status s = bind(shutdown_, "nvmlShutdown"); !s) return s;
    if (Status s = bind(get_count_, "nvmlDeviceGetCount_v2"); !s) return s;
    if (Status s = bind(get_by_index_, "nvmlDeviceGetHandleByIndex_v2"); !s) return s;
    if (Status s = bind(get_by_uuid_, "nvmlDeviceGetHandleByUUID"); !s) return s;
    if (Status s = bind(get_uuid_, "nvmlDeviceGetUUID"); !s) return s;
    if (Status s = bind(get_memory_, "nvmlDeviceGetMemoryInfo"); !s) return s;
    error_string_ = reinterpret_cast<ErrorStringFn>(dlsym(library_, "nvmlErrorString"));
    if (nvmlReturn_t rc = init_(); rc != kNvmlSuccess) {
      return make_error("nvmlInit failed: " + describe(rc));
    }
    initialized_ = true;
    return Status::Ok();
  }

  Result<std::vector<GpuInfo>> list() override {
    unsigned count = 0;
    if (nvmlReturn_t rc = get_count_(&count); rc != kNvmlSuccess) {
      return make_error("nvmlDeviceGetCount failed: " + describe(rc));
    }
    std::vector<GpuInfo> gpus;
    for (unsigned i = 0; i < count; ++i) {
      nvmlDevice_t device = nullptr;
      if (nvmlReturn_t rc = get_by_index_(i, &device); rc != kNvmlSuccess) {
        return make_error("GPU " + std::to_string(i) + ": no handle: " + describe(rc));
      }
      char uuid[kUuidBufferSize] = {};
      if (nvmlReturn_t rc = get_uuid_(device, uuid, sizeof uuid); rc != kNvmlSuccess) {
        return make_error("GPU " + std::to_string(i) + ": no UUID: " + describe(rc));
      }
      nvmlMemory_t memory{};
      if (nvmlReturn_t rc = get_memory_(device, &memory); rc != kNvmlSuccess) {
        return make_error("GPU " + std::to_string(i) + " (" + uuid +
                          "): memory unreadable: " + describe(rc));
      }
      gpus.push_back(GpuInfo{uuid, i, memory.total});
    }
    return gpus;
  }

  Status check_health(const std::string& uuid) override {
    nvmlDevice_t device = nullptr;
    if (nvmlReturn_t rc = get_by_uuid_(uuid.c_str(), &device); rc != kNvmlSuccess) {
      return make_error("lookup by UUID failed: " + describe(rc));
    }
    nvmlMemory_t memory{};
    if (nvmlReturn_t rc = get_memory_(device, &memory); rc != kNvmlSuccess) {
      return make_error("memory query failed: " + describe(rc));
    }
    return Status::Ok();
  }

 private:
  template <typename Fn>
  Status bind(Fn& fn, const char* name) {
    fn = reinterpret_cast<Fn>(dlsym(library_, name));
    if (fn == nullptr) return make_error(std::string("libnvidia-ml.so.1 lacks ") + name);
    return Status::Ok();
  }

  std::string describe(nvmlReturn_t rc) const {
    std::string text = error_string_ != nullptr ? error_string_(rc) : "NVML error";
    if (rc == kNvmlErrorGpuIsLost) text = "GPU is lost";
    return text + " (" + std::to_string(rc) + ")";
  }

  void* library_ = nullptr;
  bool initialized_ = false;
  InitFn init_ = nullptr;
  ShutdownFn shutdown_ = nullptr;
  ErrorStringFn error_string_ = nullptr;
  GetCountFn get_count_ = nullptr;
  GetHandleByIndexFn get_by_index_ = nullptr;
  GetHandleByUuidFn get_by_uuid_ = nullptr;
  GetUuidFn get_uuid_ = nullptr;
  GetMemoryInfoFn get_memory_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<GpuInventory>> open_nvml_inventory() {
  auto inventory = std::make_unique<NvmlInventory>();
  if (Status s = inventory->open(); !s) return s.error();
  return std::unique_ptr<GpuInventory>(std::move(inventory));
}

Json gpus_json(const std::vector<GpuInfo>& gpus) {
  Json list = Json::array();
  for (const GpuInfo& gpu : gpus) {
    Json entry = Json::object();
    entry.set("uuid", gpu.uuid);
    entry.set("memory_bytes", gpu.memory_bytes);
    list.push_back(std::move(entry));
  }
  return list;
}

}  // namespace nvshare
