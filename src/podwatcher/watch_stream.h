// The watch stream as the API server sends it: one JSON event per line,
//   {"type":"ADDED","object":{...Pod...}}
//   {"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"12345"}}}
//   {"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired",...}}
// LineSplitter cuts the byte stream (delivered in arbitrary pieces) into lines, refusing a line
// over its size limit; parse_watch_event reads one line. Also reads the Status objects of error
// responses and the PodList of a list. Pure: no I/O. Bodies are read with the strict parser of
// common/json under kApiJsonLimits.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/json.h"
#include "common/result.h"

namespace nvshare::podwatcher {

// What the API server's bodies may be: a pod list of a full node is a few MiB; managedFields nest a
// few dozen levels at most.
inline constexpr JsonLimits kApiJsonLimits{.max_bytes = std::size_t{256} << 20, .max_depth = 128};

class LineSplitter {
 public:
  explicit LineSplitter(std::size_t max_line_bytes = 16u << 20) : max_line_bytes_(max_line_bytes) {}

  // Appends `bytes` and calls `on_line` for every completed line (without "\n" or "\r\n"; blank
  // lines skipped). `on_line` returns false to stop early. Error: a line over the limit.
  Status feed(std::string_view bytes, const std::function<bool(std::string_view)>& on_line);
  // Bytes of an incomplete last line.
  std::size_t pending() const { return buffer_.size(); }

 private:
  std::size_t max_line_bytes_;
  std::string buffer_;
};

struct WatchEvent {
  enum class Type { kAdded, kModified, kDeleted, kBookmark, kError };
  Type type = Type::kAdded;
  Json object;
  std::string resource_version;  // object.metadata.resourceVersion ("" when absent)
  int error_code = 0;            // ERROR: the Status code (410 = Gone, the version is too old)
  std::string error_message;     // ERROR: the Status message
};

Result<WatchEvent> parse_watch_event(std::string_view line);

// A metav1.Status body (the body of an error response, or the object of an ERROR event): its code
// (0 when absent) and message.
struct ApiStatus {
  int code = 0;
  std::string reason;
  std::string message;
};
ApiStatus parse_api_status(const Json& object);
// The same, read from a response body (an empty status when the body is not JSON).
ApiStatus parse_api_status_text(std::string_view body);

// A PodList: the items and metadata.resourceVersion (required: the watch starts from it).
struct PodList {
  std::vector<Json> items;
  std::string resource_version;
};
Result<PodList> parse_pod_list(std::string_view body);

}  // namespace nvshare::podwatcher
