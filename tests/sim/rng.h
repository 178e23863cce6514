// A small deterministic random source for the simulator (splitmix64). The standard distributions
// are implementation-defined, so scenarios would differ between standard libraries; these helpers
// do not.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/clock.h"

namespace nvshare::sim {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [lo, hi].
  int range(int lo, int hi) {
    return lo + static_cast<int>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  bool chance(double p) { return uniform() < p; }
  Duration between(Duration lo, Duration hi) {
    return lo +
           Duration(static_cast<std::int64_t>(uniform() * static_cast<double>((hi - lo).count())));
  }

 private:
  std::uint64_t state_;
};

}  // namespace nvshare::sim
