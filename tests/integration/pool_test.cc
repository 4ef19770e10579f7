// Warm pools end to end (docs/design/pools.md): a real airlockd fills a pool, creates claim from
// it, the pool survives a SIGKILL of the daemon, and nothing is left behind when it shrinks or
// the daemon stops. Needs root (the jail engine); skips with the reason otherwise.

#include <atomic>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "daemon/store/store.h"
#include "support/airlockd.h"

namespace {

using namespace airlock::testing;

class PoolTest : public DaemonTest {
 protected:
  // The "base" entry of GET /v1/pools (null when it has none).
  json BasePool() {
    Reply r = daemon_->Call(http::verb::get, "/v1/pools");
    EXPECT_EQ(r.status, 200) << r.body;
    const json doc = r.Json();  // kept: a range-for over a temporary's member dangles
    for (const json& p : doc["pools"]) {
      if (p["template"] == "base") return p;
    }
    return nullptr;
  }

  void Resize(int size) {
    Reply r = daemon_->Call(http::verb::put, "/v1/pools/base", json{{"size", size}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.Json()["size"], size) << r.body;
  }

  // Waits until the base pool has exactly `ready` sandboxes ready.
  ::testing::AssertionResult WaitReady(int64_t ready) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    json pool;
    while (std::chrono::steady_clock::now() < deadline) {
      pool = BasePool();
      if (!pool.is_null() && pool["ready"] == ready) return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return ::testing::AssertionFailure() << "the pool never had " << ready << " ready: " << pool;
  }

  // Every sandbox id the engine has a directory for (pooled ones included).
  std::set<std::string> JailIds() {
    std::set<std::string> ids;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(daemon_->state_dir() + "/jail", ec)) {
      ids.insert(e.path().filename().string());
    }
    return ids;
  }

  // The value of the /metrics sample `series` (-1 when absent).
  double Metric(const std::string& series) {
    const std::string text = "\n" + daemon_->Call(http::verb::get, "/metrics").body;
    const size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + series.size() + 2));
  }

  // The memory limit of the sandbox's cgroup, in bytes, read from the host (v2 or v1).
  int64_t MemoryLimit(const std::string& id) {
    for (const std::string& dir : CgroupsNamed(id)) {
      for (const char* file : {"/memory.max", "/memory.limit_in_bytes"}) {
        std::ifstream in(dir + file);
        int64_t bytes = 0;
        if (in >> bytes) return bytes;
      }
    }
    return -1;
  }

  // Checks that nothing of `id` is left: no jail directory, no cgroup.
  void ExpectGone(const std::string& id) {
    EXPECT_FALSE(fs::exists(daemon_->state_dir() + "/jail/" + id)) << id;
    EXPECT_EQ(CgroupsNamed(id), std::vector<std::string>{}) << id;
  }
};

const std::string kHit = R"(airlock_pool_claims_total{template="base",result="hit"})";

