// Where managed memory lives: the library's own advice and prefetches, always through the real
// driver (never gated, never counted as the application's submissions).
//
//  - place_on_device(): what turns a managed allocation into "device memory that can be swapped":
//    preferred location and accessed-by the GPU, then a prefetch to the GPU on the library's
//    private stream of the calling thread's context (asynchronous; kernels that start before it
//    finishes fault the rest in). While the GPU is swapped out the allocation is left on the host
//    for swap_in to bring.
//  - prefetch(): one range to the host (CUDA 12.2+ host location, or CU_DEVICE_CPU on older
//    drivers) or to a GPU.
// Failures of advice are logged at debug and ignored: the memory stays correct, only slower.
#pragma once

#include <cstdint>

#include "client/hooks/cuda_api.h"

namespace nvshare::client::cuda {

struct DeviceState;

CUresult prefetch(std::uint64_t address, std::uint64_t bytes, bool to_host, int ordinal,
                  CUstream stream);
void place_on_device(DeviceState& device, CUcontext ctx, CUdeviceptr address, std::uint64_t bytes);

}  // namespace nvshare::client::cuda
