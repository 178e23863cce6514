// The pure parts of the pod watcher: pod objects and annotations, the watch stream, the ledger of
// desired and pushed limits, and kubeconfig / in-cluster credentials.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "podwatcher/kube_credentials.h"
#include "podwatcher/limits_ledger.h"
#include "podwatcher/pod_alerts.h"
#include "podwatcher/pod_limits.h"
#include "podwatcher/watch_stream.h"

namespace nvshare::podwatcher {
namespace {

// A JSON document written as text (the tests' pods are short enough to read that way).
Json doc(const std::string& text) {
  auto parsed = parse_json(text);
  EXPECT_TRUE(parsed.ok()) << text;
  return parsed.ok() ? std::move(parsed).value() : Json();
}

Json pod_json(const std::string& annotations, const std::string& resources,
              const std::string& phase = "Running") {
  std::string text = R"({"metadata":{"uid":"u1","name":"p","namespace":"ml","resourceVersion":"7")";
  if (!annotations.empty()) text += R"(,"annotations":)" + annotations;
  text += R"(},"spec":{"nodeName":"n1","containers":[{"name":"c","resources":)" + resources +
          R"(}]},"status":{"phase":")" + phase + R"("}})";
  return doc(text);
}

const std::string kManaged = R"({"limits":{"nvshare.com/gpu":"1"}})";

TEST(PodLimits, ParsesTheMembersTheWatcherUses) {
  auto pod =
      parse_pod(pod_json(R"({"nvshare.com/gpu-memory-limit":"4Gi"})", kManaged), "nvshare.com/gpu");
  ASSERT_TRUE(pod.ok()) << pod.error().message;
  EXPECT_EQ(pod.value().uid, "u1");
  EXPECT_EQ(pod.value().namespace_name, "ml");
  EXPECT_EQ(pod.value().name, "p");
  EXPECT_EQ(pod.value().node_name, "n1");
  EXPECT_EQ(pod.value().resource_version, "7");
  EXPECT_TRUE(pod.value().requests_resource);
  EXPECT_EQ(pod.value().memory_annotation, "4Gi");
  EXPECT_FALSE(pod.value().core_annotation.has_value());
  EXPECT_FALSE(pod.value().finished());
}

TEST(PodLimits, ResourceCountsInLimitsRequestsAndInitContainers) {
  EXPECT_TRUE(parse_pod(pod_json("", R"({"requests":{"nvshare.com/gpu":"1"}})"), "nvshare.com/gpu")
                  .value()
                  .requests_resource);
  EXPECT_FALSE(parse_pod(pod_json("", R"({"limits":{"nvidia.com/gpu":"1"}})"), "nvshare.com/gpu")
                   .value()
                   .requests_resource);
  EXPECT_TRUE(parse_pod(pod_json("", R"({"limits":{"example.com/vgpu":"1"}})"), "example.com/vgpu")
                  .value()
                  .requests_resource);
  const Json init = doc(R"({"metadata":{"uid":"u1"},"spec":{"containers":[{"resources":{}}],)"
                        R"("initContainers":[{"resources":)" +
                        kManaged + "}]}}");
  EXPECT_TRUE(parse_pod(init, "nvshare.com/gpu").value().requests_resource);
}

TEST(PodLimits, RejectsObjectsWithoutUid) {
  EXPECT_FALSE(parse_pod(Json::array(), "nvshare.com/gpu").ok());
  EXPECT_FALSE(parse_pod(doc(R"({"metadata":{"name":"x"}})"), "nvshare.com/gpu").ok());
}

TEST(PodLimits, FinishedPhases) {
  EXPECT_TRUE(parse_pod(pod_json("", kManaged, "Succeeded"), "nvshare.com/gpu").value().finished());
  EXPECT_TRUE(parse_pod(pod_json("", kManaged, "Failed"), "nvshare.com/gpu").value().finished());
  EXPECT_FALSE(parse_pod(pod_json("", kManaged, "Pending"), "nvshare.com/gpu").value().finished());
}

PodView view(std::optional<std::string> memory, std::optional<std::string> core) {
  PodView pod;
  pod.uid = "u1";
  pod.memory_annotation = std::move(memory);
  pod.core_annotation = std::move(core);
  return pod;
}

TEST(DecideLimits, ValidAnnotationsSetBothFields) {
  auto decision = decide_limits(view("4Gi", "30%"), PodLimits{});
  EXPECT_EQ(decision.limits.memory_bytes, 4ull << 30);
  EXPECT_EQ(decision.limits.core_percent, 30);
  EXPECT_TRUE(decision.problems.empty());
  EXPECT_EQ(decide_limits(view("512Mi", "100"), {}).limits.core_percent, 100);
}

TEST(DecideLimits, AbsentAnnotationsSetNothing) {
  auto decision = decide_limits(view(std::nullopt, std::nullopt),
                                PodLimits{1024, 50, std::nullopt, std::nullopt});
  EXPECT_EQ(decision.limits, PodLimits{});
  EXPECT_TRUE(decision.problems.empty());
}

TEST(DecideLimits, InvalidAnnotationsKeepThePreviousValueAndSayWhy) {
  const PodLimits previous{4ull << 30, 30, std::nullopt, std::nullopt};
  auto decision = decide_limits(view("4GB", "150"), previous);
  EXPECT_EQ(decision.limits, previous);
  ASSERT_EQ(decision.problems.size(), 2u);
  EXPECT_EQ(decision.problems[0].annotation, "nvshare.com/gpu-memory-limit");
  EXPECT_EQ(decision.problems[0].value, "4GB");
  EXPECT_NE(decision.problems[0].message.find("\"4GB\""), std::string::npos);
  EXPECT_NE(decision.problems[0].message.find("4Gi"), std::string::npos);  // the kept limit
  EXPECT_EQ(decision.problems[1].annotation, "nvshare.com/gpu-core-limit");
  EXPECT_EQ(decision.problems[1].value, "150");
  EXPECT_NE(decision.problems[1].message.find("30%"), std::string::npos);

  // Without a previous limit, nothing is set.
  auto fresh = decide_limits(view("lots", "0"), PodLimits{});
  EXPECT_EQ(fresh.limits, PodLimits{});
  EXPECT_EQ(fresh.problems.size(), 2u);
}

TEST(DecideLimits, TheMemoryModeAnnotationSetsTheModeOrKeepsThePreviousOne) {
  PodView pod = view(std::nullopt, std::nullopt);
  pod.memory_mode_annotation = "unified";
  auto decision = decide_limits(pod, PodLimits{});
  EXPECT_EQ(decision.limits.memory_mode, MemoryMode::kUnified);
  EXPECT_TRUE(decision.problems.empty());
  pod.memory_mode_annotation = "paged";
  PodLimits previous;
  previous.memory_mode = MemoryMode::kPlain;
  decision = decide_limits(pod, previous);
  EXPECT_EQ(decision.limits.memory_mode, MemoryMode::kPlain);
  ASSERT_EQ(decision.problems.size(), 1u);
  EXPECT_EQ(decision.problems[0].annotation, "nvshare.com/gpu-memory-mode");
  EXPECT_NE(decision.problems[0].message.find("keeping the previous mode (plain)"),
            std::string::npos)
      << decision.problems[0].message;
}

TEST(LimitsLedger, AChangedMemoryModeIsPushedAlone) {
  LimitsLedger ledger;
  PodLimits limits{1ull << 30, std::nullopt, std::nullopt, std::nullopt};
  ledger.set_desired("u1", "ml", "p", limits);
  ledger.mark_done(*ledger.next_command());
  limits.memory_mode = MemoryMode::kUnified;
  ledger.set_desired("u1", "ml", "p", limits);
  auto next = ledger.next_command();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(control::encode(next->to_request()).dump(),
            R"({"cmd":"set-limits","selector":{"pod_uid":"u1","namespace":"ml","name":"p"},)"
            R"("memory_mode":"unified"})");
  ledger.mark_done(*next);
  EXPECT_FALSE(ledger.next_command().has_value());
}

TEST(DecideLimits, ZeroMemoryIsInvalid) {
  auto decision = decide_limits(view("0", std::nullopt),
                                PodLimits{1 << 20, std::nullopt, std::nullopt, std::nullopt});
  EXPECT_EQ(decision.limits.memory_bytes, 1u << 20);
  ASSERT_EQ(decision.problems.size(), 1u);
  EXPECT_NE(decision.problems[0].reason.find("greater than zero"), std::string::npos);
}

TEST(DecideLimits, OneInvalidFieldLeavesTheOtherValid) {
  auto decision =
      decide_limits(view("2Gi", "abc"), PodLimits{1 << 20, 40, std::nullopt, std::nullopt});
  EXPECT_EQ(decision.limits.memory_bytes, 2ull << 30);
  EXPECT_EQ(decision.limits.core_percent, 40);
  EXPECT_EQ(decision.problems.size(), 1u);
}

// nvshare.com/gpu-priority: a class word sets the pod's class; anything else keeps the previous
// class and says why; no annotation sets none (normal).
TEST(DecideLimits, PriorityAnnotation) {
  PodView pod = view(std::nullopt, std::nullopt);
  pod.priority_annotation = "high";
  EXPECT_EQ(decide_limits(pod, {}).limits.priority, Priority::kHigh);
  pod.priority_annotation = "urgent";
  PodLimits previous;
  previous.priority = Priority::kLow;
  const LimitsDecision bad = decide_limits(pod, previous);
  EXPECT_EQ(bad.limits.priority, Priority::kLow);
  ASSERT_EQ(bad.problems.size(), 1u);
  EXPECT_EQ(bad.problems[0].message,
            "invalid nvshare.com/gpu-priority \"urgent\": not one of `high`, `normal`, `low`; "
            "keeping the previous class (low)");
  pod.priority_annotation.reset();
  EXPECT_EQ(decide_limits(pod, previous).limits.priority, std::nullopt);
}

// The class travels to the scheduler with the pod's other limits, and only when it changes.
TEST(LimitsLedger, PriorityIsPushedWhenItChanges) {
  LimitsLedger ledger;
  PodLimits limits;
  limits.priority = Priority::kLow;
  ledger.set_desired("u1", "ml", "p", limits);
  auto first = ledger.next_command();
  ASSERT_TRUE(first.has_value());
  EXPECT_NE(control::encode(first->to_request()).dump().find(R"("priority":"low")"),
            std::string::npos);
  ledger.mark_done(*first);
  EXPECT_FALSE(ledger.next_command().has_value());
  limits.priority = Priority::kHigh;
  ledger.set_desired("u1", "ml", "p", limits);
  auto second = ledger.next_command();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(
      control::encode(second->to_request()).dump(),
      R"({"cmd":"set-limits","selector":{"pod_uid":"u1","namespace":"ml","name":"p"},"priority":"high"})");
}

TEST(LineSplitter, JoinsPiecesAndSplitsLines) {
  LineSplitter splitter;
  std::vector<std::string> lines;
  auto collect = [&](std::string_view line) {
    lines.emplace_back(line);
    return true;
  };
  ASSERT_TRUE(splitter.feed("{\"a\":", collect).ok());
  EXPECT_TRUE(lines.empty());
  ASSERT_TRUE(splitter.feed("1}\n{\"b\":2}\r\n\n{\"c\"", collect).ok());
  ASSERT_TRUE(splitter.feed(":3}\n", collect).ok());
  EXPECT_EQ(lines, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "{\"c\":3}"}));
  EXPECT_EQ(splitter.pending(), 0u);
}

