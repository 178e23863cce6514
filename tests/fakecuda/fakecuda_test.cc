// API semantics of the simulated driver, called directly (the test links libcuda.so.1 from
// tests/fakecuda). Cross-process behaviour is checked by spawning nvshare-trainer against the same
// state file; timing accuracy under sharing is timing_test.sh's job.
//
// The whole binary shares one configuration (set before the first cuInit by the global environment
// below): two devices, 1 GiB and 512 MiB, the first with a configured UUID, and slow migration
// bandwidths so that migrations take measurable simulated time. Tests use deltas of shared
// counters, so they pass whether ctest runs them one per process or the binary runs them all in
// one.
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "client/hooks/nvml_api.h"
#include "shared_state.h"

extern char** environ;

namespace {

constexpr const char kUuid0[] = "GPU-11111111-2222-4333-8444-555555555555";
constexpr const char kUuid1[] = "GPU-00000000-0000-4000-8000-000000000001";
constexpr std::size_t kMiB = 1 << 20;
constexpr std::size_t kGiB = 1 << 30;
constexpr std::uint64_t kSwapBytesPerS = 1ULL << 30;     // NVSHARE_FAKECUDA_SWAP_BW=1Gi
constexpr std::uint64_t kFaultBytesPerS = 512ULL << 20;  // NVSHARE_FAKECUDA_FAULT_BW=512Mi

constexpr const char kPtx[] = R"(
.version 7.8
.target sm_80
.address_size 64
.visible .entry spin(
    .param .u64 spin_param_0
)
{
    ret;
}
.visible .entry noparams()
{
    ret;
}
)";

std::string g_state_path;
bool g_cu_init_called = false;

class FakeCudaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    g_state_path = (std::filesystem::temp_directory_path() /
                    ("fakecuda_test." + std::to_string(getpid()) + ".state"))
                       .string();
    std::filesystem::remove(g_state_path);
    setenv("NVSHARE_FAKECUDA_STATE", g_state_path.c_str(), 1);
    setenv("NVSHARE_FAKECUDA_DEVICES", "2", 1);
    setenv("NVSHARE_FAKECUDA_MEMORY", "1Gi", 1);
    setenv("NVSHARE_FAKECUDA_MEMORY_1", "512Mi", 1);
    setenv("NVSHARE_FAKECUDA_UUIDS", kUuid0, 1);
    setenv("NVSHARE_FAKECUDA_SWAP_BW", "1Gi", 1);
    setenv("NVSHARE_FAKECUDA_FAULT_BW", "512Mi", 1);
    // Children (nvshare-trainer) load the same simulated driver.
    setenv("LD_LIBRARY_PATH", NVSHARE_FAKECUDA_LIB_DIR, 1);
  }
  void TearDown() override { std::filesystem::remove(g_state_path); }
};

const ::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new FakeCudaEnvironment);

fakecuda::DeviceSnapshot snapshot(const std::string& uuid) {
  static const std::unique_ptr<fakecuda::SharedState> state = [] {
    auto opened = fakecuda::SharedState::open(g_state_path, /*create=*/false);
    EXPECT_TRUE(opened.ok());
    return opened.ok() ? std::move(opened).value() : nullptr;
  }();
  auto record = state->device(uuid, 0);
  EXPECT_TRUE(record.ok());
  return fakecuda::SimDevice(record.value()).snapshot();
}

std::string uuid_text(const CUuuid& uuid) {
  char buf[64];
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  std::snprintf(buf, sizeof buf,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return buf;
}

// A context on a device, current while the object lives, with the test module loaded.
class ScopedContext {
 public:
  explicit ScopedContext(int device) {
    EXPECT_EQ(cuCtxCreate(&ctx_, nullptr, 0, device), CUDA_SUCCESS);
    EXPECT_EQ(cuModuleLoadData(&module_, kPtx), CUDA_SUCCESS);
    EXPECT_EQ(cuModuleGetFunction(&spin_, module_, "spin"), CUDA_SUCCESS);
  }
  ~ScopedContext() { EXPECT_EQ(cuCtxDestroy(ctx_), CUDA_SUCCESS); }
  CUcontext get() const { return ctx_; }
  CUfunction spin() const { return spin_; }
  CUmodule module() const { return module_; }

 private:
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction spin_ = nullptr;
};

void launch_ns(CUfunction f, CUstream stream, std::uint64_t ns) {
  void* params[] = {&ns};
  ASSERT_EQ(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr), CUDA_SUCCESS);
}

float elapsed_ms(CUevent a, CUevent b) {
  float ms = -1;
  EXPECT_EQ(cuEventElapsedTime(&ms, a, b), CUDA_SUCCESS);
  return ms;
}

class FakeCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_cu_init_called = true;
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  }
};

