// Logging for every nvshare component: one line per record on stderr, written with a single
// write(2) so lines from threads and processes do not interleave.
//
//   2026-11-21T18:49:00.123Z nvshare-scheduler[4242] INFO client 7 registered on GPU-...
//
// The level comes from NVSHARE_LOG_LEVEL (error, warn, info, debug, trace; default info), read once
// at the first use or by log_init. The component tag is set once per process with log_init
// ("nvshare", "nvshare-scheduler", ...). Safe to call from any thread; never throws and never
// allocates on the heap, because the client library logs from inside other people's processes.
// Messages are truncated at 1 KiB.
#pragma once

#include <cstdarg>
#include <optional>
#include <string_view>

namespace nvshare {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

// The level a name stands for: error, warn (or warning), info, debug, trace, in any letter case.
// The one reading of NVSHARE_LOG_LEVEL and of every --log-level flag; nullopt for anything else.
std::optional<LogLevel> log_level_from_name(std::string_view name);

// Sets the component tag (copied, at most 47 characters) and re-reads NVSHARE_LOG_LEVEL.
void log_init(const char* component);
void log_set_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);

void log_write(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));
void log_vwrite(LogLevel level, const char* format, va_list args)
    __attribute__((format(printf, 2, 0)));

}  // namespace nvshare

#define NVSHARE_LOG_AT(level, ...)                                               \
  do {                                                                           \
    if (::nvshare::log_enabled(level)) ::nvshare::log_write(level, __VA_ARGS__); \
  } while (0)
#define NVSHARE_ERROR(...) NVSHARE_LOG_AT(::nvshare::LogLevel::kError, __VA_ARGS__)
#define NVSHARE_WARN(...) NVSHARE_LOG_AT(::nvshare::LogLevel::kWarn, __VA_ARGS__)
#define NVSHARE_INFO(...) NVSHARE_LOG_AT(::nvshare::LogLevel::kInfo, __VA_ARGS__)
#define NVSHARE_DEBUG(...) NVSHARE_LOG_AT(::nvshare::LogLevel::kDebug, __VA_ARGS__)
#define NVSHARE_TRACE(...) NVSHARE_LOG_AT(::nvshare::LogLevel::kTrace, __VA_ARGS__)
