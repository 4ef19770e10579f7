#pragma once
// The build's version and git commit ("0.1.0+0123456789ab"), as the agent, airlockd and the CLI
// report it.

namespace airlock {

extern const char* const kBuildId;
// The build tree this program was built in (CMAKE_BINARY_DIR), for common/helpers.h.
extern const char* const kBuildDir;

}  // namespace airlock