TEST_F(PoolTest, CreateClaimsAPooledSandboxWithTheRequestsSettings) {
  Resize(2);
  ASSERT_TRUE(WaitReady(2));
  const std::set<std::string> pooled = JailIds();
  ASSERT_EQ(pooled.size(), 2u);
  // Pooled sandboxes belong to nobody: not listed, not reachable through the sandbox routes.
  EXPECT_TRUE(Listed().empty());
  const std::string idle = *pooled.begin();
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + idle).status, 404);
  EXPECT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + idle + "/exec", R"({"cmd": "true"})")
                .status,
            404);
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + idle).status, 404);
  EXPECT_EQ(Metric(R"(airlock_pool_ready{template="base"})"), 2);
  EXPECT_EQ(Metric(R"(airlock_pool_size{template="base"})"), 2);
  EXPECT_EQ(Metric(R"(airlock_sandboxes{state="running"})"), 0);
  const double hits = Metric(kHit);

  Reply created = daemon_->Call(http::verb::post, "/v1/sandboxes",
                                R"({"ttl_seconds": 120, "memory_mb": 256, "cpus": 0.5,
                                    "env": {"GREETING": "hello", "SHARED": "sandbox"},
                                    "metadata": {"team": "ml"}})");
  ASSERT_EQ(created.status, 201) << created.body;
  const std::string id = created.Json()["id"];
  EXPECT_TRUE(pooled.contains(id)) << id << " did not come from the pool";
  EXPECT_EQ(Metric(kHit), hits + 1);
  EXPECT_EQ(BasePool()["hits"], 1);

  Reply got = daemon_->Call(http::verb::get, "/v1/sandboxes/" + id);
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["state"], "running");
  EXPECT_EQ(got.Json()["metadata"], json({{"team", "ml"}}));
  EXPECT_EQ(got.Json()["limits"]["memory_mb"], 256);
  // The deadline is the request's TTL from the claim (not from when the pool made it).
  Reply by_meta = daemon_->Call(http::verb::get, "/v1/sandboxes?metadata.team=ml");
  EXPECT_EQ(by_meta.Json()["sandboxes"].size(), 1u) << by_meta.body;
  const std::string expires = got.Json()["expires_at"];
  const std::string created_at = got.Json()["created_at"];
  EXPECT_GT(expires, created_at);
  EXPECT_EQ(Listed(), (std::map<std::string, std::string>{{id, "running"}}));

  // The env reaches every command as on a cold sandbox, and a command's own env wins.
  Reply env = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                            R"({"cmd": "echo $GREETING $SHARED", "env": {"SHARED": "cmd"}})");
  ASSERT_EQ(env.status, 200) << env.body;
  EXPECT_EQ(env.Json()["stdout"], "hello cmd\n");
  Reply plain = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                              R"({"cmd": "echo $GREETING $SHARED"})");
  EXPECT_EQ(plain.Json()["stdout"], "hello sandbox\n") << plain.body;
  // The memory limit is in force on the host's cgroup.
  EXPECT_EQ(MemoryLimit(id), 256ll << 20);

  // The pool refills, and the next user of it sees none of the first one's env.
  ASSERT_TRUE(WaitReady(2));
  Reply second = daemon_->Call(http::verb::post, "/v1/sandboxes", "{}");
  ASSERT_EQ(second.status, 201) << second.body;
  const std::string other = second.Json()["id"];
  EXPECT_EQ(Metric(kHit), hits + 2);
  Reply clean = daemon_->Call(http::verb::post, "/v1/sandboxes/" + other + "/exec",
                              R"({"cmd": "echo ${GREETING:-unset}"})");
  EXPECT_EQ(clean.Json()["stdout"], "unset\n") << clean.body;
  EXPECT_EQ(MemoryLimit(other), 512ll << 20);  // the default, as a cold create gives

  for (const std::string& s : {id, other}) {
    EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + s).status, 204);
    ExpectGone(s);
  }
}

TEST_F(PoolTest, ConcurrentCreatesGetDistinctWorkingSandboxes) {
  Resize(4);
  ASSERT_TRUE(WaitReady(4));
  constexpr int kCreates = 16;
  std::mutex mu;
  std::vector<std::string> ids;
  std::vector<std::thread> threads;
  const uint16_t port = daemon_->port();
  const std::string key = "Bearer " + daemon_->key();
  for (int i = 0; i < kCreates; ++i) {
    threads.emplace_back([&] {
      Reply r = Http(port, http::verb::post, "/v1/sandboxes", "{}", key);
      std::lock_guard lock(mu);
      EXPECT_EQ(r.status, 201) << r.body;
      if (r.status == 201) ids.push_back(r.Json()["id"]);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(ids.size(), static_cast<size_t>(kCreates));
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size());
  for (const std::string& id : ids) {
    Reply r =
        daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec", R"({"cmd": "echo ok"})");
    EXPECT_EQ(r.Json()["stdout"], "ok\n") << id << ": " << r.body;
  }
  const json pool = BasePool();
  EXPECT_EQ(pool["hits"].get<int>() + pool["misses"].get<int>(), kCreates) << pool;
  EXPECT_GE(pool["hits"].get<int>(), 1) << pool;
  for (const std::string& id : ids) {
    EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204);
  }
}

TEST_F(PoolTest, ASettingFixedAtCreateTakesTheColdPath) {
  Resize(1);
  ASSERT_TRUE(WaitReady(1));
  const std::set<std::string> pooled = JailIds();
  const std::string id = CreateSandbox(R"({"disk_mb": 2048})");
  ASSERT_FALSE(id.empty());
  EXPECT_FALSE(pooled.contains(id));
  EXPECT_EQ(Metric(R"(airlock_pool_claims_total{template="base",result="miss",reason="disk"})"), 1);
  EXPECT_EQ(Metric(kHit), 0);
  const json pool = BasePool();
  EXPECT_EQ(pool["ready"], 1) << pool;
  EXPECT_EQ(pool["misses"], 1) << pool;
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204);

  // An env too big to send with every command: cold, so that its agent gets it once.
  json big = json::object();
  for (int i = 0; i < 9; ++i) big["V" + std::to_string(i)] = std::string(32000, 'x');
  const std::string big_id = CreateSandbox(json{{"env", big}}.dump());
  ASSERT_FALSE(big_id.empty());
  EXPECT_FALSE(pooled.contains(big_id));
  EXPECT_EQ(Metric(R"(airlock_pool_claims_total{template="base",result="miss",reason="env"})"),
            1);
  Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes/" + big_id + "/exec",
                          R"({"cmd": "echo ${#V8}"})");
  EXPECT_EQ(r.Json()["stdout"], "32000\n") << r.body;
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + big_id).status, 204);
}

