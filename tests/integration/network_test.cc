// Sandbox networking end to end (docs/design/network.md; SECURITY.md, "Egress tests"): a real
// airlockd with its firewall, proxy and DNS stubs, sandboxes in allowlist and open mode, and a
// fake internet the test builds itself: a network namespace behind a veth that the daemon uses
// as its uplink, with web sites on 198.18.N.2 and .3 and an authoritative DNS server on the
// host side of that veth that counts every query. Nothing a test sends leaves this machine.
// Needs root, nftables and iproute2; skips otherwise.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "support/airlockd.h"
#include "unit/net/fake_authority.h"

namespace {

using namespace airlock::testing;

// Web sites inside the fake internet: HTTP listeners on ports 80 and 8080 of each address, in
// the fake namespace, answering "site <address> host <Host>" and counting connections.
class FakeSites {
 public:
  FakeSites(const std::string& netns_path, const std::vector<std::string>& addresses) {
    std::promise<bool> ready;
    auto started = ready.get_future();
    thread_ = std::thread([this, netns_path, addresses, &ready] {
      int ns = ::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
      // This thread lives in the fake internet: its sockets are that namespace's.
      if (ns < 0 || ::setns(ns, CLONE_NEWNET) != 0) {
        ready.set_value(false);
        return;
      }
      ::close(ns);
      for (const std::string& a : addresses) {
        for (uint16_t port : {80, 8080}) {
          int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          int one = 1;
          ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
          sockaddr_in addr{};
          addr.sin_family = AF_INET;
          addr.sin_port = htons(port);
          ::inet_pton(AF_INET, a.c_str(), &addr.sin_addr);
          if (::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
              ::listen(s, 64) != 0) {
            ready.set_value(false);
            return;
          }
          listeners_.emplace_back(s, port == 80 ? a : a + ":" + std::to_string(port));
        }
      }
      ready.set_value(true);
      Serve();
    });
    ok_ = started.get();
  }
  ~FakeSites() {
    stop_ = true;
    thread_.join();
    for (auto& [fd, a] : listeners_) ::close(fd);
  }
  bool ok() const { return ok_; }
  // Connections to port 80 of `address` ("ADDRESS:8080" for the other port).
  int hits(const std::string& address) {
    std::lock_guard lock(mu_);
    return hits_[address];
  }

 private:
  void Serve() {
    while (!stop_) {
      std::vector<pollfd> fds;
      for (auto& [fd, a] : listeners_) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!(fds[i].revents & POLLIN)) continue;
        int c = ::accept4(listeners_[i].first, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        {
          std::lock_guard lock(mu_);
          ++hits_[listeners_[i].second];
        }
        std::string request;
        char buf[4096];
        pollfd p{c, POLLIN, 0};
        while (request.find("\r\n\r\n") == std::string::npos && ::poll(&p, 1, 2000) > 0) {
          ssize_t n = ::read(c, buf, sizeof buf);
          if (n <= 0) break;
          request.append(buf, static_cast<size_t>(n));
        }
        std::string host;
        if (size_t at = request.find("\r\nHost: "); at != std::string::npos) {
          host = request.substr(at + 8, request.find("\r\n", at + 8) - at - 8);
        }
        const std::string& where = listeners_[i].second;
        const std::string body = "site " + where.substr(0, where.find(':')) + " host " + host + "\n";
        const std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: " +
                                  std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
                                  body;
        (void)!::write(c, reply.data(), reply.size());
        ::close(c);
      }
    }
  }

  std::vector<std::pair<int, std::string>> listeners_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool ok_ = false;
  std::mutex mu_;
  std::map<std::string, int> hits_;
};

