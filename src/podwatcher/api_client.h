// ApiClient: HTTP requests to the Kubernetes API server over libcurl, interruptible.
//
// One ApiClient belongs to one thread (libcurl handles are not shared); only interrupt() may be
// called from another thread. Every request re-reads the credentials' token file, so a rotated
// token is used from the next request on. A transfer runs on a multi handle and waits with
// curl_multi_poll, so interrupt() (curl_multi_wakeup) ends it at once: the request then fails with
// an error whose `interrupted` flag is set. After interrupt() every later request fails the same
// way (the client is being shut down).
//
// Limits: connecting and a plain request are bounded by `request_timeout`; a streamed response by
// `stream_timeout` (the watch's own timeoutSeconds plus a margin), with TCP keepalive so a dead
// peer is noticed. Response bodies of plain requests are capped at 256 MiB.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/result.h"
#include "podwatcher/kube_credentials.h"

namespace nvshare::podwatcher {

struct HttpResponse {
  long status = 0;
  std::string body;  // plain requests: the body; streamed: the body of a non-200 answer only
};

struct HttpFailure {
  std::string message;
  bool interrupted = false;
};

class ApiClient {
 public:
  ApiClient(ApiCredentials credentials, std::chrono::milliseconds request_timeout,
            std::string user_agent);
  ~ApiClient();
  ApiClient(const ApiClient&) = delete;
  ApiClient& operator=(const ApiClient&) = delete;

  // `path` starts with "/" and includes the query. Fails only when no HTTP response arrived.
  bool request(const std::string& method, const std::string& path, const std::string& body,
               HttpResponse* response, HttpFailure* failure);
  // GET `path` and hand the body of a 200 answer to `on_data` as it arrives; `on_data` returns
  // false to end the transfer early (success). A non-200 answer's body is collected instead.
  // Returns false when the transfer failed (dropped connection, timeout, interrupt).
  bool stream(const std::string& path, std::chrono::milliseconds stream_timeout,
              const std::function<bool(std::string_view)>& on_data, HttpResponse* response,
              HttpFailure* failure);

  void interrupt();
  bool interrupted() const { return interrupted_.load(); }

 private:
  struct Transfer;
  bool perform(Transfer& transfer, HttpFailure* failure);

  ApiCredentials credentials_;
  std::chrono::milliseconds request_timeout_;
  std::string user_agent_;
  void* multi_ = nullptr;  // CURLM*
  std::atomic<bool> interrupted_{false};
};

}  // namespace nvshare::podwatcher
