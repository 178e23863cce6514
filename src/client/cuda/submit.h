// The CUDA side of the grant gate, shared by every generated launch, copy, memset and prefetch
// wrapper:
//
//   link.before_submit()   one atomic while the grant is held; otherwise waits for it
//   the real driver call
//   link.after_submit()    always paired with before_submit, whatever the call returned
//   tracker.submitted()    one atomic increment; every kMarkerEvery-th submission records a marker
//                          and may wait for the drain bound (outside the gate, so a revoke never
//                          waits for a thread that waits for the bound)
//
// The GPU is the one of the calling thread's current context (current_device(): a driver TLS read
// and a per-thread cache). Without a current context, or with the library disabled, the call goes
// straight to the driver: the driver reports the error the application expects.
#pragma once

#include "client/cuda/device_state.h"

namespace nvshare::client::cuda {

template <typename Call>
CUresult submit(CUstream stream, bool per_thread, Call&& call) {
  const CurrentDevice current = current_device();
  if (current.device == nullptr) return call();
  DeviceLink& link = *current.device->link;
  link.before_submit();
  const CUresult rc = call();
  link.after_submit();
  if (rc == CUDA_SUCCESS) {
    // The per-thread-stream forms mean the thread's default stream by the null handle.
    current.device->tracker.submitted(
        current.ctx, per_thread && stream == nullptr ? CU_STREAM_PER_THREAD : stream);
  }
  return rc;
}

}  // namespace nvshare::client::cuda
