// An upgrade over live sandboxes (docs/install.md, "Upgrades"): the daemon stops with
// on_shutdown = keep, a newer airlockd starts over the same state dir, migrates the store
// forward and adopts every sandbox, with its files and its running processes. The older build's
// store is made by taking this build's back one schema version (as the store's migration tests
// do); a store from a newer build is refused with a clear message, and that refusal loses
// nothing: the next right start adopts everything.

#include <sqlite3.h>

#include "daemon/store/store.h"
#include "support/airlockd.h"

namespace {

using namespace airlock::testing;

// Runs `sql` on the database at `path` (the daemon stopped); "" or sqlite's error.
std::string RunSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string error;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    error = sqlite3_errmsg(db);
  } else {
    char* message = nullptr;
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &message) != SQLITE_OK) {
      error = message != nullptr ? message : "failed";
      sqlite3_free(message);
    }
  }
  sqlite3_close(db);
  return error;
}

class UpgradeTest : public DaemonTest {
 protected:
  // The packaged default, a stop that keeps the sandboxes, until the test ends.
  std::vector<std::string> DaemonArgs() const override {
    if (keep_) return {"--on-shutdown", "keep"};
    return {};
  }
  // A new daemon over the same state dir (the old one stopped or gone).
  void Replace() {
    const std::string state_dir = daemon_->state_dir();
    daemon_.reset();
    daemon_.emplace(state_dir, DaemonArgs());
  }
  // What the test kept goes: the harness's daemon, which destroys at its stop, takes it back.
  void TearDown() override {
    keep_ = false;
    if (daemon_) {
      if (daemon_->running()) daemon_->Stop(SIGTERM);
      Replace();
    }
    DaemonTest::TearDown();
  }

  bool keep_ = true;
};

TEST_F(UpgradeTest, ANewerDaemonMigratesTheStoreAndAdoptsEverySandboxWithItsProcesses) {
  const std::string a = CreateSandbox(), b = CreateSandbox();
  ASSERT_FALSE(a.empty() || b.empty());
  EXPECT_EQ(Run(a, "echo kept > /home/user/note && cat /home/user/note"), "kept\n");
  Reply bg = daemon_->Call(http::verb::post, "/v1/sandboxes/" + b + "/exec",
                           R"({"cmd": "sleep 600", "background": true})");
  ASSERT_EQ(bg.status, 200) << bg.body;
  const int64_t pid = bg.Json()["pid"];
  const std::string db = daemon_->state_dir() + "/airlock.db";

  // The older build's store: one schema version back (no metric samples yet).
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  ASSERT_EQ(RunSql(db, "DROP TABLE sandbox_metrics; PRAGMA user_version = 12;"), "");
  Replace();
  ASSERT_TRUE(daemon_->Start());
  EXPECT_NE(daemon_->Log().find("start: 2 adopted"), std::string::npos) << daemon_->Log();
  for (const std::string& id : {a, b}) {
    Reply r = daemon_->Call(http::verb::get, "/v1/sandboxes/" + id);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.Json()["state"], "running") << r.body;
  }
  EXPECT_EQ(Run(a, "cat /home/user/note"), "kept\n");
  Reply process =
      daemon_->Call(http::verb::get, "/v1/sandboxes/" + b + "/processes/" + std::to_string(pid));
  EXPECT_EQ(process.status, 200) << process.body;
  EXPECT_EQ(process.Json()["state"], "running") << process.body;
  // The migrated store has what the new build added: the metrics route answers.
  Reply metrics = daemon_->Call(http::verb::get, "/v1/sandboxes/" + a + "/metrics");
  EXPECT_EQ(metrics.status, 200) << metrics.body;
}

TEST_F(UpgradeTest, AStoreFromANewerBuildIsRefusedAndThatLosesNothing) {
  const std::string a = CreateSandbox();
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(Run(a, "echo kept > /home/user/note"), "");
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  const std::string state_dir = daemon_->state_dir();
  const std::string db = state_dir + "/airlock.db";
  ASSERT_EQ(RunSql(db, "PRAGMA user_version = 999;"), "");

  Replace();
  EXPECT_FALSE(daemon_->Start()) << "a store from a newer airlockd must not be opened";
  const std::string log = daemon_->Log();
  EXPECT_NE(log.find("database schema version 999 is newer than this airlockd understands"),
            std::string::npos)
      << log;
  daemon_->Stop(SIGKILL);  // it has exited; this reaps it
  // The sandbox is untouched: its directory is there, and the right version adopts it.
  EXPECT_TRUE(fs::exists(state_dir + "/jail/" + a));
  ASSERT_EQ(RunSql(db, "PRAGMA user_version = " +
                           std::to_string(airlock::store::Store::CurrentSchemaVersion()) + ";"),
            "");
  Replace();
  ASSERT_TRUE(daemon_->Start());
  EXPECT_EQ(Run(a, "cat /home/user/note"), "kept\n");
}

}  // namespace
