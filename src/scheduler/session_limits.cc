#include "scheduler/session_limits.h"

namespace nvshare::scheduler {

std::size_t SessionLimits::count_for(const ClientIdentity& peer) const {
  if (peer.pod_uid) {
    auto it = by_pod_.find(*peer.pod_uid);
    return it == by_pod_.end() ? 0 : it->second;
  }
  auto it = by_uid_.find(peer.uid);
  return it == by_uid_.end() ? 0 : it->second;
}

Status SessionLimits::admit(const ClientIdentity& peer) {
  const bool root = host_root(peer);
  const std::size_t total_limit = quota_.total + (root ? quota_.root_extra : 0);
  if (total_ >= total_limit) {
    return make_error("the scheduler holds " + std::to_string(total_) + " sessions, its limit");
  }
  if (peer.pod_uid) {
    if (count_for(peer) >= quota_.per_pod) {
      return make_error("pod " + *peer.pod_uid + " holds " + std::to_string(quota_.per_pod) +
                        " sessions, the most one pod may (max-sessions-per-pod)");
    }
    ++by_pod_[*peer.pod_uid];
  } else if (!root) {
    if (count_for(peer) >= quota_.per_uid) {
      return make_error("uid " + std::to_string(peer.uid) + " holds " +
                        std::to_string(quota_.per_uid) +
                        " sessions, the most one user may (max-sessions-per-uid)");
    }
    ++by_uid_[peer.uid];
  }
  ++total_;
  return Status::Ok();
}

void SessionLimits::release(const ClientIdentity& peer) {
  if (total_ > 0) --total_;
  const auto drop = [](auto& map, const auto& key) {
    auto it = map.find(key);
    if (it == map.end()) return;
    if (--it->second == 0) map.erase(it);
  };
  if (peer.pod_uid) {
    drop(by_pod_, *peer.pod_uid);
  } else if (!host_root(peer)) {
    drop(by_uid_, peer.uid);
  }
}

}  // namespace nvshare::scheduler
