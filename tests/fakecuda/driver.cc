#include "driver.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/log.h"

namespace fakecuda {
namespace {

std::size_t page_size() {
  static const std::size_t size = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

void release_slots_at_exit() { Driver::instance().release_all_slots(); }

void disable_in_forked_child() { Driver::instance().forget_after_fork(); }

}  // namespace

Driver& Driver::instance() {
  // Never destroyed: worker threads can outlive static destruction while the process exits.
  static Driver* driver = new Driver();
  return *driver;
}

CUresult Driver::init(unsigned flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::call_once(init_once_, [this] {
    nvshare::log_init("nvshare-fakecuda");
    auto config = load_config();
    if (!config.ok()) {
      NVSHARE_ERROR("%s", config.error().message.c_str());
      init_result_ = CUDA_ERROR_INVALID_VALUE;
      return;
    }
    config_ = std::move(config.value());
    if (config_.devices.empty()) {
      init_result_ = CUDA_ERROR_NO_DEVICE;
      return;
    }
    auto state = SharedState::open(config_.state_path, /*create=*/true);
    if (!state.ok()) {
      NVSHARE_ERROR("%s", state.error().message.c_str());
      init_result_ = CUDA_ERROR_OPERATING_SYSTEM;
      return;
    }
    for (std::size_t i = 0; i < config_.devices.size(); ++i) {
      const DeviceConfig& device_config = config_.devices[i];
      auto record = state.value()->device(device_config.uuid, device_config.total_bytes);
      if (!record.ok()) {
        NVSHARE_ERROR("%s", record.error().message.c_str());
        devices_.clear();
        init_result_ = CUDA_ERROR_OPERATING_SYSTEM;
        return;
      }
      devices_.push_back(
          std::make_unique<Device>(static_cast<int>(i), device_config, record.value()));
    }
    std::atexit(release_slots_at_exit);
    pthread_atfork(nullptr, nullptr, disable_in_forked_child);
    init_result_ = CUDA_SUCCESS;
    initialized_.store(true, std::memory_order_release);
  });
  return init_result_;
}

CUresult Driver::create_context(int ordinal, unsigned flags, bool primary,
                                std::shared_ptr<CUctx_st>* out) {
  Device* d = device(ordinal);
  if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  auto ctx = std::make_shared<CUctx_st>();
  ctx->id = next_id.fetch_add(1);
  ctx->device = ordinal;
  ctx->primary = primary;
  ctx->flags = flags;
  ctx->slot = d->sim.acquire_slot(ctx->id);
  if (!ctx->slot.valid()) {
    NVSHARE_ERROR("device %s has no free context slot", d->uuid.c_str());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // Like a real context, a simulated one takes device memory of its own (0 unless configured).
  if (config_.context_bytes > 0 &&
      !d->sim.reserve_device_memory(ctx->slot, config_.context_bytes)) {
    d->sim.release_slot(ctx->slot);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ctx->queue = std::make_shared<WorkQueue>(&d->sim, ctx->slot);
  {
    std::lock_guard lock(mu);
    contexts[ctx.get()] = ctx;
  }
  *out = std::move(ctx);
  return CUDA_SUCCESS;
}

void Driver::destroy_context(const std::shared_ptr<CUctx_st>& ctx) {
  ctx->live.store(false);
  {
    std::lock_guard lock(mu);
    contexts.erase(ctx.get());
    for (auto it = modules.begin(); it != modules.end();) {
      if (it->second->ctx == ctx) {
        for (auto& [name, function] : it->second->functions) functions.erase(function.get());
        it = modules.erase(it);
      } else {
        ++it;
      }
    }
    std::erase_if(streams, [&](const auto& entry) { return entry.second->ctx == ctx; });
  }
  ctx->queue->stop();
  free_context_memory(ctx.get());
  device(ctx->device)->sim.release_slot(ctx->slot);
}

void Driver::forget_after_fork() {
  // A forked child has none of the parent's worker threads and its slots belong to the parent: like
  // the real driver, refuse to work in it rather than hang on queues nobody runs.
  initialized_.store(false, std::memory_order_release);
  init_result_ = CUDA_ERROR_NOT_INITIALIZED;
}

std::shared_ptr<CUctx_st> Driver::find_context(const CUctx_st* ctx) {
  std::lock_guard lock(mu);
  auto it = contexts.find(ctx);
  return it == contexts.end() ? nullptr : it->second;
}

void Driver::release_all_slots() {
  std::lock_guard lock(mu);
  for (auto& [key, ctx] : contexts) {
    if (Device* d = device(ctx->device)) d->sim.release_slot(ctx->slot);
  }
}

std::optional<Allocation> Driver::find_allocation(std::uintptr_t address, std::size_t length) {
  std::lock_guard lock(alloc_mu);
  auto it = allocations.upper_bound(address);
  if (it == allocations.begin()) return std::nullopt;
  --it;
  const Allocation& a = it->second;
  if (address < a.base || address - a.base >= a.size) return std::nullopt;
  if (length > a.size - (address - a.base)) return std::nullopt;
  return a;
}

void Driver::free_context_memory(const CUctx_st* ctx) {
  std::vector<Allocation> freed;
  {
    std::lock_guard lock(alloc_mu);
    for (auto it = allocations.begin(); it != allocations.end();) {
      if (it->second.ctx.get() == ctx) {
        freed.push_back(std::move(it->second));
        it = allocations.erase(it);
      } else {
        ++it;
      }
    }
  }
  // The slot is released right after, which drops the shared accounting; only the mappings remain.
  for (const Allocation& a : freed) unmap_memory(reinterpret_cast<void*>(a.base), a.mapped_size);
}

std::vector<CUctx_st*>& context_stack() {
  thread_local std::vector<CUctx_st*> stack;
  return stack;
}

CUresult current_context(std::shared_ptr<CUctx_st>* out) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  auto& stack = context_stack();
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  *out = Driver::instance().find_context(stack.back());
  return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult resolve_stream(CUstream handle, std::shared_ptr<CUctx_st>* ctx,
                        std::shared_ptr<CUstream_st>* stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    stream->reset();
    return current_context(ctx);
  }
  Driver& driver = Driver::instance();
  {
    std::lock_guard lock(driver.mu);
    auto it = driver.streams.find(handle);
    if (it == driver.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    *stream = it->second;
  }
  *ctx = (*stream)->ctx;
  return (*ctx)->live.load() ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

CUresult submit_to_stream(CUstream handle, Op op, std::shared_ptr<WorkQueue>* queue,
                          std::uint64_t* seq) {
  std::shared_ptr<CUctx_st> ctx;
  std::shared_ptr<CUstream_st> stream;
  if (CUresult rc = resolve_stream(handle, &ctx, &stream); rc != CUDA_SUCCESS) return rc;
  if (stream) {
    std::lock_guard lock(Driver::instance().mu);
    if (stream->capture) {
      stream->capture->ops.push_back(std::move(op));
      return CUDA_SUCCESS;
    }
  }
  const std::uint64_t submitted = ctx->queue->submit(std::move(op));
  if (stream) {
    std::uint64_t previous = stream->last_seq.load();
    while (previous < submitted && !stream->last_seq.compare_exchange_weak(previous, submitted)) {
    }
  }
  if (queue != nullptr) *queue = ctx->queue;
  if (seq != nullptr) *seq = submitted;
  return CUDA_SUCCESS;
}

bool invalidate_captures(const CUctx_st* ctx) {
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  bool any = false;
  for (auto& [key, stream] : driver.streams) {
    if (stream->ctx.get() == ctx && stream->capture) {
      stream->capture_invalidated = true;
      any = true;
    }
  }
  return any;
}

bool stream_capturing(CUstream handle) {
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD)
    return false;
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  auto it = driver.streams.find(handle);
  return it != driver.streams.end() && it->second->capture != nullptr;
}

CUresult synchronize_stream(CUstream handle) {
  std::shared_ptr<CUctx_st> ctx;
  std::shared_ptr<CUstream_st> stream;
  if (CUresult rc = resolve_stream(handle, &ctx, &stream); rc != CUDA_SUCCESS) return rc;
  if (stream) {
    ctx->queue->wait_for(stream->last_seq.load());
  } else {
    ctx->queue->drain();
  }
  return CUDA_SUCCESS;
}

CUresult synchronize_current_context() {
  std::shared_ptr<CUctx_st> ctx;
  if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
  ctx->queue->drain();
  return CUDA_SUCCESS;
}

void* map_memory(std::size_t bytes, std::size_t* mapped_size) {
  const std::size_t page = page_size();
  std::size_t size = bytes == 0 ? page : (bytes + page - 1) / page * page;
  if (size < bytes) return nullptr;
  // MAP_NORESERVE: a simulated 16 GiB buffer costs host memory only for the pages actually written.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  *mapped_size = size;
  return p;
}

void unmap_memory(void* address, std::size_t mapped_size) { munmap(address, mapped_size); }

void fill_bytes(void* dst, unsigned char value, std::size_t bytes) {
  const std::size_t page = page_size();
  auto begin = reinterpret_cast<std::uintptr_t>(dst);
  if (value != 0 || bytes < 4 * page) {
    std::memset(dst, value, bytes);
    return;
  }
  // Zeroing whole pages of an anonymous private mapping: dropping them reads back as zeros.
  std::uintptr_t first_page = (begin + page - 1) / page * page;
  std::uintptr_t last_page = (begin + bytes) / page * page;
  std::memset(dst, 0, first_page - begin);
  madvise(reinterpret_cast<void*>(first_page), last_page - first_page, MADV_DONTNEED);
  std::memset(reinterpret_cast<void*>(last_page), 0, begin + bytes - last_page);
}

std::uint64_t fault_in_managed(const std::shared_ptr<CUctx_st>& ctx) {
  if (ctx->faultable_host_bytes.load() == 0) return 0;
  Driver& driver = Driver::instance();
  std::uint64_t moved = 0;
  {
    std::lock_guard lock(driver.alloc_mu);
    for (auto& [base, a] : driver.allocations) {
      if (a.ctx != ctx || a.kind != MemoryKind::kManaged || a.prefer_host) continue;
      moved += a.size - a.device_resident;
      a.device_resident = a.size;
    }
    ctx->faultable_host_bytes.store(0);
  }
  if (moved == 0) return 0;
  Device* d = driver.device(ctx->device);
  d->sim.migrate(ctx->slot, moved, Migration::kFaultIn);
  return static_cast<std::uint64_t>(static_cast<double>(moved) * 1e9 /
                                    static_cast<double>(driver.config().fault_bytes_per_s));
}

}  // namespace fakecuda
