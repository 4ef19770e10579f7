// Secrets bound to sandboxes, end to end (docs/design/credentials.md): a real airlockd, real
// sandboxes on each engine, and a fake internet whose HTTPS sites have a CA of their own that the
// daemon is told to trust upstream (--network-upstream-ca). Clients inside the sandbox (curl,
// Python, Node where installed) use the placeholder they were given; the value must reach the
// bound host and nothing else: not the sandbox's environment, files or memory, not another host,
// not an answer, not an event.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "support/airlockd.h"
#include "support/engines.h"
#include "support/fake_https.h"
#include "support/fake_internet.h"

namespace airlock::testing {
namespace {

constexpr std::string_view kValue = "ghp_SANDBOX-NEVER-SEES-THIS-4d2a";
constexpr std::string_view kRotated = "ghp_ROTATED-VALUE-AFTER-PUT-77c1";
constexpr std::string_view kEchoValue = "echo-SECRET-VALUE-81be";

class SandboxSecretsTest : public DaemonTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    if (std::string missing = FakeInternet::Missing(); !missing.empty()) GTEST_SKIP() << missing;
    internet_.emplace();
    ASSERT_EQ(internet_->Start(), "");
    // The HTTPS sites on an address of their own in the fake internet, port 443.
    https_address_ = "198.18." + internet_->net + ".4";
    ASSERT_EQ(std::system(("ip -n " + internet_->ns + " addr add " + https_address_ +
                           "/24 dev eth0")
                              .c_str()),
              0);
    https_.emplace("/run/netns/" + internet_->ns, https_address_, 443,
                   std::map<std::string, FakeHttpsSites::Behaviour>{
                       {"api.test", FakeHttpsSites::Api{std::string(kValue)}},
                       {"echo.test", FakeHttpsSites::Echo{}},
                       {"other.test", FakeHttpsSites::Echo{}}});
    ASSERT_TRUE(https_->ok()) << https_->error();
    for (const char* name : {"api.test", "echo.test", "other.test"}) {
      internet_->dns().Set(name, {.a = {https_address_}});
    }
    char tmpl[] = "/tmp/airlockd-secrets-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all |
                                           std::filesystem::perms::group_exec |
                                           std::filesystem::perms::others_exec);
    std::vector<std::string> args = internet_->DaemonArgs();
    args.insert(args.end(), {"--network-subnet", "10.216." + internet_->net + ".0/24",
                             "--network-upstream-ca", https_->ca_file()});
    if (GetParam() == "gvisor") args.insert(args.end(), kWithGvisor.begin(), kWithGvisor.end());
    args_ = args;
    daemon_.emplace(dir_ + "/state", args);
    ASSERT_TRUE(daemon_->Start());
    if (std::string lacks = EngineLacks(*daemon_, GetParam(), "networking"); !lacks.empty()) {
      GTEST_SKIP() << lacks;
    }
    ASSERT_EQ(Call(http::verb::post, "/v1/secrets",
                   json{{"name", "GH"}, {"value", std::string(kValue)}}.dump())
                  .status,
              201);
    ASSERT_EQ(Call(http::verb::post, "/v1/secrets",
                   json{{"name", "ECHO"}, {"value", std::string(kEchoValue)}}.dump())
                  .status,
              201);
  }
  void TearDown() override {
    if (kept_ && daemon_) {
      // Back to a daemon that destroys its sandboxes as it stops (it adopts what was kept).
      if (daemon_->running()) daemon_->Stop(SIGTERM);
      daemon_.emplace(dir_ + "/state", args_);
    }
    DaemonTest::TearDown();
    https_.reset();
    internet_.reset();
  }

  Reply Call(http::verb method, const std::string& target, const std::string& body = "") {
    return daemon_->Call(method, target, body);
  }
  static json Allowlist() {
    return {{"mode", "allowlist"}, {"allow", {"api.test", "echo.test", "other.test"}}};
  }
  Reply Create(const json& secrets, const json& network = Allowlist()) {
    return Call(http::verb::post, "/v1/sandboxes",
                json{{"engine", GetParam()}, {"network", network}, {"secrets", secrets}}.dump());
  }
  static json GithubBinding() {
    return json::array({{{"name", "GH"}, {"hosts", {"api.test"}}, {"env", "GITHUB_TOKEN"}}});
  }
  // Everything of the sandbox a search can read: its environment as commands get it, every
  // process's environ, and its files. The needle goes in as two halves that the shell joins, so
  // that the search itself never puts it whole into the sandbox.
  // The needle is put together inside one Python process from two halves, so that no command
  // line in the sandbox (which the flight recorder keeps) ever holds it whole.
  std::string Scan(const std::string& id, std::string_view needle) {
    const std::string half(needle.substr(0, needle.size() / 2)), rest(needle.substr(half.size()));
    static constexpr std::string_view kScan = R"(
import glob, os, sys
n = (sys.argv[1] + sys.argv[2]).encode()
print(sum(n in (k + "=" + v).encode() for k, v in os.environ.items()))
def holds(path):
    try:
        with open(path, "rb") as f:
            return n in f.read()
    except OSError:
        return False
print(sum(holds(p) for p in glob.glob("/proc/[0-9]*/environ")))
files = 0
for top in ("/etc", "/tmp", "/root", "/home"):
    for d, _, names in os.walk(top):
        files += sum(holds(os.path.join(d, name)) for name in names)
print(files)
)";
    return Run(id, "python3 -c '" + std::string(kScan) + "' '" + half + "' '" + rest + "'");
  }
  // How many processes of the sandbox (every pid in its cgroups) hold `needle` anywhere in
  // their readable memory, read from the host through /proc/PID/mem.
  static int ProcessesHolding(const std::string& id, std::string_view needle) {
    std::string pids;
    for (const std::string& dir : CgroupsNamed(id)) {
      std::ifstream procs(dir + "/cgroup.procs");
      for (pid_t pid; procs >> pid;) pids += " " + std::to_string(pid);
    }
    // Regions over 1 GiB are reservations (an ASan build's shadow memory), not data: skipped.
    static constexpr std::string_view kScan = R"(
import re, sys
needle, count, piece = sys.argv[1].encode(), 0, 1 << 20
for pid in set(sys.argv[2:]):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", 0)
    except OSError:
        continue
    found = False
    for line in maps:
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
        if not m or found:
            continue
        start, end = int(m.group(1), 16), int(m.group(2), 16)
        if end - start > 1 << 30:
            continue
        tail = b""
        for at in range(start, end, piece):
            try:
                mem.seek(at)
                data = tail + mem.read(min(piece, end - at))
            except (OSError, OverflowError, ValueError):
                break
            if needle in data:
                found = True
                break
            tail = data[-(len(needle) - 1):]
    count += found
print(count)
)";
    const std::string script = "/tmp/airlock-memscan-" + std::to_string(::getpid()) + ".py";
    std::ofstream(script) << kScan;
    std::string out;
    if (FILE* p = ::popen(("python3 " + script + " '" + std::string(needle) + "'" + pids).c_str(),
                          "r")) {
      char buf[64];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
      ::pclose(p);
    }
    std::filesystem::remove(script);
    return out.empty() ? -1 : std::atoi(out.c_str());
  }

  std::optional<FakeInternet> internet_;
  std::optional<FakeHttpsSites> https_;
  std::string https_address_;
  std::vector<std::string> args_;  // the daemon's flags
  bool kept_ = false;              // the daemon keeps its sandboxes as it stops
};

