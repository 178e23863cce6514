#include "common/wire.h"

namespace nvshare::wire {

void ByteWriter::put(std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

void ByteWriter::str(std::string_view s, std::size_t max_len) {
  if (s.size() > max_len) s = s.substr(0, max_len);
  u16(static_cast<std::uint16_t>(s.size()));
  out_.insert(out_.end(), s.begin(), s.end());
}

std::uint64_t ByteReader::get(int bytes) {
  if (!ok_ || in_.size() - pos_ < static_cast<std::size_t>(bytes)) {
    ok_ = false;
    return 0;
  }
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(in_[pos_ + i]) << (8 * i);
  pos_ += bytes;
  return v;
}

std::string ByteReader::str(std::size_t max_len) {
  const std::size_t len = u16();
  if (!ok_ || len > max_len || in_.size() - pos_ < len) {
    ok_ = false;
    return {};
  }
  std::string s(reinterpret_cast<const char*>(in_.data() + pos_), len);
  pos_ += len;
  return s;
}

std::uint32_t load_le32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

std::uint16_t load_le16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}

}  // namespace nvshare::wire
