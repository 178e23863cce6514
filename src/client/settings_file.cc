#include "client/settings_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "common/quantity.h"

namespace nvshare::client {
namespace {

constexpr std::size_t kMaxSettingsBytes = 16 * 1024;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

Result<Duration> milliseconds(std::string_view value, std::int64_t high) {
  std::int64_t ms = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), ms);
  if (error != std::errc() || end != value.data() + value.size() || ms < 0 || ms > high) {
    return make_error("\"" + std::string(value) + "\" is not 0.." + std::to_string(high) +
                      " milliseconds");
  }
  return Duration(std::chrono::milliseconds(ms));
}

Status apply(std::string_view key, std::string_view value, ClientSettings& s) {
  if (key == "enforce") {
    if (value != "0" && value != "1") return make_error("enforce must be 0 or 1");
    s.enforce = value == "1";
  } else if (key == "socket") {
    if (value.empty() || value.size() > 107 || value.front() != '/') {
      return make_error("socket must be an absolute path of at most 107 bytes");
    }
    s.socket = std::string(value);
  } else if (key == "register-wait-ms") {
    auto d = milliseconds(value, 60'000);
    if (!d) return d.error();
    s.register_wait = d.value();
  } else if (key == "reconnect-max-ms") {
    auto d = milliseconds(value, 600'000);
    if (!d) return d.error();
    if (d.value() < std::chrono::milliseconds(50)) return make_error("reconnect-max-ms below 50");
    s.reconnect_max = d.value();
  } else if (key == "memory-limit") {
    s.memory_pending = value == "pending";
    s.memory_bytes.reset();
    if (value == "none") {
      s.memory_bytes = 0;
    } else if (!s.memory_pending) {
      std::uint64_t bytes = 0;
      const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), bytes);
      if (error != std::errc() || end != value.data() + value.size() || bytes == 0) {
        auto quantity = parse_memory_quantity(value);
        if (!quantity || quantity.value() == 0) {
          return make_error("memory-limit must be bytes, a quantity, none or pending");
        }
        bytes = quantity.value();
      }
      s.memory_bytes = bytes;
    }
  } else if (key == "pod") {
    s.pod = std::string(value.substr(0, 253));
  } else if (key == "devices") {
    // Which slots the container holds: for the plugin's bookkeeping only.
  } else {
    return make_error("unknown setting \"" + std::string(key) + "\"");
  }
  return Status::Ok();
}

bool trusted_owner(uid_t uid) {
  if (uid == 0) return true;
  // A host root's file seen from inside a user namespace belongs to the overflow uid.
  const int fd = ::open("/proc/sys/kernel/overflowuid", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return uid == 65534;
  char buffer[32] = {};
  const ssize_t n = ::read(fd, buffer, sizeof buffer - 1);
  ::close(fd);
  unsigned long overflow = 65534;
  if (n > 0) {
    const auto [end, error] = std::from_chars(buffer, buffer + n, overflow);
    (void)end;
    if (error != std::errc()) overflow = 65534;
  }
  return uid == overflow;
}

}  // namespace

Result<ClientSettings> parse_client_settings(std::string_view text) {
  if (text.size() > kMaxSettingsBytes) return make_error("the settings file is too large");
  ClientSettings settings;
  int line_number = 0;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    ++line_number;
    line = trim(line);
    if (line.empty() || line.front() == '#') continue;
    const std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      return make_error("line " + std::to_string(line_number) + ": expected key=value");
    }
    if (Status s = apply(trim(line.substr(0, eq)), trim(line.substr(eq + 1)), settings); !s) {
      return make_error("line " + std::to_string(line_number) + ": " + s.error().message);
    }
  }
  return settings;
}

namespace {

// A file at the settings path says this container is managed: one that cannot be trusted for its
// values (not a regular file, not root's, writable by others, unreadable, malformed) still makes
// the process enforce, with its memory limit unknown until the scheduler gives it. Nothing found
// there fails open.
SettingsRead fail_closed(std::string warning) {
  SettingsRead out;
  out.warning =
      std::move(warning) + "; enforcing with the memory limit unknown until the scheduler gives it";
  ClientSettings settings;
  settings.enforce = true;
  settings.memory_pending = true;
  out.settings = settings;
  return out;
}

}  // namespace

SettingsRead read_client_settings(const std::string& path) {
  // Non-blocking: a FIFO planted at the path must not hang the process in open() or read().
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return {};
    return fail_closed(path + " exists but cannot be read (" + std::strerror(errno) + ")");
  }
  struct stat st {};
  std::string text;
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (regular) {
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || text.size() > kMaxSettingsBytes) break;
      text.append(buffer, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  if (!regular || !trusted_owner(st.st_uid) || (st.st_mode & 0022) != 0) {
    return fail_closed(path +
                       " cannot be trusted: it must be a regular file owned by root and "
                       "writable by no one else");
  }
  auto parsed = parse_client_settings(text);
  if (!parsed) return fail_closed(path + ": " + parsed.error().message);
  SettingsRead out;
  out.settings = parsed.value();
  return out;
}

}  // namespace nvshare::client
