// End-to-end behaviour of nvshare on the simulated GPU: real nvshare-trainer processes under the
// real libnvshare.so (LD_PRELOAD), the real nvshare-scheduler and nvsharectl, the simulated driver
// (tests/fakecuda) in place of libcuda.so.1. Kernels take simulated time that is shared between
// contexts at 1/n (generalized processor sharing), so GPU time, turns and hand-offs are measured
// in wall-clock time the way they would be on a GPU.
//
// Each test names its measured numbers on lines starting with "[ MEASURE ]" (ctest -V shows them),
// and on failure prints every trainer's JSON and stderr, the scheduler's log and the simulated
// GPU's state.
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "harness.h"

namespace nvshare::e2e {
namespace {

constexpr double kMi = 1024.0 * 1024.0;
constexpr double kGi = 1024.0 * kMi;

#define ASSERT_OK(expr)                                            \
  do {                                                             \
    const auto& ok_ = (expr);                                      \
    ASSERT_TRUE(ok_.ok()) << #expr << ": " << ok_.error().message; \
  } while (0)

bool wait_until(const std::function<bool()>& predicate, double timeout_s, double poll_s = 0.02) {
  const double deadline = monotonic_s() + timeout_s;
  for (;;) {
    if (predicate()) return true;
    if (monotonic_s() > deadline) return false;
    sleep_s(poll_s);
  }
}

// The first device of nvshare-fakecuda-stat's output.
const Json* first_device(const Json& stat) {
  const Json* devices = stat.find("devices");
  if (devices == nullptr || devices->as_array() == nullptr || devices->as_array()->empty()) {
    return nullptr;
  }
  return &devices->as_array()->front();
}

// The context slot of `pid` in a device of nvshare-fakecuda-stat's output.
const Json* context_of(const Json* device, pid_t pid) {
  if (device == nullptr) return nullptr;
  const Json* contexts = device->find("contexts");
  if (contexts == nullptr || contexts->as_array() == nullptr) return nullptr;
  for (const Json& c : *contexts->as_array()) {
    if (c.find("pid") != nullptr && c.find("pid")->as_int64() == pid) return &c;
  }
  return nullptr;
}

// A client (status JSON) that holds the GPU with memory allocated. One that has freed its buffer on
// its way out occupies no memory any more: the scheduler may rightly let another run beside it.
bool holds_gpu_with_memory(const Json* client) {
  const std::string state = json_string(client, "state");
  return (state == "running" || state == "revoking") &&
         json_number(client, "allocated_bytes", 0) > 0;
}

class E2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed";
    state_ = dir_.path() + "/fakecuda.state";
    t0_ = monotonic_s();
  }

  // The scheduler's status; every change in what its clients are doing is added to the timeline
  // that a failing test prints.
  Result<Json> poll_status() {
    auto status = scheduler_->status();
    if (!status.ok()) return status;
    std::string summary;
    const Json* gpus = status.value().find("gpus");
    for (const Json& gpu : gpus && gpus->as_array() ? *gpus->as_array() : Json::Array{}) {
      const Json* clients = gpu.find("clients");
      for (const Json& c : clients && clients->as_array() ? *clients->as_array() : Json::Array{}) {
        const std::string state = json_string(&c, "state");
        char entry[160];
        std::snprintf(entry, sizeof entry,
                      " | client %.0f (pid %.0f) %s%s%s epoch %.0f alloc %.0fMi",
                      json_number(&c, "id"), json_number(&c, "pid"), state.c_str(),
                      state == "waiting" ? ":" : "",
                      state == "waiting" ? json_string(&c, "waiting_for").c_str() : "",
                      json_number(&c, "epoch"), json_number(&c, "allocated_bytes", 0) / kMi);
        summary += entry;
      }
    }
    if (summary != last_summary_) {
      char when[32];
      std::snprintf(when, sizeof when, "%+8.3f s", monotonic_s() - t0_);
      timeline_ += std::string(when) + (summary.empty() ? " | no clients" : summary) + "\n";
      last_summary_ = summary;
    }
    return status;
  }

  void TearDown() override {
    for (auto& t : trainers_) {
      if (t->running()) t->kill(SIGKILL);
    }
    if (!HasFailure()) return;
    std::string out = "\n===== e2e failure context (" + dir_.path() + ") =====\n";
    for (const auto& t : trainers_) out += t->describe() + "\n";
    if (!timeline_.empty()) out += "--- scheduler status changes seen by the test:\n" + timeline_;
    if (scheduler_) out += "--- scheduler log:\n" + tail(scheduler_->log(), 150) + "\n";
    auto stat = fake_stat();
    out += "--- nvshare-fakecuda-stat: " + (stat.ok() ? stat.value().dump() : stat.error().message);
    std::fprintf(stderr, "%s\n", out.c_str());
  }

  void start_scheduler(std::vector<std::string> flags) {
    scheduler_ = std::make_unique<Scheduler>(dir_.path(), std::move(flags), gpu_env());
    ASSERT_OK(scheduler_->start());
  }

  // The simulated GPUs of the node (devices_ of 16Gi, this test's own state file), for the trainers
  // and for the scheduler's NVML.
  Env gpu_env() const {
    return {{"LD_LIBRARY_PATH", programs().fakecuda_dir},
            {"NVSHARE_FAKECUDA_STATE", state_},
            {"NVSHARE_FAKECUDA_DEVICES", std::to_string(devices_)},
            {"NVSHARE_FAKECUDA_MEMORY", "16Gi"}};
  }

  // The environment every trainer gets: the simulated GPU and this test's scheduler.
  Env trainer_env() const {
    Env env = gpu_env();
    env["NVSHARE_LOG_LEVEL"] = client_log_level();
    if (scheduler_) env["NVSHARE_SOCKET"] = scheduler_->socket();
    for (const auto& [name, value] : extra_env_) env[name] = value;
    return env;
  }

  static std::string client_log_level() {
    const char* level = std::getenv("NVSHARE_E2E_CLIENT_LOG_LEVEL");
    return level != nullptr ? level : "info";
  }

  Trainer& add_trainer(TrainerOptions options) {
    trainers_.push_back(std::make_unique<Trainer>(std::move(options), dir_.path()));
    return *trainers_.back();
  }

  // Starts a trainer; a failure to spawn fails the test (check with HasFatalFailure()).
  Trainer& start_trainer(TrainerOptions options) {
    Trainer& t = add_trainer(std::move(options));
    Status started = t.start(trainer_env());
    EXPECT_TRUE(started.ok()) << (started.ok() ? "" : started.error().message);
    return t;
  }

  // Starts trainer `name` with one allocation of `bytes` that runs a few kernels, then idles with
  // its memory parked on the device until the file `done` exists; the test fails when it is never
  // seen idle with all of it parked.
  Trainer& start_parked(const std::string& name, const std::string& bytes, double parked,
                        const Env& env, const std::string& done) {
    Trainer& t = start_trainer(
        {name,
         {"--bytes", bytes, "--kernels", "5", "--kernel-us", "2000", "--ipc-wait", done},
         env});
    const bool seen = !HasFailure() && wait_until(
                                           [&] {
                                             auto status = poll_status();
                                             if (!status.ok()) return false;
                                             const Json* c = find_client(status.value(), t.pid());
                                             return json_string(c, "state") == "idle" &&
                                                    json_number(c, "parked_bytes", 0) >= parked;
                                           },
                                           20);
    EXPECT_TRUE(seen) << name << " never idled with its memory parked on the device\n"
                      << t.describe();
    return t;
  }

  // Until `runner` ends: the device memory `parked` has (the simulated GPU's count, 0 without a
  // context) each time `runner` is seen holding the GPU with memory allocated.
  std::vector<double> memory_beside(const Trainer& parked, Trainer& runner) {
    std::vector<double> samples;
    while (runner.running()) {
      auto status = poll_status();
      auto stat = fake_stat();
      if (status.ok() && stat.ok() &&
          holds_gpu_with_memory(find_client(status.value(), runner.pid()))) {
        const Json* slot = context_of(first_device(stat.value()), parked.pid());
        samples.push_back(slot != nullptr ? json_number(slot, "allocated") : 0);
      }
      sleep_s(0.01);
    }
    return samples;
  }

  // Waits for a trainer and returns its report; the test fails when it did not finish with
  // result "ok".
  Json finish(Trainer& t, double timeout_s = 60) {
    auto code = t.wait(timeout_s);
    EXPECT_TRUE(code.ok()) << t.name() << ": " << (code.ok() ? "" : code.error().message);
    auto report = t.report();
    EXPECT_TRUE(report.ok()) << (report.ok() ? "" : report.error().message);
    if (!report.ok()) return Json();
    EXPECT_EQ(json_string(&report.value(), "result"), "ok")
        << "trainer " << t.name() << ": " << report.value().dump();
    if (code.ok()) EXPECT_EQ(code.value(), 0) << "trainer " << t.name();
    return report.value();
  }

  // A trainer capped at 30% that runs 2 iterations of `per_iteration` kernels of `kernel_us` each
  // (with `extra` options), synchronizing once per iteration: its share of the GPU's time.
  double deep_queue_share_at_thirty_percent(const std::string& name, long per_iteration,
                                            long kernel_us, std::vector<std::string> extra) {
    const long iterations = 2;
    std::vector<std::string> argv = {"--kernels",          std::to_string(iterations),
                                     "--kernel-us",        std::to_string(kernel_us),
                                     "--kernels-per-iter", std::to_string(per_iteration)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    Trainer& t = start_trainer({name, argv, {{"NVSHARE_CORE_LIMIT", "30"}}});
    if (HasFailure()) return 0;
    Json report = finish(t);
    if (HasFailure()) return 0;
    const double wall = json_number(&report, "wall_s");
    const double gpu_s = static_cast<double>(iterations * per_iteration * kernel_us) / 1e6;
    measure("wall time", wall, "s");
    measure("GPU share (K x D / wall_s)", 100.0 * gpu_s / wall, "%");
    return 100.0 * gpu_s / wall;
  }

  Result<Json> fake_stat() const {
    auto out = run_command({programs().stat, "--state", state_}, dir_.path());
    if (!out.ok()) return out.error();
    if (out.value().exit_code != 0) return make_error("nvshare-fakecuda-stat: " + out.value().err);
    return parse_json(out.value().out);
  }

  TempDir dir_;
  std::string state_;
  int devices_ = 1;
  double t0_ = 0;
  std::string timeline_;
  std::string last_summary_;
  Env extra_env_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Trainer>> trainers_;
};

// Two trainers whose memory fits together on the GPU (2Gi + 2Gi of 16Gi) are granted at once and
// share the GPU: each sees the simulated GPU at 1/2 speed, so each takes about twice its work
// (K x D = 2 s), and the scheduler shows both running at the same time, neither waiting.
TEST_F(E2eTest, TwoThatFitRunTogether) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  const std::vector<std::string> args = {
      "--bytes",     "2Gi",   "--kernels",  "100",
      "--kernel-us", "20000", "--progress", "--first-kernel-timestamp"};
  const double work_s = 100 * 0.020;
  Trainer& a = start_trainer({"A", args});
  Trainer& b = start_trainer({"B", args});
  ASSERT_FALSE(HasFailure());

  bool both_running = false;
  std::string table;  // nvsharectl status, as a person would see it, once both run
  double max_waited_ms = 0;
  while (a.running() || b.running()) {
    auto status = poll_status();
    if (status.ok()) {
      const Json* ca = find_client(status.value(), a.pid());
      const Json* cb = find_client(status.value(), b.pid());
      if (json_string(ca, "state") == "running" && json_string(cb, "state") == "running") {
        both_running = true;
        if (table.empty()) {
          auto out = scheduler_->ctl({"status"});
          if (out.ok()) table = out.value().out;
        }
      }
      max_waited_ms = std::max(
          {max_waited_ms, json_number(ca, "waited_ms", 0), json_number(cb, "waited_ms", 0)});
    }
    sleep_s(0.05);
  }
  Json ra = finish(a);
  Json rb = finish(b);
  ASSERT_FALSE(HasFailure());

