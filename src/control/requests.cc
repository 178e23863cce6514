#include "control/requests.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <type_traits>

#include "common/memory_mode.h"
#include "common/protocol.h"
#include "common/quantity.h"

namespace nvshare::control {
namespace {

constexpr std::array<std::string_view, std::variant_size_v<Request>> kNames = {
    "status", "set-limits", "forget-pod", "set-policy", "set-gpus",
    "sync",   "explain",    "stats",      "version"};

// ---- decoding helpers ---------------------------------------------------------------------------

Status check_members(const Json& object, std::string_view what,
                     std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : *object.as_object()) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    std::string list;
    for (std::string_view name : allowed) {
      if (name == "cmd") continue;
      list += list.empty() ? "" : ", ";
      list += name;
    }
    return make_error("unknown member \"" + key + "\" in " + std::string(what) +
                      " (accepted: " + (list.empty() ? "none" : list) + ")");
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
  if (s == nullptr || s->empty()) {
    return make_error(std::string(what) + " must be a non-empty string");
  }
  return *s;
}

Result<Selector> decode_selector(const Json* value) {
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
    selector.client = static_cast<std::uint64_t>(id.value());
  }
  if (const Json* pid = value->find("pid")) {
    auto n = positive_integer(*pid, "selector.pid");
    if (!n) return n.error();
    if (n.value() > INT32_MAX) return make_error("selector.pid is out of range");
    selector.pid = static_cast<pid_t>(n.value());
  }
  const std::pair<const char*, std::optional<std::string>*> strings[] = {
      {"pod_uid", &selector.pod_uid},
      {"namespace", &selector.pod_namespace},
      {"name", &selector.pod_name}};
  for (const auto& [member, field] : strings) {
    if (const Json* text = value->find(member)) {
      auto s = nonempty_string(*text, std::string("selector.") + member);
      if (!s) return s.error();
      *field = s.value();
    }
  }
  return selector;
}

