// Metrics end to end, label `metrics`: the real Prometheus server (Debian's `prometheus`) scrapes a
// real nvshare-scheduler (GET /metrics) while trainers with known workloads run under the real
// libnvshare.so on two simulated GPUs, and PromQL queries over Prometheus' HTTP API must read what
// those workloads imply. `promtool check metrics` lints one exposition.
//
// GPU 0: pod ml/capped, a compute-bound trainer capped at 30% (1Gi allocated, the pod's memory
// limit 2Gi): alone, it holds 30% of the time and waits for quota the other 70%.
// GPU 1: pods ml/big-a and ml/big-b, compute-bound, 10Gi each of 16Gi: they cannot run together,
// so they take turns (a 2 s quantum), each waiting for memory about half of the time.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/json.h"
#include "harness.h"

namespace nvshare::e2e {
namespace {

#define ASSERT_OK(expr)                                                              \
  do {                                                                               \
    const auto& ok_ = (expr);                                                        \
    ASSERT_TRUE(ok_.ok()) << #expr << ": " << (ok_.ok() ? "" : ok_.error().message); \
  } while (0)

constexpr const char* kCappedPod = "e2e00000-0000-4000-8000-0000000000c1";
constexpr const char* kBigPodA = "e2e00000-0000-4000-8000-0000000000a1";
constexpr const char* kBigPodB = "e2e00000-0000-4000-8000-0000000000b1";

std::string url_encode(const std::string& text) {
  std::string out;
  for (const unsigned char ch : text) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out += static_cast<char>(ch);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", ch);
      out += hex;
    }
  }
  return out;
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = dir_.path() + "/fakecuda.state";
    metrics_port_ = free_port();
    prometheus_port_ = free_port();
    ASSERT_NE(metrics_port_, 0);
    ASSERT_NE(prometheus_port_, 0);
    scheduler_ = std::make_unique<Scheduler>(
        dir_.path(),
        std::vector<std::string>{"--trust-client-limits", "--quantum", "2", "--metrics-address",
                                 "127.0.0.1:" + std::to_string(metrics_port_)},
        gpu_env());
    ASSERT_OK(scheduler_->start());
  }

  void TearDown() override {
    if (HasFailure()) {
      std::fprintf(stderr, "--- scheduler log (end):\n%s\n--- prometheus log (end):\n%s\n",
                   tail(scheduler_ ? scheduler_->log() : "", 30).c_str(),
                   tail(read_file(dir_.path() + "/prometheus.log"), 30).c_str());
      for (const auto& t : trainers_) std::fprintf(stderr, "%s\n", t->describe().c_str());
    }
  }

  Env gpu_env() const {
    return {{"LD_LIBRARY_PATH", programs().fakecuda_dir},
            {"NVSHARE_FAKECUDA_STATE", state_},
            {"NVSHARE_FAKECUDA_DEVICES", "2"},
            {"NVSHARE_FAKECUDA_MEMORY", "16Gi"},
            {"NVSHARE_FAKECUDA_SWAP_BW", "48Gi"}};
  }

  void start_prometheus() {
    const std::string config = dir_.path() + "/prometheus.yml";
    std::ofstream(config) << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                          << "scrape_configs:\n  - job_name: nvshare\n    static_configs:\n"
                          << "      - targets: ['127.0.0.1:" << metrics_port_ << "']\n";
    auto p = Process::spawn({on_path("prometheus"), "--config.file=" + config,
                             "--storage.tsdb.path=" + dir_.path() + "/tsdb",
                             "--web.listen-address=127.0.0.1:" + std::to_string(prometheus_port_)},
                            {}, dir_.path() + "/prometheus.out", dir_.path() + "/prometheus.log");
    ASSERT_OK(p);
    prometheus_ = std::move(p).value();
    for (int i = 0; i < 300; ++i) {
      auto ready = http_get(prometheus_port_, "/-/ready");
      if (ready.ok() && ready.value().status == 200) return;
      ASSERT_TRUE(prometheus_->running()) << "prometheus exited";
      sleep_s(0.1);
    }
    FAIL() << "prometheus was not ready within 30 s";
  }

  Trainer& start_trainer(const std::string& name, const char* pod, std::vector<std::string> args) {
    Env env = gpu_env();
    env["NVSHARE_SOCKET"] = scheduler_->socket();
    env["NVSHARE_POD_UID"] = pod;
    // The simulated GPU copies device-backed memory byte for byte (10 GiB swaps would cost real
    // host memory and seconds each); the unified mode's migrations are accounting only.
    env["NVSHARE_MEMORY_MODE"] = "unified";
    trainers_.push_back(
        std::make_unique<Trainer>(TrainerOptions{name, std::move(args)}, dir_.path()));
    Status started = trainers_.back()->start(env);
    EXPECT_TRUE(started.ok()) << (started.ok() ? "" : started.error().message);
    return *trainers_.back();
  }

  void set_pod(const char* uid, const std::string& name, const std::vector<std::string>& limits) {
    std::vector<std::string> args = {"set-limits", "--pod-uid", uid, "--pod", name};
    args.insert(args.end(), limits.begin(), limits.end());
    auto set = scheduler_->ctl(args);
    ASSERT_OK(set);
    ASSERT_EQ(set.value().exit_code, 0) << set.value().out << set.value().err;
  }

  // The values of an instant query at `at` (Unix seconds), by the value of label `by`.
  std::map<std::string, double> query(const std::string& promql, double at, const std::string& by) {
    std::map<std::string, double> values;
    char time[32];
    std::snprintf(time, sizeof time, "%.3f", at);
    auto reply =
        http_get(prometheus_port_, "/api/v1/query?query=" + url_encode(promql) + "&time=" + time);
    EXPECT_TRUE(reply.ok()) << promql;
    if (!reply.ok()) return values;
    EXPECT_EQ(reply.value().status, 200) << promql << ": " << reply.value().body;
    auto json = parse_json(reply.value().body);
    EXPECT_TRUE(json.ok()) << reply.value().body;
    if (!json.ok()) return values;
    const Json* data = json.value().find("data");
    const Json* result = data ? data->find("result") : nullptr;
    if (result == nullptr || result->as_array() == nullptr) {
      ADD_FAILURE() << promql << ": " << reply.value().body;
      return values;
    }
    for (const Json& series : *result->as_array()) {
      const Json* metric = series.find("metric");
      const Json* value = series.find("value");
      const Json* label = metric ? metric->find(by) : nullptr;
      if (value == nullptr || value->as_array() == nullptr || value->as_array()->size() != 2)
        continue;
      const std::string* text = (*value->as_array())[1].as_string();
      values[label && label->as_string() ? *label->as_string() : ""] =
          text ? std::strtod(text->c_str(), nullptr) : -1;
    }
    return values;
  }

  TempDir dir_;
  std::string state_;
  int metrics_port_ = 0;
  int prometheus_port_ = 0;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Process> prometheus_;
  std::vector<std::unique_ptr<Trainer>> trainers_;
};

