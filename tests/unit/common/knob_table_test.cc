// The shared knob mechanism on a small table of its own: naming, the order defaults < environment <
// command line, switches, every error message and where it says the value came from, and the
// generated --help text and Markdown table.
#include "common/knob_table.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/knob_parse.h"

namespace nvshare::knobtable {
namespace {

struct Config {
  int count = -1;
  std::string path = "unset";
  bool verbose = false;
};

// A knob type with switches (the scheduler's shape) and one without (the device plugin's).
struct SwitchKnob {
  std::string_view name;
  std::string_view default_value;
  std::string_view range;
  std::string_view meaning;
  bool is_switch;
  Status (*apply)(std::string_view value, Config& config);
};

struct PlainKnob {
  std::string_view name;
  std::string_view default_value;
  std::string_view range;
  std::string_view meaning;
  Status (*apply)(std::string_view value, Config& config);
};

Status apply_count(std::string_view v, Config& c) {
  auto n = knobparse::parse_integer(v, 1, 100);
  if (!n) return n.error();
  c.count = static_cast<int>(n.value());
  return Status::Ok();
}
Status apply_path(std::string_view v, Config& c) {
  c.path = std::string(v);
  return Status::Ok();
}
Status apply_verbose(std::string_view v, Config& c) {
  auto b = knobparse::parse_bool(v);
  if (!b) return b.error();
  c.verbose = b.value();
  return Status::Ok();
}

const SwitchKnob kSwitchKnobs[] = {
    {"item-count", "10", "1..100", "How many `items` there are.", false, apply_count},
    {"path", "", "a path", "Where things go.", false, apply_path},
    {"verbose", "false", "`true`, `false`", "Say more.", true, apply_verbose},
};
const KnobTable<SwitchKnob, Config> kSwitchTable(kSwitchKnobs, "TEST_");

const PlainKnob kPlainKnobs[] = {
    {"item-count", "10", "1..100", "How many items there are.", apply_count},
    {"verbose", "false", "`true`, `false`", "Say more.", apply_verbose},
};
const KnobTable<PlainKnob, Config> kPlainTable(kPlainKnobs, "TEST_PLAIN_");

using Env = std::map<std::string, std::string>;

template <typename Table>
auto parse(const Table& table, std::vector<std::string> args, const Env& env = {}) {
  std::vector<const char*> argv = {"prog"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return table.parse_command_line(static_cast<int>(argv.size()), argv.data(),
                                  [&env](const char* name) -> const char* {
                                    auto it = env.find(name);
                                    return it == env.end() ? nullptr : it->second.c_str();
                                  });
}

template <typename Table>
std::string error_of(const Table& table, std::vector<std::string> args, const Env& env = {}) {
  auto parsed = parse(table, std::move(args), env);
  return parsed ? std::string("(parsed)") : parsed.error().message;
}

TEST(KnobTable, NamesAreDerivedFromTheKnobName) {
  EXPECT_EQ(flag_name("quota-window"), "--quota-window");
  EXPECT_EQ(env_name("NVSHARE_", "quota-window"), "NVSHARE_QUOTA_WINDOW");
  EXPECT_EQ(kSwitchTable.env_name(*kSwitchTable.find("item-count")), "TEST_ITEM_COUNT");
  EXPECT_EQ(kPlainTable.env_name(*kPlainTable.find("item-count")), "TEST_PLAIN_ITEM_COUNT");
  EXPECT_EQ(kSwitchTable.flag_name(*kSwitchTable.find("path")), "--path");
  EXPECT_EQ(kSwitchTable.find("nothing"), nullptr);
  EXPECT_EQ(kSwitchTable.knobs().size(), 3u);
}

TEST(KnobTable, ReadArgumentClassifiesRequestsAndFlags) {
  EXPECT_EQ(read_argument("-h").value().kind, Argument::Kind::kHelp);
  EXPECT_EQ(read_argument("--help").value().kind, Argument::Kind::kHelp);
  EXPECT_EQ(read_argument("--version").value().kind, Argument::Kind::kVersion);
  EXPECT_EQ(read_argument("--print-config-doc").value().kind, Argument::Kind::kPrintConfigDoc);
  auto bare = read_argument("--path");
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare.value().name, "path");
  EXPECT_FALSE(bare.value().value.has_value());
  auto with_value = read_argument("--path=a=b");
  ASSERT_TRUE(with_value);
  EXPECT_EQ(with_value.value().name, "path");
  EXPECT_EQ(with_value.value().value, "a=b");
  auto empty_value = read_argument("--path=");
  ASSERT_TRUE(empty_value);
  EXPECT_EQ(empty_value.value().value, "");
  EXPECT_EQ(read_argument("path").error().message, "unexpected argument \"path\" (see --help)");
  EXPECT_FALSE(read_argument("-v"));
}

TEST(KnobTable, DefaultsThenEnvironmentThenFlags) {
  const Config defaults = kSwitchTable.defaults();
  EXPECT_EQ(defaults.count, 10);
  EXPECT_EQ(defaults.path, "");
  EXPECT_FALSE(defaults.verbose);

  auto env_only = parse(kSwitchTable, {}, {{"TEST_ITEM_COUNT", "20"}, {"TEST_PATH", "/env"}});
  ASSERT_TRUE(env_only) << env_only.error().message;
  EXPECT_EQ(env_only.value().config.count, 20);
  EXPECT_EQ(env_only.value().config.path, "/env");

  auto both = parse(kSwitchTable, {"--item-count", "30", "--path=/flag"},
                    {{"TEST_ITEM_COUNT", "20"}, {"TEST_PATH", "/env"}});
  ASSERT_TRUE(both) << both.error().message;
  EXPECT_EQ(both.value().config.count, 30);
  EXPECT_EQ(both.value().config.path, "/flag");
  EXPECT_FALSE(both.value().help);

  // An empty environment value counts as unset; a later flag wins over an earlier one.
  auto later = parse(kSwitchTable, {"--item-count=5", "--item-count=6"}, {{"TEST_PATH", ""}});
  ASSERT_TRUE(later);
  EXPECT_EQ(later.value().config.count, 6);
  EXPECT_EQ(later.value().config.path, "");
}

TEST(KnobTable, SwitchesStandAloneOrTakeAnExplicitValue) {
  auto alone = parse(kSwitchTable, {"--verbose", "--item-count", "3"});
  ASSERT_TRUE(alone) << alone.error().message;
  EXPECT_TRUE(alone.value().config.verbose);
  EXPECT_EQ(alone.value().config.count, 3);

  auto off = parse(kSwitchTable, {"--verbose=false"}, {{"TEST_VERBOSE", "true"}});
  ASSERT_TRUE(off);
  EXPECT_FALSE(off.value().config.verbose);

  // A knob type without is_switch: every flag takes a value, even one that looks like a flag.
  auto plain = parse(kPlainTable, {"--verbose", "true"});
  ASSERT_TRUE(plain) << plain.error().message;
  EXPECT_TRUE(plain.value().config.verbose);
  EXPECT_EQ(error_of(kPlainTable, {"--verbose"}), "flag --verbose needs a value (see --help)");
}

TEST(KnobTable, RequestsAreNotKnobs) {
  auto parsed = parse(kSwitchTable, {"--help", "--version", "--print-config-doc", "-h"});
  ASSERT_TRUE(parsed);
  EXPECT_TRUE(parsed.value().help);
  EXPECT_TRUE(parsed.value().version);
  EXPECT_TRUE(parsed.value().print_config_doc);
}

TEST(KnobTable, ErrorsNameWhereTheValueCameFrom) {
  EXPECT_EQ(error_of(kSwitchTable, {"--nothing"}), "unknown flag --nothing (see --help)");
  EXPECT_EQ(error_of(kSwitchTable, {"--nothing=1"}), "unknown flag --nothing (see --help)");
  EXPECT_EQ(error_of(kSwitchTable, {"--=1"}), "unknown flag -- (see --help)");
  EXPECT_EQ(error_of(kSwitchTable, {"--item-count"}),
            "flag --item-count needs a value (see --help)");
  EXPECT_EQ(error_of(kSwitchTable, {"stray"}), "unexpected argument \"stray\" (see --help)");
  EXPECT_EQ(error_of(kSwitchTable, {"--item-count=0"}), "flag --item-count: 0 is outside 1..100");
  EXPECT_EQ(
      error_of(kSwitchTable, {"--verbose=maybe"}),
      "flag --verbose: \"maybe\" is not a boolean (1, 0, true, false, yes, no, on, off, in any "
      "letter case)");
  EXPECT_EQ(error_of(kSwitchTable, {}, {{"TEST_ITEM_COUNT", "500"}}),
            "environment variable TEST_ITEM_COUNT: 500 is outside 1..100");
  // The environment is read before the command line, so its error comes first.
  EXPECT_EQ(error_of(kSwitchTable, {"--nothing"}, {{"TEST_ITEM_COUNT", "x"}})
                .rfind("environment variable TEST_ITEM_COUNT: ", 0),
            0u);

  Config config;
  const Status status = kSwitchTable.apply(*kSwitchTable.find("item-count"), "0", config);
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error().message, "item-count: 0 is outside 1..100");
  EXPECT_EQ(config.count, -1);
}

TEST(KnobTable, HelpTextIsGeneratedFromTheTable) {
  const std::string help = kSwitchTable.help_text("prog", "prog does things.");
  EXPECT_EQ(
      help,
      "Usage: prog [FLAGS]\n"
      "\n"
      "prog does things.\n"
      "\n"
      "Flags:\n"
      "  --item-count VALUE  (env TEST_ITEM_COUNT)\n"
      "      How many items there are.\n"
      "      Default: 10. Range: 1..100.\n"
      "  --path VALUE  (env TEST_PATH)\n"
      "      Where things go.\n"
      "      Default: (empty). Range: a path.\n"
      "  --verbose[=BOOL]  (env TEST_VERBOSE)\n"
      "      Say more.\n"
      "      Default: false. Range: true, false.\n"
      "  --help             print this text\n"
      "  --version          print the version\n"
      "  --print-config-doc print the knob table of docs/configuration.md (Markdown)\n"
      "  --print-knobs      print every knob as JSON (name, flag, env, default, range, meaning)\n");
  EXPECT_NE(kPlainTable.help_text("prog", "").find("  --verbose VALUE  (env TEST_PLAIN_VERBOSE)\n"),
            std::string::npos);
}

TEST(KnobTable, HelpLinesFitOneHundredColumns) {
  const std::string summary(30, 'w');
  std::string long_summary;
  for (int i = 0; i < 10; ++i) long_summary += summary + " ";
  std::istringstream lines(kSwitchTable.help_text("prog", long_summary));
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 100u) << line;
}

