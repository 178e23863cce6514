#include "scheduler/state_file.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/json.h"
#include "common/log.h"
#include "common/memory_mode.h"
#include "common/protocol.h"
#include "common/unix_socket.h"

namespace nvshare::scheduler {
namespace {

constexpr std::int64_t kVersion = 1;

void put_limits(Json& out, const LimitsLayer& limits) {
  if (limits.memory_bytes) out.set("memory_bytes", *limits.memory_bytes);
  if (limits.core_percent) out.set("core_percent", static_cast<int>(*limits.core_percent));
  if (limits.memory_mode) {
    if (const auto mode = protocol::memory_mode_of(*limits.memory_mode)) {
      out.set("memory_mode", std::string(to_string(*mode)));
    }
  }
  if (limits.priority) {
    if (const auto priority = protocol::priority_of(*limits.priority)) {
      out.set("priority", std::string(to_string(*priority)));
    }
  }
}

Result<LimitsLayer> get_limits(const Json& in) {
  LimitsLayer limits;
  if (const Json* memory = in.find("memory_bytes")) {
    const auto bytes = memory->as_int64();
    if (!bytes || *bytes < 0) return make_error("memory_bytes must be a byte count");
    limits.memory_bytes = static_cast<std::uint64_t>(*bytes);
  }
  if (const Json* core = in.find("core_percent")) {
    const auto percent = core->as_int64();
    if (!percent || *percent < 1 || *percent > 100)
      return make_error("core_percent must be 1..100");
    limits.core_percent = static_cast<std::uint8_t>(*percent);
  }
  if (const Json* mode = in.find("memory_mode")) {
    const std::string* word = mode->as_string();
    const std::optional<MemoryMode> parsed = word ? parse_memory_mode(*word) : std::nullopt;
    if (!parsed) return make_error("memory_mode must be one of " + std::string(kMemoryModeWords));
    limits.memory_mode = protocol::memory_mode_code(*parsed);
  }
  if (const Json* priority = in.find("priority")) {
    const std::string* word = priority->as_string();
    const std::optional<Priority> parsed = word ? parse_priority(*word) : std::nullopt;
    if (!parsed) return make_error("priority must be one of " + std::string(kPriorityWords));
    limits.priority = protocol::priority_code(*parsed);
  }
  return limits;
}

Result<std::string> get_string(const Json& in, std::string_view key, std::size_t max) {
  const Json* value = in.find(key);
  const std::string* text = value ? value->as_string() : nullptr;
  if (text == nullptr || text->empty() || text->size() > max) {
    return make_error(std::string(key) + " must be a string of 1.." + std::to_string(max) +
                      " bytes");
  }
  return *text;
}

Result<const Json::Array*> get_array(const Json& root, std::string_view key) {
  const Json* value = root.find(key);
  if (value == nullptr) {
    static const Json::Array kEmpty;
    return &kEmpty;
  }
  if (!value->is_array()) return make_error(std::string(key) + " must be an array");
  if (value->as_array()->size() > kMaxStateRecords) {
    return make_error(std::string(key) + " has more than " + std::to_string(kMaxStateRecords) +
                      " records");
  }
  return value->as_array();
}

std::string parent_directory(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

Status sync_directory(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return make_error("cannot open " + dir + ": " + std::strerror(errno));
  if (::fsync(fd.get()) != 0) return make_error("cannot sync " + dir + ": " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace

std::string render_state(const SchedulerState& state) {
  Json root = Json::object();
  root.set("version", kVersion);
  root.set("gpus", gpus_json(state.gpus));
  Json pods = Json::array();
  for (const auto& [uid, pod] : state.pods) {
    Json p = Json::object();
    p.set("uid", uid);
    if (pod.pod_namespace) p.set("namespace", *pod.pod_namespace);
    if (pod.pod_name) p.set("name", *pod.pod_name);
    put_limits(p, pod.limits);
    pods.push_back(std::move(p));
  }
  root.set("pods", std::move(pods));
  Json processes = Json::array();
  for (const auto& [key, limits] : state.processes) {
    Json p = Json::object();
    p.set("pid", static_cast<long long>(key.pid));
    p.set("start_time", key.start_time);
    p.set("gpu", key.gpu);
    put_limits(p, limits);
    processes.push_back(std::move(p));
  }
  root.set("processes", std::move(processes));
  std::string text = root.dump();
  text += '\n';
  return text;
}

Result<SchedulerState> parse_state(std::string_view text) {
  auto parsed = parse_json(text, JsonLimits{.max_bytes = std::size_t{256} << 20, .max_depth = 8});
  if (!parsed) return parsed.error();
  const Json& root = parsed.value();
  if (!root.is_object()) return make_error("the state is not a JSON object");
  const Json* version = root.find("version");
  if (version == nullptr || version->as_int64() != kVersion) {
    return make_error("unknown state version (this scheduler reads version 1)");
  }
  SchedulerState state;
  auto gpus = get_array(root, "gpus");
  if (!gpus) return gpus.error();
  for (const Json& g : *gpus.value()) {
    auto uuid = get_string(g, "uuid", 64);
    if (!uuid) return make_error("gpus: " + uuid.error().message);
    const Json* memory = g.find("memory_bytes");
    const auto bytes = memory ? memory->as_int64() : std::nullopt;
    if (!bytes || *bytes <= 0) return make_error("gpus: memory_bytes must be positive");
    state.gpus.push_back(GpuInfo{uuid.value(), static_cast<unsigned>(state.gpus.size()),
                                 static_cast<std::uint64_t>(*bytes)});
  }
  auto pods = get_array(root, "pods");
  if (!pods) return pods.error();
  for (const Json& p : *pods.value()) {
    auto uid = get_string(p, "uid", 64);
    if (!uid) return make_error("pods: " + uid.error().message);
    PodRecord pod;
    if (p.find("namespace")) {
      auto ns = get_string(p, "namespace", 253);
      if (!ns) return make_error("pods: " + ns.error().message);
      pod.pod_namespace = ns.value();
    }
    if (p.find("name")) {
      auto name = get_string(p, "name", 253);
      if (!name) return make_error("pods: " + name.error().message);
      pod.pod_name = name.value();
    }
    auto limits = get_limits(p);
    if (!limits) return make_error("pods: " + limits.error().message);
    pod.limits = limits.value();
    state.pods[uid.value()] = std::move(pod);
  }
  auto processes = get_array(root, "processes");
  if (!processes) return processes.error();
  for (const Json& p : *processes.value()) {
    const Json* pid = p.find("pid");
    const Json* start = p.find("start_time");
    const auto pid_value = pid ? pid->as_int64() : std::nullopt;
    const auto start_value = start ? start->as_int64() : std::nullopt;
    if (!pid_value || *pid_value <= 0 || *pid_value > INT32_MAX) {
      return make_error("processes: pid must be a positive integer");
    }
    if (!start_value || *start_value <= 0) {
      return make_error("processes: start_time must be a positive integer");
    }
    auto gpu = get_string(p, "gpu", 64);
    if (!gpu) return make_error("processes: " + gpu.error().message);
    auto limits = get_limits(p);
    if (!limits) return make_error("processes: " + limits.error().message);
    state.processes[ProcessKey{static_cast<pid_t>(*pid_value),
                               static_cast<std::uint64_t>(*start_value), gpu.value()}] =
        limits.value();
  }
  return state;
}

Result<std::optional<std::string>> read_state_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return std::optional<std::string>();
    return make_error("cannot open " + path + ": " + std::strerror(errno));
  }
  std::string text;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return make_error("cannot read " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > (std::size_t{256} << 20)) return make_error(path + " is too large");
  }
  return std::optional<std::string>(std::move(text));
}

Status write_state_file(const std::string& path, const std::string& text) {
  const std::string dir = parent_directory(path);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return make_error("cannot create " + dir + ": " + std::strerror(errno));
  }
  const std::string temporary = path + ".tmp";
  UniqueFd fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return make_error("cannot create " + temporary + ": " + std::strerror(errno));
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::unlink(temporary.c_str());
      return make_error("cannot write " + temporary + ": " + why);
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd.get()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(temporary.c_str());
    return make_error("cannot sync " + temporary + ": " + why);
  }
  fd.reset();
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(temporary.c_str());
    return make_error("cannot replace " + path + ": " + why);
  }
  return sync_directory(dir);
}

