// GrantSession: the client's half of the protocol for one GPU, as a deterministic state machine.
//
// The scheduler's half is GpuPolicy; this is its mirror in the client. The link shell
// (link_engine.h) turns socket input, wake-ups and the results of CUDA work into events, feeds
// them with the current time, and carries out the actions it gets back, in order. tests/sim drives
// the same engine against the real scheduler in virtual time.
//
// Contract
//  - Pure: no sockets, no threads, no locks, no clock reads. `now` is an argument; a `now` earlier
//    than one already seen is treated as that earlier time.
//  - handle(event, now) applies one event and returns the actions to carry out, in order.
//  - Six actions ask for work whose result comes back as an event: Connect (Connected or
//    ConnectFailed), CloseGateToRelease (GateClosed), Drain (Drained), SwapOut (SwappedOut), SwapIn
//    (SwappedIn) and ReadSettings (SettingsRead). At most one is outstanding, always the last
//    action of its batch; until its answer comes, other events wait in the engine's inbox and are
//    handled after it, in order (a frame that arrives during a swap is read after the swap, as a
//    shell with one thread per GPU reads it). Stop is never deferred.
//  - next_deadline() is the earliest time something is due (a reconnect, a handshake or liveness
//    bound, the end of the wait for threads inside a submission, an idle check, a coalesced usage
//    report, a settings read, the end of a pace window while held); the caller feeds Tick{} at or
//    after it, and whenever an application
//    thread may have started waiting (the probe's waiters() changed). nullopt: nothing is due.
//  - Quick facts about the process are read through SessionProbe when they are needed (threads
//    waiting and inside a submission, idle time, memory use); the engine calls it only from
//    handle(), never after Stop.
//  - Nothing throws out of handle() but std::bad_alloc.
//
// States (GrantState); the gate is open in kOpen, kHeld and kStopped, closed otherwise:
//
//   kStarting --welcome--> kIdle --a thread waits: request--> kRequested --grant--> kHeld
//       |                   ^ ^                                ^                     | |
//       |                   | |                                +-- kRevoking <-revoke-+ |
//       |                   | |                                    (drain, swap out if  |
//       |                   | |                                     asked, released)    |
//       |                   | +------------ idle: released (drain 0) -------------------+
//       |                   +-------------- grant while swapped out and idle: released at once
//       +--connect fails--> kOpen --reconnected, welcome--> kIdle
//   any state but kStopped --connection lost--> kOpen;   any state --Stop--> kStopped
//
//  - kStarting: the first connection is being made; threads wait for its outcome (registering
//    first is what makes the first submission scheduled).
//  - kOpen: the scheduler is unreachable (absent, refused, dropped, no welcome in time, silent
//    past the liveness bound): every submission passes (fail-open), swapped-out memory is brought
//    back, and the engine reconnects with exponential backoff. Once a new session is welcomed the
//    GPU is closed until granted again, like a new client.
//  - kRevoking: the gate is closed; the engine waits (bounded by inside_bound) for threads inside a
//    submission to leave it, drains, swaps out when asked, reports usage, then sends released. The
//    scheduler re-queues a client that answered a revoke, so the state becomes kRequested without
//    a request.
//  - A revoke for another epoch than the held grant's is ignored, and so is a grant while holding.
//    A yield (soft revoke) for the held grant shortens the idle time after which it is released.
//    A swap notice for the held grant (protocol version 8: its revoke will ask for a swap-out)
//    asks the agent to ready the swap while the grant is held (PrepareSwapOut); others are ignored.
//    It also shortens the idle time after which the grant is released (noticed_idle()): a job
//    waits for this one's memory, so the end of this one's work should not wait out the idle
//    release, yet a pause of the kind the process has made before is no reason to hand over.
//  - An eviction (protocol version 9) in kIdle or kRequested: the memory kept on the GPU without a
//    grant goes to the host (Drain, then SwapOut) and the usage is reported at once; a grant later
//    swaps it back in. Already swapped out: the usage is reported again. Ignored while holding.
//  - Swap-outs (a revoke's, an eviction's) go in steps of kSwapStep, the usage reported after each
//    but the last (which the release or the eviction's report follows): the scheduler sees the
//    room being made as it is made.
//  - Room (protocol version 12) in kRequested with memory on the host: what fits of it comes back
//    (SwapIn with a limit: the room less what is on the device already), the gate closed, and
//    the usage is reported at once; the grant brings back the rest. A process that does not want
//    the GPU any more (no thread waits, idle past the idle release) takes none.
//  - Limits: the declared ones (or the settings file's) apply before anything else; while the
//    settings file says the pod's limit is pending, LimitsUnknown comes first and the file is
//    read until it gives one. An authoritative limits frame replaces the limits known to hold; a
//    provisional one applies only where it is stricter. While the scheduler is unreachable the
//    file is read now and then for a changed limit. Limits never fail open.
//  - Pace: over each half second of held time, the share spent with a deep queue (threads waiting
//    for the drain bound, probe queue_waited()) is measured (PaceMeter) and, when it changed,
//    sent with the next usage report (protocol version 3).
//  - Registration is settled (SettleRegistration) at the first limits frame of a session, at a
//    failed connect, a lost connection or Stop, unless the limits are still unknown.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "client/device_link.h"
#include "client/link/pace_meter.h"
#include "common/last_values.h"
#include "common/log.h"
#include "common/mono_time.h"
#include "common/protocol.h"

