// Where nvshare's sockets live unless configured otherwise. One definition shared by the
// scheduler's knob table, nvsharectl and the client library, so the defaults cannot drift apart.
#pragma once

namespace nvshare {

inline constexpr const char* kDefaultSocketPath = "/var/run/nvshare/scheduler.sock";
inline constexpr const char* kDefaultControlSocketPath = "/var/run/nvshare/control.sock";

}  // namespace nvshare