  EXPECT_TRUE(both_running) << "nvsharectl status never showed both trainers running at once";
  // The same seen through nvsharectl's table: two client rows (they start with the client id) in
  // state running.
  std::size_t running_rows = 0;
  std::istringstream rows(table);
  for (std::string row; std::getline(rows, row);) {
    const std::size_t first = row.find_first_not_of(' ');
    if (first != std::string::npos && std::isdigit(static_cast<unsigned char>(row[first])) &&
        row.find(" running ") != std::string::npos) {
      ++running_rows;
    }
  }
  EXPECT_EQ(running_rows, 2u) << "nvsharectl status:\n" << table;
  EXPECT_LT(max_waited_ms, 100) << "a trainer that fits waited for the GPU";
  for (const Json* r : {&ra, &rb}) {
    const double ratio = json_number(r, "wall_s") / work_s;
    measure("wall / work (" + std::string(r == &ra ? "A" : "B") + ")", ratio, "x");
    // Strict 1/n sharing gives 2x; taking turns would give one of them about 1x.
    EXPECT_GT(ratio, 1.6) << "the trainers did not share the GPU at once";
    EXPECT_LT(ratio, 2.5) << "sharing cost more than the two trainers' work";
  }
  // Their kernels ran concurrently for most of the time.
  const double overlap = overlap_s(intervals(a.progress(), 0), intervals(b.progress(), 1));
  measure("kernel time overlapping", overlap, "s");
  measure("max waited_ms", max_waited_ms, "ms");
  EXPECT_GT(overlap, 0.7 * 2 * work_s);
}

// Two trainers that fit together but each keep a deep queue (150 kernels of 20 ms queued per
// iteration, one synchronize at the end) report that pace, and the default mode has them take turns
// instead of time-slicing: once both are saturating, status seldom shows both running, and both
// finish their work.
TEST_F(E2eTest, TwoSaturatingThatFitTakeTurns) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  const std::vector<std::string> args = {"--bytes",     "2Gi",   "--kernels",          "1",
                                         "--kernel-us", "20000", "--kernels-per-iter", "150"};
  Trainer& a = start_trainer({"A", args});
  Trainer& b = start_trainer({"B", args});
  ASSERT_FALSE(HasFailure());

  int samples = 0;
  int together = 0;
  double deepest = 0;
  while (a.running() || b.running()) {
    auto status = poll_status();
    if (status.ok()) {
      const Json* ca = find_client(status.value(), a.pid());
      const Json* cb = find_client(status.value(), b.pid());
      const Json* sa = ca != nullptr ? ca->find("saturating") : nullptr;
      const Json* sb = cb != nullptr ? cb->find("saturating") : nullptr;
      if (sa != nullptr && sb != nullptr && sa->as_bool().value_or(false) &&
          sb->as_bool().value_or(false)) {
        ++samples;
        together += json_string(ca, "state") == "running" && json_string(cb, "state") == "running";
        deepest = std::max({deepest, json_number(ca, "deep_queue_percent", 0),
                            json_number(cb, "deep_queue_percent", 0)});
      }
    }
    sleep_s(0.05);
  }
  finish(a);
  finish(b);
  ASSERT_FALSE(HasFailure());
  measure("status samples with both saturating", samples, "");
  measure("of those, both running", together, "");
  measure("deepest reported queue", deepest, "%");
  ASSERT_GE(samples, 20) << "the trainers were never both reported saturating";
  EXPECT_GE(deepest, 50);
  EXPECT_LE(together, samples / 10) << "saturating trainers kept running together";
}

// Two trainers that do not fit together (6Gi each under a virtual capacity of 8Gi, of which 90% is
// usable, on a 16Gi simulated GPU) take turns of 1 s: at most one holds the GPU at any time, and
// each hand-off swaps the leaving trainer's memory to the host and the next one's back in bulk
// (the simulated driver counts the bytes moved by prefetches, and demand faults separately).
TEST_F(E2eTest, TwoThatDoNotFitTakeTurnsAndSwap) {
  // The unified mode: the simulated GPU's migrations are accounting only, while device-backed
  // memory is copied byte for byte (a 6 GiB swap would cost real host memory and seconds).
  // SmallDeviceBackedTrainersTakeTurnsAndSwap covers the device-backed mode.
  extra_env_["NVSHARE_MEMORY_MODE"] = "unified";
  // 48Gi/s makes one 6Gi swap 125 ms of simulated copy time, so several turns fit in the test.
  extra_env_["NVSHARE_FAKECUDA_SWAP_BW"] = "48Gi";
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--capacity", "8Gi", "--quantum", "1"}));
  const std::vector<std::string> args = {"--bytes",     "6Gi",   "--kernels", "100",
                                         "--kernel-us", "20000", "--progress"};
  const double start = monotonic_s();
  Trainer& a = start_trainer({"A", args});
  Trainer& b = start_trainer({"B", args});
  ASSERT_FALSE(HasFailure());

  int max_holding = 0;
  bool saw_memory_wait = false;
  // Residency in the middle of a turn, once: the runner's buffer on the device, the buffer of the
  // waiter (which has run before, so it was swapped out) on the host.
  Json runner_slot;
  Json waiter_slot;
  while (a.running() || b.running()) {
    auto status = poll_status();
    if (status.ok()) {
      int holding = 0;
      const Json* runner = nullptr;
      const Json* waiter = nullptr;
      for (const Trainer* t : {&a, &b}) {
        const Json* c = find_client(status.value(), t->pid());
        const std::string state = json_string(c, "state");
        if (holds_gpu_with_memory(c)) ++holding;
        if (state == "running" && json_number(c, "state_for_ms") >= 300) runner = c;
        if (state == "waiting" && json_string(c, "waiting_for") == "memory") {
          saw_memory_wait = true;
          if (json_number(c, "epoch") > 0) waiter = c;
        }
      }
      max_holding = std::max(max_holding, holding);
      if (runner != nullptr && waiter != nullptr && runner_slot.is_null()) {
        const auto runner_pid = static_cast<pid_t>(json_number(runner, "pid"));
        const double runner_epoch = json_number(runner, "epoch");
        auto stat = fake_stat();
        // Only a sample taken while the same turn still runs: the runner may have released (at
        // a pause, a swap notice shortens its idle release) and been swapped out meanwhile.
        auto after = poll_status();
        const Json* still = after.ok() ? find_client(after.value(), runner_pid) : nullptr;
        const bool same_turn = still != nullptr && json_string(still, "state") == "running" &&
                               json_number(still, "epoch") == runner_epoch;
        if (stat.ok() && same_turn) {
          const Json* device = first_device(stat.value());
          const Json* rs = context_of(device, runner_pid);
          const Json* ws = context_of(device, static_cast<pid_t>(json_number(waiter, "pid")));
          if (rs != nullptr && ws != nullptr) {
            runner_slot = *rs;
            waiter_slot = *ws;
          }
        }
      }
    }
    sleep_s(0.02);
  }
  Json ra = finish(a);
  Json rb = finish(b);
  const double elapsed = monotonic_s() - start;
  ASSERT_FALSE(HasFailure());

  EXPECT_EQ(max_holding, 1)
      << "two trainers that do not fit held the GPU at once with their memory";
  EXPECT_TRUE(saw_memory_wait) << "status never showed a trainer waiting for memory";

  // Turns: order all kernels by launch and count the switches between trainers.
  std::vector<Interval> ka = intervals(a.progress(), 0);
  std::vector<Interval> kb = intervals(b.progress(), 1);
  std::vector<Interval> all = ka;
  all.insert(all.end(), kb.begin(), kb.end());
  std::sort(all.begin(), all.end(),
            [](const Interval& x, const Interval& y) { return x.begin < y.begin; });
  int switches = 0;
  for (std::size_t i = 1; i < all.size(); ++i) switches += all[i].owner != all[i - 1].owner;
  const double overlap = overlap_s(ka, kb);
  measure("turn switches", switches, "");
  measure("kernel time overlapping", overlap, "s");
  measure("elapsed for 2 x 2 s of work", elapsed, "s");
  // 2 s of work each in 1 s turns: A, B, A, B at least (the first turn may be shorter).
  EXPECT_GE(switches, 2) << "the trainers did not take turns";
  EXPECT_LT(overlap, 0.05) << "kernels of trainers that do not fit ran at the same time";

  auto stat = fake_stat();
  ASSERT_OK(stat);
  const Json* device = first_device(stat.value());
  ASSERT_NE(device, nullptr);
  const double to_host = json_number(device, "migrated_to_host");
  const double to_device = json_number(device, "migrated_to_device");
  const double faulted = json_number(device, "faulted_in");
  measure("bytes swapped to host", to_host / kGi, "GiB");
  measure("bytes moved to device", to_device / kGi, "GiB");
  measure("bytes demand-faulted", faulted / kGi, "GiB");
  EXPECT_GE(to_host, 6 * kGi) << "no trainer's memory was swapped out at a hand-off";
  EXPECT_GE(to_device, to_host) << "swapped-out memory was not brought back in bulk";
  EXPECT_EQ(faulted, 0) << "memory came back by demand faults instead of a bulk prefetch";

  ASSERT_FALSE(runner_slot.is_null()) << "never saw a turn with the other trainer swapped out";
  measure("mid-turn: runner's managed memory on the device",
          json_number(&runner_slot, "managed_resident") / kGi, "GiB");
  measure("mid-turn: waiter's managed memory on the host",
          json_number(&waiter_slot, "managed_host") / kGi, "GiB");
  EXPECT_EQ(json_number(&runner_slot, "managed_resident"), 6 * kGi) << runner_slot.dump();
  EXPECT_EQ(json_number(&runner_slot, "managed_host"), 0) << runner_slot.dump();
  EXPECT_EQ(json_number(&waiter_slot, "managed_host"), 6 * kGi) << waiter_slot.dump();
  EXPECT_EQ(json_number(&waiter_slot, "managed_resident"), 0) << waiter_slot.dump();
}

// A memory limit of 1Gi: cuMemGetInfo reports total = 1Gi; allocating all that it calls free
// succeeds, one byte more fails with CUDA_ERROR_OUT_OF_MEMORY, and so does a single byte after that
// (the trainer's --probe-free tries free + 1, then free, then 1 more byte). Besides the trainer's
// own 256Mi the library charges the CUDA context's footprint to the limit (measured with NVML: none
// on the simulated GPU, about 0.5Gi on a real one; 512Mi assumed without NVML), so
// free = limit - 256Mi - context, with context at most 512Mi.
class MemoryLimitTest : public E2eTest {
 protected:
  void run_probe(Env env) {
    Trainer& t =
        start_trainer({"limited",
                       {"--bytes", "256Mi", "--report-meminfo", "--probe-free", "--kernels", "2"},
                       std::move(env)});
    Json report = finish(t, 30);
    ASSERT_FALSE(HasFailure());
    const double limit = 1 * kGi;
    const double allocated = 256 * kMi;
    const Json* probe = report.find("probe");
    ASSERT_NE(probe, nullptr) << report.dump();
    const double free = json_number(probe, "free");
    const double context = limit - allocated - free;
    measure("cuMemGetInfo total", json_number(probe, "total") / kMi, "MiB");
    measure("cuMemGetInfo free (after 256Mi allocated)", free / kMi, "MiB");
    measure("charged besides the allocation (context)", context / kMi, "MiB");
    EXPECT_EQ(json_number(probe, "total"), limit);
    EXPECT_GT(free, 0) << "nothing can be allocated under the limit";
    EXPECT_GE(context, 0) << "free is more than the limit leaves";
    EXPECT_LE(context, 512 * kMi) << "more than a context's footprint is charged";
    EXPECT_EQ(json_string(probe, "over_by_one"), "CUDA_ERROR_OUT_OF_MEMORY");
    EXPECT_EQ(json_string(probe, "exact"), "CUDA_SUCCESS");
    EXPECT_EQ(json_number(probe, "free_after"), 0);
    EXPECT_EQ(json_string(probe, "one_more"), "CUDA_ERROR_OUT_OF_MEMORY");
    EXPECT_EQ(json_number(&report, "mem_total"), limit);
    EXPECT_EQ(json_number(&report, "mem_free"), free);
  }
};