TEST(LineSplitter, StopsWhenAskedAndRefusesHugeLines) {
  LineSplitter splitter(8);
  int seen = 0;
  ASSERT_TRUE(splitter.feed("a\nb\nc\n", [&](std::string_view) { return ++seen < 2; }).ok());
  EXPECT_EQ(seen, 2);
  EXPECT_FALSE(splitter.feed("0123456789", [](std::string_view) { return true; }).ok());
  LineSplitter other(8);
  EXPECT_FALSE(other.feed("0123\n45678901234\n", [](std::string_view) { return true; }).ok());
}

TEST(WatchEvents, ParsesEachType) {
  auto added = parse_watch_event(
      R"({"type":"ADDED","object":{"kind":"Pod","metadata":{"uid":"u","resourceVersion":"12"}}})");
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(added.value().type, WatchEvent::Type::kAdded);
  EXPECT_EQ(added.value().resource_version, "12");
  EXPECT_EQ(parse_watch_event(R"({"type":"MODIFIED","object":{}})").value().type,
            WatchEvent::Type::kModified);
  EXPECT_EQ(parse_watch_event(R"({"type":"DELETED","object":{}})").value().type,
            WatchEvent::Type::kDeleted);
  auto bookmark = parse_watch_event(
      R"({"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"99"}}})");
  EXPECT_EQ(bookmark.value().type, WatchEvent::Type::kBookmark);
  EXPECT_EQ(bookmark.value().resource_version, "99");
  auto error = parse_watch_event(
      R"x({"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired",)x"
      R"x("message":"too old resource version: 5 (10)"}})x");
  EXPECT_EQ(error.value().type, WatchEvent::Type::kError);
  EXPECT_EQ(error.value().error_code, 410);
  EXPECT_EQ(error.value().error_message, "too old resource version: 5 (10)");
}