TEST_P(SandboxSecretsTest, TheValueReachesTheBoundHostAndNothingElse) {
  Reply made = Create(GithubBinding());
  ASSERT_EQ(made.status, 201) << made.body;
  const std::string id = made.Json()["id"];
  const json bound = made.Json()["secrets"];
  ASSERT_EQ(bound.size(), 1u) << made.body;
  const std::string placeholder = bound[0]["placeholder"];
  EXPECT_TRUE(placeholder.starts_with("airlock-secret-")) << made.body;
  EXPECT_EQ(Call(http::verb::get, "/v1/sandboxes/" + id).Json()["secrets"], bound);
  // The sandbox has the placeholder, never the value.
  EXPECT_EQ(Run(id, "echo $GITHUB_TOKEN"), placeholder + "\n");
  // curl through the proxy (HTTPS_PROXY), trusting the daemon's CA by CURL_CA_BUNDLE.
  EXPECT_EQ(Run(id, "curl -sS -H \"Authorization: Bearer $GITHUB_TOKEN\" https://api.test/user"),
            "ok api.test");
  // Python's urllib, and basic auth.
  EXPECT_EQ(Run(id, "python3 -c \"import os, urllib.request as u; "
                    "r = u.Request('https://api.test/', headers={'Authorization': "
                    "'Bearer ' + os.environ['GITHUB_TOKEN']}); print(u.urlopen(r).read().decode())\""),
            "ok api.test\n");
  EXPECT_EQ(Run(id, "curl -sS -u \"x-access-token:$GITHUB_TOKEN\" https://api.test/"),
            "ok api.test");
  // Node's fetch dials the host itself (no proxy variables): redirected to the proxy, which
  // intercepts it by its server name. NODE_EXTRA_CA_CERTS makes it trust the daemon's CA.
  if (::access("/usr/bin/node", X_OK) == 0) {
    EXPECT_EQ(Run(id, "node -e \"fetch('https://api.test/', {headers: {Authorization: 'Bearer ' "
                      "+ process.env.GITHUB_TOKEN}}).then(r => r.text()).then(t => "
                      "console.log(t))\""),
              "ok api.test\n");
  } else {
    std::printf("SKIPPED part: Node's fetch (no /usr/bin/node)\n");
  }
  EXPECT_GE(https_->Requests("api.test"), 3);
  // The control: without the placeholder the host refuses.
  EXPECT_EQ(Run(id, "curl -sS https://api.test/"), "bad token");
  // Nowhere in the sandbox, and only at the bound host.
  // Not in the memory of any of its processes (a jail sandbox's are host processes; gVisor's
  // Sentry keeps the sandbox's memory in a file mapping too large to read here). A process that
  // holds the placeholder in its environment is the control.
  if (GetParam() == "jail") {
    Reply held = Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                      json{{"cmd", "sleep 600"}, {"background", true}}.dump());
    ASSERT_EQ(held.status, 200) << held.body;
    EXPECT_EQ(ProcessesHolding(id, kValue), 0);
    EXPECT_GE(ProcessesHolding(id, placeholder), 1) << "the control: the placeholder is found";
  } else {
    std::printf("SKIPPED part: the memory scan on %s (scanned on the jail)\n", GetParam().c_str());
  }
  EXPECT_EQ(Scan(id, kValue), "0\n0\n0\n");
  // The control: the same search finds the placeholder (in the env, and in the environ of the
  // shell that searched).
  const std::string found = Scan(id, placeholder);
  EXPECT_TRUE(found.starts_with("1\n") && !found.starts_with("1\n0\n")) << found;
  EXPECT_FALSE(https_->Seen("echo.test", kValue));
  EXPECT_FALSE(https_->Seen("other.test", kValue));
  // Each use is on record, by name, never with the value.
  Reply events = Call(http::verb::get, "/v1/sandboxes/" + id + "/network/events");
  ASSERT_EQ(events.status, 200) << events.body;
  EXPECT_NE(events.body.find("secret GH injected: GET /user -> 200"), std::string::npos)
      << events.body;
  EXPECT_EQ(events.body.find(kValue), std::string::npos);

  // A fork has the same bindings and placeholders (its files and memory are copies), and its
  // requests get the value put in too.
  Reply fork = Call(http::verb::post, "/v1/sandboxes/" + id + "/fork", "{}");
  ASSERT_EQ(fork.status, 201) << fork.body;
  const std::string forked = fork.Json()["sandboxes"][0]["id"];
  EXPECT_EQ(Call(http::verb::get, "/v1/sandboxes/" + forked).Json()["secrets"], bound);
  EXPECT_EQ(Run(forked, "curl -sS -H \"Authorization: Bearer $GITHUB_TOKEN\" https://api.test/"),
            "ok api.test");
  // A template made of it: the CA files it wrote are in its layer, the value is not.
  ASSERT_EQ(Call(http::verb::post, "/v1/sandboxes/" + id + "/snapshot", R"({"name": "after-secret"})")
                .status,
            201);
  // Nowhere in the daemon's state: records, layers, sandboxes' directories (the secrets table
  // holds it sealed), nor its log.
  const std::string grep = "grep -r -a -l -F -- '" + std::string(kValue) + "' " + dir_ +
                           "/state " + dir_ + "/state.log 2>/dev/null";
  std::string leaked;
  if (FILE* p = ::popen(grep.c_str(), "r")) {
    char buf[512];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) leaked.append(buf, n);
    ::pclose(p);
  }
  EXPECT_EQ(leaked, "");
  // The control: the same search finds the placeholder (in the sandbox's record, at least).
  const std::string control = "grep -r -a -l -F -q -- '" + placeholder + "' " + dir_ + "/state";
  EXPECT_EQ(std::system(control.c_str()), 0);
}

