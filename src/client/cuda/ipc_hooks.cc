// CUDA IPC hooks (family kMemory of hook_list.def): cuIpcGetMemHandle, cuIpcOpenMemHandle (both
// forms) and cuIpcCloseMemHandle.
//
// The driver's IPC accepts only cuMemAlloc memory, and device-backed allocations are physical
// memory mapped at a reserved address (device_backing.h). For those:
//  - cuIpcGetMemHandle (inside the gate, so no swap runs meanwhile) exports the physical memory
//    of each of the allocation's pieces (device_backing.h) as a file descriptor, offers each to
//    the scheduler (ipc_broker_client.h) and writes a handle that names the scheduler's tokens,
//    the allocation's size, its piece size and the offset of `dptr` in it. The
//    allocation is pinned from then on: it stays on the GPU when the process swaps out, and the
//    scheduler is told (usage pinned_bytes) so that it never plans a turn that would move it.
//  - cuIpcOpenMemHandle of such a handle asks the scheduler for the descriptors (it answers only
//    a process of the exporter's pod, or of its uid off Kubernetes), imports them, maps each piece
//    at its place in an address range reserved for the allocation and grants the current GPU
//    access. Nothing is charged: the memory is the exporter's, counted once.
//  - cuIpcCloseMemHandle unmaps and releases what open mapped.
// Any other handle or pointer goes to the driver unchanged (its own IPC, and its event handles).
// CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE answers 1 for device-backed memory the library
// can export (the driver says 0 for mapped memory), so libraries that ask before cuIpcGetMemHandle
// (UCX's cuda_ipc transport) take the IPC path.
#include <unistd.h>

#include <algorithm>
#include <array>
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

using cuda::grant_access;
using cuda::kMaxGpus;
using cuda::kMaxPieces;
using cuda::PieceLayout;
using Tokens = cuda::DeviceBacking::Tokens;

// The handle of a brokered export, little endian as the hosts that share a GPU are: a magic, the
// allocation's size, the offset of the exported pointer in it, its piece size, then the token of
// each piece (the rest zero). The first form named one token, then the size and the offset.
constexpr char kHandleMagic[8] = {'n', 'v', 's', 'h', 'I', 'P', 'C', '2'};
constexpr char kHandleMagicOnePiece[8] = {'n', 'v', 's', 'h', 'I', 'P', 'C', '1'};
static_assert(sizeof(CUipcMemHandle) >= 8 + (3 + kMaxPieces) * sizeof(std::uint64_t));

struct HandleFields {
  PieceLayout layout;
  std::uint64_t offset = 0;
  Tokens tokens{};
};

std::uint64_t u64_at(const CUipcMemHandle& handle, std::size_t at) {
  std::uint64_t v = 0;
  std::memcpy(&v, handle.reserved + at, 8);
  return v;
}

void write_handle(CUipcMemHandle* handle, const HandleFields& f) {
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle->reserved, kHandleMagic, sizeof kHandleMagic);
  std::memcpy(handle->reserved + 8, &f.layout.bytes, 8);
  std::memcpy(handle->reserved + 16, &f.offset, 8);
  std::memcpy(handle->reserved + 24, &f.layout.piece, 8);
  std::memcpy(handle->reserved + 32, f.tokens.data(), sizeof f.tokens);
}

// A handle of ours (either form): its fields, or why they cannot be (Result's error). nullopt: not
// one of ours.
std::optional<Result<HandleFields>> read_handle(const CUipcMemHandle& handle) {
  HandleFields f;
  if (std::memcmp(handle.reserved, kHandleMagic, sizeof kHandleMagic) == 0) {
    f.layout.bytes = u64_at(handle, 8);
    f.offset = u64_at(handle, 16);
    f.layout.piece = u64_at(handle, 24);
    std::memcpy(f.tokens.data(), handle.reserved + 32, sizeof f.tokens);
  } else if (std::memcmp(handle.reserved, kHandleMagicOnePiece, sizeof kHandleMagic) == 0) {
    f.tokens[0] = u64_at(handle, 8);
    f.layout.bytes = u64_at(handle, 16);
    f.offset = u64_at(handle, 24);
    f.layout.piece = f.layout.bytes;
  } else {
    return std::nullopt;
  }
  if (f.layout.bytes == 0 || f.offset >= f.layout.bytes || f.layout.piece == 0 ||
      f.layout.count() > kMaxPieces) {
    return Result<HandleFields>(make_error("a malformed handle: size, offset or piece size"));
  }
  for (std::uint64_t i = 0; i < kMaxPieces; ++i) {
    if ((f.tokens[i] != 0) != (i < f.layout.count())) {
      return Result<HandleFields>(make_error("a malformed handle: its tokens and pieces differ"));
    }
  }
  return Result<HandleFields>(f);
}

