#include "scheduler/control_api.h"

#include <unistd.h>

#include <algorithm>
#include <type_traits>

#include "common/mono_time.h"
#include "common/quantity.h"
#include "control/answers.h"
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

Json config_json(const DaemonConfig& config) {
  Json c = Json::object();
  c.set("socket", config.socket_path);
  c.set("control_socket", config.control_socket_path);
  c.set("state_file", config.state_file);
  c.set("mode", std::string(policy::to_string(config.policy.mode)));
  c.set("reserve_percent", config.policy.reserve_fraction * 100);
  c.set("capacity", config.capacity.to_string());
  c.set("quantum", config.policy.fixed_quantum ? Json(to_seconds(*config.policy.fixed_quantum))
                                               : Json("auto"));
  c.set("quantum_k", config.policy.quantum_swap_multiple);
  c.set("quantum_min_s", to_seconds(config.policy.quantum_min));
  c.set("quantum_max_s", to_seconds(config.policy.quantum_max));
  c.set("turn_slice_s", to_seconds(config.policy.turn_slice));
  c.set("cap_cycle_s", to_seconds(config.policy.cap_cycle));
  c.set("priority_interference_percent", config.policy.priority_interference * 100);
  c.set("priority_floor_s", to_seconds(config.policy.priority_floor));
  c.set("quota_window_ms", ms(config.policy.quota_window));
  c.set("revoke_grace_s", to_seconds(config.policy.revoke_grace));
  c.set("swap_bandwidth_bytes_per_s", config.policy.default_swap_bytes_per_s);
  c.set("trust_client_limits", config.trust_client_limits);
  c.set("client_buffer_limit_bytes", config.client_buffer_limit);
  return c;
}

Json status(ControlContext& context) {
  control::StatusAnswer answer;
  control::SchedulerInfo& s = answer.scheduler;
  s.version = NVSHARE_VERSION;
  s.pid = ::getpid();
  s.uptime_s = to_seconds(context.now - context.started);
  s.client_sessions = context.client_sessions;
  s.clients = context.scheduler.client_count();
  s.limits_synced = context.scheduler.synced();
  s.gpus = context.scheduler.gpu_uuids();
  s.config = config_json(context.scheduler.config());
  answer.body = to_json(context.scheduler.snapshot(context.now));
  return control::encode(answer);
}

Json set_limits(control::SetLimitsRequest request, ControlContext& context) {
  if (request.selector.pod_uid) {
    auto uid = canonical_pod_uid_of(*request.selector.pod_uid, "selector.pod_uid");
    if (!uid) return error_response(uid.error().message);
    request.selector.pod_uid = uid.value();
  }
  auto outcome = context.scheduler.set_limits(request.selector, request.change, context.now);
  if (!outcome) return error_response(outcome.error().message);
  control::SetLimitsAnswer answer;
  answer.clients.assign(outcome.value().clients.begin(), outcome.value().clients.end());
  answer.pods = outcome.value().remembered_pods;
  return control::encode(answer);
}

Json forget_pod(const control::ForgetPodRequest& request, ControlContext& context) {
  auto uid = canonical_pod_uid_of(request.pod_uid, "pod_uid");
  if (!uid) return error_response(uid.error().message);
  if (Status s = context.scheduler.forget_pod(uid.value(), context.now); !s) {
    return error_response(s.error().message);
  }
  return control::encode(control::Ack{});
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
  return control::encode(control::SetPolicyAnswer{changed.value()});
}

// The device plugin's inventory; every entry was checked before any is applied.
Json set_gpus(const control::SetGpusRequest& request, ControlContext& context) {
  if (Status s = context.scheduler.set_gpus(request.gpus, "device plugin", context.now); !s) {
    return error_response(s.error().message);
  }
  return control::encode(control::SetGpusAnswer{context.scheduler.gpu_count()});
}

// The control plane (the device plugin) has pushed every limit it holds.
Json sync(ControlContext& context) {
  context.scheduler.mark_synced(context.now);
  return control::encode(control::Ack{});
}

Json explain(const control::ExplainRequest& request, ControlContext& context) {
  auto explanation = context.scheduler.explain(request.client, context.now);
  if (!explanation) return error_response(explanation.error().message);
  control::ExplainAnswer answer;
  answer.client = explanation.value().client;
  answer.gpu = explanation.value().gpu;
  answer.state = std::string(policy::to_string(explanation.value().state));
  if (explanation.value().waiting_for) {
    answer.waiting_for = std::string(protocol::to_string(*explanation.value().waiting_for));
  }
  answer.explanation = explanation.value().text;
  return control::encode(answer);
}

Json stats(const control::StatsRequest& request, ControlContext& context) {
  DaemonStats& s = context.stats;
  control::StatsAnswer answer;
  for (std::size_t t = 1; t < DaemonStats::kTypes; ++t) {
    const std::string name(protocol::to_string(static_cast<protocol::MessageType>(t)));
    answer.frames_in.emplace_back(name, s.frames_in[t]);
    answer.frames_out.emplace_back(name, s.frames_out[t]);
    answer.frames_in_total += s.frames_in[t];
    answer.frames_out_total += s.frames_out[t];
  }
  answer.bytes_in = s.bytes_in;
  answer.bytes_out = s.bytes_out;
  answer.sessions = {
      {"open", context.client_sessions},      {"opened", s.sessions_opened},
      {"closed", s.sessions_closed},          {"closed_malformed", s.closed_malformed},
      {"closed_protocol", s.closed_protocol}, {"closed_version", s.closed_version},
      {"closed_slow", s.closed_slow},         {"closed_unknown_gpu", s.closed_unknown_gpu},
      {"closed_no_hello", s.closed_no_hello}, {"refused_identity", s.refused_identity},
      {"refused_limit", s.refused_limit},     {"refused_descriptors", s.refused_descriptors},
      {"ipc_exports", s.ipc_exports},         {"ipc_imports", s.ipc_imports},
      {"ipc_refused", s.ipc_refused}};
  answer.control_requests = s.control_requests;
  answer.control_refused = s.control_refused;
  const LatencyHistogram& h = s.decision_latency;
  answer.decision_latency_us = {h.count(),
                                us(h.mean()),
                                us(h.percentile(0.50)),
                                us(h.percentile(0.90)),
                                us(h.percentile(0.99)),
                                us(h.percentile(0.999)),
                                us(h.max())};
  if (request.reset) {
    const std::uint64_t refused = s.control_refused;
    s = DaemonStats{};
    s.control_refused = refused;
  }
  return control::encode(answer);
}

Json version() {
  return control::encode(
      control::VersionAnswer{NVSHARE_VERSION, {protocol::kMinVersion, protocol::kMaxVersion}});
}

}  // namespace

Json error_response(std::string_view message) {
  return control::encode(control::Refusal{std::string(message)});
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
