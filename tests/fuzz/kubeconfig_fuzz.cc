// Fuzz target: a kubeconfig (kubectl's YAML subset, or JSON) as the pod watcher reads it, and the
// credentials it names, and base64 data in it.
//
// Properties: nothing crashes; credentials that are accepted name a server.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "podwatcher/kube_credentials.h"

using nvshare::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)nvshare::podwatcher::decode_base64(text);
  auto parsed = nvshare::podwatcher::parse_kubeconfig_text(text);
  if (!parsed.ok()) {
    check(!parsed.error().message.empty());
    return 0;
  }
  // Relative file names resolve against a directory that holds no such files.
  auto credentials = nvshare::podwatcher::kubeconfig_credentials(parsed.value(), "/nonexistent");
  if (credentials.ok()) check(!credentials.value().server.empty());
  return 0;
}
