// What the scheduler keeps across restarts, so that a restart never leaves a limited pod unlimited:
// the pods' limits (with namespace and name), the limits set for live processes (by pid, start
// time and GPU, so a reused pid never inherits them) and the node's GPUs.
//
// The file is one JSON object (docs/configuration.md, `state-file`):
//   {"version":1,
//    "gpus":[{"uuid":"GPU-...","memory_bytes":85899345920}],
//    "pods":[{"uid":"7d3f...","namespace":"ml","name":"trainer","memory_bytes":1073741824,
//             "core_percent":30}],
//    "processes":[{"pid":4242,"start_time":98765,"gpu":"GPU-...","memory_bytes":0}]}
// In a limits record an absent field inherits; memory_bytes 0 is "no limit", core_percent 100
// "uncapped".
//
// Contract
//  - parse_state is total: any text gives a state or an error naming what is wrong; it never
//    throws. Records beyond the scheduler's own bounds are an error (a file is written by us).
//  - write_state_file replaces the file atomically: a temporary file in the same directory, fsync,
//    rename over the old one, fsync of the directory. A crash leaves the old file or the new one.
//  - StateWriter does that on its own thread, so the reactor never waits for a disk: submit()
//    hands over the latest text and returns; texts submitted while a write runs are coalesced (the
//    newest wins); flush() waits until everything submitted is written or has failed.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/gpu_inventory.h"
#include "common/result.h"
#include "scheduler/limits_layer.h"

namespace nvshare::scheduler {

struct PodRecord {
  std::optional<std::string> pod_namespace;
  std::optional<std::string> pod_name;
  LimitsLayer limits;
  bool operator==(const PodRecord&) const = default;
};

// One process's session on one GPU, as the kernel identifies it.
struct ProcessKey {
  pid_t pid = 0;
  std::uint64_t start_time = 0;
  std::string gpu;
  auto operator<=>(const ProcessKey&) const = default;
};

struct SchedulerState {
  std::vector<GpuInfo> gpus;
  std::map<std::string, PodRecord> pods;  // by canonical pod UID
  std::map<ProcessKey, LimitsLayer> processes;
};

inline constexpr std::size_t kMaxStateRecords = 200'000;

std::string render_state(const SchedulerState& state);
Result<SchedulerState> parse_state(std::string_view text);

// The file's text, nullopt when it does not exist, an error when it cannot be read.
Result<std::optional<std::string>> read_state_file(const std::string& path);
Status write_state_file(const std::string& path, const std::string& text);

class StateWriter {
 public:
  explicit StateWriter(std::string path);
  ~StateWriter();  // writes what is pending, then stops
  StateWriter(const StateWriter&) = delete;
  StateWriter& operator=(const StateWriter&) = delete;

  void submit(std::string text);
  void flush();

  std::uint64_t writes() const;
  std::uint64_t failures() const;

 private:
  void run();

  const std::string path_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::optional<std::string> pending_;
  bool writing_ = false;
  bool stopping_ = false;
  std::uint64_t writes_ = 0;
  std::uint64_t failures_ = 0;
  std::thread thread_;
};

}  // namespace nvshare::scheduler
