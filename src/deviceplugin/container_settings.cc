#include "deviceplugin/container_settings.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/atomic_file.h"
#include "common/log.h"

namespace nvshare::deviceplugin {
namespace {

constexpr const char* kFileName = "client.conf";

std::vector<std::string> sorted(std::vector<std::string> ids) {
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::string join(const std::vector<std::string>& ids) {
  std::string out;
  for (const std::string& id : ids) out += (out.empty() ? "" : ",") + id;
  return out;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The value of `key` in a settings file's text ("" when absent).
std::string value_of(const std::string& text, const std::string& key) {
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  }
  return "";
}

}  // namespace

ContainerSettings::ContainerSettings(ContainerSettingsOptions options)
    : options_(std::move(options)) {}

Status ContainerSettings::prepare(MonoTime now) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec) return make_error("cannot create " + options_.dir + ": " + ec.message());
  ::chmod(options_.dir.c_str(), 0755);
  for (const fs::directory_entry& dir : fs::directory_iterator(options_.dir, ec)) {
    if (!dir.is_directory()) continue;
    std::ifstream in(dir.path() / kFileName);
    std::stringstream text;
    text << in.rdbuf();
    Entry entry;
    entry.devices = sorted(split(value_of(text.str(), "devices")));
    entry.created = now;
    if (const std::string pod = value_of(text.str(), "pod"); !pod.empty()) entry.pod = pod;
    entry.written = value_of(text.str(), "memory-limit");
    if (entry.devices.empty()) {
      fs::remove_all(dir.path(), ec);
      continue;
    }
    entries_[dir.path().filename().string()] = std::move(entry);
  }
  if (!entries_.empty()) {
    NVSHARE_INFO("container settings: %zu directories from before kept in %s", entries_.size(),
                 options_.dir.c_str());
  }
  return Status::Ok();
}

std::string ContainerSettings::file_text(const Entry& entry) const {
  std::string text =
      "# nvshare settings of one container, written by nvshare-device-plugin (read-only there)\n"
      "enforce=1\n";
  text += "socket=" + options_.socket + "\n";
  text +=
      "register-wait-ms=" +
      std::to_string(
          std::chrono::duration_cast<std::chrono::milliseconds>(options_.register_wait).count()) +
      "\n";
  text += "devices=" + join(entry.devices) + "\n";
  text += "memory-limit=" + (entry.written.empty() ? std::string("pending") : entry.written) + "\n";
  if (entry.pod) text += "pod=" + *entry.pod + "\n";
  return text;
}

Status ContainerSettings::write(const std::string& id, const Entry& entry) const {
  // 0644 whatever the umask: readable by the container's user, writable by none.
  return replace_file(options_.dir + "/" + id + "/" + kFileName, file_text(entry), 0644);
}

void ContainerSettings::remove(const std::string& id) {
  std::error_code ec;
  std::filesystem::remove_all(options_.dir + "/" + id, ec);
  entries_.erase(id);
  if (options_.removed) options_.removed(id);
}

Result<std::string> ContainerSettings::create(const std::vector<std::string>& device_ids,
                                              MonoTime now) {
  char name[32];
  std::snprintf(name, sizeof name, "%012llx%04llx",
                static_cast<unsigned long long>(now.since_origin.count() & 0xffffffffffffULL),
                static_cast<unsigned long long>(++counter_ & 0xffff));
  const std::string id = name;
  const std::string dir = options_.dir + "/" + id;
  if (::mkdir(dir.c_str(), 0755) != 0) {
    return make_error("cannot create " + dir + ": " + std::strerror(errno));
  }
  ::chmod(dir.c_str(), 0755);
  Entry entry;
  entry.devices = sorted(device_ids);
  entry.created = now;
  if (Status s = write(id, entry); !s) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return s.error();
  }
  entries_[id] = std::move(entry);
  return dir;
}

std::set<std::string> ContainerSettings::ids() const {
  std::set<std::string> out;
  for (const auto& entry : entries_) out.insert(entry.first);
  return out;
}

std::size_t ContainerSettings::pending() const {
  std::size_t n = 0;
  for (const auto& [id, entry] : entries_) n += entry.written.empty() ? 1 : 0;
  return n;
}

void ContainerSettings::resolve(const std::vector<LiveContainer>& live,
                                const PodLimitsLookup& limits, MonoTime now) {
  std::map<std::vector<std::string>, std::string> holder;  // devices -> pod key
  for (const LiveContainer& container : live) {
    if (!container.device_ids.empty()) holder[sorted(container.device_ids)] = container.pod_key;
  }
  // The newest unclaimed directory of each device set is the one a new container uses.
  std::map<std::vector<std::string>, std::string> newest;
  for (const auto& [id, entry] : entries_) {
    if (entry.pod) continue;
    auto it = newest.find(entry.devices);
    if (it == newest.end() || entries_.at(it->second).created <= entry.created) {
      newest[entry.devices] = id;
    }
  }
  std::vector<std::string> drop;
  for (auto& [id, entry] : entries_) {
    const auto held = holder.find(entry.devices);
    if (!entry.pod) {
      if (held != holder.end() && newest[entry.devices] == id) {
        entry.pod = held->second;
        NVSHARE_INFO("container settings %s: pod %s", id.c_str(), entry.pod->c_str());
      } else if (held != holder.end() || now - entry.created > options_.unclaimed_after) {
        drop.push_back(id);  // superseded by a newer allocation, or never used
        continue;
      } else {
        continue;
      }
    }
    if (held == holder.end() || held->second != *entry.pod) {
      if (!entry.missing_since) entry.missing_since = now;
      if (now - *entry.missing_since > options_.gone_after) drop.push_back(id);
      continue;
    }
    entry.missing_since.reset();
    const std::optional<KnownPodLimits> known = limits ? limits(*entry.pod) : std::nullopt;
    if (!known) continue;  // the watcher has not seen the pod yet: stays pending
    const std::string value =
        known->memory_bytes ? std::to_string(*known->memory_bytes) : std::string("none");
    if (value == entry.written) continue;
    const std::string previous = entry.written;
    entry.written = value;
    if (Status s = write(id, entry); !s) {
      NVSHARE_WARN("container settings: %s", s.error().message.c_str());
      entry.written = previous;
    }
  }
  for (const std::string& id : drop) remove(id);
}

}  // namespace nvshare::deviceplugin
