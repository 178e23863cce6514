// MetricsEndpoint: GET /metrics over HTTP/1.1 on a thread of its own (docs/metrics.md).
//
// The thread serves up to kMaxConnections connections at once, reads each request head and answers:
// GET /metrics with what `render` returns (200, text format 0.0.4; 503 with the error's message
// when it fails), GET / with a pointer to /metrics, other paths 404, other methods 405, a request
// that does not parse 400. Each connection has kIoTimeout for its whole request and answer; when
// every place is taken the connection that has waited longest is closed for a new one, so slow or
// silent connections delay a scraper by at most that long. `render` runs on this thread (what it
// reads must be safe to read from there), at most once per kRenderCache: scrapers that come
// together get the same text.
//
// Contract
//  - start() binds and listens on `address` ("host:port"; an empty host is every interface, port 0
//    picks a free one) and starts the thread; it fails on a malformed address or a bind error.
//  - The destructor stops the thread (within one poll interval).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "common/mono_time.h"
#include "common/result.h"
#include "common/unix_socket.h"

namespace nvshare {

// "host:port", "[v6]:port" or ":port" (every interface) into host and port; fails unless the port
// is a number of 0..65535.
Result<std::pair<std::string, std::string>> split_host_port(std::string_view address);

// The metrics-address knob of each program: an empty value (no endpoint) or host:port, stored in
// `out` when it is one of those; an error naming what is wrong otherwise (`out` unchanged).
Status store_metrics_address(std::string_view value, std::string& out);

class MetricsEndpoint {
 public:
  static constexpr Duration kIoTimeout = std::chrono::seconds(5);
  static constexpr std::size_t kMaxRequestBytes = 8192;
  static constexpr std::size_t kMaxConnections = 8;
  static constexpr Duration kRenderCache = std::chrono::milliseconds(100);

  using Render = std::function<Result<std::string>()>;

  // `component` names the program in the answer to GET /.
  static Result<std::unique_ptr<MetricsEndpoint>> start(const std::string& address,
                                                        std::string component, Render render);
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
  ~MetricsEndpoint();

  // The address bound, "host:port" with the port resolved.
  const std::string& address() const { return address_; }

 private:
  MetricsEndpoint(std::string component, Render render);
  void serve();
  // `line`: the request line; empty when the request will never parse (answered 400).
  void answer(int fd, const std::string& line);
  Result<std::string> rendered();

  std::string component_;
  Render render_;
  UniqueFd listener_;
  UniqueFd stop_;                      // eventfd: destructor -> thread
  std::optional<std::string> cached_;  // the last rendering, and when (the serving thread's)
  MonoTime cached_at_{};
  std::string address_;
  std::thread thread_;
};

}  // namespace nvshare
