// The metrics endpoint under connections that stall: silent ones, one that sends its request a
// byte at a time; a scrape is answered all the same, and the endpoint stops at once.
#include "common/metrics_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace nvshare {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int connect_to(const std::string& address) {
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<std::uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// GET /metrics on a new connection: the answer, or "" when none came within 10 s.
std::string scrape(const std::string& address) {
  const int fd = connect_to(address);
  if (fd < 0) return "";
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) out.append(buffer, n);
  ::close(fd);
  return out;
}

TEST(MetricsEndpoint, StalledConnectionsDelayAScrapeByLittle) {
  std::atomic<int> renders{0};
  auto endpoint = MetricsEndpoint::start("127.0.0.1:0", "test", [&]() -> Result<std::string> {
    ++renders;
    return std::string("up 1\n");
  });
  ASSERT_TRUE(endpoint.ok()) << endpoint.error().message;
  const std::string address = endpoint.value()->address();
  // Twice as many silent connections as there are places, and one trickling its request.
  std::vector<int> silent;
  for (std::size_t i = 0; i < 2 * MetricsEndpoint::kMaxConnections; ++i) {
    silent.push_back(connect_to(address));
  }
  const int slow = connect_to(address);
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    const std::string request = "GET /metrics HTTP/1.1\r\n";
    for (std::size_t i = 0; i < request.size() && !done; ++i) {
      ::send(slow, &request[i], 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(300ms);
    }
  });
  std::this_thread::sleep_for(500ms);
  const auto asked = Clock::now();
  const std::string answer = scrape(address);
  const double waited = std::chrono::duration<double>(Clock::now() - asked).count();
  EXPECT_NE(answer.find("200 OK"), std::string::npos) << answer;
  EXPECT_NE(answer.find("up 1"), std::string::npos) << answer;
  EXPECT_LT(waited, 2.0) << "a scrape waited behind stalled connections";
  // Stopping does not wait for them.
  const auto stopping = Clock::now();
  endpoint.value().reset();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - stopping).count(), 1.0);
  done = true;
  trickle.join();
  for (int fd : silent) ::close(fd);
  ::close(slow);
}

// A rendering is kept for kRenderCache only: a scrape after that sees the state anew.
TEST(MetricsEndpoint, ARenderingIsKeptForTheCachePeriodOnly) {
  std::atomic<int> renders{0};
  auto endpoint = MetricsEndpoint::start("127.0.0.1:0", "test", [&]() -> Result<std::string> {
    ++renders;
    return std::string("n ") + std::to_string(renders.load()) + "\n";
  });
  ASSERT_TRUE(endpoint.ok()) << endpoint.error().message;
  const std::string first = scrape(endpoint.value()->address());
  std::this_thread::sleep_for(MetricsEndpoint::kRenderCache + 50ms);
  const std::string later = scrape(endpoint.value()->address());
  EXPECT_NE(first.find("n 1"), std::string::npos) << first;
  EXPECT_NE(later.find("n 2"), std::string::npos)
      << "a stale rendering after the period: " << later;
}

}  // namespace
}  // namespace nvshare
