#include "scheduler/peer_identity.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "common/log.h"
#include "common/unix_socket.h"
#include "scheduler/pod_identity.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5, asm-generic/socket.h
#endif

namespace nvshare::scheduler {
namespace {

// A pidfd of the peer, or an invalid descriptor where the kernel has none to give.
UniqueFd peer_pidfd(int fd) {
  int pidfd = -1;
  socklen_t length = sizeof pidfd;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &length) != 0) return UniqueFd();
  return UniqueFd(pidfd);
}

// A pidfd polls readable once its process has exited.
bool still_running(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

std::string read_small_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return {};
  std::string text;
  char buffer[1024];
  while (text.size() < 8192) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  return text;
}

}  // namespace

std::uint64_t read_start_time(pid_t pid, const std::string& proc_root) {
  const std::string text = read_small_file(proc_root + "/" + std::to_string(pid) + "/stat");
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so count from the last ')'.
  const std::size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::size_t pos = close + 1;
  // Field 3 (state) follows the ')'; the start time is field 22.
  for (int field = 3; field < 22; ++field) {
    pos = text.find(' ', pos + 1);
    if (pos == std::string::npos) return 0;
  }
  std::uint64_t value = 0;
  const char* begin = text.data() + pos + 1;
  const char* end = text.data() + text.size();
  const auto [ptr, error] = std::from_chars(begin, end, value);
  return error == std::errc() && ptr != begin ? value : 0;
}

bool process_alive(pid_t pid, std::uint64_t start_time, const std::string& proc_root) {
  if (pid <= 0 || start_time == 0) return false;
  return read_start_time(pid, proc_root) == start_time;
}

Result<ClientIdentity> identify_peer(int fd, const std::string& proc_root) {
  auto peer = peer_credentials(fd);
  if (!peer) return peer.error();
  ClientIdentity identity;
  identity.pid = peer.value().pid;
  identity.uid = peer.value().uid;
  identity.gid = peer.value().gid;
  if (identity.pid <= 0) return make_error("the peer has no pid in this namespace");
  const UniqueFd pidfd = peer_pidfd(fd);
  if (pidfd.valid() && !still_running(pidfd.get())) {
    return make_error("pid " + std::to_string(identity.pid) + " exited before it was accepted");
  }
  auto pod = read_pod_identity(identity.pid, proc_root);
  if (!pod) return pod.error();
  identity.pod_uid = pod.value().pod_uid;
  if (pod.value().refused) {
    NVSHARE_DEBUG("pid %d: %s: not taken for a pod", static_cast<int>(identity.pid),
                  pod.value().refused->c_str());
  }
  identity.container_id = pod.value().container_id;
  identity.cgroup = pod.value().cgroup;
  identity.start_time = read_start_time(identity.pid, proc_root);
  if (pidfd.valid() && !still_running(pidfd.get())) {
    // The number may name another process now; what was read may be that one's.
    return make_error("pid " + std::to_string(identity.pid) + " exited while it was identified");
  }
  return identity;
}

}  // namespace nvshare::scheduler