TEST(KnobTable, DocTableHasTheColumnsAskedForInOrder) {
  const std::string table = kSwitchTable.doc_table(
      {DocField::kKnob,
       DocField::kFlag,
       DocField::kEnvironment,
       {"kind", [](const SwitchKnob& k) { return std::string(k.is_switch ? "switch" : "value"); }},
       DocField::kDefault,
       DocField::kRange,
       DocField::kMeaning});
  EXPECT_EQ(table,
            "| knob | flag | environment variable | kind | default | range | meaning |\n"
            "|---|---|---|---|---|---|---|\n"
            "| item-count | `--item-count` | `TEST_ITEM_COUNT` | value | `10` | 1..100 | How many "
            "`items` there are. |\n"
            "| path | `--path` | `TEST_PATH` | value | (empty) | a path | Where things go. |\n"
            "| verbose | `--verbose` | `TEST_VERBOSE` | switch | `false` | `true`, `false` | Say "
            "more. |\n");
  EXPECT_EQ(kPlainTable.doc_table({DocField::kKnob}),
            "| knob |\n|---|\n| item-count |\n| verbose |\n");
}

}  // namespace
}  // namespace nvshare::knobtable

namespace nvshare::knobparse {
namespace {

TEST(SplitList, ItemsInOrderAndEveryEmptyItemRefused) {
  auto items = split_list("GPU-a,1,16Gi", "GPU list");
  ASSERT_TRUE(items.ok());
  EXPECT_EQ(items.value(), (std::vector<std::string_view>{"GPU-a", "1", "16Gi"}));
  for (std::string_view bad : {"", ",", "a,", ",a", "a,,b"}) {
    auto refused = split_list(bad, "GPU list");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.error().message, "empty item in GPU list \"" + std::string(bad) + "\"");
  }
}

}  // namespace
}  // namespace nvshare::knobparse
