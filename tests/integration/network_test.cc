// Sandbox networking end to end (docs/design/network.md; SECURITY.md, "Egress tests"): a real
// airlockd with its firewall, proxy and DNS stubs, sandboxes in allowlist and open mode, and a
// fake internet the test builds itself (tests/support/fake_internet.h): a network namespace
// behind a veth that the daemon uses as its uplink, with web sites on 198.18.N.2 and .3 and an
// authoritative DNS server on the host side of that veth that counts every query. Nothing a test
// sends leaves this machine.
// Needs root, nftables and iproute2; skips otherwise.

#include <sstream>
#include <thread>

#include "support/airlockd.h"
#include "support/engines.h"
#include "support/fake_internet.h"

namespace {

using namespace airlock::testing;

// A client that tries one thing per argument and prints one line for each (run inside a
// sandbox with python3 from the host's /usr):
//   connect HOST:PORT [SNI]   CONNECT through the proxy (HTTP_PROXY); on 200, a ClientHello
//                             naming SNI. "STATUS", or "200 <the site's answer>" / "200 closed"
//   tls ADDRESS PORT SNI      a ClientHello naming SNI, straight to ADDRESS (redirected to the
//                             proxy): "<the site's answer>" or "closed"
//   http ADDRESS PORT TARGET HOST   "GET TARGET" with that Host ("-": none); ADDRESS "proxy"
//                             is the proxy's. "STATUS <the body>"
// The ClientHello is made by hand (TLS 1.2 record, one cipher suite, only the SNI extension):
// the sites on port 443 speak no TLS, they report the first byte they got.
constexpr char kProbe[] = R"PY(
import os, socket, struct, sys

def hello(name):
    sni = name.encode()
    ext = struct.pack("!HHHBH", 0, len(sni) + 5, len(sni) + 3, 0, len(sni)) + sni
    body = (b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00" +
            struct.pack("!H", len(ext)) + ext)
    hs = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(hs)) + hs

def read_all(s):
    out = b""
    try:
        while True:
            got = s.recv(65536)
            if not got:
                break
            out += got
    except OSError:
        pass
    return out.decode("latin-1").strip() or "closed"

def proxy():
    rest = os.environ["HTTP_PROXY"].split("//")[1].rstrip("/")
    host, port = rest.rsplit(":", 1)
    return host, int(port)

def dial(address, port):
    s = socket.create_connection(proxy() if address == "proxy" else (address, int(port)), 10)
    s.settimeout(10)
    return s

def run(args):
    if args[0] == "connect":
        s = dial("proxy", 0)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (args[1], args[1])).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            got = s.recv(1)
            if not got:
                break
            head += got
        status = head.split(b" ")[1].decode() if head.count(b" ") else "closed"
        if status != "200" or len(args) < 3:
            return status
        s.sendall(hello(args[2]))
        return "200 " + read_all(s)
    if args[0] == "tls":
        s = dial(args[1], args[2])
        s.sendall(hello(args[3]))
        return read_all(s)
    s = dial(args[1], args[2])
    host = "" if args[4] == "-" else "Host: %s\r\n" % args[4]
    s.sendall(("GET %s HTTP/1.1\r\n%sConnection: close\r\n\r\n" % (args[3], host)).encode())
    reply = read_all(s)
    if not reply.startswith("HTTP/1.1 "):
        return reply
    return reply[9:12] + " " + reply.split("\r\n\r\n", 1)[-1].strip()

for arg in sys.argv[1:]:
    try:
        print(run(arg.split(" ")))
    except OSError as e:
        print("error " + type(e).__name__)
)PY";

