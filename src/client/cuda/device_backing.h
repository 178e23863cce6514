// Device-backed allocations (MemoryMode::kDevice): physical device memory mapped at an address
// reserved for the allocation (the driver's virtual memory management API), so the pointer the
// application holds survives a swap. One DeviceBacking per GPU.
//
//  - allocate(): reserves `bytes` (a multiple of granularity()) of address space and, unless the
//    GPU is swapped out, creates physical memory there, maps it and grants access to the GPU and
//    to every GPU that enabled peer access to it. A large allocation is backed in pieces
//    (piece_layout()), each its own physical memory mapped at its place in the range, so that a
//    swap-out asked for part of the memory moves little more than that part. While swapped out the
//    range is only reserved and swap_in() backs it (a new allocation's contents are undefined, so
//    nothing is copied in). On failure nothing is left behind and the driver's error is returned:
//    the caller falls back to another backing (physical memory short: CUDA_ERROR_OUT_OF_MEMORY).
//  - release(): unmaps and releases the physical memory, frees the address range and the host copy.
//  - Host room: host copies are charged to the process's memory cgroup like any page it touches,
//    so a copy is made only while it fits in the host room the caller gives (the limit less the
//    usage, client/host_room.h): past it the kernel would kill the process. A range whose copy
//    does not fit stays on the GPU and counts as unmovable (unmovable_bytes(), reported to the
//    scheduler as pinned bytes: it never plans a turn that needs them moved).
//  - swap_out(): copies every mapped piece to its range's host copy on `stream` (pinned memory,
//    made at a range's first swap-out or by prepare_host_copies(), and kept until it is freed: the
//    host-memory cost of this mode; anonymous memory advised to use huge pages, then page-locked
//    by kLockChunk, which the kernel provides about twice as fast as cuMemHostAlloc),
//    synchronizes, then unmaps and releases the physical memory. It first waits for a host copy
//    being prepared to be done. A range whose host copy cannot be allocated, or whose copy fails,
//    stays mapped and is not counted as moved.
//  - prepare_host_copies(): makes, ahead of a swap-out the scheduler announced, the host copies a
//    first swap-out would otherwise make while the GPU waits (for a byte target, those of the
//    ranges such a swap-out would reach, in address order): one range at a time, outside the
//    lock (the pages are provided, the slow part, then page-locked with the GPU's primary context
//    current, retained meanwhile; where the process has no active primary context the pages are
//    kept and page-locked at the swap-out). Stops early while a swap_out() waits, once the GPU is
//    swapped out, and after stop_preparing(). A range freed meanwhile loses its prepared copy.
//  - swap_in(): creates and maps physical memory for every unmapped piece, grants access, copies
//    the host copies back (ranges allocated while out have none), synchronizes. Physical memory
//    the driver cannot give yet (another process still holds it) is retried every few
//    milliseconds, with a warning every few seconds, until it can: the gate stays closed meanwhile,
//    so no kernel ever sees an unmapped range.
//
//    Pinned ranges (exported for CUDA IPC) stay mapped and are not counted as moved.
//  - grant_peer(): a context of GPU `peer` enabled peer access to this GPU's contexts: every mapped
//    range, and every range mapped from now on, becomes accessible from it.
//
// Threads: allocate()/release()/grant_peer() run on application threads, swap_out()/swap_in() on
// the link thread with a context of this GPU current; one mutex orders them (a free during a swap
// waits for it); prepare_host_copies() runs on a thread of its own. Only the real driver is
// called. Never throws.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "client/hooks/cuda_api.h"

namespace nvshare::client::cuda {

// GPUs a mask of GPUs (bit i: GPU i) can name.
inline constexpr int kMaxGpus = 64;

// How an allocation of `bytes` is cut into pieces: every piece `piece` bytes but the last, which is
// shorter where the size asks. piece_layout() makes at most kMaxPieces, each a multiple of the
// granularity and at least kMinPiece; a CUDA IPC handle carries the layout to the importer.
inline constexpr std::uint64_t kMaxPieces = 4;
inline constexpr std::uint64_t kMinPiece = 128ull << 20;
static_assert(kMaxPieces == 4, "Exported::fds lists one -1 per piece");
struct PieceLayout {
  std::uint64_t bytes = 0;
  std::uint64_t piece = 0;

