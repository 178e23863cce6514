#include "control/answers.h"

namespace nvshare::control {
namespace {

// ---- encoding -----------------------------------------------------------------------------------

Json answer_object() {
  Json out = Json::object();
  out.set("ok", true);
  return out;
}

template <typename T>
Json array_of(const std::vector<T>& values) {
  Json out = Json::array();
  for (const T& value : values) out.push_back(value);
  return out;
}

Json counters_json(const Counters& counters) {
  Json out = Json::object();
  for (const auto& [name, value] : counters) out.set(name, value);
  return out;
}

// ---- decoding: a member of the answer, by its type
// ------------------------------------------------

Result<const Json*> member(const Json& object, std::string_view key) {
  const Json* value = object.find(key);
  if (value == nullptr) return make_error("no \"" + std::string(key) + "\"");
  return value;
}

Result<std::string> text(const Json& object, std::string_view key) {
  auto value = member(object, key);
  if (!value) return value.error();
  const std::string* s = value.value()->as_string();
  if (s == nullptr) return make_error("\"" + std::string(key) + "\" is not a string");
  return *s;
}

Result<std::int64_t> integer(const Json& object, std::string_view key) {
  auto value = member(object, key);
  if (!value) return value.error();
  auto n = value.value()->as_int64();
  if (!n) return make_error("\"" + std::string(key) + "\" is not an integer");
  return *n;
}

Result<std::uint64_t> count(const Json& object, std::string_view key) {
  auto n = integer(object, key);
  if (!n) return n.error();
  if (n.value() < 0) return make_error("\"" + std::string(key) + "\" is negative");
  return static_cast<std::uint64_t>(n.value());
}

Result<double> number(const Json& object, std::string_view key) {
  auto value = member(object, key);
  if (!value) return value.error();
  auto d = value.value()->as_double();
  if (!d) return make_error("\"" + std::string(key) + "\" is not a number");
  return *d;
}

Result<bool> flag(const Json& object, std::string_view key) {
  auto value = member(object, key);
  if (!value) return value.error();
  auto b = value.value()->as_bool();
  if (!b) return make_error("\"" + std::string(key) + "\" is not a boolean");
  return *b;
}

Result<const Json*> typed_member(const Json& object, std::string_view key, Json::Kind kind,
                                 const char* what) {
  auto value = member(object, key);
  if (!value) return value.error();
  if (value.value()->kind() != kind) {
    return make_error("\"" + std::string(key) + "\" is not " + what);
  }
  return value;
}

Result<std::vector<std::string>> texts(const Json& object, std::string_view key) {
  auto list = typed_member(object, key, Json::Kind::kArray, "an array");
  if (!list) return list.error();
  std::vector<std::string> out;
  for (const Json& item : *list.value()->as_array()) {
    if (!item.is_string()) return make_error("\"" + std::string(key) + "\" holds a non-string");
    out.push_back(*item.as_string());
  }
  return out;
}

Result<std::vector<std::uint64_t>> counts(const Json& object, std::string_view key) {
  auto list = typed_member(object, key, Json::Kind::kArray, "an array");
  if (!list) return list.error();
  std::vector<std::uint64_t> out;
  for (const Json& item : *list.value()->as_array()) {
    auto n = item.as_int64();
    if (!n || *n < 0) {
      return make_error("\"" + std::string(key) + "\" holds what is not a count");
    }
    out.push_back(static_cast<std::uint64_t>(*n));
  }
  return out;
}

Result<Counters> counters(const Json& object, std::string_view key) {
  auto map = typed_member(object, key, Json::Kind::kObject, "an object");
  if (!map) return map.error();
  Counters out;
  for (const auto& [name, value] : *map.value()->as_object()) {
    auto n = count(*map.value(), name);
    if (!n) return make_error(std::string(key) + ": " + n.error().message);
    out.emplace_back(name, n.value());
  }
  return out;
}

// Reads every member of a decoded answer in one pass: the first error wins and is returned.
class Reader {
 public:
  explicit Reader(const Json& object) : object_(object) {}

