// The long versions of the chaos tests (`make soak MINUTES=N`, default 10; not part of ctest).
//
// First half: 10 x MINUTES scheduler crashes (SIGKILL, restarted at once) under load: trainers of
// a pod with a 1Gi limit come and go, each sampling cuMemGetInfo every 10 ms, each with the
// settings the device plugin gives the pod's containers (so one that starts while the scheduler is
// down keeps the limit too). Every trainer must finish its work, and no sample may show more than
// 1Gi. Second half: one scheduler's life under everything at once: the same churn, a hog that lies
// (2^60 bytes at 1 byte/s) and ignores revokes with the default knobs (a victim must be granted
// within the 30 s hog bound), floods of connections that never say hello from an unprivileged uid,
// and hellos naming invented GPUs. The scheduler's descriptors and resident memory are sampled
// every second; both must be flat: the last tenth of the samples no higher than the first tenth
// plus a small margin.
// Everything measured is printed on "[ SOAK ]" lines and written to $NVSHARE_SOAK_REPORT (JSON)
// when set.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "chaos_support.h"
#include "common/json.h"
#include "common/unix_socket.h"
#include "control/client.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "protocol_client.h"

namespace nvshare::chaos {
namespace {

using e2e::Env;
using e2e::monotonic_s;
using e2e::sleep_s;
using testing::ProtocolClient;
using namespace std::chrono_literals;

constexpr const char* kGpu = "GPU-00000000-0000-4000-8000-000000000000";
constexpr const char* kPod = "5d0a1c3e-9b7f-4e21-8c6d-0f2e4a6b8c1d";
constexpr double kGi = 1024.0 * 1024.0 * 1024.0;

double minutes() {
  const char* text = std::getenv("NVSHARE_SOAK_MINUTES");
  const double m = text != nullptr ? std::atof(text) : 10.0;
  return m > 0 ? m : 10.0;
}

struct Sample {
  double t;
  Footprint footprint;
};

class Soak {
 public:
  Soak() : state_(dir_.path() + "/fakecuda.state") {
    ::chmod(dir_.path().c_str(), 0755);  // attackers (nobody) reach the socket in it
  }

  Env gpu_env() const {
    return {{"LD_LIBRARY_PATH", e2e::programs().fakecuda_dir},
            {"NVSHARE_FAKECUDA_STATE", state_},
            {"NVSHARE_FAKECUDA_DEVICES", "1"},
            {"NVSHARE_FAKECUDA_MEMORY", "16Gi"}};
  }

  e2e::Scheduler& scheduler() { return *scheduler_; }

  void start_scheduler() {
    scheduler_ =
        std::make_unique<e2e::Scheduler>(dir_.path(), std::vector<std::string>{}, gpu_env());
    ASSERT_TRUE(scheduler_->start().ok());
    auto set = scheduler_->ctl({"set-limits", "--pod-uid", kPod, "--memory", "1Gi"});
    ASSERT_TRUE(set.ok() && set.value().exit_code == 0);
  }

  // The settings the device plugin gives the pod's containers (its 1Gi limit), which hold for a
  // process that starts while the scheduler is down.
  void write_container_settings() {
    settings_ = dir_.path() + "/container-settings";
    ASSERT_TRUE(write_settings(settings_, "enforce=1\nsocket=" + scheduler_->socket() +
                                              "\nregister-wait-ms=3000\nmemory-limit=1073741824\n")
                    .ok());
  }

  // A trainer of the pod: 256Mi, some seconds of 10 ms kernels, cuMemGetInfo every 10 ms.
  void start_trainer(const FakePod& pod) {
    e2e::SpawnOptions in_pod;
    in_pod.cgroup_procs = pod.procs();
    in_pod.settings_dir = settings_;
    const int kernels = 200 + static_cast<int>(random_() % 600);
    auto t = std::make_unique<e2e::Trainer>(
        e2e::TrainerOptions("t" + std::to_string(++trainers_started_),
                            {"--bytes", "256Mi", "--kernels", std::to_string(kernels),
                             "--kernel-us", "10000", "--meminfo-every-ms", "10"},
                            {}, true, in_pod),
        dir_.path());
    Env env = gpu_env();
    env["NVSHARE_SOCKET"] = scheduler_->socket();
    env["NVSHARE_LOG_LEVEL"] = "warn";
    ASSERT_TRUE(t->start(env).ok());
    running_.push_back(std::move(t));
  }

