// Warm pools and template builds with networks, end to end (docs/design/pools.md, "Networks";
// docs/design/templates.md, "A build's network"): a real airlockd whose pooled sandboxes wait
// with a parked link, creates that claim them with a policy (or with none), a restart after a
// SIGKILL, and builds whose steps reach a fake internet the test builds itself
// (tests/support/fake_internet.h). Nothing a test sends leaves this machine.
// Needs root, nftables and iproute2; skips otherwise.

#include <algorithm>
#include <cstdio>
#include <set>
#include <thread>

#include "support/airlockd.h"
#include "support/engines.h"
#include "support/fake_internet.h"

namespace {

using namespace airlock::testing;

// What the jail's resolv.conf says in a sandbox without a network.
constexpr char kNoNetwork[] = "# this sandbox has no network\n";
// The sandbox's network interfaces, one a line (sandboxes have no /sys).
constexpr char kInterfaces[] = "awk 'NR > 2 {print $1}' /proc/net/dev | tr -d :";

class NetworkPoolTest : public DaemonTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root";
    if (std::string missing = FakeInternet::Missing(); !missing.empty()) GTEST_SKIP() << missing;
    if (::access("/usr/sbin/nft", X_OK) != 0 && ::access("/sbin/nft", X_OK) != 0) {
      GTEST_SKIP() << "nft (nftables) is not installed";
    }
    internet_.emplace();
    ASSERT_EQ(internet_->Start(), "");
    site_ = internet_->site;
    other_site_ = internet_->other_site;
    internet_->dns().Set("allowed.test", {.a = {site_}});
    internet_->dns().Set("other.test", {.a = {other_site_}});
    subnet_prefix_ = "10.219." + internet_->net + ".";

