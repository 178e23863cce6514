#include "podwatcher/limits_ledger.h"

#include "common/protocol.h"

namespace nvshare::podwatcher {

control::Request ControlCommand::to_request() const {
  if (kind == Kind::kForgetPod) return control::ForgetPodRequest{pod_uid};
  control::SetLimitsRequest request;
  request.selector.pod_uid = pod_uid;
  // The scheduler records names only when both are given (the namespace/name selector needs both).
  if (!namespace_name.empty() && !name.empty()) {
    request.selector.pod_namespace = namespace_name;
    request.selector.pod_name = name;
  }
  using Op = control::FieldChange::Op;
  if (send_memory) {
    request.change.memory = limits.memory_bytes
                                ? control::FieldChange{Op::kSet, *limits.memory_bytes}
                                : control::FieldChange{Op::kInherit, 0};
  }
  if (send_core) {
    request.change.core =
        limits.core_percent
            ? control::FieldChange{Op::kSet, static_cast<std::uint64_t>(*limits.core_percent)}
            : control::FieldChange{Op::kInherit, 0};
  }
  if (send_memory_mode) {
    request.change.memory_mode =
        limits.memory_mode
            ? control::FieldChange{Op::kSet, protocol::memory_mode_code(*limits.memory_mode)}
            : control::FieldChange{Op::kInherit, 0};
  }
  if (send_priority) {
    request.change.priority =
        limits.priority ? control::FieldChange{Op::kSet, protocol::priority_code(*limits.priority)}
                        : control::FieldChange{Op::kInherit, 0};
  }
  return request;
}

void LimitsLedger::set_desired(const std::string& pod_uid, const std::string& namespace_name,
                               const std::string& name, const PodLimits& limits) {
  desired_[pod_uid] = Desired{namespace_name, name, limits};
}

void LimitsLedger::remove(const std::string& pod_uid) { desired_.erase(pod_uid); }

std::optional<ControlCommand> LimitsLedger::next_command() const {
  for (const auto& [uid, want] : desired_) {
    auto pushed = pushed_.find(uid);
    ControlCommand command;
    command.pod_uid = uid;
    command.namespace_name = want.namespace_name;
    command.name = want.name;
    command.limits = want.limits;
    if (pushed == pushed_.end()) {
      // First push (or after a scheduler restart): both fields, so the record is complete.
      command.send_memory = true;
      command.send_core = true;
      command.send_memory_mode = true;
      command.send_priority = true;
      return command;
    }
    command.send_memory = pushed->second.memory_bytes != want.limits.memory_bytes;
    command.send_core = pushed->second.core_percent != want.limits.core_percent;
    command.send_memory_mode = pushed->second.memory_mode != want.limits.memory_mode;
    command.send_priority = pushed->second.priority != want.limits.priority;
    if (command.send_memory || command.send_core || command.send_memory_mode ||
        command.send_priority) {
      return command;
    }
  }
  for (const auto& [uid, limits] : pushed_) {
    if (desired_.contains(uid)) continue;
    ControlCommand command;
    command.kind = ControlCommand::Kind::kForgetPod;
    command.pod_uid = uid;
    return command;
  }
  return std::nullopt;
}

void LimitsLedger::mark_done(const ControlCommand& command) {
  if (command.kind == ControlCommand::Kind::kForgetPod) {
    pushed_.erase(command.pod_uid);
    return;
  }
  PodLimits& pushed = pushed_[command.pod_uid];
  if (command.send_memory) pushed.memory_bytes = command.limits.memory_bytes;
  if (command.send_core) pushed.core_percent = command.limits.core_percent;
  if (command.send_memory_mode) pushed.memory_mode = command.limits.memory_mode;
  if (command.send_priority) pushed.priority = command.limits.priority;
}

void LimitsLedger::mark_all_unpushed() { pushed_.clear(); }

std::optional<PodLimits> LimitsLedger::desired(const std::string& pod_uid) const {
  auto it = desired_.find(pod_uid);
  if (it == desired_.end()) return std::nullopt;
  return it->second.limits;
}

std::map<std::string, std::uint64_t> LimitsLedger::memory_limits() const {
  std::map<std::string, std::uint64_t> out;
  for (const auto& [uid, want] : desired_) {
    if (want.limits.memory_bytes) out.emplace(uid, *want.limits.memory_bytes);
  }
  return out;
}

std::map<std::string, int> LimitsLedger::core_limits() const {
  std::map<std::string, int> out;
  for (const auto& [uid, want] : desired_) {
    if (want.limits.core_percent) out.emplace(uid, *want.limits.core_percent);
  }
  return out;
}

}  // namespace nvshare::podwatcher
