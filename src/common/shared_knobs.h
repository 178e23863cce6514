// The knobs several nvshare programs have, defined once: each program's table takes a shared
// knob's name, default, range and meaning from here and adds only how to store the value in its own
// configuration, so `--help`, docs/configuration.md and the chart say the same for all of them.
#pragma once

#include <string_view>

#include "common/default_paths.h"

namespace nvshare::knobtable {

struct KnobText {
  std::string_view name;
  std::string_view default_value;
  std::string_view range;
  std::string_view meaning;
};

// nvshare-scheduler, nvshare-device-plugin, libnvshare.so (NVSHARE_LOG_LEVEL everywhere).
inline constexpr KnobText kLogLevel{"log-level", "info",
                                    "`error`, `warn`, `info`, `debug`, `trace`",
                                    "Least severe log records written to stderr."};

// nvshare-scheduler listens there; libnvshare.so connects to it (NVSHARE_SOCKET).
inline constexpr KnobText kSocket{
    "socket", kDefaultSocketPath, "an absolute path (at most 107 bytes)",
    "The scheduler's client socket: nvshare-scheduler listens there (mode 0666, so that processes "
    "of any uid in any container reach it) and the library connects to it. When nothing listens "
    "there a process runs unscheduled (fail-open) and the library keeps trying to connect. In a "
    "container whose settings file enforces, the file's path is used."};

// nvshare-scheduler listens there; nvshare-device-plugin pushes limits to it (nvsharectl too).
inline constexpr KnobText kControlSocket{
    "control-socket", kDefaultControlSocketPath, "an absolute path (at most 107 bytes)",
    "The scheduler's control socket (line-delimited JSON: nvsharectl, the device plugin). The "
    "scheduler creates it mode 0600, and its directory mode 0700 when missing, and refuses peers "
    "whose uid is neither its own nor root. It admits root, so it lies outside the client "
    "socket's directory, which GPU containers get (the device plugin warns at start otherwise)."};

}  // namespace nvshare::knobtable
