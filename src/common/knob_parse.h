// Value parsers and text helpers shared by the knob tables of the nvshare daemons (the scheduler's
// src/scheduler/knobs.cc, the device plugin's src/deviceplugin/knobs.cc), so a number, a duration,
// a boolean or a log level is read the same way by every component.
//
// Contract: nothing here throws or exits. Each parser accepts the whole text or fails with a
// message that names the text and what is accepted; the caller prefixes the knob's name and where
// the value came from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/memory_mode.h"
#include "common/result.h"

namespace nvshare::knobparse {

// A finite decimal number within [min, max]; `unit` (" seconds") is appended to the range in
// errors.
Result<double> parse_decimal(std::string_view text, double min, double max, std::string_view unit);
// Seconds as a decimal number ("0.5", "30") within [min, max].
Result<Duration> parse_seconds(std::string_view text, double min, double max);
// Seconds as a decimal number with an optional trailing `s` ("5s", "0.5"), within [min, max].
Result<Duration> parse_seconds_with_unit(std::string_view text, double min, double max);
// A base-10 integer within [min, max].
Result<std::int64_t> parse_integer(std::string_view text, std::int64_t min, std::int64_t max);
// true/1/yes/on or false/0/no/off, in any letter case (the one reading of a switch for every
// program and the library).
Result<bool> parse_bool(std::string_view text);
// A unix socket's path: absolute, and short enough for sun_path (107 bytes).
Result<std::string> parse_socket_path(std::string_view text);
// error, warn, info, debug, trace (log_level_from_name's reading).
Result<LogLevel> parse_log_level(std::string_view text);
// A memory mode word (common/memory_mode.h); empty is unset (nullopt).
Result<std::optional<MemoryMode>> parse_memory_mode_setting(std::string_view text);

// The items of a comma-separated list ("a,b"); an empty item (",,", a leading or trailing comma, or
// an empty text) is an error naming `what` ("GPU list") and the text.
Result<std::vector<std::string_view>> split_list(std::string_view text, std::string_view what);

// "quota-window" -> "QUOTA_WINDOW".
std::string upper_snake(std::string_view name);
// Splits `text` into lines of at most `width` columns, each starting with `indent` (words are never
// broken); ends with a newline.
std::string wrap(std::string_view text, std::size_t width, std::string_view indent);
// Markdown code spans read as plain text in --help.
std::string strip_backticks(std::string_view text);

}  // namespace nvshare::knobparse
