#include "common/log.h"

#include <strings.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace nvshare {
namespace {

constexpr int kUnset = -1;
std::atomic<int> g_level{kUnset};
char g_component[48] = "nvshare";

int level_from_env() {
  // Read here, not through a knob table: logging works before any table is parsed (the library
  // logs from its first hooked call). The knob itself is defined once in common/shared_knobs.h.
  const char* value = std::getenv("NVSHARE_LOG_LEVEL");
  const std::optional<LogLevel> level =
      value == nullptr ? std::nullopt : log_level_from_name(value);
  return static_cast<int>(level.value_or(LogLevel::kInfo));
}

int current_level() {
  int level = g_level.load(std::memory_order_relaxed);
  if (level == kUnset) {
    level = level_from_env();
    g_level.store(level, std::memory_order_relaxed);
  }
  return level;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kTrace:
      return "TRACE";
  }
  return "?";
}

}  // namespace

std::optional<LogLevel> log_level_from_name(std::string_view name) {
  static constexpr std::string_view kNames[] = {"error", "warn", "info", "debug", "trace"};
  const auto same = [name](std::string_view word) {
    return name.size() == word.size() && strncasecmp(name.data(), word.data(), word.size()) == 0;
  };
  for (int i = 0; i < 5; ++i) {
    if (same(kNames[i])) return static_cast<LogLevel>(i);
  }
  if (same("warning")) return LogLevel::kWarn;
  return std::nullopt;
}

void log_init(const char* component) {
  if (component != nullptr) {
    std::strncpy(g_component, component, sizeof g_component - 1);
    g_component[sizeof g_component - 1] = '\0';
  }
  g_level.store(level_from_env(), std::memory_order_relaxed);
}

void log_set_level(LogLevel level) {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel log_level() { return static_cast<LogLevel>(current_level()); }

bool log_enabled(LogLevel level) { return static_cast<int>(level) <= current_level(); }

void log_vwrite(LogLevel level, const char* format, va_list args) {
  char line[1200];
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  tm utc{};
  gmtime_r(&now.tv_sec, &utc);
  int n = std::snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%d] %s ",
                        utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min,
                        utc.tm_sec, now.tv_nsec / 1000000, g_component, static_cast<int>(getpid()),
                        level_name(level));
  if (n < 0) return;
  const std::size_t room = sizeof line - 1;  // keep one byte for the newline
  std::size_t used = static_cast<std::size_t>(n) < room ? static_cast<std::size_t>(n) : room;
  const int m = std::vsnprintf(line + used, room - used, format, args);
  if (m > 0)
    used +=
        static_cast<std::size_t>(m) < room - used ? static_cast<std::size_t>(m) : room - used - 1;
  line[used++] = '\n';
  // One write(2) per record keeps records whole; a short write on stderr is not worth retrying.
  [[maybe_unused]] ssize_t ignored = ::write(STDERR_FILENO, line, used);
}

void log_write(LogLevel level, const char* format, ...) {
  va_list args;
  va_start(args, format);
  log_vwrite(level, format, args);
  va_end(args);
}

}  // namespace nvshare