  std::uint64_t count() const { return piece == 0 ? 0 : (bytes + piece - 1) / piece; }
  std::uint64_t offset(std::uint64_t i) const { return i * piece; }
  std::uint64_t size(std::uint64_t i) const { return std::min(piece, bytes - offset(i)); }
};
PieceLayout piece_layout(std::uint64_t bytes, std::uint64_t granularity);

// Host copies are page-locked in chunks of kLockChunk, each its own registration, and copied one
// chunk at a time. Registering pins the pages under the process's memory-map lock, so every thread
// of the process that maps memory or faults a page in (an interpreter's allocator, the driver's own
// calls) waits for as long as one registration lasts: on an H200 host, 70-85 ms for 3 GiB in one
// call, at most 5-7 ms for a 64 MiB chunk (bench/gpu/host_copy_stall.cc). A copy prepared for an
// announced swap-out thus no longer stalls the application while it still holds the GPU.
inline constexpr std::uint64_t kLockChunk = 64ull << 20;
// A host copy prepared ahead of a swap-out pauses this long after each chunk, unless a swap-out
// waits for it: registrations back to back let the application's threads through only now and
// then (the same host ran the application at about 40% of its speed; a 0.5 ms pause gave 88%, 2 ms
// all of it).
inline constexpr auto kLockPause = std::chrono::milliseconds(2);

// Grants the GPUs in `gpus` read-write access to the mapped range [address, address + bytes).
CUresult grant_access(CUdeviceptr address, std::uint64_t bytes, std::uint64_t gpus);

struct BackingSwap {
  std::uint64_t bytes = 0;  // moved
  std::uint64_t pieces = 0;
  std::uint64_t host_copies_made = 0;  // of the room given, what new host copies took
};

// What a swap-out given a host room would do with the device-backed ranges.
struct HostCopyPlan {
  std::uint64_t unmovable = 0;  // left on the GPU: pinned, or no room for its host copy
  std::uint64_t to_make = 0;    // host copies it would make, out of the room
};

class DeviceBacking {
 public:
  explicit DeviceBacking(int ordinal) : ordinal_(ordinal) {}
  DeviceBacking(const DeviceBacking&) = delete;
  DeviceBacking& operator=(const DeviceBacking&) = delete;

  // Asks the driver whether the GPU supports the API and its mapping granularity; called once,
  // before the first allocate(). Afterwards granularity() is 0 where the mode is unavailable.
  void probe();
  std::uint64_t granularity() const { return granularity_; }
  // `bytes` rounded up to the granularity (granularity() must be non-zero).
  std::uint64_t rounded(std::uint64_t bytes) const;

  CUresult allocate(std::uint64_t bytes, CUdeviceptr* address);
  CUresult release(CUdeviceptr address);
  bool owns(CUdeviceptr address) const;

  // `host_room`: the host memory new host copies may take (client/host_room.h); a range whose copy
  // would not fit in what is left of it stays on the GPU.
  // `target`: stops once at least that many bytes are being copied (whole ranges); 0: every range.
  BackingSwap swap_out(CUstream stream, std::uint64_t host_room, std::uint64_t target = 0);
  // `limit`: at most that many bytes come back, whole pieces in address order, skipping none
  // (a piece that does not fit ends it), without waiting for memory the driver cannot give at
  // once, and the GPU stays swapped out (allocations stay reserved only); 0: all, as above.
  BackingSwap swap_in(CUstream stream, std::uint64_t limit = 0);
  // `target`: only the copies a swap_out() with that target would copy into (0: all). Returns the
  // bytes whose host copies it made. Any thread but the link thread (it may take seconds).
  std::uint64_t prepare_host_copies(std::uint64_t host_room, std::uint64_t target = 0);
  // Process exit: waits for a driver call of a preparation in progress; none starts afterwards.
  void stop_preparing();
  void grant_peer(int peer);
  // The GPUs granted access so far (bit i: GPU i), this GPU excluded.
  std::uint64_t peers() const;

  // CUDA IPC. The allocation that contains `address`: its base, its layout, and a shareable
  // descriptor of each piece's physical memory (new ones per call, the caller's to close). Fails
  // where the GPU cannot export (no POSIX descriptor handles), for an address no allocation
  // contains, or while part of the allocation is swapped out. The allocation is pinned from then
  // on: swap_out() leaves it on the GPU, since another process may map it, until it is freed.
  using Tokens = std::array<std::uint64_t, kMaxPieces>;  // one per piece, the rest 0
  struct Exported {
    CUdeviceptr base = 0;
    PieceLayout layout;
    std::array<int, kMaxPieces> fds{-1, -1, -1, -1};  // one per piece of the layout
    Tokens tokens{};  // the tokens remembered for it (all 0: none yet)
  };
  CUresult export_shareable(CUdeviceptr address, Exported* out);
  // Remembers the broker's tokens for the allocation at `base` (its handle names them from now
  // on); all 0: the first export failed, the allocation is not pinned after all.
  void remember_tokens(CUdeviceptr base, const Tokens& tokens);
  // The tokens of the allocation at `base`, all 0 when it was never exported.
  Tokens tokens_of(CUdeviceptr base) const;
  // Whether `address` lies in one of this GPU's device-backed allocations.
  bool contains(CUdeviceptr address) const;
  // Whether `address` lies in an allocation export_shareable() can export (for
  // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: cuIpcGetMemHandle works on it).
  bool exportable(CUdeviceptr address) const;
  // Bytes of pinned allocations (exported for CUDA IPC).
  std::uint64_t pinned_bytes() const;
  // Bytes of allocations with no physical memory mapped: swapped out, or reserved while out.
  std::uint64_t unbacked_bytes() const;
  // What a swap_out() given `host_room` would leave on the GPU: the pinned allocations, and the
  // mapped ones (in address order) whose host copies, not made yet, no longer fit in the room.
  std::uint64_t unmovable_bytes(std::uint64_t host_room) const { return plan(host_room).unmovable; }
  HostCopyPlan plan(std::uint64_t host_room) const;