// Runs nvshare-trainer with the given arguments; returns its pid.
pid_t spawn_trainer(const std::vector<std::string>& args) {
  std::vector<std::string> all = {NVSHARE_TRAINER_PATH};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// Polls until pred() holds or timeout; returns whether it held.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// Must run before any cuInit in this process: it is first in the file, and skips otherwise.
TEST(FakeCudaInit, CallsBeforeCuInitFail) {
  if (g_cu_init_called) GTEST_SKIP() << "cuInit already ran in this process";
  int count = -1;
  EXPECT_EQ(cuDeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, 16), CUDA_ERROR_NOT_INITIALIZED);
  int version = 0;
  EXPECT_EQ(cuDriverGetVersion(&version), CUDA_SUCCESS);  // allowed before cuInit
  EXPECT_EQ(version, 13000);
  EXPECT_EQ(cuInit(1), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeCudaTest, DevicesComeFromTheEnvironment) {
  int count = 0;
  ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, 2);
  CUuuid uuid;
  ASSERT_EQ(cuDeviceGetUuid(&uuid, 0), CUDA_SUCCESS);
  EXPECT_EQ(uuid_text(uuid), kUuid0);
  ASSERT_EQ(cuDeviceGetUuid(&uuid, 1), CUDA_SUCCESS);
  EXPECT_EQ(uuid_text(uuid), kUuid1);
  size_t total = 0;
  ASSERT_EQ(cuDeviceTotalMem(&total, 0), CUDA_SUCCESS);
  EXPECT_EQ(total, kGiB);
  ASSERT_EQ(cuDeviceTotalMem(&total, 1), CUDA_SUCCESS);
  EXPECT_EQ(total, 512 * kMiB);
  CUdevice dev = -1;
  EXPECT_EQ(cuDeviceGet(&dev, 1), CUDA_SUCCESS);
  EXPECT_EQ(dev, 1);
  EXPECT_EQ(cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
  char name[128] = {};
  EXPECT_EQ(cuDeviceGetName(name, sizeof name, 0), CUDA_SUCCESS);
  EXPECT_NE(std::strlen(name), 0u);
  char bus[32] = {};
  EXPECT_EQ(cuDeviceGetPCIBusId(bus, sizeof bus, 1), CUDA_SUCCESS);
  EXPECT_EQ(cuDeviceGetByPCIBusId(&dev, bus), CUDA_SUCCESS);
  EXPECT_EQ(dev, 1);
}

TEST_F(FakeCudaTest, AttributesLookLikeAnH100) {
  auto attr = [](CUdevice_attribute a) {
    int v = -1;
    EXPECT_EQ(cuDeviceGetAttribute(&v, a, 0), CUDA_SUCCESS);
    return v;
  };
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), 9);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR), 0);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE), 32);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK), 1024);
  EXPECT_GT(attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), 0);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING), 1);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY), 1);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS), 1);
  EXPECT_EQ(attr(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS), 0);
  // Unknown (a value the enumeration can hold, past its last attribute): 0, not an error.
  EXPECT_EQ(attr(static_cast<CUdevice_attribute>(CU_DEVICE_ATTRIBUTE_MAX + 50)), 0);
  int v = 0;
  EXPECT_EQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 7), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(FakeCudaTest, ErrorNamesAndStrings) {
  const char* s = nullptr;
  EXPECT_EQ(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
  EXPECT_STREQ(s, "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
  EXPECT_STREQ(s, "out of memory");
  // A code the enumeration can hold (it reaches 999) that names no error.
  EXPECT_EQ(cuGetErrorName(static_cast<CUresult>(1000), &s), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeCudaTest, ContextStack) {
  CUcontext current = reinterpret_cast<CUcontext>(0x1);
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, nullptr);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);

  CUcontext a = nullptr;
  CUcontext b = nullptr;
  ASSERT_EQ(cuCtxCreate(&a, nullptr, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, a);
  ASSERT_EQ(cuCtxCreate(&b, nullptr, 0, 1), CUDA_SUCCESS);
  CUdevice dev = -1;
  EXPECT_EQ(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 1);
  CUcontext popped = nullptr;
  EXPECT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, b);
  EXPECT_EQ(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 0);
  EXPECT_EQ(cuCtxPushCurrent(b), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(a), CUDA_SUCCESS);  // replaces the top
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, a);
  EXPECT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, a);
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, a);  // the first push of a is still below
  EXPECT_EQ(cuCtxDestroy(b), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxDestroy(a), CUDA_SUCCESS);  // destroying the current context pops it
  ASSERT_EQ(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  EXPECT_EQ(current, nullptr);
  EXPECT_EQ(cuCtxPopCurrent(&popped), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxPushCurrent(a), CUDA_ERROR_INVALID_CONTEXT);  // destroyed
}

