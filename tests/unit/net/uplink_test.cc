// The uplink setting (src/net/uplink.h): an interface, netns:NAME or a path, and the check that
// a namespace file is one; NetnsThread makes its sockets in its namespace. The namespaces are the
// test's own. Needs root for those parts (they skip otherwise).

#include "net/uplink.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <linux/sockios.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace airlock::net {
namespace {

ino_t Inode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

TEST(UplinkTest, InterfacesAndNothing) {
  auto none = ParseUplink("");
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
  auto eth = ParseUplink("eth0");
  ASSERT_TRUE(eth) << eth.error().message();
  EXPECT_EQ(eth->interface, "eth0");
  EXPECT_FALSE(eth->is_netns());
  EXPECT_FALSE(eth->empty());
}

TEST(UplinkTest, MalformedSettingsAreRefused) {
  for (const char* bad : {"netns:", "netns:a/b", "netns:..", "netns:.", "relative/path", "./x"}) {
    auto parsed = ParseUplink(bad);
    ASSERT_FALSE(parsed) << bad;
    EXPECT_EQ(parsed.error().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.error().message().find("network_uplink"), std::string::npos)
        << parsed.error().message();
  }
}

TEST(UplinkTest, NamespaceFilesAreChecked) {
  // A missing one, a file that is no namespace, a namespace of another kind: refused, saying so.
  auto missing = ParseUplink("netns:airlock-no-such-namespace-" + std::to_string(::getpid()));
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("/run/netns/airlock-no-such-namespace"),
            std::string::npos)
      << missing.error().message();
  EXPECT_NE(missing.error().message().find("No such file"), std::string::npos)
      << missing.error().message();
  auto regular = ParseUplink("/proc/self/status");
  ASSERT_FALSE(regular);
  EXPECT_NE(regular.error().message().find("is not a namespace"), std::string::npos)
      << regular.error().message();
  auto mount_ns = ParseUplink("/proc/self/ns/mnt");
  ASSERT_FALSE(mount_ns);
  EXPECT_NE(mount_ns.error().message().find("not a network namespace"), std::string::npos)
      << mount_ns.error().message();
  // Its own namespace is no uplink (its table there would be the daemon's own).
  auto own = ParseUplink("/proc/self/ns/net");
  ASSERT_FALSE(own);
  EXPECT_NE(own.error().message().find("own network namespace"), std::string::npos)
      << own.error().message();
}

class NetnsThreadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (a network namespace)";
    name_ = "airlock-uplt-" + std::to_string(::getpid());
    ASSERT_EQ(std::system(("ip netns add " + name_).c_str()), 0);
    made_ = true;
  }
  void TearDown() override {
    if (made_) (void)std::system(("ip netns del " + name_).c_str());
  }
  std::string name_;
  bool made_ = false;
};

TEST_F(NetnsThreadTest, ParsesByNameAndMakesSocketsInside) {
  // The positive control of the checks above: another network namespace is taken, by name or
  // by path.
  auto uplink = ParseUplink("netns:" + name_);
  ASSERT_TRUE(uplink) << uplink.error().message();
  EXPECT_EQ(uplink->netns_path, "/run/netns/" + name_);
  EXPECT_EQ(uplink->netns_name, name_);
  auto by_path = ParseUplink("/run/netns/" + name_);
  ASSERT_TRUE(by_path) << by_path.error().message();
  EXPECT_EQ(by_path->netns_path, "/run/netns/" + name_);
  EXPECT_TRUE(by_path->netns_name.empty());

  auto thread = NetnsThread::Start(uplink->netns_path);
  ASSERT_TRUE(thread) << thread.error().message();
  const ino_t inside = Inode("/run/netns/" + name_), here = Inode("/proc/self/ns/net");
  ASSERT_NE(inside, 0u);
  ASSERT_NE(inside, here);
  auto factory = (*thread)->Factory();
  for (int type : {SOCK_STREAM, SOCK_DGRAM}) {
    auto fd = factory(AF_INET, type);
    ASSERT_TRUE(fd) << fd.error().message();
    // SIOCGSKNS: the namespace the socket belongs to.
    int ns = ::ioctl(fd->get(), SIOCGSKNS);
    ASSERT_GE(ns, 0);
    struct stat st {};
    ASSERT_EQ(::fstat(ns, &st), 0);
    ::close(ns);
    EXPECT_EQ(st.st_ino, inside);
    EXPECT_GE(::fcntl(fd->get(), F_GETFD) & FD_CLOEXEC, 1);
  }
  // The positive control: a socket made here is in the test's namespace.
  int mine = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int mine_ns = ::ioctl(mine, SIOCGSKNS);
  struct stat st {};
  ASSERT_EQ(::fstat(mine_ns, &st), 0);
  EXPECT_EQ(st.st_ino, here);
  ::close(mine_ns);
  ::close(mine);
  // What Run runs sees the namespace's interfaces (a fresh one has only lo), the caller stays.
  int interfaces = 0;
  (*thread)->Run([&] {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return;
    for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_PACKET) ++interfaces;
    }
    ::freeifaddrs(list);
  });
  EXPECT_EQ(interfaces, 1);
  EXPECT_EQ(Inode("/proc/thread-self/ns/net"), here);
}

TEST(NetnsThreadStartTest, MissingNamespaceFails) {
  auto thread = NetnsThread::Start("/run/netns/airlock-no-such-namespace");
  EXPECT_FALSE(thread);
}

}  // namespace
}  // namespace airlock::net
