#include "common/protocol.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "common/wire.h"

namespace nvshare::protocol {
namespace {

std::vector<Message> every_message() {
  Hello hello;
  hello.min_version = 1;
  hello.max_version = 1;
  hello.pid = 4242;
  hello.gpu_uuid = "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
  hello.gpu_memory_bytes = 150'000'000'000ULL;
  hello.capabilities = capability::kSwap | capability::kIdleRelease;
  hello.declared = Limits{4ULL << 30, 30};
  hello.pod_uid = "7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d";
  hello.process_name = "python3";
  return {
      hello,
      Welcome{1, 77, capability::kSwap},
      Request{},
      Grant{0x0102030405060708ULL},
      Revoke{9, RevokeReason::kQuota, true},
      Revoke{10, RevokeReason::kAdmin, false},
      Revoke{11, RevokeReason::kTurn, true, 3ULL << 30},
      Released{9, 1'500'000, 2'300},
      Usage{14ULL << 30, 12ULL << 30, 12'700'000'000ULL},
      Usage{1ULL << 30, 1ULL << 30, 0, 640},
      SetLimits{Limits{512ULL << 20, 50}},
      SetLimits{Limits{1ULL << 30, 100}, SetLimits::kProvisional},
      SetLimits{Limits{2ULL << 30, 40, memory_mode_code(MemoryMode::kUnified)}},
      Wait{WaitReason::kMemory},
      Ping{0xFFFFFFFFFFFFFFFFULL},
      Pong{1},
      IpcExport{64ULL << 20},
      IpcImport{0x1122334455667788ULL},
      IpcWithdraw{7},
      IpcAnswer{0x1122334455667788ULL, 64ULL << 20, ""},
      IpcAnswer{0, 0, "no export with this handle is shared with this process's pod or user"},
      SwapNotice{0x0807060504030201ULL},
      SwapNotice{3, 5ULL << 30},
      Evict{},
      Evict{5ULL << 30},
      Room{3ULL << 30},
      Contended{12},
  };
}

std::vector<std::uint8_t> frame_of(const Message& m) { return encode(m).value(); }

// A hand-built frame, for headers that encode() would refuse to produce.
std::vector<std::uint8_t> raw_frame(std::uint32_t magic, std::uint16_t version, std::uint16_t type,
                                    std::vector<std::uint8_t> payload,
                                    std::optional<std::uint32_t> length = std::nullopt) {
  std::vector<std::uint8_t> out;
  wire::ByteWriter w(out);
  w.u32(magic);
  w.u16(version);
  w.u16(type);
  w.u32(length.value_or(static_cast<std::uint32_t>(payload.size())));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

TEST(Protocol, EveryMessageRoundTrips) {
  for (const Message& m : every_message()) {
    const auto bytes = frame_of(m);
    auto decoded = decode_frame(bytes);
    ASSERT_TRUE(decoded.ok()) << decoded.error().message;
    ASSERT_TRUE(decoded.value().has_value());
    EXPECT_EQ(decoded.value()->consumed, bytes.size());
    // A hello is always in the oldest version, so that any scheduler can read the range in it.
    EXPECT_EQ(decoded.value()->frame.version,
              std::holds_alternative<Hello>(m) ? kMinVersion : kMaxVersion);
    EXPECT_EQ(decoded.value()->frame.message, m) << to_string(type_of(m));
  }
}

TEST(Protocol, Version1LimitsCarryNoFlags) {
  const Message provisional = SetLimits{Limits{1ULL << 30, 40}, SetLimits::kProvisional};
  const auto v1 = encode(provisional, 1).value();
  const auto v2 = encode(provisional, 2).value();
  EXPECT_EQ(v1.size() + 1, v2.size());  // the flags byte
  auto decoded = decode_frame(v1);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<SetLimits>(decoded.value()->frame.message),
            (SetLimits{Limits{1ULL << 30, 40}, 0}));
  // A v1 frame with the v2 byte is malformed, and so is a v2 frame without it.
  auto v1_with_byte = v2;
  v1_with_byte[4] = 1;
  EXPECT_FALSE(decode_frame(v1_with_byte).ok());
  auto v2_without = v1;
  v2_without[4] = 2;
  EXPECT_FALSE(decode_frame(v2_without).ok());
}

TEST(Protocol, Version2UsageCarriesNoDeepQueueShare) {
  const Message usage = Usage{8ULL << 30, 8ULL << 30, 0, 975};
  const auto v2 = encode(usage, 2).value();
  const auto v3 = encode(usage, 3).value();
  EXPECT_EQ(v2.size() + 2, v3.size());  // the u16 share
  auto decoded = decode_frame(v2);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<Usage>(decoded.value()->frame.message).deep_queue_permille,
            Usage::kPaceUnknown);
  auto v2_with_share = v3;
  v2_with_share[4] = 2;
  EXPECT_FALSE(decode_frame(v2_with_share).ok());
}

TEST(Protocol, Version3UsageCarriesNoRefusedAllocations) {
  const Message usage = Usage{8ULL << 30, 8ULL << 30, 0, 975, 42};
  const auto v3 = encode(usage, 3).value();
  const auto v4 = encode(usage, 4).value();
  EXPECT_EQ(v3.size() + 4, v4.size());  // the u32 count
  auto decoded = decode_frame(v4);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<Usage>(decoded.value()->frame.message), std::get<Usage>(usage));
  decoded = decode_frame(v3);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<Usage>(decoded.value()->frame.message).refused_allocations, 0u);
  auto v3_with_count = v4;
  v3_with_count[4] = 3;
  EXPECT_FALSE(decode_frame(v3_with_count).ok());
}

TEST(Protocol, Version5UsageCarriesNoPinnedBytes) {
  Usage full{8ULL << 30, 8ULL << 30, 0, 975, 42};
  full.sessions_lost = 3;
  full.pinned_bytes = 2ULL << 30;
  const auto v5 = encode(Message(full), 5).value();
  const auto v6 = encode(Message(full), 6).value();
  EXPECT_EQ(v5.size() + 8, v6.size());  // the u64 bytes
  auto decoded = decode_frame(v6);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<Usage>(decoded.value()->frame.message), full);
  decoded = decode_frame(v5);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<Usage>(decoded.value()->frame.message).pinned_bytes, 0u);
  EXPECT_EQ(std::get<Usage>(decoded.value()->frame.message).sessions_lost, 3u);
}