// The device-backed mode (the default) under turns: two trainers of 128 MiB under a 192Mi virtual
// capacity take turns; a trainer waiting after its turn holds no device memory (its buffer was
// copied to the host and the physical memory released), and both finish with correct results.
// Each turn that ends with a swap-out is announced first (a swap notice, in the hand-off trace),
// and the trainer makes its host copies on the strength of it, before the revoke.
TEST_F(E2eTest, SmallDeviceBackedTrainersTakeTurnsAndSwap) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--capacity", "192Mi", "--quantum", "0.5"}));
  const std::vector<std::string> args = {"--bytes",     "128Mi", "--kernels", "60",
                                         "--kernel-us", "20000", "--progress"};
  const std::string trace = dir_.path() + "/handoff.jsonl";
  const Env env = {{"NVSHARE_TRACE_FILE", trace}, {"NVSHARE_LOG_LEVEL", "debug"}};
  Trainer& a = start_trainer({"A", args, env});
  Trainer& b = start_trainer({"B", args, env});
  ASSERT_FALSE(HasFailure());
  bool saw_swapped_out = false;
  int max_holding = 0;
  while (a.running() || b.running()) {
    auto status = poll_status();
    auto stat = fake_stat();
    if (status.ok() && stat.ok()) {
      int holding = 0;
      for (const Trainer* t : {&a, &b}) {
        const Json* c = find_client(status.value(), t->pid());
        const std::string state = json_string(c, "state");
        if (holds_gpu_with_memory(c)) ++holding;
        const Json* slot = context_of(first_device(stat.value()), t->pid());
        if (state == "waiting" && json_number(c, "epoch") > 0 && slot != nullptr &&
            json_number(slot, "allocated") == 0) {
          saw_swapped_out = true;
        }
      }
      max_holding = std::max(max_holding, holding);
    }
    sleep_s(0.02);
  }
  finish(a);  // checks its result
  finish(b);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(max_holding, 1) << "two trainers that do not fit held the GPU at once";
  EXPECT_TRUE(saw_swapped_out) << "never saw a waiting trainer with its device memory released";
  std::vector<Interval> ka = intervals(a.progress(), 0);
  std::vector<Interval> kb = intervals(b.progress(), 1);
  EXPECT_LT(overlap_s(ka, kb), 0.05) << "kernels of trainers that do not fit ran at the same time";
  // Per trainer: the epochs announced, and those whose release swapped out after a notice.
  // A trainer whose memory was first moved out by an eviction (allocated before its first grant,
  // beside the other's) has its host copies from then on: only the others prepare them ahead.
  std::map<pid_t, int> announced_swaps;
  std::map<pid_t, int> swaps;
  std::map<pid_t, bool> evicted_first;
  for (Trainer* t : {&a, &b}) {
    const Result<std::vector<Json>> events = trace_events(trace, t->pid());
    ASSERT_TRUE(events.ok()) << (events.ok() ? "" : events.error().message);
    std::set<double> noticed;
    for (const Json& e : events.value()) {
      const std::string what = json_string(&e, "event");
      if (what == "swap-notice") noticed.insert(json_number(&e, "epoch"));
      if (what == "evicted" && swaps[t->pid()] == 0) evicted_first[t->pid()] = true;
      if (what == "release" && json_number(&e, "swap_bytes", 0) > 0) {
        ++swaps[t->pid()];
        announced_swaps[t->pid()] += noticed.count(json_number(&e, "epoch")) > 0 ? 1 : 0;
      }
    }
  }
  int prepared = 0;
  for (Trainer* t : {&a, &b}) {
    const pid_t pid = t->pid();
    EXPECT_GE(swaps[pid], 1) << t->name() << " never swapped out";
    // The first grant may end before the other trainer asks: every later swap-out was announced.
    EXPECT_GE(announced_swaps[pid], swaps[pid] - 1) << t->name();
    const bool made =
        t->stderr_text().find("prepared for the announced swap-out") != std::string::npos;
    prepared += made ? 1 : 0;
    if (!evicted_first[pid])
      EXPECT_TRUE(made) << t->name() << " made no host copies ahead of a swap-out";
  }
  EXPECT_GE(prepared, 1) << "no trainer made host copies ahead of an announced swap-out";
}

// Partial swap-outs (protocol version 10): two trainers of two 96 MiB allocations each under a
// 384Mi virtual capacity (345.6Mi usable) take turns. A hand-off needs 38.4Mi of room, so the
// leaver is asked for that much and moves one allocation (the library moves whole ones), keeping
// the other on the simulated GPU while it waits; an eviction (the second trainer allocates before
// its first grant) moves one the same way. Both finish ok, every swap-out moved 96Mi and none all
// 192Mi, and a waiting trainer was seen with 96Mi on the device. B starts once A has allocated:
// a process's context is charged what the GPU's used memory grew by while it was made, so an
// allocation of the other trainer's at that moment would be charged to it as well.
TEST_F(E2eTest, TurnsMoveOnlyThePartThatDoesNotFit) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--capacity", "384Mi", "--quantum", "0.5"}));
  const std::vector<std::string> args = {"--bytes",     "96Mi",      "--spare-bytes",
                                         "96Mi",        "--kernels", "60",
                                         "--kernel-us", "20000",     "--progress"};
  const std::string trace = dir_.path() + "/handoff.jsonl";
  const Env env = {{"NVSHARE_TRACE_FILE", trace}};
  Trainer& a = start_trainer({"A", args, env});
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(wait_until(
      [&] {
        auto status = poll_status();
        return status.ok() && json_number(find_client(status.value(), a.pid()), "allocated_bytes",
                                          0) >= 192.0 * kMi;
      },
      20))
      << a.describe();
  Trainer& b = start_trainer({"B", args, env});
  ASSERT_FALSE(HasFailure());
  const double range = 96.0 * 1024 * 1024;
  bool saw_part_kept = false;
  while (a.running() || b.running()) {
    auto status = poll_status();
    auto stat = fake_stat();
    if (status.ok() && stat.ok()) {
      for (const Trainer* t : {&a, &b}) {
        const Json* c = find_client(status.value(), t->pid());
        const Json* slot = context_of(first_device(stat.value()), t->pid());
        if (json_string(c, "state") == "waiting" && json_number(c, "epoch") > 0 &&
            slot != nullptr && json_number(slot, "allocated") == range) {
          saw_part_kept = true;
        }
      }
    }
    sleep_s(0.02);
  }
  finish(a);  // checks its result
  finish(b);
  ASSERT_FALSE(HasFailure());
  int swaps = 0;
  for (const Trainer* t : {&a, &b}) {
    const Result<std::vector<Json>> events = trace_events(trace, t->pid());
    ASSERT_TRUE(events.ok()) << (events.ok() ? "" : events.error().message);
    for (const Json& e : events.value()) {
      const std::string what = json_string(&e, "event");
      const double bytes = json_number(&e, "swap_bytes", 0);
      if ((what != "release" && what != "evicted") || bytes <= 0) continue;
      ++swaps;
      EXPECT_EQ(bytes, range) << t->name() << " " << what << " at " << json_number(&e, "t");
    }
  }
  measure("swap-outs (each one allocation of two)", swaps, "");
  EXPECT_GE(swaps, 2) << "the trainers never took turns";
  EXPECT_TRUE(saw_part_kept) << "never saw a waiting trainer keep one allocation on the device";
}

// Memory a process keeps on the GPU while it holds no grant counts for the others, and is evicted
// when the next one to run needs the room: trainer A runs its kernels, then idles with its 128Mi
// device-backed allocation still on the device; B (128Mi) does not fit beside it in 192Mi (90%
// usable), so A is asked to move its memory to the host, and B runs only once it has.
TEST_F(E2eTest, AnIdleProcessesMemoryIsEvictedForTheNextToRun) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--capacity", "192Mi"}));
  const std::string trace = dir_.path() + "/handoff.jsonl";
  const std::string done = dir_.path() + "/a.done";
  const Env env = {{"NVSHARE_TRACE_FILE", trace}};
  Trainer& a = start_parked("A", "128Mi", 128 * kMi, env, done);
  ASSERT_FALSE(HasFailure());
  Trainer& b = start_trainer(
      {"B", {"--bytes", "128Mi", "--kernels", "20", "--kernel-us", "10000", "--progress"}, env});
  ASSERT_FALSE(HasFailure());
  const std::vector<double> a_beside_b = memory_beside(a, b);
  std::ofstream(done) << "done\n";
  finish(a);  // checks its result
  finish(b);
  ASSERT_FALSE(HasFailure());
  EXPECT_FALSE(a_beside_b.empty()) << "B was never seen holding the GPU";
  for (double bytes : a_beside_b) {
    EXPECT_EQ(bytes, 0) << "B ran while A's memory was still on the device";
  }
  EXPECT_GE(swapped_bytes(trace, a.pid(), "evicted"), 128 * kMi)
      << "A's trace shows no eviction that moved its memory";
}

// A large allocation is backed in pieces, so an eviction moves only the pieces the next job needs
// room for: A idles with one 512Mi allocation (four pieces of 128Mi) on the device; B (256Mi)
// needs 77Mi more than the 691Mi usable of 768Mi, so A moves one piece and keeps 384Mi beside B.
TEST_F(E2eTest, AnEvictionMovesOnlyThePiecesTheNextJobNeeds) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--capacity", "768Mi"}));
  const std::string trace = dir_.path() + "/handoff.jsonl";
  const std::string done = dir_.path() + "/a.done";
  const Env env = {{"NVSHARE_TRACE_FILE", trace}};
  Trainer& a = start_parked("A", "512Mi", 512 * kMi, env, done);
  ASSERT_FALSE(HasFailure());
  Trainer& b = start_trainer(
      {"B", {"--bytes", "256Mi", "--kernels", "20", "--kernel-us", "10000", "--progress"}, env});
  ASSERT_FALSE(HasFailure());
  const std::vector<double> a_beside_b = memory_beside(a, b);
  std::ofstream(done) << "done\n";
  finish(a);  // checks its result
  finish(b);
  ASSERT_FALSE(HasFailure());
  EXPECT_FALSE(a_beside_b.empty()) << "B was never seen holding the GPU";
  for (double bytes : a_beside_b) {
    EXPECT_EQ(bytes, 384.0 * kMi) << "A's memory on the device while B ran";
  }
  EXPECT_EQ(swapped_bytes(trace, a.pid(), "evicted"), 128.0 * kMi)
      << "A's eviction should move one piece";
}

