// Exported: copies and memsets. They really move bytes (device memory is host memory) and take no
// simulated time. Synchronous forms first wait for the current context's queued work, as the legacy
// default stream does; asynchronous forms run in stream order (at once when the queue is idle).
// The _ptds / _ptsz per-thread-default-stream forms share the implementation: the fake's default
// stream is the context's single queue either way. 2D and 3D copies take host, device and unified
// operands (CUDA arrays are not simulated); peer copies ignore the contexts (all device memory is
// host memory here); batch copies queue their copies in order. Memory mapped with cuMemMap must be
// accessible from the current context's device (cuMemSetAccess) for copies and memsets, which may
// span mappings laid side by side in one reservation.
#include <cstring>

#include "driver.h"

using fakecuda::Driver;
using fakecuda::guarded;
using fakecuda::require_init;

namespace {

// The device side of a copy or memset must lie inside one allocation, and a mapping made with the
// virtual memory management API must be accessible from the current context's device
// (cuMemSetAccess), as on a GPU.
// Whether the current context may access the mapping at `base` (no context: checked by the
// caller).
bool accessible(std::uintptr_t base) {
  Driver& driver = Driver::instance();
  std::shared_ptr<CUctx_st> ctx;
  if (fakecuda::current_context(&ctx) != CUDA_SUCCESS) return true;
  std::lock_guard lock(driver.mu);
  auto it = driver.access.find(base);
  return it != driver.access.end() && ((it->second >> ctx->device) & 1) != 0;
}

// One allocation holds the range; or, as with the driver, mappings laid side by side in one
// reservation do, each accessible.
bool valid_range(CUdeviceptr address, std::size_t bytes) {
  Driver& driver = Driver::instance();
  const std::optional<fakecuda::Allocation> found = driver.find_allocation(address, bytes);
  if (found) return found->kind != fakecuda::MemoryKind::kMapped || accessible(found->base);
  const std::uintptr_t end = address + bytes;
  for (std::uintptr_t at = address; at < end;) {
    const std::optional<fakecuda::Allocation> piece = driver.find_allocation(at, 1);
    if (!piece || piece->kind != fakecuda::MemoryKind::kMapped || !accessible(piece->base)) {
      return false;
    }
    at = piece->base + piece->size;
  }
  return true;
}

CUresult copy_sync(void* dst, const void* src, std::size_t bytes) {
  if (CUresult rc = fakecuda::synchronize_current_context(); rc != CUDA_SUCCESS) return rc;
  if (bytes > 0) std::memmove(dst, src, bytes);
  return CUDA_SUCCESS;
}

CUresult copy_async(void* dst, const void* src, std::size_t bytes, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  fakecuda::Op op;
  op.kind = fakecuda::Op::Kind::kHostAction;
  op.action = [dst, src, bytes] {
    if (bytes > 0) std::memmove(dst, src, bytes);
  };
  return fakecuda::submit_to_stream(stream, std::move(op));
}

void fill(CUdeviceptr dst, unsigned value, unsigned element_size, std::size_t count) {
  if (value == 0 || element_size == 1) {
    fakecuda::fill_bytes(reinterpret_cast<void*>(dst), static_cast<unsigned char>(value),
                         count * element_size);
    return;
  }
  if (element_size == 2) {
    auto* p = reinterpret_cast<std::uint16_t*>(dst);
    for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<std::uint16_t>(value);
  } else {
    auto* p = reinterpret_cast<std::uint32_t*>(dst);
    for (std::size_t i = 0; i < count; ++i) p[i] = value;
  }
}

CUresult check_memset(CUdeviceptr dst, unsigned element_size, std::size_t count) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (dst % element_size != 0) return CUDA_ERROR_INVALID_VALUE;
  if (count > SIZE_MAX / element_size) return CUDA_ERROR_INVALID_VALUE;
  if (count > 0 && !valid_range(dst, count * element_size)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult memset_sync(CUdeviceptr dst, unsigned value, unsigned element_size, std::size_t count) {
  if (CUresult rc = check_memset(dst, element_size, count); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = fakecuda::synchronize_current_context(); rc != CUDA_SUCCESS) return rc;
  fill(dst, value, element_size, count);
  return CUDA_SUCCESS;
}

CUresult memset_async(CUdeviceptr dst, unsigned value, unsigned element_size, std::size_t count,
                      CUstream stream) {
  if (CUresult rc = check_memset(dst, element_size, count); rc != CUDA_SUCCESS) return rc;
  fakecuda::Op op;
  op.kind = fakecuda::Op::Kind::kHostAction;
  op.action = [dst, value, element_size, count] { fill(dst, value, element_size, count); };
  return fakecuda::submit_to_stream(stream, std::move(op));
}

void* host(CUdeviceptr p) { return reinterpret_cast<void*>(p); }

CUresult htod(CUdeviceptr dst, const void* src, std::size_t bytes) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (bytes > 0 && (src == nullptr || !valid_range(dst, bytes))) return CUDA_ERROR_INVALID_VALUE;
  return copy_sync(host(dst), src, bytes);
}

CUresult dtoh(void* dst, CUdeviceptr src, std::size_t bytes) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (bytes > 0 && (dst == nullptr || !valid_range(src, bytes))) return CUDA_ERROR_INVALID_VALUE;
  return copy_sync(dst, host(src), bytes);
}