// Version 10 appends the byte targets of revokes and evictions; an older peer moves everything.
TEST(Protocol, Version9RevokesAndEvictionsCarryNoByteTargets) {
  const Revoke revoke{4, RevokeReason::kTurn, true, 3ULL << 30};
  const auto v9 = encode(Message(revoke), 9).value();
  const auto v10 = encode(Message(revoke), 10).value();
  EXPECT_EQ(v9.size() + 8, v10.size());  // the u64 target
  auto decoded = decode_frame(v10);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<Revoke>(decoded.value()->frame.message), revoke);
  decoded = decode_frame(v9);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<Revoke>(decoded.value()->frame.message).swap_bytes, 0u);
  EXPECT_TRUE(std::get<Revoke>(decoded.value()->frame.message).swap_out);

  const Evict evict{1ULL << 30};
  const auto e9 = encode(Message(evict), 9).value();
  const auto e10 = encode(Message(evict), 10).value();
  EXPECT_EQ(e9.size() + 8, e10.size());
  decoded = decode_frame(e10);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<Evict>(decoded.value()->frame.message), evict);
  decoded = decode_frame(e9);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<Evict>(decoded.value()->frame.message).bytes, 0u);
}

// Version 11 appends the swap notice's byte target; an older scheduler's notice means all.
TEST(Protocol, Version10SwapNoticesCarryNoByteTarget) {
  const SwapNotice notice{6, 3ULL << 30};
  const auto v10 = encode(Message(notice), 10).value();
  const auto v11 = encode(Message(notice), 11).value();
  EXPECT_EQ(v10.size() + 8, v11.size());
  auto decoded = decode_frame(v11);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<SwapNotice>(decoded.value()->frame.message), notice);
  decoded = decode_frame(v10);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<SwapNotice>(decoded.value()->frame.message).epoch, 6u);
  EXPECT_EQ(std::get<SwapNotice>(decoded.value()->frame.message).bytes, 0u);
}

