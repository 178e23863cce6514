// The seam between the CUDA-facing half of libnvshare.so (hooks, memory, drain, swap) and its
// scheduler-facing half (the link thread, the grant state).
//
// One DeviceLink exists per GPU the process touches (keyed by UUID). The hooks own a DeviceAgent
// for that GPU — the CUDA operations the link asks for — and call the DeviceLink on every
// submission:
//
//   hooks (application threads)                     link thread
//   ---------------------------                     -----------
//   link.before_submit()  -- fast path: held? ----> (nothing)
//        slow path: request, block until granted <-- grant (after agent.swap_in() if swapped out)
//   link.after_submit()   -- counts, no syscall; numbers the submission if it queued work
//                                                   revoke: stop new submissions, agent.drain(),
//                                                     agent.swap_out() if asked, send released
//                                                   swap notice: agent.prepare_swap_out(bytes)
//                                                   idle: agent.idle_for() >= idle time -> release
//                                                   limits: agent.apply_limits()
//                                                   usage: agent.usage() sent when it changes
//
// Contract
//  - before_submit() costs one atomic read-modify-write while the grant is held (it counts the
//  thread
//    as inside a submission, so a revoke can wait for launches already half-way through before it
//    drains). Every before_submit() is paired with one after_submit(), even when the call failed.
//    Otherwise before_submit() registers (first use),
//    requests and blocks until granted. It never fails and never blocks forever because of the
//    scheduler: while the scheduler is unreachable the link is open (fail-open: every call returns
//    at once), and a holder that stops answering is not waited on.
//  - The link calls the agent only from its own thread, never while an application thread is inside
//    before_submit() waiting on the agent, so the agent may use the driver freely (it sets the
//    device's context current on the link thread itself).
//  - Each GPU has its own link thread, so a long swap on one GPU never delays another GPU's grant.
//    The agent calls the real driver functions, never the hooked ones.
//  - Declared limits (NVSHARE_MEMORY_LIMIT, or the settings file's) reach the agent through
//    apply_limits() right after link_device(); the scheduler's limits frame replaces them. A frame
//    marked provisional (a scheduler unsure of this client's limits) applies only where it is
//    stricter than the last limits known to hold. While the settings file says the pod's limit is
//    pending, limits_unknown() comes first and the link re-reads the file until it is known, and
//    while the scheduler is unreachable it re-reads it for changes: limits never fail open.
//  - Registration. link_device() starts the GPU's session and returns at once (the hooks call it
//    while holding their registry lock). The hooks then call await_registration() with no lock
//    held, before the first allocation on that GPU: it waits until the scheduler has welcomed the
//    session and the agent has applied its first limits frame (which always follows the welcome),
//    so a limit the scheduler holds for the pod is in force from the first allocation. It returns
//    at once when the scheduler is unreachable (nothing at the socket, connection refused: the
//    connect error ends the wait), once the session is settled, on the link's own thread, and
//    after NVSHARE_REGISTER_WAIT_MS (kDefaultRegisterWait, 1 s) counted from link_device() in any
//    case: a scheduler that accepts but does not answer costs the process at most that, once per
//    GPU. While it waits, the link thread needs no lock the hooks hold (apply_limits() and usage()
//    read and write atomics of the ledger only).
//  - No exception leaves this interface; nothing here calls exit() or abort().
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/mono_time.h"
#include "common/protocol.h"

