// What every fuzz target here shares: a check that stops the run (libFuzzer saves the input) when
// a property does not hold.
#pragma once

namespace nvshare::fuzz {

inline void check(bool condition) {
  if (!condition) __builtin_trap();
}

}  // namespace nvshare::fuzz
