// A network namespace as the uplink (docs/design/network.md, "A network namespace as the
// uplink"), end to end with a real airlockd: the test builds a fake internet (sites and a DNS
// authority in namespace airlock-finet-N) reachable only from an uplink namespace of its own
// (airlock-fupl-N, veth up0 198.19.N.1), and gives the daemon `--network-uplink
// netns:airlock-fupl-N`. The host has no way there: the test puts an `unreachable` route for
// 198.19.N.0/24 in the host's main table, so nothing can leave the machine through the host's
// own network even if the daemon got it wrong, and checks that the host indeed gets nowhere.
// Needs root, nftables and iproute2; skips otherwise.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <thread>

#include "net/networks.h"
#include "support/airlockd.h"
#include "support/engines.h"
#include "support/fake_internet.h"

namespace {

using namespace airlock::testing;
using airlock::net::Networks;

// The output of a shell command (stdout and stderr).
std::string Output(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  ::pclose(p);
  return out;
}

int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

// Runs `f` on a thread of its own inside the network namespace at /run/netns/`ns`.
template <typename F>
void InNetns(const std::string& ns, F f) {
  std::thread([&] {
    int fd = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) std::abort();
    ::close(fd);
    f();
  }).join();
}

class NetworkUplinkTest : public DaemonTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root";
    if (std::string missing = FakeInternet::Missing(); !missing.empty()) GTEST_SKIP() << missing;
    if (::access("/usr/sbin/nft", X_OK) != 0 && ::access("/sbin/nft", X_OK) != 0) {
      GTEST_SKIP() << "nft (nftables) is not installed";
    }
    net_ = std::to_string(TestSlot() + 20);
    inet_ = "airlock-finet-" + net_;
    upl_ = "airlock-fupl-" + net_;
    prefix_ = "198.19." + net_ + ".";
    uplink_ip_ = prefix_ + "1";
    site_ = prefix_ + "2";
    other_site_ = prefix_ + "3";
    subnet_ = "10.216." + net_ + ".0/24";
    RemoveTopology();  // what a killed run with the same N left
    made_ = true;
    ASSERT_EQ(Sh("ip route add unreachable " + prefix_ + "0/24"), 0);
    ASSERT_EQ(Sh("ip netns add " + inet_ + " && ip netns add " + upl_ + " && ip -n " + upl_ +
                 " link add up0 type veth peer name eth0 netns " + inet_ + " && ip -n " + upl_ +
                 " link set lo up && ip -n " + upl_ + " addr add " + uplink_ip_ +
                 "/24 dev up0 && ip -n " + upl_ + " link set up0 up && ip -n " + inet_ +
                 " link set lo up && ip -n " + inet_ + " addr add " + site_ +
                 "/24 dev eth0 && ip -n " + inet_ + " addr add " + other_site_ +
                 "/24 dev eth0 && ip -n " + inet_ + " link set eth0 up"),
              0);
    // A new namespace takes its IPv4 settings from the host's: the uplink starts not forwarding,
    // so that the daemon's stop can be seen to put that back.
    ASSERT_EQ(Sh("ip netns exec " + upl_ + " sysctl -qw net.ipv4.ip_forward=0"), 0);
    sites_.emplace("/run/netns/" + inet_, std::vector<std::string>{site_, other_site_});
    ASSERT_TRUE(sites_->ok());
    // The DNS authority lives in the fake internet too: only the uplink reaches it.
    InNetns(inet_, [&] {
      in_addr a{};
      ::inet_pton(AF_INET, site_.c_str(), &a);
      dns_.emplace(a.s_addr);
    });
    dns_->Set("allowed.test", {.a = {site_}});
    dns_->Set("other.test", {.a = {other_site_}});
    DaemonTest::SetUp();
    if (daemon_) id_ = daemon_->network_id();
  }
  void TearDown() override {
    DaemonTest::TearDown();
    dns_.reset();
    sites_.reset();
    if (made_) RemoveTopology();
  }
  std::vector<std::string> DaemonArgs() const override {
    std::vector<std::string> args = {"--network-uplink", "netns:" + upl_,
                                     "--network-dns",    site_ + ":" + std::to_string(dns_->port()),
                                     "--network-subnet", subnet_};
    if (engine_ == "gvisor") args.insert(args.end(), kWithGvisor.begin(), kWithGvisor.end());
    return args;
  }

  void RemoveTopology() {
    // The daemon's own leftovers if it was killed last (its stop removes them otherwise).
    if (!id_.empty()) {
      const std::string table = std::to_string(Networks::RouteTable(id_));
      Sh("ip link del " + Networks::TransitName(id_) +
         " 2>/dev/null; for i in 1 2 3 4; do ip rule "
         "del lookup " +
         table + " 2>/dev/null; done; ip route flush table " + table +
         " 2>/dev/null; rm -f /run/airlock/network-" + id_ + ".uplink-ip-forward");
    }
    Sh("ip -n " + upl_ + " link del up0 2>/dev/null; ip netns del " + inet_ +
       " 2>/dev/null; ip netns del " + upl_ + " 2>/dev/null; ip route del unreachable " + prefix_ +
       "0/24 2>/dev/null; true");
  }

  std::string Create(const json& network) {
    return CreateSandbox(json{{"network", network}, {"engine", engine_}}.dump());
  }
  // What the daemon added for its uplink, counted: the host's transit veth, the policy rule,
  // routes in its table, the nftables table and the veth's end in the uplink namespace.
  struct Plumbing {
    int veth = 0, rules = 0, routes = 0, tables = 0, peers = 0;
    std::string forward;  // the uplink namespace's net.ipv4.ip_forward
  };
  Plumbing Look() {
    const std::string table = std::to_string(Networks::RouteTable(id_));
    auto count = [](const std::string& cmd) { return std::atoi(Output(cmd).c_str()); };
    Plumbing p;
    p.veth = count("ip -o link show | grep -c ': " + Networks::TransitName(id_) + "[@:]'");
    p.rules = count("ip rule show | grep -c 'lookup " + table + "'");
    p.routes = count("ip route show table " + table + " | grep -c .");
    p.tables =
        count("ip netns exec " + upl_ + " nft list tables | grep -c 'inet airlock_" + id_ + "$'");
    p.peers = count("ip -n " + upl_ +
                    " -o link show | grep -c ': " + Networks::TransitPeerName(id_) + "[@:]'");
    p.forward = Output("ip netns exec " + upl_ + " cat /proc/sys/net/ipv4/ip_forward");
    return p;
  }

  std::string engine_ = "jail";  // the sandboxes' (NetworkUplinkEngineTest: each engine)
  std::string id_, net_, inet_, upl_, prefix_, uplink_ip_, site_, other_site_, subnet_;
  bool made_ = false;
  std::optional<FakeSites> sites_;
  std::optional<airlock::net::testing::FakeAuthority> dns_;
};