TEST_P(SandboxSecretsTest, APlaceholderGoesNowhereElseAndAnEchoGivesBackNoValue) {
  json secrets = GithubBinding();
  secrets.push_back({{"name", "ECHO"}, {"hosts", {"echo.test"}}, {"env", "ECHO_KEY"}});
  Reply made = Create(secrets);
  ASSERT_EQ(made.status, 201) << made.body;
  const std::string id = made.Json()["id"];
  // GH's placeholder to echo.test (intercepted for ECHO): refused before it leaves.
  int code = 0;
  const std::string refused =
      Run(id, "curl -sS -i -H \"Authorization: Bearer $GITHUB_TOKEN\" https://echo.test/", &code);
  EXPECT_NE(refused.find("403"), std::string::npos) << refused;
  EXPECT_NE(refused.find("secret GH"), std::string::npos) << refused;
  EXPECT_FALSE(https_->Seen("echo.test", made.Json()["secrets"][0]["placeholder"].get<std::string>()));
  // In plain HTTP, to any host: refused.
  const std::string plain =
      Run(id, "curl -sS -i -H \"Authorization: Bearer $GITHUB_TOKEN\" http://other.test/");
  EXPECT_NE(plain.find("plain-HTTP"), std::string::npos) << plain;
  // ECHO's own placeholder to echo.test: the site gets the value, the sandbox only ever sees
  // the placeholder in what comes back (headers and body).
  const std::string echoed = Run(id, "curl -sS -i -H \"X-Key: $ECHO_KEY\" https://echo.test/");
  EXPECT_TRUE(https_->Seen("echo.test", kEchoValue));
  EXPECT_EQ(echoed.find(kEchoValue), std::string::npos) << echoed;
  EXPECT_NE(echoed.find(made.Json()["secrets"][1]["placeholder"].get<std::string>()),
            std::string::npos)
      << echoed;
  // Dialling the host's address directly, without the proxy: nothing answers (allowlist).
  const std::string direct =
      Run(id, "curl -sS --noproxy '*' --max-time 5 -k -o /dev/null -w '%{http_code}' "
              "-H \"X-Key: $ECHO_KEY\" https://" + https_address_ + "/ || true");
  EXPECT_EQ(direct.substr(0, 3), "000") << direct;
  EXPECT_EQ(https_->Requests("api.test") + https_->Requests("other.test"), 0);
}

