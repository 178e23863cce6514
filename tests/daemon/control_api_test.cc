// The control API's commands against an in-process Scheduler: request shapes, errors, responses.
#include "scheduler/control_api.h"

#include <gtest/gtest.h>

#include "control/answers.h"

namespace nvshare::scheduler {
namespace {

using namespace std::chrono_literals;

class NullChannel : public ClientChannel {
 public:
  void send(ClientId client, const protocol::Message& message) override {
    if (std::holds_alternative<protocol::SetLimits>(message)) {
      limits[client] = std::get<protocol::SetLimits>(message).limits;
    }
  }
  std::map<ClientId, protocol::Limits> limits;
};

constexpr const char* kPodA = "7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d";

class ControlApiTest : public ::testing::Test {
 protected:
  ControlApiTest() : scheduler_(default_config(), channel_) {
    EXPECT_TRUE(scheduler_.set_gpus({GpuInfo{"GPU-1", 0, 80ull << 30}}, "test", MonoTime{}).ok());
  }

  Json call(std::string_view line) {
    ControlContext context{scheduler_, stats_, MonoTime{}, MonoTime{10s}, 3};
    return handle_control_line(line, context);
  }
  static std::string error_of(const Json& response) {
    const Json* ok = response.find("ok");
    EXPECT_TRUE(ok != nullptr && ok->as_bool() == false) << response.dump();
    const Json* error = response.find("error");
    return error && error->is_string() ? *error->as_string() : "";
  }
  ClientId add(const std::string& pod = "") {
    const ClientId id = scheduler_.next_client_id();
    protocol::Hello hello;
    hello.gpu_uuid = "GPU-1";
    ClientIdentity identity;
    identity.pid = 77;
    if (!pod.empty()) identity.pod_uid = pod;
    EXPECT_TRUE(scheduler_.register_client(id, identity, hello, MonoTime{10s}).ok());
    return id;
  }

