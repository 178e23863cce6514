#include "podwatcher/watch_stream.h"

namespace nvshare::podwatcher {
namespace {

using nlohmann::json;

std::string resource_version_of(const json& object) {
  if (!object.is_object()) return {};
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return {};
  auto version = metadata->find("resourceVersion");
  if (version == metadata->end() || !version->is_string()) return {};
  return version->get<std::string>();
}

Result<json> parse_json_text(std::string_view text, const char* what) {
  json value = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return make_error(std::string(what) + " is not valid JSON");
  return value;
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

ApiStatus parse_api_status(const json& object) {
  ApiStatus status;
  if (!object.is_object()) return status;
  if (auto code = object.find("code"); code != object.end() && code->is_number_integer()) {
    status.code = code->get<int>();
  }
  if (auto reason = object.find("reason"); reason != object.end() && reason->is_string()) {
    status.reason = reason->get<std::string>();
  }
  if (auto message = object.find("message"); message != object.end() && message->is_string()) {
    status.message = message->get<std::string>();
  }
  return status;
}

Result<WatchEvent> parse_watch_event(std::string_view line) {
  auto parsed = parse_json_text(line, "watch event");
  if (!parsed) return parsed.error();
  const json& event = parsed.value();
  if (!event.is_object()) return make_error("watch event is not a JSON object");
  auto type = event.find("type");
  if (type == event.end() || !type->is_string()) return make_error("watch event has no type");
  auto object = event.find("object");
  if (object == event.end() || !object->is_object()) {
    return make_error("watch event has no object");
  }
  WatchEvent out;
  const std::string& name = type->get_ref<const std::string&>();
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
  json& list = parsed.value();
  if (!list.is_object()) return make_error("pod list is not a JSON object");
  PodList out;
  out.resource_version = resource_version_of(list);
  if (out.resource_version.empty()) return make_error("pod list has no metadata.resourceVersion");
  auto items = list.find("items");
  if (items != list.end() && !items->is_null()) {
    if (!items->is_array()) return make_error("pod list items is not an array");
    out.items.reserve(items->size());
    for (json& item : *items) out.items.push_back(std::move(item));
  }
  return out;
}

}  // namespace nvshare::podwatcher
