#include "deviceplugin/allocate.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

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
  std::string visible;
  for (const std::string& uuid : uuids) visible += (visible.empty() ? "" : ",") + uuid;
  auto& envs = *response.mutable_envs();
  envs["NVIDIA_VISIBLE_DEVICES"] = visible;
  envs["NVSHARE_SOCKET"] = config.socket_dir + "/scheduler.sock";
  add_mount(response, config.library_host_path, config.library_container_path, true);
  // Read-only: clients only connect(2) to the socket, which a read-only mount allows; a writable
  // one would let a container replace scheduler.sock for every other pod on the node.
  add_mount(response, config.socket_dir, config.socket_dir, true);
  if (config.injection == Injection::kLdPreload) {
    envs["LD_PRELOAD"] = config.library_container_path;
  } else {
    add_mount(response, config.ld_so_preload_host_path, kLdSoPreloadContainerPath, true);
  }
  if (!settings_host_dir.empty()) {
    add_mount(response, settings_host_dir, kSettingsContainerPath, true);
  }
  return response;
}

Status write_ld_so_preload(const PluginConfig& config) {
  namespace fs = std::filesystem;
  const fs::path target(config.ld_so_preload_host_path);
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) {
    return make_error("cannot create " + target.parent_path().string() + ": " + ec.message());
  }
  const fs::path temporary = target.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << config.library_container_path << '\n';
    out.close();
    if (!out) {
      fs::remove(temporary, ec);
      return make_error("cannot write " + temporary.string());
    }
  }
  fs::permissions(temporary,
                  fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                      fs::perms::others_read,
                  ec);
  fs::rename(temporary, target, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(temporary, ignored);
    return make_error("cannot replace " + target.string() + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace nvshare::deviceplugin
