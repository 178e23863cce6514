// The CUDA side of the grant gate, shared by every generated launch, copy, memset and prefetch
// wrapper:
//
//   link.before_submit()   one atomic while the grant is held; otherwise waits for it
//   the real driver call
//   link.after_submit()    always paired with before_submit, whatever the call returned: one
//                          atomic, which also numbers a submission that queued work
//   tracker.submitted()    with that number, no atomic read-modify-write: at most every
//                          kMarkerEvery-th submission records a marker and may wait for the drain
//                          bound (outside the gate, so a revoke never waits for a thread that
//                          waits for the bound); for a replay, tracker.replayed(), which always
//                          records one (the graph's own length is learnt)
//
// The GPU is the one of the calling thread's current context (current_device(): a driver TLS read
// and a per-thread cache). Without a current context, or with the library disabled, the call goes
// straight to the driver: the driver reports the error the application expects.
#pragma once

#include "client/cuda/device_state.h"

namespace nvshare::client::cuda {

// What a submission queues: work on `stream` (kernels, copies, memsets, prefetches), or a replay of
// an executable graph, whose GPU time the tracker learns per graph. Hook rows name the stream; a
// replay's row names both.
struct Work {
  Work(CUstream s) : stream(s) {}  // NOLINT(google-explicit-constructor): rows name a stream
  Work(CUstream s, CUgraphExec g) : stream(s), graph(g) {}
  CUstream stream;
  CUgraphExec graph = nullptr;
};

template <typename Call>
CUresult submit(Work work, bool per_thread, Call&& call) {
  const CurrentDevice current = current_device();
  if (current.device == nullptr) return call();
  DeviceLink& link = *current.device->link;
  link.before_submit();
  const CUresult rc = call();
  const std::uint64_t count = link.after_submit(rc == CUDA_SUCCESS);
  if (rc == CUDA_SUCCESS) {
    // The per-thread-stream forms mean the thread's default stream by the null handle.
    const CUstream stream =
        per_thread && work.stream == nullptr ? CU_STREAM_PER_THREAD : work.stream;
    if (work.graph != nullptr) {
      current.device->tracker.replayed(current.ctx, stream, work.graph, count);
    } else {
      current.device->tracker.submitted(current.ctx, stream, count);
    }
  }
  return rc;
}

}  // namespace nvshare::client::cuda
