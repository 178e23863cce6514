// Configuration of the simulated GPUs, read from the environment once per process (at cuInit).
//
// Contract:
//  - load_config() reads NVSHARE_FAKECUDA_DEVICES, NVSHARE_FAKECUDA_MEMORY[_<i>],
//  NVSHARE_FAKECUDA_UUIDS,
//    NVSHARE_FAKECUDA_NAME, NVSHARE_FAKECUDA_STATE, NVSHARE_FAKECUDA_SWAP_BW and
//    NVSHARE_FAKECUDA_FAULT_BW and NVSHARE_FAKECUDA_CONTEXT_MEMORY (README.md lists meanings and
//    defaults) and returns an error naming
//    the variable when one is malformed. It never throws.
//  - A device count of 0 is valid: it models a machine without GPUs.
//  - Bandwidths are bytes per second and are never 0.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace fakecuda {

inline constexpr int kMaxConfiguredDevices = 32;

using UuidBytes = std::array<std::uint8_t, 16>;

struct DeviceConfig {
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  UuidBytes uuid_bytes{};
  std::uint64_t total_bytes = 0;
};

struct FakeConfig {
  std::vector<DeviceConfig> devices;
  std::string device_name;
  std::string state_path;
  std::uint64_t swap_bytes_per_s = 0;
  std::uint64_t fault_bytes_per_s = 0;
  std::uint64_t context_bytes = 0;  // device memory each context takes for itself
};

nvshare::Result<FakeConfig> load_config();

// "GPU-" followed by 32 hex digits grouped 8-4-4-4-12.
nvshare::Result<UuidBytes> parse_gpu_uuid(std::string_view text);
std::string format_gpu_uuid(const UuidBytes& bytes);
// The UUID a device gets when NVSHARE_FAKECUDA_UUIDS does not name one:
// GPU-00000000-0000-4000-8000-<index>.
UuidBytes default_gpu_uuid(int index);

// The default state file: /dev/shm/nvshare-fakecuda-<uid> (or /tmp when /dev/shm is missing).
std::string default_state_path();

}  // namespace fakecuda
