// WorkTracker: what this process has queued on one GPU, so that a revoke drains quickly, an idle
// holder can tell it is idle, and nothing ever synchronizes inside a stream capture.
//
// Markers. A submission whose running count reaches the next marker point (one relaxed atomic
// increment and one load: the whole fast path) records a marker event on the submitting stream
// (cuEventRecord: cheap, so markers can be frequent). The link thread's own markers, which must
// cover every stream (idle detection), are context-wide: cuCtxRecordEvent on CUDA 12.5+ drivers,
// else an event on the legacy default stream. Each context keeps its pending markers in order,
// each with the number of submissions it covers.
//
// Drain bound (the only place besides the grant where an application thread may block), by time:
// the tracker learns the GPU time one submission takes (tau: measured whenever a thread waits for a
// marker, from the marker's completion time, and at every drain, as an average), estimates the
// queued GPU time as the pending markers' submissions times tau, and when recording a marker waits
// (polling the event with sleeps of at most a sixteenth of the bound, outside every lock: the
// driver's own blocking wait was seen to wake a thread 90-110 ms late) for the marker after which
// at most the drain bound (NVSHARE_DRAIN_BOUND_MS) of work remains. Markers are spaced so that one
// covers about half the bound (at most kMarkerEvery submissions). Whatever tau says, a thread also
// waits for every marker older than the bound, and whenever more than kMaxPendingMarkers markers of
// unknown length are pending. Until tau is trusted every marker is of unknown length: before it is
// measured (at most two submissions of unknown length are queued before the first measurement), and
// after, until kConfirmations lessons agree with it (within a factor of two or kAgreeSlack, or
// shorter than it says; a span shorter than kAgreeSlack confirms nothing) with none in between that
// found the work longer over a span of more than kShortSpanOfBound of the bound (a shorter span
// that took longer than tau says may be another context's time slice: it only narrows the spacing
// to what keeps two markers within the bound were every submission as long as the span). Meanwhile
// markers start dense and their spacing doubles only on evidence: a wait that found the work no
// longer than tau says, or a marker point where every marker had completed and the newest span seen
// complete shows submissions short enough for twice the spacing (its submissions were made after it
// opened and had run by then); a span seen complete also narrows the spacing to what it shows. A
// marker complete only because the application synchronized and paused therefore never widens it,
// and when the link thread sees the process idle, markers start dense again. So tiny start-up
// kernels, a synchronize, then a loop of long kernels queue two of them before a wait measures
// them, not a marker spacing fitted to the tiny ones; a lesson that disagrees makes tau untrusted
// again. When the link thread's idle check finds a marker older than the bound still pending, the
// next submission is a marker point (kernels that became longer than tau says, submitted slowly,
// are caught within an idle check; work queued at CPU speed is caught only at the next marker
// point, at most kMarkerEvery submissions on; the same holds for a trusted tau, which alone spaces
// markers, when long kernels follow short ones with no idle period between). So but for those cases
// a revoke's drain waits for about the bound at most, for short and long kernels alike, while
// launch-bound work (tiny kernels the GPU keeps up with) never waits. The pace (bound_waited)
// counts only waits that had more than the bound queued.
//
// Graph replays. One replay may be a thousand kernels or one, so tau says nothing about it: every
// cuGraphLaunch records a marker of its own, and the tracker learns each executable graph's GPU
// time separately (kept for the kMaxGraphCosts most recently replayed graphs). A graph replayed for
// the first time is of unknown length until a wait measures it, so at most one such replay is
// queued unmeasured: a process that queues seconds of replays of a graph it has never run is held
// to the bound from its second replay on, whatever tau it learnt from its other work. A wait that
// covers several known submissions corrects all their estimates by the factor the estimate missed
// by.
//
// Stream capture. The capture hooks call begin_capture()/end_capture(). While any stream of the GPU
// is capturing, no marker is recorded or waited for (cuCtxRecordEvent would invalidate the
// capture), idle_for() reports busy, and drain() waits (bounded by kCaptureWaitBound) for the
// capture to end before it synchronizes. begin_capture runs the real call under the tracker's lock,
// so a marker can never race with a capture starting.
//
// Contexts. The tracker knows every context that submitted on this GPU (note_context) and keeps,
// per context, its marker events and a private non-blocking stream for the library's own
// prefetches. Context destruction runs under the tracker's lock (around_context_end) so the link
// thread never touches a context that is being destroyed.
//
// Threads: submitted(), begin/end_capture(), note_context() and private_stream() are called by
// application threads; drain(), idle_for() and with_any_context() by the link thread, which pushes
// the context it needs current and pops it again. Nothing throws (allocation failures lose a
// marker, never a submission).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "client/hooks/cuda_api.h"
#include "common/clock.h"

