#include "scheduler/control_api.h"

#include <unistd.h>

#include <algorithm>
#include <initializer_list>

#include "common/quantity.h"
#include "scheduler/pod_identity.h"

#ifndef NVSHARE_VERSION
#define NVSHARE_VERSION "0.0.0"
#endif

namespace nvshare::scheduler {
namespace {

double ms(Duration d) { return static_cast<double>(d.count()) / 1e6; }
double us(Duration d) { return static_cast<double>(d.count()) / 1e3; }

Status check_members(const Json& request, std::string_view command,
                     std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : *request.as_object()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      std::string list;
      for (std::string_view name : allowed) {
        if (name == "cmd") continue;
        list += list.empty() ? "" : ", ";
        list += name;
      }
      return make_error("unknown member \"" + key + "\" in " + std::string(command) +
                        " (accepted: " + list + ")");
    }
  }
  return Status::Ok();
}

Result<std::int64_t> positive_integer(const Json& value, std::string_view what) {
  const auto n = value.as_int64();
  if (!n || *n < 1) return make_error(std::string(what) + " must be a positive integer");
  return *n;
}

Result<std::string> nonempty_string(const Json& value, std::string_view what) {
  const std::string* s = value.as_string();
  if (s == nullptr || s->empty())
    return make_error(std::string(what) + " must be a non-empty string");
  return *s;
}

// A pod UID as Kubernetes writes it (a UUID, or a static pod's 32 hex digits), in canonical form:
// a UID stored in another spelling would never match the UID read from a process's cgroup.
Result<std::string> pod_uid_value(const Json& value, std::string_view what) {
  auto text = nonempty_string(value, what);
  if (!text) return text.error();
  auto canonical = canonical_pod_uid(text.value());
  if (!canonical) {
    return make_error(std::string(what) + " \"" + text.value().substr(0, 80) +
                      "\" is not a pod UID (a UUID such as "
                      "\"7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d\", or a static pod's 32 hex digits)");
  }
  return *canonical;
}

Result<Selector> parse_selector(const Json* value) {
  if (value == nullptr || !value->is_object()) {
    return make_error(
        "set-limits needs a \"selector\" object: {\"pod_uid\":...}, {\"client\":N}, "
        "{\"pid\":N} or {\"namespace\":...,\"name\":...}");
  }
  if (Status s =
          check_members(*value, "selector", {"client", "pid", "pod_uid", "namespace", "name"});
      !s) {
    return s.error();
  }
  Selector selector;
  if (const Json* client = value->find("client")) {
    auto id = positive_integer(*client, "selector.client");
    if (!id) return id.error();
    selector.client = static_cast<ClientId>(id.value());
  }
  if (const Json* pid = value->find("pid")) {
    auto n = positive_integer(*pid, "selector.pid");
    if (!n) return n.error();
    if (n.value() > INT32_MAX) return make_error("selector.pid is out of range");
    selector.pid = static_cast<pid_t>(n.value());
  }
  if (const Json* uid = value->find("pod_uid")) {
    auto s = pod_uid_value(*uid, "selector.pod_uid");
    if (!s) return s.error();
    selector.pod_uid = s.value();
  }
  if (const Json* ns = value->find("namespace")) {
    auto s = nonempty_string(*ns, "selector.namespace");
    if (!s) return s.error();
    selector.pod_namespace = s.value();
  }
  if (const Json* name = value->find("name")) {
    auto s = nonempty_string(*name, "selector.name");
    if (!s) return s.error();
    selector.pod_name = s.value();
  }
  return selector;
}

// memory: absent (keep), null or "none" (no limit), "inherit", a quantity string, or bytes. Zero is
// refused: it would read as "no limit", the opposite of what anyone writing it means.
Result<FieldChange> parse_memory(const Json* value) {
  FieldChange change;
  if (value == nullptr) return change;
  if (value->is_null()) return FieldChange{FieldChange::Op::kSet, 0};
  const auto set_bytes = [](std::uint64_t bytes) -> Result<FieldChange> {
    if (bytes == 0) {
      return make_error(
          "memory 0 is not a limit: say \"none\" (or null) for no limit, or give "
          "a size such as \"1Gi\"");
    }
    return FieldChange{FieldChange::Op::kSet, bytes};
  };
  if (const std::string* text = value->as_string()) {
    if (*text == "none") return FieldChange{FieldChange::Op::kSet, 0};
    if (*text == "inherit") return FieldChange{FieldChange::Op::kInherit, 0};
    auto bytes = parse_memory_quantity(*text);
    if (!bytes) return make_error("memory: " + bytes.error().message);
    return set_bytes(bytes.value());
  }
  if (const auto bytes = value->as_int64(); bytes && *bytes >= 0) {
    return set_bytes(static_cast<std::uint64_t>(*bytes));
  }
  return make_error(
      "memory must be a quantity such as \"4Gi\", a byte count, null, \"none\" or "
      "\"inherit\"");
}