TEST(Protocol, Version5LimitsCarryNoMemoryModeAndUnknownModesAreMalformed) {
  const SetLimits full{Limits{1ULL << 30, 50, memory_mode_code(MemoryMode::kPlain)}};
  const auto v5 = encode(Message(full), 5).value();
  const auto v6 = encode(Message(full), 6).value();
  EXPECT_EQ(v5.size() + 1, v6.size());  // the u8 mode
  auto decoded = decode_frame(v5);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<SetLimits>(decoded.value()->frame.message).limits.memory_mode,
            Limits::kNoMemoryMode);
  auto unknown = v6;
  unknown.back() = 9;
  EXPECT_FALSE(decode_frame(unknown).ok());
  EXPECT_EQ(memory_mode_of(memory_mode_code(MemoryMode::kDevice)), MemoryMode::kDevice);
  EXPECT_EQ(memory_mode_of(Limits::kNoMemoryMode), std::nullopt);
  // Not a bound: the first limits' mode where it names one.
  EXPECT_EQ(stricter(Limits{0, 100, 2}, Limits{0, 100, 3}).memory_mode, 2);
  EXPECT_EQ(stricter(Limits{0, 100, 0}, Limits{0, 100, 3}).memory_mode, 3);
}

TEST(Protocol, AnIpcExportOfNoBytesIsMalformed) {
  auto bytes = encode(IpcExport{1}).value();
  bytes[kHeaderSize] = 0;  // the u64 bytes, little endian: now 0
  EXPECT_FALSE(decode_frame(bytes).ok());
}

TEST(Protocol, Version4UsageCarriesNoSessionsLost) {
  Usage full{8ULL << 30, 8ULL << 30, 0, 975, 42};
  full.sessions_lost = 3;
  const auto v4 = encode(Message(full), 4).value();
  const auto v5 = encode(Message(full), 5).value();
  EXPECT_EQ(v4.size() + 4, v5.size());  // the u32 count
  auto decoded = decode_frame(v5);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<Usage>(decoded.value()->frame.message), full);
  decoded = decode_frame(v4);
  ASSERT_TRUE(decoded.ok() && decoded.value());
  EXPECT_EQ(std::get<Usage>(decoded.value()->frame.message).sessions_lost, 0u);
  EXPECT_EQ(std::get<Usage>(decoded.value()->frame.message).refused_allocations, 42u);
  auto v4_with_count = v5;
  v4_with_count[4] = 4;
  EXPECT_FALSE(decode_frame(v4_with_count).ok());
}

TEST(Protocol, DeepQueueShareOverAThousandIsMalformed) {
  for (std::uint16_t permille : {std::uint16_t{1001}, std::uint16_t{0xFFFE}}) {
    auto bytes = encode(Usage{0, 0, 0, 0}, 3).value();
    bytes[bytes.size() - 2] = static_cast<std::uint8_t>(permille & 0xFF);
    bytes[bytes.size() - 1] = static_cast<std::uint8_t>(permille >> 8);
    EXPECT_FALSE(decode_frame(bytes).ok()) << permille;
  }
  auto unknown = encode(Usage{}, 3).value();
  EXPECT_TRUE(decode_frame(unknown).ok());
}

TEST(Protocol, UnknownLimitFlagsAreMalformed) {
  auto bytes = encode(SetLimits{Limits{0, 100}, 0}, 2).value();
  bytes.back() = 0x02;
  auto decoded = decode_frame(bytes);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.error().message.find("out of range"), std::string::npos);
}

TEST(Protocol, HelloIsAlwaysEncodedInTheOldestVersion) {
  Hello hello;
  hello.gpu_uuid = "GPU-1";
  hello.max_version = kMaxVersion;
  const auto bytes = encode(hello, kMaxVersion).value();
  EXPECT_EQ(wire::load_le16(bytes.data() + 4), kMinVersion);
}

TEST(Protocol, EveryMessageTypeIsCovered) {
  std::set<MessageType> seen;
  for (const Message& m : every_message()) seen.insert(type_of(m));
  EXPECT_EQ(seen.size(), std::variant_size_v<Message>);
}