namespace nvshare::client {

enum class GrantState : std::uint8_t {
  kStarting,
  kOpen,
  kIdle,
  kRequested,
  kHeld,
  kRevoking,
  kStopped,
};
const char* to_string(GrantState state);

// Idle time after which a holder asked to yield releases: long enough not to hand over in the gap
// between two launches of a busy loop, short against the host work of an interactive job.
inline constexpr Duration kYieldIdle = std::chrono::microseconds(200);
// How often a holder asked to yield looks whether it is idle (otherwise every half idle release, at
// most once a millisecond).
inline constexpr Duration kYieldCheckEvery = std::chrono::microseconds(250);
// Idle time after which a holder told that a waiting job needs its memory (a swap notice) or that a
// lower class held back waits for it (contended) releases, at least: twice the pause the process
// makes again and again (recurring_pause()), if longer, and never more than the idle release. A
// pause is an idle stretch, while holding, that ended in new work: one seen between two idle
// checks, or one that a release of this kind cut short, up to when a thread next began to wait
// (SessionProbe::waiting_since). An idle stretch during which an idle check saw a thread inside a
// submission, or waiting for the drain bound, is no pause (the process was submitting: the driver
// held the call, or woke a thread late from its wait for work already done), and no holder
// releases while a thread is in either.
inline constexpr Duration kNoticedIdle = std::chrono::milliseconds(20);
// The same floor when only contended came: a release then moves no memory (the lower class runs
// beside what this process keeps on the GPU), so handing a pause over costs this process at most
// the lower class's drain when it comes back, against a whole swap each way after a swap notice.
// It is shorter so that a held-back job gets the pause sooner; a pause of the kind the process
// makes again and again still keeps the grant.
inline constexpr Duration kContendedIdle = std::chrono::milliseconds(5);
// The pauses a holder remembers: its last kPausesKept. The pause it waits out is the second longest
// of them, the longest that was made at least twice: a pause of its steady work (a gap every step)
// is waited out after it was seen twice, while a one-off (start-up before a loop, a collection, a
// hiccup of the host) never takes the short floor away, and is forgotten once as many pauses came
// after it.
inline constexpr std::size_t kPausesKept = 16;
// A swap-out moves this much (whole pieces, at least) between two usage reports: a few
// milliseconds of copies at PCIe speed, against which a report and the next step's start are
// nothing.
inline constexpr std::uint64_t kSwapStep = 256ull << 20;

// The session's clocks, set by whoever runs it (LinkOptions, tests, the simulation).
struct SessionTiming {
  Duration idle_release = std::chrono::milliseconds(100);  // zero: never release when idle
  Duration reconnect_initial = std::chrono::milliseconds(50);
  Duration reconnect_max = std::chrono::milliseconds(2000);
  // Usage reports are coalesced to at most one per interval (swaps and new sessions report at
  // once).
  Duration usage_interval = std::chrono::milliseconds(50);
  // A scheduler that accepted the connection but does not welcome within this is treated as absent.
  Duration handshake_timeout = std::chrono::seconds(2);
  // After this much silence the engine pings; after dead_after more the session is dropped.
  Duration ping_after = std::chrono::seconds(5);
  Duration dead_after = std::chrono::seconds(5);
  // How long a revoke waits for threads still inside a submission before it drains anyway (a thread
  // can be inside one GPU's submission while it waits for another GPU's grant).
  Duration inside_bound = std::chrono::seconds(1);
};

struct SessionConfig {
  // Identity announced in hello.
  std::string gpu_uuid;
  std::uint64_t gpu_memory_bytes = 0;
  std::uint32_t pid = 0;
  std::string pod_uid;
  std::string process_name;
  bool can_swap = true;
  protocol::Limits declared;
  // The settings file says the pod's memory limit is pending: allocations wait for it.
  bool limits_pending = false;
  // There is a settings file to re-read (while pending, or while the scheduler is unreachable).
  bool has_settings_file = false;