// CUDA IPC of device-backed memory between two processes of one user (off Kubernetes): the
// importer maps what the exporter allocated (it reads the exporter's bytes, the exporter sees what
// it wrote, at both ends of an allocation backed in three pieces), under a memory limit smaller
// than the shared allocation (shared memory is the exporter's, counted once), and the scheduler
// knows the exporter's shared bytes are pinned.
TEST_F(E2eTest, IpcSharesDeviceBackedMemoryCountedOnce) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  const std::string handle = dir_.path() + "/ipc.handle";
  const std::string done = dir_.path() + "/ipc.done";
  Trainer& exporter = start_trainer({"exporter",
                                     {"--bytes", "320Mi", "--kernels", "1", "--ipc-export", handle,
                                      "--ipc-wait", done, "--ipc-bytes", "320Mi"}});
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(wait_until([&] { return !read_file(handle).empty(); }, 20)) << exporter.describe();
  bool pinned = wait_until(
      [&] {
        auto status = poll_status();
        if (!status.ok()) return false;
        const Json* c = find_client(status.value(), exporter.pid());
        return json_number(c, "pinned_bytes", 0) == 320 * kMi;
      },
      5);
  EXPECT_TRUE(pinned) << "the exporter's shared allocation never showed as pinned";
  Trainer& importer = start_trainer(
      {"importer",
       {"--kernels", "0", "--ipc-import", handle, "--ipc-done", done, "--ipc-bytes", "320Mi"},
       {{"NVSHARE_MEMORY_LIMIT", "32Mi"}}});
  Json ri = finish(importer);
  Json re = finish(exporter);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(json_string(&re, "ipc_export"), "CUDA_SUCCESS");
  ASSERT_NE(re.find("ipc_capable"), nullptr);
  EXPECT_EQ(re.find("ipc_capable")->dump(), "true") << "the attribute must say IPC works";
  EXPECT_EQ(json_string(&ri, "ipc_read"), "5a") << "the importer did not see the exporter's bytes";
  EXPECT_EQ(json_string(&re, "ipc_seen"), "a5") << "the exporter did not see the importer's bytes";
  EXPECT_EQ(json_string(&ri, "ipc_read_last"), "5a") << "the last piece did not map";
  EXPECT_EQ(json_string(&re, "ipc_seen_last"), "a5") << "the last piece did not map";
}

// A trainer whose --ipc-import was refused: it exits 1 and reports cuIpcOpenMemHandle's
// CUDA_ERROR_INVALID_HANDLE.
void expect_open_refused(Trainer& t) {
  auto code = t.wait(30);
  ASSERT_TRUE(code.ok()) << t.describe();
  EXPECT_EQ(code.value(), 1) << t.describe();
  auto report = t.report();
  ASSERT_TRUE(report.ok()) << t.describe();
  EXPECT_EQ(json_string(&report.value(), "error"), "CUDA_ERROR_INVALID_HANDLE: cuIpcOpenMemHandle")
      << t.describe();
}

// CUDA IPC stays within a pod: with the pods the processes declare (a scheduler that trusts
// clients, as off Kubernetes with --trust-client-limits), a process of another pod that opens the
// exporter's handle gets CUDA_ERROR_INVALID_HANDLE and maps nothing, as for a handle nobody
// exported, and a process of the exporter's own pod opens the same handle afterwards.
TEST_F(E2eTest, IpcIsRefusedToAnotherPod) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  const std::string pod = "7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d";
  const std::string other_pod = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
  const std::string handle = dir_.path() + "/ipc.handle";
  const std::string done = dir_.path() + "/ipc.done";
  Trainer& exporter = start_trainer({"exporter",
                                     {"--bytes", "128Mi", "--kernels", "1", "--ipc-export", handle,
                                      "--ipc-wait", done, "--ipc-bytes", "128Mi"},
                                     {{"NVSHARE_POD_UID", pod}}});
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(wait_until([&] { return !read_file(handle).empty(); }, 20)) << exporter.describe();
  Trainer& stranger = start_trainer(
      {"stranger", {"--kernels", "0", "--ipc-import", handle}, {{"NVSHARE_POD_UID", other_pod}}});
  ASSERT_FALSE(HasFailure());
  expect_open_refused(stranger);
  Trainer& neighbour = start_trainer(
      {"neighbour",
       {"--kernels", "0", "--ipc-import", handle, "--ipc-done", done, "--ipc-bytes", "128Mi"},
       {{"NVSHARE_POD_UID", pod}}});
  Json rn = finish(neighbour);
  Json re = finish(exporter);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(json_string(&rn, "ipc_read"), "5a") << "the same pod could not open the handle";
  EXPECT_EQ(json_string(&re, "ipc_seen"), "a5");
}

// The 16 hex digits of `value` as a handle stores it (little endian).
std::string le_hex(std::uint64_t value) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 8; ++i, value >>= 8) {
    out += kHex[(value >> 4) & 15];
    out += kHex[value & 15];
  }
  return out;
}

// A handle of a pieced export that was tampered with is refused with CUDA_ERROR_INVALID_HANDLE
// and a warning that says why, whether it names more pieces than the library makes (a piece size of
// 64Mi for 320Mi) or sizes the scheduler's exports do not have (384Mi of three pieces); nothing
// maps, and the genuine handle still opens in full afterwards.
TEST_F(E2eTest, ATamperedHandleOfAPiecedExportIsRefused) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  const std::string handle = dir_.path() + "/ipc.handle";
  const std::string done = dir_.path() + "/ipc.done";
  Trainer& exporter = start_trainer({"exporter",
                                     {"--bytes", "320Mi", "--kernels", "1", "--ipc-export", handle,
                                      "--ipc-wait", done, "--ipc-bytes", "320Mi"}});
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(wait_until([&] { return !read_file(handle).empty(); }, 20)) << exporter.describe();
  const std::string genuine = read_file(handle);
  ASSERT_EQ(genuine.substr(0, 16), "6e76736849504332") << "not the pieced form (nvshIPC2)";
  // Fields: the size at byte 8, the offset at 16, the piece size at 24 (hex: twice that).
  std::string more_pieces = genuine;
  more_pieces.replace(48, 16, le_hex(64 * kMi));
  std::string other_sizes = genuine;
  other_sizes.replace(16, 16, le_hex(384 * kMi));
  int n = 0;
  for (const std::string& forged : {more_pieces, other_sizes}) {
    const std::string path = dir_.path() + "/forged" + std::to_string(n);
    std::ofstream(path) << forged;
    Trainer& t = start_trainer(
        {"forged" + std::to_string(n++), {"--kernels", "0", "--ipc-import", path}, {}});
    ASSERT_FALSE(HasFailure());
    expect_open_refused(t);
  }
  for (const auto& [forged, why] :
       {std::pair{0, "a malformed handle"}, std::pair{1, "the handle says 128Mi"}}) {
    const Trainer& t = **(trainers_.end() - 2 + forged);
    EXPECT_NE(t.stderr_text().find(why), std::string::npos)
        << "it did not say why: " << t.describe();
  }
  Trainer& importer = start_trainer(
      {"importer",
       {"--kernels", "0", "--ipc-import", handle, "--ipc-done", done, "--ipc-bytes", "320Mi"}});
  Json ri = finish(importer);
  Json re = finish(exporter);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(json_string(&ri, "ipc_read_last"), "5a");
  EXPECT_EQ(json_string(&re, "ipc_seen_last"), "a5");
}

// An allocation another process maps is never swapped: the exporter (64Mi shared, 64Mi of its own)
// and a 96Mi job do not fit together in 192Mi, but do once the exporter's own 64Mi move out, so
// they take turns and the exporter swaps out only its own memory: while it waits, the shared 64Mi
// stay on the device. A job that could not fit beside the shared memory at all would wait for it
// instead (tests/unit/policy/pinned_test.cc).
TEST_F(E2eTest, AnIpcSharedAllocationIsNeverSwappedWhileMapped) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--capacity", "192Mi", "--quantum", "0.3"}));
  const std::string handle = dir_.path() + "/ipc.handle";
  const std::string done = dir_.path() + "/ipc.done";
  Trainer& exporter =
      start_trainer({"exporter",
                     {"--bytes", "64Mi", "--spare-bytes", "64Mi", "--kernels", "40", "--kernel-us",
                      "20000", "--progress", "--ipc-export", handle, "--ipc-wait", done}});
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(wait_until([&] { return !read_file(handle).empty(); }, 20)) << exporter.describe();
  Trainer& importer =
      start_trainer({"importer", {"--kernels", "0", "--ipc-import", handle, "--ipc-done", done}});
  Trainer& other = start_trainer(
      {"other", {"--bytes", "96Mi", "--kernels", "30", "--kernel-us", "20000", "--progress"}});
  ASSERT_FALSE(HasFailure());
  // The exporter's device memory while it waits after a turn and the other job runs, sampled
  // between `from` and `to`. Only then has it moved what it will: a holder that went idle for a
  // moment releases without a swap-out and is evicted before the other job starts.
  struct Sample {
    double from = 0;
    double to = 0;
    double allocated = 0;
  };
  std::vector<Sample> waiting_samples;
  while (exporter.running() || other.running()) {
    auto status = poll_status();
    const double from = monotonic_s();
    auto stat = fake_stat();
    const double to = monotonic_s();
    auto after = poll_status();
    if (status.ok() && stat.ok() && after.ok()) {
      const Json* before_c = find_client(status.value(), exporter.pid());
      const Json* after_c = find_client(after.value(), exporter.pid());
      const Json* slot = context_of(first_device(stat.value()), exporter.pid());
      const bool other_ran =
          json_string(find_client(status.value(), other.pid()), "state") == "running" &&
          json_string(find_client(after.value(), other.pid()), "state") == "running";
      // Waiting, after a turn, on both sides of the sample, the other job running: its memory was
      // as swapped as it gets.
      if (slot != nullptr && other_ran && json_string(before_c, "state") == "waiting" &&
          json_string(after_c, "state") == "waiting" && json_number(before_c, "epoch") > 0 &&
          json_number(before_c, "epoch") == json_number(after_c, "epoch")) {
        waiting_samples.push_back({from, to, json_number(slot, "allocated")});
      }
    }
    sleep_s(0.01);
  }
  Json ri = finish(importer);
  Json re = finish(exporter);
  Json ro = finish(other);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(json_string(&ri, "ipc_read"), "5a");
  EXPECT_EQ(json_string(&re, "ipc_seen"), "a5");
  ASSERT_FALSE(waiting_samples.empty())
      << "never saw the exporter wait after a turn while the other job ran";
  for (const Sample& sample : waiting_samples) {
    EXPECT_GE(sample.allocated, 64 * kMi) << "the shared allocation left the device";
    EXPECT_LT(sample.allocated, 128 * kMi) << "the exporter's own memory stayed on the device";
  }
  std::vector<Interval> ke = intervals(exporter.progress(), 0);
  std::vector<Interval> ko = intervals(other.progress(), 1);
  EXPECT_LT(overlap_s(ke, ko), 0.05) << "kernels of jobs that do not fit ran at the same time";
}

// The memory mode comes from the scheduler where the process does not choose one: the scheduler's
// default, overridden for a pod by set-limits (as its nvshare.com/gpu-memory-mode annotation does),
// while a process that sets NVSHARE_MEMORY_MODE keeps its own.
TEST_F(E2eTest, MemoryModeFromTheSchedulerThePodAndTheProcess) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits", "--memory-mode", "unified"}));
  const std::string pod = "e2e00000-0000-4000-8000-00000000000a";
  auto set = scheduler_->ctl({"set-limits", "--pod-uid", pod, "--memory-mode", "device"});
  ASSERT_OK(set);
  ASSERT_EQ(set.value().exit_code, 0) << set.value().out << set.value().err;
  auto bad = scheduler_->ctl({"set-limits", "--pod-uid", pod, "--memory-mode", "paged"});
  ASSERT_OK(bad);
  EXPECT_NE(bad.value().exit_code, 0) << "an unknown memory mode was accepted";
  const std::vector<std::string> args = {"--bytes", "64Mi", "--kernels", "1"};
  Trainer& by_default = start_trainer({"scheduler-default", args});
  Trainer& in_pod = start_trainer({"pod", args, {{"NVSHARE_POD_UID", pod}}});
  Trainer& own = start_trainer({"own", args, {{"NVSHARE_MEMORY_MODE", "device"}}});
  Json rd = finish(by_default);
  Json rp = finish(in_pod);
  Json ro = finish(own);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(rd.find("buffer_managed")->dump(), "true") << "the scheduler's default (unified)";
  EXPECT_EQ(rp.find("buffer_managed")->dump(), "false") << "the pod's mode (device)";
  EXPECT_EQ(ro.find("buffer_managed")->dump(), "false") << "the process's own mode (device)";
}