// A scheduler sends no message to a peer whose version lacks its type (ClientSession::queue).
TEST(Protocol, EachTypeNamesTheVersionThatIntroducedIt) {
  EXPECT_EQ(introduced_in(MessageType::kGrant), kMinVersion);
  EXPECT_EQ(introduced_in(MessageType::kIpcExport), 6);
  EXPECT_EQ(introduced_in(MessageType::kSwapNotice), 8);
  EXPECT_EQ(introduced_in(MessageType::kEvict), 9);
  EXPECT_EQ(introduced_in(MessageType::kRoom), kRoomVersion);
  EXPECT_EQ(introduced_in(MessageType::kContended), kContendedVersion);
  EXPECT_EQ(kContendedVersion, kMaxVersion);
}

TEST(Protocol, HeaderIsLittleEndianFieldByField) {
  const auto bytes = frame_of(Grant{0x0102030405060708ULL});
  // Magic, version, type, length, payload, as they lie on the wire.
  // clang-format off
  const std::vector<std::uint8_t> expected{
      'N', 'V', 'S', 'H', 13, 0, 4, 0, 8, 0, 0, 0, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
  // clang-format on
  EXPECT_EQ(bytes, expected);
}

TEST(Protocol, RequestHasEmptyPayload) {
  const auto bytes = frame_of(Request{});
  EXPECT_EQ(bytes.size(), kHeaderSize);
}

TEST(Protocol, TruncatedFrameAtEveryLengthIsIncompleteNotAnError) {
  for (const Message& m : every_message()) {
    const auto bytes = frame_of(m);
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      auto decoded = decode_frame(std::span(bytes).first(n));
      ASSERT_TRUE(decoded.ok()) << to_string(type_of(m)) << " cut at " << n;
      EXPECT_FALSE(decoded.value().has_value());
    }
  }
}

TEST(Protocol, FrameSplitAcrossReadsAtEveryOffset) {
  std::vector<std::uint8_t> stream;
  const auto messages = every_message();
  for (const Message& m : messages) {
    const auto f = frame_of(m);
    stream.insert(stream.end(), f.begin(), f.end());
  }
  for (std::size_t split = 0; split <= stream.size(); ++split) {
    FrameDecoder decoder;
    std::vector<Message> out;
    for (auto part : {std::span(stream).first(split), std::span(stream).subspan(split)}) {
      decoder.feed(part);
      for (;;) {
        auto next = decoder.next();
        ASSERT_TRUE(next.ok()) << "split at " << split << ": " << next.error().message;
        if (!next.value()) break;
        out.push_back(next.value()->message);
      }
    }
    ASSERT_EQ(out, messages) << "split at " << split;
    EXPECT_EQ(decoder.buffered(), 0u);
  }
}

TEST(Protocol, ByteByByteFeedingYieldsEveryMessage) {
  FrameDecoder decoder;
  std::vector<Message> out;
  for (const Message& m : every_message()) {
    for (std::uint8_t b : frame_of(m)) {
      decoder.feed(std::span(&b, 1));
      auto next = decoder.next();
      ASSERT_TRUE(next.ok());
      if (next.value()) out.push_back(next.value()->message);
    }
  }
  EXPECT_EQ(out, every_message());
}

TEST(Protocol, BadMagicIsRejected) {
  auto bytes = frame_of(Ping{1});
  bytes[0] ^= 0xFF;
  auto decoded = decode_frame(bytes);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.error().message.find("magic"), std::string::npos);
}

TEST(Protocol, UnknownVersionIsRejected) {
  for (std::uint16_t version :
       {std::uint16_t{0}, std::uint16_t{kMaxVersion + 1}, std::uint16_t{0xFFFF}}) {
    auto decoded = decode_frame(raw_frame(kMagic, version, 10, std::vector<std::uint8_t>(8, 0)));
    ASSERT_FALSE(decoded.ok()) << version;
    EXPECT_NE(decoded.error().message.find("version"), std::string::npos);
  }
}

TEST(Protocol, UnknownTypeIsRejected) {
  for (std::uint16_t type : {std::uint16_t{0}, std::uint16_t{20}, std::uint16_t{0xFFFF}}) {
    auto decoded = decode_frame(raw_frame(kMagic, 1, type, {}));
    ASSERT_FALSE(decoded.ok()) << type;
    EXPECT_NE(decoded.error().message.find("type"), std::string::npos);
  }
}

