// CUDA IPC for device-backed allocations (ipc_hooks.cc): what the free hooks need.
#pragma once

#include "client/hooks/cuda_api.h"

namespace nvshare::client::cuda {

struct DeviceState;

// Before a device-backed allocation at `base` is freed: the scheduler closes the descriptor it
// keeps for it, if it was exported, so nothing new can map it. Importers that mapped it keep
// their mapping until they close it (as with the driver's own IPC).
void withdraw_ipc_export(DeviceState& device, CUdeviceptr base);

// A context of GPU `peer` enabled peer access to GPU `ordinal`: memory this process imported
// through CUDA IPC in a context of `ordinal` becomes accessible from `peer` too (as the driver's
// IPC memory does once peer access is enabled).
void grant_peer_to_imports(int ordinal, int peer);

}  // namespace nvshare::client::cuda
