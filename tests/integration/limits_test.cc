// Limits that fit (docs/design/tenancy.md "Quotas", docs/design/jail.md "Limits seen from
// inside") end to end on a real airlockd: tenant quotas (each kind, the 429's body, a race for
// the last place, who may see and set them), live limit changes (PATCH "limits") and what a
// sandbox sees of its own CPUs and memory, on every engine.

#include <unistd.h>

#include <future>
#include <regex>
#include <thread>

#include "support/airlockd.h"
#include "support/engines.h"

namespace {

using namespace airlock::testing;

class LimitsTest : public DaemonTest {
 protected:
  std::vector<std::string> DaemonArgs() const override { return kWithGvisor; }

  // A new key of `tenant`; "" (with a failure) if the create failed.
  std::string MakeKey(const std::string& name, const std::string& tenant) {
    Reply r = daemon_->Call(http::verb::post, "/v1/keys",
                            json{{"name", name}, {"tenant", tenant}}.dump());
    EXPECT_EQ(r.status, 201) << r.body;
    if (r.status != 201) return "";
    return r.Json()["key"].get<std::string>();
  }
  Reply As(const std::string& key, http::verb verb, const std::string& target,
           const std::string& body = "") {
    return Http(daemon_->port(), verb, target, body, "Bearer " + key);
  }
  // Sets `tenant`'s quota as the admin; the answer must be 200.
  void SetQuota(const std::string& tenant, const json& quota) {
    Reply r = daemon_->Call(http::verb::put, "/v1/tenants/" + tenant + "/quota", quota.dump());
    ASSERT_EQ(r.status, 200) << r.body;
  }
  // The create's answer; its id goes to `made` when it made one.
  Reply Create(const std::string& key, const json& body, std::vector<std::string>* made = nullptr) {
    Reply r = As(key, http::verb::post, "/v1/sandboxes", body.dump());
    if (r.status == 201 && made) made->push_back(r.Json()["id"].get<std::string>());
    return r;
  }
  // The message of a 429; fails the test unless the answer is one.
  std::string Refusal(const Reply& r) {
    EXPECT_EQ(r.status, 429) << r.body;
    if (r.status != 429) return "";
    EXPECT_EQ(r.Json()["error"]["code"], "resource_exhausted") << r.body;
    return r.Json()["error"]["message"].get<std::string>();
  }
  json Tenant(const std::string& key, const std::string& tenant) {
    Reply r = As(key, http::verb::get, "/v1/tenants/" + tenant);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.Json() : json();
  }
  // The output of `cmd` run as `user` in `id`, with its exit code.
  std::string RunAs(const std::string& id, const std::string& cmd, const std::string& user,
                    int* code = nullptr) {
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                            json{{"cmd", cmd}, {"user", user}, {"timeout_seconds", 60}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    if (code) *code = r.Json().value("exit_code", -1);
    return r.Json().value("stdout", "") + r.Json().value("stderr", "");
  }
  Reply Patch(const std::string& id, const json& body) {
    return daemon_->Call(http::verb::patch, "/v1/sandboxes/" + id, body.dump());
  }
};

// --- Quotas --------------------------------------------------------------------------------

TEST_F(LimitsTest, ASandboxesQuotaRefusesTheOneTooManyAndFreesAPlaceOnDestroy) {
  const std::string a = MakeKey("alice", "team-a"), b = MakeKey("bob", "team-b");
  SetQuota("team-a", {{"sandboxes", 1}});
  std::vector<std::string> made;
  ASSERT_EQ(Create(a, json::object(), &made).status, 201);
  EXPECT_EQ(Refusal(Create(a, json::object(), &made)),
            "tenant team-a: sandboxes 1 in use + 1 asked > quota 1");
  // Positive control: another tenant, without a quota, is not held back.
  ASSERT_EQ(Create(b, json::object(), &made).status, 201);
  ASSERT_EQ(Create(b, json::object(), &made).status, 201);
  // A destroyed sandbox no longer counts.
  ASSERT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + made[0]).status, 204);
  EXPECT_EQ(Create(a, json::object(), &made).status, 201);
  // The admin removes the quota: nothing holds team-a back any more.
  ASSERT_EQ(daemon_->Call(http::verb::delete_, "/v1/tenants/team-a/quota").status, 204);
  EXPECT_EQ(Create(a, json::object(), &made).status, 201);
}