TEST_F(PoolTest, ShrinkingToZeroDestroysTheIdleSandboxes) {
  Resize(3);
  ASSERT_TRUE(WaitReady(3));
  const std::set<std::string> pooled = JailIds();
  ASSERT_EQ(pooled.size(), 3u);
  Resize(0);
  ASSERT_TRUE(WaitReady(0));
  // Ready drops as each one is taken; its teardown finishes just after.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!JailIds().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const std::string& id : pooled) ExpectGone(id);
  EXPECT_EQ(BasePool()["size"], 0);
  // With the pool at 0, a create is a plain cold one and counts as nothing.
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(BasePool()["misses"], 0);
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204);
}

TEST_F(PoolTest, RestartAfterSigkillAdoptsThePoolAndKeepsItsSize) {
  Resize(2);
  ASSERT_TRUE(WaitReady(2));
  // One claimed before the kill: after the restart its env still reaches its commands.
  const std::string claimed = CreateSandbox(R"({"env": {"Y": "2"}})");
  ASSERT_FALSE(claimed.empty());
  ASSERT_TRUE(WaitReady(2));
  std::set<std::string> pooled = JailIds();
  ASSERT_EQ(pooled.erase(claimed), 1u);
  // Started again as it is: a new Daemon would first remove what this one's networking left,
  // the pooled sandboxes' network namespaces included.
  ASSERT_TRUE(WIFSIGNALED(daemon_->Stop(SIGKILL)));
  ASSERT_TRUE(daemon_->Start());
  // The same sandboxes are ready again: adopted, none made anew, none orphaned.
  const json pool = BasePool();
  ASSERT_FALSE(pool.is_null());
  EXPECT_EQ(pool["size"], 2) << pool;
  EXPECT_EQ(pool["ready"], 2) << pool;
  std::set<std::string> all = pooled;
  all.insert(claimed);
  EXPECT_EQ(JailIds(), all);
  EXPECT_EQ(Metric(R"(airlock_recovery_sandboxes{outcome="adopted"})"), 3);
  EXPECT_EQ(Metric(R"(airlock_recovery_sandboxes{outcome="orphan_removed"})"), 0);
  EXPECT_EQ(Listed(), (std::map<std::string, std::string>{{claimed, "running"}}));
  Reply kept = daemon_->Call(http::verb::post, "/v1/sandboxes/" + claimed + "/exec",
                             R"({"cmd": "echo $Y"})");
  EXPECT_EQ(kept.Json()["stdout"], "2\n") << kept.body;
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + claimed).status, 204);
  const std::string id = CreateSandbox(R"({"env": {"X": "1"}})");
  ASSERT_FALSE(id.empty());
  EXPECT_TRUE(pooled.contains(id));
  Reply r =
      daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec", R"({"cmd": "echo $X"})");
  EXPECT_EQ(r.Json()["stdout"], "1\n") << r.body;
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204);
}

TEST_F(PoolTest, ShutdownWithDestroyLeavesNothing) {
  Resize(2);
  ASSERT_TRUE(WaitReady(2));
  const std::set<std::string> pooled = JailIds();
  const int status = daemon_->Stop(SIGTERM);  // the fixture passes --on-shutdown destroy
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  for (const std::string& id : pooled) ExpectGone(id);
  auto store = airlock::store::Store::Open(daemon_->state_dir() + "/airlock.db");
  ASSERT_TRUE(store) << store.error().message();
  for (const std::string& id : pooled) {
    auto record = (*store)->Get(id);
    ASSERT_TRUE(record) << record.error().message();
    EXPECT_EQ(record->state, airlock::store::SandboxState::kDestroyed) << id;
  }
}