double unix_now() {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count()) /
         1e3;
}

TEST_F(MetricsTest, PrometheusReadsWhatTheWorkloadsImply) {
  set_pod(kCappedPod, "ml/capped", {"--core", "30", "--memory", "2Gi"});
  set_pod(kBigPodA, "ml/big-a", {"--core", "none"});
  set_pod(kBigPodB, "ml/big-b", {"--core", "none"});
  ASSERT_NO_FATAL_FAILURE(start_prometheus());

  // 24 s at 30%; 2 x 12 s of work taking turns.
  Trainer& capped = start_trainer("capped", kCappedPod,
                                  {"--bytes", "1Gi", "--kernels", "720", "--kernel-us", "10000"});
  Trainer& big_a = start_trainer(
      "big-a", kBigPodA,
      {"--device", "1", "--bytes", "10Gi", "--kernels", "1200", "--kernel-us", "10000"});
  Trainer& big_b = start_trainer(
      "big-b", kBigPodB,
      {"--device", "1", "--bytes", "10Gi", "--kernels", "1200", "--kernel-us", "10000"});
  ASSERT_FALSE(HasFailure());
  const double start = unix_now();
  sleep_s(20);
  const double at = start + 19;  // a 14 s window from 5 s in, well inside every trainer's run

  auto exposition = http_get(metrics_port_, "/metrics");
  ASSERT_OK(exposition);
  ASSERT_EQ(exposition.value().status, 200);
  auto lint = promtool_check(dir_.path(), exposition.value().body);
  ASSERT_OK(lint);
  EXPECT_EQ(lint.value().exit_code, 0) << lint.value().out << lint.value().err;

  // The capped pod: 30% of the time held, 70% waiting for quota.
  auto share = query("sum by (pod) (rate(nvshare_client_gpu_seconds_total[14s]))", at, "pod");
  measure("capped pod's share (PromQL rate)", 100 * share["capped"], "%");
  EXPECT_NEAR(share["capped"], 0.30, 0.02);
  auto windowed =
      query("avg by (pod) (avg_over_time(nvshare_client_gpu_share_ratio[14s]))", at, "pod");
  measure("capped pod's share over the quota window, averaged", 100 * windowed["capped"], "%");
  EXPECT_NEAR(windowed["capped"], 0.30, 0.02);
  auto quota_wait = query(
      "sum by (pod) (rate(nvshare_client_wait_seconds_total{reason=\"quota\"}[14s]))", at, "pod");
  measure("capped pod's quota wait", 100 * quota_wait["capped"], "%");
  EXPECT_NEAR(quota_wait["capped"], 0.70, 0.05);

  // Its memory: what it allocated, under the pod's limit.
  auto allocated = query("sum by (pod) (nvshare_client_memory_allocated_bytes)", at, "pod");
  EXPECT_EQ(allocated["capped"], 1024.0 * 1024 * 1024);
  auto limit = query("max by (pod) (nvshare_client_memory_limit_bytes)", at, "pod");
  EXPECT_EQ(limit["capped"], 2048.0 * 1024 * 1024);
  auto pod_limit = query("nvshare_pod_memory_limit_bytes", at, "pod");
  EXPECT_EQ(pod_limit["capped"], 2048.0 * 1024 * 1024);
  auto cap = query("nvshare_pod_core_limit_ratio", at, "pod");
  EXPECT_EQ(cap["capped"], 0.30);

  // The two that do not fit take turns: each waits for memory about half of the time, and
  // together they hold the GPU nearly all of it (less the swaps at each hand-off).
  auto memory_wait = query(
      "sum by (pod) (rate(nvshare_client_wait_seconds_total{reason=\"memory\"}[14s]))", at, "pod");
  for (const char* pod : {"big-a", "big-b"}) {
    measure(std::string(pod) + ": memory wait", 100 * memory_wait[pod], "%");
    EXPECT_NEAR(memory_wait[pod], 0.5, 0.15) << pod;
  }
  EXPECT_NEAR(share["big-a"] + share["big-b"], 1.0, 0.1);
  measure("big pods' shares together", 100 * (share["big-a"] + share["big-b"]), "%");
  auto swapped = query("sum by (pod) (nvshare_client_swapped_out_bytes_total)", at, "pod");
  EXPECT_GT(swapped["big-a"] + swapped["big-b"], 10.0 * 1024 * 1024 * 1024)
      << "a turn between them swaps 10Gi out";
  auto gpus = query("nvshare_gpus", at, "");
  EXPECT_EQ(gpus[""], 2);

  for (Trainer* t : {&capped, &big_a, &big_b}) {
    auto code = t->wait(60);
    ASSERT_OK(code);
    EXPECT_EQ(code.value(), 0) << t->describe();
  }
}

