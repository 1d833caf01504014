// Errors as values. Every call that can fail across a module boundary returns a Status
// (or a Result<T>); exceptions from libraries (kj::Exception, zmq::error_t,
// rocksdb::Status, cudaError_t) are turned into a Status where they arise.
//
// Thread safety: Status and Result are values; distinct objects may be used from any thread.
#pragma once

#include <glog/logging.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ps {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,     // bad input: a value out of range, a malformed message
  kNotFound = 2,            // an unknown table, key or file
  kFailedPrecondition = 3,  // the call does not fit the current state
  kUnavailable = 4,         // a peer or resource is not reachable right now; retry may work
  kDeadlineExceeded = 5,    // a wait ran past its deadline
  kInternal = 6,            // a bug or a library failure
  kVersionMismatch = 7,     // protocol versions of two peers differ
  kAborted = 8,             // the operation was cancelled (shutdown)
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string ToString() const;

  // Returns a copy with "context: " prepended to the message, for adding where an error
  // passed through (e.g. "server 1: ...").
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string msg) {
  return Status(StatusCode::kInvalidArgument, std::move(msg));
}
inline Status NotFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
inline Status FailedPrecondition(std::string msg) {
  return Status(StatusCode::kFailedPrecondition, std::move(msg));
}
inline Status Unavailable(std::string msg) {
  return Status(StatusCode::kUnavailable, std::move(msg));
}
inline Status DeadlineExceeded(std::string msg) {
  return Status(StatusCode::kDeadlineExceeded, std::move(msg));
}
inline Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }
inline Status Aborted(std::string msg) { return Status(StatusCode::kAborted, std::move(msg)); }

// A value or an error. Accessing value() of an error is a programmer error (CHECK).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    CHECK(!std::get<Status>(v_).ok()) << "Result built from an OK Status";
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    CHECK(ok()) << status().ToString();
    return std::get<T>(v_);
  }
  const T& value() const& {
    CHECK(ok()) << status().ToString();
    return std::get<T>(v_);
  }
  T&& value() && {
    CHECK(ok()) << status().ToString();
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ps

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define PS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::ps::Status _ps_status = (expr);        \
    if (!_ps_status.ok()) return _ps_status; \
  } while (0)

#define PS_CONCAT_INNER(a, b) a##b
#define PS_CONCAT(a, b) PS_CONCAT_INNER(a, b)
// `PS_ASSIGN_OR_RETURN(auto x, Foo());` declares x from Foo()'s value or returns its error.
#define PS_ASSIGN_OR_RETURN(lhs, expr) \
  PS_ASSIGN_OR_RETURN_IMPL(PS_CONCAT(_ps_result_, __LINE__), lhs, expr)
#define PS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
