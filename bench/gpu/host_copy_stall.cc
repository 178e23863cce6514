// How making a host copy stalls the process's own GPU submissions (bench/gpu/bench.py, scenario
// copystall; no library involved: it measures the driver). One thread keeps the GPU busy with
// memsets in batches of about 2 ms (synchronized each batch, mapping and unmapping 1 MiB each time
// as an interpreter's allocator does); another makes host copies phase by phase: fault fresh pages
// in, register them in one call, in 256 and 64 MiB chunks, in 64 MiB chunks with pauses between,
// and cuMemHostAlloc. Prints one JSON object per phase: its time, the batches that overlapped it
// (an unhindered thread does about one per 2 ms) and the longest of them.
//
//   nvshare-host-copy-stall [GiB]   (default 3)
#include <cuda.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
double secs(Clock::time_point t, Clock::time_point t0) {
  return std::chrono::duration<double>(t - t0).count();
}
struct Batch {
  double start, end;
};
std::mutex mu;
std::vector<Batch> batches;
std::atomic<bool> stop{false};
Clock::time_point t0;

void check(CUresult rc, const char* what) {
  if (rc != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s failed: %d\n", what, rc);
    std::exit(1);
  }
}

void fault_in(unsigned char* base, std::size_t bytes, int threads) {
  std::vector<std::thread> ws;
  std::size_t slice = (bytes / threads + 4095) / 4096 * 4096;
  for (int i = 0; i < threads; ++i) {
    unsigned char* from = base + i * slice;
    unsigned char* to = base + std::min(bytes, (i + 1) * slice);
    if (from >= to) break;
    ws.emplace_back([from, to] {
      for (volatile unsigned char* p = from; p < to; p += 4096) *p = 0;
    });
  }
  for (auto& w : ws) w.join();
}

void report(const char* phase, Clock::time_point a, Clock::time_point b) {
  // A batch the phase held back ends after it: wait for it to be recorded.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  double s = secs(a, t0), e = secs(b, t0);
  double longest = 0;
  int n = 0;
  {
    std::lock_guard l(mu);
    // A stall lands inside a batch: the mapping each batch makes is where the thread waits.
    for (const Batch& x : batches) {
      if (x.end > s && x.start < e) {
        longest = std::max(longest, x.end - x.start);
        ++n;
      }
    }
  }
  std::printf("{\"phase\": \"%s\", \"ms\": %.2f, \"batches\": %d, \"longest_batch_ms\": %.2f}\n",
              phase, (e - s) * 1e3, n, longest * 1e3);
  std::fflush(stdout);
}
}  // namespace

int main(int argc, char** argv) {
  const std::size_t gib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 3;
  const std::size_t bytes = gib << 30;
  check(cuInit(0), "cuInit");
  CUdevice dev;
  check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  CUcontext ctx;
  check(cuDevicePrimaryCtxRetain(&ctx, dev), "retain");
  check(cuCtxSetCurrent(ctx), "set");
  CUdeviceptr buf;
  const std::size_t work = 2ull << 30;
  check(cuMemAlloc(&buf, work), "alloc");
  batches.reserve(1 << 20);  // no reallocation while measuring
  t0 = Clock::now();
  std::thread worker([&] {
    cuCtxSetCurrent(ctx);
    CUstream s;
    cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    while (!stop) {
      auto a = Clock::now();
      // An interpreter's allocator maps and unmaps memory all the time.
      void* scratch =
          mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      static_cast<char*>(scratch)[0] = 1;
      munmap(scratch, 1 << 20);
      for (int i = 0; i < 4; ++i) cuMemsetD32Async(buf, i, work / 4, s);
      cuStreamSynchronize(s);
      auto b = Clock::now();
      std::lock_guard l(mu);
      batches.push_back({secs(a, t0), secs(b, t0)});
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
  const auto quiet_from = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  report("nothing", quiet_from, Clock::now());
  for (int round = 0; round < 2; ++round) {
    // mmap + fault in (8 threads), then register in one call, in the app's context.
    auto a = Clock::now();
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(m, bytes, MADV_HUGEPAGE);
    fault_in(static_cast<unsigned char*>(m), bytes, 8);
    auto b = Clock::now();
    report("fault in, 8 threads", a, b);
    pause();
    a = Clock::now();
    check(cuMemHostRegister(m, bytes, CU_MEMHOSTREGISTER_PORTABLE), "register");
    b = Clock::now();
    report("register whole", a, b);
    pause();
    a = Clock::now();
    cuMemHostUnregister(m);
    b = Clock::now();
    report("unregister whole", a, b);
    pause();
    for (std::size_t chunk : {256ull << 20, 64ull << 20}) {
      a = Clock::now();
      for (std::size_t off = 0; off < bytes; off += chunk)
        check(cuMemHostRegister(static_cast<char*>(m) + off, chunk, CU_MEMHOSTREGISTER_PORTABLE),
              "register chunk");
      b = Clock::now();
      report(("register in " + std::to_string(chunk >> 20) + " MiB chunks").c_str(), a, b);
      pause();
      a = Clock::now();
      for (std::size_t off = 0; off < bytes; off += chunk)
        cuMemHostUnregister(static_cast<char*>(m) + off);
      b = Clock::now();
      report(("unregister " + std::to_string(chunk >> 20) + " MiB chunks").c_str(), a, b);
      pause();
    }
    for (int gap_us : {500, 2000}) {
      a = Clock::now();
      for (std::size_t off = 0; off < bytes; off += 64ull << 20) {
        check(cuMemHostRegister(static_cast<char*>(m) + off, 64ull << 20,
                                CU_MEMHOSTREGISTER_PORTABLE),
              "register paced");
        std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
      }
      b = Clock::now();
      report(("register in 64 MiB chunks, " + std::to_string(gap_us) + " us apart").c_str(), a, b);
      pause();
      for (std::size_t off = 0; off < bytes; off += 64ull << 20)
        cuMemHostUnregister(static_cast<char*>(m) + off);
      pause();
    }
    munmap(m, bytes);
    a = Clock::now();
    void* h = nullptr;
    check(cuMemHostAlloc(&h, bytes, CU_MEMHOSTALLOC_PORTABLE), "hostalloc");
    b = Clock::now();
    report("cuMemHostAlloc", a, b);
    pause();
    cuMemFreeHost(h);
    pause();
  }
  stop = true;
  worker.join();

  return 0;
}
