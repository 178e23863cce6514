#include "deviceplugin/allocate.h"

#include <algorithm>
#include <filesystem>

#include "common/atomic_file.h"
#include "deviceplugin/container_settings.h"

namespace nvshare::deviceplugin {
namespace {

void add_mount(v1beta1::ContainerAllocateResponse& response, const std::string& host_path,
               const std::string& container_path, bool read_only) {
  v1beta1::Mount* mount = response.add_mounts();
  mount->set_host_path(host_path);
  mount->set_container_path(container_path);
  mount->set_read_only(read_only);
}

void add_edits(v1beta1::ContainerAllocateResponse& response, const ContainerEdits& edits) {
  auto& envs = *response.mutable_envs();
  for (const auto& [name, value] : edits.env) envs[name] = value;
  for (const ContainerEdits::Mount& m : edits.mounts) {
    add_mount(response, m.host_path, m.container_path, m.read_only);
  }
}

// Names the container's GPUs to the runtime in each way device-list-strategy lists.
void name_gpus(const PluginConfig& config, const std::vector<std::string>& uuids,
               v1beta1::ContainerAllocateResponse& response) {
  const DeviceListStrategy& strategy = config.device_list;
  if (strategy.cdi_cri) {
    for (const std::string& uuid : uuids) {
      response.add_cdi_devices()->set_name(qualified_cdi_device(config.cdi_gpu_kind, uuid));
    }
  }
  if (strategy.envvar) {
    std::string visible;
    for (const std::string& uuid : uuids) visible += (visible.empty() ? "" : ",") + uuid;
    (*response.mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = visible;
  }
  if (strategy.volume_mounts) {
    (*response.mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = kVolumeMountsDeviceDir;
    for (const std::string& uuid : uuids) {
      add_mount(response, "/dev/null", std::string(kVolumeMountsDeviceDir) + "/" + uuid, true);
    }
  }
}

}  // namespace

Status check_device_ids(const PluginConfig& config, const std::vector<ManagedGpu>& gpus,
                        const std::vector<std::string>& device_ids) {
  auto checked = container_allocation(config, gpus, device_ids);
  if (!checked) return checked.error();
  return Status::Ok();
}

Result<v1beta1::ContainerAllocateResponse> container_allocation(
    const PluginConfig& config, const std::vector<ManagedGpu>& gpus,
    const std::vector<std::string>& device_ids, const std::string& settings_host_dir) {
  if (device_ids.empty()) return make_error("the container request names no devices");
  std::vector<std::string> uuids;
  std::string unknown;
  for (const std::string& id : device_ids) {
    const auto parsed = parse_device_id(id);
    const ManagedGpu* gpu = nullptr;
    if (parsed) {
      for (const ManagedGpu& candidate : gpus) {
        if (candidate.uuid == parsed->gpu_uuid && parsed->slot < candidate.slots) gpu = &candidate;
      }
    }
    if (gpu == nullptr) {
      unknown += (unknown.empty() ? "\"" : ", \"") + id + "\"";
      continue;
    }
    if (std::find(uuids.begin(), uuids.end(), gpu->uuid) == uuids.end()) uuids.push_back(gpu->uuid);
  }
  if (!unknown.empty()) {
    return make_error("unknown device ID(s) " + unknown + ": this plugin advertises " +
                      config.resource_name + " as <GPU-UUID>__<slot> of the GPUs it manages");
  }
  if (config.fail_requests_greater_than_one && device_ids.size() > 1) {
    return make_error(std::to_string(device_ids.size()) + " " + config.resource_name +
                      " slots for one container: this plugin gives each container one shared GPU "
                      "(fail-requests-greater-than-one); ask for 1");
  }
  if (uuids.size() < device_ids.size()) {
    return make_error(std::to_string(device_ids.size()) + " " + config.resource_name +
                      " slots for one container lie on " + std::to_string(uuids.size()) +
                      " GPU(s): each slot of a container must be a distinct GPU (this node has " +
                      std::to_string(gpus.size()) + "; ask for at most that many)");
  }

  v1beta1::ContainerAllocateResponse response;
  name_gpus(config, uuids, response);
  const std::string container_id =
      settings_host_dir.empty() ? "" : std::filesystem::path(settings_host_dir).filename().string();
  if (config.edits_through_cdi()) {
    response.add_cdi_devices()->set_name(qualified_cdi_device(kCdiKind, kCdiClientDevice));
    if (!container_id.empty()) {
      response.add_cdi_devices()->set_name(
          qualified_cdi_device(kCdiKind, container_cdi_device(container_id)));
    }
  } else {
    add_edits(response, client_edits(config));
    if (!settings_host_dir.empty()) add_edits(response, settings_edits(settings_host_dir));
  }
  return response;
}

ContainerEdits client_edits(const PluginConfig& config) {
  ContainerEdits edits;
  edits.env.emplace_back("NVSHARE_SOCKET", config.socket_dir + "/scheduler.sock");
  edits.mounts.push_back({config.library_host_path, config.library_container_path, true});
  // Read-only: clients only connect(2) to the socket, which a read-only mount allows; a writable
  // one would let a container replace scheduler.sock for every other pod on the node.
  edits.mounts.push_back({config.socket_dir, config.socket_dir, true});
  if (config.injection == Injection::kLdPreload) {
    edits.env.emplace_back("LD_PRELOAD", config.library_container_path);
  } else {
    edits.mounts.push_back({config.ld_so_preload_host_path, kLdSoPreloadContainerPath, true});
  }
  return edits;
}

ContainerEdits settings_edits(const std::string& settings_host_dir) {
  ContainerEdits edits;
  edits.mounts.push_back({settings_host_dir, kSettingsContainerPath, true});
  return edits;
}

std::string allocated_gpus(const v1beta1::ContainerAllocateResponse& response) {
  std::string out;
  const auto visible = response.envs().find("NVIDIA_VISIBLE_DEVICES");
  if (visible != response.envs().end() && visible->second != kVolumeMountsDeviceDir) {
    return visible->second;
  }
  const std::string volume_prefix = std::string(kVolumeMountsDeviceDir) + "/";
  for (const v1beta1::Mount& mount : response.mounts()) {
    if (mount.container_path().rfind(volume_prefix, 0) == 0) {
      out += (out.empty() ? "" : ",") + mount.container_path().substr(volume_prefix.size());
    }
  }
  if (!out.empty()) return out;
  for (const v1beta1::CDIDevice& device : response.cdi_devices()) {
    if (device.name().rfind(std::string(kCdiKind) + "=", 0) == 0) continue;
    out += (out.empty() ? "" : ",") + device.name();
  }
  return out;
}

Status write_ld_so_preload(const PluginConfig& config) {
  if (Status s = create_parent_directories(config.ld_so_preload_host_path); !s) return s;
  return replace_file(config.ld_so_preload_host_path, config.library_container_path + "\n", 0644);
}

}  // namespace nvshare::deviceplugin
