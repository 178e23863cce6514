// SchedulerProcess: the real nvshare-scheduler binary with its sockets at given paths, so a test
// can stop it and start a fresh one at the same control socket (a restarted scheduler remembers
// nothing). start() returns once the control socket answers `version`; the destructor kills the
// process.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "common/result.h"

namespace nvshare::testing {

class SchedulerProcess {
 public:
  // `extra` flags follow the socket flags.
  static Result<std::unique_ptr<SchedulerProcess>> start(
      const std::string& binary, const std::string& dir,
      const std::vector<std::string>& extra = {});
  // The clients' socket.
  const std::string& socket() const { return socket_; }
  ~SchedulerProcess();

  const std::string& control_socket() const { return control_socket_; }
  // The `status` response, or an error when the scheduler does not answer.
  Result<Json> status() const;
  // The remembered pod with this UID from `status` (null Json when absent).
  Result<Json> pod(const std::string& pod_uid) const;
  void kill_and_wait();

 private:
  SchedulerProcess() = default;
  std::string control_socket_;
  std::string socket_;
  pid_t pid_ = -1;
};

}  // namespace nvshare::testing
