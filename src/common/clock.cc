#include "common/clock.h"

#include <ctime>

namespace nvshare {

MonoTime SteadyClock::now() const {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return MonoTime{Duration(static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec)};
}

const SteadyClock& SteadyClock::instance() {
  static const SteadyClock clock;
  return clock;
}

}  // namespace nvshare
