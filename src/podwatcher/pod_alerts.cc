#include "podwatcher/pod_alerts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "common/quantity.h"

namespace nvshare::podwatcher {
namespace {

std::uint64_t unsigned_member(const Json& object, std::string_view key) {
  const Json* value = object.find(key);
  const std::optional<std::int64_t> n = value != nullptr ? value->as_int64() : std::nullopt;
  return n && *n > 0 ? static_cast<std::uint64_t>(*n) : 0;
}

double number_member(const Json* object, std::string_view key) {
  const Json* value = object != nullptr ? object->find(key) : nullptr;
  const std::optional<double> n = value != nullptr ? value->as_double() : std::nullopt;
  return n && std::isfinite(*n) && *n > 0 ? *n : 0;
}

std::string seconds_text(double s) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f s", s);
  return buffer;
}

}  // namespace

std::vector<PodUsage> pod_usage_from_status(const Json& body) {
  std::map<std::string, PodUsage> pods;
  const Json* gpus = body.find("gpus");
  if (gpus == nullptr || gpus->as_array() == nullptr) return {};
  for (const Json& gpu : *gpus->as_array()) {
    const Json* clients = gpu.find("clients");
    if (clients == nullptr || clients->as_array() == nullptr) continue;
    for (const Json& client : *clients->as_array()) {
      const Json* uid = client.find("pod_uid");
      if (uid == nullptr || uid->as_string() == nullptr || uid->as_string()->empty()) continue;
      PodUsage& pod = pods[*uid->as_string()];
      pod.pod_uid = *uid->as_string();
      pod.refused_allocations += unsigned_member(client, "refused_allocations");
      pod.quota_wait_s += number_member(client.find("waited_by_reason_ms"), "quota") / 1e3;
      if (const std::uint64_t core = unsigned_member(client, "core_limit_percent"); core != 0) {
        pod.core_limit_percent = std::min<int>(pod.core_limit_percent, static_cast<int>(core));
      }
      pod.memory_limit_bytes =
          std::max(pod.memory_limit_bytes, unsigned_member(client, "memory_limit_bytes"));
    }
  }
  std::vector<PodUsage> out;
  for (auto& [uid, pod] : pods) out.push_back(std::move(pod));
  return out;
}

bool PodAlerts::due(PodState& state, const std::string& reason, MonoTime now) {
  auto it = state.last_posted.find(reason);
  if (it != state.last_posted.end() && now - it->second < config_.repeat_after) {
    ++suppressed_;
    return false;
  }
  state.last_posted[reason] = now;
  return true;
}

std::vector<PodAlert> PodAlerts::observe(const std::vector<PodUsage>& pods, MonoTime now) {
  std::vector<PodAlert> alerts;
  std::set<std::string> seen;
  for (const PodUsage& usage : pods) {
    seen.insert(usage.pod_uid);
    auto [it, inserted] = pods_.try_emplace(usage.pod_uid);
    PodState& state = it->second;
    // Refused allocations: any new one since the previous sample (or, for a pod seen for the
    // first time, any at all).
    if (usage.refused_allocations > state.refused || (inserted && usage.refused_allocations > 0)) {
      const std::uint64_t fresh = usage.refused_allocations - (inserted ? 0 : state.refused);
      if (due(state, kMemoryLimitReason, now)) {
        std::string limit = usage.memory_limit_bytes != 0
                                ? " of " + format_bytes(usage.memory_limit_bytes)
                                : std::string();
        alerts.push_back({usage.pod_uid, kMemoryLimitReason,
                          std::to_string(fresh) +
                              " GPU memory allocation(s) refused by the pod's memory limit" +
                              limit +
                              " (the application saw CUDA_ERROR_OUT_OF_MEMORY); raise "
                              "nvshare.com/gpu-memory-limit or allocate less"});
      }
    }
    state.refused = usage.refused_allocations;
    // Throttled: the wait for the cap over the throttle window.
    if (!state.waits.empty() && usage.quota_wait_s < state.waits.back().quota_wait_s) {
      state.waits.clear();  // a process left: a new baseline
    }
    state.waits.push_back({now, usage.quota_wait_s});
    while (state.waits.size() > 1 && now - state.waits[1].at >= config_.throttle_window) {
      state.waits.pop_front();
    }
    const Sample& oldest = state.waits.front();
    const double span = to_seconds(now - oldest.at);
    const double waited = usage.quota_wait_s - oldest.quota_wait_s;
    if (span >= to_seconds(config_.throttle_window) && waited >= config_.throttle_fraction * span &&
        due(state, kThrottledReason, now)) {
      alerts.push_back(
          {usage.pod_uid, kThrottledReason,
           "waited " + seconds_text(waited) + " of the last " + seconds_text(span) +
               " for its compute cap of " + std::to_string(usage.core_limit_percent) +
               "%: the cap, not the GPU, sets its speed (nvshare.com/gpu-core-limit)"});
    }
  }
  std::erase_if(pods_, [&](const auto& entry) { return seen.count(entry.first) == 0; });
  return alerts;
}

}  // namespace nvshare::podwatcher
