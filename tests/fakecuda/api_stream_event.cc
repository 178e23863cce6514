// Exported: streams and events (stream capture and graphs are in api_graph.cc).
//
// All streams of a context feed its single queue in submission order, so a stream waits for every
// earlier operation of its context, not only its own: a valid, if conservative, ordering. Event
// timestamps are simulated completion times, so cuEventElapsedTime measures simulated GPU time.
#include <chrono>
#include <limits>
#include <thread>

#include "driver.h"

using fakecuda::current_context;
using fakecuda::Driver;
using fakecuda::guarded;
using fakecuda::require_init;

namespace {

// EventState::seq while a record is being submitted and its sequence number is not known yet.
constexpr std::uint64_t kRecordPending = std::numeric_limits<std::uint64_t>::max();

CUresult find_event(CUevent handle, std::shared_ptr<CUevent_st>* out) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  auto it = driver.events.find(handle);
  if (it == driver.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  *out = it->second;
  return CUDA_SUCCESS;
}

struct RecordState {
  std::shared_ptr<fakecuda::WorkQueue> queue;  // null: never recorded
  std::uint64_t seq = 0;
  bool stamped = false;
  std::int64_t timestamp_ns = 0;
};

// This thread's latest query: which event, which record of it, the thread's call count and when.
struct LastQuery {
  const CUevent_st* event = nullptr;
  std::uint64_t record_id = 0;
  std::uint64_t calls = 0;
  std::chrono::steady_clock::time_point at{};
};
thread_local LastQuery t_last_query;

// Queries of one event by one thread less than kPollGap apart with no other call of the thread
// between are that thread polling it (a thread that looks at pending events now and then, as an
// idle check does, is not waiting for them); one that finds the event recorded again since the
// previous query counts as a record while awaited.
constexpr auto kPollGap = std::chrono::milliseconds(1);

void note_poll(CUevent_st& event) {
  std::uint64_t record_id = 0;
  {
    std::lock_guard lock(event.mu);
    record_id = event.record_id;
  }
  const auto now = std::chrono::steady_clock::now();
  const LastQuery& last = t_last_query;
  if (last.event == &event && last.calls + 1 == fakecuda::t_calls && now - last.at < kPollGap &&
      last.record_id != record_id) {
    Driver::instance().records_while_awaited.fetch_add(1);
  }
  t_last_query = LastQuery{&event, record_id, fakecuda::t_calls, now};
}

RecordState record_state(CUevent_st& event) {
  for (;;) {
    {
      std::lock_guard lock(event.mu);
      if (event.seq != kRecordPending) {
        return RecordState{event.queue, event.seq, event.stamped_id == event.record_id,
                           event.timestamp_ns};
      }
    }
    std::this_thread::yield();  // another thread is inside cuEventRecord for this event
  }
}

CUresult stream_create(CUstream* phStream, unsigned flags, int priority) {
  std::shared_ptr<CUctx_st> ctx;
  if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
  if (phStream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  auto stream = std::make_shared<CUstream_st>();
  stream->ctx = ctx;
  stream->flags = flags;
  stream->priority = priority;
  Driver& driver = Driver::instance();
  stream->id = driver.next_id.fetch_add(1);
  std::lock_guard lock(driver.mu);
  driver.streams[stream.get()] = stream;
  *phStream = stream.get();
  return CUDA_SUCCESS;
}

CUresult stream_query(CUstream hStream) {
  std::shared_ptr<CUctx_st> ctx;
  std::shared_ptr<CUstream_st> stream;
  if (CUresult rc = fakecuda::resolve_stream(hStream, &ctx, &stream); rc != CUDA_SUCCESS) return rc;
  std::uint64_t seq = stream ? stream->last_seq.load() : ctx->queue->last_submitted();
  return ctx->queue->done(seq) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult stream_wait_event(CUstream hStream, CUevent hEvent, unsigned flags) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (flags != CU_EVENT_WAIT_DEFAULT && flags != CU_EVENT_WAIT_EXTERNAL)
    return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<CUevent_st> event;
  if (CUresult rc = find_event(hEvent, &event); rc != CUDA_SUCCESS) return rc;
  RecordState state = record_state(*event);
  std::shared_ptr<CUctx_st> ctx;
  std::shared_ptr<CUstream_st> stream;
  if (CUresult rc = fakecuda::resolve_stream(hStream, &ctx, &stream); rc != CUDA_SUCCESS) return rc;
  if (!state.queue) return CUDA_SUCCESS;  // never recorded: nothing to wait for
  fakecuda::Op op;
  op.kind = fakecuda::Op::Kind::kEventWait;
  op.event = event;
  op.wait_queue = state.queue;
  op.wait_seq = state.seq;
  return fakecuda::submit_to_stream(hStream, std::move(op));
}

CUresult stream_get_ctx(CUstream hStream, CUcontext* pctx) {
  std::shared_ptr<CUctx_st> ctx;
  std::shared_ptr<CUstream_st> stream;
  if (CUresult rc = fakecuda::resolve_stream(hStream, &ctx, &stream); rc != CUDA_SUCCESS) return rc;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = ctx.get();
  return CUDA_SUCCESS;
}

CUresult stream_get_priority(CUstream hStream, int* priority) {
  std::shared_ptr<CUctx_st> ctx;
  std::shared_ptr<CUstream_st> stream;
  if (CUresult rc = fakecuda::resolve_stream(hStream, &ctx, &stream); rc != CUDA_SUCCESS) return rc;
  if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *priority = stream ? stream->priority : 0;
  return CUDA_SUCCESS;
}

CUresult stream_get_flags(CUstream hStream, unsigned* flags) {
  std::shared_ptr<CUctx_st> ctx;
  std::shared_ptr<CUstream_st> stream;
  if (CUresult rc = fakecuda::resolve_stream(hStream, &ctx, &stream); rc != CUDA_SUCCESS) return rc;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = stream ? stream->flags : 0;
  return CUDA_SUCCESS;
}

CUresult event_record(CUevent hEvent, CUstream hStream, unsigned flags) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (flags != CU_EVENT_RECORD_DEFAULT && flags != CU_EVENT_RECORD_EXTERNAL) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::shared_ptr<CUevent_st> event;
  if (CUresult rc = find_event(hEvent, &event); rc != CUDA_SUCCESS) return rc;
  // A record into a capturing stream becomes part of the graph in the real driver; the fake's
  // graphs hold only work, so such a record does nothing.
  if (fakecuda::stream_capturing(hStream)) return CUDA_SUCCESS;
  if (event->awaited.load() > 0) Driver::instance().records_while_awaited.fetch_add(1);
  const std::uint64_t id = Driver::instance().next_id.fetch_add(1);
  std::uint64_t previous_seq = 0;
  {
    std::lock_guard lock(event->mu);
    event->record_id = id;
    previous_seq = event->seq;
    event->seq = kRecordPending;
  }
  fakecuda::Op op;
  op.kind = fakecuda::Op::Kind::kEventRecord;
  op.event = event;
  op.record_id = id;
  std::shared_ptr<fakecuda::WorkQueue> queue;
  std::uint64_t seq = 0;
  CUresult rc = fakecuda::submit_to_stream(hStream, std::move(op), &queue, &seq);
  std::lock_guard lock(event->mu);
  if (rc != CUDA_SUCCESS) {
    if (event->seq == kRecordPending) event->seq = previous_seq;
    return rc;
  }
  if (event->record_id == id) {
    event->queue = queue;
    event->seq = seq;
  }
  return CUDA_SUCCESS;
}

CUresult elapsed_time(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (pMilliseconds == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<CUevent_st> start;
  std::shared_ptr<CUevent_st> end;
  if (CUresult rc = find_event(hStart, &start); rc != CUDA_SUCCESS) return rc;
  if (CUresult rc = find_event(hEnd, &end); rc != CUDA_SUCCESS) return rc;
  if (((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) != 0)
    return CUDA_ERROR_INVALID_HANDLE;
  RecordState a = record_state(*start);
  RecordState b = record_state(*end);
  if (!a.queue || !b.queue) return CUDA_ERROR_INVALID_HANDLE;
  if (!a.queue->done(a.seq) || !b.queue->done(b.seq)) return CUDA_ERROR_NOT_READY;
  // Completed records are stamped before their sequence number completes; re-read the stamps.
  a = record_state(*start);
  b = record_state(*end);
  if (!a.stamped || !b.stamped) return CUDA_ERROR_NOT_READY;
  *pMilliseconds = static_cast<float>(static_cast<double>(b.timestamp_ns - a.timestamp_ns) / 1e6);
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return guarded([&] { return stream_create(phStream, Flags, 0); });
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  return guarded([&] { return stream_create(phStream, flags, priority); });
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    // Work already submitted still completes: it lives in the context's queue, not in the stream.
    return driver.streams.erase(hStream) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  });
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  return guarded([&] { return fakecuda::synchronize_stream(hStream); });
}
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream) {
  return guarded([&] { return fakecuda::synchronize_stream(hStream); });
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  return guarded([&] { return stream_query(hStream); });
}
CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream) {
  return guarded([&] { return stream_query(hStream); });
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return guarded([&] { return stream_wait_event(hStream, hEvent, Flags); });
}
CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return guarded([&] { return stream_wait_event(hStream, hEvent, Flags); });
}

CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  return guarded([&] { return stream_get_ctx(hStream, pctx); });
}
CUresult CUDAAPI cuStreamGetCtx_ptsz(CUstream hStream, CUcontext* pctx) {
  return guarded([&] { return stream_get_ctx(hStream, pctx); });
}
// CUDA 12.5: also the green context, which the fake does not have.
CUresult CUDAAPI cuStreamGetCtx_v2(CUstream hStream, CUcontext* pCtx, CUgreenCtx* pGreenCtx) {
  return guarded([&] {
    if (pGreenCtx != nullptr) *pGreenCtx = nullptr;
    return stream_get_ctx(hStream, pCtx);
  });
}
CUresult CUDAAPI cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext* pCtx, CUgreenCtx* pGreenCtx) {
  return guarded([&] {
    if (pGreenCtx != nullptr) *pGreenCtx = nullptr;
    return stream_get_ctx(hStream, pCtx);
  });
}
CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int* priority) {
  return guarded([&] { return stream_get_priority(hStream, priority); });
}
CUresult CUDAAPI cuStreamGetPriority_ptsz(CUstream hStream, int* priority) {
  return guarded([&] { return stream_get_priority(hStream, priority); });
}
CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int* flags) {
  return guarded([&] { return stream_get_flags(hStream, flags); });
}
CUresult CUDAAPI cuStreamGetFlags_ptsz(CUstream hStream, unsigned int* flags) {
  return guarded([&] { return stream_get_flags(hStream, flags); });
}

CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  return guarded([&] {
    std::shared_ptr<CUctx_st> ctx;
    if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
    if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
    constexpr unsigned kKnown =
        CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if ((Flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    auto event = std::make_shared<CUevent_st>(Flags);
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    driver.events[event.get()] = event;
    *phEvent = event.get();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    return driver.events.erase(hEvent) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  });
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  return guarded([&] { return event_record(hEvent, hStream, CU_EVENT_RECORD_DEFAULT); });
}
CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  return guarded([&] { return event_record(hEvent, hStream, CU_EVENT_RECORD_DEFAULT); });
}
CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  return guarded([&] { return event_record(hEvent, hStream, flags); });
}
CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags) {
  return guarded([&] { return event_record(hEvent, hStream, flags); });
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  return guarded([&] {
    std::shared_ptr<CUevent_st> event;
    if (CUresult rc = find_event(hEvent, &event); rc != CUDA_SUCCESS) return rc;
    RecordState state = record_state(*event);
    note_poll(*event);
    if (!state.queue) return CUDA_SUCCESS;
    return state.queue->done(state.seq) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  return guarded([&] {
    std::shared_ptr<CUevent_st> event;
    if (CUresult rc = find_event(hEvent, &event); rc != CUDA_SUCCESS) return rc;
    event->awaited.fetch_add(1);
    RecordState state = record_state(*event);
    if (state.queue) state.queue->wait_for(state.seq);
    const std::int64_t wake_ns = Driver::instance().blocking_wake_ns.load();
    if (wake_ns > 0 && (event->flags & CU_EVENT_BLOCKING_SYNC) != 0) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(wake_ns));
    }
    event->awaited.fetch_sub(1);
    return CUDA_SUCCESS;
  });
}

unsigned long long cuFakeRecordsWhileAwaited(void) {
  return Driver::instance().records_while_awaited.load();
}

void cuFakeSetBlockingWakeNs(long long ns) { Driver::instance().blocking_wake_ns.store(ns); }

CUresult CUDAAPI cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return guarded([&] { return elapsed_time(pMilliseconds, hStart, hEnd); });
}

// CUDA 12.8 changed only how events recorded by graphs and external waits are timed.
CUresult CUDAAPI cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return guarded([&] { return elapsed_time(pMilliseconds, hStart, hEnd); });
}

}  // extern "C"
