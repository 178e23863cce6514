// nvshare-launch-bench: the cost of a kernel launch, the call the library's gate sits on.
//
// Launches an (almost) empty kernel many times through the CUDA driver API and prints one JSON
// object: {"launches":N,"async_ns_per_launch":..,"sync_ns_per_launch":..,"result":"ok"}.
//   async: N launches back to back on one stream, then one synchronize; the time per launch is
//          what a launch-bound program (many tiny kernels) pays.
//   sync:  launch then synchronize, N/10 times: the round trip of one launch.
//   call:  bursts of kBurst launches, each burst's calls timed, then a synchronize (not timed): the
//          CPU time of one launch call while the GPU keeps up, without the synchronizes.
//   marked: as async, with an event recorded every kMarkEvery launches and the previous one
//          queried, as the library's drain-bound markers do: beside async in the same process it
//          shows what such markers cost (native runs have no library to add them).
//   inproc: async loops alternating between the cuLaunchKernel the program links (under
//          libnvshare.so: the library's, gate and tracker included) and the driver's own function
//          looked up on libcuda with glibc's dlsym (the library's dlsym answers a hooked name with
//          its wrapper), order swapped each pair; each pair's ratio linked / driver. Both loops run
//          in the same process on the same CPU and context, so what differs from one process to the
//          next cancels out; natively both are the driver's function and the ratio is the method's
//          own noise.
//   atomic: the driver's function with an atomic read-modify-write just before and just after each
//          launch against the bare function, interleaved the same way: the least a gate costs.
//   interleaved: the same two functions in blocks of kBlock launches, alternating ABBA within one
//          loop; per repetition the ratio of the two sums of block times, so that slower drifts
//          (seen to move single loops by 10%) cancel.
// It also reports the cost of single driver calls the library makes: cuCtxGetCurrent (every gated
// call), cuEventRecord after a launch (each marker) and cuEventQuery, for the library's marker
// events and for events with blocking synchronization.
// Each is repeated --repeats times and the best (least disturbed) repetition reported, with all of
// them listed. Under libnvshare.so with a scheduler, every launch passes the grant gate (the
// process holds the grant throughout), so the difference from a native run is the gate's cost.
//
// Like nvshare-trainer it is written against the driver API only (PTX kernel; the simulated driver
// runs it too) and links no CUDA runtime.
#include <cuda.h>
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kBurst = 64;        // launches per timed burst of the call measure
constexpr long kMarkEvery = 256;  // launches per event in the marked loop
constexpr long kBlock = 1000;     // launches per block of the interleaved measure
// The library's drain-bound markers: no timing, no blocking synchronization (it polls them).
constexpr unsigned kMarkerFlags = CU_EVENT_DISABLE_TIMING;
constexpr unsigned kBlockingFlags = CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC;

constexpr const char kEmptyPtx[] = R"(
.version 7.8
.target sm_80
.address_size 64

.visible .entry nvshare_spin(
    .param .u64 nvshare_spin_param_0
)
{
    ret;
}
)";

double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

[[noreturn]] void fail(CUresult result, const char* call) {
  const char* name = nullptr;
  cuGetErrorName(result, &name);
  std::printf("{\"result\":\"error\",\"error\":\"%s: %s\"}\n", name ? name : "?", call);
  std::exit(1);
}

