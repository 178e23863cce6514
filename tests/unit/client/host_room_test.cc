// HostRoom: the host memory a swap-out's copies may use, from a tree of cgroup and proc files.
#include "client/host_room.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "test_support.h"

namespace nvshare::client {
namespace {

constexpr std::uint64_t kMi = std::uint64_t{1} << 20;
constexpr std::uint64_t kGi = std::uint64_t{1} << 30;

class HostRoomTest : public ::testing::Test {
 protected:
  void put(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = std::filesystem::path(dir_.path()) / relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  HostRoomPaths paths() const { return {dir_.path() + "/proc", dir_.path() + "/cgroup"}; }

  testing::TempDir dir_;
};

// A pod's limit in the middle of the hierarchy is what binds, whatever its container's and its
// parent's say; the margin is 5% of that limit (more than 512 MiB).
TEST_F(HostRoomTest, TheTightestCgroupOfThePathBinds) {
  put("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  put("proc/meminfo", "MemTotal: 1000 kB\nMemAvailable:   104857600 kB\n");
  put("cgroup/kubepods/memory.max", "max\n");
  put("cgroup/kubepods/memory.current", std::to_string(50 * kGi));
  put("cgroup/kubepods/pod1/memory.max", std::to_string(32 * kGi) + "\n");
  put("cgroup/kubepods/pod1/memory.current", std::to_string(10 * kGi) + "\n");
  put("cgroup/kubepods/pod1/ctr/memory.max", "max\n");
  put("cgroup/kubepods/pod1/ctr/memory.current", std::to_string(10 * kGi) + "\n");
  const auto margin = static_cast<std::uint64_t>(0.05 * static_cast<double>(32 * kGi));
  EXPECT_EQ(host_room(paths()), 22 * kGi - margin);
}

// cgroup v1's memory controller; a path the container cannot see is read at the root (its own
// cgroup, mounted there without a cgroup namespace); the margin is at least 512 MiB.
TEST_F(HostRoomTest, CgroupV1SeenFromInsideAContainer) {
  put("proc/self/cgroup", "7:cpu,cpuacct:/docker/abc\n5:memory:/docker/abc\n0::/\n");
  put("cgroup/memory/memory.limit_in_bytes", std::to_string(8 * kGi));
  put("cgroup/memory/memory.usage_in_bytes", std::to_string(2 * kGi));
  EXPECT_EQ(host_room(paths()), 6 * kGi - 512 * kMi);
}

// v1 says "no limit" with a huge number: the system's available memory is what is left.
TEST_F(HostRoomTest, NoCgroupLimitLeavesTheSystemsAvailableMemory) {
  put("proc/self/cgroup", "5:memory:/\n");
  put("proc/meminfo", "MemAvailable: 4194304 kB\n");
  put("cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  put("cgroup/memory/memory.usage_in_bytes", std::to_string(2 * kGi));
  EXPECT_EQ(host_room(paths()), 4 * kGi - 512 * kMi);
}

TEST_F(HostRoomTest, AFullCgroupLeavesNoRoom) {
  put("proc/self/cgroup", "0::/\n");
  put("cgroup/memory.max", std::to_string(4 * kGi));
  put("cgroup/memory.current", std::to_string(4 * kGi + 1));
  EXPECT_EQ(host_room(paths()), 0u);
}

// Nothing readable, or nothing parsable, limits nothing.
TEST_F(HostRoomTest, UnknownLimitsAreNoLimits) {
  EXPECT_EQ(host_room(paths()), std::numeric_limits<std::uint64_t>::max());
  put("proc/self/cgroup", "0::/a\n");
  put("cgroup/a/memory.max", "lots\n");
  put("proc/meminfo", "MemFree: 12 kB\n");
  EXPECT_EQ(host_room(paths()), std::numeric_limits<std::uint64_t>::max());
}

TEST(TakeRoom, TakesWhatFitsAndLeavesTheRoomAsItWasOtherwise) {
  std::uint64_t room = 100;
  EXPECT_TRUE(take_room(room, 60));
  EXPECT_EQ(room, 40u);
  EXPECT_FALSE(take_room(room, 41));
  EXPECT_EQ(room, 40u);
  EXPECT_TRUE(take_room(room, 40));
  EXPECT_EQ(room, 0u);
  EXPECT_TRUE(take_room(room, 0));
}

}  // namespace
}  // namespace nvshare::client
