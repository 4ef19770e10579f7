#pragma once
// The sandbox seccomp policy (shared/SECURITY.md), as a table of rules with a reason each,
// compiled with libseccomp into a BPF program by the engine, so that what runs in the sandbox
// only has to install it: the jail's launcher before it execs the agent, the agent itself on
// gVisor (`--seccomp`), where the Sentry enforces it as defence in depth. Every engine applies
// the same program (docs/design/seccomp.md).

#include <linux/filter.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace airlock::runtime {

enum class SeccompAction {
  kErrno,        // the call fails with `err`
  kKillProcess,  // SIGSYS kills the whole process
};

// One line of the policy: a syscall denied whatever its arguments.
struct SeccompRule {
  std::string_view syscall;  // as libseccomp names it
  SeccompAction action;
  int err;                  // for kErrno
  std::string_view reason;  // one line: why it is denied
};

// The policy table (documentation and tests read it; Compile turns it into BPF). Conditional
// rules (clone flags, socket families and types, ioctl requests, personality) are in
// seccomp_policy.cc beside the table.
std::span<const SeccompRule> SeccompRules();

class SeccompProgram {
 public:
  // Builds the policy for this architecture (x86_64; other architectures and x32 numbers kill).
  [[nodiscard]] static Result<SeccompProgram> Compile();

  // The program as it was compiled, in raw BPF bytes (what FromBytes takes back). The engine
  // compiles once and hands these to each launcher, which then needs no libseccomp.
  std::string_view bytes() const {
    return {reinterpret_cast<const char*>(filter_.data()), filter_.size() * sizeof(sock_filter)};
  }
  // A program from raw BPF bytes: a whole number of instructions, at most BPF_MAXINSNS.
  [[nodiscard]] static Result<SeccompProgram> FromBytes(std::string_view bytes);

  // For prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog()): points into this object.
  const sock_fprog* prog() const { return &fprog_; }
  size_t instructions() const { return filter_.size(); }

  SeccompProgram(SeccompProgram&& other) noexcept;
  SeccompProgram& operator=(SeccompProgram&&) = delete;
  SeccompProgram(const SeccompProgram&) = delete;

 private:
  SeccompProgram() = default;
  std::vector<sock_filter> filter_;
  sock_fprog fprog_{};
};

// Installs `prog` on the calling process (with SECCOMP_FILTER_FLAG_TSYNC unnecessary: the jail
// child is single-threaded). Async-signal-safe: allocates nothing. Requires NO_NEW_PRIVS.
// Returns 0, or the errno of the failure.
int InstallSeccomp(const sock_fprog* prog);

}  // namespace airlock::runtime
