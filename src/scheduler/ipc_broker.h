// IpcBroker: the descriptors of CUDA IPC exports the scheduler keeps for their exporters.
//
// cuIpcGetMemHandle in the client library exports the physical memory of a device-backed
// allocation as a file descriptor and offers it here (protocol IpcExport, the descriptor sent
// with SCM_RIGHTS); the handle the application passes to another process names the token this
// returns. cuIpcOpenMemHandle in that process claims the token (IpcImport) and gets a duplicate
// of the descriptor, which it imports and maps.
//
// Contract
//  - Who may claim: a process of the exporter's pod; where neither process is in a pod (off
//    Kubernetes), one with the exporter's uid. Identities are the kernel's (peer_identity.h),
//    taken when each connection was accepted.
//  - An export lives until its exporter withdraws it (it freed the memory) or until the exporter
//    has no session left (drop_process): a descriptor kept here keeps the GPU memory allocated,
//    so nothing outlives the process that made it.
//  - Bounded: at most max_per_process exports per process and max_total in all; over either,
//    offer() fails and the descriptor is closed.
//  - Tokens are random, never 0, never reused while their export lives. Never throws except
//    std::bad_alloc from its map.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>

#include "common/result.h"
#include "common/unix_socket.h"
#include "scheduler/peer_identity.h"

namespace nvshare::scheduler {

// Whether `importer` may map memory `exporter` exported.
bool may_share_memory(const ClientIdentity& exporter, const ClientIdentity& importer);

class IpcBroker {
 public:
  IpcBroker(std::size_t max_per_process, std::size_t max_total)
      : max_per_process_(max_per_process), max_total_(max_total) {}

  Result<std::uint64_t> offer(const ClientIdentity& exporter, UniqueFd fd, std::uint64_t bytes);

  struct Claimed {
    UniqueFd fd;  // a duplicate: the export stays
    std::uint64_t bytes = 0;
  };
  Result<Claimed> claim(const ClientIdentity& importer, std::uint64_t token) const;

  // Only the exporter (same pid and start time) may withdraw; false when the token is not its.
  bool withdraw(const ClientIdentity& exporter, std::uint64_t token);
  // Closes every export of the process; returns how many there were.
  std::size_t drop_process(pid_t pid, std::uint64_t start_time);

  std::size_t size() const { return exports_.size(); }
  std::size_t max_total() const { return max_total_; }

 private:
  struct Export {
    ClientIdentity exporter;
    UniqueFd fd;
    std::uint64_t bytes = 0;
  };
  static bool same_process(const ClientIdentity& a, const ClientIdentity& b) {
    return a.pid == b.pid && a.start_time == b.start_time;
  }
  std::size_t count_of(const ClientIdentity& exporter) const;
  std::uint64_t fresh_token() const;

  std::size_t max_per_process_;
  std::size_t max_total_;
  std::map<std::uint64_t, Export> exports_;
};

}  // namespace nvshare::scheduler
