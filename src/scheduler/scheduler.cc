#include "scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common/log.h"
#include "common/quantity.h"
#include "scheduler/pod_identity.h"
#include "scheduler/policy/gang.h"

namespace nvshare::scheduler {
namespace {

double to_ms_value(Duration d) { return static_cast<double>(d.count()) / 1e6; }

// A usage report's pace, when the client measured one.
std::optional<std::uint16_t> pace_of(const protocol::Usage& usage) {
  if (usage.deep_queue_permille == protocol::Usage::kPaceUnknown) return std::nullopt;
  return usage.deep_queue_permille;
}

// Rounds to 0.1 so that status output stays readable.
double tenths(double value) { return std::round(value * 10) / 10; }

Json optional_string(const std::optional<std::string>& value) {
  return value ? Json(*value) : Json();
}

void apply_change(const FieldChange& change, std::optional<std::uint64_t>& field) {
  switch (change.op) {
    case FieldChange::Op::kKeep:
      break;
    case FieldChange::Op::kSet:
      field = change.value;
      break;
    case FieldChange::Op::kInherit:
      field.reset();
      break;
  }
}

void apply_change(const FieldChange& change, std::optional<std::uint8_t>& field) {
  switch (change.op) {
    case FieldChange::Op::kKeep:
      break;
    case FieldChange::Op::kSet:
      field = static_cast<std::uint8_t>(change.value);
      break;
    case FieldChange::Op::kInherit:
      field.reset();
      break;
  }
}

// A memory mode code as status shows it: its word, or null for none.
Json memory_mode_json(std::uint8_t code) {
  const std::optional<MemoryMode> mode = protocol::memory_mode_of(code);
  return mode ? Json(std::string(to_string(*mode))) : Json();
}

// A priority code as status shows it: its word, or null for none.
Json priority_json(std::uint8_t code) {
  const std::optional<Priority> priority = protocol::priority_of(code);
  return priority ? Json(std::string(to_string(*priority))) : Json();
}

Json layer_json(const LimitsLayer& layer) {
  Json out = Json::object();
  out.set("memory_limit_bytes", layer.memory_bytes ? Json(*layer.memory_bytes) : Json());
  out.set("core_limit_percent",
          layer.core_percent ? Json(static_cast<int>(*layer.core_percent)) : Json());
  out.set("memory_mode", memory_mode_json(layer.memory_mode.value_or(0)));
  out.set("priority", priority_json(layer.priority.value_or(0)));
  return out;
}

}  // namespace

Scheduler::Scheduler(DaemonConfig config, ClientChannel& channel)
    : config_(std::move(config)),
      channel_(channel),
      synced_(config_.trust_client_limits),
      process_alive_([](pid_t pid, std::uint64_t start) { return process_alive(pid, start); }) {}

policy::PolicyConfig Scheduler::config_for(const std::string& uuid) const {
  if (auto it = gpu_overrides_.find(uuid); it != gpu_overrides_.end()) {
    policy::PolicyConfig config = it->second;
    if (auto known = inventory_.find(uuid); known != inventory_.end()) {
      config.device_bytes = known->second.memory_bytes;
    }
    return config;
  }
  policy::PolicyConfig config = config_.policy;
  config.capacity_bytes = config_.capacity.for_gpu(uuid);
  if (auto it = inventory_.find(uuid); it != inventory_.end()) {
    config.device_bytes = it->second.memory_bytes;
  }
  return config;
}

Scheduler::Gpu& Scheduler::gpu_for(const std::string& uuid, MonoTime) {
  auto it = gpus_.find(uuid);
  if (it == gpus_.end()) {
    it = gpus_.emplace(uuid, std::make_unique<Gpu>(config_for(uuid))).first;
    NVSHARE_INFO("GPU %s: policy created (mode %s)", uuid.c_str(),
                 std::string(policy::to_string(it->second->policy.config().mode)).c_str());
  }
  return *it->second;
}

protocol::Limits Scheduler::effective_limits(const Client& client, std::string* source) const {
  const LimitsLayer* pod = nullptr;
  if (client.pod_uid) {
    if (auto it = pods_.find(*client.pod_uid); it != pods_.end()) pod = &it->second.limits;
  }
  const LimitsLayer* layers[] = {&client.own, pod, &client.declared};
  static constexpr const char* kNames[] = {"client", "pod", "declared"};
  protocol::Limits limits;
  bool memory_found = false;
  bool core_found = false;
  std::string used;
  for (int i = 0; i < 3; ++i) {
    const LimitsLayer* layer = layers[i];
    if (layer == nullptr) continue;
    bool contributed = false;
    if (!memory_found && layer->memory_bytes) {
      limits.memory_bytes = *layer->memory_bytes;
      memory_found = contributed = true;
    }
    if (!core_found && layer->core_percent) {
      limits.core_percent = *layer->core_percent;
      core_found = contributed = true;
    }
    if (limits.memory_mode == protocol::Limits::kNoMemoryMode && layer->memory_mode) {
      limits.memory_mode = *layer->memory_mode;
    }
    if (limits.priority == protocol::Limits::kNoPriority && layer->priority) {
      limits.priority = *layer->priority;
    }
    if (contributed) used += used.empty() ? kNames[i] : std::string("+") + kNames[i];
  }
  if (limits.memory_mode == protocol::Limits::kNoMemoryMode && config_.memory_mode) {
    limits.memory_mode = protocol::memory_mode_code(*config_.memory_mode);
  }
  if (source != nullptr) *source = used.empty() ? "none" : used;
  return limits;
}

bool Scheduler::authoritative(const Client& client) const {
  if (synced_ || !client.own.empty()) return true;
  return client.pod_uid && pods_.count(*client.pod_uid) != 0;
}

protocol::SetLimits Scheduler::limits_frame(const Client& client) const {
  protocol::SetLimits frame{client.effective};
  if (!authoritative(client)) frame.flags = protocol::SetLimits::kProvisional;
  return frame;
}

void Scheduler::send_limits_if_needed(Client& client) {
  const protocol::SetLimits frame = limits_frame(client);
  const bool needed = client.last_sent ? *client.last_sent != frame
                                       : frame != protocol::SetLimits{protocol::Limits{}};
  if (!needed) return;
  channel_.send(client.id, frame);
  client.last_sent = frame;
}

void Scheduler::remember_process(const Client& client) {
  if (client.identity.start_time == 0) return;  // unknown start: a reused pid could inherit it
  const ProcessKey key = client.process();
  const auto it = processes_.find(key);
  if (client.own.empty()) {
    if (it != processes_.end()) {
      processes_.erase(it);
      state_dirty_ = true;
    }
    return;
  }
  if (it != processes_.end() && it->second == client.own) return;
  if (it == processes_.end() && processes_.size() >= kMaxStateRecords) {
    NVSHARE_WARN("not keeping the limits of pid %d across restarts: %zu processes have some",
                 static_cast<int>(client.identity.pid), processes_.size());
    return;
  }
  processes_[key] = client.own;
  state_dirty_ = true;
}

void Scheduler::refresh_limits(Client& client, MonoTime now) {
  const protocol::Limits limits = effective_limits(client);
  if (limits == client.effective) return;
  client.effective = limits;
  NVSHARE_INFO("client %llu: limits now memory %llu bytes, core %u%%",
               static_cast<unsigned long long>(client.id),
               static_cast<unsigned long long>(limits.memory_bytes), limits.core_percent);
  if (!client.gang.empty()) refresh_gang(client.gang);
  feed(client.gpu, policy::LimitsChanged{client.id, limits}, now);
  // The policy forwards LimitsChanged as SendLimits; this covers it if it chose not to.
  if (auto it = clients_.find(client.id); it != clients_.end()) send_limits_if_needed(it->second);
}

void Scheduler::feed(const std::string& gpu, const policy::Event& event, MonoTime now) {
  auto it = gpus_.find(gpu);
  if (it == gpus_.end()) return;
  route(it->second->policy.handle(event, now));
  align_gangs(now);
}

std::string Scheduler::gang_of(const Client& client) {
  if (client.pod_uid) return "pod " + *client.pod_uid;
  if (client.identity.cgroup.empty()) return {};
  return "uid " + std::to_string(client.identity.uid) + " cgroup " + client.identity.cgroup;
}

void Scheduler::refresh_gang(const std::string& gang) {
  std::erase_if(coupled_gangs_, [&](const auto& entry) { return entry.first.first == gang; });
  auto it = gangs_.find(gang);
  if (it == gangs_.end()) return;
  // Capped members by cap: members with the same cap on several GPUs are coupled.
  std::map<unsigned, std::vector<ClientId>> by_cap;
  for (ClientId id : it->second) {
    const Client& c = clients_.at(id);
    if (c.effective.core_percent < 100) by_cap[c.effective.core_percent].push_back(id);
  }
  for (auto& [cap, ids] : by_cap) {
    const std::string& first_gpu = clients_.at(ids.front()).gpu;
    const bool several_gpus = std::any_of(
        ids.begin(), ids.end(), [&](ClientId id) { return clients_.at(id).gpu != first_gpu; });
    if (several_gpus && ids.size() <= kMaxGangMembers) {
      coupled_gangs_[{gang, cap}] = std::move(ids);
    }
  }
}

void Scheduler::align_gangs(MonoTime now) {
  if (aligning_ || coupled_gangs_.empty()) return;
  aligning_ = true;
  for (const auto& [key, ids] : coupled_gangs_) {
    std::vector<std::pair<std::string, ClientId>> members;
    members.reserve(ids.size());
    for (ClientId id : ids) members.emplace_back(clients_.at(id).gpu, id);
    policy::align_gang(
        members, now,
        [this](const std::string& gpu, ClientId id) {
          return gpus_.at(gpu)->policy.gang_state(id);
        },
        [this, now](const std::string& gpu, const policy::ResumeNotBefore& floor) {
          route(gpus_.at(gpu)->policy.handle(floor, now));
        });
  }
  aligning_ = false;
}

void Scheduler::route(const std::vector<policy::Action>& actions) {
  for (const policy::Action& action : actions) {
    std::visit(
        [this](const auto& a) {
          using T = std::decay_t<decltype(a)>;
          if constexpr (std::is_same_v<T, policy::SendGrant>) {
            channel_.send(a.client, protocol::Grant{a.epoch});
          } else if constexpr (std::is_same_v<T, policy::SendRevoke>) {
            channel_.send(a.client, protocol::Revoke{a.epoch, a.reason, a.swap_out, a.swap_bytes});
          } else if constexpr (std::is_same_v<T, policy::SendYield>) {
            // Only clients that understand it get a soft revoke; others keep their quantum.
            if (auto it = clients_.find(a.client);
                it != clients_.end() && (it->second.capabilities & protocol::capability::kYield)) {
              channel_.send(a.client,
                            protocol::Revoke{a.epoch, protocol::RevokeReason::kYield, false});
            }
          } else if constexpr (std::is_same_v<T, policy::SendSwapNotice>) {
            channel_.send(a.client, protocol::SwapNotice{a.epoch, a.bytes});
          } else if constexpr (std::is_same_v<T, policy::SendEvict>) {
            channel_.send(a.client, protocol::Evict{a.bytes});
          } else if constexpr (std::is_same_v<T, policy::SendRoom>) {
            channel_.send(a.client, protocol::Room{a.bytes});
          } else if constexpr (std::is_same_v<T, policy::SendContended>) {
            channel_.send(a.client, protocol::Contended{a.epoch});
          } else if constexpr (std::is_same_v<T, policy::SendWait>) {
            channel_.send(a.client, protocol::Wait{a.reason});
          } else if constexpr (std::is_same_v<T, policy::SendLimits>) {
            auto it = clients_.find(a.client);
            if (it == clients_.end()) return;
            protocol::SetLimits frame = limits_frame(it->second);
            frame.limits = a.limits;
            channel_.send(a.client, frame);
            it->second.last_sent = frame;
          } else if constexpr (std::is_same_v<T, policy::HolderUnresponsive>) {
            NVSHARE_WARN(
                "client %llu did not release grant %llu within the revoke grace period; "
                "it no longer blocks other clients",
                static_cast<unsigned long long>(a.client),
                static_cast<unsigned long long>(a.epoch));
          }
        },
        action);
  }
}

Status Scheduler::set_gpus(const std::vector<GpuInfo>& gpus, const std::string& source,
                           MonoTime now) {
  std::size_t added = 0;
  for (const GpuInfo& gpu : gpus) {
    if (gpu.uuid.empty() || gpu.uuid.size() > protocol::kMaxUuidLength) {
      return make_error("a GPU UUID must be 1.." + std::to_string(protocol::kMaxUuidLength) +
                        " bytes");
    }
    if (gpu.memory_bytes == 0) return make_error("GPU " + gpu.uuid + " has no memory");
    if (inventory_.count(gpu.uuid) == 0) ++added;
  }
  if (inventory_.size() + added > kMaxGpus) {
    return make_error("more than " + std::to_string(kMaxGpus) + " GPUs");
  }
  for (const GpuInfo& gpu : gpus) {
    KnownGpu& known = inventory_[gpu.uuid];
    if (known.memory_bytes == gpu.memory_bytes && known.source == source) continue;
    NVSHARE_INFO("GPU %s: %s of memory (%s)", gpu.uuid.c_str(),
                 format_bytes(gpu.memory_bytes).c_str(), source.c_str());
    known = KnownGpu{gpu.memory_bytes, source};
    state_dirty_ = true;
    if (auto it = gpus_.find(gpu.uuid); it != gpus_.end()) {
      route(it->second->policy.reconfigure(config_for(gpu.uuid), now));
    }
  }
  return Status::Ok();
}

std::optional<std::string> Scheduler::pod_of(ClientId client) const {
  const auto it = clients_.find(client);
  if (it == clients_.end()) return std::nullopt;
  return it->second.pod_uid;
}

Status Scheduler::register_client(ClientId id, const ClientIdentity& identity,
                                  const protocol::Hello& hello, MonoTime now) {
  if (hello.gpu_uuid.empty()) return make_error("hello names no GPU");
  if (!knows_gpu(hello.gpu_uuid)) {
    // Nothing is created for a GPU this node does not have: refusing costs the same for the
    // fiftieth thousand invented UUID as for the first.
    return make_error("GPU " + hello.gpu_uuid.substr(0, protocol::kMaxUuidLength) +
                      " is not one of this node's " + std::to_string(inventory_.size()) + " GPUs");
  }
  Client client;
  client.id = id;
  client.gpu = hello.gpu_uuid;
  client.identity = identity;
  client.pod_uid = identity.pod_uid;
  if (!client.pod_uid && config_.trust_client_limits && !hello.pod_uid.empty()) {
    client.pod_uid = canonical_pod_uid(hello.pod_uid);
    if (!client.pod_uid)
      NVSHARE_WARN("client %llu: declared pod UID is not a pod UID; ignored",
                   static_cast<unsigned long long>(id));
  }
  client.process_name = hello.process_name;
  client.capabilities = hello.capabilities;
  client.connected_at = now;
  if (config_.trust_client_limits) {
    if (hello.declared.memory_bytes != 0)
      client.declared.memory_bytes = hello.declared.memory_bytes;
    if (hello.declared.core_percent != 100)
      client.declared.core_percent = hello.declared.core_percent;
    client.last_sent = protocol::SetLimits{hello.declared};  // it enforces these already
  }
  // A process that had limits of its own before a restart (or on another session) gets them back.
  if (auto it = processes_.find(client.process());
      client.identity.start_time != 0 && it != processes_.end()) {
    client.own = it->second;
  }
  std::string source;
  client.effective = effective_limits(client, &source);
  NVSHARE_INFO("client %llu registered on %s: pid %d uid %u pod %s process \"%s\" limits %s",
               static_cast<unsigned long long>(id), client.gpu.c_str(),
               static_cast<int>(identity.pid), static_cast<unsigned>(identity.uid),
               client.pod_uid ? client.pod_uid->c_str() : "-", client.process_name.c_str(),
               source.c_str());
  Gpu& gpu = gpu_for(client.gpu, now);
  // A peer that speaks version 9 and can swap can be asked to move memory it keeps without a grant.
  const bool swaps = (hello.capabilities & protocol::capability::kSwap) != 0;
  const bool evictable =
      swaps && hello.max_version >= protocol::introduced_in(protocol::MessageType::kEvict);
  // Version 10 moves only the bytes a revoke or an eviction asks for.
  const bool partial_swap = swaps && hello.max_version >= protocol::kPartialSwapVersion;
  // Version 12 brings memory back into the room it is given while it waits.
  const bool takes_room = partial_swap && hello.max_version >= protocol::kRoomVersion;
  const policy::Registered event{id, client.effective, evictable, partial_swap, takes_room};
  client.gang = gang_of(client);
  const std::string gang = client.gang;
  clients_.emplace(id, std::move(client));
  route(gpu.policy.handle(event, now));
  if (!gang.empty()) {
    gangs_[gang].push_back(id);
    refresh_gang(gang);
    align_gangs(now);
  }
  if (auto it = clients_.find(id); it != clients_.end()) send_limits_if_needed(it->second);
  return Status::Ok();
}

void Scheduler::request(ClientId client, MonoTime now) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  feed(it->second.gpu, policy::Requested{client}, now);
}

