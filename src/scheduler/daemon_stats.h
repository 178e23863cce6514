// DaemonStats: counters the reactor keeps about its own traffic (control API `stats`, the
// benchmark, and later metrics). Plain data, touched only on the reactor thread.
#pragma once

#include <array>
#include <cstdint>
#include <variant>

#include "common/protocol.h"
#include "scheduler/bucket_histogram.h"
#include "scheduler/latency_histogram.h"

namespace nvshare::scheduler {

struct DaemonStats {
  // Every message type's value is an index (MessageType i is the variant's alternative i - 1).
  static constexpr std::size_t kTypes = std::variant_size_v<protocol::Message> + 1;

  std::array<std::uint64_t, kTypes> frames_in{};  // indexed by MessageType
  std::array<std::uint64_t, kTypes> frames_out{};
  std::uint64_t bytes_in = 0;
  std::uint64_t bytes_out = 0;
  std::uint64_t sessions_opened = 0;
  std::uint64_t sessions_closed = 0;
  std::uint64_t closed_malformed = 0;  // a frame failed to decode
  std::uint64_t closed_protocol = 0;  // a valid frame out of place (no hello, wrong direction, ...)
  std::uint64_t closed_version = 0;   // no common protocol version
  std::uint64_t closed_slow = 0;      // output buffer over the limit
  std::uint64_t closed_unknown_gpu = 0;   // hello named a GPU this node does not have
  std::uint64_t closed_no_hello = 0;      // no hello within the hello timeout
  std::uint64_t refused_identity = 0;     // the peer could not be identified (it exited)
  std::uint64_t refused_limit = 0;        // over its uid's, its pod's or the total session limit
  std::uint64_t refused_descriptors = 0;  // accepted only to be closed: out of descriptors
  std::uint64_t control_requests = 0;
  std::uint64_t control_refused = 0;  // peers refused by uid
  std::uint64_t ipc_exports = 0;      // CUDA IPC exports accepted
  std::uint64_t ipc_imports = 0;      // descriptors handed to importers
  std::uint64_t ipc_refused = 0;      // imports refused (another pod or user, unknown token)
  // From a request or release being read to the grant it caused being written to the socket.
  LatencyHistogram decision_latency;
  BucketHistogram decision_buckets;  // the same, in the buckets metrics expose

  void count_in(protocol::MessageType type) { ++frames_in[static_cast<std::size_t>(type)]; }
  void count_out(protocol::MessageType type) { ++frames_out[static_cast<std::size_t>(type)]; }
};

}  // namespace nvshare::scheduler
