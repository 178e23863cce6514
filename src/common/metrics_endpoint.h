// MetricsEndpoint: GET /metrics over HTTP/1.1 on a thread of its own (docs/metrics.md).
//
// The thread accepts one connection at a time, reads the request head and answers: GET /metrics
// with what `render` returns (200, text format 0.0.4; 503 with the error's message when it fails),
// GET / with a pointer to /metrics, other paths 404, other methods 405, a request that does not
// parse 400. Every read and write has a timeout (kIoTimeout), so a slow or stalled scraper holds
// only this thread. `render` runs on this thread: what it reads must be safe to read from there.
//
// Contract
//  - start() binds and listens on `address` ("host:port"; an empty host is every interface, port 0
//    picks a free one) and starts the thread; it fails on a malformed address or a bind error.
//  - The destructor stops the thread (within one poll interval).
#pragma once

#include <functional>
#include <memory>
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
  void answer(int fd);

  std::string component_;
  Render render_;
  UniqueFd listener_;
  UniqueFd stop_;  // eventfd: destructor -> thread
  std::string address_;
  std::thread thread_;
};

}  // namespace nvshare