  // Bytes of host copies held (pinned host memory).
  std::uint64_t host_bytes() const;
  // The host copy of the allocation at `base`; null when it has none (page-locked pages only).
  const void* host_copy(CUdeviceptr base) const;

 private:
  struct Piece {
    std::uint64_t offset = 0;  // in its range
    std::uint64_t bytes = 0;
    CUmemGenericAllocationHandle handle = 0;  // 0: not mapped
    bool host_holds_contents = false;         // swapped out: its contents are in the host copy
  };
  struct Range {
    std::uint64_t bytes = 0;
    std::vector<Piece> pieces;     // in address order, covering the range
    void* host = nullptr;          // the pinned host copy of the whole range, once swapped out
    bool host_registered = false;  // host is our mapping, page-locked (else cuMemHostAlloc)
    void* faulted = nullptr;       // prepared pages not page-locked yet (no primary context)
    std::uint64_t serial = 0;      // tells a range from a later one at the same address
    bool pinned = false;           // exported for CUDA IPC: never swapped out
    Tokens ipc_tokens{};           // the broker's tokens, once exported

    bool has_host_memory() const { return host != nullptr || faulted != nullptr; }
    std::uint64_t mapped_bytes() const;
    bool mapped() const { return mapped_bytes() != 0; }  // some of it
    // Mapped, movable, and without host memory yet: a swap-out would have to make its copy.
    bool needs_host_copy() const { return mapped() && !pinned && !has_host_memory(); }
  };

  CUresult back(CUdeviceptr base, Piece& piece);  // create, map, grant access
  CUresult back_all(CUdeviceptr base, Range& range);
  void unback(CUdeviceptr base, Piece& piece);  // unmap, release
  void unback_all(CUdeviceptr base, Range& range);
  CUresult set_access(CUdeviceptr address, std::uint64_t bytes) const;  // this GPU and its peers
  // The range of `ranges` that contains `address`, or ranges.end().
  template <typename Ranges>
  static auto containing(Ranges& ranges, CUdeviceptr address) {
    auto it = ranges.upper_bound(address);
    if (it == ranges.begin()) return ranges.end();
    --it;
    return address - it->first < it->second.bytes ? it : ranges.end();
  }
  CUresult ensure_host_copy(Range& range);
  static void free_host_copy(Range& range);
  // The next range a preparation would make a host copy for, or ranges_.end().
  std::map<CUdeviceptr, Range>::iterator next_to_prepare(std::uint64_t target);
  // Gives `memory` (a prepared copy, page-locked when `registered`) to the range at `address` if it
  // still is the one numbered `serial` and has no copy. Under mu_. False: the caller frees it.
  bool adopt_host_copy(CUdeviceptr address, std::uint64_t serial, void* memory, bool registered);

  const int ordinal_;
  std::uint64_t granularity_ = 0;
  bool shareable_ = false;  // physical memory can be exported as a file descriptor
  mutable std::mutex mu_;
  std::condition_variable prepared_cv_;  // preparing_ or in_driver_ went false
  std::map<CUdeviceptr, Range> ranges_;
  std::uint64_t next_serial_ = 1;
  bool preparing_ = false;  // a host copy is being made outside the lock
  bool in_driver_ = false;  // ...and its preparation is inside a driver call
  // swap_out() calls waiting for preparing_ to end (changed under mu_, read by a preparation
  // outside it: it stops pacing its page-locking)
  std::atomic<int> swaps_waiting_{0};
  bool stopped_ = false;  // stop_preparing() was called
  bool out_ = false;
  std::uint64_t peers_ = 0;  // bit i: GPU i may access this GPU's ranges
};

}  // namespace nvshare::client::cuda
