#include <linux/seccomp.h>
#include <sys/prctl.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "runtime/seccomp_policy.h"

// The part of seccomp_policy.h that needs no libseccomp: a compiled program, loaded from its
// bytes and installed. The launcher links only this.

namespace airlock::runtime {

Result<SeccompProgram> SeccompProgram::FromBytes(std::string_view bytes) {
  size_t count = bytes.size() / sizeof(sock_filter);
  if (count == 0 || count * sizeof(sock_filter) != bytes.size() || count > BPF_MAXINSNS) {
    return Fail(ErrorCode::kInvalidArgument,
                "a seccomp program of " + std::to_string(bytes.size()) + " bytes is not BPF");
  }
  SeccompProgram program;
  program.filter_.resize(count);
  std::memcpy(program.filter_.data(), bytes.data(), bytes.size());
  program.fprog_.len = static_cast<unsigned short>(count);
  program.fprog_.filter = program.filter_.data();
  return program;
}

SeccompProgram::SeccompProgram(SeccompProgram&& other) noexcept
    : filter_(std::move(other.filter_)) {
  fprog_.len = static_cast<unsigned short>(filter_.size());
  fprog_.filter = filter_.data();
  other.filter_.clear();
  other.fprog_ = {};
}

int InstallSeccomp(const sock_fprog* prog) {
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0) != 0) return errno;
  return 0;
}

}  // namespace airlock::runtime