  // Checks the trainers that have finished; keeps the others.
  void collect() {
    for (auto it = running_.begin(); it != running_.end();) {
      if ((*it)->running()) {
        ++it;
        continue;
      }
      ++trainers_finished_;
      auto code = (*it)->wait(1);
      auto report = (*it)->report();
      const bool ok = code.ok() && code.value() == 0 && report.ok() &&
                      e2e::json_string(&report.value(), "result") == "ok";
      if (!ok) {
        ++application_errors_;
        ADD_FAILURE() << "a trainer failed: " << (*it)->describe();
      } else {
        meminfo_samples_ +=
            static_cast<long>(e2e::json_number(&report.value(), "meminfo_samples", 0));
        if (e2e::json_number(&report.value(), "meminfo_max_total", 0) > kGi) {
          ++limit_missing_;
          ADD_FAILURE() << "cuMemGetInfo showed more than the pod's 1Gi: " << (*it)->describe();
        }
      }
      it = running_.erase(it);
    }
  }

  // Keeps about `n` trainers running.
  void churn(const FakePod& pod, std::size_t n) {
    collect();
    while (running_.size() < n) start_trainer(pod);
  }

  void finish_trainers() {
    const double deadline = monotonic_s() + 180;
    while (!running_.empty() && monotonic_s() < deadline) {
      collect();
      sleep_s(0.1);
    }
    EXPECT_TRUE(running_.empty()) << running_.size() << " trainers did not finish";
  }

