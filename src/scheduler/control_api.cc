#include "scheduler/control_api.h"

#include <unistd.h>

#include <algorithm>
#include <type_traits>

#include "common/quantity.h"
#include "scheduler/pod_identity.h"

#ifndef NVSHARE_VERSION
#define NVSHARE_VERSION "0.0.0"
#endif

namespace nvshare::scheduler {
namespace {

double ms(Duration d) { return static_cast<double>(d.count()) / 1e6; }
double us(Duration d) { return static_cast<double>(d.count()) / 1e3; }

// A pod UID as Kubernetes writes it (a UUID, or a static pod's 32 hex digits), in canonical form:
// a UID stored in another spelling would never match the UID read from a process's cgroup.
Result<std::string> canonical_pod_uid_of(const std::string& text, std::string_view what) {
  auto canonical = canonical_pod_uid(text);
  if (!canonical) {
    return make_error(std::string(what) + " \"" + text.substr(0, 80) +
                      "\" is not a pod UID (a UUID such as "
                      "\"7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d\", or a static pod's 32 hex digits)");
  }
  return *canonical;
}

Json ok_response() {
  Json out = Json::object();
  out.set("ok", true);
  return out;
}

Json config_json(const DaemonConfig& config) {
  Json c = Json::object();
  c.set("socket", config.socket_path);
  c.set("control_socket", config.control_socket_path);
  c.set("state_file", config.state_file);
  c.set("mode", std::string(policy::to_string(config.policy.mode)));
  c.set("reserve_percent", config.policy.reserve_fraction * 100);
  c.set("capacity", config.capacity.to_string());
  c.set("quantum", config.policy.fixed_quantum
                       ? Json(static_cast<double>(config.policy.fixed_quantum->count()) / 1e9)
                       : Json("auto"));
  c.set("quantum_k", config.policy.quantum_swap_multiple);
  c.set("quantum_min_s", static_cast<double>(config.policy.quantum_min.count()) / 1e9);
  c.set("quantum_max_s", static_cast<double>(config.policy.quantum_max.count()) / 1e9);
  c.set("quota_window_ms", ms(config.policy.quota_window));
  c.set("revoke_grace_s", static_cast<double>(config.policy.revoke_grace.count()) / 1e9);
  c.set("swap_bandwidth_bytes_per_s", config.policy.default_swap_bytes_per_s);
  c.set("trust_client_limits", config.trust_client_limits);
  c.set("client_buffer_limit_bytes", config.client_buffer_limit);
  return c;
}

Json status(ControlContext& context) {
  Json out = ok_response();
  Json scheduler = Json::object();
  scheduler.set("version", NVSHARE_VERSION);
  scheduler.set("pid", static_cast<long long>(::getpid()));
  scheduler.set("uptime_s", static_cast<double>((context.now - context.started).count()) / 1e9);
  scheduler.set("client_sessions", context.client_sessions);
  scheduler.set("clients", context.scheduler.client_count());
  scheduler.set("limits_synced", context.scheduler.synced());
  scheduler.set("config", config_json(context.scheduler.config()));
  out.set("scheduler", std::move(scheduler));
  Json body = to_json(context.scheduler.snapshot(context.now));
  for (auto& [key, value] : *body.as_object()) out.set(key, std::move(value));
  return out;
}

Json set_limits(control::SetLimitsRequest request, ControlContext& context) {
  if (request.selector.pod_uid) {
    auto uid = canonical_pod_uid_of(*request.selector.pod_uid, "selector.pod_uid");
    if (!uid) return error_response(uid.error().message);
    request.selector.pod_uid = uid.value();
  }
  auto outcome = context.scheduler.set_limits(request.selector, request.change, context.now);
  if (!outcome) return error_response(outcome.error().message);
  Json out = ok_response();
  Json clients = Json::array();
  for (ClientId id : outcome.value().clients) clients.push_back(id);
  Json pods = Json::array();
  for (const std::string& uid : outcome.value().remembered_pods) pods.push_back(uid);
  out.set("clients", std::move(clients));
  out.set("pods", std::move(pods));
  return out;
}

Json forget_pod(const control::ForgetPodRequest& request, ControlContext& context) {
  auto uid = canonical_pod_uid_of(request.pod_uid, "pod_uid");
  if (!uid) return error_response(uid.error().message);
  if (Status s = context.scheduler.forget_pod(uid.value(), context.now); !s) {
    return error_response(s.error().message);
  }
  return ok_response();
}

Json set_policy(const control::SetPolicyRequest& request, ControlContext& context) {
  std::vector<std::pair<const Knob*, std::string>> values;
  for (const auto& [member, value] : request.settings) {
    const Knob* knob = knob_for_set_policy_member(member);
    if (knob == nullptr) {
      std::string accepted = "gpu";
      for (const Knob& k : knobs()) {
        if (k.scope == KnobScope::kPolicy) accepted += ", " + set_policy_member(k);
      }
      return error_response("unknown member \"" + member +
                            "\" in set-policy (accepted: " + accepted + ")");
    }
    values.emplace_back(knob, value.value_or(std::string(knob->default_value)));
  }
  auto changed = context.scheduler.set_policy(request.gpu, values, context.now);
  if (!changed) return error_response(changed.error().message);
  Json out = ok_response();
  Json gpus = Json::array();
  for (const std::string& uuid : changed.value()) gpus.push_back(uuid);
  out.set("gpus", std::move(gpus));
  return out;
}

// The device plugin's inventory; every entry was checked before any is applied.
Json set_gpus(const control::SetGpusRequest& request, ControlContext& context) {
  if (Status s = context.scheduler.set_gpus(request.gpus, "device plugin", context.now); !s) {
    return error_response(s.error().message);
  }
  Json out = ok_response();
  out.set("gpus", context.scheduler.gpu_count());
  return out;
}

// The control plane (the device plugin) has pushed every limit it holds.
Json sync(ControlContext& context) {
  context.scheduler.mark_synced(context.now);
  return ok_response();
}

Json explain(const control::ExplainRequest& request, ControlContext& context) {
  auto explanation = context.scheduler.explain(request.client, context.now);
  if (!explanation) return error_response(explanation.error().message);
  Json out = ok_response();
  out.set("client", explanation.value().client);
  out.set("gpu", explanation.value().gpu);
  out.set("state", std::string(policy::to_string(explanation.value().state)));
  out.set("waiting_for",
          explanation.value().waiting_for
              ? Json(std::string(protocol::to_string(*explanation.value().waiting_for)))
              : Json());
  out.set("explanation", explanation.value().text);
  return out;
}

Json stats(const control::StatsRequest& request, ControlContext& context) {
  const bool reset = request.reset;
  DaemonStats& s = context.stats;
  Json out = ok_response();
  Json in = Json::object();
  Json sent = Json::object();
  std::uint64_t total_in = 0;
  std::uint64_t total_out = 0;
  for (std::size_t t = 1; t < DaemonStats::kTypes; ++t) {
    const std::string name(protocol::to_string(static_cast<protocol::MessageType>(t)));
    in.set(name, s.frames_in[t]);
    sent.set(name, s.frames_out[t]);
    total_in += s.frames_in[t];
    total_out += s.frames_out[t];
  }
  out.set("frames_in", std::move(in));
  out.set("frames_out", std::move(sent));
  out.set("frames_in_total", total_in);
  out.set("frames_out_total", total_out);
  out.set("bytes_in", s.bytes_in);
  out.set("bytes_out", s.bytes_out);
  Json sessions = Json::object();
  sessions.set("open", context.client_sessions);
  sessions.set("opened", s.sessions_opened);
  sessions.set("closed", s.sessions_closed);
  sessions.set("closed_malformed", s.closed_malformed);
  sessions.set("closed_protocol", s.closed_protocol);
  sessions.set("closed_version", s.closed_version);
  sessions.set("closed_slow", s.closed_slow);
  sessions.set("closed_unknown_gpu", s.closed_unknown_gpu);
  sessions.set("closed_no_hello", s.closed_no_hello);
  sessions.set("refused_identity", s.refused_identity);
  sessions.set("refused_limit", s.refused_limit);
  sessions.set("refused_descriptors", s.refused_descriptors);
  out.set("sessions", std::move(sessions));
  out.set("control_requests", s.control_requests);
  out.set("control_refused", s.control_refused);
  const LatencyHistogram& h = s.decision_latency;
  Json latency = Json::object();
  latency.set("count", h.count());
  latency.set("mean", us(h.mean()));
  latency.set("p50", us(h.percentile(0.50)));
  latency.set("p90", us(h.percentile(0.90)));
  latency.set("p99", us(h.percentile(0.99)));
  latency.set("p999", us(h.percentile(0.999)));
  latency.set("max", us(h.max()));
  out.set("decision_latency_us", std::move(latency));
  if (reset) {
    const std::uint64_t refused = s.control_refused;
    s = DaemonStats{};
    s.control_refused = refused;
  }
  return out;
}

Json version() {
  Json out = ok_response();
  out.set("version", NVSHARE_VERSION);
  Json protocol_range = Json::object();
  protocol_range.set("min", static_cast<int>(protocol::kMinVersion));
  protocol_range.set("max", static_cast<int>(protocol::kMaxVersion));
  out.set("protocol", std::move(protocol_range));
  return out;
}

}  // namespace

Json error_response(std::string_view message) {
  Json out = Json::object();
  out.set("ok", false);
  out.set("error", std::string(message));
  return out;
}

Json handle_control_request(const Json& json, ControlContext& context) {
  ++context.stats.control_requests;
  auto request = control::decode(json);
  if (!request) return error_response(request.error().message);
  return std::visit(
      [&](auto&& r) -> Json {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, control::StatusRequest>) return status(context);
        if constexpr (std::is_same_v<T, control::SetLimitsRequest>) return set_limits(r, context);
        if constexpr (std::is_same_v<T, control::ForgetPodRequest>) return forget_pod(r, context);
        if constexpr (std::is_same_v<T, control::SetPolicyRequest>) return set_policy(r, context);
        if constexpr (std::is_same_v<T, control::SetGpusRequest>) return set_gpus(r, context);
        if constexpr (std::is_same_v<T, control::SyncRequest>) return sync(context);
        if constexpr (std::is_same_v<T, control::ExplainRequest>) return explain(r, context);
        if constexpr (std::is_same_v<T, control::StatsRequest>) return stats(r, context);
        if constexpr (std::is_same_v<T, control::VersionRequest>) return version();
      },
      std::move(request.value()));
}

Json handle_control_line(std::string_view line, ControlContext& context) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  auto request = parse_json(line, JsonLimits{.max_bytes = kMaxControlLine, .max_depth = 16});
  if (!request) {
    ++context.stats.control_requests;
    return error_response(request.error().message);
  }
  return handle_control_request(request.value(), context);
}

}  // namespace nvshare::scheduler