#define CHECK(call)                                                \
  do {                                                             \
    if (CUresult r_ = (call); r_ != CUDA_SUCCESS) fail(r_, #call); \
  } while (0)

std::string join(const std::vector<double>& values, int decimals = 1) {
  std::string out;
  char buf[32];
  for (double v : values) {
    if (!out.empty()) out += ',';
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    out += buf;
  }
  return out;
}

// Mean time of cuEventRecord(event with `flags`) on `stream`, each after one launch (not timed),
// the GPU kept up with by a synchronize every kBurst records.
template <typename Launch>
double event_record_ns(Launch& launch, CUstream stream, unsigned flags) {
  CUevent event;
  CHECK(cuEventCreate(&event, flags));
  constexpr int kRecords = 20000;
  double in_calls = 0;
  for (int i = 0; i < kRecords; ++i) {
    launch();
    const double t0 = now_s();
    CHECK(cuEventRecord(event, stream));
    in_calls += now_s() - t0;
    if (i % kBurst == kBurst - 1) CHECK(cuStreamSynchronize(stream));
  }
  CHECK(cuStreamSynchronize(stream));
  CHECK(cuEventDestroy(event));
  return in_calls * 1e9 / kRecords;
}

// Mean time of cuEventQuery on a completed event made with `flags`.
double event_query_ns(CUstream stream, unsigned flags) {
  CUevent event;
  CHECK(cuEventCreate(&event, flags));
  CHECK(cuEventRecord(event, stream));
  CHECK(cuStreamSynchronize(stream));
  constexpr int kQueries = 200000;
  const double t0 = now_s();
  for (int i = 0; i < kQueries; ++i) CHECK(cuEventQuery(event));
  const double ns = (now_s() - t0) * 1e9 / kQueries;
  CHECK(cuEventDestroy(event));
  return ns;
}

// Per repetition, the ratio of `a`'s summed block times to `b`'s: blocks of kBlock calls
// alternating ABBA within one loop, each block's calls timed (the GPU keeps up), synchronized after
// each repetition. Whatever drifts more slowly than a block (a few milliseconds) weighs on both.
template <typename A, typename B>
std::vector<double> interleaved(int repeats, long launches, CUstream stream, A&& a, B&& b) {
  std::vector<double> ratios;
  const long blocks = std::max(2L, launches / kBlock);
  for (int r = 0; r < repeats; ++r) {
    double a_s = 0;
    double b_s = 0;
    for (long k = 0; k < 2 * blocks; ++k) {
      const bool first = k % 4 == 0 || k % 4 == 3;
      const double t0 = now_s();
      for (long i = 0; i < kBlock; ++i) first ? a() : b();
      (first ? a_s : b_s) += now_s() - t0;
    }
    CHECK(cuStreamSynchronize(stream));
    ratios.push_back(a_s / b_s);
  }
  return ratios;
}

using LaunchFn = decltype(&cuLaunchKernel);
using DlsymFn = void* (*)(void*, const char*);

// The driver's own cuLaunchKernel: glibc's dlsym found by version (dlvsym skips an unversioned
// dlsym such as a preloaded library's), asked on libcuda's handle.
LaunchFn driver_launch() {
  DlsymFn real_dlsym = nullptr;
  for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"}) {
    real_dlsym = reinterpret_cast<DlsymFn>(dlvsym(RTLD_DEFAULT, "dlsym", version));
    if (real_dlsym != nullptr) break;
  }
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (real_dlsym == nullptr || cuda == nullptr) return nullptr;
  return reinterpret_cast<LaunchFn>(real_dlsym(cuda, "cuLaunchKernel"));
}

}  // namespace

