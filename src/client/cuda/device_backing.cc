#include "client/cuda/device_backing.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "client/hooks/hook_table.h"
#include "client/host_room.h"
#include "common/log.h"
#include "common/quantity.h"

namespace nvshare::client::cuda {
namespace {

using hooks::HookId;

constexpr auto kRetryPause = std::chrono::milliseconds(5);
constexpr auto kWarnEvery = std::chrono::seconds(5);

CUmemAllocationProp physical_prop(int ordinal, bool shareable) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  if (shareable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

int attribute(CUdevice_attribute which, int ordinal) {
  int value = 0;
  const hooks::DriverApi& api = hooks::driver();
  if (api.cuDeviceGetAttribute == nullptr ||
      api.cuDeviceGetAttribute(&value, which, ordinal) != CUDA_SUCCESS) {
    return 0;
  }
  return value;
}

// Faults fresh anonymous memory in from several threads at once. Providing the pages (the kernel
// allocates and zeroes each) is what bounds a first swap-out: about 1.5-2.5 GB/s from one thread
// on an H200 host, where registering memory already present ran at 28-46 GB/s. Best effort: a
// thread that cannot start leaves its slice to be faulted in by the registration.
void fault_in(unsigned char* base, std::uint64_t bytes) {
  constexpr std::uint64_t kPage = 4096;
  constexpr std::uint64_t kPerThreadAtLeast = 64ull << 20;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::uint64_t threads = std::clamp<std::uint64_t>(
      std::min<std::uint64_t>(cores / 2, bytes / kPerThreadAtLeast), 1, 8);
  const std::uint64_t slice = (bytes / threads + kPage - 1) / kPage * kPage;
  auto touch = [](unsigned char* from, unsigned char* to) {
    for (volatile unsigned char* p = from; p < to; p += kPage) *p = 0;
  };
  std::vector<std::thread> workers;
  for (std::uint64_t i = 1; i < threads && i * slice < bytes; ++i) {
    unsigned char* from = base + i * slice;
    unsigned char* to = base + std::min(bytes, (i + 1) * slice);
    try {
      workers.emplace_back(touch, from, to);
    } catch (...) {
      break;
    }
  }
  touch(base, base + std::min(bytes, slice));
  for (std::thread& worker : workers) worker.join();
}

// Fresh anonymous memory for a host copy, advised to use huge pages and faulted in; no driver
// call. Null when it cannot be mapped.
void* fresh_host_memory(std::uint64_t bytes) {
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return nullptr;
  ::madvise(mapped, bytes, MADV_HUGEPAGE);  // advice only: 4 KiB pages work too
  fault_in(static_cast<unsigned char*>(mapped), bytes);
  return mapped;
}

// Calls `each(offset, length)` for the lock chunks (kLockChunk) that [offset, offset + bytes) of a
// host copy overlaps, clipped to it, in order; stops at the first result that is not CUDA_SUCCESS
// and returns it.
template <typename Each>
CUresult for_each_lock_chunk(std::uint64_t offset, std::uint64_t bytes, Each&& each) {
  const std::uint64_t end = offset + bytes;
  while (offset < end) {
    const std::uint64_t chunk_end = std::min(end, (offset / kLockChunk + 1) * kLockChunk);
    const CUresult rc = each(offset, chunk_end - offset);
    if (rc != CUDA_SUCCESS) return rc;
    offset = chunk_end;
  }
  return CUDA_SUCCESS;
}

void page_unlock(void* memory, std::uint64_t bytes) {
  const hooks::DriverApi& api = hooks::driver();
  for_each_lock_chunk(0, bytes, [&](std::uint64_t offset, std::uint64_t) {
    api.cuMemHostUnregister(static_cast<unsigned char*>(memory) + offset);
    return CUDA_SUCCESS;
  });
}

// Page-locks `memory` one lock chunk at a time; on failure unlocks what it locked. Given
// `hurry`, it pauses kLockPause after each chunk but the last while `hurry` is 0.
bool page_lock(void* memory, std::uint64_t bytes, const std::atomic<int>* hurry = nullptr) {
  const hooks::DriverApi& api = hooks::driver();
  if (api.cuMemHostRegister_v2 == nullptr || api.cuMemHostUnregister == nullptr) return false;
  std::uint64_t locked = 0;
  const CUresult rc =
      for_each_lock_chunk(0, bytes, [&](std::uint64_t offset, std::uint64_t length) {
        const CUresult chunk = api.cuMemHostRegister_v2(
            static_cast<unsigned char*>(memory) + offset, length, CU_MEMHOSTREGISTER_PORTABLE);
        if (chunk != CUDA_SUCCESS) return chunk;
        locked = offset + length;
        if (hurry != nullptr && locked < bytes && hurry->load(std::memory_order_relaxed) == 0) {
          std::this_thread::sleep_for(kLockPause);
        }
        return chunk;
      });
  if (rc == CUDA_SUCCESS) return true;
  if (locked > 0) page_unlock(memory, locked);
  return false;
}

// Copies [offset, offset + bytes) between a host copy and the device memory at `device`, one
// asynchronous copy per lock chunk: each lies in one registration. `copy(host, device, length)`.
template <typename Copy>
CUresult copy_by_lock_chunk(void* host, std::uint64_t offset, CUdeviceptr device,
                            std::uint64_t bytes, Copy&& copy) {
  return for_each_lock_chunk(offset, bytes, [&](std::uint64_t at, std::uint64_t length) {
    return copy(static_cast<unsigned char*>(host) + at, device + (at - offset), length);
  });
}

// Runs `call` on a thread of the library's own with the GPU's primary context current: only while
// the process has it active (PyTorch, JAX and CuPy work in it), retained meanwhile so that it
// cannot be destroyed under the call. False when it is not active or `call` returned false.
template <typename Call>
bool in_primary_context(int ordinal, Call&& call) {
  const hooks::DriverApi& api = hooks::driver();
  auto retain = hooks::real<HookId::cuDevicePrimaryCtxRetain>();
  auto release = hooks::real<HookId::cuDevicePrimaryCtxRelease_v2>();
  unsigned flags = 0;
  int active = 0;
  if (retain == nullptr || release == nullptr || api.cuDevicePrimaryCtxGetState == nullptr ||
      api.cuCtxPushCurrent_v2 == nullptr || api.cuCtxPopCurrent_v2 == nullptr ||
      api.cuDevicePrimaryCtxGetState(ordinal, &flags, &active) != CUDA_SUCCESS || active == 0) {
    return false;
  }
  CUcontext primary = nullptr;
  if (retain(&primary, ordinal) != CUDA_SUCCESS) return false;
  bool done = false;
  if (api.cuCtxPushCurrent_v2(primary) == CUDA_SUCCESS) {
    done = call();
    CUcontext popped = nullptr;
    api.cuCtxPopCurrent_v2(&popped);
  }
  release(ordinal);
  return done;
}

}  // namespace

void DeviceBacking::probe() {
  const hooks::DriverApi& api = hooks::driver();
  if (api.cuMemAddressReserve == nullptr || api.cuMemAddressFree == nullptr ||
      api.cuMemMap == nullptr || api.cuMemUnmap == nullptr || api.cuMemSetAccess == nullptr ||
      api.cuMemGetAllocationGranularity == nullptr ||
      hooks::real<HookId::cuMemCreate>() == nullptr ||
      hooks::real<HookId::cuMemRelease>() == nullptr ||
      attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, ordinal_) == 0) {
    return;
  }
  shareable_ =
      attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, ordinal_) != 0;
  const CUmemAllocationProp prop = physical_prop(ordinal_, shareable_);
  std::size_t granularity = 0;
  if (api.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
      CUDA_SUCCESS) {
    return;
  }
  granularity_ = granularity;
}