TEST(WatchEvents, RejectsMalformedLines) {
  EXPECT_FALSE(parse_watch_event("not json").ok());
  EXPECT_FALSE(parse_watch_event("[]").ok());
  EXPECT_FALSE(parse_watch_event(R"({"object":{}})").ok());
  EXPECT_FALSE(parse_watch_event(R"({"type":"ADDED"})").ok());
  EXPECT_FALSE(parse_watch_event(R"({"type":"RENAMED","object":{}})").ok());
}

TEST(PodListParse, NeedsAResourceVersion) {
  auto list = parse_pod_list(
      R"({"kind":"PodList","metadata":{"resourceVersion":"42"},"items":[{"metadata":{"uid":"a"}}]})");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list.value().resource_version, "42");
  EXPECT_EQ(list.value().items.size(), 1u);
  EXPECT_TRUE(parse_pod_list(R"({"metadata":{"resourceVersion":"1"},"items":null})").ok());
  EXPECT_FALSE(parse_pod_list(R"({"items":[]})").ok());
  EXPECT_FALSE(parse_pod_list("{").ok());
}

TEST(LimitsLedger, FirstPushCarriesBothFieldsThenOnlyChanges) {
  LimitsLedger ledger;
  EXPECT_FALSE(ledger.next_command().has_value());
  ledger.set_desired("u1", "ml", "p",
                     PodLimits{4ull << 30, std::nullopt, std::nullopt, std::nullopt});
  auto first = ledger.next_command();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(
      control::encode(first->to_request()).dump(),
      R"({"cmd":"set-limits","selector":{"pod_uid":"u1","namespace":"ml","name":"p"},)"
      R"("memory":4294967296,"core":"inherit","memory_mode":"inherit","priority":"inherit"})");
  ledger.mark_done(*first);
  EXPECT_FALSE(ledger.next_command().has_value());

  ledger.set_desired("u1", "ml", "p", PodLimits{4ull << 30, 30, std::nullopt, std::nullopt});
  auto second = ledger.next_command();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(
      control::encode(second->to_request()).dump(),
      R"({"cmd":"set-limits","selector":{"pod_uid":"u1","namespace":"ml","name":"p"},"core":30})");
  ledger.mark_done(*second);

  // Removing the memory annotation: "inherit" (this layer no longer sets it).
  ledger.set_desired("u1", "ml", "p", PodLimits{std::nullopt, 30, std::nullopt, std::nullopt});
  auto third = ledger.next_command();
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(
      control::encode(third->to_request()).dump(),
      R"({"cmd":"set-limits","selector":{"pod_uid":"u1","namespace":"ml","name":"p"},"memory":"inherit"})");
}

