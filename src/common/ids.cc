#include "common/ids.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>

#include "common/syscall.h"

namespace airlock {

std::string NewSandboxId() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz234567";
  uint8_t random[16];
  size_t got = 0;
  while (got < sizeof random) {
    ssize_t n = RetryEintr([&] { return ::getrandom(random + got, sizeof random - got, 0); });
    if (n < 0) Panic("getrandom failed: " + ErrnoName(errno));
    got += static_cast<size_t>(n);
  }
  std::string id = "sbx-";
  for (uint8_t b : random) id += kAlphabet[b & 31];
  return id;
}

Status ValidateSandboxId(std::string_view id) {
  if (id.empty() || id.size() > 64) {
    return Fail(ErrorCode::kInvalidArgument, "sandbox id must be 1-64 characters long");
  }
  if (id.front() == '-') {
    return Fail(ErrorCode::kInvalidArgument, "sandbox id must not start with '-'");
  }
  for (char c : id) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    if (!ok) {
      return Fail(ErrorCode::kInvalidArgument, "sandbox id may hold only letters, digits and '-'");
    }
  }
  return {};
}

}  // namespace airlock
