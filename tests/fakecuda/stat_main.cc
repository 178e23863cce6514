// nvshare-fakecuda-stat: prints the shared state of every simulated GPU as one JSON object, so
// tests can show what the processes sharing a simulated GPU hold and how many bytes moved.
//
//   nvshare-fakecuda-stat [--state PATH]
//
// PATH defaults to NVSHARE_FAKECUDA_STATE, then to the fake driver's default. Slots of dead
// processes are reaped first, as any user of the state would. A missing state file prints no
// devices.
#include <errno.h>
#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "common/log.h"
#include "config.h"
#include "shared_state.h"

namespace {

void usage(FILE* out) {
  std::fprintf(out,
               "usage: nvshare-fakecuda-stat [--state PATH]\n"
               "Prints the simulated GPUs' shared state as JSON.\n"
               "  --state PATH  state file (default: $NVSHARE_FAKECUDA_STATE, else %s)\n",
               fakecuda::default_state_path().c_str());
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

void print_device(const fakecuda::DeviceSnapshot& d, bool last) {
  std::printf("    {\"uuid\": %s, \"total\": %" PRIu64 ", \"allocated\": %" PRIu64
              ", \"managed_resident\": %" PRIu64 ", \"managed_host\": %" PRIu64
              ", \"used\": %" PRIu64 ", \"free\": %" PRIu64 ", \"migrated_to_host\": %" PRIu64
              ", \"migrated_to_device\": %" PRIu64 ", \"faulted_in\": %" PRIu64
              ", \"kernels\": %" PRIu64
              ", \"active_contexts\": %u,"
              " \"contexts\": [",
              json_string(d.uuid).c_str(), d.memory.total, d.memory.device_bytes,
              d.memory.managed_resident, d.memory.managed_host, d.memory.used(), d.memory.free(),
              d.migrated_to_host, d.migrated_to_device, d.faulted_in, d.kernels, d.active_contexts);
  for (std::size_t i = 0; i < d.slots.size(); ++i) {
    const fakecuda::SlotSnapshot& s = d.slots[i];
    std::printf("%s{\"pid\": %d, \"context\": %" PRIu64 ", \"active\": %s, \"allocated\": %" PRIu64
                ", \"managed_resident\": %" PRIu64 ", \"managed_host\": %" PRIu64
                ", \"kernels\": %" PRIu64 "}",
                i == 0 ? "" : ", ", s.pid, s.context_id, s.counted ? "true" : "false",
                s.device_bytes, s.managed_resident, s.managed_host, s.kernels);
  }
  std::printf("]}%s\n", last ? "" : ",");
}

}  // namespace

int main(int argc, char** argv) {
  nvshare::log_init("nvshare-fakecuda-stat");
  const char* env_path = std::getenv("NVSHARE_FAKECUDA_STATE");
  std::string path =
      env_path != nullptr && *env_path != '\0' ? env_path : fakecuda::default_state_path();
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      usage(stdout);
      return 0;
    }
    if (arg == "--state" && i + 1 < argc) {
      path = argv[++i];
    } else if (arg.rfind("--state=", 0) == 0) {
      path = arg.substr(8);
    } else {
      usage(stderr);
      return 2;
    }
  }

  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) {
    std::printf("{\"state\": %s, \"devices\": []}\n", json_string(path).c_str());
    return 0;
  }
  auto state = fakecuda::SharedState::open(path, /*create=*/false);
  if (!state.ok()) {
    std::fprintf(stderr, "nvshare-fakecuda-stat: %s\n", state.error().message.c_str());
    return 1;
  }
  const std::unique_ptr<fakecuda::SharedState> owned = std::move(state).value();
  auto records = owned->devices();
  std::printf("{\"state\": %s, \"devices\": [\n", json_string(path).c_str());
  for (std::size_t i = 0; i < records.size(); ++i) {
    fakecuda::SimDevice device(records[i]);
    device.reap_dead_slots();
    print_device(device.snapshot(), i + 1 == records.size());
  }
  std::printf("]}\n");
  return 0;
}
