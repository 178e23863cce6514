#include "control/client.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "common/clock.h"

namespace nvshare::control {
namespace {

// Responses are small except status on a busy node; 64 MiB bounds a runaway peer.
constexpr std::size_t kMaxResponse = 64 << 20;

std::string hint_for(const std::string& message) {
  if (message.find("No such file") != std::string::npos ||
      message.find("Connection refused") != std::string::npos) {
    return " (is nvshare-scheduler running? --control-socket or NVSHARE_CONTROL_SOCKET select "
           "another socket)";
  }
  if (message.find("Permission denied") != std::string::npos) {
    return " (the control socket is only for root and the scheduler's user)";
  }
  return "";
}

}  // namespace

Result<ControlClient> ControlClient::connect(const std::string& path, int timeout_ms) {
  auto fd = connect_unix(path);
  if (!fd) {
    return make_error("cannot reach the scheduler's control socket: " + fd.error().message +
                      hint_for(fd.error().message));
  }
  return ControlClient(std::move(fd).value(), path, timeout_ms);
}

Result<Json> ControlClient::call(const Json& request) {
  std::string line = request.dump() + "\n";
  if (Status s = write_all(fd_.get(),
                           std::span<const std::uint8_t>(
                               reinterpret_cast<const std::uint8_t*>(line.data()), line.size()),
                           timeout_ms_);
      !s) {
    // A scheduler that refuses the peer writes why and closes at once, possibly before the request
    // is sent: the reason is still waiting to be read.
    auto refusal = read_response(std::min(timeout_ms_, 200));
    if (refusal) return refusal;
    return make_error("cannot send to the scheduler at " + path_ + ": " + s.error().message);
  }
  return read_response(timeout_ms_);
}

Result<Json> ControlClient::read_response(int timeout_ms) {
  const MonoTime deadline = SteadyClock::instance().now() + std::chrono::milliseconds(timeout_ms);
  std::size_t scanned = 0;
  for (;;) {
    if (const std::size_t newline = pending_.find('\n', scanned); newline != std::string::npos) {
      const std::string response = pending_.substr(0, newline);
      pending_.erase(0, newline + 1);
      auto parsed = parse_json(response, JsonLimits{.max_bytes = kMaxResponse, .max_depth = 64});
      if (!parsed)
        return make_error("the scheduler answered something that is not JSON: " +
                          parsed.error().message);
      return parsed;
    }
    scanned = pending_.size();
    if (pending_.size() > kMaxResponse) return make_error("the scheduler's response is too large");
    const auto left = deadline - SteadyClock::instance().now();
    const int wait_ms =
        static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(left).count());
    if (wait_ms <= 0) {
      return make_error("no answer from the scheduler at " + path_ + " within " +
                        std::to_string(timeout_ms) + " ms");
    }
    pollfd p{fd_.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // the deadline check above reports the timeout
    char buffer[65536];
    auto n = read_some(
        fd_.get(), std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(buffer), sizeof buffer));
    if (!n) {
      if (would_block(n.error())) continue;
      return make_error("lost the connection to the scheduler at " + path_ + ": " +
                        n.error().message);
    }
    if (n.value() == 0) {
      return make_error("the scheduler at " + path_ + " closed the connection without answering");
    }
    pending_.append(buffer, n.value());
  }
}

Result<Json> control_call(const std::string& path, const Json& request, int timeout_ms) {
  auto client = ControlClient::connect(path, timeout_ms);
  if (!client) return client.error();
  return client.value().call(request);
}

Result<Json> control_call(const std::string& path, const Request& request, int timeout_ms) {
  return control_call(path, encode(request), timeout_ms);
}

}  // namespace nvshare::control
