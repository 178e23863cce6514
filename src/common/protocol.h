// The client <-> scheduler wire protocol: typed messages and their binary framing.
//
// Every frame is a 12-byte header followed by a payload (docs/protocol.md is the normative text):
//
//   offset 0  u32  magic        0x4853564E ("NVSH" on the wire)
//   offset 4  u16  version      protocol version the frame is encoded in
//   offset 6  u16  type         MessageType
//   offset 8  u32  length       payload bytes that follow, at most kMaxPayload
//
// All integers are little endian, written and read field by field (no struct memcpy). Strings are a
// u16 length and that many bytes, each with its own maximum. A payload must be consumed exactly: a
// field missing or a byte left over makes the frame malformed, and so does an enum value outside
// its range.
//
// Contract of FrameDecoder: bytes may arrive in any split (streaming); next() yields each complete
// message in order, nullopt while a frame is incomplete, or an error for malformed input. A header
// is checked as soon as its 12 bytes are present, so an oversized length is rejected before any
// payload is awaited. After an error the decoder stays failed: the connection it serves is to be
// closed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/memory_mode.h"
#include "common/priority.h"
#include "common/result.h"

namespace nvshare::protocol {

inline constexpr std::uint32_t kMagic = 0x4853564E;
inline constexpr std::uint16_t kMinVersion = 1;
inline constexpr std::uint16_t kMaxVersion = 13;
// The version from which revokes and evictions carry byte targets (Revoke::swap_bytes,
// Evict::bytes).
inline constexpr std::uint16_t kPartialSwapVersion = 10;
// The version from which a swap notice names the bytes the swap-out will be asked for.
inline constexpr std::uint16_t kNoticeBytesVersion = 11;
// The version from which a waiting client may be given room to swap in ahead of its grant (Room).
inline constexpr std::uint16_t kRoomVersion = 12;
// The version from which a holder may be told that a job of a lower class waits for it (Contended).
inline constexpr std::uint16_t kContendedVersion = 13;
inline constexpr std::size_t kHeaderSize = 12;
inline constexpr std::size_t kMaxPayload = 4096;
inline constexpr std::size_t kMaxUuidLength = 64;
inline constexpr std::size_t kMaxNameLength = 256;

enum class MessageType : std::uint16_t {
  kHello = 1,     // client -> scheduler, first frame of a session (one session per process and GPU)
  kWelcome = 2,   // scheduler -> client, answer to hello with the negotiated version
  kRequest = 3,   // client -> scheduler, wants to run on the GPU
  kGrant = 4,     // scheduler -> client, may run until revoked; carries the grant epoch
  kRevoke = 5,    // scheduler -> client, stop submitting, drain, maybe swap out, then release
  kReleased = 6,  // client -> scheduler, gave the grant back (after a revoke or by itself)
  kUsage = 7,     // client -> scheduler, memory footprint and measured swap bandwidth
  kLimits = 8,    // scheduler -> client, the limits to enforce from now on
  kWait = 9,      // scheduler -> client, the request is queued and why
  kPing = 10,     // either direction, liveness
  kPong = 11,     // answer to ping with the same nonce
  // CUDA IPC brokering (version 6). Each is the first and only frame a client sends on a
  // connection of its own (no hello): the scheduler answers with kIpcAnswer and closes it.
  kIpcExport = 12,    // client -> scheduler, offers the descriptor sent with it (SCM_RIGHTS)
  kIpcImport = 13,    // client -> scheduler, asks for the descriptor a token names
  kIpcWithdraw = 14,  // client -> scheduler, the exporter freed the memory a token names
  kIpcAnswer = 15,    // scheduler -> client; a successful import carries the descriptor
  // Version 8.
  kSwapNotice = 16,  // scheduler -> client, the holder's turn will end with a swap-out
  // Version 9.
  kEvict = 17,  // scheduler -> client without the grant: move your device memory to the host
  // Version 12.
  kRoom = 18,  // scheduler -> waiting client: bring back what fits of your memory before the grant
  // Version 13.
  kContended = 19,  // scheduler -> holder: a job waits for the GPU; release at your next pause
};

// kYield is a soft revoke: someone waits for this holder and the hand-off moves no memory, so the
// holder gives the grant back (released, no drain) as soon as it is idle; it keeps running until
// then. Sent only to clients that announce capability::kYield.
enum class RevokeReason : std::uint8_t {
  kTurn = 1,
  kQuota = 2,
  kMemory = 3,
  kAdmin = 4,
  kYield = 5,
  kPriority = 6  // a client of a higher class waits (version 7; a turn to older peers)
};
// kPriority: a client of a higher class holds the GPU or waits ahead (version 7; a turn to older
// peers).
enum class WaitReason : std::uint8_t { kMemory = 1, kTurn = 2, kQuota = 3, kPriority = 4 };

// Capability bits a peer announces in hello/welcome; unknown bits are ignored.
namespace capability {
inline constexpr std::uint64_t kSwap = 1u << 0;  // can move its allocations to host on revoke
inline constexpr std::uint64_t kIdleRelease = 1u << 1;   // releases the grant by itself when idle
inline constexpr std::uint64_t kUsageReports = 1u << 2;  // sends usage messages
inline constexpr std::uint64_t kYield = 1u << 3;         // understands RevokeReason::kYield
}  // namespace capability

// Limits as enforced by the client. memory_bytes 0 means no memory limit; core_percent is 1..100
// and 100 means uncapped.
struct Limits {
  // The memory mode for the client's device allocations (common/memory_mode.h), as a wire code:
  // 0 none (the process's own choice), else MemoryMode + 1. Only limits frames carry it (version
  // 6).
  static constexpr std::uint8_t kNoMemoryMode = 0;
  // The priority class (common/priority.h), as a wire code: 0 none (normal), else Priority + 1.
  // Only limits frames carry it (version 7).
  static constexpr std::uint8_t kNoPriority = 0;
  std::uint64_t memory_bytes = 0;
  std::uint8_t core_percent = 100;
  std::uint8_t memory_mode = kNoMemoryMode;
  std::uint8_t priority = kNoPriority;
  bool operator==(const Limits&) const = default;
};

// The wire code of a memory mode and back (nullopt for kNoMemoryMode or a code out of range).
std::uint8_t memory_mode_code(MemoryMode mode);
std::optional<MemoryMode> memory_mode_of(std::uint8_t code);

// The wire code of a priority class and back (nullopt for kNoPriority or a code out of range), and
// the class a code gives (kNoPriority: normal; an unknown code: normal).
std::uint8_t priority_code(Priority priority);
std::optional<Priority> priority_of(std::uint8_t code);
Priority effective_priority(std::uint8_t code);

// The stricter of two memory limits (0 is none, the loosest), and of two limits field by field
// (the memory mode and the priority class, which are not bounds, are a's where a names one, else
// b's).
std::uint64_t stricter_memory(std::uint64_t a, std::uint64_t b);
Limits stricter(const Limits& a, const Limits& b);

struct Hello {
  std::uint16_t min_version = kMinVersion;
  std::uint16_t max_version = kMaxVersion;
  std::uint32_t pid = 0;               // informational: the scheduler trusts SO_PEERCRED
  std::string gpu_uuid;                // "GPU-..." of the device this session is for
  std::uint64_t gpu_memory_bytes = 0;  // as the client's driver reports it; informational only
  std::uint64_t capabilities = 0;
  Limits declared;      // honoured only when the scheduler trusts client limits
  std::string pod_uid;  // declared pod identity, informational unless trusted
  std::string process_name;
  bool operator==(const Hello&) const = default;
};

struct Welcome {
  std::uint16_t version = kMaxVersion;  // the version both sides speak from now on
  std::uint64_t client_id = 0;
  std::uint64_t capabilities = 0;
  bool operator==(const Welcome&) const = default;
};

struct Request {
  bool operator==(const Request&) const = default;
};

struct Grant {
  std::uint64_t epoch = 0;
  bool operator==(const Grant&) const = default;
};

struct Revoke {
  std::uint64_t epoch = 0;
  RevokeReason reason = RevokeReason::kTurn;
  bool swap_out = false;
  // Version 10, with swap_out: move at least this many bytes to the host (whole allocations, so
  // possibly more) and keep the rest on the device; 0: all of them. Older clients move all.
  std::uint64_t swap_bytes = 0;
  bool operator==(const Revoke&) const = default;
};

struct Released {
  std::uint64_t epoch = 0;
  std::uint64_t held_us = 0;   // how long the grant was held
  std::uint64_t drain_us = 0;  // from the revoke to the last queued work completing (0 if unasked)
  bool operator==(const Released&) const = default;
};

// Version 3 appends deep_queue_permille: of the time the client held its grant over its last pace
// window, the share (0..1000) during which a submitting thread waited for the drain bound, i.e. it
// had more GPU work queued than the bound and more to submit. kPaceUnknown until a window is
// complete (and from version 2 peers). Version 4 appends refused_allocations: allocations the
// client's memory limit refused since it connected (saturating; 0 from older peers). Version 5
// appends sessions_lost: how many sessions with a scheduler this link (this process, this GPU) had
// welcomed and then lost before this one, e.g. because the scheduler restarted (0 from older
// peers).
struct Usage {
  static constexpr std::uint16_t kPaceUnknown = 0xFFFF;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t resident_bytes = 0;
  std::uint64_t swap_bytes_per_s = 0;  // measured swap bandwidth, 0 until one was measured
  std::uint16_t deep_queue_permille = kPaceUnknown;
  std::uint32_t refused_allocations = 0;
  std::uint32_t sessions_lost = 0;
  // Version 6: bytes of allocated_bytes that stay on the GPU when the client swaps out (memory
  // another process has mapped through CUDA IPC); 0 from older peers.
  std::uint64_t pinned_bytes = 0;
  // Version 7: the priority class the process declares for itself (NVSHARE_PRIORITY; a
  // protocol::Limits priority code, 0 for none), honoured only by a scheduler that trusts client
  // limits. The hello cannot carry it (it is always encoded in version 1).
  std::uint8_t declared_priority = Limits::kNoPriority;
  // Version 10: the evictions this session has answered (it moved what was asked, or all it could);
  // the scheduler takes an eviction as answered when the count moves.
  std::uint32_t evictions_answered = 0;
  bool operator==(const Usage&) const = default;
};

// Version 2 appends a flags byte. kProvisional: the scheduler is not yet sure of this client's
// limits (it restarted without its state, and the control plane has not pushed them again): the
// client keeps, field by field, the stricter of these and the last limits it had, until limits
// without the flag arrive. A version 1 peer never receives provisional limits.
struct SetLimits {
  static constexpr std::uint8_t kProvisional = 1u << 0;
  Limits limits;
  std::uint8_t flags = 0;
  bool provisional() const { return (flags & kProvisional) != 0; }
  bool operator==(const SetLimits&) const = default;
};

struct Wait {
  WaitReason reason = WaitReason::kTurn;
  bool operator==(const Wait&) const = default;
};

struct Ping {
  std::uint64_t nonce = 0;
  bool operator==(const Ping&) const = default;
};

struct Pong {
  std::uint64_t nonce = 0;
  bool operator==(const Pong&) const = default;
};

// CUDA IPC (docs/memory-modes.md): an exporter offers the shareable descriptor of an allocation
// of `bytes`; the scheduler keeps it under a token for the exporter's lifetime or until it is
// withdrawn, and hands a duplicate to importers of the same pod (same uid off Kubernetes).
struct IpcExport {
  std::uint64_t bytes = 0;
  bool operator==(const IpcExport&) const = default;
};
struct IpcImport {
  std::uint64_t token = 0;
  bool operator==(const IpcImport&) const = default;
};
struct IpcWithdraw {
  std::uint64_t token = 0;
  bool operator==(const IpcWithdraw&) const = default;
};
// error empty: done (export: token set; import: bytes set and a descriptor attached).
struct IpcAnswer {
  std::uint64_t token = 0;
  std::uint64_t bytes = 0;
  std::string error;
  bool operator==(const IpcAnswer&) const = default;
};

// Version 8: the holder of grant `epoch` will be revoked with swap_out (a client waits that cannot
// run beside its memory, and the turn it waits for is planned). Advice only: the client readies
// what the swap needs (host copies) while it keeps running; the revoke comes as ever. Sent at most
// once per grant, only to peers that speak version 8.
struct SwapNotice {
  std::uint64_t epoch = 0;
  // Version 11: the bytes the revoke will ask to swap out (whole pieces, in address order, as
  // Revoke::swap_bytes); 0: all of them (and from an older scheduler).
  std::uint64_t bytes = 0;
  bool operator==(const SwapNotice&) const = default;
};

// Version 9: a client that does not hold the grant keeps memory on the GPU (it released while idle,
// after a turn that moved no memory, or never ran), and the head of the queue needs that room. The
// client drains what it may still have queued, swaps out as for a revoke with swap_out, and reports
// its usage at once (resident below allocated tells the scheduler it did). It keeps its place in
// the queue, if it has one; a later grant swaps its memory back in. Ignored while holding a grant.
struct Evict {
  // Version 10: move at least this many bytes (whole allocations); 0: all of them.
  std::uint64_t bytes = 0;
  bool operator==(const Evict&) const = default;
};

// Version 12: the head of the queue waits for memory that is leaving the device (a holder's
// swap-out, or an eviction, under way), and part of the room it needs is free already: up to
// `bytes` of its memory beyond its pinned bytes may be on the device now. The client brings back
// from the host what fits (whole pieces), its gate staying closed, and reports its usage; the
// grant brings back the rest. Each one names the whole room (not an increment), so a repeated or
// late one brings back nothing twice. Ignored unless waiting for a grant with memory on the host.
struct Room {
  std::uint64_t bytes = 0;
  bool operator==(const Room&) const = default;
};

// Version 13: the holder of grant `epoch` holds up a job that is given none of its idle moments (a
// lower class held back while it runs). Advice only, like a swap notice without the swap: the
// holder releases at its next pause (5 ms idle, or twice the pause it makes again and again, at
// most its idle release) instead of waiting out its idle release. Sent at most once per grant.
struct Contended {
  std::uint64_t epoch = 0;
  bool operator==(const Contended&) const = default;
};

using Message = std::variant<Hello, Welcome, Request, Grant, Revoke, Released, Usage, SetLimits,
                             Wait, Ping, Pong, IpcExport, IpcImport, IpcWithdraw, IpcAnswer,
                             SwapNotice, Evict, Room, Contended>;

MessageType type_of(const Message& message);
// The first protocol version that has the message type (a sender never sends a type to a peer
// whose version lacks it: that peer would find it malformed).
std::uint16_t introduced_in(MessageType type);
std::string_view to_string(MessageType type);
std::string_view to_string(RevokeReason reason);
std::string_view to_string(WaitReason reason);

// The version both sides speak, or nullopt when the peer's range does not overlap ours.
std::optional<std::uint16_t> negotiate_version(std::uint16_t peer_min, std::uint16_t peer_max);

// Encodes one frame (header and payload) in protocol version `version`. Fails only when a field
// does not fit its wire limits (a string longer than its maximum). Fields a version lacks are not
// sent (a provisional flag cannot be said in version 1: the caller decides what to send instead).
// A hello is always encoded in kMinVersion, whatever `version` says: it carries the range the
// client speaks, so any scheduler can read it.
Result<std::vector<std::uint8_t>> encode(const Message& message,
                                         std::uint16_t version = kMaxVersion);
// Appends the frame to `out`; same failure rule as encode.
Status encode_to(const Message& message, std::vector<std::uint8_t>& out,
                 std::uint16_t version = kMaxVersion);

struct Frame {
  std::uint16_t version = 0;
  Message message;
};

// Decodes the frame at the start of `bytes`. Returns the frame and the bytes it used, nullopt when
// the frame is not complete yet, or an error when what is there is malformed.
struct Decoded {
  Frame frame;
  std::size_t consumed = 0;
};
Result<std::optional<Decoded>> decode_frame(std::span<const std::uint8_t> bytes);

class FrameDecoder {
 public:
  void feed(std::span<const std::uint8_t> bytes);
  Result<std::optional<Frame>> next();
  bool failed() const { return failed_; }
  std::size_t buffered() const { return buffer_.size() - start_; }

 private:
  std::vector<std::uint8_t> buffer_;
  std::size_t start_ = 0;
  bool failed_ = false;
  std::string error_;
};

}  // namespace nvshare::protocol
