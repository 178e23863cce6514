#include "protocol_client.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <type_traits>

namespace nvshare::testing {

protocol::Hello hello_for(const std::string& gpu, const std::string& pod_uid) {
  protocol::Hello hello;
  hello.pid = static_cast<std::uint32_t>(::getpid());
  hello.gpu_uuid = gpu;
  hello.gpu_memory_bytes = 80ull << 30;
  hello.capabilities = protocol::capability::kSwap | protocol::capability::kUsageReports;
  hello.pod_uid = pod_uid;
  hello.process_name = "scripted-client";
  return hello;
}

std::string describe(const protocol::Message& message) {
  return std::visit(
      [](const auto& m) -> std::string {
        using T = std::decay_t<decltype(m)>;
        const std::string name(protocol::to_string(protocol::type_of(protocol::Message(m))));
        if constexpr (std::is_same_v<T, protocol::Grant>) {
          return name + "(epoch " + std::to_string(m.epoch) + ")";
        } else if constexpr (std::is_same_v<T, protocol::Revoke>) {
          return name + "(epoch " + std::to_string(m.epoch) + ", " +
                 std::string(protocol::to_string(m.reason)) + (m.swap_out ? ", swap out)" : ")");
        } else if constexpr (std::is_same_v<T, protocol::Wait>) {
          return name + "(" + std::string(protocol::to_string(m.reason)) + ")";
        } else if constexpr (std::is_same_v<T, protocol::SetLimits>) {
          return name + "(memory " + std::to_string(m.limits.memory_bytes) + ", core " +
                 std::to_string(m.limits.core_percent) + ")";
        } else if constexpr (std::is_same_v<T, protocol::Welcome>) {
          return name + "(version " + std::to_string(m.version) + ", client " +
                 std::to_string(m.client_id) + ")";
        } else {
          return name;
        }
      },
      message);
}

Result<ProtocolClient> ProtocolClient::connect(const std::string& path) {
  auto fd = connect_unix(path);
  if (!fd) return fd.error();
  return ProtocolClient(std::move(fd).value());
}

Status ProtocolClient::send(const protocol::Message& message) {
  auto bytes = protocol::encode(message);
  if (!bytes) return bytes.error();
  return send_raw(bytes.value());
}

Status ProtocolClient::send_raw(std::span<const std::uint8_t> bytes) {
  if (!fd_.valid()) return make_error("not connected");
  return write_all(fd_.get(), bytes, 5000);
}

Result<protocol::Message> ProtocolClient::next(Millis timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto frame = decoder_.next();
    if (!frame) return make_error("malformed frame from the scheduler: " + frame.error().message);
    if (frame.value()) return std::move(frame.value()->message);
    if (!fd_.valid()) return make_error("not connected");
    const auto left =
        std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    if (left.count() < 0)
      return make_error("timed out after " + std::to_string(timeout.count()) + " ms");
    pollfd p{fd_.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return make_error("timed out after " + std::to_string(timeout.count()) + " ms");
    std::uint8_t buffer[16384];
    auto n = read_some(fd_.get(), buffer);
    if (!n) {
      if (would_block(n.error())) continue;
      return make_error("connection closed (" + n.error().message + ")");
    }
    if (n.value() == 0) return make_error("connection closed");
    decoder_.feed(std::span<const std::uint8_t>(buffer, n.value()));
  }
}

Result<protocol::Welcome> ProtocolClient::hello(const protocol::Hello& hello, Millis timeout) {
  if (Status s = send(hello); !s) return s.error();
  auto welcome = expect<protocol::Welcome>(timeout);
  if (welcome) client_id_ = welcome.value().client_id;
  return welcome;
}

bool ProtocolClient::closed_within(Millis timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    if (left.count() < 0) return false;
    auto message = next(left);
    if (message) continue;
    return message.error().message.rfind("connection closed", 0) == 0;
  }
}

bool ProtocolClient::quiet_for(Millis duration) {
  auto message = next(duration);
  return !message && message.error().message.rfind("timed out", 0) == 0;
}

}  // namespace nvshare::testing