void Scheduler::release(ClientId client, const protocol::Released& released, MonoTime now) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  const auto from_us = [](std::uint64_t us) -> Duration {
    return std::chrono::microseconds(
        static_cast<std::int64_t>(std::min<std::uint64_t>(us, INT64_MAX / 1000)));
  };
  const Duration drained = from_us(released.drain_us);
  if (auto gpu = gpus_.find(it->second.gpu);
      gpu != gpus_.end() && gpu->second->policy.revoking(client)) {
    gpu->second->drains.record(drained);
  }
  feed(it->second.gpu, policy::Released{client, released.epoch, from_us(released.held_us), drained},
       now);
}

void Scheduler::usage(ClientId client, const protocol::Usage& usage, MonoTime now) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  count_swap(it->second, usage);
  count_resumed(it->second, usage);
  declare_priority(it->second, usage.declared_priority, now);
  feed(it->second.gpu,
       policy::UsageReported{client, usage.allocated_bytes, usage.resident_bytes,
                             usage.swap_bytes_per_s, pace_of(usage), usage.pinned_bytes,
                             usage.evictions_answered},
       now);
}

// The class a process declares (NVSHARE_PRIORITY, with its usage): its own layer's, in local mode
// only, like its declared limits.
void Scheduler::declare_priority(Client& client, std::uint8_t code, MonoTime now) {
  if (!config_.trust_client_limits || !protocol::priority_of(code)) return;
  if (client.declared.priority == code) return;
  client.declared.priority = code;
  refresh_limits(client, now);
}

