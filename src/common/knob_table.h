// The mechanism every nvshare program's knob table shares, and the client library's: a component
// defines each knob once, in an array of its own knob type, and KnobTable derives everything else
// from that array. Daemons and tools read flags and the environment (parse_command_line); the
// library reads the environment only (parse_environment).
//
// A knob type is a table row with at least
//   std::string_view name, default_value, range, meaning;
//   Status (*apply)(std::string_view value, Config& config);  // parses `value` into `config`
// and optionally `bool is_switch` (a boolean flag: `--name` alone means true). It may carry more
// (the scheduler's scope); KnobTable ignores what it does not know.
//
// From a row's name ("quota-window") come its flag (--quota-window) and its environment variable
// (<env prefix>QUOTA_WINDOW). The starting configuration is built from every knob's default text,
// then the environment (an empty value counts as unset), then the command line (`--name value`,
// `--name=value`, a switch as `--name` or `--name=true|false`); later wins. `--help`, `--version`
// and `--print-config-doc` are requests, not knobs. The `--help` text and the Markdown table of
// docs/configuration.md are generated from the same rows, so they cannot disagree with the parser.
//
// Contract: nothing here exits or throws. A parse error names where the value came from ("flag
// --quantum: ...", "environment variable NVSHARE_QUANTUM: ...") followed by the knob's own message;
// apply() prefixes the knob's name instead. What a component checks on the configuration as a whole
// (the scheduler's policy validation) it does after parse_command_line.
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/json.h"
#include "common/result.h"

namespace nvshare::knobtable {

// getenv's shape, replaceable in tests.
using EnvLookup = std::function<const char*(const char*)>;

// What parse_environment produces: the configuration and one warning per value it did not take.
template <typename Config>
struct EnvironmentRead {
  Config config;
  std::vector<std::string> warnings;
};

// What parse_command_line produces: the configuration and the requests that are not knobs.
template <typename Config>
struct CommandLine {
  Config config;
  bool help = false;
  bool version = false;
  bool print_config_doc = false;
  bool print_knobs = false;
};

template <typename Knob, typename Config>
concept KnobOf = requires(const Knob& knob, std::string_view value, Config& config) {
  { knob.name } -> std::convertible_to<std::string_view>;
  { knob.default_value } -> std::convertible_to<std::string_view>;
  { knob.range } -> std::convertible_to<std::string_view>;
  { knob.meaning } -> std::convertible_to<std::string_view>;
  { knob.apply(value, config) } -> std::same_as<Status>;
};

// Whether `--name` alone sets the knob (to "true"); false for knob types without `is_switch`.
template <typename Knob>
bool is_switch(const Knob& knob) {
  if constexpr (requires { static_cast<bool>(knob.is_switch); }) {
    return knob.is_switch;
  } else {
    return false;
  }
}

// ---- the text of the mechanism, independent of any table (knob_table.cc) ----------------------

std::string flag_name(std::string_view knob_name);  // "--quota-window"
std::string env_name(std::string_view env_prefix,
                     std::string_view knob_name);  // "NVSHARE_QUOTA_WINDOW"

// One command-line argument as the parser reads it.
struct Argument {
  enum class Kind { kHelp, kVersion, kPrintConfigDoc, kPrintKnobs, kFlag };
  Kind kind = Kind::kFlag;
  std::string_view name;                  // kFlag: what follows "--", up to any '='
  std::optional<std::string_view> value;  // kFlag: what follows the '=', when there is one
};
// "--help" and "-h", "--version", "--print-config-doc", or a flag; anything not starting with "--"
// is an error.
Result<Argument> read_argument(std::string_view arg);

// Pieces of the `--help` text: the usage line and the wrapped summary; one knob's entry (flag,
// environment variable, meaning, default and range, code spans read as plain text, lines of at most
// 100 columns); the lines of the requests.
std::string help_header(std::string_view program, std::string_view summary);
std::string help_entry(std::string_view flag, std::string_view env, bool is_switch,
                       std::string_view meaning, std::string_view default_value,
                       std::string_view range);
std::string help_footer();

// A default as a Markdown cell: "`value`", or "(empty)".
// A default as --help and warnings show it ("(empty)" for none), and as the Markdown table does.
std::string plain_default(std::string_view default_value);
std::string doc_default(std::string_view default_value);
// "| a | b |\n".
std::string doc_row(const std::vector<std::string>& cells);

// ---- the table ----------------------------------------------------------------------------------

// The columns every table can show; a component adds its own (the scheduler's set-policy member,
// the plugin's Helm value) as a header with a cell function.
enum class DocField { kKnob, kFlag, kEnvironment, kDefault, kRange, kMeaning };

template <typename Knob>
struct DocColumn {
  DocColumn(DocField which) : field(which) {}  // NOLINT: implicit so a column list reads as fields
  DocColumn(std::string_view title, std::function<std::string(const Knob&)> render)
      : header(title), cell(std::move(render)) {}