namespace nvshare::client::cuda {

// At most one marker per this many submissions: launch-bound work (tiny kernels) pays for a marker
// (a lock, event queries and an event record, a few microseconds) once per 256 launches. This
// spacing is also how many submissions may queue before a marker shows that kernels became longer
// than tau says (tiny start-up kernels teach a small tau, then come long ones): the idle checks of
// the link thread come too late for work queued at CPU speed, so it stays small.
inline constexpr std::uint64_t kMarkerEvery = 256;
// Until tau is trusted: a marker at the first submission (and at the first after an idle period),
// then every kFirstMarkerEvery submissions (doubling up to kMarkerEvery on evidence, above; no
// wider than tau fits once measured), and a thread waits as soon as more than kMaxPendingMarkers
// are pending. The same holds again after a lesson that disagreed with tau. So the first
// measurement comes after the first submission that is still running when the next one is made, and
// work of unknown length never piles up: a process that queues a few long graph replays and
// synchronizes once (its own synchronization teaches the tracker nothing) is bounded from its
// second submission on.
inline constexpr std::uint64_t kFirstMarkerEvery = 1;
inline constexpr std::size_t kMaxPendingMarkers = 1;
inline constexpr std::size_t kMaxPendingMarkersMeasured = 1024;  // only a memory bound
// Lessons in a row that must agree with tau (within a factor of two, or within kAgreeSlack of the
// estimate: a wait's wake-up alone can double a short span) before it is trusted.
inline constexpr int kConfirmations = 3;
inline constexpr Duration kAgreeSlack = std::chrono::milliseconds(1);
// A lesson longer than tau says disagrees only when its whole span took more than this share of the
// drain bound. A shorter one (another context's time slice inside a span of a few short kernels,
// on a GPU two jobs share) neither confirms tau nor undoes its trust; it narrows the spacing so
// that two markers stay within the bound even if every submission took as long as that span.
inline constexpr double kShortSpanOfBound = 0.25;
inline constexpr std::size_t kMaxGraphCosts = 512;  // executable graphs whose GPU time is kept
inline constexpr Duration kCaptureWaitBound = std::chrono::seconds(5);

struct TrackerStats {
  std::uint64_t submissions = 0;
  double gpu_ns_per_submission = 0;   // tau; 0 until measured
  bool tau_trusted = false;           // measured and confirmed (kConfirmations)
  std::uint64_t markers = 0;          // marker events recorded
  std::uint64_t bound_waits = 0;      // times a submitting thread waited for the drain bound
  std::uint64_t lessons = 0;          // waits and drains that measured plain submissions
  std::uint64_t disagreements = 0;    // of which tau was off by more than the agreement allows
  std::uint64_t captures_open = 0;    // streams capturing now
  std::uint64_t contexts = 0;         // contexts known on this GPU
  std::uint64_t graph_replays = 0;    // cuGraphLaunch calls seen (outside captures)
  std::uint64_t graphs_measured = 0;  // executable graphs whose GPU time is known now
};

class WorkTracker {
 public:
  WorkTracker(Duration drain_bound, const Clock& clock);

  // The bound on queued GPU time; set_drain_bound() changes it from the next marker point on (the
  // library holds a `low` client to a shorter one, so that a higher class gets the GPU quickly).
  Duration drain_bound() const noexcept {
    return Duration(drain_bound_ns_.load(std::memory_order_relaxed));
  }
  void set_drain_bound(Duration bound) noexcept {
    drain_bound_ns_.store(bound.count(), std::memory_order_relaxed);
  }
  WorkTracker(const WorkTracker&) = delete;
  WorkTracker& operator=(const WorkTracker&) = delete;

  // Application thread, after a submission to `ctx` (current on this thread) returned. `count` is
  // its number among the GPU's submissions (1, 2, ...: DeviceLink::after_submit() numbers them in
  // the gate's own atomic operation, so the fast path here is loads and, mostly, one plain store).
  void submitted(CUcontext ctx, CUstream stream, std::uint64_t count) noexcept {
    note_count(count);
    if (count >= next_marker_.load(std::memory_order_relaxed) &&
        captures_.load(std::memory_order_acquire) == 0) {
      record_and_bound(ctx, stream, count, nullptr);
    }
  }
  // Application thread, after a replay of `graph` on `stream` returned (numbered as above): always
  // records a marker (outside captures) so that the replay's GPU time is learnt and bounded on its
  // own.
  void replayed(CUcontext ctx, CUstream stream, CUgraphExec graph, std::uint64_t count) noexcept;

