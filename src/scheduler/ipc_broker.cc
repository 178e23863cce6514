#include "scheduler/ipc_broker.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

namespace nvshare::scheduler {

bool may_share_memory(const ClientIdentity& exporter, const ClientIdentity& importer) {
  if (exporter.pod_uid || importer.pod_uid) {
    return exporter.pod_uid.has_value() && importer.pod_uid.has_value() &&
           *exporter.pod_uid == *importer.pod_uid;
  }
  return exporter.uid == importer.uid;
}

std::size_t IpcBroker::count_of(const ClientIdentity& exporter) const {
  std::size_t n = 0;
  for (const auto& [token, e] : exports_) n += same_process(e.exporter, exporter) ? 1 : 0;
  return n;
}

std::uint64_t IpcBroker::fresh_token() const {
  for (;;) {
    std::uint64_t token = 0;
    if (::getrandom(&token, sizeof token, 0) != static_cast<ssize_t>(sizeof token)) {
      // No entropy source: the tokens only need to be unique; identity guards who may claim.
      token =
          static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) *
          0x9E3779B97F4A7C15ull;
    }
    if (token != 0 && exports_.count(token) == 0) return token;
  }
}

Result<std::uint64_t> IpcBroker::offer(const ClientIdentity& exporter, UniqueFd fd,
                                       std::uint64_t bytes) {
  if (!fd.valid()) return make_error("no descriptor came with the export");
  if (bytes == 0) return make_error("an export of 0 bytes");
  if (exports_.size() >= max_total_) {
    return make_error("the scheduler keeps " + std::to_string(max_total_) +
                      " exports already (its limit)");
  }
  if (count_of(exporter) >= max_per_process_) {
    return make_error("this process has " + std::to_string(max_per_process_) +
                      " exports already (the limit per process)");
  }
  const std::uint64_t token = fresh_token();
  exports_.emplace(token, Export{exporter, std::move(fd), bytes});
  return token;
}

Result<IpcBroker::Claimed> IpcBroker::claim(const ClientIdentity& importer,
                                            std::uint64_t token) const {
  auto it = exports_.find(token);
  // The same answer whether the token is unknown or belongs to another pod: a token says nothing
  // about memory its holder may not map.
  if (it == exports_.end() || !may_share_memory(it->second.exporter, importer)) {
    return make_error("no export with this handle is shared with this process's pod or user");
  }
  UniqueFd copy(::fcntl(it->second.fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!copy.valid()) return make_error(std::string("cannot duplicate: ") + std::strerror(errno));
  return Claimed{std::move(copy), it->second.bytes};
}

bool IpcBroker::withdraw(const ClientIdentity& exporter, std::uint64_t token) {
  auto it = exports_.find(token);
  if (it == exports_.end() || !same_process(it->second.exporter, exporter)) return false;
  exports_.erase(it);
  return true;
}

std::size_t IpcBroker::drop_process(pid_t pid, std::uint64_t start_time) {
  std::size_t dropped = 0;
  for (auto it = exports_.begin(); it != exports_.end();) {
    if (it->second.exporter.pid == pid && it->second.exporter.start_time == start_time) {
      it = exports_.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  return dropped;
}

}  // namespace nvshare::scheduler
