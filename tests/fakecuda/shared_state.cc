#include "shared_state.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/log.h"

namespace fakecuda {
namespace {

constexpr std::uint64_t kMagic = 0x4b55434b4146564eULL;  // "NVFAKCUK"
// Bump whenever a struct in shared_state.h changes: a file of another layout is re-initialized.
constexpr std::uint32_t kLayoutVersion = 1;
constexpr std::int64_t kReapIntervalNs = 200'000'000;

std::atomic_ref<std::uint32_t> generation_of(DeviceRecord* record) {
  return std::atomic_ref<std::uint32_t>(record->generation);
}

void init_robust_mutex(pthread_mutex_t* mutex) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(mutex, &attr);
  pthread_mutexattr_destroy(&attr);
}

// Locks a robust mutex; returns true when the previous owner died while holding it.
bool lock_robust(pthread_mutex_t* mutex) {
  int rc = pthread_mutex_lock(mutex);
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(mutex);
    return true;
  }
  return false;
}

bool pid_alive(const SlotRecord& slot) {
  if (kill(slot.pid, 0) != 0 && errno == ESRCH) return false;
  if (slot.start_time == 0) return true;
  std::uint64_t now_start = process_start_time(slot.pid);
  return now_start == 0 || now_start == slot.start_time;
}

std::uint64_t my_start_time() {
  static const std::uint64_t value = process_start_time(static_cast<int>(getpid()));
  return value;
}

}  // namespace

std::int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::uint64_t process_start_time(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // Field 2 (comm) may hold spaces and parentheses: fields are counted after its closing ')'.
  char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  int field = 2;
  for (++p; *p != '\0'; ++p) {
    if (*p == ' ') {
      ++field;
      if (field == 22) return std::strtoull(p + 1, nullptr, 10);
    }
  }
  return 0;
}