TEST(Protocol, OversizedLengthIsRejectedFromTheHeaderAlone) {
  // Only the 12 header bytes are present: the decoder must not wait for 4 GiB of payload.
  auto header = raw_frame(kMagic, 1, 10, {}, 0xFFFFFFFFu);
  auto decoded = decode_frame(header);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.error().message.find("exceeds"), std::string::npos);
  EXPECT_FALSE(decode_frame(raw_frame(kMagic, 1, 10, {}, kMaxPayload + 1)).ok());
}

TEST(Protocol, TrailingBytesInPayloadAreRejected) {
  std::vector<std::uint8_t> payload(9, 0);  // ping is 8 bytes
  auto decoded = decode_frame(raw_frame(kMagic, 1, 10, payload));
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.error().message.find("trailing"), std::string::npos);
}

TEST(Protocol, ShortPayloadIsRejected) {
  auto decoded = decode_frame(raw_frame(kMagic, 1, 10, std::vector<std::uint8_t>(7, 0)));
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(decoded.error().message.find("truncated"), std::string::npos);
}

TEST(Protocol, OutOfRangeFieldsAreRejected) {
  // Revoke with reason 0, reason 6, swap flag 2.
  for (auto [reason, swap] : {std::pair{0, 0}, std::pair{6, 0}, std::pair{1, 2}}) {
    std::vector<std::uint8_t> payload(8, 0);
    payload.push_back(static_cast<std::uint8_t>(reason));
    payload.push_back(static_cast<std::uint8_t>(swap));
    EXPECT_FALSE(decode_frame(raw_frame(kMagic, 1, 5, payload)).ok()) << reason << "," << swap;
  }
  // Limits with core percent 0 and 101.
  for (int core : {0, 101}) {
    std::vector<std::uint8_t> payload(8, 0);
    payload.push_back(static_cast<std::uint8_t>(core));
    EXPECT_FALSE(decode_frame(raw_frame(kMagic, 1, 8, payload)).ok()) << core;
  }
  // Wait with reason 4.
  EXPECT_FALSE(decode_frame(raw_frame(kMagic, 1, 9, {4})).ok());
  // Version 7 adds the priority reasons (revoke 6, wait 4), and no other.
  std::vector<std::uint8_t> revoke(8, 0);
  revoke.push_back(6);
  revoke.push_back(0);
  EXPECT_TRUE(decode_frame(raw_frame(kMagic, 7, 5, revoke)).ok());
  revoke[8] = 7;
  EXPECT_FALSE(decode_frame(raw_frame(kMagic, 7, 5, revoke)).ok());
  EXPECT_TRUE(decode_frame(raw_frame(kMagic, 7, 9, {4})).ok());
  EXPECT_FALSE(decode_frame(raw_frame(kMagic, 7, 9, {5})).ok());
}

// A peer of version 6 knows no priority reasons: a priority revoke or wait reaches it as a turn.
TEST(Protocol, PriorityReasonsReachOlderPeersAsTurns) {
  const auto revoke = encode(Revoke{3, RevokeReason::kPriority, true}, 6);
  ASSERT_TRUE(revoke.ok());
  auto decoded = decode_frame(revoke.value());
  ASSERT_TRUE(decoded.ok());
  ASSERT_TRUE(decoded.value().has_value());
  EXPECT_EQ(std::get<Revoke>(decoded.value()->frame.message),
            (Revoke{3, RevokeReason::kTurn, true}));
  const auto wait = encode(Wait{WaitReason::kPriority}, 6);
  ASSERT_TRUE(wait.ok());
  decoded = decode_frame(wait.value());
  ASSERT_TRUE(decoded.ok());
  ASSERT_TRUE(decoded.value().has_value());
  EXPECT_EQ(std::get<Wait>(decoded.value()->frame.message), (Wait{WaitReason::kTurn}));
  // Version 7 keeps them, and carries the priority class of limits.
  SetLimits limits;
  limits.limits.priority = priority_code(Priority::kHigh);
  const auto seven = encode(limits, 7);
  ASSERT_TRUE(seven.ok());
  decoded = decode_frame(seven.value());
  ASSERT_TRUE(decoded.ok());
  ASSERT_TRUE(decoded.value().has_value());
  EXPECT_EQ(std::get<SetLimits>(decoded.value()->frame.message).limits.priority, 3);
  const auto six = encode(limits, 6);
  ASSERT_TRUE(six.ok());
  decoded = decode_frame(six.value());
  ASSERT_TRUE(decoded.ok());
  ASSERT_TRUE(decoded.value().has_value());
  EXPECT_EQ(std::get<SetLimits>(decoded.value()->frame.message).limits.priority,
            Limits::kNoPriority);
}