TEST(LimitsLedger, AChangeDuringAPushIsSentNext) {
  LimitsLedger ledger;
  ledger.set_desired("u1", "ml", "p", PodLimits{1 << 20, std::nullopt, std::nullopt, std::nullopt});
  auto in_flight = ledger.next_command();
  ledger.set_desired("u1", "ml", "p", PodLimits{2 << 20, std::nullopt, std::nullopt, std::nullopt});
  ledger.mark_done(*in_flight);
  auto next = ledger.next_command();
  ASSERT_TRUE(next.has_value());
  EXPECT_TRUE(next->send_memory);
  EXPECT_EQ(next->limits.memory_bytes, 2u << 20);
}

TEST(LimitsLedger, RemovedPodsAreForgottenOnlyWhenPushed) {
  LimitsLedger ledger;
  ledger.set_desired("never", "ml", "a", PodLimits{});
  ledger.remove("never");
  EXPECT_FALSE(ledger.next_command().has_value());

  ledger.set_desired("u1", "ml", "p", PodLimits{1 << 20, 50, std::nullopt, std::nullopt});
  ledger.mark_done(*ledger.next_command());
  EXPECT_EQ(ledger.memory_limits(), (std::map<std::string, std::uint64_t>{{"u1", 1u << 20}}));
  EXPECT_EQ(ledger.core_limits(), (std::map<std::string, int>{{"u1", 50}}));
  ledger.remove("u1");
  EXPECT_TRUE(ledger.memory_limits().empty());
  auto forget = ledger.next_command();
  ASSERT_TRUE(forget.has_value());
  EXPECT_EQ(control::encode(forget->to_request()).dump(), R"({"cmd":"forget-pod","pod_uid":"u1"})");
  ledger.mark_done(*forget);
  EXPECT_FALSE(ledger.next_command().has_value());
}