  std::optional<DocField> field;
  std::string_view header;                       // when !field
  std::function<std::string(const Knob&)> cell;  // when !field
};

// The request an argument is (--help, --version, --print-config-doc, --print-knobs), as the
// command line's field to set; nullptr for a knob's flag.
template <typename Config>
bool* request_flag(CommandLine<Config>& command_line, Argument::Kind kind) {
  switch (kind) {
    case Argument::Kind::kHelp:
      return &command_line.help;
    case Argument::Kind::kVersion:
      return &command_line.version;
    case Argument::Kind::kPrintConfigDoc:
      return &command_line.print_config_doc;
    case Argument::Kind::kPrintKnobs:
      return &command_line.print_knobs;
    case Argument::Kind::kFlag:
      return nullptr;
  }
  return nullptr;
}

template <typename Knob, typename Config>
requires KnobOf<Knob, Config>
class KnobTable {
 public:
  KnobTable(std::span<const Knob> knobs, std::string_view env_prefix)
      : knobs_(knobs), env_prefix_(env_prefix) {}

  std::span<const Knob> knobs() const { return knobs_; }

  const Knob* find(std::string_view name) const {
    for (const Knob& knob : knobs_) {
      if (knob.name == name) return &knob;
    }
    return nullptr;
  }

  std::string flag_name(const Knob& knob) const { return knobtable::flag_name(knob.name); }
  std::string env_name(const Knob& knob) const {
    return knobtable::env_name(env_prefix_, knob.name);
  }

  // Applies one knob's value; the error names the knob ("quantum: ...").
  Status apply(const Knob& knob, std::string_view value, Config& config) const {
    if (Status s = knob.apply(value, config); !s) {
      return make_error(std::string(knob.name) + ": " + s.error().message);
    }
    return Status::Ok();
  }

  // The configuration from every knob's default. The defaults are literals of the component's
  // table; each component's tests prove every one parses, so errors are not looked at here.
  Config defaults() const {
    Config config;
    for (const Knob& knob : knobs_) (void)apply(knob, knob.default_value, config);
    return config;
  }

  // Defaults, then the environment through `getenv`, then argv[1..argc).
  Result<CommandLine<Config>> parse_command_line(int argc, const char* const* argv,
                                                 const EnvLookup& getenv) const {
    CommandLine<Config> command_line;
    command_line.config = defaults();
    Config& config = command_line.config;

    for (const Knob& knob : knobs_) {
      const std::string env = env_name(knob);
      const char* value = getenv(env.c_str());
      if (value == nullptr || *value == '\0') continue;
      if (Status s = knob.apply(value, config); !s) {
        return make_error("environment variable " + env + ": " + s.error().message);
      }
    }

    for (int i = 1; i < argc; ++i) {
      auto argument = read_argument(argv[i]);
      if (!argument) return argument.error();
      const Argument& arg = argument.value();
      if (bool* request = request_flag(command_line, arg.kind)) {
        *request = true;
        continue;
      }
      const std::string flag = knobtable::flag_name(arg.name);
      const Knob* knob = find(arg.name);
      if (knob == nullptr) return make_error("unknown flag " + flag + " (see --help)");
      std::string_view value;
      if (arg.value) {
        value = *arg.value;
      } else if (is_switch(*knob)) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return make_error("flag " + flag + " needs a value (see --help)");
      }
      if (Status s = knob->apply(value, config); !s) {
        return make_error("flag " + flag + ": " + s.error().message);
      }
    }
    return command_line;
  }