CUresult dtod(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (bytes > 0 && (!valid_range(dst, bytes) || !valid_range(src, bytes))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return copy_sync(host(dst), host(src), bytes);
}

CUresult htod_async(CUdeviceptr dst, const void* src, std::size_t bytes, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (bytes > 0 && (src == nullptr || !valid_range(dst, bytes))) return CUDA_ERROR_INVALID_VALUE;
  return copy_async(host(dst), src, bytes, stream);
}

CUresult dtoh_async(void* dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (bytes > 0 && (dst == nullptr || !valid_range(src, bytes))) return CUDA_ERROR_INVALID_VALUE;
  return copy_async(dst, host(src), bytes, stream);
}

CUresult dtod_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (bytes > 0 && (!valid_range(dst, bytes) || !valid_range(src, bytes))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return copy_async(host(dst), host(src), bytes, stream);
}

// Unified addressing: either side may be host or device memory, so nothing is range-checked.
CUresult unified(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (bytes > 0 && (dst == 0 || src == 0)) return CUDA_ERROR_INVALID_VALUE;
  return copy_sync(host(dst), host(src), bytes);
}

CUresult unified_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (bytes > 0 && (dst == 0 || src == 0)) return CUDA_ERROR_INVALID_VALUE;
  return copy_async(host(dst), host(src), bytes, stream);
}

// One side of a 2D/3D copy: its first byte and how its rows and layers are laid out.
struct Side {
  unsigned char* first = nullptr;
  bool device = false;
  std::size_t pitch = 0;
  std::size_t height = 0;  // rows per layer
};

struct Copy3D {
  Side src;
  Side dst;
  std::size_t width = 0;  // bytes per row
  std::size_t rows = 0;
  std::size_t layers = 0;
};

CUresult make_side(CUmemorytype type, const void* host, CUdeviceptr device, std::size_t x,
                   std::size_t y, std::size_t z, std::size_t pitch, std::size_t height, Side* out) {
  switch (type) {
    case CU_MEMORYTYPE_HOST:
      out->first = static_cast<unsigned char*>(const_cast<void*>(host));
      break;
    case CU_MEMORYTYPE_DEVICE:
      out->first = reinterpret_cast<unsigned char*>(device);
      out->device = true;
      break;
    case CU_MEMORYTYPE_UNIFIED:
      out->first = reinterpret_cast<unsigned char*>(device);
      out->device = Driver::instance().find_allocation(device).has_value();
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;  // CUDA arrays are not simulated
  }
  if (out->first == nullptr) return CUDA_ERROR_INVALID_VALUE;
  out->pitch = pitch;
  out->height = height;
  out->first += (z * height + y) * pitch + x;
  return CUDA_SUCCESS;
}

