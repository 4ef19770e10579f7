#pragma once
// Failure and Outcome: how a command ends early. Every failure becomes exactly one line on stderr,
// "airlock: <message>", and an exit code: 2 for a usage error, 1 for anything else.

#include <expected>
#include <string>

namespace airlock::cli {

inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct Failure {
  int exit_code = kExitFailure;
  std::string message;  // one line, without the "airlock: " prefix
};

template <typename T>
using Outcome = std::expected<T, Failure>;

// A usage error in `command` ("" for the top level); the message ends with a hint to --help.
inline std::unexpected<Failure> UsageError(const std::string& command, const std::string& message) {
  const std::string help = command.empty() ? "airlock --help" : "airlock " + command + " --help";
  return std::unexpected<Failure>(Failure{kExitUsage, message + " (see '" + help + "')"});
}

inline std::unexpected<Failure> CommandError(std::string message) {
  return std::unexpected<Failure>(Failure{kExitFailure, std::move(message)});
}

}  // namespace airlock::cli
