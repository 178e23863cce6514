// Exported: copies and memsets. They really move bytes (device memory is host memory) and take no
// simulated time. Synchronous forms first wait for the current context's queued work, as the legacy
// default stream does; asynchronous forms run in stream order (at once when the queue is idle).
// The _ptds / _ptsz per-thread-default-stream forms share the implementation: the fake's default
// stream is the context's single queue either way.
#include <cstring>

#include "driver.h"

using fakecuda::Driver;
using fakecuda::guarded;
using fakecuda::require_init;

namespace {

// The device side of a copy or memset must lie inside one allocation.
bool valid_range(CUdeviceptr address, std::size_t bytes) {
  return Driver::instance().find_allocation(address, bytes).has_value();
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

}  // extern "C"