TEST_P(SandboxSecretsTest, ABindingIsRefusedUnlessItCanOnlyGoWhereItShould) {
  const std::map<std::string, std::pair<json, json>> refused = {
      {"mode \\\"allowlist\\\"",
       {GithubBinding(), json{{"mode", "none"}}}},
      {"not allowed on port 443",
       {json::array({{{"name", "GH"}, {"hosts", {"elsewhere.test"}}}}), Allowlist()}},
      {"secrets[0].name",
       {json::array({{{"name", "NOPE"}, {"hosts", {"api.test"}}}}), Allowlist()}},
      {"is an address",
       {json::array({{{"name", "GH"}, {"hosts", {https_address_}}}}), Allowlist()}},
  };
  for (const auto& [want, request] : refused) {
    Reply r = Create(request.first, request.second);
    EXPECT_EQ(r.status, 400) << want << ": " << r.body;
    EXPECT_NE(r.body.find(want), std::string::npos) << r.body;
    EXPECT_EQ(r.body.find(kValue), std::string::npos);
  }
  // Another tenant's secret of that name cannot be bound by this one.
  ASSERT_EQ(Call(http::verb::post, "/v1/secrets?tenant=team-b",
                 json{{"name", "TEAM_B_ONLY"}, {"value", "team-b-value"}}.dump())
                .status,
            201);
  Reply other = Create(json::array({{{"name", "TEAM_B_ONLY"}, {"hosts", {"api.test"}}}}));
  EXPECT_EQ(other.status, 400) << other.body;
  // Nothing was left of the refused creates; the control is made.
  Reply listed = Call(http::verb::get, "/v1/sandboxes");
  EXPECT_EQ(listed.Json()["sandboxes"].size(), 0u) << listed.body;
  EXPECT_EQ(Create(GithubBinding()).status, 201);
}

