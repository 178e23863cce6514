// Exported: stream capture, CUDA graphs (just enough to capture, instantiate and launch work) and
// cuCtxRecordEvent.
//
// Capture works on created streams (not on the legacy or per-thread default stream, which return
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED): between cuStreamBeginCapture* and cuStreamEndCapture*,
// kernels, copies, memsets and prefetches submitted to the stream are appended to a graph instead
// of running (event records into it do nothing). cuGraphInstantiate* copies the graph's operations;
// cuGraphLaunch submits the copies to a stream, in order, where they run like the originals would.
// As in the real driver, cuCtxSynchronize and cuCtxRecordEvent on a context with an open capture
// fail with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate the capture: its end reports
// CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. That lets tests prove a library never synchronizes or
// records into an open capture.
#include "driver.h"

using fakecuda::current_context;
using fakecuda::Driver;
using fakecuda::guarded;
using fakecuda::require_init;

namespace {

// The created stream a capture call names (null when it names a default stream).
CUresult capture_stream(CUstream handle, std::shared_ptr<CUstream_st>* stream) {
  std::shared_ptr<CUctx_st> ctx;
  if (CUresult rc = fakecuda::resolve_stream(handle, &ctx, stream); rc != CUDA_SUCCESS) return rc;
  return *stream ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

CUresult begin_capture(CUstream handle, std::shared_ptr<CUgraph_st> into) {
  std::shared_ptr<CUstream_st> stream;
  if (CUresult rc = capture_stream(handle, &stream); rc != CUDA_SUCCESS) return rc;
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  if (stream->capture) return CUDA_ERROR_ILLEGAL_STATE;
  stream->capture = into ? std::move(into) : std::make_shared<CUgraph_st>();
  stream->capture_invalidated = false;
  return CUDA_SUCCESS;
}

std::shared_ptr<CUgraph_st> find_graph(CUgraph graph) {
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  auto it = driver.graphs.find(graph);
  return it == driver.graphs.end() ? nullptr : it->second;
}

CUresult begin_capture_to_graph(CUstream handle, CUgraph graph) {
  auto found = find_graph(graph);
  if (!found) return CUDA_ERROR_INVALID_VALUE;
  return begin_capture(handle, std::move(found));
}

CUresult end_capture(CUstream handle, CUgraph* phGraph) {
  std::shared_ptr<CUstream_st> stream;
  if (CUresult rc = capture_stream(handle, &stream); rc != CUDA_SUCCESS) {
    return rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ? CUDA_ERROR_ILLEGAL_STATE : rc;
  }
  if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  if (!stream->capture) return CUDA_ERROR_ILLEGAL_STATE;
  std::shared_ptr<CUgraph_st> graph = std::move(stream->capture);
  stream->capture.reset();
  *phGraph = nullptr;
  if (stream->capture_invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  driver.graphs[graph.get()] = graph;
  *phGraph = graph.get();
  return CUDA_SUCCESS;
}

CUresult is_capturing(CUstream handle, CUstreamCaptureStatus* status) {
  std::shared_ptr<CUctx_st> ctx;
  std::shared_ptr<CUstream_st> stream;
  if (CUresult rc = fakecuda::resolve_stream(handle, &ctx, &stream); rc != CUDA_SUCCESS) return rc;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (stream) {
    std::lock_guard lock(Driver::instance().mu);
    if (stream->capture) {
      *status = stream->capture_invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                            : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    }
  }
  return CUDA_SUCCESS;
}

CUresult instantiate(CUgraphExec* phGraphExec, CUgraph hGraph) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  if (phGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto graph = find_graph(hGraph);
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  auto exec = std::make_shared<CUgraphExec_st>();
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  exec->ops = graph->ops;
  driver.graph_execs[exec.get()] = exec;
  *phGraphExec = exec.get();
  return CUDA_SUCCESS;
}

CUresult launch_graph(CUgraphExec hGraphExec, CUstream stream) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  std::vector<fakecuda::Op> ops;
  {
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    auto it = driver.graph_execs.find(hGraphExec);
    if (it == driver.graph_execs.end()) return CUDA_ERROR_INVALID_VALUE;
    ops = it->second->ops;
  }
  for (fakecuda::Op& op : ops) {
    op.seq = 0;
    op.submit_ns = 0;
    if (CUresult rc = fakecuda::submit_to_stream(stream, std::move(op)); rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  if (ops.empty()) {
    // An empty graph still orders the stream: resolve it to report a bad handle.
    std::shared_ptr<CUctx_st> ctx;
    std::shared_ptr<CUstream_st> resolved;
    return fakecuda::resolve_stream(stream, &ctx, &resolved);
  }
  return CUDA_SUCCESS;
}

template <typename Registry>
CUresult erase(Registry& registry, const void* key) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  std::lock_guard lock(Driver::instance().mu);
  return registry.erase(key) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream) {
  return guarded([&] { return begin_capture(hStream, nullptr); });
}
CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream) {
  return guarded([&] { return begin_capture(hStream, nullptr); });
}
CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode /*mode*/) {
  return guarded([&] { return begin_capture(hStream, nullptr); });
}
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode /*mode*/) {
  return guarded([&] { return begin_capture(hStream, nullptr); });
}
CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                             const CUgraphNode* /*dependencies*/,
                                             const CUgraphEdgeData* /*dependencyData*/,
                                             size_t /*numDependencies*/,
                                             CUstreamCaptureMode /*mode*/) {
  return guarded([&] { return begin_capture_to_graph(hStream, hGraph); });
}
CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                  const CUgraphNode* /*dependencies*/,
                                                  const CUgraphEdgeData* /*dependencyData*/,
                                                  size_t /*numDependencies*/,
                                                  CUstreamCaptureMode /*mode*/) {
  return guarded([&] { return begin_capture_to_graph(hStream, hGraph); });
}
CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return guarded([&] { return end_capture(hStream, phGraph); });
}
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph* phGraph) {
  return guarded([&] { return end_capture(hStream, phGraph); });
}
CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return guarded([&] { return is_capturing(hStream, captureStatus); });
}
CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  return guarded([&] { return is_capturing(hStream, captureStatus); });
}

