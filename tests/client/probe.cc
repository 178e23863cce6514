// nvshare-client-probe: a driver-API program that checks libnvshare.so from the inside. The tests
// (client_test.cc) run it as a real process against the simulated driver, with
// LD_PRELOAD=libnvshare.so; each scenario checks itself, prints one line per failed check and a
// summary, and exits 0 only when every check held.
//
//   dispatch     every symbol of hook_list.def reaches our wrapper through every path: the exported
//                symbol (a direct call), dlsym on a dlopen("libcuda.so.1") / libnvidia-ml handle,
//                dlsym(RTLD_DEFAULT), dlsym(RTLD_NEXT), cuGetProcAddress and cuGetProcAddress_v2
//                with each symbol's (base name, version, per-thread flag), and every request the
//                CUDA 13 PyTorch/JAX/CuPy runtimes make (tests/client/data, with what driver 580
//                answered); other names pass through untouched; calls through each path are
//                limited (they reach the wrapper, not just its address).
//   memory       the limit (NVSHARE_MEMORY_LIMIT) at exactly the limit, the context's memory
//                counted, device allocations backed as NVSHARE_MEMORY_MODE says (device memory,
//                or managed memory on the device), pools and VMM counted, cuMemGetInfo /
//                cuDeviceTotalMem / NVML report the limit.
//   peer         two GPUs: after GPU 1's context enables peer access to GPU 0's, GPU 0's
//                device-backed allocations (made before and after) grant GPU 1 access.
//   passthrough  with NVSHARE_ENABLE=0: every path returns the driver's own functions and nothing
//                is converted, counted or limited.
//   context [START_NS [RELEASE_FILE]]
//                sleeps until START_NS (CLOCK_REALTIME nanoseconds; 0: now), retains the primary
//                context of every device (the first CUDA call on each GPU: registration with the
//                scheduler and the context footprint measurement), prints
//                {"first_call_ms":..,"charged":[..]} (the time the first device's retain took, and
//                per device what cuMemGetInfo shows charged besides allocations: total - free,
//                which is the context's footprint) and then, with RELEASE_FILE, waits for that file
//                to exist before it exits, so that no process's exit frees memory while another one
//                measures.
//
// "Lands in our wrapper" is decided with dladdr: the address must lie in libnvshare.so and be the
// symbol of that exact name, which is independent of the dlsym hook under test.
#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "client/hooks/cuda_api.h"
#include "common/quantity.h"
#include "shared_state.h"

