// Exported: primary contexts, created contexts and the per-thread context stack.
#include <algorithm>

#include "driver.h"

using fakecuda::context_stack;
using fakecuda::current_context;
using fakecuda::Driver;
using fakecuda::guarded;
using fakecuda::require_init;

namespace {

constexpr unsigned kContextApiVersion = 3020;  // contexts made by the _v2-and-later entry points

CUresult device_for(CUdevice dev, fakecuda::Device** out) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  *out = Driver::instance().device(dev);
  return *out != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult create_and_push(CUcontext* pctx, unsigned flags, CUdevice dev) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<CUctx_st> ctx;
  if (CUresult rc = Driver::instance().create_context(dev, flags, /*primary=*/false, &ctx);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  context_stack().push_back(ctx.get());
  *pctx = ctx.get();
  return CUDA_SUCCESS;
}

// The context a call names, or the current one when it names none.
CUresult context_or_current(CUcontext handle, std::shared_ptr<CUctx_st>* out) {
  if (handle == nullptr) return current_context(out);
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  *out = Driver::instance().find_context(handle);
  return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult release_primary(CUdevice dev) {
  fakecuda::Device* d = nullptr;
  if (CUresult rc = device_for(dev, &d); rc != CUDA_SUCCESS) return rc;
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.primary_mu);
  if (d->primary_refs == 0 || !d->primary) return CUDA_ERROR_INVALID_CONTEXT;
  if (--d->primary_refs == 0) {
    driver.destroy_context(d->primary);
    d->primary.reset();
  }
  return CUDA_SUCCESS;
}

CUresult reset_primary(CUdevice dev) {
  fakecuda::Device* d = nullptr;
  if (CUresult rc = device_for(dev, &d); rc != CUDA_SUCCESS) return rc;
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.primary_mu);
  if (d->primary) driver.destroy_context(d->primary);
  d->primary.reset();
  d->primary_refs = 0;
  return CUDA_SUCCESS;
}

CUresult set_primary_flags(CUdevice dev, unsigned flags, bool fail_when_active) {
  fakecuda::Device* d = nullptr;
  if (CUresult rc = device_for(dev, &d); rc != CUDA_SUCCESS) return rc;
  if ((flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK)) != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(Driver::instance().primary_mu);
  if (fail_when_active && d->primary_refs > 0) return CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE;
  d->primary_flags = flags;
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  return guarded([&] {
    fakecuda::Device* d = nullptr;
    if (CUresult rc = device_for(dev, &d); rc != CUDA_SUCCESS) return rc;
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.primary_mu);
    if (!d->primary) {
      if (CUresult rc = driver.create_context(dev, d->primary_flags, /*primary=*/true, &d->primary);
          rc != CUDA_SUCCESS) {
        return rc;
      }
    }
    ++d->primary_refs;
    *pctx = d->primary.get();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return guarded([&] { return release_primary(dev); });
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  return guarded([&] { return release_primary(dev); });
}

CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return guarded([&] { return reset_primary(dev); });
}

CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) {
  return guarded([&] { return reset_primary(dev); });
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  return guarded([&] { return set_primary_flags(dev, flags, /*fail_when_active=*/false); });
}

// Before CUDA 11 the flags could not change while the primary context was active.
CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return guarded([&] { return set_primary_flags(dev, flags, /*fail_when_active=*/true); });
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  return guarded([&] {
    fakecuda::Device* d = nullptr;
    if (CUresult rc = device_for(dev, &d); rc != CUDA_SUCCESS) return rc;
    if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(Driver::instance().primary_mu);
    *flags = d->primary_flags;
    *active = d->primary_refs > 0 ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return guarded([&] { return create_and_push(pctx, flags, dev); });
}

// Execution affinity (SM partitions) is not simulated: every context shares the whole device.
CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* /*paramsArray*/,
                                int /*numParams*/, unsigned int flags, CUdevice dev) {
  return guarded([&] { return create_and_push(pctx, flags, dev); });
}

CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* /*ctxCreateParams*/,
                                unsigned int flags, CUdevice dev) {
  return guarded([&] { return create_and_push(pctx, flags, dev); });
}

CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    std::shared_ptr<CUctx_st> found = Driver::instance().find_context(ctx);
    if (!found) return CUDA_ERROR_INVALID_CONTEXT;
    if (found->primary)
      return CUDA_ERROR_INVALID_CONTEXT;  // primary contexts are released, not destroyed
    auto& stack = context_stack();
    std::erase(stack, ctx);
    Driver::instance().destroy_context(found);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto& stack = context_stack();
    *pctx = stack.empty() ? nullptr : stack.back();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    auto& stack = context_stack();
    if (ctx == nullptr) {
      if (!stack.empty()) stack.pop_back();
      return CUDA_SUCCESS;
    }
    if (!Driver::instance().find_context(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (stack.empty()) {
      stack.push_back(ctx);
    } else {
      stack.back() = ctx;
    }
    return CUDA_SUCCESS;
  });
}

// Peer access is bookkeeping here (every context can read every mapping of the simulated GPUs);
// the errors are the driver's.
CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<CUctx_st> ctx;
    if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
    Driver& driver = Driver::instance();
    std::shared_ptr<CUctx_st> peer = driver.find_context(peerContext);
    if (peer == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (peer->device == ctx->device) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard lock(driver.mu);
    if (!ctx->peers.insert(peer.get()).second) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    std::shared_ptr<CUctx_st> ctx;
    if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    if (ctx->peers.erase(peerContext) == 0) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (ctx == nullptr || !Driver::instance().find_context(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    context_stack().push_back(ctx);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    auto& stack = context_stack();
    if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx != nullptr) *pctx = stack.back();
    stack.pop_back();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> ctx;
    if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *device = ctx->device;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> found;
    if (CUresult rc = context_or_current(ctx, &found); rc != CUDA_SUCCESS) return rc;
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *device = found->device;
    return CUDA_SUCCESS;
  });
}

// Synchronizing a context while one of its streams captures is illegal: the capture is invalidated.
CUresult CUDAAPI cuCtxSynchronize(void) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> found;
    if (CUresult rc = current_context(&found); rc != CUDA_SUCCESS) return rc;
    if (fakecuda::invalidate_captures(found.get())) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    found->queue->drain();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> found;
    if (CUresult rc = context_or_current(ctx, &found); rc != CUDA_SUCCESS) return rc;
    if (fakecuda::invalidate_captures(found.get())) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    found->queue->drain();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> found;
    if (CUresult rc = context_or_current(ctx, &found); rc != CUDA_SUCCESS) return rc;
    if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *version = kContextApiVersion;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetFlags(unsigned int* flags) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> ctx;
    if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *flags = ctx->flags;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> ctx;
    if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
    if (leastPriority != nullptr) *leastPriority = 0;
    if (greatestPriority != nullptr) *greatestPriority = -5;
    return CUDA_SUCCESS;
  });
}

}  // extern "C"
