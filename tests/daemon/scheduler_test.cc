// The Scheduler in process, with the real policy engine, a recording channel and a manual clock:
// how sessions, limits layers and control commands turn into events and frames.
#include "scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <map>

namespace nvshare::scheduler {
namespace {

using namespace std::chrono_literals;
using protocol::Limits;

constexpr std::uint64_t Mi = 1ull << 20;
constexpr std::uint64_t Gi = 1ull << 30;
const std::string kGpu = "GPU-aaaa";
const std::string kPod = "7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d";

class RecordingChannel : public ClientChannel {
 public:
  void send(ClientId client, const protocol::Message& message) override {
    sent.emplace_back(client, message);
  }
  // Frames of type T sent to `client` since the last take.
  template <typename T>
  std::vector<T> take(ClientId client) {
    std::vector<T> out;
    for (auto it = sent.begin(); it != sent.end();) {
      if (it->first == client && std::holds_alternative<T>(it->second)) {
        out.push_back(std::get<T>(it->second));
        it = sent.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }
  std::vector<std::pair<ClientId, protocol::Message>> sent;
};

class SchedulerTest : public ::testing::Test {
 protected:
  void make(std::vector<std::string> flags = {}) {
    std::vector<const char*> argv = {"nvshare-scheduler"};
    for (const std::string& f : flags) argv.push_back(f.c_str());
    auto cl = parse_command_line(static_cast<int>(argv.size()), argv.data(),
                                 [](const char*) -> const char* { return nullptr; });
    ASSERT_TRUE(cl.ok()) << cl.error().message;
    scheduler_ = std::make_unique<Scheduler>(cl.value().config, channel_);
    // The node's GPUs, as NVML or the device plugin would give them.
    std::vector<GpuInfo> gpus;
    for (const char* uuid : {"GPU-aaaa", "GPU-1", "GPU-2", "GPU-later"}) {
      gpus.push_back(GpuInfo{uuid, static_cast<unsigned>(gpus.size()), 80 * Gi});
    }
    ASSERT_TRUE(scheduler_->set_gpus(gpus, "test", now_).ok());
  }

  ClientId add(const std::string& gpu = kGpu, std::optional<std::string> cgroup_pod = std::nullopt,
               protocol::Hello hello = {}, pid_t pid = 1000, std::uint64_t start_time = 0) {
    const ClientId id = scheduler_->next_client_id();
    ClientIdentity identity;
    identity.pid = pid;
    identity.uid = 0;
    identity.start_time = start_time;
    identity.pod_uid = std::move(cgroup_pod);
    hello.gpu_uuid = gpu;
    if (hello.gpu_memory_bytes == 0) hello.gpu_memory_bytes = 80 * Gi;
    EXPECT_TRUE(scheduler_->register_client(id, identity, hello, now_).ok());
    return id;
  }

  Limits last_limits(ClientId client) { return last_frame(client).limits; }
  protocol::SetLimits last_frame(ClientId client) {
    auto frames = channel_.take<protocol::SetLimits>(client);
    EXPECT_FALSE(frames.empty()) << "no limits frame for client " << client;
    return frames.empty() ? protocol::SetLimits{} : frames.back();
  }

  Result<SetLimitsOutcome> set(Selector selector, std::optional<std::uint64_t> memory,
                               std::optional<std::uint64_t> core) {
    LimitsChange change;
    if (memory) change.memory = {FieldChange::Op::kSet, *memory};
    if (core) change.core = {FieldChange::Op::kSet, *core};
    return scheduler_->set_limits(selector, change, now_);
  }

  RecordingChannel channel_;
  std::unique_ptr<Scheduler> scheduler_;
  MonoTime now_{std::chrono::seconds(100)};
};

TEST_F(SchedulerTest, RegistrationSendsTheLimitsInForceAndCreatesOnePolicyPerGpu) {
  make();
  const ClientId a = add("GPU-1");
  const ClientId b = add("GPU-2");
  const ClientId c = add("GPU-1");
  EXPECT_EQ(last_limits(a), (Limits{0, 100}));
  EXPECT_EQ(last_limits(b), (Limits{0, 100}));
  EXPECT_EQ(last_limits(c), (Limits{0, 100}));
  const StatusSnapshot snapshot = scheduler_->snapshot(now_);
  ASSERT_EQ(snapshot.gpus.size(), 2u);
  EXPECT_EQ(snapshot.gpus[0].uuid, "GPU-1");
  EXPECT_EQ(snapshot.gpus[0].clients.size(), 2u);
  EXPECT_EQ(snapshot.gpus[1].clients.size(), 1u);

  protocol::Hello no_gpu;
  ClientIdentity identity;
  EXPECT_FALSE(
      scheduler_->register_client(scheduler_->next_client_id(), identity, no_gpu, now_).ok());
}

TEST_F(SchedulerTest, AGpuThisNodeDoesNotHaveIsRefusedAndLeavesNothingBehind) {
  make();
  for (int i = 0; i < 1000; ++i) {
    protocol::Hello hello;
    hello.gpu_uuid = "GPU-invented-" + std::to_string(i);
    ClientIdentity identity;
    auto registered =
        scheduler_->register_client(scheduler_->next_client_id(), identity, hello, now_);
    ASSERT_FALSE(registered.ok());
    EXPECT_NE(registered.error().message.find("not one of this node's"), std::string::npos);
  }
  EXPECT_EQ(scheduler_->client_count(), 0u);
  EXPECT_TRUE(scheduler_->snapshot(now_).gpus.empty());
  EXPECT_EQ(scheduler_->gpu_count(), 4u);
}

TEST_F(SchedulerTest, AGpusMemoryComesFromTheDeviceNotFromItsClients) {
  make({"--mode", "auto", "--reserve", "0"});
  protocol::Hello tiny;
  tiny.gpu_memory_bytes = 1;  // an idle client claiming a 1-byte GPU
  add(kGpu, std::nullopt, tiny);
  const ClientId a = add();
  const ClientId b = add();
  scheduler_->usage(a, protocol::Usage{30 * Gi, 30 * Gi, 0}, now_);
  scheduler_->usage(b, protocol::Usage{30 * Gi, 30 * Gi, 0}, now_);
  scheduler_->request(a, now_);
  scheduler_->request(b, now_);
  EXPECT_EQ(channel_.take<protocol::Grant>(a).size(), 1u);
  EXPECT_EQ(channel_.take<protocol::Grant>(b).size(), 1u);  // 60Gi of 80Gi: they co-run
  EXPECT_EQ(scheduler_->snapshot(now_).gpus[0].view.capacity_bytes, 80 * Gi);
  EXPECT_EQ(scheduler_->snapshot(now_).gpus[0].memory_source, "test");
  // The device plugin's inventory can correct it; that reaches the policy at once.
  ASSERT_TRUE(scheduler_->set_gpus({GpuInfo{kGpu, 0, 40 * Gi}}, "device plugin", now_).ok());
  EXPECT_EQ(scheduler_->snapshot(now_).gpus[0].view.capacity_bytes, 40 * Gi);
  EXPECT_FALSE(scheduler_->set_gpus({GpuInfo{kGpu, 0, 0}}, "device plugin", now_).ok());
}

TEST_F(SchedulerTest, LimitsAreProvisionalUntilTheSchedulerKnowsThem) {
  make();
  // A fresh scheduler without state: a client in a pod it has no record of gets provisional limits.
  const ClientId a = add(kGpu, kPod);
  EXPECT_TRUE(last_frame(a).provisional());
  // The control plane pushes the pod: the same limits, now authoritative.
  Selector pod;
  pod.pod_uid = kPod;
  ASSERT_TRUE(set(pod, 2 * Gi, std::nullopt).ok());
  protocol::SetLimits frame = last_frame(a);
  EXPECT_EQ(frame.limits, (Limits{2 * Gi, 100}));
  EXPECT_FALSE(frame.provisional());
  // Another pod's client stays provisional until the control plane says it pushed everything.
  const ClientId b = add(kGpu, std::string("11111111-2222-3333-4444-555555555555"));
  EXPECT_TRUE(last_frame(b).provisional());
  scheduler_->mark_synced(now_);
  frame = last_frame(b);
  EXPECT_EQ(frame.limits, (Limits{0, 100}));
  EXPECT_FALSE(frame.provisional());
  EXPECT_TRUE(channel_.take<protocol::SetLimits>(a).empty());  // nothing changed for a
}

TEST_F(SchedulerTest, PodAndProcessLimitsSurviveARestart) {
  make();
  Selector pod;
  pod.pod_uid = kPod;
  pod.pod_namespace = "ns";
  pod.pod_name = "trainer";
  ASSERT_TRUE(set(pod, 1 * Gi, 30).ok());
  LimitsChange unified;
  unified.memory_mode = FieldChange{FieldChange::Op::kSet, 2};
  ASSERT_TRUE(scheduler_->set_limits(pod, unified, now_).ok());
  const ClientId p = add("GPU-1", std::nullopt, {}, 4242, 777);
  Selector pid;
  pid.pid = 4242;
  ASSERT_TRUE(set(pid, 3 * Gi, std::nullopt).ok());
  scheduler_->set_process_probe(
      [](pid_t pid, std::uint64_t start) { return pid == 4242 && start == 777; });
  EXPECT_TRUE(scheduler_->take_state_dirty());
  const std::string text = render_state(scheduler_->persistent_state());
  EXPECT_FALSE(scheduler_->take_state_dirty());
  (void)p;

  // The next run restores it before anyone registers.
  auto state = parse_state(text);
  ASSERT_TRUE(state.ok()) << state.error().message;
  make();
  scheduler_->set_process_probe(
      [](pid_t pid, std::uint64_t start) { return pid == 4242 && start == 777; });
  scheduler_->restore(state.value(), true, now_);
  const ClientId in_pod = add(kGpu, kPod);
  protocol::SetLimits frame = last_frame(in_pod);
  EXPECT_EQ(frame.limits, (Limits{1 * Gi, 30, 2}));  // the pod's memory mode survives too
  EXPECT_FALSE(frame.provisional());
  const ClientId same_process = add("GPU-1", std::nullopt, {}, 4242, 777);
  EXPECT_EQ(last_limits(same_process), (Limits{3 * Gi, 100}));
  // The same pid started anew is another process: nothing of the old one applies.
  const ClientId reused = add("GPU-1", std::nullopt, {}, 4242, 999);
  EXPECT_EQ(last_limits(reused), (Limits{0, 100}));
  EXPECT_EQ(scheduler_->snapshot(now_).pods.at(0).pod_name, "trainer");
}

TEST_F(SchedulerTest, ARecordOfAProcessThatExitedIsDropped) {
  make();
  const ClientId p = add("GPU-1", std::nullopt, {}, 4242, 777);
  Selector client;
  client.client = p;
  ASSERT_TRUE(set(client, 3 * Gi, std::nullopt).ok());
  bool alive = true;
  scheduler_->set_process_probe([&](pid_t, std::uint64_t) { return alive; });
  EXPECT_EQ(scheduler_->persistent_state().processes.size(), 1u);
  scheduler_->disconnect(p, now_);  // alive: its link may come back
  EXPECT_EQ(scheduler_->persistent_state().processes.size(), 1u);
  alive = false;
  EXPECT_TRUE(scheduler_->persistent_state().processes.empty());
}

TEST_F(SchedulerTest, RequestsReleasesAndDisconnectsRouteToTheGpusPolicy) {
  make({"--mode", "auto", "--capacity", "1Gi", "--reserve", "0", "--quantum", "600"});
  const ClientId a = add();
  const ClientId b = add();
  scheduler_->usage(a, protocol::Usage{700 * Mi, 700 * Mi, 0}, now_);
  scheduler_->usage(b, protocol::Usage{700 * Mi, 0, 0}, now_);
  scheduler_->request(a, now_);
  auto grants = channel_.take<protocol::Grant>(a);
  ASSERT_EQ(grants.size(), 1u);
  scheduler_->request(b, now_);
  auto waits = channel_.take<protocol::Wait>(b);
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_EQ(waits[0].reason, protocol::WaitReason::kMemory);

  // A stale release is ignored; the disconnect frees the GPU for b.
  scheduler_->release(a, protocol::Released{grants[0].epoch + 1, 10, 0}, now_);
  EXPECT_TRUE(channel_.take<protocol::Grant>(b).empty());
  scheduler_->disconnect(a, now_);
  EXPECT_FALSE(scheduler_->has_client(a));
  auto b_grants = channel_.take<protocol::Grant>(b);
  ASSERT_EQ(b_grants.size(), 1u);
  EXPECT_GT(b_grants[0].epoch, grants[0].epoch);

  // Frames for departed clients and events from unknown ones are harmless.
  scheduler_->request(a, now_);
  scheduler_->disconnect(a, now_);
}

TEST_F(SchedulerTest, DeadlinesRevokeAtTheEndOfATurn) {
  make({"--capacity", "1Gi", "--reserve", "0", "--quantum", "0.5"});
  const ClientId a = add();
  const ClientId b = add();
  scheduler_->usage(a, protocol::Usage{700 * Mi, 700 * Mi, 0}, now_);
  scheduler_->usage(b, protocol::Usage{700 * Mi, 0, 0}, now_);
  scheduler_->request(a, now_);
  scheduler_->request(b, now_);
  const auto deadline = scheduler_->next_deadline();
  ASSERT_TRUE(deadline.has_value());
  EXPECT_LE(*deadline, now_ + 500ms);
  scheduler_->run_due(now_ + 100ms);  // not due yet
  EXPECT_TRUE(channel_.take<protocol::Revoke>(a).empty());
  scheduler_->run_due(*deadline);
  auto revokes = channel_.take<protocol::Revoke>(a);
  ASSERT_EQ(revokes.size(), 1u);
  EXPECT_EQ(revokes[0].reason, protocol::RevokeReason::kTurn);
}

// Room goes to a head that speaks version 12 and swaps, while the holder it waits for swaps out:
// the room nobody holds at the revoke, then what each report of the leaver frees. An older head
// (version 11) is never sent one.
TEST_F(SchedulerTest, RoomGoesOnlyToAHeadThatSpeaksVersionTwelve) {
  for (const std::uint16_t version : {std::uint16_t{11}, std::uint16_t{12}}) {
    SCOPED_TRACE("head speaks version " + std::to_string(version));
    make({"--capacity", "1Gi", "--reserve", "0", "--quantum", "0.5"});
    protocol::Hello hello;
    hello.capabilities = protocol::capability::kSwap;
    hello.max_version = version;
    const ClientId a = add(kGpu, std::nullopt, hello);
    const ClientId b = add(kGpu, std::nullopt, hello);
    scheduler_->usage(a, protocol::Usage{768 * Mi, 768 * Mi, 0}, now_);
    scheduler_->usage(b, protocol::Usage{768 * Mi, 0, 0}, now_);
    scheduler_->request(a, now_);
    scheduler_->request(b, now_);
    const auto deadline = scheduler_->next_deadline();
    ASSERT_TRUE(deadline.has_value());
    scheduler_->run_due(*deadline);
    ASSERT_EQ(channel_.take<protocol::Revoke>(a).size(), 1u);
    scheduler_->usage(a, protocol::Usage{768 * Mi, 256 * Mi, 0}, *deadline + 10ms);
    const auto rooms = channel_.take<protocol::Room>(b);
    if (version < protocol::kRoomVersion) {
      EXPECT_TRUE(rooms.empty());
      continue;
    }
    ASSERT_EQ(rooms.size(), 2u);
    EXPECT_EQ(rooms[0].bytes, 256 * Mi);  // 1Gi less a's 768Mi
    EXPECT_EQ(rooms[1].bytes, 768 * Mi);  // a moved 512Mi out: all of b's fits
  }
}

// Drives clients that always want their GPU for `length`: each answers a revoke after its own
// drain time and asks again at once. Returns the times each was granted.
std::map<ClientId, std::vector<MonoTime>> drive_always_busy(
    Scheduler& scheduler, RecordingChannel& channel, MonoTime& now,
    const std::map<ClientId, Duration>& drains, Duration length) {
  std::map<ClientId, std::vector<MonoTime>> grants;
  std::map<ClientId, std::uint64_t> epochs;
  std::map<ClientId, MonoTime> releases;  // due releases
  const MonoTime end = now + length;
  while (now < end) {
    for (const auto& [id, drain] : drains) {
      for (const protocol::Grant& g : channel.take<protocol::Grant>(id)) {
        grants[id].push_back(now);
        epochs[id] = g.epoch;
      }
      for (const protocol::Revoke& r : channel.take<protocol::Revoke>(id)) {
        if (r.epoch == epochs[id] && r.reason != protocol::RevokeReason::kYield) {
          releases[id] = now + drain;
        }
      }
    }
    MonoTime next = end;
    if (auto d = scheduler.next_deadline()) next = std::min(next, *d);
    for (const auto& [id, at] : releases) next = std::min(next, at);
    now = std::max(now, next);
    for (auto it = releases.begin(); it != releases.end();) {
      if (it->second <= now) {
        scheduler.release(it->first, protocol::Released{epochs[it->first], 0, 0}, now);
        it = releases.erase(it);
      } else {
        ++it;
      }
    }
    scheduler.run_due(now);
  }
  return grants;
}

// Grants of `b` within 1 us of one of `a`'s, after the first second.
int grants_together(const std::vector<MonoTime>& a, const std::vector<MonoTime>& b, MonoTime after,
                    int* b_total) {
  int together = 0;
  *b_total = 0;
  for (MonoTime t : b) {
    if (t < after) continue;
    ++*b_total;
    for (MonoTime u : a) {
      if (std::chrono::abs(t - u) <= 1us) {
        ++together;
        break;
      }
    }
  }
  return together;
}

TEST_F(SchedulerTest, TheCappedProcessesOfOnePodOnTwoGpusResumeTogether) {
  make();
  Selector pod;
  pod.pod_uid = kPod;
  ASSERT_TRUE(set(pod, std::nullopt, 50).ok());
  const ClientId a = add("GPU-1", kPod);
  scheduler_->request(a, now_);
  now_ += 137ms;  // the other rank starts later, and drains slower
  const ClientId b = add("GPU-2", kPod, {}, 1001);
  scheduler_->request(b, now_);
  const MonoTime start = now_;
  auto grants = drive_always_busy(*scheduler_, channel_, now_, {{a, 2ms}, {b, 9ms}}, 10s);
  int total = 0;
  const int together = grants_together(grants[a], grants[b], start + 1s, &total);
  EXPECT_GE(total, 15);  // a 0.5 s cycle
  EXPECT_EQ(together, total) << "every run of the pod's process on GPU-2 starts with GPU-1's";

  // Processes of different pods (or of no pod) on the two GPUs keep their own phases.
  const ClientId c = add("GPU-1", "11111111-2222-3333-4444-555555555555", {}, 1002);
  const ClientId d = add("GPU-2", std::nullopt, {}, 1003);
  ASSERT_TRUE(set(Selector{.client = c}, std::nullopt, 50).ok());
  ASSERT_TRUE(set(Selector{.client = d}, std::nullopt, 50).ok());
  scheduler_->disconnect(a, now_);
  scheduler_->disconnect(b, now_);
  scheduler_->request(c, now_);
  now_ += 137ms;
  scheduler_->request(d, now_);
  const MonoTime later = now_;
  grants = drive_always_busy(*scheduler_, channel_, now_, {{c, 2ms}, {d, 9ms}}, 10s);
  EXPECT_EQ(grants_together(grants[c], grants[d], later + 1s, &total), 0);
  EXPECT_GE(total, 15);
}

TEST_F(SchedulerTest, PodLimitsAreRememberedForClientsThatRegisterLater) {
  make();
  Selector pod;
  pod.pod_uid = kPod;
  pod.pod_namespace = "ns";
  pod.pod_name = "trainer";
  auto outcome = set(pod, 4 * Gi, 30);
  ASSERT_TRUE(outcome.ok()) << outcome.error().message;
  EXPECT_TRUE(outcome.value().clients.empty());
  EXPECT_EQ(outcome.value().remembered_pods, std::vector<std::string>{kPod});

  const ClientId a = add(kGpu, kPod);
  EXPECT_EQ(last_limits(a), (Limits{4 * Gi, 30}));
  const ClientId other = add(kGpu, std::string("11111111-2222-3333-4444-555555555555"));
  EXPECT_EQ(last_limits(other), (Limits{0, 100}));

  const StatusSnapshot snapshot = scheduler_->snapshot(now_);
  const ClientStatus& status = snapshot.gpus[0].clients[0];
  EXPECT_EQ(status.pod_namespace, "ns");
  EXPECT_EQ(status.pod_name, "trainer");
  EXPECT_EQ(status.limits_source, "pod");
  ASSERT_EQ(snapshot.pods.size(), 1u);
  EXPECT_EQ(snapshot.pods[0].clients, 1u);

  // A namespace/name selector alone reaches the pod now that its name is known.
  Selector by_name;
  by_name.pod_namespace = "ns";
  by_name.pod_name = "trainer";
  outcome = set(by_name, std::nullopt, 60);
  ASSERT_TRUE(outcome.ok()) << outcome.error().message;
  EXPECT_EQ(outcome.value().clients, std::vector<ClientId>{a});
  EXPECT_EQ(last_limits(a), (Limits{4 * Gi, 60}));

  by_name.pod_name = "unknown";
  EXPECT_FALSE(set(by_name, 1 * Gi, std::nullopt).ok());

  // Forgetting the pod drops its limits from its clients.
  ASSERT_TRUE(scheduler_->forget_pod(kPod, now_).ok());
  EXPECT_EQ(last_limits(a), (Limits{0, 100}));
  EXPECT_FALSE(scheduler_->forget_pod(kPod, now_).ok());
}

TEST_F(SchedulerTest, ClientLayerWinsOverPodWhichWinsOverTrustedDeclaration) {
  make({"--trust-client-limits"});
  protocol::Hello hello;
  hello.declared = Limits{8 * Gi, 20};
  hello.pod_uid = kPod;  // trusted: used since no cgroup names a pod
  const ClientId a = add(kGpu, std::nullopt, hello);
  EXPECT_EQ(last_limits(a), (Limits{8 * Gi, 20}));

  Selector pod;
  pod.pod_uid = kPod;
  ASSERT_TRUE(set(pod, 4 * Gi, std::nullopt).ok());
  EXPECT_EQ(last_limits(a), (Limits{4 * Gi, 20}));  // memory from the pod, core still declared

  Selector client;
  client.client = a;
  ASSERT_TRUE(set(client, std::nullopt, 100).ok());  // "none" is a value: uncapped
  EXPECT_EQ(last_limits(a), (Limits{4 * Gi, 100}));

  // inherit drops the client's override again.
  LimitsChange inherit;
  inherit.core = {FieldChange::Op::kInherit, 0};
  ASSERT_TRUE(scheduler_->set_limits(client, inherit, now_).ok());
  EXPECT_EQ(last_limits(a), (Limits{4 * Gi, 20}));

  // Unchanged limits send nothing.
  ASSERT_TRUE(set(pod, 4 * Gi, std::nullopt).ok());
  EXPECT_TRUE(channel_.take<protocol::SetLimits>(a).empty());
}

TEST_F(SchedulerTest, UntrustedDeclarationsAndPodClaimsAreIgnored) {
  make();
  Selector pod;
  pod.pod_uid = kPod;
  ASSERT_TRUE(set(pod, 4 * Gi, std::nullopt).ok());
  protocol::Hello hello;
  hello.declared = Limits{8 * Gi, 20};
  hello.pod_uid = kPod;
  const ClientId a = add(kGpu, std::nullopt, hello);
  EXPECT_EQ(last_limits(a), (Limits{0, 100}));
  // The cgroup's pod is believed.
  const ClientId b = add(kGpu, kPod);
  EXPECT_EQ(last_limits(b), (Limits{4 * Gi, 100}));
}

TEST_F(SchedulerTest, PidSelectorReachesEverySessionOfTheProcess) {
  make();
  const ClientId a = add("GPU-1", std::nullopt, {}, 4242);
  const ClientId b = add("GPU-2", std::nullopt, {}, 4242);
  const ClientId c = add("GPU-1", std::nullopt, {}, 4343);
  channel_.sent.clear();
  Selector pid;
  pid.pid = 4242;
  auto outcome = set(pid, 1 * Gi, std::nullopt);
  ASSERT_TRUE(outcome.ok()) << outcome.error().message;
  EXPECT_EQ(outcome.value().clients, (std::vector<ClientId>{a, b}));
  EXPECT_EQ(last_limits(a).memory_bytes, 1 * Gi);
  EXPECT_EQ(last_limits(b).memory_bytes, 1 * Gi);
  EXPECT_TRUE(channel_.take<protocol::SetLimits>(c).empty());
}

TEST_F(SchedulerTest, SelectorsAndValuesAreChecked) {
  make();
  const ClientId a = add();
  Selector none;
  EXPECT_FALSE(set(none, 1 * Gi, std::nullopt).ok());
  Selector two;
  two.client = a;
  two.pid = 1000;
  EXPECT_FALSE(set(two, 1 * Gi, std::nullopt).ok());
  Selector half_name;
  half_name.pod_namespace = "ns";
  EXPECT_FALSE(set(half_name, 1 * Gi, std::nullopt).ok());
  Selector client;
  client.client = a;
  auto bad_core = set(client, std::nullopt, 0);
  ASSERT_FALSE(bad_core.ok());
  EXPECT_NE(bad_core.error().message.find("outside 1..100"), std::string::npos);
  client.client = 999;
  EXPECT_NE(set(client, 1 * Gi, std::nullopt).error().message.find("no client with id 999"),
            std::string::npos);
}

TEST_F(SchedulerTest, SetPolicyValidatesEverythingBeforeChangingAnything) {
  // Auto mode, so that a larger capacity lets b co-run and the later mode change is a change.
  make({"--mode", "auto", "--capacity", "1Gi", "--reserve", "0", "--quantum", "600"});
  const ClientId a = add();
  const ClientId b = add();
  scheduler_->usage(a, protocol::Usage{700 * Mi, 700 * Mi, 0}, now_);
  scheduler_->usage(b, protocol::Usage{700 * Mi, 0, 0}, now_);
  scheduler_->request(a, now_);
  scheduler_->request(b, now_);
  ASSERT_EQ(channel_.take<protocol::Wait>(b).size(), 1u);

  // quantum-min above quantum-max: refused as a whole, nothing changes.
  auto bad = scheduler_->set_policy(
      std::nullopt, {{find_knob("capacity"), "4Gi"}, {find_knob("quantum-min"), "400"}}, now_);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(scheduler_->snapshot(now_).gpus[0].view.capacity_bytes, 1 * Gi);
  EXPECT_FALSE(scheduler_->set_policy(std::nullopt, {{find_knob("socket"), "/x"}}, now_).ok());

  // A per-GPU capacity takes effect at once and lets b run beside a.
  auto changed = scheduler_->set_policy(kGpu, {{find_knob("capacity"), "2Gi"}}, now_);
  ASSERT_TRUE(changed.ok()) << changed.error().message;
  EXPECT_EQ(changed.value(), std::vector<std::string>{kGpu});
  EXPECT_EQ(channel_.take<protocol::Grant>(b).size(), 1u);
  EXPECT_EQ(scheduler_->snapshot(now_).gpus[0].view.capacity_bytes, 2 * Gi);

  // A later global change applies to that GPU too, keeping its own capacity unless one is given.
  ASSERT_TRUE(scheduler_->set_policy(std::nullopt, {{find_knob("mode"), "exclusive"}}, now_).ok());
  const StatusSnapshot snapshot = scheduler_->snapshot(now_);
  EXPECT_EQ(snapshot.gpus[0].config.mode, policy::Mode::kExclusive);
  EXPECT_EQ(snapshot.gpus[0].view.capacity_bytes, 2 * Gi);
  EXPECT_EQ(scheduler_->config().policy.mode, policy::Mode::kExclusive);

  // Settings for a GPU without clients yet are kept for when it appears.
  ASSERT_TRUE(
      scheduler_->set_policy(std::string("GPU-later"), {{find_knob("capacity"), "3Gi"}}, now_)
          .ok());
  add("GPU-later");
  for (const GpuStatus& gpu : scheduler_->snapshot(now_).gpus) {
    if (gpu.uuid == "GPU-later") {
      EXPECT_EQ(gpu.view.capacity_bytes, 3 * Gi);
      EXPECT_EQ(gpu.config.mode, policy::Mode::kExclusive);
    }
  }
}

TEST_F(SchedulerTest, ExplainNamesTheGpuAndState) {
  make({"--mode", "auto", "--capacity", "1Gi", "--reserve", "0"});
  const ClientId a = add();
  const ClientId b = add();
  scheduler_->usage(a, protocol::Usage{700 * Mi, 700 * Mi, 0}, now_);
  scheduler_->usage(b, protocol::Usage{700 * Mi, 0, 0}, now_);
  scheduler_->request(a, now_);
  scheduler_->request(b, now_);
  auto explanation = scheduler_->explain(b, now_);
  ASSERT_TRUE(explanation.ok());
  EXPECT_EQ(explanation.value().gpu, kGpu);
  EXPECT_EQ(explanation.value().state, policy::ClientState::kWaiting);
  EXPECT_EQ(explanation.value().waiting_for, protocol::WaitReason::kMemory);
  EXPECT_FALSE(explanation.value().text.empty());
  EXPECT_FALSE(scheduler_->explain(999, now_).ok());
}

TEST_F(SchedulerTest, StatusJsonHasTheDocumentedFields) {
  make({"--capacity", "1Gi"});
  const ClientId a = add(kGpu, kPod);
  scheduler_->usage(a, protocol::Usage{100 * Mi, 50 * Mi, 0}, now_);
  scheduler_->request(a, now_);
  const Json json = to_json(scheduler_->snapshot(now_ + 1s));
  const Json& gpu = json.find("gpus")->as_array()->at(0);
  for (const char* key : {"uuid", "mode", "capacity_bytes", "capacity_virtual", "usable_bytes",
                          "running_bytes", "reserve_percent", "quantum_ms", "quantum_fixed",
                          "quota_window_ms", "last_epoch", "unresponsive_holders", "clients"}) {
    EXPECT_NE(gpu.find(key), nullptr) << key;
  }
  const Json& client = gpu.find("clients")->as_array()->at(0);
  for (const char* key : {"id",
                          "pid",
                          "uid",
                          "pod_uid",
                          "namespace",
                          "pod",
                          "container_id",
                          "process",
                          "state",
                          "waiting_for",
                          "epoch",
                          "allocated_bytes",
                          "resident_bytes",
                          "memory_limit_bytes",
                          "core_limit_percent",
                          "limits_source",
                          "effective_cap_percent",
                          "share_percent",
                          "held_ms",
                          "waited_ms",
                          "state_for_ms",
                          "connected_ms",
                          "capabilities"}) {
    EXPECT_NE(client.find(key), nullptr) << key;
  }
  EXPECT_EQ(*client.find("state")->as_string(), "running");
  EXPECT_EQ(client.find("allocated_bytes")->as_int64(), static_cast<std::int64_t>(100 * Mi));
  EXPECT_DOUBLE_EQ(*client.find("state_for_ms")->as_double(), 1000.0);
  EXPECT_TRUE(json.find("pods")->is_array());
}

}  // namespace
}  // namespace nvshare::scheduler
