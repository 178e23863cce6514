// nvshare-trainer: a training-loop-shaped GPU workload written against the CUDA driver API only, so
// it runs unchanged on the simulated driver (tests/fakecuda) and on a real GPU.
//
// It allocates memory (device memory, or managed memory prefetched to the device), then runs
// iterations of kernels that each spin for a given time, timing every iteration with events, and
// prints one JSON object:
//   {"device":0,"uuid":"GPU-...","bytes":...,"managed":false,"iterations":K,"kernels_per_iter":M,
//    "kernel_us":D,"wall_s":...,"gpu_s":...,"iters_per_s":...,"result":"ok"}
// On a CUDA error it prints {"result":"error","error":"<CUDA error name>: <call>",...} and exits 1.
//
// Contract: wall_s is the steady-clock time of the iteration loop; gpu_s sums, per iteration, the
// event time between a record before its kernels and one after them; each iteration is synchronized
// before the host sleep, so gpu_s excludes --sleep-us. The kernel is PTX (nvshare_spin(.param .u64
// ns)) that spins on %globaltimer; the simulated driver reads the same parameter as the kernel's
// duration.
#include <cuda.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

#include "common/quantity.h"

namespace {

constexpr const char kSpinPtx[] = R"(
.version 7.8
.target sm_80
.address_size 64

.visible .entry nvshare_spin(
    .param .u64 nvshare_spin_param_0
)
{
    .reg .pred  %p<2>;
    .reg .b64   %rd<5>;

    ld.param.u64    %rd1, [nvshare_spin_param_0];
    mov.u64         %rd2, %globaltimer;
$L_spin:
    mov.u64         %rd3, %globaltimer;
    sub.s64         %rd4, %rd3, %rd2;
    setp.lt.u64     %p1, %rd4, %rd1;
    @%p1 bra        $L_spin;
    ret;
}
)";

struct Options {
  int device = 0;
  std::uint64_t bytes = 0;
  bool managed = false;
  long kernels = 100;
  long kernel_us = 1000;
  long kernels_per_iter = 1;
  long sleep_us = 0;
  unsigned blocks = 1;
  unsigned threads = 32;
  bool report_meminfo = false;
  bool exit_without_cleanup = false;
};

struct Report {
  int device = 0;
  std::string uuid;
  std::uint64_t bytes = 0;
  bool managed = false;
  long iterations = 0;
  long kernels_per_iter = 1;
  long kernel_us = 0;
  double wall_s = 0;
  double gpu_s = 0;
  bool have_meminfo = false;
  std::size_t mem_free = 0;
  std::size_t mem_total = 0;
};

Report g_report;

void print_report(const char* result, const std::string& error) {
  const Report& r = g_report;
  std::printf("{\"device\":%d,\"uuid\":\"%s\",\"bytes\":%" PRIu64
              ",\"managed\":%s,\"iterations\":%ld,\"kernels_per_iter\":%ld,\"kernel_us\":%ld,"
              "\"wall_s\":%.6f,\"gpu_s\":%.6f,\"iters_per_s\":%.3f",
              r.device, r.uuid.c_str(), r.bytes, r.managed ? "true" : "false", r.iterations,
              r.kernels_per_iter, r.kernel_us, r.wall_s, r.gpu_s,
              r.wall_s > 0 ? static_cast<double>(r.iterations) / r.wall_s : 0.0);
  if (r.have_meminfo) std::printf(",\"mem_free\":%zu,\"mem_total\":%zu", r.mem_free, r.mem_total);
  if (!error.empty()) std::printf(",\"error\":\"%s\"", error.c_str());
  std::printf(",\"result\":\"%s\"}\n", result);
  std::fflush(stdout);
}

[[noreturn]] void fail_cuda(CUresult rc, const char* call) {
  const char* name = nullptr;
  if (cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == nullptr) name = "CUDA_ERROR_UNKNOWN";
  print_report("error", std::string(name) + ": " + call);
  std::exit(1);
}

// Calls a driver function and reports "<error name>: <function>" on failure.
#define CU_CHECK(function, args)                        \
  do {                                                  \
    CUresult rc_ = function args;                       \
    if (rc_ != CUDA_SUCCESS) fail_cuda(rc_, #function); \
  } while (0)

void usage(FILE* out) {
  std::fprintf(
      out,
      "usage: nvshare-trainer [options]\n"
      "  --device N            device ordinal (default 0)\n"
      "  --bytes Q             memory to allocate and memset, a quantity (512Mi; default 0)\n"
      "  --managed             allocate managed memory and prefetch it to the device\n"
      "  --kernels K           iterations (default 100)\n"
      "  --kernel-us D         duration of each kernel in microseconds (default 1000)\n"
      "  --kernels-per-iter M  kernels per iteration (default 1)\n"
      "  --sleep-us S          host sleep after each iteration (default 0)\n"
      "  --blocks B            grid size of each launch (default 1)\n"
      "  --threads T           block size of each launch (default 32)\n"
      "  --report-meminfo      include cuMemGetInfo free/total after allocating\n"
      "  --exit-without-cleanup  exit holding the memory, context and module, as crashing or\n"
      "                        careless programs do (the driver must release them)\n"
      "  --json                JSON output (the default and only format)\n");
}

bool parse_long(std::string_view text, long min, long* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  std::string copy(text);
  long value = std::strtol(copy.c_str(), &end, 10);
  if (*end != '\0' || value < min) return false;
  *out = value;
  return true;
}

bool parse_options(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&](std::string_view* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string_view v;
    long number = 0;
    if (arg == "--help" || arg == "-h") {
      usage(stdout);
      std::exit(0);
    } else if (arg == "--managed") {
      options->managed = true;
    } else if (arg == "--report-meminfo") {
      options->report_meminfo = true;
    } else if (arg == "--exit-without-cleanup") {
      options->exit_without_cleanup = true;
    } else if (arg == "--json") {
      // The only output format; accepted so scripts can be explicit.
    } else if (arg == "--bytes" && value(&v)) {
      auto parsed = nvshare::parse_memory_quantity(v);
      if (!parsed.ok()) {
        std::fprintf(stderr, "nvshare-trainer: --bytes: %s\n", parsed.error().message.c_str());
        return false;
      }
      options->bytes = parsed.value();
    } else if (arg == "--device" && value(&v) && parse_long(v, 0, &number)) {
      options->device = static_cast<int>(number);
    } else if (arg == "--kernels" && value(&v) && parse_long(v, 0, &number)) {
      options->kernels = number;
    } else if (arg == "--kernel-us" && value(&v) && parse_long(v, 0, &number)) {
      options->kernel_us = number;
    } else if (arg == "--kernels-per-iter" && value(&v) && parse_long(v, 1, &number)) {
      options->kernels_per_iter = number;
    } else if (arg == "--sleep-us" && value(&v) && parse_long(v, 0, &number)) {
      options->sleep_us = number;
    } else if (arg == "--blocks" && value(&v) && parse_long(v, 1, &number)) {
      options->blocks = static_cast<unsigned>(number);
    } else if (arg == "--threads" && value(&v) && parse_long(v, 1, &number)) {
      options->threads = static_cast<unsigned>(number);
    } else {
      std::fprintf(stderr, "nvshare-trainer: bad or incomplete option %s\n", argv[i]);
      return false;
    }
  }
  return true;
}