class NetworkTest : public DaemonTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root";
    for (const char* tool : {"/usr/sbin/nft", "/usr/sbin/ip"}) {
      if (::access(tool, X_OK) != 0 && ::access((std::string("/sbin/") + (tool + 10)).c_str(), X_OK) != 0) {
        GTEST_SKIP() << tool << " is not installed (nftables, iproute2)";
      }
    }
    const int n = static_cast<int>(::getpid() % 200) + 20;
    net_ = std::to_string(n);
    fake_ns_ = "airlock-fake-" + net_;
    uplink_ = "alup" + net_;
    host_ip_ = "198.18." + net_ + ".1";
    site_ = "198.18." + net_ + ".2";
    other_site_ = "198.18." + net_ + ".3";
    Sh("ip link del " + uplink_ + " 2>/dev/null; ip netns del " + fake_ns_ + " 2>/dev/null; true");
    ASSERT_EQ(Sh("ip netns add " + fake_ns_ + " && ip link add " + uplink_ +
                 " type veth peer name eth0 netns " + fake_ns_ + " && ip addr add " + host_ip_ +
                 "/24 dev " + uplink_ + " && ip link set " + uplink_ + " up && ip -n " + fake_ns_ +
                 " link set lo up && ip -n " + fake_ns_ + " addr add " + site_ +
                 "/24 dev eth0 && ip -n " + fake_ns_ + " addr add " + other_site_ +
                 "/24 dev eth0 && ip -n " + fake_ns_ + " link set eth0 up && ip -n " + fake_ns_ +
                 " route add default via " + host_ip_),
              0);
    sites_.emplace("/run/netns/" + fake_ns_, std::vector<std::string>{site_, other_site_});
    ASSERT_TRUE(sites_->ok()) << "the fake sites did not start";
    in_addr host{};
    ::inet_pton(AF_INET, host_ip_.c_str(), &host);
    dns_.emplace(host.s_addr);
    dns_->Set("allowed.test", {.a = {site_}});
    dns_->Set("other.test", {.a = {other_site_}});
    dns_->Set("rebind.test", {.a = {"169.254.169.254"}});

    char tmpl[] = "/tmp/airlockd-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    subnet_ = "10.215." + net_ + ".0/24";
    daemon_.emplace(dir_ + "/state", Args());
    id_ = daemon_->network_id();
    ASSERT_TRUE(daemon_->Start());
  }
  void TearDown() override {
    if (keeps_sandboxes_ && daemon_) {
      // Back to a daemon that destroys its sandboxes as it stops: DaemonTest::TearDown starts
      // it on the state dir (it adopts what the other one kept) and stops it.
      if (daemon_->running()) daemon_->Stop(SIGTERM);
      daemon_.emplace(dir_ + "/state", Args());
    }
    DaemonTest::TearDown();
    sites_.reset();
    dns_.reset();
    // The veth first: a namespace's teardown in the kernel comes later, with its names.
    if (!fake_ns_.empty()) {
      Sh("ip link del " + uplink_ + " 2>/dev/null; ip netns del " + fake_ns_ + " 2>/dev/null; true");
    }
  }

  static int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

  // airlockd's flags for this fake internet (after those every test daemon gets).
  std::vector<std::string> Args() const {
    return {"--network-subnet", subnet_, "--network-uplink", uplink_, "--network-dns",
            host_ip_ + ":" + std::to_string(dns_->port()), "--network-warm-links", "4"};
  }
  // Restarts the daemon as one that keeps its sandboxes when it stops (TearDown undoes it),
  // with `extra` flags.
  ::testing::AssertionResult KeepSandboxesAcrossStops(std::vector<std::string> extra = {}) {
    if (daemon_->Stop(SIGTERM) != 0) return ::testing::AssertionFailure() << "stopping airlockd";
    std::vector<std::string> args = Args();
    args.insert(args.end(), {"--on-shutdown", "keep"});
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_.emplace(dir_ + "/state", args);
    keeps_sandboxes_ = true;
    return daemon_->Start();
  }

  std::string Create(const json& network) {
    return CreateSandbox(json{{"network", network}}.dump());
  }
  // Runs `cmd` in the sandbox; its stdout (and the exit code through `code`).
  std::string Run(const std::string& id, const std::string& cmd, int* code = nullptr) {
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                            json{{"cmd", cmd}, {"timeout_seconds", 30}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    const json doc = r.Json();
    if (code) *code = doc.value("exit_code", -1);
    return doc.value("stdout", "");
  }

  bool keeps_sandboxes_ = false;
  std::string id_;  // the daemon's network id
  std::string net_, fake_ns_, uplink_, host_ip_, site_, other_site_, subnet_;
  std::optional<FakeSites> sites_;
  std::optional<airlock::net::testing::FakeAuthority> dns_;
};