namespace nvshare::client {

// How long the first CUDA call on a GPU waits for the scheduler's welcome and first limits frame
// (NVSHARE_REGISTER_WAIT_MS; the knob's default must be this).
inline constexpr std::chrono::milliseconds kDefaultRegisterWait{1000};

struct DeviceUsage {
  std::uint64_t allocated_bytes = 0;
  std::uint64_t resident_bytes = 0;
  std::uint64_t swap_bytes_per_s = 0;     // measured by the last swap, 0 until one happened
  std::uint64_t refused_allocations = 0;  // allocations refused by the memory limit so far
  std::uint64_t pinned_bytes = 0;         // of allocated, what a swap leaves on the GPU (CUDA IPC)
};

// CUDA-side operations the link thread asks for. Implemented by the hooks' side (src/client/cuda/).
class DeviceAgent {
 public:
  virtual ~DeviceAgent() = default;
  // Waits until the work submitted so far on this GPU has completed. Must not be called while a
  // stream is being captured (the agent waits for the capture to end first). Returns how long it
  // waited.
  virtual Duration drain() = 0;
  // Moves this process's allocations on the GPU to host memory in bulk, whole allocations, until at
  // least `target` bytes moved (0: all of them); returns bytes moved. What stays is swapped in with
  // the rest by swap_in(), and a later swap_out() moves more of it.
  virtual std::uint64_t swap_out(std::uint64_t target = 0) = 0;
  // Moves them back to the GPU in bulk; returns bytes moved. With a `limit`, moves back at most
  // that many bytes (whole pieces, in address order, none the GPU cannot give at once) and stays
  // swapped out: room the scheduler gave while the process waits for its grant.
  virtual std::uint64_t swap_in(std::uint64_t limit = 0) = 0;
  // The scheduler announced that this grant's revoke will ask for a swap-out of `bytes` (0: all):
  // ready what that swap-out needs (host copies) in the background, while the process keeps
  // running. Returns at once; the swap_out() that follows waits for work already under way rather
  // than repeat it.
  virtual void prepare_swap_out(std::uint64_t /*bytes*/) {}
  // Time since the last submission if all submitted work has completed; zero while work is in
  // flight.
  virtual Duration idle_for() = 0;
  virtual DeviceUsage usage() = 0;
  // Submitting threads' waits for the drain bound so far (pace_meter.h): cheap, read at every
  // event of the link, unlike usage().
  virtual Duration queue_waited() = 0;
  // Submitting threads waiting now for the drain bound, that is for this process's own queued work
  // (WorkTracker::threads_at_bound): cheap, read at every idle check.
  virtual std::uint64_t threads_at_bound() = 0;
  // New limits from the scheduler (memory 0 = unlimited; core is informational for the client).
  virtual void apply_limits(const protocol::Limits& limits) = 0;
  // The limits this process must keep are not known yet (see settings_file.h: a managed container
  // whose settings say pending, and no scheduler has said): allocations fail until apply_limits().
  virtual void limits_unknown() = 0;
};

struct DeviceIdentity {
  std::string gpu_uuid;                // "GPU-..."
  std::uint64_t gpu_memory_bytes = 0;  // physical memory as the driver reports it
};

class DeviceLink {
 public:
  virtual ~DeviceLink() = default;
  // Application threads, before a launch, copy or memset on this GPU.
  virtual void before_submit() = 0;
  // Application threads, after the submission returned; `queued`: it succeeded (queued work).
  // Returns, for a queued one, its number among this GPU's queued submissions (1, 2, ... in the
  // order their threads returned here; the work tracker's count, kept in the same atomic
  // operation); 0 otherwise.
  virtual std::uint64_t after_submit(bool queued) = 0;
  // Allocation or free changed usage: the link reports it (coalesced, from its own thread).
  virtual void usage_changed() = 0;
  // Application threads, with no lock held, after link_device() and before the first allocation:
  // waits (bounded, see "Registration" above) until the scheduler's limits are in force or the
  // scheduler is known to be unreachable. Costs one atomic load once settled.
  virtual void await_registration() = 0;
};

// The process-wide link: one background thread, one scheduler session per registered GPU.
// `agent` must outlive the process (the hooks keep theirs in static storage).
// Returns the same DeviceLink for the same UUID. Thread-safe.
DeviceLink& link_device(const DeviceIdentity& identity, DeviceAgent& agent);

}  // namespace nvshare::client
