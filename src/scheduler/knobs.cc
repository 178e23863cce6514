#include "scheduler/knobs.h"

#include <filesystem>

#include "common/default_paths.h"
#include "common/knob_parse.h"
#include "common/metrics_endpoint.h"
#include "common/protocol.h"
#include "common/quantity.h"
#include "common/shared_knobs.h"
#include "scheduler/metrics_server.h"

namespace nvshare::scheduler {
namespace {

using namespace std::chrono_literals;

// ---- value parsers (the generic ones live in common/knob_parse) --------------------------------

using knobparse::parse_bool;
using knobparse::parse_decimal;
using knobparse::parse_integer;
using knobparse::parse_log_level;
using knobparse::parse_memory_mode_setting;
using knobparse::parse_seconds;
using knobparse::parse_socket_path;
using knobparse::split_list;

Result<CapacitySpec> parse_capacity(std::string_view text) {
  CapacitySpec spec;
  if (text.empty()) return spec;  // unset: what the GPUs' clients report
  auto items = split_list(text, "capacity list");
  if (!items) return items.error();
  for (const std::string_view item : items.value()) {
    const std::size_t eq = item.find('=');
    const std::string_view quantity = eq == std::string_view::npos ? item : item.substr(eq + 1);
    auto bytes = parse_memory_quantity(quantity);
    if (!bytes) return bytes.error();
    if (bytes.value() == 0) return make_error("capacity \"" + std::string(item) + "\" is zero");
    if (eq == std::string_view::npos) {
      if (spec.all)
        return make_error("capacity for all GPUs given twice in \"" + std::string(text) + "\"");
      spec.all = bytes.value();
    } else {
      const std::string uuid(item.substr(0, eq));
      if (uuid.empty()) return make_error("capacity \"" + std::string(item) + "\" has no GPU UUID");
      if (!spec.by_gpu.emplace(uuid, bytes.value()).second) {
        return make_error("capacity for " + uuid + " given twice");
      }
    }
  }
  return spec;
}

// "nvml", or "UUID=QUANTITY,..." (each GPU once).
Result<std::optional<std::vector<GpuInfo>>> parse_gpus(std::string_view text) {
  if (text == "nvml") return std::optional<std::vector<GpuInfo>>();
  auto items = split_list(text, "GPU list");
  if (!items) return items.error();
  std::vector<GpuInfo> gpus;
  for (const std::string_view item : items.value()) {
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return make_error("\"" + std::string(item) + "\" is not UUID=QUANTITY (or say nvml)");
    }
    const std::string uuid(item.substr(0, eq));
    if (uuid.size() > protocol::kMaxUuidLength) {
      return make_error("GPU UUID \"" + uuid + "\" is longer than " +
                        std::to_string(protocol::kMaxUuidLength) + " bytes");
    }
    auto bytes = parse_memory_quantity(item.substr(eq + 1));
    if (!bytes) return bytes.error();
    if (bytes.value() == 0) return make_error("GPU " + uuid + " has zero memory");
    for (const GpuInfo& known : gpus) {
      if (known.uuid == uuid) return make_error("GPU " + uuid + " given twice");
    }
    gpus.push_back(GpuInfo{uuid, static_cast<unsigned>(gpus.size()), bytes.value()});
  }
  return std::optional<std::vector<GpuInfo>>(std::move(gpus));
}

// Bytes per second as a quantity, 1M..1T.
Result<std::uint64_t> parse_bandwidth(std::string_view text) {
  auto bytes = parse_memory_quantity(text);
  if (!bytes) return bytes.error();
  if (bytes.value() < 1'000'000 || bytes.value() > 1'000'000'000'000) {
    return make_error(std::string(text) + " is outside 1M..1T");
  }
  return bytes.value();
}

// ---- the table ----------------------------------------------------------------------------------

// Each apply function parses its text and stores it; the caller prefixes errors with the knob's
// name.
template <typename T, typename Store>
Status store(Result<T> parsed, Store&& assign) {
  if (!parsed) return parsed.error();
  assign(std::move(parsed).value());
  return Status::Ok();
}

constexpr double kMaxSeconds = 86400;

const Knob kKnobs[] = {
    {knobtable::kSocket.name, knobtable::kSocket.default_value, knobtable::kSocket.range,
     knobtable::kSocket.meaning, KnobScope::kDaemon, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_socket_path(v), [&](std::string p) { c.socket_path = std::move(p); });
     }},
    {knobtable::kControlSocket.name, knobtable::kControlSocket.default_value,
     knobtable::kControlSocket.range, knobtable::kControlSocket.meaning, KnobScope::kDaemon, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_socket_path(v),
                    [&](std::string p) { c.control_socket_path = std::move(p); });
     }},
    {"state-file", kDefaultStateFile, "a filesystem path, or empty",
     "Where the scheduler keeps the limits set for pods and processes, and the node's GPUs, "
     "across restarts (written atomically, read before any client is accepted). Empty: nowhere; "
     "a restarted scheduler then marks limits provisional, and clients keep the stricter of those "
     "and the ones they had, until the device plugin has pushed every limit again.",
     KnobScope::kDaemon, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       c.state_file = std::string(v);
       return Status::Ok();
     }},
    {"metrics-address", "", "`host:port` (an empty host: every interface), or empty",
     "Where the scheduler serves its metrics (GET /metrics, the Prometheus text format; "
     "docs/metrics.md), from a thread of its own. Empty: no metrics endpoint.",
     KnobScope::kDaemon, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store_metrics_address(v, c.metrics_address);
     }},
    {"mode", "auto", "`auto`, `exclusive`, `serial` (an alias of exclusive)",
     "`auto` runs clients whose working sets fit in memory together, except that clients which "
     "keep a deep queue (saturating) take turns with each other, and takes turns otherwise; "
     "`exclusive` gives the GPU to one client at a time, a holder that goes idle handing over at "
     "once while a client that fits waits (docs/benchmarks.md compares the two).",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(policy::parse_mode(v), [&](policy::Mode m) { c.policy.mode = m; });
     }},
    {"reserve", "10", "0..90 (percent)",
     "Share of each GPU's capacity kept free when deciding which clients fit together (driver "
     "context, fragmentation, allocations not yet reported).",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       std::string_view text = v;
       if (!text.empty() && text.back() == '%') text.remove_suffix(1);
       return store(parse_decimal(text, 0, 90, " percent"),
                    [&](double p) { c.policy.reserve_fraction = p / 100; });
     }},
    {"gpus", "nvml", "`nvml`, or a comma-separated list of `UUID=QUANTITY` items",
     "The GPUs this scheduler arbitrates and their physical memory. `nvml` reads them from the "
     "driver at start; the device plugin's inventory (control API `set-gpus`) adds to them. A "
     "list names them instead (hosts without NVML, tests). A client naming any other GPU is "
     "refused; a GPU's memory never comes from a client.",
     KnobScope::kDaemon, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_gpus(v),
                    [&](std::optional<std::vector<GpuInfo>> g) { c.gpus = std::move(g); });
     }},
    {"capacity", "", "empty, or a comma-separated list of `QUANTITY` and `UUID=QUANTITY` items",
     "Virtual memory capacity per GPU: a quantity (`24Gi`) applies to every GPU, `GPU-...=16Gi` to "
     "one (it wins over the plain quantity). Empty: the GPU's physical memory.",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_capacity(v), [&](CapacitySpec s) { c.capacity = std::move(s); });
     }},
    {"quantum", "auto", "`auto`, or 0.01..86400 (seconds)",
     "How long a client runs before it yields to a waiting client it cannot run beside. `auto`: "
     "quantum-k times the estimated swap time of the memory that must move, within "
     "[quantum-min, quantum-max].",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       if (v == "auto") {
         c.policy.fixed_quantum.reset();
         return Status::Ok();
       }
       return store(parse_seconds(v, 0.01, kMaxSeconds),
                    [&](Duration d) { c.policy.fixed_quantum = d; });
     }},
    {"quantum-k", "50", "0.1..1000",
     "Multiple of the estimated swap time that an `auto` quantum lasts, so swapping takes at most "
     "about 1/(k+1) of the GPU's time while the quantum is under quantum-max (2% with 50).",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_decimal(v, 0.1, 1000, ""),
                    [&](double k) { c.policy.quantum_swap_multiple = k; });
     }},
    {"quantum-min", "5", "0.01..86400 (seconds)", "Lower bound of an `auto` quantum.",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_seconds(v, 0.01, kMaxSeconds),
                    [&](Duration d) { c.policy.quantum_min = d; });
     }},
    {"quantum-max", "15", "0.01..86400 (seconds)",
     "Upper bound of an `auto` quantum. With revoke-grace and swap-allowance-max it bounds how "
     "long "
     "a client that ignores revokes can keep others waiting (30 s with the defaults).",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_seconds(v, 0.01, kMaxSeconds),
                    [&](Duration d) { c.policy.quantum_max = d; });
     }},
    {"turn-slice", "0.5", "0.01..86400 (seconds)",
     "One client at a time (exclusive mode, or while a compute cap binds) with nothing to swap: "
     "clients take turns by their fair clocks, each about turn-slice times its share of the GPU "
     "(1 when no cap applies).",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_seconds(v, 0.01, kMaxSeconds),
                    [&](Duration d) { c.policy.turn_slice = d; });
     }},
    {"cap-cycle", "0.25", "0.01..86400 (seconds)",
     "A capped client whose memory stays on the GPU is paused in cycles of this length (at most "
     "the quota window): it runs its cap times the cycle and waits the rest. Shorter cycles hold "
     "its share closer to its cap over short spans, at the price of more hand-offs; one whose "
     "memory went to the host cycles over the whole quota window.",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_seconds(v, 0.01, kMaxSeconds),
                    [&](Duration d) { c.policy.cap_cycle = d; });
     }},
    {"priority-interference", "0.5", "0..100 (percent)",
     "Priority classes: how much of the time a lower class's kernels, still running after it was "
     "preempted for a higher class, may delay the higher class's steps. A delay within a tenth of "
     "the higher class's step is free; longer ones are charged against a budget refilled at this "
     "rate, and a lower class out of budget does not run in the higher classes' idle moments.",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_decimal(v, 0, 100, " percent"),
                    [&](double p) { c.policy.priority_interference = p / 100; });
     }},
    {"priority-floor", "4", "0.01..86400 (seconds)",
     "The longest a lower class out of interference budget is held back from the higher classes' "
     "idle moments: it runs again at least this often. Also the budget's burst (this many seconds "
     "of priority-interference).",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_seconds(v, 0.01, kMaxSeconds),
                    [&](Duration d) { c.policy.priority_floor = d; });
     }},
    {"quota-window", "2000", "10..3600000 (milliseconds)",
     "Window of the compute caps: the depth of each capped client's token bucket and the period "
     "over which the effective share is shown.",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_integer(v, 10, 3'600'000), [&](std::int64_t ms) {
         c.policy.quota_window = std::chrono::milliseconds(ms);
       });
     }},
    {"revoke-grace", "5", "0.1..60 (seconds)",
     "How long a holder may take to release after a revoke (plus its swap allowance when it must "
     "swap out) before it stops blocking other clients.",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_seconds(v, 0.1, 60), [&](Duration d) { c.policy.revoke_grace = d; });
     }},
    {"swap-allowance-max", "10", "0..120 (seconds)",
     "Most time a revoked holder gets on top of the grace to move its memory to host: its "
     "estimated swap time (its allocation, at most the GPU's memory, at its measured bandwidth, "
     "at least swap-bandwidth-floor), capped here. A client that ignored a revoke once gets none.",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_seconds(v, 0, 120), [&](Duration d) { c.policy.swap_allowance_max = d; });
     }},
    {"swap-bandwidth", "2G", "1M..1T (bytes per second, a quantity)",
     "Swap bandwidth assumed for the `auto` quantum until a client reports a measured one.",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_bandwidth(v),
                    [&](std::uint64_t b) { c.policy.default_swap_bytes_per_s = b; });
     }},
    {"swap-bandwidth-floor", "1G", "1M..1T (bytes per second, a quantity)",
     "A client's reported swap bandwidth counts as at least this in its quantum and swap "
     "allowance, so a client cannot stretch either by reporting a slow swap.",
     KnobScope::kPolicy, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_bandwidth(v),
                    [&](std::uint64_t b) { c.policy.swap_bandwidth_floor = b; });
     }},
    {"trust-client-limits", "false", "`true`, `false`",
     "Honour the limits and pod UID a client declares in its hello (local mode, nvshare-run). Off "
     "on "
     "Kubernetes nodes, where limits come from the control API and the pod from the cgroup.",
     KnobScope::kDaemon, true,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_bool(v), [&](bool b) { c.trust_client_limits = b; });
     }},
    {"memory-mode", "", "empty, `device`, `unified`, `plain`",
     "The memory mode clients get (how their device allocations are backed, "
     "docs/memory-modes.md) when neither their pod's `nvshare.com/gpu-memory-mode` annotation "
     "nor `set-limits` names one; a process that sets NVSHARE_MEMORY_MODE keeps its own. Empty: "
     "the clients' default, `device`.",
     KnobScope::kDaemon, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_memory_mode_setting(v),
                    [&](std::optional<MemoryMode> m) { c.memory_mode = m; });
     }},
    {"client-buffer-limit", "1Mi", "64Ki..1Gi (a quantity)",
     "Output a client may leave unread before the scheduler drops its connection, so a stuck "
     "client can never stall the scheduler or grow its memory.",
     KnobScope::kDaemon, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       auto bytes = parse_memory_quantity(v);
       if (!bytes) return bytes.error();
       if (bytes.value() < std::uint64_t{64} * 1024 || bytes.value() > (1ull << 30)) {
         return make_error(std::string(v) + " is outside 64Ki..1Gi");
       }
       c.client_buffer_limit = bytes.value();
       return Status::Ok();
     }},
    {"hello-timeout", "5", "0.1..60 (seconds)",
     "A client connection that has not said hello within this is closed, so connections that "
     "never speak cannot pile up.",
     KnobScope::kDaemon, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_seconds(v, 0.1, 60), [&](Duration d) { c.hello_timeout = d; });
     }},
    {"max-sessions-per-uid", "256", "1..65536",
     "Client sessions (one per process and GPU) one uid may hold outside pods; host root is "
     "exempt. Connections over it are closed at once.",
     KnobScope::kDaemon, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_integer(v, 1, 65536),
                    [&](std::int64_t n) { c.max_sessions_per_uid = static_cast<std::size_t>(n); });
     }},
    {"max-sessions-per-pod", "256", "1..65536",
     "Client sessions all the processes of one pod may hold together (whatever their uids). "
     "Connections over it are closed at once.",
     KnobScope::kDaemon, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_integer(v, 1, 65536),
                    [&](std::int64_t n) { c.max_sessions_per_pod = static_cast<std::size_t>(n); });
     }},
    {knobtable::kLogLevel.name, knobtable::kLogLevel.default_value, knobtable::kLogLevel.range,
     knobtable::kLogLevel.meaning, KnobScope::kDaemon, false,
     [](std::string_view v, DaemonConfig& c) -> Status {
       return store(parse_log_level(v), [&](LogLevel l) { c.log_level = l; });
     }},
};

