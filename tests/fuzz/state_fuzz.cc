// Fuzz target: the scheduler's state file, read before any client is accepted.
//
// Properties: parsing never crashes; an accepted state renders to text that parses to a state
// rendering to the same text (nothing is lost or invented in a round trip).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "scheduler/state_file.h"

using nvshare::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto state = nvshare::scheduler::parse_state(text);
  if (!state.ok()) {
    check(!state.error().message.empty());
    return 0;
  }
  const std::string once = nvshare::scheduler::render_state(state.value());
  auto again = nvshare::scheduler::parse_state(once);
  check(again.ok());
  check(nvshare::scheduler::render_state(again.value()) == once);
  return 0;
}
