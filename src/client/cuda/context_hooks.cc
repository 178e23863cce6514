// Initialization, context and stream-capture hooks (families kInit, kContext, kCapture).
//
// Contexts. The first context this process makes on a GPU is measured: NVML's used memory of that
// GPU before and after the real call, under a lock shared with the other processes on that GPU so
// that their contexts are not counted (context_footprint.h: a bounded wait; only a measurement on
// an otherwise idle GPU is taken, and recorded; a GPU in use, a timeout, no NVML or an implausible
// result charge the footprint recorded for that GPU, or kDefaultContextBytes). The bytes are
// charged to the GPU's ledger for the rest of the process's life, so a limit covers the context's
// own memory too. Calls that may end a context run under the GPU's tracker lock and then move the
// context generation, so no thread keeps using a stale context
// -> GPU mapping.
//
// Capture. Begin/end of every capture form feed WorkTracker, which keeps markers and
// synchronization out of open captures. The per-thread default stream (the null handle in the _ptsz
// forms) is tracked as CU_STREAM_PER_THREAD so both spellings match.
#include <optional>

#include "client/config.h"
#include "client/cuda/context_footprint.h"
#include "client/cuda/device_state.h"
#include "client/cuda/ipc.h"
#include "client/hooks/hook_table.h"
#include "client/hooks/impl.h"
#include "common/log.h"
#include "common/quantity.h"