TEST_F(NetworkTest, AllowlistReachesOnlyItsNamesThroughTheProxyAndItsDns) {
  const std::string id = Create({{"mode", "allowlist"}, {"allow", {"allowed.test"}}});
  ASSERT_FALSE(id.empty());
  Reply got = daemon_->Call(http::verb::get, "/v1/sandboxes/" + id);
  const json sandbox = got.Json();
  EXPECT_EQ(sandbox["network"]["mode"], "allowlist") << got.body;
  EXPECT_TRUE(sandbox["network"].contains("address")) << got.body;

  // Positive controls: the allowed name resolves, and is reached through the proxy both as a
  // proxy client (HTTP_PROXY is set) and transparently (port 80 is redirected).
  EXPECT_EQ(Run(id, "getent hosts allowed.test | cut -d' ' -f1"), site_ + "\n");
  EXPECT_EQ(Run(id, "curl -s -m 10 http://allowed.test/"), "site " + site_ + " host allowed.test\n");
  EXPECT_EQ(Run(id, "curl -s -m 10 --noproxy '*' http://allowed.test/"),
            "site " + site_ + " host allowed.test\n");
  EXPECT_EQ(sites_->hits(site_), 2);

  // A name not on the list: no answer, and not one query reaches the authority.
  int code = 0;
  Run(id, "getent hosts other.test", &code);
  EXPECT_NE(code, 0);
  for (int i = 0; i < 20; ++i) Run(id, "getent hosts secret-" + std::to_string(i) + ".other.test");
  EXPECT_EQ(dns_->queries_for("other.test"), 0u);
  EXPECT_EQ(dns_->queries(), dns_->queries_for("allowed.test"));
  // Through the proxy it gets a 403 that says why; the site never sees it.
  const std::string denied = Run(id, "curl -s -m 10 -w ' %{http_code}' http://other.test/");
  EXPECT_NE(denied.find("not in this sandbox's allowlist"), std::string::npos) << denied;
  EXPECT_NE(denied.find(" 403"), std::string::npos) << denied;
  // By address, dialled directly: redirected to the proxy, which refuses an address no rule names.
  const std::string direct =
      Run(id, "curl -s -m 10 --noproxy '*' -w ' %{http_code}' http://" + other_site_ + "/");
  EXPECT_NE(direct.find(" 403"), std::string::npos) << direct;
  // The metadata endpoint, in two encodings, and through a name that resolves to it.
  for (const std::string url : {"http://169.254.169.254/", "http://2852039166/"}) {
    const std::string meta = Run(id, "curl -s -m 10 --noproxy '*' -w ' %{http_code}' " + url);
    EXPECT_NE(meta.find(" 403"), std::string::npos) << url << ": " << meta;
  }
  Run(id, "getent hosts rebind.test", &code);
  EXPECT_NE(code, 0) << "an answer that points at the metadata endpoint is not given";
  EXPECT_EQ(sites_->hits(other_site_), 0);
  // Raw and packet sockets are refused; IPv6 has no route; other ports of the sites (8080
  // listens on both) are not reached, by address or by an allowed name.
  const std::string sockets = Run(id, R"(python3 -c '
import socket
out = []
for args in [(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), (socket.AF_PACKET, socket.SOCK_RAW, 0)]:
    try:
        socket.socket(*args); out.append("open")
    except OSError:
        out.append("refused")
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM); s.settimeout(2)
try:
    s.connect(("2001:db8::1", 80)); out.append("v6-open")
except OSError:
    out.append("v6-refused")
for host in ["allowed.test", ")" + site_ + R"(", ")" + other_site_ + R"("]:
    for port in [21, 22, 25, 3306, 5432, 6379, 8080, 8443]:
        c = socket.socket(); c.settimeout(0.5)
        try:
            c.connect((host, port)); out.append("%s:%d-open" % (host, port))
        except OSError:
            pass
print(" ".join(out))')");
  EXPECT_EQ(sockets, "refused refused v6-refused\n");
  EXPECT_EQ(sites_->hits(site_ + ":8080"), 0);
  EXPECT_EQ(sites_->hits(other_site_ + ":8080"), 0);
  // Any other port or protocol goes nowhere: not the site, not the host (the daemon's API).
  const std::string port = std::to_string(daemon_->port());
  Run(id, "timeout 3 bash -c 'exec 3<>/dev/tcp/" + site_ + "/22'", &code);
  EXPECT_NE(code, 0);
  const std::string gateway = Run(id, "ip route | awk '/default/ {print $3}'");
  ASSERT_FALSE(gateway.empty());
  Run(id, "timeout 3 bash -c 'exec 3<>/dev/tcp/" + gateway.substr(0, gateway.size() - 1) + "/" +
              port + "'",
      &code);
  EXPECT_NE(code, 0) << "the daemon's API is out of reach";

  // Every verdict is on record.
  Reply events = daemon_->Call(http::verb::get, "/v1/sandboxes/" + id + "/network/events");
  ASSERT_EQ(events.status, 200) << events.body;
  bool saw_denied = false, saw_allowed = false;
  const json listed = events.Json();
  for (const json& e : listed["events"]) {
    if (e["name"] == "other.test" && e["verdict"] == "denied" && e["kind"] != "dns") saw_denied = true;
    if (e["name"] == "allowed.test" && e["verdict"] == "allowed" && e["kind"] != "dns") saw_allowed = true;
  }
  EXPECT_TRUE(saw_denied && saw_allowed) << events.body;
}