  SessionTiming timing;
  // Debug notes are built only when someone reads them.
  bool debug_notes = false;
};

// Quick facts the engine reads while it handles an event (atomics and the agent's counters in the
// shell; the simulated process in tests/sim).
class SessionProbe {
 public:
  virtual ~SessionProbe() = default;
  virtual int waiters() = 0;             // application threads waiting at the closed gate
  virtual MonoTime waiting_since() = 0;  // when the first of them began to wait (waiters() > 0)
  virtual std::uint64_t inside() = 0;    // threads inside a submission
  // Threads waiting for the drain bound, after their submission (outside the gate, so a revoke
  // never waits for them): DeviceAgent::threads_at_bound().
  virtual std::uint64_t at_bound() = 0;
  virtual Duration idle_for() = 0;      // DeviceAgent::idle_for()
  virtual DeviceUsage usage() = 0;      // DeviceAgent::usage()
  virtual Duration queue_waited() = 0;  // DeviceAgent::queue_waited()
};

namespace session {

// ---- events -------------------------------------------------------------------------------------

struct Tick {};          // something may be due, or a thread may have started waiting
struct UsageChanged {};  // an allocation or free changed the usage
struct Connected {};     // answer to Connect: the socket is connected
struct ConnectFailed {   // answer to Connect
  std::string why;
};
struct FrameReceived {
  protocol::Message message;
};
struct ConnectionLost {  // read or write failed, the peer closed, or it stopped reading
  std::string why;
};
struct GateClosed {  // answer to CloseGateToRelease: threads inside when it closed
  std::uint64_t inside = 0;
};
struct Drained {};   // answer to Drain
struct SwappedOut {  // answer to SwapOut
  std::uint64_t bytes = 0;
};
struct SwappedIn {  // answer to SwapIn
  std::uint64_t bytes = 0;
};
struct SettingsRead {  // answer to ReadSettings: the file's memory limit, when it gives one
  std::optional<std::uint64_t> memory_bytes;
};
struct Stop {};  // the process stops scheduling this GPU: gate open for good

using Event =
    std::variant<Tick, UsageChanged, Connected, ConnectFailed, FrameReceived, ConnectionLost,
                 GateClosed, Drained, SwappedOut, SwappedIn, SettingsRead, Stop>;

// ---- actions ------------------------------------------------------------------------------------

struct Connect {};     // open a connection to the scheduler; answer Connected/ConnectFailed
struct Disconnect {};  // close the connection (the engine has already moved on)
struct Send {          // queue a frame, encoded with the session's protocol version
  protocol::Message message;
  std::uint16_t version = protocol::kMaxVersion;
};
enum class GateChange : std::uint8_t { kKeep, kOpen, kClose };
struct Publish {  // the new state for application threads (state(), epoch(), the gate)
  GrantState state = GrantState::kStarting;
  GateChange gate = GateChange::kKeep;
  std::uint64_t epoch = 0;  // the grant held (kHeld, kRevoking), else 0
};
struct CloseGateToRelease {};  // close the gate; answer GateClosed with the threads inside
struct Drain {};               // DeviceAgent::drain(); answer Drained
struct SwapOut {               // DeviceAgent::swap_out(bytes); answer SwappedOut
  std::uint64_t bytes = 0;     // at least this many; 0: all
};
struct SwapIn {             // DeviceAgent::swap_in(limit); answer SwappedIn
  std::uint64_t limit = 0;  // room: at most this many, staying swapped out; 0: all, for the grant
};
struct PrepareSwapOut {     // DeviceAgent::prepare_swap_out(); no answer (it does not block)
  std::uint64_t bytes = 0;  // the swap-out the notice announced; 0: all
};
struct ApplyLimits {
  protocol::Limits limits;
};
struct LimitsUnknown {};
struct SettleRegistration {};
struct ReadSettings {};  // read the settings file; answer SettingsRead
struct SwapRecord {      // a swap a trace event included; bytes < 0: none
  std::int64_t bytes = -1;
  double ms = -1;
};
// During an idle stretch seen by the idle checks: the most application threads seen at once inside
// a submission, waiting at the gate and waiting for the drain bound (-1: not looked). A stretch
// with threads inside or at the bound was spent submitting (in the driver, or in the library's wait
// for this process's own work), not in the application.
struct ThreadsSeen {
  std::int64_t inside = -1;
  std::int64_t waiting = -1;
  std::int64_t at_bound = -1;
  bool submitting() const { return inside > 0 || at_bound > 0; }
};
// A hand-off trace event (handoff_trace.h); ms < 0: no duration. Emitted before the action that
// lets another process react to the event (a frame, the gate opening), so that what others record
// in reaction always reads later in a shared trace.
struct Record {
  const char* event = "";
  std::uint64_t epoch = 0;
  double ms = -1;
  SwapRecord swap{};      // grant: the swap-in before it; release: the swap-out before it
  ThreadsSeen threads{};  // pause: during it
};
struct Registered {  // a session was welcomed
  std::uint64_t client_id = 0;
};
struct OutageBegins {  // the scheduler became unreachable (first failure of an outage)
  std::string why;
  bool refused = false;  // it closed the session before welcoming it: it refuses this process
};
struct OutageEnds {};
struct Note {  // a log line
  LogLevel level = LogLevel::kDebug;
  std::string text;
};

using Action = std::variant<Connect, Disconnect, Send, Publish, CloseGateToRelease, Drain, SwapOut,
                            SwapIn, PrepareSwapOut, ApplyLimits, LimitsUnknown, SettleRegistration,
                            ReadSettings, Record, Registered, OutageBegins, OutageEnds, Note>;

}  // namespace session

class GrantSession {
 public:
  GrantSession(SessionConfig config, SessionProbe& probe);

