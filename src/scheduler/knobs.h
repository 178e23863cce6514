// The scheduler's configuration: every knob defined once, in one table.
//
// Each knob has a name ("quantum"), from which its flag (--quantum) and environment variable
// (NVSHARE_QUANTUM) are derived, a default, a range and a meaning. The table is the only
// definition: the daemon's starting configuration is built by applying each knob's default text,
// then the environment, then the command line (later wins); `--help`, `--print-config-doc` and the
// table in docs/configuration.md are generated from it (a test checks the document is current).
// The mechanism is common/knob_table.h, shared with the device plugin; this file holds the table
// and what only the scheduler has (knob scopes, set-policy members, policy validation).
//
// Knobs of scope kPolicy are per-GPU policy settings; the control API's set-policy applies them at
// run time through the same parsers (apply_knob), so a value means the same thing wherever it is
// written.
//
// Contract: parsing never exits or throws; every error names the knob, where the value came from
// (flag or environment variable) and what is accepted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/gpu_inventory.h"
#include "common/knob_table.h"
#include "common/log.h"
#include "common/memory_mode.h"
#include "common/result.h"
#include "scheduler/policy/config.h"

namespace nvshare::scheduler {

// Virtual capacity: one quantity for every GPU and/or quantities for named GPUs (the named ones
// win).
struct CapacitySpec {
  std::optional<std::uint64_t> all;
  std::map<std::string, std::uint64_t> by_gpu;

  // The capacity for one GPU: nullopt means "what the GPU's clients report".
  std::optional<std::uint64_t> for_gpu(const std::string& uuid) const;
  // Renders the spec the way the knob accepts it ("24Gi,GPU-1=16Gi"; "" when unset).
  std::string to_string() const;
};

struct DaemonConfig {
  std::string socket_path;
  std::string control_socket_path;
  // Where GET /metrics is served ("host:port"); empty: nowhere.
  std::string metrics_address;
  // Where pod limits, processes' own limits and the GPUs are kept across restarts; empty: nowhere.
  std::string state_file;
  // Policy settings shared by all GPUs; capacity_bytes is resolved per GPU from `capacity`.
  policy::PolicyConfig policy;
  CapacitySpec capacity;
  // The node's GPUs and their physical memory: nullopt reads them from NVML at start (the device
  // plugin's inventory, pushed with set-gpus, adds to them); a list names them (hosts without
  // NVML, tests).
  std::optional<std::vector<GpuInfo>> gpus;
  bool trust_client_limits = false;
  // The memory mode clients get when neither their pod nor an operator named one (nullopt: none,
  // the client's own default).
  std::optional<MemoryMode> memory_mode;
  LogLevel log_level = LogLevel::kInfo;
  std::size_t client_buffer_limit = 0;
  // A connection that has not said hello within this is closed.
  Duration hello_timeout{0};
  // Client sessions one uid (outside pods; host root is exempt) or one pod may hold.
  std::size_t max_sessions_per_uid = 0;
  std::size_t max_sessions_per_pod = 0;
};

enum class KnobScope {
  kDaemon,  // read at start
  kPolicy,  // also settable per GPU at run time (control API set-policy)
};

struct Knob {
  std::string_view name;
  std::string_view default_value;
  std::string_view range;
  std::string_view meaning;
  KnobScope scope;
  bool is_switch;  // a boolean flag: `--name` alone means true
  Status (*apply)(std::string_view value, DaemonConfig& config);
};

std::span<const Knob> knobs();
const Knob* find_knob(std::string_view name);
std::string flag_name(const Knob& knob);  // "--quota-window"
std::string env_name(const Knob& knob);   // "NVSHARE_QUOTA_WINDOW"
// The member of a control API set-policy request that sets a kPolicy knob: the name with '_' for
// '-', and "quota_window_ms" for quota-window (its unit is in the name). Empty for kDaemon knobs.
std::string set_policy_member(const Knob& knob);
// The kPolicy knob a set-policy member sets (also accepts the knob's own name), or nullptr.
const Knob* knob_for_set_policy_member(std::string_view member);

// Applies one knob's value; the error names the knob.
Status apply_knob(const Knob& knob, std::string_view value, DaemonConfig& config);

// The configuration from every knob's default (valid by construction; a test checks it).
DaemonConfig default_config();

using CommandLine = knobtable::CommandLine<DaemonConfig>;
using EnvLookup = knobtable::EnvLookup;

// Builds the configuration from the defaults, then the environment (through `getenv`), then argv
// (`--name value`, `--name=value`, switches as `--name` or `--name=true|false`). Validates the
// policy settings as a whole (policy::validate) and that the two sockets differ at the end.
Result<CommandLine> parse_command_line(int argc, const char* const* argv, const EnvLookup& getenv);

// The client socket and the control socket must be different files.
Status check_sockets_differ(const DaemonConfig& config);

// `--help` text and the Markdown table of docs/configuration.md, both generated from the table.
std::string help_text(std::string_view program);
std::string config_doc_table();
// `--print-knobs`: the knobs as JSON (knob_table.h).
std::string knobs_json();

}  // namespace nvshare::scheduler