// memory: absent (keep), null or "none" (no limit), "inherit", a quantity string, or bytes. Zero is
// refused: it would read as "no limit", the opposite of what anyone writing it means.
Result<FieldChange> decode_memory(const Json* value) {
  if (value == nullptr) return FieldChange{};
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
Result<FieldChange> decode_core(const Json* value) {
  if (value == nullptr) return FieldChange{};
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

// memory_mode: absent (keep), "inherit", or a memory mode word (common/memory_mode.h).
Result<FieldChange> decode_memory_mode(const Json* value) {
  if (value == nullptr) return FieldChange{};
  if (const std::string* text = value->as_string()) {
    if (*text == "inherit") return FieldChange{FieldChange::Op::kInherit, 0};
    if (const std::optional<MemoryMode> mode = parse_memory_mode(*text)) {
      return FieldChange{FieldChange::Op::kSet, protocol::memory_mode_code(*mode)};
    }
  }
  return make_error("memory_mode must be one of " + std::string(kMemoryModeWords) +
                    " or \"inherit\"");
}

// priority: absent (keep), "inherit", or a class word (common/priority.h).
Result<FieldChange> decode_priority(const Json* value) {
  if (value == nullptr) return FieldChange{};
  if (const std::string* text = value->as_string()) {
    if (*text == "inherit") return FieldChange{FieldChange::Op::kInherit, 0};
    if (const std::optional<Priority> priority = parse_priority(*text)) {
      return FieldChange{FieldChange::Op::kSet, protocol::priority_code(*priority)};
    }
  }
  return make_error("priority must be one of " + std::string(kPriorityWords) + " or \"inherit\"");
}

Result<Request> decode_set_limits(const Json& request) {
  if (Status s = check_members(request, "set-limits",
                               {"cmd", "selector", "memory", "core", "memory_mode", "priority"});
      !s) {
    return s.error();
  }
  auto selector = decode_selector(request.find("selector"));
  if (!selector) return selector.error();
  auto memory = decode_memory(request.find("memory"));
  if (!memory) return memory.error();
  auto core = decode_core(request.find("core"));
  if (!core) return core.error();
  auto mode = decode_memory_mode(request.find("memory_mode"));
  if (!mode) return mode.error();
  auto priority = decode_priority(request.find("priority"));
  if (!priority) return priority.error();
  if (memory.value().op == FieldChange::Op::kKeep && core.value().op == FieldChange::Op::kKeep &&
      mode.value().op == FieldChange::Op::kKeep && priority.value().op == FieldChange::Op::kKeep &&
      !(selector.value().pod_uid && selector.value().pod_name)) {
    return make_error(
        "set-limits changes nothing: give \"memory\", \"core\", \"memory_mode\" and/or "
        "\"priority\"");
  }
  return Request(SetLimitsRequest{selector.value(), LimitsChange{memory.value(), core.value(),
                                                                 mode.value(), priority.value()}});
}

Result<Request> decode_set_policy(const Json& request) {
  SetPolicyRequest out;
  for (const auto& [key, value] : *request.as_object()) {
    if (key == "cmd") continue;
    if (key == "gpu") {
      if (value.is_null()) continue;
      auto text = nonempty_string(value, "gpu");
      if (!text) return text.error();
      out.gpu = text.value();
      continue;
    }
    if (value.is_null()) {
      out.settings.emplace_back(key, std::nullopt);
    } else if (const std::string* s = value.as_string()) {
      out.settings.emplace_back(key, *s);
    } else if (value.is_number() || value.is_bool()) {
      out.settings.emplace_back(key, value.dump());
    } else {
      return make_error(key + " must be a string, a number or null");
    }
  }
  if (out.settings.empty())
    return make_error("set-policy changes nothing: give at least one setting");
  return Request(std::move(out));
}

// {"cmd":"set-gpus","gpus":[{"uuid":"GPU-...","memory_bytes":N},...]}
Result<Request> decode_set_gpus(const Json& request) {
  if (Status s = check_members(request, "set-gpus", {"cmd", "gpus"}); !s) return s.error();
  const Json* list = request.find("gpus");
  if (list == nullptr || !list->is_array()) {
    return make_error("set-gpus needs \"gpus\": [{\"uuid\":...,\"memory_bytes\":...}]");
  }
  SetGpusRequest out;
  for (const Json& entry : *list->as_array()) {
    if (!entry.is_object()) return make_error("each of \"gpus\" must be an object");
    if (Status s = check_members(entry, "a GPU", {"uuid", "memory_bytes"}); !s) return s.error();
    const Json* uuid = entry.find("uuid");
    const Json* memory = entry.find("memory_bytes");
    auto text = uuid ? nonempty_string(*uuid, "uuid")
                     : Result<std::string>(make_error("a GPU needs \"uuid\""));
    if (!text) return text.error();
    auto bytes = memory ? positive_integer(*memory, "memory_bytes")
                        : Result<std::int64_t>(make_error("a GPU needs \"memory_bytes\""));
    if (!bytes) return bytes.error();
    out.gpus.push_back(GpuInfo{text.value(), static_cast<unsigned>(out.gpus.size()),
                               static_cast<std::uint64_t>(bytes.value())});
  }
  return Request(std::move(out));
}

// The one member a command needs besides "cmd" (present; nothing else allowed).
Result<const Json*> sole_member(const Json& request, std::string_view command, const char* member) {
  if (Status s = check_members(request, command, {"cmd", member}); !s) return s.error();
  const Json* value = request.find(member);
  if (value == nullptr) {
    return make_error(std::string(command) + " needs \"" + member + "\"");
  }
  return value;
}

Result<Request> decode_command(std::string_view name, const Json& request) {
  const auto only_cmd = [&](Request r) -> Result<Request> {
    if (Status s = check_members(request, name, {"cmd"}); !s) return s.error();
    return r;
  };
  if (name == "status") return only_cmd(StatusRequest{});
  if (name == "sync") return only_cmd(SyncRequest{});
  if (name == "version") return only_cmd(VersionRequest{});
  if (name == "set-limits") return decode_set_limits(request);
  if (name == "set-policy") return decode_set_policy(request);
  if (name == "set-gpus") return decode_set_gpus(request);
  if (name == "forget-pod") {
    auto uid = sole_member(request, name, "pod_uid");
    if (!uid) return uid.error();
    auto text = nonempty_string(*uid.value(), "pod_uid");
    if (!text) return text.error();
    return Request(ForgetPodRequest{text.value()});
  }
  if (name == "explain") {
    auto client = sole_member(request, name, "client");
    if (!client) return client.error();
    auto id = positive_integer(*client.value(), "client");
    if (!id) return id.error();
    return Request(ExplainRequest{static_cast<std::uint64_t>(id.value())});
  }
  if (name == "stats") {
    if (Status s = check_members(request, "stats", {"cmd", "reset"}); !s) return s.error();
    StatsRequest out;
    if (const Json* value = request.find("reset")) {
      if (!value->is_bool()) return make_error("reset must be true or false");
      out.reset = *value->as_bool();
    }
    return Request(out);
  }
  std::string known;
  for (std::string_view n : kNames) known += (known.empty() ? "" : ", ") + std::string(n);
  return make_error("unknown cmd \"" + std::string(name) + "\" (known: " + known + ")");
}

// ---- encoding -----------------------------------------------------------------------------------

Json encode_selector(const Selector& s) {
  Json out = Json::object();
  if (s.client) out.set("client", *s.client);
  if (s.pid) out.set("pid", static_cast<long long>(*s.pid));
  if (s.pod_uid) out.set("pod_uid", *s.pod_uid);
  if (s.pod_namespace) out.set("namespace", *s.pod_namespace);
  if (s.pod_name) out.set("name", *s.pod_name);
  return out;
}

void encode_members(Json& out, const StatusRequest&) { (void)out; }
void encode_members(Json& out, const SyncRequest&) { (void)out; }
void encode_members(Json& out, const VersionRequest&) { (void)out; }
void encode_members(Json& out, const SetLimitsRequest& r) {
  out.set("selector", encode_selector(r.selector));
  if (auto memory = encode_memory(r.change.memory)) out.set("memory", std::move(*memory));
  if (auto core = encode_core(r.change.core)) out.set("core", std::move(*core));
  if (auto mode = encode_memory_mode(r.change.memory_mode))
    out.set("memory_mode", std::move(*mode));
  if (auto priority = encode_priority(r.change.priority)) out.set("priority", std::move(*priority));
}
void encode_members(Json& out, const ForgetPodRequest& r) { out.set("pod_uid", r.pod_uid); }
void encode_members(Json& out, const SetPolicyRequest& r) {
  if (r.gpu) out.set("gpu", *r.gpu);
  for (const auto& [name, value] : r.settings) out.set(name, value ? Json(*value) : Json());
}
void encode_members(Json& out, const SetGpusRequest& r) { out.set("gpus", gpus_json(r.gpus)); }
void encode_members(Json& out, const ExplainRequest& r) { out.set("client", r.client); }
void encode_members(Json& out, const StatsRequest& r) {
  if (r.reset) out.set("reset", true);
}

}  // namespace

bool SetGpusRequest::operator==(const SetGpusRequest& other) const {
  return std::equal(gpus.begin(), gpus.end(), other.gpus.begin(), other.gpus.end(),
                    [](const GpuInfo& a, const GpuInfo& b) {
                      return a.uuid == b.uuid && a.memory_bytes == b.memory_bytes;
                    });
}

std::span<const std::string_view> command_names() { return kNames; }

std::string_view command_name(const Request& request) { return kNames[request.index()]; }

namespace {

// A field of a limits change as a request carries it; `zero_is_none`: a set 0 travels as null.
std::optional<Json> encode_field(const FieldChange& change, bool zero_is_none) {
  switch (change.op) {
    case FieldChange::Op::kKeep:
      return std::nullopt;
    case FieldChange::Op::kInherit:
      return Json("inherit");
    case FieldChange::Op::kSet:
      return zero_is_none && change.value == 0 ? Json() : Json(change.value);
  }
  return std::nullopt;
}

}  // namespace

// Memory 0 is refused on the wire ("none" is null); a core of 100 is a plain number.
std::optional<Json> encode_memory(const FieldChange& change) { return encode_field(change, true); }
std::optional<Json> encode_core(const FieldChange& change) { return encode_field(change, false); }
std::optional<Json> encode_memory_mode(const FieldChange& change) {
  if (change.op != FieldChange::Op::kSet) return encode_field(change, false);
  const std::optional<MemoryMode> mode =
      protocol::memory_mode_of(static_cast<std::uint8_t>(change.value));
  return mode ? Json(std::string(to_string(*mode))) : Json("inherit");
}
std::optional<Json> encode_priority(const FieldChange& change) {
  if (change.op != FieldChange::Op::kSet) return encode_field(change, false);
  const std::optional<Priority> priority =
      protocol::priority_of(static_cast<std::uint8_t>(change.value));
  return priority ? Json(std::string(to_string(*priority))) : Json("inherit");
}

Json encode(const Request& request) {
  Json out = Json::object();
  out.set("cmd", std::string(command_name(request)));
  std::visit([&](const auto& r) { encode_members(out, r); }, request);
  return out;
}

Result<Request> decode(const Json& request) {
  if (!request.is_object()) return make_error("a request must be a JSON object with \"cmd\"");
  const Json* cmd = request.find("cmd");
  if (cmd == nullptr || !cmd->is_string()) return make_error("missing \"cmd\" (a string)");
  return decode_command(*cmd->as_string(), request);
}

}  // namespace nvshare::control