    char tmpl[] = "/tmp/airlockd-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    // No links made ahead (the Daemon's default): every namespace of this daemon is a
    // sandbox's, pooled or not.
    std::vector<std::string> args = internet_->DaemonArgs();
    args.insert(args.end(), {"--network-subnet", subnet_prefix_ + "0/24"});
    if (engine_ == "gvisor") args.insert(args.end(), kWithGvisor.begin(), kWithGvisor.end());
    daemon_.emplace(dir_ + "/state", args);
    id_ = daemon_->network_id();
    ASSERT_TRUE(daemon_->Start());
    if (engine_ == "jail") return;
    // A pool is made on its template's engine: a template of the engine's own, with no steps.
    if (const std::string lacks = EngineLacks(*daemon_, engine_, "networking"); !lacks.empty()) {
      GTEST_SKIP() << lacks;
    }
    pool_template_ = "on-" + engine_;
    Reply built = daemon_->Call(http::verb::post, "/v1/templates",
                                json{{"name", pool_template_}, {"engine", engine_}}.dump());
    ASSERT_EQ(built.status, 201) << built.body;
  }
  void TearDown() override {
    DaemonTest::TearDown();
    internet_.reset();
  }

  static int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }
  // The stdout of a host shell command.
  static std::string Capture(const std::string& cmd) {
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
      ::pclose(p);
    }
    return out;
  }

  // The pool template's entry of GET /v1/pools (null when it has none).
  json PoolEntry() {
    Reply r = daemon_->Call(http::verb::get, "/v1/pools");
    EXPECT_EQ(r.status, 200) << r.body;
    const json doc = r.Json();
    for (const json& p : doc["pools"]) {
      if (p["template"] == pool_template_) return p;
    }
    return nullptr;
  }
  void Resize(int size) {
    Reply r = daemon_->Call(http::verb::put, "/v1/pools/" + pool_template_,
                            json{{"size", size}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
  }
  ::testing::AssertionResult WaitReady(int64_t ready) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    json pool;
    while (std::chrono::steady_clock::now() < deadline) {
      pool = PoolEntry();
      if (!pool.is_null() && pool["ready"] == ready) return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return ::testing::AssertionFailure() << "the pool never had " << ready << " ready: " << pool;
  }
  // Every sandbox the engine under test has (pooled ones included).
  std::set<std::string> EngineIds() {
    std::set<std::string> ids;
    std::error_code ec;
    const std::string dir =
        daemon_->state_dir() + (engine_ == "jail" ? "/jail" : "/" + engine_ + "/sandboxes");
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      ids.insert(e.path().filename().string());
    }
    return ids;
  }
  double Metric(const std::string& series) {
    const std::string text = "\n" + daemon_->Call(http::verb::get, "/metrics").body;
    const size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + series.size() + 2));
  }

  // This daemon's network namespaces (/run/netns/airlock-<id>-N), by slot N.
  std::set<int> Namespaces() const {
    std::set<int> slots;
    const std::string prefix = "airlock-" + id_ + "-";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/run/netns", ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with(prefix)) slots.insert(std::stoi(name.substr(prefix.size())));
    }
    return slots;
  }
  // Its host-side veths (al<id>-N), by slot.
  std::set<int> Veths() const {
    std::set<int> slots;
    const std::string prefix = "al" + id_ + "-";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/sys/class/net", ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with(prefix)) slots.insert(std::stoi(name.substr(prefix.size())));
    }
    return slots;
  }
  // The interfaces in the firewall's allowlist and open sets.
  std::string SetMembers() const {
    return Capture("nft list set inet airlock_" + id_ + " allowlist 2>/dev/null | grep -o 'al" +
                   id_ + "-[0-9]*'; nft list set inet airlock_" + id_ +
                   " open 2>/dev/null | grep -o 'al" + id_ + "-[0-9]*'");
  }
  std::string Gateway(int slot) const { return subnet_prefix_ + std::to_string(4 * slot + 1); }
  // A command run on the host inside the namespace of `slot`: the path a sandbox's packets take.
  std::string InNetns(int slot, const std::string& cmd) const {
    return "ip netns exec airlock-" + id_ + "-" + std::to_string(slot) + " " + cmd;
  }

  // A create of the pool's template (network mode none when `network` is null).
  std::string CreateWith(const json& network) {
    json body = {{"template", pool_template_}};
    if (!network.is_null()) body["network"] = network;
    return CreateSandbox(body.dump());
  }
  void Delete(const std::string& id) {
    EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204) << id;
  }
  // Waits until the sandbox's only interface is loopback (its veth is deleted in the
  // background after a claim with mode none).
  std::string WaitLoopbackOnly(const std::string& id) {
    std::string interfaces;
    for (int i = 0; i < 100; ++i) {
      interfaces = Run(id, kInterfaces);
      if (interfaces == "lo\n") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return interfaces;
  }

  // The pool's hits, as /metrics counts them.
  double Hits() {
    return Metric("airlock_pool_claims_total{template=\"" + pool_template_ + "\",result=\"hit\"}");
  }

  std::optional<FakeInternet> internet_;
  std::string id_, site_, other_site_, subnet_prefix_;
  std::string engine_ = "jail";          // the pooled sandboxes' (NetworkPoolEngineTest: each)
  std::string pool_template_ = "base";   // the template whose pool the tests fill
};

// The tests of a pool's claims, once per engine.
class NetworkPoolEngineTest : public NetworkPoolTest,
                              public ::testing::WithParamInterface<std::string> {
 protected:
  NetworkPoolEngineTest() { engine_ = GetParam(); }
};

// Run with SITE GATEWAY PROXY_PORT: TCP to the site's ports 80 and 8080 and to the proxy, then a
// DNS query for allowed.test to the gateway's port 53; prints "open"/"closed" for each
// connection and "answered"/"silent" for the query, on one line.
constexpr char kParkedProbe[] = R"PY(
import socket, sys
site, gateway, proxy = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = []
for host, port in [(site, 80), (site, 8080), (gateway, proxy)]:
    c = socket.socket(); c.settimeout(2)
    try:
        c.connect((host, port)); out.append("open")
    except OSError:
        out.append("closed")
query = bytes.fromhex("123401000001000000000000") + b"\x07allowed\x04test\x00\x00\x01\x00\x01"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
u.sendto(query, (gateway, 53))
try:
    u.recv(512); out.append("answered")
except OSError:
    out.append("silent")
print(" ".join(out))
)PY";

