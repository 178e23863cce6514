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
//
// With --bytes, "buffer_managed" says whether the buffer is managed memory (under nvshare: the
// memory mode the process got). Observation flags for end-to-end tests (each adds fields, none
// changes the ones above). Every timestamp is CLOCK_MONOTONIC in seconds, so a test can line the
// trainer's events up with its own (a kill, a set-limits call) and with other processes':
//   --first-kernel-timestamp  "start_s" (main entered), "first_launch_call_s" / "first_kernel_s"
//                             (just before / after the first cuLaunchKernel returned: under
//                             nvshare, the moment this process got the GPU)
//   --progress                one line per iteration on stderr: {"progress":i,"launch_s":..,
//                             "done_s":..,"gpu_ms":..}: when its kernels were submitted and done
//   --meminfo-every-ms N      a thread samples cuMemGetInfo every N ms; each sample whose free or
//                             total differs from the previous one is a line on stderr and an entry
//                             of "meminfo_changes":[{"t":..,"free":..,"total":..}]; also
//                             "meminfo_samples" (how many) and "meminfo_max_total"
//   --alloc-after-ms T --alloc-bytes Q
//                             T ms into the loop (between iterations) tries cuMemAlloc(Q) and
//                             reports "late_alloc":{"t":..,"bytes":Q,"result":"<CUresult name>"};
//                             a failure there is a result, not an error of the run
//   --probe-free              after allocating: read cuMemGetInfo (free F, total T), try to
//                             allocate F + 1 bytes, then exactly F, then 1 more byte, and report
//                             each result name in "probe" (the check that a memory limit is exact;
//                             refused when more than 16Gi is free, so it never fills a real GPU)
//   --ipc-export FILE         after allocating: fill the buffer with 0x5a, write the buffer's
//                             cuIpcGetMemHandle (hex) to FILE; "ipc_export":"<CUresult name>",
//                             "ipc_capable": the pointer's IS_LEGACY_CUDA_IPC_CAPABLE attribute
//   --ipc-wait FILE           after the loop: wait (up to 60 s) for FILE, then report the buffer's
//                             first byte as "ipc_seen" (hex): what an importer wrote
//   --ipc-import FILE         before the loop: wait (up to 60 s) for a handle in FILE, open it
//                             (cuIpcOpenMemHandle; a failure is the run's error), report its first
//                             byte as "ipc_read", write 0xa5 over its first 4 KiB, close it;
//                             with --ipc-done FILE2, create FILE2 afterwards
//   --ipc-bytes Q             with --ipc-import: the opened memory is Q bytes; its last 4 KiB are
//                             read ("ipc_read_last") and overwritten with 0xa5 as well (a handle of
//                             an allocation the library backs in pieces maps every piece). With
//                             --ipc-wait: the buffer's last byte is reported too ("ipc_seen_last")
//   --also-device N           one process on two GPUs: also retains device N's primary context,
//                             allocates --also-bytes there, and every iteration launches its
//                             kernels on both devices (switching the current context) and waits for
//                             both; reports
//                             "also":{"device":N,"uuid":..,"mem_total":..,"kernels":..} and, with
//                             --also-try-bytes Q, "try":"<CUresult name>" of allocating Q more
//                             there (a failure there is a result, not an error of the run)
#include <cuda.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

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
  long graph_kernels = 0;
  long warmup_kernels = 0;
  long warmup_us = 100;
  long sleep_us = 0;
  unsigned blocks = 1;
  unsigned threads = 32;
  bool report_meminfo = false;
  bool exit_without_cleanup = false;
  bool first_kernel_timestamp = false;
  bool progress = false;
  long meminfo_every_ms = 0;
  long alloc_after_ms = -1;
  std::uint64_t alloc_bytes = 0;
  bool probe_free = false;
  std::uint64_t spare_bytes = 0;
  std::string ipc_export;
  std::string ipc_wait;
  std::string ipc_import;
  std::string ipc_done;
  std::uint64_t ipc_bytes = 0;
  int also_device = -1;
  std::uint64_t also_bytes = 0;
  std::uint64_t also_try_bytes = 0;
};

