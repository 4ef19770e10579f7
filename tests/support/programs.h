#pragma once
// The programs an end-to-end test runs (airlockd, airlock-agent, airlock-jail, the CLI): this
// build tree's, whose paths CMake compiles in (AIRLOCKD_PATH, ...), or the same programs in the
// build tree named by AIRLOCK_TEST_PROGRAMS. scripts/test runs build/'s end-to-end tests a second
// time with AIRLOCK_TEST_PROGRAMS=build-asan, against the sanitized daemon, agent, launcher and
// CLI, instead of compiling those tests again in the sanitizer tree (docs/design/build.md).

#include <cstdlib>
#include <string>
#include <string_view>

namespace airlock::testing {

// `path`, a program under this build tree (AIRLOCK_TEST_BUILD_DIR), moved to the tree named by
// AIRLOCK_TEST_PROGRAMS when that is set.
inline std::string Program(std::string_view path) {
  const char* other = std::getenv("AIRLOCK_TEST_PROGRAMS");
  constexpr std::string_view kTree = AIRLOCK_TEST_BUILD_DIR;
  if (other == nullptr || *other == '\0' || !path.starts_with(kTree)) return std::string(path);
  return std::string(other) + std::string(path.substr(kTree.size()));
}

#ifdef AIRLOCKD_PATH
inline const std::string& AirlockdPath() {
  static const std::string path = Program(AIRLOCKD_PATH);
  return path;
}
#endif
#ifdef AIRLOCK_AGENT_PATH
inline const std::string& AgentPath() {
  static const std::string path = Program(AIRLOCK_AGENT_PATH);
  return path;
}
#endif
#ifdef AIRLOCK_JAIL_LAUNCHER_PATH
inline const std::string& LauncherPath() {
  static const std::string path = Program(AIRLOCK_JAIL_LAUNCHER_PATH);
  return path;
}
#endif
#ifdef AIRLOCK_CLI_PATH
inline const std::string& CliPath() {
  static const std::string path = Program(AIRLOCK_CLI_PATH);
  return path;
}
#endif

}  // namespace airlock::testing