TEST_P(NetworkPoolEngineTest, NetworkedCreatesAreServedFromThePoolEachWithItsOwnPolicy) {
  Resize(2);
  ASSERT_TRUE(WaitReady(2));
  const std::set<std::string> pooled = EngineIds();
  ASSERT_EQ(pooled.size(), 2u);
  // Each pooled sandbox has its link, parked: its veth is in no firewall set.
  EXPECT_EQ(Namespaces().size(), 2u);
  EXPECT_EQ(Veths(), Namespaces());
  EXPECT_EQ(SetMembers(), "");

  const std::string allow = CreateWith({{"mode", "allowlist"}, {"allow", {"allowed.test"}}});
  ASSERT_FALSE(allow.empty());
  EXPECT_TRUE(pooled.contains(allow)) << allow << " did not come from the pool";
  EXPECT_EQ(Hits(), 1);
  const json view = daemon_->Call(http::verb::get, "/v1/sandboxes/" + allow).Json();
  EXPECT_EQ(view["network"]["mode"], "allowlist") << view;
  EXPECT_EQ(view["network"]["allow"], json::array({"allowed.test"})) << view;
  ASSERT_TRUE(view["network"].contains("address")) << view;
  const std::string address = view["network"]["address"];
  EXPECT_TRUE(address.starts_with(subnet_prefix_)) << address;

  // Exactly its policy: the allowed name through the proxy (HTTP_PROXY is in its commands'
  // env) and transparently; another name refused with a 403, never reaching its site, never
  // asked of the DNS authority.
  EXPECT_NE(Run(allow, "echo $HTTP_PROXY"), "\n");
  EXPECT_EQ(Run(allow, "curl -s -m 10 http://allowed.test/"),
            "site " + site_ + " host allowed.test\n");
  EXPECT_EQ(Run(allow, "curl -s -m 10 --noproxy '*' http://allowed.test/"),
            "site " + site_ + " host allowed.test\n");
  EXPECT_EQ(internet_->sites().hits(site_), 2);
  const std::string denied = Run(allow, "curl -s -m 10 -w ' %{http_code}' http://other.test/");
  EXPECT_NE(denied.find("not in this sandbox's allowlist"), std::string::npos) << denied;
  EXPECT_NE(denied.find(" 403"), std::string::npos) << denied;
  const std::string by_address =
      Run(allow, "curl -s -m 10 --noproxy '*' -w ' %{http_code}' http://" + other_site_ + "/");
  EXPECT_NE(by_address.find(" 403"), std::string::npos) << by_address;
  EXPECT_EQ(internet_->sites().hits(other_site_), 0);
  EXPECT_EQ(internet_->dns().queries_for("other.test"), 0u);

  // A second claim, open: it reaches what the first may not, and neither sees the other's
  // policy (nor the first one's proxy settings).
  ASSERT_TRUE(WaitReady(2));
  const std::string open = CreateWith({{"mode", "open"}});
  ASSERT_FALSE(open.empty());
  EXPECT_TRUE(pooled.contains(open)) << open << " did not come from the pool";
  EXPECT_EQ(Hits(), 2);
  EXPECT_EQ(Run(open, "echo ${HTTP_PROXY:-unset}"), "unset\n");
  EXPECT_EQ(Run(open, "curl -s -m 10 http://" + other_site_ + "/"),
            "site " + other_site_ + " host " + other_site_ + "\n");
  EXPECT_EQ(Run(open, "curl -s -m 10 http://other.test/"),
            "site " + other_site_ + " host other.test\n");
  EXPECT_EQ(internet_->sites().hits(other_site_), 2);
  const std::string still = Run(allow, "curl -s -m 10 -w ' %{http_code}' http://other.test/");
  EXPECT_NE(still.find(" 403"), std::string::npos) << still;
  EXPECT_EQ(internet_->sites().hits(other_site_), 2);

  const json pool = PoolEntry();
  EXPECT_EQ(pool["hits"], 2) << pool;
  EXPECT_EQ(pool["misses"], 0) << pool;
  Delete(allow);
  Delete(open);
}

