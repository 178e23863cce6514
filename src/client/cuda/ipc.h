// CUDA IPC for device-backed allocations (ipc_hooks.cc): what the free hooks need.
#pragma once

#include "client/hooks/cuda_api.h"

namespace nvshare::client::cuda {

struct DeviceState;

// Before a device-backed allocation at `base` is freed: the scheduler closes the descriptor it
// keeps for it, if it was exported, so nothing new can map it. Importers that mapped it keep
// their mapping until they close it (as with the driver's own IPC).
void withdraw_ipc_export(DeviceState& device, CUdeviceptr base);

}  // namespace nvshare::client::cuda
