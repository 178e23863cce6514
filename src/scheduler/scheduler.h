// Scheduler: the daemon's state, without its sockets. One GpuPolicy per GPU UUID (created when the
// first client registers on it), the registry of clients and what is known about them, the limits
// set through the control API, and the routing of policy actions to frames.
//
// The reactor turns socket input into calls here and the calls' output reaches clients through
// ClientChannel, so everything in this unit can be driven by tests with a fake channel and a manual
// clock. It is single-threaded by design (the reactor's thread owns it).
//
// Limits are layered per field (memory, core), the higher layer winning where it is set:
//   client  set-limits by client id or pid; lives as long as the session
//   pod     set-limits by pod UID (or namespace/name of a pod whose UID is known); remembered, so a
//           process that registers later from that pod gets them (the device plugin pushes limits
//           before the pod's processes start)
//   declared  the client's own hello.declared, only with --trust-client-limits
// A layer's field may be "none" (memory 0, core 100), which is a value: it overrides lower layers.
// Whenever a client's effective limits change, it receives a limits frame (the policy forwards
// LimitsChanged; the scheduler sends the frame itself if the policy did not).
//
// Restarts: pod limits and the limits set for live processes (by pid, start time and GPU) are
// persistent state (state_file.h): the daemon restores them before it accepts clients, so a
// re-registering client gets the limits it had. A client's limits are authoritative when the
// scheduler restored its state or the control plane said it pushed everything (sync), when its
// pod has a record, when it has limits of its own, or when clients are trusted; otherwise the
// frame is marked provisional and the client keeps the stricter of it and what it had.
//
// Identity: pid and uid come from SO_PEERCRED and the pod UID from the pid's cgroup; hello.pod_uid
// is used only when trusted and no cgroup names a pod.
//
// Gangs: the processes of one pod (off Kubernetes: of one uid and cgroup) with the same cap on
// several GPUs pause for their caps together (policy/gang.h): after every event the scheduler gives
// each member the resume floor (ResumeNotBefore) that the other GPUs' members imply.
//
// GPUs: the node's GPUs and their memory come from the device (NVML, the `gpus` knob, the device
// plugin's inventory through set-gpus, or the state a previous run left). A hello naming another
// GPU is refused and leaves nothing behind; what a client says about a GPU's memory is ignored.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/gpu_inventory.h"
#include "common/json.h"
#include "common/protocol.h"
#include "common/result.h"
#include "control/requests.h"
#include "scheduler/bucket_histogram.h"
#include "scheduler/knobs.h"
#include "scheduler/limits_layer.h"
#include "scheduler/peer_identity.h"
#include "scheduler/policy/gpu_policy.h"
#include "scheduler/state_file.h"

namespace nvshare::scheduler {

using policy::ClientId;

// Where frames for clients go. send() must not block and must tolerate unknown clients.
class ClientChannel {
 public:
  virtual ~ClientChannel() = default;
  virtual void send(ClientId client, const protocol::Message& message) = 0;
};

// A limits change and its selector are the control protocol's types (src/control/requests.h).
using control::FieldChange;
using control::LimitsChange;
using control::Selector;

struct SetLimitsOutcome {
  std::vector<ClientId> clients;             // live clients whose limits were recomputed
  std::vector<std::string> remembered_pods;  // pod UIDs whose record was updated
};

struct ClientStatus {
  ClientId id = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  std::optional<std::string> pod_uid;
  std::optional<std::string> pod_namespace;
  std::optional<std::string> pod_name;
  std::optional<std::string> container_id;
  std::string process_name;
  std::uint64_t capabilities = 0;
  protocol::Limits limits;    // effective
  std::string limits_source;  // which layers contributed: "client", "pod", "declared", "none"
  Duration connected_for{0};
  // Bytes that left the device (resident fell more than allocated) and came back, from its usage
  // reports.
  std::uint64_t swapped_out_bytes = 0;
  std::uint64_t swapped_in_bytes = 0;
  std::uint64_t refused_allocations = 0;  // allocations its memory limit refused, as it reports
  std::uint32_t sessions_lost = 0;        // sessions its link lost before this one, as it reports
  policy::ClientView view;
};

struct GpuStatus {
  std::string uuid;
  std::uint64_t memory_bytes = 0;  // physical, from the device
  std::string memory_source;       // where that figure came from
  policy::PolicyConfig config;
  policy::GpuView view;
  BucketHistogram drains;  // revokes' drains, as the clients measured them
  std::vector<ClientStatus> clients;
};

struct PodStatus {
  std::string pod_uid;
  std::optional<std::string> pod_namespace;
  std::optional<std::string> pod_name;
  LimitsLayer limits;
  std::size_t clients = 0;
};

// An immutable picture of the scheduler, for status, nvsharectl and (later) metrics.
struct StatusSnapshot {
  MonoTime taken{};
  // Sessions whose client reported losing an earlier one (the scheduler restarted, or dropped it):
  // after a restart, one per client that came back.
  std::uint64_t resumed_sessions = 0;
  std::vector<GpuStatus> gpus;
  std::vector<PodStatus> pods;
};

Json to_json(const StatusSnapshot& snapshot);

struct Explanation {
  ClientId client = 0;
  std::string gpu;
  policy::ClientState state = policy::ClientState::kIdle;
  std::optional<protocol::WaitReason> waiting_for;
  std::string text;
};

class Scheduler {
 public:
  // At most this many pods are remembered; set-limits for a new pod beyond it fails.
  static constexpr std::size_t kMaxPods = 100'000;
  // At most this many GPUs are known (a node has a handful; MIG instances a few dozen).
  static constexpr std::size_t kMaxGpus = 1024;

