// Fuzz target: a container's settings file (/etc/nvshare/client.conf), as the client library
// reads it, and the configuration it makes with a hostile environment.
//
// Properties: nothing crashes; accepted settings are within their ranges (an absolute socket path,
// waits within bounds, a memory limit that is bytes, none or pending); with enforce=1 the
// environment never disables the library.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "client/config.h"
#include "client/settings_file.h"
#include "fuzz_check.h"

using nvshare::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto settings = nvshare::client::parse_client_settings(text);
  if (!settings.ok()) {
    check(!settings.error().message.empty());
    return 0;
  }
  const nvshare::client::ClientSettings& s = settings.value();
  if (s.socket) check(!s.socket->empty() && s.socket->front() == '/');
  if (s.register_wait) check(*s.register_wait <= std::chrono::seconds(60));
  check(!(s.memory_pending && s.memory_bytes.has_value()));
  const auto hostile = [](const char* name) -> const char* {
    if (std::string_view(name) == "NVSHARE_ENABLE") return "0";
    if (std::string_view(name) == "NVSHARE_MEMORY_LIMIT") return "1Ti";
    return nullptr;
  };
  const nvshare::client::ParsedClientConfig config =
      nvshare::client::parse_client_config(hostile, s);
  if (s.enforce) {
    check(config.config.enabled);
    if (s.memory_bytes && *s.memory_bytes != 0) {
      check(config.config.declared_limits.memory_bytes <= *s.memory_bytes);
    }
  }
  return 0;
}