void Scheduler::disconnect(ClientId client, MonoTime now) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  const std::string gpu = it->second.gpu;
  NVSHARE_INFO("client %llu disconnected from %s", static_cast<unsigned long long>(client),
               gpu.c_str());
  // A process that has exited takes its own limits with it; a live one keeps them for its next
  // session.
  if (!it->second.own.empty() &&
      !process_alive_(it->second.identity.pid, it->second.identity.start_time) &&
      processes_.erase(it->second.process()) != 0) {
    state_dirty_ = true;
  }
  const std::string gang = it->second.gang;
  // The record goes first: frames the policy addresses to the departed client are dropped.
  clients_.erase(it);
  if (auto g = gangs_.find(gang); g != gangs_.end()) {
    std::erase(g->second, client);
    if (g->second.empty()) gangs_.erase(g);
    refresh_gang(gang);
  }
  feed(gpu, policy::Disconnected{client}, now);
}

std::optional<MonoTime> Scheduler::next_deadline() const {
  std::optional<MonoTime> earliest;
  for (const auto& [uuid, gpu] : gpus_) {
    const auto deadline = gpu->policy.next_deadline();
    if (deadline && (!earliest || *deadline < *earliest)) earliest = deadline;
  }
  return earliest;
}

void Scheduler::run_due(MonoTime now) {
  for (auto& [uuid, gpu] : gpus_) {
    const auto deadline = gpu->policy.next_deadline();
    if (deadline && *deadline <= now) route(gpu->policy.handle(policy::DeadlineReached{}, now));
  }
  align_gangs(now);
}

