#include "common/error.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <set>
#include <string>
#include <string_view>

namespace airlock {
namespace {

struct CodeRow {
  ErrorCode code;
  uint16_t wire_value;
  std::string_view name;
  int http;
};

// The wire values are part of the protocol: a renumbering must fail here.
constexpr CodeRow kCodes[] = {
    {ErrorCode::kInvalidArgument, 1, "invalid_argument", 400},
    {ErrorCode::kNotFound, 2, "not_found", 404},
    {ErrorCode::kAlreadyExists, 3, "already_exists", 409},
    {ErrorCode::kPermissionDenied, 4, "permission_denied", 403},
    {ErrorCode::kFailedPrecondition, 5, "failed_precondition", 409},
    {ErrorCode::kResourceExhausted, 6, "resource_exhausted", 429},
    {ErrorCode::kTooLarge, 7, "too_large", 413},
    {ErrorCode::kUnauthenticated, 8, "unauthenticated", 401},
    {ErrorCode::kUnimplemented, 9, "unimplemented", 501},
    {ErrorCode::kUnavailable, 10, "unavailable", 503},
    {ErrorCode::kDeadlineExceeded, 11, "deadline_exceeded", 504},
    {ErrorCode::kProtocol, 12, "protocol_error", 502},
    {ErrorCode::kInternal, 13, "internal", 500},
};

TEST(ErrorCodeTest, NameHttpStatusAndWireValueOfEveryCode) {
  std::set<std::string_view> names;
  for (const auto& row : kCodes) {
    SCOPED_TRACE(row.name);
    EXPECT_EQ(static_cast<uint16_t>(row.code), row.wire_value);
    EXPECT_EQ(ErrorCodeName(row.code), row.name);
    EXPECT_EQ(HttpStatus(row.code), row.http);
    EXPECT_TRUE(IsValidErrorCode(row.wire_value));
    names.insert(ErrorCodeName(row.code));
  }
  EXPECT_EQ(names.size(), std::size(kCodes)) << "two codes share a name";
}

TEST(ErrorCodeTest, OutOfRangeValuesHaveFallbacks) {
  EXPECT_EQ(ErrorCodeName(static_cast<ErrorCode>(0)), "unknown");
  EXPECT_EQ(ErrorCodeName(static_cast<ErrorCode>(14)), "unknown");
  EXPECT_EQ(HttpStatus(static_cast<ErrorCode>(0)), 500);
  EXPECT_EQ(HttpStatus(static_cast<ErrorCode>(999)), 500);
}

TEST(ErrorCodeTest, IsValidErrorCodeBounds) {
  EXPECT_FALSE(IsValidErrorCode(0));
  EXPECT_TRUE(IsValidErrorCode(1));
  EXPECT_TRUE(IsValidErrorCode(13));
  EXPECT_FALSE(IsValidErrorCode(14));
  EXPECT_FALSE(IsValidErrorCode(0xFFFF));
}

TEST(CodeForErrnoTest, MainErrnos) {
  struct Row {
    int err;
    ErrorCode code;
  };
  constexpr Row kRows[] = {
      {ENOENT, ErrorCode::kNotFound},
      {ESRCH, ErrorCode::kNotFound},
      {EEXIST, ErrorCode::kAlreadyExists},
      {ENOTEMPTY, ErrorCode::kAlreadyExists},
      {EACCES, ErrorCode::kPermissionDenied},
      {EPERM, ErrorCode::kPermissionDenied},
      {EROFS, ErrorCode::kPermissionDenied},
      {EXDEV, ErrorCode::kPermissionDenied},
      {ELOOP, ErrorCode::kPermissionDenied},
      {EINVAL, ErrorCode::kInvalidArgument},
      {ENAMETOOLONG, ErrorCode::kInvalidArgument},
      {ENOTDIR, ErrorCode::kInvalidArgument},
      {EISDIR, ErrorCode::kInvalidArgument},
      {EBADF, ErrorCode::kInvalidArgument},
      {ENOSPC, ErrorCode::kResourceExhausted},
      {EDQUOT, ErrorCode::kResourceExhausted},
      {ENOMEM, ErrorCode::kResourceExhausted},
      {EMFILE, ErrorCode::kResourceExhausted},
      {ENFILE, ErrorCode::kResourceExhausted},
      {EAGAIN, ErrorCode::kResourceExhausted},
      {EFBIG, ErrorCode::kTooLarge},
      {ENOSYS, ErrorCode::kUnimplemented},
      {EOPNOTSUPP, ErrorCode::kUnimplemented},
      {ETIMEDOUT, ErrorCode::kDeadlineExceeded},
      {EPIPE, ErrorCode::kUnavailable},
      {ECONNRESET, ErrorCode::kUnavailable},
      {EIO, ErrorCode::kInternal},
      {0, ErrorCode::kInternal},
      {123456, ErrorCode::kInternal},
  };
  for (const auto& row : kRows) {
    EXPECT_EQ(CodeForErrno(row.err), row.code) << "errno " << row.err;
  }
}

TEST(ErrnoNameTest, KnownAndUnknownValues) {
  EXPECT_EQ(ErrnoName(ENOENT), "ENOENT");
  EXPECT_EQ(ErrnoName(EACCES), "EACCES");
  EXPECT_EQ(ErrnoName(EINVAL), "EINVAL");
  EXPECT_EQ(ErrnoName(4095), "E4095");
  EXPECT_EQ(ErrnoName(123456), "E123456");
  EXPECT_EQ(ErrnoName(-7), "E-7");
}

TEST(ErrnoErrorTest, MessageCodeAndErrno) {
  Error e = ErrnoError("opening /etc/x", ENOENT);
  EXPECT_EQ(e.message(), "opening /etc/x: ENOENT (No such file or directory)");
  EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  EXPECT_EQ(e.sys_errno(), ENOENT);

  Error unknown = ErrnoError("frobbing", 4095);
  EXPECT_EQ(unknown.message(), "frobbing: E4095 (unknown error)");
  EXPECT_EQ(unknown.code(), ErrorCode::kInternal);
  EXPECT_EQ(unknown.sys_errno(), 4095);

  auto failed = FailErrno("mounting overlay", EPERM);
  EXPECT_EQ(failed.error().code(), ErrorCode::kPermissionDenied);
  EXPECT_EQ(failed.error().message(), "mounting overlay: EPERM (Operation not permitted)");
}

TEST(ErrorTest, ConstructorAndFail) {
  Error plain(ErrorCode::kTooLarge, "body too big");
  EXPECT_EQ(plain.code(), ErrorCode::kTooLarge);
  EXPECT_EQ(plain.sys_errno(), 0);
  EXPECT_EQ(plain.message(), "body too big");

  Result<int> r = Fail(ErrorCode::kNotFound, "no such sandbox");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(r.error().message(), "no such sandbox");
}

TEST(ErrorTest, WrapPrependsContextAndKeepsCodeAndErrno) {
  const Error inner(ErrorCode::kInvalidArgument, "EINVAL", EINVAL);
  Error once = inner.Wrap("mounting overlay");
  EXPECT_EQ(once.message(), "mounting overlay: EINVAL");
  EXPECT_EQ(once.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(once.sys_errno(), EINVAL);
  EXPECT_EQ(inner.message(), "EINVAL") << "the const& overload must not modify the original";

  Error twice = std::move(once).Wrap("creating sbx-ab12");
  EXPECT_EQ(twice.message(), "creating sbx-ab12: mounting overlay: EINVAL");
  EXPECT_EQ(twice.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(twice.sys_errno(), EINVAL);
}

TEST(WithContextTest, PassesSuccessThrough) {
  Result<std::string> ok = std::string("value");
  Result<std::string> out = WithContext(std::move(ok), "reading config");
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(*out, "value");
}

TEST(WithContextTest, WrapsFailures) {
  Result<int> failed = std::unexpected(Error(ErrorCode::kNotFound, "ENOENT", ENOENT));
  Result<int> out = WithContext(std::move(failed), "reading config");
  ASSERT_FALSE(out.has_value());
  EXPECT_EQ(out.error().message(), "reading config: ENOENT");
  EXPECT_EQ(out.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(out.error().sys_errno(), ENOENT);
}

TEST(PanicDeathTest, CheckAbortsWithTheCondition) {
  int x = 1;
  EXPECT_DEATH(AIRLOCK_CHECK(x == 2), "check failed: x == 2");
  AIRLOCK_CHECK(x == 1);  // a true condition does nothing
}

}  // namespace
}  // namespace airlock
