#include "client/cuda/placement.h"

#include "client/cuda/device_state.h"
#include "client/hooks/hook_table.h"
#include "common/log.h"

namespace nvshare::client::cuda {
namespace {

using hooks::HookId;

CUresult advise(CUdeviceptr address, std::uint64_t bytes, CUmem_advise advice, int ordinal) {
  const hooks::DriverApi& api = hooks::driver();
  if (api.cuMemAdvise_v2 != nullptr) {
    CUmemLocation location{};
    location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    location.id = ordinal;
    return api.cuMemAdvise_v2(address, bytes, advice, location);
  }
  if (api.cuMemAdvise != nullptr) return api.cuMemAdvise(address, bytes, advice, ordinal);
  return CUDA_ERROR_NOT_FOUND;
}

}  // namespace

CUresult prefetch(std::uint64_t address, std::uint64_t bytes, bool to_host, int ordinal,
                  CUstream stream) {
  if (auto by_location = hooks::real<HookId::cuMemPrefetchAsync_v2>()) {
    CUmemLocation location{};
    location.type = to_host ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    location.id = to_host ? 0 : ordinal;
    return by_location(address, bytes, location, 0, stream);
  }
  if (auto by_device = hooks::real<HookId::cuMemPrefetchAsync>()) {
    return by_device(address, bytes, to_host ? CU_DEVICE_CPU : ordinal, stream);
  }
  return CUDA_ERROR_NOT_FOUND;
}

void place_on_device(DeviceState& device, CUcontext ctx, CUdeviceptr address, std::uint64_t bytes) {
  for (CUmem_advise advice :
       {CU_MEM_ADVISE_SET_PREFERRED_LOCATION, CU_MEM_ADVISE_SET_ACCESSED_BY}) {
    const CUresult rc = advise(address, bytes, advice, device.ordinal);
    if (rc != CUDA_SUCCESS) NVSHARE_DEBUG("cuMemAdvise(%d): %s", advice, hooks::error_name(rc));
  }
  if (device.swapped_out.load(std::memory_order_acquire)) {
    device.swapped_bytes.fetch_add(bytes, std::memory_order_relaxed);
    return;
  }
  CUstream stream = device.tracker.private_stream(ctx);
  if (stream == nullptr) return;
  const CUresult rc = prefetch(address, bytes, /*to_host=*/false, device.ordinal, stream);
  if (rc != CUDA_SUCCESS) NVSHARE_DEBUG("prefetch to the GPU: %s", hooks::error_name(rc));
}

}  // namespace nvshare::client::cuda
