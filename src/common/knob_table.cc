#include "common/knob_table.h"

#include "common/knob_parse.h"

namespace nvshare::knobtable {
namespace {

constexpr std::size_t kHelpWidth = 100;
constexpr std::string_view kHelpIndent = "      ";

}  // namespace

std::string flag_name(std::string_view knob_name) { return "--" + std::string(knob_name); }

std::string env_name(std::string_view env_prefix, std::string_view knob_name) {
  return std::string(env_prefix) + knobparse::upper_snake(knob_name);
}

Result<Argument> read_argument(std::string_view arg) {
  Argument argument;
  if (arg == "--help" || arg == "-h") {
    argument.kind = Argument::Kind::kHelp;
    return argument;
  }
  if (arg == "--version") {
    argument.kind = Argument::Kind::kVersion;
    return argument;
  }
  if (arg == "--print-config-doc") {
    argument.kind = Argument::Kind::kPrintConfigDoc;
    return argument;
  }
  if (arg == "--print-knobs") {
    argument.kind = Argument::Kind::kPrintKnobs;
    return argument;
  }
  if (arg.substr(0, 2) != "--") {
    return make_error("unexpected argument \"" + std::string(arg) + "\" (see --help)");
  }
  const std::size_t eq = arg.find('=');
  if (eq == std::string_view::npos) {
    argument.name = arg.substr(2);
  } else {
    argument.name = arg.substr(2, eq - 2);
    argument.value = arg.substr(eq + 1);
  }
  return argument;
}

std::string help_header(std::string_view program, std::string_view summary) {
  return "Usage: " + std::string(program) + " [FLAGS]\n\n" +
         knobparse::wrap(summary, kHelpWidth, "") + "\nFlags:\n";
}

std::string help_entry(std::string_view flag, std::string_view env, bool is_switch,
                       std::string_view meaning, std::string_view default_value,
                       std::string_view range) {
  std::string out = "  " + std::string(flag) + (is_switch ? "[=BOOL]" : " VALUE") + "  (env " +
                    std::string(env) + ")\n";
  out += knobparse::wrap(knobparse::strip_backticks(meaning), kHelpWidth, kHelpIndent);
  out += knobparse::wrap("Default: " + plain_default(default_value) +
                             ". Range: " + knobparse::strip_backticks(range) + ".",
                         kHelpWidth, kHelpIndent);
  return out;
}

std::string help_footer() {
  return "  --help             print this text\n"
         "  --version          print the version\n"
         "  --print-config-doc print the knob table of docs/configuration.md (Markdown)\n"
         "  --print-knobs      print every knob as JSON (name, flag, env, default, range, "
         "meaning)\n";
}

std::string plain_default(std::string_view default_value) {
  return default_value.empty() ? "(empty)" : std::string(default_value);
}

std::string doc_default(std::string_view default_value) {
  return default_value.empty() ? "(empty)" : "`" + std::string(default_value) + "`";
}

std::string doc_row(const std::vector<std::string>& cells) {
  std::string out = "|";
  for (const std::string& cell : cells) out += " " + cell + " |";
  return out + "\n";
}

}  // namespace nvshare::knobtable