// Step times from --progress lines (done_s - launch_s), sorted.
std::vector<double> step_times(const std::vector<Json>& progress) {
  std::vector<double> out;
  for (const Interval& i : intervals(progress, 0)) out.push_back(i.end - i.begin);
  std::sort(out.begin(), out.end());
  return out;
}

double median_of(const std::vector<double>& sorted) {
  return sorted.empty() ? 0 : sorted[sorted.size() / 2];
}

// Priority classes from pod records (the way the plugin's annotation arrives): a `high` service
// (steps of 120 kernels of 1 ms, synchronized, then 120 ms idle) beside a `low` trainer of 250 us
// kernels that never idles. The simulated GPU shares itself equally among the contexts with work,
// as time-slicing does, so running beside the trainer would double the service's step (about
// 240 ms); with the classes the trainer only drains beside it (its bound is 2 ms of work, about
// 5 ms time-sliced beside the service: well within a tenth of the service's step, free of the
// interference budget), and the trainer runs in the service's idle time.
TEST_F(E2eTest, AHighServiceKeepsItsStepTimeBesideALowTrainer) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  const std::string high_pod = "e2e00000-0000-4000-8000-0000000000a1";
  const std::string low_pod = "e2e00000-0000-4000-8000-0000000000a2";
  for (const auto& [pod, word] : {std::pair{high_pod, "high"}, std::pair{low_pod, "low"}}) {
    auto set = scheduler_->ctl({"set-limits", "--pod-uid", pod, "--priority", word});
    ASSERT_OK(set);
    ASSERT_EQ(set.value().exit_code, 0) << set.value().out << set.value().err;
  }
  auto bad = scheduler_->ctl({"set-limits", "--pod-uid", high_pod, "--priority", "urgent"});
  ASSERT_OK(bad);
  EXPECT_NE(bad.value().exit_code, 0) << "an unknown class was accepted";
  const std::vector<std::string> service = {
      "--bytes",     "64Mi", "--kernels",  "10",     "--kernels-per-iter", "120",
      "--kernel-us", "1000", "--sleep-us", "120000", "--progress"};
  Trainer& alone = start_trainer({"service alone", service, {{"NVSHARE_POD_UID", high_pod}}});
  finish(alone);
  const std::vector<double> steps_alone = step_times(alone.progress());

  Trainer& low = start_trainer({"low trainer",
                                {"--bytes", "64Mi", "--kernels", "400", "--kernels-per-iter", "40",
                                 "--kernel-us", "250", "--progress"},
                                {{"NVSHARE_POD_UID", low_pod}}});
  for (int i = 0; i < 200 && low.progress().size() < 5; ++i) sleep_s(0.02);
  Trainer& high = start_trainer({"service", service, {{"NVSHARE_POD_UID", high_pod}}});
  std::string table;
  while (high.running()) {
    if (table.empty() && high.progress().size() > 3) {
      auto out = scheduler_->ctl({"status"});
      if (out.ok()) table = out.value().out;
    }
    sleep_s(0.05);
  }
  finish(high);
  finish(low);
  ASSERT_FALSE(HasFailure());

  const std::vector<double> steps = step_times(high.progress());
  ASSERT_FALSE(steps.empty());
  ASSERT_FALSE(steps_alone.empty());
  measure("service step alone, median", 1e3 * median_of(steps_alone), "ms");
  measure("service step beside the low trainer, median", 1e3 * median_of(steps), "ms");
  // The hand-over costs the low trainer's drain (at most its 2 ms bound and the kernel it runs)
  // and a few round trips; sharing the GPU would cost the whole step again (120 ms).
  EXPECT_LT(median_of(steps), median_of(steps_alone) + 0.005)
      << "the high service's steps slowed down beside the low trainer";
  // The low trainer used the service's idle time.
  const std::vector<Json> service_progress = high.progress();
  const Interval window{json_number(&service_progress.front(), "launch_s"),
                        json_number(&service_progress.back(), "done_s"), 0};
  double low_busy = 0;  // GPU time of the trainer's iterations done within the window
  for (const Json& p : low.progress()) {
    const double done = json_number(&p, "done_s");
    if (done > window.begin && done <= window.end) low_busy += 40 * 250e-6;
  }
  const double span = window.end - window.begin;
  measure("low trainer's share of the service's run", 100 * low_busy / span, "%");
  EXPECT_GT(low_busy, 0.2 * span) << "the low trainer did not run in the service's idle time";
  EXPECT_NE(table.find("high"), std::string::npos) << "status shows no class:\n" << table;
  EXPECT_NE(table.find("low"), std::string::npos) << "status shows no class:\n" << table;
}

// A `low` trainer whose kernels (20 ms) are much longer than a `high` service's idle moments (5 ms
// steps, 5 ms idle): each kernel it starts in a gap runs on beside the service's next steps, so the
// scheduler charges its drains to the interference budget and holds it back once the budget is
// spent. Most of the service's steps see no trainer at all; the trainer still runs now and then.
TEST_F(E2eTest, ALowTrainerOfLongKernelsIsHeldToTheInterferenceBudget) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  const std::string high_pod = "e2e00000-0000-4000-8000-0000000000b1";
  const std::string low_pod = "e2e00000-0000-4000-8000-0000000000b2";
  for (const auto& [pod, word] : {std::pair{high_pod, "high"}, std::pair{low_pod, "low"}}) {
    auto set = scheduler_->ctl({"set-limits", "--pod-uid", pod, "--priority", word});
    ASSERT_OK(set);
    ASSERT_EQ(set.value().exit_code, 0) << set.value().out << set.value().err;
  }
  const std::vector<std::string> service = {
      "--bytes",     "64Mi", "--kernels",  "200",  "--kernels-per-iter", "5",
      "--kernel-us", "1000", "--sleep-us", "5000", "--progress"};
  Trainer& alone = start_trainer({"service alone", service, {{"NVSHARE_POD_UID", high_pod}}});
  finish(alone);
  const std::vector<double> steps_alone = step_times(alone.progress());

  Trainer& low =
      start_trainer({"low trainer",
                     {"--bytes", "64Mi", "--kernels", "100", "--kernel-us", "20000", "--progress"},
                     {{"NVSHARE_POD_UID", low_pod}}});
  for (int i = 0; i < 200 && low.progress().size() < 3; ++i) sleep_s(0.02);
  const std::size_t low_before = low.progress().size();
  Trainer& high = start_trainer({"service", service, {{"NVSHARE_POD_UID", high_pod}}});
  finish(high);
  const std::size_t low_during = low.progress().size() - low_before;
  finish(low);
  ASSERT_FALSE(HasFailure());

  const std::vector<double> steps = step_times(high.progress());
  ASSERT_FALSE(steps.empty());
  ASSERT_FALSE(steps_alone.empty());
  const auto at = [](const std::vector<double>& sorted, double q) {
    return sorted[std::min(sorted.size() - 1, static_cast<std::size_t>(q * sorted.size()))];
  };
  measure("service step alone, p50", 1e3 * median_of(steps_alone), "ms");
  measure("service step beside the trainer, p50", 1e3 * median_of(steps), "ms");
  measure("service step beside the trainer, p90", 1e3 * at(steps, 0.9), "ms");
  measure("trainer kernels finished while the service ran", static_cast<double>(low_during), "");
  // Each kernel the trainer runs beside the service slows a few of its steps (the simulated GPU
  // shares itself between the two); without the budget every step would be (about 2 s of
  // trainer kernels started in the service's gaps over its 2 s).
  EXPECT_LT(at(steps, 0.9), at(steps_alone, 0.9) + 0.002)
      << "the trainer's kernels slowed more than a tenth of the service's steps";
  EXPECT_LT(low_during, 40u) << "the trainer was not held back";
}

// The class a process declares (NVSHARE_PRIORITY, what nvshare-run --priority sets) is its own in
// local mode; a scheduler that does not trust clients ignores it. The declaration travels with the
// usage reports (the hello cannot carry it), so the process is `normal` from its registration until
// its first report: the test watches the whole run.
TEST_F(E2eTest, ADeclaredClassCountsOnlyInLocalMode) {
  for (const bool trusted : {true, false}) {
    ASSERT_NO_FATAL_FAILURE(start_scheduler(
        trusted ? std::vector<std::string>{"--trust-client-limits"} : std::vector<std::string>{}));
    Trainer& t = start_trainer({trusted ? "trusted" : "untrusted",
                                {"--bytes", "64Mi", "--kernels", "40", "--kernel-us", "20000"},
                                {{"NVSHARE_PRIORITY", "low"}}});
    std::set<std::string> seen;
    while (t.running()) {
      auto status = poll_status();
      if (status.ok()) {
        const std::string word = json_string(find_client(status.value(), t.pid()), "priority");
        if (!word.empty()) seen.insert(word);
      }
      sleep_s(0.02);
    }
    finish(t);
    const std::string which = trusted ? "local mode" : "cluster mode";
    EXPECT_EQ(seen.count("low"), trusted ? 1u : 0u) << which;
    if (!trusted) EXPECT_EQ(seen.count("normal"), 1u) << which;
  }
}

// The limit the process declares (NVSHARE_MEMORY_LIMIT; honoured in local mode).
TEST_F(MemoryLimitTest, ExactDeclared) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  run_probe({{"NVSHARE_MEMORY_LIMIT", "1Gi"}});
}

// The same limit pushed through the control API for the pod before the process starts, as the
// device plugin does at admission.
TEST_F(MemoryLimitTest, ExactFromControlApi) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  auto set = scheduler_->ctl(
      {"set-limits", "--pod-uid", "e2e00000-0000-4000-8000-000000000001", "--memory", "1Gi"});
  ASSERT_OK(set);
  ASSERT_EQ(set.value().exit_code, 0) << set.value().out << set.value().err;
  run_probe({{"NVSHARE_POD_UID", "e2e00000-0000-4000-8000-000000000001"}});
}

// The pod's limit, pushed through the control API before the processes start, holds from each
// process's very first allocation: the first CUDA call on the GPU waits (bounded) until the
// scheduler has welcomed the process and its limits frame is applied, instead of letting the
// allocations of the first milliseconds see only the (absent) declared limit. Trainers whose very
// first allocation is over the limit all fail with CUDA_ERROR_OUT_OF_MEMORY; one under it runs.
TEST_F(MemoryLimitTest, PodLimitHoldsFromTheFirstAllocation) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  auto set = scheduler_->ctl(
      {"set-limits", "--pod-uid", "e2e00000-0000-4000-8000-000000000002", "--memory", "256Mi"});
  ASSERT_OK(set);
  ASSERT_EQ(set.value().exit_code, 0) << set.value().out << set.value().err;
  const Env pod = {{"NVSHARE_POD_UID", "e2e00000-0000-4000-8000-000000000002"}};
  std::vector<Trainer*> over;
  for (int i = 0; i < 6; ++i) {
    over.push_back(
        &start_trainer({"over-" + std::to_string(i), {"--bytes", "512Mi", "--kernels", "1"}, pod}));
  }
  Trainer& under = start_trainer({"under", {"--bytes", "128Mi", "--kernels", "1"}, pod});
  ASSERT_FALSE(HasFailure());
  for (Trainer* t : over) {
    auto code = t->wait(30);
    ASSERT_OK(code);
    EXPECT_EQ(code.value(), 1) << t->describe();
    auto report = t->report();
    ASSERT_OK(report);
    EXPECT_EQ(json_string(&report.value(), "error"), "CUDA_ERROR_OUT_OF_MEMORY: cuMemAlloc")
        << "the first allocation got past the pod's 256Mi limit: " << t->describe();
  }
  finish(under, 30);
}

