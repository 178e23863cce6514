#include "scheduler/knobs.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace nvshare::scheduler {
namespace {

using namespace std::chrono_literals;

struct Env {
  std::map<std::string, std::string> values;
  EnvLookup lookup() const {
    return [this](const char* name) -> const char* {
      auto it = values.find(name);
      return it == values.end() ? nullptr : it->second.c_str();
    };
  }
};

Result<CommandLine> parse(std::vector<std::string> args, const Env& env = {}) {
  std::vector<const char*> argv = {"nvshare-scheduler"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data(), env.lookup());
}

TEST(Knobs, EveryDefaultParsesAndMatchesThePolicyDefaults) {
  for (const Knob& knob : knobs()) {
    DaemonConfig config;
    EXPECT_TRUE(apply_knob(knob, knob.default_value, config).ok()) << knob.name;
  }
  // One definition: the table's defaults must be the policy engine's documented defaults.
  const DaemonConfig config = default_config();
  const policy::PolicyConfig reference;
  EXPECT_EQ(config.policy.mode, reference.mode);
  EXPECT_DOUBLE_EQ(config.policy.reserve_fraction, reference.reserve_fraction);
  EXPECT_EQ(config.policy.capacity_bytes, reference.capacity_bytes);
  EXPECT_EQ(config.policy.fixed_quantum, reference.fixed_quantum);
  EXPECT_DOUBLE_EQ(config.policy.quantum_swap_multiple, reference.quantum_swap_multiple);
  EXPECT_EQ(config.policy.quantum_min, reference.quantum_min);
  EXPECT_EQ(config.policy.quantum_max, reference.quantum_max);
  EXPECT_EQ(config.policy.turn_slice, reference.turn_slice);
  EXPECT_EQ(config.policy.cap_cycle, reference.cap_cycle);
  EXPECT_EQ(config.policy.default_swap_bytes_per_s, reference.default_swap_bytes_per_s);
  EXPECT_EQ(config.policy.quota_window, reference.quota_window);
  EXPECT_EQ(config.policy.revoke_grace, reference.revoke_grace);
  EXPECT_TRUE(policy::validate(config.policy).ok());

  EXPECT_EQ(config.socket_path, "/var/run/nvshare/scheduler.sock");
  EXPECT_EQ(config.control_socket_path, "/var/run/nvshare-control/control.sock");
  EXPECT_FALSE(config.trust_client_limits);
  EXPECT_EQ(config.client_buffer_limit, 1u << 20);
  EXPECT_EQ(config.log_level, LogLevel::kInfo);
  EXPECT_FALSE(config.capacity.all.has_value());
}

TEST(Knobs, TheTableHasTheKnobsTheIssueNamesOnceEach) {
  std::set<std::string> names;
  for (const Knob& knob : knobs()) {
    EXPECT_TRUE(names.insert(std::string(knob.name)).second) << "duplicate knob " << knob.name;
    EXPECT_FALSE(knob.meaning.empty()) << knob.name;
    EXPECT_FALSE(knob.range.empty()) << knob.name;
  }
  for (const char* required : {"socket", "control-socket", "mode", "reserve", "capacity", "quantum",
                               "quantum-k", "quantum-min", "quantum-max", "quota-window",
                               "revoke-grace", "trust-client-limits", "log-level"}) {
    EXPECT_EQ(names.count(required), 1u) << required;
  }
  EXPECT_EQ(env_name(*find_knob("quota-window")), "NVSHARE_QUOTA_WINDOW");
  EXPECT_EQ(flag_name(*find_knob("control-socket")), "--control-socket");
}

TEST(Knobs, FlagsWinOverTheEnvironmentWhichWinsOverDefaults) {
  Env env;
  env.values["NVSHARE_MODE"] = "exclusive";
  env.values["NVSHARE_QUANTUM"] = "30";
  env.values["NVSHARE_TRUST_CLIENT_LIMITS"] = "true";
  env.values["NVSHARE_SOCKET"] = "";  // empty means unset
  auto cl = parse({"--quantum", "2.5", "--reserve=20", "--capacity", "24Gi,GPU-a=16Gi"}, env);
  ASSERT_TRUE(cl.ok()) << cl.error().message;
  const DaemonConfig& c = cl.value().config;
  EXPECT_EQ(c.policy.mode, policy::Mode::kExclusive);
  EXPECT_EQ(c.policy.fixed_quantum, Duration(2500ms));
  EXPECT_DOUBLE_EQ(c.policy.reserve_fraction, 0.2);
  EXPECT_TRUE(c.trust_client_limits);
  EXPECT_EQ(c.socket_path, "/var/run/nvshare/scheduler.sock");
  EXPECT_EQ(c.capacity.for_gpu("GPU-a"), 16ull << 30);
  EXPECT_EQ(c.capacity.for_gpu("GPU-b"), 24ull << 30);
  EXPECT_EQ(c.capacity.to_string(), "24Gi,GPU-a=16Gi");
}

TEST(Knobs, AcceptsEveryDocumentedForm) {
  auto cl = parse({"--mode",
                   "serial",
                   "--quantum",
                   "auto",
                   "--quantum-k",
                   "2.5",
                   "--quantum-min",
                   "0.5",
                   "--quantum-max",
                   "60",
                   "--turn-slice",
                   "0.25",
                   "--cap-cycle",
                   "0.1",
                   "--quota-window",
                   "500",
                   "--revoke-grace",
                   "1.5",
                   "--swap-bandwidth",
                   "12G",
                   "--trust-client-limits",
                   "--client-buffer-limit",
                   "4Mi",
                   "--log-level",
                   "debug",
                   "--reserve",
                   "5%",
                   "--capacity",
                   "GPU-x=8Gi"});
  ASSERT_TRUE(cl.ok()) << cl.error().message;
  const DaemonConfig& c = cl.value().config;
  EXPECT_EQ(c.policy.mode, policy::Mode::kExclusive);
  EXPECT_FALSE(c.policy.fixed_quantum.has_value());
  EXPECT_DOUBLE_EQ(c.policy.quantum_swap_multiple, 2.5);
  EXPECT_EQ(c.policy.quantum_min, Duration(500ms));
  EXPECT_EQ(c.policy.quantum_max, Duration(60s));
  EXPECT_EQ(c.policy.turn_slice, Duration(250ms));
  EXPECT_EQ(c.policy.cap_cycle, Duration(100ms));
  EXPECT_EQ(c.policy.quota_window, Duration(500ms));
  EXPECT_EQ(c.policy.revoke_grace, Duration(1500ms));
  EXPECT_EQ(c.policy.default_swap_bytes_per_s, 12'000'000'000u);
  EXPECT_TRUE(c.trust_client_limits);
  EXPECT_EQ(c.client_buffer_limit, 4u << 20);
  EXPECT_EQ(c.log_level, LogLevel::kDebug);
  EXPECT_DOUBLE_EQ(c.policy.reserve_fraction, 0.05);
  EXPECT_FALSE(c.capacity.all.has_value());
  EXPECT_EQ(c.capacity.for_gpu("GPU-x"), 8ull << 30);

  auto off = parse({"--trust-client-limits=false"});
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off.value().config.trust_client_limits);
  auto meta = parse({"--help", "--version", "--print-config-doc"});
  ASSERT_TRUE(meta.ok());
  EXPECT_TRUE(meta.value().help && meta.value().version && meta.value().print_config_doc);
}

struct BadInput {
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  const char* message_part;
};

void PrintTo(const BadInput& b, std::ostream* os) { *os << b.message_part; }

class KnobsReject : public ::testing::TestWithParam<BadInput> {};

TEST_P(KnobsReject, WithAMessageNamingTheKnob) {
  Env env;
  env.values = GetParam().env;
  auto cl = parse(GetParam().args, env);
  ASSERT_FALSE(cl.ok());
  EXPECT_NE(cl.error().message.find(GetParam().message_part), std::string::npos)
      << cl.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    Invalid, KnobsReject,
    ::testing::Values(
        BadInput{{"--mode", "fast"}, {}, "flag --mode: "},
        BadInput{{"--reserve", "95"}, {}, "flag --reserve: 95 is outside 0..90 percent"},
        BadInput{{"--reserve", "-1"}, {}, "outside 0..90"},
        BadInput{{"--quantum", "0"}, {}, "flag --quantum: 0 is outside 0.01..86400 seconds"},
        BadInput{{"--quantum", "5m"}, {}, "\"5m\" is not a decimal number"},
        BadInput{{"--quantum", "nan"}, {}, "is not a decimal number"},
        BadInput{{"--quota-window", "1.5"}, {}, "flag --quota-window: \"1.5\" is not an integer"},
        BadInput{{"--quota-window", "5"}, {}, "5 is outside 10..3600000"},
        BadInput{{"--capacity", "4GB"}, {}, "unknown suffix"},
        BadInput{{"--capacity", "24Gi,16Gi"}, {}, "given twice"},
        BadInput{{"--capacity", "GPU-a=1Gi,GPU-a=2Gi"}, {}, "capacity for GPU-a given twice"},
        BadInput{{"--capacity", "=1Gi"}, {}, "has no GPU UUID"},
        BadInput{{"--capacity", "1Gi,"}, {}, "empty item"},
        BadInput{{"--capacity", "0"}, {}, "is zero"},
        BadInput{{"--trust-client-limits=maybe"}, {}, "not a boolean"},
        BadInput{{"--log-level", "loud"}, {}, "not one of error, warn, info, debug, trace"},
        BadInput{{"--client-buffer-limit", "1Ki"}, {}, "outside 64Ki..1Gi"},
        BadInput{{"--swap-bandwidth", "10"}, {}, "outside 1M..1T"},
        BadInput{{"--socket", ""}, {}, "the path is empty"},
        BadInput{{"--socket"}, {}, "flag --socket needs a value"},
        BadInput{{"--sokcet", "/x"}, {}, "unknown flag --sokcet"},
        BadInput{{"stray"}, {}, "unexpected argument \"stray\""},
        BadInput{{"--quantum-min", "10", "--quantum-max", "5"}, {}, "invalid policy settings"},
        BadInput{{},
                 {{"NVSHARE_QUANTUM_K", "0"}},
                 "environment variable NVSHARE_QUANTUM_K: 0 is outside"},
        BadInput{{}, {{"NVSHARE_MODE", "exclusiv"}}, "environment variable NVSHARE_MODE"}));

TEST(Knobs, HelpListsEveryFlagEnvironmentVariableAndDefault) {
  const std::string help = help_text("nvshare-scheduler");
  for (const Knob& knob : knobs()) {
    EXPECT_NE(help.find(flag_name(knob)), std::string::npos) << knob.name;
    EXPECT_NE(help.find(env_name(knob)), std::string::npos) << knob.name;
    if (!knob.default_value.empty()) {
      EXPECT_NE(help.find("Default: " + std::string(knob.default_value)), std::string::npos)
          << knob.name;
    }
  }
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 100u) << line;
}

TEST(Knobs, ConfigurationDocumentContainsTheGeneratedTable) {
  std::ifstream in(NVSHARE_CONFIGURATION_DOC);
  ASSERT_TRUE(in.good()) << "cannot read " << NVSHARE_CONFIGURATION_DOC;
  std::stringstream text;
  text << in.rdbuf();
  const std::string table = config_doc_table();
  EXPECT_NE(text.str().find(table), std::string::npos)
      << "docs/configuration.md is out of date; regenerate its table with "
         "`nvshare-scheduler --print-config-doc`:\n"
      << table;
  for (const Knob& knob : knobs()) {
    EXPECT_NE(text.str().find("`" + env_name(knob) + "`"), std::string::npos) << knob.name;
  }
}

TEST(Knobs, CapacitySpecRendersExactly) {
  CapacitySpec spec;
  spec.all = 1'500'000'001;  // not a round binary quantity: rendered as bytes
  spec.by_gpu["GPU-b"] = 3ull << 29;
  EXPECT_EQ(spec.to_string(), "1500000001,GPU-b=1.5Gi");
  EXPECT_EQ(CapacitySpec{}.to_string(), "");
}

}  // namespace
}  // namespace nvshare::scheduler
