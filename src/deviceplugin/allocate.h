// Allocate: what the kubelet must add to a container that was given slots of nvshare GPUs.
//
// For the device IDs of one container the response names its GPUs, the distinct GPU UUIDs of
// those slots in the order they first appear, as device-list-strategy says (knobs.h):
//  - cdi-cri: a CDI device <cdi-gpu-kind>=<UUID> per GPU in cdi_devices;
//  - envvar: NVIDIA_VISIBLE_DEVICES = the UUIDs, comma-separated;
//  - volume-mounts: NVIDIA_VISIBLE_DEVICES = /var/run/nvidia-container-devices, and /dev/null
//    mounted read-only at /var/run/nvidia-container-devices/<UUID> per GPU.
// and gives it nvshare's edits (client_edits, settings_edits):
//  - NVSHARE_SOCKET = <socket-dir>/scheduler.sock, and a read-only mount of socket-dir at the same
//    path, so the library reaches the node's scheduler (connecting to a unix socket needs no
//    write access to its file system; the control socket lies elsewhere, see default_paths.h);
//  - a read-only mount of library-host-path at library-container-path;
//  - injection ld-preload: LD_PRELOAD = library-container-path; injection ld-so-preload: a
//    read-only mount of ld-so-preload-host-path at /etc/ld.so.preload.
//  - with a settings directory (container_settings.h), a read-only mount of it at /etc/nvshare:
//    the settings the container's environment cannot override.
// The edits travel as the response's mounts and environment, or, with cdi-cri and cdi-edits, as
// the CDI devices nvshare.com/gpu=client and nvshare.com/gpu=container-<id> (cdi_spec.h; the
// caller writes the container's spec before answering).
// An ID that does not name a slot of a managed GPU is rejected: the error lists the unknown IDs
// and nothing is allocated. So are two slots of one GPU for one container (a slot count is a GPU
// count: two slots of one GPU would give the container one GPU where it asked for two), and, with
// fail-requests-greater-than-one, any request of more than one slot.
#pragma once

#include <string>
#include <vector>

#include "common/result.h"
#include "deviceplugin/cdi_spec.h"
#include "deviceplugin/knobs.h"
#include "deviceplugin/placement.h"
#include "k8s/deviceplugin/v1beta1/api.pb.h"

namespace nvshare::deviceplugin {

inline constexpr const char* kLdSoPreloadContainerPath = "/etc/ld.so.preload";
inline constexpr const char* kVolumeMountsDeviceDir = "/var/run/nvidia-container-devices";

// nvshare's edits common to every container: the socket, the library and the injection.
ContainerEdits client_edits(const PluginConfig& config);
// One container's settings directory, mounted read-only at /etc/nvshare.
ContainerEdits settings_edits(const std::string& settings_host_dir);

Result<v1beta1::ContainerAllocateResponse> container_allocation(
    const PluginConfig& config, const std::vector<ManagedGpu>& gpus,
    const std::vector<std::string>& device_ids, const std::string& settings_host_dir = "");

// The GPUs a response names, for logs: "GPU-a,GPU-b".
std::string allocated_gpus(const v1beta1::ContainerAllocateResponse& response);

// Checks the device IDs as container_allocation does (without building a response).
Status check_device_ids(const PluginConfig& config, const std::vector<ManagedGpu>& gpus,
                        const std::vector<std::string>& device_ids);

// Writes <ld-so-preload-host-path> (one line: library-container-path) atomically, creating its
// directory; used at start in ld-so-preload mode.
Status write_ld_so_preload(const PluginConfig& config);

}  // namespace nvshare::deviceplugin
