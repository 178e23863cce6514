#include "scheduler/client_session.h"

#include <array>
#include <type_traits>

#include "common/log.h"

namespace nvshare::scheduler {
namespace {

// Bytes read per readable event before yielding to other connections (the loop is level-triggered,
// so whatever is left is read on the next iteration).
constexpr std::size_t kReadChunk = std::size_t{64} * 1024;
constexpr int kMaxReadsPerEvent = 4;

}  // namespace

ClientSession::ClientSession(UniqueFd fd, ClientIdentity peer, Scheduler& scheduler,
                             SessionHost& host, DaemonStats& stats, std::uint64_t serial)
    : fd_(std::move(fd)),
      peer_(std::move(peer)),
      scheduler_(scheduler),
      host_(host),
      stats_(stats),
      serial_(serial) {}

void ClientSession::close_with(std::string reason) {
  if (closing_) return;
  closing_ = true;
  close_reason_ = std::move(reason);
}

void ClientSession::on_readable(MonoTime now) {
  static thread_local std::array<std::uint8_t, kReadChunk> buffer;
  for (int i = 0; i < kMaxReadsPerEvent && !closing_; ++i) {
    auto n = read_some_with_fds(fd_.get(), buffer, passed_);
    if (!n) {
      if (would_block(n.error())) return;
      close_with(n.error().message);
      return;
    }
    if (n.value() == 0) {
      close_with(decoder_.buffered() > 0 ? "end of stream inside a frame" : "end of stream");
      return;
    }
    // Descriptors are held only for the one frame that may carry one: an IPC export, the first
    // and only frame of a connection of its own. A registered session never needs any, and no
    // connection may hold more than one while its frame arrives a byte at a time: each is closed
    // at once, with the session.
    if (!passed_.empty() && (client_ != 0 || passed_.size() > 1)) {
      ++stats_.closed_protocol;
      const std::size_t count = passed_.size();
      passed_.clear();
      close_with(std::to_string(count) + " descriptors sent " +
                 (client_ != 0 ? "on a registered session" : "before one frame completed"));
      return;
    }
    stats_.bytes_in += n.value();
    decoder_.feed(std::span<const std::uint8_t>(buffer.data(), n.value()));
    for (;;) {
      auto frame = decoder_.next();
      if (!frame) {
        ++stats_.closed_malformed;
        close_with(frame.error().message);
        return;
      }
      if (!frame.value()) break;
      handle(*frame.value(), now);
      if (closing_) return;
    }
    if (n.value() < buffer.size()) return;  // drained the socket
  }
}

void ClientSession::handle(const protocol::Frame& frame, MonoTime now) {
  const protocol::MessageType type = protocol::type_of(frame.message);
  stats_.count_in(type);
  if (client_ == 0 &&
      (type == protocol::MessageType::kIpcExport || type == protocol::MessageType::kIpcImport ||
       type == protocol::MessageType::kIpcWithdraw)) {
    handle_ipc(frame.message);
    return;
  }
  if (!passed_.empty()) {
    ++stats_.closed_protocol;
    close_with("descriptors sent with " + std::string(protocol::to_string(type)));
    return;
  }
  if (client_ == 0 && type != protocol::MessageType::kHello) {
    ++stats_.closed_protocol;
    close_with("expected hello, got " + std::string(protocol::to_string(type)));
    return;
  }
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, protocol::Hello>) {
          if (client_ != 0) {
            ++stats_.closed_protocol;
            close_with("second hello on a session");
            return;
          }
          handle_hello(m, now);
        } else if constexpr (std::is_same_v<T, protocol::Request>) {
          host_.decision_started(now);
          scheduler_.request(client_, now);
          host_.decision_started(std::nullopt);
        } else if constexpr (std::is_same_v<T, protocol::Released>) {
          host_.decision_started(now);
          scheduler_.release(client_, m, now);
          host_.decision_started(std::nullopt);
        } else if constexpr (std::is_same_v<T, protocol::Usage>) {
          scheduler_.usage(client_, m, now);
        } else if constexpr (std::is_same_v<T, protocol::Ping>) {
          queue(protocol::Pong{m.nonce});
        } else if constexpr (std::is_same_v<T, protocol::Pong>) {
          // Answers to pings we never send are harmless.
        } else {
          ++stats_.closed_protocol;
          close_with("client sent " + std::string(protocol::to_string(type)) +
                     ", a scheduler-to-client message");
        }
      },
      frame.message);
}