TEST(LimitsLedger, AllUnpushedSendsEverythingAgainAndDropsForgets) {
  LimitsLedger ledger;
  ledger.set_desired("a", "ml", "a", PodLimits{1 << 20, std::nullopt, std::nullopt, std::nullopt});
  ledger.set_desired("b", "ml", "b", PodLimits{std::nullopt, 20, std::nullopt, std::nullopt});
  for (auto command = ledger.next_command(); command; command = ledger.next_command()) {
    ledger.mark_done(*command);
  }
  ledger.remove("b");
  ledger.mark_all_unpushed();
  auto command = ledger.next_command();
  ASSERT_TRUE(command.has_value());
  EXPECT_EQ(command->pod_uid, "a");
  EXPECT_TRUE(command->send_memory && command->send_core);
  ledger.mark_done(*command);
  EXPECT_FALSE(ledger.next_command().has_value());
}

// ---- credentials ----

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/nvshare-pw-unit-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string path = path_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

constexpr const char* kKubeconfig = R"(apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
    server: https://10.0.0.1:6443/
  name: prod
- cluster:
    server: "http://127.0.0.1:8080"   # a comment
    insecure-skip-tls-verify: true
  name: dev
contexts:
- context:
    cluster: prod
    user: admin
  name: prod-admin
- name: dev-ctx
  context:
    cluster: dev
    user: 'dev user'