struct MeminfoSample {
  double t = 0;
  std::size_t free = 0;
  std::size_t total = 0;
};

struct Report {
  int buffer_managed = -1;  // whether the buffer is managed memory (cuPointerGetAttribute), once
  std::string ipc_export;   // CUresult name of cuIpcGetMemHandle, when asked
  int ipc_seen = -1;        // first byte of the buffer after the importer was done
  int ipc_capable = -1;     // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE of the buffer
  int ipc_read = -1;        // first byte of the imported memory
  int ipc_seen_last = -1;   // last byte of the buffer after the importer was done (--ipc-bytes)
  int ipc_read_last = -1;   // last byte of the imported memory (--ipc-bytes)
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
  // --first-kernel-timestamp
  bool have_timestamps = false;
  double start_s = 0;
  double first_launch_call_s = 0;
  double first_kernel_s = 0;
  // --meminfo-every-ms (guarded by meminfo_mutex: the sampler thread appends)
  bool have_meminfo_changes = false;
  std::vector<MeminfoSample> meminfo_changes;
  std::uint64_t meminfo_samples = 0;  // every sample, not only the changes
  std::size_t meminfo_max_total = 0;  // the largest total any sample showed
  // --alloc-after-ms
  bool have_late_alloc = false;
  double late_alloc_t = 0;
  std::uint64_t late_alloc_bytes = 0;
  std::string late_alloc_result;
  // --probe-free
  bool have_probe = false;
  std::size_t probe_total = 0;
  std::size_t probe_free = 0;
  std::string probe_over_by_one;
  std::string probe_exact;
  std::size_t probe_free_after = 0;
  std::string probe_one_more;
  // --also-device
  int also_device = -1;
  std::string also_uuid;
  std::size_t also_mem_total = 0;
  long also_kernels = 0;
  std::string also_try;
};

Report g_report;
std::mutex g_meminfo_mutex;

// CLOCK_MONOTONIC in seconds: the clock other processes (tests, scripts) can read too.
double monotonic_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string result_name(CUresult rc) {
  const char* name = nullptr;
  if (cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == nullptr) return "CUDA_ERROR_UNKNOWN";
  return name;
}

