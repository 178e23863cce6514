// Fuzz target: the control API's command layer, the lines nvsharectl and the device plugin send,
// against a Scheduler with two GPUs and three clients (one in a pod).
//
// Properties: every line gets one response, an object whose "ok" is a boolean and which carries
// "error" exactly when "ok" is false; the response to a line that decodes as a request decodes as
// the answer that request expects (or a refusal); nothing crashes; the persistent state the
// commands leave renders to text that parses back to the same text.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "control/answers.h"
#include "fuzz_check.h"
#include "scheduler/control_api.h"
#include "scheduler/scheduler.h"

namespace {

using namespace nvshare;
using namespace nvshare::scheduler;
using nvshare::fuzz::check;

class NullChannel final : public ClientChannel {
 public:
  void send(ClientId, const protocol::Message&) override {}
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  log_set_level(LogLevel::kError);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  NullChannel channel;
  DaemonStats stats;
  Scheduler scheduler(default_config(), channel);
  scheduler.set_process_probe([](pid_t, std::uint64_t) { return true; });
  const MonoTime now{std::chrono::seconds(100)};
  check(scheduler
            .set_gpus({GpuInfo{"GPU-a", 0, 16ull << 30}, GpuInfo{"GPU-b", 1, 80ull << 30}}, "fuzz",
                      now)
            .ok());
  const char* pods[] = {"7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d", nullptr, nullptr};
  for (int i = 0; i < 3; ++i) {
    ClientIdentity identity;
    identity.pid = 100 + i;
    identity.start_time = 1000 + static_cast<std::uint64_t>(i);
    if (pods[i] != nullptr) identity.pod_uid = pods[i];
    protocol::Hello hello;
    hello.gpu_uuid = i == 1 ? "GPU-b" : "GPU-a";
    check(scheduler.register_client(scheduler.next_client_id(), identity, hello, now).ok());
  }
  ControlContext context{scheduler, stats, MonoTime{}, now, 3};
  std::string_view input(reinterpret_cast<const char*>(data), size);
  while (!input.empty()) {
    const std::size_t end = input.find('\n');
    const std::string_view line = input.substr(0, end);
    input = end == std::string_view::npos ? std::string_view() : input.substr(end + 1);
    const Json response = handle_control_line(line, context);
    const Json* ok = response.find("ok");
    check(ok != nullptr && ok->is_bool());
    check((response.find("error") != nullptr) == !*ok->as_bool());
    auto parsed_line = parse_json(line);
    auto request = parsed_line ? control::decode(parsed_line.value())
                               : Result<control::Request>(Error{"not JSON"});
    if (request) {
      std::visit(
          [&](const auto& r) {
            using Answer = control::AnswerOf<std::decay_t<decltype(r)>>;
            check(control::decode_reply<Answer>(response).ok());
          },
          request.value());
    }
  }
  const std::string state = render_state(scheduler.persistent_state());
  auto parsed = parse_state(state);
  check(parsed.ok());
  check(render_state(parsed.value()) == state);
  return 0;
}
