// The client's knob table: defaults, valid and invalid values, and docs/configuration.md.
#include "client/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "client/device_link.h"
#include "common/default_paths.h"

namespace nvshare::client {
namespace {

using namespace std::chrono_literals;

ParsedClientConfig parse(const std::map<std::string, std::string>& env) {
  return parse_client_config([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(ClientConfig, DefaultsAreTheDocumentedOnes) {
  const ParsedClientConfig parsed = parse({});
  EXPECT_TRUE(parsed.warnings.empty());
  const ClientConfig& c = parsed.config;
  EXPECT_TRUE(c.enabled);
  EXPECT_EQ(c.socket_path, kDefaultSocketPath);
  EXPECT_EQ(c.idle_release, 100ms);
  EXPECT_EQ(c.drain_bound, 50ms);
  EXPECT_EQ(c.declared_limits, protocol::Limits{});
  EXPECT_EQ(c.pod_uid, "");
  EXPECT_EQ(c.memory_mode, std::nullopt);  // the scheduler's word, else device
  EXPECT_EQ(c.reconnect_max, 2000ms);
  EXPECT_EQ(c.register_wait, 1000ms);
  EXPECT_EQ(c.register_wait, kDefaultRegisterWait);
  EXPECT_EQ(c.log_level, LogLevel::kInfo);
}

TEST(ClientConfig, EveryDefaultTextParses) {
  for (const ClientKnob& knob : client_knobs()) {
    if (knob.default_value.empty()) continue;
    ClientConfig config;
    EXPECT_TRUE(knob.apply(knob.default_value, config).ok()) << knob.name;
  }
}

TEST(ClientConfig, EnvironmentNamesDeriveFromKnobNames) {
  std::vector<std::string> names;
  for (const ClientKnob& knob : client_knobs()) names.push_back(client_env_name(knob));
  const std::vector<std::string> expected = {
      "NVSHARE_ENABLE",           "NVSHARE_SOCKET",           "NVSHARE_IDLE_RELEASE_MS",
      "NVSHARE_DRAIN_BOUND_MS",   "NVSHARE_MEMORY_LIMIT",     "NVSHARE_CORE_LIMIT",
      "NVSHARE_POD_UID",          "NVSHARE_MEMORY_MODE",      "NVSHARE_PRIORITY",
      "NVSHARE_RECONNECT_MAX_MS", "NVSHARE_REGISTER_WAIT_MS", "NVSHARE_LOG_LEVEL",
      "NVSHARE_TRACE_FILE"};
  EXPECT_EQ(names, expected);
  ASSERT_NE(find_client_knob("core-limit"), nullptr);
  EXPECT_EQ(find_client_knob("cores"), nullptr);
}

// NVSHARE_PRIORITY: a class word becomes the declared limits' class; anything else is refused.
TEST(ClientConfig, PriorityIsDeclared) {
  EXPECT_EQ(parse({{"NVSHARE_PRIORITY", "low"}}).config.declared_limits.priority,
            protocol::priority_code(Priority::kLow));
  EXPECT_EQ(parse({}).config.declared_limits.priority, protocol::Limits::kNoPriority);
  const ClientKnob* knob = find_client_knob("priority");
  ASSERT_NE(knob, nullptr);
  ClientConfig config;
  EXPECT_FALSE(knob->apply("urgent", config).ok());
  EXPECT_EQ(config.declared_limits.priority, protocol::Limits::kNoPriority);
}

TEST(ClientConfig, ValidValuesAreApplied) {
  const ParsedClientConfig parsed = parse({{"NVSHARE_ENABLE", "0"},
                                           {"NVSHARE_SOCKET", "/run/x/s.sock"},
                                           {"NVSHARE_IDLE_RELEASE_MS", "250"},
                                           {"NVSHARE_DRAIN_BOUND_MS", "20"},
                                           {"NVSHARE_MEMORY_LIMIT", "4Gi"},
                                           {"NVSHARE_CORE_LIMIT", "30%"},
                                           {"NVSHARE_POD_UID", "0f1e2d3c-aaaa"},
                                           {"NVSHARE_MEMORY_MODE", "unified"},
                                           {"NVSHARE_RECONNECT_MAX_MS", "500"},
                                           {"NVSHARE_REGISTER_WAIT_MS", "0"},
                                           {"NVSHARE_LOG_LEVEL", "DEBUG"}});
  EXPECT_TRUE(parsed.warnings.empty()) << parsed.warnings.front();
  const ClientConfig& c = parsed.config;
  EXPECT_FALSE(c.enabled);
  EXPECT_EQ(c.socket_path, "/run/x/s.sock");
  EXPECT_EQ(c.idle_release, 250ms);
  EXPECT_EQ(c.drain_bound, 20ms);
  EXPECT_EQ(c.declared_limits.memory_bytes, 4ull << 30);
  EXPECT_EQ(c.declared_limits.core_percent, 30);
  EXPECT_EQ(c.pod_uid, "0f1e2d3c-aaaa");
  EXPECT_EQ(c.memory_mode, MemoryMode::kUnified);
  EXPECT_EQ(c.reconnect_max, 500ms);
  EXPECT_EQ(c.register_wait, 0ms);
  EXPECT_EQ(c.log_level, LogLevel::kDebug);
}

TEST(ClientConfig, IdleReleaseZeroTurnsItOff) {
  EXPECT_EQ(parse({{"NVSHARE_IDLE_RELEASE_MS", "0"}}).config.idle_release, 0ms);
}

TEST(ClientConfig, EmptyValuesCountAsUnset) {
  const ParsedClientConfig parsed = parse({{"NVSHARE_CORE_LIMIT", ""}, {"NVSHARE_SOCKET", ""}});
  EXPECT_TRUE(parsed.warnings.empty());
  EXPECT_EQ(parsed.config.declared_limits.core_percent, 100);
  EXPECT_EQ(parsed.config.socket_path, kDefaultSocketPath);
}

struct BadValue {
  std::string variable;
  std::string value;
  std::string message;  // part of the warning
};

void PrintTo(const BadValue& b, std::ostream* os) {
  *os << b.variable << '=' << b.value.substr(0, 24);
}

class ClientConfigInvalid : public ::testing::TestWithParam<BadValue> {};

TEST_P(ClientConfigInvalid, WarnsOnceAndKeepsTheDefault) {
  const BadValue& bad = GetParam();
  const ParsedClientConfig parsed = parse({{bad.variable, bad.value}});
  ASSERT_EQ(parsed.warnings.size(), 1u);
  EXPECT_NE(parsed.warnings[0].find(bad.variable + "=\"" + bad.value + "\""), std::string::npos)
      << parsed.warnings[0];
  EXPECT_NE(parsed.warnings[0].find(bad.message), std::string::npos) << parsed.warnings[0];
  EXPECT_NE(parsed.warnings[0].find("using the default"), std::string::npos);
  const ClientConfig defaults = default_client_config();
  const ClientConfig& c = parsed.config;
  EXPECT_EQ(c.enabled, defaults.enabled);
  EXPECT_EQ(c.socket_path, defaults.socket_path);
  EXPECT_EQ(c.idle_release, defaults.idle_release);
  EXPECT_EQ(c.drain_bound, defaults.drain_bound);
  EXPECT_EQ(c.declared_limits, defaults.declared_limits);
  EXPECT_EQ(c.pod_uid, defaults.pod_uid);
  EXPECT_EQ(c.memory_mode, defaults.memory_mode);
  EXPECT_EQ(c.reconnect_max, defaults.reconnect_max);
  EXPECT_EQ(c.register_wait, defaults.register_wait);
  EXPECT_EQ(c.log_level, defaults.log_level);
}

INSTANTIATE_TEST_SUITE_P(
    Values, ClientConfigInvalid,
    ::testing::Values(
        BadValue{"NVSHARE_ENABLE", "maybe", "is not a boolean (1, 0"},
        BadValue{"NVSHARE_SOCKET", "/" + std::string(200, 'x'), "longer than 107 bytes"},
        BadValue{"NVSHARE_IDLE_RELEASE_MS", "fast", "not a whole number of milliseconds"},
        BadValue{"NVSHARE_IDLE_RELEASE_MS", "-5", "outside 0..3600000"},
        BadValue{"NVSHARE_IDLE_RELEASE_MS", "3600001", "outside 0..3600000"},
        BadValue{"NVSHARE_DRAIN_BOUND_MS", "0", "outside 1..60000"},
        BadValue{"NVSHARE_DRAIN_BOUND_MS", "10ms", "not a whole number"},
        BadValue{"NVSHARE_MEMORY_LIMIT", "4GB", "unknown suffix"},
        BadValue{"NVSHARE_CORE_LIMIT", "150", "150"}, BadValue{"NVSHARE_CORE_LIMIT", "0", "0"},
        BadValue{"NVSHARE_POD_UID", std::string(65, 'p'), "longer than 64 bytes"},
        BadValue{"NVSHARE_MEMORY_MODE", "managed", "is not one of `device`, `unified`, `plain`"},
        BadValue{"NVSHARE_RECONNECT_MAX_MS", "10", "outside 50..600000"},
        BadValue{"NVSHARE_REGISTER_WAIT_MS", "10001", "outside 0..10000"},
        BadValue{"NVSHARE_REGISTER_WAIT_MS", "1s", "not a whole number"},
        BadValue{"NVSHARE_LOG_LEVEL", "loud", "not one of error, warn, info, debug, trace"}));

TEST(ClientConfig, ConfigurationDocumentContainsTheGeneratedTable) {
  std::ifstream in(NVSHARE_CONFIGURATION_DOC);
  ASSERT_TRUE(in.good()) << "cannot read " << NVSHARE_CONFIGURATION_DOC;
  std::stringstream text;
  text << in.rdbuf();
  const std::string table = client_config_doc_table();
  EXPECT_NE(text.str().find(table), std::string::npos)
      << "docs/configuration.md's client section is out of date; its table must read:\n"
      << table;
}

}  // namespace
}  // namespace nvshare::client

namespace nvshare::client {
namespace {

ParsedClientConfig parse_with(const std::map<std::string, std::string>& env,
                              const std::string& settings_text) {
  auto settings = parse_client_settings(settings_text);
  EXPECT_TRUE(settings.ok()) << settings.error().message;
  return parse_client_config(
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      settings.ok() ? std::optional<ClientSettings>(settings.value()) : std::nullopt);
}

TEST(ClientSettings, ParsesWhatThePluginWrites) {
  auto s = parse_client_settings(
      "# nvshare client settings\nenforce=1\nsocket=/var/run/nvshare/scheduler.sock\n"
      "register-wait-ms=5000\nreconnect-max-ms=2000\nmemory-limit=1073741824\npod=ml/trainer\n"
      "devices=GPU-a__0\n");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_TRUE(s.value().enforce);
  EXPECT_EQ(s.value().socket, "/var/run/nvshare/scheduler.sock");
  EXPECT_EQ(s.value().register_wait, Duration(5000ms));
  EXPECT_EQ(s.value().memory_bytes, 1ull << 30);
  EXPECT_FALSE(s.value().memory_pending);
  EXPECT_EQ(s.value().pod, "ml/trainer");
  EXPECT_TRUE(parse_client_settings("memory-limit=pending").value().memory_pending);
  EXPECT_EQ(parse_client_settings("memory-limit=none").value().memory_bytes, 0u);
  EXPECT_EQ(parse_client_settings("memory-limit=2Gi").value().memory_bytes, 2ull << 30);
}

TEST(ClientSettings, RejectsWhatItDoesNotKnow) {
  for (const char* bad : {"enforce=yes", "socket=relative.sock", "register-wait-ms=-1",
                          "register-wait-ms=99999999", "memory-limit=0", "memory-limit=lots",
                          "reconnect-max-ms=10", "colour=blue", "no equals sign"}) {
    auto s = parse_client_settings(bad);
    EXPECT_FALSE(s.ok()) << bad;
    if (!s.ok()) EXPECT_NE(s.error().message.find("line 1"), std::string::npos) << bad;
  }
}

// In a managed container the environment cannot turn enforcement off, point the library at
// another socket, skip the registration wait or raise the memory limit.
TEST(ClientSettings, EnforcedSettingsWinOverTheEnvironment) {
  const ParsedClientConfig parsed =
      parse_with({{"NVSHARE_ENABLE", "0"},
                  {"NVSHARE_SOCKET", "/tmp/elsewhere.sock"},
                  {"NVSHARE_REGISTER_WAIT_MS", "0"},
                  {"NVSHARE_RECONNECT_MAX_MS", "600000"},
                  {"NVSHARE_MEMORY_LIMIT", "8Gi"}},
                 "enforce=1\nsocket=/var/run/nvshare/scheduler.sock\nregister-wait-ms=5000\n"
                 "memory-limit=1Gi\n");
  const ClientConfig& c = parsed.config;
  EXPECT_TRUE(c.enforced);
  EXPECT_TRUE(c.enabled);
  EXPECT_EQ(c.socket_path, "/var/run/nvshare/scheduler.sock");
  EXPECT_EQ(c.register_wait, 5000ms);
  EXPECT_EQ(c.reconnect_max, 2000ms);
  EXPECT_EQ(c.declared_limits.memory_bytes, 1ull << 30);
  ASSERT_EQ(parsed.warnings.size(), 4u);
  for (const char* name : {"NVSHARE_ENABLE", "NVSHARE_SOCKET", "NVSHARE_REGISTER_WAIT_MS",
                           "NVSHARE_RECONNECT_MAX_MS"}) {
    bool named = false;
    for (const std::string& w : parsed.warnings) named |= w.rfind(name, 0) == 0;
    EXPECT_TRUE(named) << name;
  }
  // A declared limit may only lower the file's.
  EXPECT_EQ(parse_with({{"NVSHARE_MEMORY_LIMIT", "512Mi"}}, "enforce=1\nmemory-limit=1Gi\n")
                .config.declared_limits.memory_bytes,
            512ull << 20);
  // Pending: nothing is known yet.
  EXPECT_TRUE(parse_with({}, "enforce=1\nmemory-limit=pending\n").config.memory_limit_pending);
  // enforce=0 leaves the environment in charge.
  EXPECT_FALSE(parse_with({{"NVSHARE_ENABLE", "0"}}, "enforce=0\n").config.enabled);
}

// The device plugin puts the enforced socket in the environment too: a variable that says what the
// file says is no news, and one that differs is still named.
TEST(ClientSettings, AVariableEqualToTheEnforcedValueIsNotWarnedOf) {
  const std::string file =
      "enforce=1\nsocket=/var/run/nvshare/scheduler.sock\nregister-wait-ms=5000\n";
  const ParsedClientConfig same = parse_with({{"NVSHARE_SOCKET", "/var/run/nvshare/scheduler.sock"},
                                              {"NVSHARE_ENABLE", "1"},
                                              {"NVSHARE_REGISTER_WAIT_MS", "5000"}},
                                             file);
  EXPECT_TRUE(same.warnings.empty()) << same.warnings.front();
  const ParsedClientConfig differs = parse_with(
      {{"NVSHARE_SOCKET", "/var/run/nvshare/other.sock"}, {"NVSHARE_ENABLE", "0"}}, file);
  ASSERT_EQ(differs.warnings.size(), 2u);
  EXPECT_EQ(differs.warnings[0].rfind("NVSHARE_ENABLE=", 0), 0u) << differs.warnings[0];
  EXPECT_EQ(differs.warnings[1].rfind("NVSHARE_SOCKET=", 0), 0u) << differs.warnings[1];
}

// A file the workload could have written is not trusted for its values, but a file at the path
// still says the container is managed: enforced, with the limit unknown until the scheduler gives
// it. So is anything else found there (a directory, a FIFO, which must not hang the process).
TEST(ClientSettings, AnythingUntrustedAtThePathFailsClosed) {
  char tmpl[] = "/tmp/nvshare-settings-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/client.conf";
  const auto expect_fail_closed = [](const SettingsRead& read, const std::string& what) {
    ASSERT_TRUE(read.settings.has_value()) << what << ": " << read.warning;
    EXPECT_TRUE(read.settings->enforce) << what;
    EXPECT_TRUE(read.settings->memory_pending) << what;
    EXPECT_EQ(read.settings->memory_bytes, std::nullopt) << what;
    EXPECT_NE(read.warning.find("enforcing with the memory limit unknown"), std::string::npos)
        << what << ": " << read.warning;
  };
  std::ofstream(path) << "enforce=1\nmemory-limit=1Gi\n";
  ::chmod(path.c_str(), 0666);  // writable by anyone
  expect_fail_closed(read_client_settings(path), "a file writable by anyone");
  ::chmod(path.c_str(), 0644);
  SettingsRead read = read_client_settings(path);
  if (::geteuid() == 0) {  // root owns it: the plugin's file as the container sees it
    ASSERT_TRUE(read.settings.has_value()) << read.warning;
    EXPECT_EQ(read.settings->memory_bytes, 1ull << 30);
    EXPECT_FALSE(read.settings->memory_pending);
  } else {
    expect_fail_closed(read, "a file of another owner than root");
  }
  // Present but unreadable as settings: enforced, with the limit unknown.
  std::ofstream(path) << "enforce=maybe\n";
  if (::geteuid() == 0) expect_fail_closed(read_client_settings(path), "malformed settings");
  std::remove(path.c_str());
  ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
  expect_fail_closed(read_client_settings(path), "a directory");
  ::rmdir(path.c_str());
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  expect_fail_closed(read_client_settings(path), "a FIFO");  // returns: no writer needed
  std::remove(path.c_str());
  EXPECT_FALSE(read_client_settings(std::string(tmpl) + "/absent.conf").settings.has_value());
  ::rmdir(tmpl);
}

}  // namespace
}  // namespace nvshare::client
