// nvshare-run: starting a local scheduler, the command's environment, exit statuses and signals.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_support.h"

namespace nvshare::client {
namespace {

using namespace std::chrono_literals;
using testing::EnvChanges;
using testing::ProcessResult;
using testing::TempDir;
using testing::wait_until;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

// The command line of a process, arguments separated by spaces.
std::string command_line(pid_t pid) {
  std::string text = read_file("/proc/" + std::to_string(pid) + "/cmdline");
  for (char& c : text) {
    if (c == '\0') c = ' ';
  }
  return text;
}

// Gone or a zombie (the scheduler's parent is init, which may reap it only later).
bool process_ended(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z' ||
         stat[paren + 2] == 'X';
}

class NvshareRunTest : public ::testing::Test {
 protected:
  ~NvshareRunTest() override {
    // Schedulers started by nvshare-run are detached: stop every one this test started.
    for (const std::string& socket : sockets_) {
      if (const pid_t pid = testing::listener_pid(socket); pid > 0) {
        ::kill(pid, SIGTERM);
        wait_until([&] { return process_ended(pid); }, 3000ms);
      }
    }
  }

  std::string socket(const std::string& name = "s.sock") {
    sockets_.push_back(dir_.file(name));
    return sockets_.back();
  }

  // The scheduler it starts knows two GPUs (as NVML would tell it on a GPU host).
  EnvChanges env() const {
    return {{"NVSHARE_LIBRARY", NVSHARE_TEST_PRELOAD},
            {"NVSHARE_SCHEDULER_BIN", NVSHARE_SCHEDULER_BIN},
            {"NVSHARE_GPUS", kGpu + "=16Gi," + kOtherGpu + "=16Gi"},
            {"NVSHARE_SOCKET", std::nullopt},
            {"LD_PRELOAD", std::nullopt}};
  }

  static inline const std::string kGpu = "GPU-7e3a0c55-0000-4000-8000-000000000001";
  static inline const std::string kOtherGpu = "GPU-7e3a0c55-0000-4000-8000-000000000002";

  ProcessResult run(std::vector<std::string> args, EnvChanges changes = {}) {
    EnvChanges merged = env();
    for (auto& [name, value] : changes) merged[name] = value;
    args.insert(args.begin(), NVSHARE_RUN_BIN);
    return testing::run_process(args, merged, 20s);
  }

