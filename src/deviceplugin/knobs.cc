#include "deviceplugin/knobs.h"

#include <cctype>
#include <cmath>
#include <filesystem>

#include "common/default_paths.h"
#include "common/knob_parse.h"
#include "common/metrics_endpoint.h"
#include "common/quantity.h"
#include "common/shared_knobs.h"
#include "deviceplugin/cdi_spec.h"

namespace nvshare::deviceplugin {
namespace {

using knobparse::parse_integer;
using knobparse::parse_log_level;
using knobparse::parse_seconds;
using knobparse::parse_seconds_with_unit;
using knobparse::parse_socket_path;
using knobparse::split_list;

constexpr std::size_t kMaxUnixPath = 107;  // sun_path holds 108 bytes with the terminating NUL

template <typename T, typename Store>
Status store(Result<T> parsed, Store&& assign) {
  if (!parsed) return parsed.error();
  assign(std::move(parsed).value());
  return Status::Ok();
}

bool all_digits(std::string_view text) {
  if (text.empty()) return false;
  for (char ch : text) {
    if (!std::isdigit(static_cast<unsigned char>(ch))) return false;
  }
  return true;
}

// A GPU named by NVML index ("0") or by UUID ("GPU-...", "MIG-...").
Result<std::optional<unsigned>> parse_gpu_name(std::string_view item) {
  if (all_digits(item)) {
    auto index = parse_integer(item, 0, 1023);
    if (!index) return make_error("GPU index " + index.error().message);
    return std::optional<unsigned>(static_cast<unsigned>(index.value()));
  }
  if (item.substr(0, 4) != "GPU-" && item.substr(0, 4) != "MIG-") {
    return make_error("\"" + std::string(item) +
                      "\" is neither a GPU index nor a GPU UUID (GPU-...)");
  }
  return std::optional<unsigned>();
}

Result<GpuSelection> parse_gpus(std::string_view text) {
  GpuSelection selection;
  if (text == "all") return selection;
  if (text.empty()) return make_error("empty (use `all` for every GPU)");
  auto items = split_list(text, "GPU list");
  if (!items) return items.error();
  selection.all = false;
  for (std::string_view item : items.value()) {
    auto index = parse_gpu_name(item);
    if (!index) return index.error();
    if (index.value()) {
      for (unsigned known : selection.indexes) {
        if (known == *index.value()) return make_error("GPU " + std::string(item) + " given twice");
      }
      selection.indexes.push_back(*index.value());
    } else {
      for (const std::string& known : selection.uuids) {
        if (known == item) return make_error("GPU " + std::string(item) + " given twice");
      }
      selection.uuids.emplace_back(item);
    }
  }
  return selection;
}

// "16Gi" (a quantity) or "1.5x" (a factor of the physical memory, 0.01..1000).
Result<CapacityValue> parse_capacity_value(std::string_view text) {
  CapacityValue value;
  if (!text.empty() && text.back() == 'x') {
    auto factor = knobparse::parse_decimal(text.substr(0, text.size() - 1), 0.01, 1000, "");
    if (!factor)
      return make_error("factor \"" + std::string(text) + "\": " + factor.error().message);
    value.factor = factor.value();
    return value;
  }
  auto bytes = parse_memory_quantity(text);
  if (!bytes) return bytes.error();
  if (bytes.value() == 0) return make_error("capacity \"" + std::string(text) + "\" is zero");
  value.bytes = bytes.value();
  return value;
}

Result<MemoryCapacitySpec> parse_memory_capacity(std::string_view text) {
  MemoryCapacitySpec spec;
  if (text.empty()) return spec;
  auto items = split_list(text, "memory-capacity list");
  if (!items) return items.error();
  for (std::string_view item : items.value()) {
    const std::size_t eq = item.find('=');
    auto value = parse_capacity_value(eq == std::string_view::npos ? item : item.substr(eq + 1));
    if (!value) return value.error();
    if (eq == std::string_view::npos) {
      if (spec.all)
        return make_error("capacity for all GPUs given twice in \"" + std::string(text) + "\"");
      spec.all = value.value();
      continue;
    }
    const std::string_view gpu = item.substr(0, eq);
    if (gpu.empty()) return make_error("capacity \"" + std::string(item) + "\" names no GPU");
    auto index = parse_gpu_name(gpu);
    if (!index) return index.error();
    const bool fresh = index.value() ? spec.by_index.emplace(*index.value(), value.value()).second
                                     : spec.by_uuid.emplace(std::string(gpu), value.value()).second;
    if (!fresh) return make_error("capacity for GPU " + std::string(gpu) + " given twice");
  }
  return spec;
}

// An extended resource name: `<domain>/<name>`, the domain a DNS subdomain outside kubernetes.io,
// the name at most 63 characters of [A-Za-z0-9._-] that starts and ends alphanumeric.
Status check_resource_name(std::string_view text) {
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == text.size() ||
      text.find('/', slash + 1) != std::string_view::npos) {
    return make_error("\"" + std::string(text) + "\" is not of the form <domain>/<name>");
  }
  const std::string_view domain = text.substr(0, slash);
  const std::string_view name = text.substr(slash + 1);
  if (domain.size() > 253) return make_error("domain of \"" + std::string(text) + "\" is too long");
  for (char ch : domain) {
    if (!(std::islower(static_cast<unsigned char>(ch)) ||
          std::isdigit(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.')) {
      return make_error("domain \"" + std::string(domain) +
                        "\" may hold only lower-case letters, digits, '-' and '.'");
    }
  }
  if (domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") || domain == "k8s.io" ||
      domain.ends_with(".k8s.io")) {
    return make_error("domain \"" + std::string(domain) + "\" is reserved by Kubernetes");
  }
  if (name.size() > 63)
    return make_error("name \"" + std::string(name) + "\" exceeds 63 characters");
  const auto alnum = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) != 0; };
  if (!alnum(name.front()) || !alnum(name.back())) {
    return make_error("name \"" + std::string(name) +
                      "\" must start and end with a letter or digit");
  }
  for (char ch : name) {
    if (!(alnum(ch) || ch == '-' || ch == '_' || ch == '.')) {
      return make_error("name \"" + std::string(name) +
                        "\" may hold only letters, digits, '-', '_', '.'");
    }
  }
  return Status::Ok();
}

Result<DeviceListStrategy> parse_device_list_strategy(std::string_view text) {
  if (text.empty())
    return make_error("empty (name at least one of cdi-cri, envvar, volume-mounts)");
  auto items = split_list(text, "strategy list");
  if (!items) return items.error();
  DeviceListStrategy strategy{false, false, false};
  for (std::string_view item : items.value()) {
    bool* flag = item == "cdi-cri"         ? &strategy.cdi_cri
                 : item == "envvar"        ? &strategy.envvar
                 : item == "volume-mounts" ? &strategy.volume_mounts
                                           : nullptr;
    if (flag == nullptr) {
      return make_error("\"" + std::string(item) +
                        "\" is not one of cdi-cri, envvar, volume-mounts");
    }
    if (*flag) return make_error("\"" + std::string(item) + "\" is named twice");
    *flag = true;
  }
  if (strategy.envvar && strategy.volume_mounts) {
    return make_error("envvar and volume-mounts both set NVIDIA_VISIBLE_DEVICES: name one of them");
  }
  return strategy;
}

Result<std::string> parse_path(std::string_view text) {
  if (text.empty()) return make_error("the path is empty");
  if (text.front() != '/')
    return make_error("\"" + std::string(text) + "\" is not an absolute path");
  return std::string(text);
}

Result<std::string> parse_directory(std::string_view text, std::string_view longest_child) {
  auto path = parse_path(text);
  if (!path) return path;
  while (path.value().size() > 1 && path.value().back() == '/') path.value().pop_back();
  if (path.value().size() + 1 + longest_child.size() > kMaxUnixPath) {
    return make_error("\"" + path.value() + "/" + std::string(longest_child) +
                      "\" is longer than " + std::to_string(kMaxUnixPath) +
                      " bytes (a unix socket path)");
  }
  return path;
}

const Knob kKnobs[] = {
    {"resource-name", "nvshare.com/gpu", "`<domain>/<name>` (an extended resource name)",
     "Extended resource the plugin advertises; pods request it in resources.limits.",
     [](std::string_view v, PluginConfig& c) -> Status {
       if (Status s = check_resource_name(v); !s) return s;
       c.resource_name = std::string(v);
       return Status::Ok();
     }},
    {"slots-per-gpu", "10", "1..1000",
     "Devices advertised per physical GPU, with IDs `<GPU-UUID>__<n>` (n = 0..slots-1): how many "
     "containers may share one GPU.",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_integer(v, 1, 1000),
                    [&](std::int64_t n) { c.slots_per_gpu = static_cast<int>(n); });
     }},
    {"fail-requests-greater-than-one", "false", "true or false",
     "Refuse Allocate for any container asking for more than one slot. Whatever this says, a "
     "container's slots must lie on distinct GPUs: two slots of one GPU are refused.",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(knobparse::parse_bool(v),
                    [&](bool b) { c.fail_requests_greater_than_one = b; });
     }},
    {"gpus", "all", "`all`, or a comma-separated list of GPU UUIDs and/or NVML indexes",
     "GPUs the plugin manages; the others are left alone.",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_gpus(v), [&](GpuSelection s) { c.gpus = std::move(s); });
     }},
    {"memory-capacity", "",
     "empty, or a comma-separated list of `VALUE` and `GPU=VALUE` items, VALUE a quantity (`80Gi`) "
     "or a factor of the physical memory (`1.5x`), GPU a UUID or an index",
     "Virtual memory capacity per GPU, used for placement and, when set, pushed to the scheduler "
     "(control API set-policy `capacity`). A plain VALUE applies to every GPU, `GPU-...=16Gi` to "
     "one "
     "(it wins). Empty: the physical memory, and the scheduler keeps its own setting.",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_memory_capacity(v),
                    [&](MemoryCapacitySpec s) { c.memory_capacity = std::move(s); });
     }},
    {"kubelet-dir", "/var/lib/kubelet/device-plugins", "an absolute directory path",
     "Directory of the kubelet's registration socket (kubelet.sock) and of the plugin's own socket "
     "(nvshare.sock).",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_directory(v, PluginConfig::kPluginSocketName),
                    [&](std::string p) { c.kubelet_dir = std::move(p); });
     }},
    {"pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock",
     "an absolute socket path",
     "The kubelet's pod-resources API, read at each placement to count the pods holding slots of "
     "each GPU.",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_socket_path(v),
                    [&](std::string p) { c.pod_resources_socket = std::move(p); });
     }},
    {"library-host-path", "/var/lib/nvshare/lib/libnvshare.so", "an absolute file path",
     "Where libnvshare.so lies on the host (installed there by the init container); mounted "
     "read-only into each container.",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_path(v), [&](std::string p) { c.library_host_path = std::move(p); });
     }},
    {"library-container-path", "/usr/lib/nvshare/libnvshare.so", "an absolute file path",
     "Where Allocate mounts the library inside the container (and what is preloaded).",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_path(v), [&](std::string p) { c.library_container_path = std::move(p); });
     }},
    {"injection", "ld-preload", "`ld-preload`, `ld-so-preload`",
     "How containers load the library: `ld-preload` sets LD_PRELOAD; `ld-so-preload` mounts "
     "ld-so-preload-host-path as /etc/ld.so.preload (also covers programs that reset their "
     "environment).",
     [](std::string_view v, PluginConfig& c) -> Status {
       if (v == "ld-preload") {
         c.injection = Injection::kLdPreload;
       } else if (v == "ld-so-preload") {
         c.injection = Injection::kLdSoPreload;
       } else {
         return make_error("\"" + std::string(v) + "\" is not one of ld-preload, ld-so-preload");
       }
       return Status::Ok();
     }},
    {"device-list-strategy", "cdi-cri",
     "a comma-separated, non-empty set of `cdi-cri`, `envvar`, `volume-mounts`",
     "How Allocate names a container's GPUs to the container runtime: `cdi-cri` as CDI devices "
     "(`<cdi-gpu-kind>=<GPU-UUID>`, which the kubelet passes to the runtime since Kubernetes 1.31; "
     "the node needs NVIDIA's CDI spec, as the GPU Operator and `nvidia-ctk cdi generate` write "
     "it); `envvar` as NVIDIA_VISIBLE_DEVICES=<UUIDs> (needs the NVIDIA runtime as the runtime of "
     "the pod); `volume-mounts` as /dev/null mounts under /var/run/nvidia-container-devices (the "
     "NVIDIA runtime with accept-nvidia-visible-devices-as-volume-mounts).",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_device_list_strategy(v),
                    [&](DeviceListStrategy s) { c.device_list = s; });
     }},
    {"cdi-gpu-kind", "nvidia.com/gpu", "a CDI kind `<vendor>/<class>`",
     "With `cdi-cri`: the kind under which the node's CDI spec names each GPU by its UUID.",
     [](std::string_view v, PluginConfig& c) -> Status {
       if (Status s = check_cdi_kind(v); !s) return s;
       c.cdi_gpu_kind = std::string(v);
       return Status::Ok();
     }},
    {"cdi-spec-dir", "/var/run/cdi", "an absolute directory path",
     "With `cdi-cri` and cdi-edits: where the plugin writes nvshare's own CDI spec (kind "
     "nvshare.com/gpu: device `client` with the library, the socket and the injection, and one "
     "device per container with its settings directory). The runtime must read specs from it "
     "(containerd and CRI-O read /etc/cdi and /var/run/cdi).",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_directory(v, "nvshare.com-gpu_container-0123456789abcdef.json.tmp"),
                    [&](std::string p) { c.cdi_spec_dir = std::move(p); });
     }},
    {"cdi-edits", "true", "true or false",
     "With `cdi-cri`: true gives containers the library, the scheduler's socket and their settings "
     "through nvshare's CDI spec (names in cdi_devices); false through the Allocate response's "
     "mounts and environment, as the other strategies do.",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(knobparse::parse_bool(v), [&](bool b) { c.cdi_edits = b; });
     }},
    {"ld-so-preload-host-path", "/var/lib/nvshare/preload/ld.so.preload", "an absolute file path",
     "Host file mounted read-only as /etc/ld.so.preload in `ld-so-preload` mode; the plugin writes "
     "it at start (one line: library-container-path).",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_path(v),
                    [&](std::string p) { c.ld_so_preload_host_path = std::move(p); });
     }},
    {"socket-dir", "/var/run/nvshare", "an absolute directory path",
     "The scheduler's socket directory on the host, mounted read-only at the same path in "
     "containers, which get NVSHARE_SOCKET=<socket-dir>/scheduler.sock.",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_directory(v, "scheduler.sock"),
                    [&](std::string p) { c.socket_dir = std::move(p); });
     }},
    {"settings-dir", "/var/lib/nvshare/containers", "an absolute directory path, or empty",
     "Host directory where Allocate makes each container's nvshare settings (a directory mounted "
     "read-only at /etc/nvshare): the scheduler's socket, the registration wait and the pod's "
     "memory limit, which the container's environment cannot override and which the library "
     "enforces when the scheduler cannot be reached. Empty: none, and a container's environment "
     "can then turn enforcement off (NVSHARE_ENABLE=0).",
     [](std::string_view v, PluginConfig& c) -> Status {
       if (v.empty()) {
         c.settings_dir.clear();
         return Status::Ok();
       }
       return store(parse_directory(v, "0123456789abcdef/client.conf.tmp"),
                    [&](std::string p) { c.settings_dir = std::move(p); });
     }},
    {"client-register-wait", "5", "0..60 (seconds)",
     "How long a container's first CUDA call on a GPU waits for the scheduler's limits (written "
     "into its settings); while its pod's limit is not known yet, allocations wait this long and "
     "then fail until it is.",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_seconds(v, 0, 60), [&](Duration d) { c.client_register_wait = d; });
     }},
    {knobtable::kControlSocket.name, knobtable::kControlSocket.default_value,
     knobtable::kControlSocket.range, knobtable::kControlSocket.meaning,
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_socket_path(v), [&](std::string p) { c.control_socket = std::move(p); });
     }},
    {"node-name", "", "empty, or a Kubernetes node name",
     "The node whose pods are watched. Empty: the NODE_NAME environment variable (set from the "
     "downward API).",
     [](std::string_view v, PluginConfig& c) -> Status {
       c.node_name = std::string(v);
       return Status::Ok();
     }},
    {"kubeconfig", "", "empty, or a file path",
     "Kubeconfig file for running outside a cluster. Empty: the in-cluster service account.",
     [](std::string_view v, PluginConfig& c) -> Status {
       c.kubeconfig = std::string(v);
       return Status::Ok();
     }},
    {"health-interval", "5s", "0.1..3600 (seconds, optionally suffixed `s`)",
     "Period of the GPU health poll; a GPU that is lost or reports a fatal error makes its slots "
     "Unhealthy until it answers again.",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_seconds_with_unit(v, 0.1, 3600),
                    [&](Duration d) { c.health_interval = d; });
     }},
    {"watch-timeout", "300s", "1..86400 (whole seconds, optionally suffixed `s`)",
     "Server-side timeoutSeconds of each pod watch request; the watch is re-established after it.",
     [](std::string_view v, PluginConfig& c) -> Status {
       std::string_view number = v;
       if (!number.empty() && number.back() == 's') number.remove_suffix(1);
       return store(parse_integer(number, 1, 86400),
                    [&](std::int64_t s) { c.watch_timeout = std::chrono::seconds(s); });
     }},
    {"metrics-address", "", "`host:port` (an empty host: every interface), or empty",
     "Where the device plugin serves its metrics (GET /metrics, the Prometheus text format; "
     "docs/metrics.md): slots and allocations per GPU, annotation errors, watch restarts, "
     "Events posted. Empty: no metrics endpoint.",
     [](std::string_view v, PluginConfig& c) -> Status {
       return store_metrics_address(v, c.metrics_address);
     }},
    {knobtable::kLogLevel.name, knobtable::kLogLevel.default_value, knobtable::kLogLevel.range,
     knobtable::kLogLevel.meaning,
     [](std::string_view v, PluginConfig& c) -> Status {
       return store(parse_log_level(v), [&](LogLevel l) { c.log_level = l; });
     }},
};