TEST_F(NetworkUplinkTest, TheHostCannotReachTheFakeInternetButTheUplinkCan) {
  // The topology's positive control: from the uplink namespace the site answers...
  EXPECT_EQ(Output("ip netns exec " + upl_ + " curl -s -m 5 http://" + site_ + "/"),
            "site " + site_ + " host " + site_ + "\n");
  EXPECT_EQ(sites_->last_client(site_), uplink_ip_);
  // ...from the host it does not (and nothing went out: the route is unreachable, not a gateway).
  const int hits = sites_->hits(site_);
  EXPECT_NE(Sh("curl -s -m 3 -o /dev/null http://" + site_ + "/"), 0);
  EXPECT_NE(Output("ip route get " + site_).find("No route to host"), std::string::npos);
  EXPECT_EQ(sites_->hits(site_), hits);
}

// What a sandbox sends goes out through the uplink namespace whatever its engine.
class NetworkUplinkEngineTest : public NetworkUplinkTest,
                                public ::testing::WithParamInterface<std::string> {
 protected:
  NetworkUplinkEngineTest() { engine_ = GetParam(); }
  void SetUp() override {
    NetworkUplinkTest::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    if (const std::string lacks = EngineLacks(*daemon_, engine_, "networking"); !lacks.empty()) {
      GTEST_SKIP() << lacks;
    }
  }
};