Result<SetLimitsOutcome> Scheduler::set_limits(const Selector& selector, const LimitsChange& change,
                                               MonoTime now) {
  const int kinds = (selector.client ? 1 : 0) + (selector.pid ? 1 : 0) +
                    ((selector.pod_uid || selector.pod_namespace || selector.pod_name) ? 1 : 0);
  if (kinds != 1) {
    return make_error(
        "the selector must name exactly one of client, pid, pod_uid or namespace/name");
  }
  if (selector.pod_namespace.has_value() != selector.pod_name.has_value()) {
    return make_error("namespace and name go together");
  }
  if (change.core.op == FieldChange::Op::kSet &&
      (change.core.value < 1 || change.core.value > 100)) {
    return make_error("core " + std::to_string(change.core.value) + " is outside 1..100");
  }
  if (change.memory_mode.op == FieldChange::Op::kSet &&
      (change.memory_mode.value > 255 ||
       !protocol::memory_mode_of(static_cast<std::uint8_t>(change.memory_mode.value)))) {
    return make_error("memory mode code " + std::to_string(change.memory_mode.value) +
                      " is not one of " + std::string(kMemoryModeWords));
  }
  if (change.priority.op == FieldChange::Op::kSet &&
      (change.priority.value > 255 ||
       !protocol::priority_of(static_cast<std::uint8_t>(change.priority.value)))) {
    return make_error("priority code " + std::to_string(change.priority.value) + " is not one of " +
                      std::string(kPriorityWords));
  }

  SetLimitsOutcome outcome;
  std::vector<ClientId> affected;
  if (selector.client || selector.pid) {
    for (auto& [id, client] : clients_) {
      if ((selector.client && id == *selector.client) ||
          (selector.pid && client.identity.pid == *selector.pid)) {
        affected.push_back(id);
      }
    }
    if (affected.empty()) {
      return make_error(selector.client ? "no client with id " + std::to_string(*selector.client)
                                        : "no client with pid " + std::to_string(*selector.pid));
    }
    for (ClientId id : affected) {
      Client& client = clients_.at(id);
      apply_change(change.memory, client.own.memory_bytes);
      apply_change(change.core, client.own.core_percent);
      apply_change(change.memory_mode, client.own.memory_mode);
      apply_change(change.priority, client.own.priority);
      remember_process(client);
    }
  } else {
    std::vector<std::string> uids;
    if (selector.pod_uid) {
      if (selector.pod_uid->empty()) return make_error("pod_uid is empty");
      if (pods_.count(*selector.pod_uid) == 0 && pods_.size() >= kMaxPods) {
        return make_error("too many remembered pods (" + std::to_string(kMaxPods) +
                          "); forget-pod the ones that are gone");
      }
      PodRecord& pod = pods_[*selector.pod_uid];
      state_dirty_ = true;
      if (selector.pod_namespace) {
        pod.pod_namespace = selector.pod_namespace;
        pod.pod_name = selector.pod_name;
      }
      uids.push_back(*selector.pod_uid);
    } else {
      for (const auto& [uid, pod] : pods_) {
        if (pod.pod_namespace == selector.pod_namespace && pod.pod_name == selector.pod_name) {
          uids.push_back(uid);
        }
      }
      if (uids.empty()) {
        return make_error("no known pod " + *selector.pod_namespace + "/" + *selector.pod_name +
                          " (the scheduler learns pod names from set-limits with pod_uid and "
                          "namespace/name)");
      }
    }
    for (const std::string& uid : uids) {
      PodRecord& pod = pods_.at(uid);
      apply_change(change.memory, pod.limits.memory_bytes);
      apply_change(change.core, pod.limits.core_percent);
      apply_change(change.memory_mode, pod.limits.memory_mode);
      apply_change(change.priority, pod.limits.priority);
      state_dirty_ = true;
      outcome.remembered_pods.push_back(uid);
      for (auto& [id, client] : clients_) {
        if (client.pod_uid == uid) affected.push_back(id);
      }
    }
  }
  std::sort(affected.begin(), affected.end());
  for (ClientId id : affected) {
    if (auto it = clients_.find(id); it != clients_.end()) {
      refresh_limits(it->second, now);
      // The limits may be the same but have become authoritative (a first pod record).
      if (auto again = clients_.find(id); again != clients_.end()) {
        send_limits_if_needed(again->second);
      }
    }
  }
  outcome.clients = std::move(affected);
  return outcome;
}

