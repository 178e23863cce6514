// MetricsServer: GET /metrics over HTTP/1.1 (docs/metrics.md), on a thread of its own.
//
// The server never touches the scheduler's state. For a scrape it asks the reactor for a snapshot
// (an eventfd the reactor watches; once the batch that saw it has written its output, the reactor
// takes a MetricsSnapshot and hands it over), then renders and writes the exposition on its own
// thread. Scrapes within kFreshFor of the last snapshot share it, so however many scrapers there
// are the reactor takes at most one snapshot per kFreshFor. A slow or stalled scraper holds only
// this thread (every read and write has a timeout); grants never wait for it.
//
// Contract
//  - start() binds and listens on `address` (common/metrics_endpoint.h serves the HTTP side) and
//    registers the eventfd with `reactor`; call it on the reactor's thread.
//  - The destructor stops the endpoint's thread and unregisters the eventfd; call it on the
//    reactor's thread, while the reactor still exists.
//  - Answers as MetricsEndpoint does; 503 when the reactor gave no snapshot within kSnapshotWait.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/metrics_endpoint.h"
#include "common/result.h"
#include "common/unix_socket.h"
#include "scheduler/metrics.h"
#include "scheduler/reactor.h"

namespace nvshare::scheduler {

using nvshare::split_host_port;

class MetricsServer {
 public:
  static constexpr Duration kFreshFor = std::chrono::milliseconds(100);
  static constexpr Duration kSnapshotWait = std::chrono::seconds(2);

  using Snapshotter = std::function<MetricsSnapshot()>;

  static Result<std::unique_ptr<MetricsServer>> start(const std::string& address, Reactor& reactor,
                                                      Snapshotter snapshotter);
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  ~MetricsServer();

  // The address bound, "host:port" with the port resolved.
  const std::string& address() const { return endpoint_->address(); }
  std::uint64_t snapshots_taken() const { return snapshots_.load(std::memory_order_relaxed); }

 private:
  MetricsServer(Reactor& reactor, Snapshotter snapshotter);

  // Reactor thread: the eventfd is readable, a scrape waits; defers publish() past the batch.
  void on_wanted();
  // Reactor thread, after the batch's output: takes and publishes a snapshot.
  void publish();
  // Endpoint thread: a snapshot no older than kFreshFor, or nullptr after kSnapshotWait.
  std::shared_ptr<const MetricsSnapshot> fresh_snapshot();

  Reactor& reactor_;
  Snapshotter snapshotter_;
  std::shared_ptr<MetricsServer*> self_ = std::make_shared<MetricsServer*>(this);
  UniqueFd wanted_;  // eventfd: endpoint thread -> reactor

  std::mutex mu_;
  std::condition_variable published_;
  std::shared_ptr<const MetricsSnapshot> latest_;
  MonoTime latest_at_{};
  std::uint64_t generation_ = 0;
  std::atomic<std::uint64_t> snapshots_{0};
  double last_snapshot_s_ = 0;  // reactor thread only
  std::unique_ptr<MetricsEndpoint> endpoint_;
};

}  // namespace nvshare::scheduler