  // The library's mode (it lives in other people's processes: no flags, never fails): defaults,
  // then the environment; a value that does not parse is a warning naming the variable, the value
  // and what is accepted, and the knob keeps its default.
  EnvironmentRead<Config> parse_environment(const EnvLookup& getenv) const {
    EnvironmentRead<Config> out{defaults(), {}};
    for (const Knob& knob : knobs_) {
      const std::string env = env_name(knob);
      const char* value = getenv ? getenv(env.c_str()) : nullptr;
      if (value == nullptr || *value == '\0') continue;
      if (Status s = knob.apply(value, out.config); !s) {
        out.warnings.push_back(env + "=\"" + value + "\": " + s.error().message +
                               "; using the default " + plain_default(knob.default_value));
      }
    }
    return out;
  }

  // `--print-knobs`: every knob as JSON, one object per knob ({"name", "flag", "env", "default",
  // "range", "meaning", "switch"}), for what deploys the program (the Helm chart's check reads
  // the knobs from the programs, not from a copy).
  std::string knobs_json() const {
    Json list = Json::array();
    for (const Knob& knob : knobs_) {
      Json entry = Json::object();
      entry.set("name", std::string(knob.name));
      entry.set("flag", flag_name(knob));
      entry.set("env", env_name(knob));
      entry.set("default", std::string(knob.default_value));
      entry.set("range", std::string(knob.range));
      entry.set("meaning", std::string(knob.meaning));
      entry.set("switch", is_switch(knob));
      list.push_back(std::move(entry));
    }
    return list.dump() + "\n";
  }

  // `--help`: usage, `summary` (wrapped), one entry per knob, then the requests.
  std::string help_text(std::string_view program, std::string_view summary) const {
    std::string out = help_header(program, summary);
    for (const Knob& knob : knobs_) {
      out += help_entry(flag_name(knob), env_name(knob), is_switch(knob), knob.meaning,
                        knob.default_value, knob.range);
    }
    return out + help_footer();
  }

  // The Markdown table of docs/configuration.md with `columns`, in order, one row per knob.
  std::string doc_table(std::initializer_list<DocColumn<Knob>> columns) const {
    std::vector<std::string> headers;
    for (const DocColumn<Knob>& column : columns) {
      headers.emplace_back(column.field ? field_header(*column.field) : column.header);
    }
    std::string out = doc_row(headers) + "|";
    for (std::size_t i = 0; i < headers.size(); ++i) out += "---|";
    out += "\n";
    for (const Knob& knob : knobs_) {
      std::vector<std::string> cells;
      for (const DocColumn<Knob>& column : columns) {
        cells.push_back(column.field ? field_cell(*column.field, knob) : column.cell(knob));
      }
      out += doc_row(cells);
    }
    return out;
  }

 private:
  static std::string_view field_header(DocField field) {
    switch (field) {
      case DocField::kKnob:
        return "knob";
      case DocField::kFlag:
        return "flag";
      case DocField::kEnvironment:
        return "environment variable";
      case DocField::kDefault:
        return "default";
      case DocField::kRange:
        return "range";
      case DocField::kMeaning:
        return "meaning";
    }
    return "";
  }

  std::string field_cell(DocField field, const Knob& knob) const {
    switch (field) {
      case DocField::kKnob:
        return std::string(knob.name);
      case DocField::kFlag:
        return "`" + flag_name(knob) + "`";
      case DocField::kEnvironment:
        return "`" + env_name(knob) + "`";
      case DocField::kDefault:
        return doc_default(knob.default_value);
      case DocField::kRange:
        return std::string(knob.range);
      case DocField::kMeaning:
        return std::string(knob.meaning);
    }
    return "";
  }

  std::span<const Knob> knobs_;
  std::string_view env_prefix_;
};

}  // namespace nvshare::knobtable