void Scheduler::mark_synced(MonoTime) {
  if (synced_) return;
  synced_ = true;
  NVSHARE_INFO("limits are in sync with the control plane");
  for (auto& [id, client] : clients_) send_limits_if_needed(client);
}

SchedulerState Scheduler::persistent_state() {
  // Records of processes that have exited go; a live process keeps its record even between
  // sessions (its link may be reconnecting).
  for (auto it = processes_.begin(); it != processes_.end();) {
    if (!process_alive_(it->first.pid, it->first.start_time)) {
      it = processes_.erase(it);
    } else {
      ++it;
    }
  }
  SchedulerState state;
  for (const auto& [uuid, known] : inventory_) {
    state.gpus.push_back(
        GpuInfo{uuid, static_cast<unsigned>(state.gpus.size()), known.memory_bytes});
  }
  state.pods = pods_;
  state.processes = processes_;
  return state;
}

void Scheduler::restore(const SchedulerState& state, bool with_gpus, MonoTime now) {
  if (with_gpus && !state.gpus.empty()) {
    if (Status s = set_gpus(state.gpus, "state", now); !s) {
      NVSHARE_WARN("state: GPUs not restored: %s", s.error().message.c_str());
    }
  }
  for (const auto& [uid, pod] : state.pods) {
    if (pods_.size() >= kMaxPods) break;
    if (auto canonical = canonical_pod_uid(uid)) pods_[*canonical] = pod;
  }
  for (const auto& [key, limits] : state.processes) {
    if (processes_.size() >= kMaxStateRecords) break;
    if (process_alive_(key.pid, key.start_time)) processes_[key] = limits;
  }
  synced_ = true;
  NVSHARE_INFO("state restored: %zu pods, %zu processes with limits, %zu GPUs", pods_.size(),
               processes_.size(), state.gpus.size());
}

