// Process-local state of the fake driver: initialization, devices, handles, allocations and each
// thread's context stack. The api_*.cc files implement the exported functions on top of it.
//
// Contract:
//  - Handles (CUcontext, CUstream, CUevent, CUmodule, CUfunction) point at the structs defined here
//  and
//    are looked up in registries before use, so a stale or garbage handle yields
//    CUDA_ERROR_INVALID_HANDLE / CUDA_ERROR_INVALID_CONTEXT instead of a crash. Lookups return
//    shared_ptrs, which keep an object alive while a call uses it.
//  - A context is immutable once created; destroying it (or releasing a primary context to zero)
//  drains
//    its queue, frees its memory and modules, and gives its slot in the shared state back.
//  - The Driver is never destroyed: worker threads may still run while the process exits. At exit
//  every
//    live context's slot is released, so the shared state never keeps a finished process's memory.
//  - Device memory, managed memory and pinned host memory are anonymous private mappings: pointers
//  are
//    real and CUdeviceptr is the address.
//  - Nothing blocks while holding Driver::mu or Driver::alloc_mu.
//  - In a child forked after cuInit every call fails with CUDA_ERROR_NOT_INITIALIZED, as with the
//  real
//    driver (the child has no worker threads and its parent's slots are not its own).
//  - Exported functions run their body inside guarded(): no exception crosses the C ABI.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "config.h"
#include "cuda_api.h"
#include "shared_state.h"
#include "work_queue.h"

struct CUctx_st {
  std::uint64_t id = 0;
  int device = 0;
  bool primary = false;
  unsigned flags = 0;
  fakecuda::SlotRef slot;
  std::shared_ptr<fakecuda::WorkQueue> queue;
  std::atomic<bool> live{true};
  // Managed bytes of this context that sit on the host and that the next kernel would fault in.
  std::atomic<std::uint64_t> faultable_host_bytes{0};
  // Contexts whose memory this one may access (cuCtxEnablePeerAccess), guarded by Driver::mu.
  std::set<const CUctx_st*> peers;
};

struct CUgraph_st;

struct CUstream_st {
  std::shared_ptr<CUctx_st> ctx;
  unsigned flags = 0;
  int priority = 0;
  std::uint64_t id = 0;
  std::atomic<std::uint64_t> last_seq{0};  // sequence number of its latest operation in ctx->queue
  // Stream capture (guarded by Driver::mu): while `capture` is set, work submitted to the stream is
  // appended to that graph instead of running.
  std::shared_ptr<CUgraph_st> capture;
  bool capture_invalidated = false;
};

// A captured sequence of operations; instantiating copies it, launching submits the copies.
struct CUgraph_st {
  std::vector<fakecuda::Op> ops;
};
struct CUgraphExec_st {
  std::vector<fakecuda::Op> ops;
};
// A memory pool: only where its memory lives (stream-ordered allocations are device memory).
struct CUmemPoolHandle_st {
  int device = 0;
};

struct CUevent_st : fakecuda::EventState {
  using EventState::EventState;
};

struct CUfunc_st;

struct CUmod_st {
  std::shared_ptr<CUctx_st> ctx;
  std::string
      ptx;  // the image when it is PTX text (empty for binaries): tells which kernels take params
  std::map<std::string, std::shared_ptr<CUfunc_st>> functions;  // guarded by Driver::mu
};

struct CUfunc_st {
  CUmod_st* module = nullptr;
  std::string name;
  bool has_params = true;  // false only when the PTX shows an entry without parameters
};

