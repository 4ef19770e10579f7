#pragma once
// The benchmarks' command-line flags.

#include <cstdlib>
#include <optional>
#include <string>

#include "common/error.h"

namespace airlock::bench {

// Reads `value`, given to `flag`, into `into`: a whole number from `min` to `max`, or an error
// that names the flag and the range.
inline Status ParseIntFlag(const std::string& flag, const std::string& value, int min, int max,
                           std::optional<int>& into) {
  char* end = nullptr;
  long n = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || n < min || n > max) {
    return Fail(ErrorCode::kInvalidArgument, flag + ": expected " + std::to_string(min) + "-" +
                                                 std::to_string(max) + ", got '" + value + "'");
  }
  into = static_cast<int>(n);
  return {};
}

}  // namespace airlock::bench