// core: absent (keep), null or "none" (uncapped), "inherit", or a percent 1..100 (number or "30%").
Result<FieldChange> parse_core(const Json* value) {
  FieldChange change;
  if (value == nullptr) return change;
  if (value->is_null()) return FieldChange{FieldChange::Op::kSet, 100};
  if (const std::string* text = value->as_string()) {
    if (*text == "none") return FieldChange{FieldChange::Op::kSet, 100};
    if (*text == "inherit") return FieldChange{FieldChange::Op::kInherit, 0};
    auto percent = parse_percent(*text);
    if (!percent) return make_error("core: " + percent.error().message);
    return FieldChange{FieldChange::Op::kSet, static_cast<std::uint64_t>(percent.value())};
  }
  if (const auto percent = value->as_int64(); percent && *percent >= 1 && *percent <= 100) {
    return FieldChange{FieldChange::Op::kSet, static_cast<std::uint64_t>(*percent)};
  }
  return make_error("core must be a percent 1..100, null, \"none\" or \"inherit\"");
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

Json set_limits(const Json& request, ControlContext& context) {
  if (Status s = check_members(request, "set-limits", {"cmd", "selector", "memory", "core"}); !s) {
    return error_response(s.error().message);
  }
  auto selector = parse_selector(request.find("selector"));
  if (!selector) return error_response(selector.error().message);
  auto memory = parse_memory(request.find("memory"));
  if (!memory) return error_response(memory.error().message);
  auto core = parse_core(request.find("core"));
  if (!core) return error_response(core.error().message);
  if (memory.value().op == FieldChange::Op::kKeep && core.value().op == FieldChange::Op::kKeep &&
      !(selector.value().pod_uid && selector.value().pod_name)) {
    return error_response("set-limits changes nothing: give \"memory\" and/or \"core\"");
  }
  auto outcome = context.scheduler.set_limits(
      selector.value(), LimitsChange{memory.value(), core.value()}, context.now);
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

Json forget_pod(const Json& request, ControlContext& context) {
  if (Status s = check_members(request, "forget-pod", {"cmd", "pod_uid"}); !s) {
    return error_response(s.error().message);
  }
  const Json* uid = request.find("pod_uid");
  auto text = uid ? pod_uid_value(*uid, "pod_uid")
                  : Result<std::string>(make_error("forget-pod needs \"pod_uid\""));
  if (!text) return error_response(text.error().message);
  if (Status s = context.scheduler.forget_pod(text.value(), context.now); !s) {
    return error_response(s.error().message);
  }
  return ok_response();
}

Json set_policy(const Json& request, ControlContext& context) {
  std::optional<std::string> gpu;
  std::vector<std::pair<const Knob*, std::string>> values;
  for (const auto& [key, value] : *request.as_object()) {
    if (key == "cmd") continue;
    if (key == "gpu") {
      if (value.is_null()) continue;
      auto text = nonempty_string(value, "gpu");
      if (!text) return error_response(text.error().message);
      gpu = text.value();
      continue;
    }
    const Knob* knob = knob_for_set_policy_member(key);
    if (knob == nullptr) {
      std::string accepted = "gpu";
      for (const Knob& k : knobs()) {
        if (k.scope == KnobScope::kPolicy) accepted += ", " + set_policy_member(k);
      }
      return error_response("unknown member \"" + key + "\" in set-policy (accepted: " + accepted +
                            ")");
    }
    std::string text;
    if (value.is_null()) {
      text = std::string(knob->default_value);
    } else if (const std::string* s = value.as_string()) {
      text = *s;
    } else if (value.is_number() || value.is_bool()) {
      text = value.dump();
    } else {
      return error_response(key + " must be a string, a number or null");
    }
    values.emplace_back(knob, std::move(text));
  }
  if (values.empty())
    return error_response("set-policy changes nothing: give at least one setting");
  auto changed = context.scheduler.set_policy(gpu, values, context.now);
  if (!changed) return error_response(changed.error().message);
  Json out = ok_response();
  Json gpus = Json::array();
  for (const std::string& uuid : changed.value()) gpus.push_back(uuid);
  out.set("gpus", std::move(gpus));
  return out;
}

// {"cmd":"set-gpus","gpus":[{"uuid":"GPU-...","memory_bytes":N},...]}: the device plugin's
// inventory. Every entry is checked before any is applied.
Json set_gpus(const Json& request, ControlContext& context) {
  if (Status s = check_members(request, "set-gpus", {"cmd", "gpus"}); !s) {
    return error_response(s.error().message);
  }
  const Json* list = request.find("gpus");
  if (list == nullptr || !list->is_array()) {
    return error_response("set-gpus needs \"gpus\": [{\"uuid\":...,\"memory_bytes\":...}]");
  }
  std::vector<GpuInfo> gpus;
  for (const Json& entry : *list->as_array()) {
    if (!entry.is_object()) return error_response("each of \"gpus\" must be an object");
    if (Status s = check_members(entry, "a GPU", {"uuid", "memory_bytes"}); !s) {
      return error_response(s.error().message);
    }
    const Json* uuid = entry.find("uuid");
    const Json* memory = entry.find("memory_bytes");
    auto text = uuid ? nonempty_string(*uuid, "uuid")
                     : Result<std::string>(make_error("a GPU needs \"uuid\""));
    if (!text) return error_response(text.error().message);
    auto bytes = memory ? positive_integer(*memory, "memory_bytes")
                        : Result<std::int64_t>(make_error("a GPU needs \"memory_bytes\""));
    if (!bytes) return error_response(bytes.error().message);
    gpus.push_back(GpuInfo{text.value(), static_cast<unsigned>(gpus.size()),
                           static_cast<std::uint64_t>(bytes.value())});
  }
  if (Status s = context.scheduler.set_gpus(gpus, "device plugin", context.now); !s) {
    return error_response(s.error().message);
  }
  Json out = ok_response();
  out.set("gpus", context.scheduler.gpu_count());
  return out;
}

// {"cmd":"sync"}: the control plane (the device plugin) has pushed every limit it holds.
Json sync(const Json& request, ControlContext& context) {
  if (Status s = check_members(request, "sync", {"cmd"}); !s) {
    return error_response(s.error().message);
  }
  context.scheduler.mark_synced(context.now);
  return ok_response();
}

Json explain(const Json& request, ControlContext& context) {
  if (Status s = check_members(request, "explain", {"cmd", "client"}); !s) {
    return error_response(s.error().message);
  }
  const Json* client = request.find("client");
  if (client == nullptr) return error_response("explain needs \"client\"");
  auto id = positive_integer(*client, "client");
  if (!id) return error_response(id.error().message);
  auto explanation = context.scheduler.explain(static_cast<ClientId>(id.value()), context.now);
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

Json stats(const Json& request, ControlContext& context) {
  if (Status s = check_members(request, "stats", {"cmd", "reset"}); !s) {
    return error_response(s.error().message);
  }
  bool reset = false;
  if (const Json* value = request.find("reset")) {
    if (!value->is_bool()) return error_response("reset must be true or false");
    reset = *value->as_bool();
  }
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

Json handle_control_request(const Json& request, ControlContext& context) {
  ++context.stats.control_requests;
  if (!request.is_object()) return error_response("a request must be a JSON object with \"cmd\"");
  const Json* cmd = request.find("cmd");
  if (cmd == nullptr || !cmd->is_string()) return error_response("missing \"cmd\" (a string)");
  const std::string& name = *cmd->as_string();
  if (name == "status") {
    if (Status s = check_members(request, "status", {"cmd"}); !s)
      return error_response(s.error().message);
    return status(context);
  }
  if (name == "set-limits") return set_limits(request, context);
  if (name == "forget-pod") return forget_pod(request, context);
  if (name == "set-policy") return set_policy(request, context);
  if (name == "set-gpus") return set_gpus(request, context);
  if (name == "sync") return sync(request, context);
  if (name == "explain") return explain(request, context);
  if (name == "stats") return stats(request, context);
  if (name == "version") return version();
  return error_response("unknown cmd \"" + name +
                        "\" (known: status, set-limits, forget-pod, set-policy, set-gpus, sync, "
                        "explain, stats, version)");
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
