// What the chaos tests and the soak need beyond the end-to-end harness: pods as the kubelet makes
// them, container settings as the device plugin writes them, attackers running as an unprivileged
// user, and the scheduler's footprint.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/result.h"

namespace nvshare::chaos {

inline constexpr uid_t kNobody = 65534;

// A pod as a node has one: a cgroup kubepods/besteffort/pod<uid> in a hierarchy root may write, so
// the scheduler finds the pod of a process in it from /proc/<pid>/cgroup, without trusting
// anything the process says. The destructor removes the cgroup (its processes must be gone).
class FakePod {
 public:
  // Fails where no cgroup hierarchy is writable (not root, or a read-only /sys/fs/cgroup).
  // `under`: the path below the hierarchy's root where the pod's cgroup goes (the kubelet's
  // hierarchy unless a test places a look-alike elsewhere).
  static Result<std::unique_ptr<FakePod>> create(const std::string& uid,
                                                 const std::string& under = "kubepods/besteffort");
  ~FakePod();
  FakePod(const FakePod&) = delete;
  FakePod& operator=(const FakePod&) = delete;

  const std::string& uid() const { return uid_; }
  std::string procs() const { return dir_ + "/cgroup.procs"; }
  // The hierarchy's root cgroup, to leave the pod again.
  std::string root_procs() const { return root_ + "/cgroup.procs"; }
  Status add(pid_t pid) const;

 private:
  FakePod(std::string uid, std::string root, std::string dir, std::string under)
      : uid_(std::move(uid)),
        root_(std::move(root)),
        dir_(std::move(dir)),
        under_(std::move(under)) {}
  std::string uid_;
  std::string root_;  // the hierarchy's mount point
  std::string dir_;
  std::string under_;
};

// The device plugin's settings of one container: <dir>/client.conf with `text`, root's and 0644,
// replaced atomically.
Status write_settings(const std::string& dir, const std::string& text);

// /etc/nvshare as a mount point for SpawnOptions::settings_dir: made (empty) when missing, and
// removed again by the destructor when it was made here.
class SettingsMountPoint {
 public:
  SettingsMountPoint();
  ~SettingsMountPoint();
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
  bool made_ = false;
};

// A child process running `body` as `uid` (dropped from root; its descriptor limit raised first to
// `max_files` when that is more than it has). It dies with the test; kill() ends it early.
class Attacker {
 public:
  static Result<std::unique_ptr<Attacker>> start(uid_t uid, std::size_t max_files,
                                                 std::function<int(int report_fd)> body);
  ~Attacker();
  // Waits up to `timeout_s` for a line the body wrote to its report descriptor.
  Result<std::string> report(double timeout_s);
  // Waits for the exit code.
  Result<int> wait(double timeout_s);
  void kill();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int report_fd_ = -1;
  std::string buffered_;
  std::optional<int> exit_code_;
};

// Writes one line to an attacker's report descriptor.
void report_line(int fd, const std::string& line);

// A process's open descriptors and resident memory.
struct Footprint {
  std::size_t fds = 0;
  std::size_t rss_bytes = 0;
};
Footprint footprint(pid_t pid);

// Lifts this process's descriptor limit to at least `n` (root may raise the hard limit too).
void raise_descriptor_limit(std::size_t n);

}  // namespace nvshare::chaos
