#include "common/error.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace airlock {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kAlreadyExists:
      return "already_exists";
    case ErrorCode::kPermissionDenied:
      return "permission_denied";
    case ErrorCode::kFailedPrecondition:
      return "failed_precondition";
    case ErrorCode::kResourceExhausted:
      return "resource_exhausted";
    case ErrorCode::kTooLarge:
      return "too_large";
    case ErrorCode::kUnauthenticated:
      return "unauthenticated";
    case ErrorCode::kUnimplemented:
      return "unimplemented";
    case ErrorCode::kUnavailable:
      return "unavailable";
    case ErrorCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case ErrorCode::kProtocol:
      return "protocol_error";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

int HttpStatus(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return 400;
    case ErrorCode::kNotFound:
      return 404;
    case ErrorCode::kAlreadyExists:
      return 409;
    case ErrorCode::kPermissionDenied:
      return 403;
    case ErrorCode::kFailedPrecondition:
      return 409;
    case ErrorCode::kResourceExhausted:
      return 429;
    case ErrorCode::kTooLarge:
      return 413;
    case ErrorCode::kUnauthenticated:
      return 401;
    case ErrorCode::kUnimplemented:
      return 501;
    case ErrorCode::kUnavailable:
      return 503;
    case ErrorCode::kDeadlineExceeded:
      return 504;
    case ErrorCode::kProtocol:
      return 502;
    case ErrorCode::kInternal:
      return 500;
  }
  return 500;
}

bool IsValidErrorCode(uint16_t value) {
  return value >= static_cast<uint16_t>(ErrorCode::kInvalidArgument) &&
         value <= static_cast<uint16_t>(ErrorCode::kInternal);
}

ErrorCode CodeForErrno(int err) {
  switch (err) {
    case ENOENT:
    case ESRCH:
      return ErrorCode::kNotFound;
    case EEXIST:
    case ENOTEMPTY:
      return ErrorCode::kAlreadyExists;
    case EACCES:
    case EPERM:
    case EROFS:
    case EXDEV:
    case ELOOP:
      return ErrorCode::kPermissionDenied;
    case EINVAL:
    case ENAMETOOLONG:
    case ENOTDIR:
    case EISDIR:
    case EBADF:
      return ErrorCode::kInvalidArgument;
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EAGAIN:
      return ErrorCode::kResourceExhausted;
    case EFBIG:
      return ErrorCode::kTooLarge;
    case ENOSYS:
    case EOPNOTSUPP:
      return ErrorCode::kUnimplemented;
    case ETIMEDOUT:
      return ErrorCode::kDeadlineExceeded;
    case EPIPE:
    case ECONNRESET:
      return ErrorCode::kUnavailable;
    default:
      return ErrorCode::kInternal;
  }
}

std::string ErrnoName(int err) {
  const char* name = strerrorname_np(err);
  return name ? std::string(name) : "E" + std::to_string(err);
}

Error Error::Wrap(std::string_view context) && {
  message_.insert(0, std::string(context) + ": ");
  return std::move(*this);
}

Error Error::Wrap(std::string_view context) const& { return Error(*this).Wrap(context); }

Error ErrnoError(std::string_view what, int err) {
  std::string message(what);
  const char* desc = strerrordesc_np(err);
  message += ": " + ErrnoName(err) + " (" + (desc ? desc : "unknown error") + ")";
  return Error(CodeForErrno(err), std::move(message), err);
}

void Panic(std::string_view message) {
  std::fprintf(stderr, "airlock: fatal: %.*s\n", static_cast<int>(message.size()), message.data());
  std::abort();
}

}  // namespace airlock
