// HostRoom: how much more memory this process may take on the host before the kernel reclaims it
// by killing a process: what a swap-out's host copies may use.
//
// A pod's memory limit is often smaller than its GPU memory (an 80 GB GPU job with a 32 GiB
// limit), and host copies are charged to the pod's memory cgroup like any page the process
// touches: copies past the limit would have the kernel's OOM killer end the job. The room is the
// least of
//  - for the process's memory cgroup and each of its ancestors, its limit less its usage (cgroup
//  v2:
//    memory.max and memory.current; v1: memory.limit_in_bytes and memory.usage_in_bytes, from the
//    memory controller's line of /proc/self/cgroup);
//  - the system's MemAvailable (/proc/meminfo);
// less a margin: kHostRoomMargin, or kHostRoomMarginShare of the tightest limit if that is more
// (the process keeps allocating host memory of its own).
//
// Contract: reads files only, never throws. A file that cannot be read or parsed, and a limit of
// "max", impose nothing (an unknown limit is not a zero one); where nothing imposes a limit the
// room is unbounded (UINT64_MAX). The roots are parameters so tests can give a tree of their own.
#pragma once

#include <cstdint>
#include <string>

namespace nvshare::client {

inline constexpr std::uint64_t kHostRoomMargin = std::uint64_t{512} << 20;
inline constexpr double kHostRoomMarginShare = 0.05;

struct HostRoomPaths {
  std::string proc = "/proc";             // its self/cgroup and meminfo are read
  std::string cgroup = "/sys/fs/cgroup";  // where the cgroup hierarchy is mounted
};

// Bytes of host memory the process may still take; UINT64_MAX where nothing limits it.
std::uint64_t host_room(const HostRoomPaths& paths = {});

// Takes `bytes` out of `room` when they fit; false, and `room` unchanged, when they do not. A
// swap-out spends its room this way, range by range in address order.
inline bool take_room(std::uint64_t& room, std::uint64_t bytes) {
  if (bytes > room) return false;
  room -= bytes;
  return true;
}

}  // namespace nvshare::client
