// Who is on the other end of a client connection, from the kernel, at the moment it is accepted.
//
// Never from what the client says, and never later: the process that called connect(2) may have
// exited by the time its session says hello (connect, fork, exit, the child speaks), and its pid
// may belong to another process by then.
//  - pid, uid, gid: SO_PEERCRED, the credentials of the connecting process.
//  - pod, container and cgroup: that pid's cgroup file (pod_identity.h).
//  - start time: field 22 of /proc/<pid>/stat, so that a limit kept for a process never applies
//    to a later process that reuses the number.
// Where the kernel offers SO_PEERPIDFD (Linux 6.5), the peer is pinned by a pidfd while /proc is
// read, and the reads count only if it is still alive afterwards: a reused pid cannot lend its
// cgroup. On older kernels the short window between connect and accept remains.
//
// Contract: identify_peer fails when the credentials or the peer's cgroup cannot be read (it has
// exited): the daemon then refuses the connection unless it trusts clients. An unreadable start
// time is 0 (nothing is kept for such a process across sessions).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "common/result.h"

namespace nvshare::scheduler {

struct ClientIdentity {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::uint64_t start_time = 0;        // clock ticks after boot; 0 when unknown
  std::optional<std::string> pod_uid;  // from the cgroup (canonical)
  std::optional<std::string> container_id;
  std::string cgroup;  // its cgroup's path (pod_identity.h); empty when unknown
};

Result<ClientIdentity> identify_peer(int fd, const std::string& proc_root = "/proc");

// The start time of `pid` (field 22 of <proc_root>/<pid>/stat), or 0 when it cannot be read.
std::uint64_t read_start_time(pid_t pid, const std::string& proc_root = "/proc");

// Whether `pid` still runs the process that started at `start_time` (nonzero).
bool process_alive(pid_t pid, std::uint64_t start_time, const std::string& proc_root = "/proc");

}  // namespace nvshare::scheduler
