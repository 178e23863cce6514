#include "client/config.h"

#include <strings.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>

#include "common/default_paths.h"
#include "common/knob_parse.h"
#include "common/knob_table.h"
#include "common/quantity.h"
#include "common/shared_knobs.h"

namespace nvshare::client {
namespace {

std::string quoted(std::string_view value) { return "\"" + std::string(value) + "\""; }

Result<Duration> parse_milliseconds(std::string_view value, std::int64_t low, std::int64_t high) {
  std::int64_t ms = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), ms);
  if (error != std::errc() || end != value.data() + value.size()) {
    return make_error(quoted(value) + " is not a whole number of milliseconds");
  }
  if (ms < low || ms > high) {
    return make_error(std::to_string(ms) + " is outside " + std::to_string(low) + ".." +
                      std::to_string(high) + " (milliseconds)");
  }
  return Duration(std::chrono::milliseconds(ms));
}

Status apply_enable(std::string_view value, ClientConfig& config) {
  auto parsed = knobparse::parse_bool(value);
  if (!parsed) return parsed.error();
  config.enabled = parsed.value();
  return Status::Ok();
}

Status apply_socket(std::string_view value, ClientConfig& config) {
  auto path = knobparse::parse_socket_path(value);
  if (!path) return path.error();
  config.socket_path = std::move(path).value();
  return Status::Ok();
}

Status apply_idle_release(std::string_view value, ClientConfig& config) {
  auto parsed = parse_milliseconds(value, 0, 3'600'000);
  if (!parsed) return parsed.error();
  config.idle_release = parsed.value();
  return Status::Ok();
}