std::string format_uuid(const CUuuid& uuid) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    auto byte = static_cast<unsigned char>(uuid.bytes[i]);
    out.push_back(kHex[byte >> 4]);
    out.push_back(kHex[byte & 0xf]);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!parse_options(argc, argv, &options)) {
    usage(stderr);
    return 2;
  }
  Report& report = g_report;
  report.device = options.device;
  report.bytes = options.bytes;
  report.managed = options.managed;
  report.kernels_per_iter = options.kernels_per_iter;
  report.kernel_us = options.kernel_us;

  CU_CHECK(cuInit, (0));
  CUdevice device = 0;
  CU_CHECK(cuDeviceGet, (&device, options.device));
  CUuuid uuid{};
  CU_CHECK(cuDeviceGetUuid, (&uuid, device));
  report.uuid = format_uuid(uuid);
  // The primary context, as the CUDA runtime (and so most applications) uses it.
  CUcontext ctx = nullptr;
  CU_CHECK(cuDevicePrimaryCtxRetain, (&ctx, device));
  CU_CHECK(cuCtxSetCurrent, (ctx));

  CUmodule module = nullptr;
  CU_CHECK(cuModuleLoadData, (&module, kSpinPtx));
  CUfunction spin = nullptr;
  CU_CHECK(cuModuleGetFunction, (&spin, module, "nvshare_spin"));
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate, (&stream, CU_STREAM_DEFAULT));

  CUdeviceptr buffer = 0;
  if (options.bytes > 0) {
    if (options.managed) {
      CU_CHECK(cuMemAllocManaged, (&buffer, options.bytes, CU_MEM_ATTACH_GLOBAL));
      CUmemLocation location{};
      location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      location.id = device;
      CU_CHECK(cuMemPrefetchAsync, (buffer, options.bytes, location, 0, stream));
    } else {
      CU_CHECK(cuMemAlloc, (&buffer, options.bytes));
    }
    CU_CHECK(cuMemsetD8Async, (buffer, 0, options.bytes, stream));
    CU_CHECK(cuStreamSynchronize, (stream));
  }
  if (options.report_meminfo) {
    CU_CHECK(cuMemGetInfo, (&report.mem_free, &report.mem_total));
    report.have_meminfo = true;
  }

  CUevent begin = nullptr;
  CUevent end = nullptr;
  CU_CHECK(cuEventCreate, (&begin, CU_EVENT_DEFAULT));
  CU_CHECK(cuEventCreate, (&end, CU_EVENT_DEFAULT));
  std::uint64_t spin_ns = static_cast<std::uint64_t>(options.kernel_us) * 1000;
  void* params[] = {&spin_ns};

  const auto wall_start = std::chrono::steady_clock::now();
  double gpu_ms = 0;
  for (long iteration = 0; iteration < options.kernels; ++iteration) {
    CU_CHECK(cuEventRecord, (begin, stream));
    for (long k = 0; k < options.kernels_per_iter; ++k) {
      CU_CHECK(cuLaunchKernel,
               (spin, options.blocks, 1, 1, options.threads, 1, 1, 0, stream, params, nullptr));
    }
    CU_CHECK(cuEventRecord, (end, stream));
    CU_CHECK(cuEventSynchronize, (end));
    float ms = 0;
    CU_CHECK(cuEventElapsedTime, (&ms, begin, end));
    gpu_ms += ms;
    report.iterations = iteration + 1;
    if (options.sleep_us > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(options.sleep_us));
  }
  report.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  report.gpu_s = gpu_ms / 1000.0;
  if (options.exit_without_cleanup) {
    print_report("ok", "");
    return 0;
  }

  CU_CHECK(cuEventDestroy, (begin));
  CU_CHECK(cuEventDestroy, (end));
  if (buffer != 0) CU_CHECK(cuMemFree, (buffer));
  CU_CHECK(cuStreamDestroy, (stream));
  CU_CHECK(cuModuleUnload, (module));
  CU_CHECK(cuDevicePrimaryCtxRelease, (device));
  print_report("ok", "");
  return 0;
}
