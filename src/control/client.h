// ControlClient: one connection to the scheduler's control socket (docs/control-api.md).
//
// Sends one JSON request per line and reads one JSON response line per request. Every failure is a
// value with a message a user can act on: the scheduler not running (no socket, connection
// refused), the socket not being ours to use (permission), no answer within the timeout, or an
// answer that is not JSON. The one client of nvsharectl, the device plugin, the pod watcher, the
// bench and the tests; requests and answers are typed (requests.h, answers.h), raw JSON only for
// tests of bad input.
#pragma once

#include <string>

#include "common/json.h"
#include "common/result.h"
#include "common/unix_socket.h"
#include "control/requests.h"

namespace nvshare::control {

class ControlClient {
 public:
  // Connects to the control socket at `path`.
  static Result<ControlClient> connect(const std::string& path, int timeout_ms = 5000);

  // Sends `request` and returns the scheduler's response (which may itself say {"ok":false,...}).
  Result<Json> call(const Request& request) { return call(encode(request)); }
  // A request as raw JSON (tests of what the scheduler does with bad input).
  Result<Json> call(const Json& request);

 private:
  Result<Json> read_response(int timeout_ms);

  ControlClient(UniqueFd fd, std::string path, int timeout_ms)
      : fd_(std::move(fd)), path_(std::move(path)), timeout_ms_(timeout_ms) {}

  UniqueFd fd_;
  std::string path_;
  int timeout_ms_;
  std::string pending_;  // bytes read past the last response line
};

// Connects, sends one request, returns the response.
Result<Json> control_call(const std::string& path, const Request& request, int timeout_ms = 5000);
Result<Json> control_call(const std::string& path, const Json& request, int timeout_ms = 5000);

// Connects, sends one typed request and reads the answer it expects, or the scheduler's refusal.
// Errors: the scheduler cannot be reached, or what came back is not that answer.
template <typename R>
Result<Reply<AnswerOf<R>>> ask(const std::string& path, const R& request, int timeout_ms = 5000) {
  auto response = control_call(path, Request(request), timeout_ms);
  if (!response) return response.error();
  return decode_reply<AnswerOf<R>>(response.value());
}

}  // namespace nvshare::control