// Each test runs once per engine of this build that has networking: the same rules must hold
// whichever stack sends the packets (the host's kernel for the jail, gVisor's Sentry).
class NetworkTest : public DaemonTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root";
    for (const char* tool : {"/usr/sbin/nft", "/usr/sbin/ip"}) {
      if (::access(tool, X_OK) != 0 && ::access((std::string("/sbin/") + (tool + 10)).c_str(), X_OK) != 0) {
        GTEST_SKIP() << tool << " is not installed (nftables, iproute2)";
      }
    }
    internet_.emplace();
    const std::string made = internet_->Start();
    ASSERT_EQ(made, "");
    net_ = internet_->net;
    host_ip_ = internet_->host_ip;
    site_ = internet_->site;
    other_site_ = internet_->other_site;
    sites_ = &internet_->sites();
    dns_ = &internet_->dns();
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
    if (const std::string lacks = EngineLacks(*daemon_, GetParam(), "networking"); !lacks.empty()) {
      GTEST_SKIP() << lacks;
    }
  }
  void TearDown() override {
    if (keeps_sandboxes_ && daemon_) {
      // Back to a daemon that destroys its sandboxes as it stops: DaemonTest::TearDown starts
      // it on the state dir (it adopts what the other one kept) and stops it.
      if (daemon_->running()) daemon_->Stop(SIGTERM);
      daemon_.emplace(dir_ + "/state", Args());
    }
    DaemonTest::TearDown();
    internet_.reset();
  }

  static int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

  // airlockd's flags for this fake internet (after those every test daemon gets).
  std::vector<std::string> Args() const {
    std::vector<std::string> args = internet_->DaemonArgs();
    args.insert(args.end(), {"--network-subnet", subnet_, "--network-warm-links", "4"});
    if (GetParam() == "gvisor") args.insert(args.end(), kWithGvisor.begin(), kWithGvisor.end());
    return args;
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
    return CreateSandbox(json{{"network", network}, {"engine", GetParam()}}.dump());
  }

  bool keeps_sandboxes_ = false;

  // Runs the probe (kProbe) in the sandbox with `tries`, one line of output each.
  std::vector<std::string> Probe(const std::string& id, const std::vector<std::string>& tries) {
    std::string cmd = "cat > /tmp/probe.py <<'EOF'\n" + std::string(kProbe) + "EOF\npython3 /tmp/probe.py";
    for (const std::string& t : tries) cmd += " '" + t + "'";
    std::vector<std::string> lines;
    std::istringstream out(Run(id, cmd));
    for (std::string line; std::getline(out, line);) lines.push_back(line);
    EXPECT_EQ(lines.size(), tries.size()) << "the probe printed less than it should";
    lines.resize(tries.size());
    return lines;
  }

  std::string id_;  // the daemon's network id
  std::string net_, host_ip_, site_, other_site_, subnet_;
  std::optional<FakeInternet> internet_;
  FakeSites* sites_ = nullptr;
  airlock::net::testing::FakeAuthority* dns_ = nullptr;
};

TEST_P(NetworkTest, AllowlistReachesOnlyItsNamesThroughTheProxyAndItsDns) {
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
  // The gateway, where the proxy listens (from HTTP_PROXY: gVisor's kernel has no route table
  // for `ip route` to show).
  const std::string gateway = Run(id, "echo \"$HTTP_PROXY\" | sed -E 's|^[a-z]+://([^:/]+).*|\\1|'");
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

TEST_P(NetworkTest, VerdictsAreStoredAndReadBackInPagesAfterARestart) {
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
  // /metrics counts the verdicts this daemon took: at least the denied one just made.
  const std::string metrics = daemon_->Call(http::verb::get, "/metrics").body;
  EXPECT_NE(metrics.find("\nairlock_network_verdicts_total{verdict=\"denied\"} "), std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("\nairlock_network_verdicts_total{verdict=\"denied\"} 0\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("\nairlock_network_verdicts_dropped_total 0\n"), std::string::npos)
      << metrics;

  // A deleted sandbox's verdicts stay readable (an audit comes after the work) while the
  // sandbox itself is gone, until its record is purged (destroyed_keep after the destroy).
  ASSERT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204);
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).Json()["state"], "destroyed");
  Reply kept = daemon_->Call(http::verb::get, events + "?limit=1000");
  ASSERT_EQ(kept.status, 200) << kept.body;
  EXPECT_EQ(kept.Json()["events"].size(), list.size() + newer["events"].size()) << kept.body;
  ASSERT_TRUE(KeepSandboxesAcrossStops({"--destroyed-keep", "1s"}));
  int status = 200;
  for (int i = 0; i < 300 && status == 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    status = daemon_->Call(http::verb::get, events).status;
  }
  EXPECT_EQ(status, 404) << "the record was not purged within 30 s";
  EXPECT_EQ(daemon_->Call(http::verb::get, "/metrics").body.find("\nairlock_records_purged_total 0\n"),
            std::string::npos);
}

TEST_P(NetworkTest, APolicyChangeTakesEffectAtOnceAndClosesWhatItNoLongerAllows) {
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
  const std::string plain = CreateSandbox(json{{"engine", GetParam()}}.dump());
  Reply refused = daemon_->Call(http::verb::patch, "/v1/sandboxes/" + plain,
                                json{{"network", {{"mode", "open"}}}}.dump());
  EXPECT_EQ(refused.status, 409) << refused.body;
}

TEST_P(NetworkTest, OpenModeGoesOutThroughTheUplinkButNotToOtherSandboxesOrTheHost) {
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
  const std::string none = CreateSandbox(json{{"engine", GetParam()}}.dump());
  EXPECT_EQ(Run(none, "ls /sys/class/net 2>/dev/null || awk 'NR>2 {print $1}' /proc/net/dev | tr -d :"),
            "lo\n");
}