// Checks the layout and that device sides lie inside one allocation.
CUresult check_copy(const Copy3D& c) {
  if (c.width == 0 || c.rows == 0 || c.layers == 0) return CUDA_SUCCESS;
  for (const Side* side : {&c.src, &c.dst}) {
    if ((c.rows > 1 || c.layers > 1) && side->pitch < c.width) return CUDA_ERROR_INVALID_VALUE;
    if (c.layers > 1 && side->height < c.rows) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t extent =
        ((c.layers - 1) * side->height + (c.rows - 1)) * side->pitch + c.width;
    if (side->device && !valid_range(reinterpret_cast<CUdeviceptr>(side->first), extent)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}

void run_copy(const Copy3D& c) {
  for (std::size_t z = 0; z < c.layers; ++z) {
    for (std::size_t y = 0; y < c.rows; ++y) {
      std::memmove(c.dst.first + (z * c.dst.height + y) * c.dst.pitch,
                   c.src.first + (z * c.src.height + y) * c.src.pitch, c.width);
    }
  }
}

CUresult copy_3d(const Copy3D& c, bool async, CUstream stream) {
  if (CUresult rc = check_copy(c); rc != CUDA_SUCCESS) return rc;
  if (!async) {
    if (CUresult rc = fakecuda::synchronize_current_context(); rc != CUDA_SUCCESS) return rc;
    run_copy(c);
    return CUDA_SUCCESS;
  }
  fakecuda::Op op;
  op.kind = fakecuda::Op::Kind::kHostAction;
  op.action = [c] { run_copy(c); };
  return fakecuda::submit_to_stream(stream, std::move(op));
}

CUresult copy_2d(const CUDA_MEMCPY2D* p, bool async, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Copy3D c;
  c.width = p->WidthInBytes;
  c.rows = p->Height;
  c.layers = 1;
  if (CUresult rc = make_side(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY,
                              0, p->srcPitch, p->Height, &c.src);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (CUresult rc = make_side(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes, p->dstY,
                              0, p->dstPitch, p->Height, &c.dst);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  return copy_3d(c, async, stream);
}

template <typename Params>
CUresult copy_3d_params(const Params* p, bool async, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Copy3D c;
  c.width = p->WidthInBytes;
  c.rows = p->Height;
  c.layers = p->Depth;
  const std::size_t src_height = p->srcHeight != 0 ? p->srcHeight : p->Height;
  const std::size_t dst_height = p->dstHeight != 0 ? p->dstHeight : p->Height;
  if (CUresult rc = make_side(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY,
                              p->srcZ, p->srcPitch, src_height, &c.src);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (CUresult rc = make_side(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes, p->dstY,
                              p->dstZ, p->dstPitch, dst_height, &c.dst);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  return copy_3d(c, async, stream);
}

// cuMemcpyBatchAsync: independent 1D copies in stream order. failIdx (12.8 form) is SIZE_MAX on
// success, else the first copy that failed.
CUresult copy_batch(CUdeviceptr* dsts, CUdeviceptr* srcs, std::size_t* sizes, std::size_t count,
                    std::size_t* fail_index, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (fail_index != nullptr) *fail_index = SIZE_MAX;
  for (std::size_t i = 0; i < count; ++i) {
    if (CUresult rc = unified_async(dsts[i], srcs[i], sizes[i], stream); rc != CUDA_SUCCESS) {
      if (fail_index != nullptr) *fail_index = i;
      return rc;
    }
  }
  return CUDA_SUCCESS;
}

// cuMemcpy3DBatchAsync with pointer operands (elements are bytes; CUDA arrays are not simulated).
CUresult copy_3d_batch(std::size_t count, CUDA_MEMCPY3D_BATCH_OP* ops, std::size_t* fail_index,
                       CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (count == 0 || ops == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (fail_index != nullptr) *fail_index = SIZE_MAX;
  for (std::size_t i = 0; i < count; ++i) {
    const CUDA_MEMCPY3D_BATCH_OP& op = ops[i];
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (op.src.type == CU_MEMCPY_OPERAND_TYPE_POINTER &&
        op.dst.type == CU_MEMCPY_OPERAND_TYPE_POINTER) {
      Copy3D c;
      c.width = op.extent.width;
      c.rows = op.extent.height;
      c.layers = op.extent.depth;
      auto side = [&c](const CUmemcpy3DOperand& operand, Side* out) {
        const std::size_t pitch =
            operand.op.ptr.rowLength != 0 ? operand.op.ptr.rowLength : c.width;
        const std::size_t height =
            operand.op.ptr.layerHeight != 0 ? operand.op.ptr.layerHeight : c.rows;
        return make_side(CU_MEMORYTYPE_UNIFIED, nullptr, operand.op.ptr.ptr, 0, 0, 0, pitch, height,
                         out);
      };
      rc = side(op.src, &c.src);
      if (rc == CUDA_SUCCESS) rc = side(op.dst, &c.dst);
      if (rc == CUDA_SUCCESS) rc = copy_3d(c, /*async=*/true, stream);
    }
    if (rc != CUDA_SUCCESS) {
      if (fail_index != nullptr) *fail_index = i;
      return rc;
    }
  }
  return CUDA_SUCCESS;
}

CUresult memset_2d(CUdeviceptr dst, std::size_t pitch, unsigned value, unsigned element_size,
                   std::size_t width, std::size_t height, bool async, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (width == 0 || height == 0) return CUDA_SUCCESS;
  if (dst % element_size != 0 || pitch % element_size != 0 ||
      (height > 1 && pitch < width * element_size) ||
      !valid_range(dst, (height - 1) * pitch + width * element_size)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto rows = [dst, pitch, value, element_size, width, height] {
    for (std::size_t y = 0; y < height; ++y) fill(dst + y * pitch, value, element_size, width);
  };
  if (!async) {
    if (CUresult rc = fakecuda::synchronize_current_context(); rc != CUDA_SUCCESS) return rc;
    rows();
    return CUDA_SUCCESS;
  }
  fakecuda::Op op;
  op.kind = fakecuda::Op::Kind::kHostAction;
  op.action = rows;
  return fakecuda::submit_to_stream(stream, std::move(op));
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return guarded([&] { return unified(dst, src, ByteCount); });
}
CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return guarded([&] { return unified(dst, src, ByteCount); });
}
CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                               CUstream hStream) {
  return guarded([&] { return unified_async(dst, src, ByteCount, hStream); });
}
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                    CUstream hStream) {
  return guarded([&] { return unified_async(dst, src, ByteCount, hStream); });
}

CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  return guarded([&] { return htod(dstDevice, srcHost, ByteCount); });
}
CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost,
                                      size_t ByteCount) {
  return guarded([&] { return htod(dstDevice, srcHost, ByteCount); });
}
CUresult CUDAAPI cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return guarded([&] { return dtoh(dstHost, srcDevice, ByteCount); });
}
CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return guarded([&] { return dtoh(dstHost, srcDevice, ByteCount); });
}
CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  return guarded([&] { return dtod(dstDevice, srcDevice, ByteCount); });
}
CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                      size_t ByteCount) {
  return guarded([&] { return dtod(dstDevice, srcDevice, ByteCount); });
}

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount,
                                      CUstream hStream) {
  return guarded([&] { return htod_async(dstDevice, srcHost, ByteCount, hStream); });
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void* srcHost,
                                           size_t ByteCount, CUstream hStream) {
  return guarded([&] { return htod_async(dstDevice, srcHost, ByteCount, hStream); });
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                      CUstream hStream) {
  return guarded([&] { return dtoh_async(dstHost, srcDevice, ByteCount, hStream); });
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                           CUstream hStream) {
  return guarded([&] { return dtoh_async(dstHost, srcDevice, ByteCount, hStream); });
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                      size_t ByteCount, CUstream hStream) {
  return guarded([&] { return dtod_async(dstDevice, srcDevice, ByteCount, hStream); });
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                           size_t ByteCount, CUstream hStream) {
  return guarded([&] { return dtod_async(dstDevice, srcDevice, ByteCount, hStream); });
}

CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  return guarded([&] { return memset_sync(dstDevice, uc, 1, N); });
}
CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  return guarded([&] { return memset_sync(dstDevice, uc, 1, N); });
}
CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N) {
  return guarded([&] { return memset_sync(dstDevice, us, 2, N); });
}
CUresult CUDAAPI cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N) {
  return guarded([&] { return memset_sync(dstDevice, us, 2, N); });
}
CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  return guarded([&] { return memset_sync(dstDevice, ui, 4, N); });
}
CUresult CUDAAPI cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  return guarded([&] { return memset_sync(dstDevice, ui, 4, N); });
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                 CUstream hStream) {
  return guarded([&] { return memset_async(dstDevice, uc, 1, N, hStream); });
}
CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                      CUstream hStream) {
  return guarded([&] { return memset_async(dstDevice, uc, 1, N, hStream); });
}
CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N,
                                  CUstream hStream) {
  return guarded([&] { return memset_async(dstDevice, us, 2, N, hStream); });
}
CUresult CUDAAPI cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N,
                                       CUstream hStream) {
  return guarded([&] { return memset_async(dstDevice, us, 2, N, hStream); });
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                  CUstream hStream) {
  return guarded([&] { return memset_async(dstDevice, ui, 4, N, hStream); });
}
CUresult CUDAAPI cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                       CUstream hStream) {
  return guarded([&] { return memset_async(dstDevice, ui, 4, N, hStream); });
}

