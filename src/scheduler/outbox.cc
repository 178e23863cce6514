#include "scheduler/outbox.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace nvshare::scheduler {

Result<bool> Outbox::flush(int fd) {
  while (start_ < data_.size()) {
    const ssize_t n =
        ::send(fd, data_.data() + start_, data_.size() - start_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      start_ += static_cast<std::size_t>(n);
      sent_total_ += static_cast<std::uint64_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return make_error(std::string("send: ") + std::strerror(errno));
  }
  if (start_ == data_.size()) {
    data_.clear();  // keeps the capacity: the next frames reuse it without allocating
    start_ = 0;
    return true;
  }
  // Partly written: drop the written prefix once it dominates, so the buffer does not grow forever.
  if (start_ > 65536 && start_ * 2 > data_.size()) {
    data_.erase(data_.begin(), data_.begin() + static_cast<std::ptrdiff_t>(start_));
    start_ = 0;
  }
  return false;
}

}  // namespace nvshare::scheduler
