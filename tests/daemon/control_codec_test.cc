// The control protocol's one codec (src/control/requests.h): every request survives a round trip,
// bad input is refused with the member named, and docs/control-api.md describes exactly the
// commands the codec knows.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "control/requests.h"

namespace nvshare::control {
namespace {

using Op = FieldChange::Op;

std::vector<Request> examples() {
  SetLimitsRequest by_pod;
  by_pod.selector.pod_uid = "7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d";
  by_pod.selector.pod_namespace = "ml";
  by_pod.selector.pod_name = "trainer";
  by_pod.change = {FieldChange{Op::kSet, 4ull << 30}, FieldChange{Op::kInherit, 0}};
  SetLimitsRequest by_client;
  by_client.selector.client = 7;
  by_client.change.core = FieldChange{Op::kSet, 30};
  SetLimitsRequest no_limit;
  no_limit.selector.pid = 4242;
  no_limit.change = {FieldChange{Op::kSet, 0}, FieldChange{Op::kSet, 100}};
  SetPolicyRequest policy;
  policy.gpu = "GPU-a";
  policy.settings = {{"mode", std::string("exclusive")}, {"quantum", std::nullopt}};
  SetGpusRequest gpus;
  gpus.gpus = {GpuInfo{"GPU-a", 0, 80ull << 30}, GpuInfo{"GPU-b", 1, 16ull << 30}};
  return {StatusRequest{},
          by_pod,
          by_client,
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