Status Scheduler::forget_pod(const std::string& pod_uid, MonoTime now) {
  if (pods_.erase(pod_uid) == 0) return make_error("no remembered pod " + pod_uid);
  state_dirty_ = true;
  std::vector<ClientId> affected;
  for (auto& [id, client] : clients_) {
    if (client.pod_uid == pod_uid) affected.push_back(id);
  }
  for (ClientId id : affected) {
    if (auto it = clients_.find(id); it != clients_.end()) refresh_limits(it->second, now);
  }
  return Status::Ok();
}

Result<std::vector<std::string>> Scheduler::set_policy(
    const std::optional<std::string>& gpu,
    const std::vector<std::pair<const Knob*, std::string>>& values, MonoTime now) {
  for (const auto& [knob, text] : values) {
    if (knob == nullptr || knob->scope != KnobScope::kPolicy) {
      return make_error("not a policy knob: " +
                        (knob ? std::string(knob->name) : std::string("?")));
    }
  }
  // Applies the values to one GPU's settings, reading capacity as that GPU's own.
  const auto apply_to_gpu = [&](const std::string& uuid,
                                policy::PolicyConfig base) -> Result<policy::PolicyConfig> {
    DaemonConfig scratch = config_;
    scratch.policy = base;
    scratch.capacity = CapacitySpec{base.capacity_bytes, {}};
    for (const auto& [knob, text] : values) {
      if (Status s = apply_knob(*knob, text, scratch); !s) return s.error();
    }
    scratch.policy.capacity_bytes = scratch.capacity.for_gpu(uuid);
    if (Status s = policy::validate(scratch.policy); !s)
      return make_error(uuid + ": " + s.error().message);
    return scratch.policy;
  };

  std::vector<std::string> changed;
  if (gpu) {
    auto updated = apply_to_gpu(*gpu, config_for(*gpu));
    if (!updated) return updated.error();
    gpu_overrides_[*gpu] = updated.value();
    if (auto it = gpus_.find(*gpu); it != gpus_.end()) {
      route(it->second->policy.reconfigure(updated.value(), now));
      changed.push_back(*gpu);
    }
    return changed;
  }

  DaemonConfig next = config_;
  for (const auto& [knob, text] : values) {
    if (Status s = apply_knob(*knob, text, next); !s) return s.error();
  }
  if (Status s = policy::validate(next.policy); !s) return s.error();
  std::map<std::string, policy::PolicyConfig> overrides;
  for (const auto& [uuid, config] : gpu_overrides_) {
    auto updated = apply_to_gpu(uuid, config);
    if (!updated) return updated.error();
    overrides.emplace(uuid, updated.value());
  }
  config_ = std::move(next);
  gpu_overrides_ = std::move(overrides);
  for (auto& [uuid, entry] : gpus_) {
    route(entry->policy.reconfigure(config_for(uuid), now));
    changed.push_back(uuid);
  }
  return changed;
}

Result<Explanation> Scheduler::explain(ClientId client, MonoTime now) const {
  auto it = clients_.find(client);
  if (it == clients_.end()) return make_error("no client with id " + std::to_string(client));
  const auto gpu = gpus_.find(it->second.gpu);
  if (gpu == gpus_.end()) return make_error("client " + std::to_string(client) + " has no GPU");
  Explanation explanation;
  explanation.client = client;
  explanation.gpu = it->second.gpu;
  const policy::GpuView view = gpu->second->policy.view(now);
  for (const policy::ClientView& c : view.clients) {
    if (c.client == client) {
      explanation.state = c.state;
      explanation.waiting_for = c.waiting_for;
    }
  }
  explanation.text = gpu->second->policy.explain(client, now);
  return explanation;
}

