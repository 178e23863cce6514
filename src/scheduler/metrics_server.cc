#include "scheduler/metrics_server.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"

namespace nvshare::scheduler {

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& address,
                                                            Reactor& reactor,
                                                            Snapshotter snapshotter) {
  std::unique_ptr<MetricsServer> server(new MetricsServer(reactor, std::move(snapshotter)));
  server->wanted_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!server->wanted_.valid()) {
    return make_error(std::string("metrics: eventfd: ") + std::strerror(errno));
  }
  MetricsServer* self = server.get();
  auto endpoint =
      MetricsEndpoint::start(address, "nvshare-scheduler", [self]() -> Result<std::string> {
        const std::shared_ptr<const MetricsSnapshot> snapshot = self->fresh_snapshot();
        if (!snapshot) return make_error("the scheduler gave no snapshot in time");
        return render_metrics(*snapshot);
      });
  if (!endpoint.ok()) return endpoint.error();
  Status added =
      reactor.add(server->wanted_.get(), EPOLLIN, [self](std::uint32_t) { self->on_wanted(); });
  if (!added.ok()) return added.error();
  server->endpoint_ = std::move(endpoint).value();
  return server;
}

MetricsServer::MetricsServer(Reactor& reactor, Snapshotter snapshotter)
    : reactor_(reactor), snapshotter_(std::move(snapshotter)) {}

MetricsServer::~MetricsServer() {
  endpoint_.reset();  // no scrape waits on the reactor from here on
  if (wanted_.valid()) reactor_.remove(wanted_.get());
}

void MetricsServer::on_wanted() {
  std::uint64_t count = 0;
  if (read(wanted_.get(), &count, sizeof count) < 0) return;  // nothing asked (spurious)
  // Taken after the batch's output is written: a grant decided in this batch never waits for it.
  // The task may outlive this server (it is destroyed while the reactor still exists).
  reactor_.defer([self = std::weak_ptr<MetricsServer*>(self_)] {
    if (auto server = self.lock()) (*server)->publish();
  });
}

void MetricsServer::publish() {
  const MonoTime started = SteadyClock::instance().now();
  auto snapshot = std::make_shared<MetricsSnapshot>(snapshotter_());
  snapshot->previous_snapshot_s = last_snapshot_s_;
  last_snapshot_s_ = to_seconds(SteadyClock::instance().now() - started);
  snapshots_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(mu_);
    latest_ = std::move(snapshot);
    latest_at_ = SteadyClock::instance().now();
    ++generation_;
  }
  published_.notify_all();
}

std::shared_ptr<const MetricsSnapshot> MetricsServer::fresh_snapshot() {
  std::unique_lock lock(mu_);
  if (latest_ && SteadyClock::instance().now() - latest_at_ < kFreshFor) return latest_;
  const std::uint64_t seen = generation_;
  const std::uint64_t one = 1;
  if (write(wanted_.get(), &one, sizeof one) < 0 && errno != EAGAIN) return nullptr;
  if (!published_.wait_for(lock, kSnapshotWait, [&] { return generation_ != seen; }))
    return nullptr;
  return latest_;
}

}  // namespace nvshare::scheduler
