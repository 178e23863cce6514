#include "podwatcher/pod_limits.h"

#include "common/quantity.h"

namespace nvshare::podwatcher {
namespace {

const Json* member(const Json& object, std::string_view key) { return object.find(key); }

std::string string_member(const Json& object, std::string_view key) {
  const Json* value = member(object, key);
  const std::string* text = value != nullptr ? value->as_string() : nullptr;
  return text != nullptr ? *text : std::string();
}

bool container_requests(const Json& container, std::string_view resource_name) {
  const Json* resources = member(container, "resources");
  if (resources == nullptr) return false;
  for (const char* section : {"limits", "requests"}) {
    const Json* amounts = member(*resources, section);
    if (amounts == nullptr || !amounts->is_object()) continue;
    if (amounts->find(resource_name) != nullptr) return true;
  }
  return false;
}

bool pod_requests(const Json& spec, std::string_view resource_name) {
  for (const char* list : {"containers", "initContainers"}) {
    const Json* containers = member(spec, list);
    if (containers == nullptr || !containers->is_array()) continue;
    for (const Json& container : *containers->as_array()) {
      if (container_requests(container, resource_name)) return true;
    }
  }
  return false;
}

std::string describe_memory(const std::optional<std::uint64_t>& bytes) {
  return bytes ? format_bytes(*bytes) : std::string("none");
}

std::string describe_core(const std::optional<int>& percent) {
  return percent ? std::to_string(*percent) + "%" : std::string("none");
}

AnnotationProblem problem(std::string_view annotation, const std::string& value, std::string reason,
                          const std::string& kept) {
  AnnotationProblem out;
  out.annotation = std::string(annotation);
  out.value = value;
  out.reason = std::move(reason);
  out.message = "invalid " + out.annotation + " \"" + value + "\": " + out.reason +
                "; keeping the previous limit (" + kept + ")";
  return out;
}

}  // namespace

Result<PodView> parse_pod(const Json& pod, std::string_view resource_name) {
  if (!pod.is_object()) return make_error("pod is not a JSON object");
  const Json* metadata = member(pod, "metadata");
  if (metadata == nullptr || !metadata->is_object()) return make_error("pod has no metadata");
  PodView view;
  view.uid = string_member(*metadata, "uid");
  if (view.uid.empty()) return make_error("pod has no metadata.uid");
  view.namespace_name = string_member(*metadata, "namespace");
  view.name = string_member(*metadata, "name");
  view.resource_version = string_member(*metadata, "resourceVersion");
  const Json* deletion = member(*metadata, "deletionTimestamp");
  view.deleting = deletion != nullptr && !deletion->is_null();
  if (const Json* annotations = member(*metadata, "annotations");
      annotations != nullptr && annotations->is_object()) {
    for (auto [key, field] : {std::pair{kMemoryLimitAnnotation, &view.memory_annotation},
                              std::pair{kCoreLimitAnnotation, &view.core_annotation},
                              std::pair{kMemoryModeAnnotation, &view.memory_mode_annotation},
                              std::pair{kPriorityAnnotation, &view.priority_annotation}}) {
      const Json* value = annotations->find(key);
      if (value == nullptr) continue;
      // Annotation values are strings in the API; anything else is shown as written.
      *field = value->is_string() ? *value->as_string() : value->dump();
    }
  }
  if (const Json* spec = member(pod, "spec")) {
    view.node_name = string_member(*spec, "nodeName");
    view.requests_resource = pod_requests(*spec, resource_name);
  }
  if (const Json* status = member(pod, "status")) view.phase = string_member(*status, "phase");
  return view;
}

LimitsDecision decide_limits(const PodView& pod, const PodLimits& previous) {
  LimitsDecision decision;
  if (pod.memory_annotation) {
    const std::string& text = *pod.memory_annotation;
    auto bytes = parse_memory_quantity(text);
    if (!bytes) {
      decision.limits.memory_bytes = previous.memory_bytes;
      decision.problems.push_back(problem(kMemoryLimitAnnotation, text, bytes.error().message,
                                          describe_memory(previous.memory_bytes)));
    } else if (bytes.value() == 0) {
      // The scheduler reads 0 bytes as "no limit"; an annotation that says 0 is almost surely a
      // mistake, and removing the annotation is the way to say "no limit".
      decision.limits.memory_bytes = previous.memory_bytes;
      decision.problems.push_back(problem(kMemoryLimitAnnotation, text,
                                          "a memory limit must be greater than zero",
                                          describe_memory(previous.memory_bytes)));
    } else {
      decision.limits.memory_bytes = bytes.value();
    }
  }
  if (pod.core_annotation) {
    const std::string& text = *pod.core_annotation;
    auto percent = parse_percent(text);
    if (!percent) {
      decision.limits.core_percent = previous.core_percent;
      decision.problems.push_back(problem(kCoreLimitAnnotation, text, percent.error().message,
                                          describe_core(previous.core_percent)));
    } else {
      decision.limits.core_percent = percent.value();
    }
  }
  if (pod.memory_mode_annotation) {
    const std::string& text = *pod.memory_mode_annotation;
    if (const std::optional<MemoryMode> mode = parse_memory_mode(text)) {
      decision.limits.memory_mode = *mode;
    } else {
      decision.limits.memory_mode = previous.memory_mode;
      AnnotationProblem p =
          problem(kMemoryModeAnnotation, text, "not one of " + std::string(kMemoryModeWords),
                  previous.memory_mode ? std::string(to_string(*previous.memory_mode)) : "none");
      p.message = "invalid " + p.annotation + " \"" + text + "\": " + p.reason +
                  "; keeping the previous mode (" +
                  (previous.memory_mode ? std::string(to_string(*previous.memory_mode)) : "none") +
                  ")";
      decision.problems.push_back(std::move(p));
    }
  }
  if (pod.priority_annotation) {
    const std::string& text = *pod.priority_annotation;
    if (const std::optional<Priority> priority = parse_priority(text)) {
      decision.limits.priority = *priority;
    } else {
      decision.limits.priority = previous.priority;
      const std::string kept =
          previous.priority ? std::string(to_string(*previous.priority)) : "normal";
      AnnotationProblem p =
          problem(kPriorityAnnotation, text, "not one of " + std::string(kPriorityWords), kept);
      p.message = "invalid " + p.annotation + " \"" + text + "\": " + p.reason +
                  "; keeping the previous class (" + kept + ")";
      decision.problems.push_back(std::move(p));
    }
  }
  return decision;
}

}  // namespace nvshare::podwatcher
