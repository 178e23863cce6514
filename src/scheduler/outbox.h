// Outbox: the bytes queued for one non-blocking socket.
//
// The reactor never blocks on a peer: frames are appended here and written when the socket takes
// them (at the end of each event batch, and on EPOLLOUT while anything is left). The owner caps the
// pending size and drops a peer that does not read. Byte counters are absolute (since the
// connection opened), so a caller can remember "the frame that ends at byte N" and learn when it
// has been written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace nvshare::scheduler {

class Outbox {
 public:
  // The buffer to append encoded bytes to (protocol::encode_to appends in place).
  std::vector<std::uint8_t>& buffer() { return data_; }
  void append(std::span<const std::uint8_t> bytes) {
    data_.insert(data_.end(), bytes.begin(), bytes.end());
  }
  void append(std::string_view text) { data_.insert(data_.end(), text.begin(), text.end()); }

  std::size_t pending() const { return data_.size() - start_; }
  bool empty() const { return pending() == 0; }
  std::uint64_t appended_total() const { return sent_total_ + pending(); }
  std::uint64_t sent_total() const { return sent_total_; }

  // Writes what the socket accepts without blocking. Ok(true) when everything was written,
  // Ok(false) when the socket is full (wait for EPOLLOUT), an error when the peer is gone.
  Result<bool> flush(int fd);

 private:
  std::vector<std::uint8_t> data_;
  std::size_t start_ = 0;
  std::uint64_t sent_total_ = 0;
};

}  // namespace nvshare::scheduler