  template <typename T, typename Read>
  Reader& read(T& field, Read read_member, std::string_view key) {
    if (!error_) {
      auto value = read_member(object_, key);
      if (value) {
        field = std::move(value).value();
      } else {
        error_ = value.error();
      }
    }
    return *this;
  }

  template <typename A>
  Result<A> done(A answer) const {
    if (error_) return *error_;
    return answer;
  }

 private:
  const Json& object_;
  std::optional<Error> error_;
};

}  // namespace

Json encode(const Refusal& refusal) {
  Json out = Json::object();
  out.set("ok", false);
  out.set("error", refusal.error);
  return out;
}

Json encode(const Ack&) { return answer_object(); }

Json encode(const SetLimitsAnswer& answer) {
  Json out = answer_object();
  out.set("clients", array_of(answer.clients));
  out.set("pods", array_of(answer.pods));
  return out;
}

Json encode(const SetPolicyAnswer& answer) {
  Json out = answer_object();
  out.set("gpus", array_of(answer.gpus));
  return out;
}

Json encode(const SetGpusAnswer& answer) {
  Json out = answer_object();
  out.set("gpus", answer.gpus);
  return out;
}

Json encode(const ExplainAnswer& answer) {
  Json out = answer_object();
  out.set("client", answer.client);
  out.set("gpu", answer.gpu);
  out.set("state", answer.state);
  out.set("waiting_for", answer.waiting_for ? Json(*answer.waiting_for) : Json());
  out.set("explanation", answer.explanation);
  return out;
}

Json encode(const VersionAnswer& answer) {
  Json out = answer_object();
  out.set("version", answer.version);
  Json range = Json::object();
  range.set("min", answer.protocol_min);
  range.set("max", answer.protocol_max);
  out.set("protocol", std::move(range));
  return out;
}

Json encode(const StatsAnswer& answer) {
  Json out = answer_object();
  out.set("frames_in", counters_json(answer.frames_in));
  out.set("frames_out", counters_json(answer.frames_out));
  out.set("frames_in_total", answer.frames_in_total);
  out.set("frames_out_total", answer.frames_out_total);
  out.set("bytes_in", answer.bytes_in);
  out.set("bytes_out", answer.bytes_out);
  out.set("sessions", counters_json(answer.sessions));
  out.set("control_requests", answer.control_requests);
  out.set("control_refused", answer.control_refused);
  const LatencySummary& l = answer.decision_latency_us;
  Json latency = Json::object();
  latency.set("count", l.count);
  for (const auto& [name, value] :
       {std::pair{"mean", l.mean}, std::pair{"p50", l.p50}, std::pair{"p90", l.p90},
        std::pair{"p99", l.p99}, std::pair{"p999", l.p999}, std::pair{"max", l.max}}) {
    latency.set(name, value);
  }
  out.set("decision_latency_us", std::move(latency));
  return out;
}

Json encode(const StatusAnswer& answer) {
  Json out = answer_object();
  const SchedulerInfo& s = answer.scheduler;
  Json scheduler = Json::object();
  scheduler.set("version", s.version);
  scheduler.set("pid", s.pid);
  scheduler.set("uptime_s", s.uptime_s);
  scheduler.set("client_sessions", s.client_sessions);
  scheduler.set("clients", s.clients);
  scheduler.set("limits_synced", s.limits_synced);
  scheduler.set("config", s.config);
  out.set("scheduler", std::move(scheduler));
  if (const Json::Object* body = answer.body.as_object()) {
    for (const auto& [key, value] : *body) out.set(key, value);
  }
  return out;
}

Result<std::optional<Refusal>> decode_refusal(const Json& json) {
  auto ok = flag(json, "ok");
  if (!ok) return make_error("not an answer of the control protocol: " + ok.error().message);
  if (ok.value()) return std::optional<Refusal>();
  auto error = text(json, "error");
  if (!error) return make_error("a refusal without its message: " + error.error().message);
  return std::optional<Refusal>(Refusal{error.value()});
}

Result<Ack> decode_answer(const Json&, std::type_identity<Ack>) { return Ack{}; }

Result<SetLimitsAnswer> decode_answer(const Json& json, std::type_identity<SetLimitsAnswer>) {
  SetLimitsAnswer a;
  return Reader(json).read(a.clients, counts, "clients").read(a.pods, texts, "pods").done(a);
}

Result<SetPolicyAnswer> decode_answer(const Json& json, std::type_identity<SetPolicyAnswer>) {
  SetPolicyAnswer a;
  return Reader(json).read(a.gpus, texts, "gpus").done(a);
}

Result<SetGpusAnswer> decode_answer(const Json& json, std::type_identity<SetGpusAnswer>) {
  SetGpusAnswer a;
  return Reader(json).read(a.gpus, count, "gpus").done(a);
}

Result<ExplainAnswer> decode_answer(const Json& json, std::type_identity<ExplainAnswer>) {
  ExplainAnswer a;
  if (const Json* waiting = json.find("waiting_for"); waiting != nullptr && !waiting->is_null()) {
    if (!waiting->is_string()) return make_error("\"waiting_for\" is not a string or null");
    a.waiting_for = *waiting->as_string();
  }
  return Reader(json)
      .read(a.client, count, "client")
      .read(a.gpu, text, "gpu")
      .read(a.state, text, "state")
      .read(a.explanation, text, "explanation")
      .done(a);
}

Result<VersionAnswer> decode_answer(const Json& json, std::type_identity<VersionAnswer>) {
  VersionAnswer a;
  auto range = typed_member(json, "protocol", Json::Kind::kObject, "an object");
  if (!range) return range.error();
  auto in_range = Reader(*range.value())
                      .read(a.protocol_min, integer, "min")
                      .read(a.protocol_max, integer, "max")
                      .done(a);
  if (!in_range) return make_error("protocol: " + in_range.error().message);
  return Reader(json).read(a.version, text, "version").done(a);
}

Result<StatsAnswer> decode_answer(const Json& json, std::type_identity<StatsAnswer>) {
  StatsAnswer a;
  auto latency = typed_member(json, "decision_latency_us", Json::Kind::kObject, "an object");
  if (!latency) return latency.error();
  LatencySummary& l = a.decision_latency_us;
  auto summary = Reader(*latency.value())
                     .read(l.count, count, "count")
                     .read(l.mean, number, "mean")
                     .read(l.p50, number, "p50")
                     .read(l.p90, number, "p90")
                     .read(l.p99, number, "p99")
                     .read(l.p999, number, "p999")
                     .read(l.max, number, "max")
                     .done(a);
  if (!summary) return make_error("decision_latency_us: " + summary.error().message);
  return Reader(json)
      .read(a.frames_in, counters, "frames_in")
      .read(a.frames_out, counters, "frames_out")
      .read(a.frames_in_total, count, "frames_in_total")
      .read(a.frames_out_total, count, "frames_out_total")
      .read(a.bytes_in, count, "bytes_in")
      .read(a.bytes_out, count, "bytes_out")
      .read(a.sessions, counters, "sessions")
      .read(a.control_requests, count, "control_requests")
      .read(a.control_refused, count, "control_refused")
      .done(a);
}

Result<StatusAnswer> decode_answer(const Json& json, std::type_identity<StatusAnswer>) {
  StatusAnswer a;
  auto scheduler = typed_member(json, "scheduler", Json::Kind::kObject, "an object");
  if (!scheduler) return scheduler.error();
  SchedulerInfo& s = a.scheduler;
  const auto any = [](const Json& object, std::string_view key) -> Result<Json> {
    auto value = member(object, key);
    if (!value) return value.error();
    return *value.value();
  };
  auto info = Reader(*scheduler.value())
                  .read(s.version, text, "version")
                  .read(s.pid, integer, "pid")
                  .read(s.uptime_s, number, "uptime_s")
                  .read(s.client_sessions, count, "client_sessions")
                  .read(s.clients, count, "clients")
                  .read(s.limits_synced, flag, "limits_synced")
                  .read(s.config, any, "config")
                  .done(a);
  if (!info) return make_error("scheduler: " + info.error().message);
  for (const auto& [key, value] : *json.as_object()) {
    if (key != "ok" && key != "scheduler") a.body.set(key, value);
  }
  return a;
}

}  // namespace nvshare::control