// The sandbox's eth0, its addresses, routes and shaping are the host's to set: root in the
// sandbox changes none of them (on the jail it has no capability in a namespace of the host's
// user namespace; on gVisor the Sentry answers these requests itself and sends none to the host).
TEST_P(NetworkTest, RootInTheSandboxCannotChangeItsInterfaceRoutesOrShaping) {
  const std::string id = Create({{"mode", "open"}});
  ASSERT_FALSE(id.empty());
  const std::string address =
      daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).Json()["network"]["address"];
  const int slot = (std::stoi(address.substr(address.rfind('.') + 1)) - 2) / 4;
  const std::string ns = "airlock-" + id_ + "-" + std::to_string(slot);
  auto host_view = [&] {
    return RunProcess({"/bin/sh", "-c",
                       "ip -n " + ns + " -o addr show dev eth0; ip -n " + ns + " route; ip -n " +
                           ns + " -o link show; tc -n " + ns + " qdisc show dev eth0"},
                      {{"PATH", "/usr/sbin:/usr/bin:/sbin:/bin"}})
        .out;
  };
  const std::string before = host_view();
  // Positive control: the host's view names the sandbox's address and its shaping.
  EXPECT_NE(before.find(address + "/"), std::string::npos) << before;
  EXPECT_NE(before.find("tbf"), std::string::npos) << before;
  for (const std::string cmd :
       {"ip addr add 10.99.0.9/32 dev eth0", "ip addr flush dev eth0",
        "ip route add 198.18.0.0/15 dev eth0", "ip route del default",
        "ip link set eth0 down", "ip link set eth0 address 02:00:00:00:00:99",
        "ip link add airlockx type dummy", "tc qdisc del dev eth0 root",
        "tc qdisc replace dev eth0 root pfifo"}) {
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                            json{{"cmd", cmd}, {"user", "root"}, {"timeout_seconds", 30}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_NE(r.Json()["exit_code"], 0) << cmd << ": " << r.body;
  }
  EXPECT_EQ(host_view(), before);
  // And the network still works as it did.
  EXPECT_EQ(Run(id, "curl -s -m 10 http://" + other_site_ + "/"),
            "site " + other_site_ + " host " + other_site_ + "\n");
}

// No engine here can save a sandbox with a network to disk (the jail has no memory checkpoints;
// gVisor's host networking cannot be saved): the hibernate is refused with why, and the sandbox
// and its network go on.
TEST_P(NetworkTest, AHibernateOfANetworkedSandboxIsRefusedAndItsNetworkGoesOn) {
  const std::string id = Create({{"mode", "allowlist"}, {"allow", {"allowed.test"}}});
  ASSERT_FALSE(id.empty());
  Reply refused = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/pause",
                                R"({"memory": true})");
  EXPECT_EQ(refused.status, 409) << refused.body;
  EXPECT_NE(refused.body.find(GetParam() == "gvisor" ? "network" : "memory_checkpoint"),
            std::string::npos)
      << refused.body;
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).Json()["state"], "running");
  EXPECT_EQ(Run(id, "curl -s -m 10 http://allowed.test/"), "site " + site_ + " host allowed.test\n");
  // Nor is a sandbox made to hibernate when idle: refused at the create, naming what is missing.
  Reply create = daemon_->Call(
      http::verb::post, "/v1/sandboxes",
      json{{"engine", GetParam()},
           {"auto_hibernate_seconds", 60},
           {"network", {{"mode", "allowlist"}, {"allow", {"allowed.test"}}}}}
          .dump());
  EXPECT_EQ(create.status, 409) << create.body;
  EXPECT_NE(create.body.find(GetParam() == "gvisor" ? "memory_checkpoint_network"
                                                    : "memory_checkpoint"),
            std::string::npos)
      << create.body;
}