void ClientSession::handle_hello(const protocol::Hello& hello, MonoTime now) {
  const auto version = protocol::negotiate_version(hello.min_version, hello.max_version);
  if (!version) {
    ++stats_.closed_version;
    close_with("no common protocol version (client speaks " + std::to_string(hello.min_version) +
               ".." + std::to_string(hello.max_version) + ", scheduler " +
               std::to_string(protocol::kMinVersion) + ".." +
               std::to_string(protocol::kMaxVersion) + ")");
    return;
  }
  if (hello.gpu_uuid.empty()) {
    ++stats_.closed_protocol;
    close_with("hello names no GPU");
    return;
  }
  if (!scheduler_.knows_gpu(hello.gpu_uuid)) {
    ++stats_.closed_unknown_gpu;
    close_with("GPU " + hello.gpu_uuid + " is not one of this node's GPUs");
    return;
  }
  version_ = *version;
  client_ = scheduler_.next_client_id();
  host_.bind(client_, *this);
  queue(protocol::Welcome{version_, client_, 0});
  if (Status s = scheduler_.register_client(client_, peer_, hello, now); !s) {
    ++stats_.closed_protocol;
    close_with(s.error().message);
  }
}

void ClientSession::handle_ipc(const protocol::Message& message) {
  const bool exporting = std::holds_alternative<protocol::IpcExport>(message);
  if (passed_.size() > (exporting ? 1u : 0u)) {
    ++stats_.closed_protocol;
    close_with("an ipc request came with " + std::to_string(passed_.size()) + " descriptors");
    return;
  }
  UniqueFd passed;
  if (!passed_.empty()) passed = std::move(passed_.front());
  passed_.clear();
  SessionHost::IpcReply reply = host_.ipc(peer_, message, std::move(passed));
  std::vector<std::uint8_t> frame;
  (void)protocol::encode_to(reply.answer, frame, version_);
  stats_.count_out(protocol::MessageType::kIpcAnswer);
  // One small frame on a connection that has sent nothing yet: the socket buffer takes it; a peer
  // that does not read within the bound only loses its answer.
  constexpr int kAnswerTimeoutMs = 100;
  const std::span<const std::uint8_t> bytes(frame);
  const Status sent = reply.fd.valid()
                          ? send_with_fd(fd_.get(), bytes, reply.fd.get(), kAnswerTimeoutMs)
                          : write_all(fd_.get(), bytes, kAnswerTimeoutMs);
  close_with(sent ? kIpcAnswered : "ipc answer not sent: " + sent.error().message);
}

void ClientSession::queue(const protocol::Message& message) {
  // Advice a peer's version lacks (a swap notice to a version 7 client) is not sent.
  if (version_ < protocol::introduced_in(protocol::type_of(message))) return;
  // Every message the scheduler sends fits the protocol's limits, so encoding cannot fail here.
  (void)protocol::encode_to(message, outbox_.buffer(), version_);
  stats_.count_out(protocol::type_of(message));
  host_.output_queued(*this);
}

void ClientSession::mark_decision(MonoTime started) {
  marks_.push_back(Mark{outbox_.appended_total(), started});
}

void ClientSession::collect_written(LatencyHistogram& histogram, BucketHistogram& buckets,
                                    MonoTime now) {
  while (!marks_.empty() && marks_.front().end <= outbox_.sent_total()) {
    histogram.record(now - marks_.front().started);
    buckets.record(now - marks_.front().started);
    marks_.pop_front();
  }
}

}  // namespace nvshare::scheduler