// `nvsharectl set-limits --pid P --memory 2Gi` while the trainer runs (512Mi allocated, no limit
// before): its cuMemGetInfo, sampled every 10 ms by a thread of the trainer, reports total = 2Gi
// within 1 s of the call (measured from just before nvsharectl starts to the first sample showing
// it) with free = 2Gi - what it used before; an allocation of 1600Mi after that, which fits the
// GPU but not the new limit, fails with CUDA_ERROR_OUT_OF_MEMORY.
TEST_F(E2eTest, SetLimitsTakesEffectWithinOneSecond) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  Trainer& t = start_trainer(
      {"T",
       {"--bytes", "512Mi", "--kernels", "150", "--kernel-us", "20000", "--meminfo-every-ms", "10",
        "--alloc-after-ms", "2000", "--alloc-bytes", "1600Mi", "--progress"}});
  ASSERT_FALSE(HasFailure());
  // Registered with the scheduler and running kernels.
  ASSERT_TRUE(wait_until(
      [&] {
        auto status = poll_status();
        return status.ok() &&
               json_string(find_client(status.value(), t.pid()), "state") == "running" &&
               t.progress().size() >= 5;
      },
      10))
      << "the trainer never showed up running in the scheduler's status";

  const double limit = 2 * kGi;
  const double before = monotonic_s();
  auto set = scheduler_->ctl({"set-limits", "--pid", std::to_string(t.pid()), "--memory", "2Gi"});
  const double after = monotonic_s();
  ASSERT_OK(set);
  ASSERT_EQ(set.value().exit_code, 0) << set.value().out << set.value().err;
  Json report = finish(t);
  ASSERT_FALSE(HasFailure());

  const Json* changes = report.find("meminfo_changes");
  ASSERT_TRUE(changes != nullptr && changes->as_array() != nullptr) << report.dump();
  double seen_at = -1;
  double free_then = -1;
  double used_before = -1;
  for (const Json& sample : *changes->as_array()) {
    const double t_sample = json_number(&sample, "t");
    const double total = json_number(&sample, "total");
    if (t_sample < before) {
      EXPECT_NE(total, limit) << "the limit was in force before it was set";
      used_before = total - json_number(&sample, "free");
    } else if (total == limit && seen_at < 0) {
      seen_at = t_sample;
      free_then = json_number(&sample, "free");
    }
  }
  ASSERT_GE(seen_at, 0) << "cuMemGetInfo never reported the new 2Gi limit: " << report.dump();
  measure("set-limits call (nvsharectl round trip)", (after - before) * 1000, "ms");
  measure("limit-change latency (call to cuMemGetInfo total = 2Gi)", (seen_at - before) * 1000,
          "ms");
  EXPECT_LT(seen_at - before, 1.0) << "the new limit reached the process after more than 1 s";
  EXPECT_EQ(free_then, limit - used_before) << "used before the change: " << used_before;

  const Json* late = report.find("late_alloc");
  ASSERT_NE(late, nullptr) << report.dump();
  EXPECT_GT(json_number(late, "t"), seen_at) << "the late allocation ran before the limit changed";
  EXPECT_EQ(json_string(late, "result"), "CUDA_ERROR_OUT_OF_MEMORY")
      << "512Mi allocated + 1600Mi more must not fit under a 2Gi limit";
}

// A compute-bound trainer alone under a 30% cap (NVSHARE_CORE_LIMIT=30, honoured in local mode)
// for about 20 s of wall time. A cap is a share of the GPU's time: the scheduler bills the time a
// client holds a grant, and the library lets kernels run only while it does. So, from three sides:
// the scheduler billed 30% +- 2 of the time the client was connected; the client's own hand-off
// trace shows it held 30% +- 2 from its first grant to its last; its kernels ran inside those
// grants and filled them (the gate opens and closes with the grant). And the trainer got no more
// than 32% of the wall time as kernel time (K x D / wall_s). Its kernel time can fall short of what
// it held by the host's own cost: on the simulated GPU under the sanitizers a 10 ms kernel
// completes 1-10% late, more on a busy host (a 30% cap measured 27.1% as K x D / wall_s with 29.99%
// billed on one). On a GPU, bench/gpu's caps scenario measures the share of native throughput.
TEST_F(E2eTest, CoreCapThirtyPercent) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  const long kernels = 600;
  const double kernel_s = 0.010;
  const std::string trace = dir_.path() + "/handoff.jsonl";
  Trainer& t =
      start_trainer({"capped",
                     {"--kernels", std::to_string(kernels), "--kernel-us", "10000", "--progress"},
                     {{"NVSHARE_CORE_LIMIT", "30"}, {"NVSHARE_TRACE_FILE", trace}}});
  ASSERT_FALSE(HasFailure());
  Json last_client;
  while (t.running()) {
    auto status = poll_status();
    if (status.ok()) {
      if (const Json* c = find_client(status.value(), t.pid())) last_client = *c;
    }
    sleep_s(0.25);
  }
  Json report = finish(t);
  ASSERT_FALSE(HasFailure());
  ASSERT_FALSE(last_client.is_null()) << "the capped trainer never showed in status";

  const double billed =
      100.0 * json_number(&last_client, "held_ms") / json_number(&last_client, "connected_ms");
  const double kernel_share =
      100.0 * static_cast<double>(kernels) * kernel_s / json_number(&report, "wall_s");
  measure("scheduler: billed held_ms / connected_ms", billed, "%");
  measure("kernel time / wall time (K x D / wall_s)", kernel_share, "%");
  EXPECT_EQ(json_number(&last_client, "core_limit_percent"), 30) << last_client.dump();
  EXPECT_NEAR(billed, 30.0, 2.0) << last_client.dump();
  expect_cap_held(cap_use(trace, t), 30, "a 30% cap");
  EXPECT_LE(kernel_share, 32.0) << "a 30% cap gave " << kernel_share << "% of the GPU's time";
}

// The same cap for a process that queues deep and synchronizes rarely: each of 2 iterations queues
// 30 kernels of 100 ms (3 s of GPU work) and synchronizes once at its end. The library bounds what
// may be queued by the GPU time it will take (the drain bound), so a revoke is honoured within the
// bound and the cap holds as for a trainer that synchronizes after every kernel.
TEST_F(E2eTest, CoreCapThirtyPercentHoldsForADeepQueue) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  const double share = deep_queue_share_at_thirty_percent("deep", 30, 100000, {});
  ASSERT_FALSE(HasFailure());
  EXPECT_NEAR(share, 30.0, 2.0) << "a 30% cap on a deep queue gave " << share << "%";
}

// The same for CUDA-graph replays: after 400 short warm-up kernels (0.2 ms) have taught the library
// that a submission is short, each of 2 iterations queues 30 replays of a graph of ten 10 ms
// kernels (3 s of GPU work) and synchronizes once. Replays are bounded by their own learnt length,
// so the cap holds (bounded by the per-submission time alone, the replays queued freely and the
// cap did not hold).
TEST_F(E2eTest, CoreCapThirtyPercentHoldsForDeepGraphReplays) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  const double share = deep_queue_share_at_thirty_percent(
      "graphs", 300, 10000,
      {"--graph-kernels", "10", "--warmup-kernels", "400", "--warmup-us", "200"});
  ASSERT_FALSE(HasFailure());
  EXPECT_NEAR(share, 30.0, 2.0) << "a 30% cap on deep graph replays gave " << share << "%";
}

// Caps are entitlements beside an uncapped job: 20% and 45% trainers and an uncapped one, started
// together on one simulated GPU (which time-slices equally among the contexts that have work, as a
// GPU does). Each trainer's GPU time is that of the kernels it completed in a common window, from
// 3 s after the start until the first of them ends. Of the GPU time the three got, each has its
// entitlement: 20%, 45% and the rest, 35%, each within 2 points (without entitlements the 45% job
// got an equal third when all three ran together); and together they kept a kernel in flight at
// least 85% of the window (one at a time, each hand-over costs the GPU a moment: 98% under the
// sanitizers on a quiet host, where K x D over the window gave 96.5%; a busy host had shrunk every
// share by 2.6-2.9 points as K x D, from simulated kernels completing late). Caps are enforced by
// time-division, in turns of up to the 5 s quantum, so the window is about 45 s: a 20 s one holds
// too few turns for 2 points (42.4% for the 45% job once, under the sanitizers).
TEST_F(E2eTest, CapsAreEntitlementsBesideAnUncappedJob) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  const double kernel_s = 0.010;
  const struct {
    const char* name;
    int cap;
    long kernels;  // about 48 s at the expected share
  } jobs[] = {{"cap20", 20, 960}, {"cap45", 45, 2160}, {"uncapped", 100, 1680}};
  std::vector<Trainer*> trainers;
  for (const auto& job : jobs) {
    Env env;
    if (job.cap < 100) env["NVSHARE_CORE_LIMIT"] = std::to_string(job.cap);
    trainers.push_back(&start_trainer(
        {job.name,
         {"--kernels", std::to_string(job.kernels), "--kernel-us", "10000", "--progress"},
         env}));
  }
  ASSERT_FALSE(HasFailure());
  std::vector<Json> reports;
  for (Trainer* t : trainers) {
    reports.push_back(finish(*t, 180));
    if (HasFailure()) return;
  }
  // The window: 3 s after the last start, until the first trainer's last kernel completed.
  double begin = 0;
  double end = 1e300;
  for (Trainer* t : trainers) {
    const std::vector<Json> progress = t->progress();
    ASSERT_FALSE(progress.empty()) << t->name();
    begin = std::max(begin, json_number(&progress.front(), "launch_s") + 3.0);
    end = std::min(end, json_number(&progress.back(), "done_s"));
  }
  ASSERT_GT(end - begin, 10.0) << "the trainers overlapped for too short a time";
  const double expected[] = {20, 45, 35};
  double shares[3] = {0, 0, 0};
  double busy = 0;
  for (std::size_t i = 0; i < trainers.size(); ++i) {
    long done = 0;
    for (const Json& p : trainers[i]->progress()) {
      const double at = json_number(&p, "done_s");
      done += at > begin && at <= end ? 1 : 0;
    }
    shares[i] = 100.0 * static_cast<double>(done) * kernel_s / (end - begin);
    measure(std::string(jobs[i].name) + ": share over " + std::to_string(end - begin) + " s",
            shares[i], "%");
    busy += shares[i];
  }
  // Busy: some trainer had a kernel in flight. A simulated kernel that completes late (the host's
  // cost, more under the sanitizers) keeps its trainer's turn busy; a hand-over does not.
  std::vector<Interval> all;
  for (std::size_t i = 0; i < trainers.size(); ++i) {
    const std::vector<Interval> ran = intervals(trainers[i]->progress(), static_cast<int>(i));
    all.insert(all.end(), ran.begin(), ran.end());
  }
  const double in_flight = 100.0 * covered_s(all, begin, end) / (end - begin);
  measure("GPU busy (K x D over the window)", busy, "%");
  measure("GPU busy (a kernel in flight)", in_flight, "%");
  EXPECT_GE(in_flight, 85.0) << "the hand-overs left the GPU idle";
  for (std::size_t i = 0; i < trainers.size(); ++i) {
    const double of_busy = 100.0 * shares[i] / busy;
    measure(std::string(jobs[i].name) + ": of the GPU time the three got", of_busy, "%");
    EXPECT_NEAR(of_busy, expected[i], 2.0) << jobs[i].name;
  }
}

// Two simulated GPUs: each GPU's clients are scheduled on their own.
class TwoGpuTest : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    devices_ = 2;
  }
};