void print_report(const char* result, const std::string& error) {
  const Report& r = g_report;
  std::printf("{\"device\":%d,\"uuid\":\"%s\",\"bytes\":%" PRIu64
              ",\"managed\":%s,\"iterations\":%ld,\"kernels_per_iter\":%ld,\"kernel_us\":%ld,"
              "\"wall_s\":%.6f,\"gpu_s\":%.6f,\"iters_per_s\":%.3f",
              r.device, r.uuid.c_str(), r.bytes, r.managed ? "true" : "false", r.iterations,
              r.kernels_per_iter, r.kernel_us, r.wall_s, r.gpu_s,
              r.wall_s > 0 ? static_cast<double>(r.iterations) / r.wall_s : 0.0);
  if (r.have_meminfo) std::printf(",\"mem_free\":%zu,\"mem_total\":%zu", r.mem_free, r.mem_total);
  if (r.have_timestamps) {
    std::printf(",\"start_s\":%.6f,\"first_launch_call_s\":%.6f,\"first_kernel_s\":%.6f", r.start_s,
                r.first_launch_call_s, r.first_kernel_s);
  }
  if (r.have_meminfo_changes) {
    std::lock_guard<std::mutex> lock(g_meminfo_mutex);
    std::printf(",\"meminfo_changes\":[");
    for (std::size_t i = 0; i < r.meminfo_changes.size(); ++i) {
      const MeminfoSample& m = r.meminfo_changes[i];
      std::printf("%s{\"t\":%.6f,\"free\":%zu,\"total\":%zu}", i == 0 ? "" : ",", m.t, m.free,
                  m.total);
    }
    std::printf("],\"meminfo_samples\":%" PRIu64 ",\"meminfo_max_total\":%zu", r.meminfo_samples,
                r.meminfo_max_total);
  }
  if (r.have_late_alloc) {
    std::printf(",\"late_alloc\":{\"t\":%.6f,\"bytes\":%" PRIu64 ",\"result\":\"%s\"}",
                r.late_alloc_t, r.late_alloc_bytes, r.late_alloc_result.c_str());
  }
  if (r.have_probe) {
    std::printf(
        ",\"probe\":{\"total\":%zu,\"free\":%zu,\"over_by_one\":\"%s\",\"exact\":\"%s\","
        "\"free_after\":%zu,\"one_more\":\"%s\"}",
        r.probe_total, r.probe_free, r.probe_over_by_one.c_str(), r.probe_exact.c_str(),
        r.probe_free_after, r.probe_one_more.c_str());
  }
  if (r.buffer_managed >= 0) {
    std::printf(",\"buffer_managed\":%s", r.buffer_managed != 0 ? "true" : "false");
  }
  if (!r.ipc_export.empty()) std::printf(",\"ipc_export\":\"%s\"", r.ipc_export.c_str());
  if (r.ipc_capable >= 0) {
    std::printf(",\"ipc_capable\":%s", r.ipc_capable != 0 ? "true" : "false");
  }
  if (r.ipc_seen >= 0) std::printf(",\"ipc_seen\":\"%02x\"", r.ipc_seen);
  if (r.ipc_read >= 0) std::printf(",\"ipc_read\":\"%02x\"", r.ipc_read);
  if (r.ipc_seen_last >= 0) std::printf(",\"ipc_seen_last\":\"%02x\"", r.ipc_seen_last);
  if (r.ipc_read_last >= 0) std::printf(",\"ipc_read_last\":\"%02x\"", r.ipc_read_last);
  if (r.also_device >= 0) {
    std::printf(",\"also\":{\"device\":%d,\"uuid\":\"%s\",\"mem_total\":%zu,\"kernels\":%ld",
                r.also_device, r.also_uuid.c_str(), r.also_mem_total, r.also_kernels);
    if (!r.also_try.empty()) std::printf(",\"try\":\"%s\"", r.also_try.c_str());
    std::printf("}");
  }
  if (!error.empty()) std::printf(",\"error\":\"%s\"", error.c_str());
  std::printf(",\"result\":\"%s\"}\n", result);
  std::fflush(stdout);
}

