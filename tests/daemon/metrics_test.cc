// render_metrics and MetricsServer: the exposition's shape (families grouped, labels escaped,
// histograms cumulative) and the server's answers, against a snapshotter run by a real reactor.
#include "scheduler/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <set>
#include <sstream>
#include <thread>

#include "scheduler/metrics_server.h"
#include "scheduler/reactor.h"

namespace nvshare::scheduler {
namespace {

using namespace std::chrono_literals;

MetricsSnapshot one_client() {
  MetricsSnapshot s;
  s.version = "1.2.3";
  GpuStatus gpu;
  gpu.uuid = "GPU-1";
  gpu.drains.record(3ms);
  gpu.drains.record(40ms);
  ClientStatus c;
  c.id = 7;
  c.pid = 1234;
  c.process_name = "py\"th\\on\nx";
  c.pod_namespace = "ml";
  c.pod_name = "trainer-0";
  c.limits.memory_bytes = 2048;
  c.limits.core_percent = 30;
  c.view.allocated_bytes = 1000;
  c.view.resident_bytes = 600;
  c.view.held_total = 1500ms;
  c.view.counters.grants = 4;
  c.view.counters.waited[static_cast<std::size_t>(protocol::WaitReason::kQuota)] = 250ms;
  gpu.clients.push_back(c);
  s.status.gpus.push_back(gpu);
  return s;
}

TEST(Metrics, ClientSeriesCarryEscapedLabelsAndBaseUnits) {
  const std::string text = render_metrics(one_client());
  const std::string labels =
      R"({gpu="GPU-1",client="7",pid="1234",process="py\"th\\on\nx",namespace="ml",pod="trainer-0"})";
  EXPECT_NE(text.find("nvshare_client_memory_allocated_bytes" + labels + " 1000\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("nvshare_client_memory_swapped_bytes" + labels + " 400\n"),
            std::string::npos);
  EXPECT_NE(text.find("nvshare_client_memory_limit_bytes" + labels + " 2048\n"), std::string::npos);
  EXPECT_NE(text.find("nvshare_client_core_limit_ratio" + labels + " 0.3\n"), std::string::npos);
  EXPECT_NE(text.find("nvshare_client_gpu_seconds_total" + labels + " 1.5\n"), std::string::npos);
  EXPECT_NE(text.find("nvshare_client_grants_total" + labels + " 4\n"), std::string::npos);
  const std::string quota = labels.substr(0, labels.size() - 1) + R"(,reason="quota"})";
  EXPECT_NE(text.find("nvshare_client_wait_seconds_total" + quota + " 0.25\n"), std::string::npos);
  EXPECT_NE(text.find("nvshare_scheduler_info{version=\"1.2.3\"} 1\n"), std::string::npos);
}

TEST(Metrics, EveryFamilyIsOneBlockWithItsHeader) {
  const std::string text = render_metrics(one_client());
  std::set<std::string> seen;
  std::string current;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      current = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(seen.insert(current).second) << current << " appears twice";
      EXPECT_EQ(current.rfind("nvshare_", 0), 0u) << current;
      continue;
    }
    const std::string name = line.substr(0, line.find_first_of("{ "));
    EXPECT_EQ(name.rfind(current, 0), 0u) << name << " outside its family " << current;
  }
  EXPECT_GT(seen.size(), 40u);
}

TEST(Metrics, HistogramsAreCumulative) {
  const std::string text = render_metrics(one_client());
  EXPECT_NE(text.find("nvshare_gpu_drain_seconds_bucket{gpu=\"GPU-1\",le=\"0.0025\"} 0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("nvshare_gpu_drain_seconds_bucket{gpu=\"GPU-1\",le=\"0.005\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("nvshare_gpu_drain_seconds_bucket{gpu=\"GPU-1\",le=\"0.05\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("nvshare_gpu_drain_seconds_bucket{gpu=\"GPU-1\",le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("nvshare_gpu_drain_seconds_count{gpu=\"GPU-1\"} 2\n"), std::string::npos);
}

TEST(MetricsAddress, HostAndPortOrAClearError) {
  auto v4 = split_host_port("127.0.0.1:9402");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4.value(), (std::pair<std::string, std::string>{"127.0.0.1", "9402"}));
  auto any = split_host_port(":9402");
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any.value().first, "");
  auto v6 = split_host_port("[::1]:80");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6.value().first, "::1");
  for (const char* bad : {"9402", "host:", "host:http", "host:65536", "host:1234567"}) {
    EXPECT_FALSE(split_host_port(bad).ok()) << bad;
  }
}

// The whole reply of one request to 127.0.0.1:port.
std::string exchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
    char buffer[4096];
    ssize_t n = 0;
    while ((n = read(fd, buffer, sizeof buffer)) > 0)
      reply.append(buffer, static_cast<std::size_t>(n));
  }
  close(fd);
  return reply;
}

// The snapshot is taken on the reactor's thread, the reply written from the server's.
TEST(MetricsServerTest, AnswersFromSnapshotsTheReactorTakes) {
  auto reactor = Reactor::create();
  ASSERT_TRUE(reactor.ok());
  std::thread::id taken_on;
  auto server = MetricsServer::start("127.0.0.1:0", *reactor.value(), [&] {
    taken_on = std::this_thread::get_id();
    return one_client();
  });
  ASSERT_TRUE(server.ok()) << server.error().message;
  const int port =
      std::stoi(server.value()->address().substr(server.value()->address().rfind(':') + 1));
  std::string metrics, missing, post;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    metrics = exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    missing = exchange(port, "GET /other HTTP/1.1\r\n\r\n");
    post = exchange(port, "POST /metrics HTTP/1.1\r\n\r\n");
    done = true;
  });
  // Run the loop in 20 ms turns until the scraper is done.
  while (!done.load()) {
    auto timer = reactor.value()->set_timer(SteadyClock::instance().now() + 20ms);
    ASSERT_TRUE(timer.ok());
    reactor.value()->on_timer([&] { reactor.value()->stop(); });
    ASSERT_TRUE(reactor.value()->run().ok());
  }
  scraper.join();
  EXPECT_EQ(taken_on, std::this_thread::get_id());
  EXPECT_EQ(metrics.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << metrics.substr(0, 200);
  EXPECT_NE(metrics.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(metrics.find("nvshare_client_grants_total{"), std::string::npos);
  EXPECT_EQ(missing.rfind("HTTP/1.1 404", 0), 0u) << missing;
  EXPECT_EQ(post.rfind("HTTP/1.1 405", 0), 0u) << post;
  EXPECT_EQ(server.value()->snapshots_taken(), 1u);
  server.value().reset();
}

}  // namespace
}  // namespace nvshare::scheduler
