// Exported: allocation, memory info, managed memory (advice, prefetch) and pointer queries.
//
// Device memory counts against the device's capacity in the shared state (cuMemAlloc beyond it is
// CUDA_ERROR_OUT_OF_MEMORY). Managed memory does not: it starts on the host, moves by prefetch (a
// queued migration taking bytes / NVSHARE_FAKECUDA_SWAP_BW) or by demand faults at the next kernel
// of its context (bytes / NVSHARE_FAKECUDA_FAULT_BW added to that kernel), and is never evicted by
// the fake.
#include <algorithm>
#include <cstring>

#include "driver.h"

using fakecuda::Allocation;
using fakecuda::current_context;
using fakecuda::Driver;
using fakecuda::guarded;
using fakecuda::MemoryKind;
using fakecuda::require_init;

namespace {

constexpr std::size_t kPitchAlignment = 512;

// Bytes cuPointerGetAttribute writes for an attribute: 4 for enums, booleans and ordinals (the real
// driver writes booleans as unsigned int), 8 for handles, addresses, sizes and ids.
std::size_t attribute_size(CUpointer_attribute attribute) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      return 4;
    default:
      return 8;
  }
}

}  // namespace

namespace fakecuda {

std::uintptr_t register_allocation(Allocation allocation) {
  Driver& driver = Driver::instance();
  allocation.buffer_id = driver.next_id.fetch_add(1);
  std::lock_guard lock(driver.alloc_mu);
  std::uintptr_t base = allocation.base;
  driver.allocations[base] = std::move(allocation);
  return base;
}

CUresult allocate_device(const std::shared_ptr<CUctx_st>& ctx, std::size_t bytes,
                         CUdeviceptr* dptr) {
  fakecuda::Device* d = Driver::instance().device(ctx->device);
  if (!d->sim.reserve_device_memory(ctx->slot, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  std::size_t mapped = 0;
  void* p = fakecuda::map_memory(bytes, &mapped);
  if (p == nullptr) {
    d->sim.release_device_memory(ctx->slot, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Allocation a;
  a.base = reinterpret_cast<std::uintptr_t>(p);
  a.size = bytes;
  a.mapped_size = mapped;
  a.kind = MemoryKind::kDevice;
  a.ctx = ctx;
  *dptr = register_allocation(std::move(a));
  return CUDA_SUCCESS;
}

std::optional<Allocation> take_allocation(std::uintptr_t base,
                                          std::initializer_list<MemoryKind> kinds) {
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.alloc_mu);
  auto it = driver.allocations.find(base);
  if (it == driver.allocations.end()) return std::nullopt;
  if (std::find(kinds.begin(), kinds.end(), it->second.kind) == kinds.end()) return std::nullopt;
  Allocation a = std::move(it->second);
  driver.allocations.erase(it);
  return a;
}

void free_device_allocation(const Allocation& allocation) {
  Driver::instance()
      .device(allocation.ctx->device)
      ->sim.release_device_memory(allocation.ctx->slot, allocation.size);
  unmap_memory(reinterpret_cast<void*>(allocation.base), allocation.mapped_size);
}

}  // namespace fakecuda

namespace {

using fakecuda::allocate_device;
using fakecuda::register_allocation;
using fakecuda::take_allocation;

CUresult allocate_host(void** pp, std::size_t bytes, unsigned flags) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (pp == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<CUctx_st> ctx;
  if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
  std::size_t mapped = 0;
  void* p = fakecuda::map_memory(bytes, &mapped);
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation a;
  a.base = reinterpret_cast<std::uintptr_t>(p);
  a.size = bytes;
  a.mapped_size = mapped;
  a.kind = MemoryKind::kHost;
  a.ctx = ctx;
  a.flags = flags;
  *pp = reinterpret_cast<void*>(register_allocation(std::move(a)));
  return CUDA_SUCCESS;
}

// Where a prefetch or advice points: a device ordinal, or -1 for the host.
CUresult location_target(const CUmemLocation& location, int* target) {
  switch (location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (Driver::instance().device(location.id) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
      *target = location.id;
      return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      *target = CU_DEVICE_CPU;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult device_target(CUdevice device, int* target) {
  if (device == CU_DEVICE_CPU) {
    *target = CU_DEVICE_CPU;
    return CUDA_SUCCESS;
  }
  if (Driver::instance().device(device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *target = device;
  return CUDA_SUCCESS;
}

CUresult advise(CUdeviceptr ptr, std::size_t count, CUmem_advise advice, int target) {
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.alloc_mu);
  auto it = driver.allocations.upper_bound(ptr);
  if (it == driver.allocations.begin()) return CUDA_ERROR_INVALID_VALUE;
  Allocation& a = std::prev(it)->second;
  if (a.kind != MemoryKind::kManaged || ptr - a.base >= a.size || count > a.size - (ptr - a.base)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  bool prefer_host = a.prefer_host;
  if (advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION) prefer_host = target == CU_DEVICE_CPU;
  if (advice == CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION) prefer_host = false;
  if (prefer_host != a.prefer_host) {
    // Host-preferred memory stays where it is when kernels run: it is not demand-faulted in.
    std::uint64_t host_part = a.size - a.device_resident;
    if (prefer_host) {
      a.ctx->faultable_host_bytes -= host_part;
    } else {
      a.ctx->faultable_host_bytes += host_part;
    }
    a.prefer_host = prefer_host;
  }
  return CUDA_SUCCESS;
}

CUresult prefetch(CUdeviceptr ptr, std::size_t count, int target, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  auto found = Driver::instance().find_allocation(ptr, std::max<std::size_t>(count, 1));
  if (!found || found->kind != MemoryKind::kManaged) return CUDA_ERROR_INVALID_VALUE;
  const std::uintptr_t base = found->base;
  const bool to_device = target != CU_DEVICE_CPU;
  fakecuda::Op op;
  op.kind = fakecuda::Op::Kind::kMigration;
  // Residency moves when the migration starts, in stream order with the kernels that fault pages
  // in. The bytes stay accounted to the allocating context's device whichever device they are sent
  // to.
  op.prologue = [base, count, to_device]() -> std::uint64_t {
    Driver& driver = Driver::instance();
    std::uint64_t moved = 0;
    std::shared_ptr<CUctx_st> owner;
    {
      std::lock_guard lock(driver.alloc_mu);
      auto it = driver.allocations.find(base);
      if (it == driver.allocations.end()) return 0;  // freed meanwhile
      Allocation& a = it->second;
      owner = a.ctx;
      if (to_device) {
        moved = std::min<std::uint64_t>(count, a.size - a.device_resident);
        a.device_resident += moved;
        if (!a.prefer_host) owner->faultable_host_bytes -= moved;
      } else {
        moved = std::min<std::uint64_t>(count, a.device_resident);
        a.device_resident -= moved;
        if (!a.prefer_host) owner->faultable_host_bytes += moved;
      }
    }
    if (moved == 0) return 0;
    driver.device(owner->device)
        ->sim.migrate(owner->slot, moved,
                      to_device ? fakecuda::Migration::kToDevice : fakecuda::Migration::kToHost);
    return static_cast<std::uint64_t>(static_cast<double>(moved) * 1e9 /
                                      static_cast<double>(driver.config().swap_bytes_per_s));
  };
  return fakecuda::submit_to_stream(stream, std::move(op));
}

CUresult prefetch_to_device(CUdeviceptr ptr, std::size_t count, CUdevice device, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  int target = 0;
  if (CUresult rc = device_target(device, &target); rc != CUDA_SUCCESS) return rc;
  return prefetch(ptr, count, target, stream);
}

CUresult prefetch_to_location(CUdeviceptr ptr, std::size_t count, CUmemLocation location,
                              unsigned flags, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  int target = 0;
  if (CUresult rc = location_target(location, &target); rc != CUDA_SUCCESS) return rc;
  return prefetch(ptr, count, target, stream);
}

// Stream-ordered allocation: device memory at once (the fake has no pool to grow), counted like
// cuMemAlloc; the stream only has to be valid.
CUresult allocate_async(CUdeviceptr* dptr, std::size_t bytes, CUstream stream) {
  std::shared_ptr<CUctx_st> ctx;
  std::shared_ptr<CUstream_st> resolved;
  if (CUresult rc = fakecuda::resolve_stream(stream, &ctx, &resolved); rc != CUDA_SUCCESS)
    return rc;
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  return allocate_device(ctx, bytes, dptr);
}

// Stream-ordered free: the memory goes back when the stream's earlier work has run.
CUresult free_async(CUdeviceptr dptr, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  auto found = Driver::instance().find_allocation(dptr);
  if (!found || found->base != dptr || found->kind != MemoryKind::kDevice) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  fakecuda::Op op;
  op.kind = fakecuda::Op::Kind::kHostAction;
  op.action = [dptr] {
    if (auto a = take_allocation(dptr, {MemoryKind::kDevice})) fakecuda::free_device_allocation(*a);
  };
  return fakecuda::submit_to_stream(stream, std::move(op));
}

// cuMemPrefetchBatchAsync: prefetchLocs[k] applies to the operations from prefetchLocIdxs[k] up to
// the next index (or the end).
CUresult prefetch_batch(CUdeviceptr* dptrs, std::size_t* sizes, std::size_t count,
                        CUmemLocation* locations, std::size_t* first_ops,
                        std::size_t locations_count, unsigned long long flags, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (count == 0 || dptrs == nullptr || sizes == nullptr || locations == nullptr ||
      first_ops == nullptr || locations_count == 0 || locations_count > count ||
      first_ops[0] != 0 || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (std::size_t k = 1; k < locations_count; ++k) {
    if (first_ops[k] <= first_ops[k - 1] || first_ops[k] >= count) return CUDA_ERROR_INVALID_VALUE;
  }
  std::size_t k = 0;
  for (std::size_t i = 0; i < count; ++i) {
    while (k + 1 < locations_count && first_ops[k + 1] <= i) ++k;
    if (CUresult rc = prefetch_to_location(dptrs[i], sizes[i], locations[k], 0, stream);
        rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  return CUDA_SUCCESS;
}

std::shared_ptr<CUmemPoolHandle_st> find_pool(CUmemoryPool pool) {
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  auto it = driver.pools.find(pool);
  return it == driver.pools.end() ? nullptr : it->second;
}

CUmemoryPool make_pool(int device) {
  auto pool = std::make_shared<CUmemPoolHandle_st>();
  pool->device = device;
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  driver.pools[pool.get()] = pool;
  return pool.get();
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> ctx;
    if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    return allocate_device(ctx, bytesize, dptr);
  });
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes,
                                    size_t Height, unsigned int ElementSizeBytes) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> ctx;
    if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
    if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::size_t pitch = (WidthInBytes + kPitchAlignment - 1) / kPitchAlignment * kPitchAlignment;
    if (Height > SIZE_MAX / pitch) return CUDA_ERROR_OUT_OF_MEMORY;
    if (CUresult rc = allocate_device(ctx, pitch * Height, dptr); rc != CUDA_SUCCESS) return rc;
    *pPitch = pitch;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> ctx;
    if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
    if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
      return CUDA_ERROR_INVALID_VALUE;
    std::size_t mapped = 0;
    void* p = fakecuda::map_memory(bytesize, &mapped);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    // Managed memory is populated on first touch; until a kernel or a prefetch moves it, it is on
    // the host.
    Driver::instance().device(ctx->device)->sim.add_managed(ctx->slot, 0, bytesize);
    ctx->faultable_host_bytes += bytesize;
    Allocation a;
    a.base = reinterpret_cast<std::uintptr_t>(p);
    a.size = bytesize;
    a.mapped_size = mapped;
    a.kind = MemoryKind::kManaged;
    a.ctx = ctx;
    a.flags = flags;
    *dptr = register_allocation(std::move(a));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (dptr == 0) return CUDA_SUCCESS;
    auto found = Driver::instance().find_allocation(dptr);
    if (!found || found->base != dptr || found->kind == MemoryKind::kHost) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // Like the real driver, freeing waits for the context's queued work, which may still use it.
    found->ctx->queue->drain();
    auto a = take_allocation(dptr, {MemoryKind::kDevice, MemoryKind::kManaged});
    if (!a) return CUDA_ERROR_INVALID_VALUE;  // freed by another thread meanwhile
    fakecuda::Device* d = Driver::instance().device(a->ctx->device);
    if (a->kind == MemoryKind::kDevice) {
      d->sim.release_device_memory(a->ctx->slot, a->size);
    } else {
      const std::uint64_t host_part = a->size - a->device_resident;
      d->sim.remove_managed(a->ctx->slot, a->device_resident, host_part);
      if (!a->prefer_host) a->ctx->faultable_host_bytes -= host_part;
    }
    fakecuda::unmap_memory(reinterpret_cast<void*>(a->base), a->mapped_size);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> ctx;
    if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    fakecuda::SimDevice& sim = Driver::instance().device(ctx->device)->sim;
    sim.maybe_reap();
    fakecuda::MemoryTotals totals = sim.memory();
    *free = totals.free();
    *total = totals.total;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                             CUdevice device) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    int target = 0;
    if (CUresult rc = device_target(device, &target); rc != CUDA_SUCCESS) return rc;
    return advise(devPtr, count, advice, target);
  });
}

CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                CUmemLocation location) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    int target = 0;
    if (CUresult rc = location_target(location, &target); rc != CUDA_SUCCESS) return rc;
    return advise(devPtr, count, advice, target);
  });
}

CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                    CUstream hStream) {
  return guarded([&] { return prefetch_to_device(devPtr, count, dstDevice, hStream); });
}

CUresult CUDAAPI cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                         CUstream hStream) {
  return guarded([&] { return prefetch_to_device(devPtr, count, dstDevice, hStream); });
}

CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                       unsigned int flags, CUstream hStream) {
  return guarded([&] { return prefetch_to_location(devPtr, count, location, flags, hStream); });
}

CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count,
                                            CUmemLocation location, unsigned int flags,
                                            CUstream hStream) {
  return guarded([&] { return prefetch_to_location(devPtr, count, location, flags, hStream); });
}

CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) {
  return guarded([&] { return allocate_host(pp, bytesize, 0); });
}

CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  return guarded([&] { return allocate_host(pp, bytesize, Flags); });
}

CUresult CUDAAPI cuMemFreeHost(void* p) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    auto a = take_allocation(reinterpret_cast<std::uintptr_t>(p), {MemoryKind::kHost});
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    fakecuda::unmap_memory(reinterpret_cast<void*>(a->base), a->mapped_size);
    return CUDA_SUCCESS;
  });
}

// Page-locks memory the caller mapped: recorded as host memory the fake does not own
// (mapped_size 0), so copies accept it and cuMemHostUnregister leaves the pages to the caller. As
// the real driver, it needs a current context (CUDA_ERROR_INVALID_CONTEXT without one).
CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> current;
    if (CUresult rc = current_context(&current); rc != CUDA_SUCCESS) return rc;
    if (p == nullptr || bytesize == 0 || (Flags & ~0xfu) != 0) return CUDA_ERROR_INVALID_VALUE;
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    Driver& driver = Driver::instance();
    if (driver.find_allocation(base, 1) || driver.find_allocation(base + bytesize - 1, 1)) {
      return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    Allocation a;
    a.base = base;
    a.size = bytesize;
    a.mapped_size = 0;
    a.kind = MemoryKind::kHost;
    fakecuda::register_allocation(std::move(a));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemHostUnregister(void* p) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    auto a = take_allocation(reinterpret_cast<std::uintptr_t>(p), {MemoryKind::kHost});
    if (!a) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    if (a->mapped_size != 0) {  // cuMemHostAlloc memory is not registered memory
      fakecuda::register_allocation(std::move(*a));
      return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (pdptr == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    auto a = Driver::instance().find_allocation(reinterpret_cast<std::uintptr_t>(p));
    if (!a || a->kind != MemoryKind::kHost) return CUDA_ERROR_INVALID_VALUE;
    *pdptr =
        reinterpret_cast<CUdeviceptr>(p);  // unified addressing: the host address is the device one
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    auto a = Driver::instance().find_allocation(dptr);
    if (!a) return CUDA_ERROR_NOT_FOUND;
    if (pbase != nullptr) *pbase = a->base;
    if (psize != nullptr) *psize = a->size;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto a = Driver::instance().find_allocation(ptr);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    const bool host = a->kind == MemoryKind::kHost;
    auto put = [data](auto value) {
      std::memcpy(data, &value, sizeof value);
      return CUDA_SUCCESS;
    };
    switch (attribute) {
      case CU_POINTER_ATTRIBUTE_CONTEXT:
        return put(static_cast<CUcontext>(a->ctx.get()));
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        return put(static_cast<unsigned>(host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE));
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        return put(static_cast<CUdeviceptr>(ptr));
      case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (a->kind == MemoryKind::kDevice) return CUDA_ERROR_INVALID_VALUE;
        return put(reinterpret_cast<void*>(ptr));
      case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        return put(1U);
      case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        return put(static_cast<unsigned long long>(a->buffer_id));
      case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        return put(static_cast<unsigned>(a->kind == MemoryKind::kManaged ? 1 : 0));
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        return put(a->ctx ? a->ctx->device : 0);
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        return put(static_cast<CUdeviceptr>(a->base));
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        return put(static_cast<std::size_t>(a->size));
      case CU_POINTER_ATTRIBUTE_MAPPED:
        return put(1U);
      case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
        return put(0U);
      case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        return put(static_cast<unsigned>(CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE));
      case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        return put(reinterpret_cast<void*>(a->base));
      case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        return put(static_cast<std::size_t>(a->mapped_size));
      case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        return put(static_cast<unsigned long long>(a->buffer_id));
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes,
                                        void** data, CUdeviceptr ptr) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (numAttributes > 0 && (attributes == nullptr || data == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numAttributes; ++i) {
      if (data[i] == nullptr) continue;
      if (cuPointerGetAttribute(data[i], attributes[i], ptr) != CUDA_SUCCESS) {
        // Unlike the single query, the batch form reports unknown pointers as zeros (or null).
        std::memset(data[i], 0, attribute_size(attributes[i]));
      }
    }
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                         CUmemLocation* prefetchLocs, size_t* prefetchLocIdxs,
                                         size_t numPrefetchLocs, unsigned long long flags,
                                         CUstream hStream) {
  return guarded([&] {
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs,
                          flags, hStream);
  });
}

CUresult CUDAAPI cuMemPrefetchBatchAsync_ptsz(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                              CUmemLocation* prefetchLocs, size_t* prefetchLocIdxs,
                                              size_t numPrefetchLocs, unsigned long long flags,
                                              CUstream hStream) {
  return guarded([&] {
    return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs,
                          flags, hStream);
  });
}

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return guarded([&] { return allocate_async(dptr, bytesize, hStream); });
}

CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return guarded([&] { return allocate_async(dptr, bytesize, hStream); });
}

CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream hStream) {
  return guarded([&] {
    if (!find_pool(pool)) return CUDA_ERROR_INVALID_VALUE;
    return allocate_async(dptr, bytesize, hStream);
  });
}

CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream) {
  return guarded([&] {
    if (!find_pool(pool)) return CUDA_ERROR_INVALID_VALUE;
    return allocate_async(dptr, bytesize, hStream);
  });
}

CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  return guarded([&] { return free_async(dptr, hStream); });
}

CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  return guarded([&] { return free_async(dptr, hStream); });
}

CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (Driver::instance().device(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
    static CUmemoryPool defaults[fakecuda::kMaxConfiguredDevices] = {};
    static std::mutex mu;
    std::lock_guard lock(mu);
    if (defaults[dev] == nullptr) defaults[dev] = make_pool(dev);
    *pool_out = defaults[dev];
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (pool == nullptr || poolProps == nullptr ||
        poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        Driver::instance().device(poolProps->location.id) == nullptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    *pool = make_pool(poolProps->location.id);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    return driver.pools.erase(pool) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

}  // extern "C"