[[noreturn]] void fail_cuda(CUresult rc, const char* call) {
  print_report("error", result_name(rc) + ": " + call);
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
      "  --graph-kernels N     capture N kernels into a CUDA graph once; an iteration replays it\n"
      "                        M/N times (M must be a multiple of N) instead of launching kernels\n"
      "  --warmup-kernels W    before the timed loop, queue W kernels of --warmup-us each and\n"
      "                        synchronize once (default 0)\n"
      "  --warmup-us U         duration of each warm-up kernel (default 100)\n"
      "  --sleep-us S          host sleep after each iteration (default 0)\n"
      "  --blocks B            grid size of each launch (default 1)\n"
      "  --threads T           block size of each launch (default 32)\n"
      "  --report-meminfo      include cuMemGetInfo free/total after allocating\n"
      "  --exit-without-cleanup  exit holding the memory, context and module, as crashing or\n"
      "                        careless programs do (the driver must release them)\n"
      "  --first-kernel-timestamp  report start_s, first_launch_call_s, first_kernel_s\n"
      "                        (CLOCK_MONOTONIC seconds)\n"
      "  --progress            one JSON line per iteration on stderr with monotonic timestamps\n"
      "  --meminfo-every-ms N  sample cuMemGetInfo every N ms; report the changes\n"
      "  --alloc-after-ms T    T ms into the loop, try allocating --alloc-bytes and report it\n"
      "  --alloc-bytes Q       size of that allocation, a quantity\n"
      "  --probe-free          after allocating, try free+1, then free, then 1 more byte\n"
      "                        (refused when more than 16Gi is free: use it under a limit)\n"
      "  --spare-bytes Q       a second allocation of Q bytes, never exported\n"
      "  --ipc-export FILE     fill the buffer with 0x5a and write its IPC handle to FILE\n"
      "  --ipc-wait FILE       after the loop, wait for FILE and report the buffer's first byte\n"
      "  --ipc-import FILE     open the IPC handle in FILE, report and overwrite its first bytes\n"
      "  --ipc-done FILE       create FILE once the imported memory is closed\n"
      "  --ipc-bytes Q         the opened (or exported) memory's size: its last 4 KiB too\n"
      "  --also-device N       also drive device N: allocate --also-bytes Q there and launch "
      "every\n"
      "                        iteration's kernels on both devices\n"
      "  --also-try-bytes Q    then try to allocate Q more on device N (result in the report)\n"
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
    } else if (arg == "--first-kernel-timestamp") {
      options->first_kernel_timestamp = true;
    } else if (arg == "--progress") {
      options->progress = true;
    } else if (arg == "--probe-free") {
      options->probe_free = true;
    } else if ((arg == "--bytes" || arg == "--alloc-bytes" || arg == "--spare-bytes" ||
                arg == "--also-bytes" || arg == "--also-try-bytes" || arg == "--ipc-bytes") &&
               value(&v)) {
      auto parsed = nvshare::parse_memory_quantity(v);
      if (!parsed.ok()) {
        std::fprintf(stderr, "nvshare-trainer: %s: %s\n", argv[i - 1],
                     parsed.error().message.c_str());
        return false;
      }
      (arg == "--bytes"         ? options->bytes
       : arg == "--alloc-bytes" ? options->alloc_bytes
       : arg == "--spare-bytes" ? options->spare_bytes
       : arg == "--also-bytes"  ? options->also_bytes
       : arg == "--ipc-bytes"   ? options->ipc_bytes
                                : options->also_try_bytes) = parsed.value();
    } else if (arg == "--meminfo-every-ms" && value(&v) && parse_long(v, 1, &number)) {
      options->meminfo_every_ms = number;
    } else if (arg == "--alloc-after-ms" && value(&v) && parse_long(v, 0, &number)) {
      options->alloc_after_ms = number;
    } else if (arg == "--also-device" && value(&v) && parse_long(v, 0, &number)) {
      options->also_device = static_cast<int>(number);
    } else if (arg == "--device" && value(&v) && parse_long(v, 0, &number)) {
      options->device = static_cast<int>(number);
    } else if (arg == "--kernels" && value(&v) && parse_long(v, 0, &number)) {
      options->kernels = number;
    } else if (arg == "--kernel-us" && value(&v) && parse_long(v, 0, &number)) {
      options->kernel_us = number;
    } else if (arg == "--graph-kernels" && value(&v) && parse_long(v, 1, &number)) {
      options->graph_kernels = number;
    } else if (arg == "--warmup-kernels" && value(&v) && parse_long(v, 0, &number)) {
      options->warmup_kernels = number;
    } else if (arg == "--warmup-us" && value(&v) && parse_long(v, 0, &number)) {
      options->warmup_us = number;
    } else if (arg == "--kernels-per-iter" && value(&v) && parse_long(v, 1, &number)) {
      options->kernels_per_iter = number;
    } else if (arg == "--sleep-us" && value(&v) && parse_long(v, 0, &number)) {
      options->sleep_us = number;
    } else if (arg == "--blocks" && value(&v) && parse_long(v, 1, &number)) {
      options->blocks = static_cast<unsigned>(number);
    } else if (arg == "--threads" && value(&v) && parse_long(v, 1, &number)) {
      options->threads = static_cast<unsigned>(number);
    } else if (arg == "--ipc-export" && value(&v)) {
      options->ipc_export = v;
    } else if (arg == "--ipc-wait" && value(&v)) {
      options->ipc_wait = v;
    } else if (arg == "--ipc-import" && value(&v)) {
      options->ipc_import = v;
    } else if (arg == "--ipc-done" && value(&v)) {
      options->ipc_done = v;
    } else {
      std::fprintf(stderr, "nvshare-trainer: bad or incomplete option %s\n", argv[i]);
      return false;
    }
  }
  if (options->graph_kernels > 0 && options->kernels_per_iter % options->graph_kernels != 0) {
    std::fprintf(stderr,
                 "nvshare-trainer: --kernels-per-iter must be a multiple of --graph-kernels\n");
    return false;
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

// Samples cuMemGetInfo every `period` on its own thread (with the context current there, as any
// application thread would have it) and keeps the samples whose values changed.
class MeminfoSampler {
 public:
  void start(CUcontext ctx, std::chrono::milliseconds period) {
    g_report.have_meminfo_changes = true;
    thread_ = std::thread([this, ctx, period] { run(ctx, period); });
  }
  void stop() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    thread_.join();
  }

 private:
  void run(CUcontext ctx, std::chrono::milliseconds period) {
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return;
    MeminfoSample last{0, static_cast<std::size_t>(-1), static_cast<std::size_t>(-1)};
    auto next = std::chrono::steady_clock::now();
    while (!stop_.load()) {
      MeminfoSample sample;
      if (cuMemGetInfo(&sample.free, &sample.total) == CUDA_SUCCESS) {
        sample.t = monotonic_s();
        {
          std::lock_guard<std::mutex> lock(g_meminfo_mutex);
          ++g_report.meminfo_samples;
          g_report.meminfo_max_total = std::max(g_report.meminfo_max_total, sample.total);
        }
        if (sample.free != last.free || sample.total != last.total) {
          std::fprintf(stderr, "{\"meminfo\":{\"t\":%.6f,\"free\":%zu,\"total\":%zu}}\n", sample.t,
                       sample.free, sample.total);
          std::lock_guard<std::mutex> lock(g_meminfo_mutex);
          g_report.meminfo_changes.push_back(sample);
          last = sample;
        }
      }
      // Fixed-rate schedule: a slow cuMemGetInfo does not stretch the sampling period.
      next += period;
      std::this_thread::sleep_until(next);
    }
  }

  std::thread thread_;
  std::atomic<bool> stop_{false};
};

