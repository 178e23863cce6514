#include "scheduler/policy/gang.h"

namespace nvshare::policy {

std::vector<std::optional<MonoTime>> gang_resume_floors(const std::vector<GangMember>& members,
                                                        MonoTime now) {
  // The latest pause end of all, and the latest on any other GPU than that one's: each member's
  // floor is one of the two (O(members)).
  const GangMember* latest = nullptr;
  for (const GangMember& m : members) {
    if (m.pause_ends && (latest == nullptr || *m.pause_ends > *latest->pause_ends)) latest = &m;
  }
  std::optional<MonoTime> elsewhere;
  if (latest != nullptr) {
    for (const GangMember& m : members) {
      if (m.pause_ends && m.gpu != latest->gpu && (!elsewhere || *m.pause_ends > *elsewhere)) {
        elsewhere = m.pause_ends;
      }
    }
  }
  std::vector<std::optional<MonoTime>> floors(members.size());
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (latest == nullptr) break;
    const std::optional<MonoTime> floor =
        members[i].gpu != latest->gpu ? latest->pause_ends : elsewhere;
    if (floor && *floor > now + kGangSlack) floors[i] = floor;
  }
  return floors;
}

std::vector<bool> gang_peers_paused(const std::vector<GangMember>& members) {
  // O(members^2): a job has a process or a few per GPU.
  std::vector<bool> paused(members.size(), false);
  for (std::size_t i = 0; i < members.size(); ++i) {
    bool one_pauses = false;
    bool none_runs = true;
    for (const GangMember& m : members) {
      if (m.gpu == members[i].gpu) continue;
      one_pauses = one_pauses || m.pause_ends.has_value();
      none_runs = none_runs && (m.pause_ends.has_value() || m.draining);
    }
    paused[i] = one_pauses && none_runs;
  }
  return paused;
}

}  // namespace nvshare::policy
