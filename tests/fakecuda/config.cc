#include "config.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <string>

#include "common/quantity.h"

namespace fakecuda {
namespace {

constexpr std::uint64_t kDefaultMemory = 16ULL << 30;
constexpr std::uint64_t kDefaultSwapBandwidth = 8ULL << 30;   // managed prefetch, each way
constexpr std::uint64_t kDefaultFaultBandwidth = 2ULL << 30;  // demand paging back to the device

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

nvshare::Error env_error(const std::string& name, const std::string& what) {
  return nvshare::make_error(name + ": " + what);
}

nvshare::Result<std::uint64_t> quantity_from_env(const std::string& name, std::uint64_t fallback) {
  const char* value = env(name.c_str());
  if (value == nullptr) return fallback;
  auto parsed = nvshare::parse_memory_quantity(value);
  if (!parsed.ok()) return env_error(name, parsed.error().message);
  return parsed.value();
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

nvshare::Result<UuidBytes> parse_gpu_uuid(std::string_view text) {
  constexpr std::string_view kPrefix = "GPU-";
  const std::string quoted = "GPU UUID \"" + std::string(text) + "\"";
  if (text.substr(0, kPrefix.size()) != kPrefix) {
    return nvshare::make_error(quoted + ": must start with \"GPU-\"");
  }
  std::string_view rest = text.substr(kPrefix.size());
  // Dashes sit after the 8th, 12th, 16th and 20th hex digit, as nvidia-smi prints them.
  constexpr std::size_t kDashAfter[] = {8, 12, 16, 20};
  UuidBytes bytes{};
  std::size_t digits = 0;
  std::size_t next_dash = 0;
  for (char c : rest) {
    if (c == '-') {
      if (next_dash >= 4 || digits != kDashAfter[next_dash]) {
        return nvshare::make_error(quoted + ": misplaced '-'");
      }
      ++next_dash;
      continue;
    }
    int v = hex_value(c);
    if (v < 0) return nvshare::make_error(quoted + ": not a hex digit");
    if (digits >= 32) return nvshare::make_error(quoted + ": more than 32 hex digits");
    bytes[digits / 2] =
        static_cast<std::uint8_t>(bytes[digits / 2] | (v << ((digits % 2) ? 0 : 4)));
    ++digits;
  }
  if (digits != 32 || next_dash != 4) {
    return nvshare::make_error(quoted + ": want GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx");
  }
  return bytes;
}

std::string format_gpu_uuid(const UuidBytes& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 0xf]);
  }
  return out;
}

UuidBytes default_gpu_uuid(int index) {
  UuidBytes bytes{};
  bytes[6] = 0x40;  // version 4 and variant 1 nibbles, so the value looks like a well-formed UUID
  bytes[8] = 0x80;
  auto value = static_cast<std::uint64_t>(index);
  for (int i = 15; i >= 10; --i) {
    bytes[i] = static_cast<std::uint8_t>(value & 0xff);
    value >>= 8;
  }
  return bytes;
}

std::string default_state_path() {
  const std::string dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  return dir + "/nvshare-fakecuda-" + std::to_string(getuid());
}

nvshare::Result<FakeConfig> load_config() {
  FakeConfig config;

  int count = 1;
  if (const char* value = env("NVSHARE_FAKECUDA_DEVICES")) {
    std::string_view text(value);
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), count);
    if (ec != std::errc() || end != text.data() + text.size() || count < 0 ||
        count > kMaxConfiguredDevices) {
      return env_error("NVSHARE_FAKECUDA_DEVICES", "want an integer 0.." +
                                                       std::to_string(kMaxConfiguredDevices) +
                                                       ", got \"" + std::string(text) + "\"");
    }
  }

  auto memory = quantity_from_env("NVSHARE_FAKECUDA_MEMORY", kDefaultMemory);
  if (!memory.ok()) return memory.error();

  std::vector<std::string> uuids;
  if (const char* value = env("NVSHARE_FAKECUDA_UUIDS")) {
    std::string_view list(value);
    while (!list.empty()) {
      std::size_t comma = list.find(',');
      uuids.emplace_back(list.substr(0, comma));
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    }
  }

  for (int i = 0; i < count; ++i) {
    DeviceConfig device;
    auto total = quantity_from_env("NVSHARE_FAKECUDA_MEMORY_" + std::to_string(i), memory.value());
    if (!total.ok()) return total.error();
    if (total.value() == 0)
      return env_error("NVSHARE_FAKECUDA_MEMORY", "device memory must be > 0");
    device.total_bytes = total.value();
    if (static_cast<std::size_t>(i) < uuids.size() && !uuids[i].empty()) {
      auto parsed = parse_gpu_uuid(uuids[i]);
      if (!parsed.ok()) return env_error("NVSHARE_FAKECUDA_UUIDS", parsed.error().message);
      device.uuid_bytes = parsed.value();
    } else {
      device.uuid_bytes = default_gpu_uuid(i);
    }
    device.uuid = format_gpu_uuid(device.uuid_bytes);
    for (const DeviceConfig& other : config.devices) {
      if (other.uuid == device.uuid) {
        return env_error("NVSHARE_FAKECUDA_UUIDS", "duplicate GPU UUID " + device.uuid);
      }
    }
    config.devices.push_back(std::move(device));
  }

  const char* name = env("NVSHARE_FAKECUDA_NAME");
  config.device_name = name != nullptr ? name : "NVIDIA H100 (nvshare fakecuda)";
  const char* state = env("NVSHARE_FAKECUDA_STATE");
  config.state_path = state != nullptr ? state : default_state_path();

  auto swap = quantity_from_env("NVSHARE_FAKECUDA_SWAP_BW", kDefaultSwapBandwidth);
  if (!swap.ok()) return swap.error();
  auto fault = quantity_from_env("NVSHARE_FAKECUDA_FAULT_BW", kDefaultFaultBandwidth);
  if (!fault.ok()) return fault.error();
  if (swap.value() == 0 || fault.value() == 0) {
    return nvshare::make_error(
        "NVSHARE_FAKECUDA_SWAP_BW and NVSHARE_FAKECUDA_FAULT_BW must be > 0");
  }
  config.swap_bytes_per_s = swap.value();
  config.fault_bytes_per_s = fault.value();
  auto context = quantity_from_env("NVSHARE_FAKECUDA_CONTEXT_MEMORY", 0);
  if (!context.ok()) return context.error();
  config.context_bytes = context.value();
  return config;
}

}  // namespace fakecuda