// What this process mapped from other processes' exports, by the pointer open returned.
struct Imported {
  CUdeviceptr base = 0;
  PieceLayout layout;
  std::array<CUmemGenericAllocationHandle, kMaxPieces> handles{};  // one per piece
  int ordinal = 0;         // the GPU whose context opened it
  std::uint64_t gpus = 0;  // bit i: GPU i may access it
};

// Grants the GPUs in `gpus` access to every piece of `imported`.
CUresult grant_imported(const Imported& imported, std::uint64_t gpus) {
  const PieceLayout& layout = imported.layout;
  for (std::uint64_t i = 0; i < layout.count(); ++i) {
    const CUresult rc = grant_access(imported.base + layout.offset(i), layout.size(i), gpus);
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

// Unmaps and releases the pieces of `imported` that were mapped, then frees its address range.
CUresult unmap_imported(const Imported& imported) {
  const hooks::DriverApi& api = hooks::driver();
  const PieceLayout& layout = imported.layout;
  for (std::uint64_t i = 0; i < layout.count(); ++i) {
    if (imported.handles[i] == 0) continue;
    api.cuMemUnmap(imported.base + layout.offset(i), layout.size(i));
    hooks::real<hooks::HookId::cuMemRelease>()(imported.handles[i]);
  }
  return api.cuMemAddressFree(imported.base, layout.bytes);
}

std::mutex imports_mu;
std::map<CUdeviceptr, Imported>& imports() {
  static auto* table = new std::map<CUdeviceptr, Imported>();  // never destroyed: exit-safe
  return *table;
}

const std::string& broker_socket() { return client_config().socket_path; }

// Offers each piece's descriptor to the scheduler; its tokens, or why not (a partial offer is
// withdrawn).
Result<Tokens> offer_pieces(const cuda::DeviceBacking::Exported& exported) {
  Tokens tokens{};
  for (std::uint64_t i = 0; i < exported.layout.count(); ++i) {
    auto offered = ipc_export(broker_socket(), exported.fds[i], exported.layout.size(i));
    if (!offered) {
      for (std::uint64_t j = 0; j < i; ++j) (void)ipc_withdraw(broker_socket(), tokens[j]);
      return offered.error();
    }
    tokens[i] = offered.value();
  }
  return tokens;
}

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
    device.link->after_submit(false);
    return std::nullopt;
  }
  ExportOutcome out;
  out.rc = rc;
  if (rc == CUDA_SUCCESS) {
    HandleFields fields{exported.layout, dptr - exported.base, exported.tokens};
    if (fields.tokens[0] == 0) {
      auto offered = offer_pieces(exported);
      if (offered) {
        fields.tokens = offered.value();
      } else {
        NVSHARE_WARN("cuIpcGetMemHandle: the scheduler cannot broker %s: %s",
                     format_bytes(exported.layout.bytes).c_str(), offered.error().message.c_str());
        out.rc = CUDA_ERROR_NOT_SUPPORTED;
        fields.tokens = Tokens{};
      }
    }
    for (std::uint64_t i = 0; i < exported.layout.count(); ++i) ::close(exported.fds[i]);
    // No tokens unpin a first export that failed.
    device.backing.remember_tokens(exported.base, fields.tokens);
    out.fields = fields;
  } else {
    NVSHARE_WARN("cuIpcGetMemHandle: cannot export device-backed memory: %s",
                 hooks::error_name(rc));
  }
  device.link->after_submit(false);
  device.link->usage_changed();
  return out;
}

