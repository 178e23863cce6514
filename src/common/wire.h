// Explicit little-endian encoding of integers and length-prefixed strings.
//
// ByteWriter appends to a caller-owned byte vector. ByteReader reads from a span it does not own and
// never reads past its end: every read reports failure instead, and once a read has failed the reader
// stays failed (so a decoder can read a whole payload and check ok() once at the end).
// Strings are a u16 length followed by that many bytes; readers enforce a per-field maximum length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nvshare::wire {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<std::uint8_t>& out) : out_(out) {}

  void u8(std::uint8_t v) { out_.push_back(v); }
  void u16(std::uint16_t v) { put(v, 2); }
  void u32(std::uint32_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  // Writes at most max_len bytes of s (callers validate lengths before encoding).
  void str(std::string_view s, std::size_t max_len);

 private:
  void put(std::uint64_t v, int bytes);
  std::vector<std::uint8_t>& out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::uint8_t> in) : in_(in) {}

  std::uint8_t u8() { return static_cast<std::uint8_t>(get(1)); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(get(2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(get(4)); }
  std::uint64_t u64() { return get(8); }
  // Fails when the declared length exceeds max_len or the remaining input.
  std::string str(std::size_t max_len);

  bool ok() const { return ok_; }
  std::size_t remaining() const { return ok_ ? in_.size() - pos_ : 0; }
  // True when every byte was consumed and no read failed.
  bool done() const { return ok_ && pos_ == in_.size(); }

 private:
  std::uint64_t get(int bytes);
  std::span<const std::uint8_t> in_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

// Little-endian helpers for fixed positions (frame headers).
std::uint32_t load_le32(const std::uint8_t* p);
std::uint16_t load_le16(const std::uint8_t* p);

}  // namespace nvshare::wire
