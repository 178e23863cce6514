#include "control/answers.h"

#include <type_traits>

namespace nvshare::control {
namespace {

template <typename T>
concept HasMembers = requires(T& t) {
  T::members(t, [](const char*, auto&) {});
};

// ---- encoding: a member's value as JSON
// -----------------------------------------------------------

Json to_json(const Json& value) { return value; }
Json to_json(const std::string& value) { return value; }
Json to_json(const std::optional<std::string>& value) { return value ? Json(*value) : Json(); }
template <typename T>
requires std::is_arithmetic_v<T> Json to_json(T value) { return Json(value); }
Json to_json(const Counters& counters) {
  Json out = Json::object();
  for (const auto& [name, value] : counters) out.set(name, value);
  return out;
}
template <typename T>
Json to_json(const std::vector<T>& values) {
  Json out = Json::array();
  for (const T& value : values) out.push_back(to_json(value));
  return out;
}
template <HasMembers T>
Json to_json(const T& value) {
  Json out = Json::object();
  T::members(value,
             [&out](const char* name, const auto& member) { out.set(name, to_json(member)); });
  return out;
}

// ---- decoding: a member's value from JSON (an error says what it should have been)
// -----------------

Status from_json(const Json& json, Json& out) {
  out = json;
  return Status::Ok();
}

Status from_json(const Json& json, std::string& out) {
  if (!json.is_string()) return make_error("is not a string");
  out = *json.as_string();
  return Status::Ok();
}

Status from_json(const Json& json, std::optional<std::string>& out) {
  if (json.is_null()) {
    out.reset();
    return Status::Ok();
  }
  if (!json.is_string()) return make_error("is not a string or null");
  out = *json.as_string();
  return Status::Ok();
}

Status from_json(const Json& json, bool& out) {
  auto value = json.as_bool();
  if (!value) return make_error("is not a boolean");
  out = *value;
  return Status::Ok();
}

Status from_json(const Json& json, double& out) {
  auto value = json.as_double();
  if (!value) return make_error("is not a number");
  out = *value;
  return Status::Ok();
}

Status from_json(const Json& json, std::int64_t& out) {
  auto value = json.as_int64();
  if (!value) return make_error("is not an integer");
  out = *value;
  return Status::Ok();
}

Status from_json(const Json& json, std::uint64_t& out) {
  auto value = json.as_int64();
  if (!value || *value < 0) return make_error("is not a count (a non-negative integer)");
  out = static_cast<std::uint64_t>(*value);
  return Status::Ok();
}

Status from_json(const Json& json, Counters& out) {
  if (!json.is_object()) return make_error("is not an object");
  out.clear();
  for (const auto& [name, value] : *json.as_object()) {
    std::uint64_t n = 0;
    if (Status s = from_json(value, n); !s) return make_error("." + name + " " + s.error().message);
    out.emplace_back(name, n);
  }
  return Status::Ok();
}

template <typename T>
Status from_json(const Json& json, std::vector<T>& out) {
  if (!json.is_array()) return make_error("is not an array");
  out.clear();
  for (const Json& item : *json.as_array()) {
    T value{};
    if (Status s = from_json(item, value); !s)
      return make_error("holds an item that " + s.error().message);
    out.push_back(std::move(value));
  }
  return Status::Ok();
}

template <HasMembers T>
Status from_json(const Json& json, T& out) {
  if (!json.is_object()) return make_error("is not an object");
  std::optional<Error> error;
  T::members(out, [&](const char* name, auto& member) {
    if (error) return;
    const Json* value = json.find(name);
    using Member = std::decay_t<decltype(member)>;
    if (value == nullptr && std::is_same_v<Member, std::optional<std::string>>) return;
    if (value == nullptr) {
      error = Error{"\"" + std::string(name) + "\" is missing"};
      return;
    }
    if (Status s = from_json(*value, member); !s) {
      // A nested member's error already names where it is.
      const std::string& what = s.error().message;
      const bool nested = what.front() == '"' || what.front() == '.';
      error = Error{"\"" + std::string(name) + "\"" + (nested ? "." : " ") +
                    (nested && what.front() == '.' ? what.substr(1) : what)};
    }
  });
  if (error) return *error;
  return Status::Ok();
}

template <HasMembers A>
Result<A> decode_members(const Json& json) {
  A answer;
  if (Status s = from_json(json, answer); !s) return s.error();
  return answer;
}

}  // namespace

Json encode(const Answer& answer) {
  return std::visit(
      [](const auto& a) -> Json {
        using A = std::decay_t<decltype(a)>;
        Json out = Json::object();
        if constexpr (std::is_same_v<A, Refusal>) {
          out.set("ok", false);
          out.set("error", a.error);
        } else {
          out.set("ok", true);
          Json members = to_json(a);
          for (auto& [key, value] : *members.as_object()) out.set(key, std::move(value));
          if constexpr (std::is_same_v<A, StatusAnswer>) {
            if (const Json::Object* body = a.body.as_object()) {
              for (const auto& [key, value] : *body) out.set(key, value);
            }
          }
        }
        return out;
      },
      answer);
}

Result<std::optional<Refusal>> decode_refusal(const Json& json) {
  const Json* ok = json.find("ok");
  if (ok == nullptr || !ok->is_bool()) {
    return make_error("not an answer of the control protocol: no boolean \"ok\"");
  }
  if (*ok->as_bool()) return std::optional<Refusal>();
  const Json* error = json.find("error");
  if (error == nullptr || !error->is_string()) {
    return make_error("a refusal without its message: no string \"error\"");
  }
  return std::optional<Refusal>(Refusal{*error->as_string()});
}

template <typename A>
Result<A> decode_answer(const Json& json) {
  auto answer = decode_members<A>(json);
  if constexpr (std::is_same_v<A, StatusAnswer>) {
    if (answer) {
      for (const auto& [key, value] : *json.as_object()) {
        if (key != "ok" && key != "scheduler") answer.value().body.set(key, value);
      }
    }
  }
  return answer;
}

template Result<Ack> decode_answer<Ack>(const Json&);
template Result<SetLimitsAnswer> decode_answer<SetLimitsAnswer>(const Json&);
template Result<SetPolicyAnswer> decode_answer<SetPolicyAnswer>(const Json&);
template Result<SetGpusAnswer> decode_answer<SetGpusAnswer>(const Json&);
template Result<ExplainAnswer> decode_answer<ExplainAnswer>(const Json&);
template Result<VersionAnswer> decode_answer<VersionAnswer>(const Json&);
template Result<StatsAnswer> decode_answer<StatsAnswer>(const Json&);
template Result<StatusAnswer> decode_answer<StatusAnswer>(const Json&);

}  // namespace nvshare::control