namespace fakecuda {

// kMapped: a VMM mapping (cuMemMap) of a cuMemCreate allocation; its memory is counted by the
// physical allocation, the mapping only makes copies and memsets accept the range.
enum class MemoryKind { kDevice, kManaged, kHost, kMapped };

// A cuMemCreate allocation: a memfd that cuMemMap maps at reserved addresses.
struct PhysicalAllocation {
  int fd = -1;
  std::size_t size = 0;
  std::shared_ptr<CUctx_st> ctx;  // whose slot counts it
  bool shareable = false;         // created with the POSIX descriptor handle type: may be exported
  bool counted = true;            // false for an import: the exporter's slot counts the memory
};

struct Allocation {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  std::size_t mapped_size = 0;
  MemoryKind kind = MemoryKind::kDevice;
  std::shared_ptr<CUctx_st> ctx;      // null for host memory
  std::uint64_t device_resident = 0;  // managed: bytes on the device (the rest is on the host)
  bool prefer_host = false;           // managed: cuMemAdvise preferred location is the CPU
  std::uint64_t buffer_id = 0;
  unsigned flags = 0;
};

struct Device {
  Device(int index, const DeviceConfig& config, DeviceRecord* record)
      : ordinal(index), uuid(config.uuid), uuid_bytes(config.uuid_bytes), sim(record) {}
  int ordinal;
  std::string uuid;
  UuidBytes uuid_bytes;
  SimDevice sim;
  // Primary context (guarded by Driver::primary_mu): the live one, its retain count and its flags.
  std::shared_ptr<CUctx_st> primary;
  int primary_refs = 0;
  unsigned primary_flags = 0;
};

class Driver {
 public:
  static Driver& instance();

  CUresult init(unsigned flags);
  bool initialized() const { return initialized_.load(std::memory_order_acquire); }
  const FakeConfig& config() const { return config_; }
  int device_count() const { return static_cast<int>(devices_.size()); }
  Device* device(int ordinal) {
    return ordinal >= 0 && ordinal < device_count() ? devices_[ordinal].get() : nullptr;
  }

  // Contexts.
  CUresult create_context(int ordinal, unsigned flags, bool primary,
                          std::shared_ptr<CUctx_st>* out);
  void destroy_context(const std::shared_ptr<CUctx_st>& ctx);
  std::shared_ptr<CUctx_st> find_context(const CUctx_st* ctx);
  void release_all_slots();  // at exit
  void forget_after_fork();  // in a forked child: every call fails with NOT_INITIALIZED

  // Guards every Device's primary-context fields. Held across creating or destroying a primary
  // context (which may wait for its queue to drain); never taken while holding mu.
  std::mutex primary_mu;

  // Registries, guarded by mu.
  std::mutex mu;
  std::unordered_map<const void*, std::shared_ptr<CUctx_st>> contexts;
  std::unordered_map<const void*, std::shared_ptr<CUstream_st>> streams;
  std::unordered_map<const void*, std::shared_ptr<CUevent_st>> events;
  std::unordered_map<const void*, std::shared_ptr<CUmod_st>> modules;
  std::unordered_map<const void*, std::shared_ptr<CUfunc_st>> functions;
  std::unordered_map<const void*, std::shared_ptr<CUgraph_st>> graphs;
  std::unordered_map<const void*, std::shared_ptr<CUgraphExec_st>> graph_execs;
  std::unordered_map<const void*, std::shared_ptr<CUmemPoolHandle_st>> pools;
  std::map<std::uint64_t, PhysicalAllocation> physical;  // cuMemCreate handles
  std::map<std::uintptr_t, std::size_t> reservations;    // cuMemAddressReserve ranges
  std::map<std::uintptr_t, std::uint64_t>
      access;  // mapped range -> bit per device (cuMemSetAccess)
  std::atomic<std::uint64_t> next_id{1};

  // Events recorded again while a thread was waiting for them, inside cuEventSynchronize or
  // polling them (cuEventQuery calls of the event less than a millisecond apart with no other call
  // of the thread between):
  // that thread then waits for the newer work (in the real driver what a synchronize waits for
  // is undefined; it was seen to wait for the newer work). Tests read it
  // (cuFakeRecordsWhileAwaited); nothing in the fake depends on it.
  std::atomic<std::uint64_t> records_while_awaited{0};
  // How long after its event completes cuEventSynchronize returns, for events made with
  // CU_EVENT_BLOCKING_SYNC (a real driver wakes such a waiter by an interrupt, later than a
  // spinning one); 0 by default. Tests set it (cuFakeSetBlockingWakeNs).
  std::atomic<std::int64_t> blocking_wake_ns{0};

