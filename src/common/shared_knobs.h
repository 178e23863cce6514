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

}  // namespace nvshare::knobtable