// What moved between device and host since the last report: the change in resident bytes that a
// change in allocated bytes does not explain (an allocation made or freed moves nothing).
void Scheduler::count_swap(Client& client, const protocol::Usage& usage) {
  const auto delta = [](std::uint64_t to, std::uint64_t from) {
    return static_cast<std::int64_t>(to) - static_cast<std::int64_t>(from);
  };
  const std::int64_t moved = delta(usage.resident_bytes, client.resident_bytes) -
                             delta(usage.allocated_bytes, client.allocated_bytes);
  if (moved < 0) client.swapped_out_bytes += static_cast<std::uint64_t>(-moved);
  if (moved > 0) client.swapped_in_bytes += static_cast<std::uint64_t>(moved);
  client.allocated_bytes = usage.allocated_bytes;
  client.resident_bytes = usage.resident_bytes;
  // A counter: it only grows within a session (what a client says can only mislead this figure).
  client.refused_allocations =
      std::max<std::uint64_t>(client.refused_allocations, usage.refused_allocations);
}

void Scheduler::count_resumed(Client& client, const protocol::Usage& usage) {
  if (usage.sessions_lost > 0 && client.sessions_lost == 0) ++resumed_sessions_;
  client.sessions_lost = std::max(client.sessions_lost, usage.sessions_lost);
}

std::vector<std::string> Scheduler::gpu_uuids() const {
  std::vector<std::string> out;
  out.reserve(inventory_.size());
  for (const auto& [uuid, known] : inventory_) out.push_back(uuid);
  return out;
}

StatusSnapshot Scheduler::snapshot(MonoTime now) const {
  StatusSnapshot snapshot;
  snapshot.taken = now;
  snapshot.resumed_sessions = resumed_sessions_;
  for (const auto& [uuid, gpu] : gpus_) {
    GpuStatus status;
    status.uuid = uuid;
    if (auto known = inventory_.find(uuid); known != inventory_.end()) {
      status.memory_bytes = known->second.memory_bytes;
      status.memory_source = known->second.source;
    }
    status.config = gpu->policy.config();
    status.view = gpu->policy.view(now);
    status.drains = gpu->drains;
    for (const policy::ClientView& view : status.view.clients) {
      auto it = clients_.find(view.client);
      if (it == clients_.end()) continue;
      const Client& client = it->second;
      ClientStatus c;
      c.id = client.id;
      c.pid = client.identity.pid;
      c.uid = client.identity.uid;
      c.pod_uid = client.pod_uid;
      if (client.pod_uid) {
        if (auto pod = pods_.find(*client.pod_uid); pod != pods_.end()) {
          c.pod_namespace = pod->second.pod_namespace;
          c.pod_name = pod->second.pod_name;
        }
      }
      c.container_id = client.identity.container_id;
      c.process_name = client.process_name;
      c.capabilities = client.capabilities;
      c.limits = effective_limits(client, &c.limits_source);
      c.connected_for = now - client.connected_at;
      c.swapped_out_bytes = client.swapped_out_bytes;
      c.swapped_in_bytes = client.swapped_in_bytes;
      c.refused_allocations = client.refused_allocations;
      c.sessions_lost = client.sessions_lost;
      c.view = view;
      status.clients.push_back(std::move(c));
    }
    snapshot.gpus.push_back(std::move(status));
  }
  std::map<std::string, std::size_t> per_pod;
  for (const auto& [id, client] : clients_) {
    if (client.pod_uid) ++per_pod[*client.pod_uid];
  }
  for (const auto& [uid, pod] : pods_) {
    PodStatus status;
    status.pod_uid = uid;
    status.pod_namespace = pod.pod_namespace;
    status.pod_name = pod.pod_name;
    status.limits = pod.limits;
    if (auto n = per_pod.find(uid); n != per_pod.end()) status.clients = n->second;
    snapshot.pods.push_back(std::move(status));
  }
  return snapshot;
}

