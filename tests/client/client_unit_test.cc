// In-process tests of libnvshare.so's CUDA-facing half: the memory ledger and the hook table as
// plain code, then the DeviceAgent and the gate's bookkeeping against the simulated driver.
//
// The CUDA-facing objects are linked into this binary (with test_link.cc in place of the
// scheduler-facing half), so the test's own calls to hooked names run our wrappers, exactly as an
// application's calls do under LD_PRELOAD, and the test can drive each GPU's agent as the link
// thread would. The global environment below configures one simulated GPU of 1 GiB with a fast
// swap and a 50 ms drain bound before anything reads the configuration. Tests use deltas, so they
// pass whether ctest runs them one per process or the binary runs them all.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/cuda/device_state.h"
#include "client/cuda/memory_ledger.h"
#include "client/hooks/cuda_api.h"  // first: the versioned driver names
#include "client/hooks/hook_table.h"
#include "driver.h"
#include "shared_state.h"
#include "test_link.h"

namespace nvshare::client {
namespace {

using cuda::AllocationKind;
using cuda::allocations;
using cuda::AllocationTable;
using cuda::MemoryLedger;
using namespace std::chrono_literals;

constexpr std::uint64_t kMiB = 1 << 20;

std::string g_state_path;

class ClientEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    g_state_path = (std::filesystem::temp_directory_path() /
                    ("client_unit_test." + std::to_string(getpid()) + ".state"))
                       .string();
    std::filesystem::remove(g_state_path);
    setenv("NVSHARE_FAKECUDA_STATE", g_state_path.c_str(), 1);
    setenv("NVSHARE_FAKECUDA_DEVICES", "1", 1);
    setenv("NVSHARE_FAKECUDA_MEMORY", "1Gi", 1);
    setenv("NVSHARE_FAKECUDA_SWAP_BW", "8Gi", 1);
    setenv("NVSHARE_DRAIN_BOUND_MS", "50", 1);
    unsetenv("NVSHARE_MEMORY_LIMIT");
    unsetenv("NVSHARE_ENABLE");
  }
  void TearDown() override { std::filesystem::remove(g_state_path); }
};

const ::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new ClientEnvironment);

// ---- The ledger ----

TEST(MemoryLedger, ChargesUpToExactlyTheLimit) {
  MemoryLedger ledger(100);
  EXPECT_TRUE(ledger.try_charge(60));
  EXPECT_FALSE(ledger.try_charge(41));
  EXPECT_EQ(ledger.used(), 60u);
  EXPECT_TRUE(ledger.try_charge(40));
  EXPECT_FALSE(ledger.try_charge(1));
  ledger.refund(100);
  EXPECT_EQ(ledger.used(), 0u);
  EXPECT_FALSE(ledger.try_charge(101));
  ledger.refund(5);  // never below zero
  EXPECT_EQ(ledger.used(), 0u);
  MemoryLedger unlimited;
  EXPECT_TRUE(unlimited.try_charge(std::uint64_t{1} << 62));
}

TEST(MemoryLedger, LowerLimitKeepsWhatIsAllocated) {
  MemoryLedger ledger(100);
  ASSERT_TRUE(ledger.try_charge(80));
  ledger.set_limit(50);
  EXPECT_EQ(ledger.used(), 80u);
  EXPECT_FALSE(ledger.try_charge(1));
  ledger.charge(10);  // the context's own memory is counted whatever the limit
  EXPECT_EQ(ledger.used(), 90u);
  EXPECT_EQ(ledger.view(1000, 1000).total, 50u);
  EXPECT_EQ(ledger.view(1000, 1000).free, 0u);
  ledger.set_limit(0);
  EXPECT_TRUE(ledger.try_charge(1000));
}

TEST(MemoryLedger, ViewIsTheLimitAndNeverMoreThanTheDriverHasFree) {
  EXPECT_EQ(MemoryLedger::view(100, 30, 1000, 1000).total, 100u);
  EXPECT_EQ(MemoryLedger::view(100, 30, 1000, 1000).free, 70u);
  EXPECT_EQ(MemoryLedger::view(100, 30, 20, 1000).free, 20u);  // others hold the GPU
  EXPECT_EQ(MemoryLedger::view(2000, 30, 900, 1000).total, 1000u);
  EXPECT_EQ(MemoryLedger::view(0, 30, 900, 1000).total, 1000u);
  EXPECT_EQ(MemoryLedger::view(0, 30, 900, 1000).free, 900u);
  EXPECT_EQ(MemoryLedger::view(100, 130, 900, 1000).free, 0u);
}

TEST(AllocationTable, RemembersKindsAndFindsManagedRanges) {
  AllocationTable table;
  using Space = AllocationTable::Space;
  table.add(Space::kDeviceAddress, 0x1000, {0, 10, AllocationKind::kManagedFromDevice});
  table.add(Space::kDeviceAddress, 0x2000, {0, 20, AllocationKind::kDevice});
  table.add(Space::kDeviceAddress, 0x3000, {1, 30, AllocationKind::kManaged});
  table.add(Space::kVmmHandle, 0x1000, {0, 40, AllocationKind::kVmm});  // same key, other space
  table.add(Space::kDeviceAddress, 0x4000, {0, 50, AllocationKind::kManaged});
  auto ranges = table.managed_ranges(0);
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0].address, 0x1000u);
  EXPECT_EQ(ranges[1].bytes, 50u);
  EXPECT_EQ(table.bytes(0, AllocationKind::kVmm), 40u);
  ASSERT_TRUE(table.remove(Space::kVmmHandle, 0x1000));
  EXPECT_TRUE(table.find(Space::kDeviceAddress, 0x1000));
  EXPECT_FALSE(table.remove(Space::kVmmHandle, 0x1000));
}

// ---- The hook table ----

TEST(HookTable, EveryNameIsFoundAndEveryFormIsDistinct) {
  std::set<std::string> names;
  std::set<std::tuple<std::string, int, bool>> forms;
  for (std::size_t i = 0; i < hooks::kHookCount; ++i) {
    const hooks::HookInfo& hook = hooks::kHooks[i];
    EXPECT_TRUE(names.insert(hook.name).second) << hook.name << " listed twice";
    EXPECT_TRUE(forms.insert({hook.base, hook.version, hook.per_thread}).second)
        << hook.base << "@" << hook.version << " listed twice";
    auto found = hooks::find_hook(hook.name);
    ASSERT_TRUE(found) << hook.name;
    EXPECT_EQ(static_cast<std::size_t>(*found), i);
    EXPECT_EQ(hook.per_thread, std::string(hook.name).find("_pt") != std::string::npos)
        << hook.name;
  }
  EXPECT_FALSE(hooks::find_hook("cuMemAlloc"));  // the 32-bit form is not hooked
  EXPECT_FALSE(hooks::find_hook("dlsym"));
  EXPECT_GT(hooks::kHookCount, 110u);
}

// What the .def says each form is must match what driver 580 (CUDA 13.0) answered to the CUDA 13
// runtimes' own requests: asked for (base, version, flags), it returned the newest hooked form of
// that base whose version is at most the requested one, per-thread when flags ask for it.
TEST(HookTable, FormsAgreeWithWhatDriver580Returned) {
  std::ifstream in(NVSHARE_CUDA13_REQUESTS);
  ASSERT_TRUE(in.good());
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string field;
    while (std::getline(ss, field, '\t')) f.push_back(field);
    if (f.size() < 5 || f[0] != "cuGetProcAddress_v2") continue;
    auto id = hooks::find_hook(f[4]);
    if (!id) continue;
    const hooks::HookInfo& hook = hooks::info(*id);
    const int version = std::stoi(f[2]);
    const bool per_thread =
        (std::stoull(f[3]) & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    EXPECT_EQ(f[1], hook.base) << f[4];
    EXPECT_LE(hook.version, version) << f[4];
    EXPECT_TRUE(!hook.per_thread || per_thread) << f[4];
    for (const hooks::HookInfo& other : hooks::kHooks) {
      if (&other == &hook || f[1] != other.base || other.per_thread != hook.per_thread) continue;
      EXPECT_FALSE(other.version > hook.version && other.version <= version)
          << other.name << " would be the newer form of " << f[1] << "@" << version;
    }
    ++checked;
  }
  EXPECT_GT(checked, 80);
}