TEST(Protocol, HelloWithInvertedVersionRangeIsRejected) {
  Hello hello;
  hello.min_version = 1;
  hello.max_version = 1;
  auto bytes = frame_of(hello);
  bytes[kHeaderSize] = 2;  // min_version = 2 > max_version = 1
  EXPECT_FALSE(decode_frame(bytes).ok());
}

TEST(Protocol, StringLongerThanItsMaximumIsRejected) {
  std::vector<std::uint8_t> payload;
  wire::ByteWriter w(payload);
  w.u16(1);
  w.u16(1);
  w.u32(1);
  w.u16(static_cast<std::uint16_t>(kMaxUuidLength + 1));
  payload.insert(payload.end(), kMaxUuidLength + 1, 'a');
  auto decoded = decode_frame(raw_frame(kMagic, 1, 1, payload));
  EXPECT_FALSE(decoded.ok());
}

TEST(Protocol, StringLengthPastThePayloadIsRejectedWithoutReadingBeyondIt) {
  std::vector<std::uint8_t> payload;
  wire::ByteWriter w(payload);
  w.u16(1);
  w.u16(1);
  w.u32(1);
  w.u16(40);  // claims 40 bytes, payload ends here
  // Bytes after the frame must not be taken as part of it.
  auto frame = raw_frame(kMagic, 1, 1, payload);
  frame.insert(frame.end(), 64, 'x');
  EXPECT_FALSE(decode_frame(frame).ok());
}

TEST(Protocol, EncoderRefusesStringsOverTheirMaximum) {
  Hello hello;
  hello.gpu_uuid.assign(kMaxUuidLength + 1, 'g');
  EXPECT_FALSE(encode(hello).ok());
}

TEST(Protocol, DecoderStaysFailedAfterMalformedInput) {
  FrameDecoder decoder;
  auto bad = frame_of(Ping{1});
  bad[0] = 0;
  decoder.feed(bad);
  EXPECT_FALSE(decoder.next().ok());
  EXPECT_TRUE(decoder.failed());
  const auto good = frame_of(Ping{2});
  decoder.feed(good);
  EXPECT_FALSE(decoder.next().ok());
}

TEST(Protocol, MessagesBeforeAMalformedFrameAreStillDelivered) {
  FrameDecoder decoder;
  auto good = frame_of(Ping{7});
  auto bad = raw_frame(kMagic, 1, 99, {});
  good.insert(good.end(), bad.begin(), bad.end());
  decoder.feed(good);
  auto first = decoder.next();
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first.value().has_value());
  EXPECT_EQ(first.value()->message, Message(Ping{7}));
  EXPECT_FALSE(decoder.next().ok());
}

TEST(Protocol, VersionNegotiation) {
  EXPECT_EQ(negotiate_version(1, 1), std::optional<std::uint16_t>(1));
  EXPECT_EQ(negotiate_version(1, kMaxVersion + 1), std::optional<std::uint16_t>(kMaxVersion));
  EXPECT_EQ(negotiate_version(kMaxVersion + 1, kMaxVersion + 3), std::nullopt);
  EXPECT_EQ(negotiate_version(0, 0), std::nullopt);
}

TEST(Protocol, NamesAreStable) {
  EXPECT_EQ(to_string(MessageType::kReleased), "released");
  EXPECT_EQ(to_string(RevokeReason::kQuota), "quota");
  EXPECT_EQ(to_string(WaitReason::kMemory), "memory");
}

}  // namespace
}  // namespace nvshare::protocol