TEST_P(SandboxSecretsTest, PatchRebindsAndAPutRotatesFromTheNextRequest) {
  Reply made = Create(json::array());
  ASSERT_EQ(made.status, 201) << made.body;
  const std::string id = made.Json()["id"];
  EXPECT_EQ(Run(id, "echo ${GITHUB_TOKEN:-unset}"), "unset\n");
  // Bound by a PATCH: the next command has the variable, the CA is trusted, the value goes in.
  Reply patched = Call(http::verb::patch, "/v1/sandboxes/" + id,
                       json{{"secrets", GithubBinding()}}.dump());
  ASSERT_EQ(patched.status, 200) << patched.body;
  const std::string placeholder = patched.Json()["secrets"][0]["placeholder"];
  EXPECT_EQ(Run(id, "echo $GITHUB_TOKEN"), placeholder + "\n");
  EXPECT_EQ(Run(id, "curl -sS -H \"Authorization: Bearer $GITHUB_TOKEN\" https://api.test/"),
            "ok api.test");
  // A PATCH of the network alone keeps the bindings and their placeholders.
  Reply network = Call(http::verb::patch, "/v1/sandboxes/" + id,
                       json{{"network", Allowlist()}}.dump());
  ASSERT_EQ(network.status, 200) << network.body;
  EXPECT_EQ(network.Json()["secrets"][0]["placeholder"], placeholder);
  // A network that no longer lets the value reach its host is refused, nothing changed.
  Reply narrowed = Call(http::verb::patch, "/v1/sandboxes/" + id,
                        json{{"network", {{"mode", "allowlist"}, {"allow", {"echo.test"}}}}}.dump());
  EXPECT_EQ(narrowed.status, 400) << narrowed.body;
  // Rotated: the next request carries the new value (the site now wants it).
  ASSERT_EQ(Call(http::verb::put, "/v1/secrets/GH", json{{"value", std::string(kRotated)}}.dump())
                .status,
            200);
  EXPECT_EQ(Run(id, "curl -sS -H \"Authorization: Bearer $GITHUB_TOKEN\" https://api.test/"),
            "bad token");
  EXPECT_TRUE(https_->Seen("api.test", kRotated));
  // Unbound: the variable is gone and the placeholder goes nowhere.
  ASSERT_EQ(Call(http::verb::patch, "/v1/sandboxes/" + id, R"({"secrets": []})").status, 200);
  EXPECT_EQ(Run(id, "echo ${GITHUB_TOKEN:-unset}"), "unset\n");
}