TEST_P(NetworkUplinkEngineTest, AllowlistProxyAndDnsGoOutThroughTheUplinkNamespace) {
  const std::string id = Create({{"mode", "allowlist"}, {"allow", {"allowed.test"}}});
  ASSERT_FALSE(id.empty());
  // DNS: the authority is reachable only through the uplink namespace.
  EXPECT_EQ(Run(id, "getent hosts allowed.test | cut -d' ' -f1"), site_ + "\n");
  EXPECT_GE(dns_->queries_for("allowed.test"), 1u);
  // The proxy, explicitly and transparently; the site sees the uplink namespace's address.
  EXPECT_EQ(Run(id, "curl -s -m 10 http://allowed.test/"),
            "site " + site_ + " host allowed.test\n");
  EXPECT_EQ(sites_->last_client(site_), uplink_ip_);
  EXPECT_EQ(Run(id, "curl -s -m 10 --noproxy '*' http://allowed.test/"),
            "site " + site_ + " host allowed.test\n");
  EXPECT_EQ(sites_->hits(site_), 2);
  // A name it does not list: refused by the proxy, never resolved or dialled.
  EXPECT_EQ(Run(id, "curl -s -m 10 -o /dev/null -w '%{http_code}' http://other.test/"), "403");
  int code = 0;
  Run(id, "getent hosts other.test", &code);
  EXPECT_NE(code, 0);
  EXPECT_EQ(dns_->queries_for("other.test"), 0u);
  EXPECT_EQ(sites_->hits(other_site_), 0);
  // The uplink namespace's own address is no destination either (its proxy dials from there).
  EXPECT_EQ(Run(id, "curl -s -m 10 -o /dev/null -w '%{http_code}' http://" + uplink_ip_ + "/"),
            "403");
}

TEST_P(NetworkUplinkEngineTest, OpenModeLeavesFromTheUplinkNamespaceOnly) {
  const std::string a = Create({{"mode", "open"}});
  const std::string b = Create({{"mode", "open"}});
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  // Positive controls: the site by address and by name, masqueraded in the uplink namespace.
  EXPECT_EQ(Run(a, "curl -s -m 10 http://" + site_ + "/"),
            "site " + site_ + " host " + site_ + "\n");
  EXPECT_EQ(sites_->last_client(site_), uplink_ip_);
  EXPECT_EQ(Run(a, "curl -s -m 10 http://other.test:8080/"),
            "site " + other_site_ + " host other.test:8080\n");
  EXPECT_EQ(sites_->last_client(other_site_ + ":8080"), uplink_ip_);

  // A listener in the uplink namespace itself: the fake internet reaches it (the control), an
  // open sandbox does not.
  int listener = -1;
  uint16_t port = 0;
  InNetns(upl_, [&] {
    listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    ::inet_pton(AF_INET, uplink_ip_.c_str(), &addr.sin_addr);
    socklen_t len = sizeof addr;
    if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(listener, 16) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      std::abort();
    }
    port = ntohs(addr.sin_port);
  });
  const std::string tcp = "/dev/tcp/" + uplink_ip_ + "/" + std::to_string(port);
  EXPECT_EQ(Sh("ip netns exec " + inet_ + " timeout 3 bash -c 'exec 3<>" + tcp + "'"), 0);
  int code = 0;
  Run(a, "timeout 3 bash -c 'exec 3<>" + tcp + "'", &code);
  EXPECT_NE(code, 0) << "an open sandbox reached the uplink namespace itself";
  ::close(listener);

  // Another sandbox, the host's end of the transit link, the metadata address: out of reach.
  const std::string b_address =
      daemon_->Call(http::verb::get, "/v1/sandboxes/" + b).Json()["network"]["address"];
  Run(b, "timeout 6 python3 -m http.server 8080 --bind 0.0.0.0 >/dev/null 2>&1 &");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Run(a, "curl -s -m 3 http://" + b_address + ":8080/", &code);
  EXPECT_NE(code, 0) << "sandbox a reached sandbox b";
  Run(b, "curl -s -m 3 http://127.0.0.1:8080/ >/dev/null", &code);
  EXPECT_EQ(code, 0) << "the positive control: b's server runs";
  const std::string transit_host = "10.216." + net_ + ".253";
  EXPECT_NE(Output("ip -o addr show " + Networks::TransitName(id_)).find(transit_host + "/30"),
            std::string::npos);
  Run(a,
      "timeout 3 bash -c 'exec 3<>/dev/tcp/" + transit_host + "/" +
          std::to_string(daemon_->port()) + "'",
      &code);
  EXPECT_NE(code, 0) << "an open sandbox reached the host";
  Run(a, "curl -s -m 3 http://169.254.169.254/", &code);
  EXPECT_NE(code, 0) << "an open sandbox reached the metadata address";
}

