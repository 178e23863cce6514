// Result<T>: a value or an error message, the way every fallible operation in nvshare reports failure.
//
// Contract: errors are values. Nothing in src/common throws; a Result is checked with ok() (or
// operator bool) before value() is read. Reading value() of an error, or error() of a value, is a
// programming error and aborts in debug builds. Error carries a human-readable message that is safe to
// show to a user or to log as is ("memory quantity \"4GB\": unknown suffix \"GB\" ...").
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace nvshare {

struct Error {
  std::string message;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : state_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(state_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(state_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(state_));
  }
  const Error& error() const {
    assert(!ok());
    return std::get<1>(state_);
  }
  T value_or(T fallback) const { return ok() ? std::get<0>(state_) : std::move(fallback); }

 private:
  std::variant<T, Error> state_;
};

// Status: success or an error, for operations that produce no value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), failed_(true) {}  // NOLINT: implicit by design

  static Status Ok() { return Status(); }
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    assert(failed_);
    return error_;
  }

 private:
  Error error_;
  bool failed_ = false;
};

inline Error make_error(std::string message) { return Error{std::move(message)}; }

}  // namespace nvshare
