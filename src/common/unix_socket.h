// Unix stream sockets: an owning descriptor, listening and connecting by path, peer credentials,
// and whole-buffer writes.
//
// Contract: every function returns a Result/Status instead of throwing or exiting; descriptors are
// created close-on-exec. listen_unix removes a stale socket file at `path` (only if it is a
// socket), creates the parent directory when missing, and applies `mode` to the socket file, so the
// scheduler can offer a world-usable client socket and an owner-only control socket. Sending never
// raises SIGPIPE (MSG_NOSIGNAL): a peer that went away shows up as an error value.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"

namespace nvshare {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

Result<UniqueFd> listen_unix(const std::string& path, unsigned mode, int backlog = 128);
Result<UniqueFd> connect_unix(const std::string& path);
Result<PeerCredentials> peer_credentials(int fd);
Status set_nonblocking(int fd, bool nonblocking = true);
// What identifies one incarnation of a socket file: a socket created anew (a restarted daemon)
// differs in inode or change time. nullopt when `path` is not a socket.
struct FileIdentity {
  ino_t inode = 0;
  std::int64_t ctime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};
std::optional<FileIdentity> socket_identity(const std::string& path);

// A connected pair, for tests and in-process links.
Result<std::pair<UniqueFd, UniqueFd>> unix_socketpair();

// Writes all bytes, retrying on EINTR and short writes; on a non-blocking descriptor it waits with
// poll(2) for up to timeout_ms when the socket buffer is full (-1 waits forever).
Status write_all(int fd, std::span<const std::uint8_t> bytes, int timeout_ms = -1);

// Reads what is available, up to buffer.size(). Returns the count, 0 at end of stream; EAGAIN on a
// non-blocking descriptor returns an error whose message is "would block" (check would_block()).
Result<std::size_t> read_some(int fd, std::span<std::uint8_t> buffer);
bool would_block(const Error& error);

// Descriptor passing (SCM_RIGHTS). read_some_with_fds reads like read_some and appends the
// descriptors that came with the bytes to `fds` (close-on-exec); one read takes at most
// kMaxPassedFds, more is an error (the kernel closed the rest). send_with_fd writes all bytes like
// write_all, the first chunk carrying `pass` (a descriptor of ours, still ours afterwards).
inline constexpr int kMaxPassedFds = 4;
Result<std::size_t> read_some_with_fds(int fd, std::span<std::uint8_t> buffer,
                                       std::vector<UniqueFd>& fds);
Status send_with_fd(int fd, std::span<const std::uint8_t> bytes, int pass, int timeout_ms = -1);

}  // namespace nvshare