// ---- The agent and the gate, against the simulated driver ----

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
)";

fakecuda::DeviceSnapshot snapshot() {
  static const std::unique_ptr<fakecuda::SharedState> state = [] {
    auto opened = fakecuda::SharedState::open(g_state_path, /*create=*/false);
    EXPECT_TRUE(opened.ok());
    return opened.ok() ? std::move(opened).value() : nullptr;
  }();
  return fakecuda::SimDevice(state->devices().at(0)).snapshot();
}

constexpr std::uint64_t kUnlimitedRoom = std::numeric_limits<std::uint64_t>::max();

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    ASSERT_EQ(cuModuleLoadData(&module_, kPtx), CUDA_SUCCESS);
    ASSERT_EQ(cuModuleGetFunction(&spin_, module_, "spin"), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    device_ = cuda::devices().get(0);
    ASSERT_NE(device_, nullptr);
    link_ = testing::test_link(device_->identity.gpu_uuid);
    ASSERT_NE(link_, nullptr);
    agent_ = link_->agent;
    ASSERT_NE(agent_, nullptr);
  }
  void TearDown() override {
    EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_EQ(cuStreamDestroy_v2(stream_), CUDA_SUCCESS);
    EXPECT_EQ(cuModuleUnload(module_), CUDA_SUCCESS);
  }

  CUresult launch(std::uint64_t ns, CUstream stream) {
    void* params[] = {&ns};
    return cuLaunchKernel(spin_, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr);
  }
  // The number the link gives a submission (DeviceLink::after_submit), for tests that drive a
  // tracker of their own.
  std::uint64_t next_count() { return submissions_.fetch_add(1) + 1; }

  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction spin_ = nullptr;
  CUstream stream_ = nullptr;
  cuda::DeviceState* device_ = nullptr;
  testing::TestLink* link_ = nullptr;
  DeviceAgent* agent_ = nullptr;
  std::atomic<std::uint64_t> submissions_{0};
};

TEST_F(GpuTest, TheContextIsMeasuredWithNvmlAndCounted) {
  // The simulated contexts take no memory of their own here: NVML (the simulated one) says so.
  EXPECT_TRUE(device_->footprint_charged.load());
  EXPECT_EQ(device_->footprint_bytes, 0u);
  EXPECT_EQ(device_->identity.gpu_memory_bytes, 1024 * kMiB);
}