  std::vector<session::Action> handle(const session::Event& event, MonoTime now);
  std::optional<MonoTime> next_deadline() const;

  GrantState state() const { return state_; }
  // The grant held (kHeld, kRevoking), else 0.
  std::uint64_t held_epoch() const;
  bool connected() const { return conn_ == Conn::kUp; }
  bool swapped_out() const { return swapped_out_; }
  // The limits last applied to the agent (nullopt before any, or while unknown).
  const std::optional<protocol::Limits>& applied_limits() const { return applied_; }
  // Whether an action's answer is outstanding.
  bool busy() const { return awaiting_ != Awaiting::kNothing; }

  // What a forked child keeps: it starts over as a new client of the scheduler (no session, no
  // grant, nothing outstanding) but knows what its limits are. Plain values, so the child can read
  // them even if the parent's thread was inside handle() at the instant of fork.
  struct Inherited {
    bool stopped = false;
    bool limits_started = false;
    std::optional<protocol::Limits> known_limits;
    std::optional<protocol::Limits> applied;
    std::optional<std::uint64_t> file_memory;
  };
  Inherited inherited() const;
  GrantSession(SessionConfig config, SessionProbe& probe, const Inherited& inherited);

 private:
  enum class Conn : std::uint8_t { kDown, kConnecting, kHandshake, kUp };
  enum class Awaiting : std::uint8_t {
    kNothing,
    kConnect,
    kGateClosed,
    kDrained,
    kSwappedOut,
    kSwappedIn,
    kSettings,
  };