TEST_F(PoolTest, TheConfigSetsASizeThatTheApiOverrides) {
  ASSERT_TRUE(daemon_->Stop(SIGTERM) == 0);
  const std::string state_dir = daemon_->state_dir();
  daemon_.reset();
  daemon_.emplace(state_dir, std::vector<std::string>{"--pool.base", "1"});
  ASSERT_TRUE(daemon_->Start());
  ASSERT_TRUE(WaitReady(1));
  EXPECT_EQ(BasePool()["size"], 1);
  Resize(0);
  ASSERT_TRUE(WaitReady(0));
  // Restarted with the same flag, the size set through the API stays.
  ASSERT_TRUE(daemon_->Stop(SIGTERM) == 0);
  daemon_.reset();
  daemon_.emplace(state_dir, std::vector<std::string>{"--pool.base", "1"});
  ASSERT_TRUE(daemon_->Start());
  EXPECT_EQ(BasePool()["size"], 0);
  // A pool for a template that does not exist stops the start with the reason.
  ASSERT_TRUE(daemon_->Stop(SIGTERM) == 0);
  daemon_.reset();
  Daemon bad(state_dir, {"--pool.nope", "1"});
  EXPECT_FALSE(bad.Start());
  EXPECT_NE(bad.Log().find("template 'nope' does not exist"), std::string::npos) << bad.Log();
}

TEST_F(PoolTest, AReloadResizesThePoolsTheConfigFileNamesAndABadFileChangesNothing) {
  ASSERT_TRUE(daemon_->Stop(SIGTERM) == 0);
  const std::string state_dir = daemon_->state_dir();
  const std::string config = state_dir + ".toml";
  auto write = [&](const std::string& text) {
    std::ofstream(config, std::ios::trunc) << text;
  };
  write("pool.base = 1\n");
  daemon_.reset();
  daemon_.emplace(state_dir, std::vector<std::string>{"--config", config});
  ASSERT_TRUE(daemon_->Start());
  ASSERT_TRUE(WaitReady(1));
  // The file names the pool no more: it empties, and its sandbox goes.
  write("log_level = \"info\"\n");
  ASSERT_EQ(::kill(daemon_->pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitReady(0));
  EXPECT_EQ(BasePool()["size"], 0);
  // Named again, with a size.
  write("pool.base = 2\n");
  ASSERT_EQ(::kill(daemon_->pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitReady(2));
  // A bad file: refused with the line, nothing changes, the daemon serves on.
  write("pool.base = 1\nworkers = many\n");
  ASSERT_EQ(::kill(daemon_->pid(), SIGHUP), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (daemon_->Log().find("reload refused") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(daemon_->Log().find("reload refused, nothing changed: " + config + ": line 2"),
            std::string::npos)
      << daemon_->Log();
  EXPECT_EQ(BasePool()["size"], 2);
  EXPECT_TRUE(WaitReady(2));
  ::unlink(config.c_str());
}

TEST_F(PoolTest, BadPoolRequestsAreRefusedAndChangeNothing) {
  struct Case {
    http::verb verb;
    std::string target, body;
    int status;
  };
  const Case cases[] = {
      {http::verb::put, "/v1/pools/base", R"({"size": -1})", 400},
      {http::verb::put, "/v1/pools/base", R"({"size": 100000})", 400},
      {http::verb::put, "/v1/pools/base", R"({"size": "4"})", 400},
      {http::verb::put, "/v1/pools/base", R"({"size": 1.5})", 400},
      {http::verb::put, "/v1/pools/base", R"({"size": 1, "extra": true})", 400},
      {http::verb::put, "/v1/pools/base", R"({})", 400},
      {http::verb::put, "/v1/pools/base", "not json", 400},
      {http::verb::put, "/v1/pools/Base!", R"({"size": 1})", 400},
      {http::verb::put, "/v1/pools/nope", R"({"size": 1})", 404},
      {http::verb::put, "/v1/pools/base?x=1", R"({"size": 1})", 400},
      {http::verb::put, "/v1/pools/base/more", R"({"size": 1})", 404},
      {http::verb::post, "/v1/pools", R"({"size": 1})", 405},
      {http::verb::get, "/v1/pools/base", "", 405},
      {http::verb::delete_, "/v1/pools/base", "", 405},
  };
  for (const Case& c : cases) {
    Reply r = daemon_->Call(c.verb, c.target, c.body);
    EXPECT_EQ(r.status, c.status) << c.target << " " << c.body << ": " << r.body;
    EXPECT_TRUE(r.Json().contains("error")) << r.body;
  }
  Reply pools = daemon_->Call(http::verb::get, "/v1/pools");
  ASSERT_EQ(pools.status, 200) << pools.body;
  EXPECT_EQ(pools.Json(), json({{"pools", json::array()}}));
  EXPECT_TRUE(JailIds().empty());
}

}  // namespace