TEST_F(GpuTest, SubmissionsPassTheGateInPairs) {
  const std::uint64_t before = link_->before.load();
  ASSERT_EQ(launch(0, stream_), CUDA_SUCCESS);
  std::uint32_t word = 0;
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD32_v2(p, 7, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH_v2(&word, p, 4), CUDA_SUCCESS);
  EXPECT_EQ(word, 7u);
  EXPECT_EQ(link_->before.load() - before, 3u);  // the allocation is not gated
  EXPECT_EQ(link_->before.load(), link_->after.load());
  // A failing submission still leaves the gate.
  EXPECT_NE(cuLaunchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, stream_, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(link_->before.load(), link_->after.load());
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

// Sets a GPU's memory mode for one test.
class ModeScope {
 public:
  ModeScope(cuda::DeviceState& device, MemoryMode mode)
      : device_(device), saved_(device.memory_mode.exchange(mode)) {}
  ~ModeScope() { device_.memory_mode.store(saved_); }

 private:
  cuda::DeviceState& device_;
  MemoryMode saved_;
};

unsigned pointer_attribute(CUpointer_attribute attribute, CUdeviceptr p) {
  unsigned value = 99;
  if (cuPointerGetAttribute(&value, attribute, p) != CUDA_SUCCESS) return 98;
  return value;
}

TEST_F(GpuTest, DeviceAllocationsAreDeviceMemoryMappedAtAFixedAddress) {
  ASSERT_EQ(device_->memory_mode.load(), MemoryMode::kDevice);
  ASSERT_EQ(device_->backing.granularity(), 2 * kMiB);
  const fakecuda::DeviceSnapshot before = snapshot();
  const std::uint64_t used = device_->ledger.used();
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 64 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(pointer_attribute(CU_POINTER_ATTRIBUTE_IS_MANAGED, p), 0u);
  EXPECT_EQ(pointer_attribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p), CU_MEMORYTYPE_DEVICE);
  EXPECT_EQ(p % (2 * kMiB), 0u);
  const fakecuda::DeviceSnapshot after = snapshot();
  EXPECT_EQ(after.memory.device_bytes - before.memory.device_bytes, 64 * kMiB);
  EXPECT_EQ(after.memory.managed_resident, before.memory.managed_resident);
  EXPECT_EQ(after.migrated_to_device, before.migrated_to_device);
  EXPECT_EQ(device_->ledger.used() - used, 64 * kMiB);
  EXPECT_EQ(allocations().find(AllocationTable::Space::kDeviceAddress, p)->kind,
            AllocationKind::kBacked);

  // Charged what it takes of the GPU: whole pages of the mapping granularity.
  CUdeviceptr odd = 0;
  ASSERT_EQ(cuMemAlloc_v2(&odd, 3 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(device_->ledger.used() - used, 68 * kMiB);
  EXPECT_EQ(snapshot().memory.device_bytes - before.memory.device_bytes, 68 * kMiB);
  // Below the granularity: ordinary device memory, charged as asked.
  CUdeviceptr small = 0;
  ASSERT_EQ(cuMemAlloc_v2(&small, 4096), CUDA_SUCCESS);
  EXPECT_EQ(device_->ledger.used() - used, 68 * kMiB + 4096);
  EXPECT_EQ(allocations().find(AllocationTable::Space::kDeviceAddress, small)->kind,
            AllocationKind::kDevice);

  ASSERT_EQ(cuMemsetD8_v2(p, 0x17, 64 * kMiB), CUDA_SUCCESS);
  unsigned char byte = 0;
  ASSERT_EQ(cuMemcpyDtoH_v2(&byte, p + 64 * kMiB - 1, 1), CUDA_SUCCESS);
  EXPECT_EQ(byte, 0x17);
  for (CUdeviceptr q : {p, odd, small}) EXPECT_EQ(cuMemFree_v2(q), CUDA_SUCCESS);
  EXPECT_EQ(device_->ledger.used(), used);
  EXPECT_EQ(snapshot().memory.device_bytes, before.memory.device_bytes);
}

// The GPU (1 GiB) cannot back a second large allocation beside the first: the second becomes
// managed memory, which the driver pages, instead of failing.
TEST_F(GpuTest, ADeviceBackedAllocationTheGpuCannotBackBecomesManaged) {
  CUdeviceptr big = 0;
  ASSERT_EQ(cuMemAlloc_v2(&big, 768 * kMiB), CUDA_SUCCESS);
  CUdeviceptr more = 0;
  ASSERT_EQ(cuMemAlloc_v2(&more, 512 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(pointer_attribute(CU_POINTER_ATTRIBUTE_IS_MANAGED, big), 0u);
  EXPECT_EQ(pointer_attribute(CU_POINTER_ATTRIBUTE_IS_MANAGED, more), 1u);
  EXPECT_EQ(allocations().find(AllocationTable::Space::kDeviceAddress, more)->bytes, 512 * kMiB);
  EXPECT_EQ(cuMemFree_v2(more), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(big), CUDA_SUCCESS);
}

TEST_F(GpuTest, SwapOutCopiesDeviceBackedMemoryToTheHostAndFreesTheGpu) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 64 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8_v2(p, 0x42, 64 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8_v2(p + 5 * kMiB, 0x24, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  const fakecuda::DeviceSnapshot before = snapshot();

  const std::uint64_t out = agent_->swap_out();
  EXPECT_EQ(out, 64 * kMiB);
  fakecuda::DeviceSnapshot s = snapshot();
  EXPECT_EQ(before.memory.device_bytes - s.memory.device_bytes, 64 * kMiB);
  EXPECT_EQ(s.migrated_to_host, before.migrated_to_host);  // copies, not migrations
  EXPECT_EQ(device_->backing.host_bytes(), 64 * kMiB);
  DeviceUsage usage = agent_->usage();
  EXPECT_EQ(usage.resident_bytes, usage.allocated_bytes - out);
  EXPECT_GT(usage.swap_bytes_per_s, 0u);

  // Allocated while swapped out: only an address until swap_in backs it.
  CUdeviceptr late = 0;
  ASSERT_EQ(cuMemAlloc_v2(&late, 16 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(snapshot().memory.device_bytes, s.memory.device_bytes);

  const std::uint64_t in = agent_->swap_in();
  EXPECT_EQ(in, out + 16 * kMiB);
  s = snapshot();
  EXPECT_EQ(s.memory.device_bytes, before.memory.device_bytes + 16 * kMiB);
  EXPECT_EQ(agent_->usage().resident_bytes, agent_->usage().allocated_bytes);
  // The same pointer, the same contents.
  unsigned char bytes[2] = {};
  ASSERT_EQ(cuMemcpyDtoH_v2(&bytes[0], p + 1234, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoH_v2(&bytes[1], p + 5 * kMiB, 1), CUDA_SUCCESS);
  EXPECT_EQ(bytes[0], 0x42);
  EXPECT_EQ(bytes[1], 0x24);
  ASSERT_EQ(cuMemsetD8_v2(late, 0x01, 16 * kMiB), CUDA_SUCCESS);

  // A second swap reuses the host copies; a free while out gives everything back.
  EXPECT_EQ(agent_->swap_out(), 80 * kMiB);
  EXPECT_EQ(device_->backing.host_bytes(), 80 * kMiB);
  EXPECT_EQ(cuMemFree_v2(late), CUDA_SUCCESS);
  EXPECT_EQ(device_->backing.host_bytes(), 64 * kMiB);
  EXPECT_EQ(agent_->swap_in(), 64 * kMiB);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(device_->backing.host_bytes(), 0u);
  EXPECT_EQ(snapshot().memory.device_bytes, before.memory.device_bytes - 64 * kMiB);
}

// A large allocation is backed in pieces: a swap-out asked for part of the memory moves whole
// pieces until it has that much, not the whole allocation, and the pieces come back with their
// contents at the same addresses; one asked for everything moves the rest.
TEST_F(GpuTest, APartialSwapOutMovesPiecesOfALargeAllocation) {
  const cuda::PieceLayout layout = cuda::piece_layout(512 * kMiB, 2 * kMiB);
  ASSERT_EQ(layout.piece, 128 * kMiB);
  ASSERT_EQ(layout.count(), 4u);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 512 * kMiB), CUDA_SUCCESS);
  for (std::uint64_t i = 0; i < 4; ++i) {
    ASSERT_EQ(cuMemsetD8_v2(p + i * 128 * kMiB, static_cast<unsigned char>(0x10 + i), 128 * kMiB),
              CUDA_SUCCESS);
  }
  // One write across the boundary of the first two pieces: the range is contiguous.
  ASSERT_EQ(cuMemsetD8_v2(p + 128 * kMiB - 2, 0x99, 4), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  cuda::DeviceBacking& backing = device_->backing;
  const fakecuda::DeviceSnapshot before = snapshot();

  EXPECT_EQ(backing.swap_out(stream_, kUnlimitedRoom, 150 * kMiB).bytes, 256 * kMiB);
  EXPECT_EQ(before.memory.device_bytes - snapshot().memory.device_bytes, 256 * kMiB);
  EXPECT_EQ(backing.unbacked_bytes(), 256 * kMiB);
  EXPECT_EQ(backing.host_bytes(), 512 * kMiB) << "one host copy for the whole allocation";
  EXPECT_EQ(backing.swap_out(stream_, kUnlimitedRoom).bytes, 256 * kMiB) << "the rest";
  EXPECT_EQ(backing.unbacked_bytes(), 512 * kMiB);
  EXPECT_EQ(backing.swap_in(stream_).bytes, 512 * kMiB);
  EXPECT_EQ(snapshot().memory.device_bytes, before.memory.device_bytes);

  for (std::uint64_t i = 0; i < 4; ++i) {
    unsigned char first = 0;
    unsigned char last = 0;
    ASSERT_EQ(cuMemcpyDtoH_v2(&first, p + i * 128 * kMiB + 7, 1), CUDA_SUCCESS);
    ASSERT_EQ(cuMemcpyDtoH_v2(&last, p + (i + 1) * 128 * kMiB - 3 - (i == 0 ? 4 : 0), 1),
              CUDA_SUCCESS);
    EXPECT_EQ(first, 0x10 + i) << "piece " << i;
    EXPECT_EQ(last, 0x10 + i) << "piece " << i;
  }
  unsigned char across[4] = {};
  ASSERT_EQ(cuMemcpyDtoH_v2(across, p + 128 * kMiB - 2, 4), CUDA_SUCCESS);
  for (unsigned char byte : across) EXPECT_EQ(byte, 0x99);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(snapshot().memory.device_bytes, before.memory.device_bytes - 512 * kMiB);
  EXPECT_EQ(backing.host_bytes(), 0u);
}

// A host copy is page-locked one lock chunk at a time (a single registration of gigabytes would
// stop the process's other threads for as long as it lasts), and copies cross chunk and piece
// boundaries that do not line up: 600 MiB makes pieces of 150 MiB and chunks of 64 MiB. The copy is
// prepared from a thread of its own, as ahead of an announced swap-out; freeing the allocation
// unlocks every chunk.
TEST_F(GpuTest, AHostCopyIsPageLockedInChunksAndCopiedAcrossThem) {
  constexpr std::uint64_t kBytes = 600 * kMiB;
  ASSERT_EQ(cuda::piece_layout(kBytes, 2 * kMiB).piece, 150 * kMiB);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, kBytes), CUDA_SUCCESS);
  std::vector<unsigned char> pattern(kBytes);
  for (std::uint64_t i = 0; i < kBytes; ++i) pattern[i] = static_cast<unsigned char>(i * 7 / 4099);
  ASSERT_EQ(cuMemcpyHtoD_v2(p, pattern.data(), kBytes), CUDA_SUCCESS);
  cuda::DeviceBacking& backing = device_->backing;
  std::uint64_t prepared = 0;
  std::thread([&] { prepared = backing.prepare_host_copies(kUnlimitedRoom); }).join();
  ASSERT_EQ(prepared, kBytes);

  EXPECT_EQ(backing.swap_out(stream_, kUnlimitedRoom, 200 * kMiB).bytes, 300 * kMiB)
      << "two pieces";
  const auto* host = static_cast<const unsigned char*>(backing.host_copy(p));
  ASSERT_NE(host, nullptr);
  for (std::uint64_t at = 0; at < kBytes; at += cuda::kLockChunk) {
    CUdeviceptr start = 0;
    std::size_t size = 0;
    const auto inside = reinterpret_cast<CUdeviceptr>(host + at + 4097);
    ASSERT_EQ(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inside),
              CUDA_SUCCESS)
        << "chunk at " << at / kMiB << " MiB";
    ASSERT_EQ(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, inside), CUDA_SUCCESS);
    EXPECT_EQ(start, reinterpret_cast<CUdeviceptr>(host + at)) << "its own registration";
    EXPECT_EQ(size, std::min(cuda::kLockChunk, kBytes - at));
  }
  EXPECT_EQ(std::memcmp(host, pattern.data(), 300 * kMiB), 0) << "the moved pieces, in place";
  EXPECT_EQ(backing.swap_out(stream_, kUnlimitedRoom).bytes, 300 * kMiB) << "the rest";
  EXPECT_EQ(backing.swap_in(stream_).bytes, kBytes);
  std::vector<unsigned char> back(kBytes);
  ASSERT_EQ(cuMemcpyDtoH_v2(back.data(), p, kBytes), CUDA_SUCCESS);
  EXPECT_TRUE(back == pattern);

  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  for (std::uint64_t at = 0; at < kBytes; at += cuda::kLockChunk) {
    CUdeviceptr start = 0;
    EXPECT_NE(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                    reinterpret_cast<CUdeviceptr>(host + at)),
              CUDA_SUCCESS)
        << "chunk at " << at / kMiB << " MiB still registered";
  }
}

TEST(PieceLayout, LargeAllocationsAreCutInAtMostFourPiecesOfTheGranularity) {
  using cuda::piece_layout;
  EXPECT_EQ(piece_layout(64 * kMiB, 2 * kMiB).count(), 1u);
  EXPECT_EQ(piece_layout(64 * kMiB, 2 * kMiB).piece, 64 * kMiB);
  EXPECT_EQ(piece_layout(128 * kMiB, 2 * kMiB).count(), 1u) << "no piece below 128 MiB";
  EXPECT_EQ(piece_layout(200 * kMiB, 2 * kMiB).piece, 128 * kMiB);
  EXPECT_EQ(piece_layout(200 * kMiB, 2 * kMiB).count(), 2u);
  EXPECT_EQ(piece_layout(1024 * kMiB, 2 * kMiB).piece, 256 * kMiB);
  EXPECT_EQ(piece_layout(1024 * kMiB, 2 * kMiB).count(), 4u);
  // 1001 MiB: a quarter rounded up to the granularity, the last piece shorter.
  EXPECT_EQ(piece_layout(1001 * kMiB, 2 * kMiB).piece, 252 * kMiB);
  EXPECT_EQ(piece_layout(1001 * kMiB, 2 * kMiB).count(), 4u);
  EXPECT_EQ(piece_layout(3 * 1024 * kMiB, 2 * kMiB).count(), 4u);
  EXPECT_EQ(piece_layout(0, 2 * kMiB).count(), 0u);
}

// Host copies prepared ahead of an announced swap-out (from a thread with no context of its own:
// the primary context is made current for the page-locking) are the ones the swap-out copies
// into; a range freed after its copy was prepared gives the copy back.
TEST_F(GpuTest, PreparedHostCopiesAreTheOnesTheSwapOutUses) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 64 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8_v2(p, 0x5a, 64 * kMiB), CUDA_SUCCESS);
  CUdeviceptr freed = 0;
  ASSERT_EQ(cuMemAlloc_v2(&freed, 8 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);

  std::uint64_t prepared = 0;
  std::thread([&] { prepared = device_->backing.prepare_host_copies(kUnlimitedRoom); }).join();
  EXPECT_EQ(prepared, 72 * kMiB);
  EXPECT_EQ(device_->backing.host_bytes(), 72 * kMiB) << "page-locked in the primary context";
  EXPECT_EQ(device_->backing.prepare_host_copies(kUnlimitedRoom), 0u) << "nothing left to prepare";
  ASSERT_EQ(cuMemFree_v2(freed), CUDA_SUCCESS);
  EXPECT_EQ(device_->backing.host_bytes(), 64 * kMiB);

  EXPECT_EQ(agent_->swap_out(), 64 * kMiB);
  EXPECT_EQ(device_->backing.host_bytes(), 64 * kMiB) << "no second copy was made";
  EXPECT_EQ(agent_->swap_in(), 64 * kMiB);
  unsigned char byte = 0;
  ASSERT_EQ(cuMemcpyDtoH_v2(&byte, p + 4321, 1), CUDA_SUCCESS);
  EXPECT_EQ(byte, 0x5a);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(device_->backing.host_bytes(), 0u);
}

// A swap notice names the swap-out's target: only the copies of the ranges such a swap-out reaches
// (in address order) are prepared, so the swap-out makes none and the ranges it leaves on the GPU
// take no host memory.
TEST_F(GpuTest, APreparationForATargetMakesOnlyTheCopiesItsSwapOutReaches) {
  std::vector<CUdeviceptr> ranges(3);
  for (CUdeviceptr& r : ranges) ASSERT_EQ(cuMemAlloc_v2(&r, 32 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  cuda::DeviceBacking& backing = device_->backing;
  EXPECT_EQ(backing.prepare_host_copies(kUnlimitedRoom, 40 * kMiB), 64 * kMiB)
      << "two ranges reach 40 MiB";
  EXPECT_EQ(backing.prepare_host_copies(kUnlimitedRoom, 40 * kMiB), 0u) << "none left to reach";
  const cuda::BackingSwap swap = backing.swap_out(stream_, kUnlimitedRoom, 40 * kMiB);
  EXPECT_EQ(swap.bytes, 64 * kMiB);
  EXPECT_EQ(swap.host_copies_made, 0u) << "the swap-out found its copies made";
  EXPECT_EQ(backing.host_bytes(), 64 * kMiB) << "the range that stays has none";
  EXPECT_EQ(backing.swap_in(stream_).bytes, 64 * kMiB);
  EXPECT_EQ(backing.prepare_host_copies(kUnlimitedRoom), 32 * kMiB) << "no target: all";
  for (CUdeviceptr r : ranges) EXPECT_EQ(cuMemFree_v2(r), CUDA_SUCCESS);
}

// Host copies are made only within the host room (the memory cgroup's headroom): what does not
// fit stays on the GPU, and is reported as unmovable before any swap-out, so that the scheduler
// never plans a turn that needs it moved.
TEST_F(GpuTest, WhatTheHostRoomCannotHoldStaysOnTheGpu) {
  std::vector<CUdeviceptr> ranges(3);
  for (CUdeviceptr& r : ranges) ASSERT_EQ(cuMemAlloc_v2(&r, 32 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8_v2(ranges[2], 0x77, 32 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  cuda::DeviceBacking& backing = device_->backing;
  EXPECT_EQ(backing.unmovable_bytes(kUnlimitedRoom), 0u);
  EXPECT_EQ(backing.unmovable_bytes(70 * kMiB), 32 * kMiB) << "room for two of the three";
  EXPECT_EQ(backing.prepare_host_copies(40 * kMiB), 32 * kMiB) << "room for one";
  EXPECT_EQ(backing.unmovable_bytes(40 * kMiB), 32 * kMiB) << "one is paid for, one more fits";
  const fakecuda::DeviceSnapshot before = snapshot();
  EXPECT_EQ(backing.swap_out(stream_, 40 * kMiB).bytes, 64 * kMiB);
  EXPECT_EQ(before.memory.device_bytes - snapshot().memory.device_bytes, 64 * kMiB);
  EXPECT_EQ(backing.host_bytes(), 64 * kMiB);
  EXPECT_EQ(backing.swap_in(stream_).bytes, 64 * kMiB);
  unsigned char byte = 0;
  ASSERT_EQ(cuMemcpyDtoH_v2(&byte, ranges[2] + 99, 1), CUDA_SUCCESS);
  EXPECT_EQ(byte, 0x77) << "the range that stayed kept its contents";
  for (CUdeviceptr r : ranges) EXPECT_EQ(cuMemFree_v2(r), CUDA_SUCCESS);
}

// Room: a swap-in with a limit brings back whole ranges in address order while they fit, contents
// intact, and the GPU stays swapped out (the usage says what is back; a new allocation is only
// reserved); the grant's swap-in brings back the rest and the new allocation.
TEST_F(GpuTest, ASwapInIntoRoomBringsBackWhatFitsAndStaysSwappedOut) {
  std::vector<CUdeviceptr> ranges(4);
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    ASSERT_EQ(cuMemAlloc_v2(&ranges[i], 32 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(cuMemsetD8_v2(ranges[i], static_cast<unsigned char>(i + 1), 32 * kMiB), CUDA_SUCCESS);
  }
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(agent_->swap_out(), 4 * 32 * kMiB);
  const std::uint64_t allocated = agent_->usage().allocated_bytes;
  EXPECT_EQ(allocated - agent_->usage().resident_bytes, 4 * 32 * kMiB);
  const fakecuda::DeviceSnapshot out = snapshot();
  EXPECT_EQ(agent_->swap_in(70 * kMiB), 2 * 32 * kMiB) << "two ranges fit in 70Mi";
  EXPECT_EQ(snapshot().memory.device_bytes - out.memory.device_bytes, 2 * 32 * kMiB);
  EXPECT_EQ(allocated - agent_->usage().resident_bytes, 2 * 32 * kMiB);
  EXPECT_TRUE(device_->swapped_out.load());
  CUdeviceptr late = 0;
  ASSERT_EQ(cuMemAlloc_v2(&late, 32 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(snapshot().memory.device_bytes - out.memory.device_bytes, 2 * 32 * kMiB)
      << "allocated while swapped out: reserved only";
  EXPECT_EQ(agent_->swap_in(16 * kMiB), 0u) << "no whole range fits";
  EXPECT_EQ(agent_->swap_in(), 3 * 32 * kMiB) << "the rest and the new allocation";
  EXPECT_FALSE(device_->swapped_out.load());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    unsigned char byte = 0;
    ASSERT_EQ(cuMemcpyDtoH_v2(&byte, ranges[i] + 4321, 1), CUDA_SUCCESS);
    EXPECT_EQ(byte, i + 1);
    EXPECT_EQ(cuMemFree_v2(ranges[i]), CUDA_SUCCESS);
  }
  EXPECT_EQ(cuMemFree_v2(late), CUDA_SUCCESS);
}

// The agent prepares on a thread of its own; a swap-out that comes while it works waits for the
// copy under way and makes the rest itself: every byte moves, and comes back intact.
TEST_F(GpuTest, ASwapOutDuringAPreparationMovesEverything) {
  std::vector<CUdeviceptr> ranges(8);
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    ASSERT_EQ(cuMemAlloc_v2(&ranges[i], 32 * kMiB), CUDA_SUCCESS);
    ASSERT_EQ(cuMemsetD8_v2(ranges[i], static_cast<unsigned char>(i + 1), 32 * kMiB), CUDA_SUCCESS);
  }
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  agent_->prepare_swap_out(0);
  EXPECT_EQ(agent_->swap_out(), 8 * 32 * kMiB);
  EXPECT_EQ(device_->backing.host_bytes(), 8 * 32 * kMiB);
  while (device_->preparing_host_copies.load()) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(device_->backing.host_bytes(), 8 * 32 * kMiB) << "the preparation added nothing";
  EXPECT_EQ(agent_->swap_in(), 8 * 32 * kMiB);
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    unsigned char byte = 0;
    ASSERT_EQ(cuMemcpyDtoH_v2(&byte, ranges[i] + 777, 1), CUDA_SUCCESS);
    EXPECT_EQ(byte, i + 1);
    EXPECT_EQ(cuMemFree_v2(ranges[i]), CUDA_SUCCESS);
  }
  EXPECT_EQ(device_->backing.host_bytes(), 0u);
}

// Managed memory prefetched to the host is host memory too: a swap-out moves only the managed
// ranges that fit in the host room (in address order) and reports the rest as staying on the GPU,
// before the swap-out and while swapped out.
TEST_F(GpuTest, InTheUnifiedModeManagedMemoryBeyondTheHostRoomStaysOnTheGpu) {
  const ModeScope unified(*device_, MemoryMode::kUnified);
  struct RoomScope {
    explicit RoomScope(cuda::GpuAgent& agent) : agent(agent) {
      agent.set_host_room_source([] { return std::uint64_t{40} * kMiB; });
    }
    ~RoomScope() { agent.set_host_room_source(nullptr); }
    cuda::GpuAgent& agent;
  } room(device_->agent);
  std::vector<CUdeviceptr> ranges(2);
  for (CUdeviceptr& r : ranges) ASSERT_EQ(cuMemAlloc_v2(&r, 32 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8_v2(ranges[1], 0x5a, 32 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(agent_->usage().pinned_bytes, 32 * kMiB) << "room for one of the two";
  const fakecuda::DeviceSnapshot before = snapshot();

  EXPECT_EQ(agent_->swap_out(), 32 * kMiB);
  const fakecuda::DeviceSnapshot s = snapshot();
  EXPECT_EQ(s.migrated_to_host - before.migrated_to_host, 32 * kMiB);
  EXPECT_EQ(s.memory.managed_resident, before.memory.managed_resident - 32 * kMiB);
  const DeviceUsage usage = agent_->usage();
  EXPECT_EQ(usage.pinned_bytes, 32 * kMiB) << "what the swap-out left";
  EXPECT_EQ(usage.resident_bytes, usage.allocated_bytes - 32 * kMiB);

  EXPECT_GE(agent_->swap_in(), 32 * kMiB);
  unsigned char byte = 0;
  ASSERT_EQ(cuMemcpyDtoH_v2(&byte, ranges[1] + 4321, 1), CUDA_SUCCESS);
  EXPECT_EQ(byte, 0x5a) << "the range that stayed kept its contents";
  for (CUdeviceptr r : ranges) EXPECT_EQ(cuMemFree_v2(r), CUDA_SUCCESS);
}

TEST_F(GpuTest, InTheUnifiedModeDeviceAllocationsBecomeManagedOnTheDevice) {
  const ModeScope unified(*device_, MemoryMode::kUnified);
  const fakecuda::DeviceSnapshot before = snapshot();
  const std::uint64_t reports = link_->usage_reports.load();
  const std::uint64_t used = device_->ledger.used();
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 64 * kMiB), CUDA_SUCCESS);
  unsigned managed = 0;
  ASSERT_EQ(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p), CUDA_SUCCESS);
  EXPECT_EQ(managed, 1u);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  const fakecuda::DeviceSnapshot after = snapshot();
  EXPECT_EQ(after.memory.managed_resident - before.memory.managed_resident, 64 * kMiB);
  EXPECT_EQ(after.memory.device_bytes, before.memory.device_bytes);
  EXPECT_EQ(after.migrated_to_device - before.migrated_to_device, 64 * kMiB);  // prefetched
  EXPECT_EQ(device_->ledger.used() - used, 64 * kMiB);
  EXPECT_GT(link_->usage_reports.load(), reports);
  EXPECT_EQ(agent_->usage().allocated_bytes, device_->ledger.used());
  ASSERT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(device_->ledger.used(), used);
}

TEST_F(GpuTest, InTheUnifiedModeSwapOutMovesManagedMemoryToTheHostAndBack) {
  const ModeScope unified(*device_, MemoryMode::kUnified);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 64 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8_v2(p, 0x42, 64 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  const fakecuda::DeviceSnapshot before = snapshot();

  const std::uint64_t out = agent_->swap_out();
  EXPECT_GE(out, 64 * kMiB);
  fakecuda::DeviceSnapshot s = snapshot();
  EXPECT_EQ(s.migrated_to_host - before.migrated_to_host, out);
  EXPECT_EQ(s.memory.managed_resident, before.memory.managed_resident - out);
  DeviceUsage usage = agent_->usage();
  EXPECT_EQ(usage.resident_bytes, usage.allocated_bytes - out);
  EXPECT_GT(usage.swap_bytes_per_s, 0u);

  // Allocated while swapped out: stays on the host until swap_in brings it with the rest.
  CUdeviceptr late = 0;
  ASSERT_EQ(cuMemAlloc_v2(&late, 16 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(snapshot().memory.managed_resident, s.memory.managed_resident);
  EXPECT_EQ(agent_->usage().resident_bytes, usage.resident_bytes);

  const std::uint64_t in = agent_->swap_in();
  EXPECT_EQ(in, out + 16 * kMiB);
  s = snapshot();
  EXPECT_EQ(s.memory.managed_resident, before.memory.managed_resident + 16 * kMiB);
  EXPECT_EQ(agent_->usage().resident_bytes, agent_->usage().allocated_bytes);
  unsigned char byte = 0;
  ASSERT_EQ(cuMemcpyDtoH_v2(&byte, p + 1234, 1), CUDA_SUCCESS);
  EXPECT_EQ(byte, 0x42);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(late), CUDA_SUCCESS);
}

TEST_F(GpuTest, DrainWaitsForQueuedWork) {
  ASSERT_EQ(launch(200'000'000, stream_), CUDA_SUCCESS);
  const auto start = std::chrono::steady_clock::now();
  const Duration waited = agent_->drain();
  const auto wall = std::chrono::steady_clock::now() - start;
  EXPECT_GE(wall, 150ms);
  EXPECT_GE(waited, 150ms);
  EXPECT_EQ(cuStreamQuery(stream_), CUDA_SUCCESS);
}

// 200 kernels of 5 ms (1 s of GPU time) submitted as fast as possible: the bound keeps about
// 50 ms queued, so the submitting thread is held back and a drain at the end is short.
TEST_F(GpuTest, DrainBoundKeepsQueuedWorkNearTheBound) {
  const cuda::TrackerStats before = device_->tracker.stats();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) ASSERT_EQ(launch(5'000'000, stream_), CUDA_SUCCESS);
  const auto submitted = std::chrono::steady_clock::now() - start;
  const Duration drained = agent_->drain();
  const cuda::TrackerStats after = device_->tracker.stats();
  EXPECT_GT(after.bound_waits, before.bound_waits);
  EXPECT_NEAR(after.gpu_ns_per_submission, 5e6, 1e6);
  EXPECT_GE(submitted, 700ms) << "the submitting thread was not held back";
  EXPECT_LT(drained, 150ms) << "queued work at the end was not bounded";
}

// Graph replays are bounded by their own learnt length, not by the per-submission time learnt from
// other work: after short kernels (0.2 ms each) taught the tracker that a submission is short, 20
// replays of a graph of ten 10 ms kernels (2 s of GPU time) submitted as fast as possible still
// leave about the bound plus one replay queued.
TEST_F(GpuTest, DrainBoundHoldsForReplaysOfALongGraph) {
  for (int i = 0; i < 400; ++i) ASSERT_EQ(launch(200'000, stream_), CUDA_SUCCESS);
  agent_->drain();
  const cuda::TrackerStats taught = device_->tracker.stats();
  ASSERT_GT(taught.gpu_ns_per_submission, 0);
  ASSERT_LT(taught.gpu_ns_per_submission, 1e6) << "short kernels did not teach a short tau";

  ASSERT_EQ(cuStreamBeginCapture_v2(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(launch(10'000'000, stream_), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  ASSERT_EQ(cuStreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);

  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) ASSERT_EQ(cuGraphLaunch(exec, stream_), CUDA_SUCCESS);
  const auto submitted = std::chrono::steady_clock::now() - start;
  const Duration drained = agent_->drain();
  const cuda::TrackerStats after = device_->tracker.stats();
  EXPECT_EQ(after.graph_replays, taught.graph_replays + 20);
  EXPECT_GT(after.graphs_measured, 0u);
  EXPECT_GT(after.bound_waits, taught.bound_waits);
  EXPECT_GE(submitted, 1500ms) << "the replays were queued without bound";
  EXPECT_LT(drained, 250ms) << "queued replays at the end were not bounded";
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
}

// Kernels that become long after short ones taught a short tau: the link thread's idle checks
// (every 20 ms here) find a marker older than the bound still pending and make the next submission
// wait for it, so 150 kernels of 10 ms (1.5 s of GPU time), launched a millisecond apart, do not
// all queue before the estimate catches up (without the check they would: 150 is under
// kMarkerEvery).
TEST_F(GpuTest, DrainBoundHoldsWhenKernelsBecomeLong) {
  for (int i = 0; i < 400; ++i) ASSERT_EQ(launch(200'000, stream_), CUDA_SUCCESS);
  agent_->drain();
  ASSERT_LT(device_->tracker.stats().gpu_ns_per_submission, 1e6);
  const Duration waited_before = device_->tracker.bound_waited();

  std::atomic<bool> done{false};
  std::thread link([&] {
    while (!done.load()) {
      agent_->idle_for();
      std::this_thread::sleep_for(20ms);
    }
  });
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 150; ++i) {
    ASSERT_EQ(launch(10'000'000, stream_), CUDA_SUCCESS);
    std::this_thread::sleep_for(1ms);
  }
  const auto submitted = std::chrono::steady_clock::now() - start;
  done = true;
  link.join();
  const Duration drained = agent_->drain();
  // Without the idle check's correction: submitted in about 0.16 s, 1.3 s left to drain, no wait
  // at the bound. The margins leave room for a loaded machine (the simulated GPU slows too).
  EXPECT_GE(submitted, 500ms) << "the long kernels were queued without bound";
  EXPECT_LT(drained, 1000ms) << "queued work at the end was not bounded";
  EXPECT_GT(device_->tracker.stats().gpu_ns_per_submission, 2e6) << "tau was not relearnt";
  EXPECT_GE(device_->tracker.bound_waited() - waited_before, 300ms)
      << "the submitting thread's waits are the pace the scheduler is told";
}

// Start-up kernels (tiny) teach a small tau, then the loop's long kernels come back to back from
// a thread that never synchronizes (a PyTorch job after its warm-up). The spacing tau would fit
// (hundreds of submissions) must not be used before tau is confirmed: the long kernels would all
// queue at CPU speed, long before an idle check could notice (all 100 queued at once here).
TEST_F(GpuTest, DrainBoundHoldsForLongKernelsAfterTinyStartUpKernels) {
  for (int i = 0; i < 4; ++i) ASSERT_EQ(launch(10'000, stream_), CUDA_SUCCESS);
  ASSERT_EQ(launch(20'000'000, stream_), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread loop([&] {
    if (cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) return;
    while (!stop.load() && sent.load() < 100) {
      if (launch(20'000'000, stream_) != CUDA_SUCCESS) return;
      sent++;
    }
  });
  std::this_thread::sleep_for(300ms);
  stop = true;
  loop.join();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  const auto drained = std::chrono::steady_clock::now() - t0;
  // Without the confirmation: all 100 kernels (2 s) queued at once, about 1.7 s left to drain.
  // Bounded, what is queued stays near the 50 ms bound; the margin leaves room for a loaded
  // machine.
  EXPECT_LT(drained, 700ms) << sent.load() << " kernels of 20 ms sent in 300 ms";
  EXPECT_LT(sent.load(), 60) << device_->tracker.stats().markers << " markers, "
                             << device_->tracker.stats().bound_waits << " waits";
  EXPECT_GT(device_->tracker.stats().gpu_ns_per_submission, 5e6) << "tau was not relearnt";
}

// A trusted time stays trusted after a lesson over a short span that found the work longer (another
// context's time slice): that must not let work that really became longer pile up. Short kernels
// (0.1 ms) queued far ahead make tau trusted; then kernels 20 times longer come back to back from a
// thread that never synchronizes, with no idle period between. Their first lesson covers what was
// queued meanwhile, more than a quarter of the bound, so it disagrees as any lesson did: what is
// queued stays near the bound.
TEST_F(GpuTest, KernelsThatBecomeLongerWithoutAPauseStayBounded) {
  for (int i = 0; i < 3000; ++i) ASSERT_EQ(launch(100'000, stream_), CUDA_SUCCESS);
  ASSERT_TRUE(device_->tracker.stats().tau_trusted);
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread loop([&] {
    if (cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) return;
    while (!stop.load() && sent.load() < 2000) {
      if (launch(2'000'000, stream_) != CUDA_SUCCESS) return;
      sent++;
    }
  });
  std::this_thread::sleep_for(600ms);
  stop = true;
  loop.join();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  const auto drained = std::chrono::steady_clock::now() - t0;
  // Unbounded, a marker every 250 submissions by the old tau: 0.5 s of the long kernels per marker
  // queued at CPU speed. The margin leaves room for a loaded machine.
  EXPECT_LT(drained, 300ms) << sent.load() << " kernels of 2 ms sent in 600 ms, "
                            << device_->tracker.stats().disagreements << " lessons disagreed";
  EXPECT_GT(device_->tracker.stats().disagreements, 0u);
}

// The start-up of a compute-bound job (PyTorch's `randn`s, one warm-up matmul, a synchronize, a
// pause until the job's loop starts), then its loop queueing 20 ms kernels at CPU speed. The
// synchronize completes every marker, which says nothing of how long the loop's kernels are: a
// marker spacing widened on that evidence let the first wait come after a dozen long kernels (on an
// H200 the first revoke of two such jobs drained 521 ms, and the pace that tells saturating jobs
// apart showed nothing for their first half second). Once the link thread has seen the process
// idle, markers start dense again: the loop waits from its second kernel on.
TEST_F(GpuTest, ASynchronizeIsNoEvidenceThatTheNextKernelsAreShort) {
  for (int i = 0; i < 3; ++i) ASSERT_EQ(launch(10'000, stream_), CUDA_SUCCESS);
  ASSERT_EQ(launch(20'000'000, stream_), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  // The pause, with the idle checks the link thread makes while it holds a grant.
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(50ms);
    agent_->idle_for();
  }
  const std::uint64_t waits_before = device_->tracker.stats().bound_waits;
  std::atomic<int> sent{0};
  std::thread loop([&] {
    if (cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) return;
    while (device_->tracker.stats().bound_waits == waits_before && sent.load() < 100) {
      if (launch(20'000'000, stream_) != CUDA_SUCCESS) return;
      sent++;
    }
  });
  loop.join();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  const auto drained = std::chrono::steady_clock::now() - t0;
  EXPECT_LE(sent.load(), 2) << "kernels of 20 ms queued before the first wait; tau "
                            << device_->tracker.stats().gpu_ns_per_submission << " ns, "
                            << device_->tracker.stats().markers << " markers";
  // Two or three kernels of 20 ms; the margin leaves room for a loaded machine.
  EXPECT_LT(drained, 150ms);
}

// A service: each step queues a forward pass of 30 short kernels (0.1 ms), synchronizes, and idles
// 20 ms (the link thread sees it idle). Its markers start dense after every idle period and it may
// wait for some of them, but it never has more than the bound queued: none of that is the pace
// that would make the scheduler take it for a trainer that queues ahead.
TEST_F(GpuTest, AServicesCautiousWaitsAreNotItsPace) {
  const Duration waited_before = device_->tracker.bound_waited();
  const std::uint64_t waits_before = device_->tracker.stats().bound_waits;
  for (int step = 0; step < 20; ++step) {
    for (int i = 0; i < 30; ++i) ASSERT_EQ(launch(100'000, stream_), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
    std::this_thread::sleep_for(10ms);
    agent_->idle_for();
    std::this_thread::sleep_for(10ms);
    agent_->idle_for();
  }
  EXPECT_GT(device_->tracker.stats().bound_waits, waits_before) << "no cautious wait to discount";
  EXPECT_EQ(device_->tracker.bound_waited(), waited_before);
}

// A service beside a trainer under the GPU's time-slicing: each step queues 30 short kernels (0.1
// ms) and synchronizes, and the GPU runs the other context's slice (2.5 ms here; about 2.4 ms per
// step on an H100) as the step begins, which a wait measures as if the service's own kernels had
// taken it. A span that long is no threat to the bound, whatever made it long: it must neither
// undo tau's trust nor bring markers back to one per kernel, or the service waits mid-step (each
// such wait can cost it a slice) for as long as the two contexts share the GPU. With dense markers
// after every such lesson an H100 service lost its first two seconds beside a trainer (p99 7x).
TEST_F(GpuTest, AnotherContextsTimeSliceIsNoLongerKernels) {
  cuda::WorkTracker tracker(50ms, SteadyClock::instance());
  tracker.note_context(ctx_);
  // The driver's own launch: only this tracker may hold the service back.
  const auto real_launch = hooks::real<hooks::HookId::cuLaunchKernel>();
  ASSERT_NE(real_launch, nullptr);
  const auto spin = [&](std::uint64_t ns) {
    void* params[] = {&ns};
    return real_launch(spin_, 1, 1, 1, 32, 1, 1, 0, stream_, params, nullptr);
  };
  std::uint64_t waits_after_warmup = 0;
  // 100 steps: on a loaded host a wake-up's delay can put a slice in a few more spans, and trust
  // needs three lessons that agree.
  for (int step = 0; step < 100; ++step) {
    if (step == 20) waits_after_warmup = tracker.stats().bound_waits;
    const int slice_at = static_cast<int>((step * 7919) % 30);
    for (int i = 0; i < 30; ++i) {
      if (i == slice_at) ASSERT_EQ(spin(2'500'000), CUDA_SUCCESS);  // the other context's slice
      ASSERT_EQ(spin(100'000), CUDA_SUCCESS);
      tracker.submitted(ctx_, stream_, next_count());
    }
    ASSERT_EQ(cuStreamSynchronize(stream_), CUDA_SUCCESS);
  }
  const cuda::TrackerStats stats = tracker.stats();
  EXPECT_EQ(stats.disagreements, 0u) << stats.lessons << " lessons";
  EXPECT_TRUE(stats.tau_trusted) << "tau " << stats.gpu_ns_per_submission << " ns";
  EXPECT_EQ(stats.bound_waits - waits_after_warmup, 0u)
      << stats.bound_waits << " waits in all, " << stats.markers << " markers, tau "
      << stats.gpu_ns_per_submission << " ns";
}

// GPU-bound work of short kernels (0.1 ms, queued far ahead): its waits agree with the estimate
// (within a factor of two, or within the slack a wake-up takes on a real GPU), so tau becomes
// trusted and the queue may grow to the bound instead of staying at two markers of a few kernels.
TEST_F(GpuTest, ShortKernelsQueuedAheadGetATrustedTime) {
  for (int i = 0; i < 3000; ++i) ASSERT_EQ(launch(100'000, stream_), CUDA_SUCCESS);
  const cuda::TrackerStats stats = device_->tracker.stats();
  EXPECT_TRUE(stats.tau_trusted) << stats.bound_waits << " waits, tau "
                                 << stats.gpu_ns_per_submission << " ns";
  EXPECT_GT(stats.gpu_ns_per_submission, 50'000);
  EXPECT_LT(stats.gpu_ns_per_submission, 400'000);
}

// A thread waiting at the drain bound polls its marker; once the marker completes, another thread
// may see it complete (the link thread's idle checks, another submitting thread) before the
// waiter's next look. The tracker reuses completed marker events, but never one a thread still
// waits for: recorded again, it would make the waiter wait for the newer work (on an H200 it slept
// on with the GPU idle). Here a second thread submits and a third looks for idleness as the link
// thread does, every 2 ms, while the first waits at the bound again and again.
TEST_F(GpuTest, AMarkerAThreadWaitsForIsNeverRecordedAgain) {
  cuda::WorkTracker tracker(20ms, SteadyClock::instance());
  tracker.note_context(ctx_);
  const auto real_launch = hooks::real<hooks::HookId::cuLaunchKernel>();
  ASSERT_NE(real_launch, nullptr);
  const auto spin = [&](CUstream stream, std::uint64_t ns) {
    void* params[] = {&ns};
    return real_launch(spin_, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr);
  };
  CUstream other = nullptr;
  ASSERT_EQ(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  const unsigned long long rerecorded_before = cuFakeRecordsWhileAwaited();
  std::atomic<bool> stop{false};
  std::thread looker([&] {
    while (!stop.load()) {
      tracker.idle_for();
      std::this_thread::sleep_for(2ms);
    }
  });
  std::thread second([&] {
    if (cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) return;
    while (!stop.load()) {
      if (spin(other, 50'000) == CUDA_SUCCESS) tracker.submitted(ctx_, other, next_count());
      std::this_thread::sleep_for(200us);
    }
  });
  for (int i = 0; i < 150; ++i) {
    ASSERT_EQ(spin(stream_, 2'000'000), CUDA_SUCCESS);
    tracker.submitted(ctx_, stream_, next_count());
  }
  stop.store(true);
  looker.join();
  second.join();
  EXPECT_EQ(cuStreamSynchronize(other), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(other), CUDA_SUCCESS);
  EXPECT_GT(tracker.stats().bound_waits, 10u);
  EXPECT_EQ(cuFakeRecordsWhileAwaited() - rerecorded_before, 0u);
}

// A thread waiting for the drain bound is counted there for as long as it waits (the link does not
// take that stretch for a pause of the process: grant_session.h, kNoticedIdle), and its wait ends
// when its marker completes: the tracker polls the marker, so a driver that wakes a thread blocked
// on an event late (here 200 ms; on an H200 such wakes came 90-110 ms after the work was done)
// never leaves the GPU idle while the thread sleeps on.
TEST_F(GpuTest, AWaitAtTheDrainBoundEndsWhenItsMarkerCompletes) {
  cuda::WorkTracker tracker(5ms, SteadyClock::instance());
  tracker.note_context(ctx_);
  const auto real_launch = hooks::real<hooks::HookId::cuLaunchKernel>();
  ASSERT_NE(real_launch, nullptr);
  cuFakeSetBlockingWakeNs(200'000'000);
  std::atomic<bool> done{false};
  std::thread submitter([&] {
    if (cuCtxSetCurrent(ctx_) == CUDA_SUCCESS) {
      for (int i = 0; i < 10; ++i) {
        std::uint64_t ns = 10'000'000;
        void* params[] = {&ns};
        if (real_launch(spin_, 1, 1, 1, 32, 1, 1, 0, stream_, params, nullptr) == CUDA_SUCCESS) {
          tracker.submitted(ctx_, stream_, next_count());
        }
      }
    }
    done.store(true);
  });
  bool at_bound = false;                     // the thread seen waiting at the bound
  Duration longest_idle = Duration::zero();  // the GPU idle while it waited
  while (!done.load()) {
    if (tracker.threads_at_bound() == 1) {
      at_bound = true;
      const Duration idle = tracker.idle_for();
      if (tracker.threads_at_bound() == 1) longest_idle = std::max(longest_idle, idle);
    }
    std::this_thread::sleep_for(1ms);
  }
  submitter.join();
  cuFakeSetBlockingWakeNs(0);
  EXPECT_TRUE(at_bound);
  EXPECT_LT(longest_idle, 100ms) << "a wait outlived its marker";
  EXPECT_GT(tracker.stats().bound_waits, 0u);
  EXPECT_EQ(tracker.threads_at_bound(), 0u);
}

// A revoke can come before any submitting thread has waited at the bound (a capped client's first
// run is a few tens of milliseconds): the drain's synchronization is then the first measurement.
// Without it a process whose grants always end inside its first long kernel never learnt tau, its
// unmeasured marker spacing doubled at every grant, and a 30% cap on 100 ms kernels gave 45%.
TEST_F(GpuTest, ADrainTeachesWhatASubmissionTakes) {
  cuda::WorkTracker tracker(50ms, SteadyClock::instance());
  tracker.note_context(ctx_);
  ASSERT_EQ(launch(100'000'000, stream_), CUDA_SUCCESS);
  tracker.submitted(ctx_, stream_, next_count());
  ASSERT_EQ(tracker.stats().gpu_ns_per_submission, 0);
  tracker.drain();
  // 100 ms; the margins leave room for a loaded machine.
  EXPECT_GT(tracker.stats().gpu_ns_per_submission, 60e6);
  EXPECT_LT(tracker.stats().gpu_ns_per_submission, 400e6);
}

// What the library logs at exit never waits for a tracker another thread holds: a drain holds it
// for as long as the GPU takes to finish what is queued.
TEST_F(GpuTest, StatsIfFreeNeverWaitsForADrain) {
  cuda::WorkTracker tracker(50ms, SteadyClock::instance());
  tracker.note_context(ctx_);
  ASSERT_EQ(launch(1'000'000'000, stream_), CUDA_SUCCESS);
  tracker.submitted(ctx_, stream_, next_count());
  std::thread drain([&] {
    if (cuCtxSetCurrent(ctx_) == CUDA_SUCCESS) tracker.drain();
  });
  std::this_thread::sleep_for(100ms);  // the drain is synchronizing now, for most of a second
  // A call that waited would return the figures once the drain is over.
  EXPECT_FALSE(tracker.stats_if_free().has_value());
  drain.join();
  const std::optional<cuda::TrackerStats> after = tracker.stats_if_free();
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->submissions, 1u);
}

TEST_F(GpuTest, IdleOnlyWhenAllWorkIsComplete) {
  ASSERT_EQ(launch(100'000'000, stream_), CUDA_SUCCESS);
  EXPECT_EQ(agent_->idle_for(), Duration::zero());  // marks the work submitted since the last look
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(agent_->idle_for(), Duration::zero());  // the kernel still runs
  std::this_thread::sleep_for(120ms);
  const Duration first = agent_->idle_for();
  std::this_thread::sleep_for(20ms);
  const Duration second = agent_->idle_for();
  EXPECT_GE(second, first);
  EXPECT_GE(second, 15ms);
  ASSERT_EQ(launch(0, stream_), CUDA_SUCCESS);
  EXPECT_EQ(agent_->idle_for(), Duration::zero());  // a new submission: active again
}

// The simulated driver invalidates a capture when its context is synchronized or a context-wide
// event is recorded during it, so a capture that ends cleanly proves neither happened; and a
// drain asked for during the capture waits for it to end.
TEST_F(GpuTest, NothingSynchronizesOrRecordsIntoAnOpenCapture) {
  ASSERT_EQ(cuStreamBeginCapture_v2(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  EXPECT_TRUE(device_->tracker.capturing());
  for (int i = 0; i < 40; ++i) ASSERT_EQ(launch(1'000'000, stream_), CUDA_SUCCESS);
  EXPECT_EQ(agent_->idle_for(), Duration::zero());
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    agent_->drain();
    drained = true;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(drained.load()) << "drain did not wait for the capture";
  CUgraph graph = nullptr;
  ASSERT_EQ(cuStreamEndCapture(stream_, &graph), CUDA_SUCCESS) << "the capture was invalidated";
  drainer.join();
  EXPECT_TRUE(drained.load());
  EXPECT_FALSE(device_->tracker.capturing());
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphLaunch(exec, stream_), CUDA_SUCCESS);
  EXPECT_GE(agent_->drain(), 30ms);  // the graph's 40 ms of kernels
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
}

TEST_F(GpuTest, LowerLimitFailsLaterAllocationsOnly) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 64 * kMiB), CUDA_SUCCESS);
  const std::uint64_t used = device_->ledger.used();
  agent_->apply_limits(protocol::Limits{32 * kMiB, 100});
  ASSERT_EQ(cuMemsetD8_v2(p, 1, 64 * kMiB), CUDA_SUCCESS);  // still there
  CUdeviceptr q = 0;
  EXPECT_EQ(cuMemAlloc_v2(&q, 1), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cuMemAllocManaged(&q, 1, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_OUT_OF_MEMORY);
  size_t free = 1;
  size_t total = 0;
  ASSERT_EQ(cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 32 * kMiB);
  EXPECT_EQ(free, 0u);
  size_t device_total = 0;
  ASSERT_EQ(cuDeviceTotalMem_v2(&device_total, 0), CUDA_SUCCESS);
  EXPECT_EQ(device_total, 32 * kMiB);
  EXPECT_EQ(agent_->usage().allocated_bytes, used);
  agent_->apply_limits(protocol::Limits{0, 100});
  EXPECT_EQ(cuMemAlloc_v2(&q, 1), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(q), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

// A low client holds its queued work to the short drain bound, so a higher class gets the GPU
// quickly; another class brings the configured bound back.
TEST_F(GpuTest, ALowClassShortensTheDrainBound) {
  const Duration configured = device_->tracker.drain_bound();
  ASSERT_GT(configured, cuda::kLowDrainBound);
  protocol::Limits limits;
  limits.priority = protocol::priority_code(Priority::kLow);
  agent_->apply_limits(limits);
  EXPECT_EQ(device_->tracker.drain_bound(), cuda::kLowDrainBound);
  limits.priority = protocol::priority_code(Priority::kHigh);
  agent_->apply_limits(limits);
  EXPECT_EQ(device_->tracker.drain_bound(), configured);
  limits.priority = protocol::Limits::kNoPriority;
  agent_->apply_limits(limits);
  EXPECT_EQ(device_->tracker.drain_bound(), configured);
}

TEST_F(GpuTest, DestroyedContextsAreForgotten) {
  const std::uint64_t contexts = device_->tracker.stats().contexts;
  CUcontext extra = nullptr;
  ASSERT_EQ(cuCtxCreate_v4(&extra, nullptr, 0, 0), CUDA_SUCCESS);
  CUmodule module = nullptr;
  CUfunction spin = nullptr;
  ASSERT_EQ(cuModuleLoadData(&module, kPtx), CUDA_SUCCESS);
  ASSERT_EQ(cuModuleGetFunction(&spin, module, "spin"), CUDA_SUCCESS);
  std::uint64_t ns = 1'000'000;
  void* params[] = {&ns};
  for (int i = 0; i < 40; ++i) {
    ASSERT_EQ(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr), CUDA_SUCCESS);
  }
  EXPECT_EQ(device_->tracker.stats().contexts, contexts + 1);
  ASSERT_EQ(cuCtxDestroy_v2(extra), CUDA_SUCCESS);
  EXPECT_EQ(device_->tracker.stats().contexts, contexts);
  ASSERT_EQ(cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  agent_->drain();
  agent_->idle_for();
  ASSERT_EQ(launch(0, stream_), CUDA_SUCCESS);
}

TEST_F(GpuTest, AForkedChildStartsClean) {
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, kMiB), CUDA_SUCCESS);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The parent's devices are not the child's: nothing registered, nothing charged, and CUDA
    // calls answer (the driver refuses them in a forked child) without hanging.
    int failures = 0;
    if (cuda::devices().find(0) != nullptr) ++failures;
    size_t free = 0;
    size_t total = 0;
    if (cuMemGetInfo_v2(&free, &total) == CUDA_SUCCESS) ++failures;
    if (launch(0, stream_) == CUDA_SUCCESS) ++failures;
    if (cuMemFree_v2(p) == CUDA_SUCCESS) ++failures;
    _exit(failures);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

}  // namespace
}  // namespace nvshare::client