TEST_F(NetworkTest, VerdictsAreStoredAndReadBackInPagesAfterARestart) {
  // The writer's own flushes a minute apart: within the test only the clean stop (and reads)
  // write verdicts.
  ASSERT_TRUE(KeepSandboxesAcrossStops({"--network-events-flush-ms", "60000"}));
  const std::string id = Create({{"mode", "allowlist"}, {"allow", {"allowed.test"}}});
  ASSERT_FALSE(id.empty());
  const std::string events = "/v1/sandboxes/" + id + "/network/events";
  // Allowed (positive control: the site answers) and denied, by the proxy and by the DNS stub.
  EXPECT_EQ(Run(id, "curl -s -m 10 http://allowed.test/"), "site " + site_ + " host allowed.test\n");
  const std::string denied = Run(id, "curl -s -m 10 -w ' %{http_code}' http://other.test/");
  EXPECT_NE(denied.find(" 403"), std::string::npos) << denied;
  int code = 0;
  Run(id, "getent hosts other.test", &code);
  EXPECT_NE(code, 0);
  EXPECT_EQ(Run(id, "getent hosts allowed.test | cut -d' ' -f1"), site_ + "\n");
  EXPECT_EQ(sites_->hits(other_site_), 0);

  // A clean stop right away, nothing read before it: what was queued is written as it stops.
  // The sandbox is kept, and the next start adopts it.
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  ASSERT_TRUE(daemon_->Start());
  ASSERT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).Json()["state"], "running");

  // Every event in one read, then the same in pages of two.
  Reply all = daemon_->Call(http::verb::get, events + "?limit=1000");
  ASSERT_EQ(all.status, 200) << all.body;
  const json whole = all.Json();
  const json& list = whole["events"];
  EXPECT_EQ(whole["has_more"], false);
  EXPECT_EQ(whole["dropped"], 0);
  EXPECT_EQ(whole["trimmed"], 0);
  ASSERT_GE(list.size(), 4u) << all.body;
  EXPECT_EQ(whole["last_seq"], list.back()["seq"]);
  EXPECT_EQ(whole["next_after"], list.back()["seq"]);
  for (size_t i = 0; i < list.size(); ++i) EXPECT_EQ(list[i]["seq"], i + 1) << all.body;
  auto seen = [&](const std::string& name, const std::string& verdict, bool dns) {
    for (const json& e : list) {
      if (e["name"] == name && e["verdict"] == verdict && (e["kind"] == "dns") == dns) return true;
    }
    return false;
  };
  EXPECT_TRUE(seen("allowed.test", "allowed", false)) << all.body;
  EXPECT_TRUE(seen("other.test", "denied", false)) << all.body;
  EXPECT_TRUE(seen("allowed.test", "allowed", true)) << all.body;
  EXPECT_TRUE(seen("other.test", "denied", true)) << all.body;

  json paged = json::array();
  int64_t after = 0;
  for (int pages = 0; pages < 100; ++pages) {
    Reply r = daemon_->Call(http::verb::get, events + "?after=" + std::to_string(after) + "&limit=2");
    ASSERT_EQ(r.status, 200) << r.body;
    const json page = r.Json();
    EXPECT_LE(page["events"].size(), 2u);
    for (const json& e : page["events"]) paged.push_back(e);
    after = page["next_after"].get<int64_t>();
    if (!page["has_more"].get<bool>()) break;
  }
  EXPECT_EQ(paged, list);
  EXPECT_TRUE(daemon_->Call(http::verb::get, events + "?after=" + std::to_string(after))
                  .Json()["events"]
                  .empty());

  // Numbering goes on after the restart: a new verdict comes after the old ones.
  Run(id, "curl -s -m 10 http://other.test/");
  Reply next = daemon_->Call(http::verb::get, events + "?after=" + std::to_string(after));
  const json newer = next.Json();
  ASSERT_FALSE(newer["events"].empty()) << next.body;
  EXPECT_EQ(newer["events"][0]["seq"], after + 1) << next.body;
  EXPECT_EQ(newer["events"][0]["name"], "other.test") << next.body;

  // Bad paging parameters are refused, saying what to change.
  for (const std::string bad : {"?limit=0", "?limit=1001", "?after=-1", "?after=x", "?page=2"}) {
    Reply r = daemon_->Call(http::verb::get, events + bad);
    EXPECT_EQ(r.status, 400) << bad << ": " << r.body;
  }
  // A deleted sandbox's events are gone with it from the API.
  ASSERT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204);
  EXPECT_EQ(daemon_->Call(http::verb::get, events).status, 404);
}

