// Quantities as users and Kubernetes write them: memory sizes ("4Gi", "512Mi", "4G", "1.5Gi", "4096")
// and percentages ("30", "30%").
//
// Contract:
//  - parse_memory_quantity accepts the Kubernetes quantity grammar for non-negative amounts: an optional
//    '+', decimal digits with an optional fraction, then one of: nothing (bytes), a binary suffix (Ki Mi
//    Gi Ti Pi Ei), a decimal suffix (k M G T P E), or a decimal exponent (e3, E6). Fractional byte
//    counts round up, as Kubernetes does. The result is an exact byte count.
//  - It rejects, with a message that names the input and what is wrong: empty input, signs other than a
//    leading '+', hexadecimal, whitespace, unknown suffixes ("4GB", "4gi"), and values that do not fit in
//    64 bits.
//  - parse_percent accepts an integer 1..100, optionally followed by '%'.
//  - format_bytes renders a byte count the way status tables show it ("4Gi", "1.5Gi", "512Mi", "100").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.h"

namespace nvshare {

Result<std::uint64_t> parse_memory_quantity(std::string_view text);
Result<int> parse_percent(std::string_view text);
std::string format_bytes(std::uint64_t bytes);

}  // namespace nvshare