TEST_P(NetworkPoolEngineTest, ANoneClaimFromThePoolHasOnlyLoopbackAndSendsNothing) {
  Resize(1);
  ASSERT_TRUE(WaitReady(1));
  const std::set<std::string> pooled = EngineIds();
  const std::string none = CreateWith(nullptr);
  ASSERT_FALSE(none.empty());
  EXPECT_TRUE(pooled.contains(none)) << none << " did not come from the pool";
  EXPECT_EQ(Hits(), 1);
  // Right after the claim (its veth may not be deleted yet): nothing leaves, by address or by
  // name, and resolv.conf names no server.
  int code = 0;
  Run(none, "curl -s -m 3 --noproxy '*' http://" + site_ + "/", &code);
  EXPECT_NE(code, 0);
  Run(none, "curl -s -m 3 http://allowed.test/", &code);
  EXPECT_NE(code, 0);
  EXPECT_EQ(Run(none, "cat /etc/resolv.conf"), kNoNetwork);
  EXPECT_EQ(internet_->sites().hits(site_), 0);
  EXPECT_EQ(internet_->dns().queries(), 0u);
  // Then it has what a cold sandbox without a network has: loopback only, no network in its
  // view, and none to change.
  EXPECT_EQ(WaitLoopbackOnly(none), "lo\n");
  const json view = daemon_->Call(http::verb::get, "/v1/sandboxes/" + none).Json();
  EXPECT_EQ(view["network"]["mode"], "none") << view;
  EXPECT_FALSE(view["network"].contains("address")) << view;
  Reply patched = daemon_->Call(http::verb::patch, "/v1/sandboxes/" + none,
                                json{{"network", {{"mode", "open"}}}}.dump());
  EXPECT_EQ(patched.status, 409) << patched.body;

  // The positive control: the refilled pool's sandbox, claimed open, reaches the same site.
  ASSERT_TRUE(WaitReady(1));
  const std::string open = CreateWith({{"mode", "open"}});
  ASSERT_FALSE(open.empty());
  EXPECT_EQ(Run(open, "curl -s -m 10 http://" + site_ + "/"),
            "site " + site_ + " host " + site_ + "\n");
  EXPECT_EQ(internet_->sites().hits(site_), 1);
  EXPECT_EQ(Hits(), 2);
  Delete(none);
  Delete(open);
}

TEST_P(NetworkPoolEngineTest, APooledSandboxsLinkSendsNothingUntilAClaimGivesItAPolicy) {
  Resize(1);
  ASSERT_TRUE(WaitReady(1));
  const std::set<int> slots = Namespaces();
  ASSERT_EQ(slots.size(), 1u);
  const int slot = *slots.begin();
  const std::string gateway = Gateway(slot);
  const std::string port = Capture("cat " + daemon_->state_dir() + "/network-proxy-port");
  ASSERT_FALSE(port.empty());
  // From inside its namespace: the site by address (80 and 8080), the DNS stub and the egress
  // proxy on the gateway.
  const std::string tries = std::string("python3 -c '") + kParkedProbe + "' " + site_ + " " +
                            gateway + " " + port.substr(0, port.find('\n'));
  EXPECT_EQ(Capture(InNetns(slot, tries)), "closed closed closed silent\n");
  EXPECT_EQ(internet_->sites().hits(site_), 0);
  EXPECT_EQ(internet_->sites().hits(site_ + ":8080"), 0);
  EXPECT_EQ(internet_->dns().queries(), 0u);

  // The positive control, the same probe once a claim has given the sandbox an allowlist:
  // port 80 is taken by the proxy (redirected), the proxy and the stub answer (the allowed name
  // is resolved upstream); 8080 stays closed, as for any allowlist sandbox.
  const std::string id = CreateWith({{"mode", "allowlist"}, {"allow", {"allowed.test"}}});
  ASSERT_FALSE(id.empty());
  // (The filler may already have made the next pooled sandbox, with a link of its own.)
  EXPECT_TRUE(Namespaces().contains(slot)) << "the claim kept the pooled sandbox's link";
  EXPECT_EQ(Capture(InNetns(slot, tries)), "open closed open answered\n");
  EXPECT_EQ(internet_->dns().queries_for("allowed.test"), 1u);
  EXPECT_EQ(internet_->sites().hits(site_ + ":8080"), 0);
  Delete(id);
}

INSTANTIATE_TEST_SUITE_P(Engines, NetworkPoolEngineTest, ::testing::ValuesIn(EnginesOfThisBuild()),
                         EngineName);

