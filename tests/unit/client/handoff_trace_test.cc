// HandoffTrace: one JSON object per line, each field only where the event has it.
#include "client/link/handoff_trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace nvshare::client {
namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(HandoffTrace, WritesEachFieldOnlyWhereTheEventHasIt) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("nvshare-trace-" + std::to_string(::getpid()) + ".jsonl"))
                               .string();
  std::filesystem::remove(path);
  {
    const HandoffTrace trace(path);
    ASSERT_TRUE(trace.enabled());
    trace.record("request", "GPU-1", 3);
    trace.record("release", "GPU-1", 3, 12.5, 4096, 2.25);
    trace.record("pause", "GPU-1", 3, 91.0, -1, -1, 1, 0, 2);
  }
  const std::vector<std::string> lines = lines_of(path);
  std::filesystem::remove(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find("\"event\":\"request\",\"epoch\":3}"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("\"ms\":12.500,\"swap_bytes\":4096,\"swap_ms\":2.250}"),
            std::string::npos)
      << lines[1];
  EXPECT_EQ(lines[1].find("inside"), std::string::npos);
  EXPECT_NE(
      lines[2].find("\"event\":\"pause\",\"epoch\":3,\"ms\":91.000,\"inside\":1,\"waiting\":0,"
                    "\"at_bound\":2}"),
      std::string::npos)
      << lines[2];
}

}  // namespace
}  // namespace nvshare::client
