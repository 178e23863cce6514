// The few NVML declarations libnvshare.so needs, written from NVML's public API reference because
// the CUDA toolkit does not ship nvml.h (the driver package does). Layouts and values are NVML's
// ABI: they must not change.
//
// Only what the memory hooks and the context-footprint measurement use is declared: the memory info
// structs (v1 and v2), the handle and UUID lookups, init and shutdown.
#pragma once

#include <cstdint>

extern "C" {

typedef int nvmlReturn_t;
inline constexpr nvmlReturn_t NVML_SUCCESS = 0;
inline constexpr nvmlReturn_t NVML_ERROR_UNINITIALIZED = 1;
inline constexpr nvmlReturn_t NVML_ERROR_INVALID_ARGUMENT = 2;
inline constexpr nvmlReturn_t NVML_ERROR_NOT_SUPPORTED = 3;
inline constexpr nvmlReturn_t NVML_ERROR_NOT_FOUND = 6;
inline constexpr nvmlReturn_t NVML_ERROR_LIBRARY_NOT_FOUND = 12;
inline constexpr nvmlReturn_t NVML_ERROR_FUNCTION_NOT_FOUND = 13;
inline constexpr nvmlReturn_t NVML_ERROR_UNKNOWN = 999;

typedef struct nvmlDevice_st* nvmlDevice_t;

// nvmlDeviceGetMemoryInfo: bytes; used counts reserved memory too.
typedef struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

// nvmlDeviceGetMemoryInfo_v2: `version` must be nvmlMemory_v2; used excludes `reserved`.
typedef struct nvmlMemory_v2_st {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_v2_t;

// NVML_STRUCT_VERSION(Memory, 2): the struct's size with the version in the top byte.
inline constexpr unsigned int nvmlMemory_v2 =
    static_cast<unsigned int>(sizeof(nvmlMemory_v2_t)) | (2u << 24);

// Room for "GPU-" and a 36-character UUID, or a MIG UUID; NVML asks for at least 96 bytes.
inline constexpr unsigned int kNvmlUuidBufferSize = 96;

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory);

}  // extern "C"

// The rest are only called through pointers from libnvidia-ml.so.1, never exported by us.
namespace nvshare::client::nvml {
using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using GetHandleByUuidFn = nvmlReturn_t (*)(const char* uuid, nvmlDevice_t* device);
using GetUuidFn = nvmlReturn_t (*)(nvmlDevice_t device, char* uuid, unsigned int length);
}  // namespace nvshare::client::nvml
