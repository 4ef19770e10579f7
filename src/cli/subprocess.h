#pragma once
// Runs a helper program (the system tar) with bytes on its stdin and its stdout captured.

#include <string>
#include <string_view>
#include <vector>

#include "cli/outcome.h"

namespace airlock::cli {

// Runs argv[0] (looked up in PATH) with `input` on stdin and returns what it wrote to stdout.
// A non-zero exit is a Failure naming the program and the first line of its stderr.
// Precondition: the process is single-threaded (it forks).
[[nodiscard]] Outcome<std::string> RunProgram(const std::vector<std::string>& argv,
                                              std::string_view input);

}  // namespace airlock::cli
