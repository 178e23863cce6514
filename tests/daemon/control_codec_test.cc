// The control protocol's one codec (src/control/requests.h, answers.h): every request and every
// answer survives a round trip, bad input is refused with the member named, and docs/control-api.md
// describes exactly the commands the codec knows.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "control/answers.h"
#include "control/requests.h"

namespace nvshare::control {
namespace {

using Op = FieldChange::Op;

std::vector<Request> examples() {
  SetLimitsRequest by_pod;
  by_pod.selector.pod_uid = "7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d";
  by_pod.selector.pod_namespace = "ml";
  by_pod.selector.pod_name = "trainer";
  by_pod.change = {FieldChange{Op::kSet, 4ull << 30}, FieldChange{Op::kInherit, 0}, FieldChange{},
                   FieldChange{}};
  SetLimitsRequest by_client;
  by_client.selector.client = 7;
  by_client.change.core = FieldChange{Op::kSet, 30};
  SetLimitsRequest mode;
  mode.selector.pod_uid = "u2";
  mode.change.memory_mode = FieldChange{Op::kSet, 2};  // unified
  SetLimitsRequest mode_inherited;
  mode_inherited.selector.client = 8;
  mode_inherited.change.memory_mode = FieldChange{Op::kInherit, 0};
  SetLimitsRequest no_limit;
  no_limit.selector.pid = 4242;
  no_limit.change = {FieldChange{Op::kSet, 0}, FieldChange{Op::kSet, 100}, FieldChange{},
                     FieldChange{}};
  SetPolicyRequest policy;
  policy.gpu = "GPU-a";
  policy.settings = {{"mode", std::string("exclusive")}, {"quantum", std::nullopt}};
  SetGpusRequest gpus;
  gpus.gpus = {GpuInfo{"GPU-a", 0, 80ull << 30}, GpuInfo{"GPU-b", 1, 16ull << 30}};
  return {StatusRequest{},
          by_pod,
          by_client,
          mode,
          mode_inherited,
          no_limit,
          ForgetPodRequest{"u1"},
          policy,
          gpus,
          SyncRequest{},
          ExplainRequest{12},
          StatsRequest{true},
          StatsRequest{},
          VersionRequest{}};
}

TEST(ControlCodec, EveryRequestSurvivesARoundTrip) {
  for (const Request& request : examples()) {
    const Json encoded = encode(request);
    auto decoded = decode(encoded);
    ASSERT_TRUE(decoded) << encoded.dump() << ": " << decoded.error().message;
    EXPECT_EQ(decoded.value(), request) << encoded.dump();
    EXPECT_EQ(command_name(decoded.value()), *encoded.find("cmd")->as_string());
  }
}

template <typename A>
void expect_round_trip(const A& answer) {
  const Json encoded = encode(answer);
  auto decoded = decode_reply<A>(encoded);
  ASSERT_TRUE(decoded.ok()) << encoded.dump() << ": " << decoded.error().message;
  ASSERT_FALSE(decoded.value().refused()) << encoded.dump();
  EXPECT_EQ(decoded.value().answer(), answer) << encoded.dump();
  // Any answer may be a refusal instead.
  auto refused = decode_reply<A>(encode(Refusal{"no such client 9"}));
  ASSERT_TRUE(refused.ok());
  ASSERT_TRUE(refused.value().refused());
  EXPECT_EQ(refused.value().refusal(), "no such client 9");
}

TEST(ControlCodec, EveryAnswerSurvivesARoundTrip) {
  expect_round_trip(Ack{});
  expect_round_trip(SetLimitsAnswer{{3, 9}, {"7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d"}});
  expect_round_trip(SetLimitsAnswer{});
  expect_round_trip(SetPolicyAnswer{{"GPU-a", "GPU-b"}});
  expect_round_trip(SetGpusAnswer{2});
  expect_round_trip(ExplainAnswer{7, "GPU-a", "waiting", "memory", "waits for 3 GiB"});
  expect_round_trip(ExplainAnswer{7, "GPU-a", "running", std::nullopt, "holds the GPU"});
  expect_round_trip(VersionAnswer{"1.2.3", {1, 2}});
  StatsAnswer stats;
  stats.frames_in = {{"hello", 4}, {"request", 10}};
  stats.frames_out = {{"grant", 9}};
  stats.frames_in_total = 14;
  stats.frames_out_total = 9;
  stats.bytes_in = 1000;
  stats.bytes_out = 800;
  stats.sessions = {{"open", 2}, {"closed_slow", 1}};
  stats.control_requests = 5;
  stats.control_refused = 1;
  stats.decision_latency_us = {3, 1.5, 1.25, 2, 3.5, 3.5, 4};
  expect_round_trip(stats);
  StatusAnswer status;
  status.scheduler = {
      "1.2.3", 4242, 12.5, 3, 2, true, {"GPU-1", "GPU-2"}, Json::Object{{"mode", "auto"}}};
  status.body = Json::Object{{"gpus", Json::array()}, {"pods", Json::array()}};
  expect_round_trip(status);
}

TEST(ControlCodec, AnswersThatAreNotWhatTheRequestExpectsAreErrorsNamingTheMember) {
  const auto error_of = [](const std::string& text) {
    auto reply = decode_reply<SetLimitsAnswer>(parse_json(text).value());
    return reply.ok() ? std::string("decoded") : reply.error().message;
  };
  EXPECT_NE(error_of(R"({"clients":[],"pods":[]})").find("\"ok\""), std::string::npos);
  EXPECT_NE(error_of(R"({"ok":false})").find("\"error\""), std::string::npos);
  EXPECT_NE(error_of(R"({"ok":true,"pods":[]})").find("\"clients\""), std::string::npos);
  EXPECT_NE(error_of(R"({"ok":true,"clients":[-1],"pods":[]})").find("\"clients\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"ok":true,"clients":[],"pods":[3]})").find("\"pods\""), std::string::npos);
  std::string stats_text = encode(StatsAnswer{}).dump();
  const std::string count = R"("count":0,)";
  ASSERT_NE(stats_text.find(count), std::string::npos) << stats_text;
  stats_text.erase(stats_text.find(count), count.size());
  auto stats = decode_reply<StatsAnswer>(parse_json(stats_text).value());
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.error().message.find(R"("decision_latency_us"."count" is missing)"),
            std::string::npos)
      << stats.error().message;
  // Members an answer does not know are ignored: a newer scheduler may say more.
  auto newer =
      decode_reply<SetGpusAnswer>(parse_json(R"({"ok":true,"gpus":2,"added":["GPU-c"]})").value());
  ASSERT_TRUE(newer.ok()) << newer.error().message;
  EXPECT_EQ(newer.value().answer().gpus, 2u);
}

TEST(ControlCodec, TheSpellingsPeopleWriteDecodeToTheSameChange) {
  const auto change_of = [](const std::string& json) {
    auto request = decode(parse_json(json).value());
    EXPECT_TRUE(request) << json << ": " << (request ? "" : request.error().message);
    return request ? std::get<SetLimitsRequest>(request.value()).change : LimitsChange{};
  };
  const std::string selector = R"("selector":{"client":1})";
  EXPECT_EQ(change_of(R"({"cmd":"set-limits",)" + selector + R"(,"memory":"4Gi"})").memory,
            (FieldChange{Op::kSet, 4ull << 30}));
  EXPECT_EQ(change_of(R"({"cmd":"set-limits",)" + selector + R"(,"memory":4294967296})").memory,
            (FieldChange{Op::kSet, 4ull << 30}));
  EXPECT_EQ(change_of(R"({"cmd":"set-limits",)" + selector + R"(,"memory":"none"})").memory,
            (FieldChange{Op::kSet, 0}));
  EXPECT_EQ(change_of(R"({"cmd":"set-limits",)" + selector + R"(,"memory":null})").memory,
            (FieldChange{Op::kSet, 0}));
  EXPECT_EQ(change_of(R"({"cmd":"set-limits",)" + selector + R"(,"core":"30%"})").core,
            (FieldChange{Op::kSet, 30}));
  EXPECT_EQ(change_of(R"({"cmd":"set-limits",)" + selector + R"(,"core":"inherit"})").core,
            (FieldChange{Op::kInherit, 0}));
  EXPECT_EQ(
      change_of(R"({"cmd":"set-limits",)" + selector + R"(,"memory_mode":"plain"})").memory_mode,
      (FieldChange{Op::kSet, 3}));
}

TEST(ControlCodec, BadRequestsAreRefusedWithTheMemberNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {R"([1])", "a JSON object"},
      {R"({"cmd":7})", "missing \"cmd\""},
      {R"({"cmd":"launch"})", "unknown cmd \"launch\""},
      {R"({"cmd":"status","verbose":true})", "unknown member \"verbose\" in status"},
      {R"({"cmd":"set-limits","selector":{"client":1},"cores":30})", "unknown member \"cores\""},
      {R"({"cmd":"set-limits","selector":{"client":1},"memory":0})", "memory 0 is not a limit"},
      {R"({"cmd":"set-limits","selector":{"client":1},"core":101})", "core must be"},
      {R"({"cmd":"set-limits","selector":{"client":1}})", "changes nothing"},
      {R"({"cmd":"set-limits","selector":{"client":1},"memory_mode":"paged"})",
       "memory_mode must be"},
      {R"({"cmd":"set-limits","selector":{"client":1},"memory_mode":2})", "memory_mode must be"},
      {R"({"cmd":"set-limits","memory":"1Gi"})", "needs a \"selector\""},
      {R"({"cmd":"set-limits","selector":{"client":0},"memory":"1Gi"})", "selector.client"},
      {R"({"cmd":"forget-pod"})", "needs \"pod_uid\""},
      {R"({"cmd":"set-gpus","gpus":[{"uuid":"GPU-a"}]})", "memory_bytes"},
      {R"({"cmd":"set-policy"})", "changes nothing"},
      {R"({"cmd":"set-policy","mode":[1]})", "mode must be"},
      {R"({"cmd":"explain","client":-1})", "client must be"},
      {R"({"cmd":"stats","reset":"yes"})", "reset must be"},
  };
  for (const auto& [text, message] : cases) {
    auto json = parse_json(text);
    ASSERT_TRUE(json) << text;
    auto request = decode(json.value());
    ASSERT_FALSE(request) << text;
    EXPECT_NE(request.error().message.find(message), std::string::npos)
        << text << ": " << request.error().message;
  }
}

TEST(ControlCodec, TheDocumentDescribesExactlyTheCommandsTheCodecKnows) {
  std::ifstream file(NVSHARE_CONTROL_API_DOC);
  ASSERT_TRUE(file) << NVSHARE_CONTROL_API_DOC;
  std::stringstream text;
  text << file.rdbuf();
  const std::string doc = text.str();
  std::set<std::string> documented;
  const std::string commands = doc.substr(doc.find("## Commands"));
  const std::regex heading(R"(\n### ([a-z-]+)\n)");
  for (auto it = std::sregex_iterator(commands.begin(), commands.end(), heading);
       it != std::sregex_iterator(); ++it) {
    documented.insert((*it)[1]);
  }
  std::set<std::string> known;
  for (std::string_view name : command_names()) known.insert(std::string(name));
  EXPECT_EQ(documented, known);
}

}  // namespace
}  // namespace nvshare::control