current-context: dev-ctx
preferences: {}
users:
- name: admin
  user:
    client-certificate: certs/admin.crt
    client-key: /abs/admin.key
- name: dev user
  user:
    token: abc123
)";

TEST(Kubeconfig, ParsesKubectlYaml) {
  auto parsed = parse_kubeconfig_text(kKubeconfig);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  const Json& config = parsed.value();
  const auto text_at = [](const Json* value) {
    return value != nullptr && value->is_string() ? *value->as_string() : std::string("<absent>");
  };
  const auto item = [](const Json* list, std::size_t i) {
    return list != nullptr && list->is_array() && i < list->as_array()->size()
               ? &list->as_array()->at(i)
               : nullptr;
  };
  EXPECT_EQ(text_at(config.find("current-context")), "dev-ctx");
  ASSERT_TRUE(config.find("clusters") != nullptr && config.find("clusters")->is_array());
  EXPECT_EQ(config.find("clusters")->as_array()->size(), 2u);
  const Json* second_cluster = item(config.find("clusters"), 1);
  ASSERT_NE(second_cluster, nullptr);
  EXPECT_EQ(text_at(second_cluster->find("cluster")->find("server")), "http://127.0.0.1:8080");
  const Json* second_context = item(config.find("contexts"), 1);
  ASSERT_NE(second_context, nullptr);
  EXPECT_EQ(text_at(second_context->find("context")->find("user")), "dev user");
  ASSERT_NE(config.find("preferences"), nullptr);
  EXPECT_TRUE(config.find("preferences")->is_object());

  auto credentials = kubeconfig_credentials(config, "/base");
  ASSERT_TRUE(credentials.ok()) << credentials.error().message;
  EXPECT_EQ(credentials.value().server, "http://127.0.0.1:8080");
  EXPECT_TRUE(credentials.value().insecure_skip_tls_verify);
  EXPECT_EQ(credentials.value().current_token().value(), "abc123");

  Json prod = config;
  prod.set("current-context", "prod-admin");
  auto admin = kubeconfig_credentials(prod, "/base");
  ASSERT_TRUE(admin.ok()) << admin.error().message;
  EXPECT_EQ(admin.value().server, "https://10.0.0.1:6443");
  EXPECT_EQ(admin.value().ca_pem, "-----BEGIN CERTIFICATE-----\n");
  EXPECT_EQ(admin.value().client_cert_file, "/base/certs/admin.crt");
  EXPECT_EQ(admin.value().client_key_file, "/abs/admin.key");
  EXPECT_FALSE(admin.value().insecure_skip_tls_verify);
}

TEST(Kubeconfig, ReportsWhatIsMissing) {
  Json missing = parse_kubeconfig_text(kKubeconfig).value();
  missing.set("current-context", "nope");
  auto error = kubeconfig_credentials(missing, "");
  ASSERT_FALSE(error.ok());
  EXPECT_NE(error.error().message.find("context \"nope\" not found"), std::string::npos);
  std::string exec_text = kKubeconfig;
  const std::string token_line = "    token: abc123\n";
  ASSERT_NE(exec_text.find(token_line), std::string::npos);
  exec_text.replace(exec_text.find(token_line), token_line.size(),
                    "    exec:\n      command: aws\n");
  auto exec = parse_kubeconfig_text(exec_text);
  ASSERT_TRUE(exec.ok()) << exec.error().message;
  auto unsupported = kubeconfig_credentials(exec.value(), "");
  ASSERT_FALSE(unsupported.ok());
  EXPECT_NE(unsupported.error().message.find("not supported"), std::string::npos);
  EXPECT_FALSE(parse_kubeconfig_text("a: b\n  c: d\n").ok());
  EXPECT_FALSE(parse_kubeconfig_text("key: |\n  block\n").ok());
  EXPECT_FALSE(load_kubeconfig("/nonexistent/kubeconfig").ok());
}

