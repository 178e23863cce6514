// Exported: cuGetErrorName and cuGetErrorString. Both work before cuInit, as in the real driver.
#include "cuda_api.h"

namespace {

// (code, description). Names come from the enumerator itself, so they match cuda.h exactly.
#define FAKECUDA_ERRORS(X)                                                                     \
  X(CUDA_SUCCESS, "no error")                                                                  \
  X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                              \
  X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                                 \
  X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                                        \
  X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                          \
  X(CUDA_ERROR_PROFILER_DISABLED, "profiler disabled while using an external profiling tool")  \
  X(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library")                                  \
  X(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "operation requires a newer driver")                \
  X(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable")        \
  X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                                \
  X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                                       \
  X(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")                                \
  X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                                      \
  X(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current")                             \
  X(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed")                                  \
  X(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed")                              \
  X(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device")  \
  X(CUDA_ERROR_UNSUPPORTED_LIMIT, "limit is not supported on this architecture")               \
  X(CUDA_ERROR_CONTEXT_ALREADY_IN_USE,                                                         \
    "exclusive-thread device already in use by a different thread")                            \
  X(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed")                                    \
  X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION,                                                        \
    "the provided PTX was compiled with an unsupported toolchain")                             \
  X(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid")                               \
  X(CUDA_ERROR_FILE_NOT_FOUND, "file not found")                                               \
  X(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "shared object symbol not found")               \
  X(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object initialization failed")               \
  X(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS")       \
  X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                                      \
  X(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state")        \
  X(CUDA_ERROR_LOSSY_QUERY, "attempted introspection would be semantically lossy")             \
  X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                            \
  X(CUDA_ERROR_NOT_READY, "device not ready")                                                  \
  X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")                    \
  X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch")             \
  X(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated")                      \
  X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled")                  \
  X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled")                    \
  X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "cannot set while device is active in this process")    \
  X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                                   \
  X(CUDA_ERROR_ASSERT, "device-side assert triggered")                                         \
  X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,                                                 \
    "part or all of the requested memory range is already mapped")                             \
  X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,                                                     \
    "pointer does not correspond to a registered memory region")                               \
  X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                                    \
  X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "too many blocks in cooperative launch")          \
  X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                                       \
  X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                                       \
  X(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized")                                 \
  X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,                                                         \
    "system has unsupported display driver / cuda driver combination")                         \
  X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing") \
  X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,                                                     \
    "operation failed due to a previous error during capture")                                 \
  X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,                                                    \
    "attempt to terminate a thread-local capture sequence from another thread")                \
  X(CUDA_ERROR_TIMEOUT, "wait operation timed out")                                            \
  X(CUDA_ERROR_UNKNOWN, "unknown error")

struct ErrorEntry {
  CUresult code;
  const char* name;
  const char* description;
};

#define FAKECUDA_ERROR_ENTRY(code, description) {code, #code, description},
constexpr ErrorEntry kErrors[] = {FAKECUDA_ERRORS(FAKECUDA_ERROR_ENTRY)};
#undef FAKECUDA_ERROR_ENTRY

const ErrorEntry* find_error(CUresult code) {
  for (const ErrorEntry& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorEntry* e = find_error(error);
  *pStr = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorEntry* e = find_error(error);
  *pStr = e != nullptr ? e->description : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // extern "C"
