// The control protocol's requests as types, and their one JSON codec (docs/control-api.md).
//
// Every program that speaks to the scheduler's control socket builds a Request and encodes it here
// (nvsharectl, the device plugin, the pod watcher, the bench, the tests); the scheduler decodes
// every line here before it acts. So a request's members, their spellings and their checks exist
// once.
//
// Contract
//  - encode() gives {"cmd": <name>, ...} with only the members that carry something.
//  - decode() accepts exactly what encode() can give and the spellings docs/control-api.md lists
//    (memory as bytes or a quantity, core as a number or "30%", null or "none" for no limit,
//    "inherit"); anything else, an unknown member included, is an error whose message names the
//    member and what it accepts. A decoded request has been checked for shape, not against the
//    scheduler's state (a pod UID's spelling and set-policy's knob names are the scheduler's).
//  - decode(encode(r)) == r for every request r.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/gpu_inventory.h"
#include "common/json.h"
#include "common/result.h"
#include "control/answers.h"

namespace nvshare::control {

// One field of a limits change: keep what the layer has, set a value ("none" is a value: memory 0,
// core 100), or inherit from the layers below.
struct FieldChange {
  enum class Op { kKeep, kSet, kInherit };
  Op op = Op::kKeep;
  std::uint64_t value = 0;  // with kSet: bytes (0 = none) or percent (100 = uncapped)
  bool operator==(const FieldChange&) const = default;
};

// The one type for "change these limits": from an annotation, a command line or a request.
struct LimitsChange {
  FieldChange memory;
  FieldChange core;
  // With kSet: a protocol::Limits memory mode code (1..3; common/memory_mode.h word + 1).
  FieldChange memory_mode;
  // With kSet: a protocol::Limits priority code (1..3; common/priority.h class + 1).
  FieldChange priority;
  bool operator==(const LimitsChange&) const = default;
};

// Which clients or pods a set-limits applies to. Exactly one of client, pid, pod_uid or
// namespace/name; pod_uid may come with namespace/name, which is then remembered for display.
struct Selector {
  std::optional<std::uint64_t> client;
  std::optional<pid_t> pid;
  std::optional<std::string> pod_uid;
  std::optional<std::string> pod_namespace;
  std::optional<std::string> pod_name;
  bool operator==(const Selector&) const = default;
};

struct StatusRequest {
  using AnswerType = StatusAnswer;
  bool operator==(const StatusRequest&) const = default;
};
struct SetLimitsRequest {
  using AnswerType = SetLimitsAnswer;
  Selector selector;
  LimitsChange change;
  bool operator==(const SetLimitsRequest&) const = default;
};
struct ForgetPodRequest {
  using AnswerType = Ack;
  std::string pod_uid;
  bool operator==(const ForgetPodRequest&) const = default;
};
// Policy knobs by their set-policy member names (the scheduler checks the names); a value of
// nullopt puts the knob back to its default.
struct SetPolicyRequest {
  using AnswerType = SetPolicyAnswer;
  std::optional<std::string> gpu;  // nullopt: every GPU and the defaults for GPUs to come
  std::vector<std::pair<std::string, std::optional<std::string>>> settings;
  bool operator==(const SetPolicyRequest&) const = default;
};
struct SetGpusRequest {
  using AnswerType = SetGpusAnswer;
  std::vector<GpuInfo> gpus;  // uuid and memory_bytes travel; index is the position
  bool operator==(const SetGpusRequest& other) const;
};
struct SyncRequest {
  using AnswerType = Ack;
  bool operator==(const SyncRequest&) const = default;
};
struct ExplainRequest {
  using AnswerType = ExplainAnswer;
  std::uint64_t client = 0;
  bool operator==(const ExplainRequest&) const = default;
};
struct StatsRequest {
  using AnswerType = StatsAnswer;
  bool reset = false;
  bool operator==(const StatsRequest&) const = default;
};
struct VersionRequest {
  using AnswerType = VersionAnswer;
  bool operator==(const VersionRequest&) const = default;
};

using Request =
    std::variant<StatusRequest, SetLimitsRequest, ForgetPodRequest, SetPolicyRequest,
                 SetGpusRequest, SyncRequest, ExplainRequest, StatsRequest, VersionRequest>;

// The answer each request expects (answers.h).
template <typename R>
using AnswerOf = typename R::AnswerType;

// "status", "set-limits", ... in the order of Request's alternatives.
std::span<const std::string_view> command_names();
std::string_view command_name(const Request& request);

Json encode(const Request& request);
Result<Request> decode(const Json& request);

// A memory field as a request carries it: bytes, null for none, or "inherit" (absent: keep).
std::optional<Json> encode_memory(const FieldChange& change);
std::optional<Json> encode_core(const FieldChange& change);
std::optional<Json> encode_memory_mode(const FieldChange& change);
std::optional<Json> encode_priority(const FieldChange& change);

}  // namespace nvshare::control