TEST(Kubeconfig, AcceptsJsonAndTokenFiles) {
  TempDir dir;
  dir.write("token", "first\n");
  const std::string path = dir.write(
      "config.json",
      R"({"current-context":"c","contexts":[{"name":"c","context":{"cluster":"k","user":"u"}}],)"
      R"("clusters":[{"name":"k","cluster":{"server":"http://127.0.0.1:1"}}],)"
      R"("users":[{"name":"u","user":{"tokenFile":"token"}}]})");
  auto credentials = load_kubeconfig(path);
  ASSERT_TRUE(credentials.ok()) << credentials.error().message;
  EXPECT_EQ(credentials.value().current_token().value(), "first");
  dir.write("token", "rotated\n");
  EXPECT_EQ(credentials.value().current_token().value(), "rotated");
}

TEST(InCluster, ReadsTheServiceAccountAndRereadsTheToken) {
  TempDir dir;
  dir.write("token", "sa-token-1");
  dir.write("ca.crt", "pem");
  auto credentials = in_cluster_credentials("10.96.0.1", "443", dir.path());
  ASSERT_TRUE(credentials.ok()) << credentials.error().message;
  EXPECT_EQ(credentials.value().server, "https://10.96.0.1:443");
  EXPECT_EQ(credentials.value().ca_file, dir.path() + "/ca.crt");
  EXPECT_EQ(credentials.value().current_token().value(), "sa-token-1");
  dir.write("token", "sa-token-2");
  EXPECT_EQ(credentials.value().current_token().value(), "sa-token-2");
  EXPECT_EQ(in_cluster_credentials("fd00::1", "443", dir.path()).value().server,
            "https://[fd00::1]:443");
  EXPECT_FALSE(in_cluster_credentials("10.96.0.1", "443", dir.path() + "/missing").ok());
}

TEST(InCluster, NeedsTheServiceEnvironment) {
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  ::unsetenv("KUBERNETES_SERVICE_PORT");
  auto credentials = in_cluster_credentials("", "", "/nonexistent");
  ASSERT_FALSE(credentials.ok());
  EXPECT_NE(credentials.error().message.find("KUBERNETES_SERVICE_HOST"), std::string::npos);
}

TEST(Base64, DecodesStandardAndUrlAlphabets) {
  EXPECT_EQ(decode_base64("aGVsbG8=").value(), "hello");
  EXPECT_EQ(decode_base64("aGVs\nbG8").value(), "hello");
  EXPECT_FALSE(decode_base64("a$b").ok());
}

// ---- alerts ---------------------------------------------------------------------------------

MonoTime at(int seconds) { return MonoTime{} + std::chrono::seconds(seconds); }

PodUsage usage(const std::string& uid, std::uint64_t refused, double quota_wait_s) {
  PodUsage u;
  u.pod_uid = uid;
  u.refused_allocations = refused;
  u.quota_wait_s = quota_wait_s;
  u.core_limit_percent = 30;
  return u;
}

TEST(PodAlerts, RefusedAllocationsRaiseOncePerRepeatInterval) {
  PodAlerts alerts(PodAlertsConfig{});  // 10 minutes between two of a kind
  EXPECT_TRUE(alerts.observe({usage("a", 0, 0)}, at(0)).empty());
  auto raised = alerts.observe({usage("a", 2, 0)}, at(10));
  ASSERT_EQ(raised.size(), 1u);
  EXPECT_EQ(raised[0].reason, kMemoryLimitReason);
  EXPECT_NE(raised[0].message.find("2 GPU memory allocation(s)"), std::string::npos);
  EXPECT_TRUE(alerts.observe({usage("a", 5, 0)}, at(20)).empty());  // within 10 minutes
  EXPECT_EQ(alerts.suppressed(), 1u);
  EXPECT_TRUE(alerts.observe({usage("a", 5, 0)}, at(700)).empty());  // nothing new
  raised = alerts.observe({usage("a", 6, 0)}, at(710));
  ASSERT_EQ(raised.size(), 1u);
  EXPECT_NE(raised[0].message.find("1 GPU memory"), std::string::npos) << raised[0].message;
  // A process left (the total fell): a new baseline, nothing raised.
  EXPECT_TRUE(alerts.observe({usage("a", 1, 0)}, at(720)).empty());
  // A pod seen for the first time with refusals already counted.
  raised = alerts.observe({usage("a", 1, 0), usage("b", 4, 0)}, at(730));
  ASSERT_EQ(raised.size(), 1u);
  EXPECT_EQ(raised[0].pod_uid, "b");
}