StateWriter::StateWriter(std::string path) : path_(std::move(path)) {
  // The thread takes no signals: SIGTERM and SIGINT are the reactor's (through its signalfd).
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  thread_ = std::thread([this] { run(); });
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

StateWriter::~StateWriter() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void StateWriter::submit(std::string text) {
  {
    std::lock_guard lock(mu_);
    pending_ = std::move(text);
  }
  changed_.notify_all();
}

void StateWriter::flush() {
  std::unique_lock lock(mu_);
  changed_.wait(lock, [&] { return !pending_ && !writing_; });
}

std::uint64_t StateWriter::writes() const {
  std::lock_guard lock(mu_);
  return writes_;
}

std::uint64_t StateWriter::failures() const {
  std::lock_guard lock(mu_);
  return failures_;
}

void StateWriter::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    changed_.wait(lock, [&] { return pending_.has_value() || stopping_; });
    if (!pending_) return;  // stopping with nothing left to write
    std::string text = std::move(*pending_);
    pending_.reset();
    writing_ = true;
    lock.unlock();
    const Status written = write_state_file(path_, text);
    if (!written) NVSHARE_ERROR("state file: %s", written.error().message.c_str());
    lock.lock();
    writing_ = false;
    ++(written ? writes_ : failures_);
    changed_.notify_all();
  }
}

}  // namespace nvshare::scheduler
