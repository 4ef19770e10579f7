// The Debian package on a fresh Debian 12 root: tests/package/install_test.sh does the work
// (docs/install.md); this runs it once from the build tree and reports a skip with its reason.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace {

TEST(PackageTest, AFreshDebianRootRunsASandboxFromThePackageAlone) {
  const std::string command = std::string("bash ") + AIRLOCK_PACKAGE_TEST_SCRIPT + " " +
                              AIRLOCK_BUILD_DIR + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out, last;
  char line[4096];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    out += line;
    last = line;
  }
  const int status = ::pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << last.substr(0, last.find('\n'));
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_EQ(last, "PASS\n");
  std::fputs(out.c_str(), stdout);
}

}  // namespace
