#include "client/link/handoff_trace.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "common/log.h"

namespace nvshare::client {

HandoffTrace::HandoffTrace(const std::string& path) {
  if (path.empty()) return;
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    NVSHARE_WARN("trace file %s cannot be opened (%s); not tracing", path.c_str(),
                 std::strerror(errno));
  }
}

HandoffTrace::~HandoffTrace() {
  if (fd_ >= 0) ::close(fd_);
}

void HandoffTrace::record(std::string_view event, std::string_view gpu_uuid, std::uint64_t epoch,
                          double ms, std::int64_t swap_bytes, double swap_ms, std::int64_t inside,
                          std::int64_t waiting, std::int64_t at_bound) const noexcept {
  if (fd_ < 0) return;
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  char line[320];
  int n = std::snprintf(line, sizeof line,
                        "{\"t\":%lld.%09ld,\"pid\":%d,\"gpu\":\"%.*s\",\"event\":\"%.*s\","
                        "\"epoch\":%" PRIu64,
                        static_cast<long long>(ts.tv_sec), ts.tv_nsec, static_cast<int>(::getpid()),
                        static_cast<int>(gpu_uuid.size()), gpu_uuid.data(),
                        static_cast<int>(event.size()), event.data(), epoch);
  if (n < 0 || n >= static_cast<int>(sizeof line) - 150) return;
  if (ms >= 0) n += std::snprintf(line + n, sizeof line - n, ",\"ms\":%.3f", ms);
  if (swap_bytes >= 0) {
    n += std::snprintf(line + n, sizeof line - n, ",\"swap_bytes\":%" PRId64 ",\"swap_ms\":%.3f",
                       swap_bytes, swap_ms);
  }
  if (inside >= 0) {
    n += std::snprintf(line + n, sizeof line - n,
                       ",\"inside\":%" PRId64 ",\"waiting\":%" PRId64 ",\"at_bound\":%" PRId64,
                       inside, waiting, std::max<std::int64_t>(at_bound, 0));
  }
  n += std::snprintf(line + n, sizeof line - n, "}\n");
  // One write: O_APPEND keeps concurrent writers' lines whole. A short write is not retried (it
  // would split the line); the trace is best effort.
  const ssize_t written = ::write(fd_, line, static_cast<std::size_t>(n));
  (void)written;
}

}  // namespace nvshare::client
