// The CUDA context's own memory, measured without counting other processes' contexts.
//
// The first context a process makes on a GPU is measured as the GPU's used memory (NVML) after
// minus before the real call. Two things make that measurement wrong, both seen on an H200 with
// driver 580 (a context takes 523.5 MiB there, and each process ends up using that much):
//  - A context another process creates in between is counted too: processes started together
//    were each charged 1 GiB (two), 2 GiB (four), up to 3.9 GiB (eight). So the measurement runs
//    under a lock shared by every process of the node that uses this GPU: an flock(2) on a
//    per-GPU lock file.
//  - Beside another process's context, creating one often takes only 76-88 MiB; the rest comes
//    later (nvidia-smi shows every such process at 518 MiB). So only a measurement on an otherwise
//    idle GPU (applications' used memory at most kIdleUsedBytes before it) is the footprint. It is
//    recorded in the lock file, the GPU's "known" footprint, and a process that finds the GPU in
//    use is charged that.
//
// Lock file, the first directory where it can be opened (created mode 0666 when missing):
//   1. next to the scheduler's socket (NVSHARE_SOCKET), as <socket>.context-<uuid>.lock: every
//      process that shares the scheduler sees that directory, containers included;
//   2. /dev/shm/nvshare-context-<uuid>.lock;
//   3. /tmp/nvshare-context-<uuid>.lock.
// Nothing is created through a symlink (O_NOFOLLOW), and an existing file is opened without
// O_CREAT, so a file another user made in a sticky directory is usable (fs.protected_regular).
//
// Contract
//  - The lock is waited for at most kFootprintLockWait (polling, never a blocking flock), so a
//    process holding it forever (stopped in a debugger) costs others that long, once per GPU.
//  - The charge is the measurement when the GPU was idle before it and the result is at most
//    kMaxContextBytes (above that it is noise: another process allocated meanwhile). Otherwise
//    (GPU in use, lock timed out, implausible result) it is the known footprint, or
//    kDefaultContextBytes when none was recorded. Without NVML nothing is measured or locked:
//    kDefaultContextBytes.
//  - Only a measurement taken under the lock on an idle GPU is recorded.
//  - No lock file at all (every directory unusable): measured without the lock.
//  - The descriptor is close-on-exec and the lock is released explicitly (LOCK_UN), so a child
//    forked meanwhile does not keep it.
//  - Nothing here throws or blocks without a bound.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace nvshare::client::cuda {

// Charged for the CUDA context when it cannot be measured and none was recorded: what a CUDA 13
// primary context took on an H200 with driver 580 (523.5 and 526 MiB measured), rounded.
inline constexpr std::uint64_t kDefaultContextBytes = 512ull << 20;
// A measured footprint above this is taken for noise from other processes: a context took 523.5
// MiB on an H200, two measured together 1 GiB.
inline constexpr std::uint64_t kMaxContextBytes = 1ull << 30;
// A GPU whose applications use at most this much memory (NVML's used without the driver's
// reservation: 0 MiB on an idle H200, which reserves 618 MiB) has no other CUDA context on it (the
// smallest seen took 76 MiB): a context measured there is measured alone.
inline constexpr std::uint64_t kIdleUsedBytes = 32ull << 20;
// The longest a first context creation waits for another process's measurement on the same GPU.
inline constexpr std::chrono::milliseconds kFootprintLockWait{2000};

// The per-GPU measurement lock (RAII: released when destroyed).
class FootprintLock {
 public:
  // Opens the GPU's lock file (see above) and takes the lock, waiting at most `wait`.
  FootprintLock(const std::string& socket_path, const std::string& gpu_uuid,
                std::chrono::milliseconds wait);
  FootprintLock(const FootprintLock&) = delete;
  FootprintLock& operator=(const FootprintLock&) = delete;
  ~FootprintLock();

  // The measurement is protected: the lock is held.
  bool held() const { return held_; }
  // Another process held the lock for the whole wait: do not measure.
  bool timed_out() const { return timed_out_; }
  const std::string& path() const { return path_; }
  // The footprint recorded by the last measurement on the idle GPU, if any (validated).
  std::optional<std::uint64_t> known() const;
  // Records a measurement taken alone on the GPU while held(); ignored when not held().
  void record(std::uint64_t bytes);

 private:
  int fd_ = -1;
  bool writable_ = false;
  bool held_ = false;
  bool timed_out_ = false;
  std::string path_;
};

}  // namespace nvshare::client::cuda