namespace {

int g_checks = 0;
int g_failures = 0;

#define CHECK(cond, ...)                               \
  do {                                                 \
    ++g_checks;                                        \
    if (!(cond)) {                                     \
      ++g_failures;                                    \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      std::printf(__VA_ARGS__);                        \
      std::printf("\n");                               \
    }                                                  \
  } while (0)

struct Hook {
  const char* name;
  const char* base;
  int version;
  bool per_thread;
  bool nvml;
  void* direct;  // the address this program was linked against: the exported symbol
};

const Hook kHooks[] = {
#define NVSHARE_HOOK(family, name, base, version, per_thread, ...) \
  {#name, #base, version, per_thread != 0, false, reinterpret_cast<void*>(&::name)},
#define NVSHARE_SUBMIT(family, name, base, version, per_thread, ...) \
  {#name, #base, version, per_thread != 0, false, reinterpret_cast<void*>(&::name)},
#define NVSHARE_NVML(name, ...) {#name, #name, 0, false, true, reinterpret_cast<void*>(&::name)},
#include "client/hooks/hook_list.def"
#undef NVSHARE_HOOK
#undef NVSHARE_SUBMIT
#undef NVSHARE_NVML
};

const Hook* find_hook(const std::string& name) {
  for (const Hook& hook : kHooks) {
    if (name == hook.name) return &hook;
  }
  return nullptr;
}

struct Where {
  std::string file;
  std::string symbol;
  bool exact = false;
};

Where where(const void* address) {
  Where w;
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0) return w;
  if (info.dli_fname != nullptr) w.file = info.dli_fname;
  if (info.dli_sname != nullptr) w.symbol = info.dli_sname;
  w.exact = info.dli_saddr == address;
  return w;
}

std::string describe(const void* address) {
  if (address == nullptr) return "null";
  const Where w = where(address);
  return w.symbol + (w.exact ? "" : "+?") + " in " + w.file;
}

bool in(const Where& w, const char* library) { return w.file.find(library) != std::string::npos; }

// The address is our exported wrapper named `name`.
void expect_wrapper(const char* path, const char* name, const void* address) {
  const Where w = where(address);
  CHECK(w.exact && in(w, "libnvshare") && w.symbol == name, "%s: %s -> %s", path, name,
        describe(address).c_str());
}

// The address is the driver's own function named `name`.
void expect_driver(const char* path, const char* name, const void* address, const char* library) {
  const Where w = where(address);
  CHECK(w.exact && in(w, library) && w.symbol == name, "%s: %s -> %s (want %s's)", path, name,
        describe(address).c_str(), library);
}

std::string result_name(CUresult rc) {
  const char* name = nullptr;
  return cuGetErrorName(rc, &name) == CUDA_SUCCESS && name != nullptr ? name : "?";
}

struct Request {
  std::string how, symbol;
  int version = 0;
  cuuint64_t flags = 0;
  std::string resolved;  // what driver 580 returned
};

std::vector<Request> load_requests() {
  std::vector<Request> out;
  // NVSHARE_PROBE_REQUESTS: another copy of the data (the probe is also run on GPU machines).
  const char* path = std::getenv("NVSHARE_PROBE_REQUESTS");
  if (path == nullptr || *path == '\0') path = NVSHARE_CUDA13_REQUESTS;
  std::ifstream in(path);
  CHECK(in.good(), "cannot read %s", path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string field;
    while (std::getline(ss, field, '\t')) f.push_back(field);
    if (f.size() < 5) continue;
    Request r;
    r.how = f[0];
    r.symbol = f[1];
    r.version = f[2].empty() ? 0 : std::atoi(f[2].c_str());
    r.flags = f[3].empty() ? 0 : std::strtoull(f[3].c_str(), nullptr, 10);
    r.resolved = f[4];
    out.push_back(r);
  }
  return out;
}

std::uint64_t env_quantity(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return 0;
  auto parsed = nvshare::parse_memory_quantity(value);
  return parsed.ok() ? parsed.value() : 0;
}

using GetProcAddressV2 = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);
using MemGetInfo = CUresult (*)(size_t*, size_t*);
using TotalMem = CUresult (*)(size_t*, CUdevice);
using NvmlMemory = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);

CUcontext make_current() {
  CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
  CUcontext ctx = nullptr;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS, "cuDevicePrimaryCtxRetain");
  CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS, "cuCtxSetCurrent");
  return ctx;
}