  Scheduler(DaemonConfig config, ClientChannel& channel);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // ---- sessions: the reactor calls these for each decoded frame ---------------------------------

  // The id for a session about to register (ids are never reused).
  ClientId next_client_id() { return next_id_++; }
  // Registers a client whose welcome has been queued: resolves its pod and limits, creates the
  // GPU's policy when it is the first client there, and feeds Registered. Fails (the session is to
  // be closed) when the hello names no GPU.
  Status register_client(ClientId id, const ClientIdentity& identity, const protocol::Hello& hello,
                         MonoTime now);
  void request(ClientId client, MonoTime now);
  void release(ClientId client, const protocol::Released& released, MonoTime now);
  void usage(ClientId client, const protocol::Usage& usage, MonoTime now);
  void disconnect(ClientId client, MonoTime now);

  // ---- the node's GPUs --------------------------------------------------------------------------

  // Adds or updates GPUs (UUID, physical memory) learned from `source` ("nvml", "gpus knob",
  // "device plugin", "state"). A GPU whose policy exists takes the new memory at once. Fails,
  // changing nothing, on an empty UUID, zero memory, or more than kMaxGpus GPUs in all.
  Status set_gpus(const std::vector<GpuInfo>& gpus, const std::string& source, MonoTime now);
  bool knows_gpu(const std::string& uuid) const { return inventory_.count(uuid) != 0; }
  std::size_t gpu_count() const { return inventory_.size(); }
  std::vector<std::string> gpu_uuids() const;

  // ---- time -------------------------------------------------------------------------------------

  // The earliest deadline over all GPUs.
  std::optional<MonoTime> next_deadline() const;
  // Feeds DeadlineReached to every GPU whose deadline is at or before `now`.
  void run_due(MonoTime now);

  // ---- control API ------------------------------------------------------------------------------

  Result<SetLimitsOutcome> set_limits(const Selector& selector, const LimitsChange& change,
                                      MonoTime now);
  // The control plane has pushed every limit it holds: limits are authoritative from now on
  // (clients sent provisional ones get them again, without the flag).
  void mark_synced(MonoTime now);
  bool synced() const { return synced_; }
  // Forgets a remembered pod; its live clients fall back to their other layers.
  Status forget_pod(const std::string& pod_uid, MonoTime now);
  // Applies policy knobs (name, text) to one GPU, or to every GPU and the defaults for GPUs to
  // come. All values are checked before anything changes. Returns the GPUs whose policy was
  // reconfigured.
  Result<std::vector<std::string>> set_policy(
      const std::optional<std::string>& gpu,
      const std::vector<std::pair<const Knob*, std::string>>& values, MonoTime now);
  Result<Explanation> explain(ClientId client, MonoTime now) const;
  StatusSnapshot snapshot(MonoTime now) const;

  // ---- state kept across restarts ---------------------------------------------------------------

  // Pods, live processes' own limits and GPUs. Process records whose process has exited (the probe
  // says so) are dropped first.
  SchedulerState persistent_state();
  // Before any client registers: what a previous run left (GPUs only when `with_gpus`). Limits
  // are authoritative from then on.
  void restore(const SchedulerState& state, bool with_gpus, MonoTime now);
  // Whether the persistent state changed since the last call.
  bool take_state_dirty() { return std::exchange(state_dirty_, false); }
  // How process records are checked for life (tests replace it; default: /proc).
  using ProcessProbe = std::function<bool(pid_t pid, std::uint64_t start_time)>;
  void set_process_probe(ProcessProbe probe) { process_alive_ = std::move(probe); }