namespace nvshare::client::hooks::impl {
namespace {

using cuda::DeviceState;

// Whether NVML can be asked at all (without it nothing is measured, so nothing is locked).
bool nvml_present() {
  const NvmlApi& api = nvml_api();
  return (real<HookId::nvmlDeviceGetMemoryInfo_v2>() != nullptr ||
          real<HookId::nvmlDeviceGetMemoryInfo>() != nullptr) &&
         api.init != nullptr && api.get_handle_by_uuid != nullptr;
}

struct NvmlUsed {
  std::uint64_t all = 0;      // used, the driver's reservation included (what contexts add to)
  std::uint64_t by_apps = 0;  // used without the reservation: 0 on an idle GPU
};

// NVML's used bytes on the GPU with this UUID, or nothing when NVML cannot say. The _v2 query
// tells the driver's reservation apart (618 MiB on an idle H200 with driver 580, which the first
// form counts as used); without it both numbers are the first form's.
std::optional<NvmlUsed> nvml_used(const std::string& uuid) {
  auto memory_v2 = real<HookId::nvmlDeviceGetMemoryInfo_v2>();
  auto memory_v1 = real<HookId::nvmlDeviceGetMemoryInfo>();
  const NvmlApi& api = nvml_api();
  if ((memory_v2 == nullptr && memory_v1 == nullptr) || api.init == nullptr ||
      api.get_handle_by_uuid == nullptr || api.init() != NVML_SUCCESS) {
    return std::nullopt;
  }
  std::optional<NvmlUsed> used;
  nvmlDevice_t handle = nullptr;
  if (api.get_handle_by_uuid(uuid.c_str(), &handle) == NVML_SUCCESS) {
    nvmlMemory_v2_t memory2{};
    memory2.version = nvmlMemory_v2;
    nvmlMemory_t memory{};
    if (memory_v2 != nullptr && memory_v2(handle, &memory2) == NVML_SUCCESS) {
      used = NvmlUsed{memory2.used + memory2.reserved, memory2.used};
    } else if (memory_v1 != nullptr && memory_v1(handle, &memory) == NVML_SUCCESS) {
      used = NvmlUsed{memory.used, memory.used};
    }
  }
  if (api.shutdown != nullptr) api.shutdown();
  return used;
}

// Runs a context-creating call on GPU `dev`; the first context of the process on that GPU is
// measured and charged. `created` receives the new context.
template <typename Create>
CUresult create_context(CUdevice dev, CUcontext* created, bool primary, Create&& create) {
  DeviceState* device = cuda::devices().get(dev);
  if (device == nullptr) return create();  // cuInit not done, or a bad ordinal: the driver says so
  CUresult rc = CUDA_SUCCESS;
  if (device->footprint_charged.load(std::memory_order_acquire)) {
    rc = create();
  } else {
    std::lock_guard lock(device->footprint_mu);
    if (device->footprint_charged.load(std::memory_order_acquire)) {
      rc = create();
    } else {
      const std::string& uuid = device->identity.gpu_uuid;
      std::optional<cuda::FootprintLock> shared;
      if (nvml_present()) {
        shared.emplace(client_config().socket_path, uuid, cuda::kFootprintLockWait);
      }
      // Measured only when no other process's measurement (its context creation) is under way.
      const bool measure = shared && !shared->timed_out();
      const std::optional<NvmlUsed> before = measure ? nvml_used(uuid) : std::nullopt;
      rc = create();
      if (rc == CUDA_SUCCESS) {
        const std::optional<NvmlUsed> after = before ? nvml_used(uuid) : std::nullopt;
        const std::optional<std::uint64_t> known = shared ? shared->known() : std::nullopt;
        std::uint64_t bytes = known.value_or(cuda::kDefaultContextBytes);
        const char* how = known ? "as measured alone on this GPU" : "assumed";
        if (before && after) {
          const std::uint64_t measured = after->all > before->all ? after->all - before->all : 0;
          if (measured > cuda::kMaxContextBytes) {
            NVSHARE_DEBUG("%s: context footprint measured as %s, over %s: taken for noise",
                          uuid.c_str(), format_bytes(measured).c_str(),
                          format_bytes(cuda::kMaxContextBytes).c_str());
          } else if (before->by_apps <= cuda::kIdleUsedBytes) {
            // Alone on the GPU: this is the footprint.
            bytes = measured;
            how = shared->held() ? "measured" : "measured without the lock";
            shared->record(measured);
          } else {
            // Beside other contexts the driver allocates part of a new one later: not the
            // footprint.
            NVSHARE_DEBUG("%s: context footprint measured as %s beside %s in use: not used",
                          uuid.c_str(), format_bytes(measured).c_str(),
                          format_bytes(before->by_apps).c_str());
          }
        } else if (shared && shared->timed_out()) {
          NVSHARE_DEBUG("%s: %s stayed locked for %lld ms; the context is not measured",
                        uuid.c_str(), shared->path().c_str(),
                        static_cast<long long>(cuda::kFootprintLockWait.count()));
        }
        shared.reset();  // released before anything else happens
        device->footprint_bytes = bytes;
        device->ledger.charge(bytes);
        device->footprint_charged.store(true, std::memory_order_release);
        device->link->usage_changed();
        NVSHARE_DEBUG("%s: the CUDA context takes %s (%s)", uuid.c_str(),
                      format_bytes(bytes).c_str(), how);
      }
    }
  }
  if (rc == CUDA_SUCCESS && created != nullptr && *created != nullptr) {
    if (primary) device->primary.store(*created, std::memory_order_release);
    device->tracker.note_context(*created);
  }
  return rc;
}

// A call that may end the primary context of `dev` (release, reset).
template <typename Call>
CUresult end_primary(CUdevice dev, bool always_ends, Call&& call) {
  DeviceState* device = cuda::devices().find(dev);
  CUcontext primary = device != nullptr ? device->primary.load() : nullptr;
  CUresult rc = CUDA_SUCCESS;
  if (primary == nullptr) {
    rc = call();
  } else {
    rc = device->tracker.around_context_end(primary, call, [&] {
      if (always_ends) return true;
      unsigned flags = 0;
      int active = 1;
      return driver().cuDevicePrimaryCtxGetState != nullptr &&
             driver().cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS &&
             active == 0;
    });
  }
  cuda::contexts_changed();
  return rc;
}

CUstream tracked_stream(CUstream stream, bool per_thread) {
  return per_thread && stream == nullptr ? CU_STREAM_PER_THREAD : stream;
}

template <typename Call>
CUresult begin_capture(CUstream stream, bool per_thread, Call&& call) {
  const cuda::CurrentDevice current = cuda::current_device();
  if (current.device == nullptr) return call();
  return current.device->tracker.begin_capture(tracked_stream(stream, per_thread), call);
}

template <typename Call>
CUresult end_capture(CUstream stream, bool per_thread, Call&& call) {
  const CUresult rc = call();
  const cuda::CurrentDevice current = cuda::current_device();
  if (current.device != nullptr) {
    current.device->tracker.end_capture(tracked_stream(stream, per_thread));
  }
  return rc;
}

}  // namespace

CUresult cuInit(unsigned int Flags) {
  auto fn = real<HookId::cuInit>();
  return fn != nullptr ? fn(Flags) : CUDA_ERROR_NOT_FOUND;
}

CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  auto fn = real<HookId::cuCtxCreate_v2>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return create_context(dev, pctx, false, [&] { return fn(pctx, flags, dev); });
}

CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                        unsigned int flags, CUdevice dev) {
  auto fn = real<HookId::cuCtxCreate_v3>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return create_context(dev, pctx, false,
                        [&] { return fn(pctx, paramsArray, numParams, flags, dev); });
}