nvmlDevice_t nvml_device(void* nvml) {
  auto init = reinterpret_cast<nvmlReturn_t (*)()>(dlsym(nvml, "nvmlInit_v2"));
  auto by_index = reinterpret_cast<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(
      dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2"));
  nvmlDevice_t device = nullptr;
  CHECK(init != nullptr && init() == NVML_SUCCESS, "nvmlInit_v2");
  CHECK(by_index != nullptr && by_index(0, &device) == NVML_SUCCESS, "nvmlDeviceGetHandleByIndex");
  return device;
}

// ---- dispatch ----

void check_paths(void* cuda, void* nvml) {
  for (const Hook& hook : kHooks) {
    expect_wrapper("exported symbol", hook.name, hook.direct);
    expect_wrapper(hook.nvml ? "dlsym(libnvidia-ml)" : "dlsym(libcuda)", hook.name,
                   dlsym(hook.nvml ? nvml : cuda, hook.name));
    expect_wrapper("dlsym(RTLD_DEFAULT)", hook.name, dlsym(RTLD_DEFAULT, hook.name));
    expect_wrapper("dlsym(RTLD_NEXT)", hook.name, dlsym(RTLD_NEXT, hook.name));
    if (hook.nvml) continue;
    const cuuint64_t flags = hook.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
    void* fn = nullptr;
    CUresult rc = cuGetProcAddress(hook.base, &fn, hook.version, flags);
    CHECK(rc == CUDA_SUCCESS, "cuGetProcAddress(%s, %d, %llu): %s", hook.base, hook.version,
          static_cast<unsigned long long>(flags), result_name(rc).c_str());
    expect_wrapper("cuGetProcAddress", hook.name, fn);
    fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    rc = cuGetProcAddress_v2(hook.base, &fn, hook.version, flags, &status);
    CHECK(rc == CUDA_SUCCESS && status == CU_GET_PROC_ADDRESS_SUCCESS,
          "cuGetProcAddress_v2(%s, %d, %llu): %s", hook.base, hook.version,
          static_cast<unsigned long long>(flags), result_name(rc).c_str());
    expect_wrapper("cuGetProcAddress_v2", hook.name, fn);
  }
}

void check_cuda13_requests(void* cuda) {
  int resolved_hooked = 0;
  for (const Request& r : load_requests()) {
    const Hook* hook = find_hook(r.resolved);
    if (r.how == "dlsym") {
      void* fn = dlsym(cuda, r.symbol.c_str());
      if (hook != nullptr) {
        expect_wrapper("tsv dlsym(libcuda)", hook->name, fn);
      } else if (fn != nullptr) {
        expect_driver("tsv dlsym(libcuda)", r.symbol.c_str(), fn, "libcuda");
      }
      continue;
    }
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    const CUresult rc = cuGetProcAddress_v2(r.symbol.c_str(), &fn, r.version, r.flags, &status);
    if (rc != CUDA_SUCCESS) {
      // The simulated driver lacks most of the API; it must have everything we hook.
      CHECK(hook == nullptr, "tsv %s@%d/%llu (driver 580: %s, hooked): not resolved (%s)",
            r.symbol.c_str(), r.version, static_cast<unsigned long long>(r.flags),
            r.resolved.c_str(), result_name(rc).c_str());
      continue;
    }
    if (hook != nullptr) {
      ++resolved_hooked;
      expect_wrapper("tsv cuGetProcAddress_v2", hook->name, fn);
    } else {
      // Not hooked: the driver's own function, and the same one driver 580 chose.
      expect_driver("tsv cuGetProcAddress_v2", r.resolved.c_str(), fn, "libcuda");
    }
  }
  CHECK(resolved_hooked > 50, "only %d CUDA 13 requests reached hooked entry points",
        resolved_hooked);
  std::printf("cuda13 requests resolved to hooked entry points: %d\n", resolved_hooked);
}

void check_pass_through(void* cuda) {
  // RTLD_NEXT stays relative to the caller: the next dlsym after this program is ours.
  expect_wrapper("dlsym(RTLD_NEXT) of dlsym", "dlsym", dlsym(RTLD_NEXT, "dlsym"));
  expect_driver("unhooked", "cuDeviceGetName", dlsym(RTLD_DEFAULT, "cuDeviceGetName"), "libcuda");
  expect_driver("unhooked", "cuDeviceGetName", dlsym(cuda, "cuDeviceGetName"), "libcuda");
  expect_driver("unhooked", "cuStreamSynchronize", dlsym(RTLD_NEXT, "cuStreamSynchronize"),
                "libcuda");
  CHECK(dlsym(cuda, "cuNoSuchFunction") == nullptr, "unknown name resolved");
  // An unhooked name resolves exactly as glibc's own dlsym resolves it (libc's malloc, or a
  // sanitizer's interceptor in a sanitized program).
  using Dlsym = void* (*)(void*, const char*);
  Dlsym glibc = nullptr;
  for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"}) {
    if (glibc == nullptr) glibc = reinterpret_cast<Dlsym>(dlvsym(RTLD_DEFAULT, "dlsym", version));
  }
  CHECK(glibc != nullptr, "glibc's dlsym not found");
  if (glibc != nullptr) {
    const Where malloc_at = where(dlsym(RTLD_DEFAULT, "malloc"));
    const Where expected = where(glibc(RTLD_DEFAULT, "malloc"));
    CHECK(malloc_at.file == expected.file, "malloc -> %s, glibc says %s", malloc_at.file.c_str(),
          expected.file.c_str());
  }
  void* fn = nullptr;
  CHECK(cuGetProcAddress("cuNoSuchFunction", &fn, 13000, 0) != CUDA_SUCCESS,
        "unknown cuGetProcAddress name");
  CHECK(cuGetProcAddress("cuDeviceGetName", &fn, 2000, 0) == CUDA_SUCCESS, "cuDeviceGetName");
  expect_driver("cuGetProcAddress unhooked", "cuDeviceGetName", fn, "libcuda");
}

