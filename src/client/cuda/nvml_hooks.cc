// NVML memory queries (family kNvml): inside a process with a memory limit, nvidia-smi and NVML
// bindings see the limit as the GPU's memory.
//
// Only a GPU with a limit is changed (the scheduler's, once it sent one, else
// NVSHARE_MEMORY_LIMIT):
//   total = min(limit, physical)
//   used  = this process's ledger when it uses the GPU, else NVML's used capped at total
//   free  = total - used (- reserved for _v2), never more than NVML says is free
// A GPU without a limit reads exactly as NVML reports it.
#include <algorithm>
#include <cstring>

#include "client/config.h"
#include "client/cuda/device_state.h"
#include "client/hooks/hook_table.h"
#include "client/hooks/impl.h"

namespace nvshare::client::hooks::impl {
namespace {

// NVML's numbers for one GPU, rewritten in place when the GPU is limited.
struct MemoryNumbers {
  unsigned long long* total;
  unsigned long long* used;
  unsigned long long* reserved;  // null for the v1 struct
  unsigned long long* free;
};

void apply_limit(nvmlDevice_t device, const MemoryNumbers& m) {
  std::uint64_t limit = 0;
  const cuda::DeviceState* state = nullptr;
  char uuid[kNvmlUuidBufferSize] = {};
  const NvmlApi& api = nvml_api();
  if (api.get_uuid != nullptr && api.get_uuid(device, uuid, sizeof uuid) == NVML_SUCCESS) {
    state = cuda::devices().find_by_uuid(uuid);
  }
  limit = state != nullptr ? state->ledger.limit() : client_config().declared_limits.memory_bytes;
  if (limit == 0) return;  // not limited: NVML's answer stands
  const std::uint64_t total = std::min<std::uint64_t>(limit, *m.total);
  const std::uint64_t used =
      std::min<std::uint64_t>(state != nullptr ? state->ledger.used() : *m.used, total);
  const std::uint64_t reserved =
      m.reserved != nullptr ? std::min<std::uint64_t>(*m.reserved, total - used) : 0;
  *m.free = std::min<std::uint64_t>(total - used - reserved, *m.free);
  if (m.reserved != nullptr) *m.reserved = reserved;
  *m.used = used;
  *m.total = total;
}

}  // namespace

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  auto fn = real<HookId::nvmlDeviceGetMemoryInfo>();
  if (fn == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;
  const nvmlReturn_t rc = fn(device, memory);
  if (rc == NVML_SUCCESS && memory != nullptr) {
    apply_limit(device, {&memory->total, &memory->used, nullptr, &memory->free});
  }
  return rc;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  auto fn = real<HookId::nvmlDeviceGetMemoryInfo_v2>();
  if (fn == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;
  const nvmlReturn_t rc = fn(device, memory);
  if (rc == NVML_SUCCESS && memory != nullptr) {
    apply_limit(device, {&memory->total, &memory->used, &memory->reserved, &memory->free});
  }
  return rc;
}

}  // namespace nvshare::client::hooks::impl
