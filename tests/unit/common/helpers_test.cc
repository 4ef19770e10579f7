#include "common/helpers.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/build_id.h"

namespace airlock {
namespace {

using Paths = std::vector<std::string>;

TEST(HelpersTest, AnInstalledProgramLooksBesideItselfThenInLibexec) {
  EXPECT_EQ(HelperCandidates("airlock-agent", "/opt/airlock/bin/airlockd"),
            (Paths{"/opt/airlock/bin/airlock-agent", "/opt/airlock/libexec/airlock/airlock-agent"}));
  EXPECT_EQ(HelperCandidates("airlock-jail", "/usr/bin/airlockd"),
            (Paths{"/usr/bin/airlock-jail", "/usr/libexec/airlock/airlock-jail"}));
}

TEST(HelpersTest, AProgramInItsBuildTreeAlsoLooksWhereTheBuildPutTheHelper) {
  const std::string build = kBuildDir;
  ASSERT_FALSE(build.empty());
  const Paths found = HelperCandidates("airlock-jail", build + "/src/daemon/server/airlockd");
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[2], build + "/src/runtime/jail/airlock-jail");
  EXPECT_EQ(HelperCandidates("airlock-agent", build + "/tests/x").back(),
            build + "/src/agent/airlock-agent");
  // A name the build tree has no place for, and a directory that only starts like the tree.
  EXPECT_EQ(HelperCandidates("other", build + "/src/x").size(), 2u);
  EXPECT_EQ(HelperCandidates("airlock-agent", build + "-other/bin/airlockd").size(), 2u);
  EXPECT_EQ(HelperCandidates("airlock-agent", build + "/../elsewhere/airlockd").size(), 2u);
}

TEST(HelpersTest, ThisTestFindsTheAgentItsBuildMade) {
  const std::string built = std::string(kBuildDir) + "/src/agent/airlock-agent";
  if (::access(built.c_str(), X_OK) != 0) GTEST_SKIP() << built << " is not built";
  EXPECT_EQ(FindHelper("airlock-agent"), built);
  EXPECT_EQ(FindHelper("airlock-no-such-helper"), "");
}

}  // namespace
}  // namespace airlock