#if CUDA_VERSION >= 12050
CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* ctxCreateParams, unsigned int flags,
                        CUdevice dev) {
  auto fn = real<HookId::cuCtxCreate_v4>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return create_context(dev, pctx, false, [&] { return fn(pctx, ctxCreateParams, flags, dev); });
}
#endif

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  auto fn = real<HookId::cuCtxDestroy_v2>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  DeviceState* device = cuda::devices().find_by_context(ctx);
  const CUresult rc = device != nullptr ? device->tracker.around_context_end(
                                              ctx, [&] { return fn(ctx); }, [] { return true; })
                                        : fn(ctx);
  cuda::contexts_changed();
  return rc;
}

// The current context's GPU may now read and write the peer context's memory: the peer GPU's
// device-backed allocations grant it access (now, and whenever they are mapped again).
CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  auto fn = real<HookId::cuCtxEnablePeerAccess>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = fn(peerContext, Flags);
  if (rc != CUDA_SUCCESS || !cuda::library_enabled()) return rc;
  const hooks::DriverApi& api = hooks::driver();
  CUdevice self = -1;
  CUdevice peer = -1;
  if (api.cuCtxGetDevice == nullptr || api.cuCtxGetDevice(&self) != CUDA_SUCCESS ||
      api.cuCtxPushCurrent_v2 == nullptr || api.cuCtxPopCurrent_v2 == nullptr ||
      api.cuCtxPushCurrent_v2(peerContext) != CUDA_SUCCESS) {
    return rc;
  }
  api.cuCtxGetDevice(&peer);
  CUcontext popped = nullptr;
  api.cuCtxPopCurrent_v2(&popped);
  if (DeviceState* owner = cuda::devices().find(peer)) owner->backing.grant_peer(self);
  cuda::grant_peer_to_imports(peer, self);
  return rc;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  auto fn = real<HookId::cuDevicePrimaryCtxRetain>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return create_context(dev, pctx, true, [&] { return fn(pctx, dev); });
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  auto fn = real<HookId::cuDevicePrimaryCtxRelease>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return end_primary(dev, false, [&] { return fn(dev); });
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  auto fn = real<HookId::cuDevicePrimaryCtxRelease_v2>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return end_primary(dev, false, [&] { return fn(dev); });
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  auto fn = real<HookId::cuDevicePrimaryCtxReset>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return end_primary(dev, true, [&] { return fn(dev); });
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  auto fn = real<HookId::cuDevicePrimaryCtxReset_v2>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return end_primary(dev, true, [&] { return fn(dev); });
}

CUresult cuStreamBeginCapture(CUstream hStream) {
  auto fn = real<HookId::cuStreamBeginCapture>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return begin_capture(hStream, false, [&] { return fn(hStream); });
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
  auto fn = real<HookId::cuStreamBeginCapture_ptsz>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return begin_capture(hStream, true, [&] { return fn(hStream); });
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  auto fn = real<HookId::cuStreamBeginCapture_v2>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return begin_capture(hStream, false, [&] { return fn(hStream, mode); });
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  auto fn = real<HookId::cuStreamBeginCapture_v2_ptsz>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return begin_capture(hStream, true, [&] { return fn(hStream, mode); });
}

#if CUDA_VERSION >= 12030
CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                     const CUgraphNode* dependencies,
                                     const CUgraphEdgeData* dependencyData, size_t numDependencies,
                                     CUstreamCaptureMode mode) {
  auto fn = real<HookId::cuStreamBeginCaptureToGraph>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return begin_capture(hStream, false, [&] {
    return fn(hStream, hGraph, dependencies, dependencyData, numDependencies, mode);
  });
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                          const CUgraphNode* dependencies,
                                          const CUgraphEdgeData* dependencyData,
                                          size_t numDependencies, CUstreamCaptureMode mode) {
  auto fn = real<HookId::cuStreamBeginCaptureToGraph_ptsz>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return begin_capture(hStream, true, [&] {
    return fn(hStream, hGraph, dependencies, dependencyData, numDependencies, mode);
  });
}
#endif

CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  auto fn = real<HookId::cuStreamEndCapture>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return end_capture(hStream, false, [&] { return fn(hStream, phGraph); });
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  auto fn = real<HookId::cuStreamEndCapture_ptsz>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return end_capture(hStream, true, [&] { return fn(hStream, phGraph); });
}

}  // namespace nvshare::client::hooks::impl