Status apply_drain_bound(std::string_view value, ClientConfig& config) {
  auto parsed = parse_milliseconds(value, 1, 60'000);
  if (!parsed) return parsed.error();
  config.drain_bound = parsed.value();
  return Status::Ok();
}

Status apply_memory_limit(std::string_view value, ClientConfig& config) {
  auto parsed = parse_memory_quantity(value);
  if (!parsed) return parsed.error();
  config.declared_limits.memory_bytes = parsed.value();
  return Status::Ok();
}

Status apply_core_limit(std::string_view value, ClientConfig& config) {
  auto parsed = parse_percent(value);
  if (!parsed) return parsed.error();
  config.declared_limits.core_percent = static_cast<std::uint8_t>(parsed.value());
  return Status::Ok();
}

Status apply_pod_uid(std::string_view value, ClientConfig& config) {
  // The hello carries it in a string field of this maximum; longer would make the frame
  // unencodable.
  if (value.size() > protocol::kMaxUuidLength) {
    return make_error("longer than " + std::to_string(protocol::kMaxUuidLength) + " bytes");
  }
  config.pod_uid = std::string(value);
  return Status::Ok();
}

Status apply_memory_mode(std::string_view value, ClientConfig& config) {
  auto mode =
      knobparse::parse_memory_mode_setting(value);  // unset: the scheduler's word, else device
  if (!mode) return mode.error();
  config.memory_mode = mode.value();
  return Status::Ok();
}

Status apply_priority(std::string_view value, ClientConfig& config) {
  if (value.empty()) {
    config.declared_limits.priority = protocol::Limits::kNoPriority;
    return Status::Ok();
  }
  const std::optional<Priority> priority = parse_priority(value);
  if (!priority) return make_error("not one of " + std::string(kPriorityWords));
  config.declared_limits.priority = protocol::priority_code(*priority);
  return Status::Ok();
}

Status apply_reconnect_max(std::string_view value, ClientConfig& config) {
  auto parsed = parse_milliseconds(value, 50, 600'000);
  if (!parsed) return parsed.error();
  config.reconnect_max = parsed.value();
  return Status::Ok();
}

Status apply_register_wait(std::string_view value, ClientConfig& config) {
  auto parsed = parse_milliseconds(value, 0, 10'000);
  if (!parsed) return parsed.error();
  config.register_wait = parsed.value();
  return Status::Ok();
}

Status apply_log_level(std::string_view value, ClientConfig& config) {
  auto level = knobparse::parse_log_level(value);
  if (!level) return level.error();
  config.log_level = level.value();
  return Status::Ok();
}

// The one definition of every client knob. Keep meanings to one or two sentences: they are the
// documentation (docs/configuration.md is generated from them).
Status apply_trace_file(std::string_view value, ClientConfig& config) {
  config.trace_file = std::string(value);
  return Status::Ok();
}

constexpr std::array<ClientKnob, 13> kKnobs = {{
    {"enable", "1", "`1`, `0` (also `true`/`false`, `yes`/`no`, `on`/`off`, any letter case)",
     "`0` makes the library a pure pass-through: no gating, no scheduler connection, no memory "
     "virtualization. Ignored in a container whose settings file enforces (`/etc/nvshare`).",
     apply_enable},
    {knobtable::kSocket.name, knobtable::kSocket.default_value, knobtable::kSocket.range,
     knobtable::kSocket.meaning, apply_socket},
    {"idle-release-ms", "100", "0..3600000 (milliseconds; 0: never)",
     "A holder that has submitted nothing for this long, with all its work complete, gives the "
     "grant back by itself and asks again on its next submission. While a job waits for its "
     "memory (a swap notice), after 20 ms or twice the pause it makes again and again, if "
     "shorter (scheduling.md, "
     "\"A noticed holder releases sooner\").",
     apply_idle_release},
    {"drain-bound-ms", "50", "1..60000 (milliseconds)",
     "GPU work the process may have queued, measured in time, so that a revoke drains within "
     "about this long (at most 10 ms while it is capped, 2 ms while it is low).",
     apply_drain_bound},
    {"memory-limit", "", "empty, or a quantity (`4Gi`, `512Mi`, `4G`; `0`: none)",
     "Memory limit the process declares for itself on each GPU. Enforced locally from the start; "
     "the scheduler honours it only with `--trust-client-limits` (local mode, `nvshare-run`). In a "
     "container whose settings file enforces, it can only lower the file's limit.",
     apply_memory_limit},
    {"core-limit", "100", "1..100 (percent; 100: uncapped)",
     "Compute cap the process declares for itself, honoured only by a scheduler that trusts "
     "client limits.",
     apply_core_limit},
    {"pod-uid", "", "empty, or at most 64 bytes",
     "Pod identity the process declares. Informational: the scheduler takes the pod from the "
     "process's cgroup unless it trusts client limits.",
     apply_pod_uid},
    {"memory-mode", "", kMemoryModeWords,
     "How device allocations are backed. `device`: device memory mapped at a fixed address, "
     "swapped at a hand-off by copies. `unified`: managed memory, swapped by prefetch, lets one "
     "job use more than its GPU holds. `plain`: never swapped (still counted and limited). Unset: "
     "the mode the scheduler gives (the pod's `nvshare.com/gpu-memory-mode` annotation or the "
     "scheduler's `memory-mode`), else `device`.",
     apply_memory_mode},
    {"priority", "", "empty, `high`, `normal`, `low`",
     "Priority class the process declares for itself (docs/scheduling.md, \"Priority classes\"), "
     "honoured only by a scheduler that trusts client limits (nvshare-run's). On Kubernetes the "
     "pod's nvshare.com/gpu-priority annotation gives the class.",
     apply_priority},
    {"reconnect-max-ms", "2000", "50..600000 (milliseconds)",
     "Longest wait between attempts to reach the scheduler again; attempts start at 50 ms and "
     "double up to this. In a container whose settings file enforces, the file's.",
     apply_reconnect_max},
    {"register-wait-ms", "1000", "0..10000 (milliseconds; 0: no wait)",
     "How long the first CUDA call on a GPU waits for the scheduler to register the process and "
     "send its limits, so a limit set for the pod holds from the first allocation. No wait when "
     "nothing listens on the socket. In a container whose settings file enforces, the file's.",
     apply_register_wait},
    {knobtable::kLogLevel.name, knobtable::kLogLevel.default_value, knobtable::kLogLevel.range,
     knobtable::kLogLevel.meaning, apply_log_level},
    {"trace-file", "", "empty, or a filesystem path",
     "Appends one JSON line per grant event (request, grant, revoke, release, idle release, swap "
     "notice, eviction, a longer pause learnt) with its CLOCK_MONOTONIC time, for benchmarks and "
     "schedule plots. Empty: no trace.",
     apply_trace_file},
}};

const knobtable::KnobTable<ClientKnob, ClientConfig> kTable(kKnobs, "NVSHARE_");

}  // namespace

std::span<const ClientKnob> client_knobs() { return kKnobs; }

const ClientKnob* find_client_knob(std::string_view name) { return kTable.find(name); }

std::string client_env_name(const ClientKnob& knob) { return kTable.env_name(knob); }

ClientConfig default_client_config() { return kTable.defaults(); }

namespace {

// The members a settings file that enforces sets, whatever the environment says.
bool same_enforced(const ClientConfig& a, const ClientConfig& b) {
  return a.enabled == b.enabled && a.socket_path == b.socket_path &&
         a.register_wait == b.register_wait && a.reconnect_max == b.reconnect_max;
}

// Enforcement from a settings file: its values win over the environment's. A variable that says
// something else is named in a warning; one that says the same (the socket a device plugin also
// puts in the environment) is not.
void apply_settings(const ClientSettings& settings, const ClientEnvLookup& getenv,
                    ParsedClientConfig& out) {
  ClientConfig& config = out.config;
  config.enforced = true;
  const ClientConfig defaults = default_client_config();
  config.enabled = true;
  config.socket_path = settings.socket.value_or(defaults.socket_path);
  config.register_wait = settings.register_wait.value_or(defaults.register_wait);
  config.reconnect_max = settings.reconnect_max.value_or(defaults.reconnect_max);
  config.memory_limit_pending = settings.memory_pending;
  if (settings.memory_bytes) {
    config.declared_limits.memory_bytes =
        protocol::stricter_memory(config.declared_limits.memory_bytes, *settings.memory_bytes);
  }
  for (const char* name : {"enable", "socket", "register-wait-ms", "reconnect-max-ms"}) {
    const ClientKnob& knob = *find_client_knob(name);
    const std::string env = client_env_name(knob);
    const char* value = getenv ? getenv(env.c_str()) : nullptr;
    if (value == nullptr || *value == '\0') continue;
    ClientConfig asked = config;
    if (knob.apply(value, asked).ok() && same_enforced(asked, config)) continue;
    out.warnings.push_back(env + "=" + quoted(value) +
                           ": ignored: this container's nvshare settings (" + kSettingsPath +
                           ") enforce its limits");
  }
}

}  // namespace

ParsedClientConfig parse_client_config(const ClientEnvLookup& getenv,
                                       const std::optional<ClientSettings>& settings) {
  knobtable::EnvironmentRead<ClientConfig> read = kTable.parse_environment(getenv);
  ParsedClientConfig out{std::move(read.config), std::move(read.warnings)};
  if (settings && settings->enforce) apply_settings(*settings, getenv, out);
  return out;
}

const ClientConfig& client_config() {
  static const ClientConfig config = [] {
    const SettingsRead settings = read_client_settings(kSettingsPath);
    if (!settings.warning.empty()) NVSHARE_WARN("%s", settings.warning.c_str());
    ParsedClientConfig parsed =
        parse_client_config([](const char* name) { return std::getenv(name); }, settings.settings);
    for (const std::string& warning : parsed.warnings) NVSHARE_WARN("%s", warning.c_str());
    if (parsed.config.enforced) parsed.config.settings_path = kSettingsPath;
    return parsed.config;
  }();
  return config;
}

std::string client_config_doc_table() {
  using knobtable::DocField;
  return kTable.doc_table({{DocField::kKnob},
                           {DocField::kEnvironment},
                           {DocField::kDefault},
                           {DocField::kRange},
                           {DocField::kMeaning}});
}

}  // namespace nvshare::client
