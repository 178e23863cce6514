#include "podwatcher/watch_stream.h"

#include <climits>

namespace nvshare::podwatcher {
namespace {

std::string resource_version_of(const Json& object) {
  const Json* metadata = object.find("metadata");
  const Json* version = metadata != nullptr ? metadata->find("resourceVersion") : nullptr;
  const std::string* text = version != nullptr ? version->as_string() : nullptr;
  return text != nullptr ? *text : std::string();
}

Result<Json> parse_json_text(std::string_view text, const char* what) {
  auto value = parse_json(text, kApiJsonLimits);
  if (!value) return make_error(std::string(what) + " is not valid JSON: " + value.error().message);
  return value;
}

std::string string_or_empty(const Json& object, std::string_view key) {
  const Json* value = object.find(key);
  const std::string* text = value != nullptr ? value->as_string() : nullptr;
  return text != nullptr ? *text : std::string();
}

}  // namespace

Status LineSplitter::feed(std::string_view bytes,
                          const std::function<bool(std::string_view)>& on_line) {
  while (!bytes.empty()) {
    const std::size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      if (buffer_.size() + bytes.size() > max_line_bytes_) {
        buffer_.clear();
        return make_error("a watch event is longer than " + std::to_string(max_line_bytes_) +
                          " bytes");
      }
      buffer_.append(bytes);
      return Status::Ok();
    }
    std::string_view line;
    if (buffer_.empty()) {
      line = bytes.substr(0, newline);
    } else {
      buffer_.append(bytes.substr(0, newline));
      line = buffer_;
    }
    if (line.size() > max_line_bytes_) {
      buffer_.clear();
      return make_error("a watch event is longer than " + std::to_string(max_line_bytes_) +
                        " bytes");
    }
    bytes.remove_prefix(newline + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    bool keep_going = true;
    if (!line.empty()) keep_going = on_line(line);
    buffer_.clear();
    if (!keep_going) return Status::Ok();
  }
  return Status::Ok();
}

ApiStatus parse_api_status(const Json& object) {
  ApiStatus status;
  if (const Json* code = object.find("code")) {
    auto value = code->as_int64();
    if (value && *value >= INT_MIN && *value <= INT_MAX) status.code = static_cast<int>(*value);
  }
  status.reason = string_or_empty(object, "reason");
  status.message = string_or_empty(object, "message");
  return status;
}

ApiStatus parse_api_status_text(std::string_view body) {
  auto parsed = parse_json(body, kApiJsonLimits);
  return parsed ? parse_api_status(parsed.value()) : ApiStatus{};
}

Result<WatchEvent> parse_watch_event(std::string_view line) {
  auto parsed = parse_json_text(line, "watch event");
  if (!parsed) return parsed.error();
  Json& event = parsed.value();
  if (!event.is_object()) return make_error("watch event is not a JSON object");
  const Json* type = event.find("type");
  if (type == nullptr || !type->is_string()) return make_error("watch event has no type");
  Json* object = nullptr;
  for (auto& [key, value] : *event.as_object()) {
    if (key == "object") object = &value;
  }
  if (object == nullptr || !object->is_object()) return make_error("watch event has no object");
  WatchEvent out;
  const std::string& name = *type->as_string();
  if (name == "ADDED") {
    out.type = WatchEvent::Type::kAdded;
  } else if (name == "MODIFIED") {
    out.type = WatchEvent::Type::kModified;
  } else if (name == "DELETED") {
    out.type = WatchEvent::Type::kDeleted;
  } else if (name == "BOOKMARK") {
    out.type = WatchEvent::Type::kBookmark;
  } else if (name == "ERROR") {
    out.type = WatchEvent::Type::kError;
  } else {
    return make_error("watch event has unknown type \"" + name + "\"");
  }
  out.object = std::move(*object);
  out.resource_version = resource_version_of(out.object);
  if (out.type == WatchEvent::Type::kError) {
    ApiStatus status = parse_api_status(out.object);
    out.error_code = status.code;
    out.error_message = status.message.empty() ? status.reason : status.message;
  }
  return out;
}

Result<PodList> parse_pod_list(std::string_view body) {
  auto parsed = parse_json_text(body, "pod list");
  if (!parsed) return parsed.error();
  Json& list = parsed.value();
  if (!list.is_object()) return make_error("pod list is not a JSON object");
  PodList out;
  out.resource_version = resource_version_of(list);
  if (out.resource_version.empty()) return make_error("pod list has no metadata.resourceVersion");
  for (auto& [key, items] : *list.as_object()) {
    if (key != "items" || items.is_null()) continue;
    Json::Array* array = items.as_array();
    if (array == nullptr) return make_error("pod list items is not an array");
    out.items = std::move(*array);
  }
  return out;
}

}  // namespace nvshare::podwatcher
