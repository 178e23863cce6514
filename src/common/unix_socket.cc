#include "common/unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace nvshare {
namespace {

constexpr const char* kWouldBlock = "would block";

Error errno_error(const std::string& what, int err = errno) {
  return make_error(what + ": " + std::strerror(err));
}

Result<sockaddr_un> make_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return make_error("socket path \"" + path + "\" is empty or longer than " +
                      std::to_string(sizeof addr.sun_path - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

Status make_parent_directory(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return Status::Ok();
  const std::string dir = path.substr(0, slash);
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) return Status::Ok();
  if (Status parent = make_parent_directory(dir); !parent) return parent;
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return errno_error("cannot create directory " + dir);
  }
  return Status::Ok();
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(std::exchange(other.fd_, -1));
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Result<UniqueFd> listen_unix(const std::string& path, unsigned mode, int backlog) {
  auto addr = make_address(path);
  if (!addr) return addr.error();
  if (Status dir = make_parent_directory(path); !dir) return dir.error();
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return make_error(path + " exists and is not a socket");
    ::unlink(path.c_str());
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_error("socket");
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.value()), sizeof(sockaddr_un)) !=
      0) {
    return errno_error("bind " + path);
  }
  if (::chmod(path.c_str(), mode) != 0) return errno_error("chmod " + path);
  if (::listen(fd.get(), backlog) != 0) return errno_error("listen " + path);
  return fd;
}

Result<UniqueFd> connect_unix(const std::string& path) {
  auto addr = make_address(path);
  if (!addr) return addr.error();
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_error("socket");
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.value()), sizeof(sockaddr_un));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return errno_error("connect " + path);
  return fd;
}

Result<PeerCredentials> peer_credentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return errno_error("SO_PEERCRED");
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

Status set_nonblocking(int fd, bool nonblocking) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return errno_error("fcntl F_GETFL");
  const int wanted = nonblocking ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, wanted) != 0) return errno_error("fcntl F_SETFL");
  return Status::Ok();
}

Result<std::pair<UniqueFd, UniqueFd>> unix_socketpair() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return errno_error("socketpair");
  }
  return std::pair<UniqueFd, UniqueFd>{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

namespace {

// After a send that wrote nothing (`n` <= 0): Ok to try again (interrupted, or the socket became
// writable within `timeout_ms`), else the error to return.
Status retry_send(int fd, ssize_t n, int timeout_ms, const char* call) {
  if (n < 0 && errno == EINTR) return Status::Ok();
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, timeout_ms);
    if (ready == 0) return make_error("write timed out");
    if (ready < 0 && errno != EINTR) return errno_error("poll");
    return Status::Ok();
  }
  return errno_error(call);
}

}  // namespace

Status write_all(int fd, std::span<const std::uint8_t> bytes, int timeout_ms) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (Status retry = retry_send(fd, n, timeout_ms, "send"); !retry) return retry;
  }
  return Status::Ok();
}

Result<std::size_t> read_some(int fd, std::span<std::uint8_t> buffer) {
  for (;;) {
    const ssize_t n = ::recv(fd, buffer.data(), buffer.size(), 0);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return make_error(kWouldBlock);
    return errno_error("recv");
  }
}

bool would_block(const Error& error) { return error.message == kWouldBlock; }

Result<std::size_t> read_some_with_fds(int fd, std::span<std::uint8_t> buffer,
                                       std::vector<UniqueFd>& fds) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  for (;;) {
    iovec iov{buffer.data(), buffer.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return make_error(kWouldBlock);
    if (n < 0) return errno_error("recvmsg");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int passed = -1;
        std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.emplace_back(passed);
      }
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0) return make_error("too many descriptors in one read");
    return static_cast<std::size_t>(n);
  }
}

Status send_with_fd(int fd, std::span<const std::uint8_t> bytes, int pass, int timeout_ms) {
  if (bytes.empty()) return make_error("a descriptor needs at least one byte to travel with");
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  for (;;) {
    iovec iov{const_cast<std::uint8_t*>(bytes.data()), bytes.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass, sizeof(int));
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n > 0) return write_all(fd, bytes.subspan(static_cast<std::size_t>(n)), timeout_ms);
    if (Status retry = retry_send(fd, n, timeout_ms, "sendmsg"); !retry) return retry;
  }
}

std::optional<FileIdentity> socket_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return std::nullopt;
  return FileIdentity{
      st.st_ino, static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec};
}

}  // namespace nvshare