TEST_F(LimitsTest, MemoryCpuAndDiskQuotasSumTheLimitsOfTheTenantsSandboxes) {
  const std::string a = MakeKey("alice", "team-a");
  SetQuota("team-a", {{"memory_mb", 1024}, {"cpus", 1.5}, {"disk_mb", 3072}});
  ASSERT_EQ(Create(a, {{"memory_mb", 512}, {"cpus", 1}}).status, 201);
  EXPECT_EQ(Refusal(Create(a, {{"memory_mb", 768}, {"cpus", 0.5}})),
            "tenant team-a: memory 512 MiB in use + 768 asked > quota 1024 MiB");
  EXPECT_EQ(Refusal(Create(a, {{"memory_mb", 256}, {"cpus", 1}})),
            "tenant team-a: cpus 1 in use + 1 asked > quota 1.5");
  // One sandbox of the default disk (1024 MiB) in use.
  EXPECT_EQ(Refusal(Create(a, {{"memory_mb", 16}, {"cpus", 0.25}, {"disk_mb", 2049}})),
            "tenant team-a: disk 1024 MiB in use + 2049 asked > quota 3072 MiB");
  ASSERT_EQ(Create(a, {{"memory_mb", 256}, {"cpus", 0.5}}).status, 201);
  // The cpus are all taken now.
  EXPECT_EQ(Refusal(Create(a, {{"memory_mb", 16}, {"cpus", 0.1}})),
            "tenant team-a: cpus 1.5 in use + 0.1 asked > quota 1.5");
  // What the tenant uses, as it sees it.
  const json shown = Tenant(a, "team-a");
  EXPECT_EQ(shown["name"], "team-a");
  EXPECT_EQ(shown["usage"]["sandboxes"], 2) << shown;
  EXPECT_DOUBLE_EQ(shown["usage"]["cpus"].get<double>(), 1.5) << shown;
  EXPECT_EQ(shown["usage"]["memory_mb"], 768) << shown;
  EXPECT_EQ(shown["usage"]["disk_mb"], 2048) << shown;
  EXPECT_EQ(shown["quota"]["memory_mb"], 1024) << shown;
  EXPECT_EQ(shown["quota"]["sandboxes"], 0) << shown;  // unlimited
}

TEST_F(LimitsTest, CreatesPerMinuteCountCreatesNotSandboxes) {
  const std::string a = MakeKey("alice", "team-a");
  SetQuota("team-a", {{"creates_per_minute", 2}});
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> made;
    ASSERT_EQ(Create(a, json::object(), &made).status, 201);
    ASSERT_EQ(As(a, http::verb::delete_, "/v1/sandboxes/" + made[0]).status, 204);
  }
  // None is left, but two were made within the minute.
  EXPECT_EQ(Refusal(Create(a, json::object())),
            "tenant team-a: creates 2 in the last minute + 1 asked > quota 2 per minute");
  EXPECT_EQ(Tenant(a, "team-a")["usage"]["creates_last_minute"], 2);
}

TEST_F(LimitsTest, ParallelCreatesAgainstAQuotaOfOneGetExactlyOneSandbox) {
  const std::string a = MakeKey("alice", "team-a");
  SetQuota("team-a", {{"sandboxes", 1}});
  constexpr int kRacers = 6;
  std::vector<std::future<Reply>> racers;
  for (int i = 0; i < kRacers; ++i) {
    racers.push_back(std::async(std::launch::async, [&] { return Create(a, json::object()); }));
  }
  int made = 0, refused = 0;
  for (auto& r : racers) {
    Reply reply = r.get();
    if (reply.status == 201) ++made;
    if (reply.status == 429) ++refused;
  }
  EXPECT_EQ(made, 1);
  EXPECT_EQ(refused, kRacers - 1);
  EXPECT_EQ(Tenant(a, "team-a")["usage"]["sandboxes"], 1);
}

TEST_F(LimitsTest, AForkOverQuotaIsRefusedAndLeavesNothing) {
  const std::string a = MakeKey("alice", "team-a");
  std::vector<std::string> made;
  ASSERT_EQ(Create(a, {{"memory_mb", 256}}, &made).status, 201);
  SetQuota("team-a", {{"memory_mb", 640}});
  Reply fork =
      As(a, http::verb::post, "/v1/sandboxes/" + made[0] + "/fork", json{{"count", 2}}.dump());
  EXPECT_NE(Refusal(fork).find("memory 512 MiB in use + 256 asked > quota 640 MiB"),
            std::string::npos)
      << fork.body;
  // The fork that fitted went with the refusal: only the source is left.
  EXPECT_EQ(Tenant(a, "team-a")["usage"]["sandboxes"], 1);
  // Positive control: one fork fits.
  EXPECT_EQ(As(a, http::verb::post, "/v1/sandboxes/" + made[0] + "/fork", json{{"count", 1}}.dump())
                .status,
            201);
}

