// The control API's commands: one JSON request in, one JSON response out (docs/control-api.md is
// the normative description).
//
// Requests are objects with a "cmd" member: status, set-limits, forget-pod, set-policy, explain,
// stats, version, decoded by control/requests. Answers are control/answers types, encoded there:
// {"ok":true,...} or {"ok":false,"error":"..."}. Unknown members of a request are errors (a typo
// such as "cores" must not be silently ignored). Nothing here touches sockets, so
// the commands can be tested against a Scheduler directly; control_server.h carries the lines.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/json.h"
#include "scheduler/daemon_stats.h"
#include "scheduler/scheduler.h"

namespace nvshare::scheduler {

// The largest request line accepted.
inline constexpr std::size_t kMaxControlLine = 64 * 1024;

struct ControlContext {
  Scheduler& scheduler;
  DaemonStats& stats;
  MonoTime started{};
  MonoTime now{};
  std::size_t client_sessions = 0;
};

Json handle_control_request(const Json& request, ControlContext& context);
// Parses one line (without its newline) and handles it; a parse error becomes an error response.
Json handle_control_line(std::string_view line, ControlContext& context);

Json error_response(std::string_view message);

}  // namespace nvshare::scheduler
