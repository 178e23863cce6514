// ContainerSettings: the settings every container given nvshare GPUs gets, which its own
// environment cannot override (client/settings_file.h is the library's reader and describes the
// file).
//
// Allocate creates one directory per container under settings-dir, holding client.conf, and
// mounts it read-only at /etc/nvshare. At that moment the kubelet has not said which pod the
// devices are for, so the file starts with memory-limit=pending. resolve() finishes it: once the
// kubelet's pod-resources names the pod container that holds exactly those devices (slot IDs are
// held by one container at a time) and the pod watcher knows that pod, the file gets the pod's
// memory limit (`none` without one), and gets it again whenever it changes. A container whose
// pod no longer holds its devices loses its directory after `gone_after`; a directory never
// claimed within `unclaimed_after` goes too. A newer allocation of the same devices supersedes an
// older unclaimed one.
//
// Files are replaced atomically (a temporary file renamed within the directory), so a reader sees
// the old file or the new one. prepare() reads back the directories a previous run left, so a
// restarted plugin keeps serving them. Not thread-safe: the caller locks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/result.h"

namespace nvshare::deviceplugin {

inline constexpr const char* kSettingsContainerPath = "/etc/nvshare";

// The limits the pod watcher holds for a pod ("namespace/name"); nullopt from the lookup while it
// does not know the pod (or has not listed the node's pods yet).
struct KnownPodLimits {
  std::optional<std::uint64_t> memory_bytes;  // nullopt: no memory limit
};
using PodLimitsLookup = std::function<std::optional<KnownPodLimits>(const std::string& key)>;

// One container of a pod, as pod-resources shows it: the device IDs of our resource it holds.
struct LiveContainer {
  std::string pod_key;  // "namespace/name"
  std::vector<std::string> device_ids;
};

struct ContainerSettingsOptions {
  std::string dir;     // settings-dir on the host
  std::string socket;  // the scheduler's client socket as containers see it
  Duration register_wait{};
  Duration unclaimed_after = std::chrono::minutes(10);
  Duration gone_after = std::chrono::seconds(30);
  // Called with a container's directory name after its directory went (what lives beside it goes
  // too: its CDI spec).
  std::function<void(const std::string& id)> removed;
};

class ContainerSettings {
 public:
  explicit ContainerSettings(ContainerSettingsOptions options);

  // Creates settings-dir (0755) and reads back what a previous run left.
  Status prepare(MonoTime now);
  // A new container's directory for `device_ids`; returns its host path.
  Result<std::string> create(const std::vector<std::string>& device_ids, MonoTime now);
  // One pass over the live containers and the pod watcher's limits.
  void resolve(const std::vector<LiveContainer>& live, const PodLimitsLookup& limits, MonoTime now);

  std::size_t pending() const;  // containers whose pod's limit is not written yet
  std::size_t size() const { return entries_.size(); }
  std::set<std::string> ids() const;  // the containers' directory names

 private:
  struct Entry {
    std::vector<std::string> devices;  // sorted
    MonoTime created{};
    std::optional<std::string> pod;  // once claimed
    std::string written;             // the memory-limit value in the file
    std::optional<MonoTime> missing_since;
  };

  std::string file_text(const Entry& entry) const;
  Status write(const std::string& id, const Entry& entry) const;
  void remove(const std::string& id);

  ContainerSettingsOptions options_;
  std::map<std::string, Entry> entries_;  // by directory name
  std::uint64_t counter_ = 0;
};

}  // namespace nvshare::deviceplugin
