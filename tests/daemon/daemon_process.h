// DaemonProcess: the real nvshare-scheduler binary, started for one test with its sockets and its
// state file in a fresh temporary directory, knowing one GPU (kTestGpu, 80Gi) unless its flags say
// otherwise, and helpers to run other programs (nvsharectl) and capture their output.
//
// start() returns once both sockets accept connections (the control socket is <dir>/control.sock
// unless the flags name another with --control-socket), or as the Readiness given says; the
// destructor kills the daemon if it is still running and removes the directory. The daemon's stderr
// goes to <dir>/scheduler.log, which log() returns, so a failing test can print what the daemon
// said.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"

namespace nvshare::testing {

// The GPU a DaemonProcess knows unless its flags name others (--gpus).
inline constexpr const char* kTestGpu = "GPU-00000000-1111-2222-3333-444444444444";

// What start() waits for: both sockets accepting (the default), or only the client socket's file
// existing (the earliest moment anyone could see the daemon).
enum class Readiness { kBothSocketsAccept, kClientSocketExists };

class DaemonProcess {
 public:
  static Result<std::unique_ptr<DaemonProcess>> start(
      const std::vector<std::string>& flags, const std::string& binary,
      Readiness readiness = Readiness::kBothSocketsAccept);
  ~DaemonProcess();

  const std::string& dir() const { return dir_; }
  const std::string& socket() const { return socket_; }
  const std::string& control_socket() const { return control_socket_; }
  pid_t pid() const { return pid_; }
  std::string log() const;

  // Sends `signal` and waits up to `timeout` for the exit. Returns the exit status (the code, or
  // 128 + signal when killed by one), or an error on timeout.
  Result<int> stop(int signal, std::chrono::milliseconds timeout);

 private:
  DaemonProcess() = default;

  std::string dir_;
  std::string socket_;
  std::string control_socket_;
  pid_t pid_ = -1;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs argv[0] with the arguments, waits for it (up to `timeout`), and captures stdout and stderr.
Result<CommandResult> run_command(const std::vector<std::string>& argv,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(20));

}  // namespace nvshare::testing
