// The real nvshare-device-plugin binary on the simulated NVML (tests/fakecuda) against the kubelet
// simulator: registration, the advertised devices, re-registration after a kubelet restart, a clean
// exit on SIGTERM, and configuration errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "kubelet_sim.h"

namespace nvshare::testing {
namespace {

constexpr auto kDeadline = std::chrono::seconds(30);

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// One child process with its stderr in a file; killed and reaped by the destructor.
class PluginProcess {
 public:
  PluginProcess(const std::vector<std::string>& args, const std::string& dir,
                const std::vector<std::string>& env_extra)
      : log_(dir + "/plugin.log") {
    std::vector<std::string> env = env_extra;
    env.push_back("LD_LIBRARY_PATH=" + std::string(NVSHARE_FAKECUDA_DIR));
    env.push_back("NVSHARE_FAKECUDA_DEVICES=2");
    env.push_back("NVSHARE_FAKECUDA_MEMORY=8Gi");
    env.push_back("NVSHARE_FAKECUDA_STATE=" + dir + "/gpus");
    env.push_back("NVSHARE_LOG_LEVEL=debug");
    std::vector<std::string> argv = {NVSHARE_DEVICE_PLUGIN_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> cargv, cenv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      for (auto& e : env) cenv.push_back(e.data());
      cenv.push_back(nullptr);
      ::execve(cargv[0], cargv.data(), cenv.data());
      ::_exit(127);
    }
  }
  ~PluginProcess() {
    if (!status_) {
      ::kill(pid_, SIGKILL);
      wait(std::chrono::seconds(30));
    }
  }
  // The exit status (or 128+signal) once it ended within the deadline.
  std::optional<int> wait(std::chrono::milliseconds deadline) {
    const auto end = std::chrono::steady_clock::now() + deadline;
    while (!status_) {
      int status = 0;
      const pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (std::chrono::steady_clock::now() >= end) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return status_;
  }
  void signal(int sig) { ::kill(pid_, sig); }
  std::string log() const { return read_text(log_); }

 private:
  std::string log_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

class PluginProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = std::make_unique<KubeletSimulator>(dir_.path());
    sim_->start();
  }
  void TearDown() override {
    if (HasFailure() && plugin_) std::fprintf(stderr, "plugin log:\n%s\n", plugin_->log().c_str());
  }
  void start_plugin(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--kubelet-dir",          sim_->device_plugin_dir(),
                                     "--pod-resources-socket", sim_->pod_resources_socket(),
                                     "--slots-per-gpu",        "3",
                                     "--health-interval",      "0.2",
                                     "--settings-dir",         dir_.path() + "/containers",
                                     "--cdi-spec-dir",         dir_.path() + "/cdi"};
    args.insert(args.end(), extra.begin(), extra.end());
    plugin_ = std::make_unique<PluginProcess>(args, dir_.path(), std::vector<std::string>{});
  }

  TempDir dir_;
  std::unique_ptr<KubeletSimulator> sim_;
  std::unique_ptr<PluginProcess> plugin_;
};

std::vector<std::string> first_device_list(KubeletSimulator& sim) {
  auto stub = sim.plugin();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kDeadline);
  auto reader = stub->ListAndWatch(&context, v1beta1::Empty());
  v1beta1::ListAndWatchResponse list;
  std::vector<std::string> devices;
  if (reader->Read(&list)) {
    for (const auto& device : list.devices())
      devices.push_back(device.id() + " " + device.health());
  }
  context.TryCancel();
  return devices;
}

TEST_F(PluginProcessTest, RegistersAdvertisesAndReRegistersAfterAKubeletRestart) {
  start_plugin({"--resource-name", "example.com/shared-gpu"});
  ASSERT_TRUE(sim_->wait_for_registrations(1));
  const auto request = sim_->registrations().at(0);
  EXPECT_EQ(request.version(), "v1beta1");
  EXPECT_EQ(request.endpoint(), "nvshare.sock");
  EXPECT_EQ(request.resource_name(), "example.com/shared-gpu");
  EXPECT_TRUE(request.options().get_preferred_allocation_available());

  const std::vector<std::string> expected = {"GPU-00000000-0000-4000-8000-000000000000__0 Healthy",
                                             "GPU-00000000-0000-4000-8000-000000000000__1 Healthy",
                                             "GPU-00000000-0000-4000-8000-000000000000__2 Healthy",
                                             "GPU-00000000-0000-4000-8000-000000000001__0 Healthy",
                                             "GPU-00000000-0000-4000-8000-000000000001__1 Healthy",
                                             "GPU-00000000-0000-4000-8000-000000000001__2 Healthy"};
  EXPECT_EQ(first_device_list(*sim_), expected);

  sim_->restart();  // the kubelet restarts and wipes the directory, our socket included
  ASSERT_TRUE(sim_->wait_for_registrations(2));
  EXPECT_EQ(sim_->registrations().at(1).resource_name(), "example.com/shared-gpu");
  // Served again on a fresh socket.
  std::vector<std::string> again;
  const auto end = std::chrono::steady_clock::now() + kDeadline;
  while (again.empty() && std::chrono::steady_clock::now() < end) again = first_device_list(*sim_);
  EXPECT_EQ(again, expected);

  plugin_->signal(SIGTERM);
  EXPECT_EQ(plugin_->wait(kDeadline), std::optional<int>(0));
  EXPECT_FALSE(std::filesystem::exists(sim_->plugin_socket()));
}

TEST_F(PluginProcessTest, ReplacesAStaleSocket) {
  { std::ofstream stale(sim_->plugin_socket()); }
  start_plugin();
  ASSERT_TRUE(sim_->wait_for_registrations(1));
  EXPECT_EQ(first_device_list(*sim_).size(), 6u);
  plugin_->signal(SIGINT);
  EXPECT_EQ(plugin_->wait(kDeadline), std::optional<int>(0));
}

TEST_F(PluginProcessTest, ConfigurationErrorsExitWithStatusTwo) {
  start_plugin({"--injection", "magic"});
  EXPECT_EQ(plugin_->wait(kDeadline), std::optional<int>(2));
  EXPECT_NE(
      plugin_->log().find("flag --injection: \"magic\" is not one of ld-preload, ld-so-preload"),
      std::string::npos)
      << plugin_->log();
  EXPECT_TRUE(sim_->registrations().empty());
}

TEST_F(PluginProcessTest, AMissingGpuStopsTheStart) {
  start_plugin({"--gpus", "GPU-not-here"});
  EXPECT_EQ(plugin_->wait(kDeadline), std::optional<int>(1));
  EXPECT_NE(plugin_->log().find("no GPU GPU-not-here"), std::string::npos) << plugin_->log();
}

}  // namespace
}  // namespace nvshare::testing
