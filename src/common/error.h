#pragma once
// Error and Result: the one error type that crosses module boundaries.
//
// An Error carries a code (which maps to an HTTP status and to the wire protocol's error code),
// the errno that caused it where there was one, and a message that says what was being done.
// Context is prepended as the error travels up: "creating sbx-ab12: mounting overlay: EINVAL".

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace airlock {

// Stable numeric values: they travel on the wire (protocol Error frames). Never renumber.
enum class ErrorCode : uint16_t {
  kInvalidArgument = 1,     // 400: the caller sent something malformed or out of range
  kNotFound = 2,            // 404
  kAlreadyExists = 3,       // 409
  kPermissionDenied = 4,    // 403
  kFailedPrecondition = 5,  // 409: the object is in the wrong state for this call
  kResourceExhausted = 6,   // 429: a limit was hit (processes, memory, queue)
  kTooLarge = 7,            // 413: a body, frame or file over its cap
  kUnauthenticated = 8,     // 401
  kUnimplemented = 9,       // 501: this engine or build cannot do it
  kUnavailable = 10,        // 503: try again later (channel closed, shutting down)
  kDeadlineExceeded = 11,   // 504
  kProtocol = 12,           // 502: the peer broke the wire protocol
  kInternal = 13,           // 500: a bug or an unexpected system failure
};

std::string_view ErrorCodeName(ErrorCode code);
int HttpStatus(ErrorCode code);
// Maps an errno to the code a caller should see (ENOENT -> kNotFound, EACCES -> ...).
ErrorCode CodeForErrno(int err);
// "ENOENT"; "E<number>" for values glibc does not name.
std::string ErrnoName(int err);
// True for a value that names an ErrorCode.
bool IsValidErrorCode(uint16_t value);

class [[nodiscard]] Error {
 public:
  Error(ErrorCode code, std::string message, int err = 0)
      : code_(code), errno_(err), message_(std::move(message)) {}

  ErrorCode code() const { return code_; }
  int sys_errno() const { return errno_; }
  const std::string& message() const { return message_; }

  // Returns this error with "context: " in front of the message.
  Error Wrap(std::string_view context) &&;
  Error Wrap(std::string_view context) const&;

 private:
  ErrorCode code_;
  int errno_;
  std::string message_;
};

template <typename T>
using Result = std::expected<T, Error>;
using Status = std::expected<void, Error>;

inline std::unexpected<Error> Fail(ErrorCode code, std::string message) {
  return std::unexpected<Error>(Error(code, std::move(message)));
}

// An Error from `err` (default: the current errno): "what: ENOENT (No such file or directory)".
Error ErrnoError(std::string_view what, int err);
inline std::unexpected<Error> FailErrno(std::string_view what, int err) {
  return std::unexpected<Error>(ErrnoError(what, err));
}

// Adds context to the error of a failed Result, passing successes through.
template <typename T>
Result<T> WithContext(Result<T> r, std::string_view context) {
  if (!r) return std::unexpected<Error>(std::move(r.error()).Wrap(context));
  return r;
}

// A broken invariant: a bug, never a user's input. Prints and aborts.
[[noreturn]] void Panic(std::string_view message);
#define AIRLOCK_CHECK(cond)                                                                 \
  do {                                                                                      \
    if (!(cond))                                                                            \
      ::airlock::Panic(__FILE__ ":" + std::to_string(__LINE__) + ": check failed: " #cond); \
  } while (0)

}  // namespace airlock