TEST(PodAlerts, ThrottledNeedsAWholeWindowMostlyWaiting) {
  PodAlertsConfig config;
  config.throttle_window = std::chrono::seconds(60);
  PodAlerts alerts(config);
  // 40% of the time waiting for the cap: never raised.
  for (int t = 0; t <= 120; t += 10)
    EXPECT_TRUE(alerts.observe({usage("a", 0, 0.4 * t)}, at(t)).empty());
  // From t = 120 on, 70% of the time: raised once a whole window waits half of it, not before.
  std::vector<PodAlert> raised;
  int when = -1;
  for (int t = 130; t <= 240 && raised.empty(); t += 10) {
    raised = alerts.observe({usage("a", 0, 48 + 0.7 * (t - 120))}, at(t));
    when = t;
  }
  ASSERT_EQ(raised.size(), 1u);
  EXPECT_EQ(raised[0].reason, kThrottledReason);
  // The first whole window waiting half the time: 80..140 s, 40 s at 40% and 20 s at 70%.
  EXPECT_EQ(when, 140);
  EXPECT_NE(raised[0].message.find("compute cap of 30%"), std::string::npos) << raised[0].message;
  // A pod gone from the status is forgotten; when it comes back it starts over.
  EXPECT_TRUE(alerts.observe({}, at(250)).empty());
  EXPECT_TRUE(alerts.observe({usage("a", 0, 500)}, at(260)).empty());
  EXPECT_TRUE(alerts.observe({usage("a", 0, 530)}, at(290)).empty());  // half a window
  EXPECT_EQ(alerts.observe({usage("a", 0, 560)}, at(320)).size(), 1u);
}

TEST(PodAlerts, StatusTotalsArePerPodAcrossGpus) {
  auto body = parse_json(R"({"gpus":[
    {"clients":[{"pod_uid":"a","refused_allocations":2,"waited_by_reason_ms":{"quota":1500},
                 "core_limit_percent":30,"memory_limit_bytes":4096},
                {"pod_uid":null,"refused_allocations":9},
                {"pod_uid":"b","refused_allocations":1,"waited_by_reason_ms":{"quota":"x"}}]},
    {"clients":[{"pod_uid":"a","refused_allocations":1,"waited_by_reason_ms":{"quota":500},
                 "core_limit_percent":30,"memory_limit_bytes":4096}]},
    {"clients":"not a list"}]})");
  ASSERT_TRUE(body.ok()) << body.error().message;
  const std::vector<PodUsage> pods = pod_usage_from_status(body.value());
  ASSERT_EQ(pods.size(), 2u);
  EXPECT_EQ(pods[0].pod_uid, "a");
  EXPECT_EQ(pods[0].refused_allocations, 3u);
  EXPECT_DOUBLE_EQ(pods[0].quota_wait_s, 2.0);
  EXPECT_EQ(pods[0].core_limit_percent, 30);
  EXPECT_EQ(pods[0].memory_limit_bytes, 4096u);
  EXPECT_EQ(pods[1].refused_allocations, 1u);
  EXPECT_DOUBLE_EQ(pods[1].quota_wait_s, 0.0);
  EXPECT_TRUE(pod_usage_from_status(Json()).empty());
}

}  // namespace
}  // namespace nvshare::podwatcher