Json to_json(const StatusSnapshot& snapshot) {
  Json gpus = Json::array();
  for (const GpuStatus& gpu : snapshot.gpus) {
    Json g = Json::object();
    g.set("uuid", gpu.uuid);
    g.set("mode", std::string(policy::to_string(gpu.config.mode)));
    g.set("memory_bytes", gpu.memory_bytes);
    g.set("memory_source", gpu.memory_source);
    g.set("capacity_bytes", gpu.view.capacity_bytes);
    g.set("capacity_virtual", gpu.config.capacity_bytes.has_value());
    g.set("usable_bytes", gpu.view.usable_bytes);
    g.set("running_bytes", gpu.view.running_bytes);
    g.set("reserve_percent", tenths(gpu.config.reserve_fraction * 100));
    g.set("quantum_ms", tenths(to_ms_value(gpu.view.quantum)));
    g.set("quantum_fixed", gpu.config.fixed_quantum.has_value());
    g.set("quota_window_ms", tenths(to_ms_value(gpu.config.quota_window)));
    g.set("last_epoch", gpu.view.last_epoch);
    g.set("unresponsive_holders", gpu.view.unresponsive_holders);
    g.set("swap_bytes_per_s", gpu.view.swap_bytes_per_s);
    g.set("swap_measured", gpu.view.swap_measured);
    Json queue = Json::array();
    for (ClientId id : gpu.view.queue) queue.push_back(id);
    g.set("queue", std::move(queue));
    Json clients = Json::array();
    for (const ClientStatus& c : gpu.clients) {
      Json j = Json::object();
      j.set("id", c.id);
      j.set("pid", static_cast<long long>(c.pid));
      j.set("uid", static_cast<long long>(c.uid));
      j.set("pod_uid", optional_string(c.pod_uid));
      j.set("namespace", optional_string(c.pod_namespace));
      j.set("pod", optional_string(c.pod_name));
      j.set("container_id", optional_string(c.container_id));
      j.set("process", c.process_name);
      j.set("state", std::string(policy::to_string(c.view.state)));
      j.set("swapping_out", c.view.swapping_out);
      j.set("waiting_for", c.view.waiting_for
                               ? Json(std::string(protocol::to_string(*c.view.waiting_for)))
                               : Json());
      j.set("epoch", c.view.epoch);
      j.set("allocated_bytes", c.view.allocated_bytes);
      j.set("pinned_bytes", c.view.pinned_bytes);
      j.set("parked_bytes", c.view.parked_bytes);
      j.set("resident_bytes", c.view.resident_bytes);
      j.set("memory_limit_bytes",
            c.limits.memory_bytes != 0 ? Json(c.limits.memory_bytes) : Json());
      j.set("core_limit_percent", static_cast<int>(c.limits.core_percent));
      j.set("memory_mode", memory_mode_json(c.limits.memory_mode));
      j.set("priority", std::string(to_string(protocol::effective_priority(c.limits.priority))));
      j.set("limits_source", c.limits_source);
      j.set("effective_cap_percent", tenths(c.view.effective_cap_percent));
      j.set("share_percent", tenths(c.view.share_percent));
      j.set("held_ms", tenths(to_ms_value(c.view.held_total)));
      j.set("waited_ms", tenths(to_ms_value(c.view.waited_total)));
      Json waited = Json::object();
      for (const protocol::WaitReason r : policy::kWaitReasons) {
        waited.set(std::string(protocol::to_string(r)),
                   tenths(to_ms_value(c.view.counters.waited_for(r))));
      }
      j.set("waited_by_reason_ms", std::move(waited));
      j.set("grants", c.view.counters.grants);
      Json revokes = Json::object();
      for (const protocol::RevokeReason r : policy::kRevokeReasons) {
        revokes.set(std::string(protocol::to_string(r)), c.view.counters.revokes_for(r));
      }
      j.set("revokes", std::move(revokes));
      j.set("swapped_out_bytes", c.swapped_out_bytes);
      j.set("swapped_in_bytes", c.swapped_in_bytes);
      j.set("refused_allocations", c.refused_allocations);
      j.set("sessions_lost", c.sessions_lost);
      j.set("state_for_ms", tenths(to_ms_value(snapshot.taken - c.view.state_since)));
      j.set("connected_ms", tenths(to_ms_value(c.connected_for)));
      // Present only when they apply: a capped client's bucket, a runner's turn end, a revoked
      // holder's grace deadline (all relative to the snapshot).
      j.set("budget_left_ms",
            c.view.budget_left ? Json(tenths(to_ms_value(*c.view.budget_left))) : Json());
      j.set("turn_ends_in_ms", c.view.turn_ends
                                   ? Json(tenths(to_ms_value(*c.view.turn_ends - snapshot.taken)))
                                   : Json());
      j.set("unresponsive_in_ms",
            c.view.unresponsive_at
                ? Json(tenths(to_ms_value(*c.view.unresponsive_at - snapshot.taken)))
                : Json());
      j.set("deep_queue_percent",
            c.view.deep_queue_permille ? Json(tenths(*c.view.deep_queue_permille / 10.0)) : Json());
      j.set("saturating", c.view.saturating);
      j.set("capabilities", c.capabilities);
      clients.push_back(std::move(j));
    }
    g.set("clients", std::move(clients));
    gpus.push_back(std::move(g));
  }
  Json pods = Json::array();
  for (const PodStatus& pod : snapshot.pods) {
    Json p = layer_json(pod.limits);
    p.set("pod_uid", pod.pod_uid);
    p.set("namespace", optional_string(pod.pod_namespace));
    p.set("name", optional_string(pod.pod_name));
    p.set("clients", pod.clients);
    pods.push_back(std::move(p));
  }
  Json out = Json::object();
  out.set("gpus", std::move(gpus));
  out.set("pods", std::move(pods));
  out.set("resumed_sessions", snapshot.resumed_sessions);
  return out;
}

}  // namespace nvshare::scheduler