TEST_F(FakeCudaTest, PrimaryContextIsPerDeviceAndRefcounted) {
  CUcontext p1 = nullptr;
  CUcontext p2 = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&p1, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&p2, 0), CUDA_SUCCESS);
  EXPECT_EQ(p1, p2);
  unsigned flags = 0;
  int active = 0;
  EXPECT_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 1);
  EXPECT_EQ(cuCtxSetCurrent(p1), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc(&p, kMiB), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 1);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 0);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
  // The released context's memory is gone with it, and the stale handle is no longer usable.
  EXPECT_EQ(cuMemAlloc(&p, kMiB), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxSetFlags(0, CU_CTX_SCHED_BLOCKING_SYNC), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(flags, static_cast<unsigned>(CU_CTX_SCHED_BLOCKING_SYNC));
  EXPECT_EQ(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, AllocationsCountAgainstCapacity) {
  ScopedContext ctx(1);  // 512 MiB
  size_t free0 = 0;
  size_t total = 0;
  ASSERT_EQ(cuMemGetInfo(&free0, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 512 * kMiB);
  CUdeviceptr a = 0;
  ASSERT_EQ(cuMemAlloc(&a, 256 * kMiB), CUDA_SUCCESS);
  size_t free1 = 0;
  ASSERT_EQ(cuMemGetInfo(&free1, &total), CUDA_SUCCESS);
  EXPECT_EQ(free0 - free1, 256 * kMiB);
  EXPECT_EQ(snapshot(kUuid1).memory.device_bytes, 512 * kMiB - free1);
  CUdeviceptr b = 0;
  EXPECT_EQ(cuMemAlloc(&b, 300 * kMiB), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cuMemAlloc(&b, 0), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr pitched = 0;
  size_t pitch = 0;
  ASSERT_EQ(cuMemAllocPitch(&pitched, &pitch, 1000, 10, 4), CUDA_SUCCESS);
  EXPECT_GE(pitch, 1000u);
  EXPECT_EQ(pitch % 512, 0u);
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_EQ(cuMemGetAddressRange(&base, &size, a + 4096), CUDA_SUCCESS);
  EXPECT_EQ(base, a);
  EXPECT_EQ(size, 256 * kMiB);
  EXPECT_EQ(cuMemGetAddressRange(&base, &size, 0x10), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(cuMemFree(a + 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(pitched), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
  size_t free2 = 0;
  ASSERT_EQ(cuMemGetInfo(&free2, &total), CUDA_SUCCESS);
  EXPECT_EQ(free2, free0);
  ASSERT_EQ(cuMemAlloc(&b, 300 * kMiB), CUDA_SUCCESS);  // fits again
  EXPECT_EQ(cuMemFree(b), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, DestroyingAContextReturnsItsMemory) {
  size_t before = snapshot(kUuid1).memory.device_bytes;
  {
    ScopedContext ctx(1);
    CUdeviceptr a = 0;
    ASSERT_EQ(cuMemAlloc(&a, 64 * kMiB), CUDA_SUCCESS);
    EXPECT_EQ(snapshot(kUuid1).memory.device_bytes, before + 64 * kMiB);
  }
  EXPECT_EQ(snapshot(kUuid1).memory.device_bytes, before);
}

TEST_F(FakeCudaTest, CopiesAndMemsetsMoveBytes) {
  ScopedContext ctx(0);
  constexpr size_t kCount = 1 << 20;
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  ASSERT_EQ(cuMemAlloc(&a, kCount * 4), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc(&b, kCount * 4), CUDA_SUCCESS);
  std::vector<std::uint32_t> host(kCount);
  for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<std::uint32_t>(i * 2654435761u);
  ASSERT_EQ(cuMemcpyHtoD(a, host.data(), kCount * 4), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoD(b, a, kCount * 4), CUDA_SUCCESS);
  std::vector<std::uint32_t> back(kCount);
  ASSERT_EQ(cuMemcpyDtoH(back.data(), b, kCount * 4), CUDA_SUCCESS);
  EXPECT_EQ(back, host);

  ASSERT_EQ(cuMemsetD32(a, 0xdeadbeef, kCount), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH(back.data(), a, kCount * 4), CUDA_SUCCESS);
  EXPECT_EQ(back[0], 0xdeadbeefu);
  EXPECT_EQ(back[kCount - 1], 0xdeadbeefu);
  ASSERT_EQ(cuMemsetD16(a + 2, 0x1234, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8(a + 5, 0x7f, 2), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH(back.data(), a, 8), CUDA_SUCCESS);
  EXPECT_EQ(back[0], 0x1234beefu);
  EXPECT_EQ(back[1], 0xde7f7fefu);
  EXPECT_EQ(cuMemsetD32(a + 2, 0, 1), CUDA_ERROR_INVALID_VALUE);          // misaligned
  EXPECT_EQ(cuMemsetD8(a, 0, kCount * 4 + 1), CUDA_ERROR_INVALID_VALUE);  // past the allocation

  // Zeroing whole pages takes the madvise path; the bytes must still read back as zeros.
  ASSERT_EQ(cuMemsetD8(a + 3, 0, kCount * 4 - 5), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH(back.data(), a, kCount * 4), CUDA_SUCCESS);
  EXPECT_EQ(back[0], 0x0034beefu);
  EXPECT_EQ(back[kCount / 2], 0u);
  EXPECT_EQ(back[kCount - 1], 0xdead0000u);

  // Asynchronous forms run after the kernel queued before them and are done at synchronize.
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  launch_ns(ctx.spin(), stream, 100'000'000);
  ASSERT_EQ(cuMemsetD32Async(a, 7, kCount, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoDAsync(b, a, kCount * 4, stream), CUDA_SUCCESS);
  std::vector<std::uint32_t> out(kCount, 1);
  ASSERT_EQ(cuMemcpyDtoHAsync(out.data(), b, kCount * 4, stream), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(stream), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(out[0], 1u);  // not yet: the kernel ahead of it still runs
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(stream), CUDA_SUCCESS);
  EXPECT_EQ(out[0], 7u);
  EXPECT_EQ(out[kCount - 1], 7u);
  EXPECT_EQ(cuStreamDestroy(stream), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(b), CUDA_SUCCESS);
}

// Simulated-time checks below are exact to well under a millisecond because what they measure is
// queued behind earlier GPU work (a "lead" kernel or migration): a queued operation starts when the
// one before it ends on the simulated clock, however late the host submitted it or the worker woke.
// Only an event recorded on an idle queue is stamped with host time.
constexpr std::uint64_t kLeadNs = 50'000'000;

TEST_F(FakeCudaTest, LaunchesAreAsynchronousAndTakeSimulatedTime) {
  ScopedContext ctx(0);
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
  CUevent start = nullptr;
  CUevent end = nullptr;
  ASSERT_EQ(cuEventCreate(&start, CU_EVENT_DEFAULT), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&end, CU_EVENT_DEFAULT), CUDA_SUCCESS);
  auto t0 = std::chrono::steady_clock::now();
  launch_ns(ctx.spin(), stream, kLeadNs);
  ASSERT_EQ(cuEventRecord(start, stream), CUDA_SUCCESS);
  launch_ns(ctx.spin(), stream, 60'000'000);
  launch_ns(ctx.spin(), stream, 40'000'000);
  ASSERT_EQ(cuEventRecord(end, stream), CUDA_SUCCESS);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(40));
  EXPECT_EQ(cuEventQuery(end), CUDA_ERROR_NOT_READY);
  float ms = 0;
  EXPECT_EQ(cuEventElapsedTime(&ms, start, end), CUDA_ERROR_NOT_READY);
  ASSERT_EQ(cuEventSynchronize(end), CUDA_SUCCESS);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));
  EXPECT_EQ(cuEventQuery(end), CUDA_SUCCESS);
  EXPECT_NEAR(elapsed_ms(start, end), 100.0, 0.5);

  // Kernels without parameters take no time; extra-buffer parameters work like kernelParams.
  CUfunction noparams = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&noparams, ctx.module(), "noparams"), CUDA_SUCCESS);
  launch_ns(ctx.spin(), stream, kLeadNs);
  ASSERT_EQ(cuEventRecord(start, stream), CUDA_SUCCESS);
  void* none[] = {nullptr};
  ASSERT_EQ(cuLaunchKernel(noparams, 1, 1, 1, 1, 1, 1, 0, stream, none, nullptr), CUDA_SUCCESS);
  std::uint64_t ns = 10'000'000;
  size_t size = sizeof ns;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &ns, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  ASSERT_EQ(cuLaunchKernel(ctx.spin(), 1, 1, 1, 1, 1, 1, 0, stream, nullptr, extra), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(end, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_NEAR(elapsed_ms(start, end), 10.0, 0.5);

  CUfunction missing = nullptr;
  EXPECT_EQ(cuModuleGetFunction(&missing, ctx.module(), "not_in_the_ptx"), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(cuLaunchKernel(ctx.spin(), 0, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr),
            CUDA_ERROR_INVALID_HANDLE);

  CUevent untimed = nullptr;
  ASSERT_EQ(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(untimed, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuEventSynchronize(untimed), CUDA_SUCCESS);
  EXPECT_EQ(cuEventElapsedTime(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);
  CUevent never = nullptr;
  ASSERT_EQ(cuEventCreate(&never, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(never), CUDA_SUCCESS);
  EXPECT_EQ(cuEventElapsedTime(&ms, start, never), CUDA_ERROR_INVALID_HANDLE);

  // The same kernels through cuLaunchKernelEx and cooperative launches.
  CUlaunchConfig config{};
  config.gridDimX = config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = config.blockDimY = config.blockDimZ = 1;
  config.hStream = stream;
  std::uint64_t ten_ms = 10'000'000;
  void* params[] = {&ten_ms};
  launch_ns(ctx.spin(), stream, kLeadNs);
  ASSERT_EQ(cuEventRecord(start, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernelEx(&config, ctx.spin(), params, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchCooperativeKernel(ctx.spin(), 1, 1, 1, 1, 1, 1, 0, stream, params),
            CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(end, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(end), CUDA_SUCCESS);
  EXPECT_NEAR(elapsed_ms(start, end), 20.0, 0.5);

  for (CUevent e : {start, end, untimed, never}) EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(start), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuStreamDestroy(stream), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, ContextsOnOneDeviceShareItAndDevicesAreIndependent) {
  ScopedContext a(0);
  ScopedContext b(0);
  ScopedContext c(1);
  ScopedContext gate(
      1);  // current: a managed-memory migration (no GPU share) that all three wait for
  CUdeviceptr buffer = 0;
  ASSERT_EQ(cuMemAllocManaged(&buffer, 64 * kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  CUevent go = nullptr;
  ASSERT_EQ(cuEventCreate(&go, 0), CUDA_SUCCESS);
  CUmemLocation device1{CU_MEM_LOCATION_TYPE_DEVICE, 1};
  ASSERT_EQ(cuMemPrefetchAsync(buffer, 64 * kMiB, device1, 0, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(go, nullptr), CUDA_SUCCESS);

  CUevent events[6];
  for (CUevent& e : events) ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  struct Run {
    CUcontext ctx;
    CUfunction spin;
  };
  const Run runs[] = {{a.get(), a.spin()}, {b.get(), b.spin()}, {c.get(), c.spin()}};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(cuCtxPushCurrent(runs[i].ctx), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamWaitEvent(nullptr, go, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuEventRecord(events[2 * i], nullptr), CUDA_SUCCESS);
    launch_ns(runs[i].spin, nullptr, 40'000'000);
    ASSERT_EQ(cuEventRecord(events[2 * i + 1], nullptr), CUDA_SUCCESS);
    CUcontext popped = nullptr;
    ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  }
  EXPECT_EQ(cuEventQuery(go), CUDA_ERROR_NOT_READY);  // the gate held while all three queued
  for (CUevent e : events) ASSERT_EQ(cuEventSynchronize(e), CUDA_SUCCESS);
  // All start together when the gate opens. Two contexts with work on device 0 each run at half
  // speed; device 1 is not slowed by them.
  EXPECT_NEAR(elapsed_ms(events[0], events[2]), 0.0, 0.1);
  EXPECT_NEAR(elapsed_ms(events[0], events[4]), 0.0, 0.1);
  EXPECT_NEAR(elapsed_ms(events[0], events[1]), 80.0, 0.5);
  EXPECT_NEAR(elapsed_ms(events[2], events[3]), 80.0, 0.5);
  EXPECT_NEAR(elapsed_ms(events[4], events[5]), 40.0, 0.5);
  for (CUevent e : events) EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(go), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, StreamWaitEventAcrossContexts) {
  ScopedContext a(0);
  CUevent done_a = nullptr;
  CUevent start = nullptr;
  ASSERT_EQ(cuEventCreate(&done_a, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&start, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(start, nullptr), CUDA_SUCCESS);
  launch_ns(a.spin(), nullptr, 100'000'000);
  ASSERT_EQ(cuEventRecord(done_a, nullptr), CUDA_SUCCESS);
  {
    ScopedContext b(1);
    CUstream stream = nullptr;
    ASSERT_EQ(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
    CUevent done_b = nullptr;
    ASSERT_EQ(cuEventCreate(&done_b, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamWaitEvent(stream, done_a, 0), CUDA_SUCCESS);
    launch_ns(b.spin(), stream, 10'000'000);
    ASSERT_EQ(cuEventRecord(done_b, stream), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
    EXPECT_EQ(cuEventQuery(done_a), CUDA_SUCCESS);
    EXPECT_GE(elapsed_ms(start, done_a), 99.9);
    // b's kernel starts the moment a's work ends, on the simulated clock.
    EXPECT_NEAR(elapsed_ms(done_a, done_b), 10.0, 0.5);
    EXPECT_EQ(cuEventDestroy(done_b), CUDA_SUCCESS);
  }
  EXPECT_EQ(cuEventDestroy(done_a), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(start), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, ManagedMemoryMigratesByPrefetchAndFaults) {
  ScopedContext ctx(0);
  constexpr size_t kBytes = 64 * kMiB;
  const fakecuda::DeviceSnapshot before = snapshot(kUuid0);
  CUdeviceptr m = 0;
  ASSERT_EQ(cuMemAllocManaged(&m, kBytes, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  unsigned is_managed = 0;
  ASSERT_EQ(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m), CUDA_SUCCESS);
  EXPECT_EQ(is_managed, 1u);
  unsigned type = 0;
  ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m), CUDA_SUCCESS);
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  fakecuda::DeviceSnapshot s = snapshot(kUuid0);
  EXPECT_EQ(s.memory.managed_host - before.memory.managed_host, kBytes);  // fresh: on the host
  EXPECT_EQ(s.memory.managed_resident, before.memory.managed_resident);

  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
  CUevent t[4];
  for (CUevent& e : t) ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  const double swap_ms = static_cast<double>(kBytes) * 1e3 / kSwapBytesPerS;
  const double fault_ms = static_cast<double>(kBytes) * 1e3 / kFaultBytesPerS;

  // To the device by prefetch, back to the host by prefetch (CUDA 13 location forms), then a kernel
  // demand-faults it in. Each step takes its bytes over its bandwidth, in stream order.
  CUmemLocation device{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemLocation host{CU_MEM_LOCATION_TYPE_HOST, 0};
  ASSERT_EQ(cuEventRecord(t[0], stream), CUDA_SUCCESS);
  ASSERT_EQ(cuMemPrefetchAsync(m, kBytes, device, 0, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(t[1], stream), CUDA_SUCCESS);
  ASSERT_EQ(cuMemPrefetchAsync(m, kBytes, host, 0, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(t[2], stream), CUDA_SUCCESS);
  launch_ns(ctx.spin(), stream, 0);
  ASSERT_EQ(cuEventRecord(t[3], stream), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_GE(elapsed_ms(t[0], t[1]), swap_ms - 0.1);  // t[0] was stamped by the host
  EXPECT_NEAR(elapsed_ms(t[1], t[2]), swap_ms, 0.5);
  EXPECT_NEAR(elapsed_ms(t[2], t[3]), fault_ms, 0.5);
  s = snapshot(kUuid0);
  EXPECT_EQ(s.migrated_to_device - before.migrated_to_device, kBytes);
  EXPECT_EQ(s.migrated_to_host - before.migrated_to_host, kBytes);
  EXPECT_EQ(s.faulted_in - before.faulted_in, kBytes);
  EXPECT_EQ(s.memory.managed_resident - before.memory.managed_resident, kBytes);
  EXPECT_EQ(s.memory.managed_host, before.memory.managed_host);
  size_t free = 0;
  size_t total = 0;
  ASSERT_EQ(cuMemGetInfo(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(total - free, s.memory.device_bytes + s.memory.managed_resident);

  // Host-preferred memory is not faulted in by kernels.
  ASSERT_EQ(cuMemPrefetchAsync(m, kBytes, host, 0, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAdvise(m, kBytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host), CUDA_SUCCESS);
  launch_ns(ctx.spin(), stream, 0);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  s = snapshot(kUuid0);
  EXPECT_EQ(s.faulted_in - before.faulted_in, kBytes);
  EXPECT_EQ(s.memory.managed_host - before.memory.managed_host, kBytes);

  CUdeviceptr plain = 0;
  ASSERT_EQ(cuMemAlloc(&plain, kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, plain),
            CUDA_SUCCESS);
  EXPECT_EQ(is_managed, 0u);
  EXPECT_EQ(cuMemPrefetchAsync(plain, kMiB, device, 0, stream), CUDA_ERROR_INVALID_VALUE);
  void* pinned = nullptr;
  ASSERT_EQ(cuMemAllocHost(&pinned, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                  reinterpret_cast<CUdeviceptr>(pinned)),
            CUDA_SUCCESS);
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_HOST));
  EXPECT_EQ(cuMemFreeHost(pinned), CUDA_SUCCESS);

  EXPECT_EQ(cuMemFree(plain), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(m), CUDA_SUCCESS);
  s = snapshot(kUuid0);
  EXPECT_EQ(s.memory.managed_host, before.memory.managed_host);
  EXPECT_EQ(s.memory.managed_resident, before.memory.managed_resident);
  for (CUevent e : t) EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(stream), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, StreamCaptureRecordsIntoAGraphThatLaunches) {
  ScopedContext ctx(0);
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, 0), CUDA_SUCCESS);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  EXPECT_EQ(cuStreamIsCapturing(stream, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(cuStreamIsCapturing(reinterpret_cast<CUstream>(0x1234), &status),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuStreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL),
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);

  // Captured work does not run; the instantiated graph runs it each launch, on simulated time.
  const std::uint64_t kernels_before = snapshot(kUuid0).kernels;
  ASSERT_EQ(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamIsCapturing(stream, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
  launch_ns(ctx.spin(), stream, 20'000'000);
  launch_ns(ctx.spin(), stream, 20'000'000);
  CUgraph graph = nullptr;
  ASSERT_EQ(cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
  ASSERT_NE(graph, nullptr);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(snapshot(kUuid0).kernels, kernels_before);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
  CUevent start = nullptr;
  CUevent end = nullptr;
  ASSERT_EQ(cuEventCreate(&start, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&end, 0), CUDA_SUCCESS);
  launch_ns(ctx.spin(), stream, kLeadNs);
  ASSERT_EQ(cuEventRecord(start, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphLaunch(exec, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphLaunch(exec, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(end, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_NEAR(elapsed_ms(start, end), 80.0, 0.5);
  EXPECT_EQ(snapshot(kUuid0).kernels, kernels_before + 5);

  // Synchronizing the context, or recording a context-wide event, during a capture is illegal and
  // invalidates it, as on a real GPU.
  ASSERT_EQ(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamIsCapturing(stream, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CUgraph broken = reinterpret_cast<CUgraph>(0x1);
  EXPECT_EQ(cuStreamEndCapture(stream, &broken), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(broken, nullptr);
  ASSERT_EQ(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxRecordEvent(ctx.get(), end), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamEndCapture(stream, &broken), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(cuStreamEndCapture(stream, &broken), CUDA_ERROR_ILLEGAL_STATE);

  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuEventDestroy(start), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(end), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(stream), CUDA_SUCCESS);
}

// cuCtxRecordEvent covers every stream of the context.
TEST_F(FakeCudaTest, ContextEventCoversAllStreams) {
  ScopedContext ctx(0);
  CUstream a = nullptr;
  CUstream b = nullptr;
  ASSERT_EQ(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUevent marker = nullptr;
  ASSERT_EQ(cuEventCreate(&marker, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC), CUDA_SUCCESS);
  launch_ns(ctx.spin(), a, 50'000'000);
  launch_ns(ctx.spin(), b, 0);
  ASSERT_EQ(cuCtxRecordEvent(ctx.get(), marker), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(marker), CUDA_ERROR_NOT_READY);
  ASSERT_EQ(cuEventSynchronize(marker), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(a), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxRecordEvent(reinterpret_cast<CUcontext>(0x1234), marker),
            CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuEventDestroy(marker), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(a), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(b), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, TwoAndThreeDimensionalCopiesAndMemsets) {
  ScopedContext ctx(0);
  CUdeviceptr d = 0;
  size_t pitch = 0;
  ASSERT_EQ(cuMemAllocPitch(&d, &pitch, 100, 8, 4), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD2D8(d, pitch, 0x11, 100, 8), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD2D32(d + 4, pitch, 0xabcdef01, 2, 8), CUDA_SUCCESS);
  std::vector<unsigned char> host(16 * 8, 0);
  CUDA_MEMCPY2D copy{};
  copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.srcDevice = d;
  copy.srcPitch = pitch;
  copy.dstMemoryType = CU_MEMORYTYPE_HOST;
  copy.dstHost = host.data();
  copy.dstPitch = 16;
  copy.WidthInBytes = 16;
  copy.Height = 8;
  ASSERT_EQ(cuMemcpy2D(&copy), CUDA_SUCCESS);
  for (int row = 0; row < 8; ++row) {
    EXPECT_EQ(host[row * 16 + 0], 0x11);
    EXPECT_EQ(host[row * 16 + 4], 0x01);
    EXPECT_EQ(host[row * 16 + 11], 0xab);
    EXPECT_EQ(host[row * 16 + 12], 0x11);
  }
  copy.Height = 9;  // one row past the allocation
  EXPECT_EQ(cuMemcpy2D(&copy), CUDA_ERROR_INVALID_VALUE);

  // 3D: two layers of 2 x 4 bytes out of a device volume into a packed host buffer, asynchronously.
  CUDA_MEMCPY3D volume{};
  volume.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  volume.srcDevice = d;
  volume.srcPitch = pitch;
  volume.srcHeight = 4;
  volume.srcXInBytes = 4;
  volume.dstMemoryType = CU_MEMORYTYPE_HOST;
  std::vector<unsigned char> packed(16, 0);
  volume.dstHost = packed.data();
  volume.dstPitch = 4;
  volume.dstHeight = 2;
  volume.WidthInBytes = 4;
  volume.Height = 2;
  volume.Depth = 2;
  ASSERT_EQ(cuMemcpy3DAsync(&volume, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  for (int i = 0; i < 16; i += 4) EXPECT_EQ(packed[i], 0x01) << i;

  // Peer and batch copies move bytes like the plain ones.
  CUdeviceptr e = 0;
  ASSERT_EQ(cuMemAlloc(&e, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyPeer(e, ctx.get(), d, ctx.get(), 16), CUDA_SUCCESS);
  CUdeviceptr dsts[] = {e + 1024, e + 2048};
  CUdeviceptr srcs[] = {e, d + pitch};
  size_t sizes[] = {16, 16};
  size_t fail = 0;
  CUmemcpyAttributes attrs{};
  size_t attr_index = 0;
  // The CUDA 12.8 form (with failIdx) is only reachable by name; cuda.h 13 declares the _v2 form.
  using Batch12080 = CUresult (*)(CUdeviceptr*, CUdeviceptr*, size_t*, size_t, CUmemcpyAttributes*,
                                  size_t*, size_t, size_t*, CUstream);
  auto batch_12080 = reinterpret_cast<Batch12080>(dlsym(RTLD_DEFAULT, "cuMemcpyBatchAsync"));
  ASSERT_NE(batch_12080, nullptr);
  ASSERT_EQ(batch_12080(dsts, srcs, sizes, 2, &attrs, &attr_index, 1, &fail, nullptr),
            CUDA_SUCCESS);
  EXPECT_EQ(fail, SIZE_MAX);
  ASSERT_EQ(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &attrs, &attr_index, 1, nullptr),
            CUDA_SUCCESS);
  unsigned char check[16] = {};
  ASSERT_EQ(cuMemcpyDtoH(check, e + 2048, 16), CUDA_SUCCESS);
  EXPECT_EQ(check[0], 0x11);
  EXPECT_EQ(check[4], 0x01);
  EXPECT_EQ(cuMemFree(e), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(d), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, VirtualMemoryMapsOnePhysicalAllocationTwice) {
  ScopedContext ctx(1);
  const std::uint64_t before = snapshot(kUuid1).memory.device_bytes;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 1;
  size_t granularity = 0;
  ASSERT_EQ(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  ASSERT_EQ(granularity, 2 * kMiB);
  CUmemGenericAllocationHandle handle = 0;
  EXPECT_EQ(cuMemCreate(&handle, granularity + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemCreate(&handle, 2 * granularity, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(snapshot(kUuid1).memory.device_bytes, before + 2 * granularity);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, 4 * granularity, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(va % granularity, 0u);
  ASSERT_EQ(cuMemMap(va, 2 * granularity, 0, handle, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(va + 2 * granularity, 2 * granularity, 0, handle, 0), CUDA_SUCCESS);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(cuMemSetAccess(va, 4 * granularity, &access, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD32(va, 0x5a5a5a5a, 1), CUDA_SUCCESS);
  std::uint32_t word = 0;
  ASSERT_EQ(cuMemcpyDtoH(&word, va + 2 * granularity, 4), CUDA_SUCCESS);  // the second mapping
  EXPECT_EQ(word, 0x5a5a5a5au);
  EXPECT_EQ(cuMemFree(va), CUDA_ERROR_INVALID_VALUE);  // mapped memory is not cuMemAlloc memory
  ASSERT_EQ(cuMemUnmap(va, 2 * granularity), CUDA_SUCCESS);
  ASSERT_EQ(cuMemUnmap(va + 2 * granularity, 2 * granularity), CUDA_SUCCESS);
  ASSERT_EQ(cuMemRelease(handle), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(handle), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(snapshot(kUuid1).memory.device_bytes, before);
  ASSERT_EQ(cuMemAddressFree(va, 4 * granularity), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, StreamOrderedAllocationsAreDeviceMemory) {
  ScopedContext ctx(1);
  const std::uint64_t before = snapshot(kUuid1).memory.device_bytes;
  CUstream stream = nullptr;
  ASSERT_EQ(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUmemoryPool pool = nullptr;
  ASSERT_EQ(cuDeviceGetDefaultMemPool(&pool, 1), CUDA_SUCCESS);
  CUdeviceptr a = 0;
  CUdeviceptr b = 0;
  ASSERT_EQ(cuMemAllocAsync(&a, 8 * kMiB, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAllocFromPoolAsync(&b, 4 * kMiB, pool, stream), CUDA_SUCCESS);
  EXPECT_EQ(snapshot(kUuid1).memory.device_bytes, before + 12 * kMiB);
  EXPECT_EQ(cuMemAllocAsync(&a, 1024 * kMiB, stream), CUDA_ERROR_OUT_OF_MEMORY);
  launch_ns(ctx.spin(), stream, 20'000'000);
  ASSERT_EQ(cuMemFreeAsync(a, stream), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFreeAsync(b, stream), CUDA_SUCCESS);
  EXPECT_EQ(snapshot(kUuid1).memory.device_bytes, before + 12 * kMiB);  // after the kernel
  ASSERT_EQ(cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(snapshot(kUuid1).memory.device_bytes, before);
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 1;
  CUmemoryPool own = nullptr;
  ASSERT_EQ(cuMemPoolCreate(&own, &props), CUDA_SUCCESS);
  EXPECT_EQ(cuMemPoolDestroy(own), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(stream), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, BatchPrefetchMovesEachRangeToItsLocation) {
  ScopedContext ctx(0);
  const fakecuda::DeviceSnapshot before = snapshot(kUuid0);
  CUdeviceptr m[3] = {};
  for (CUdeviceptr& p : m)
    ASSERT_EQ(cuMemAllocManaged(&p, 4 * kMiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  CUdeviceptr ptrs[] = {m[0], m[1], m[2]};
  size_t sizes[] = {4 * kMiB, 4 * kMiB, 4 * kMiB};
  CUmemLocation locations[] = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, {CU_MEM_LOCATION_TYPE_HOST, 0}};
  size_t first[] = {0, 2};  // m[0], m[1] to the device; m[2] to the host (where it already is)
  ASSERT_EQ(cuMemPrefetchBatchAsync(ptrs, sizes, 3, locations, first, 2, 0, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(snapshot(kUuid0).migrated_to_device - before.migrated_to_device, 8 * kMiB);
  size_t bad_first[] = {1, 2};
  EXPECT_EQ(cuMemPrefetchBatchAsync(ptrs, sizes, 3, locations, bad_first, 2, 0, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  for (CUdeviceptr p : m) EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

// libnvidia-ml.so.1 beside the fake libcuda reads the same simulated GPUs.
TEST_F(FakeCudaTest, FakeNvmlReportsTheSimulatedMemory) {
  void* nvml = dlopen(NVSHARE_FAKECUDA_LIB_DIR "/libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(nvml, nullptr) << dlerror();
  // NVML's own types (client/hooks/nvml_api.h): the functions are called as they are defined.
  using InitFn = nvmlReturn_t (*)();
  using ByUuidFn = nvmlReturn_t (*)(const char*, nvmlDevice_t*);
  using MemoryFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
  auto init = reinterpret_cast<InitFn>(dlsym(nvml, "nvmlInit_v2"));
  auto by_uuid = reinterpret_cast<ByUuidFn>(dlsym(nvml, "nvmlDeviceGetHandleByUUID"));
  auto memory = reinterpret_cast<MemoryFn>(dlsym(nvml, "nvmlDeviceGetMemoryInfo"));
  auto shutdown = reinterpret_cast<InitFn>(dlsym(nvml, "nvmlShutdown"));
  ASSERT_TRUE(init && by_uuid && memory && shutdown);
  ASSERT_EQ(init(), 0);
  nvmlDevice_t device = nullptr;
  ASSERT_EQ(by_uuid(kUuid1, &device), 0);
  nvmlMemory_t info{};
  ASSERT_EQ(memory(device, &info), 0);
  EXPECT_EQ(info.total, 512 * kMiB);
  const unsigned long long used_before = info.used;
  ScopedContext ctx(1);
  CUdeviceptr a = 0;
  ASSERT_EQ(cuMemAlloc(&a, 32 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(memory(device, &info), 0);
  EXPECT_EQ(info.used, used_before + 32 * kMiB);
  EXPECT_EQ(info.free, info.total - info.used);
  EXPECT_EQ(cuMemFree(a), CUDA_SUCCESS);
  EXPECT_EQ(by_uuid("GPU-ffffffff-ffff-4fff-8fff-ffffffffffff", &device), 6);
  EXPECT_EQ(shutdown(), 0);
}

using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);

void* lookup(const char* name, int version, cuuint64_t flags, CUresult* rc = nullptr,
             CUdriverProcAddressQueryResult* status = nullptr) {
  void* fn = reinterpret_cast<void*>(0x1);
  CUdriverProcAddressQueryResult s = CU_GET_PROC_ADDRESS_SUCCESS;
  CUresult r = cuGetProcAddress(name, &fn, version, flags, &s);
  if (rc != nullptr) *rc = r;
  if (status != nullptr) *status = s;
  return fn;
}

void* exported(const char* name) { return dlsym(RTLD_DEFAULT, name); }

TEST(FakeCudaProcAddress, ResolvesByNameVersionAndFlags) {
  EXPECT_EQ(lookup("cuMemAlloc", 3020, 0), exported("cuMemAlloc_v2"));
  EXPECT_EQ(lookup("cuMemAlloc", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
            exported("cuMemAlloc_v2"));
  EXPECT_EQ(lookup("cuMemGetInfo", 3020, 0), exported("cuMemGetInfo_v2"));
  EXPECT_EQ(lookup("cuCtxCreate", 3020, 0), exported("cuCtxCreate_v2"));
  EXPECT_EQ(lookup("cuCtxCreate", 11040, 0), exported("cuCtxCreate_v3"));
  EXPECT_EQ(lookup("cuCtxCreate", 12050, 0), exported("cuCtxCreate_v4"));
  EXPECT_EQ(lookup("cuCtxCreate", 13000, 0), exported("cuCtxCreate_v4"));
  EXPECT_EQ(lookup("cuGetProcAddress", 11030, 0), exported("cuGetProcAddress"));
  EXPECT_EQ(lookup("cuGetProcAddress", 12000, 0), exported("cuGetProcAddress_v2"));
  EXPECT_EQ(lookup("cuLaunchKernel", 4000, 0), exported("cuLaunchKernel"));
  EXPECT_EQ(lookup("cuLaunchKernel", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
            exported("cuLaunchKernel_ptsz"));
  EXPECT_EQ(lookup("cuMemcpyHtoD", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
            exported("cuMemcpyHtoD_v2_ptds"));
  EXPECT_EQ(lookup("cuMemPrefetchAsync", 8000, 0), exported("cuMemPrefetchAsync"));
  EXPECT_EQ(lookup("cuMemPrefetchAsync", 12020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
            exported("cuMemPrefetchAsync_v2_ptsz"));
  EXPECT_EQ(lookup("cuCtxSynchronize", 13000, 0), exported("cuCtxSynchronize_v2"));

  CUresult rc = CUDA_SUCCESS;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_EQ(lookup("cuMemAlloc", 2000, 0, &rc, &status),
            nullptr);  // the 32-bit form is not provided
  EXPECT_EQ(rc, CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(lookup("cuNoSuchFunction", 13000, 0, &rc, &status), nullptr);
  EXPECT_EQ(rc, CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(lookup("", 0, 0, &rc, &status), nullptr);
  EXPECT_EQ(rc, CUDA_ERROR_NOT_FOUND);

  // The CUDA 11.3 entry point (no status argument) answers the same way.
  using OldFn = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto old = reinterpret_cast<OldFn>(lookup("cuGetProcAddress", 11030, 0));
  void* fn = nullptr;
  EXPECT_EQ(old("cuMemFree", &fn, 3020, 0), CUDA_SUCCESS);
  EXPECT_EQ(fn, exported("cuMemFree_v2"));
}

// Every entry of the one symbol table is exported under its name and is what cuGetProcAddress
// returns for its (name, version, flags).
TEST(FakeCudaProcAddress, TableMatchesExports) {
  struct Entry {
    const char* base;
    int version;
    int per_thread;
    const char* symbol;
  };
#define FAKECUDA_SYMBOL(base, version, per_thread, symbol) {#base, version, per_thread, #symbol},
  const Entry entries[] = {
#include "procaddress_table.def"
  };
#undef FAKECUDA_SYMBOL
  EXPECT_GT(sizeof entries / sizeof entries[0], 100u);
  for (const Entry& e : entries) {
    void* symbol = exported(e.symbol);
    EXPECT_NE(symbol, nullptr) << e.symbol << " is not exported";
    cuuint64_t flags = e.per_thread != 0 ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
    EXPECT_EQ(lookup(e.base, e.version, flags), symbol) << e.base << "@" << e.version;
  }
}

// Only driver API names leave the library: its C++ internals must not clash with the process around
// it (nor with libnvshare.so's own copy of nvshare_common).
TEST(FakeCudaExports, OnlyCuSymbolsAreExported) {
  FILE* nm = popen("nm -D --defined-only '" NVSHARE_FAKECUDA_LIB "' 2>/dev/null", "r");
  ASSERT_NE(nm, nullptr);
  char line[512];
  int symbols = 0;
  while (std::fgets(line, sizeof line, nm) != nullptr) {
    char name[400] = {};
    if (std::sscanf(line, "%*s %*s %399s", name) != 1) continue;
    ++symbols;
    EXPECT_EQ(std::strncmp(name, "cu", 2), 0) << "unexpected export " << name;
  }
  if (pclose(nm) != 0 && symbols == 0) GTEST_SKIP() << "nm is not available";
  EXPECT_GT(symbols, 100);
}

TEST_F(FakeCudaTest, OtherProcessesShareTheDeviceMemoryAndAreReaped) {
  ScopedContext ctx(1);
  size_t free0 = 0;
  size_t total = 0;
  ASSERT_EQ(cuMemGetInfo(&free0, &total), CUDA_SUCCESS);
  auto free_now = [] {
    size_t f = 0;
    size_t t = 0;
    EXPECT_EQ(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
    return f;
  };

  // A trainer holding 128 MiB is visible here while it runs; killed, its memory comes back.
  pid_t pid = spawn_trainer(
      {"--device", "1", "--bytes", "128Mi", "--kernels", "1000", "--kernel-us", "10000"});
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(
      eventually([&] { return free_now() == free0 - 128 * kMiB; }, std::chrono::seconds(10)));
  EXPECT_TRUE(
      eventually([] { return snapshot(kUuid1).active_contexts == 1; }, std::chrono::seconds(5)));
  kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(eventually([&] { return free_now() == free0; }, std::chrono::seconds(5)));
  EXPECT_EQ(snapshot(kUuid1).active_contexts, 0u);

  // A trainer that exits without freeing gives its memory back at exit, without waiting for
  // reaping.
  pid = spawn_trainer({"--device", "1", "--bytes", "64Mi", "--managed", "--kernels", "2",
                       "--kernel-us", "1000", "--exit-without-cleanup"});
  ASSERT_GT(pid, 0);
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  fakecuda::DeviceSnapshot s = snapshot(kUuid1);
  EXPECT_EQ(s.memory.free(), free0);
  EXPECT_EQ(s.slots.size(), 1u);  // only this test's context remains

  // A trainer asking for more than the device has reports CUDA_ERROR_OUT_OF_MEMORY and exits 1.
  pid = spawn_trainer({"--device", "1", "--bytes", "1Gi"});
  ASSERT_GT(pid, 0);
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1);
}

}  // namespace