const knobtable::KnobTable<Knob, PluginConfig> kTable(kKnobs, "NVSHARE_PLUGIN_");

}  // namespace

bool GpuSelection::selects(const std::string& uuid, unsigned index) const {
  if (all) return true;
  for (const std::string& known : uuids) {
    if (known == uuid) return true;
  }
  for (unsigned known : indexes) {
    if (known == index) return true;
  }
  return false;
}

std::uint64_t CapacityValue::resolve(std::uint64_t physical_bytes) const {
  if (bytes) return *bytes;
  return static_cast<std::uint64_t>(std::llround(static_cast<double>(physical_bytes) * factor));
}

std::uint64_t MemoryCapacitySpec::for_gpu(const std::string& uuid, unsigned index,
                                          std::uint64_t physical) const {
  if (auto it = by_uuid.find(uuid); it != by_uuid.end()) return it->second.resolve(physical);
  if (auto it = by_index.find(index); it != by_index.end()) return it->second.resolve(physical);
  if (all) return all->resolve(physical);
  return physical;
}

std::string PluginConfig::kubelet_socket() const { return kubelet_dir + "/kubelet.sock"; }
std::string PluginConfig::plugin_socket() const { return kubelet_dir + "/" + kPluginSocketName; }

std::span<const Knob> knobs() { return kKnobs; }
const Knob* find_knob(std::string_view name) { return kTable.find(name); }
std::string flag_name(const Knob& knob) { return kTable.flag_name(knob); }
std::string env_name(const Knob& knob) { return kTable.env_name(knob); }

