#include "client/cuda/work_tracker.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "client/hooks/hook_table.h"
#include "common/log.h"

namespace nvshare::client::cuda {
namespace {

using hooks::driver;

// Marker events are only queried: no timing, and no blocking synchronization (recording such an
// event costs the driver about a microsecond more per marker, and a thread it wakes by interrupt
// was seen to wake 90-110 ms after the event completed). A thread waits for one by polling
// (await_marker).
constexpr unsigned kMarkerEventFlags = CU_EVENT_DISABLE_TIMING;

constexpr Duration kPollFirst = std::chrono::microseconds(10);
constexpr Duration kPollLongest = std::chrono::microseconds(250);

// The longest sleep between polls: a sixteenth of the drain bound (a low client's 2 ms bound polls
// every 125 us at most), at most kPollLongest.
Duration poll_sleep_limit(Duration bound) {
  return std::clamp(bound / 16, kPollFirst, kPollLongest);
}

// Waits until `event` completes: cuEventQuery, then a sleep that doubles from kPollFirst up to
// `longest_sleep`, so a wait ends within about one sleep (and the kernel's timer slack) of the
// event's completion, and a thread that waits long polls a few thousand times a second at most.
// Returns what the last query said (CUDA_SUCCESS, or the error that ended the wait).
CUresult await_marker(CUevent event, Duration longest_sleep) {
  Duration sleep = std::min(kPollFirst, longest_sleep);
  for (;;) {
    const CUresult rc = driver().cuEventQuery(event);
    if (rc != CUDA_ERROR_NOT_READY) return rc;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(2 * sleep, longest_sleep);
  }
}

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
    : drain_bound_ns_(drain_bound.count()), clock_(clock), last_activity_(clock.now()) {}

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
    ContextWork work;
    work.ctx = ctx;
    work.last_recorded = clock_.now();
    contexts_.push_back(std::move(work));
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
  const bool awaited =
      std::find(work.awaited.begin(), work.awaited.end(), event) != work.awaited.end();
  try {
    (awaited ? work.held : work.spare).push_back(event);
  } catch (...) {
    // No memory to keep it. One a thread still waits for is left alone (its context's end
    // destroys it); any other is given back.
    if (!awaited) driver().cuEventDestroy_v2(event);
  }
}

void WorkTracker::awaiting_locked(ContextWork& work, CUevent event) noexcept {
  try {
    work.awaited.push_back(event);
  } catch (...) {
    // Not noted: the event may be reused while this thread waits, which only lengthens the wait.
  }
}

void WorkTracker::done_awaiting_locked(ContextWork& work, CUevent event) noexcept {
  const auto it = std::find(work.awaited.begin(), work.awaited.end(), event);
  if (it == work.awaited.end()) return;
  work.awaited.erase(it);
  if (std::find(work.awaited.begin(), work.awaited.end(), event) != work.awaited.end()) return;
  const auto held = std::find(work.held.begin(), work.held.end(), event);
  if (held == work.held.end()) return;  // still pending: the one who reaps it recycles it
  work.held.erase(held);
  recycle(work, event);
}

bool WorkTracker::record_locked(ContextWork& work, CUstream stream, std::uint64_t count,
                                bool context_wide, CUgraphExec graph) {
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
  // A replay's marker covers the other submissions since the previous marker besides the replay.
  const std::uint64_t others = graph != nullptr ? 1 : 0;
  const std::uint64_t covered = count > marked_ + others ? count - marked_ - others : 0;
  try {
    const MonoTime now = clock_.now();
    work.pending.push_back(Marker{event, now, work.last_recorded, covered, graph,
                                  graph != nullptr ? graph_cost_locked(graph) : 0});
    work.last_recorded = now;
  } catch (...) {
    recycle(work, event);
    return false;
  }
  marked_ = std::max(marked_, count);
  ++markers_;
  return true;
}

std::uint64_t WorkTracker::spacing_for(double ns_per_submission) const {
  const double fit = static_cast<double>(drain_bound().count()) / (2 * ns_per_submission);
  return fit < 1 ? 1 : std::min(kMarkerEvery, static_cast<std::uint64_t>(fit));
}

double WorkTracker::estimate(const Marker& marker) const {
  return static_cast<double>(marker.submissions) * tau_ns_ + marker.graph_ns;
}

bool WorkTracker::unknown(const Marker& marker) const {
  return (marker.submissions > 0 && !trusted()) ||
         (marker.graph != nullptr && marker.graph_ns == 0);
}

WorkTracker::GraphCost* WorkTracker::find_graph_locked(CUgraphExec graph) {
  auto it = std::find_if(graph_costs_.begin(), graph_costs_.end(),
                         [graph](const GraphCost& cost) { return cost.graph == graph; });
  return it == graph_costs_.end() ? nullptr : &*it;
}

double WorkTracker::graph_cost_locked(CUgraphExec graph) {
  GraphCost* cost = find_graph_locked(graph);
  if (cost == nullptr) return 0;
  cost->used = graph_replays_;
  return cost->ns;
}

void WorkTracker::set_graph_cost_locked(CUgraphExec graph, double ns) {
  GraphCost* cost = find_graph_locked(graph);
  if (cost == nullptr && graph_costs_.size() >= kMaxGraphCosts) {
    // Full: the least recently replayed graph (likely destroyed) makes room.
    cost =
        &*std::min_element(graph_costs_.begin(), graph_costs_.end(),
                           [](const GraphCost& a, const GraphCost& b) { return a.used < b.used; });
    *cost = GraphCost{graph, 0, graph_replays_};
  }
  if (cost == nullptr) {
    try {
      cost = &graph_costs_.emplace_back(GraphCost{graph, 0, graph_replays_});
    } catch (...) {
      return;  // not kept: the graph stays of unknown length, which only bounds it more tightly
    }
  }
  keep_graph_cost_locked(*cost, ns);
}

void WorkTracker::keep_graph_cost_locked(GraphCost& cost, double ns) {
  cost.ns = ns;
  // Pending replays of the graph are estimated from what is known now.
  for (ContextWork& work : contexts_) {
    for (Marker& marker : work.pending) {
      if (marker.graph == cost.graph) marker.graph_ns = ns;
    }
  }
}

void WorkTracker::learn_locked(std::deque<Marker>::const_iterator first,
                               std::deque<Marker>::const_iterator last, double elapsed_ns) {
  std::uint64_t kernels = 0;  // other submissions than replays
  double known_graphs = 0;
  std::size_t unknown_graphs = 0;
  for (auto it = first; it != last; ++it) {
    kernels += it->submissions;
    if (it->graph == nullptr) continue;
    if (it->graph_ns > 0) {
      known_graphs += it->graph_ns;
    } else {
      ++unknown_graphs;
    }
  }
  const double kernel_ns = static_cast<double>(kernels) * tau_ns_;
  if (unknown_graphs > 0) {
    // What the known part does not explain is the unmeasured replays' time (at least 1 us each).
    const double each = std::max(
        (elapsed_ns - known_graphs - kernel_ns) / static_cast<double>(unknown_graphs), 1e3);
    for (auto it = first; it != last; ++it) {
      if (it->graph != nullptr && it->graph_ns == 0) set_graph_cost_locked(it->graph, each);
    }
    return;
  }
  if (tau_ns_ == 0) {
    if (kernels > 0 && elapsed_ns > known_graphs) {
      tau_ns_ = (elapsed_ns - known_graphs) / static_cast<double>(kernels);
    }
    return;
  }
  // Everything covered was estimated: correct each estimate by the factor the total missed by
  // (for plain submissions alone, a new sample of tau), each graph once however often it was
  // replayed in the span.
  const double estimated = kernel_ns + known_graphs;
  if (estimated <= 0) return;
  const double ratio = elapsed_ns / estimated;
  const double keep = 0.75 + 0.25 * ratio;
  if (kernels > 0) {
    ++kernel_lessons_;
    tau_ns_ *= keep;
    // A short span is measured no better than a wake-up's latency: within kAgreeSlack it does not
    // disagree, but a span shorter than the slack (tiny start-up kernels) confirms nothing either.
    const double slack = static_cast<double>(kAgreeSlack.count());
    const bool longer = std::abs(elapsed_ns - estimated) >= slack && ratio > 2;
    if (!longer) {
      // Within the agreement, or shorter than estimated: the estimates were not low.
      if (std::max(elapsed_ns, estimated) >= slack) agreed_ = std::min(agreed_ + 1, kConfirmations);
      spacing_limit_ = std::min(kMarkerEvery, 2 * spacing_limit_);
    } else if (elapsed_ns <= static_cast<double>(drain_bound().count()) * kShortSpanOfBound) {
      // Longer than tau says, but the whole span was short: another context's time slice on a
      // shared GPU looks like this, and so do kernels a little longer. Trust stays as it was, and
      // until it is confirmed markers are no wider than keeps two of them within the bound even if
      // every submission took as long as this whole span.
      spacing_limit_ = std::min(spacing_limit_, spacing_for(elapsed_ns));
    } else {
      // The work changed length: dense markers again until the new tau is confirmed.
      ++disagreements_;
      agreed_ = 0;
      spacing_limit_ = kFirstMarkerEvery;
    }
  }
  ++lessons_;
  for (auto it = first; it != last; ++it) {
    GraphCost* cost = it->graph != nullptr ? find_graph_locked(it->graph) : nullptr;
    if (cost == nullptr || cost->ns <= 0 || cost->corrected == lessons_) continue;
    cost->corrected = lessons_;
    keep_graph_cost_locked(*cost, cost->ns * keep);
  }
}

bool WorkTracker::reap_locked(ContextWork& work) {
  while (!work.pending.empty()) {
    const CUresult rc = driver().cuEventQuery(work.pending.front().event);
    if (rc == CUDA_ERROR_NOT_READY) return false;
    // Complete, or an error that will never clear (a failed context): either way nothing to wait
    // for. Only a cleanly completed event is reused.
    const Marker& done = work.pending.front();
    const MonoTime now = clock_.now();
    if (rc == CUDA_SUCCESS) {
      recycle(work, done.event);
      if (done.submissions > 0 && done.graph == nullptr) {
        work.short_ns = static_cast<double>((now - done.opened).count()) /
                        static_cast<double>(done.submissions);
      }
    }
    work.pending.pop_front();
    work.last_done = now;
  }
  return true;
}

CUevent WorkTracker::over_bound_locked(const ContextWork& work) const {
  const std::size_t n = work.pending.size();
  if (n == 0) return nullptr;
  // The newest marker that has to complete for every rule to hold again; waiting for it covers all
  // older ones, so one wait restores the bound.
  std::ptrdiff_t target = -1;
  const auto at_least = [&target](std::size_t i) {
    target = std::max(target, static_cast<std::ptrdiff_t>(i));
  };
  if (n > kMaxPendingMarkersMeasured) at_least(n - kMaxPendingMarkersMeasured - 1);
  const MonoTime now = clock_.now();
  for (std::size_t i = 0; i < n && now - work.pending[i].recorded > drain_bound(); ++i) at_least(i);
  // From the newest back: the GPU time estimated after marker i, and how many markers of unknown
  // length are newer. Launch-bound work (tiny kernels the GPU keeps up with) never waits.
  const double bound = static_cast<double>(drain_bound().count());
  double after = 0;
  std::size_t unknowns = 0;
  for (std::size_t i = n; i-- > 0;) {
    const Marker& marker = work.pending[i];
    if (after > bound || (unknown(marker) && ++unknowns > kMaxPendingMarkers)) {
      at_least(i);
      break;
    }
    after += estimate(marker);
  }
  return target >= 0 ? work.pending[static_cast<std::size_t>(target)].event : nullptr;
}

bool WorkTracker::waited_locked(CUcontext ctx, CUevent event, MonoTime done) {
  ContextWork* work = find_locked(ctx);
  // Another thread may have reaped it meanwhile, or the context ended: nothing to learn then.
  if (work == nullptr) return false;
  auto waited = std::find_if(work->pending.begin(), work->pending.end(),
                             [event](const Marker& marker) { return marker.event == event; });
  if (waited == work->pending.end()) return false;
  // The GPU worked on these markers' submissions from when it finished the marker before them (or
  // from when they were submitted, if later) until now.
  const MonoTime began = std::max(work->last_done, work->pending.front().recorded);
  const auto last = std::next(waited);
  if (done > began) {
    learn_locked(work->pending.begin(), last, static_cast<double>((done - began).count()));
  }
  for (auto it = work->pending.begin(); it != last; ++it) recycle(*work, it->event);
  work->pending.erase(work->pending.begin(), last);
  work->last_done = done;
  return true;
}

void WorkTracker::replayed(CUcontext ctx, CUstream stream, CUgraphExec graph,
                           std::uint64_t count) noexcept {
  note_count(count);
  // A replay into a capture adds a child graph there; nothing runs yet.
  if (captures_.load(std::memory_order_acquire) == 0) record_and_bound(ctx, stream, count, graph);
}

void WorkTracker::record_and_bound(CUcontext ctx, CUstream stream, std::uint64_t count,
                                   CUgraphExec graph) noexcept {
  CUevent wait_for = nullptr;
  {
    std::lock_guard lock(mu_);
    // Another thread may have recorded this marker already, or a capture may have started since
    // the fast path looked. A replay is always marked.
    if ((graph == nullptr && count < next_marker_.load(std::memory_order_relaxed)) ||
        captures_.load(std::memory_order_acquire) != 0 || ctx == nullptr) {
      return;
    }
    if (graph != nullptr) ++graph_replays_;
    // Until something is queued long enough to be waited for there is no tau; make sure the next
    // marker point comes even if this one fails below.
    next_marker_.store(count + spacing_limit_, std::memory_order_relaxed);
    ContextWork* work = find_locked(ctx);
    if (work == nullptr) work = add_locked(ctx);
    if (work == nullptr) return;
    const bool kept_up = reap_locked(*work);
    // Space markers so that one covers about half the bound of GPU time by tau; until tau is
    // trusted, no wider than the spacing limit (the header says when it widens, narrows and
    // restarts). A trusted tau alone spaces markers: a service's steps after idle gaps keep their
    // whole forward pass queued.
    if (work->short_ns > 0 && !trusted()) {
      const std::uint64_t fits = spacing_for(work->short_ns);
      if (kept_up && 2 * spacing_limit_ <= fits) {
        spacing_limit_ = std::min(kMarkerEvery, 2 * spacing_limit_);
      } else if (spacing_limit_ > fits) {
        spacing_limit_ = fits;
      }
    }
    work->short_ns = 0;  // used (or of no use while trusted): the next one needs a span of its own
    std::uint64_t spacing = spacing_limit_;
    if (tau_ns_ > 0) {
      const std::uint64_t by_tau = spacing_for(tau_ns_);
      spacing = trusted() ? by_tau : std::min(by_tau, spacing);
    }
    next_marker_.store(count + spacing, std::memory_order_relaxed);
    record_locked(*work, stream, count, /*context_wide=*/false, graph);
    wait_for = over_bound_locked(*work);
    if (wait_for != nullptr) awaiting_locked(*work, wait_for);
  }
  // Wait outside the lock until the estimate is within the bound (one wait, unless tau changed
  // meanwhile). The event stays valid (only its context's end destroys it), and no thread records
  // it again until this one is done with it (awaiting_locked, under the lock that chose it).
  if (wait_for == nullptr) return;
  threads_at_bound_.fetch_add(1, std::memory_order_acq_rel);
  const MonoTime started = clock_.now();
  MonoTime done = started;
  double queued_after = 0;
  for (int round = 0; wait_for != nullptr && round < 4; ++round) {
    bound_waits_.fetch_add(1, std::memory_order_relaxed);
    const MonoTime round_began = clock_.now();
    await_marker(wait_for, poll_sleep_limit(drain_bound()));
    done = clock_.now();
    std::lock_guard lock(mu_);
    ContextWork* work = find_locked(ctx);
    if (work != nullptr) done_awaiting_locked(*work, wait_for);
    const bool still_pending = waited_locked(ctx, wait_for, done);
    if (done - round_began > drain_bound()) {
      // A wait for a marker that leaves at most the bound queued should not outlast it.
      NVSHARE_DEBUG("drain bound: waited %.1f ms for one marker (%s)", to_ms(done - round_began),
                    still_pending ? "still pending when the wait returned"
                                  : "seen complete by another thread meanwhile");
    }
    if (work == nullptr || captures_.load(std::memory_order_acquire) != 0) break;
    reap_locked(*work);
    wait_for = over_bound_locked(*work);
    if (wait_for != nullptr) awaiting_locked(*work, wait_for);
    queued_after = 0;
    for (const Marker& marker : work->pending) queued_after += estimate(marker);
  }
  if (wait_for != nullptr) {  // chosen in the last round, not waited for
    std::lock_guard lock(mu_);
    if (ContextWork* work = find_locked(ctx)) done_awaiting_locked(*work, wait_for);
  }
  threads_at_bound_.fetch_sub(1, std::memory_order_acq_rel);
  // The pace the scheduler is told counts the waits of a thread that had more than the bound
  // queued, as learnt once the wait ended (what it waited for plus what is still queued). A wait
  // for a marker of unknown length, or for the oldest of many short ones, that turns out to have
  // covered less is caution, not a deep queue: a service's forward pass of short kernels, queued
  // right after an idle period, must not look like a trainer that queues ahead.
  const Duration waited = done - started;
  if (static_cast<double>(waited.count()) + queued_after >
      static_cast<double>(drain_bound().count())) {
    bound_waited_ns_.fetch_add(waited.count(), std::memory_order_relaxed);
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
  const std::uint64_t submitted = counted_locked();
  for (ContextWork& work : contexts_) {
    ScopedCurrent current(work.ctx);
    if (!current.ok()) continue;
    // Until a submission's time is known, the drain's synchronization is a measurement: a revoke
    // may come before any thread has waited at the bound, and every later grant would then queue
    // work of unknown length. Mark the tail so that every submission still queued is covered, and
    // measure only when the oldest of them cannot have started before it was submitted after the
    // last completion seen (after a completion seen late the GPU may have been on it for a while,
    // and the drain would see only a remainder). Known estimates are corrected by waits only: a
    // drain covers whatever was queued, kernels and replays together, and drains that corrected
    // them too let a 30% cap on graph replays reach 83-84% in two H100 calls.
    if (tau_ns_ == 0 && submitted > marked_) {
      record_locked(work, nullptr, submitted, /*context_wide=*/true);
    }
    const bool measurable =
        tau_ns_ == 0 && !reap_locked(work) && work.pending.front().recorded >= work.last_done;
    const MonoTime began = measurable ? work.pending.front().recorded : MonoTime{};
    const CUresult rc = driver().cuCtxSynchronize();
    if (rc != CUDA_SUCCESS) NVSHARE_DEBUG("drain: cuCtxSynchronize: %s", hooks::error_name(rc));
    const MonoTime done = clock_.now();
    if (rc == CUDA_SUCCESS && measurable && done > began) {
      learn_locked(work.pending.begin(), work.pending.end(),
                   static_cast<double>((done - began).count()));
    }
    reap_locked(work);
  }
  marked_ = std::max(marked_, submitted);
  return clock_.now() - start;
}

Duration WorkTracker::idle_for() noexcept {
  const MonoTime now = clock_.now();
  std::lock_guard lock(mu_);
  const std::uint64_t submitted = counted_locked();
  if (submitted != seen_) {
    // Submissions since the last look: the GPU was active until about now.
    seen_ = submitted;
    last_activity_ = now;
  }
  if (captures_.load(std::memory_order_acquire) != 0) return Duration::zero();
  if (submitted != marked_) {
    // Submissions after the newest markers: mark the tail, and look again next time.
    bool behind = false;
    for (ContextWork& work : contexts_) {
      ScopedCurrent current(work.ctx);
      if (current.ok()) record_locked(work, nullptr, submitted, /*context_wide=*/true);
      reap_locked(work);
      behind =
          behind || (!work.pending.empty() && now - work.pending.front().recorded > drain_bound());
    }
    marked_ = submitted;
    // Application threads look at the bound at marker points spaced by the time a submission was
    // learnt to take; work that became longer (short kernels, then long ones) would pile up for up
    // to kMarkerEvery submissions. A marker older than the bound brings the next marker point to
    // the next submission, which then waits for it and learns the new length.
    if (behind && next_marker_.load(std::memory_order_relaxed) > submitted + 1) {
      next_marker_.store(submitted + 1, std::memory_order_relaxed);
    }
    return Duration::zero();
  }
  bool all_done = true;
  for (ContextWork& work : contexts_) all_done = reap_locked(work) && all_done;
  if (!all_done || now == last_activity_) return Duration::zero();
  if (!trusted()) {
    // Idle: what comes next may be unlike what came before (a job's start-up, then its loop), and
    // nothing measured vouches for it. Markers start dense again from the next submission on.
    spacing_limit_ = kFirstMarkerEvery;
    next_marker_.store(std::min(next_marker_.load(std::memory_order_relaxed), submitted + 1),
                       std::memory_order_relaxed);
    for (ContextWork& work : contexts_) work.short_ns = 0;
  }
  return now - last_activity_;
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
  return stats_locked();
}

std::optional<TrackerStats> WorkTracker::stats_if_free() const {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return std::nullopt;
  return stats_locked();
}

TrackerStats WorkTracker::stats_locked() const {
  TrackerStats s;
  s.submissions = counted_locked();
  s.gpu_ns_per_submission = tau_ns_;
  s.tau_trusted = trusted();
  s.markers = markers_;
  s.bound_waits = bound_waits_.load(std::memory_order_relaxed);
  s.lessons = kernel_lessons_;
  s.disagreements = disagreements_;
  s.captures_open = capturing_.size();
  s.contexts = contexts_.size();
  s.graph_replays = graph_replays_;
  s.graphs_measured = static_cast<std::uint64_t>(std::count_if(
      graph_costs_.begin(), graph_costs_.end(), [](const GraphCost& cost) { return cost.ns > 0; }));
  return s;
}

}  // namespace nvshare::client::cuda