// Imports the piece `fd` names and maps it at its place in `imported`'s range.
CUresult map_piece(int fd, std::uint64_t i, Imported& imported) {
  const hooks::DriverApi& api = hooks::driver();
  CUmemGenericAllocationHandle handle = 0;
  CUresult rc = api.cuMemImportFromShareableHandle(
      &handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (rc != CUDA_SUCCESS) return rc;
  rc = api.cuMemMap(imported.base + imported.layout.offset(i), imported.layout.size(i), 0, handle,
                    0);
  if (rc != CUDA_SUCCESS) {
    hooks::real<hooks::HookId::cuMemRelease>()(handle);
    return rc;
  }
  imported.handles[i] = handle;
  return CUDA_SUCCESS;
}

// Maps the pieces `fds` name (of `fields`' layout) for GPU `ordinal` and the GPUs in `peers`
// (those that enabled peer access to it).
CUresult map_imported(const std::array<UniqueFd, kMaxPieces>& fds, const HandleFields& fields,
                      int ordinal, std::uint64_t peers, Imported* out) {
  const hooks::DriverApi& api = hooks::driver();
  if (api.cuMemImportFromShareableHandle == nullptr || api.cuMemAddressReserve == nullptr ||
      api.cuMemMap == nullptr || api.cuMemSetAccess == nullptr ||
      hooks::real<hooks::HookId::cuMemRelease>() == nullptr) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  Imported imported;
  imported.layout = fields.layout;
  imported.ordinal = ordinal;
  imported.gpus = peers | (std::uint64_t{1} << ordinal);
  CUresult rc = api.cuMemAddressReserve(&imported.base, fields.layout.bytes, 0, 0, 0);
  if (rc != CUDA_SUCCESS) return rc;
  for (std::uint64_t i = 0; i < fields.layout.count() && rc == CUDA_SUCCESS; ++i) {
    rc = map_piece(fds[i].get(), i, imported);
  }
  if (rc == CUDA_SUCCESS) rc = grant_imported(imported, imported.gpus);
  if (rc != CUDA_SUCCESS) {
    unmap_imported(imported);
    return rc;
  }
  *out = imported;
  return CUDA_SUCCESS;
}

// Claims the descriptor of each piece `fields` names; why not, when one is refused or is not of
// the size the handle says.
Result<std::array<UniqueFd, kMaxPieces>> claim_pieces(const HandleFields& fields) {
  std::array<UniqueFd, kMaxPieces> fds;
  for (std::uint64_t i = 0; i < fields.layout.count(); ++i) {
    auto imported = ipc_import(broker_socket(), fields.tokens[i]);
    if (!imported) return imported.error();
    if (imported.value().bytes != fields.layout.size(i)) {
      return make_error("the scheduler's export is of " + format_bytes(imported.value().bytes) +
                        ", the handle says " + format_bytes(fields.layout.size(i)));
    }
    fds[i] = std::move(imported.value().fd);
  }
  return fds;
}

template <typename Open>
CUresult open_handle(CUdeviceptr* pdptr, const CUipcMemHandle& handle, Open&& real_open) {
  const std::optional<Result<HandleFields>> read = read_handle(handle);
  if (!read) return real_open();
  if (!read->ok()) {
    NVSHARE_WARN("cuIpcOpenMemHandle: %s", read->error().message.c_str());
    return CUDA_ERROR_INVALID_HANDLE;
  }
  const HandleFields* fields = &read->value();
  if (pdptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const cuda::CurrentDevice current = cuda::current_device();
  if (current.device == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (current.device->ordinal < 0 || current.device->ordinal >= kMaxGpus) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  // The scheduler decides in which pod this process may import by its registration: one that
  // opens a handle before it allocated anything registers first, as an allocation would.
  current.device->link->await_registration();
  auto claimed = claim_pieces(*fields);
  if (!claimed) {
    NVSHARE_WARN("cuIpcOpenMemHandle: %s", claimed.error().message.c_str());
    return CUDA_ERROR_INVALID_HANDLE;
  }
  Imported mapped;
  const CUresult rc = map_imported(claimed.value(), *fields, current.device->ordinal,
                                   current.device->backing.peers(), &mapped);
  if (rc != CUDA_SUCCESS) {
    NVSHARE_WARN("cuIpcOpenMemHandle: cannot map %s: %s",
                 format_bytes(fields->layout.bytes).c_str(), hooks::error_name(rc));
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
  for (const std::uint64_t token : device.backing.tokens_of(base)) {
    if (token == 0) break;
    if (Status s = ipc_withdraw(broker_socket(), token); !s) {
      NVSHARE_DEBUG("CUDA IPC export withdrawn with the process's session only: %s",
                    s.error().message.c_str());
      return;
    }
  }
}

void grant_peer_to_imports(int ordinal, int peer) {
  if (peer < 0 || peer >= kMaxGpus) return;
  const std::uint64_t bit = std::uint64_t{1} << peer;
  std::lock_guard lock(imports_mu);
  for (auto& [pointer, imported] : imports()) {
    if (imported.ordinal != ordinal || (imported.gpus & bit) != 0) continue;
    const CUresult rc = grant_imported(imported, imported.gpus | bit);
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
  return unmap_imported(*found);
}

}  // namespace hooks::impl
}  // namespace nvshare::client