  const DaemonConfig& config() const { return config_; }
  std::size_t client_count() const { return clients_.size(); }
  bool has_client(ClientId client) const { return clients_.count(client) != 0; }
  // The pod a client counts in: its cgroup's, or the one it declared where the scheduler trusts
  // client limits. None: no pod, or no such client.
  std::optional<std::string> pod_of(ClientId client) const;

 private:
  struct Client {
    ClientId id = 0;
    std::string gpu;
    ClientIdentity identity;
    std::optional<std::string> pod_uid;  // effective (cgroup, or trusted hello)
    std::string gang;                    // its job: the pod, or the uid and cgroup; empty: none
    std::string process_name;
    std::uint64_t capabilities = 0;
    LimitsLayer declared;  // only filled when client limits are trusted
    LimitsLayer own;       // set-limits by client id or pid
    protocol::Limits effective;
    std::optional<protocol::SetLimits> last_sent;  // the last limits frame queued for it
    MonoTime connected_at{};
    std::uint64_t allocated_bytes = 0;  // as last reported
    std::uint64_t resident_bytes = 0;
    std::uint64_t swapped_out_bytes = 0;
    std::uint64_t swapped_in_bytes = 0;
    std::uint64_t refused_allocations = 0;  // as last reported (it counts since it connected)
    std::uint32_t sessions_lost = 0;        // as last reported
    ProcessKey process() const { return ProcessKey{identity.pid, identity.start_time, gpu}; }
  };

  struct Gpu {
    explicit Gpu(policy::PolicyConfig config) : policy(config) {}
    policy::GpuPolicy policy;
    BucketHistogram drains;
  };

  struct KnownGpu {
    std::uint64_t memory_bytes = 0;
    std::string source;
  };

  policy::PolicyConfig config_for(const std::string& uuid) const;
  Gpu& gpu_for(const std::string& uuid, MonoTime now);
  protocol::Limits effective_limits(const Client& client, std::string* source = nullptr) const;
  // Recomputes a client's effective limits and tells the policy (and so the client) when they
  // change.
  void refresh_limits(Client& client, MonoTime now);
  void declare_priority(Client& client, std::uint8_t code, MonoTime now);
  // Feeds one GPU's policy an event, routes its actions and re-aligns the gangs.
  void feed(const std::string& gpu, const policy::Event& event, MonoTime now);
  // Gives every capped member of a gang on several GPUs the resume floor its gang implies (only
  // changes are fed).
  void align_gangs(MonoTime now);
  static std::string gang_of(const Client& client);
  void route(const std::vector<policy::Action>& actions);
  void send_limits_if_needed(Client& client);
  static void count_swap(Client& client, const protocol::Usage& usage);
  // A session whose client reports losing an earlier one counts once as resumed.
  void count_resumed(Client& client, const protocol::Usage& usage);
  // The limits frame for a client: its effective limits, provisional unless authoritative.
  protocol::SetLimits limits_frame(const Client& client) const;
  bool authoritative(const Client& client) const;
  // Records (or drops, when empty) a process's own limits in the persistent state.
  void remember_process(const Client& client);

  DaemonConfig config_;
  ClientChannel& channel_;
  ClientId next_id_ = 1;
  std::unordered_map<ClientId, Client> clients_;
  std::map<std::string, KnownGpu> inventory_;
  std::map<std::string, std::unique_ptr<Gpu>> gpus_;
  // Per-GPU policy settings made through set-policy with a GPU named; other GPUs follow config_.
  std::map<std::string, policy::PolicyConfig> gpu_overrides_;
  std::map<std::string, PodRecord> pods_;
  std::map<ProcessKey, LimitsLayer> processes_;
  std::uint64_t resumed_sessions_ = 0;
  // Recomputes whether a gang's capped members are on several GPUs (after it gains or loses a
  // member, or a member's cap changes).
  void refresh_gang(const std::string& gang);

  // Clients by gang, and the gangs whose capped members are on several GPUs (at most
  // kMaxGangMembers of them: a job has a process or a few per GPU, a node a handful of GPUs).
  static constexpr std::size_t kMaxGangMembers = 64;
  std::map<std::string, std::vector<ClientId>> gangs_;
  std::map<std::pair<std::string, unsigned>, std::vector<ClientId>> coupled_gangs_;  // by gang, cap
  bool aligning_ = false;  // align_gangs() is feeding (its own feeds do not re-align)
  bool synced_ = false;
  bool state_dirty_ = false;
  ProcessProbe process_alive_;
};

}  // namespace nvshare::scheduler