std::uint64_t DeviceBacking::rounded(std::uint64_t bytes) const {
  return (bytes + granularity_ - 1) / granularity_ * granularity_;
}

PieceLayout piece_layout(std::uint64_t bytes, std::uint64_t granularity) {
  const std::uint64_t unit = std::max<std::uint64_t>(granularity, 1);
  const std::uint64_t share = (bytes + kMaxPieces - 1) / kMaxPieces;
  const std::uint64_t piece =
      std::max((share + unit - 1) / unit * unit, (kMinPiece + unit - 1) / unit * unit);
  return {bytes, std::min(piece, bytes)};
}

std::uint64_t DeviceBacking::Range::mapped_bytes() const {
  std::uint64_t total = 0;
  for (const Piece& piece : pieces) total += piece.handle != 0 ? piece.bytes : 0;
  return total;
}

CUresult grant_access(CUdeviceptr address, std::uint64_t bytes, std::uint64_t gpus) {
  CUmemAccessDesc access[kMaxGpus] = {};
  std::size_t count = 0;
  for (int gpu = 0; gpu < kMaxGpus; ++gpu) {
    if ((gpus & (std::uint64_t{1} << gpu)) == 0) continue;
    access[count].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[count].location.id = gpu;
    access[count].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ++count;
  }
  return hooks::driver().cuMemSetAccess(address, bytes, access, count);
}

