#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace nvshare {

Status replace_file(const std::string& path, std::string_view text, mode_t mode) {
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return make_error("cannot create " + temporary + ": " + std::strerror(errno));
  ::fchmod(fd, mode);
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
  const int write_errno = errno;
  ::close(fd);
  if (written != text.size()) {
    ::unlink(temporary.c_str());
    return make_error("cannot write " + temporary + ": " + std::strerror(write_errno));
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(temporary.c_str());
    return make_error("cannot replace " + path + ": " + why);
  }
  return Status::Ok();
}

Status create_parent_directories(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) return make_error("cannot create " + parent.string() + ": " + ec.message());
  return Status::Ok();
}

}  // namespace nvshare
