// The device plugin's configuration: every knob defined once, in one table.
//
// Each knob has a name ("slots-per-gpu") from which its flag (--slots-per-gpu), its environment
// variable (NVSHARE_PLUGIN_SLOTS_PER_GPU) and its Helm value (devicePlugin.slotsPerGpu) are
// derived, a default, a range and a meaning. The plugin's configuration is built from each knob's
// default text, then the environment, then the command line (later wins); `--help`,
// `--print-config-doc` and the device-plugin table of docs/configuration.md are generated from the
// table (a test checks the document is current). The mechanism is common/knob_table.h, shared
// with the scheduler; this file holds the table and what only the plugin has (Helm value names, the
// node-name fallback, the socket layout check).
//
// Contract: parsing never exits or throws; every error names the knob, where the value came from
// (flag or environment variable) and what is accepted.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/knob_table.h"
#include "common/log.h"
#include "common/result.h"

namespace nvshare::deviceplugin {

// How Allocate makes the container load libnvshare.so.
enum class Injection {
  kLdPreload,    // LD_PRELOAD=<library-container-path> in the container's environment
  kLdSoPreload,  // <ld-so-preload-host-path> mounted read-only as /etc/ld.so.preload
};

// How Allocate names a container's GPUs to the container runtime (any non-empty combination, as
// NVIDIA's device plugin accepts): through CDI device names in the response's cdi_devices (the
// kubelet passes them to the runtime over CRI since Kubernetes 1.31), through the
// NVIDIA_VISIBLE_DEVICES variable, or through /dev/null mounts under
// /var/run/nvidia-container-devices (the NVIDIA runtime's volume-mounts mode, which an image's own
// environment cannot widen).
struct DeviceListStrategy {
  bool cdi_cri = true;
  bool envvar = false;
  bool volume_mounts = false;
};

// Which GPUs the plugin manages: all, or those named by UUID or NVML index.
struct GpuSelection {
  bool all = true;
  std::vector<std::string> uuids;
  std::vector<unsigned> indexes;

  bool selects(const std::string& uuid, unsigned index) const;
};

// A virtual memory capacity: an exact byte count or a factor of the GPU's physical memory.
struct CapacityValue {
  std::optional<std::uint64_t> bytes;
  double factor = 1.0;  // used when `bytes` is empty

  std::uint64_t resolve(std::uint64_t physical_bytes) const;
};

// memory-capacity: one value for every GPU and/or values for GPUs named by UUID or index (the named
// ones win). Empty: every GPU's physical memory.
struct MemoryCapacitySpec {
  std::optional<CapacityValue> all;
  std::map<std::string, CapacityValue> by_uuid;
  std::map<unsigned, CapacityValue> by_index;

  bool empty() const { return !all && by_uuid.empty() && by_index.empty(); }
  // The capacity of one GPU in bytes (its physical memory when nothing applies).
  std::uint64_t for_gpu(const std::string& uuid, unsigned index, std::uint64_t physical) const;
};

struct PluginConfig {
  std::string resource_name;
  int slots_per_gpu = 0;
  // Refuse every request of more than one slot (a container gets one shared GPU at most).
  bool fail_requests_greater_than_one = false;
  GpuSelection gpus;
  MemoryCapacitySpec memory_capacity;
  std::string kubelet_dir;
  std::string pod_resources_socket;
  std::string library_host_path;
  std::string library_container_path;
  Injection injection = Injection::kLdPreload;
  DeviceListStrategy device_list;
  // CDI: where the plugin writes its own spec (kind nvshare.com/gpu), the kind under which the
  // node's NVIDIA CDI spec names GPUs by UUID, and whether the library, the socket and the
  // settings reach the container through nvshare's spec (else through the response's mounts and
  // environment).
  std::string cdi_spec_dir;
  std::string cdi_gpu_kind;
  bool cdi_edits = true;
  std::string ld_so_preload_host_path;
  std::string socket_dir;
  std::string control_socket;
  // Where each container's settings directory is made (container_settings.h); empty: none.
  std::string settings_dir;
  Duration client_register_wait{};
  std::string node_name;
  std::string kubeconfig;
  Duration health_interval{};
  Duration watch_timeout{};
  std::string metrics_address;  // where GET /metrics is served; empty: nowhere
  LogLevel log_level = LogLevel::kInfo;

  // True when the container's nvshare edits travel in nvshare's CDI spec.
  bool edits_through_cdi() const { return device_list.cdi_cri && cdi_edits; }

  // <kubelet-dir>/kubelet.sock and <kubelet-dir>/nvshare.sock.
  std::string kubelet_socket() const;
  std::string plugin_socket() const;
  static constexpr const char* kPluginSocketName = "nvshare.sock";
};

struct Knob {
  std::string_view name;
  std::string_view default_value;
  std::string_view range;
  std::string_view meaning;
  Status (*apply)(std::string_view value, PluginConfig& config);
};

std::span<const Knob> knobs();
const Knob* find_knob(std::string_view name);
std::string flag_name(const Knob& knob);   // "--slots-per-gpu"
std::string env_name(const Knob& knob);    // "NVSHARE_PLUGIN_SLOTS_PER_GPU"
std::string helm_value(const Knob& knob);  // "devicePlugin.slotsPerGpu"

// Applies one knob's value; the error names the knob.
Status apply_knob(const Knob& knob, std::string_view value, PluginConfig& config);

// The configuration from every knob's default (valid by construction; a test checks it).
PluginConfig default_config();

using CommandLine = knobtable::CommandLine<PluginConfig>;
using EnvLookup = knobtable::EnvLookup;

// An error when control-socket lies inside socket-dir (compared lexically): socket-dir is mounted
// into every GPU container, and the control socket admits root.
Status check_socket_layout(const PluginConfig& config);

// Builds the configuration from the defaults, then the environment (through `getenv`; an empty
// value counts as unset), then argv (`--name value` or `--name=value`). An empty node-name is
// then taken from NODE_NAME (the downward API), when set. A configuration that fails
// check_socket_layout is logged as a warning, not refused.
Result<CommandLine> parse_command_line(int argc, const char* const* argv, const EnvLookup& getenv);

// `--help` text and the Markdown table of docs/configuration.md, both generated from the table.
std::string help_text(std::string_view program);
std::string config_doc_table();
// `--print-knobs`: the knobs as JSON (knob_table.h).
std::string knobs_json();

}  // namespace nvshare::deviceplugin
