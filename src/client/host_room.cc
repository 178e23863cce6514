#include "client/host_room.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <limits>
#include <optional>
#include <string_view>
#include <system_error>
#include <vector>

// POSIX calls only (no iostreams, no std::filesystem): the library must load on glibc 2.28, and
// libstdc++'s file streams and filesystem reach stat functions that newer glibc versions.

namespace nvshare::client {
namespace {

constexpr std::uint64_t kUnbounded = std::numeric_limits<std::uint64_t>::max();
// cgroup v1 writes "no limit" as a page-rounded LONG_MAX; anything this large limits nothing.
constexpr std::uint64_t kNoLimitAbove = std::uint64_t{1} << 62;
constexpr std::size_t kMaxFile = 64 * 1024;  // /proc/self/cgroup and /proc/meminfo are far smaller

std::optional<std::string> read_text(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || text.size() + static_cast<std::size_t>(n) > kMaxFile) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

std::optional<std::uint64_t> parse_bytes(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<std::uint64_t> read_bytes(const std::string& path) {
  const std::optional<std::string> text = read_text(path);
  return text ? parse_bytes(*text) : std::nullopt;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// What one cgroup directory allows beyond its usage, and its limit; nullopt when it sets none.
struct Headroom {
  std::uint64_t limit = 0;
  std::uint64_t left = 0;
};
std::optional<Headroom> headroom(const std::string& dir, const char* limit_file,
                                 const char* usage_file) {
  const std::optional<std::uint64_t> limit = read_bytes(dir + "/" + limit_file);
  if (!limit || *limit >= kNoLimitAbove) return std::nullopt;  // "max", absent or unreadable
  const std::uint64_t used = read_bytes(dir + "/" + usage_file).value_or(0);
  return Headroom{*limit, *limit > used ? *limit - used : 0};
}

// The tightest headroom of `path` (a cgroup's path as /proc/self/cgroup gives it) and its
// ancestors under `root`. A path that does not exist under the root (a container that sees its
// own cgroup at the root without a cgroup namespace) is read at the root.
void walk_cgroups(const std::string& root, std::string_view path, const char* limit_file,
                  const char* usage_file, std::optional<Headroom>& tightest) {
  std::vector<std::string> dirs{root};  // the root, then each level below it
  while (!path.empty()) {
    const std::size_t slash = path.find('/');
    const std::string_view part = path.substr(0, slash);
    path = slash == std::string_view::npos ? std::string_view{} : path.substr(slash + 1);
    if (part.empty() || part == "." || part == "..") continue;
    dirs.push_back(dirs.back() + "/" + std::string(part));
  }
  if (!is_directory(dirs.back())) dirs.resize(1);
  for (const std::string& dir : dirs) {
    if (const std::optional<Headroom> h = headroom(dir, limit_file, usage_file)) {
      if (!tightest || h->left < tightest->left) tightest = h;
    }
  }
}

std::optional<std::uint64_t> mem_available(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemAvailable:";
  const std::size_t at = meminfo.find(kKey);
  if (at == std::string_view::npos || (at > 0 && meminfo[at - 1] != '\n')) return std::nullopt;
  std::string_view rest = meminfo.substr(at + kKey.size());
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  std::uint64_t kib = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), kib);
  if (ec != std::errc() || end == rest.data()) return std::nullopt;
  return kib * 1024;
}

}  // namespace

std::uint64_t host_room(const HostRoomPaths& paths) {
  std::optional<Headroom> tightest;
  if (const std::optional<std::string> cgroups = read_text(paths.proc + "/self/cgroup")) {
    std::string_view lines(*cgroups);
    while (!lines.empty()) {
      const std::size_t newline = lines.find('\n');
      const std::string_view line = lines.substr(0, newline);
      lines = newline == std::string_view::npos ? std::string_view{} : lines.substr(newline + 1);
      // hierarchy-ID:controllers:path
      const std::size_t first = line.find(':');
      const std::size_t second =
          first == std::string_view::npos ? first : line.find(':', first + 1);
      if (second == std::string_view::npos) continue;
      const std::string controllers(line.substr(first + 1, second - first - 1));
      const std::string_view path = line.substr(second + 1);
      if (controllers.empty()) {  // v2
        walk_cgroups(paths.cgroup, path, "memory.max", "memory.current", tightest);
      } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
        walk_cgroups(paths.cgroup + "/memory", path, "memory.limit_in_bytes",
                     "memory.usage_in_bytes", tightest);
      }
    }
  }
  std::uint64_t room = tightest ? tightest->left : kUnbounded;
  if (const std::optional<std::string> meminfo = read_text(paths.proc + "/meminfo")) {
    if (const std::optional<std::uint64_t> available = mem_available(*meminfo)) {
      room = std::min(room, *available);
    }
  }
  if (room == kUnbounded) return room;
  const std::uint64_t margin = std::max<std::uint64_t>(
      kHostRoomMargin, tightest ? static_cast<std::uint64_t>(kHostRoomMarginShare *
                                                             static_cast<double>(tightest->limit))
                                : 0);
  return room > margin ? room - margin : 0;
}

}  // namespace nvshare::client
