// Metrics: the scheduler's state in the Prometheus text exposition format (version 0.0.4),
// rendered from a snapshot, never from live state (docs/metrics.md lists every family).
//
// The reactor takes a MetricsSnapshot (a copy of the status snapshot and of its own counters) when
// the metrics server asks for one; rendering happens on the server's thread. Names carry the
// `nvshare_` prefix and base units (bytes, seconds, ratios 0..1); counters end in `_total`. Series
// are per GPU, per pod and per client process; a client's series go when it disconnects, so the
// number of series follows the number of clients.
#pragma once

#include <cstdint>
#include <string>

#include "scheduler/bucket_histogram.h"
#include "scheduler/daemon_stats.h"
#include "scheduler/scheduler.h"

namespace nvshare::scheduler {

struct MetricsSnapshot {
  StatusSnapshot status;
  DaemonStats stats;
  std::size_t sessions = 0;  // connections open now (registered or not)
  double start_time_s = 0;   // the scheduler's start, in seconds since the Unix epoch
  std::string version;
  // How long the reactor took to take the previous snapshot (its cost to the scheduler's loop).
  double previous_snapshot_s = 0;
};

// The exposition for one scrape.
std::string render_metrics(const MetricsSnapshot& snapshot);

}  // namespace nvshare::scheduler