CUresult CUDAAPI cuMemcpy2D_v2(const CUDA_MEMCPY2D* pCopy) {
  return guarded([&] { return copy_2d(pCopy, false, nullptr); });
}
CUresult CUDAAPI cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D* pCopy) {
  return guarded([&] { return copy_2d(pCopy, false, nullptr); });
}
CUresult CUDAAPI cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* pCopy) {
  return guarded([&] { return copy_2d(pCopy, false, nullptr); });
}
CUresult CUDAAPI cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D* pCopy) {
  return guarded([&] { return copy_2d(pCopy, false, nullptr); });
}
CUresult CUDAAPI cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
  return guarded([&] { return copy_2d(pCopy, true, hStream); });
}
CUresult CUDAAPI cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
  return guarded([&] { return copy_2d(pCopy, true, hStream); });
}
CUresult CUDAAPI cuMemcpy3D_v2(const CUDA_MEMCPY3D* pCopy) {
  return guarded([&] { return copy_3d_params(pCopy, false, nullptr); });
}
CUresult CUDAAPI cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D* pCopy) {
  return guarded([&] { return copy_3d_params(pCopy, false, nullptr); });
}
CUresult CUDAAPI cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* pCopy, CUstream hStream) {
  return guarded([&] { return copy_3d_params(pCopy, true, hStream); });
}
CUresult CUDAAPI cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D* pCopy, CUstream hStream) {
  return guarded([&] { return copy_3d_params(pCopy, true, hStream); });
}
CUresult CUDAAPI cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER* pCopy) {
  return guarded([&] { return copy_3d_params(pCopy, false, nullptr); });
}
CUresult CUDAAPI cuMemcpy3DPeer_ptds(const CUDA_MEMCPY3D_PEER* pCopy) {
  return guarded([&] { return copy_3d_params(pCopy, false, nullptr); });
}
CUresult CUDAAPI cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER* pCopy, CUstream hStream) {
  return guarded([&] { return copy_3d_params(pCopy, true, hStream); });
}
CUresult CUDAAPI cuMemcpy3DPeerAsync_ptsz(const CUDA_MEMCPY3D_PEER* pCopy, CUstream hStream) {
  return guarded([&] { return copy_3d_params(pCopy, true, hStream); });
}

// Peer copies: the contexts only name the devices; every device's memory is host memory here.
CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext /*dstContext*/,
                              CUdeviceptr srcDevice, CUcontext /*srcContext*/, size_t ByteCount) {
  return guarded([&] { return dtod(dstDevice, srcDevice, ByteCount); });
}
CUresult CUDAAPI cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext /*dstContext*/,
                                   CUdeviceptr srcDevice, CUcontext /*srcContext*/,
                                   size_t ByteCount) {
  return guarded([&] { return dtod(dstDevice, srcDevice, ByteCount); });
}
CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext /*dstContext*/,
                                   CUdeviceptr srcDevice, CUcontext /*srcContext*/,
                                   size_t ByteCount, CUstream hStream) {
  return guarded([&] { return dtod_async(dstDevice, srcDevice, ByteCount, hStream); });
}
CUresult CUDAAPI cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext /*dstContext*/,
                                        CUdeviceptr srcDevice, CUcontext /*srcContext*/,
                                        size_t ByteCount, CUstream hStream) {
  return guarded([&] { return dtod_async(dstDevice, srcDevice, ByteCount, hStream); });
}

CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                    size_t count, CUmemcpyAttributes* /*attrs*/,
                                    size_t* /*attrsIdxs*/, size_t /*numAttrs*/, size_t* failIdx,
                                    CUstream hStream) {
  return guarded([&] { return copy_batch(dsts, srcs, sizes, count, failIdx, hStream); });
}
CUresult CUDAAPI cuMemcpyBatchAsync_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                         size_t count, CUmemcpyAttributes* /*attrs*/,
                                         size_t* /*attrsIdxs*/, size_t /*numAttrs*/,
                                         size_t* failIdx, CUstream hStream) {
  return guarded([&] { return copy_batch(dsts, srcs, sizes, count, failIdx, hStream); });
}
CUresult CUDAAPI cuMemcpyBatchAsync_v2(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                       size_t count, CUmemcpyAttributes* /*attrs*/,
                                       size_t* /*attrsIdxs*/, size_t /*numAttrs*/,
                                       CUstream hStream) {
  return guarded([&] { return copy_batch(dsts, srcs, sizes, count, nullptr, hStream); });
}
CUresult CUDAAPI cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                            size_t count, CUmemcpyAttributes* /*attrs*/,
                                            size_t* /*attrsIdxs*/, size_t /*numAttrs*/,
                                            CUstream hStream) {
  return guarded([&] { return copy_batch(dsts, srcs, sizes, count, nullptr, hStream); });
}
CUresult CUDAAPI cuMemcpy3DBatchAsync(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList,
                                      size_t* failIdx, unsigned long long /*flags*/,
                                      CUstream hStream) {
  return guarded([&] { return copy_3d_batch(numOps, opList, failIdx, hStream); });
}
CUresult CUDAAPI cuMemcpy3DBatchAsync_ptsz(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList,
                                           size_t* failIdx, unsigned long long /*flags*/,
                                           CUstream hStream) {
  return guarded([&] { return copy_3d_batch(numOps, opList, failIdx, hStream); });
}
CUresult CUDAAPI cuMemcpy3DBatchAsync_v2(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList,
                                         unsigned long long /*flags*/, CUstream hStream) {
  return guarded([&] { return copy_3d_batch(numOps, opList, nullptr, hStream); });
}
CUresult CUDAAPI cuMemcpy3DBatchAsync_v2_ptsz(size_t numOps, CUDA_MEMCPY3D_BATCH_OP* opList,
                                              unsigned long long /*flags*/, CUstream hStream) {
  return guarded([&] { return copy_3d_batch(numOps, opList, nullptr, hStream); });
}

CUresult CUDAAPI cuMemsetD2D8_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc,
                                 size_t Width, size_t Height) {
  return guarded(
      [&] { return memset_2d(dstDevice, dstPitch, uc, 1, Width, Height, false, nullptr); });
}
CUresult CUDAAPI cuMemsetD2D8_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc,
                                      size_t Width, size_t Height) {
  return guarded(
      [&] { return memset_2d(dstDevice, dstPitch, uc, 1, Width, Height, false, nullptr); });
}
CUresult CUDAAPI cuMemsetD2D16_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us,
                                  size_t Width, size_t Height) {
  return guarded(
      [&] { return memset_2d(dstDevice, dstPitch, us, 2, Width, Height, false, nullptr); });
}
CUresult CUDAAPI cuMemsetD2D16_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us,
                                       size_t Width, size_t Height) {
  return guarded(
      [&] { return memset_2d(dstDevice, dstPitch, us, 2, Width, Height, false, nullptr); });
}
CUresult CUDAAPI cuMemsetD2D32_v2(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui,
                                  size_t Width, size_t Height) {
  return guarded(
      [&] { return memset_2d(dstDevice, dstPitch, ui, 4, Width, Height, false, nullptr); });
}
CUresult CUDAAPI cuMemsetD2D32_v2_ptds(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui,
                                       size_t Width, size_t Height) {
  return guarded(
      [&] { return memset_2d(dstDevice, dstPitch, ui, 4, Width, Height, false, nullptr); });
}
CUresult CUDAAPI cuMemsetD2D8Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc,
                                   size_t Width, size_t Height, CUstream hStream) {
  return guarded(
      [&] { return memset_2d(dstDevice, dstPitch, uc, 1, Width, Height, true, hStream); });
}
CUresult CUDAAPI cuMemsetD2D8Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc,
                                        size_t Width, size_t Height, CUstream hStream) {
  return guarded(
      [&] { return memset_2d(dstDevice, dstPitch, uc, 1, Width, Height, true, hStream); });
}
CUresult CUDAAPI cuMemsetD2D16Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us,
                                    size_t Width, size_t Height, CUstream hStream) {
  return guarded(
      [&] { return memset_2d(dstDevice, dstPitch, us, 2, Width, Height, true, hStream); });
}
CUresult CUDAAPI cuMemsetD2D16Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us,
                                         size_t Width, size_t Height, CUstream hStream) {
  return guarded(
      [&] { return memset_2d(dstDevice, dstPitch, us, 2, Width, Height, true, hStream); });
}
CUresult CUDAAPI cuMemsetD2D32Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui,
                                    size_t Width, size_t Height, CUstream hStream) {
  return guarded(
      [&] { return memset_2d(dstDevice, dstPitch, ui, 4, Width, Height, true, hStream); });
}
CUresult CUDAAPI cuMemsetD2D32Async_ptsz(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui,
                                         size_t Width, size_t Height, CUstream hStream) {
  return guarded(
      [&] { return memset_2d(dstDevice, dstPitch, ui, 4, Width, Height, true, hStream); });
}

}  // extern "C"
