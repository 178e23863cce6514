// Where nvshare's sockets live unless configured otherwise. One definition shared by the
// scheduler's knob table, nvsharectl, nvshare-run, the device plugin and the client library, so the
// defaults cannot drift apart.
//
// The two sockets have directories of their own on purpose. The client socket's directory is
// mounted into every GPU container on Kubernetes; the control socket admits root, so it must not
// lie there, or a GPU container running as uid 0 could change any pod's limits or replace the
// client socket. Its directory is mounted into the scheduler and the device plugin only.
#pragma once

namespace nvshare {

inline constexpr const char* kDefaultSocketPath = "/var/run/nvshare/scheduler.sock";
inline constexpr const char* kDefaultControlSocketPath = "/var/run/nvshare-control/control.sock";
// The scheduler's state across restarts (pod limits, GPUs); a host directory on Kubernetes.
inline constexpr const char* kDefaultStateFile = "/var/lib/nvshare/scheduler/state.json";

}  // namespace nvshare