CUresult DeviceBacking::set_access(CUdeviceptr address, std::uint64_t bytes) const {
  return grant_access(address, bytes, peers_ | (std::uint64_t{1} << ordinal_));
}

CUresult DeviceBacking::back(CUdeviceptr base, Piece& piece) {
  const hooks::DriverApi& api = hooks::driver();
  const CUmemAllocationProp prop = physical_prop(ordinal_, shareable_);
  const CUdeviceptr address = base + piece.offset;
  CUmemGenericAllocationHandle handle = 0;
  CUresult rc = hooks::real<HookId::cuMemCreate>()(&handle, piece.bytes, &prop, 0);
  if (rc != CUDA_SUCCESS) return rc;
  rc = api.cuMemMap(address, piece.bytes, 0, handle, 0);
  if (rc == CUDA_SUCCESS) {
    rc = set_access(address, piece.bytes);
    if (rc != CUDA_SUCCESS) api.cuMemUnmap(address, piece.bytes);
  }
  if (rc != CUDA_SUCCESS) {
    hooks::real<HookId::cuMemRelease>()(handle);
    return rc;
  }
  piece.handle = handle;
  return CUDA_SUCCESS;
}

CUresult DeviceBacking::back_all(CUdeviceptr base, Range& range) {
  for (Piece& piece : range.pieces) {
    const CUresult rc = back(base, piece);
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

void DeviceBacking::unback(CUdeviceptr base, Piece& piece) {
  if (piece.handle == 0) return;
  hooks::driver().cuMemUnmap(base + piece.offset, piece.bytes);
  hooks::real<HookId::cuMemRelease>()(piece.handle);
  piece.handle = 0;
}

void DeviceBacking::unback_all(CUdeviceptr base, Range& range) {
  for (Piece& piece : range.pieces) unback(base, piece);
}

CUresult DeviceBacking::allocate(std::uint64_t bytes, CUdeviceptr* address) {
  if (granularity_ == 0) return CUDA_ERROR_NOT_SUPPORTED;
  const hooks::DriverApi& api = hooks::driver();
  CUdeviceptr reserved = 0;
  CUresult rc = api.cuMemAddressReserve(&reserved, bytes, 0, 0, 0);
  if (rc != CUDA_SUCCESS) return rc;
  Range range;
  range.bytes = bytes;
  const PieceLayout layout = piece_layout(bytes, granularity_);
  try {
    for (std::uint64_t i = 0; i < layout.count(); ++i) {
      range.pieces.push_back(Piece{layout.offset(i), layout.size(i)});
    }
  } catch (...) {
    api.cuMemAddressFree(reserved, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::lock_guard lock(mu_);
  range.serial = next_serial_++;
  if (!out_) rc = back_all(reserved, range);
  if (rc == CUDA_SUCCESS) {
    try {
      ranges_.emplace(reserved, range);
    } catch (...) {
      rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  if (rc != CUDA_SUCCESS) {
    unback_all(reserved, range);
    api.cuMemAddressFree(reserved, bytes);
    return rc;
  }
  *address = reserved;
  return CUDA_SUCCESS;
}

CUresult DeviceBacking::release(CUdeviceptr address) {
  std::lock_guard lock(mu_);
  auto it = ranges_.find(address);
  if (it == ranges_.end()) return CUDA_ERROR_INVALID_VALUE;
  Range& range = it->second;
  unback_all(address, range);
  free_host_copy(range);
  const CUresult rc = hooks::driver().cuMemAddressFree(address, range.bytes);
  ranges_.erase(it);
  return rc;
}

bool DeviceBacking::owns(CUdeviceptr address) const {
  std::lock_guard lock(mu_);
  return ranges_.count(address) != 0;
}

CUresult DeviceBacking::ensure_host_copy(Range& range) {
  if (range.host != nullptr) return CUDA_SUCCESS;
  const hooks::DriverApi& api = hooks::driver();
  if (api.cuMemHostRegister_v2 != nullptr && api.cuMemHostUnregister != nullptr) {
    void* mapped = range.faulted != nullptr ? std::exchange(range.faulted, nullptr)
                                            : fresh_host_memory(range.bytes);
    if (mapped != nullptr) {
      if (page_lock(mapped, range.bytes)) {
        range.host = mapped;
        range.host_registered = true;
        return CUDA_SUCCESS;
      }
      ::munmap(mapped, range.bytes);
    }
  }
  return hooks::real<HookId::cuMemHostAlloc>()(&range.host, range.bytes, CU_MEMHOSTALLOC_PORTABLE);
}

void DeviceBacking::free_host_copy(Range& range) {
  if (range.faulted != nullptr) ::munmap(std::exchange(range.faulted, nullptr), range.bytes);
  if (range.host == nullptr) return;
  if (range.host_registered) {
    page_unlock(range.host, range.bytes);
    ::munmap(range.host, range.bytes);
  } else {
    hooks::real<HookId::cuMemFreeHost>()(range.host);
  }
  range.host = nullptr;
  range.host_registered = false;
}

BackingSwap DeviceBacking::swap_out(CUstream stream, std::uint64_t host_room,
                                    std::uint64_t target) {
  auto to_host = hooks::real<HookId::cuMemcpyDtoHAsync_v2>();
  std::unique_lock lock(mu_);
  // A copy being prepared is further along than one this call would start; no other starts.
  ++swaps_waiting_;
  prepared_cv_.wait(lock, [this] { return !preparing_; });
  --swaps_waiting_;
  out_ = true;
  std::vector<std::pair<CUdeviceptr, Piece*>> copied;
  std::uint64_t copying = 0;
  std::uint64_t no_room = 0;
  BackingSwap done;
  // What stays once the target is met is swapped in with the rest.
  const auto met = [&] { return target > 0 && copying >= target; };
  for (auto& [address, range] : ranges_) {
    if (met()) break;
    if (!range.mapped() || range.pinned) continue;
    const bool new_copy = range.needs_host_copy();
    if (new_copy && !take_room(host_room, range.bytes)) {
      no_room += range.bytes;
      continue;
    }
    CUresult rc = ensure_host_copy(range);
    if (rc == CUDA_SUCCESS && new_copy) done.host_copies_made += range.bytes;
    for (Piece& piece : range.pieces) {
      if (rc != CUDA_SUCCESS || met()) break;
      if (piece.handle == 0) continue;
      rc = to_host != nullptr
               ? copy_by_lock_chunk(range.host, piece.offset, address + piece.offset, piece.bytes,
                                    [&](void* host, CUdeviceptr device, std::uint64_t length) {
                                      return to_host(host, device, length, stream);
                                    })
               : CUDA_ERROR_NOT_FOUND;
      if (rc != CUDA_SUCCESS) break;
      copied.emplace_back(address, &piece);
      copying += piece.bytes;
    }
    if (rc != CUDA_SUCCESS) {
      NVSHARE_WARN("swap out: some of %s at 0x%llx stays on the GPU: %s",
                   format_bytes(range.bytes).c_str(), static_cast<unsigned long long>(address),
                   hooks::error_name(rc));
    }
  }
  if (no_room > 0) {
    NVSHARE_WARN(
        "swap out: %s stays on the GPU: host copies of it would not fit in the memory "
        "this process may still take (its cgroup's limit, or the host's)",
        format_bytes(no_room).c_str());
  }
  if (copied.empty()) return done;
  const CUresult synced = hooks::driver().cuStreamSynchronize(stream);
  if (synced != CUDA_SUCCESS) {
    NVSHARE_WARN("swap out: copies to the host failed (%s); memory stays on the GPU",
                 hooks::error_name(synced));
    return done;
  }
  for (auto& [address, piece] : copied) {
    piece->host_holds_contents = true;
    unback(address, *piece);
    done.bytes += piece->bytes;
    ++done.pieces;
  }
  return done;
}

// The swap-out's walk: movable mapped ranges in address order, until what comes before a range
// reaches the target.
std::map<CUdeviceptr, DeviceBacking::Range>::iterator DeviceBacking::next_to_prepare(
    std::uint64_t target) {
  if (stopped_ || out_ || swaps_waiting_ > 0) return ranges_.end();
  std::uint64_t reached = 0;
  for (auto it = ranges_.begin(); it != ranges_.end(); ++it) {
    if (target > 0 && reached >= target) break;
    const Range& range = it->second;
    if (!range.mapped() || range.pinned) continue;
    if (range.needs_host_copy()) return it;
    reached += range.mapped_bytes();
  }
  return ranges_.end();
}

bool DeviceBacking::adopt_host_copy(CUdeviceptr address, std::uint64_t serial, void* memory,
                                    bool registered) {
  auto it = ranges_.find(address);
  if (it == ranges_.end() || it->second.serial != serial || it->second.has_host_memory()) {
    return false;
  }
  if (registered) {
    it->second.host = memory;
    it->second.host_registered = true;
  } else {
    it->second.faulted = memory;
  }
  return true;
}

std::uint64_t DeviceBacking::prepare_host_copies(std::uint64_t host_room, std::uint64_t target) {
  std::uint64_t prepared = 0;
  std::unique_lock lock(mu_);
  for (auto it = next_to_prepare(target); it != ranges_.end(); it = next_to_prepare(target)) {
    const CUdeviceptr address = it->first;
    const std::uint64_t bytes = it->second.bytes;
    const std::uint64_t serial = it->second.serial;
    if (bytes > host_room) break;  // the swap-out will leave it (and what follows) on the GPU
    host_room -= bytes;
    preparing_ = true;
    lock.unlock();
    void* memory = fresh_host_memory(bytes);
    lock.lock();
    if (memory == nullptr) {  // out of host memory: the swap-out will say so
      preparing_ = false;
      prepared_cv_.notify_all();
      break;
    }
    bool registered = false;
    if (!stopped_) {
      in_driver_ = true;
      lock.unlock();
      registered =
          in_primary_context(ordinal_, [&] { return page_lock(memory, bytes, &swaps_waiting_); });
      lock.lock();
    }
    const bool adopted = adopt_host_copy(address, serial, memory, registered);
    if (!adopted && registered) {  // the range was freed meanwhile: still inside in_driver_
      lock.unlock();
      in_primary_context(ordinal_, [&] {
        page_unlock(memory, bytes);
        return true;
      });
      lock.lock();
    }
    if (!adopted) ::munmap(memory, bytes);
    prepared += adopted ? bytes : 0;
    in_driver_ = false;
    preparing_ = false;
    prepared_cv_.notify_all();
  }
  return prepared;
}

void DeviceBacking::stop_preparing() {
  std::unique_lock lock(mu_);
  stopped_ = true;
  prepared_cv_.wait(lock, [this] { return !in_driver_; });
}

BackingSwap DeviceBacking::swap_in(CUstream stream, std::uint64_t limit) {
  auto to_device = hooks::real<HookId::cuMemcpyHtoDAsync_v2>();
  std::unique_lock lock(mu_);
  if (limit == 0) out_ = false;
  BackingSwap done;
  auto waiting_since = std::chrono::steady_clock::now();
  auto warned = waiting_since;
  for (;;) {
    // The map may change while the lock is dropped to wait: start over each round.
    bool short_of_memory = false;
    bool room_full = false;
    std::uint64_t missing = 0;
    for (auto& [address, range] : ranges_) {
      for (Piece& piece : range.pieces) {
        if (piece.handle != 0 || room_full) continue;
        if (limit > 0 && done.bytes + piece.bytes > limit) {
          room_full = true;
          continue;
        }
        const CUdeviceptr at = address + piece.offset;
        const CUresult rc = back(address, piece);
        if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
          short_of_memory = true;
          missing += piece.bytes;
          room_full = limit > 0;  // room given, not memory: no waiting for it
          continue;
        }
        if (rc != CUDA_SUCCESS) {
          NVSHARE_ERROR("swap in: cannot map %s at 0x%llx: %s", format_bytes(piece.bytes).c_str(),
                        static_cast<unsigned long long>(at), hooks::error_name(rc));
          continue;
        }
        if (piece.host_holds_contents && to_device != nullptr) {
          const CUresult copy =
              copy_by_lock_chunk(range.host, piece.offset, at, piece.bytes,
                                 [&](void* host, CUdeviceptr device, std::uint64_t length) {
                                   return to_device(device, host, length, stream);
                                 });
          if (copy != CUDA_SUCCESS) {
            NVSHARE_ERROR("swap in: copy of %s back to the GPU failed: %s",
                          format_bytes(piece.bytes).c_str(), hooks::error_name(copy));
          }
        }
        piece.host_holds_contents = false;
        done.bytes += piece.bytes;
        ++done.pieces;
      }
    }
    if (!short_of_memory || limit > 0) break;
    const auto now = std::chrono::steady_clock::now();
    if (now - warned >= kWarnEvery) {
      warned = now;
      NVSHARE_WARN("swap in: waiting %.0f s for %s of GPU memory that another process holds",
                   std::chrono::duration<double>(now - waiting_since).count(),
                   format_bytes(missing).c_str());
    }
    lock.unlock();
    std::this_thread::sleep_for(kRetryPause);
    lock.lock();
  }
  if (done.pieces > 0) hooks::driver().cuStreamSynchronize(stream);
  return done;
}

void DeviceBacking::grant_peer(int peer) {
  if (peer < 0 || peer >= kMaxGpus || peer == ordinal_) return;
  std::lock_guard lock(mu_);
  const std::uint64_t bit = std::uint64_t{1} << peer;
  if ((peers_ & bit) != 0) return;
  peers_ |= bit;
  for (const auto& [address, range] : ranges_) {
    for (const Piece& piece : range.pieces) {
      if (piece.handle == 0) continue;
      const CUresult rc = set_access(address + piece.offset, piece.bytes);
      if (rc != CUDA_SUCCESS) {
        NVSHARE_WARN(
            "peer access for GPU %d to %s at 0x%llx: %s", peer, format_bytes(piece.bytes).c_str(),
            static_cast<unsigned long long>(address + piece.offset), hooks::error_name(rc));
      }
    }
  }
}

CUresult DeviceBacking::export_shareable(CUdeviceptr address, Exported* out) {
  auto to_fd = hooks::driver().cuMemExportToShareableHandle;
  if (!shareable_ || to_fd == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  std::lock_guard lock(mu_);
  const auto it = containing(ranges_, address);
  if (it == ranges_.end()) return CUDA_ERROR_INVALID_VALUE;
  Range& range = it->second;
  // Swapped out: the caller waits for the gate.
  if (range.mapped_bytes() != range.bytes) return CUDA_ERROR_NOT_READY;
  if (range.pieces.size() > kMaxPieces) return CUDA_ERROR_NOT_SUPPORTED;
  Exported exported;
  exported.base = it->first;
  exported.layout = PieceLayout{range.bytes, range.pieces.front().bytes};
  exported.tokens = range.ipc_tokens;
  for (std::size_t i = 0; i < range.pieces.size(); ++i) {
    const CUresult rc = to_fd(&exported.fds[i], range.pieces[i].handle,
                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (rc != CUDA_SUCCESS) {
      for (std::size_t j = 0; j < i; ++j) ::close(exported.fds[j]);
      return rc;
    }
  }
  range.pinned = true;
  *out = exported;
  return CUDA_SUCCESS;
}

bool DeviceBacking::contains(CUdeviceptr address) const {
  std::lock_guard lock(mu_);
  return containing(ranges_, address) != ranges_.end();
}

bool DeviceBacking::exportable(CUdeviceptr address) const {
  return shareable_ && hooks::driver().cuMemExportToShareableHandle != nullptr && contains(address);
}

void DeviceBacking::remember_tokens(CUdeviceptr base, const Tokens& tokens) {
  std::lock_guard lock(mu_);
  auto it = ranges_.find(base);
  if (it == ranges_.end()) return;
  it->second.ipc_tokens = tokens;
  if (tokens[0] == 0) it->second.pinned = false;  // the export failed: nothing can map it
}

DeviceBacking::Tokens DeviceBacking::tokens_of(CUdeviceptr base) const {
  std::lock_guard lock(mu_);
  auto it = ranges_.find(base);
  return it != ranges_.end() ? it->second.ipc_tokens : Tokens{};
}

std::uint64_t DeviceBacking::pinned_bytes() const {
  std::lock_guard lock(mu_);
  std::uint64_t total = 0;
  for (const auto& [address, range] : ranges_) {
    if (range.pinned) total += range.bytes;
  }
  return total;
}

std::uint64_t DeviceBacking::unbacked_bytes() const {
  std::lock_guard lock(mu_);
  std::uint64_t total = 0;
  for (const auto& [address, range] : ranges_) total += range.bytes - range.mapped_bytes();
  return total;
}

HostCopyPlan DeviceBacking::plan(std::uint64_t host_room) const {
  std::lock_guard lock(mu_);
  HostCopyPlan plan;
  for (const auto& [address, range] : ranges_) {
    if (range.pinned) {
      plan.unmovable += range.bytes;
    } else if (range.needs_host_copy()) {
      (take_room(host_room, range.bytes) ? plan.to_make : plan.unmovable) += range.bytes;
    }
  }
  return plan;
}

std::uint64_t DeviceBacking::peers() const {
  std::lock_guard lock(mu_);
  return peers_;
}

const void* DeviceBacking::host_copy(CUdeviceptr base) const {
  std::lock_guard lock(mu_);
  const auto it = ranges_.find(base);
  return it == ranges_.end() ? nullptr : it->second.host;
}

std::uint64_t DeviceBacking::host_bytes() const {
  std::lock_guard lock(mu_);
  std::uint64_t total = 0;
  for (const auto& [address, range] : ranges_) {
    if (range.host != nullptr) total += range.bytes;
  }
  return total;
}

}  // namespace nvshare::client::cuda