TEST_F(LimitsTest, APoolClaimOverQuotaIsRefusedAndTheSandboxStaysPooled) {
  const std::string a = MakeKey("alice", "team-a");
  SetQuota("team-a", {{"sandboxes", 1}});
  ASSERT_EQ(daemon_->Call(http::verb::put, "/v1/pools/base", R"({"size": 1})").status, 200);
  // The base pool's hits, once it has a sandbox ready (-1 if it never does).
  auto ready_hits = [&]() -> int64_t {
    for (int i = 0; i < 3000; ++i) {
      Reply r = daemon_->Call(http::verb::get, "/v1/pools");
      const json doc = r.Json();
      for (const json& p : doc["pools"]) {
        if (p["template"] == "base" && p["ready"] == 1) return p["hits"].get<int64_t>();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  };
  ASSERT_EQ(ready_hits(), 0);
  std::vector<std::string> made;
  ASSERT_EQ(Create(a, json::object(), &made).status, 201);
  ASSERT_EQ(ready_hits(), 1);  // the create was a claim (positive control), and it refilled
  EXPECT_EQ(Refusal(Create(a, json::object(), &made)),
            "tenant team-a: sandboxes 1 in use + 1 asked > quota 1");
  EXPECT_EQ(ready_hits(), 1);  // not claimed: still ready, no hit
  EXPECT_EQ(Tenant(a, "team-a")["usage"]["sandboxes"], 1);
  // The pooled sandbox is admin's until claimed: it counts for nobody.
  EXPECT_EQ(Tenant(daemon_->key(), "admin")["usage"]["sandboxes"], 0);
}

TEST_F(LimitsTest, OnlyAnAdminSetsQuotasAndATenantSeesOnlyItsOwn) {
  const std::string a = MakeKey("alice", "team-a"), b = MakeKey("bob", "team-b");
  ASSERT_EQ(Create(a, {{"memory_mb", 128}}).status, 201);
  EXPECT_EQ(As(a, http::verb::put, "/v1/tenants/team-a/quota", R"({"sandboxes": 9})").status, 403);
  EXPECT_EQ(As(a, http::verb::delete_, "/v1/tenants/team-a/quota").status, 403);
  EXPECT_EQ(As(b, http::verb::get, "/v1/tenants/team-a").status, 403);
  // A tenant without a quota: zeros, and what it uses.
  json own = Tenant(a, "team-a");
  EXPECT_EQ(own["quota"]["sandboxes"], 0) << own;
  EXPECT_EQ(own["usage"]["memory_mb"], 128) << own;
  // The admin sees any tenant, sets and removes.
  SetQuota("team-a", {{"sandboxes", 3}, {"memory_mb", 0}});
  Reply shown = daemon_->Call(http::verb::get, "/v1/tenants/team-a");
  ASSERT_EQ(shown.status, 200) << shown.body;
  EXPECT_EQ(shown.Json()["quota"]["sandboxes"], 3) << shown.body;
  EXPECT_EQ(shown.Json()["usage"]["sandboxes"], 1) << shown.body;
  EXPECT_EQ(Tenant(a, "team-a")["quota"]["sandboxes"], 3);
  SetQuota("team-a", {{"sandboxes", 0}});  // all zero: removed
  EXPECT_EQ(Tenant(a, "team-a")["quota"]["sandboxes"], 0);
  // Bad input: a clear 400, nothing set.
  for (const char* bad : {R"({"sandboxes": -1})", R"({"cpus": "2"})", R"({"memory": 5})",
                          R"({"disk_mb": 1.5})", "[]"}) {
    Reply r = daemon_->Call(http::verb::put, "/v1/tenants/team-a/quota", bad);
    EXPECT_EQ(r.status, 400) << bad << ": " << r.body;
  }
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/tenants/bad$name").status, 400);
  EXPECT_EQ(daemon_->Call(http::verb::post, "/v1/tenants/team-a").status, 405);
  EXPECT_EQ(Tenant(a, "team-a")["quota"]["sandboxes"], 0);
}

TEST_F(LimitsTest, QuotasOutliveARestart) {
  SetQuota("team-a", {{"sandboxes", 2}, {"cpus", 2.5}});
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  ASSERT_TRUE(daemon_->Start());
  Reply r = daemon_->Call(http::verb::get, "/v1/tenants/team-a");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["quota"]["sandboxes"], 2);
  EXPECT_DOUBLE_EQ(r.Json()["quota"]["cpus"].get<double>(), 2.5);
}

// --- Live limits ---------------------------------------------------------------------------

TEST_F(LimitsTest, LoweringMemoryLiveOomKillsWhatNoLongerFits) {
  const std::string id = CreateSandbox(R"({"memory_mb": 512})");
  ASSERT_FALSE(id.empty());
  const std::string hog =
      "python3 -c 'b = bytearray(200 << 20); b[::4096] = b\"x\" * len(b[::4096]); print(\"held\")'";
  // Positive control: 200 MiB fit under 512.
  int code = -1;
  EXPECT_EQ(Run(id, hog, &code), "held\n");
  EXPECT_EQ(code, 0);
  Reply patched = Patch(id, {{"limits", {{"memory_mb", 128}}}});
  ASSERT_EQ(patched.status, 200) << patched.body;
  EXPECT_EQ(patched.Json()["limits"]["memory_mb"], 128);
  EXPECT_EQ(patched.Json()["limits"]["cpus"], 1);  // what the patch did not name stays
  // As argv, so that the process the exec result is about is the one killed.
  const json argv = {"python3", "-c",
                     "b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]); print('held')"};
  Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                          json{{"argv", argv}, {"timeout_seconds", 60}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["stdout"], "") << r.body;
  EXPECT_TRUE(r.Json()["oom_killed"].get<bool>()) << r.body;
  // The record says so too.
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).Json()["limits"]["memory_mb"],
            128);
}

