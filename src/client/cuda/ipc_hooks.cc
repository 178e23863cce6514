// CUDA IPC hooks (family kMemory of hook_list.def): cuIpcGetMemHandle, cuIpcOpenMemHandle (both
// forms) and cuIpcCloseMemHandle.
//
// The driver's IPC accepts only cuMemAlloc memory, and device-backed allocations are physical
// memory mapped at a reserved address (device_backing.h). For those:
//  - cuIpcGetMemHandle (inside the gate, so no swap runs meanwhile) exports the physical memory
//    as a file descriptor, offers it to the scheduler (ipc_broker_client.h) and writes a handle
//    that names the scheduler's token, the allocation's size and the offset of `dptr` in it. The
//    allocation is pinned from then on: it stays on the GPU when the process swaps out, and the
//    scheduler is told (usage pinned_bytes) so that it never plans a turn that would move it.
//  - cuIpcOpenMemHandle of such a handle asks the scheduler for the descriptor (it answers only
//    a process of the exporter's pod, or of its uid off Kubernetes), imports it, maps it at an
//    address reserved for it and grants the current GPU access. Nothing is charged: the memory is
//    the exporter's, counted once.
//  - cuIpcCloseMemHandle unmaps and releases what open mapped.
// Any other handle or pointer goes to the driver unchanged (its own IPC, and its event handles).
// CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE answers 1 for device-backed memory the library
// can export (the driver says 0 for mapped memory), so libraries that ask before cuIpcGetMemHandle
// (UCX's cuda_ipc transport) take the IPC path.
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "client/config.h"
#include "client/cuda/device_state.h"
#include "client/cuda/ipc.h"
#include "client/hooks/hook_table.h"
#include "client/hooks/impl.h"
#include "client/ipc_broker_client.h"
#include "common/log.h"
#include "common/quantity.h"

