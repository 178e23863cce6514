// The client's knob table: defaults, valid and invalid values, and docs/configuration.md.
#include "client/config.h"

#include <gtest/gtest.h>

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
  EXPECT_TRUE(c.managed);
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
      "NVSHARE_ENABLE",           "NVSHARE_SOCKET",       "NVSHARE_IDLE_RELEASE_MS",
      "NVSHARE_DRAIN_BOUND_MS",   "NVSHARE_MEMORY_LIMIT", "NVSHARE_CORE_LIMIT",
      "NVSHARE_POD_UID",          "NVSHARE_MANAGED",      "NVSHARE_RECONNECT_MAX_MS",
      "NVSHARE_REGISTER_WAIT_MS", "NVSHARE_LOG_LEVEL",    "NVSHARE_TRACE_FILE"};
  EXPECT_EQ(names, expected);
  ASSERT_NE(find_client_knob("core-limit"), nullptr);
  EXPECT_EQ(find_client_knob("cores"), nullptr);
}

TEST(ClientConfig, ValidValuesAreApplied) {
  const ParsedClientConfig parsed = parse({{"NVSHARE_ENABLE", "0"},
                                           {"NVSHARE_SOCKET", "/run/x/s.sock"},
                                           {"NVSHARE_IDLE_RELEASE_MS", "250"},
                                           {"NVSHARE_DRAIN_BOUND_MS", "20"},
                                           {"NVSHARE_MEMORY_LIMIT", "4Gi"},
                                           {"NVSHARE_CORE_LIMIT", "30%"},
                                           {"NVSHARE_POD_UID", "0f1e2d3c-aaaa"},
                                           {"NVSHARE_MANAGED", "false"},
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
  EXPECT_FALSE(c.managed);
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
  EXPECT_EQ(c.managed, defaults.managed);
  EXPECT_EQ(c.reconnect_max, defaults.reconnect_max);
  EXPECT_EQ(c.register_wait, defaults.register_wait);
  EXPECT_EQ(c.log_level, defaults.log_level);
}

INSTANTIATE_TEST_SUITE_P(
    Values, ClientConfigInvalid,
    ::testing::Values(
        BadValue{"NVSHARE_ENABLE", "maybe", "is not one of 1, 0"},
        BadValue{"NVSHARE_SOCKET", std::string(200, 'x'), "longer than 107 bytes"},
        BadValue{"NVSHARE_IDLE_RELEASE_MS", "fast", "not a whole number of milliseconds"},
        BadValue{"NVSHARE_IDLE_RELEASE_MS", "-5", "outside 0..3600000"},
        BadValue{"NVSHARE_IDLE_RELEASE_MS", "3600001", "outside 0..3600000"},
        BadValue{"NVSHARE_DRAIN_BOUND_MS", "0", "outside 1..60000"},
        BadValue{"NVSHARE_DRAIN_BOUND_MS", "10ms", "not a whole number"},
        BadValue{"NVSHARE_MEMORY_LIMIT", "4GB", "unknown suffix"},
        BadValue{"NVSHARE_CORE_LIMIT", "150", "150"}, BadValue{"NVSHARE_CORE_LIMIT", "0", "0"},
        BadValue{"NVSHARE_POD_UID", std::string(65, 'p'), "longer than 64 bytes"},
        BadValue{"NVSHARE_MANAGED", "2", "is not one of"},
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
