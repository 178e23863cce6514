#include "scheduler/pod_identity.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>

namespace nvshare::scheduler {
namespace {

constexpr std::size_t kUuidLength = 36;
// Static (manifest) pods: the kubelet names them by a hash, 32 hex digits.
constexpr std::size_t kHashLength = 32;

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// `text` as a canonical UUID when it is one in 8-4-4-4-12 form, separated by '-' or (systemd) '_'
// consistently.
std::optional<std::string> canonical_uuid(std::string_view text) {
  if (text.size() != kUuidLength) return std::nullopt;
  const char separator = text[8];
  if (separator != '-' && separator != '_') return std::nullopt;
  std::string out(text);
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (out[i] != separator) return std::nullopt;
      out[i] = '-';
    } else if (!is_hex(out[i])) {
      return std::nullopt;
    } else {
      out[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(out[i])));
    }
  }
  return out;
}

std::optional<std::string> canonical_hash(std::string_view text) {
  if (text.size() != kHashLength) return std::nullopt;
  std::string out(text);
  for (char& c : out) {
    if (!is_hex(c)) return std::nullopt;
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// The pod UID a single path segment names, if any (see the header for the recognized shapes).
std::optional<std::string> pod_uid_in_segment(std::string_view segment) {
  // cgroupfs driver: the whole segment is "pod<uid>".
  if (segment.size() > 3 && segment.substr(0, 3) == "pod") {
    if (auto uid = canonical_pod_uid(segment.substr(3))) return uid;
  }
  // systemd driver: "<...kubepods...>-pod<uid>.slice", optionally followed by ":runtime:<id>".
  std::string_view unit = segment.substr(0, segment.find(':'));
  constexpr std::string_view kSlice = ".slice";
  if (unit.size() < kSlice.size() || unit.substr(unit.size() - kSlice.size()) != kSlice) {
    return std::nullopt;
  }
  unit.remove_suffix(kSlice.size());
  constexpr std::string_view kPod = "-pod";
  for (const std::size_t length : {kUuidLength, kHashLength}) {
    if (unit.size() < kPod.size() + length) continue;
    const std::string_view prefix = unit.substr(0, unit.size() - length - kPod.size());
    if (unit.substr(prefix.size(), kPod.size()) != kPod) continue;
    if (prefix.find("kubepods") == std::string_view::npos) continue;
    if (auto uid = canonical_pod_uid(unit.substr(unit.size() - length))) return uid;
  }
  return std::nullopt;
}

// The container ID a segment names: "<id>" (cgroupfs), "cri-containerd-<id>.scope",
// "crio-<id>.scope", "docker-<id>.scope", "crio-conmon-<id>.scope" (CRI-O's monitor process), or
// the ":runtime:<id>" tail of a systemd slice. IDs are hex, at least 12 characters.
std::optional<std::string> container_id_in(std::string_view segment) {
  if (const std::size_t colon = segment.rfind(':'); colon != std::string_view::npos) {
    segment = segment.substr(colon + 1);
  }
  constexpr std::string_view kScope = ".scope";
  if (segment.size() > kScope.size() && segment.substr(segment.size() - kScope.size()) == kScope) {
    segment.remove_suffix(kScope.size());
  }
  static constexpr std::array<std::string_view, 5> kPrefixes = {"cri-containerd-", "crio-conmon-",
                                                                "crio-", "docker-", "cri-o-"};
  for (std::string_view prefix : kPrefixes) {
    if (segment.substr(0, prefix.size()) == prefix) {
      segment.remove_prefix(prefix.size());
      break;
    }
  }
  if (segment.size() < 12) return std::nullopt;
  for (char c : segment) {
    if (!is_hex(c)) return std::nullopt;
  }
  return std::string(segment);
}

// A segment of a tree that systemd delegates to a user (user.slice, user-1000.slice,
// user@1000.service): its user may create cgroups there, named like anything.
bool user_tree_segment(std::string_view segment) {
  return segment == "user.slice" || segment.substr(0, 5) == "user@" ||
         (segment.substr(0, 5) == "user-" && segment.size() > 6 &&
          segment.substr(segment.size() - 6) == ".slice");
}

// Scans one cgroup path (the third field of a line). A pod segment counts only where the kubelet
// puts pods: below a kubepods (or kubelet) segment, or in a path relative to the reader's cgroup
// namespace (which lies inside the pods' hierarchy), or the systemd driver's slice on cgroup v1
// (whose own name carries kubepods); never inside a user's delegated tree. One found elsewhere is
// reported in `refused`.
PodIdentity parse_path(std::string_view path) {
  PodIdentity identity;
  bool kubelet_tree = path.substr(0, 3) == "/..";
  bool user_tree = false;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view segment = path.substr(start, end - start);
    if (auto uid = pod_uid_in_segment(segment)) {
      const bool slice_form = segment.substr(0, 3) != "pod";
      if (user_tree || (!kubelet_tree && !slice_form)) {
        identity.refused = "a pod segment (" + std::string(segment.substr(0, 64)) + ") " +
                           (user_tree ? "inside a user's delegated cgroup tree"
                                      : "outside the kubelet's kubepods hierarchy");
        return identity;
      }
      identity.pod_uid = std::move(uid);
      if (segment.find(':') != std::string_view::npos) {
        identity.container_id = container_id_in(segment);
      } else if (end < path.size()) {
        const std::size_t next_end = path.find('/', end + 1);
        identity.container_id = container_id_in(
            path.substr(end + 1, next_end == std::string_view::npos ? std::string_view::npos
                                                                    : next_end - end - 1));
      }
      return identity;
    }
    if (user_tree_segment(segment)) user_tree = true;
    if (segment.substr(0, 8) == "kubepods" || segment.find("-kubepods") != std::string_view::npos ||
        segment.substr(0, 8) == "kubelet.") {
      kubelet_tree = true;
    }
    start = end + 1;
  }
  return identity;
}

}  // namespace