// Tries to allocate `bytes` (freeing it again on success) and returns the result's name.
std::string try_alloc(std::size_t bytes) {
  CUdeviceptr ptr = 0;
  CUresult rc = cuMemAlloc(&ptr, bytes);
  if (rc == CUDA_SUCCESS) CU_CHECK(cuMemFree, (ptr));
  return result_name(rc);
}

// The exactness check of a memory limit: everything cuMemGetInfo calls free can be allocated, and
// not one byte more.
void probe_free(Report* report) {
  CU_CHECK(cuMemGetInfo, (&report->probe_free, &report->probe_total));
  // It allocates all that is free, which under nvshare becomes managed memory: on a real GPU
  // without a limit that would oversubscribe it. Meant for runs under a memory limit.
  constexpr std::size_t kMaxProbe = std::size_t{16} << 30;
  if (report->probe_free > kMaxProbe) {
    print_report("error", "--probe-free: " + std::to_string(report->probe_free) +
                              " bytes free is over 16Gi; run it under a memory limit");
    std::exit(1);
  }
  report->probe_over_by_one = try_alloc(report->probe_free + 1);
  CUdeviceptr exact = 0;
  CUresult rc = cuMemAlloc(&exact, report->probe_free);
  report->probe_exact = result_name(rc);
  std::size_t total_after = 0;
  CU_CHECK(cuMemGetInfo, (&report->probe_free_after, &total_after));
  report->probe_one_more = try_alloc(1);
  if (rc == CUDA_SUCCESS) CU_CHECK(cuMemFree, (exact));
  report->have_probe = true;
}

}  // namespace

// Waits up to 60 s for `path` to exist; its contents (empty when it never appeared).
std::string wait_for_file(const std::string& path) {
  for (int i = 0; i < 6000; ++i) {
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      std::string text;
      char chunk[256];
      for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) text.append(chunk, n);
      std::fclose(f);
      return text;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return {};
}