CUresult CUDAAPI cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    auto graph = std::make_shared<CUgraph_st>();
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    driver.graphs[graph.get()] = graph;
    *phGraph = graph.get();
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
  return guarded([&] { return erase(Driver::instance().graphs, hGraph); });
}
CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                             unsigned long long /*flags*/) {
  return guarded([&] { return instantiate(phGraphExec, hGraph); });
}
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* phGraphExec, CUgraph hGraph,
                                    CUgraphNode* phErrorNode, char* logBuffer, size_t bufferSize) {
  return guarded([&] {
    if (phErrorNode != nullptr) *phErrorNode = nullptr;
    if (logBuffer != nullptr && bufferSize > 0) logBuffer[0] = '\0';
    return instantiate(phGraphExec, hGraph);
  });
}
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* phGraphExec, CUgraph hGraph,
                                       CUgraphNode* phErrorNode, char* logBuffer,
                                       size_t bufferSize) {
  return cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}
CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
  return guarded([&] { return erase(Driver::instance().graph_execs, hGraphExec); });
}
CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  return guarded([&] { return launch_graph(hGraphExec, hStream); });
}
CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return guarded([&] { return launch_graph(hGraphExec, hStream); });
}

CUresult CUDAAPI cuCtxRecordEvent(CUcontext hCtx, CUevent hEvent) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    std::shared_ptr<CUctx_st> ctx = Driver::instance().find_context(hCtx);
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    if (fakecuda::invalidate_captures(ctx.get())) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    // All streams of a context share its one queue: an event recorded at its end covers them all.
    // Make ctx current for the record (what the context argument means), then restore.
    auto& stack = fakecuda::context_stack();
    stack.push_back(ctx.get());
    const CUresult rc = cuEventRecord(hEvent, nullptr);
    stack.pop_back();
    return rc;
  });
}

}  // extern "C"
