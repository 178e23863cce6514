// The settings file a managed container gets: what its own environment must not be able to weaken.
//
// On Kubernetes the device plugin's Allocate mounts a directory it owns at /etc/nvshare, read-only,
// into every container it gives GPUs to, holding client.conf:
//
//   # nvshare client settings (written by nvshare-device-plugin)
//   enforce=1
//   socket=/var/run/nvshare/scheduler.sock
//   register-wait-ms=5000
//   reconnect-max-ms=2000
//   memory-limit=4294967296      (bytes; `none`; or `pending` until the plugin knows the pod)
//   pod=ml/trainer               (informational)
//
// With enforce=1 the library ignores NVSHARE_ENABLE, NVSHARE_SOCKET, NVSHARE_REGISTER_WAIT_MS and
// NVSHARE_RECONNECT_MAX_MS from the environment (and says so), a declared NVSHARE_MEMORY_LIMIT
// can only lower the file's, and the file's memory limit is what the process keeps while the
// scheduler cannot be reached: scheduling fails open, limits never do. While the file says
// `pending` and no scheduler has given limits, allocations fail with CUDA_ERROR_OUT_OF_MEMORY.
//
// Trust: the file counts only when it is a regular file owned by root (or by the overflow uid, as
// a host root's file appears inside a user namespace) and writable by no one else; otherwise it is
// ignored with a warning (a workload could have written it). Its path is fixed: no environment
// variable can point the library elsewhere.
//
// Contract: parse_client_settings is total (any text in; unknown keys and bad values are errors
// naming the line), never throws. read_client_settings never throws either.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/result.h"

namespace nvshare::client {

inline constexpr const char* kSettingsPath = "/etc/nvshare/client.conf";

struct ClientSettings {
  bool enforce = false;
  std::optional<std::string> socket;
  std::optional<Duration> register_wait;
  std::optional<Duration> reconnect_max;
  // The pod's memory limit: nullopt when the file does not say; `pending` when the plugin does
  // not know the pod yet; otherwise bytes (0: none).
  bool memory_pending = false;
  std::optional<std::uint64_t> memory_bytes;
  std::string pod;
  bool operator==(const ClientSettings&) const = default;
};

Result<ClientSettings> parse_client_settings(std::string_view text);

struct SettingsRead {
  std::optional<ClientSettings> settings;  // nullopt: no usable file (absent or distrusted)
  std::string warning;                     // why a file that exists was not used
};

// Reads and checks `path`. A file that exists but is malformed still enforces (it is the
// plugin's, and a managed container must not run unlimited): enforce=1 with the memory limit
// pending.
SettingsRead read_client_settings(const std::string& path = kSettingsPath);

}  // namespace nvshare::client