const knobtable::KnobTable<Knob, DaemonConfig> kTable(kKnobs, "NVSHARE_");

}  // namespace

std::optional<std::uint64_t> CapacitySpec::for_gpu(const std::string& uuid) const {
  if (auto it = by_gpu.find(uuid); it != by_gpu.end()) return it->second;
  return all;
}

std::string CapacitySpec::to_string() const {
  const auto quantity = [](std::uint64_t bytes) {
    std::string text = format_bytes(bytes);
    auto back = parse_memory_quantity(text);
    return back.ok() && back.value() == bytes ? text : std::to_string(bytes);
  };
  std::string out;
  if (all) out = quantity(*all);
  for (const auto& [uuid, bytes] : by_gpu) {
    if (!out.empty()) out += ',';
    out += uuid + "=" + quantity(bytes);
  }
  return out;
}

std::span<const Knob> knobs() { return kKnobs; }
const Knob* find_knob(std::string_view name) { return kTable.find(name); }
std::string flag_name(const Knob& knob) { return kTable.flag_name(knob); }
std::string env_name(const Knob& knob) { return kTable.env_name(knob); }

std::string set_policy_member(const Knob& knob) {
  if (knob.scope != KnobScope::kPolicy) return "";
  if (knob.name == "quota-window") return "quota_window_ms";
  std::string member(knob.name);
  for (char& ch : member) {
    if (ch == '-') ch = '_';
  }
  return member;
}