// Calls through every path are limited: they ran our wrapper, not only resolved to it.
void check_calls(void* cuda, void* nvml) {
  const std::uint64_t limit = env_quantity("NVSHARE_MEMORY_LIMIT");
  CHECK(limit != 0, "the dispatch scenario needs NVSHARE_MEMORY_LIMIT");
  make_current();
  std::vector<std::pair<const char*, MemGetInfo>> meminfo = {
      {"exported", &cuMemGetInfo_v2},
      {"dlsym(libcuda)", reinterpret_cast<MemGetInfo>(dlsym(cuda, "cuMemGetInfo_v2"))},
      {"dlsym(RTLD_DEFAULT)", reinterpret_cast<MemGetInfo>(dlsym(RTLD_DEFAULT, "cuMemGetInfo_v2"))},
  };
  void* fn = nullptr;
  if (cuGetProcAddress_v2("cuMemGetInfo", &fn, 3020, 0, nullptr) == CUDA_SUCCESS) {
    meminfo.emplace_back("cuGetProcAddress_v2", reinterpret_cast<MemGetInfo>(fn));
  }
  // The runtime's way: cuGetProcAddress_v2 itself taken from cuGetProcAddress.
  void* gpa = nullptr;
  CHECK(cuGetProcAddress("cuGetProcAddress", &gpa, 12000, 0) == CUDA_SUCCESS, "gpa@12000");
  expect_wrapper("cuGetProcAddress(cuGetProcAddress@12000)", "cuGetProcAddress_v2", gpa);
  if (gpa != nullptr && reinterpret_cast<GetProcAddressV2>(gpa)("cuMemGetInfo", &fn, 13000, 2,
                                                                nullptr) == CUDA_SUCCESS) {
    meminfo.emplace_back("runtime table", reinterpret_cast<MemGetInfo>(fn));
  }
  CHECK(meminfo.size() == 5, "%zu cuMemGetInfo paths", meminfo.size());
  for (const auto& [path, call] : meminfo) {
    size_t free = 0;
    size_t total = 0;
    CHECK(call != nullptr && call(&free, &total) == CUDA_SUCCESS, "%s cuMemGetInfo_v2", path);
    CHECK(total == limit, "%s: cuMemGetInfo total %zu, want the limit %" PRIu64, path, total,
          limit);
  }
  for (TotalMem call :
       {&cuDeviceTotalMem_v2, reinterpret_cast<TotalMem>(dlsym(cuda, "cuDeviceTotalMem_v2"))}) {
    size_t bytes = 0;
    CHECK(call != nullptr && call(&bytes, 0) == CUDA_SUCCESS && bytes == limit,
          "cuDeviceTotalMem_v2 %zu", bytes);
  }
  nvmlDevice_t device = nvml_device(nvml);
  for (NvmlMemory call : {&nvmlDeviceGetMemoryInfo,
                          reinterpret_cast<NvmlMemory>(dlsym(nvml, "nvmlDeviceGetMemoryInfo"))}) {
    nvmlMemory_t memory{};
    CHECK(call != nullptr && call(device, &memory) == NVML_SUCCESS && memory.total == limit,
          "nvmlDeviceGetMemoryInfo total %llu", memory.total);
  }
}

int dispatch() {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  CHECK(cuda != nullptr && nvml != nullptr, "dlopen");
  if (cuda == nullptr || nvml == nullptr) return 1;
  check_paths(cuda, nvml);
  check_cuda13_requests(cuda);
  check_pass_through(cuda);
  check_calls(cuda, nvml);
  std::printf("hooks: %zu\n", sizeof kHooks / sizeof kHooks[0]);
  return 0;
}

// ---- memory ----

fakecuda::DeviceSnapshot fake_device() {
  auto state = fakecuda::SharedState::open(std::getenv("NVSHARE_FAKECUDA_STATE"), false);
  CHECK(state.ok(), "state file");
  auto devices = state.ok() ? state.value()->devices() : std::vector<fakecuda::DeviceRecord*>{};
  CHECK(!devices.empty(), "no simulated device");
  return devices.empty() ? fakecuda::DeviceSnapshot{} : fakecuda::SimDevice(devices[0]).snapshot();
}