// Holds a device record's mutex; recovers the record when the previous holder died.
class SimDevice::Lock {
 public:
  explicit Lock(SimDevice* device) : device_(device) {
    if (lock_robust(&device_->record_->mutex)) device_->recover_locked();
  }
  ~Lock() { pthread_mutex_unlock(&device_->record_->mutex); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  SimDevice* device_;
};

std::string SimDevice::uuid() const {
  return std::string(record_->uuid, strnlen(record_->uuid, kUuidTextSize));
}

SlotRecord* SimDevice::owned(SlotRef slot) {
  if (slot.index < 0 || slot.index >= kMaxSlots) return nullptr;
  SlotRecord& s = record_->slots[slot.index];
  if (s.pid != static_cast<std::int32_t>(getpid()) || s.context_id != slot.context_id)
    return nullptr;
  return &s;
}

double SimDevice::virtual_now(std::int64_t now) const {
  const TimePoint& p = record_->history[record_->history_head];
  if (p.active == 0 || now <= p.wall_ns) return p.virtual_ns;
  return p.virtual_ns + static_cast<double>(now - p.wall_ns) / p.active;
}

std::int64_t SimDevice::wall_at(double target) const {
  // Change points are ordered by both wall and virtual time; the crossing lies in the interval of
  // the newest point at or below target.
  std::uint32_t index = record_->history_head;
  for (std::uint32_t i = 0; i < record_->history_count; ++i) {
    const TimePoint& p = record_->history[index];
    if (p.virtual_ns <= target) {
      if (p.active == 0) return p.wall_ns;
      return p.wall_ns +
             static_cast<std::int64_t>(std::llround((target - p.virtual_ns) * p.active));
    }
    index = (index + kHistoryLength - 1) % kHistoryLength;
  }
  return record_->history[(index + 1) % kHistoryLength].wall_ns;
}

double SimDevice::virtual_at(std::int64_t wall_ns) {
  Lock lock(this);
  std::uint32_t index = record_->history_head;
  double oldest = record_->history[index].virtual_ns;
  for (std::uint32_t i = 0; i < record_->history_count; ++i) {
    const TimePoint& p = record_->history[index];
    if (p.wall_ns <= wall_ns) {
      if (p.active == 0) return p.virtual_ns;
      return p.virtual_ns + static_cast<double>(wall_ns - p.wall_ns) / p.active;
    }
    oldest = p.virtual_ns;
    index = (index + kHistoryLength - 1) % kHistoryLength;
  }
  return oldest;
}

void SimDevice::push_change(std::int64_t now, std::uint32_t active) {
  double v = virtual_now(now);
  std::uint32_t next = (record_->history_head + 1) % kHistoryLength;
  // Write the point before publishing it, so a holder dying in between leaves a consistent history.
  record_->history[next] = TimePoint{now, v, active, 0};
  record_->history_head = next;
  record_->history_count = std::min<std::uint32_t>(record_->history_count + 1, kHistoryLength);
  generation_of(record_).fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, &record_->generation, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

int SimDevice::reap_locked() {
  int reaped = 0;
  std::uint32_t active = record_->history[record_->history_head].active;
  bool counted_changed = false;
  for (SlotRecord& s : record_->slots) {
    if (s.pid == 0) continue;
    // pid_alive also catches this process's own pid left behind by an earlier process (start times
    // differ).
    if (pid_alive(s)) continue;
    if (s.counted != 0 && active > 0) {
      --active;
      counted_changed = true;
    }
    s = SlotRecord{};
    ++reaped;
  }
  if (counted_changed) push_change(mono_ns(), active);
  return reaped;
}

void SimDevice::recover_locked() {
  // The dead holder may have been anywhere in an update: drop what dead processes held and restate
  // n from the slots, which are the source of truth.
  reap_locked();
  std::uint32_t counted = 0;
  for (const SlotRecord& s : record_->slots) {
    if (s.pid != 0 && s.counted != 0) ++counted;
  }
  push_change(mono_ns(), counted);
  NVSHARE_WARN("recovered simulated GPU %s after a process died holding its lock", record_->uuid);
}

int SimDevice::reap_dead_slots() {
  Lock lock(this);
  last_reap_ns_.store(mono_ns(), std::memory_order_relaxed);
  return reap_locked();
}

void SimDevice::maybe_reap() {
  std::int64_t now = mono_ns();
  if (now - last_reap_ns_.load(std::memory_order_relaxed) < kReapIntervalNs) return;
  reap_dead_slots();
}

SlotRef SimDevice::acquire_slot(std::uint64_t context_id) {
  Lock lock(this);
  reap_locked();
  for (int i = 0; i < kMaxSlots; ++i) {
    SlotRecord& s = record_->slots[i];
    if (s.pid != 0) continue;
    s = SlotRecord{};
    s.pid = static_cast<std::int32_t>(getpid());
    s.start_time = my_start_time();
    s.context_id = context_id;
    return SlotRef{i, context_id};
  }
  return SlotRef{};
}

void SimDevice::release_slot(SlotRef slot) {
  Lock lock(this);
  SlotRecord* s = owned(slot);
  if (s == nullptr) return;
  if (s->counted != 0) {
    std::uint32_t active = record_->history[record_->history_head].active;
    push_change(mono_ns(), active > 0 ? active - 1 : 0);
  }
  *s = SlotRecord{};
}

double SimDevice::set_counted(SlotRef slot, bool counted, std::int64_t since) {
  Lock lock(this);
  // Dating the change back to `since` keeps a worker's wake-up latency out of n: a context whose
  // queue emptied at t stops slowing the others at t, not when its worker noticed. Other workers
  // are woken by the change and re-predict from the corrected history.
  const std::int64_t latest = mono_ns();
  const std::int64_t earliest = std::min(record_->history[record_->history_head].wall_ns, latest);
  const std::int64_t at = std::clamp(since, earliest, latest);
  SlotRecord* s = owned(slot);
  if (s != nullptr && (s->counted != 0) != counted) {
    std::uint32_t active = record_->history[record_->history_head].active;
    if (counted) {
      ++active;
    } else if (active > 0) {
      --active;
    }
    push_change(at, active);
    s->counted = counted ? 1 : 0;
  }
  return virtual_now(at);
}

KernelProgress SimDevice::poll_kernel(SlotRef slot, double target) {
  Lock lock(this);
  KernelProgress progress;
  std::int64_t now = mono_ns();
  progress.generation = generation_of(record_).load(std::memory_order_acquire);
  double v = virtual_now(now);
  std::uint32_t active = record_->history[record_->history_head].active;
  if (v >= target || active == 0) {
    // active == 0 while a kernel runs means this context is no longer counted (its slot was
    // released at exit): the kernel ends now instead of waiting for a clock that has stopped.
    progress.done = true;
    progress.finish_wall_ns = active == 0 ? now : std::min(wall_at(target), now);
    ++record_->kernels;
    if (SlotRecord* s = owned(slot)) ++s->kernels;
    return progress;
  }
  double remaining_wall = std::ceil((target - v) * active);
  progress.wake_at_ns = now + std::max<std::int64_t>(1, static_cast<std::int64_t>(remaining_wall));
  return progress;
}

void SimDevice::wait_for_change(std::uint32_t generation, std::int64_t deadline_ns) {
  timespec deadline{static_cast<time_t>(deadline_ns / 1'000'000'000),
                    static_cast<long>(deadline_ns % 1'000'000'000)};
  // Not FUTEX_PRIVATE: the word lives in a MAP_SHARED file and waiters are in several processes.
  // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline, so a retry after EINTR never
  // drifts.
  while (generation_of(record_).load(std::memory_order_acquire) == generation) {
    long rc = syscall(SYS_futex, &record_->generation, FUTEX_WAIT_BITSET, generation, &deadline,
                      nullptr, FUTEX_BITSET_MATCH_ANY);
    if (rc == 0) continue;  // woken: the loop condition tells a real change from a spurious wake
    if (errno == EINTR) continue;
    return;  // ETIMEDOUT, or EAGAIN (the word changed before we slept)
  }
}

bool SimDevice::reserve_device_memory(SlotRef slot, std::uint64_t bytes) {
  Lock lock(this);
  SlotRecord* s = owned(slot);
  if (s == nullptr) return false;
  auto used = [&] {
    std::uint64_t sum = 0;
    for (const SlotRecord& r : record_->slots) {
      if (r.pid != 0) sum += r.device_bytes;
    }
    return sum;
  };
  std::uint64_t in_use = used();
  if (in_use + bytes > record_->total_bytes || in_use + bytes < in_use) {
    // Before failing, give back what dead processes held.
    if (reap_locked() == 0) return false;
    in_use = used();
    if (in_use + bytes > record_->total_bytes || in_use + bytes < in_use) return false;
  }
  s->device_bytes += bytes;
  return true;
}

void SimDevice::release_device_memory(SlotRef slot, std::uint64_t bytes) {
  Lock lock(this);
  if (SlotRecord* s = owned(slot)) s->device_bytes -= std::min(bytes, s->device_bytes);
}

void SimDevice::add_managed(SlotRef slot, std::uint64_t resident, std::uint64_t host) {
  Lock lock(this);
  if (SlotRecord* s = owned(slot)) {
    s->managed_resident += resident;
    s->managed_host += host;
  }
}

void SimDevice::remove_managed(SlotRef slot, std::uint64_t resident, std::uint64_t host) {
  Lock lock(this);
  if (SlotRecord* s = owned(slot)) {
    s->managed_resident -= std::min(resident, s->managed_resident);
    s->managed_host -= std::min(host, s->managed_host);
  }
}

void SimDevice::migrate(SlotRef slot, std::uint64_t bytes, Migration kind) {
  Lock lock(this);
  SlotRecord* s = owned(slot);
  if (s == nullptr) return;
  if (kind == Migration::kToHost) {
    std::uint64_t moved = std::min(bytes, s->managed_resident);
    s->managed_resident -= moved;
    s->managed_host += moved;
    record_->migrated_to_host += moved;
  } else {
    std::uint64_t moved = std::min(bytes, s->managed_host);
    s->managed_host -= moved;
    s->managed_resident += moved;
    (kind == Migration::kToDevice ? record_->migrated_to_device : record_->faulted_in) += moved;
  }
}

MemoryTotals SimDevice::memory() {
  Lock lock(this);
  MemoryTotals totals;
  totals.total = record_->total_bytes;
  for (const SlotRecord& s : record_->slots) {
    if (s.pid == 0) continue;
    totals.device_bytes += s.device_bytes;
    totals.managed_resident += s.managed_resident;
    totals.managed_host += s.managed_host;
  }
  return totals;
}

DeviceSnapshot SimDevice::snapshot() {
  DeviceSnapshot snap;
  snap.slots.reserve(kMaxSlots);
  Lock lock(this);
  snap.uuid = uuid();
  snap.memory.total = record_->total_bytes;
  snap.migrated_to_host = record_->migrated_to_host;
  snap.migrated_to_device = record_->migrated_to_device;
  snap.faulted_in = record_->faulted_in;
  snap.kernels = record_->kernels;
  snap.active_contexts = record_->history[record_->history_head].active;
  snap.virtual_ns = virtual_now(mono_ns());
  for (const SlotRecord& s : record_->slots) {
    if (s.pid == 0) continue;
    snap.memory.device_bytes += s.device_bytes;
    snap.memory.managed_resident += s.managed_resident;
    snap.memory.managed_host += s.managed_host;
    snap.slots.push_back(SlotSnapshot{s.pid, s.context_id, s.counted != 0, s.device_bytes,
                                      s.managed_resident, s.managed_host, s.kernels});
  }
  return snap;
}

nvshare::Result<std::unique_ptr<SharedState>> SharedState::open(const std::string& path,
                                                                bool create) {
  int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0);
  int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0) {
    return nvshare::make_error("fakecuda state " + path + ": " + std::strerror(errno));
  }
  while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  const auto size = static_cast<off_t>(sizeof(SharedHeader));
  struct stat st {};
  fstat(fd, &st);
  bool fresh = false;
  if (st.st_size != size) {
    if (ftruncate(fd, 0) != 0 || ftruncate(fd, size) != 0) {
      std::string error = std::strerror(errno);
      ::close(fd);
      return nvshare::make_error("fakecuda state " + path + ": cannot size: " + error);
    }
    fresh = true;
  }
  void* map = mmap(nullptr, sizeof(SharedHeader), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    std::string error = std::strerror(errno);
    ::close(fd);
    return nvshare::make_error("fakecuda state " + path + ": mmap: " + error);
  }
  auto* header = static_cast<SharedHeader*>(map);
  if (!fresh && (header->magic != kMagic || header->layout_version != kLayoutVersion)) {
    NVSHARE_WARN("state file %s has another layout; re-initializing it", path.c_str());
    std::memset(static_cast<void*>(header), 0, sizeof(SharedHeader));
    fresh = true;
  }
  if (fresh) {
    init_robust_mutex(&header->registry_mutex);
    header->layout_version = kLayoutVersion;
    std::atomic_ref<std::uint64_t>(header->magic).store(kMagic, std::memory_order_release);
  }
  flock(fd, LOCK_UN);
  ::close(fd);  // the mapping keeps the file's pages
  return std::unique_ptr<SharedState>(new SharedState(header));
}

nvshare::Result<DeviceRecord*> SharedState::device(const std::string& uuid,
                                                   std::uint64_t total_bytes) {
  lock_robust(&header_->registry_mutex);
  DeviceRecord* found = nullptr;
  DeviceRecord* free_record = nullptr;
  for (DeviceRecord& d : header_->devices) {
    if (d.in_use != 0 && uuid == std::string(d.uuid, strnlen(d.uuid, kUuidTextSize))) {
      found = &d;
      break;
    }
    if (d.in_use == 0 && free_record == nullptr) free_record = &d;
  }
  if (found == nullptr && free_record != nullptr) {
    DeviceRecord& d = *free_record;
    std::memset(static_cast<void*>(&d), 0, sizeof d);
    init_robust_mutex(&d.mutex);
    std::snprintf(d.uuid, sizeof d.uuid, "%s", uuid.c_str());
    d.total_bytes = total_bytes;
    d.history[0] = TimePoint{mono_ns(), 0.0, 0, 0};
    d.history_head = 0;
    d.history_count = 1;
    d.in_use = 1;  // published last: readers skip records that are not in use
    found = &d;
  }
  pthread_mutex_unlock(&header_->registry_mutex);
  if (found == nullptr) {
    return nvshare::make_error("fakecuda state: more than " + std::to_string(kMaxDevices) +
                               " distinct GPU UUIDs");
  }
  return found;
}

std::vector<DeviceRecord*> SharedState::devices() {
  std::vector<DeviceRecord*> out;
  lock_robust(&header_->registry_mutex);
  for (DeviceRecord& d : header_->devices) {
    if (d.in_use != 0) out.push_back(&d);
  }
  pthread_mutex_unlock(&header_->registry_mutex);
  return out;
}

}  // namespace fakecuda
