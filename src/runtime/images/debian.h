#pragma once
// A Debian root file system made with mmdebstrap from Debian's packages (the "debian:<suite>"
// template bases; docs/design/templates.md).

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock::images {

struct DebianOptions {
  std::string suite;  // bookworm, trixie, ...
  std::string mirror = "http://deb.debian.org/debian";
  std::string variant = "minbase";  // essential packages, apt, and what they need
  std::chrono::seconds timeout{1800};
};

// Runs mmdebstrap into `dir` (an existing empty directory), in a mount namespace of its own so
// that nothing it mounts in the tree outlives it. Each line of its output goes to `on_output`;
// `cancelled` is asked about once a second and ends the run (kUnavailable) when it says so.
// kUnimplemented when mmdebstrap is not installed; kFailedPrecondition when it fails (with the
// end of its output); kDeadlineExceeded past the timeout.
[[nodiscard]] Status MakeDebianRoot(const DebianOptions& options, const std::string& dir,
                                    const std::function<void(std::string_view line)>& on_output,
                                    const std::function<bool()>& cancelled);

}  // namespace airlock::images