  NullChannel channel_;
  DaemonStats stats_;
  Scheduler scheduler_;
};

TEST_F(ControlApiTest, StatusHasSchedulerGpusAndPods) {
  add();
  const Json response = call(R"({"cmd":"status"})");
  EXPECT_EQ(response.find("ok")->as_bool(), true);
  const Json* scheduler = response.find("scheduler");
  ASSERT_NE(scheduler, nullptr);
  EXPECT_EQ(scheduler->find("client_sessions")->as_int64(), 3);
  EXPECT_EQ(scheduler->find("clients")->as_int64(), 1);
  EXPECT_DOUBLE_EQ(*scheduler->find("uptime_s")->as_double(), 10.0);
  EXPECT_EQ(*scheduler->find("config")->find("mode")->as_string(), "auto");
  EXPECT_EQ(response.find("gpus")->as_array()->size(), 1u);
  EXPECT_TRUE(response.find("pods")->is_array());
}

TEST_F(ControlApiTest, SetLimitsAcceptsEveryDocumentedValueForm) {
  const ClientId a = add(kPodA);
  Json r =
      call(R"({"cmd":"set-limits","selector":{"pod_uid":"7D3F9A2E-1C4B-4E8F-9A6D-2B5C8E1F0A3D",)"
           R"("namespace":"ns","name":"p"},)"
           R"("memory":"4Gi","core":30})");
  ASSERT_EQ(r.find("ok")->as_bool(), true) << r.dump();
  EXPECT_EQ(r.find("clients")->dump(), "[" + std::to_string(a) + "]");
  // Stored in canonical form, so it matches the UID the pod's cgroup gives.
  EXPECT_EQ(r.find("pods")->dump(), "[\"" + std::string(kPodA) + "\"]");
  EXPECT_EQ(channel_.limits[a], (protocol::Limits{4ull << 30, 30}));

  r = call(R"({"cmd":"set-limits","selector":{"client":)" + std::to_string(a) +
           R"(},"memory":1073741824,"core":"50%"})");
  ASSERT_EQ(r.find("ok")->as_bool(), true) << r.dump();
  EXPECT_EQ(channel_.limits[a], (protocol::Limits{1ull << 30, 50}));

  r = call(R"({"cmd":"set-limits","selector":{"pid":77},"memory":null,"core":"none"})");
  ASSERT_EQ(r.find("ok")->as_bool(), true) << r.dump();
  EXPECT_EQ(channel_.limits[a], (protocol::Limits{0, 100}));

  r = call(R"({"cmd":"set-limits","selector":{"client":)" + std::to_string(a) +
           R"(},"memory":"inherit","core":"inherit"})");
  ASSERT_EQ(r.find("ok")->as_bool(), true) << r.dump();
  EXPECT_EQ(channel_.limits[a], (protocol::Limits{4ull << 30, 30}));  // back to the pod's

  r = call(R"({"cmd":"set-limits","selector":{"namespace":"ns","name":"p"},"core":10})");
  ASSERT_EQ(r.find("ok")->as_bool(), true) << r.dump();
  EXPECT_EQ(channel_.limits[a].core_percent, 10);
}

struct BadRequest {
  const char* name;
  const char* line;
  const char* message_part;
};

void PrintTo(const BadRequest& r, std::ostream* os) { *os << r.name; }

class ControlApiRejects : public ControlApiTest,
                          public ::testing::WithParamInterface<BadRequest> {};

TEST_P(ControlApiRejects, WithAnErrorResponse) {
  add(kPodA);
  EXPECT_NE(error_of(call(GetParam().line)).find(GetParam().message_part), std::string::npos)
      << call(GetParam().line).dump();
}

INSTANTIATE_TEST_SUITE_P(
    Errors, ControlApiRejects,
    ::testing::Values(
        BadRequest{"not_json", "status", "invalid JSON at line 1 column 1"},
        BadRequest{"not_object", "[1]", "must be a JSON object"},
        BadRequest{"no_cmd", "{}", "missing \"cmd\""},
        BadRequest{"unknown_cmd", R"({"cmd":"reboot"})", "unknown cmd \"reboot\""},
        BadRequest{"status_extra", R"({"cmd":"status","verbose":true})",
                   "unknown member \"verbose\""},
        BadRequest{"typo_member", R"({"cmd":"set-limits","selector":{"client":1},"cores":3})",
                   "unknown member \"cores\" in set-limits"},
        BadRequest{"no_selector", R"({"cmd":"set-limits","memory":"1Gi"})", "needs a \"selector\""},
        BadRequest{"bad_selector_key", R"({"cmd":"set-limits","selector":{"pod":"x"},"core":3})",
                   "unknown member \"pod\" in selector"},
        BadRequest{"two_selectors",
                   R"({"cmd":"set-limits","selector":{"client":1,"pid":2},"core":3})",
                   "exactly one of"},
        BadRequest{"client_zero", R"({"cmd":"set-limits","selector":{"client":0},"core":3})",
                   "selector.client must be a positive integer"},
        BadRequest{"bad_quantity", R"({"cmd":"set-limits","selector":{"client":1},"memory":"4GB"})",
                   "memory: memory quantity"},
        BadRequest{"negative_memory", R"({"cmd":"set-limits","selector":{"client":1},"memory":-1})",
                   "memory must be"},
        BadRequest{"core_range", R"({"cmd":"set-limits","selector":{"client":1},"core":101})",
                   "core must be a percent 1..100"},
        BadRequest{"core_text", R"({"cmd":"set-limits","selector":{"client":1},"core":"lots"})",
                   "core: "},
        BadRequest{"nothing_to_set", R"({"cmd":"set-limits","selector":{"client":1}})",
                   "changes nothing"},
        BadRequest{"unknown_pid", R"({"cmd":"set-limits","selector":{"pid":5},"core":3})",
                   "no client with pid 5"},
        BadRequest{
            "policy_unknown", R"({"cmd":"set-policy","quantom":3})",
            "unknown member \"quantom\" in set-policy (accepted: gpu, mode, reserve, capacity"},
        BadRequest{"policy_daemon_knob", R"({"cmd":"set-policy","socket":"/x"})",
                   "unknown member \"socket\""},
        BadRequest{"policy_empty", R"({"cmd":"set-policy","gpu":"GPU-1"})", "changes nothing"},
        BadRequest{"policy_bad_value", R"({"cmd":"set-policy","quota_window_ms":5})",
                   "quota-window: 5 is outside 10..3600000"},
        BadRequest{"policy_bad_type", R"({"cmd":"set-policy","mode":["auto"]})",
                   "must be a string"},
        BadRequest{"explain_missing", R"({"cmd":"explain"})", "explain needs \"client\""},
        BadRequest{"explain_unknown", R"({"cmd":"explain","client":99})", "no client with id 99"},
        BadRequest{"forget_unknown",
                   R"({"cmd":"forget-pod","pod_uid":"11111111-2222-3333-4444-555555555555"})",
                   "no remembered pod 11111111-2222-3333-4444-555555555555"},
        BadRequest{"forget_not_a_uid", R"({"cmd":"forget-pod","pod_uid":"nope"})",
                   "pod_uid \"nope\" is not a pod UID"},
        BadRequest{"pod_uid_not_a_uid",
                   R"({"cmd":"set-limits","selector":{"pod_uid":"pod-a"},"core":3})",
                   "selector.pod_uid \"pod-a\" is not a pod UID"},
        BadRequest{"memory_zero", R"({"cmd":"set-limits","selector":{"client":1},"memory":0})",
                   "memory 0 is not a limit"},
        BadRequest{"memory_zero_text",
                   R"({"cmd":"set-limits","selector":{"client":1},"memory":"0Gi"})",
                   "memory 0 is not a limit"},
        BadRequest{"gpus_missing", R"({"cmd":"set-gpus"})", "set-gpus needs \"gpus\""},
        BadRequest{"gpus_zero", R"({"cmd":"set-gpus","gpus":[{"uuid":"GPU-2","memory_bytes":0}]})",
                   "memory_bytes must be a positive integer"},
        BadRequest{"gpus_extra",
                   R"({"cmd":"set-gpus","gpus":[{"uuid":"GPU-2","memory_bytes":1,"x":1}]})",
                   "unknown member \"x\""},
        BadRequest{"sync_extra", R"({"cmd":"sync","all":true})", "unknown member \"all\""},
        BadRequest{"stats_reset_type", R"({"cmd":"stats","reset":"yes"})",
                   "reset must be true or false"}),
    [](const ::testing::TestParamInfo<BadRequest>& test) { return std::string(test.param.name); });

TEST_F(ControlApiTest, SetGpusAddsToTheInventoryAndSyncMakesLimitsAuthoritative) {
  Json r = call(R"({"cmd":"set-gpus","gpus":[{"uuid":"GPU-2","memory_bytes":17179869184}]})");
  ASSERT_EQ(r.find("ok")->as_bool(), true) << r.dump();
  EXPECT_EQ(r.find("gpus")->as_int64(), 2);
  EXPECT_TRUE(scheduler_.knows_gpu("GPU-2"));
  EXPECT_FALSE(scheduler_.synced());
  EXPECT_EQ(call(R"({"cmd":"status"})").find("scheduler")->find("limits_synced")->as_bool(), false);
  ASSERT_EQ(call(R"({"cmd":"sync"})").find("ok")->as_bool(), true);
  EXPECT_TRUE(scheduler_.synced());
}

TEST_F(ControlApiTest, SetPolicyMapsMembersToKnobs) {
  add();
  Json r = call(R"({"cmd":"set-policy","mode":"serial","quantum":2.5,"quota_window_ms":500,)"
                R"("capacity":"24Gi","reserve":5,"quantum_k":3,"revoke_grace":"1"})");
  ASSERT_EQ(r.find("ok")->as_bool(), true) << r.dump();
  EXPECT_EQ(r.find("gpus")->dump(), R"(["GPU-1"])");
  const policy::PolicyConfig& c = scheduler_.config().policy;
  EXPECT_EQ(c.mode, policy::Mode::kExclusive);
  EXPECT_EQ(c.fixed_quantum, Duration(2500ms));
  EXPECT_EQ(c.quota_window, Duration(500ms));
  EXPECT_DOUBLE_EQ(c.reserve_fraction, 0.05);
  EXPECT_DOUBLE_EQ(c.quantum_swap_multiple, 3);
  EXPECT_EQ(c.revoke_grace, Duration(1s));
  EXPECT_EQ(scheduler_.config().capacity.all, 24ull << 30);
  // null restores a knob's default.
  r = call(R"({"cmd":"set-policy","quantum":null,"capacity":null})");
  ASSERT_EQ(r.find("ok")->as_bool(), true) << r.dump();
  EXPECT_FALSE(scheduler_.config().policy.fixed_quantum.has_value());
  EXPECT_FALSE(scheduler_.config().capacity.all.has_value());
}

TEST_F(ControlApiTest, ExplainStatsAndVersion) {
  const ClientId a = add();
  Json r = call(R"({"cmd":"explain","client":)" + std::to_string(a) + "}");
  ASSERT_EQ(r.find("ok")->as_bool(), true) << r.dump();
  EXPECT_EQ(*r.find("gpu")->as_string(), "GPU-1");
  EXPECT_EQ(*r.find("state")->as_string(), "idle");
  EXPECT_TRUE(r.find("explanation")->is_string());

  stats_.count_in(protocol::MessageType::kRequest);
  stats_.decision_latency.record(20us);
  r = call(R"({"cmd":"stats","reset":true})");
  ASSERT_EQ(r.find("ok")->as_bool(), true) << r.dump();
  EXPECT_EQ(r.find("frames_in")->find("request")->as_int64(), 1);
  EXPECT_EQ(r.find("decision_latency_us")->find("count")->as_int64(), 1);
  EXPECT_NEAR(*r.find("decision_latency_us")->find("p50")->as_double(), 20, 1);
  r = call(R"({"cmd":"stats"})");
  EXPECT_EQ(r.find("frames_in")->find("request")->as_int64(), 0);
  // Every message type has its counter, the newest included.
  for (std::size_t t = 1; t <= std::variant_size_v<protocol::Message>; ++t) {
    stats_.count_out(static_cast<protocol::MessageType>(t));
  }
  r = call(R"({"cmd":"stats"})");
  EXPECT_EQ(r.find("frames_out")->find("room")->as_int64(), 1) << r.dump();
  EXPECT_EQ(r.find("frames_out")->find("contended")->as_int64(), 1) << r.dump();
  EXPECT_EQ(r.find("frames_out_total")->as_int64(),
            static_cast<std::int64_t>(std::variant_size_v<protocol::Message>));

  r = call(R"({"cmd":"version"})");
  EXPECT_EQ(r.find("ok")->as_bool(), true);
  EXPECT_EQ(r.find("protocol")->find("max")->as_int64(), protocol::kMaxVersion);
}

// What the scheduler answers is what the clients' typed decoder reads: every command's answer
// decodes as the answer type its request expects, and a refusal as a refusal.
TEST_F(ControlApiTest, EveryAnswerDecodesAsTheTypeItsRequestExpects) {
  const ClientId a = add(kPodA);
  control::SetLimitsRequest limits;
  limits.selector.pod_uid = kPodA;
  limits.change.core = control::FieldChange{control::FieldChange::Op::kSet, 30};
  control::SetPolicyRequest policy;
  policy.settings = {{"quantum", std::string("2")}};
  control::SetGpusRequest gpus;
  gpus.gpus = {GpuInfo{"GPU-2", 1, 16ull << 30}};
  const std::vector<control::Request> requests = {control::StatusRequest{},
                                                  limits,
                                                  control::ForgetPodRequest{kPodA},
                                                  policy,
                                                  gpus,
                                                  control::SyncRequest{},
                                                  control::ExplainRequest{a},
                                                  control::StatsRequest{},
                                                  control::VersionRequest{}};
  for (const control::Request& request : requests) {
    const Json response = call(control::encode(request).dump());
    std::visit(
        [&](const auto& r) {
          using Answer = control::AnswerOf<std::decay_t<decltype(r)>>;
          auto reply = control::decode_reply<Answer>(response);
          ASSERT_TRUE(reply.ok()) << response.dump() << ": " << reply.error().message;
          EXPECT_FALSE(reply.value().refused()) << response.dump();
          // Encoding the typed answer gives back what the scheduler wrote.
          if (!reply.value().refused()) {
            EXPECT_EQ(control::encode(reply.value().answer()).dump(), response.dump());
          }
        },
        request);
  }
  auto explained = control::decode_reply<control::ExplainAnswer>(
      call(R"({"cmd":"explain","client":)" + std::to_string(a) + "}"));
  ASSERT_TRUE(explained.ok());
  EXPECT_EQ(explained.value().answer().client, a);
  EXPECT_EQ(explained.value().answer().gpu, "GPU-1");
  auto refused =
      control::decode_reply<control::ExplainAnswer>(call(R"({"cmd":"explain","client":999})"));
  ASSERT_TRUE(refused.ok());
  ASSERT_TRUE(refused.value().refused());
  EXPECT_FALSE(refused.value().refusal().empty());
}

}  // namespace
}  // namespace nvshare::scheduler
