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

// `path`, a program under this build tree (AIRLOCK_TEST_BUILD_DIR; AIRLOCKD_PATH and the like),
// moved to the tree named by AIRLOCK_TEST_PROGRAMS when that is set.
inline std::string Program(std::string_view path) {
  const char* other = std::getenv("AIRLOCK_TEST_PROGRAMS");
  constexpr std::string_view kTree = AIRLOCK_TEST_BUILD_DIR;
  if (other == nullptr || *other == '\0' || !path.starts_with(kTree)) return std::string(path);
  return std::string(other) + std::string(path.substr(kTree.size()));
}

}  // namespace airlock::testing