TEST_F(LimitsTest, LoweringPidsLiveMakesForkFail) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  // Up to 24 children that each live a moment, all waited for; how many forks succeeded.
  const std::string forks =
      "python3 -c '\nimport os, time\nkids = 0\nfor i in range(24):\n  try:\n    pid = os.fork()\n"
      "  except BlockingIOError:\n    break\n  if pid == 0:\n    time.sleep(0.5); os._exit(0)\n"
      "  kids += 1\nfor i in range(kids):\n  os.wait()\nprint(kids)'";
  EXPECT_EQ(Run(id, forks), "24\n");  // positive control: 256 pids
  ASSERT_EQ(Patch(id, {{"limits", {{"pids_max", 16}}}}).status, 200);
  const std::string after = Run(id, forks);
  ASSERT_FALSE(after.empty());
  EXPECT_LT(std::stoi(after), 16) << after;
  EXPECT_GT(std::stoi(after), 0) << after;
}

TEST_F(LimitsTest, LiveLimitsAreRefusedWhereTheyCannotBeApplied) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  // disk_mb is fixed at create; an empty or unknown limit is bad input.
  for (const char* bad :
       {R"({"limits": {"disk_mb": 2048}})", R"({"limits": {}})", R"({"limits": {"memory_mb": 1}})",
        R"({"limits": {"cpu": 2}})", R"({"limits": 3})"}) {
    Reply r = daemon_->Call(http::verb::patch, "/v1/sandboxes/" + id, bad);
    EXPECT_EQ(r.status, 400) << bad << ": " << r.body;
  }
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).Json()["limits"]["memory_mb"],
            512);
  // A destroyed sandbox: the 404 of every route.
  ASSERT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204);
  EXPECT_EQ(Patch(id, {{"limits", {{"memory_mb", 256}}}}).status, 404);
  // An engine without live_limits: 409 naming it and the capability.
  if (std::string lacks = EngineLacks(*daemon_, "gvisor"); !lacks.empty()) {
    GTEST_SKIP() << lacks;
  }
  const std::string g = CreateSandbox(R"({"engine": "gvisor"})");
  ASSERT_FALSE(g.empty());
  Reply r = Patch(g, {{"limits", {{"memory_mb", 256}}}});
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_NE(r.body.find("gvisor"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("live_limits"), std::string::npos) << r.body;
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + g).Json()["limits"]["memory_mb"],
            512);
}