  // Allocations by base address, guarded by alloc_mu.
  std::mutex alloc_mu;
  std::map<std::uintptr_t, Allocation> allocations;
  // The allocation containing [address, address + length), if any.
  std::optional<Allocation> find_allocation(std::uintptr_t address, std::size_t length = 1);
  // Frees every allocation of ctx (its memory is gone with it).
  void free_context_memory(const CUctx_st* ctx);

 private:
  Driver() = default;
  std::once_flag init_once_;
  CUresult init_result_ = CUDA_ERROR_NOT_INITIALIZED;
  std::atomic<bool> initialized_{false};
  FakeConfig config_;
  std::vector<std::unique_ptr<Device>> devices_;
};

// Runs an exported function's body; an exception becomes an error code instead of crossing the C
// ABI.
// Driver calls this thread has made (every exported function counts itself in guarded()): two
// queries of one event with no other call between are a thread polling it (cuEventQuery).
inline thread_local std::uint64_t t_calls = 0;

template <typename Body>
CUresult guarded(Body&& body) noexcept {
  ++t_calls;
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

inline CUresult require_init() {
  return Driver::instance().initialized() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

// Registers an allocation (assigning its buffer id) and returns its base address.
std::uintptr_t register_allocation(Allocation allocation);
// Removes the allocation based exactly at `base` when its kind is one of `kinds`.
std::optional<Allocation> take_allocation(std::uintptr_t base,
                                          std::initializer_list<MemoryKind> kinds);
// Device memory for ctx, counted against its device's capacity (cuMemAlloc, cuMemAllocAsync).
CUresult allocate_device(const std::shared_ptr<CUctx_st>& ctx, std::size_t bytes,
                         CUdeviceptr* dptr);
// Gives back a device allocation taken out of the registry: its accounting and its mapping.
void free_device_allocation(const Allocation& allocation);

// Stream capture of ctx's streams is invalidated (what the real driver does when a call that is
// illegal during capture, such as cuCtxSynchronize or cuCtxRecordEvent, meets an open capture).
// Returns true when some stream of ctx was capturing.
bool invalidate_captures(const CUctx_st* ctx);
// Whether `handle` names a stream that is being captured.
bool stream_capturing(CUstream handle);

// The calling thread's context stack (top = current).
std::vector<CUctx_st*>& context_stack();
// The current context, or CUDA_ERROR_INVALID_CONTEXT (none, destroyed) / NOT_INITIALIZED.
CUresult current_context(std::shared_ptr<CUctx_st>* out);

// The queue and stream an API stream argument means. The null stream, CU_STREAM_LEGACY and
// CU_STREAM_PER_THREAD mean the current context's default stream (*stream stays null).
CUresult resolve_stream(CUstream handle, std::shared_ptr<CUctx_st>* ctx,
                        std::shared_ptr<CUstream_st>* stream);
// Submits op to the stream's context and records it as the stream's latest operation. *queue and
// *seq (when given) tell where it went. On a capturing stream the op is appended to the capture's
// graph instead (*queue stays null).
CUresult submit_to_stream(CUstream handle, Op op, std::shared_ptr<WorkQueue>* queue = nullptr,
                          std::uint64_t* seq = nullptr);
// Blocks until the stream's work (for a default stream: all of its context's work) has completed.
CUresult synchronize_stream(CUstream handle);
// Blocks until all work submitted to the current context has completed (what synchronous copies and
// frees do first, as the legacy default stream does).
CUresult synchronize_current_context();

// Anonymous private mapping of at least `bytes` (never 0); nullptr when the host is out of memory.
void* map_memory(std::size_t bytes, std::size_t* mapped_size);
void unmap_memory(void* address, std::size_t mapped_size);
// memset that returns whole pages to the kernel when filling with zeros, so large simulated buffers
// do not consume host memory.
void fill_bytes(void* dst, unsigned char value, std::size_t bytes);

// Managed memory: demand faults at kernel start (returns the alone-ns they take) and prefetches.
std::uint64_t fault_in_managed(const std::shared_ptr<CUctx_st>& ctx);

}  // namespace fakecuda

// Test controls of the simulated driver, not CUDA API (exported with the cu* names, libcuda.map).
extern "C" {
unsigned long long cuFakeRecordsWhileAwaited(void);
void cuFakeSetBlockingWakeNs(long long ns);
}
