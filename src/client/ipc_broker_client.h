// The client half of CUDA IPC brokering (scheduler/ipc_broker.h): one short connection to the
// scheduler's client socket per request, whose only frame is the request; the answer ends it.
//
// Contract: every call returns within `timeout` (connect, send and the answer each bounded) with
// the answer or an error saying why (no scheduler, refused, timed out); never throws. The
// descriptor an export offers stays the caller's.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/result.h"
#include "common/unix_socket.h"

namespace nvshare::client {

inline constexpr std::chrono::milliseconds kIpcTimeout{2000};

// Offers the shareable descriptor of an allocation of `bytes`; the token importers name.
Result<std::uint64_t> ipc_export(const std::string& socket_path, int fd, std::uint64_t bytes,
                                 std::chrono::milliseconds timeout = kIpcTimeout);

struct IpcImported {
  UniqueFd fd;
  std::uint64_t bytes = 0;
};
Result<IpcImported> ipc_import(const std::string& socket_path, std::uint64_t token,
                               std::chrono::milliseconds timeout = kIpcTimeout);

// The exporter freed the memory: the scheduler closes its descriptor.
Status ipc_withdraw(const std::string& socket_path, std::uint64_t token,
                    std::chrono::milliseconds timeout = kIpcTimeout);

}  // namespace nvshare::client