int memory() {
  const std::uint64_t limit = env_quantity("NVSHARE_MEMORY_LIMIT");
  const std::uint64_t context = env_quantity("NVSHARE_FAKECUDA_CONTEXT_MEMORY");
  CHECK(limit > context, "the memory scenario needs NVSHARE_MEMORY_LIMIT > the context memory");
  make_current();

  size_t free = 0;
  size_t total = 0;
  CHECK(cuMemGetInfo_v2(&free, &total) == CUDA_SUCCESS, "cuMemGetInfo");
  CHECK(total == limit, "total %zu, want the limit %" PRIu64, total, limit);
  CHECK(free == limit - context, "free %zu, want limit - context = %" PRIu64, free,
        limit - context);
  size_t device_total = 0;
  CHECK(cuDeviceTotalMem_v2(&device_total, 0) == CUDA_SUCCESS && device_total == limit,
        "cuDeviceTotalMem %zu", device_total);

  // Exactly the rest fits; one byte more does not; nothing changes on refusal.
  CUdeviceptr too_big = 0;
  CHECK(cuMemAlloc_v2(&too_big, free + 1) == CUDA_ERROR_OUT_OF_MEMORY, "free + 1 allowed");
  CUdeviceptr all = 0;
  const CUresult rc = cuMemAlloc_v2(&all, free);
  CHECK(rc == CUDA_SUCCESS, "allocating exactly free (%zu): %s", free, result_name(rc).c_str());
  CUdeviceptr one = 0;
  CHECK(cuMemAlloc_v2(&one, 1) == CUDA_ERROR_OUT_OF_MEMORY, "one byte over the limit allowed");
  CHECK(cuMemAllocManaged(&one, 1, CU_MEM_ATTACH_GLOBAL) == CUDA_ERROR_OUT_OF_MEMORY,
        "managed byte over the limit allowed");
  size_t free_after = 1;
  CHECK(cuMemGetInfo_v2(&free_after, &total) == CUDA_SUCCESS && free_after == 0,
        "free after filling the limit: %zu", free_after);

  // The allocation is usable; in the unified mode it is managed memory placed on the device, in
  // the device-backed mode (the default) device memory.
  const char* mode = std::getenv("NVSHARE_MEMORY_MODE");
  const bool unified = mode != nullptr && std::string_view(mode) == "unified";
  unsigned managed = 2;
  CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, all) == CUDA_SUCCESS &&
            managed == (unified ? 1u : 0u),
        "device allocation is%s managed", unified ? " not" : "");
  unsigned type = 0;
  CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, all) == CUDA_SUCCESS &&
            type == CU_MEMORYTYPE_DEVICE,
        "memory type %u", type);
  CHECK(cuMemsetD8_v2(all, 0x5a, 4096) == CUDA_SUCCESS, "memset");
  unsigned char byte = 0;
  CHECK(cuMemcpyDtoH_v2(&byte, all + 4095, 1) == CUDA_SUCCESS && byte == 0x5a, "copy back");
  CHECK(cuCtxSynchronize() == CUDA_SUCCESS, "sync");
  fakecuda::DeviceSnapshot s = fake_device();
  const std::uint64_t want_managed = unified ? free : 0;
  const std::uint64_t want_device = unified ? context : context + free;
  CHECK(s.memory.managed_resident == want_managed,
        "fake: %" PRIu64 " managed bytes on the device, want %" PRIu64, s.memory.managed_resident,
        want_managed);
  CHECK(s.memory.device_bytes == want_device, "fake: %" PRIu64 " device bytes, want %" PRIu64,
        s.memory.device_bytes, want_device);
  CHECK(cuMemFree_v2(all) == CUDA_SUCCESS, "free");
  CHECK(cuMemGetInfo_v2(&free_after, &total) == CUDA_SUCCESS && free_after == free,
        "free after cuMemFree: %zu", free_after);

  // Pitched allocations: the driver's pitch, charged pitch * height.
  CUdeviceptr pitched = 0;
  size_t pitch = 0;
  CHECK(cuMemAllocPitch_v2(&pitched, &pitch, 1000, 64, 4) == CUDA_SUCCESS && pitch == 1024,
        "pitched allocation (pitch %zu)", pitch);
  CHECK(cuMemGetInfo_v2(&free_after, &total) == CUDA_SUCCESS && free_after == free - pitch * 64,
        "pitched allocation charged %zu", free - free_after);
  CHECK(cuMemFree_v2(pitched) == CUDA_SUCCESS, "free pitched");

  // Stream-ordered and VMM allocations cannot be managed but are counted.
  CUstream stream = nullptr;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
  CUdeviceptr async = 0;
  CHECK(cuMemAllocAsync(&async, 4 << 20, stream) == CUDA_SUCCESS, "cuMemAllocAsync");
  CHECK(cuMemGetInfo_v2(&free_after, &total) == CUDA_SUCCESS && free_after == free - (4 << 20),
        "async allocation not counted");
  CHECK(cuMemAllocAsync(&too_big, free, stream) == CUDA_ERROR_OUT_OF_MEMORY,
        "async allocation over the limit allowed");
  CHECK(cuMemFreeAsync(async, stream) == CUDA_SUCCESS, "cuMemFreeAsync");
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle handle = 0;
  CHECK(cuMemCreate(&handle, 2 << 20, &prop, 0) == CUDA_SUCCESS, "cuMemCreate");
  CHECK(cuMemGetInfo_v2(&free_after, &total) == CUDA_SUCCESS && free_after == free - (2 << 20),
        "VMM allocation not counted (free %zu)", free_after);
  CHECK(cuMemRelease(handle) == CUDA_SUCCESS, "cuMemRelease");
  CHECK(cuStreamSynchronize(stream) == CUDA_SUCCESS, "stream sync");
  CHECK(cuMemGetInfo_v2(&free_after, &total) == CUDA_SUCCESS && free_after == free,
        "frees not refunded (free %zu)", free_after);

  // NVML: the limit, and this process's usage.
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  CHECK(nvml != nullptr, "dlopen libnvidia-ml");
  if (nvml != nullptr) {
    nvmlDevice_t device = nvml_device(nvml);
    nvmlMemory_t m{};
    CHECK(nvmlDeviceGetMemoryInfo(device, &m) == NVML_SUCCESS && m.total == limit &&
              m.used == context && m.free == limit - context,
          "NVML total %llu used %llu free %llu", m.total, m.used, m.free);
    nvmlMemory_v2_t m2{};
    m2.version = nvmlMemory_v2;
    CHECK(nvmlDeviceGetMemoryInfo_v2(device, &m2) == NVML_SUCCESS && m2.total == limit,
          "NVML v2 total %llu", m2.total);
  }
  std::printf("limit %" PRIu64 " context %" PRIu64 " free %zu\n", limit, context, free);
  return 0;
}