std::optional<std::string> canonical_pod_uid(std::string_view text) {
  if (auto uuid = canonical_uuid(text)) return uuid;
  return canonical_hash(text);
}

PodIdentity parse_pod_identity(std::string_view cgroup_file) {
  PodIdentity found;
  bool unified = false;
  std::size_t start = 0;
  while (start < cgroup_file.size()) {
    std::size_t end = cgroup_file.find('\n', start);
    if (end == std::string_view::npos) end = cgroup_file.size();
    const std::string_view line = cgroup_file.substr(start, end - start);
    start = end + 1;
    // hierarchy-ID ":" controller-list ":" path; the path itself may contain ':'.
    const std::size_t first = line.find(':');
    if (first == std::string_view::npos) continue;
    const std::size_t second = line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const std::string_view path = line.substr(second + 1);
    const bool is_unified = line.substr(0, second + 1) == "0::";
    if (!unified && (is_unified || found.cgroup.empty())) {
      found.cgroup = std::string(path);
      unified = is_unified;
    }
    if (found.pod_uid) continue;
    PodIdentity identity = parse_path(path);
    if (identity.pod_uid) {
      found.pod_uid = std::move(identity.pod_uid);
      found.container_id = std::move(identity.container_id);
      found.refused.reset();
    } else if (identity.refused && !found.refused) {
      found.refused = std::move(identity.refused);
    }
  }
  return found;
}

Result<PodIdentity> read_pod_identity(pid_t pid, const std::string& proc_root) {
  const std::string path = proc_root + "/" + std::to_string(pid) + "/cgroup";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error("cannot open " + path + ": " + std::strerror(errno));
  // A cgroup file is a few hundred bytes (v1 lists each hierarchy); 64 KiB is far beyond any real
  // one.
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return make_error("cannot read " + path + ": " + std::strerror(err));
    }
    if (n == 0 || text.size() > 65536) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return parse_pod_identity(text);
}

}  // namespace nvshare::scheduler