const Knob* knob_for_set_policy_member(std::string_view member) {
  for (const Knob& knob : kKnobs) {
    if (knob.scope == KnobScope::kPolicy &&
        (set_policy_member(knob) == member || knob.name == member)) {
      return &knob;
    }
  }
  return nullptr;
}

Status apply_knob(const Knob& knob, std::string_view value, DaemonConfig& config) {
  return kTable.apply(knob, value, config);
}

DaemonConfig default_config() { return kTable.defaults(); }

Status check_sockets_differ(const DaemonConfig& config) {
  // The same file would serve one of them only: every client would then fail open, or the control
  // socket (root's) would be the one mounted into containers.
  const auto normal = [](const std::string& path) {
    std::error_code ec;
    std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
    return ec ? std::filesystem::path(path).lexically_normal() : p;
  };
  if (normal(config.socket_path) == normal(config.control_socket_path)) {
    return make_error("--socket and --control-socket name the same file (" + config.socket_path +
                      "); they must differ");
  }
  return Status::Ok();
}

Result<CommandLine> parse_command_line(int argc, const char* const* argv, const EnvLookup& getenv) {
  auto command_line = kTable.parse_command_line(argc, argv, getenv);
  if (!command_line) return command_line;
  if (Status s = check_sockets_differ(command_line.value().config); !s) return s.error();
  if (Status s = policy::validate(command_line.value().config.policy); !s) {
    return make_error("invalid policy settings: " + s.error().message);
  }
  return command_line;
}

std::string help_text(std::string_view program) {
  return kTable.help_text(
      program,
      "nvshare-scheduler arbitrates each GPU of this node between the processes that share it. "
      "Every flag can also be set by its environment variable; flags win over the environment.");
}

std::string knobs_json() { return kTable.knobs_json(); }

std::string config_doc_table() {
  using knobtable::DocField;
  return kTable.doc_table({DocField::kKnob,
                           DocField::kFlag,
                           DocField::kEnvironment,
                           DocField::kDefault,
                           DocField::kRange,
                           {"set-policy member",
                            [](const Knob& knob) -> std::string {
                              return knob.scope == KnobScope::kPolicy
                                         ? "`" + set_policy_member(knob) + "`"
                                         : "(start only)";
                            }},
                           DocField::kMeaning});
}

}  // namespace nvshare::scheduler
