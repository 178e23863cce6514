// The pure half of the pod watcher: what a pod object says, and which limits it asks for.
//
// parse_pod reads the members of a Kubernetes Pod object (JSON, as the API server sends it) that
// the watcher needs; it never throws and rejects objects without a UID. decide_limits turns the two
// nvshare annotations into the limits the pod layer should carry, given the limits in force before:
//  - an absent annotation means "this layer does not set the field" (nullopt);
//  - a valid one sets the field;
//  - an invalid one keeps the previous value of that field and is returned as a problem, so the
//    caller can report it (once per value) without changing anything.
// No I/O, no clocks, no threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/json.h"
#include "common/memory_mode.h"
#include "common/priority.h"
#include "common/result.h"

namespace nvshare::podwatcher {

inline constexpr std::string_view kMemoryLimitAnnotation = "nvshare.com/gpu-memory-limit";
inline constexpr std::string_view kCoreLimitAnnotation = "nvshare.com/gpu-core-limit";
inline constexpr std::string_view kMemoryModeAnnotation = "nvshare.com/gpu-memory-mode";
inline constexpr std::string_view kPriorityAnnotation = "nvshare.com/gpu-priority";

struct PodView {
  std::string uid;
  std::string namespace_name;
  std::string name;
  std::string node_name;         // spec.nodeName ("" while unscheduled)
  std::string phase;             // status.phase ("" when absent)
  std::string resource_version;  // metadata.resourceVersion
  bool deleting = false;         // metadata.deletionTimestamp is set
  bool requests_resource = false;
  std::optional<std::string> memory_annotation;  // raw value; nullopt when absent
  std::optional<std::string> core_annotation;
  std::optional<std::string> memory_mode_annotation;
  std::optional<std::string> priority_annotation;

  // Finished pods hold no GPU any more: Succeeded and Failed are terminal phases.
  bool finished() const { return phase == "Succeeded" || phase == "Failed"; }
};

// Reads a Pod object. `resource_name` is the extended resource that makes a pod managed: it counts
// when it appears in resources.limits or resources.requests of any container or init container.
Result<PodView> parse_pod(const Json& pod, std::string_view resource_name);

// The limits of the pod layer. nullopt: not set by this layer ("inherit").
struct PodLimits {
  std::optional<std::uint64_t> memory_bytes;
  std::optional<int> core_percent;
  std::optional<MemoryMode> memory_mode;  // how its processes' device allocations are backed
  std::optional<Priority> priority;       // its processes' priority class
  bool operator==(const PodLimits&) const = default;
};

struct AnnotationProblem {
  std::string annotation;  // the annotation key
  std::string value;       // its value as written
  std::string reason;      // what is wrong, for a person
  // "invalid nvshare.com/gpu-core-limit \"150\": ...; keeping the previous limit (30%)"
  std::string message;
};

struct LimitsDecision {
  PodLimits limits;
  std::vector<AnnotationProblem> problems;
};

LimitsDecision decide_limits(const PodView& pod, const PodLimits& previous);

}  // namespace nvshare::podwatcher
