// SessionLimits: how many client sessions one local identity may hold, decided when a connection is
// accepted, so that no user or pod can exhaust the scheduler's descriptors (and with them the
// control socket, other pods' sessions, and the registration that puts a new process under its
// pod's limit).
//
// A session counts against its pod when the peer's cgroup names one (every uid in a pod together:
// containers commonly run as uid 0), else against its uid. Limits:
//  - per pod: at most `per_pod` sessions;
//  - per uid (outside pods): at most `per_uid`; host root (uid 0, no pod) is exempt;
//  - in all: at most `total` (the descriptor budget); host root may go `root_extra` beyond it, so
//    an administrator's process always gets in.
// Pure bookkeeping: admit() counts a session or says which limit refused it; release() uncounts
// one admitted before. Not thread-safe (the reactor owns it).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <map>
#include <string>

#include "common/result.h"
#include "scheduler/peer_identity.h"

namespace nvshare::scheduler {

struct SessionQuota {
  std::size_t per_uid = 256;
  std::size_t per_pod = 256;
  std::size_t total = 65536;
  std::size_t root_extra = 128;
};

class SessionLimits {
 public:
  explicit SessionLimits(SessionQuota quota) : quota_(quota) {}

  Status admit(const ClientIdentity& peer);
  void release(const ClientIdentity& peer);

  std::size_t total() const { return total_; }
  std::size_t count_for(const ClientIdentity& peer) const;
  const SessionQuota& quota() const { return quota_; }

 private:
  static bool host_root(const ClientIdentity& peer) { return !peer.pod_uid && peer.uid == 0; }

  SessionQuota quota_;
  std::size_t total_ = 0;
  std::map<uid_t, std::size_t> by_uid_;
  std::map<std::string, std::size_t> by_pod_;
};

}  // namespace nvshare::scheduler
