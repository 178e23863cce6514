#include "client/host_room.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>
#include <system_error>
#include <vector>

namespace nvshare::client {
namespace {

constexpr std::uint64_t kUnbounded = std::numeric_limits<std::uint64_t>::max();
// cgroup v1 writes "no limit" as a page-rounded LONG_MAX; anything this large limits nothing.
constexpr std::uint64_t kNoLimitAbove = std::uint64_t{1} << 62;

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
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

// What one cgroup directory allows beyond its usage, and its limit; nullopt when it sets none.
struct Headroom {
  std::uint64_t limit = 0;
  std::uint64_t left = 0;
};
std::optional<Headroom> headroom(const std::filesystem::path& dir, const char* limit_file,
                                 const char* usage_file) {
  const std::optional<std::uint64_t> limit = read_bytes((dir / limit_file).string());
  if (!limit || *limit >= kNoLimitAbove) return std::nullopt;  // "max", absent or unreadable
  const std::uint64_t used = read_bytes((dir / usage_file).string()).value_or(0);
  return Headroom{*limit, *limit > used ? *limit - used : 0};
}

// The tightest headroom of `path` (a cgroup's path as /proc/self/cgroup gives it) and its
// ancestors under `root`. A path that does not exist under the root (a container that sees its
// own cgroup at the root without a cgroup namespace) is read at the root.
void walk_cgroups(const std::filesystem::path& root, std::string_view path, const char* limit_file,
                  const char* usage_file, std::optional<Headroom>& tightest) {
  std::vector<std::filesystem::path> dirs{root};  // the root, then each level below it
  for (const auto& part : std::filesystem::path(path).relative_path()) {
    if (part.empty() || part == "." || part == "..") continue;
    dirs.push_back(dirs.back() / part);
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(dirs.back(), ec)) dirs.resize(1);
  for (const std::filesystem::path& dir : dirs) {
    if (const std::optional<Headroom> h = headroom(dir, limit_file, usage_file)) {
      if (!tightest || h->left < tightest->left) tightest = h;
    }
  }
}

std::optional<std::uint64_t> mem_available(const std::string& meminfo) {
  std::istringstream lines(meminfo);
  for (std::string line; std::getline(lines, line);) {
    constexpr std::string_view kKey = "MemAvailable:";
    if (line.rfind(kKey, 0) != 0) continue;
    std::istringstream fields(line.substr(kKey.size()));
    std::uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace

std::uint64_t host_room(const HostRoomPaths& paths) {
  std::optional<Headroom> tightest;
  if (const std::optional<std::string> cgroups = read_text(paths.proc + "/self/cgroup")) {
    std::istringstream lines(*cgroups);
    for (std::string line; std::getline(lines, line);) {
      // hierarchy-ID:controllers:path
      const std::size_t first = line.find(':');
      const std::size_t second = first == std::string::npos ? first : line.find(':', first + 1);
      if (second == std::string::npos) continue;
      const std::string_view controllers(line.data() + first + 1, second - first - 1);
      const std::string_view path(line.data() + second + 1, line.size() - second - 1);
      if (controllers.empty()) {  // v2
        walk_cgroups(paths.cgroup, path, "memory.max", "memory.current", tightest);
      } else if (("," + std::string(controllers) + ",").find(",memory,") != std::string::npos) {
        walk_cgroups(std::filesystem::path(paths.cgroup) / "memory", path, "memory.limit_in_bytes",
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
