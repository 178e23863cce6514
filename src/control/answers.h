// The control protocol's answers as types, and their one JSON codec (docs/control-api.md).
//
// The scheduler encodes every answer here; nvsharectl, the device plugin, the pod watcher and the
// bench read the answer their request expects through decode_reply, so an answer's members, their
// spellings and their types exist once: each answer lists its members in members(), which both
// the encoder and the decoder walk.
//
// Contract
//  - An answer is {"ok": true, <its members>}; a refusal is {"ok": false, "error": <message>}.
//  - decode_reply<A>(json) gives the Refusal when "ok" is false, the A when "ok" is true and every
//    member A lists is there with its type (an optional one may be absent or null), and an error
//    naming the member otherwise (no "ok", a refusal without a message, a member missing or of the
//    wrong type). Members an answer does not list are ignored: a newer scheduler may say more.
//  - decode_reply<A>(encode(a)) == a and decode_reply<A>(encode(refusal)) == refusal.
//  - status is typed at its envelope: its "scheduler" member is SchedulerInfo; the GPUs, clients
//    and pods the scheduler's snapshot writes stay one JSON document (StatusAnswer::body), the one
//    docs/control-api.md describes and nvsharectl's tables read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/json.h"
#include "common/result.h"

namespace nvshare::control {

struct Refusal {
  std::string error;
  bool operator==(const Refusal&) const = default;
};

// The answer of forget-pod and sync: done, nothing more to say.
struct Ack {
  template <typename Self, typename V>
  static void members(Self&, V&&) {}
  bool operator==(const Ack&) const = default;
};

struct SetLimitsAnswer {
  std::vector<std::uint64_t> clients;  // the clients whose limits changed
  std::vector<std::string> pods;       // the pod UIDs whose limits are remembered
  template <typename Self, typename V>
  static void members(Self& self, V&& v) {
    v("clients", self.clients);
    v("pods", self.pods);
  }
  bool operator==(const SetLimitsAnswer&) const = default;
};

struct SetPolicyAnswer {
  std::vector<std::string> gpus;  // the GPUs reconfigured now
  template <typename Self, typename V>
  static void members(Self& self, V&& v) {
    v("gpus", self.gpus);
  }
  bool operator==(const SetPolicyAnswer&) const = default;
};

struct SetGpusAnswer {
  std::uint64_t gpus = 0;  // GPUs the scheduler knows after the change
  template <typename Self, typename V>
  static void members(Self& self, V&& v) {
    v("gpus", self.gpus);
  }
  bool operator==(const SetGpusAnswer&) const = default;
};

struct ExplainAnswer {
  std::uint64_t client = 0;
  std::string gpu;
  std::string state;
  std::optional<std::string> waiting_for;
  std::string explanation;
  template <typename Self, typename V>
  static void members(Self& self, V&& v) {
    v("client", self.client);
    v("gpu", self.gpu);
    v("state", self.state);
    v("waiting_for", self.waiting_for);
    v("explanation", self.explanation);
  }
  bool operator==(const ExplainAnswer&) const = default;
};

struct ProtocolRange {
  std::int64_t min = 0;
  std::int64_t max = 0;
  template <typename Self, typename V>
  static void members(Self& self, V&& v) {
    v("min", self.min);
    v("max", self.max);
  }
  bool operator==(const ProtocolRange&) const = default;
};

struct VersionAnswer {
  std::string version;
  ProtocolRange protocol;  // the client protocol versions the scheduler speaks
  template <typename Self, typename V>
  static void members(Self& self, V&& v) {
    v("version", self.version);
    v("protocol", self.protocol);
  }
  bool operator==(const VersionAnswer&) const = default;
};

// Named counters in the scheduler's order (frame types, session outcomes).
using Counters = std::vector<std::pair<std::string, std::uint64_t>>;

struct LatencySummary {  // microseconds
  std::uint64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;
  template <typename Self, typename V>
  static void members(Self& self, V&& v) {
    v("count", self.count);
    for (auto [name, field] : {std::pair{"mean", &self.mean}, std::pair{"p50", &self.p50},
                               std::pair{"p90", &self.p90}, std::pair{"p99", &self.p99},
                               std::pair{"p999", &self.p999}, std::pair{"max", &self.max}}) {
      v(name, *field);
    }
  }
  bool operator==(const LatencySummary&) const = default;
};

struct StatsAnswer {
  Counters frames_in;
  Counters frames_out;
  std::uint64_t frames_in_total = 0;
  std::uint64_t frames_out_total = 0;
  std::uint64_t bytes_in = 0;
  std::uint64_t bytes_out = 0;
  Counters sessions;  // open, opened, closed, closed_<reason>..., refused_<reason>...
  std::uint64_t control_requests = 0;
  std::uint64_t control_refused = 0;
  LatencySummary decision_latency_us;
  template <typename Self, typename V>
  static void members(Self& self, V&& v) {
    v("frames_in", self.frames_in);
    v("frames_out", self.frames_out);
    for (auto [name, field] :
         {std::pair{"frames_in_total", &self.frames_in_total},
          std::pair{"frames_out_total", &self.frames_out_total},
          std::pair{"bytes_in", &self.bytes_in}, std::pair{"bytes_out", &self.bytes_out}}) {
      v(name, *field);
    }
    v("sessions", self.sessions);
    v("control_requests", self.control_requests);
    v("control_refused", self.control_refused);
    v("decision_latency_us", self.decision_latency_us);
  }
  bool operator==(const StatsAnswer&) const = default;
};

struct SchedulerInfo {
  std::string version;
  std::int64_t pid = 0;
  double uptime_s = 0;
  std::uint64_t client_sessions = 0;
  std::uint64_t clients = 0;
  bool limits_synced = false;
  // The GPUs it knows (NVML, --gpus, the device plugin's set-gpus): it refuses clients of others.
  std::vector<std::string> gpus;
  Json config;  // the effective configuration, knob by knob
  template <typename Self, typename V>
  static void members(Self& self, V&& v) {
    v("version", self.version);
    v("pid", self.pid);
    v("gpus", self.gpus);
    v("uptime_s", self.uptime_s);
    v("client_sessions", self.client_sessions);
    v("clients", self.clients);
    v("limits_synced", self.limits_synced);
    v("config", self.config);
  }
  bool operator==(const SchedulerInfo&) const = default;
};

struct StatusAnswer {
  SchedulerInfo scheduler;
  Json body = Json::object();  // gpus, clients, pods, ... as the snapshot writes them
  template <typename Self, typename V>
  static void members(Self& self, V&& v) {
    v("scheduler", self.scheduler);
  }
  bool operator==(const StatusAnswer&) const = default;
};

// What came back: the answer, or the scheduler's refusal.
template <typename A>
struct Reply {
  std::variant<A, Refusal> value;
  bool refused() const { return std::holds_alternative<Refusal>(value); }
  const A& answer() const { return std::get<A>(value); }
  const std::string& refusal() const { return std::get<Refusal>(value).error; }
  bool operator==(const Reply&) const = default;
};

using Answer = std::variant<Refusal, Ack, SetLimitsAnswer, SetPolicyAnswer, SetGpusAnswer,
                            ExplainAnswer, VersionAnswer, StatsAnswer, StatusAnswer>;

Json encode(const Answer& answer);

// The refusal a response carries (nullopt when "ok" is true), or an error when it says neither.
Result<std::optional<Refusal>> decode_refusal(const Json& json);

// The members of answer type A ("ok" already known to be true). Defined for every type in Answer
// but Refusal.
template <typename A>
Result<A> decode_answer(const Json& json);

template <typename A>
Result<Reply<A>> decode_reply(const Json& json) {
  auto refusal = decode_refusal(json);
  if (!refusal) return refusal.error();
  if (refusal.value()) return Reply<A>{std::move(*refusal.value())};
  auto answer = decode_answer<A>(json);
  if (!answer) return make_error("malformed answer: " + answer.error().message);
  return Reply<A>{std::move(answer).value()};
}

}  // namespace nvshare::control