  // Runs the real cuStreamBeginCapture* call; counts the capture when it succeeded.
  template <typename Call>
  CUresult begin_capture(CUstream stream, Call&& call) {
    std::lock_guard lock(mu_);
    const CUresult rc = call();
    if (rc == CUDA_SUCCESS) {
      capturing_.push_back(stream);
      captures_.store(capturing_.size(), std::memory_order_release);
    }
    return rc;
  }
  // After the real cuStreamEndCapture* returned (whatever it returned: the capture is over).
  void end_capture(CUstream stream) noexcept;
  bool capturing() const { return captures_.load(std::memory_order_acquire) != 0; }

  // Registers a context that submits or allocates on this GPU (cheap when already known).
  void note_context(CUcontext ctx) noexcept;
  // Runs the real call that may end `ctx` (destroy, primary release/reset) under the tracker's
  // lock; forgets the context when `gone()` says it no longer exists afterwards.
  template <typename Call, typename Gone>
  CUresult around_context_end(CUcontext ctx, Call&& call, Gone&& gone) {
    std::lock_guard lock(mu_);
    const CUresult rc = call();
    if (rc == CUDA_SUCCESS && gone()) forget_locked(ctx);
    return rc;
  }
  bool knows_context(CUcontext ctx) const;

  // The library's own non-blocking stream in `ctx`, which must be current on the calling thread.
  // Null when it cannot be created.
  CUstream private_stream(CUcontext ctx) noexcept;

  // Link thread. Waits for everything queued on this GPU; returns how long it waited.
  Duration drain() noexcept;
  // Link thread. Time since the last submission when all of it has completed; zero otherwise.
  Duration idle_for() noexcept;
  // Link thread. Runs fn(ctx, stream) with a live context of this GPU current on the calling thread
  // and that context's private stream; false when the GPU has no live context.
  bool with_any_context(const std::function<void(CUcontext, CUstream)>& fn) noexcept;

  TrackerStats stats() const;
  // The same, but never waits: nullopt while another thread holds the tracker (at exit a drain may
  // hold it for as long as the GPU takes to finish what is queued).
  std::optional<TrackerStats> stats_if_free() const;
  // Time submitting threads have spent waiting for the drain bound so far while more than the bound
  // was queued (a thread that queues faster than the GPU runs its work waits here: the pace the
  // scheduler is told, pace_meter.h). Waits that turn out to have covered less are not counted.
  Duration bound_waited() const {
    return Duration(bound_waited_ns_.load(std::memory_order_relaxed));
  }
  // Submitting threads waiting for the drain bound now. Such a thread waits for this process's own
  // queued work: when the GPU is idle meanwhile, its wake-up is late, and the process is not idle.
  std::uint64_t threads_at_bound() const noexcept {
    return threads_at_bound_.load(std::memory_order_acquire);
  }

 private:
  struct Marker {
    CUevent event = nullptr;
    MonoTime recorded{};
    MonoTime opened{};              // when the previous marker of its context was recorded
    std::uint64_t submissions = 0;  // covered since the previous marker (graph replays apart)
    CUgraphExec graph = nullptr;    // the replay this marker directly follows, if any
    double graph_ns = 0;            // that replay's estimated GPU time; 0 while unknown
  };
  struct GraphCost {
    CUgraphExec graph = nullptr;
    double ns = 0;
    std::uint64_t used = 0;  // replay sequence number of its latest use (least recent is evicted)
    std::uint64_t corrected = 0;  // the lesson that last corrected it (once per lesson)
  };
  struct ContextWork {
    CUcontext ctx = nullptr;
    std::deque<Marker> pending;
    std::vector<CUevent> spare;  // completed marker events, reused
    // Marker events a thread is waiting for (once per waiting thread), and completed ones kept out
    // of `spare` until their last waiter is done: an event recorded again while a thread waits for
    // it makes that thread wait for the newer work (on an H200 it slept on with the GPU idle).
    std::vector<CUevent> awaited;
    std::vector<CUevent> held;
    CUstream stream = nullptr;  // private stream, created on first use
    MonoTime last_done{};       // when the newest completed marker was seen complete
    MonoTime last_recorded{};   // when the newest marker was recorded (or the context noted)
    // At most this GPU time per submission, shown by the newest marker seen complete (its span's
    // submissions were made after it opened and had run by then); 0: no such evidence since it
    // was last used.
    double short_ns = 0;
  };

