#include "deviceplugin/cdi_spec.h"

#include <filesystem>

#include "common/atomic_file.h"
#include "common/json.h"

namespace nvshare::deviceplugin {
namespace {

constexpr std::string_view kSpecPrefix = "nvshare.com-gpu";
constexpr std::string_view kContainerPrefix = "container-";

bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_alnum(char c) { return is_letter(c) || (c >= '0' && c <= '9'); }

Status check_label(std::string_view label, std::string_view what) {
  if (label.empty()) return make_error("empty CDI " + std::string(what));
  if (!is_letter(label.front())) {
    return make_error("CDI " + std::string(what) + " \"" + std::string(label) +
                      "\" must start with a letter");
  }
  if (!is_alnum(label.back())) {
    return make_error("CDI " + std::string(what) + " \"" + std::string(label) +
                      "\" must end with a letter or digit");
  }
  for (char c : label) {
    if (!is_alnum(c) && c != '_' && c != '-' && c != '.') {
      return make_error("CDI " + std::string(what) + " \"" + std::string(label) + "\" holds '" +
                        std::string(1, c) + "' (letters, digits, _ - . only)");
    }
  }
  return Status::Ok();
}

Json mount_json(const ContainerEdits::Mount& mount) {
  Json options = Json::array();
  if (mount.read_only) options.push_back("ro");
  for (const char* option : {"nosuid", "nodev", "rbind", "rprivate"}) options.push_back(option);
  Json out = Json::object();
  out.set("hostPath", mount.host_path);
  out.set("containerPath", mount.container_path);
  out.set("options", std::move(options));
  return out;
}

}  // namespace

Status check_cdi_kind(std::string_view kind) {
  const std::size_t slash = kind.find('/');
  if (slash == std::string_view::npos) {
    return make_error("\"" + std::string(kind) + "\" is not a CDI kind <vendor>/<class>");
  }
  if (Status s = check_label(kind.substr(0, slash), "vendor"); !s) return s;
  return check_label(kind.substr(slash + 1), "class");
}

std::string qualified_cdi_device(std::string_view kind, std::string_view device) {
  return std::string(kind) + "=" + std::string(device);
}

std::string container_cdi_device(std::string_view container_id) {
  return std::string(kContainerPrefix) + std::string(container_id);
}

std::string cdi_spec_text(std::string_view device, const ContainerEdits& edits) {
  Json env = Json::array();
  for (const auto& [name, value] : edits.env) env.push_back(name + "=" + value);
  Json mounts = Json::array();
  for (const ContainerEdits::Mount& mount : edits.mounts) mounts.push_back(mount_json(mount));
  Json container_edits = Json::object();
  if (!edits.env.empty()) container_edits.set("env", std::move(env));
  if (!edits.mounts.empty()) container_edits.set("mounts", std::move(mounts));
  Json entry = Json::object();
  entry.set("name", device);
  entry.set("containerEdits", std::move(container_edits));
  Json devices = Json::array();
  devices.push_back(std::move(entry));
  Json spec = Json::object();
  spec.set("cdiVersion", kCdiVersion);
  spec.set("kind", kCdiKind);
  spec.set("devices", std::move(devices));
  return spec.dump_pretty() + "\n";
}

std::string client_cdi_spec_path(const std::string& dir) {
  return dir + "/" + std::string(kSpecPrefix) + ".json";
}

std::string container_cdi_spec_path(const std::string& dir, std::string_view container_id) {
  return dir + "/" + std::string(kSpecPrefix) + "_" + container_cdi_device(container_id) + ".json";
}

Status write_cdi_spec(const std::string& path, const std::string& text) {
  if (Status s = create_parent_directories(path); !s) return s;
  // The temporary name ends in .tmp: CDI readers load only *.json and *.yaml files.
  return replace_file(path, text, 0644);
}

void remove_stale_container_specs(const std::string& dir, const std::set<std::string>& live) {
  const std::string prefix = std::string(kSpecPrefix) + "_" + std::string(kContainerPrefix);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !name.ends_with(".json")) continue;
    const std::string id = name.substr(prefix.size(), name.size() - prefix.size() - 5);
    if (live.count(id) == 0) {
      std::error_code ignored;
      std::filesystem::remove(entry.path(), ignored);
    }
  }
}

}  // namespace nvshare::deviceplugin
