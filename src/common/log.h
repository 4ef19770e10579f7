#pragma once
// Logging through spdlog (compiled into airlock_common by spdlog_lib.cc, so the static agent can
// use it too).
// Use the spdlog calls directly: spdlog::info("created {}", id).

#include <spdlog/spdlog.h>

#include <string_view>

namespace airlock {

// Sets the default logger: stderr, "[time] [program] [level] message". `level` is one of
// trace, debug, info, warn, error, off; an unknown name keeps info. Call once, early in main.
void InitLogging(std::string_view program, std::string_view level);

}  // namespace airlock