TEST_F(NetworkTest, APolicyChangeTakesEffectAtOnceAndClosesWhatItNoLongerAllows) {
  const std::string id = Create({{"mode", "allowlist"}, {"allow", {"allowed.test", "other.test"}}});
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(Run(id, "curl -s -m 10 http://other.test/"), "site " + other_site_ + " host other.test\n");
  Reply patched = daemon_->Call(http::verb::patch, "/v1/sandboxes/" + id,
                                json{{"network", {{"mode", "allowlist"}, {"allow", {"allowed.test"}}}}}.dump());
  ASSERT_EQ(patched.status, 200) << patched.body;
  EXPECT_EQ(patched.Json()["network"]["allow"], json::array({"allowed.test"}));
  const std::string after = Run(id, "curl -s -m 10 -w ' %{http_code}' http://other.test/");
  EXPECT_NE(after.find(" 403"), std::string::npos) << after;
  EXPECT_EQ(Run(id, "curl -s -m 10 http://allowed.test/"), "site " + site_ + " host allowed.test\n");
  // Mode none cuts it off (nothing it sends gets past the firewall); a policy brings it back.
  ASSERT_EQ(daemon_->Call(http::verb::patch, "/v1/sandboxes/" + id,
                          json{{"network", {{"mode", "none"}}}}.dump())
                .status,
            200);
  const std::string cut = Run(id, "curl -s -m 3 -w ' %{http_code}' http://allowed.test/");
  EXPECT_EQ(cut.find("site "), std::string::npos) << cut;
  ASSERT_EQ(daemon_->Call(http::verb::patch, "/v1/sandboxes/" + id,
                          json{{"network", {{"mode", "allowlist"}, {"allow", {"allowed.test"}}}}}.dump())
                .status,
            200);
  EXPECT_EQ(Run(id, "curl -s -m 10 http://allowed.test/"), "site " + site_ + " host allowed.test\n");
  // A sandbox made without a network keeps none.
  const std::string plain = CreateSandbox();
  Reply refused = daemon_->Call(http::verb::patch, "/v1/sandboxes/" + plain,
                                json{{"network", {{"mode", "open"}}}}.dump());
  EXPECT_EQ(refused.status, 409) << refused.body;
}