TEST_P(SandboxSecretsTest, ARestartedDaemonKeepsTheBindingsAndTheirPlaceholders) {
  // A daemon that keeps its sandboxes as it stops; the next one adopts them.
  std::vector<std::string> keep = args_;
  keep.insert(keep.end(), {"--on-shutdown", "keep"});
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  daemon_.emplace(dir_ + "/state", keep);
  kept_ = true;
  ASSERT_TRUE(daemon_->Start());
  Reply made = Create(GithubBinding());
  ASSERT_EQ(made.status, 201) << made.body;
  const std::string id = made.Json()["id"];
  const std::string placeholder = made.Json()["secrets"][0]["placeholder"];
  // The same daemon object started again: a new one would remove the namespaces as it went.
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  ASSERT_TRUE(daemon_->Start());
  Reply adopted = Call(http::verb::get, "/v1/sandboxes/" + id);
  EXPECT_EQ(adopted.Json()["state"], "running") << adopted.body;
  EXPECT_EQ(adopted.Json()["secrets"][0]["placeholder"], placeholder);
  EXPECT_EQ(Run(id, "echo $GITHUB_TOKEN"), placeholder + "\n");
  EXPECT_EQ(Run(id, "curl -sS -H \"Authorization: Bearer $GITHUB_TOKEN\" https://api.test/"),
            "ok api.test");
  EXPECT_EQ(Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204);
}

TEST_P(SandboxSecretsTest, AClaimedPooledSandboxGetsTheBindings) {
  const std::string name = "pool-" + GetParam();
  ASSERT_EQ(Call(http::verb::post, "/v1/templates",
                 json{{"name", name}, {"engine", GetParam()}}.dump())
                .status,
            201);
  ASSERT_EQ(Call(http::verb::put, "/v1/pools/" + name, R"({"size": 1})").status, 200);
  auto pool = [&] {
    const json pools = Call(http::verb::get, "/v1/pools").Json();
    for (const json& p : pools["pools"]) {
      if (p["template"] == name) return p;
    }
    return json::object();
  };
  for (int i = 0; i < 3000 && pool().value("ready", 0) < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(pool().value("ready", 0), 1) << pool();
  Reply made = Call(http::verb::post, "/v1/sandboxes",
                    json{{"template", name}, {"engine", GetParam()}, {"network", Allowlist()},
                         {"secrets", GithubBinding()}}
                        .dump());
  ASSERT_EQ(made.status, 201) << made.body;
  EXPECT_EQ(pool().value("hits", 0), 1) << "the create was not served from the pool: " << pool();
  const std::string id = made.Json()["id"];
  EXPECT_EQ(Run(id, "echo $GITHUB_TOKEN"),
            made.Json()["secrets"][0]["placeholder"].get<std::string>() + "\n");
  EXPECT_EQ(Run(id, "curl -sS -H \"Authorization: Bearer $GITHUB_TOKEN\" https://api.test/"),
            "ok api.test");
  ASSERT_EQ(Call(http::verb::put, "/v1/pools/" + name, R"({"size": 0})").status, 200);
}

INSTANTIATE_TEST_SUITE_P(Engines, SandboxSecretsTest, ::testing::ValuesIn(EnginesOfThisBuild()),
                         EngineName);

}  // namespace
}  // namespace airlock::testing