TEST_P(NetworkTest, DestroyAndRestartLeaveNoNamespaceVethOrRule) {
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

// CONNECT is judged by the name and the port it names: an allowed site's address, or its name
// on a port the rule does not list, is refused before anything is dialled.
TEST_P(NetworkTest, ConnectToAnAllowedSitesAddressOrAnotherPortIsRefused) {
  const std::string id = Create({{"mode", "allowlist"}, {"allow", {"allowed.test:443"}}});
  ASSERT_FALSE(id.empty());
  const std::vector<std::string> got =
      Probe(id, {"connect allowed.test:443 allowed.test", "connect " + site_ + ":443 allowed.test",
                 "connect allowed.test:8080", "connect allowed.test:80", "connect " + site_ + ":8080"});
  EXPECT_EQ(got[0], "200 site " + site_ + " tls 22") << "the positive control";
  EXPECT_EQ(got[1], "403") << "CONNECT to the allowed site's address";
  EXPECT_EQ(got[2], "403") << "CONNECT to the allowed name on a port the rule does not list";
  EXPECT_EQ(got[3], "403");
  EXPECT_EQ(got[4], "403");
  EXPECT_EQ(sites_->hits(site_ + ":443"), 1);
  EXPECT_EQ(sites_->hits(site_ + ":8080"), 0);
  EXPECT_EQ(sites_->hits(site_), 0);
  // An address is reached through CONNECT when a rule names it (with its port): the refusal
  // above is the policy's, not a CONNECT that cannot work.
  const std::string by_address = Create({{"mode", "allowlist"}, {"allow", {site_ + ":443"}}});
  ASSERT_FALSE(by_address.empty());
  EXPECT_EQ(Probe(by_address, {"connect " + site_ + ":443 allowed.test", "connect " + site_ + ":8080"}),
            (std::vector<std::string>{"200 site " + site_ + " tls 22", "403"}));
  EXPECT_EQ(sites_->hits(site_ + ":443"), 2);
  EXPECT_EQ(sites_->hits(site_ + ":8080"), 0);
}

// The name a TLS client sends (SNI) must be the one judged: in a CONNECT tunnel it must be the
// CONNECT host, and a transparent connection goes where the SNI or Host names, never to the
// address the client dialled. Absolute-form requests through the proxy port must agree with
// their Host header.
TEST_P(NetworkTest, ServerNameAndHostAreJudgedNotTheAddressDialled) {
  const std::string id = Create({{"mode", "allowlist"}, {"allow", {"allowed.test"}}});
  ASSERT_FALSE(id.empty());
  const std::string reached = "site " + site_ + " tls 22";
  const std::vector<std::string> tls = Probe(
      id, {"connect allowed.test:443 allowed.test", "connect allowed.test:443 other.test",
           "connect other.test:443 allowed.test", "tls " + site_ + " 443 allowed.test",
           "tls " + site_ + " 443 other.test", "tls " + other_site_ + " 443 allowed.test",
           "tls " + other_site_ + " 443 other.test"});
  EXPECT_EQ(tls[0], "200 " + reached) << "the positive control";
  EXPECT_EQ(tls[1], "200 closed") << "SNI other.test in a tunnel to allowed.test";
  EXPECT_EQ(tls[2], "403") << "a tunnel to other.test, with SNI allowed.test";
  EXPECT_EQ(tls[3], reached) << "transparent TLS, the positive control";
  EXPECT_EQ(tls[4], "closed") << "transparent TLS naming other.test at the allowed site's address";
  EXPECT_EQ(tls[5], reached) << "the proxy dials allowed.test's address, not the one dialled";
  EXPECT_EQ(tls[6], "closed");
  // The tunnel of tls[1] was dialled (the CONNECT host is allowed) but got not one byte.
  EXPECT_EQ(sites_->received(site_ + ":443"), 3);
  EXPECT_EQ(sites_->hits(other_site_ + ":443"), 0);

  const std::string allowed = "200 site " + site_ + " host allowed.test";
  const std::vector<std::string> http = Probe(
      id, {"http " + site_ + " 80 / allowed.test", "http " + site_ + " 80 / other.test",
           "http " + other_site_ + " 80 / allowed.test", "http " + site_ + " 80 / allowed.test:8080",
           "http proxy 0 http://allowed.test/ allowed.test", "http proxy 0 http://other.test/ other.test",
           "http proxy 0 http://other.test/ allowed.test", "http proxy 0 http://allowed.test/ other.test",
           "http proxy 0 http://" + other_site_ + "/ -", "http proxy 0 http://other.test@allowed.test/ -",
           "http proxy 0 / allowed.test"});
  EXPECT_EQ(http[0], allowed) << "transparent HTTP, the positive control";
  EXPECT_TRUE(http[1].starts_with("403 ")) << "Host other.test at the allowed site's address: " << http[1];
  EXPECT_EQ(http[2], allowed) << "Host allowed.test at the other site's address goes to allowed.test";
  EXPECT_TRUE(http[3].starts_with("403 ")) << "a port in Host that differs from the one dialled: " << http[3];
  EXPECT_EQ(http[4], allowed) << "absolute-form through the proxy port, the positive control";
  EXPECT_TRUE(http[5].starts_with("403 ") && http[5].find("not in this sandbox's allowlist") != std::string::npos)
      << http[5];
  EXPECT_TRUE(http[6].starts_with("403 ")) << "a denied URL with an allowed Host: " << http[6];
  EXPECT_TRUE(http[7].starts_with("403 ")) << "an allowed URL with a denied Host: " << http[7];
  EXPECT_TRUE(http[8].starts_with("403 ")) << "a denied address as the URL: " << http[8];
  EXPECT_TRUE(http[9].starts_with("400 ")) << "user information in the URL: " << http[9];
  EXPECT_TRUE(http[10].starts_with("400 ")) << "origin-form to the proxy port: " << http[10];
  EXPECT_EQ(sites_->hits(site_), 3);
  EXPECT_EQ(sites_->hits(site_ + ":8080"), 0);
  EXPECT_EQ(sites_->hits(other_site_), 0);
}

// Names that look like an allowed one are other names; the allowed name in upper case or with
// a trailing dot is the same name, and a deny rule holds for every spelling of its name.
TEST_P(NetworkTest, LookAlikeNamesAreJudgedAsTheNamesTheyAre) {
  const std::vector<std::string> look_alikes = {"allowed.test.evil", "xallowed.test", "allowed.testx",
                                                "zone.test", "bad.zone.test", "BAD.ZONE.TEST",
                                                "bad.zone.test.", "Bad.Zone.Test."};
  // They resolve to the other site: a look-alike let through would show there.
  const std::vector<std::string> resolvable = {"allowed.test.evil", "xallowed.test",
                                               "allowed.testx", "zone.test", "bad.zone.test"};
  for (const std::string& name : resolvable) dns_->Set(name, {.a = {other_site_}});
  dns_->Set("good.zone.test", {.a = {site_}});
  const std::string id = Create({{"mode", "allowlist"},
                                 {"allow", {"allowed.test", "*.zone.test"}},
                                 {"deny", {"bad.zone.test"}}});
  ASSERT_FALSE(id.empty());
  // The daemon looks up the one name its rules deny itself, to deny its addresses too (at create,
  // then when the answer's TTL runs out): that query comes from the policy, none of those below
  // from the sandbox.
  std::map<std::string, size_t> at_create;
  for (const std::string& name : resolvable) at_create[name] = dns_->queries_for(name);
  EXPECT_GT(at_create["bad.zone.test"], 0u);
  const std::vector<std::string> same = {"allowed.test", "ALLOWED.TEST", "allowed.test.",
                                         "good.zone.test", "GOOD.Zone.test."};
  std::vector<std::string> tries;
  for (const auto& names : {same, look_alikes}) {
    for (const std::string& name : names) {
      tries.push_back("http proxy 0 http://" + name + "/ -");
      tries.push_back("http " + other_site_ + " 80 / " + name);
      tries.push_back("tls " + other_site_ + " 443 " + name);
      tries.push_back("connect " + name + ":443 " + name);
    }
  }
  const std::vector<std::string> got = Probe(id, tries);
  for (size_t i = 0; i < got.size(); ++i) {
    const bool allowed = i < 4 * same.size();
    std::string want;
    switch (i % 4) {
      case 0:
      case 1:
        want = allowed ? "200 site " + site_ + " host " : "403 ";
        break;
      case 2:
        want = allowed ? "site " + site_ + " tls 22" : "closed";
        break;
      case 3:
        want = allowed ? "200 site " + site_ + " tls 22" : "403";
        break;
    }
    EXPECT_TRUE(got[i].starts_with(want)) << tries[i] << ": " << got[i];
  }
  EXPECT_EQ(sites_->hits(site_), static_cast<int>(2 * same.size())) << "the positive controls";
  EXPECT_EQ(sites_->received(site_ + ":443"), static_cast<int>(2 * same.size()));
  EXPECT_EQ(sites_->hits(other_site_), 0);
  EXPECT_EQ(sites_->hits(other_site_ + ":443"), 0);

  // The sandbox's own resolver: the same names resolve, the others are never asked for.
  EXPECT_EQ(Run(id, "getent hosts ALLOWED.TEST | cut -d' ' -f1"), site_ + "\n");
  int code = 0;
  for (const std::string& name : look_alikes) {
    Run(id, "getent hosts " + name, &code);
    EXPECT_NE(code, 0) << name;
  }
  for (const std::string& name : resolvable) {
    EXPECT_EQ(dns_->queries_for(name), at_create[name]) << name;
    if (name != "bad.zone.test") {
      EXPECT_EQ(at_create[name], 0u) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, NetworkTest, ::testing::ValuesIn(EnginesOfThisBuild()),
                         EngineName);

}  // namespace
