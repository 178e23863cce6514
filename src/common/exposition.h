// The Prometheus text exposition format (version 0.0.4), written family by family: what the
// scheduler's and the device plugin's /metrics render with.
//
// Contract: label values are escaped (backslash, double quote, newline) and made valid UTF-8 (an
// invalid byte and a control character other than the newline become U+FFFD); an empty label value
// is the same as no label and is left out; numbers are written in the shortest form that reads back
// exactly, NaN and infinities as the format spells them. Names are the caller's (they are not
// checked).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace nvshare {

// A label set, already rendered: `a="x",b="y"` without the braces.
class Labels {
 public:
  Labels() = default;
  Labels& add(std::string_view name, std::string_view value);
  Labels with(std::string_view name, std::string_view value) const;
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

void append_number(std::string& out, double value);
void append_number(std::string& out, std::uint64_t value);

// Families one at a time: the header, then every sample of the family.
class Exposition {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help);
  template <typename Number>
  void sample(const Labels& labels, Number value, std::string_view suffix = {}) {
    begin_sample(labels, suffix);
    append_number(out_, value);
    out_ += '\n';
  }
  // A family of one sample without labels.
  template <typename Number>
  void scalar(std::string_view name, std::string_view type, std::string_view help, Number value) {
    family(name, type, help);
    sample(Labels(), value);
  }
  std::string take() { return std::move(out_); }

 private:
  void begin_sample(const Labels& labels, std::string_view suffix);

  std::string out_;
  std::string name_;
};

}  // namespace nvshare
