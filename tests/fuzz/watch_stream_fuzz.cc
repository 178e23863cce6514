// Fuzz target: the API server's watch stream and list bodies, and the pods in them, as the pod
// watcher reads them: the bytes are cut into pieces at arbitrary points (the first byte chooses
// the piece size), split into lines, and every line is read as a watch event whose object is read
// as a pod and turned into limits.
//
// Properties: nothing crashes; the line splitter never hands out a line with a newline; a pod that
// is read has a UID; an annotation that is invalid keeps the previous limit of its field.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "podwatcher/pod_limits.h"
#include "podwatcher/watch_stream.h"

using nvshare::fuzz::check;
namespace pw = nvshare::podwatcher;

namespace {

void read_pod(const nvshare::Json& object) {
  auto pod = pw::parse_pod(object, "nvshare.com/gpu");
  if (!pod.ok()) return;
  check(!pod.value().uid.empty());
  const pw::PodLimits previous{std::uint64_t{1} << 30, 30, std::nullopt, std::nullopt};
  const pw::LimitsDecision decision = pw::decide_limits(pod.value(), previous);
  for (const pw::AnnotationProblem& problem : decision.problems) {
    check(!problem.message.empty());
    if (problem.annotation == pw::kMemoryLimitAnnotation) {
      check(decision.limits.memory_bytes == previous.memory_bytes);
    } else if (problem.annotation == pw::kCoreLimitAnnotation) {
      check(decision.limits.core_percent == previous.core_percent);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t piece = 1 + data[0] % 64;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (auto list = pw::parse_pod_list(rest); list.ok()) {
    for (const nvshare::Json& item : list.value().items) read_pod(item);
  }
  pw::LineSplitter splitter(4096);
  while (!rest.empty()) {
    const std::string_view chunk = rest.substr(0, piece);
    rest.remove_prefix(chunk.size());
    const nvshare::Status fed = splitter.feed(chunk, [](std::string_view line) {
      check(line.find('\n') == std::string_view::npos);
      auto event = pw::parse_watch_event(line);
      if (!event.ok()) return true;
      if (event.value().type == pw::WatchEvent::Type::kError) {
        (void)pw::parse_api_status(event.value().object);
      } else {
        read_pod(event.value().object);
      }
      return true;
    });
    if (!fed.ok()) break;
  }
  return 0;
}