// ---- passthrough (NVSHARE_ENABLE=0) ----

int passthrough() {
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
  CHECK(cuda != nullptr, "dlopen");
  if (cuda == nullptr) return 1;
  for (const Hook& hook : kHooks) {
    if (hook.nvml) continue;
    expect_driver("disabled dlsym(libcuda)", hook.name, dlsym(cuda, hook.name), "libcuda");
    const cuuint64_t flags = hook.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
    void* fn = nullptr;
    cuGetProcAddress_v2(hook.base, &fn, hook.version, flags, nullptr);
    expect_driver("disabled cuGetProcAddress_v2", hook.name, fn, "libcuda");
  }
  make_current();
  size_t free = 0;
  size_t total = 0;
  CHECK(cuMemGetInfo_v2(&free, &total) == CUDA_SUCCESS, "cuMemGetInfo");
  const fakecuda::DeviceSnapshot s = fake_device();
  CHECK(total == s.memory.total, "disabled: total %zu, the device has %" PRIu64, total,
        s.memory.total);
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc_v2(&p, 1 << 20) == CUDA_SUCCESS, "alloc");
  unsigned managed = 1;
  CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p) == CUDA_SUCCESS &&
            managed == 0,
        "disabled: the allocation became managed");
  CHECK(cuMemFree_v2(p) == CUDA_SUCCESS, "free");
  return 0;
}

// ---- context ----

double monotonic_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

