// nvshare's own CDI (Container Device Interface) spec, written by the device plugin.
//
// With device-list-strategy cdi-cri and cdi-edits, Allocate names CDI devices instead of listing
// mounts and variables, and the container runtime applies the edits these specs describe (CDI
// 0.5.0; kind nvshare.com/gpu), read from cdi-spec-dir:
//  - nvshare.com-gpu.json, device `client`: the library mounted read-only, the scheduler's socket
//    directory mounted read-only, NVSHARE_SOCKET and the injection (LD_PRELOAD, or the preload
//    file mounted at /etc/ld.so.preload). Written at start; the same for every container, so off
//    Kubernetes `--device nvshare.com/gpu=client` gives a container the library as well.
//  - nvshare.com-gpu_container-<id>.json, device `container-<id>`: one container's settings
//    directory (container_settings.h) at /etc/nvshare. Written before Allocate answers, removed
//    with the directory.
// Files are replaced atomically (a temporary name in the same directory, then rename), so a
// runtime that watches the directory never reads half a spec.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"

namespace nvshare::deviceplugin {

inline constexpr const char* kCdiKind = "nvshare.com/gpu";
inline constexpr const char* kCdiVersion = "0.5.0";
inline constexpr const char* kCdiClientDevice = "client";

// What a container gets from nvshare, however it travels (Allocate's response or a CDI device).
struct ContainerEdits {
  struct Mount {
    std::string host_path;
    std::string container_path;
    bool read_only = true;
  };
  std::vector<std::pair<std::string, std::string>> env;
  std::vector<Mount> mounts;
};

// A CDI kind "<vendor>/<class>": vendor and class start with a letter, end with a letter or digit,
// and hold letters, digits, '_', '-' and '.' between.
Status check_cdi_kind(std::string_view kind);

// "<kind>=<device>", a fully qualified CDI device name.
std::string qualified_cdi_device(std::string_view kind, std::string_view device);
// The device of one container's settings: "container-<id>".
std::string container_cdi_device(std::string_view container_id);

// The spec text (JSON) of kind nvshare.com/gpu with one device and its edits.
std::string cdi_spec_text(std::string_view device, const ContainerEdits& edits);

std::string client_cdi_spec_path(const std::string& dir);
std::string container_cdi_spec_path(const std::string& dir, std::string_view container_id);

// Writes `text` to `path` atomically (mode 0644), creating the directory.
Status write_cdi_spec(const std::string& path, const std::string& text);
// Removes the container specs in `dir` whose container is not in `live`.
void remove_stale_container_specs(const std::string& dir, const std::set<std::string>& live);

}  // namespace nvshare::deviceplugin