TEST_F(NetworkPoolTest, RestartAfterSigkillAdoptsParkedAndClaimedLinksAndLeavesNothing) {
  Resize(2);
  ASSERT_TRUE(WaitReady(2));
  const std::string allow = CreateWith({{"mode", "allowlist"}, {"allow", {"allowed.test"}}});
  ASSERT_FALSE(allow.empty());
  ASSERT_TRUE(WaitReady(2));
  // Killed right after a claim with mode none: its link may or may not be gone yet (it is
  // taken away after the answer); the next start takes away what is left of it.
  const std::string none = CreateSandbox();
  ASSERT_FALSE(none.empty());
  ASSERT_TRUE(WIFSIGNALED(daemon_->Stop(SIGKILL)));
  ASSERT_TRUE(daemon_->Start());

  // Adopted: the two claimed sandboxes and the pooled one (still parked), and the refill if it
  // was made before the kill.
  EXPECT_GE(Metric(R"(airlock_recovery_sandboxes{outcome="adopted"})"), 3);
  EXPECT_EQ(Metric(R"(airlock_recovery_sandboxes{outcome="orphan_removed"})"), 0);
  ASSERT_TRUE(WaitReady(2));
  for (int i = 0; i < 100 && Namespaces().size() != 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Namespaces().size(), 3u) << "two pooled, one claimed with a network";
  EXPECT_EQ(Veths(), Namespaces());
  const std::string allow_slot = SetMembers();
  EXPECT_EQ(std::count(allow_slot.begin(), allow_slot.end(), '\n'), 1) << allow_slot;
  // The claimed allowlist sandbox works as before (its commands still get HTTP_PROXY); the
  // none one still has loopback only.
  EXPECT_EQ(Run(allow, "curl -s -m 10 http://allowed.test/"),
            "site " + site_ + " host allowed.test\n");
  EXPECT_EQ(Run(none, kInterfaces), "lo\n");
  // A claim from the adopted pool gets its policy.
  const std::string later = CreateWith({{"mode", "allowlist"}, {"allow", {"allowed.test"}}});
  ASSERT_FALSE(later.empty());
  EXPECT_EQ(Run(later, "curl -s -m 10 http://allowed.test/"),
            "site " + site_ + " host allowed.test\n");
  const std::string denied = Run(later, "curl -s -m 10 -w ' %{http_code}' http://other.test/");
  EXPECT_NE(denied.find(" 403"), std::string::npos) << denied;
  EXPECT_EQ(PoolEntry()["hits"], 1);
  EXPECT_EQ(internet_->sites().hits(other_site_), 0);

  // Emptied and stopped: no namespace, veth, set member or table of this daemon is left.
  for (const std::string& id : {allow, none, later}) Delete(id);
  Resize(0);
  ASSERT_TRUE(WaitReady(0));
  for (int i = 0; i < 200 && !(EngineIds().empty() && Namespaces().empty()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(EngineIds().empty());
  EXPECT_EQ(Namespaces(), std::set<int>{});
  EXPECT_EQ(SetMembers(), "");
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  EXPECT_EQ(Namespaces(), std::set<int>{});
  EXPECT_EQ(Veths(), std::set<int>{});
  EXPECT_NE(Sh("nft list table inet airlock_" + id_ + " >/dev/null 2>&1"), 0);
}

// What a start finds of a link no record names (a claim with mode none whose link was being
// taken away when the daemon died) goes, veth included, even while a live process keeps the
// namespace itself alive (as the claimed sandbox does).
TEST_F(NetworkPoolTest, AStartRemovesALinkNoRecordNamesWhileAProcessHoldsItsNamespace) {
  const std::string ns = "airlock-" + id_ + "-40", veth = "al" + id_ + "-40";
  ASSERT_EQ(Sh("ip netns add " + ns + " && ip link add " + veth +
               " type veth peer name eth0 netns " + ns),
            0);
  ChildProcess holder;
  ASSERT_TRUE(holder.Start({"/bin/sh", "-c", "exec ip netns exec " + ns + " sleep 300"}, {}));
  for (int i = 0; i < 100 && Capture("ip netns pids " + ns).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(Capture("ip netns pids " + ns).empty()) << "the namespace has its holder";
  EXPECT_TRUE(fs::exists("/sys/class/net/" + veth));

  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  ASSERT_TRUE(daemon_->Start());
  EXPECT_FALSE(fs::exists("/run/netns/" + ns));
  EXPECT_FALSE(fs::exists("/sys/class/net/" + veth)) << "the veth outlived its namespace's name";
  Sh("ip link del " + veth + " 2>/dev/null; ip netns del " + ns + " 2>/dev/null");
}

// ---- template builds with a network -------------------------------------------------------

TEST_F(NetworkPoolTest, ABuildWithAnAllowlistFetchesInItsStepsAndItsLayerKeepsNoTrace) {
  const json allowlist = {{"mode", "allowlist"}, {"allow", {"allowed.test"}}};
  Reply built =
      daemon_->Call(http::verb::post, "/v1/templates",
                    json{{"name", "fetched"},
                         {"network", allowlist},
                         {"steps",
                          {{{"run",
                             "test -n \"$HTTP_PROXY\" && mkdir -p /opt/data && "
                             "curl -sf -m 10 http://allowed.test/ -o /opt/data/page"}},
                           {{"run",
                             "python3 -c 'import urllib.request as u; "
                             "open(\"/opt/data/page2\", \"wb\").write("
                             "u.urlopen(\"http://allowed.test/\", timeout=10).read())'"}}}}}
                        .dump());
  ASSERT_EQ(built.status, 201) << built.body;
  const json t = built.Json();
  EXPECT_EQ(internet_->sites().hits(site_), 2);
  EXPECT_EQ(t["env_keys"], json::array()) << "the build's proxy settings are not the template's";
  EXPECT_FALSE(t.contains("network")) << t;
  const std::string layer = daemon_->state_dir() + "/layers/" + t["layers"][0].get<std::string>();
  const std::string page = "site " + site_ + " host allowed.test\n";
  EXPECT_EQ(Capture("cat " + layer + "/opt/data/page"), page);
  EXPECT_EQ(Capture("cat " + layer + "/opt/data/page2"), page);
  // No trace of the build's network in the layer: resolv.conf as a build without one has it,
  // and no file names the build's addresses or its proxy.
  EXPECT_EQ(Capture("cat " + layer + "/etc/resolv.conf"), kNoNetwork);
  EXPECT_EQ(Capture("stat -c '%u %a' " + layer + "/etc/resolv.conf"), "0 644\n");
  EXPECT_EQ(Capture("grep -rlF -e '" + subnet_prefix_ + "' -e HTTP_PROXY -e http_proxy " + layer),
            "");

  // The negative of that pair: a build without a network. Its steps reach nothing, and its
  // layer's resolv.conf is the one above.
  Reply offline = daemon_->Call(http::verb::post, "/v1/templates",
                                json{{"name", "offline"},
                                     {"steps",
                                      {{{"run",
                                         "mkdir -p /opt && echo ${HTTP_PROXY:-unset} > /opt/proxy; "
                                         "! curl -s -m 3 --noproxy '*' http://" +
                                             site_ + "/"}}}}}
                                    .dump());
  ASSERT_EQ(offline.status, 201) << offline.body;
  const std::string offline_layer =
      daemon_->state_dir() + "/layers/" + offline.Json()["layers"][0].get<std::string>();
  EXPECT_EQ(Capture("cat " + offline_layer + "/opt/proxy"), "unset\n");
  EXPECT_EQ(Capture("cat " + offline_layer + "/etc/resolv.conf"), kNoNetwork);
  EXPECT_EQ(internet_->sites().hits(site_), 2);

  // A sandbox of the template gets only what its own create asks for: no network, no proxy...
  const std::string plain = CreateSandbox(R"({"template": "fetched"})");
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(Run(plain, "cat /opt/data/page"), page);
  EXPECT_EQ(Run(plain, "cat /etc/resolv.conf"), kNoNetwork);
  EXPECT_EQ(Run(plain, "env | grep -ic proxy"), "0\n");
  EXPECT_EQ(Run(plain, kInterfaces), "lo\n");
  // ... or its own allowlist, with its own gateway and proxy (the positive control of the
  // checks above).
  const std::string networked =
      CreateSandbox(json{{"template", "fetched"}, {"network", allowlist}}.dump());
  ASSERT_FALSE(networked.empty());
  EXPECT_EQ(Run(networked, "env | grep -c '^HTTP_PROXY='"), "1\n");
  EXPECT_EQ(Run(networked, "grep -c '^nameserver " + subnet_prefix_ + "' /etc/resolv.conf"), "1\n");
  EXPECT_EQ(Run(networked, "curl -s -m 10 http://allowed.test/"), page);
  Delete(plain);
  Delete(networked);
}

TEST_F(NetworkPoolTest, ABuildStepThatFetchesADeniedNameFailsTheBuild) {
  Reply built =
      daemon_->Call(http::verb::post, "/v1/templates",
                    json{{"name", "denied"},
                         {"network", {{"mode", "allowlist"}, {"allow", {"allowed.test"}}}},
                         {"steps",
                          {{{"run", "curl -sf -m 10 http://allowed.test/ -o /dev/null"}},
                           {{"run", "curl -sf -m 10 http://other.test/ -o /opt/x"}}}}}
                        .dump());
  EXPECT_EQ(built.status, 409) << built.body;
  const std::string message = built.Json()["error"]["message"];
  EXPECT_NE(message.find("step 2"), std::string::npos) << message;
  EXPECT_NE(message.find("exited 22"), std::string::npos) << message;
  EXPECT_EQ(internet_->sites().hits(site_), 1) << "the positive control, step 1";
  EXPECT_EQ(internet_->sites().hits(other_site_), 0);
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/templates/denied").Json()["state"], "failed");
  EXPECT_TRUE(Listed().empty()) << "the build sandbox is gone";
}

TEST_F(NetworkPoolTest, ANetworkIsRefusedWhereItCannotBeServedBeforeAnythingIsMade) {
  // A malformed policy: the same 400 as a create's, naming the field.
  const json bad = {{"mode", "allowlist"}, {"allow", {"bad..name"}}};
  Reply build = daemon_->Call(http::verb::post, "/v1/templates",
                              json{{"name", "bad"}, {"network", bad}}.dump());
  Reply create = daemon_->Call(http::verb::post, "/v1/sandboxes", json{{"network", bad}}.dump());
  EXPECT_EQ(build.status, 400) << build.body;
  EXPECT_EQ(create.status, 400) << create.body;
  EXPECT_EQ(build.Json()["error"]["message"], create.Json()["error"]["message"]);
  EXPECT_NE(build.body.find("network.allow[0]"), std::string::npos) << build.body;
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/templates/bad").status, 404);

  // A daemon whose networking could not be set up (here: a subnet it refuses) refuses a
  // networked build (streamed or not) and a networked create, and claims nothing for them.
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  daemon_.emplace(dir_ + "/second", std::vector<std::string>{"--network-subnet", "10.0.0.0/8"});
  ASSERT_TRUE(daemon_->Start());
  Daemon& offline = *daemon_;
  EXPECT_NE(offline.Log().find("sandbox networking is off"), std::string::npos) << offline.Log();
  const json allowlist = {{"mode", "allowlist"}, {"allow", {"allowed.test"}}};
  for (bool stream : {false, true}) {
    Reply refused =
        offline.Call(http::verb::post, "/v1/templates",
                     json{{"name", "netbuild"}, {"network", allowlist}, {"stream", stream}}.dump());
    EXPECT_EQ(refused.status, 501) << refused.body;
    EXPECT_NE(refused.body.find("no sandbox networking"), std::string::npos) << refused.body;
    EXPECT_EQ(offline.Call(http::verb::get, "/v1/templates/netbuild").status, 404);
  }
  ASSERT_EQ(offline.Call(http::verb::put, "/v1/pools/base", R"({"size": 1})").status, 200);
  for (int i = 0; i < 3000; ++i) {
    const json pools = offline.Call(http::verb::get, "/v1/pools").Json();
    if (pools["pools"][0]["ready"] == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Reply networked =
      offline.Call(http::verb::post, "/v1/sandboxes", json{{"network", allowlist}}.dump());
  EXPECT_EQ(networked.status, 501) << networked.body;
  json pool = offline.Call(http::verb::get, "/v1/pools").Json()["pools"][0];
  EXPECT_EQ(pool["ready"], 1) << pool;
  EXPECT_EQ(pool["hits"], 0) << pool;
  EXPECT_EQ(pool["misses"], 0) << pool;
  // The positive control: a build and a create without a network work there, the create from
  // its pool (whose sandboxes have no link at all).
  Reply plain_build = offline.Call(http::verb::post, "/v1/templates",
                                   json{{"name", "plain"}, {"steps", {{{"run", "true"}}}}}.dump());
  EXPECT_EQ(plain_build.status, 201) << plain_build.body;
  Reply plain = offline.Call(http::verb::post, "/v1/sandboxes", "{}");
  ASSERT_EQ(plain.status, 201) << plain.body;
  pool = offline.Call(http::verb::get, "/v1/pools").Json()["pools"][0];
  EXPECT_EQ(pool["hits"], 1) << pool;
  EXPECT_EQ(
      offline.Call(http::verb::delete_, "/v1/sandboxes/" + plain.Json()["id"].get<std::string>())
          .status,
      204);
}

}  // namespace
