// Allocation, free and memory-info hooks (families kMemory and kMemInfo of hook_list.def).
//
// Every allocation on a GPU is charged to that GPU's ledger before it is made, and only when it
// fits under the limit; otherwise it fails with CUDA_ERROR_OUT_OF_MEMORY and nothing else happens.
// Device allocations (cuMemAlloc_v2, cuMemAllocPitch_v2) become managed allocations placed on the
// GPU (placement.h), falling back to real device memory when the managed allocation fails. Memory
// that cannot become managed (VMM, pools) is only counted; pinned host memory is only recorded.
// Frees refund what the allocation charged. Allocation never waits for the grant.
#include <limits>

#include "client/config.h"
#include "client/cuda/device_state.h"
#include "client/cuda/ipc.h"
#include "client/cuda/placement.h"
#include "client/hooks/hook_table.h"
#include "client/hooks/impl.h"
#include "common/log.h"
#include "common/quantity.h"

namespace nvshare::client::hooks::impl {
namespace {

using cuda::AllocationKind;
using cuda::allocations;
using cuda::AllocationTable;
using cuda::current_device;
using cuda::CurrentDevice;
using cuda::DeviceState;
using Space = AllocationTable::Space;

CUresult over_limit(DeviceState& device, std::uint64_t bytes) {
  device.ledger.note_refused();
  if (device.link != nullptr) device.link->usage_changed();
  NVSHARE_DEBUG("%s: allocation of %s refused: %s of %s limit in use",
                device.identity.gpu_uuid.c_str(), format_bytes(bytes).c_str(),
                format_bytes(device.ledger.used()).c_str(),
                format_bytes(device.ledger.limit()).c_str());
  return CUDA_ERROR_OUT_OF_MEMORY;
}

// Records a successful allocation that was charged; on failure refunds the charge.
CUresult finish(DeviceState& device, CUresult rc, Space space, std::uint64_t key,
                std::uint64_t bytes, AllocationKind kind) {
  if (rc != CUDA_SUCCESS) {
    device.ledger.refund(bytes);
    return rc;
  }
  allocations().add(space, key, cuda::Allocation{device.ordinal, bytes, kind});
  device.link->usage_changed();
  return CUDA_SUCCESS;
}

void refund(const cuda::Allocation& allocation) {
  DeviceState* device = cuda::devices().find(allocation.device);
  if (device == nullptr) return;
  device->ledger.refund(allocation.bytes);
  if (cuda::prefetchable(allocation.kind) && device->swapped_out.load(std::memory_order_acquire)) {
    std::uint64_t swapped = device->swapped_bytes.load(std::memory_order_relaxed);
    while (!device->swapped_bytes.compare_exchange_weak(
        swapped, swapped > allocation.bytes ? swapped - allocation.bytes : 0)) {
    }
  }
  device->link->usage_changed();
}

// After the free of `key`, whose table entry `found` was taken out before it: the entry goes back
// if the free failed, else its charge is refunded. Returns the free's result.
CUresult settle_free(Space space, std::uint64_t key, const std::optional<cuda::Allocation>& found,
                     CUresult rc) {
  if (!found) return rc;
  if (rc != CUDA_SUCCESS) {
    allocations().add(space, key, *found);
    return rc;
  }
  refund(*found);
  return rc;
}

// Runs the real free of `key`; the table entry is taken out first, so an address the driver hands
// out again right after the free can be recorded anew, and put back if the free failed.
template <typename Free>
CUresult release(Space space, std::uint64_t key, Free&& free_call) {
  const std::optional<cuda::Allocation> found = allocations().remove(space, key);
  return settle_free(space, key, found, free_call());
}

CUresult allocate_managed_on_device(DeviceState& device, CUcontext ctx, CUdeviceptr* dptr,
                                    std::uint64_t bytes) {
  auto managed = real<HookId::cuMemAllocManaged>();
  if (managed == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = managed(dptr, bytes, CU_MEM_ATTACH_GLOBAL);
  if (rc != CUDA_SUCCESS) return rc;
  cuda::place_on_device(device, ctx, *dptr, bytes);
  return CUDA_SUCCESS;
}

// Device memory mapped at a reserved address, charged at its size rounded up to the mapping
// granularity (what it takes of the GPU). Below the granularity (it would waste most of its page)
// the allocation is not tried; over the limit it is refused (final); a failure of the driver (the
// GPU short of memory, mostly) leaves the choice to the caller.
struct BackedOutcome {
  std::optional<CUresult> final;  // the answer to return
  bool failed = false;            // tried, and the driver could not back it
};

BackedOutcome allocate_backed(DeviceState& device, CUdeviceptr* dptr, std::uint64_t bytes) {
  const std::uint64_t granularity = device.backing.granularity();
  if (granularity == 0 || bytes < granularity) return {};
  const std::uint64_t charged = device.backing.rounded(bytes);
  if (!device.ledger.try_charge(charged)) return {over_limit(device, charged)};
  const CUresult rc = device.backing.allocate(charged, dptr);
  if (rc != CUDA_SUCCESS) {
    device.ledger.refund(charged);
    NVSHARE_DEBUG("device-backed allocation of %s failed (%s)", format_bytes(charged).c_str(),
                  error_name(rc));
    return {std::nullopt, true};
  }
  return {finish(device, rc, Space::kDeviceAddress, *dptr, charged, AllocationKind::kBacked)};
}

// A device allocation of `bytes` for the current context, backed as the GPU's memory mode says
// (common/memory_mode.h): device-backed; managed memory in the unified mode, or when the GPU could
// not back a device-backed allocation (a job whose memory does not fit beside others' still runs,
// paged); device memory otherwise (plain mode, small allocations, managed memory failing).
// `device_alloc` makes the real device allocation.
template <typename DeviceAlloc>
CUresult allocate_device_memory(const CurrentDevice& current, CUdeviceptr* dptr,
                                std::uint64_t bytes, DeviceAlloc&& device_alloc) {
  DeviceState& device = *current.device;
  const MemoryMode mode = device.memory_mode.load(std::memory_order_relaxed);
  BackedOutcome backed;
  if (mode == MemoryMode::kDevice) {
    backed = allocate_backed(device, dptr, bytes);
    if (backed.final) return *backed.final;
  }
  if (!device.ledger.try_charge(bytes)) return over_limit(device, bytes);
  AllocationKind kind = AllocationKind::kDevice;
  CUresult rc = CUDA_ERROR_NOT_SUPPORTED;
  if (mode == MemoryMode::kUnified || (backed.failed && device.managed_allowed)) {
    rc = allocate_managed_on_device(device, current.ctx, dptr, bytes);
    if (rc == CUDA_SUCCESS) {
      kind = AllocationKind::kManagedFromDevice;
    } else {
      NVSHARE_DEBUG("managed allocation of %s failed (%s); using device memory",
                    format_bytes(bytes).c_str(), error_name(rc));
    }
  }
  if (rc != CUDA_SUCCESS) rc = device_alloc();
  return finish(device, rc, Space::kDeviceAddress, *dptr, bytes, kind);
}

// Charges an allocation that needs no conversion (managed, async, VMM) around its real call.
// `key` points at where the call writes the new allocation's address or handle.
template <typename Key, typename Alloc>
CUresult allocate_counted(DeviceState& device, std::uint64_t bytes, Space space, const Key* key,
                          AllocationKind kind, Alloc&& alloc) {
  if (!device.ledger.try_charge(bytes)) return over_limit(device, bytes);
  const CUresult rc = alloc();
  return finish(device, rc, space, rc == CUDA_SUCCESS ? static_cast<std::uint64_t>(*key) : 0, bytes,
                kind);
}

// Frees the device address `dptr`, its table entry taken out once: a device-backed allocation by
// its backing, after `wait()` (the synchronization the driver's free implies) and after its CUDA
// IPC export is withdrawn; anything else by `driver_free()`. The entry is put back if the free
// fails, else its charge is refunded.
template <typename Wait, typename Free>
CUresult free_device_address(CUdeviceptr dptr, Wait&& wait, Free&& driver_free) {
  const std::optional<cuda::Allocation> found = allocations().remove(Space::kDeviceAddress, dptr);
  DeviceState* owner = found && found->kind == AllocationKind::kBacked
                           ? cuda::devices().find(found->device)
                           : nullptr;
  if (owner == nullptr) return settle_free(Space::kDeviceAddress, dptr, found, driver_free());
  wait();
  cuda::withdraw_ipc_export(*owner, dptr);
  return settle_free(Space::kDeviceAddress, dptr, found, owner->backing.release(dptr));
}

// A stream-ordered free of a device-backed allocation (which the driver's pools never made) waits
// for the stream's earlier work, then frees at once.
template <typename Free>
CUresult free_async(CUdeviceptr dptr, CUstream stream, Free&& free_call) {
  return free_device_address(
      dptr,
      [&] {
        if (hooks::driver().cuStreamSynchronize != nullptr) {
          hooks::driver().cuStreamSynchronize(stream);
        }
      },
      free_call);
}

template <typename Alloc>
CUresult allocate_async(CUdeviceptr* dptr, std::size_t bytesize, Alloc&& alloc) {
  const CurrentDevice current = current_device();
  if (current.device == nullptr || dptr == nullptr || bytesize == 0) return alloc();
  return allocate_counted(*current.device, bytesize, Space::kDeviceAddress, dptr,
                          AllocationKind::kAsync, alloc);
}

template <typename Alloc>
CUresult allocate_host(void** pp, std::size_t bytesize, Alloc&& alloc) {
  const CUresult rc = alloc();
  if (rc == CUDA_SUCCESS && pp != nullptr && *pp != nullptr) {
    allocations().add(Space::kHostAddress, reinterpret_cast<std::uintptr_t>(*pp),
                      cuda::Allocation{-1, bytesize, AllocationKind::kHostPinned});
  }
  return rc;
}

}  // namespace

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  auto real_alloc = real<HookId::cuMemAlloc_v2>();
  if (real_alloc == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CurrentDevice current = current_device();
  if (current.device == nullptr || dptr == nullptr || bytesize == 0) {
    return real_alloc(dptr, bytesize);  // the driver reports the error the caller expects
  }
  return allocate_device_memory(current, dptr, bytesize,
                                [&] { return real_alloc(dptr, bytesize); });
}

CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes) {
  auto real_pitch = real<HookId::cuMemAllocPitch_v2>();
  auto real_free = real<HookId::cuMemFree_v2>();
  if (real_pitch == nullptr || real_free == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CurrentDevice current = current_device();
  if (current.device == nullptr || dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 ||
      Height == 0) {
    return real_pitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  }
  // The pitch is the driver's choice (alignment per GPU): learn it from a one-row allocation, which
  // also validates the arguments exactly as the driver does.
  CUdeviceptr row = 0;
  std::size_t pitch = 0;
  CUresult rc = real_pitch(&row, &pitch, WidthInBytes, 1, ElementSizeBytes);
  if (rc != CUDA_SUCCESS) return rc;
  real_free(row);
  if (pitch == 0 || Height > std::numeric_limits<std::size_t>::max() / pitch) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  rc = allocate_device_memory(current, dptr, pitch * Height, [&] {
    std::size_t device_pitch = 0;
    const CUresult device_rc =
        real_pitch(dptr, &device_pitch, WidthInBytes, Height, ElementSizeBytes);
    if (device_rc == CUDA_SUCCESS) pitch = device_pitch;
    return device_rc;
  });
  if (rc == CUDA_SUCCESS) *pPitch = pitch;
  return rc;
}

CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  auto real_managed = real<HookId::cuMemAllocManaged>();
  if (real_managed == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CurrentDevice current = current_device();
  auto call = [&] { return real_managed(dptr, bytesize, flags); };
  if (current.device == nullptr || dptr == nullptr || bytesize == 0) return call();
  return allocate_counted(*current.device, bytesize, Space::kDeviceAddress, dptr,
                          AllocationKind::kManaged, call);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  auto real_free = real<HookId::cuMemFree_v2>();
  if (real_free == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (dptr == 0) return real_free(dptr);
  // cuMemFree synchronizes with the work that may still use the memory; so does a device-backed
  // free.
  return free_device_address(
      dptr,
      [] {
        if (hooks::driver().cuCtxSynchronize != nullptr) hooks::driver().cuCtxSynchronize();
      },
      [&] { return real_free(dptr); });
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  auto fn = real<HookId::cuMemAllocAsync>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return allocate_async(dptr, bytesize, [&] { return fn(dptr, bytesize, hStream); });
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  auto fn = real<HookId::cuMemAllocAsync_ptsz>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return allocate_async(dptr, bytesize, [&] { return fn(dptr, bytesize, hStream); });
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream) {
  auto fn = real<HookId::cuMemAllocFromPoolAsync>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return allocate_async(dptr, bytesize, [&] { return fn(dptr, bytesize, pool, hStream); });
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream) {
  auto fn = real<HookId::cuMemAllocFromPoolAsync_ptsz>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return allocate_async(dptr, bytesize, [&] { return fn(dptr, bytesize, pool, hStream); });
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  auto fn = real<HookId::cuMemFreeAsync>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return free_async(dptr, hStream, [&] { return fn(dptr, hStream); });
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  auto fn = real<HookId::cuMemFreeAsync_ptsz>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return free_async(dptr, hStream, [&] { return fn(dptr, hStream); });
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  auto fn = real<HookId::cuMemCreate>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  auto call = [&] { return fn(handle, size, prop, flags); };
  // Only physical memory on a GPU counts; host-located VMM memory is the host's.
  if (handle == nullptr || size == 0 || prop == nullptr ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return call();
  }
  DeviceState* device = cuda::devices().get(prop->location.id);
  if (device == nullptr) return call();
  return allocate_counted(*device, size, Space::kVmmHandle, handle, AllocationKind::kVmm, call);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  auto fn = real<HookId::cuMemRelease>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return release(Space::kVmmHandle, handle, [&] { return fn(handle); });
}

CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  auto fn = real<HookId::cuMemAllocHost_v2>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return allocate_host(pp, bytesize, [&] { return fn(pp, bytesize); });
}

CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  auto fn = real<HookId::cuMemHostAlloc>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return allocate_host(pp, bytesize, [&] { return fn(pp, bytesize, Flags); });
}

CUresult cuMemFreeHost(void* p) {
  auto fn = real<HookId::cuMemFreeHost>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return release(Space::kHostAddress, reinterpret_cast<std::uintptr_t>(p), [&] { return fn(p); });
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  auto fn = real<HookId::cuMemGetInfo_v2>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = fn(free, total);
  if (rc != CUDA_SUCCESS || free == nullptr || total == nullptr) return rc;
  const CurrentDevice current = current_device();
  if (current.device == nullptr) return rc;
  const cuda::MemoryLedger::View view = current.device->ledger.view(*free, *total);
  *free = view.free;
  *total = view.total;
  return rc;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  auto fn = real<HookId::cuDeviceTotalMem_v2>();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult rc = fn(bytes, dev);
  if (rc != CUDA_SUCCESS || bytes == nullptr) return rc;
  // Frameworks ask this of every visible GPU at start-up: a GPU the process has not used yet is
  // not registered for it, and shows the declared limit.
  const DeviceState* device = cuda::devices().find(dev);
  const std::uint64_t limit =
      device != nullptr ? device->ledger.limit() : client_config().declared_limits.memory_bytes;
  if (limit != 0 && limit < *bytes) *bytes = limit;
  return rc;
}

}  // namespace nvshare::client::hooks::impl
