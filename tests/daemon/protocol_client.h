// ProtocolClient: a scripted client of the scheduler's wire protocol for tests and the benchmark.
//
// It speaks through the same codec as the real client library (src/common/protocol.h) over a plain
// unix socket, one call per step, so a test reads like the conversation it checks:
//
//   auto a = ProtocolClient::connect(path).value();
//   auto welcome = a.hello(hello_for("GPU-1")).value();
//   a.send(protocol::Request{});
//   auto grant = a.expect<protocol::Grant>(1s).value();
//
// Every wait has a timeout and every failure is an Error value whose message says what arrived
// instead
// ("expected grant, got wait(memory)", "timed out after 1000 ms", "connection closed"), so a
// failing test explains itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "common/result.h"
#include "common/unix_socket.h"

namespace nvshare::testing {

using namespace std::chrono_literals;
using Millis = std::chrono::milliseconds;

// A hello for `gpu` with the defaults tests want (80 GiB GPU, pid of this process).
protocol::Hello hello_for(const std::string& gpu, const std::string& pod_uid = "");

// Renders a message for failure messages: "grant(epoch 3)", "wait(memory)", ...
std::string describe(const protocol::Message& message);

class ProtocolClient {
 public:
  static Result<ProtocolClient> connect(const std::string& path);

  Status send(const protocol::Message& message);
  Status send_raw(std::span<const std::uint8_t> bytes);

  // The next frame, waiting up to `timeout`. Errors: timeout, connection closed, malformed frame.
  Result<protocol::Message> next(Millis timeout);

  // The next frame, which must be a T.
  template <typename T>
  Result<T> expect(Millis timeout) {
    auto message = next(timeout);
    if (!message) return message.error();
    if (const T* typed = std::get_if<T>(&message.value())) return *typed;
    return make_error("expected " + describe(protocol::Message(T{})) + ", got " +
                      describe(message.value()));
  }

  // Skips frames until a T arrives (other frames are kept in `skipped` when given).
  template <typename T>
  Result<T> wait_for(Millis timeout, std::vector<protocol::Message>* skipped = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
      auto message = next(left.count() > 0 ? left : Millis(0));
      if (!message) return message.error();
      if (const T* typed = std::get_if<T>(&message.value())) return *typed;
      if (skipped != nullptr) skipped->push_back(message.value());
    }
  }

  // Sends hello and returns the welcome.
  Result<protocol::Welcome> hello(const protocol::Hello& hello, Millis timeout = 2000ms);

  // True when the scheduler closes the connection within `timeout` (frames before it are
  // discarded).
  bool closed_within(Millis timeout);
  // True when no frame arrives (and the connection stays open) for `duration`.
  bool quiet_for(Millis duration);

  void close() { fd_.reset(); }
  int fd() const { return fd_.get(); }
  std::uint64_t client_id() const { return client_id_; }

 private:
  explicit ProtocolClient(UniqueFd fd) : fd_(std::move(fd)) {}

  UniqueFd fd_;
  protocol::FrameDecoder decoder_;
  std::uint64_t client_id_ = 0;
};

}  // namespace nvshare::testing
