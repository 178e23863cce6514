#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace nvshare {

namespace {

// A new temporary beside `path`: whatever is there (a stale one, or a symbolic link planted to
// redirect the write) is removed first, and the file is created, never opened through a link.
int create_temporary(const std::string& temporary, mode_t mode) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (::unlink(temporary.c_str()) != 0 && errno != ENOENT) return -1;
    const int fd =
        ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

void sync_directory_of(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

Status replace_file(const std::string& path, std::string_view text, mode_t mode) {
  const std::string temporary = path + ".tmp";
  const int fd = create_temporary(temporary, mode);
  if (fd < 0) return make_error("cannot create " + temporary + ": " + std::strerror(errno));
  ::fchmod(fd, mode);
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
  int write_errno = errno;
  // On the disk before the rename makes it the file: a crash leaves the old file or the new one.
  if (written == text.size() && ::fsync(fd) != 0) {
    write_errno = errno;
    written = 0;
  }
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
  sync_directory_of(path);
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