// CUDA IPC between processes on different GPUs: the importer maps GPU 0's exported buffer in a
// context of GPU 1 (the simulated GPU checks that the mapping grants GPU 1 access), reads the
// exporter's bytes and writes its own, which the exporter sees.
TEST_F(TwoGpuTest, IpcReachesMemoryOfAnotherGpu) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  const std::string handle = dir_.path() + "/ipc.handle";
  const std::string done = dir_.path() + "/ipc.done";
  Trainer& exporter = start_trainer({"exporter",
                                     {"--device", "0", "--bytes", "64Mi", "--kernels", "1",
                                      "--ipc-export", handle, "--ipc-wait", done}});
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(wait_until([&] { return !read_file(handle).empty(); }, 20)) << exporter.describe();
  Trainer& importer = start_trainer(
      {"importer",
       {"--device", "1", "--kernels", "0", "--ipc-import", handle, "--ipc-done", done}});
  Json ri = finish(importer);
  Json re = finish(exporter);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(json_number(&ri, "device"), 1);
  EXPECT_EQ(json_string(&ri, "ipc_read"), "5a");
  EXPECT_EQ(json_string(&re, "ipc_seen"), "a5");
}

// Two trainers that do not fit on each of two GPUs (6Gi each under an 8Gi capacity per GPU): each
// GPU's pair takes turns with swap, and the two GPUs' turns go on at the same time (one GPU's
// hand-offs and swaps never hold the other's up).
TEST_F(TwoGpuTest, EachGpuTakesTurnsOnItsOwn) {
  // The unified mode: the simulated GPU's migrations are accounting only, while device-backed
  // memory is copied byte for byte (a 6 GiB swap would cost real host memory and seconds).
  // SmallDeviceBackedTrainersTakeTurnsAndSwap covers the device-backed mode.
  extra_env_["NVSHARE_MEMORY_MODE"] = "unified";
  extra_env_["NVSHARE_FAKECUDA_SWAP_BW"] = "48Gi";
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--capacity", "8Gi", "--quantum", "1"}));
  std::vector<Trainer*> trainers;
  for (int gpu = 0; gpu < 2; ++gpu) {
    for (const char* name : {"A", "B"}) {
      trainers.push_back(
          &start_trainer({std::string(name) + std::to_string(gpu),
                          {"--device", std::to_string(gpu), "--bytes", "6Gi", "--kernels", "100",
                           "--kernel-us", "20000", "--progress"}}));
    }
  }
  ASSERT_FALSE(HasFailure());
  const double start = monotonic_s();
  const auto any_running = [&] {
    return std::any_of(trainers.begin(), trainers.end(), [](Trainer* t) { return t->running(); });
  };
  int max_holding[2] = {0, 0};
  while (any_running()) {
    auto status = poll_status();
    if (status.ok()) {
      int holding[2] = {0, 0};
      for (std::size_t i = 0; i < trainers.size(); ++i) {
        const Json* c = find_client(status.value(), trainers[i]->pid());
        const std::string state = json_string(c, "state");
        if (holds_gpu_with_memory(c)) ++holding[i / 2];
      }
      for (int gpu = 0; gpu < 2; ++gpu) max_holding[gpu] = std::max(max_holding[gpu], holding[gpu]);
    }
    sleep_s(0.02);
  }
  for (Trainer* t : trainers) finish(*t);
  const double elapsed = monotonic_s() - start;
  ASSERT_FALSE(HasFailure());

  std::vector<Interval> per_gpu[2];
  for (int gpu = 0; gpu < 2; ++gpu) {
    std::vector<Interval> a = intervals(trainers[2 * gpu]->progress(), 0);
    std::vector<Interval> b = intervals(trainers[2 * gpu + 1]->progress(), 1);
    const double overlap = overlap_s(a, b);
    per_gpu[gpu] = a;
    per_gpu[gpu].insert(per_gpu[gpu].end(), b.begin(), b.end());
    std::sort(per_gpu[gpu].begin(), per_gpu[gpu].end(),
              [](const Interval& x, const Interval& y) { return x.begin < y.begin; });
    int switches = 0;
    for (std::size_t i = 1; i < per_gpu[gpu].size(); ++i) {
      switches += per_gpu[gpu][i].owner != per_gpu[gpu][i - 1].owner;
    }
    const std::string label = "GPU " + std::to_string(gpu) + ": ";
    measure(label + "turn switches", switches, "");
    measure(label + "kernel time overlapping within the GPU", overlap, "s");
    EXPECT_EQ(max_holding[gpu], 1) << label << "two trainers that do not fit held it at once";
    EXPECT_GE(switches, 2) << label << "the trainers did not take turns";
    EXPECT_LT(overlap, 0.05) << label << "kernels of trainers that do not fit ran at once";
  }
  // Each GPU has 2 x 2 s of work; run independently, the two GPUs' work overlaps for most of it.
  const double across = overlap_s(per_gpu[0], per_gpu[1]);
  measure("kernel time overlapping across the GPUs (of 4 s per GPU)", across, "s");
  measure("elapsed for 2 x 2 x 2 s of work", elapsed, "s");
  EXPECT_GE(across, 2.0) << "the GPUs' turns did not go on at the same time";

  auto stat = fake_stat();
  ASSERT_OK(stat);
  const Json* devices = stat.value().find("devices");
  ASSERT_TRUE(devices != nullptr && devices->as_array() != nullptr &&
              devices->as_array()->size() == 2);
  for (int gpu = 0; gpu < 2; ++gpu) {
    const Json& device = (*devices->as_array())[static_cast<std::size_t>(gpu)];
    measure("GPU " + std::to_string(gpu) + ": bytes swapped to host",
            json_number(&device, "migrated_to_host") / kGi, "GiB");
    EXPECT_GE(json_number(&device, "migrated_to_host"), 6 * kGi)
        << "GPU " << gpu << ": no trainer's memory was swapped out at a hand-off";
  }
}

// One process driving both GPUs (a tensor and kernels on each, switching the current context):
// it is registered on both, each GPU's memory limit holds on its own (4Gi seen on each; 1Gi + 5Gi
// refused on the second), and every kernel on both runs.
TEST_F(TwoGpuTest, OneProcessDrivesBothGpusUnderItsLimits) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  Trainer& t = start_trainer(
      {"both",
       {"--device", "0", "--bytes", "1Gi", "--report-meminfo", "--also-device", "1", "--also-bytes",
        "1Gi", "--also-try-bytes", "5Gi", "--kernels", "100", "--kernel-us", "10000"},
       {{"NVSHARE_MEMORY_LIMIT", "4Gi"}}});
  ASSERT_FALSE(HasFailure());
  std::set<std::string> gpus_seen;
  while (t.running()) {
    auto status = poll_status();
    if (status.ok()) {
      const Json* gpus = status.value().find("gpus");
      for (const Json& gpu : gpus != nullptr && gpus->as_array() != nullptr ? *gpus->as_array()
                                                                            : std::vector<Json>{}) {
        const Json* clients = gpu.find("clients");
        if (clients == nullptr || clients->as_array() == nullptr) continue;
        for (const Json& c : *clients->as_array()) {
          if (json_number(&c, "pid") == t.pid()) gpus_seen.insert(json_string(&gpu, "uuid"));
        }
      }
    }
    sleep_s(0.1);
  }
  Json report = finish(t);
  if (HasFailure()) return;
  EXPECT_EQ(gpus_seen.size(), 2u) << "the process was not registered on both GPUs";
  EXPECT_DOUBLE_EQ(json_number(&report, "mem_total"), 4 * kGi);
  const Json* also = report.find("also");
  ASSERT_NE(also, nullptr);
  EXPECT_EQ(json_number(also, "device"), 1);
  EXPECT_DOUBLE_EQ(json_number(also, "mem_total"), 4 * kGi) << "the second GPU's limit";
  EXPECT_EQ(json_string(also, "try"), "CUDA_ERROR_OUT_OF_MEMORY") << "1Gi + 5Gi under 4Gi";
  EXPECT_EQ(json_number(also, "kernels"), 100);
}

// A 30% cap on one GPU and a 60% cap on the other, at once. Each process holds its GPU within 2
// points of its cap (the hand-off trace's grant-to-release time: what the cap governs), and its
// kernels run no more than that (the work it got; what it does with its held time besides kernels,
// its launches and synchronizations, several times longer under the sanitizers or on a loaded
// host, is its own and only lowers that figure).
TEST_F(TwoGpuTest, CapsOnTwoGpusHoldAtOnce) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  // 12 s of GPU work each (20-40 s of wall time): a scheduling hiccup of the host moves the share
  // by a fraction of a point, not by the tolerance.
  const long kernels = 1200;
  const double kernel_s = 0.010;
  const int caps[2] = {30, 60};
  std::vector<Trainer*> trainers;
  std::vector<std::string> traces;
  for (int gpu = 0; gpu < 2; ++gpu) {
    traces.push_back(dir_.path() + "/handoff-" + std::to_string(gpu) + ".jsonl");
    trainers.push_back(
        &start_trainer({"capped" + std::to_string(gpu),
                        {"--device", std::to_string(gpu), "--kernels", std::to_string(kernels),
                         "--kernel-us", "10000", "--progress"},
                        {{"NVSHARE_CORE_LIMIT", std::to_string(caps[gpu])},
                         {"NVSHARE_TRACE_FILE", traces.back()}}}));
  }
  ASSERT_FALSE(HasFailure());
  while (trainers[0]->running() || trainers[1]->running()) {
    (void)poll_status();
    sleep_s(0.25);
  }
  for (std::size_t gpu = 0; gpu < 2; ++gpu) {
    Json report = finish(*trainers[gpu]);
    if (HasFailure()) return;
    // From its first grant to its last: whole cycles of the cap, all of them released.
    const double kernel_share =
        100.0 * static_cast<double>(kernels) * kernel_s / json_number(&report, "wall_s");
    const std::string what =
        "GPU " + std::to_string(gpu) + ", a " + std::to_string(caps[gpu]) + "% cap";
    measure(what + ": kernels", kernel_share, "%");
    expect_cap_held(cap_use(traces[gpu], *trainers[gpu]), caps[gpu], what);
    EXPECT_LE(kernel_share, caps[gpu] + 2.0) << what;
  }
}

// The processes of one job (here: of one uid and cgroup) with the same 50% cap on two GPUs, the
// second started 137 ms after the first: they pause and resume together (policy/gang.h), so their
// kernels run at the same time for most of their GPU time (left to their own cycles they would
// overlap for about a tenth of it). Neither goes over its cap, and coupling costs neither more than
// the others' pauses can: the start offset and a cap cycle.
TEST_F(TwoGpuTest, TheCappedProcessesOfOneJobOnTwoGpusRunTogether) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--trust-client-limits"}));
  const long kernels = 400;
  const double kernel_s = 0.010;
  std::vector<Trainer*> trainers;
  for (int gpu = 0; gpu < 2; ++gpu) {
    if (gpu == 1) sleep_s(0.137);
    trainers.push_back(
        &start_trainer({"rank" + std::to_string(gpu),
                        {"--device", std::to_string(gpu), "--kernels", std::to_string(kernels),
                         "--kernel-us", "10000", "--progress"},
                        {{"NVSHARE_CORE_LIMIT", "50"}}}));
  }
  ASSERT_FALSE(HasFailure());
  while (trainers[0]->running() || trainers[1]->running()) {
    (void)poll_status();
    sleep_s(0.25);
  }
  std::vector<Interval> runs[2];
  for (int gpu = 0; gpu < 2; ++gpu) {
    Trainer& t = *trainers[static_cast<std::size_t>(gpu)];
    Json report = finish(t);
    if (HasFailure()) return;
    runs[gpu] = intervals(t.progress(), gpu);
    const double wall_s = json_number(&report, "wall_s");
    const double share = 100.0 * static_cast<double>(kernels) * kernel_s / wall_s;
    measure("GPU " + std::to_string(gpu) + ": share under a 50% cap", share, "%");
    EXPECT_LE(share, 52.0) << "GPU " << gpu;
    EXPECT_GE(share, 48.0 - 100.0 * (0.137 + 0.25) / wall_s) << "GPU " << gpu;
  }
  const double together = overlap_s(runs[0], runs[1]);
  const double gpu_s = static_cast<double>(kernels) * kernel_s;
  measure("kernel time the two ran at once", together, "s");
  EXPECT_GE(together, 0.7 * gpu_s) << "the ranks' caps did not pause them together";
}

