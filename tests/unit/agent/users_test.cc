// LookupUser against passwd and group files of our own.

#include "agent/users.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "agent_fixture.h"

namespace airlock::agent::test {
namespace {

class UsersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteWholeFile(etc_.Sub("passwd"),
                   "# a comment line\n"
                   "root:x:0:0:root:/root:/bin/bash\n"
                   "\n"
                   "alice:x:1000:1000:Alice A:/home/alice:/bin/zsh\n"
                   "this line is not a passwd entry\n"
                   "bob:x:1001:100::/home/bob:\n"
                   "#ghost:x:1500:1500::/home/ghost:/bin/sh\n"
                   "carol:x:notanumber:1002::/home/carol:/bin/sh\n"
                   "dave:x:1003:1003:six fields only:/home/dave\n"
                   "erin:x:1004:-1::/home/erin:/bin/sh\n"
                   "frank:x:1005:1005:::/bin/sh\n"
                   "alice:x:1999:1999:second alice:/home/alice2:/bin/sh\n"
                   "grace:x:1006:1006::/home/grace:/bin/sh");  // no final newline
    WriteWholeFile(etc_.Sub("group"),
                   "# groups\n"
                   "root:x:0:\n"
                   "users:x:100:alice,bob\n"
                   "\n"
                   "alice:x:1000:\n"
                   "dev:x:2000:carol,alice\n"
                   "ops:x:2001:bob,alice\n"
                   "almost:x:2002:alice2,xalice,alic\n"
                   "broken:x:zzz:alice\n"
                   "short:x:2003\n"
                   "#old:x:2004:alice\n");
  }

  TempDir etc_;
};

TEST_F(UsersTest, ByName) {
  auto u = LookupUser("alice", etc_.path());
  ASSERT_TRUE(u) << u.error().message();
  EXPECT_EQ(u->name, "alice");
  EXPECT_EQ(u->uid, 1000u);
  EXPECT_EQ(u->gid, 1000u);
  EXPECT_EQ(u->home, "/home/alice");
  EXPECT_EQ(u->shell, "/bin/zsh");
}

TEST_F(UsersTest, ByUid) {
  auto u = LookupUser("1001", etc_.path());
  ASSERT_TRUE(u) << u.error().message();
  EXPECT_EQ(u->name, "bob");
  EXPECT_EQ(u->gid, 100u);
  EXPECT_EQ(u->home, "/home/bob");
  EXPECT_EQ(u->shell, "/bin/sh") << "an empty shell field means the default";
  u = LookupUser("0", etc_.path());
  ASSERT_TRUE(u);
  EXPECT_EQ(u->name, "root");
  EXPECT_EQ(u->groups, (std::vector<gid_t>{0}));
}

TEST_F(UsersTest, FirstEntryWins) {
  auto u = LookupUser("alice", etc_.path());
  ASSERT_TRUE(u);
  EXPECT_EQ(u->uid, 1000u);
}

TEST_F(UsersTest, NumericUidMissingFromPasswdIsAccepted) {
  auto u = LookupUser("4242", etc_.path());
  ASSERT_TRUE(u) << u.error().message();
  EXPECT_EQ(u->name, "");
  EXPECT_EQ(u->uid, 4242u);
  EXPECT_EQ(u->gid, 4242u);
  EXPECT_EQ(u->home, "/");
  EXPECT_EQ(u->shell, "/bin/sh");
  EXPECT_EQ(u->groups, (std::vector<gid_t>{4242}));
  // Even with no passwd file at all.
  u = LookupUser("7", etc_.Sub("missing"));
  ASSERT_TRUE(u);
  EXPECT_EQ(u->uid, 7u);
}

TEST_F(UsersTest, UnknownNameIsRejected) {
  for (const char* name : {"mallory", "ALICE", "alic", "", "1000x", "-1"}) {
    SCOPED_TRACE(name);
    auto u = LookupUser(name, etc_.path());
    ASSERT_FALSE(u);
    EXPECT_EQ(u.error().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_FALSE(LookupUser("alice", etc_.Sub("missing"))) << "no passwd file: no names";
}

TEST_F(UsersTest, MalformedLinesAreSkipped) {
  // Bad uid, too few fields, bad gid: as if they were not there.
  EXPECT_FALSE(LookupUser("carol", etc_.path()));
  EXPECT_FALSE(LookupUser("dave", etc_.path()));
  EXPECT_FALSE(LookupUser("erin", etc_.path()));
  auto u = LookupUser("1003", etc_.path());
  ASSERT_TRUE(u);
  EXPECT_EQ(u->name, "") << "dave's line has six fields";
  EXPECT_FALSE(LookupUser("this line is not a passwd entry", etc_.path()));
  // Lines after the malformed ones are still read, the last one without a newline too.
  u = LookupUser("grace", etc_.path());
  ASSERT_TRUE(u);
  EXPECT_EQ(u->uid, 1006u);
}

TEST_F(UsersTest, EmptyHomeMeansRoot) {
  auto u = LookupUser("frank", etc_.path());
  ASSERT_TRUE(u);
  EXPECT_EQ(u->home, "/");
}

TEST_F(UsersTest, CommentsAreNotEntries) {
  auto u = LookupUser("1500", etc_.path());
  ASSERT_TRUE(u);
  EXPECT_EQ(u->name, "") << "#ghost is a comment";
  EXPECT_FALSE(LookupUser("#ghost", etc_.path()));
}

TEST_F(UsersTest, SupplementaryGroupsFromEtcGroup) {
  auto u = LookupUser("alice", etc_.path());
  ASSERT_TRUE(u);
  // Primary first; then every group that lists her, in file order; not the commented one,
  // nor members whose names merely resemble hers.
  EXPECT_EQ(u->groups, (std::vector<gid_t>{1000, 100, 2000, 2001}));
  u = LookupUser("bob", etc_.path());
  ASSERT_TRUE(u);
  EXPECT_EQ(u->groups, (std::vector<gid_t>{100, 2001})) << "the primary group is not repeated";
  u = LookupUser("grace", etc_.path());
  ASSERT_TRUE(u);
  EXPECT_EQ(u->groups, (std::vector<gid_t>{1006}));
}

TEST_F(UsersTest, MissingGroupFileLeavesThePrimaryGroup) {
  TempDir etc;
  WriteWholeFile(etc.Sub("passwd"), "alice:x:1000:1000::/home/alice:/bin/sh\n");
  auto u = LookupUser("alice", etc.path());
  ASSERT_TRUE(u);
  EXPECT_EQ(u->groups, (std::vector<gid_t>{1000}));
}

}  // namespace
}  // namespace airlock::agent::test
