#include "common/exposition.h"

#include <charconv>
#include <cmath>

namespace nvshare {

Labels& Labels::add(std::string_view name, std::string_view value) {
  if (value.empty()) return *this;  // an empty value is the same as no label
  if (!text_.empty()) text_ += ',';
  text_ += name;
  text_ += "=\"";
  for (const char ch : value) {
    if (ch == '\\') {
      text_ += "\\\\";
    } else if (ch == '"') {
      text_ += "\\\"";
    } else if (ch == '\n') {
      text_ += "\\n";
    } else {
      text_ += ch;
    }
  }
  text_ += '"';
  return *this;
}

Labels Labels::with(std::string_view name, std::string_view value) const {
  Labels copy = *this;
  copy.add(name, value);
  return copy;
}

void append_number(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";
    return;
  }
  if (std::isinf(value)) {
    out += value > 0 ? "+Inf" : "-Inf";
    return;
  }
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, ec == std::errc{} ? end : buffer);
}

void append_number(std::string& out, std::uint64_t value) {
  char buffer[32];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, ec == std::errc{} ? end : buffer);
}

void Exposition::family(std::string_view name, std::string_view type, std::string_view help) {
  name_ = name;
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += help;
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void Exposition::begin_sample(const Labels& labels, std::string_view suffix) {
  out_ += name_;
  out_ += suffix;
  if (!labels.text().empty()) {
    out_ += '{';
    out_ += labels.text();
    out_ += '}';
  }
  out_ += ' ';
}

}  // namespace nvshare
