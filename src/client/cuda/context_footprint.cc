#include "client/cuda/context_footprint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <vector>

namespace nvshare::client::cuda {
namespace {

// The recorded footprint is stored with a check word, so that a torn read (the file is read
// without the lock after a timeout) or foreign content is never taken for a footprint.
constexpr std::uint64_t kCheckKey = 0x6e76736861726521ull;
constexpr std::size_t kMaxUuidChars = 64;

std::string file_safe(const std::string& uuid) {
  std::string out;
  for (char c : uuid.substr(0, kMaxUuidChars)) {
    const bool safe =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    out += safe ? c : '_';
  }
  return out;
}

std::vector<std::string> candidate_paths(const std::string& socket_path,
                                         const std::string& gpu_uuid) {
  const std::string name = file_safe(gpu_uuid);
  std::vector<std::string> paths;
  if (!socket_path.empty()) paths.push_back(socket_path + ".context-" + name + ".lock");
  paths.push_back("/dev/shm/nvshare-context-" + name + ".lock");
  paths.push_back("/tmp/nvshare-context-" + name + ".lock");
  return paths;
}

bool is_regular(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

// Opens the lock file at `path`, creating it when missing; -1 when it cannot be used. O_NONBLOCK
// so that a FIFO planted there cannot block the open (it is then refused as not a regular file).
int open_lock_file(const std::string& path, bool* writable) {
  constexpr int kFlags = O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = ::open(path.c_str(), O_RDWR | kFlags);
    *writable = fd >= 0;
    if (fd < 0 && (errno == EACCES || errno == EROFS)) {
      fd = ::open(path.c_str(), O_RDONLY | kFlags);  // flock needs no write access
    }
    if (fd >= 0) {
      if (is_regular(fd)) return fd;
      ::close(fd);
      return -1;
    }
    if (errno != ENOENT) return -1;
    // Not there yet. O_EXCL: an existing file is never opened with O_CREAT (protected_regular).
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | kFlags, 0666);
    if (fd >= 0) {
      ::fchmod(fd, 0666);  // past the umask: processes of every uid share the lock
      *writable = true;
      return fd;
    }
    if (errno != EEXIST) return -1;
    // Created by another process in between: open that one.
  }
  return -1;
}

void sleep_ms(long ms) {
  timespec ts{0, ms * 1'000'000};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

}  // namespace

FootprintLock::FootprintLock(const std::string& socket_path, const std::string& gpu_uuid,
                             std::chrono::milliseconds wait) {
  for (const std::string& path : candidate_paths(socket_path, gpu_uuid)) {
    fd_ = open_lock_file(path, &writable_);
    if (fd_ >= 0) {
      path_ = path;
      break;
    }
  }
  if (fd_ < 0) return;  // no lock file anywhere: measured unprotected
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      held_ = true;
      return;
    }
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return;  // locks unsupported here (ENOLCK): measured unprotected
    if (std::chrono::steady_clock::now() >= deadline) {
      timed_out_ = true;
      return;
    }
    sleep_ms(1);
  }
}

FootprintLock::~FootprintLock() {
  if (fd_ < 0) return;
  if (held_) ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

std::optional<std::uint64_t> FootprintLock::known() const {
  if (fd_ < 0) return std::nullopt;
  char text[64];
  const ssize_t n = ::pread(fd_, text, sizeof text - 1, 0);
  if (n <= 0) return std::nullopt;
  text[n] = '\0';
  unsigned long long bytes = 0;
  unsigned long long check = 0;
  if (std::sscanf(text, "%llu %llu", &bytes, &check) != 2 || (bytes ^ kCheckKey) != check ||
      bytes > kMaxContextBytes) {
    return std::nullopt;
  }
  return static_cast<std::uint64_t>(bytes);
}

void FootprintLock::record(std::uint64_t bytes) {
  if (!held_ || !writable_ || bytes > kMaxContextBytes) return;
  char text[64];
  const int n =
      std::snprintf(text, sizeof text, "%" PRIu64 " %" PRIu64 "\n", bytes, bytes ^ kCheckKey);
  if (n <= 0 || static_cast<std::size_t>(n) >= sizeof text) return;
  if (::pwrite(fd_, text, static_cast<std::size_t>(n), 0) == n) {
    [[maybe_unused]] const int rc = ::ftruncate(fd_, n);
  }
}

}  // namespace nvshare::client::cuda
