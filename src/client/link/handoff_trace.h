// HandoffTrace: an optional record of each GPU's grant life cycle, for benchmarks and for people
// reading a schedule after the fact (NVSHARE_TRACE_FILE).
//
// One JSON object per line, appended with a single write(2) to a file opened O_APPEND, so lines of
// several processes sharing one file never interleave:
//   {"t":12345.678901234,"pid":4242,"gpu":"GPU-...","event":"grant","epoch":7,"ms":1.25}
// `t` is CLOCK_MONOTONIC in seconds (comparable across processes of one host); `ms` is the event's
// duration where it has one (swap in for a grant, drain and swap out for a release); a grant or
// release that included a swap adds `swap_bytes` and `swap_ms`. Events: request, grant, revoke,
// release (answering a revoke), idle-release (`ms`: how long the process had been idle, with the
// thread counts below seen during that stretch), handback (a grant given straight back), yield,
// swap-notice (a swap-out announced for this grant: host copies are being made), contended (a
// lower class held back waits: this grant ends at the next pause), pause (the pause a noticed
// holder waits out changed, `ms` the new one: the second longest of its last kPausesKept; a
// pause the idle checks saw adds `inside`, `waiting` and `at_bound`, the most application threads
// they saw at once inside a submission, waiting at the gate and waiting for the drain bound during
// it: all 0, the application itself paused), stall (the longest idle stretch yet during which a
// thread sat inside a submission or waited for the drain bound: not a pause, and never learnt as
// one; with the same counts), evict and evicted (an eviction without a grant, and its swap-out),
// room (memory brought back into room while waiting for the grant, with `swap_bytes` and
// `swap_ms`).
//
// Contract: disabled (no file, no cost but one branch) when the path is empty; a file that cannot
// be opened is logged once and the trace stays disabled; recording never blocks on anything but
// the write itself and never fails the caller.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace nvshare::client {

class HandoffTrace {
 public:
  explicit HandoffTrace(const std::string& path);
  ~HandoffTrace();
  HandoffTrace(const HandoffTrace&) = delete;
  HandoffTrace& operator=(const HandoffTrace&) = delete;

  bool enabled() const { return fd_ >= 0; }
  // `ms` < 0: the event has no duration; `swap_bytes` < 0: it included no swap; `inside` < 0: no
  // thread counts (`inside`, `waiting` and `at_bound`, written only with them).
  void record(std::string_view event, std::string_view gpu_uuid, std::uint64_t epoch,
              double ms = -1, std::int64_t swap_bytes = -1, double swap_ms = -1,
              std::int64_t inside = -1, std::int64_t waiting = -1,
              std::int64_t at_bound = -1) const noexcept;

 private:
  int fd_ = -1;
};

}  // namespace nvshare::client