// Writes `text` to `path` at once (a reader never sees half of it).
void publish_file(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  FILE* f = std::fopen(temporary.c_str(), "w");
  if (f == nullptr) return;
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  std::rename(temporary.c_str(), path.c_str());
}

void export_buffer(const Options& options, CUdeviceptr buffer, CUstream stream) {
  CU_CHECK(cuMemsetD8Async, (buffer, 0x5a, options.bytes, stream));
  CU_CHECK(cuStreamSynchronize, (stream));
  unsigned int capable = 0;
  CU_CHECK(cuPointerGetAttribute,
           (&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, buffer));
  g_report.ipc_capable = capable != 0 ? 1 : 0;
  CUipcMemHandle handle{};
  const CUresult rc = cuIpcGetMemHandle(&handle, buffer);
  g_report.ipc_export = result_name(rc);
  if (rc != CUDA_SUCCESS) return;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char byte : handle.reserved) {
    hex += kHex[byte >> 4];
    hex += kHex[byte & 15];
  }
  publish_file(options.ipc_export, hex);
}

void import_buffer(const Options& options) {
  const std::string hex = wait_for_file(options.ipc_import);
  CUipcMemHandle handle{};
  if (hex.size() < 2 * sizeof handle.reserved) fail_cuda(CUDA_ERROR_INVALID_VALUE, "ipc handle");
  for (std::size_t i = 0; i < sizeof handle.reserved; ++i) {
    handle.reserved[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  CUdeviceptr shared = 0;
  CU_CHECK(cuIpcOpenMemHandle, (&shared, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  constexpr std::size_t kTouched = 4096;
  std::vector<unsigned char> bytes(kTouched);
  CU_CHECK(cuMemcpyDtoH, (bytes.data(), shared, kTouched));
  g_report.ipc_read = bytes[0];
  CU_CHECK(cuMemsetD8, (shared, 0xa5, kTouched));
  if (options.ipc_bytes >= kTouched) {
    const CUdeviceptr last = shared + options.ipc_bytes - kTouched;
    CU_CHECK(cuMemcpyDtoH, (bytes.data(), last, kTouched));
    g_report.ipc_read_last = bytes[kTouched - 1];
    CU_CHECK(cuMemsetD8, (last, 0xa5, kTouched));
  }
  CU_CHECK(cuCtxSynchronize, ());
  CU_CHECK(cuIpcCloseMemHandle, (shared));
  if (!options.ipc_done.empty()) publish_file(options.ipc_done, "done");
}

// --also-device: the second GPU of a process that drives two.
struct SecondDevice {
  CUdevice device = 0;
  CUcontext ctx = nullptr;
  CUmodule module = nullptr;
  CUfunction spin = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr buffer = 0;
};

// Retains the device's primary context and sets it up as main() does its own; `home` is current
// again afterwards.
SecondDevice open_second(const Options& options, CUcontext home) {
  SecondDevice second;
  CU_CHECK(cuDeviceGet, (&second.device, options.also_device));
  CUuuid uuid{};
  CU_CHECK(cuDeviceGetUuid, (&uuid, second.device));
  g_report.also_device = options.also_device;
  g_report.also_uuid = format_uuid(uuid);
  CU_CHECK(cuDevicePrimaryCtxRetain, (&second.ctx, second.device));
  CU_CHECK(cuCtxSetCurrent, (second.ctx));
  CU_CHECK(cuModuleLoadData, (&second.module, kSpinPtx));
  CU_CHECK(cuModuleGetFunction, (&second.spin, second.module, "nvshare_spin"));
  CU_CHECK(cuStreamCreate, (&second.stream, CU_STREAM_DEFAULT));
  if (options.also_bytes > 0) {
    CU_CHECK(cuMemAlloc, (&second.buffer, options.also_bytes));
    CU_CHECK(cuMemsetD8Async, (second.buffer, 0, options.also_bytes, second.stream));
    CU_CHECK(cuStreamSynchronize, (second.stream));
  }
  std::size_t free = 0;
  CU_CHECK(cuMemGetInfo, (&free, &g_report.also_mem_total));
  if (options.also_try_bytes > 0) g_report.also_try = try_alloc(options.also_try_bytes);
  CU_CHECK(cuCtxSetCurrent, (home));
  return second;
}

void close_second(SecondDevice& second, CUcontext home) {
  CU_CHECK(cuCtxSetCurrent, (second.ctx));
  if (second.buffer != 0) CU_CHECK(cuMemFree, (second.buffer));
  CU_CHECK(cuStreamDestroy, (second.stream));
  CU_CHECK(cuModuleUnload, (second.module));
  CU_CHECK(cuCtxSetCurrent, (home));
  CU_CHECK(cuDevicePrimaryCtxRelease, (second.device));
}

int main(int argc, char** argv) {
  const double start_s = monotonic_s();
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
  report.start_s = start_s;

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
  MeminfoSampler sampler;
  if (options.meminfo_every_ms > 0) {
    sampler.start(ctx, std::chrono::milliseconds(options.meminfo_every_ms));
  }

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
    unsigned int managed = 0;
    CU_CHECK(cuPointerGetAttribute, (&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, buffer));
    report.buffer_managed = managed != 0 ? 1 : 0;
  }
  CUdeviceptr spare = 0;
  if (options.spare_bytes > 0) {
    CU_CHECK(cuMemAlloc, (&spare, options.spare_bytes));
    CU_CHECK(cuMemsetD8Async, (spare, 0, options.spare_bytes, stream));
    CU_CHECK(cuStreamSynchronize, (stream));
  }
  if (!options.ipc_export.empty() && buffer != 0) export_buffer(options, buffer, stream);
  if (!options.ipc_import.empty()) import_buffer(options);
  if (options.report_meminfo) {
    CU_CHECK(cuMemGetInfo, (&report.mem_free, &report.mem_total));
    report.have_meminfo = true;
  }
  if (options.probe_free) probe_free(&report);
  SecondDevice second;
  if (options.also_device >= 0) second = open_second(options, ctx);

  CUevent begin = nullptr;
  CUevent end = nullptr;
  CU_CHECK(cuEventCreate, (&begin, CU_EVENT_DEFAULT));
  CU_CHECK(cuEventCreate, (&end, CU_EVENT_DEFAULT));
  std::uint64_t spin_ns = static_cast<std::uint64_t>(options.kernel_us) * 1000;
  void* params[] = {&spin_ns};

  auto late_alloc = [&] {
    report.late_alloc_t = monotonic_s();
    report.late_alloc_bytes = options.alloc_bytes;
    report.late_alloc_result = try_alloc(options.alloc_bytes);
    report.have_late_alloc = true;
  };

  // Warm-up: short kernels queued back to back (they teach a sharing layer a per-launch time).
  std::uint64_t warmup_ns = static_cast<std::uint64_t>(options.warmup_us) * 1000;
  void* warmup_params[] = {&warmup_ns};
  for (long k = 0; k < options.warmup_kernels; ++k) {
    CU_CHECK(cuLaunchKernel, (spin, options.blocks, 1, 1, options.threads, 1, 1, 0, stream,
                              warmup_params, nullptr));
  }
  if (options.warmup_kernels > 0) CU_CHECK(cuStreamSynchronize, (stream));
  // --graph-kernels: one graph of N kernels, captured once; launches become its replays.
  CUgraph graph = nullptr;
  CUgraphExec graph_exec = nullptr;
  if (options.graph_kernels > 0) {
    CU_CHECK(cuStreamBeginCapture, (stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (long k = 0; k < options.graph_kernels; ++k) {
      CU_CHECK(cuLaunchKernel,
               (spin, options.blocks, 1, 1, options.threads, 1, 1, 0, stream, params, nullptr));
    }
    CU_CHECK(cuStreamEndCapture, (stream, &graph));
    CU_CHECK(cuGraphInstantiateWithFlags, (&graph_exec, graph, 0));
  }
  const long launches_per_iter = options.graph_kernels > 0
                                     ? options.kernels_per_iter / options.graph_kernels
                                     : options.kernels_per_iter;

  const auto wall_start = std::chrono::steady_clock::now();
  double gpu_ms = 0;
  for (long iteration = 0; iteration < options.kernels; ++iteration) {
    if (options.alloc_after_ms >= 0 && !report.have_late_alloc &&
        std::chrono::steady_clock::now() - wall_start >=
            std::chrono::milliseconds(options.alloc_after_ms)) {
      late_alloc();
    }
    CU_CHECK(cuEventRecord, (begin, stream));
    double launch_s = 0;
    for (long k = 0; k < launches_per_iter; ++k) {
      const double call_s = monotonic_s();
      if (graph_exec != nullptr) {
        CU_CHECK(cuGraphLaunch, (graph_exec, stream));
      } else {
        CU_CHECK(cuLaunchKernel,
                 (spin, options.blocks, 1, 1, options.threads, 1, 1, 0, stream, params, nullptr));
      }
      if (k == 0) launch_s = monotonic_s();
      if (iteration == 0 && k == 0) {
        report.first_launch_call_s = call_s;
        report.first_kernel_s = launch_s;
        report.have_timestamps = options.first_kernel_timestamp;
      }
    }
    CU_CHECK(cuEventRecord, (end, stream));
    if (second.ctx != nullptr) {
      CU_CHECK(cuCtxSetCurrent, (second.ctx));
      for (long k = 0; k < launches_per_iter; ++k) {
        CU_CHECK(cuLaunchKernel, (second.spin, options.blocks, 1, 1, options.threads, 1, 1, 0,
                                  second.stream, params, nullptr));
      }
      CU_CHECK(cuStreamSynchronize, (second.stream));
      report.also_kernels += launches_per_iter;
      CU_CHECK(cuCtxSetCurrent, (ctx));
    }
    CU_CHECK(cuEventSynchronize, (end));
    float ms = 0;
    CU_CHECK(cuEventElapsedTime, (&ms, begin, end));
    gpu_ms += ms;
    report.iterations = iteration + 1;
    if (options.progress) {
      std::fprintf(stderr, "{\"progress\":%ld,\"launch_s\":%.6f,\"done_s\":%.6f,\"gpu_ms\":%.3f}\n",
                   iteration, launch_s, monotonic_s(), static_cast<double>(ms));
    }
    if (options.sleep_us > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(options.sleep_us));
  }
  report.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  report.gpu_s = gpu_ms / 1000.0;
  // A run shorter than --alloc-after-ms still answers the question it was asked.
  if (options.alloc_after_ms >= 0 && !report.have_late_alloc) late_alloc();
  sampler.stop();
  if (!options.ipc_wait.empty() && buffer != 0) {
    wait_for_file(options.ipc_wait);
    unsigned char first = 0;
    CU_CHECK(cuMemcpyDtoH, (&first, buffer, 1));
    report.ipc_seen = first;
    if (options.ipc_bytes > 0 && options.ipc_bytes <= options.bytes) {
      CU_CHECK(cuMemcpyDtoH, (&first, buffer + options.ipc_bytes - 1, 1));
      report.ipc_seen_last = first;
    }
  }
  if (options.exit_without_cleanup) {
    print_report("ok", "");
    return 0;
  }

  if (second.ctx != nullptr) close_second(second, ctx);
  if (graph_exec != nullptr) CU_CHECK(cuGraphExecDestroy, (graph_exec));
  if (graph != nullptr) CU_CHECK(cuGraphDestroy, (graph));
  CU_CHECK(cuEventDestroy, (begin));
  CU_CHECK(cuEventDestroy, (end));
  if (buffer != 0) CU_CHECK(cuMemFree, (buffer));
  if (spare != 0) CU_CHECK(cuMemFree, (spare));
  CU_CHECK(cuStreamDestroy, (stream));
  CU_CHECK(cuModuleUnload, (module));
  CU_CHECK(cuDevicePrimaryCtxRelease, (device));
  print_report("ok", "");
  return 0;
}