// The scheduler is killed with SIGKILL while two trainers that do not fit take turns (one runs,
// one waits with its memory on the host), and restarted 3 s later on the same sockets. While it is
// down both trainers keep running (fail-open: the waiter is let go once its memory is back, which
// the simulated GPU copies at host speed); after the restart both register again; both finish with
// result ok.
TEST_F(E2eTest, SchedulerKilledAndRestartedMidRun) {
  extra_env_["NVSHARE_FAKECUDA_SWAP_BW"] = "48Gi";
  // 256Mi each: the waiter's memory comes back at host speed before it runs unscheduled, and a
  // loaded host (a sanitizer build beside other suites) copied 1Gi slowly enough to eat the
  // scheduler's whole absence.
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--capacity", "384Mi", "--quantum", "4"}));
  const std::vector<std::string> args = {"--bytes",     "256Mi", "--kernels", "500",
                                         "--kernel-us", "20000", "--progress"};
  Trainer& a = start_trainer({"A", args});
  Trainer& b = start_trainer({"B", args});
  ASSERT_FALSE(HasFailure());

  // One running, the other waiting for it with its memory on the host (the memory it allocated
  // before its first grant is evicted for the runner; once its usage says so, its link is not
  // busy moving memory).
  const auto waits_swapped = [](const Json* c) {
    return json_string(c, "state") == "waiting" &&
           json_number(c, "resident_bytes", 0) < json_number(c, "allocated_bytes", 0);
  };
  ASSERT_TRUE(wait_until(
      [&] {
        auto status = poll_status();
        if (!status.ok()) return false;
        const Json* ca = find_client(status.value(), a.pid());
        const Json* cb = find_client(status.value(), b.pid());
        const std::string sa = json_string(ca, "state");
        const std::string sb = json_string(cb, "state");
        return (sa == "running" && waits_swapped(cb)) || (waits_swapped(ca) && sb == "running");
      },
      60))
      << "never saw one trainer running and the other waiting, swapped out";
  sleep_s(0.3);

  const double killed_at = monotonic_s();
  scheduler_->kill_hard();
  sleep_s(3.0);
  const double restarted_at = monotonic_s();
  ASSERT_TRUE(a.running() && b.running()) << "a trainer ended while the scheduler was down";
  // Both made progress while the scheduler was down: nobody waits for a scheduler that is gone.
  for (Trainer* t : {&a, &b}) {
    int done_while_down = 0;
    for (const Json& p : t->progress()) {
      const double done = json_number(&p, "done_s");
      if (done > killed_at + 0.2 && done < restarted_at) ++done_while_down;
    }
    measure("iterations done while the scheduler was down (" + t->name() + ")", done_while_down,
            "");
    EXPECT_GT(done_while_down, 0) << "trainer " << t->name()
                                  << " made no progress while the scheduler was down";
  }

  ASSERT_OK(scheduler_->start());
  double registered_at = -1;
  wait_until(
      [&] {
        auto status = poll_status();
        if (status.ok() && find_client(status.value(), a.pid()) != nullptr &&
            find_client(status.value(), b.pid()) != nullptr) {
          registered_at = monotonic_s();
          return true;
        }
        return !(a.running() && b.running());
      },
      10, 0.01);
  // Each came back saying it had lost one session: the restarted scheduler counts two resumed
  // sessions (status, and nvshare_resumed_sessions_total in the metrics).
  Json resumed;
  wait_until(
      [&] {
        auto status = poll_status();
        if (!status.ok()) return false;
        resumed = status.value();
        return json_number(find_client(resumed, a.pid()), "sessions_lost") == 1 &&
               json_number(find_client(resumed, b.pid()), "sessions_lost") == 1;
      },
      10, 0.01);
  Json ra = finish(a);
  Json rb = finish(b);
  EXPECT_GE(registered_at, 0) << "the trainers did not both register with the restarted scheduler "
                                 "while they ran";
  if (registered_at >= 0) {
    measure("re-registration after restart", (registered_at - restarted_at) * 1000, "ms");
  }
  EXPECT_EQ(json_number(&resumed, "resumed_sessions"), 2) << resumed.dump();
  EXPECT_EQ(json_number(find_client(resumed, a.pid()), "sessions_lost"), 1) << resumed.dump();
}

// A holder killed with SIGKILL: the trainer waiting behind it gets the GPU on the disconnect, not
// by a timer (the revoke grace, the link's dead-peer timeout and the quantum are 5 s and more):
// within 1 s from just before kill(2) to the instant the waiter's first cuLaunchKernel returned
// (CLOCK_MONOTONIC in both processes), the time reported (tens of milliseconds on an idle host).
// Run twice, 64Mi each under a 100Mi virtual capacity so the two do not fit together (the holder
// is never asked to yield): waiting for its turn (exclusive mode) and waiting for memory (auto).
// The holder never releases by itself (NVSHARE_IDLE_RELEASE_MS=0): a job that waits for its memory
// would otherwise have it release at a pause of 20 ms, which a loaded host can put between two of
// its kernels.
class HolderKilledTest : public E2eTest {
 protected:
  void run(const std::vector<std::string>& scheduler_flags, const std::string& expected_reason) {
    ASSERT_NO_FATAL_FAILURE(start_scheduler(scheduler_flags));
    Trainer& holder = start_trainer(
        {"holder",
         {"--bytes", "64Mi", "--kernels", "1000", "--kernel-us", "20000", "--progress"},
         {{"NVSHARE_IDLE_RELEASE_MS", "0"}}});
    ASSERT_FALSE(HasFailure());
    ASSERT_TRUE(wait_until(
        [&] {
          auto status = poll_status();
          return status.ok() &&
                 json_string(find_client(status.value(), holder.pid()), "state") == "running" &&
                 holder.progress().size() >= 2;
        },
        10))
        << "the holder never ran";

    Trainer& waiter = start_trainer({"waiter",
                                     {"--bytes", "64Mi", "--kernels", "20", "--kernel-us", "10000",
                                      "--first-kernel-timestamp", "--progress"}});
    ASSERT_FALSE(HasFailure());
    std::string reason;
    ASSERT_TRUE(wait_until(
        [&] {
          auto status = poll_status();
          if (!status.ok()) return false;
          const Json* c = find_client(status.value(), waiter.pid());
          reason = json_string(c, "waiting_for");
          return json_string(c, "state") == "waiting";
        },
        10))
        << "the second trainer never waited for the holder";
    EXPECT_EQ(reason, expected_reason);
    sleep_s(0.3);
    ASSERT_TRUE(waiter.progress().empty())
        << "the waiter ran kernels while the holder held the GPU";

    const double killed_at = monotonic_s();
    holder.kill(SIGKILL);
    Json report = finish(waiter, 30);
    ASSERT_FALSE(HasFailure());
    const double first_kernel = json_number(&report, "first_kernel_s");
    measure("hand-off after SIGKILL (kill to waiter's first kernel)",
            (first_kernel - killed_at) * 1000, "ms");
    EXPECT_GT(first_kernel, killed_at) << "the waiter's first kernel came before the kill";
    EXPECT_LT(first_kernel - killed_at, 1.0)
        << "the waiter got the GPU more than 1 s after the holder was killed: a timer, not the "
           "disconnect, handed it over";
  }
};

TEST_F(HolderKilledTest, NextGetsGpuOnTheDisconnectWaitingForTurn) {
  run({"--mode", "exclusive", "--capacity", "100Mi", "--quantum", "30"}, "turn");
}

TEST_F(HolderKilledTest, NextGetsGpuOnTheDisconnectWaitingForMemory) {
  run({"--capacity", "100Mi", "--quantum", "30"}, "memory");
}

// NVSHARE_ENABLE=0 with the library preloaded changes nothing: the same trainer output (apart from
// timings, which are reported), the same device-memory accounting in the simulated driver (plain
// cuMemAlloc bytes, nothing converted to managed memory) and no session with the scheduler. A
// third run with the library enabled shows that the same checks do see the library when it acts.
TEST_F(E2eTest, EnableZeroChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  const std::vector<std::string> args = {"--bytes",     "256Mi", "--kernels",        "50",
                                         "--kernel-us", "20000", "--report-meminfo", "--progress"};
  struct Run {
    Json report;
    Json slot;  // the trainer's context in nvshare-fakecuda-stat, mid-run
    double sessions = -1;
    bool registered = false;
  };
  auto run = [&](TrainerOptions options) -> Run {
    Run out;
    Trainer& t = start_trainer(std::move(options));
    if (HasFailure()) return out;
    wait_until([&] { return !t.progress().empty() || !t.running(); }, 10);
    auto stat = fake_stat();
    if (stat.ok()) {
      if (const Json* slot = context_of(first_device(stat.value()), t.pid())) out.slot = *slot;
    }
    auto status = poll_status();
    if (status.ok()) {
      out.sessions = json_number(status.value().find("scheduler"), "client_sessions");
      out.registered = find_client(status.value(), t.pid()) != nullptr;
    }
    out.report = finish(t);
    return out;
  };
  Run plain = run({"plain", args, {}, /*preload=*/false});
  Run disabled = run({"disabled", args, {{"NVSHARE_ENABLE", "0"}}});
  Run enabled = run({"enabled", args});
  ASSERT_FALSE(HasFailure());

  for (const char* key : {"device", "uuid", "bytes", "managed", "iterations", "kernels_per_iter",
                          "kernel_us", "mem_free", "mem_total", "result"}) {
    const Json* p = plain.report.find(key);
    const Json* d = disabled.report.find(key);
    ASSERT_TRUE(p != nullptr && d != nullptr) << key;
    EXPECT_EQ(p->dump(), d->dump()) << "field " << key << " differs with NVSHARE_ENABLE=0";
  }
  // Times are reported, not asserted: on a loaded host one run of a second can take a third longer
  // with or without the library (benchmarks measure speed; bench/gpu's single-job scenario does).
  measure("wall_s without the library", json_number(&plain.report, "wall_s"), "s");
  measure("wall_s with NVSHARE_ENABLE=0", json_number(&disabled.report, "wall_s"), "s");
  measure("wall_s with the library enabled", json_number(&enabled.report, "wall_s"), "s");

  for (const Run* r : {&plain, &disabled}) {
    const std::string which = r == &plain ? "without the library" : "with NVSHARE_ENABLE=0";
    ASSERT_FALSE(r->slot.is_null()) << "no simulated-GPU context seen " << which;
    EXPECT_EQ(json_number(&r->slot, "allocated"), 256 * kMi) << which << ": " << r->slot.dump();
    EXPECT_EQ(json_number(&r->slot, "managed_resident"), 0) << which << ": " << r->slot.dump();
    EXPECT_EQ(json_number(&r->slot, "managed_host"), 0) << which << ": " << r->slot.dump();
    EXPECT_EQ(r->sessions, 0) << which << ": the scheduler had a client session";
    EXPECT_FALSE(r->registered) << which << ": the trainer registered with the scheduler";
  }
  // The contrast: enabled, the library backs the allocation itself (device memory mapped at an
  // address it reserved, the same bytes on the GPU) and registers.
  ASSERT_FALSE(enabled.slot.is_null());
  EXPECT_EQ(json_number(&enabled.slot, "allocated"), 256 * kMi) << enabled.slot.dump();
  EXPECT_EQ(json_number(&enabled.slot, "managed_resident"), 0) << enabled.slot.dump();
  EXPECT_TRUE(enabled.registered) << "the enabled library never registered with the scheduler";
}

}  // namespace
}  // namespace nvshare::e2e
