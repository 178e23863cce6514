#include "cdi_validator.h"

#include <algorithm>
#include <array>
#include <set>

namespace nvshare::testing {
namespace {

constexpr std::array<std::string_view, 8> kReleased = {"0.1.0", "0.2.0", "0.3.0", "0.4.0",
                                                       "0.5.0", "0.6.0", "0.7.0", "0.8.0"};

bool letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool alnum(char c) { return letter(c) || (c >= '0' && c <= '9'); }

Status only_fields(const Json& object, std::initializer_list<std::string_view> allowed,
                   std::string_view where) {
  if (!object.is_object()) return make_error(std::string(where) + " is not an object");
  for (const auto& [key, value] : *object.as_object()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return make_error(std::string(where) + ": unknown field \"" + key + "\"");
    }
  }
  return Status::Ok();
}

Status name_chars(std::string_view name, std::string_view between, bool first_letter,
                  std::string_view what) {
  const std::string shown = std::string(what) + " \"" + std::string(name) + "\"";
  if (name.empty()) return make_error("empty " + std::string(what));
  if (first_letter ? !letter(name.front()) : !alnum(name.front())) {
    return make_error(shown + ": bad first character");
  }
  if (!alnum(name.back())) return make_error(shown + ": must end with a letter or digit");
  for (char c : name) {
    if (!alnum(c) && between.find(c) == std::string_view::npos) {
      return make_error(shown + ": invalid character '" + std::string(1, c) + "'");
    }
  }
  return Status::Ok();
}

const std::string* string_field(const Json& object, std::string_view key) {
  const Json* value = object.find(key);
  return value == nullptr ? nullptr : value->as_string();
}

Status check_env(const Json* env, std::string_view where) {
  if (env == nullptr) return Status::Ok();
  if (!env->is_array()) return make_error(std::string(where) + ": env is not an array");
  for (const Json& entry : *env->as_array()) {
    const std::string* text = entry.as_string();
    if (text == nullptr || text->find('=') == std::string::npos || text->front() == '=') {
      return make_error(std::string(where) + ": invalid environment variable " + entry.dump());
    }
  }
  return Status::Ok();
}

Status check_strings(const Json* array, std::string_view where) {
  if (array == nullptr) return Status::Ok();
  if (!array->is_array()) return make_error(std::string(where) + " is not an array");
  for (const Json& entry : *array->as_array()) {
    if (!entry.is_string()) return make_error(std::string(where) + " holds a non-string");
  }
  return Status::Ok();
}

Status check_mount(const Json& mount) {
  if (Status s = only_fields(mount, {"hostPath", "containerPath", "type", "options"}, "mount");
      !s) {
    return s;
  }
  const std::string* host = string_field(mount, "hostPath");
  const std::string* container = string_field(mount, "containerPath");
  if (host == nullptr || host->empty()) return make_error("invalid mount, empty host path");
  if (container == nullptr || container->empty()) {
    return make_error("invalid mount, empty container path");
  }
  const Json* type = mount.find("type");
  if (type != nullptr && !type->is_string()) return make_error("mount type is not a string");
  return check_strings(mount.find("options"), "mount options");
}

Status check_device_node(const Json& node) {
  if (Status s = only_fields(
          node,
          {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"},
          "device node");
      !s) {
    return s;
  }
  const std::string* path = string_field(node, "path");
  if (path == nullptr || path->empty()) return make_error("invalid (empty) device path");
  if (const std::string* type = string_field(node, "type")) {
    if (!type->empty() && std::string_view("bcup").find(*type) == std::string_view::npos) {
      return make_error("device " + *path + ": invalid type \"" + *type + "\"");
    }
    if (type->size() > 1) return make_error("device " + *path + ": invalid type");
  }
  for (const char* key : {"major", "minor"}) {
    const Json* number = node.find(key);
    if (number != nullptr && (!number->as_int64() || *number->as_int64() < 0)) {
      return make_error("device " + *path + ": invalid " + key);
    }
  }
  if (const std::string* permissions = string_field(node, "permissions")) {
    if (permissions->find_first_not_of("rwm") != std::string::npos) {
      return make_error("device " + *path + ": invalid permissions \"" + *permissions + "\"");
    }
  }
  return Status::Ok();
}

Status check_hook(const Json& hook) {
  if (Status s = only_fields(hook, {"hookName", "path", "args", "env", "timeout"}, "hook"); !s) {
    return s;
  }
  static const std::set<std::string> kHooks = {"prestart",       "createRuntime", "createContainer",
                                               "startContainer", "poststart",     "poststop"};
  const std::string* name = string_field(hook, "hookName");
  if (name == nullptr || kHooks.count(*name) == 0) return make_error("invalid hook name");
  const std::string* path = string_field(hook, "path");
  if (path == nullptr || path->empty()) return make_error("hook " + *name + " with empty path");
  if (Status s = check_strings(hook.find("args"), "hook args"); !s) return s;
  return check_env(hook.find("env"), "hook " + *name);
}

template <typename Check>
Status check_each(const Json* array, std::string_view what, Check check) {
  if (array == nullptr) return Status::Ok();
  if (!array->is_array()) return make_error(std::string(what) + " is not an array");
  for (const Json& item : *array->as_array()) {
    if (Status s = check(item); !s) return s;
  }
  return Status::Ok();
}

// Returns whether the edits are empty (valid for a spec, not for a device).
Result<bool> check_edits(const Json& edits, std::string_view where) {
  if (Status s = only_fields(
          edits, {"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids"},
          std::string(where) + " containerEdits");
      !s) {
    return s.error();
  }
  if (Status s = check_env(edits.find("env"), where); !s) return s.error();
  if (Status s = check_each(edits.find("mounts"), "mounts", check_mount); !s) return s.error();
  if (Status s = check_each(edits.find("deviceNodes"), "deviceNodes", check_device_node); !s) {
    return s.error();
  }
  if (Status s = check_each(edits.find("hooks"), "hooks", check_hook); !s) return s.error();
  for (const auto& [key, value] : *edits.as_object()) {
    const bool empty = (value.is_array() && value.as_array()->empty()) || value.is_null();
    if (!empty) return false;
  }
  return true;
}

int version_index(std::string_view version) {
  for (std::size_t i = 0; i < kReleased.size(); ++i) {
    if (kReleased[i] == version) return static_cast<int>(i);
  }
  return -1;
}

bool non_empty(const Json* value) {
  if (value == nullptr || value->is_null()) return false;
  if (value->is_array()) return !value->as_array()->empty();
  if (value->is_object()) return !value->as_object()->empty();
  return true;
}

}  // namespace

std::string minimum_cdi_version(const Json& spec) {
  int needed = version_index("0.3.0");
  auto need = [&](std::string_view version) { needed = std::max(needed, version_index(version)); };
  std::vector<const Json*> edits;
  if (const Json* e = spec.find("containerEdits")) edits.push_back(e);
  if (non_empty(spec.find("annotations"))) need("0.6.0");
  if (const std::string* kind = string_field(spec, "kind")) {
    const std::size_t slash = kind->find('/');
    if (slash != std::string::npos && kind->find('.', slash) != std::string::npos) need("0.6.0");
  }
  if (const Json* devices = spec.find("devices"); devices != nullptr && devices->is_array()) {
    for (const Json& device : *devices->as_array()) {
      if (const std::string* name = string_field(device, "name")) {
        if (!name->empty() && !letter(name->front())) need("0.5.0");
      }
      if (non_empty(device.find("annotations"))) need("0.6.0");
      if (const Json* e = device.find("containerEdits")) edits.push_back(e);
    }
  }
  for (const Json* e : edits) {
    if (non_empty(e->find("intelRdt")) || non_empty(e->find("additionalGids"))) need("0.7.0");
    if (const Json* mounts = e->find("mounts"); mounts != nullptr && mounts->is_array()) {
      for (const Json& mount : *mounts->as_array()) {
        if (non_empty(mount.find("type"))) need("0.4.0");
      }
    }
    if (const Json* nodes = e->find("deviceNodes"); nodes != nullptr && nodes->is_array()) {
      for (const Json& node : *nodes->as_array()) {
        if (non_empty(node.find("hostPath"))) need("0.5.0");
      }
    }
  }
  return std::string(kReleased[static_cast<std::size_t>(needed)]);
}

Result<Json> validate_cdi_spec(std::string_view text) {
  auto parsed = parse_json(text);
  if (!parsed) return make_error("not JSON: " + parsed.error().message);
  const Json& spec = parsed.value();
  if (Status s = only_fields(
          spec, {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}, "spec");
      !s) {
    return s.error();
  }
  const std::string* version = string_field(spec, "cdiVersion");
  if (version == nullptr) return make_error("cdiVersion is missing");
  if (version_index(*version) < 0) return make_error("invalid version \"" + *version + "\"");
  const std::string* kind = string_field(spec, "kind");
  if (kind == nullptr) return make_error("kind is missing");
  const std::size_t slash = kind->find('/');
  if (slash == std::string::npos) return make_error("kind \"" + *kind + "\" has no vendor");
  if (Status s = name_chars(kind->substr(0, slash), "_-.", true, "vendor"); !s) return s.error();
  if (Status s = name_chars(kind->substr(slash + 1), "_-.", true, "class"); !s) return s.error();
  if (const Json* edits = spec.find("containerEdits")) {
    if (auto checked = check_edits(*edits, "spec"); !checked) return checked.error();
  }
  const Json* devices = spec.find("devices");
  if (devices == nullptr || !devices->is_array() || devices->as_array()->empty()) {
    return make_error("invalid spec, no devices");
  }
  std::set<std::string> names;
  for (const Json& device : *devices->as_array()) {
    if (Status s = only_fields(device, {"name", "annotations", "containerEdits"}, "device"); !s) {
      return s.error();
    }
    const std::string* name = string_field(device, "name");
    if (name == nullptr) return make_error("a device has no name");
    if (Status s = name_chars(*name, "_-.:", false, "device name"); !s) return s.error();
    if (!names.insert(*name).second) return make_error("device \"" + *name + "\" defined twice");
    const Json* edits = device.find("containerEdits");
    if (edits == nullptr) return make_error("device \"" + *name + "\" has no containerEdits");
    auto empty = check_edits(*edits, "device \"" + *name + "\"");
    if (!empty) return empty.error();
    if (empty.value()) return make_error("device \"" + *name + "\" has empty containerEdits");
  }
  const std::string needed = minimum_cdi_version(spec);
  if (version_index(needed) > version_index(*version)) {
    return make_error("the spec version must be at least v" + needed + " (it says " + *version +
                      ")");
  }
  return parsed;
}

}  // namespace nvshare::testing