// An allocation over the pod's limit fails in the process (CUDA_ERROR_OUT_OF_MEMORY) and is counted
// on its series while it keeps running.
TEST_F(MetricsTest, RefusedAllocationsAreCounted) {
  set_pod(kCappedPod, "ml/limited", {"--memory", "1Gi"});
  Trainer& t = start_trainer("limited", kCappedPod,
                             {"--bytes", "256Mi", "--kernels", "300", "--kernel-us", "10000",
                              "--alloc-after-ms", "200", "--alloc-bytes", "2Gi"});
  ASSERT_FALSE(HasFailure());
  std::string line;
  for (int i = 0; i < 50 && line.empty(); ++i) {
    sleep_s(0.1);
    auto exposition = http_get(metrics_port_, "/metrics");
    ASSERT_OK(exposition);
    std::istringstream lines(exposition.value().body);
    for (std::string l; std::getline(lines, l);) {
      if (l.rfind("nvshare_client_memory_refused_allocations_total{", 0) == 0 &&
          l.find("pod=\"limited\"") != std::string::npos && l.substr(l.rfind(' ') + 1) != "0") {
        line = l;
      }
    }
  }
  EXPECT_EQ(line.substr(line.rfind(' ') + 1), "1") << "no refusal counted: " << line;
  auto code = t.wait(30);
  ASSERT_OK(code);
  EXPECT_EQ(code.value(), 0) << t.describe();
  auto report = t.report();
  ASSERT_OK(report);
  EXPECT_NE(report.value().dump().find("OUT_OF_MEMORY"), std::string::npos)
      << report.value().dump();
}

// A scrape with nothing connected is valid too, and series of a client that left are gone.
TEST_F(MetricsTest, SeriesOfAGoneClientDisappear) {
  Trainer& t = start_trainer("short", kCappedPod, {"--bytes", "64Mi", "--kernels", "10"});
  auto code = t.wait(30);
  ASSERT_OK(code);
  ASSERT_EQ(code.value(), 0) << t.describe();
  // The scheduler sees the disconnect shortly after the process exits.
  for (int i = 0; i < 50; ++i) {
    auto status = scheduler_->status();
    ASSERT_OK(status);
    if (find_client(status.value(), t.pid()) == nullptr) break;
    sleep_s(0.1);
  }
  auto exposition = http_get(metrics_port_, "/metrics");
  ASSERT_OK(exposition);
  ASSERT_EQ(exposition.value().status, 200);
  std::istringstream lines(exposition.value().body);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_NE(line.rfind("nvshare_client_", 0), 0u) << "a client series remains: " << line;
  }
  EXPECT_EQ(exposition.value().body.find("pid=\"" + std::to_string(t.pid()) + "\""),
            std::string::npos);
  EXPECT_NE(exposition.value().body.find("nvshare_clients 0\n"), std::string::npos);
  auto lint = promtool_check(dir_.path(), exposition.value().body);
  ASSERT_OK(lint);
  EXPECT_EQ(lint.value().exit_code, 0) << lint.value().out << lint.value().err;

  auto missing = http_get(metrics_port_, "/nothing");
  ASSERT_OK(missing);
  EXPECT_EQ(missing.value().status, 404);
}

}  // namespace
}  // namespace nvshare::e2e
