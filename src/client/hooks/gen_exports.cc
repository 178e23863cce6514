// Build-time generator of libnvshare.so's version script from hook_list.def: the hooked symbols and
// dlsym are global, everything else (our C++ internals, static libstdc++) is local. With --list it
// prints just the names, one per line (the tests compare them with `nm -D`).
#include <cstdio>
#include <cstring>

#include "client/hooks/cuda_api.h"

namespace {

const char* const kNames[] = {
#define NVSHARE_HOOK(family, name, ...) #name,
#define NVSHARE_SUBMIT(family, name, ...) #name,
#define NVSHARE_NVML(name, ...) #name,
#include "client/hooks/hook_list.def"
#undef NVSHARE_HOOK
#undef NVSHARE_SUBMIT
#undef NVSHARE_NVML
    "dlsym",
};

}  // namespace

int main(int argc, char** argv) {
  const bool list = argc > 1 && std::strcmp(argv[1], "--list") == 0;
  if (!list) {
    std::printf(
        "/* libnvshare.so exports: generated from src/client/hooks/hook_list.def. */\n{\n"
        "  global:\n");
  }
  for (const char* name : kNames) std::printf(list ? "%s\n" : "    %s;\n", name);
  if (!list) std::printf("  local:\n    *;\n};\n");
  return 0;
}
