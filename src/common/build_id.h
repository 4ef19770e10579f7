#pragma once
// The build's version and git commit ("0.1.0+0123456789ab"), as the agent, airlockd and the CLI
// report it.

namespace airlock {

extern const char* const kBuildId;

}  // namespace airlock
