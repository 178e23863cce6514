#include "client/ipc_broker_client.h"

#include <poll.h>

#include <array>
#include <vector>

#include "common/protocol.h"

namespace nvshare::client {
namespace {

struct Answer {
  protocol::IpcAnswer answer;
  UniqueFd fd;
};

// Sends `request` (with `pass` attached when valid) and reads the answer frame.
Result<Answer> ask(const std::string& socket_path, const protocol::Message& request, int pass,
                   std::chrono::milliseconds timeout) {
  auto connected = connect_unix(socket_path);
  if (!connected) return make_error("scheduler: " + connected.error().message);
  UniqueFd fd = std::move(connected).value();
  if (Status s = set_nonblocking(fd.get()); !s) return s.error();
  auto frame = protocol::encode(request);
  if (!frame) return frame.error();
  const int ms = static_cast<int>(timeout.count());
  const std::span<const std::uint8_t> bytes(frame.value());
  Status sent =
      pass >= 0 ? send_with_fd(fd.get(), bytes, pass, ms) : write_all(fd.get(), bytes, ms);
  if (!sent) return make_error("scheduler: " + sent.error().message);

  protocol::FrameDecoder decoder;
  std::vector<UniqueFd> passed;
  std::array<std::uint8_t, 512> buffer{};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto n = read_some_with_fds(fd.get(), buffer, passed);
    if (!n && !would_block(n.error())) return make_error("scheduler: " + n.error().message);
    if (n && n.value() == 0) return make_error("the scheduler closed the connection unanswered");
    if (n) {
      decoder.feed(std::span<const std::uint8_t>(buffer.data(), n.value()));
      auto next = decoder.next();
      if (!next) return make_error("scheduler: " + next.error().message);
      if (next.value()) {
        auto* answer = std::get_if<protocol::IpcAnswer>(&next.value()->message);
        if (answer == nullptr) return make_error("the scheduler answered with another message");
        Answer out{*answer, passed.empty() ? UniqueFd() : std::move(passed.front())};
        return out;
      }
      continue;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return make_error("the scheduler did not answer in time");
    pollfd p{fd.get(), POLLIN, 0};
    (void)::poll(&p, 1, static_cast<int>(left.count()));
  }
}

}  // namespace

Result<std::uint64_t> ipc_export(const std::string& socket_path, int fd, std::uint64_t bytes,
                                 std::chrono::milliseconds timeout) {
  auto answer = ask(socket_path, protocol::IpcExport{bytes}, fd, timeout);
  if (!answer) return answer.error();
  if (!answer.value().answer.error.empty()) return make_error(answer.value().answer.error);
  if (answer.value().answer.token == 0) return make_error("the scheduler gave no token");
  return answer.value().answer.token;
}

Result<IpcImported> ipc_import(const std::string& socket_path, std::uint64_t token,
                               std::chrono::milliseconds timeout) {
  auto answer = ask(socket_path, protocol::IpcImport{token}, -1, timeout);
  if (!answer) return answer.error();
  if (!answer.value().answer.error.empty()) return make_error(answer.value().answer.error);
  if (!answer.value().fd.valid()) return make_error("the scheduler sent no descriptor");
  return IpcImported{std::move(answer.value().fd), answer.value().answer.bytes};
}

Status ipc_withdraw(const std::string& socket_path, std::uint64_t token,
                    std::chrono::milliseconds timeout) {
  auto answer = ask(socket_path, protocol::IpcWithdraw{token}, -1, timeout);
  if (!answer) return answer.error();
  if (!answer.value().answer.error.empty()) return make_error(answer.value().answer.error);
  return Status::Ok();
}

}  // namespace nvshare::client
