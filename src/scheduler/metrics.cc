#include "scheduler/metrics.h"

#include <cmath>
#include <functional>
#include <string_view>
#include <vector>

#include "common/exposition.h"

namespace nvshare::scheduler {
namespace {

using policy::ClientState;
using policy::kRevokeReasons;
using policy::kWaitReasons;
using protocol::RevokeReason;
using protocol::WaitReason;

// The histogram samples of a family: cumulative buckets, sum and count.
void histogram(Exposition& out, const Labels& labels, const BucketHistogram& h) {
  for (std::size_t i = 0; i <= BucketHistogram::kBounds.size(); ++i) {
    std::string le = "+Inf";
    if (i < BucketHistogram::kBounds.size()) {
      le.clear();
      append_number(le, BucketHistogram::kBounds[i]);
    }
    out.sample(labels.with("le", le), h.cumulative(i), "_bucket");
  }
  out.sample(labels, h.sum_seconds(), "_sum");
  out.sample(labels, h.count(), "_count");
}

double seconds(Duration d) { return to_seconds(d); }
double ratio(double percent) { return percent / 100.0; }

struct ClientRow {
  const GpuStatus* gpu;
  const ClientStatus* client;
  Labels labels;
};

std::vector<ClientRow> client_rows(const StatusSnapshot& status) {
  std::vector<ClientRow> rows;
  for (const GpuStatus& gpu : status.gpus) {
    for (const ClientStatus& c : gpu.clients) {
      Labels labels;
      labels.add("gpu", gpu.uuid)
          .add("client", std::to_string(c.id))
          .add("pid", std::to_string(c.pid))
          .add("process", c.process_name)
          .add("namespace", c.pod_namespace.value_or(""))
          .add("pod", c.pod_name.value_or(""))
          .add("pod_uid", c.pod_uid.value_or(""))
          .add("container_id", c.container_id.value_or(""));
      rows.push_back(ClientRow{&gpu, &c, std::move(labels)});
    }
  }
  return rows;
}

void node_families(Exposition& e, const MetricsSnapshot& s) {
  e.family("nvshare_scheduler_info", "gauge", "The scheduler's version (always 1).");
  e.sample(Labels().add("version", s.version), std::uint64_t{1});
  e.scalar("nvshare_scheduler_start_time_seconds", "gauge",
           "When the scheduler started, in seconds since the Unix epoch.", s.start_time_s);
  e.scalar("nvshare_gpus", "gauge", "GPUs the scheduler has a policy for (one client seen).",
           static_cast<std::uint64_t>(s.status.gpus.size()));
  std::uint64_t clients = 0;
  for (const GpuStatus& g : s.status.gpus) clients += g.clients.size();
  e.scalar("nvshare_clients", "gauge", "Registered client processes, all GPUs.", clients);
  e.scalar("nvshare_sessions", "gauge", "Open client connections, registered or not.",
           static_cast<std::uint64_t>(s.sessions));
  e.scalar("nvshare_resumed_sessions_total", "counter",
           "Sessions whose client had lost an earlier one (the scheduler restarted or dropped it): "
           "after a restart, one per client process and GPU that came back.",
           s.status.resumed_sessions);
  const DaemonStats& d = s.stats;
  e.scalar("nvshare_sessions_opened_total", "counter", "Client connections accepted.",
           d.sessions_opened);
  e.family("nvshare_sessions_closed_by_scheduler_total", "counter",
           "Client connections the scheduler closed, by reason.");
  const std::pair<std::string_view, std::uint64_t> closed[] = {
      {"malformed", d.closed_malformed},     {"protocol", d.closed_protocol},
      {"version", d.closed_version},         {"slow", d.closed_slow},
      {"unknown_gpu", d.closed_unknown_gpu}, {"no_hello", d.closed_no_hello},
      {"unidentified", d.refused_identity},  {"session_limit", d.refused_limit},
      {"descriptors", d.refused_descriptors}};
  for (const auto& [reason, n] : closed) e.sample(Labels().add("reason", reason), n);
  e.scalar("nvshare_received_bytes_total", "counter", "Bytes read from client connections.",
           d.bytes_in);
  e.scalar("nvshare_sent_bytes_total", "counter", "Bytes written to client connections.",
           d.bytes_out);
  e.scalar("nvshare_control_requests_total", "counter", "Control API requests served.",
           d.control_requests);
  e.family("nvshare_ipc_requests_total", "counter",
           "CUDA IPC requests: exports accepted, imports served, imports refused (another pod or "
           "user, or an unknown handle).");
  const std::pair<std::string_view, std::uint64_t> ipc[] = {
      {"export", d.ipc_exports}, {"import", d.ipc_imports}, {"refused", d.ipc_refused}};
  for (const auto& [kind, n] : ipc) e.sample(Labels().add("kind", kind), n);
  e.scalar("nvshare_metrics_snapshot_seconds", "gauge",
           "How long the scheduler's loop spent taking the previous metrics snapshot.",
           s.previous_snapshot_s);
  e.family("nvshare_handoff_latency_seconds", "histogram",
           "From a request or release being read to the grant it caused being written "
           "(one observation per grant).");
  histogram(e, Labels(), d.decision_buckets);
}

void gpu_families(Exposition& e, const StatusSnapshot& s) {
  const auto each = [&](std::string_view name, std::string_view type, std::string_view help,
                        const std::function<void(const GpuStatus&, const Labels&)>& fn) {
    e.family(name, type, help);
    for (const GpuStatus& g : s.gpus) fn(g, Labels().add("gpu", g.uuid));
  };
  each("nvshare_gpu_info", "gauge", "A GPU's scheduling mode (always 1).",
       [&](const GpuStatus& g, const Labels& l) {
         e.sample(l.with("mode", policy::to_string(g.config.mode)), std::uint64_t{1});
       });
  each("nvshare_gpu_memory_bytes", "gauge", "The GPU's physical memory.",
       [&](const GpuStatus& g, const Labels& l) { e.sample(l, g.memory_bytes); });
  each("nvshare_gpu_capacity_bytes", "gauge",
       "The memory the scheduler plans with (a virtual capacity, or the device's).",
       [&](const GpuStatus& g, const Labels& l) { e.sample(l, g.view.capacity_bytes); });
  each("nvshare_gpu_usable_bytes", "gauge", "The capacity less the reserve.",
       [&](const GpuStatus& g, const Labels& l) { e.sample(l, g.view.usable_bytes); });
  each("nvshare_gpu_running_bytes", "gauge", "Working sets of the clients holding the GPU.",
       [&](const GpuStatus& g, const Labels& l) { e.sample(l, g.view.running_bytes); });
  each("nvshare_gpu_clients", "gauge", "Clients on the GPU, by state.",
       [&](const GpuStatus& g, const Labels& l) {
         for (const ClientState state :
              {ClientState::kIdle, ClientState::kWaiting, ClientState::kRunning,
               ClientState::kRevoking, ClientState::kUnresponsive}) {
           std::uint64_t n = 0;
           for (const ClientStatus& c : g.clients) n += c.view.state == state ? 1 : 0;
           e.sample(l.with("state", policy::to_string(state)), n);
         }
       });
  each("nvshare_gpu_queue_length", "gauge", "Clients waiting for the GPU.",
       [&](const GpuStatus& g, const Labels& l) {
         e.sample(l, static_cast<std::uint64_t>(g.view.queue.size()));
       });
  each("nvshare_gpu_quantum_seconds", "gauge", "The quantum that applies now.",
       [&](const GpuStatus& g, const Labels& l) { e.sample(l, seconds(g.view.quantum)); });
  each("nvshare_gpu_swap_bandwidth_bytes_per_second", "gauge",
       "The swap bandwidth the scheduler plans turns with (measured by clients, or the default).",
       [&](const GpuStatus& g, const Labels& l) { e.sample(l, g.view.swap_bytes_per_s); });
  each("nvshare_gpu_grants_total", "counter", "Grants made on the GPU.",
       [&](const GpuStatus& g, const Labels& l) { e.sample(l, g.view.last_epoch); });
  each("nvshare_gpu_unresponsive_holders_total", "counter",
       "Holders that did not answer a revoke within the grace period.",
       [&](const GpuStatus& g, const Labels& l) { e.sample(l, g.view.unresponsive_holders); });
  each("nvshare_gpu_drain_seconds", "histogram",
       "From a revoke to the client's queued work being done, as the clients measure it.",
       [&](const GpuStatus& g, const Labels& l) { histogram(e, l, g.drains); });
}

void client_families(Exposition& e, const std::vector<ClientRow>& rows) {
  const auto each = [&](std::string_view name, std::string_view type, std::string_view help,
                        const std::function<void(const ClientStatus&, const Labels&)>& fn) {
    e.family(name, type, help);
    for (const ClientRow& r : rows) fn(*r.client, r.labels);
  };
  each("nvshare_client_memory_allocated_bytes", "gauge",
       "Device memory the process has allocated (its working set).",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.view.allocated_bytes); });
  each("nvshare_client_memory_resident_bytes", "gauge",
       "Of that, what is on the GPU now (the rest is swapped to host memory).",
       [&](const ClientStatus& c, const Labels& l) {
         e.sample(l, std::min(c.view.resident_bytes, c.view.allocated_bytes));
       });
  each("nvshare_client_memory_swapped_bytes", "gauge", "Allocated memory now in host memory.",
       [&](const ClientStatus& c, const Labels& l) {
         const std::uint64_t resident = std::min(c.view.resident_bytes, c.view.allocated_bytes);
         e.sample(l, c.view.allocated_bytes - resident);
       });
  each("nvshare_client_memory_pinned_bytes", "gauge",
       "Allocated memory that stays on the GPU when the process swaps out (mapped by another "
       "process through CUDA IPC).",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.view.pinned_bytes); });
  each("nvshare_client_memory_parked_bytes", "gauge",
       "Memory the process keeps on the GPU while it holds no grant (counted for the others, "
       "evicted when the next process to run needs the room).",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.view.parked_bytes); });
  each("nvshare_client_memory_limit_bytes", "gauge",
       "The process's memory limit (no series: no limit).",
       [&](const ClientStatus& c, const Labels& l) {
         if (c.limits.memory_bytes > 0) e.sample(l, c.limits.memory_bytes);
       });
  each("nvshare_client_sessions_lost", "gauge",
       "Sessions with a scheduler this process's link to the GPU had and lost before this one.",
       [&](const ClientStatus& c, const Labels& l) {
         e.sample(l, static_cast<std::uint64_t>(c.sessions_lost));
       });
  each("nvshare_client_memory_refused_allocations_total", "counter",
       "Allocations the process's memory limit refused (CUDA_ERROR_OUT_OF_MEMORY), as it reports.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.refused_allocations); });
  each("nvshare_client_core_limit_ratio", "gauge",
       "The process's compute cap, a fraction of the GPU's time (1: uncapped).",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, ratio(c.limits.core_percent)); });
  each("nvshare_client_core_limit_effective_ratio", "gauge",
       "The cap after scaling (caps summing over the GPU; an uncapped client's entitlement).",
       [&](const ClientStatus& c, const Labels& l) {
         e.sample(l, ratio(c.view.effective_cap_percent));
       });
  each("nvshare_client_gpu_seconds_total", "counter",
       "GPU time billed to the process: wall time holding the GPU, divided among co-holders.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, seconds(c.view.held_total)); });
  each("nvshare_client_gpu_share_ratio", "gauge",
       "GPU time billed over the last quota window, a fraction of wall time.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, ratio(c.view.share_percent)); });
  each("nvshare_client_wait_seconds_total", "counter", "Time waited for the GPU, by reason.",
       [&](const ClientStatus& c, const Labels& l) {
         for (const WaitReason r : kWaitReasons) {
           e.sample(l.with("reason", protocol::to_string(r)),
                    seconds(c.view.counters.waited_for(r)));
         }
       });
  each("nvshare_client_waiting", "gauge", "1 while the process waits for the GPU for this reason.",
       [&](const ClientStatus& c, const Labels& l) {
         for (const WaitReason r : kWaitReasons) {
           const bool now = c.view.state == ClientState::kWaiting && c.view.waiting_for == r;
           e.sample(l.with("reason", protocol::to_string(r)), std::uint64_t{now ? 1u : 0u});
         }
       });
  each("nvshare_client_running", "gauge", "1 while the process holds the GPU.",
       [&](const ClientStatus& c, const Labels& l) {
         e.sample(l, std::uint64_t{policy::holds(c.view.state) ? 1u : 0u});
       });
  each("nvshare_client_grants_total", "counter", "Grants made to the process.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.view.counters.grants); });
  each("nvshare_client_revokes_total", "counter", "Grants revoked, by reason.",
       [&](const ClientStatus& c, const Labels& l) {
         for (const RevokeReason r : kRevokeReasons) {
           e.sample(l.with("reason", protocol::to_string(r)), c.view.counters.revokes_for(r));
         }
       });
  each("nvshare_client_yields_total", "counter",
       "Times the process was asked to hand over when idle.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.view.counters.yields); });
  each("nvshare_client_swap_notices_total", "counter",
       "Times the process was told ahead that its turn ends with a swap-out.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.view.counters.swap_notices); });
  each("nvshare_client_evictions_total", "counter",
       "Times the process was asked to move memory it kept on the GPU without a grant.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.view.counters.evictions); });
  each("nvshare_client_rooms_total", "counter",
       "Times the process was told how much of its memory it may bring back while it waited.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.view.counters.rooms); });
  each("nvshare_client_contended_total", "counter",
       "Times the process, holding the GPU, was told that a lower class held back waits for it.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.view.counters.contended); });
  each("nvshare_client_releases_total", "counter", "Releases answering a revoke.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.view.counters.releases); });
  each("nvshare_client_idle_releases_total", "counter",
       "Grants the process gave back by itself, idle.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.view.counters.idle_releases); });
  each("nvshare_client_swapped_out_bytes_total", "counter",
       "Bytes moved from the GPU to host memory, from the process's usage reports.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.swapped_out_bytes); });
  each("nvshare_client_swapped_in_bytes_total", "counter",
       "Bytes moved from host memory back to the GPU, from the process's usage reports.",
       [&](const ClientStatus& c, const Labels& l) { e.sample(l, c.swapped_in_bytes); });
  each("nvshare_client_deep_queue_ratio", "gauge",
       "Share of its held time the process waited with a deep queue, as it reports (no series: "
       "not reported).",
       [&](const ClientStatus& c, const Labels& l) {
         if (c.view.deep_queue_permille) e.sample(l, *c.view.deep_queue_permille / 1000.0);
       });
}

void pod_families(Exposition& e, const StatusSnapshot& s) {
  std::vector<std::pair<const PodStatus*, Labels>> rows;
  for (const PodStatus& p : s.pods) {
    Labels labels;
    labels.add("namespace", p.pod_namespace.value_or(""))
        .add("pod", p.pod_name.value_or(""))
        .add("pod_uid", p.pod_uid);
    rows.emplace_back(&p, std::move(labels));
  }
  e.family("nvshare_pod_clients", "gauge", "Client processes of the pod connected now.");
  for (const auto& [p, l] : rows) e.sample(l, static_cast<std::uint64_t>(p->clients));
  e.family("nvshare_pod_memory_limit_bytes", "gauge",
           "The pod's memory limit per GPU (no series: none set).");
  for (const auto& [p, l] : rows) {
    if (p->limits.memory_bytes && *p->limits.memory_bytes > 0) e.sample(l, *p->limits.memory_bytes);
  }
  e.family("nvshare_pod_core_limit_ratio", "gauge",
           "The pod's compute cap, a fraction of the GPU's time (no series: none set).");
  for (const auto& [p, l] : rows) {
    if (p->limits.core_percent) e.sample(l, ratio(*p->limits.core_percent));
  }
}

}  // namespace

std::string render_metrics(const MetricsSnapshot& snapshot) {
  Exposition e;
  node_families(e, snapshot);
  gpu_families(e, snapshot.status);
  client_families(e, client_rows(snapshot.status));
  pod_families(e, snapshot.status);
  return e.take();
}

}  // namespace nvshare::scheduler