  TempDir dir_;
  std::vector<std::string> sockets_;
};

TEST_F(NvshareRunTest, StartsALocalSchedulerWhenNoneRunsAndReusesIt) {
  const std::string sock = socket();
  ASSERT_EQ(testing::listener_pid(sock), 0);
  const ProcessResult first = run({"--socket", sock, "--", "true"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.err.find("started nvshare-scheduler on " + sock), std::string::npos) << first.err;
  const pid_t scheduler = testing::listener_pid(sock);
  ASSERT_GT(scheduler, 0) << "nothing accepts on " << sock;
  EXPECT_NE(scheduler, ::getpid());
  // Local mode, its control socket and log next to the client socket.
  const std::string cmdline = command_line(scheduler);
  EXPECT_NE(cmdline.find("--trust-client-limits"), std::string::npos) << cmdline;
  EXPECT_NE(cmdline.find("--control-socket " + dir_.file("s.control.sock")), std::string::npos)
      << cmdline;
  EXPECT_TRUE(std::filesystem::exists(dir_.file("s.control.sock")));
  EXPECT_NE(read_file(dir_.file("s.log")).find("started"), std::string::npos);
  // Detached: another session than ours, and not our child.
  EXPECT_NE(::getsid(scheduler), ::getsid(0));
  EXPECT_NE(command_line(scheduler).find(NVSHARE_SCHEDULER_BIN), std::string::npos);

  const ProcessResult second = run({"--socket", sock, "--", "true"});
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(second.err.find("started nvshare-scheduler"), std::string::npos) << second.err;
  EXPECT_EQ(testing::listener_pid(sock), scheduler);
}

TEST_F(NvshareRunTest, SchedulerSocketNamedLikeTheSystemOneGetsControlSockNextToIt) {
  std::filesystem::create_directory(dir_.file("run"));
  const std::string sock = socket("run/scheduler.sock");
  const ProcessResult result = run({"--socket", sock, "true"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(std::filesystem::exists(dir_.file("run/control.sock")));
  EXPECT_TRUE(std::filesystem::exists(dir_.file("run/scheduler.log")));
}

// A missing socket directory under a symbolic link to a directory is created (as root the system
// socket's /var/run is one to /run on most distributions, and /run/nvshare may not exist yet).
TEST_F(NvshareRunTest, CreatesTheSocketDirectoryBeneathALinkedParent) {
  std::filesystem::create_directory(dir_.file("real"));
  std::filesystem::create_directory_symlink(dir_.file("real"), dir_.file("link"));
  const std::string sock = socket("link/nvshare/s.sock");
  const ProcessResult result = run({"--socket", sock, "true"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(std::filesystem::exists(dir_.file("real/nvshare/s.control.sock")));
}

TEST_F(NvshareRunTest, ReturnsTheCommandsExitStatus) {
  const std::string sock = socket();
  EXPECT_EQ(run({"--socket", sock, "--", "sh", "-c", "exit 7"}).exit_code, 7);
  EXPECT_EQ(run({"--socket", sock, "--", "sh", "-c", "exit 0"}).exit_code, 0);
  EXPECT_EQ(run({"--socket", sock, "--", "sh", "-c", "kill -TERM $$"}).exit_code, 128 + SIGTERM);
  EXPECT_EQ(run({"--socket", sock, "--", "sh", "-c", "kill -KILL $$"}).exit_code, 128 + SIGKILL);
}

TEST_F(NvshareRunTest, GivesTheCommandTheLibraryTheSocketAndTheDeclaredLimits) {
  const std::string sock = socket();
  const ProcessResult result =
      run({"--gpu", "1", "--memory-limit", "4Gi", "--core-limit", "30", "--memory-mode", "unified",
           "--priority", "low", "--socket", sock, "--", "env"},
          {{"LD_PRELOAD", "libexisting.so"}, {"NVSHARE_MEMORY_LIMIT", "1Gi"}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::string library = std::filesystem::canonical(NVSHARE_TEST_PRELOAD).string();
  EXPECT_NE(result.out.find("\nLD_PRELOAD=" + library + ":libexisting.so\n"), std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("\nNVSHARE_SOCKET=" + sock + "\n"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("\nNVSHARE_MEMORY_LIMIT=4Gi\n"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("\nNVSHARE_CORE_LIMIT=30\n"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("\nNVSHARE_MEMORY_MODE=unified\n"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("\nNVSHARE_PRIORITY=low\n"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("\nCUDA_VISIBLE_DEVICES=1\n"), std::string::npos) << result.out;
}

TEST_F(NvshareRunTest, LeavesUnaskedVariablesAlone) {
  const std::string sock = socket();
  const ProcessResult result = run({"--socket", sock, "env"}, {{"CUDA_VISIBLE_DEVICES", "0,2"}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("\nCUDA_VISIBLE_DEVICES=0,2\n"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("NVSHARE_MEMORY_LIMIT="), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("NVSHARE_CORE_LIMIT="), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("NVSHARE_MEMORY_MODE="), std::string::npos) << result.out;
  const std::string library = std::filesystem::canonical(NVSHARE_TEST_PRELOAD).string();
  EXPECT_NE(result.out.find("\nLD_PRELOAD=" + library + "\n"), std::string::npos) << result.out;
}

TEST_F(NvshareRunTest, SocketFromTheEnvironmentWhenNotGiven) {
  const std::string sock = socket();
  const ProcessResult result = run({"env"}, {{"NVSHARE_SOCKET", sock}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("\nNVSHARE_SOCKET=" + sock + "\n"), std::string::npos) << result.out;
  EXPECT_GT(testing::listener_pid(sock), 0);
}

TEST_F(NvshareRunTest, MissingCommandIs127) {
  const std::string sock = socket();
  ProcessResult result = run({"--socket", sock, "--", "nvshare-no-such-command-xyz"});
  EXPECT_EQ(result.exit_code, 127);
  EXPECT_NE(result.err.find("nvshare-no-such-command-xyz: command not found"), std::string::npos)
      << result.err;
  EXPECT_EQ(run({"--socket", sock, "--", dir_.file("absent")}).exit_code, 127);
}

TEST_F(NvshareRunTest, CommandThatCannotRunIs126) {
  const std::string sock = socket();
  const std::string script = dir_.file("not-executable");
  std::ofstream(script) << "#!/bin/sh\nexit 0\n";
  ::chmod(script.c_str(), 0644);
  const ProcessResult result = run({"--socket", sock, "--", script});
  EXPECT_EQ(result.exit_code, 126) << result.err;
}

TEST_F(NvshareRunTest, UsageErrors) {
  const std::string sock = socket();
  EXPECT_EQ(run({"--socket", sock}).exit_code, 2);
  EXPECT_EQ(run({"--core-limit", "150", "--socket", sock, "true"}).exit_code, 2);
  EXPECT_EQ(run({"--memory-limit", "4GB", "--socket", sock, "true"}).exit_code, 2);
  const ProcessResult mode = run({"--memory-mode", "managed", "--socket", sock, "true"});
  EXPECT_EQ(mode.exit_code, 2);
  EXPECT_NE(mode.err.find("--memory-mode: managed is not one of"), std::string::npos) << mode.err;
  const ProcessResult priority = run({"--priority", "urgent", "--socket", sock, "true"});
  EXPECT_EQ(priority.exit_code, 2);
  EXPECT_NE(priority.err.find("--priority: urgent is not one of"), std::string::npos)
      << priority.err;
  const ProcessResult unknown = run({"--cores", "3", "true"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("unknown option --cores"), std::string::npos) << unknown.err;
  EXPECT_EQ(testing::listener_pid(sock), 0) << "a usage error started a scheduler";
  const ProcessResult help = run({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--memory-limit"), std::string::npos);
}

// A scheduler that knows no GPU refuses every client: nvshare-run says so, and will not run a
// command whose cap or class only the scheduler could enforce.
TEST_F(NvshareRunTest, NeverRunsSilentlyUnscheduled) {
  const std::string sock = socket();
  const EnvChanges no_gpu = {{"NVSHARE_GPUS", std::nullopt}};
  ProcessResult result = run({"--socket", sock, "--core-limit", "30", "--", "true"}, no_gpu);
  EXPECT_EQ(result.exit_code, 125) << result.err;
  EXPECT_NE(result.err.find("knows no GPU"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("--core-limit cannot be enforced"), std::string::npos) << result.err;
  result = run({"--socket", sock, "--priority", "low", "--", "true"}, no_gpu);
  EXPECT_EQ(result.exit_code, 125) << result.err;
  result = run({"--socket", sock, "--memory-limit", "1Gi", "--", "true"}, no_gpu);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("runs unscheduled (its --memory-limit still holds)"), std::string::npos)
      << result.err;
}

// A local scheduler started where it could see no GPU is started again, with the environment of
// the nvshare-run that finds it so, and keeps running once it knows one.
TEST_F(NvshareRunTest, RestartsALocalSchedulerThatKnowsNoGpu) {
  const std::string sock = socket();
  ProcessResult result = run({"--socket", sock, "--", "true"}, {{"NVSHARE_GPUS", std::nullopt}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const pid_t blind = testing::listener_pid(sock);
  ASSERT_GT(blind, 0);
  result = run({"--socket", sock, "--core-limit", "30", "--", "true"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("knows no GPU; starting it again"), std::string::npos) << result.err;
  const pid_t seeing = testing::listener_pid(sock);
  EXPECT_NE(seeing, blind);
  EXPECT_TRUE(process_ended(blind));
  result = run({"--socket", sock, "--", "true"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.err.find("starting it again"), std::string::npos) << result.err;
  EXPECT_EQ(testing::listener_pid(sock), seeing);
}

TEST_F(NvshareRunTest, StopsTheLocalSchedulerItStarted) {
  const std::string sock = socket();
  ProcessResult result = run({"--socket", sock, "--stop-scheduler"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("no scheduler runs on " + sock), std::string::npos) << result.err;
  ASSERT_EQ(run({"--socket", sock, "--", "true"}).exit_code, 0);
  const pid_t scheduler = testing::listener_pid(sock);
  ASSERT_GT(scheduler, 0);
  result = run({"--socket", sock, "--stop-scheduler"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("stopped nvshare-scheduler (pid " + std::to_string(scheduler) + ")"),
            std::string::npos)
      << result.err;
  EXPECT_TRUE(process_ended(scheduler));
  EXPECT_EQ(testing::listener_pid(sock), 0);
  EXPECT_EQ(run({"--socket", sock, "--stop-scheduler", "--", "true"}).exit_code, 2);
}

TEST_F(NvshareRunTest, TheGpuAndTheMemoryLimitAreChecked) {
  const std::string sock = socket();
  ProcessResult result = run({"--socket", sock, "--gpu", "7", "--", "true"});
  EXPECT_EQ(result.exit_code, 125) << result.err;
  EXPECT_NE(result.err.find("--gpu 7: this machine's scheduler knows 2 GPUs (indices 0..1)"),
            std::string::npos)
      << result.err;
  result = run({"--socket", sock, "--gpu", "GPU-0123", "--", "true"});
  EXPECT_EQ(result.exit_code, 125) << result.err;
  EXPECT_NE(result.err.find("is not one of this machine's GPUs (" + kGpu + ", " + kOtherGpu + ")"),
            std::string::npos)
      << result.err;
  EXPECT_EQ(run({"--socket", sock, "--gpu", "0", "--", "true"}).exit_code, 0);
  EXPECT_EQ(run({"--socket", sock, "--gpu", kGpu.substr(0, 12), "--", "true"}).exit_code, 0);
  result = run({"--socket", sock, "--memory-limit", "0", "--", "true"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("0 is not a limit"), std::string::npos) << result.err;
}

TEST_F(NvshareRunTest, ClearErrorsWhenTheLibraryOrTheSchedulerIsMissing) {
  const std::string sock = socket();
  ProcessResult result =
      run({"--socket", sock, "true"}, {{"NVSHARE_LIBRARY", dir_.file("nope.so")}});
  EXPECT_EQ(result.exit_code, 125);
  EXPECT_NE(result.err.find("NVSHARE_LIBRARY"), std::string::npos) << result.err;
  result = run({"--socket", sock, "true"}, {{"NVSHARE_SCHEDULER_BIN", dir_.file("nope")}});
  EXPECT_EQ(result.exit_code, 125);
  EXPECT_NE(result.err.find("NVSHARE_SCHEDULER_BIN"), std::string::npos) << result.err;
}

TEST_F(NvshareRunTest, FindsTheLibraryAndSchedulerNextToItself) {
  // An installed layout: bin/nvshare-run, bin/nvshare-scheduler, lib/libnvshare.so.
  std::filesystem::create_directories(dir_.file("prefix/bin"));
  std::filesystem::create_directories(dir_.file("prefix/lib"));
  std::filesystem::copy_file(NVSHARE_RUN_BIN, dir_.file("prefix/bin/nvshare-run"));
  std::filesystem::copy_file(NVSHARE_SCHEDULER_BIN, dir_.file("prefix/bin/nvshare-scheduler"));
  std::filesystem::copy_file(NVSHARE_TEST_PRELOAD, dir_.file("prefix/lib/libnvshare.so"));
  const std::string sock = socket();
  const ProcessResult result =
      testing::run_process({dir_.file("prefix/bin/nvshare-run"), "--socket", sock, "env"},
                           {{"NVSHARE_LIBRARY", std::nullopt},
                            {"NVSHARE_SCHEDULER_BIN", std::nullopt},
                            {"LD_PRELOAD", std::nullopt},
                            {"PATH", "/usr/bin:/bin"}},
                           20s);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("\nLD_PRELOAD=" + dir_.file("prefix/lib/libnvshare.so") + "\n"),
            std::string::npos)
      << result.out;
  const pid_t scheduler = testing::listener_pid(sock);
  ASSERT_GT(scheduler, 0);
  EXPECT_EQ(std::filesystem::read_symlink("/proc/" + std::to_string(scheduler) + "/exe").string(),
            dir_.file("prefix/bin/nvshare-scheduler"));
}

TEST_F(NvshareRunTest, ForwardsSigtermToTheCommand) {
  const std::string sock = socket();
  EnvChanges changes = env();
  const pid_t run_pid =
      testing::start_process({NVSHARE_RUN_BIN, "--socket", sock, "--", "sh", "-c",
                              "echo ready > " + dir_.file("ready") + "; exec sleep 30"},
                             changes, dir_.file("run.log"));
  ASSERT_TRUE(wait_until([&] { return std::filesystem::exists(dir_.file("ready")); }, 10000ms))
      << read_file(dir_.file("run.log"));
  ::kill(run_pid, SIGTERM);
  EXPECT_EQ(testing::wait_process(run_pid, 5000ms), 128 + SIGTERM)
      << read_file(dir_.file("run.log"));
}

}  // namespace
}  // namespace nvshare::client
