// Fuzz target: the streaming frame decoder.
//
// The input is fed in chunks whose sizes come from the input itself. Properties checked on every
// input: the decoder never reads outside its buffer (ASan), streaming and one-shot decoding agree, and
// every decoded message re-encodes to a frame that decodes to the same message.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/protocol.h"

namespace {

using nvshare::protocol::decode_frame;
using nvshare::protocol::encode;
using nvshare::protocol::FrameDecoder;
using nvshare::protocol::Message;

void check(bool condition) {
  if (!condition) __builtin_trap();
}

// One-shot decoding of the whole buffer, frame after frame.
std::vector<Message> decode_all(std::span<const std::uint8_t> bytes, bool& failed) {
  std::vector<Message> out;
  for (;;) {
    auto decoded = decode_frame(bytes);
    if (!decoded.ok()) {
      failed = true;
      return out;
    }
    if (!decoded.value()) return out;
    check(decoded.value()->consumed <= bytes.size());
    out.push_back(decoded.value()->frame.message);
    bytes = bytes.subspan(decoded.value()->consumed);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t chunk = 1 + data[0] % 17;
  const std::span<const std::uint8_t> input(data + 1, size - 1);

  FrameDecoder decoder;
  std::vector<Message> streamed;
  bool stream_failed = false;
  for (std::size_t at = 0; at < input.size() && !stream_failed; at += chunk) {
    decoder.feed(input.subspan(at, std::min(chunk, input.size() - at)));
    for (;;) {
      auto next = decoder.next();
      if (!next.ok()) {
        stream_failed = true;
        break;
      }
      if (!next.value()) break;
      streamed.push_back(next.value()->message);
    }
  }

  bool oneshot_failed = false;
  const std::vector<Message> oneshot = decode_all(input, oneshot_failed);
  check(streamed == oneshot);
  check(stream_failed == oneshot_failed);

  for (const Message& m : oneshot) {
    auto bytes = encode(m);
    check(bytes.ok());
    auto again = decode_frame(bytes.value());
    check(again.ok() && again.value().has_value());
    check(again.value()->consumed == bytes.value().size());
    check(again.value()->frame.message == m);
  }
  return 0;
}