std::string helm_value(const Knob& knob) {
  std::string out = "devicePlugin.";
  bool upper = false;
  for (char ch : knob.name) {
    if (ch == '-') {
      upper = true;
      continue;
    }
    out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(ch))) : ch;
    upper = false;
  }
  return out;
}

Status apply_knob(const Knob& knob, std::string_view value, PluginConfig& config) {
  return kTable.apply(knob, value, config);
}

PluginConfig default_config() { return kTable.defaults(); }

Status check_socket_layout(const PluginConfig& config) {
  namespace fs = std::filesystem;
  const std::string dir = fs::path(config.socket_dir).lexically_normal().string();
  const std::string control = fs::path(config.control_socket).lexically_normal().string();
  const std::string prefix = dir.ends_with('/') ? dir : dir + "/";
  if (!control.starts_with(prefix)) return Status::Ok();
  return make_error("control-socket " + config.control_socket + " lies in socket-dir " +
                    config.socket_dir +
                    ", which every GPU container gets: a root process in any GPU pod could "
                    "change limits through it; give it a directory of its own (default " +
                    std::string(kDefaultControlSocketPath) + ")");
}

Result<CommandLine> parse_command_line(int argc, const char* const* argv, const EnvLookup& getenv) {
  auto command_line = kTable.parse_command_line(argc, argv, getenv);
  if (!command_line) return command_line;
  PluginConfig& config = command_line.value().config;
  if (config.node_name.empty()) {
    // Not a knob of ours: the node's name from the downward API (the chart sets it), the default
    // when --node-name is not given.
    if (const char* node = getenv("NODE_NAME"); node != nullptr) config.node_name = node;
  }
  // A warning rather than a refusal: outside a cluster (tests, a plugin run by hand) nothing mounts
  // socket-dir anywhere; on a node it is a hole, and the chart refuses to render it.
  if (Status s = check_socket_layout(config); !s) NVSHARE_WARN("%s", s.error().message.c_str());
  return command_line;
}

std::string help_text(std::string_view program) {
  return kTable.help_text(
      program,
      "nvshare-device-plugin advertises each GPU of this node to the kubelet as slots of an "
      "extended resource, places containers on the least-loaded GPUs and injects the nvshare "
      "client library into them. Every flag can also be set by its environment variable; flags "
      "win over the environment.");
}

std::string knobs_json() { return kTable.knobs_json(); }

std::string config_doc_table() {
  using knobtable::DocField;
  return kTable.doc_table(
      {DocField::kKnob,
       DocField::kFlag,
       DocField::kEnvironment,
       {"Helm value", [](const Knob& knob) { return "`" + helm_value(knob) + "`"; }},
       DocField::kDefault,
       DocField::kRange,
       DocField::kMeaning});
}

}  // namespace nvshare::deviceplugin