TEST_F(NetworkTest, OpenModeGoesOutThroughTheUplinkButNotToOtherSandboxesOrTheHost) {
  const std::string a = Create({{"mode", "open"}});
  const std::string b = Create({{"mode", "open"}});
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  // Positive control: the fake internet, by address (NAT through the uplink) and by name.
  EXPECT_EQ(Run(a, "curl -s -m 10 http://" + other_site_ + "/"),
            "site " + other_site_ + " host " + other_site_ + "\n");
  EXPECT_EQ(Run(a, "curl -s -m 10 http://other.test/"), "site " + other_site_ + " host other.test\n");
  EXPECT_EQ(Run(a, "curl -s -m 10 http://" + other_site_ + ":8080/"),
            "site " + other_site_ + " host " + other_site_ + ":8080\n");
  EXPECT_EQ(sites_->hits(other_site_ + ":8080"), 1) << "the positive control of the port sweep";
  // Another sandbox and the host (the uplink's own address) are out of reach.
  const std::string b_address = daemon_->Call(http::verb::get, "/v1/sandboxes/" + b).Json()["network"]["address"];
  Run(b, "timeout 5 python3 -m http.server 8080 --bind 0.0.0.0 >/dev/null 2>&1 &");
  int code = 0;
  Run(a, "curl -s -m 3 http://" + b_address + ":8080/", &code);
  EXPECT_NE(code, 0) << "sandbox a reached sandbox b";
  Run(a, "timeout 3 bash -c 'exec 3<>/dev/tcp/" + host_ip_ + "/" + std::to_string(dns_->port()) + "'",
      &code);
  EXPECT_NE(code, 0) << "sandbox a reached the host";
  // And a sandbox with mode none has no interface but loopback.
  const std::string none = CreateSandbox();
  EXPECT_EQ(Run(none, "ls /sys/class/net 2>/dev/null || awk 'NR>2 {print $1}' /proc/net/dev | tr -d :"),
            "lo\n");
}

TEST_F(NetworkTest, DestroyAndRestartLeaveNoNamespaceVethOrRule) {
  const std::string id = Create({{"mode", "allowlist"}, {"allow", {"allowed.test"}}});
  ASSERT_FALSE(id.empty());
  // Its slot, from its address: 10.215.N.(4 * slot + 2).
  const std::string address =
      daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).Json()["network"]["address"];
  const int slot = (std::stoi(address.substr(address.rfind('.') + 1)) - 2) / 4;
  const std::string ns = "/run/netns/airlock-" + id_ + "-" + std::to_string(slot);
  const std::string veth = "al" + id_ + "-" + std::to_string(slot);
  EXPECT_TRUE(fs::exists(ns));
  // A crash and a restart: the sandbox is adopted with its network, which still works (through
  // the proxy, whose port it has in HTTP_PROXY, and transparently).
  daemon_->Stop(SIGKILL);
  ASSERT_TRUE(daemon_->Start());
  EXPECT_EQ(Run(id, "curl -s -m 10 --noproxy '*' http://allowed.test/"),
            "site " + site_ + " host allowed.test\n");
  EXPECT_EQ(Run(id, "curl -s -m 10 http://allowed.test/"), "site " + site_ + " host allowed.test\n");
  ASSERT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204);
  // Out of the firewall's set at once; its namespace and veth go in the background.
  EXPECT_NE(Sh("nft list set inet airlock_" + id_ + " allowlist | grep -q '\"" + veth + "\"'"), 0);
  for (int i = 0; i < 100 && (fs::exists(ns) || fs::exists("/sys/class/net/" + veth)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_FALSE(fs::exists(ns));
  EXPECT_FALSE(fs::exists("/sys/class/net/" + veth));
  // A stopped daemon leaves none of its namespaces (the links it made ahead included) and no
  // table.
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  int left = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/run/netns", ec)) {
    if (e.path().filename().string().starts_with("airlock-" + id_ + "-")) ++left;
  }
  EXPECT_EQ(left, 0);
  EXPECT_NE(Sh("nft list table inet airlock_" + id_ + " >/dev/null 2>&1"), 0);
}

}  // namespace
