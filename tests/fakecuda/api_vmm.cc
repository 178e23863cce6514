// Exported: the virtual memory management API (cuMemCreate, cuMemAddressReserve, cuMemMap, ...).
//
// A physical allocation (cuMemCreate) is a memfd of the requested size, counted against its
// device's capacity like cuMemAlloc until cuMemRelease. cuMemAddressReserve reserves address space
// (an inaccessible anonymous mapping); cuMemMap maps the memfd over part of it, shared, so that two
// mappings of one allocation see the same bytes, and registers the range so copies and memsets
// accept it. cuMemUnmap puts the reservation back; cuMemSetAccess records which devices may access
// a mapping, which copies and memsets check (kernels do not). The fake requires a current context
// on the allocation's device, whose slot carries the accounting. cuMemExportToShareableHandle gives
// a duplicate of the memfd (only for memory created with the POSIX descriptor handle type);
// cuMemImportFromShareableHandle, in any process that received it, makes a handle over the same
// pages, counted nowhere (the exporter's slot counts them).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "driver.h"

using fakecuda::Allocation;
using fakecuda::current_context;
using fakecuda::Driver;
using fakecuda::guarded;
using fakecuda::MemoryKind;
using fakecuda::require_init;

namespace {

constexpr std::size_t kGranularity = 2 << 20;

bool granular(std::size_t value) { return value % kGranularity == 0; }

CUresult check_prop(const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return Driver::instance().device(prop->location.id) != nullptr ? CUDA_SUCCESS
                                                                 : CUDA_ERROR_INVALID_DEVICE;
}

CUresult create(CUmemGenericAllocationHandle* handle, std::size_t size,
                const CUmemAllocationProp* prop, unsigned long long flags) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (handle == nullptr || size == 0 || !granular(size) || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult rc = check_prop(prop); rc != CUDA_SUCCESS) return rc;
  std::shared_ptr<CUctx_st> ctx;
  if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
  if (ctx->device != prop->location.id) return CUDA_ERROR_INVALID_DEVICE;
  Driver& driver = Driver::instance();
  fakecuda::Device* d = driver.device(ctx->device);
  if (!d->sim.reserve_device_memory(ctx->slot, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  const int fd = memfd_create("fakecuda-vmm", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    d->sim.release_device_memory(ctx->slot, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const std::uint64_t id = driver.next_id.fetch_add(1);
  std::lock_guard lock(driver.mu);
  driver.physical[id] = fakecuda::PhysicalAllocation{
      fd, size, ctx, (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0,
      true};
  *handle = id;
  return CUDA_SUCCESS;
}

CUresult release(CUmemGenericAllocationHandle handle) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  Driver& driver = Driver::instance();
  fakecuda::PhysicalAllocation physical;
  {
    std::lock_guard lock(driver.mu);
    auto it = driver.physical.find(handle);
    if (it == driver.physical.end()) return CUDA_ERROR_INVALID_VALUE;
    physical = std::move(it->second);
    driver.physical.erase(it);
  }
  // Mappings that still exist keep the pages; the device's accounting ends here.
  if (physical.counted) {
    driver.device(physical.ctx->device)
        ->sim.release_device_memory(physical.ctx->slot, physical.size);
  }
  close(physical.fd);
  return CUDA_SUCCESS;
}

// Whether [ptr, ptr + size) lies inside one reservation.
bool reserved(std::uintptr_t ptr, std::size_t size) {
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  auto it = driver.reservations.upper_bound(ptr);
  if (it == driver.reservations.begin()) return false;
  --it;
  return ptr >= it->first && ptr - it->first + size <= it->second;
}

CUresult map(CUdeviceptr ptr, std::size_t size, std::size_t offset,
             CUmemGenericAllocationHandle handle, unsigned long long flags) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (size == 0 || !granular(size) || !granular(offset) || !granular(ptr) || flags != 0 ||
      !reserved(ptr, size)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& driver = Driver::instance();
  int fd = -1;
  std::shared_ptr<CUctx_st> ctx;
  {
    std::lock_guard lock(driver.mu);
    auto it = driver.physical.find(handle);
    if (it == driver.physical.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (offset + size > it->second.size) return CUDA_ERROR_INVALID_VALUE;
    fd = it->second.fd;
    ctx = it->second.ctx;
  }
  if (driver.find_allocation(ptr, 1) || driver.find_allocation(ptr + size - 1, 1)) {
    return CUDA_ERROR_ALREADY_MAPPED;
  }
  void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                 fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation a;
  a.base = ptr;
  a.size = size;
  a.mapped_size = 0;  // the reservation owns the address space
  a.kind = MemoryKind::kMapped;
  a.ctx = ctx;
  fakecuda::register_allocation(std::move(a));
  return CUDA_SUCCESS;
}

CUresult unmap(CUdeviceptr ptr, std::size_t size) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  auto a = fakecuda::take_allocation(ptr, {MemoryKind::kMapped});
  if (!a) return CUDA_ERROR_INVALID_VALUE;
  if (a->size != size) {
    fakecuda::register_allocation(std::move(*a));
    return CUDA_ERROR_INVALID_VALUE;
  }
  mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  driver.access.erase(ptr);
  return CUDA_SUCCESS;
}

CUresult export_fd(void* shareable, CUmemGenericAllocationHandle handle,
                   CUmemAllocationHandleType type, unsigned long long flags) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (shareable == nullptr || flags != 0 || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  auto it = driver.physical.find(handle);
  if (it == driver.physical.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (!it->second.shareable) return CUDA_ERROR_INVALID_VALUE;
  const int copy = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = copy;
  return CUDA_SUCCESS;
}

CUresult import_fd(CUmemGenericAllocationHandle* handle, void* os_handle,
                   CUmemAllocationHandleType type) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (handle == nullptr || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::shared_ptr<CUctx_st> ctx;
  if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
  const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle));
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0 ||
      !granular(static_cast<std::size_t>(st.st_size))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  Driver& driver = Driver::instance();
  const std::uint64_t id = driver.next_id.fetch_add(1);
  std::lock_guard lock(driver.mu);
  driver.physical[id] =
      fakecuda::PhysicalAllocation{copy, static_cast<std::size_t>(st.st_size), ctx, true, false};
  *handle = id;
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuMemExportToShareableHandle(void* shareableHandle,
                                              CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType,
                                              unsigned long long flags) {
  return guarded([&] { return export_fd(shareableHandle, handle, handleType, flags); });
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                void* osHandle,
                                                CUmemAllocationHandleType shHandleType) {
  return guarded([&] { return import_fd(handle, osHandle, shHandleType); });
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
        option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult rc = check_prop(prop); rc != CUDA_SUCCESS) return rc;
    *granularity = kGranularity;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                             const CUmemAllocationProp* prop, unsigned long long flags) {
  return guarded([&] { return create(handle, size, prop, flags); });
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  return guarded([&] { return release(handle); });
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (ptr == nullptr || size == 0 || !granular(size) || flags != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const std::size_t align = alignment > kGranularity ? alignment : kGranularity;
    // Over-reserve, then trim to an aligned range.
    void* p = mmap(addr != 0 ? reinterpret_cast<void*>(addr) : nullptr, size + align, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    const auto raw = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t base = (raw + align - 1) / align * align;
    if (base > raw) munmap(p, base - raw);
    if (raw + size + align > base + size) {
      munmap(reinterpret_cast<void*>(base + size), raw + size + align - (base + size));
    }
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    driver.reservations[base] = size;
    *ptr = base;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    Driver& driver = Driver::instance();
    {
      std::lock_guard lock(driver.mu);
      auto it = driver.reservations.find(ptr);
      if (it == driver.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
      driver.reservations.erase(it);
    }
    munmap(reinterpret_cast<void*>(ptr), size);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return guarded([&] { return map(ptr, size, offset, handle, flags); });
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return guarded([&] { return unmap(ptr, size); });
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                size_t count) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (desc == nullptr || count == 0 || !reserved(ptr, size)) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t granted = 0;
    std::uint64_t revoked = 0;
    for (size_t i = 0; i < count; ++i) {
      if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
          Driver::instance().device(desc[i].location.id) == nullptr) {
        return CUDA_ERROR_INVALID_DEVICE;
      }
      const std::uint64_t bit = std::uint64_t{1} << desc[i].location.id;
      (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE ? revoked : granted) |= bit;
    }
    // Every mapping inside the range (one call may cover several, as with the driver).
    Driver& driver = Driver::instance();
    std::vector<std::uintptr_t> mappings;
    {
      std::lock_guard lock(driver.alloc_mu);
      for (auto it = driver.allocations.lower_bound(ptr);
           it != driver.allocations.end() && it->first < ptr + size; ++it) {
        if (it->second.kind == MemoryKind::kMapped) mappings.push_back(it->first);
      }
    }
    std::lock_guard lock(driver.mu);
    for (std::uintptr_t base : mappings) {
      std::uint64_t& bits = driver.access[base];
      bits = (bits | granted) & ~revoked;
    }
    return CUDA_SUCCESS;
  });
}

// What cuMemSetAccess granted the device to the mapping that contains ptr.
CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location,
                                CUdeviceptr ptr) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (flags == nullptr || location == nullptr || location->type != CU_MEM_LOCATION_TYPE_DEVICE ||
        Driver::instance().device(location->id) == nullptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    Driver& driver = Driver::instance();
    auto mapped = driver.find_allocation(ptr, 1);
    if (!mapped || mapped->kind != MemoryKind::kMapped) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(driver.mu);
    auto it = driver.access.find(mapped->base);
    const std::uint64_t bits = it != driver.access.end() ? it->second : 0;
    *flags = (bits >> location->id) & 1 ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                                        : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return CUDA_SUCCESS;
  });
}

}  // extern "C"

// The simulated GPU has no legacy IPC (cuMemAlloc memory is private to its process here): the
// client library brokers device-backed memory itself and passes other handles through to these.
extern "C" {

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (pHandle == nullptr || dptr == 0) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED;
  });
}

CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle, unsigned int) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    return pdptr == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
  });
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle,
                                       unsigned int flags) {
  return cuIpcOpenMemHandle(pdptr, handle, flags);
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    return CUDA_ERROR_INVALID_VALUE;
  });
}

}  // extern "C"