TEST_F(LimitsTest, ALiveIncreaseMustFitTheQuotaAndADecreaseAlwaysDoes) {
  const std::string a = MakeKey("alice", "team-a");
  std::vector<std::string> made;
  ASSERT_EQ(Create(a, {{"memory_mb", 256}}, &made).status, 201);
  ASSERT_EQ(Create(a, {{"memory_mb", 256}}, &made).status, 201);
  SetQuota("team-a", {{"memory_mb", 768}});
  Reply over = As(a, http::verb::patch, "/v1/sandboxes/" + made[0],
                  json{{"limits", {{"memory_mb", 600}}}}.dump());
  EXPECT_EQ(Refusal(over), "tenant team-a: memory 512 MiB in use + 344 asked > quota 768 MiB");
  EXPECT_EQ(Tenant(a, "team-a")["usage"]["memory_mb"], 512);
  EXPECT_EQ(As(a, http::verb::patch, "/v1/sandboxes/" + made[0],
               json{{"limits", {{"memory_mb", 512}}}}.dump())
                .status,
            200);
  EXPECT_EQ(As(a, http::verb::patch, "/v1/sandboxes/" + made[1],
               json{{"limits", {{"memory_mb", 64}}}}.dump())
                .status,
            200);
  EXPECT_EQ(Tenant(a, "team-a")["usage"]["memory_mb"], 576);
}

// --- What a sandbox sees of its limits, on every engine --------------------------------------

class LimitsViewTest : public LimitsTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    LimitsTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (std::string lacks = EngineLacks(*daemon_, GetParam()); !lacks.empty()) {
      GTEST_SKIP() << lacks;
    }
  }
  std::string Make(const json& limits) {
    json body = limits;
    body["engine"] = GetParam();
    return CreateSandbox(body.dump());
  }
  // MemTotal of a /proc/meminfo, in kB.
  static int64_t MemTotalKb(const std::string& meminfo) {
    std::smatch m;
    if (!std::regex_search(meminfo, m, std::regex(R"(MemTotal:\s+(\d+) kB)"))) return -1;
    return std::stoll(m[1]);
  }
  static int64_t HostMemTotalKb() {
    std::ifstream in("/proc/meminfo");
    std::stringstream s;
    s << in.rdbuf();
    return MemTotalKb(s.str());
  }
  static std::string Nproc() { return std::to_string(::sysconf(_SC_NPROCESSORS_ONLN)) + "\n"; }
  const std::string kPython =
      "python3 -c 'import os; print(os.cpu_count(), len(os.sched_getaffinity(0)))'";
};