  e2e::TempDir dir_;
  std::string state_;
  std::string settings_;
  std::unique_ptr<e2e::Scheduler> scheduler_;
  std::vector<std::unique_ptr<e2e::Trainer>> running_;
  std::mt19937 random_{7};
  int trainers_started_ = 0;
  int trainers_finished_ = 0;
  int application_errors_ = 0;
  long meminfo_samples_ = 0;
  long limit_missing_ = 0;  // trainers that ever saw more than the limit
};

// A hog of the default knobs: lies, takes the grant, ignores revokes; returns once granted.
std::unique_ptr<Attacker> start_hog(const std::string& socket) {
  auto attacker = Attacker::start(kNobody, 1024, [socket](int report) {
    auto client = ProtocolClient::connect(socket);
    if (!client.ok() || !client.value().hello(testing::hello_for(kGpu)).ok()) return 1;
    const std::uint64_t lie = std::uint64_t{1} << 60;
    if (!client.value().send(protocol::Usage{lie, lie, 1}).ok()) return 2;
    if (!client.value().send(protocol::Request{}).ok()) return 3;
    if (!client.value().wait_for<protocol::Grant>(60000ms).ok()) return 4;
    report_line(report, "granted");
    for (;;) (void)client.value().next(1000ms);
  });
  return attacker.ok() ? std::move(attacker).value() : nullptr;
}

std::unique_ptr<Attacker> start_flood(const std::string& socket, int connections) {
  auto attacker =
      Attacker::start(kNobody, connections + 100, [socket, connections](int report) -> int {
        std::vector<UniqueFd> held;
        for (int i = 0; i < connections; ++i) {
          auto fd = connect_unix(socket);
          if (fd.ok()) held.push_back(std::move(fd).value());
        }
        report_line(report, std::to_string(held.size()));
        for (;;) ::pause();
      });
  return attacker.ok() ? std::move(attacker).value() : nullptr;
}

std::unique_ptr<Attacker> start_inventor(const std::string& socket, int hellos) {
  auto attacker = Attacker::start(kNobody, 1024, [socket, hellos](int report) {
    std::mt19937_64 random(static_cast<unsigned>(::getpid()));
    for (int i = 0; i < hellos; ++i) {
      auto client = ProtocolClient::connect(socket);
      if (!client.ok()) continue;
      char uuid[64];
      std::snprintf(uuid, sizeof uuid, "GPU-%016llx", static_cast<unsigned long long>(random()));
      (void)client.value().send(testing::hello_for(uuid));
      (void)client.value().closed_within(1000ms);
    }
    report_line(report, "done");
    return 0;
  });
  return attacker.ok() ? std::move(attacker).value() : nullptr;
}

TEST(Soak, RestartsHogsFloodsAndChurn) {
  if (::geteuid() != 0) GTEST_SKIP() << "the soak makes cgroups and runs attackers as nobody";
  const double total_s = minutes() * 60;
  const int restarts = static_cast<int>(10 * minutes());
  std::printf(
      "[ SOAK ] %.1f minutes: %d restarts, then one scheduler under hogs, floods and churn\n",
      minutes(), restarts);
  SettingsMountPoint mount_point;
  ASSERT_TRUE(mount_point.ok()) << "cannot make /etc/nvshare as a mount point";
  Soak soak;
  auto pod = FakePod::create(kPod);
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  ASSERT_NO_FATAL_FAILURE(soak.start_scheduler());
  ASSERT_NO_FATAL_FAILURE(soak.write_container_settings());

  // ---- first half: restarts under load
  const double half = total_s / 2;
  const double restart_every = half / restarts;
  const double phase1_end = monotonic_s() + half;
  int restarted = 0;
  double next_restart = monotonic_s() + restart_every / 2;
  while (monotonic_s() < phase1_end) {
    soak.churn(*pod.value(), 4);
    if (monotonic_s() >= next_restart && restarted < restarts) {
      soak.scheduler().kill_hard();
      ASSERT_TRUE(soak.scheduler().start().ok()) << soak.scheduler().log();
      ++restarted;
      next_restart += restart_every;
    }
    sleep_s(0.05);
  }
  soak.finish_trainers();
  std::printf(
      "[ SOAK ] restarts: %d; trainers finished: %d, application errors: %d; cuMemGetInfo "
      "samples: %ld; trainers that saw more than the pod's limit: %ld\n",
      restarted, soak.trainers_finished_, soak.application_errors_, soak.meminfo_samples_,
      soak.limit_missing_);
  EXPECT_EQ(restarted, restarts);

  // ---- second half: one scheduler's life under everything
  const int errors_before = soak.application_errors_;
  std::vector<Sample> samples;
  double worst_hog_wait = 0;
  int hogs = 0;
  int floods = 0;
  const double phase2_end = monotonic_s() + half;
  double next_sample = monotonic_s();
  double next_attack = monotonic_s() + 5;
  int attack = 0;
  // Keeps the churn going and samples the scheduler every second, whatever else is waited for.
  const auto pump = [&] {
    soak.churn(*pod.value(), 2);
    if (monotonic_s() >= next_sample) {
      samples.push_back({monotonic_s(), footprint(soak.scheduler().pid())});
      next_sample += 1;
    }
  };
  const auto pump_for = [&](double seconds) {
    const double until = monotonic_s() + seconds;
    while (monotonic_s() < until) {
      pump();
      sleep_s(0.05);
    }
  };
  const auto pump_until_report = [&](Attacker& attacker, double timeout_s) {
    const double until = monotonic_s() + timeout_s;
    while (monotonic_s() < until) {
      if (attacker.report(0.1).ok()) return true;
      pump();
    }
    return false;
  };
  while (monotonic_s() < phase2_end) {
    pump();
    if (monotonic_s() >= next_attack && monotonic_s() + 40 < phase2_end) {
      switch (attack++ % 3) {
        case 0: {  // a hog, and a victim waiting behind it
          auto hog = start_hog(soak.scheduler().socket());
          if (hog && pump_until_report(*hog, 60)) {
            auto victim = ProtocolClient::connect(soak.scheduler().socket());
            ASSERT_TRUE(victim.ok());
            ASSERT_TRUE(victim.value().hello(testing::hello_for(kGpu)).ok());
            const std::uint64_t gi = std::uint64_t{1} << 30;
            (void)victim.value().send(protocol::Usage{gi, gi, 0});
            (void)victim.value().send(protocol::Request{});
            const double asked = monotonic_s();
            std::atomic<bool> granted{false};
            std::atomic<bool> done{false};
            std::thread waiter([&] {
              granted = victim.value().wait_for<protocol::Grant>(60000ms).ok();
              done = true;
            });
            while (!done) {
              pump();
              sleep_s(0.05);
            }
            waiter.join();
            const double waited = monotonic_s() - asked;
            EXPECT_TRUE(granted) << "the victim was never granted";
            worst_hog_wait = std::max(worst_hog_wait, waited);
            ++hogs;
          }
          break;  // the hog dies with its Attacker here
        }
        case 1: {  // a flood that never says hello, held a few seconds
          auto flood = start_flood(soak.scheduler().socket(), 5000);
          if (flood) (void)pump_until_report(*flood, 60);
          pump_for(3);
          ++floods;
          break;
        }
        case 2: {  // invented GPUs
          auto inventor = start_inventor(soak.scheduler().socket(), 5000);
          if (inventor) (void)pump_until_report(*inventor, 120);
          break;
        }
      }
      next_attack = monotonic_s() + 5;
    }
    sleep_s(0.05);
  }
  soak.finish_trainers();
  // Quiet: the scheduler's last sample, with every attacker gone and the hello timeout passed.
  sleep_s(6);
  samples.push_back({monotonic_s(), footprint(soak.scheduler().pid())});

  ASSERT_GE(samples.size(), 20u);
  const std::size_t tenth = samples.size() / 10;
  const auto peak = [&](std::size_t from, std::size_t to, auto field) {
    std::size_t best = 0;
    for (std::size_t i = from; i < to; ++i) best = std::max(best, field(samples[i].footprint));
    return best;
  };
  const auto fds = [](const Footprint& f) { return f.fds; };
  const auto rss = [](const Footprint& f) { return f.rss_bytes; };
  const std::size_t fds_first = peak(0, tenth, fds);
  const std::size_t fds_last = peak(samples.size() - tenth, samples.size(), fds);
  const std::size_t rss_first = peak(0, tenth, rss);
  const std::size_t rss_last = peak(samples.size() - tenth, samples.size(), rss);
  const std::size_t fds_max = peak(0, samples.size(), fds);
  const std::size_t rss_max = peak(0, samples.size(), rss);
  std::printf(
      "[ SOAK ] one scheduler for %.0f s: %zu samples; descriptors first tenth %zu, last "
      "tenth %zu, max %zu, at rest %zu; RSS first tenth %.1f MB, last tenth %.1f MB, max "
      "%.1f MB, at rest %.1f MB\n",
      half, samples.size(), fds_first, fds_last, fds_max, samples.back().footprint.fds,
      rss_first / 1e6, rss_last / 1e6, rss_max / 1e6, samples.back().footprint.rss_bytes / 1e6);
  std::printf(
      "[ SOAK ] hogs: %d, worst wait behind one %.1f s (bound 30 s); floods: %d; "
      "application errors: %d; cuMemGetInfo samples %ld; trainers over the limit %ld\n",
      hogs, worst_hog_wait, floods, soak.application_errors_ - errors_before, soak.meminfo_samples_,
      soak.limit_missing_);
  EXPECT_LE(worst_hog_wait, 30.0 + 1.0);
  EXPECT_EQ(soak.application_errors_, 0);
  EXPECT_EQ(soak.limit_missing_, 0);
  // Flat: a flood may hold 256 sessions at the peak; afterwards all of them are gone again.
  EXPECT_LE(fds_last, fds_first + 300);
  EXPECT_LE(samples.back().footprint.fds, samples.front().footprint.fds + 8);
  EXPECT_LE(rss_last, rss_first + (std::size_t{16} << 20));

  if (const char* path = std::getenv("NVSHARE_SOAK_REPORT")) {
    Json report = Json::object();
    report.set("minutes", minutes());
    report.set("restarts", restarted);
    report.set("trainers", soak.trainers_finished_);
    report.set("application_errors", soak.application_errors_);
    report.set("meminfo_samples", soak.meminfo_samples_);
    report.set("meminfo_over_limit", soak.limit_missing_);
    report.set("hogs", hogs);
    report.set("worst_hog_wait_s", worst_hog_wait);
    report.set("floods", floods);
    report.set("fds_first_tenth", fds_first);
    report.set("fds_last_tenth", fds_last);
    report.set("fds_at_rest", samples.back().footprint.fds);
    report.set("rss_first_tenth_bytes", rss_first);
    report.set("rss_last_tenth_bytes", rss_last);
    report.set("rss_at_rest_bytes", samples.back().footprint.rss_bytes);
    std::ofstream(path) << report.dump_pretty() << "\n";
  }
}

}  // namespace
}  // namespace nvshare::chaos
