#pragma once
// Runs a helper program (the system tar, airlockd --doctor) with bytes on its stdin and its
// output captured.

#include <string>
#include <string_view>
#include <vector>

#include "cli/outcome.h"

namespace airlock::cli {

// How a program ended and what it wrote.
struct Ran {
  int status = 0;  // as waitpid gives it
  std::string out, err;
};

// Runs argv[0] (looked up in PATH when it has no slash) with `input` on stdin, to its end,
// whatever its exit. A Failure only when it could not be started at all.
// Precondition: the process is single-threaded (it forks).
[[nodiscard]] Outcome<Ran> RunCaptured(const std::vector<std::string>& argv,
                                       std::string_view input);

// RunCaptured, for a program that must succeed: what it wrote to stdout. A non-zero exit is a
// Failure naming the program and the first line of its stderr.
[[nodiscard]] Outcome<std::string> RunProgram(const std::vector<std::string>& argv,
                                              std::string_view input);

}  // namespace airlock::cli