  // Handles one event that is not deferred.
  void dispatch(const session::Event& event, MonoTime now);
  bool answers_outstanding(const session::Event& event) const;
  void service(MonoTime now);
  void service_connection(MonoTime now);
  void service_grant(MonoTime now);
  void first_limits();
  void on_connected(MonoTime now);
  void on_connect_failed(MonoTime now, const std::string& why);
  void lose_connection(MonoTime now, const std::string& why, bool refused = false);
  void on_frame(const protocol::Message& message, MonoTime now);
  void on_welcome(const protocol::Welcome& welcome, MonoTime now);
  void on_grant(const protocol::Grant& grant, MonoTime now);
  void hold(std::uint64_t epoch, MonoTime now, double swap_in_ms, session::SwapRecord swap = {});
  void on_swapped_in(std::uint64_t bytes, MonoTime now);
  void on_revoke(const protocol::Revoke& revoke, MonoTime now);
  void on_swap_notice(const protocol::SwapNotice& notice, MonoTime now);
  void on_contended(const protocol::Contended& contended, MonoTime now);
  // A notice (swap notice or contended) for the grant held: release at the next pause. False if
  // stale.
  bool take_notice(std::uint64_t epoch, MonoTime now, bool swap);
  void on_evict(const protocol::Evict& evict, MonoTime now);
  void on_room(const protocol::Room& room, MonoTime now);
  void on_room_swapped_in(std::uint64_t bytes, MonoTime now);
  // The next step of the swap-out under way (swap_target_, swap_moved_ so far).
  void swap_out_step();
  void on_limits(const protocol::SetLimits& frame);
  void on_drained(MonoTime now);
  void on_swapped_out(std::uint64_t bytes, MonoTime now);
  void finish_revoke(MonoTime now, session::SwapRecord swap = {});
  void on_gate_closed(std::uint64_t inside, MonoTime now);
  void on_settings(const std::optional<std::uint64_t>& memory);
  void stop();
  void enter_outage(const std::string& why, bool refused = false);
  // The settings file says the pod's limit is pending and nobody has given it yet.
  bool limits_pending() const;
  // The settings file is read now and then: while the limit is pending or the scheduler is away.
  bool watching_settings() const;
  void schedule_reconnect(MonoTime now);
  // Queued (by a revoke) yet done with the GPU: no thread waits and the process has been idle for
  // the idle release. Such a process takes neither a grant's swap-in nor room.
  bool wants_no_gpu();
  // A thread is inside a submission or waiting for the drain bound: the process is not idle,
  // whatever the GPU is.
  bool submitting();
  // How long the process has been idle: the GPU's idle time, from the last idle check that saw a
  // thread submitting at the latest.
  Duration process_idle(MonoTime now, Duration gpu_idle) const;
  bool yield_asked() const;
  bool noticed() const;
  bool swap_noticed() const;  // of the notices for the grant held, one was a swap notice
  Duration noticed_idle() const;
  // The idle time a noticed holder waits out with this floor: twice the recurring pause, if
  // longer, never more than the idle release.
  Duration pauses_waited_out(Duration floor) const;
  Duration idle_threshold() const;
  // Pauses (kNoticedIdle): an idle check's view, and a request after a release on a notice.
  void observe_idle(Duration idle);
  // Kept among the last kPausesKept; a change of the recurring pause is traced ("pause"), with the
  // threads seen during the pause that changed it.
  void learn_pause(Duration pause, session::ThreadsSeen threads = {});
  // The longest pause made at least twice among those kept (kPausesKept).
  Duration recurring_pause() const;
  // An idle stretch with a thread submitting: traced ("stall") when the longest yet.
  void note_stall(Duration stall, session::ThreadsSeen threads);
  void observe_pause_before_request(MonoTime now);
  void settle_if_limits_known();
  void settle();
  void apply(const protocol::Limits& limits);
  void send_usage(MonoTime now, bool force);
  void observe_pace(MonoTime now);
  void send(protocol::Message message);
  void publish(GrantState state, session::GateChange gate);
  void await(Awaiting what, session::Action action);
  void note(LogLevel level, std::string text);
  void debug(std::string text);

