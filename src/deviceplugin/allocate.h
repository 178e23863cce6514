// Allocate: what the kubelet must add to a container that was given slots of nvshare GPUs.
//
// For the device IDs of one container the response holds:
//  - NVIDIA_VISIBLE_DEVICES = the distinct GPU UUIDs of those slots, comma-separated, in the order
//    they first appear (the NVIDIA container runtime exposes exactly those GPUs);
//  - NVSHARE_SOCKET = <socket-dir>/scheduler.sock, and a read-only mount of socket-dir at the same
//    path, so the library reaches the node's scheduler (connecting to a unix socket needs no
//    write access to its file system; the control socket lies elsewhere, see default_paths.h);
//  - a read-only mount of library-host-path at library-container-path;
//  - injection ld-preload: LD_PRELOAD = library-container-path; injection ld-so-preload: a
//    read-only mount of ld-so-preload-host-path at /etc/ld.so.preload.
//  - with a settings directory (container_settings.h), a read-only mount of it at /etc/nvshare:
//    the settings the container's environment cannot override.
// An ID that does not name a slot of a managed GPU is rejected: the error lists the unknown IDs
// and nothing is allocated. So are two slots of one GPU for one container (a slot count is a GPU
// count: two slots of one GPU would give the container one GPU where it asked for two), and, with
// fail-requests-greater-than-one, any request of more than one slot.
#pragma once

#include <string>
#include <vector>

#include "common/result.h"
#include "deviceplugin/knobs.h"
#include "deviceplugin/placement.h"
#include "k8s/deviceplugin/v1beta1/api.pb.h"

namespace nvshare::deviceplugin {

inline constexpr const char* kLdSoPreloadContainerPath = "/etc/ld.so.preload";

Result<v1beta1::ContainerAllocateResponse> container_allocation(
    const PluginConfig& config, const std::vector<ManagedGpu>& gpus,
    const std::vector<std::string>& device_ids, const std::string& settings_host_dir = "");

// Checks the device IDs as container_allocation does (without building a response).
Status check_device_ids(const PluginConfig& config, const std::vector<ManagedGpu>& gpus,
                        const std::vector<std::string>& device_ids);

// Writes <ld-so-preload-host-path> (one line: library-container-path) atomically, creating its
// directory; used at start in ld-so-preload mode.
Status write_ld_so_preload(const PluginConfig& config);

}  // namespace nvshare::deviceplugin
