#include "common/protocol.h"

#include <algorithm>
#include <array>

#include "common/wire.h"

namespace nvshare::protocol {
namespace {

using wire::ByteReader;
using wire::ByteWriter;

// Per-message payload codecs. Each type has one encode and one decode overload; the decoders read
// every field and leave the exact-length and enum checks to read_enum and the caller.
void encode_limits(ByteWriter& w, const Limits& l) {
  w.u64(l.memory_bytes);
  w.u8(l.core_percent);
}
Limits decode_limits(ByteReader& r, bool& valid) {
  Limits l;
  l.memory_bytes = r.u64();
  l.core_percent = r.u8();
  if (l.core_percent < 1 || l.core_percent > 100) valid = false;
  return l;
}
bool read_bool(ByteReader& r, bool& valid) {
  const std::uint8_t v = r.u8();
  if (v > 1) valid = false;
  return v == 1;
}
template <typename Enum>
Enum read_enum(ByteReader& r, std::uint8_t max, bool& valid) {
  const std::uint8_t v = r.u8();
  if (v < 1 || v > max) valid = false;
  return static_cast<Enum>(v);
}

void encode_payload(ByteWriter& w, const Hello& m) {
  w.u16(m.min_version);
  w.u16(m.max_version);
  w.u32(m.pid);
  w.str(m.gpu_uuid, kMaxUuidLength);
  w.u64(m.gpu_memory_bytes);
  w.u64(m.capabilities);
  encode_limits(w, m.declared);
  w.str(m.pod_uid, kMaxUuidLength);
  w.str(m.process_name, kMaxNameLength);
}
void decode_payload(ByteReader& r, Hello& m, bool& valid) {
  m.min_version = r.u16();
  m.max_version = r.u16();
  m.pid = r.u32();
  m.gpu_uuid = r.str(kMaxUuidLength);
  m.gpu_memory_bytes = r.u64();
  m.capabilities = r.u64();
  m.declared = decode_limits(r, valid);
  m.pod_uid = r.str(kMaxUuidLength);
  m.process_name = r.str(kMaxNameLength);
  if (m.min_version > m.max_version) valid = false;
}

void encode_payload(ByteWriter& w, const Welcome& m) {
  w.u16(m.version);
  w.u64(m.client_id);
  w.u64(m.capabilities);
}
void decode_payload(ByteReader& r, Welcome& m, bool&) {
  m.version = r.u16();
  m.client_id = r.u64();
  m.capabilities = r.u64();
}

void encode_payload(ByteWriter&, const Request&) {}
void decode_payload(ByteReader&, Request&, bool&) {}

void encode_payload(ByteWriter& w, const Grant& m) { w.u64(m.epoch); }
void decode_payload(ByteReader& r, Grant& m, bool&) { m.epoch = r.u64(); }

void encode_payload(ByteWriter& w, const SwapNotice& m) { w.u64(m.epoch); }
void decode_payload(ByteReader& r, SwapNotice& m, bool&) { m.epoch = r.u64(); }

void encode_payload(ByteWriter&, const Evict&) {}
void decode_payload(ByteReader&, Evict&, bool&) {}

void encode_payload(ByteWriter& w, const Room& m) { w.u64(m.bytes); }
void decode_payload(ByteReader& r, Room& m, bool&) { m.bytes = r.u64(); }

void encode_payload(ByteWriter& w, const Contended& m) { w.u64(m.epoch); }
void decode_payload(ByteReader& r, Contended& m, bool&) { m.epoch = r.u64(); }

void encode_payload(ByteWriter& w, const Revoke& m) {
  w.u64(m.epoch);
  w.u8(static_cast<std::uint8_t>(m.reason));
  w.u8(m.swap_out ? 1 : 0);
}
void decode_payload(ByteReader& r, Revoke& m, bool& valid) {
  m.epoch = r.u64();
  m.reason = read_enum<RevokeReason>(r, static_cast<std::uint8_t>(RevokeReason::kPriority), valid);
  m.swap_out = read_bool(r, valid);
}

void encode_payload(ByteWriter& w, const Released& m) {
  w.u64(m.epoch);
  w.u64(m.held_us);
  w.u64(m.drain_us);
}
void decode_payload(ByteReader& r, Released& m, bool&) {
  m.epoch = r.u64();
  m.held_us = r.u64();
  m.drain_us = r.u64();
}

void encode_payload(ByteWriter& w, const Usage& m) {
  w.u64(m.allocated_bytes);
  w.u64(m.resident_bytes);
  w.u64(m.swap_bytes_per_s);
}
void decode_payload(ByteReader& r, Usage& m, bool&) {
  m.allocated_bytes = r.u64();
  m.resident_bytes = r.u64();
  m.swap_bytes_per_s = r.u64();
}

void encode_payload(ByteWriter& w, const SetLimits& m) { encode_limits(w, m.limits); }
void decode_payload(ByteReader& r, SetLimits& m, bool& valid) {
  m.limits = decode_limits(r, valid);
}

void encode_payload(ByteWriter& w, const Wait& m) { w.u8(static_cast<std::uint8_t>(m.reason)); }
void decode_payload(ByteReader& r, Wait& m, bool& valid) {
  m.reason = read_enum<WaitReason>(r, static_cast<std::uint8_t>(WaitReason::kPriority), valid);
}

void encode_payload(ByteWriter& w, const Ping& m) { w.u64(m.nonce); }
void decode_payload(ByteReader& r, Ping& m, bool&) { m.nonce = r.u64(); }
void encode_payload(ByteWriter& w, const Pong& m) { w.u64(m.nonce); }
void decode_payload(ByteReader& r, Pong& m, bool&) { m.nonce = r.u64(); }

void encode_payload(ByteWriter& w, const IpcExport& m) { w.u64(m.bytes); }
void decode_payload(ByteReader& r, IpcExport& m, bool& valid) {
  m.bytes = r.u64();
  if (m.bytes == 0) valid = false;
}
void encode_payload(ByteWriter& w, const IpcImport& m) { w.u64(m.token); }
void decode_payload(ByteReader& r, IpcImport& m, bool&) { m.token = r.u64(); }
void encode_payload(ByteWriter& w, const IpcWithdraw& m) { w.u64(m.token); }
void decode_payload(ByteReader& r, IpcWithdraw& m, bool&) { m.token = r.u64(); }
void encode_payload(ByteWriter& w, const IpcAnswer& m) {
  w.u64(m.token);
  w.u64(m.bytes);
  w.str(m.error, kMaxNameLength);
}
void decode_payload(ByteReader& r, IpcAnswer& m, bool&) {
  m.token = r.u64();
  m.bytes = r.u64();
  m.error = r.str(kMaxNameLength);
}

// Reasons version 7 added are turns to older peers (they act on one the same way).
template <typename M>
M for_version_6(const M& m) {
  M older = m;
  if constexpr (std::is_same_v<M, Revoke>) {
    if (older.reason == RevokeReason::kPriority) older.reason = RevokeReason::kTurn;
  } else if constexpr (std::is_same_v<M, Wait>) {
    if (older.reason == WaitReason::kPriority) older.reason = WaitReason::kTurn;
  }
  return older;
}

// Fields later versions append at the end of a payload: version 2 gives limits a flags byte,
// version 3 gives usage its deep-queue share, version 4 its refused allocations, version 5 the
// sessions its link lost, version 6 its pinned bytes and the memory mode of limits, version 7 the
// priority class of limits, version 10 the byte targets of revokes and evictions and the evictions
// usage says were answered.
void encode_extension(ByteWriter& w, const Message& message, std::uint16_t version) {
  if (version < 2) return;
  if (const auto* limits = std::get_if<SetLimits>(&message)) w.u8(limits->flags);
  if (version < 3) return;
  if (const auto* usage = std::get_if<Usage>(&message)) w.u16(usage->deep_queue_permille);
  if (version < 4) return;
  if (const auto* usage = std::get_if<Usage>(&message)) w.u32(usage->refused_allocations);
  if (version < 5) return;
  if (const auto* usage = std::get_if<Usage>(&message)) w.u32(usage->sessions_lost);
  if (version < 6) return;
  if (const auto* usage = std::get_if<Usage>(&message)) w.u64(usage->pinned_bytes);
  if (const auto* limits = std::get_if<SetLimits>(&message)) w.u8(limits->limits.memory_mode);
  if (version < 7) return;
  if (const auto* limits = std::get_if<SetLimits>(&message)) w.u8(limits->limits.priority);
  if (const auto* usage = std::get_if<Usage>(&message)) w.u8(usage->declared_priority);
  if (version < 10) return;
  if (const auto* revoke = std::get_if<Revoke>(&message)) w.u64(revoke->swap_bytes);
  if (const auto* evict = std::get_if<Evict>(&message)) w.u64(evict->bytes);
  if (const auto* usage = std::get_if<Usage>(&message)) w.u32(usage->evictions_answered);
  if (version < kNoticeBytesVersion) return;
  if (const auto* notice = std::get_if<SwapNotice>(&message)) w.u64(notice->bytes);
}
void decode_extension(ByteReader& r, Message& message, std::uint16_t version, bool& valid) {
  if (version < 7) {
    // The priority reasons are version 7's.
    if (const auto* revoke = std::get_if<Revoke>(&message)) {
      if (revoke->reason == RevokeReason::kPriority) valid = false;
    }
    if (const auto* wait = std::get_if<Wait>(&message)) {
      if (wait->reason == WaitReason::kPriority) valid = false;
    }
  }
  if (version < 2) return;
  if (auto* limits = std::get_if<SetLimits>(&message)) {
    limits->flags = r.u8();
    if ((limits->flags & ~SetLimits::kProvisional) != 0) valid = false;
  }
  if (version < 3) return;
  if (auto* usage = std::get_if<Usage>(&message)) {
    usage->deep_queue_permille = r.u16();
    if (usage->deep_queue_permille > 1000 && usage->deep_queue_permille != Usage::kPaceUnknown) {
      valid = false;
    }
  }
  if (version < 4) return;
  if (auto* usage = std::get_if<Usage>(&message)) usage->refused_allocations = r.u32();
  if (version < 5) return;
  if (auto* usage = std::get_if<Usage>(&message)) usage->sessions_lost = r.u32();
  if (version < 6) return;
  if (auto* usage = std::get_if<Usage>(&message)) usage->pinned_bytes = r.u64();
  if (auto* limits = std::get_if<SetLimits>(&message)) {
    limits->limits.memory_mode = r.u8();
    if (limits->limits.memory_mode != Limits::kNoMemoryMode &&
        !memory_mode_of(limits->limits.memory_mode)) {
      valid = false;
    }
  }
  if (version < 7) return;
  if (auto* limits = std::get_if<SetLimits>(&message)) {
    limits->limits.priority = r.u8();
    if (limits->limits.priority != Limits::kNoPriority && !priority_of(limits->limits.priority)) {
      valid = false;
    }
  }
  if (auto* usage = std::get_if<Usage>(&message)) {
    usage->declared_priority = r.u8();
    if (usage->declared_priority != Limits::kNoPriority && !priority_of(usage->declared_priority)) {
      valid = false;
    }
  }
  if (version < 10) return;
  if (auto* revoke = std::get_if<Revoke>(&message)) revoke->swap_bytes = r.u64();
  if (auto* evict = std::get_if<Evict>(&message)) evict->bytes = r.u64();
  if (auto* usage = std::get_if<Usage>(&message)) usage->evictions_answered = r.u32();
  if (version < kNoticeBytesVersion) return;
  if (auto* notice = std::get_if<SwapNotice>(&message)) notice->bytes = r.u64();
}

// Variant index i holds MessageType i + 1; this is checked at compile time below.
constexpr std::size_t kMessageTypes = std::variant_size_v<Message>;
static_assert(std::is_same_v<std::variant_alternative_t<0, Message>, Hello>);
static_assert(std::is_same_v<std::variant_alternative_t<kMessageTypes - 1, Message>, Contended>);
static_assert(static_cast<std::size_t>(MessageType::kContended) == kMessageTypes);

template <std::size_t I>
Message decode_alternative(ByteReader& r, bool& valid) {
  std::variant_alternative_t<I, Message> m;
  decode_payload(r, m, valid);
  return m;
}

template <std::size_t... I>
constexpr auto make_decoders(std::index_sequence<I...>) {
  using Fn = Message (*)(ByteReader&, bool&);
  return std::array<Fn, sizeof...(I)>{&decode_alternative<I>...};
}
constexpr auto kDecoders = make_decoders(std::make_index_sequence<kMessageTypes>{});

Error malformed(std::string what) { return make_error("malformed frame: " + std::move(what)); }

bool string_fields_fit(const Message& message) {
  if (const auto* hello = std::get_if<Hello>(&message)) {
    return hello->gpu_uuid.size() <= kMaxUuidLength && hello->pod_uid.size() <= kMaxUuidLength &&
           hello->process_name.size() <= kMaxNameLength;
  }
  if (const auto* answer = std::get_if<IpcAnswer>(&message)) {
    return answer->error.size() <= kMaxNameLength;
  }
  return true;
}

}  // namespace

MessageType type_of(const Message& message) {
  return static_cast<MessageType>(message.index() + 1);
}

std::uint16_t introduced_in(MessageType type) {
  switch (type) {
    case MessageType::kIpcExport:
    case MessageType::kIpcImport:
    case MessageType::kIpcWithdraw:
    case MessageType::kIpcAnswer:
      return 6;
    case MessageType::kSwapNotice:
      return 8;
    case MessageType::kEvict:
      return 9;
    case MessageType::kRoom:
      return kRoomVersion;
    case MessageType::kContended:
      return kContendedVersion;
    default:
      return kMinVersion;
  }
}

std::uint64_t stricter_memory(std::uint64_t a, std::uint64_t b) {
  if (a == 0) return b;
  if (b == 0) return a;
  return std::min(a, b);
}

Limits stricter(const Limits& a, const Limits& b) {
  return Limits{stricter_memory(a.memory_bytes, b.memory_bytes),
                std::min(a.core_percent, b.core_percent),
                a.memory_mode != Limits::kNoMemoryMode ? a.memory_mode : b.memory_mode,
                a.priority != Limits::kNoPriority ? a.priority : b.priority};
}

std::uint8_t priority_code(Priority priority) { return static_cast<std::uint8_t>(priority) + 1; }

std::optional<Priority> priority_of(std::uint8_t code) {
  if (code == Limits::kNoPriority || code > priority_code(Priority::kHigh)) return std::nullopt;
  return static_cast<Priority>(code - 1);
}

Priority effective_priority(std::uint8_t code) {
  return priority_of(code).value_or(Priority::kNormal);
}

std::uint8_t memory_mode_code(MemoryMode mode) { return static_cast<std::uint8_t>(mode) + 1; }

std::optional<MemoryMode> memory_mode_of(std::uint8_t code) {
  if (code == Limits::kNoMemoryMode || code > memory_mode_code(MemoryMode::kPlain)) {
    return std::nullopt;
  }
  return static_cast<MemoryMode>(code - 1);
}

std::string_view to_string(MessageType type) {
  switch (type) {
    case MessageType::kHello:
      return "hello";
    case MessageType::kWelcome:
      return "welcome";
    case MessageType::kRequest:
      return "request";
    case MessageType::kGrant:
      return "grant";
    case MessageType::kRevoke:
      return "revoke";
    case MessageType::kReleased:
      return "released";
    case MessageType::kUsage:
      return "usage";
    case MessageType::kLimits:
      return "limits";
    case MessageType::kWait:
      return "wait";
    case MessageType::kPing:
      return "ping";
    case MessageType::kPong:
      return "pong";
    case MessageType::kIpcExport:
      return "ipc-export";
    case MessageType::kIpcImport:
      return "ipc-import";
    case MessageType::kIpcWithdraw:
      return "ipc-withdraw";
    case MessageType::kIpcAnswer:
      return "ipc-answer";
    case MessageType::kSwapNotice:
      return "swap-notice";
    case MessageType::kEvict:
      return "evict";
    case MessageType::kRoom:
      return "room";
    case MessageType::kContended:
      return "contended";
  }
  return "unknown";
}

std::string_view to_string(RevokeReason reason) {
  switch (reason) {
    case RevokeReason::kTurn:
      return "turn";
    case RevokeReason::kQuota:
      return "quota";
    case RevokeReason::kMemory:
      return "memory";
    case RevokeReason::kAdmin:
      return "admin";
    case RevokeReason::kYield:
      return "yield";
    case RevokeReason::kPriority:
      return "priority";
  }
  return "unknown";
}

std::string_view to_string(WaitReason reason) {
  switch (reason) {
    case WaitReason::kMemory:
      return "memory";
    case WaitReason::kTurn:
      return "turn";
    case WaitReason::kQuota:
      return "quota";
    case WaitReason::kPriority:
      return "priority";
  }
  return "unknown";
}

std::optional<std::uint16_t> negotiate_version(std::uint16_t peer_min, std::uint16_t peer_max) {
  const std::uint16_t low = std::max(peer_min, kMinVersion);
  const std::uint16_t high = std::min(peer_max, kMaxVersion);
  if (low > high) return std::nullopt;
  return high;
}

Status encode_to(const Message& message, std::vector<std::uint8_t>& out, std::uint16_t version) {
  if (version < kMinVersion || version > kMaxVersion) {
    return make_error("cannot encode protocol version " + std::to_string(version));
  }
  if (!string_fields_fit(message)) {
    return make_error(std::string("a string field of ") + std::string(to_string(type_of(message))) +
                      " is longer than the protocol allows");
  }
  if (std::holds_alternative<Hello>(message)) version = kMinVersion;
  const std::size_t header_at = out.size();
  ByteWriter w(out);
  w.u32(kMagic);
  w.u16(version);
  w.u16(static_cast<std::uint16_t>(type_of(message)));
  w.u32(0);  // length, patched below
  if (version < 7) {
    std::visit([&w](const auto& m) { encode_payload(w, for_version_6(m)); }, message);
  } else {
    std::visit([&w](const auto& m) { encode_payload(w, m); }, message);
  }
  encode_extension(w, message, version);
  const std::size_t length = out.size() - header_at - kHeaderSize;
  for (int i = 0; i < 4; ++i) out[header_at + 8 + i] = static_cast<std::uint8_t>(length >> (8 * i));
  return Status::Ok();
}

Result<std::vector<std::uint8_t>> encode(const Message& message, std::uint16_t version) {
  std::vector<std::uint8_t> out;
  out.reserve(64);
  if (Status s = encode_to(message, out, version); !s) return s.error();
  return out;
}

Result<std::optional<Decoded>> decode_frame(std::span<const std::uint8_t> bytes) {
  using Out = std::optional<Decoded>;
  if (bytes.size() < kHeaderSize) return Out{};
  const std::uint32_t magic = wire::load_le32(bytes.data());
  const std::uint16_t version = wire::load_le16(bytes.data() + 4);
  const std::uint16_t type = wire::load_le16(bytes.data() + 6);
  const std::uint32_t length = wire::load_le32(bytes.data() + 8);
  if (magic != kMagic) return malformed("bad magic");
  if (version < kMinVersion || version > kMaxVersion) {
    return malformed("unsupported protocol version " + std::to_string(version));
  }
  if (type < 1 || type > kMessageTypes)
    return malformed("unknown message type " + std::to_string(type));
  if (length > kMaxPayload) {
    return malformed("payload length " + std::to_string(length) + " exceeds the maximum " +
                     std::to_string(kMaxPayload));
  }
  if (bytes.size() - kHeaderSize < length) return Out{};

  ByteReader reader(bytes.subspan(kHeaderSize, length));
  bool valid = true;
  Message message = kDecoders[type - 1](reader, valid);
  decode_extension(reader, message, version, valid);
  const auto name = std::string(to_string(static_cast<MessageType>(type)));
  if (!reader.ok()) return malformed(name + " payload is truncated or a string is too long");
  if (!valid) return malformed(name + " payload has a field out of range");
  if (!reader.done()) {
    return malformed(name + " payload has " + std::to_string(reader.remaining()) +
                     " trailing bytes");
  }
  return Out{Decoded{Frame{version, std::move(message)}, kHeaderSize + length}};
}

void FrameDecoder::feed(std::span<const std::uint8_t> bytes) {
  if (failed_) return;
  // Reclaim consumed space before growing; frames are small, so this stays cheap.
  if (start_ > 0 && start_ == buffer_.size()) {
    buffer_.clear();
    start_ = 0;
  } else if (start_ > 4096 && start_ * 2 > buffer_.size()) {
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(start_));
    start_ = 0;
  }
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
}

Result<std::optional<Frame>> FrameDecoder::next() {
  using Out = std::optional<Frame>;
  if (failed_) return make_error(error_);
  auto decoded = decode_frame(std::span<const std::uint8_t>(buffer_).subspan(start_));
  if (!decoded) {
    failed_ = true;
    error_ = decoded.error().message;
    return decoded.error();
  }
  if (!decoded.value()) return Out{};
  start_ += decoded.value()->consumed;
  return Out{std::move(decoded.value()->frame)};
}

}  // namespace nvshare::protocol
