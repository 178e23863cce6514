// The control protocol's answers as types, and their one JSON codec (docs/control-api.md).
//
// The scheduler encodes every answer here; nvsharectl, the device plugin, the pod watcher and the
// bench read the answer their request expects through decode_reply, so an answer's members, their
// spellings and their types exist once.
//
// Contract
//  - An answer is {"ok": true, <its members>}; a refusal is {"ok": false, "error": <message>}.
//  - decode_reply<A>(json) gives the Refusal when "ok" is false, the A when "ok" is true and every
//    member A needs is there with its type, and an error naming the member otherwise (no "ok", a
//    refusal without a message, a member of the wrong type). Members an answer does not know are
//    ignored: a newer scheduler may say more.
//  - decode_reply<A>(encode(a)) == a and decode_reply<A>(encode(refusal)) == refusal.
//  - status is typed at its envelope: its "scheduler" member is SchedulerInfo; the GPUs, clients
//    and pods the scheduler's snapshot writes stay one JSON document (StatusAnswer::body), the one
//    docs/control-api.md describes and nvsharectl's tables read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "common/json.h"
#include "common/result.h"
#include "control/requests.h"

namespace nvshare::control {

struct Refusal {
  std::string error;
  bool operator==(const Refusal&) const = default;
};

// The answer of forget-pod and sync: done, nothing more to say.
struct Ack {
  bool operator==(const Ack&) const = default;
};

struct SetLimitsAnswer {
  std::vector<std::uint64_t> clients;  // the clients whose limits changed
  std::vector<std::string> pods;       // the pod UIDs whose limits are remembered
  bool operator==(const SetLimitsAnswer&) const = default;
};

struct SetPolicyAnswer {
  std::vector<std::string> gpus;  // the GPUs reconfigured now
  bool operator==(const SetPolicyAnswer&) const = default;
};

struct SetGpusAnswer {
  std::uint64_t gpus = 0;  // GPUs the scheduler knows after the change
  bool operator==(const SetGpusAnswer&) const = default;
};

struct ExplainAnswer {
  std::uint64_t client = 0;
  std::string gpu;
  std::string state;
  std::optional<std::string> waiting_for;
  std::string explanation;
  bool operator==(const ExplainAnswer&) const = default;
};

struct VersionAnswer {
  std::string version;
  std::int64_t protocol_min = 0;
  std::int64_t protocol_max = 0;
  bool operator==(const VersionAnswer&) const = default;
};

// Named counters in the scheduler's order (frame types, session outcomes).
using Counters = std::vector<std::pair<std::string, std::uint64_t>>;

struct LatencySummary {  // microseconds
  std::uint64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;
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
  bool operator==(const StatsAnswer&) const = default;
};

struct SchedulerInfo {
  std::string version;
  std::int64_t pid = 0;
  double uptime_s = 0;
  std::uint64_t client_sessions = 0;
  std::uint64_t clients = 0;
  bool limits_synced = false;
  Json config;  // the effective configuration, knob by knob
  bool operator==(const SchedulerInfo&) const = default;
};

struct StatusAnswer {
  SchedulerInfo scheduler;
  Json body = Json::object();  // gpus, clients, pods, ... as the snapshot writes them
  bool operator==(const StatusAnswer&) const = default;
};

// The answer each request expects.
template <typename R>
struct AnswerTo;
template <>
struct AnswerTo<StatusRequest> {
  using type = StatusAnswer;
};
template <>
struct AnswerTo<SetLimitsRequest> {
  using type = SetLimitsAnswer;
};
template <>
struct AnswerTo<ForgetPodRequest> {
  using type = Ack;
};
template <>
struct AnswerTo<SetPolicyRequest> {
  using type = SetPolicyAnswer;
};
template <>
struct AnswerTo<SetGpusRequest> {
  using type = SetGpusAnswer;
};
template <>
struct AnswerTo<SyncRequest> {
  using type = Ack;
};
template <>
struct AnswerTo<ExplainRequest> {
  using type = ExplainAnswer;
};
template <>
struct AnswerTo<StatsRequest> {
  using type = StatsAnswer;
};
template <>
struct AnswerTo<VersionRequest> {
  using type = VersionAnswer;
};
template <typename R>
using AnswerOf = typename AnswerTo<R>::type;

// What came back: the answer, or the scheduler's refusal.
template <typename A>
struct Reply {
  std::variant<A, Refusal> value;
  bool refused() const { return std::holds_alternative<Refusal>(value); }
  const A& answer() const { return std::get<A>(value); }
  const std::string& refusal() const { return std::get<Refusal>(value).error; }
  bool operator==(const Reply&) const = default;
};

Json encode(const Refusal& refusal);
Json encode(const Ack& answer);
Json encode(const SetLimitsAnswer& answer);
Json encode(const SetPolicyAnswer& answer);
Json encode(const SetGpusAnswer& answer);
Json encode(const ExplainAnswer& answer);
Json encode(const VersionAnswer& answer);
Json encode(const StatsAnswer& answer);
Json encode(const StatusAnswer& answer);

// The answer's own members, "ok" already known to be true.
Result<Ack> decode_answer(const Json& json, std::type_identity<Ack>);
Result<SetLimitsAnswer> decode_answer(const Json& json, std::type_identity<SetLimitsAnswer>);
Result<SetPolicyAnswer> decode_answer(const Json& json, std::type_identity<SetPolicyAnswer>);
Result<SetGpusAnswer> decode_answer(const Json& json, std::type_identity<SetGpusAnswer>);
Result<ExplainAnswer> decode_answer(const Json& json, std::type_identity<ExplainAnswer>);
Result<VersionAnswer> decode_answer(const Json& json, std::type_identity<VersionAnswer>);
Result<StatsAnswer> decode_answer(const Json& json, std::type_identity<StatsAnswer>);
Result<StatusAnswer> decode_answer(const Json& json, std::type_identity<StatusAnswer>);

// The refusal a response carries (nullopt when "ok" is true), or an error when it says neither.
Result<std::optional<Refusal>> decode_refusal(const Json& json);

template <typename A>
Result<Reply<A>> decode_reply(const Json& json) {
  auto refusal = decode_refusal(json);
  if (!refusal) return refusal.error();
  if (refusal.value()) return Reply<A>{std::move(*refusal.value())};
  auto answer = decode_answer(json, std::type_identity<A>{});
  if (!answer) return make_error("malformed answer: " + answer.error().message);
  return Reply<A>{std::move(answer).value()};
}

}  // namespace nvshare::control