INSTANTIATE_TEST_SUITE_P(Engines, NetworkUplinkEngineTest,
                         ::testing::ValuesIn(EnginesOfThisBuild()), EngineName);

TEST_F(NetworkUplinkTest, ItsPlumbingGoesAtStopAndIsNotDoubledAfterAKill) {
  Plumbing p = Look();
  EXPECT_EQ(p.veth, 1);
  EXPECT_EQ(p.rules, 1);
  EXPECT_EQ(p.routes, 2);  // the default into the namespace, and the subnet thrown back
  EXPECT_EQ(p.tables, 1);
  EXPECT_EQ(p.peers, 1);
  EXPECT_EQ(p.forward, "1\n");
  // A kill leaves it all; the next start replaces it, one of each still.
  daemon_->Stop(SIGKILL);
  p = Look();
  EXPECT_EQ(p.veth, 1);
  EXPECT_EQ(p.rules, 1);
  ASSERT_TRUE(daemon_->Start());
  p = Look();
  EXPECT_EQ(p.veth, 1);
  EXPECT_EQ(p.rules, 1);
  EXPECT_EQ(p.routes, 2);
  EXPECT_EQ(p.tables, 1);
  EXPECT_EQ(p.peers, 1);
  // And it works after the restart.
  const std::string id = Create({{"mode", "open"}});
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(Run(id, "curl -s -m 10 http://" + site_ + "/"),
            "site " + site_ + " host " + site_ + "\n");
  // A clean stop removes everything, and the namespace forwards no more (it did not before).
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  p = Look();
  EXPECT_EQ(p.veth, 0);
  EXPECT_EQ(p.rules, 0);
  EXPECT_EQ(p.routes, 0);
  EXPECT_EQ(p.tables, 0);
  EXPECT_EQ(p.peers, 0);
  EXPECT_EQ(p.forward, "0\n");
}

// A namespace uplink that is not there, or a file that is not one: airlockd stops at once with a
// message naming the setting.
TEST(NetworkUplinkConfigTest, AMissingOrWrongNamespaceStopsTheDaemon) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root";
  char tmpl[] = "/tmp/airlockd-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string missing = "airlock-no-such-" + std::to_string(::getpid());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"netns:" + missing, "/run/netns/" + missing},
      {"/etc/hostname", "is not a namespace"},
      {"/proc/self/ns/uts", "not a network namespace"},
      {"/proc/self/ns/net", "own network namespace"},
  };
  for (const auto& [uplink, says] : cases) {
    Daemon daemon(dir + "/state", {"--network-uplink", uplink});
    EXPECT_FALSE(daemon.Start()) << uplink;
    const int status = daemon.Stop(SIGKILL, std::chrono::seconds(10));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << uplink << ": " << status;
    const std::string log = daemon.Log();
    EXPECT_NE(log.find("network_uplink"), std::string::npos) << log;
    EXPECT_NE(log.find(says), std::string::npos) << log;
    std::filesystem::remove(dir + "/state.log");
  }
  // The positive control: another network namespace, by its path, is taken.
  const std::string ns = "airlock-cfg-" + std::to_string(::getpid());
  ASSERT_EQ(Sh("ip netns add " + ns), 0);
  {
    Daemon daemon(dir + "/state", {"--network-uplink", "/run/netns/" + ns});
    EXPECT_TRUE(daemon.Start());
    EXPECT_EQ(daemon.Stop(SIGTERM), 0);
  }
  Sh("ip netns del " + ns);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
