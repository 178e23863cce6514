// Exported: initialization, versions and device queries.
#include <cstdio>
#include <cstring>

#include "driver.h"

using fakecuda::Driver;
using fakecuda::guarded;
using fakecuda::require_init;

namespace {

constexpr int kDriverVersion = 13000;
constexpr int kPciBusBase = 0x18;

CUresult checked_device(CUdevice dev, fakecuda::Device** out) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  *out = Driver::instance().device(dev);
  return *out != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

// H100 SXM-like values; attributes not listed are 0. VMM and memory pools read as supported: the
// fake implements cuMemCreate/cuMemMap and cuMemAllocAsync (api_vmm.cc, api_memory.cc).
int attribute_value(CUdevice_attribute attribute, int ordinal) {
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
      return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
      return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
      return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
      return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
      return 1980000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT:
      return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      return 132;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
      return CU_COMPUTEMODE_DEFAULT;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT:
      return 512;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
      return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      return kPciBusBase + ordinal;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
      return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
      return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
      return 50 * 1024 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
      return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
      return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      return 1;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT:
      return 32;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      return 0;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
      return 233472;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
      return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
      return 1;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO:
      return 2;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
      return 0;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      return 232448;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR:
      return 32;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK:
      return 1024;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      return 1;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH:
      return 1;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT:
      return 4;
    default:
      return 0;
  }
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuInit(unsigned int Flags) {
  return guarded([&] { return Driver::instance().init(Flags); });
}

CUresult CUDAAPI cuDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = kDriverVersion;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (Driver::instance().device(ordinal) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = Driver::instance().device_count();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  return guarded([&] {
    fakecuda::Device* d = nullptr;
    if (CUresult rc = checked_device(dev, &d); rc != CUDA_SUCCESS) return rc;
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    std::snprintf(name, static_cast<std::size_t>(len), "%s",
                  Driver::instance().config().device_name.c_str());
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  return guarded([&] {
    fakecuda::Device* d = nullptr;
    if (CUresult rc = checked_device(dev, &d); rc != CUDA_SUCCESS) return rc;
    if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(uuid->bytes, d->uuid_bytes.data(), sizeof uuid->bytes);
    return CUDA_SUCCESS;
  });
}

// The CUDA 9.2 form differs only for MIG instances, which the fake does not have.
CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  return cuDeviceGetUuid_v2(uuid, dev);
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  return guarded([&] {
    fakecuda::Device* d = nullptr;
    if (CUresult rc = checked_device(dev, &d); rc != CUDA_SUCCESS) return rc;
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *bytes = d->sim.total_bytes();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  return guarded([&] {
    fakecuda::Device* d = nullptr;
    if (CUresult rc = checked_device(dev, &d); rc != CUDA_SUCCESS) return rc;
    if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *pi = attribute_value(attrib, dev);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  return guarded([&] {
    fakecuda::Device* d = nullptr;
    if (CUresult rc = checked_device(dev, &d); rc != CUDA_SUCCESS) return rc;
    if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    std::snprintf(pciBusId, static_cast<std::size_t>(len), "00000000:%02X:00.0", kPciBusBase + dev);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (dev == nullptr || pciBusId == nullptr) return CUDA_ERROR_INVALID_VALUE;
    unsigned domain = 0;
    unsigned bus = 0;
    unsigned device = 0;
    unsigned function = 0;
    if (std::sscanf(pciBusId, "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    int ordinal = static_cast<int>(bus) - kPciBusBase;
    if (domain != 0 || device != 0 || Driver::instance().device(ordinal) == nullptr) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    *dev = ordinal;
    return CUDA_SUCCESS;
  });
}

}  // extern "C"