  // Records a marker after submission `count` (a replay of `graph`, or null for other work) and
  // waits while the queued estimate is over the bound.
  void record_and_bound(CUcontext ctx, CUstream stream, std::uint64_t count,
                        CUgraphExec graph) noexcept;
  ContextWork* find_locked(CUcontext ctx);
  ContextWork* add_locked(CUcontext ctx);
  void forget_locked(CUcontext ctx);
  // Records a marker; the context must be current on this thread. Context-wide (every stream of
  // `work.ctx`, cuCtxRecordEvent) or on `stream` only (cuEventRecord).
  bool record_locked(ContextWork& work, CUstream stream, std::uint64_t count, bool context_wide,
                     CUgraphExec graph = nullptr);
  // Tau is measured and confirmed (kConfirmations).
  bool trusted() const { return tau_ns_ > 0 && agreed_ >= kConfirmations; }
  // The marker spacing (1..kMarkerEvery) whose submissions take about half the bound at this GPU
  // time each.
  std::uint64_t spacing_for(double ns_per_submission) const;
  // A marker's estimated GPU time, and whether part of it is of unknown length.
  double estimate(const Marker& marker) const;
  bool unknown(const Marker& marker) const;
  // The entry kept for `graph`, or null.
  GraphCost* find_graph_locked(CUgraphExec graph);
  // Learnt GPU time of one replay of `graph` (a use: it is kept longer); 0 when unknown.
  double graph_cost_locked(CUgraphExec graph);
  // Keeps `ns` as the graph's time (adding it, evicting the least recently replayed when full)
  // and updates its pending markers.
  void set_graph_cost_locked(CUgraphExec graph, double ns);
  void keep_graph_cost_locked(GraphCost& cost, double ns);
  // Learns from `elapsed` GPU time spent on markers [first, last) (all complete).
  void learn_locked(std::deque<Marker>::const_iterator first,
                    std::deque<Marker>::const_iterator last, double elapsed_ns);
  TrackerStats stats_locked() const;
  // Keeps a completed marker event for reuse (never throws: it is destroyed when that fails); one a
  // thread is waiting for is reused only once that thread is done (done_awaiting_locked).
  static void recycle(ContextWork& work, CUevent event) noexcept;
  // A thread waits for `event` / is done waiting for it.
  static void awaiting_locked(ContextWork& work, CUevent event) noexcept;
  static void done_awaiting_locked(ContextWork& work, CUevent event) noexcept;
  // Pops completed markers (keeping the evidence short_ns of the newest cleanly completed one);
  // true when none is pending any more.
  bool reap_locked(ContextWork& work);
  // The event to wait for when this context has too much queued (the newest marker that must
  // complete for the bound to hold again); else null.
  CUevent over_bound_locked(const ContextWork& work) const;
  void note_count(std::uint64_t count) noexcept {
    if (count > submissions_.load(std::memory_order_relaxed)) {
      submissions_.store(count, std::memory_order_relaxed);
    }
  }
  // Submissions made so far as far as the tracker knows: never fewer than it has marked.
  std::uint64_t counted_locked() const {
    return std::max(submissions_.load(std::memory_order_acquire), marked_);
  }

  // After waiting for `event` (completed at `done`): pops it and the markers before it, and learns
  // tau from them. False when it was no longer pending (another thread saw it complete first).
  bool waited_locked(CUcontext ctx, CUevent event, MonoTime done);

  // The drain bound in nanoseconds: set at start, changed by set_drain_bound() (a class change).
  std::atomic<Duration::rep> drain_bound_ns_;
  const Clock& clock_;
  // The highest submission number seen, kept with a plain store: two threads may store out of
  // order, so it can briefly read lower than a number already marked; counted_locked() never does.
  alignas(64) std::atomic<std::uint64_t> submissions_{0};
  std::atomic<std::uint64_t> next_marker_{kFirstMarkerEvery};
  std::atomic<std::uint64_t> captures_{0};

  mutable std::mutex mu_;
  std::condition_variable capture_ended_;
  std::vector<ContextWork> contexts_;
  std::vector<CUstream> capturing_;  // one entry per open capture (a stream may repeat)
  std::uint64_t marked_ = 0;         // submissions covered by the newest markers
  double tau_ns_ = 0;                // GPU time per submission, learnt from waits
  int agreed_ = 0;                   // lessons in a row that agreed with tau
  std::uint64_t spacing_limit_ = kFirstMarkerEvery;  // widest marker spacing confirmed so far
  std::uint64_t seen_ = 0;                           // submissions at the last idle check
  MonoTime last_activity_{};
  std::uint64_t markers_ = 0;
  std::vector<GraphCost> graph_costs_;  // at most kMaxGraphCosts
  std::uint64_t graph_replays_ = 0;
  std::uint64_t lessons_ = 0;  // corrections learn_locked has applied
  std::uint64_t kernel_lessons_ = 0;
  std::uint64_t disagreements_ = 0;
  std::atomic<std::uint64_t> bound_waits_{0};
  std::atomic<std::int64_t> bound_waited_ns_{0};
  std::atomic<std::uint64_t> threads_at_bound_{0};
};

}  // namespace nvshare::client::cuda
