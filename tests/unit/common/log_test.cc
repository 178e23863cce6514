#include "common/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace nvshare {
namespace {

// Captures what the logger writes to stderr while `body` runs.
template <typename Body>
std::string capture_stderr(Body body) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe(pipe_fds), 0);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(pipe_fds[1], STDERR_FILENO);
  body();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(pipe_fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buf, sizeof buf)) > 0)
    out.append(buf, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  return out;
}

TEST(Log, LevelComesFromTheEnvironment) {
  ::setenv("NVSHARE_LOG_LEVEL", "debug", 1);
  log_init("test");
  EXPECT_EQ(log_level(), LogLevel::kDebug);
  ::setenv("NVSHARE_LOG_LEVEL", "ERROR", 1);
  log_init("test");
  EXPECT_EQ(log_level(), LogLevel::kError);
  ::setenv("NVSHARE_LOG_LEVEL", "nonsense", 1);
  log_init("test");
  EXPECT_EQ(log_level(), LogLevel::kInfo);
  ::unsetenv("NVSHARE_LOG_LEVEL");
  log_init("test");
  EXPECT_EQ(log_level(), LogLevel::kInfo);
}

TEST(Log, LevelNamesAreReadOnceForEveryComponent) {
  EXPECT_EQ(log_level_from_name("trace"), LogLevel::kTrace);
  EXPECT_EQ(log_level_from_name("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(log_level_from_name("warning"), LogLevel::kWarn);
  EXPECT_EQ(log_level_from_name("Warn"), LogLevel::kWarn);
  EXPECT_EQ(log_level_from_name("loud"), std::nullopt);
  EXPECT_EQ(log_level_from_name(""), std::nullopt);
  EXPECT_EQ(log_level_from_name("info "), std::nullopt);
}

TEST(Log, LineHasTimestampComponentPidAndLevel) {
  log_init("nvshare-unit");
  log_set_level(LogLevel::kInfo);
  const std::string out = capture_stderr([] { NVSHARE_WARN("value %d of %s", 42, "x"); });
  // 2026-11-21T18:49:00.123Z nvshare-unit[123] WARN value 42 of x
  ASSERT_GE(out.size(), 25u);
  EXPECT_EQ(out[4], '-');
  EXPECT_EQ(out[10], 'T');
  EXPECT_EQ(out[23], 'Z');
  EXPECT_NE(out.find(" nvshare-unit[" + std::to_string(::getpid()) + "] WARN value 42 of x\n"),
            std::string::npos)
      << out;
}

TEST(Log, RecordsBelowTheLevelAreDropped) {
  log_set_level(LogLevel::kWarn);
  const std::string out = capture_stderr([] {
    NVSHARE_INFO("hidden");
    NVSHARE_DEBUG("hidden");
    NVSHARE_ERROR("shown");
  });
  EXPECT_EQ(out.find("hidden"), std::string::npos);
  EXPECT_NE(out.find("ERROR shown"), std::string::npos);
}

TEST(Log, LongMessagesAreTruncatedToOneLine) {
  log_set_level(LogLevel::kInfo);
  const std::string big(5000, 'a');
  const std::string out = capture_stderr([&] { NVSHARE_INFO("%s", big.c_str()); });
  EXPECT_LT(out.size(), 1300u);
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(out.find('\n'), out.size() - 1);
}

}  // namespace
}  // namespace nvshare