  SessionConfig config_;
  SessionProbe& probe_;
  std::vector<session::Action> out_;
  std::deque<session::Event> inbox_;  // deferred while awaiting an answer
  MonoTime last_now_{};
  Awaiting awaiting_ = Awaiting::kNothing;
  bool stopped_ = false;

  GrantState state_ = GrantState::kStarting;
  // Connection.
  Conn conn_ = Conn::kDown;
  std::uint16_t version_ = protocol::kMaxVersion;
  std::uint64_t client_id_ = 0;
  MonoTime next_attempt_{};
  Duration backoff_{};
  MonoTime up_since_{};
  MonoTime handshake_deadline_{};
  MonoTime last_rx_{};
  bool ping_outstanding_ = false;
  std::uint64_t ping_nonce_ = 0;
  bool in_outage_ = false;
  // Grant.
  std::uint64_t epoch_ = 0;  // the last grant taken
  MonoTime granted_at_{};
  std::optional<std::uint64_t> swapping_in_for_;  // the grant a swap-in is for; none: an outage's
  MonoTime swap_in_started_{};
  std::string outage_why_;       // a lost connection waits for the swap-in before the outage begins
  bool outage_refused_ = false;  // ...and whether the scheduler closed it before its welcome
  bool revoke_pending_ = false;  // waiting for threads inside a submission
  protocol::Revoke revoke_;
  MonoTime revoke_at_{};
  MonoTime inside_deadline_{};
  MonoTime drained_at_{};
  bool swapped_out_ = false;
  bool evicting_ = false;                 // the drain and swap-out in progress answer an eviction
  std::uint64_t evict_bytes_ = 0;         // what that eviction asked for (0: all)
  std::uint64_t swap_target_ = 0;         // the last swap-out's target (0: all), while swapped out
  std::uint64_t swap_moved_ = 0;          // what the swap-out under way (or the last) moved
  std::uint64_t swap_step_ = 0;           // what its step under way was asked for
  bool room_swapping_ = false;            // the swap-in under way is into room, not for a grant
  std::uint64_t room_in_bytes_ = 0;       // brought back into room since the last swap-out
  std::uint32_t evictions_answered_ = 0;  // sent with usage (protocol version 10)
  MonoTime evict_at_{};
  std::uint64_t swap_out_bytes_per_s_ = 0;
  MonoTime next_idle_check_{};
  std::uint64_t yield_epoch_ = 0;             // a yield asks to release this grant once idle
  std::uint64_t notice_epoch_ = 0;            // a swap notice or contended came for this grant
  std::uint64_t swap_notice_epoch_ = 0;       // of which a swap notice (floor kNoticedIdle)
  LastValues<Duration, kPausesKept> pauses_;  // the last pauses seen while holding
  Duration longest_stall_{};                  // the longest idle stretch with a thread submitting
  Duration idle_seen_{};                      // idle time at the last idle check of the grant held
  session::ThreadsSeen idle_threads_{};       // during the idle stretch under way (idle_seen_ > 0)
  // The last idle check of the grant held that saw a thread submitting (none: not since the grant).
  std::optional<MonoTime> submitting_seen_;
  // A release on a notice: when the idle stretch it ended began (a pause, if work comes soon).
  std::optional<MonoTime> noticed_release_idle_since_;
  // Usage.
  bool usage_dirty_ = true;
  bool usage_sent_ = false;
  protocol::Usage last_usage_;
  // Welcomed sessions this link lost (the scheduler went away or dropped it), reported with usage.
  std::uint32_t sessions_lost_ = 0;
  MonoTime last_usage_at_{};
  // Pace (pace_meter.h): reported with the usage once a window's figure changes it.
  PaceMeter pace_;
  std::uint16_t pace_permille_ = protocol::Usage::kPaceUnknown;
  // Limits; kept across sessions (and into a forked child).
  bool limits_started_ = false;
  std::optional<protocol::Limits> known_limits_;
  std::optional<protocol::Limits> applied_;
  std::optional<std::uint64_t> file_memory_;
  MonoTime next_settings_read_{};
  bool settled_ = false;
};

}  // namespace nvshare::client