int context(int argc, char** argv) {
  const long long start_ns = argc > 2 ? std::atoll(argv[2]) : 0;
  const std::string release = argc > 3 ? argv[3] : "";
  if (cuInit(0) != CUDA_SUCCESS) {
    std::printf("FAIL cuInit\n");
    return 1;
  }
  int count = 0;
  CHECK(cuDeviceGetCount(&count) == CUDA_SUCCESS && count > 0, "cuDeviceGetCount %d", count);
  if (start_ns > 0) {
    timespec at{static_cast<time_t>(start_ns / 1'000'000'000),
                static_cast<long>(start_ns % 1'000'000'000)};
    while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &at, nullptr) != 0) {
    }
  }
  std::vector<CUcontext> contexts(static_cast<std::size_t>(count), nullptr);
  double first_call_ms = -1;
  for (int d = 0; d < count; ++d) {
    const double t0 = monotonic_ms();
    const CUresult rc = cuDevicePrimaryCtxRetain(&contexts[d], d);
    if (d == 0) first_call_ms = monotonic_ms() - t0;
    CHECK(rc == CUDA_SUCCESS, "cuDevicePrimaryCtxRetain(%d): %s", d, result_name(rc).c_str());
  }
  std::string charged;
  for (int d = 0; d < count; ++d) {
    size_t free = 0;
    size_t total = 0;
    CHECK(contexts[d] != nullptr && cuCtxSetCurrent(contexts[d]) == CUDA_SUCCESS &&
              cuMemGetInfo_v2(&free, &total) == CUDA_SUCCESS,
          "cuMemGetInfo on device %d", d);
    charged += (d > 0 ? "," : "") + std::to_string(total - free);
  }
  std::printf("{\"first_call_ms\":%.3f,\"charged\":[%s]}\n", first_call_ms, charged.c_str());
  std::fflush(stdout);
  if (!release.empty()) {
    for (int i = 0; i < 6000 && access(release.c_str(), F_OK) != 0; ++i) usleep(10'000);
  }
  for (int d = 0; d < count; ++d) {
    if (contexts[d] != nullptr) cuDevicePrimaryCtxRelease(d);
  }
  return 0;
}

// ---- peer ----

unsigned long long access_of(int device, CUdeviceptr p) {
  CUmemLocation location{};
  location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  location.id = device;
  unsigned long long flags = 99;
  CHECK(cuMemGetAccess(&flags, &location, p) == CUDA_SUCCESS, "cuMemGetAccess(%d)", device);
  return flags;
}

int peer() {
  CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
  CUcontext ctx[2] = {};
  for (int d = 0; d < 2; ++d) {
    CHECK(cuDevicePrimaryCtxRetain(&ctx[d], d) == CUDA_SUCCESS, "retain %d", d);
  }
  CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "current 0");
  CUdeviceptr before = 0;
  CHECK(cuMemAlloc_v2(&before, 4 << 20) == CUDA_SUCCESS, "allocate on GPU 0");
  CHECK(access_of(0, before) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "GPU 0 reads its own");
  CHECK(access_of(1, before) == CU_MEM_ACCESS_FLAGS_PROT_NONE, "GPU 1 reads GPU 0 unasked");
  CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS, "current 1");
  CHECK(cuCtxEnablePeerAccess(ctx[0], 0) == CUDA_SUCCESS, "peer access 1 -> 0");
  CHECK(cuCtxEnablePeerAccess(ctx[0], 0) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        "the driver's answer to a second enable");
  CHECK(access_of(1, before) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "GPU 1 reads GPU 0's memory");
  CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "current 0 again");
  CUdeviceptr after = 0;
  CHECK(cuMemAlloc_v2(&after, 4 << 20) == CUDA_SUCCESS, "allocate on GPU 0 after");
  CHECK(access_of(1, after) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "GPU 1 reads a later one");
  CHECK(cuMemFree_v2(before) == CUDA_SUCCESS && cuMemFree_v2(after) == CUDA_SUCCESS, "free");
  for (int d = 0; d < 2; ++d) cuDevicePrimaryCtxRelease(d);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  int rc = 2;
  if (scenario == "dispatch") {
    rc = dispatch();
  } else if (scenario == "memory") {
    rc = memory();
  } else if (scenario == "passthrough") {
    rc = passthrough();
  } else if (scenario == "context") {
    rc = context(argc, argv);
  } else if (scenario == "peer") {
    rc = peer();
  } else {
    std::fprintf(stderr,
                 "usage: nvshare-client-probe dispatch|memory|passthrough|peer|context [START_NS "
                 "[RELEASE_FILE]]\n");
    return 2;
  }
  std::printf("{\"scenario\":\"%s\",\"checks\":%d,\"failures\":%d}\n", scenario.c_str(), g_checks,
              g_failures);
  return rc != 0 || g_failures != 0 ? 1 : 0;
}
