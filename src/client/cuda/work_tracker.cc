#include "client/cuda/work_tracker.h"

#include <algorithm>

#include "client/hooks/hook_table.h"
#include "common/log.h"

namespace nvshare::client::cuda {
namespace {

using hooks::driver;

// Marker events are only waited on or queried: no timing, and a waiting thread sleeps instead of
// spinning on a CPU the application may need.
constexpr unsigned kMarkerEventFlags = CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC;

// Makes `ctx` current on the link thread for the scope; undone at the end.
class ScopedCurrent {
 public:
  explicit ScopedCurrent(CUcontext ctx) {
    pushed_ = driver().cuCtxPushCurrent_v2 != nullptr &&
              driver().cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
  }
  ~ScopedCurrent() {
    CUcontext popped = nullptr;
    if (pushed_) driver().cuCtxPopCurrent_v2(&popped);
  }
  ScopedCurrent(const ScopedCurrent&) = delete;
  ScopedCurrent& operator=(const ScopedCurrent&) = delete;
  bool ok() const { return pushed_; }

 private:
  bool pushed_ = false;
};

}  // namespace

WorkTracker::WorkTracker(Duration drain_bound, const Clock& clock)
    : drain_bound_(drain_bound), clock_(clock), last_activity_(clock.now()) {}

void WorkTracker::end_capture(CUstream stream) noexcept {
  std::lock_guard lock(mu_);
  auto it = std::find(capturing_.begin(), capturing_.end(), stream);
  if (it == capturing_.end()) return;  // not a capture we saw begin (it failed, or an app bug)
  capturing_.erase(it);
  captures_.store(capturing_.size(), std::memory_order_release);
  if (capturing_.empty()) capture_ended_.notify_all();
}

void WorkTracker::note_context(CUcontext ctx) noexcept {
  if (ctx == nullptr) return;
  std::lock_guard lock(mu_);
  if (find_locked(ctx) == nullptr) add_locked(ctx);
}

bool WorkTracker::knows_context(CUcontext ctx) const {
  std::lock_guard lock(mu_);
  return std::any_of(contexts_.begin(), contexts_.end(),
                     [ctx](const ContextWork& work) { return work.ctx == ctx; });
}

WorkTracker::ContextWork* WorkTracker::find_locked(CUcontext ctx) {
  for (ContextWork& work : contexts_) {
    if (work.ctx == ctx) return &work;
  }
  return nullptr;
}

WorkTracker::ContextWork* WorkTracker::add_locked(CUcontext ctx) {
  try {
    contexts_.push_back(ContextWork{ctx, {}, {}, nullptr});
    return &contexts_.back();
  } catch (...) {
    return nullptr;
  }
}

void WorkTracker::forget_locked(CUcontext ctx) {
  // The context is gone and its events and stream with it: drop them without touching the driver.
  std::erase_if(contexts_, [ctx](const ContextWork& work) { return work.ctx == ctx; });
}

void WorkTracker::recycle(ContextWork& work, CUevent event) noexcept {
  try {
    work.spare.push_back(event);
  } catch (...) {
    driver().cuEventDestroy_v2(event);  // no memory to keep it: give it back
  }
}

bool WorkTracker::record_locked(ContextWork& work, CUstream stream, std::uint64_t count,
                                bool context_wide) {
  const hooks::DriverApi& api = driver();
  CUevent event = nullptr;
  if (!work.spare.empty()) {
    event = work.spare.back();
    work.spare.pop_back();
  } else if (api.cuEventCreate == nullptr ||
             api.cuEventCreate(&event, kMarkerEventFlags) != CUDA_SUCCESS) {
    return false;
  }
  CUresult rc = CUDA_ERROR_NOT_FOUND;
  if (context_wide && api.cuCtxRecordEvent != nullptr) {
    rc = api.cuCtxRecordEvent(work.ctx, event);
  } else if (api.cuEventRecord != nullptr) {
    rc = api.cuEventRecord(event, stream);
  }
  if (rc != CUDA_SUCCESS) {
    recycle(work, event);
    NVSHARE_DEBUG("marker not recorded: %s", hooks::error_name(rc));
    return false;
  }
  try {
    work.pending.push_back(Marker{event, clock_.now(), count > marked_ ? count - marked_ : 0});
  } catch (...) {
    recycle(work, event);
    return false;
  }
  marked_ = std::max(marked_, count);
  ++markers_;
  return true;
}

bool WorkTracker::reap_locked(ContextWork& work) {
  while (!work.pending.empty()) {
    const CUresult rc = driver().cuEventQuery(work.pending.front().event);
    if (rc == CUDA_ERROR_NOT_READY) return false;
    // Complete, or an error that will never clear (a failed context): either way nothing to wait
    // for. Only a cleanly completed event is reused.
    if (rc == CUDA_SUCCESS) recycle(work, work.pending.front().event);
    work.pending.pop_front();
    work.last_done = clock_.now();
  }
  return true;
}

CUevent WorkTracker::over_bound_locked(const ContextWork& work) const {
  const std::size_t n = work.pending.size();
  if (n == 0) return nullptr;
  // The newest marker that has to complete for every rule to hold again; waiting for it covers all
  // older ones, so one wait restores the bound.
  std::ptrdiff_t target = -1;
  // Until tau is measured the count of pending markers is the only estimate; once it is, the time
  // estimate decides, so launch-bound work (tiny kernels the GPU keeps up with) never waits.
  const std::size_t max_pending = tau_ns_ > 0 ? kMaxPendingMarkersMeasured : kMaxPendingMarkers;
  if (n > max_pending) target = static_cast<std::ptrdiff_t>(n - max_pending - 1);
  const MonoTime now = clock_.now();
  for (std::size_t i = 0; i < n && now - work.pending[i].recorded > drain_bound_; ++i) {
    target = std::max(target, static_cast<std::ptrdiff_t>(i));
  }
  if (tau_ns_ > 0) {
    const double bound = static_cast<double>(drain_bound_.count());
    double after = 0;  // GPU time queued after marker i
    for (std::size_t i = n; i-- > 0;) {
      if (after > bound) {
        target = std::max(target, static_cast<std::ptrdiff_t>(i));
        break;
      }
      after += static_cast<double>(work.pending[i].submissions) * tau_ns_;
    }
  }
  return target >= 0 ? work.pending[static_cast<std::size_t>(target)].event : nullptr;
}

void WorkTracker::waited_locked(CUcontext ctx, CUevent event, MonoTime done) {
  ContextWork* work = find_locked(ctx);
  // Another thread may have reaped it meanwhile, or the context ended: nothing to learn then.
  if (work == nullptr) return;
  auto waited = std::find_if(work->pending.begin(), work->pending.end(),
                             [event](const Marker& marker) { return marker.event == event; });
  if (waited == work->pending.end()) return;
  // The GPU worked on these markers' submissions from when it finished the marker before them (or
  // from when they were submitted, if later) until now.
  const MonoTime began = std::max(work->last_done, work->pending.front().recorded);
  std::uint64_t submissions = 0;
  const auto last = std::next(waited);
  for (auto it = work->pending.begin(); it != last; ++it) {
    submissions += it->submissions;
    recycle(*work, it->event);
  }
  work->pending.erase(work->pending.begin(), last);
  work->last_done = done;
  if (submissions == 0 || done <= began) return;
  const double sample =
      static_cast<double>((done - began).count()) / static_cast<double>(submissions);
  tau_ns_ = tau_ns_ == 0 ? sample : 0.75 * tau_ns_ + 0.25 * sample;
}

void WorkTracker::record_and_bound(CUcontext ctx, CUstream stream, std::uint64_t count) noexcept {
  CUevent wait_for = nullptr;
  {
    std::lock_guard lock(mu_);
    // Another thread may have recorded this marker already, or a capture may have started since
    // the fast path looked.
    if (count < next_marker_.load(std::memory_order_relaxed) ||
        captures_.load(std::memory_order_acquire) != 0 || ctx == nullptr) {
      return;
    }
    // Until something is queued long enough to be waited for there is no tau; make sure the next
    // marker point comes even if this one fails below.
    next_marker_.store(count + unmeasured_spacing_, std::memory_order_relaxed);
    ContextWork* work = find_locked(ctx);
    if (work == nullptr) work = add_locked(ctx);
    if (work == nullptr) return;
    const bool kept_up = reap_locked(*work);
    // Space markers so that one covers about half the bound of GPU time (at most kMarkerEvery).
    // Unmeasured, start dense and widen while the GPU keeps up (every marker complete by the next:
    // nothing to bound, and markers cost CPU time).
    std::uint64_t spacing = unmeasured_spacing_;
    if (tau_ns_ > 0) {
      const double fit = static_cast<double>(drain_bound_.count()) / (2 * tau_ns_);
      spacing = fit < 1 ? 1 : std::min(kMarkerEvery, static_cast<std::uint64_t>(fit));
    } else if (kept_up) {
      unmeasured_spacing_ = std::min(kMarkerEvery, 2 * unmeasured_spacing_);
    }
    next_marker_.store(count + spacing, std::memory_order_relaxed);
    record_locked(*work, stream, count, /*context_wide=*/false);
    wait_for = over_bound_locked(*work);
  }
  // Wait outside the lock until the estimate is within the bound (one wait, unless tau changed
  // meanwhile). The event stays valid (only its context's end destroys it); if another thread
  // re-records it meanwhile, this waits for newer work, which the same bound allows.
  for (int round = 0; wait_for != nullptr && round < 4; ++round) {
    bound_waits_.fetch_add(1, std::memory_order_relaxed);
    driver().cuEventSynchronize(wait_for);
    const MonoTime done = clock_.now();
    std::lock_guard lock(mu_);
    waited_locked(ctx, wait_for, done);
    ContextWork* work = find_locked(ctx);
    if (work == nullptr || captures_.load(std::memory_order_acquire) != 0) return;
    reap_locked(*work);
    wait_for = over_bound_locked(*work);
  }
}

CUstream WorkTracker::private_stream(CUcontext ctx) noexcept {
  std::lock_guard lock(mu_);
  ContextWork* work = find_locked(ctx);
  if (work == nullptr) work = add_locked(ctx);
  if (work == nullptr) return nullptr;
  if (work->stream == nullptr && driver().cuStreamCreate != nullptr) {
    CUstream stream = nullptr;
    if (driver().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
      work->stream = stream;
    }
  }
  return work->stream;
}

Duration WorkTracker::drain() noexcept {
  const MonoTime start = clock_.now();
  std::unique_lock lock(mu_);
  if (captures_.load(std::memory_order_acquire) != 0) {
    // Never synchronize a context while one of its streams captures: wait for the capture to end.
    const auto deadline = std::chrono::steady_clock::now() + kCaptureWaitBound;
    while (captures_.load(std::memory_order_acquire) != 0) {
      if (capture_ended_.wait_until(lock, deadline) == std::cv_status::timeout &&
          captures_.load(std::memory_order_acquire) != 0) {
        NVSHARE_WARN(
            "drain: a stream capture stayed open for %lld ms; not synchronizing",
            static_cast<long long>(
                std::chrono::duration_cast<std::chrono::milliseconds>(kCaptureWaitBound).count()));
        return clock_.now() - start;
      }
    }
  }
  const std::uint64_t submitted = submissions_.load(std::memory_order_acquire);
  for (ContextWork& work : contexts_) {
    ScopedCurrent current(work.ctx);
    if (!current.ok()) continue;
    const CUresult rc = driver().cuCtxSynchronize();
    if (rc != CUDA_SUCCESS) NVSHARE_DEBUG("drain: cuCtxSynchronize: %s", hooks::error_name(rc));
    reap_locked(work);
  }
  marked_ = std::max(marked_, submitted);
  return clock_.now() - start;
}

Duration WorkTracker::idle_for() noexcept {
  const MonoTime now = clock_.now();
  const std::uint64_t submitted = submissions_.load(std::memory_order_acquire);
  std::lock_guard lock(mu_);
  if (submitted != seen_) {
    // Submissions since the last look: the GPU was active until about now.
    seen_ = submitted;
    last_activity_ = now;
  }
  if (captures_.load(std::memory_order_acquire) != 0) return Duration::zero();
  if (submitted != marked_) {
    // Submissions after the newest markers: mark the tail, and look again next time.
    for (ContextWork& work : contexts_) {
      ScopedCurrent current(work.ctx);
      if (current.ok()) record_locked(work, nullptr, submitted, /*context_wide=*/true);
    }
    marked_ = submitted;
    return Duration::zero();
  }
  bool all_done = true;
  for (ContextWork& work : contexts_) all_done = reap_locked(work) && all_done;
  return all_done ? now - last_activity_ : Duration::zero();
}

bool WorkTracker::with_any_context(const std::function<void(CUcontext, CUstream)>& fn) noexcept {
  std::lock_guard lock(mu_);
  // The most recently seen context is the likeliest to be alive and in use.
  for (auto it = contexts_.rbegin(); it != contexts_.rend(); ++it) {
    ScopedCurrent current(it->ctx);
    if (!current.ok()) continue;
    if (it->stream == nullptr && driver().cuStreamCreate != nullptr) {
      CUstream stream = nullptr;
      if (driver().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS) {
        it->stream = stream;
      }
    }
    if (it->stream == nullptr) continue;
    try {
      fn(it->ctx, it->stream);
    } catch (...) {
      return false;
    }
    return true;
  }
  return false;
}

TrackerStats WorkTracker::stats() const {
  std::lock_guard lock(mu_);
  TrackerStats s;
  s.submissions = submissions_.load(std::memory_order_relaxed);
  s.gpu_ns_per_submission = tau_ns_;
  s.markers = markers_;
  s.bound_waits = bound_waits_.load(std::memory_order_relaxed);
  s.captures_open = capturing_.size();
  s.contexts = contexts_.size();
  return s;
}

}  // namespace nvshare::client::cuda