int main(int argc, char** argv) {
  long launches = 200000;
  int repeats = 5;
  int device_index = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--launches") == 0)
      launches = std::atol(argv[i + 1]);
    else if (std::strcmp(argv[i], "--repeats") == 0)
      repeats = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--device") == 0)
      device_index = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--launches N] [--repeats R] [--device I]\n", argv[0]);
      return 2;
    }
  }
  if (launches < 10 || repeats < 1) {
    std::fprintf(stderr, "--launches must be at least 10 and --repeats at least 1\n");
    return 2;
  }
  CHECK(cuInit(0));
  CUdevice device;
  CHECK(cuDeviceGet(&device, device_index));
  CUcontext context;
  CHECK(cuDevicePrimaryCtxRetain(&context, device));
  CHECK(cuCtxSetCurrent(context));
  CUmodule module;
  CHECK(cuModuleLoadData(&module, kEmptyPtx));
  CUfunction kernel;
  CHECK(cuModuleGetFunction(&kernel, module, "nvshare_spin"));
  CUstream stream;
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  unsigned long long zero = 0;
  void* params[] = {&zero};

  auto launch = [&] {
    CHECK(cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr));
  };
  for (int i = 0; i < 1000; ++i) launch();  // warm up
  CHECK(cuStreamSynchronize(stream));

  // The marked loop records an event like the library's drain-bound markers every kMarkEvery
  // launches and queries the one before, so the same process shows what markers cost.
  CUevent marks[2];
  for (CUevent& mark : marks) {
    CHECK(cuEventCreate(&mark, kMarkerFlags));
    CHECK(cuEventRecord(mark, stream));
  }
  std::vector<double> async_ns, marked_ns, sync_ns, call_ns;
  for (int r = 0; r < repeats; ++r) {
    double t0 = now_s();
    for (long i = 0; i < launches; ++i) launch();
    CHECK(cuStreamSynchronize(stream));
    async_ns.push_back((now_s() - t0) * 1e9 / static_cast<double>(launches));
    t0 = now_s();
    for (long i = 0; i < launches; ++i) {
      launch();
      if (i % kMarkEvery == kMarkEvery - 1) {
        const long k = i / kMarkEvery;
        cuEventQuery(marks[(k + 1) % 2]);  // NOT_READY or SUCCESS: either is fine
        CHECK(cuEventRecord(marks[k % 2], stream));
      }
    }
    CHECK(cuStreamSynchronize(stream));
    marked_ns.push_back((now_s() - t0) * 1e9 / static_cast<double>(launches));
    const long round_trips = launches / 10;
    t0 = now_s();
    for (long i = 0; i < round_trips; ++i) {
      launch();
      CHECK(cuStreamSynchronize(stream));
    }
    sync_ns.push_back((now_s() - t0) * 1e9 / static_cast<double>(round_trips));
    double in_calls = 0;
    const long bursts = launches / kBurst;
    for (long b = 0; b < bursts; ++b) {
      t0 = now_s();
      for (int i = 0; i < kBurst; ++i) launch();
      in_calls += now_s() - t0;
      CHECK(cuStreamSynchronize(stream));
    }
    call_ns.push_back(in_calls * 1e9 / static_cast<double>(bursts * kBurst));
  }
  // In-process pairs: the linked cuLaunchKernel against the driver's own, alternating.
  std::vector<double> inproc_ratios;
  const LaunchFn direct = driver_launch();
  if (direct != nullptr) {
    auto timed_loop = [&](LaunchFn fn) {
      const double t0 = now_s();
      for (long i = 0; i < launches; ++i)
        CHECK(fn(kernel, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr));
      CHECK(cuStreamSynchronize(stream));
      return (now_s() - t0) * 1e9 / static_cast<double>(launches);
    };
    for (int p = 0; p < 2 * repeats; ++p) {
      double linked_ns = 0;
      double direct_ns = 0;
      if (p % 2 == 0) {
        linked_ns = timed_loop(&cuLaunchKernel);
        direct_ns = timed_loop(direct);
      } else {
        direct_ns = timed_loop(direct);
        linked_ns = timed_loop(&cuLaunchKernel);
      }
      inproc_ratios.push_back(linked_ns / direct_ns);
    }
  }
  // Interleaved: the library's launch path against the driver's. Atomics: the driver's launch with
  // an atomic read-modify-write on a word of this process just before and just after it (what a
  // gate costs at the least: a locked instruction waits for the stores before it, the driver's
  // among them), against the bare launch.
  std::vector<double> interleaved_ratios;
  std::vector<double> atomic_ratios;
  if (direct != nullptr) {
    const auto with_direct = [&] {
      CHECK(direct(kernel, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr));
    };
    interleaved_ratios = interleaved(
        repeats, launches, stream,
        [&] { CHECK(cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr)); },
        with_direct);
    static std::atomic<std::uint64_t> word{0};
    atomic_ratios = interleaved(
        repeats, launches, stream,
        [&] {
          word.fetch_add(2, std::memory_order_acq_rel);
          with_direct();
          word.fetch_sub(2, std::memory_order_acq_rel);
        },
        with_direct);
  }
  const bool interposed = direct != nullptr && direct != &cuLaunchKernel;
  // The cost of one cuCtxGetCurrent, which the library's launch path makes on every launch to find
  // the calling thread's GPU (reported so the gate's share of a launch can be told apart).
  const long ctx_calls = 1000000;
  double t0 = now_s();
  for (long i = 0; i < ctx_calls; ++i) {
    CUcontext current = nullptr;
    CHECK(cuCtxGetCurrent(&current));
  }
  const double ctx_ns = (now_s() - t0) * 1e9 / static_cast<double>(ctx_calls);
  // What one drain-bound marker costs the library in driver calls: recording an event of the
  // kind it uses (no timing, no blocking synchronization) after a launch and querying a completed
  // one; and the same for an event with blocking synchronization, for comparison.
  const double record_ns = event_record_ns(launch, stream, kMarkerFlags);
  const double blocking_record_ns = event_record_ns(launch, stream, kBlockingFlags);
  const double query_ns = event_query_ns(stream, kMarkerFlags);
  const double blocking_query_ns = event_query_ns(stream, kBlockingFlags);
  std::printf(
      "{\"ctx_get_current_ns\":%.1f,\"event_record_ns\":%.1f,\"event_record_blocking_ns\":%.1f,"
      "\"event_query_ns\":%.1f,\"event_query_blocking_ns\":%.1f,"
      "\"launches\":%ld,\"repeats\":%d,\"async_ns_per_launch\":%.1f,"
      "\"sync_ns_per_launch\":%.1f,\"call_ns_per_launch\":%.1f,"
      "\"inproc_interposed\":%s,\"inproc_ratios\":[%s],\"interleaved_ratios\":[%s],\"atomic_"
      "ratios\":[%s],"
      "\"marked_ns_all\":[%s],\"async_ns_all\":[%s],\"sync_ns_all\":[%s],\"call_ns_all\":[%s],"
      "\"result\":\"ok\"}\n",
      ctx_ns, record_ns, blocking_record_ns, query_ns, blocking_query_ns, launches, repeats,
      *std::min_element(async_ns.begin(), async_ns.end()),
      *std::min_element(sync_ns.begin(), sync_ns.end()),
      *std::min_element(call_ns.begin(), call_ns.end()), interposed ? "true" : "false",
      join(inproc_ratios, 4).c_str(), join(interleaved_ratios, 4).c_str(),
      join(atomic_ratios, 4).c_str(), join(marked_ns).c_str(), join(async_ns).c_str(),
      join(sync_ns).c_str(), join(call_ns).c_str());
  for (CUevent mark : marks) CHECK(cuEventDestroy(mark));
  CHECK(cuStreamDestroy(stream));
  CHECK(cuModuleUnload(module));
  CHECK(cuDevicePrimaryCtxRelease(device));
  return 0;
}
