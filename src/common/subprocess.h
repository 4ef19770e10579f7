#pragma once
// Runs a short host program (ip, nft) to completion: stdin from a string, stdout and stderr
// together into one capped string. For the daemon's own plumbing, never for sandbox commands.

#include <chrono>
#include <string>
#include <vector>

#include "common/error.h"

namespace airlock {

struct ProgramResult {
  int exit_code = -1;    // -1 when killed by a signal
  std::string output;    // stdout and stderr, interleaved, at most 64 KiB (the rest dropped)
};

// argv[0] is looked up in /usr/sbin, /usr/bin, /sbin, /bin. The program gets an empty
// environment but PATH, no fds but 0-2, and is killed (SIGKILL) past `timeout`
// (kDeadlineExceeded).
[[nodiscard]] Result<ProgramResult> RunProgram(const std::vector<std::string>& argv,
                                               const std::string& input = "",
                                               std::chrono::milliseconds timeout =
                                                   std::chrono::seconds(30));

// RunProgram, and an error that quotes the output unless it exited 0.
[[nodiscard]] Status RunProgramOk(const std::vector<std::string>& argv,
                                  const std::string& input = "",
                                  std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace airlock
