// IPv6 on a sandbox's link (SECURITY.md, "IPv6 leaks (router advertisements ignored)"): the
// link carries no IPv6 at either end, and a router advertisement sent from a sandbox's
// namespace (by root on the host, as if the sandbox had beaten seccomp's raw-socket rule) changes
// nothing on the host. The positive control is the same advertisement between two namespaces
// the test makes, which does install a route. Needs root, iproute2 and python3.

#include <unistd.h>

#include <array>
#include <cstdio>

#include "support/airlockd.h"

namespace {

using namespace airlock::testing;

// Sends one router advertisement (prefix 2001:db8:1::/64, router lifetime 1800 s) from
// fe80::1 out of the interface named by argv[1], to all nodes.
constexpr char kSendRa[] = R"PY(
import socket, struct, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
ra = struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 1800, 0, 0)
ra += struct.pack("!BBBBIII", 3, 4, 64, 0xC0, 86400, 14400, 0)
ra += socket.inet_pton(socket.AF_INET6, "2001:db8:1::")
for _ in range(3):
    s.sendto(ra, ("ff02::1", 0, 0, socket.if_nametoindex(sys.argv[1])))
)PY";

int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

std::string Out(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    std::array<char, 4096> buf;
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    ::pclose(p);
  }
  return out;
}

// Gives `ifname` in namespace `ns` IPv6 and fe80::1, the source of the advertisements.
int PrepareSender(const std::string& ns, const std::string& ifname) {
  return Sh("ip netns exec " + ns + " sysctl -qw net.ipv6.conf." + ifname +
            ".disable_ipv6=0 && ip -n " + ns + " addr add fe80::1/64 dev " + ifname + " nodad");
}

// Sends the advertisement from namespace `ns` out of `ifname`.
int SendRa(const std::string& ns, const std::string& ifname) {
  const std::string script = "/tmp/airlock-ra-" + std::to_string(::getpid()) + ".py";
  {
    std::ofstream(script) << kSendRa;
  }
  int rc = Sh("ip netns exec " + ns + " python3 " + script + " " + ifname);
  ::unlink(script.c_str());
  return rc;
}

class NetworkIpv6Test : public DaemonTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root";
    if (Sh("command -v ip >/dev/null && command -v python3 >/dev/null") != 0) {
      GTEST_SKIP() << "ip (iproute2) or python3 is not installed";
    }
    if (::access("/proc/sys/net/ipv6", F_OK) != 0) GTEST_SKIP() << "this kernel has no IPv6";
    DaemonTest::SetUp();
  }
  void TearDown() override {
    if (!control_.empty()) {
      Sh("ip netns del " + control_ + "-a 2>/dev/null; ip netns del " + control_ +
         "-b 2>/dev/null; true");
    }
    DaemonTest::TearDown();
  }
  std::string control_;
};

TEST_F(NetworkIpv6Test, ARouterAdvertisementFromASandboxChangesNothingOnTheHost) {
  // Positive control: two namespaces of the test's own, one listening for advertisements.
  control_ = "airlock-ra-" + std::to_string(::getpid());
  const std::string a = control_ + "-a", b = control_ + "-b";
  ASSERT_EQ(Sh("ip netns add " + a + " && ip netns add " + b + " && ip -n " + a +
               " link add eth0 type veth peer name eth0 netns " + b + " && ip netns exec " + b +
               " sysctl -qw net.ipv6.conf.eth0.accept_ra=2 && ip -n " + a +
               " link set eth0 up && ip -n " + b + " link set eth0 up"),
            0);
  ASSERT_EQ(PrepareSender(a, "eth0"), 0);
  // Sent until taken: the listener ignores advertisements until its link-local address is up.
  std::string learned;
  for (int i = 0; i < 20 && learned.find("fe80::1") == std::string::npos; ++i) {
    ASSERT_EQ(SendRa(a, "eth0"), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    learned = Out("ip -n " + b + " -6 route show default");
  }
  ASSERT_NE(learned.find("via fe80::1"), std::string::npos)
      << "the control namespace did not take the advertisement: the sender does not work";

  // A sandbox: its link has IPv6 off at both ends and ignores advertisements...
  const std::string id = CreateSandbox(R"({"network": {"mode": "allowlist", "allow": ["x.test"]}})");
  ASSERT_FALSE(id.empty());
  const std::string ns = Out("ls /run/netns | grep '^airlock-" + daemon_->network_id() + "-'");
  ASSERT_FALSE(ns.empty());
  const std::string netns = ns.substr(0, ns.find('\n'));
  const std::string veth = "al" + daemon_->network_id() + "-" + netns.substr(netns.rfind('-') + 1);
  Reply r = daemon_->Call(
      http::verb::post, "/v1/sandboxes/" + id + "/exec",
      json{{"cmd", "cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6 "
                   "/proc/sys/net/ipv6/conf/eth0/accept_ra /proc/sys/net/ipv6/conf/all/accept_ra; "
                   "echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6 && echo WROTE"}}
          .dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["stdout"], "1\n0\n0\n") << r.body;
  EXPECT_EQ(Out("cat /proc/sys/net/ipv6/conf/" + veth + "/disable_ipv6"), "1\n");
  EXPECT_EQ(Out("cat /proc/sys/net/ipv6/conf/" + veth + "/accept_ra"), "0\n");

  // ...so the same advertisement, sent from the sandbox's namespace, reaches nothing: no route
  // through the sandbox's link and no new default route on the host. (The whole table is not
  // compared: tests running beside this one add routes of their own.)
  const std::string host_defaults = Out("ip -6 route show default");
  EXPECT_EQ(Out("ip -6 route show dev " + veth), "");
  ASSERT_EQ(PrepareSender(netns, "eth0"), 0);
  ASSERT_EQ(SendRa(netns, "eth0"), 0);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_EQ(Out("ip -6 route show dev " + veth), "");
  EXPECT_EQ(Out("ip -6 route show default"), host_defaults);
  EXPECT_EQ(Out("ip -6 addr show dev " + veth), "");
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204);
}

}  // namespace
