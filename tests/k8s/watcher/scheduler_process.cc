#include "scheduler_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "control/client.h"

namespace nvshare::testing {

Result<std::unique_ptr<SchedulerProcess>> SchedulerProcess::start(
    const std::string& binary, const std::string& dir, const std::vector<std::string>& extra) {
  std::unique_ptr<SchedulerProcess> process(new SchedulerProcess());
  process->control_socket_ = dir + "/control.sock";
  process->socket_ = dir + "/scheduler.sock";
  const std::string& socket = process->socket_;
  const std::string log = dir + "/scheduler.log";
  // No state file: a restarted scheduler knows nothing, as after the loss of its state, so what
  // it learns again comes from the pod watcher's pushes.
  std::vector<std::string> args = {
      binary, "--socket", socket, "--control-socket", process->control_socket_, "--state-file", ""};
  args.insert(args.end(), extra.begin(), extra.end());
  const pid_t pid = ::fork();
  if (pid < 0) return make_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 2);
      ::dup2(fd, 1);
    }
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  process->pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  Json version = Json::object();
  version.set("cmd", "version");
  while (true) {
    if (control::control_call(process->control_socket_, version, 2000)) return process;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      process->pid_ = -1;
      return make_error("nvshare-scheduler exited at start; see " + log);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return make_error("nvshare-scheduler did not answer on " + process->control_socket_);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

SchedulerProcess::~SchedulerProcess() { kill_and_wait(); }

void SchedulerProcess::kill_and_wait() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  ::unlink(control_socket_.c_str());
  ::unlink(socket_.c_str());
}

Result<Json> SchedulerProcess::status() const {
  Json request = Json::object();
  request.set("cmd", "status");
  return control::control_call(control_socket_, request, 5000);
}

Result<Json> SchedulerProcess::pod(const std::string& pod_uid) const {
  auto response = status();
  if (!response) return response.error();
  const Json* pods = response.value().find("pods");
  if (pods == nullptr || pods->as_array() == nullptr) return Json();
  for (const Json& pod : *pods->as_array()) {
    const Json* uid = pod.find("pod_uid");
    if (uid != nullptr && uid->as_string() != nullptr && *uid->as_string() == pod_uid) return pod;
  }
  return Json();
}

}  // namespace nvshare::testing