TEST_P(LimitsViewTest, ASandboxSeesItsOwnCpusAndMemory) {
  if (::sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "one CPU: nothing to tell apart";
  const std::string id = Make({{"cpus", 1}, {"memory_mb", 256}});
  ASSERT_FALSE(id.empty());
  const std::string free = Run(id, "free -m | awk '/^Mem:/ {print $2}'");
  const int64_t total_kb = MemTotalKb(Run(id, "cat /proc/meminfo"));
  if (GetParam() == "gvisor") {
    // runsc sizes its kernel's memory from the limit; its CPU count comes from the host (see
    // docs/design/gvisor.md, "Limits seen from inside").
    EXPECT_LE(total_kb, 256 * 1024) << total_kb;
    EXPECT_GT(total_kb, 0);
    return;
  }
  EXPECT_EQ(Run(id, "nproc"), "1\n");
  EXPECT_EQ(Run(id, kPython), "1 1\n");
  EXPECT_EQ(Run(id, "cat /sys/devices/system/cpu/online").size(), 2u);  // one CPU: "N\n"
  EXPECT_EQ(total_kb, 256 * 1024);
  EXPECT_EQ(free, "256\n");
}

TEST_P(LimitsViewTest, WithoutLimitsBelowTheHostsASandboxSeesTheHost) {
  const std::string id = Make({{"cpus", 64}, {"memory_mb", 262144}});
  ASSERT_FALSE(id.empty());
  const int64_t host = HostMemTotalKb();
  const int64_t inside = MemTotalKb(Run(id, "cat /proc/meminfo"));
  if (GetParam() == "gvisor") {
    EXPECT_GT(inside, 256 * 1024) << inside;  // not the small sandbox's
    return;
  }
  EXPECT_EQ(Run(id, "nproc"), Nproc());
  const std::string n = std::to_string(::sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_EQ(Run(id, kPython), n + " " + n + "\n");
  // The host's own file, as it was when it was read (MemTotal does not move).
  EXPECT_EQ(inside, host);
}

TEST_P(LimitsViewTest, ALiveChangeChangesWhatTheSandboxSees) {
  const std::string id = Make({{"cpus", 1}, {"memory_mb", 256}});
  ASSERT_FALSE(id.empty());
  Reply r = Patch(id, {{"limits", {{"cpus", 2}, {"memory_mb", 384}}}});
  if (GetParam() == "gvisor") {
    EXPECT_EQ(r.status, 409) << r.body;  // no live_limits
    return;
  }
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string two = std::to_string(std::min<long>(2, ::sysconf(_SC_NPROCESSORS_ONLN)));
  EXPECT_EQ(Run(id, "nproc"), two + "\n");
  EXPECT_EQ(Run(id, kPython), two + " " + two + "\n");
  EXPECT_EQ(MemTotalKb(Run(id, "cat /proc/meminfo")), 384 * 1024);
  ASSERT_EQ(Patch(id, {{"limits", {{"cpus", 0.5}}}}).status, 200);
  EXPECT_EQ(Run(id, "nproc"), "1\n");
}

TEST_P(LimitsViewTest, TheMemoryViewFollowsWhatTheSandboxUses) {
  if (GetParam() == "gvisor") GTEST_SKIP() << "gVisor's kernel keeps its own /proc/meminfo";
  const std::string id = Make({{"memory_mb", 512}});
  ASSERT_FALSE(id.empty());
  // 150 MiB held in the background; the view is rewritten every second or so.
  Reply bg =
      daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                    json{{"cmd",
                          "python3 -c 'import time; b = bytearray(150 << 20); b[::4096] = b\"x\" * "
                          "len(b[::4096]); time.sleep(600)'"},
                         {"background", true}}
                        .dump());
  ASSERT_EQ(bg.status, 200) << bg.body;
  int64_t used_mb = 0;
  for (int i = 0; i < 100 && used_mb < 150; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const std::string used = Run(id, "free -m | awk '/^Mem:/ {print $2 - $4}'");
    used_mb = used.empty() ? 0 : std::stoll(used);
  }
  EXPECT_GE(used_mb, 150);
  EXPECT_LT(used_mb, 512);
}

TEST_P(LimitsViewTest, TheViewCannotBeWrittenOrUnmountedFromInside) {
  if (GetParam() == "gvisor") GTEST_SKIP() << "gVisor's kernel makes its own /proc/meminfo";
  const std::string id = Make({{"cpus", 1}, {"memory_mb", 256}});
  ASSERT_FALSE(id.empty());
  const std::string before = Run(id, "cat /proc/meminfo /sys/devices/system/cpu/online");
  ASSERT_NE(before.find("MemTotal:"), std::string::npos);
  for (const char* user : {"root", "user"}) {
    for (const char* attempt :
         {"echo 'MemTotal: 99999999 kB' > /proc/meminfo",
          "echo 0-63 > /sys/devices/system/cpu/online", "umount /proc/meminfo",
          "umount -l /sys/devices/system/cpu/online", "mount -o remount,rw,bind /proc/meminfo",
          "mount --bind /tmp /proc/meminfo", "rm -f /sys/devices/system/cpu/online",
          "chmod 666 /proc/meminfo"}) {
      int code = -1;
      const std::string out = RunAs(id, attempt, user, &code);
      EXPECT_NE(code, 0) << user << ": " << attempt << " succeeded: " << out;
    }
  }
  // Positive control: the same user can write where it may.
  int code = -1;
  RunAs(id, "echo ok > /tmp/ok", "root", &code);
  EXPECT_EQ(code, 0);
  // Nothing moved: MemTotal and the CPUs are as they were (the rest of meminfo may move).
  const std::string after = Run(id, "cat /proc/meminfo /sys/devices/system/cpu/online");
  EXPECT_EQ(MemTotalKb(after), MemTotalKb(before));
  EXPECT_EQ(after.substr(after.rfind('\n', after.size() - 2)),
            before.substr(before.rfind('\n', before.size() - 2)));
  EXPECT_EQ(Run(id, "nproc"), "1\n");
}

INSTANTIATE_TEST_SUITE_P(Engines, LimitsViewTest, ::testing::ValuesIn(EnginesOfThisBuild()),
                         EngineName);

}  // namespace