namespace nvshare::client {
namespace {

// The handle of a brokered export: a magic, then the token, the allocation's size and the offset
// of the exported pointer in it, little endian as the hosts that share a GPU are; the rest zero.
constexpr char kHandleMagic[8] = {'n', 'v', 's', 'h', 'I', 'P', 'C', '1'};
static_assert(sizeof(CUipcMemHandle) >= 8 + 3 * sizeof(std::uint64_t));

struct HandleFields {
  std::uint64_t token = 0;
  std::uint64_t bytes = 0;
  std::uint64_t offset = 0;
};

void write_handle(CUipcMemHandle* handle, const HandleFields& f) {
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle->reserved, kHandleMagic, sizeof kHandleMagic);
  std::memcpy(handle->reserved + 8, &f.token, 8);
  std::memcpy(handle->reserved + 16, &f.bytes, 8);
  std::memcpy(handle->reserved + 24, &f.offset, 8);
}

std::optional<HandleFields> read_handle(const CUipcMemHandle& handle) {
  if (std::memcmp(handle.reserved, kHandleMagic, sizeof kHandleMagic) != 0) return std::nullopt;
  HandleFields f;
  std::memcpy(&f.token, handle.reserved + 8, 8);
  std::memcpy(&f.bytes, handle.reserved + 16, 8);
  std::memcpy(&f.offset, handle.reserved + 24, 8);
  if (f.token == 0 || f.bytes == 0 || f.offset >= f.bytes) return std::nullopt;
  return f;
}

// What this process mapped from other processes' exports, by the pointer open returned.
struct Imported {
  CUdeviceptr base = 0;
  std::uint64_t bytes = 0;
  CUmemGenericAllocationHandle handle = 0;
  int ordinal = 0;         // the GPU whose context opened it
  std::uint64_t gpus = 0;  // bit i: GPU i may access it
};

using cuda::grant_access;
using cuda::kMaxGpus;

std::mutex imports_mu;
std::map<CUdeviceptr, Imported>& imports() {
  static auto* table = new std::map<CUdeviceptr, Imported>();  // never destroyed: exit-safe
  return *table;
}

const std::string& broker_socket() { return client_config().socket_path; }

// Exports the device-backed allocation that contains `dptr` on `device`; nullopt when it is not
// one (the driver's IPC applies), else the handle's fields or the error to return.
struct ExportOutcome {
  CUresult rc = CUDA_SUCCESS;
  HandleFields fields;
};
std::optional<ExportOutcome> export_backed(cuda::DeviceState& device, CUdeviceptr dptr) {
  if (!device.backing.contains(dptr)) return std::nullopt;  // not ours: no need for the gate
  device.link->before_submit();  // no swap while the memory is exported and pinned
  cuda::DeviceBacking::Exported exported;
  const CUresult rc = device.backing.export_shareable(dptr, &exported);
  if (rc == CUDA_ERROR_INVALID_VALUE) {  // freed meanwhile
    device.link->after_submit();
    return std::nullopt;
  }
  ExportOutcome out;
  out.rc = rc;
  if (rc == CUDA_SUCCESS) {
    std::uint64_t token = exported.token;
    if (token == 0) {
      auto offered = ipc_export(broker_socket(), exported.fd, exported.bytes);
      if (offered) {
        token = offered.value();
      } else {
        NVSHARE_WARN("cuIpcGetMemHandle: the scheduler cannot broker %s: %s",
                     format_bytes(exported.bytes).c_str(), offered.error().message.c_str());
        out.rc = CUDA_ERROR_NOT_SUPPORTED;
      }
    }
    ::close(exported.fd);
    device.backing.remember_token(exported.base, token);  // 0 unpins a first export that failed
    out.fields = HandleFields{token, exported.bytes, dptr - exported.base};
  } else {
    NVSHARE_WARN("cuIpcGetMemHandle: cannot export device-backed memory: %s",
                 hooks::error_name(rc));
  }
  device.link->after_submit();
  device.link->usage_changed();
  return out;
}

// Maps the memory `fd` names for GPU `ordinal` and the GPUs in `peers` (those that enabled peer
// access to it).
CUresult map_imported(int fd, std::uint64_t bytes, int ordinal, std::uint64_t peers,
                      Imported* out) {
  const hooks::DriverApi& api = hooks::driver();
  auto release = hooks::real<hooks::HookId::cuMemRelease>();
  if (api.cuMemImportFromShareableHandle == nullptr || api.cuMemAddressReserve == nullptr ||
      api.cuMemMap == nullptr || api.cuMemSetAccess == nullptr || release == nullptr) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUmemGenericAllocationHandle handle = 0;
  CUresult rc = api.cuMemImportFromShareableHandle(
      &handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (rc != CUDA_SUCCESS) return rc;
  CUdeviceptr base = 0;
  rc = api.cuMemAddressReserve(&base, bytes, 0, 0, 0);
  if (rc == CUDA_SUCCESS) {
    rc = api.cuMemMap(base, bytes, 0, handle, 0);
    if (rc == CUDA_SUCCESS) {
      rc = grant_access(base, bytes, peers | (std::uint64_t{1} << ordinal));
      if (rc != CUDA_SUCCESS) api.cuMemUnmap(base, bytes);
    }
    if (rc != CUDA_SUCCESS) api.cuMemAddressFree(base, bytes);
  }
  if (rc != CUDA_SUCCESS) {
    release(handle);
    return rc;
  }
  *out = Imported{base, bytes, handle, ordinal, peers | (std::uint64_t{1} << ordinal)};
  return CUDA_SUCCESS;
}

template <typename Open>
CUresult open_handle(CUdeviceptr* pdptr, const CUipcMemHandle& handle, Open&& real_open) {
  const std::optional<HandleFields> fields = read_handle(handle);
  if (!fields) return real_open();
  if (pdptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const cuda::CurrentDevice current = cuda::current_device();
  if (current.device == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto imported = ipc_import(broker_socket(), fields->token);
  if (!imported) {
    NVSHARE_WARN("cuIpcOpenMemHandle: %s", imported.error().message.c_str());
    return CUDA_ERROR_INVALID_HANDLE;
  }
  Imported mapped;
  if (current.device->ordinal < 0 || current.device->ordinal >= kMaxGpus) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  const CUresult rc =
      map_imported(imported.value().fd.get(), imported.value().bytes, current.device->ordinal,
                   current.device->backing.peers(), &mapped);
  if (rc != CUDA_SUCCESS) {
    NVSHARE_WARN("cuIpcOpenMemHandle: cannot map %s: %s",
                 format_bytes(imported.value().bytes).c_str(), hooks::error_name(rc));
    return rc;
  }
  const CUdeviceptr pointer = mapped.base + fields->offset;
  try {
    std::lock_guard lock(imports_mu);
    imports()[pointer] = mapped;
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;  // the mapping is left: a leak of address space, not memory
  }
  *pdptr = pointer;
  return CUDA_SUCCESS;
}

// Whether a device-backed allocation of any GPU contains `ptr` and can be exported.
bool exportable_backed(CUdeviceptr ptr) {
  for (int ordinal = 0; ordinal < kMaxGpus; ++ordinal) {
    const cuda::DeviceState* device = cuda::devices().find(ordinal);
    if (device != nullptr && device->backing.exportable(ptr)) return true;
  }
  return false;
}

void answer_ipc_capable(CUpointer_attribute attribute, void* data, CUdeviceptr ptr) {
  if (attribute != CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE || data == nullptr) return;
  unsigned int capable = 0;
  std::memcpy(&capable, data, sizeof capable);
  if (capable == 0 && exportable_backed(ptr)) {
    capable = 1;
    std::memcpy(data, &capable, sizeof capable);
  }
}

}  // namespace

namespace cuda {

void withdraw_ipc_export(DeviceState& device, CUdeviceptr base) {
  const std::uint64_t token = device.backing.token_of(base);
  if (token == 0) return;
  if (Status s = ipc_withdraw(broker_socket(), token); !s) {
    NVSHARE_DEBUG("CUDA IPC export withdrawn with the process's session only: %s",
                  s.error().message.c_str());
  }
}

void grant_peer_to_imports(int ordinal, int peer) {
  if (peer < 0 || peer >= kMaxGpus) return;
  const std::uint64_t bit = std::uint64_t{1} << peer;
  std::lock_guard lock(imports_mu);
  for (auto& [pointer, imported] : imports()) {
    if (imported.ordinal != ordinal || (imported.gpus & bit) != 0) continue;
    const CUresult rc = grant_access(imported.base, imported.bytes, imported.gpus | bit);
    if (rc == CUDA_SUCCESS) {
      imported.gpus |= bit;
    } else {
      NVSHARE_WARN("peer access for GPU %d to imported memory at 0x%llx: %s", peer,
                   static_cast<unsigned long long>(imported.base), hooks::error_name(rc));
    }
  }
}

}  // namespace cuda

namespace hooks::impl {

CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  auto fn = real<HookId::cuIpcGetMemHandle>();
  auto call = [&] { return fn != nullptr ? fn(pHandle, dptr) : CUDA_ERROR_NOT_SUPPORTED; };
  const cuda::CurrentDevice current = cuda::current_device();
  if (current.device == nullptr || pHandle == nullptr || dptr == 0) return call();
  const std::optional<ExportOutcome> exported = export_backed(*current.device, dptr);
  if (!exported) return call();
  if (exported->rc == CUDA_SUCCESS) write_handle(pHandle, exported->fields);
  return exported->rc;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  auto fn = real<HookId::cuIpcOpenMemHandle>();
  return open_handle(pdptr, handle, [&] {
    return fn != nullptr ? fn(pdptr, handle, Flags) : CUDA_ERROR_NOT_SUPPORTED;
  });
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  auto fn = real<HookId::cuIpcOpenMemHandle_v2>();
  return open_handle(pdptr, handle, [&] {
    return fn != nullptr ? fn(pdptr, handle, Flags) : CUDA_ERROR_NOT_SUPPORTED;
  });
}

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  auto fn = real<HookId::cuPointerGetAttribute>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = fn(data, attribute, ptr);
  if (rc == CUDA_SUCCESS) answer_ipc_capable(attribute, data, ptr);
  return rc;
}

CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes,
                                void** data, CUdeviceptr ptr) {
  auto fn = real<HookId::cuPointerGetAttributes>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = fn(numAttributes, attributes, data, ptr);
  if (rc != CUDA_SUCCESS || attributes == nullptr || data == nullptr) return rc;
  for (unsigned int i = 0; i < numAttributes; ++i) answer_ipc_capable(attributes[i], data[i], ptr);
  return rc;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  std::optional<Imported> found;
  {
    std::lock_guard lock(imports_mu);
    auto it = imports().find(dptr);
    if (it != imports().end()) {
      found = it->second;
      imports().erase(it);
    }
  }
  if (!found) {
    auto fn = real<HookId::cuIpcCloseMemHandle>();
    return fn != nullptr ? fn(dptr) : CUDA_ERROR_INVALID_VALUE;
  }
  // Like the driver's close: work that still uses the mapping completes first.
  if (driver().cuCtxSynchronize != nullptr) driver().cuCtxSynchronize();
  driver().cuMemUnmap(found->base, found->bytes);
  real<HookId::cuMemRelease>()(found->handle);
  return driver().cuMemAddressFree(found->base, found->bytes);
}

}  // namespace hooks::impl
}  // namespace nvshare::client
