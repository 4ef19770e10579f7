#include "daemon/store/store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/ids.h"
#include "common/syscall.h"

namespace airlock::store {
namespace {

using S = SandboxState;
constexpr int64_t kT0 = 1'700'000'000'000;  // the fake clock's start, unix ms

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "airlock-store-XXXXXX").string();
    AIRLOCK_CHECK(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs one query on its own connection and returns the first column of the first row.
std::string RawQuery(const std::string& db_path, const std::string& sql) {
  sqlite3* db = nullptr;
  AIRLOCK_CHECK(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  std::string out;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0) != nullptr) {
    out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

// Takes a database back to schema version 12: no metric samples.
void UndoMetricsMigration(const std::string& db_path) {
  RawQuery(db_path, "DROP TABLE sandbox_metrics");
  RawQuery(db_path, "PRAGMA user_version = 12");
}

// Takes a database back to schema version 11: no tenant quotas.
void UndoQuotasMigration(const std::string& db_path) {
  UndoMetricsMigration(db_path);
  RawQuery(db_path, "DROP TABLE tenant_quotas");
  RawQuery(db_path, "PRAGMA user_version = 11");
}

// Takes a database back to schema version 10: no flight recorder.
void UndoRecorderMigration(const std::string& db_path) {
  UndoQuotasMigration(db_path);
  RawQuery(db_path, "DROP TABLE sandbox_events");
  RawQuery(db_path, "DROP TABLE sandbox_event_counters");
  RawQuery(db_path, "PRAGMA user_version = 10");
}

// Takes a database back to schema version 9: sandboxes without the secrets bound to them.
void UndoBoundSecretsMigration(const std::string& db_path) {
  UndoRecorderMigration(db_path);
  RawQuery(db_path, "ALTER TABLE sandboxes DROP COLUMN secrets");
  RawQuery(db_path, "PRAGMA user_version = 9");
}

// Takes a database back to schema version 8, as an Airlock without secrets left it.
void UndoSecretsMigration(const std::string& db_path) {
  UndoBoundSecretsMigration(db_path);
  RawQuery(db_path, "DROP TABLE secrets");
  RawQuery(db_path, "PRAGMA user_version = 8");
}

// Takes a database back to schema version 7, as an Airlock without hibernation left it: the
// sandboxes table made again with the old CHECK on its state (the rows kept; foreign keys are
// off on this connection, so the network events stay).
void UndoHibernatedMigration(const std::string& db_path) {
  UndoSecretsMigration(db_path);
  RawQuery(db_path, R"sql(CREATE TABLE sandboxes_old (
  id TEXT PRIMARY KEY NOT NULL,
  state TEXT NOT NULL CHECK (state IN
    ('creating', 'running', 'paused', 'destroying', 'destroyed', 'failed')),
  engine TEXT NOT NULL, template_name TEXT NOT NULL, cpus REAL NOT NULL,
  memory_mb INTEGER NOT NULL, pids_max INTEGER NOT NULL, disk_mb INTEGER NOT NULL,
  env TEXT NOT NULL CHECK (json_valid(env)), metadata TEXT NOT NULL CHECK (json_valid(metadata)),
  created_at_ms INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL,
  resources TEXT NOT NULL CHECK (json_valid(resources)), error TEXT NOT NULL,
  pooled INTEGER NOT NULL DEFAULT 0 CHECK (pooled IN (0, 1)),
  layers TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(layers)), network TEXT NOT NULL DEFAULT '',
  tenant TEXT NOT NULL DEFAULT 'admin', engine_state TEXT NOT NULL DEFAULT '') STRICT)sql");
  RawQuery(db_path, "INSERT INTO sandboxes_old SELECT id, state, engine, template_name, cpus, "
                    "memory_mb, pids_max, disk_mb, env, metadata, created_at_ms, updated_at_ms, "
                    "expires_at_ms, resources, error, pooled, layers, network, tenant, "
                    "engine_state FROM sandboxes");
  RawQuery(db_path, "DROP TABLE sandboxes");
  RawQuery(db_path, "ALTER TABLE sandboxes_old RENAME TO sandboxes");
  RawQuery(db_path, "CREATE INDEX sandboxes_by_state ON sandboxes (state)");
  RawQuery(db_path, "CREATE INDEX sandboxes_by_deadline ON sandboxes (expires_at_ms) "
                    "WHERE expires_at_ms > 0");
  RawQuery(db_path, "CREATE INDEX sandboxes_pooled ON sandboxes (template_name, created_at_ms) "
                    "WHERE pooled = 1");
  RawQuery(db_path, "CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant)");
  RawQuery(db_path, "PRAGMA user_version = 7");
}

// Takes a database back to schema version 6, as an Airlock without engine state left it: the
// agent's host pid in init_pid, the jail's resources in resources.
void UndoEngineStateMigration(const std::string& db_path) {
  UndoHibernatedMigration(db_path);
  RawQuery(db_path, "ALTER TABLE sandboxes ADD COLUMN init_pid INTEGER NOT NULL DEFAULT 0");
  RawQuery(db_path, "ALTER TABLE sandboxes DROP COLUMN engine_state");
  RawQuery(db_path, "PRAGMA user_version = 6");
}

// Takes a database back to schema version 5, as an Airlock without tenancy left it: migration
// 6's index and columns go (the rows stay).
void UndoTenancyMigration(const std::string& db_path) {
  UndoEngineStateMigration(db_path);
  RawQuery(db_path, "DROP INDEX sandboxes_by_tenant");
  RawQuery(db_path, "ALTER TABLE sandboxes DROP COLUMN tenant");
  RawQuery(db_path, "ALTER TABLE api_keys DROP COLUMN tenant");
  RawQuery(db_path, "ALTER TABLE templates DROP COLUMN tenant");
  RawQuery(db_path, "PRAGMA user_version = 5");
}

SandboxRecord MakeRecord(std::string id) {
  SandboxRecord r;
  r.id = std::move(id);
  r.engine = "jail";
  r.template_name = "python-3.11";
  r.limits = {1.5, 512, 256, 1024};
  r.env = {"PATH=/usr/bin", "LANG=C.UTF-8"};
  r.metadata = {{"owner", "alice"}, {"job", "42"}};
  return r;
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }

  void Reopen() {
    store_.reset();
    auto opened = Store::Open(db_path_, {.now_ms = [this] { return now_.load(); }});
    ASSERT_TRUE(opened.has_value()) << opened.error().message();
    store_ = std::move(*opened);
  }

  // Inserts a record and drives it to `state` through allowed transitions.
  SandboxRecord InState(const std::string& id, SandboxState state,
                        std::map<std::string, std::string> metadata = {}) {
    SandboxRecord record = MakeRecord(id);
    if (!metadata.empty()) record.metadata = std::move(metadata);
    auto inserted = store_->Insert(record);
    AIRLOCK_CHECK(inserted.has_value());
    std::vector<SandboxState> path;
    switch (state) {
      case S::kCreating:
        break;
      case S::kRunning:
        path = {S::kRunning};
        break;
      case S::kPaused:
        path = {S::kRunning, S::kPaused};
        break;
      case S::kHibernated:
        path = {S::kRunning, S::kHibernated};
        break;
      case S::kFailed:
        path = {S::kFailed};
        break;
      case S::kDestroying:
        path = {S::kDestroying};
        break;
      case S::kDestroyed:
        path = {S::kDestroying, S::kDestroyed};
        break;
    }
    SandboxRecord r = *inserted;
    for (SandboxState next : path) {
      auto moved = store_->Transition(id, {}, next);
      AIRLOCK_CHECK(moved.has_value());
      r = *moved;
    }
    AIRLOCK_CHECK(r.state == state);
    return r;
  }

  TempDir dir_;
  std::string db_path_ = dir_.path() + "/store.db";
  std::atomic<int64_t> now_{kT0};
  std::unique_ptr<Store> store_;
};

// --- Opening ---------------------------------------------------------------------------------

TEST_F(StoreTest, OpenCreatesSchemaInWalModeWithPrivateFile) {
  EXPECT_EQ(RawQuery(db_path_, "PRAGMA user_version"),
            std::to_string(Store::CurrentSchemaVersion()));
  EXPECT_GE(Store::CurrentSchemaVersion(), 1);
  EXPECT_EQ(RawQuery(db_path_, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM sqlite_master WHERE name = 'sandboxes'"), "1");
  struct stat st {};
  ASSERT_EQ(::stat(db_path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_TRUE(store_->Insert(MakeRecord("sbx-a")).has_value());
  ASSERT_EQ(::stat((db_path_ + "-wal").c_str(), &st), 0) << "no WAL file after a write";
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(store_->CheckIntegrity().has_value());
}

TEST_F(StoreTest, ReopenKeepsRecordsAndDoesNotRemigrate) {
  ASSERT_TRUE(store_->Insert(MakeRecord("sbx-keep")).has_value());
  Reopen();
  Reopen();
  auto got = store_->Get("sbx-keep");
  ASSERT_TRUE(got.has_value()) << got.error().message();
  EXPECT_EQ(got->engine, "jail");
}

TEST_F(StoreTest, RefusesDatabaseFromNewerSchema) {
  store_.reset();
  RawQuery(db_path_, "PRAGMA user_version = 999");
  auto opened = Store::Open(db_path_);
  ASSERT_FALSE(opened.has_value());
  EXPECT_EQ(opened.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(opened.error().message().find("999"), std::string::npos) << opened.error().message();
}

TEST(StoreOpenTest, FailsOnMissingDirectory) {
  auto opened = Store::Open("/nonexistent-airlock-dir/store.db");
  ASSERT_FALSE(opened.has_value());
  EXPECT_EQ(opened.error().code(), ErrorCode::kNotFound) << opened.error().message();
}

// --- Records ---------------------------------------------------------------------------------

TEST_F(StoreTest, InsertThenGetRoundTripsEveryField) {
  SandboxRecord r = MakeRecord("sbx-round");
  r.expires_at_ms = kT0 + 60'000;
  r.engine_state = R"({"init_pid":1234,"uid_base":165536})";
  r.resources = {{"net.slot", "7"}, {"workdir", "/srv"}};
  r.error = "none yet";
  r.created_at_ms = 1;  // ignored: the store sets the times
  auto inserted = store_->Insert(r);
  ASSERT_TRUE(inserted.has_value()) << inserted.error().message();
  EXPECT_EQ(inserted->created_at_ms, kT0);
  EXPECT_EQ(inserted->updated_at_ms, kT0);
  auto got = store_->Get("sbx-round");
  ASSERT_TRUE(got.has_value()) << got.error().message();
  EXPECT_EQ(*got, *inserted);
  EXPECT_EQ(got->env, r.env);
  EXPECT_EQ(got->metadata, r.metadata);
  EXPECT_EQ(got->resources, r.resources);
  EXPECT_EQ(got->limits, r.limits);
}

TEST_F(StoreTest, InsertOfExistingIdFailsAlreadyExists) {
  ASSERT_TRUE(store_->Insert(MakeRecord("sbx-dup")).has_value());
  auto again = store_->Insert(MakeRecord("sbx-dup"));
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(again.error().message(), "sandbox sbx-dup already exists");
}

TEST_F(StoreTest, GetOfMissingIdFailsNotFound) {
  auto got = store_->Get("sbx-nope");
  ASSERT_FALSE(got.has_value());
  EXPECT_EQ(got.error().code(), ErrorCode::kNotFound);
}

TEST_F(StoreTest, InsertRefusesBadFields) {
  SandboxRecord running = MakeRecord("sbx-x");
  running.state = S::kRunning;
  SandboxRecord negative = MakeRecord("sbx-y");
  negative.limits.memory_mb = -1;
  SandboxRecord nan = MakeRecord("sbx-z");
  nan.limits.cpus = std::numeric_limits<double>::quiet_NaN();
  SandboxRecord bad_ttl = MakeRecord("sbx-w");
  bad_ttl.expires_at_ms = -5;
  SandboxRecord bad_utf8 = MakeRecord("sbx-v");
  bad_utf8.metadata["k"] = "\xff\xfe";
  for (const SandboxRecord& r : {running, negative, nan, bad_ttl, bad_utf8}) {
    auto inserted = store_->Insert(r);
    ASSERT_FALSE(inserted.has_value()) << r.id;
    EXPECT_EQ(inserted.error().code(), ErrorCode::kInvalidArgument) << r.id;
    EXPECT_EQ(store_->Get(r.id).error().code(), ErrorCode::kNotFound) << r.id;
  }
}

TEST_F(StoreTest, BadIdsAreRefusedBeforeAnySql) {
  ASSERT_TRUE(store_->Insert(MakeRecord("sbx-ok")).has_value());
  const std::string bad_ids[] = {"",
                                 "-sbx",
                                 "sbx/../../etc",
                                 "sbx-1'; DROP TABLE sandboxes; --",
                                 "sbx 1",
                                 std::string(65, 'a'),
                                 std::string("sbx\0x", 5),
                                 "sbx-é"};
  for (const std::string& id : bad_ids) {
    // The error is ValidateSandboxId's own, unwrapped: no SQL ran to add context.
    const std::string expected = ValidateSandboxId(id).error().message();
    auto check = [&](const Error& e, const char* op) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << op << " " << id;
      EXPECT_EQ(e.message(), expected) << op << " " << id;
    };
    check(store_->Insert(MakeRecord(id)).error(), "Insert");
    check(store_->Get(id).error(), "Get");
    check(store_->Transition(id, {}, S::kRunning).error(), "Transition");
    check(store_->MarkFailed(id, "x").error(), "MarkFailed");
    check(store_->UpdateTtl(id, 1).error(), "UpdateTtl");
    check(store_->UpdateMetadata(id, {}).error(), "UpdateMetadata");
    check(store_->SetRuntimeInfo(id, "", {}).error(), "SetRuntimeInfo");
    check(store_->Delete(id).error(), "Delete");
  }
  auto all = store_->List();
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->size(), 1u);
}

TEST_F(StoreTest, InjectionLookingValuesAreStoredVerbatim) {
  SandboxRecord r = MakeRecord("sbx-inject");
  r.metadata = {{"note", "'); DROP TABLE sandboxes; --"},
                {"q\"uote", "a'b\"c\\d"},
                {"$.path", "json_each"},
                {"nul", std::string("a\0b", 3)}};
  r.env = {"X=$(rm -rf /)", "Y='; DELETE FROM api_keys; --"};
  r.template_name = "t' OR '1'='1";
  ASSERT_TRUE(store_->Insert(r).has_value());
  auto got = store_->Get("sbx-inject");
  ASSERT_TRUE(got.has_value()) << got.error().message();
  EXPECT_EQ(got->metadata, r.metadata);
  EXPECT_EQ(got->env, r.env);
  EXPECT_EQ(got->template_name, r.template_name);
  auto found = store_->List({.metadata = {{"note", "'); DROP TABLE sandboxes; --"}}});
  ASSERT_TRUE(found.has_value()) << found.error().message();
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ(found->front().id, "sbx-inject");
  auto none = store_->List({.metadata = {{"note", "' OR 1=1 --"}}});
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM sandboxes"), "1");
}

// --- The state machine -----------------------------------------------------------------------

// The spec's transitions, written out independently of the table in sandbox_state.cc so an
// edit to one without the other fails here.
const std::set<std::pair<S, S>> kExpectedTransitions = {
    {S::kCreating, S::kRunning},  {S::kCreating, S::kFailed},   {S::kCreating, S::kDestroying},
    {S::kRunning, S::kPaused},    {S::kPaused, S::kRunning},    {S::kRunning, S::kDestroying},
    {S::kPaused, S::kDestroying}, {S::kFailed, S::kDestroying}, {S::kDestroying, S::kDestroyed},
    {S::kRunning, S::kFailed},    {S::kPaused, S::kFailed},     {S::kDestroying, S::kFailed},
    {S::kRunning, S::kHibernated}, {S::kHibernated, S::kRunning},
    {S::kHibernated, S::kDestroying}, {S::kHibernated, S::kFailed},
};

TEST(SandboxStateTest, TableMatchesSpec) {
  std::set<std::pair<S, S>> table;
  for (const StateTransition& t : AllowedTransitions()) {
    EXPECT_TRUE(table.insert({t.from, t.to}).second) << "duplicate entry";
    EXPECT_NE(std::strlen(t.why), 0u);
  }
  EXPECT_EQ(table, kExpectedTransitions);
  for (S to : kAllSandboxStates) EXPECT_FALSE(IsAllowedTransition(S::kDestroyed, to));
}

TEST(SandboxStateTest, NamesRoundTrip) {
  std::set<std::string_view> names;
  for (S s : kAllSandboxStates) {
    names.insert(SandboxStateName(s));
    EXPECT_EQ(ParseSandboxState(SandboxStateName(s)), s);
  }
  EXPECT_EQ(names.size(), std::size(kAllSandboxStates));
  EXPECT_FALSE(ParseSandboxState("Running").has_value());
  EXPECT_FALSE(ParseSandboxState("").has_value());
}

TEST_F(StoreTest, EveryStatePairIsAllowedOrRefusedAsTheTableSays) {
  int n = 0;
  for (S from : kAllSandboxStates) {
    for (S to : kAllSandboxStates) {
      std::string id = "sbx-pair-" + std::to_string(n++);
      InState(id, from);
      const S from_set[] = {from};
      auto moved = store_->Transition(id, from_set, to);
      const bool expected = kExpectedTransitions.contains({from, to});
      const std::string what =
          std::string(SandboxStateName(from)) + " -> " + std::string(SandboxStateName(to));
      ASSERT_EQ(moved.has_value(), expected) << what;
      auto now = store_->Get(id);
      ASSERT_TRUE(now.has_value());
      if (expected) {
        EXPECT_EQ(moved->state, to) << what;
        EXPECT_EQ(now->state, to) << what;
      } else {
        EXPECT_EQ(moved.error().code(), ErrorCode::kFailedPrecondition) << what;
        EXPECT_EQ(HttpStatus(moved.error().code()), 409);
        EXPECT_NE(moved.error().message().find(std::string(SandboxStateName(from))),
                  std::string::npos)
            << moved.error().message();
        EXPECT_EQ(now->state, from) << what << ": a refused transition changed the record";
      }
    }
  }
}

TEST_F(StoreTest, WrongStateMessageNamesCurrentAndWantedState) {
  InState("sbx-p", S::kPaused);
  const S running[] = {S::kRunning};
  auto paused = store_->Transition("sbx-p", running, S::kPaused);
  ASSERT_FALSE(paused.has_value());
  EXPECT_EQ(paused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(paused.error().message(), "sandbox sbx-p is paused, not running");

  InState("sbx-d", S::kDestroyed);
  const S live[] = {S::kRunning, S::kPaused};
  auto destroyed = store_->Transition("sbx-d", live, S::kDestroying);
  ASSERT_FALSE(destroyed.has_value());
  EXPECT_EQ(destroyed.error().message(), "sandbox sbx-d is destroyed, not running or paused");

  auto to_creating = store_->Transition("sbx-p", {}, S::kCreating);
  ASSERT_FALSE(to_creating.has_value());
  EXPECT_EQ(to_creating.error().message(), "sandbox sbx-p is paused, cannot become creating");

  EXPECT_EQ(RequireState("sbx-q", S::kCreating, running).error().message(),
            "sandbox sbx-q is creating, not running");
  EXPECT_TRUE(RequireState("sbx-q", S::kRunning, running).has_value());
  EXPECT_EQ(store_->Transition("sbx-absent", {}, S::kRunning).error().code(), ErrorCode::kNotFound);
}

TEST_F(StoreTest, TransitionAppliesMutationButKeepsIdentity) {
  InState("sbx-m", S::kCreating);
  now_ = kT0 + 500;
  auto moved = store_->Transition("sbx-m", {}, S::kRunning, [](SandboxRecord& r) {
    r.engine_state = "{\"init_pid\":4242}";
    r.resources["cgroup"] = "/sys/fs/cgroup/x";
    r.id = "sbx-other";       // ignored
    r.state = S::kDestroyed;  // ignored
    r.created_at_ms = 7;      // ignored
  });
  ASSERT_TRUE(moved.has_value()) << moved.error().message();
  auto got = store_->Get("sbx-m");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, *moved);
  EXPECT_EQ(got->state, S::kRunning);
  EXPECT_EQ(got->engine_state, "{\"init_pid\":4242}");
  EXPECT_EQ(got->resources.at("cgroup"), "/sys/fs/cgroup/x");
  EXPECT_EQ(got->created_at_ms, kT0);
  EXPECT_EQ(got->updated_at_ms, kT0 + 500);
  EXPECT_EQ(store_->Get("sbx-other").error().code(), ErrorCode::kNotFound);
}

TEST_F(StoreTest, MarkFailedRecordsWhyAndIsRefusedWhenTerminal) {
  InState("sbx-f", S::kRunning);
  auto failed = store_->MarkFailed("sbx-f", "init exited during recovery");
  ASSERT_TRUE(failed.has_value()) << failed.error().message();
  EXPECT_EQ(store_->Get("sbx-f")->error, "init exited during recovery");
  EXPECT_EQ(store_->Get("sbx-f")->state, S::kFailed);
  InState("sbx-g", S::kDestroyed);
  auto refused = store_->MarkFailed("sbx-g", "x");
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(store_->Get("sbx-g")->error, "");
}

TEST_F(StoreTest, EditsWorkUntilDestroyed) {
  InState("sbx-e", S::kPaused);
  ASSERT_TRUE(store_->UpdateTtl("sbx-e", kT0 + 10).has_value());
  ASSERT_TRUE(store_->UpdateMetadata("sbx-e", {{"a", "b"}}).has_value());
  ASSERT_TRUE(store_->SetRuntimeInfo("sbx-e", "opaque 99", {{"uid_base", "65536"}}).has_value());
  auto got = store_->Get("sbx-e");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->expires_at_ms, kT0 + 10);
  EXPECT_EQ(got->metadata, (std::map<std::string, std::string>{{"a", "b"}}));
  EXPECT_EQ(got->engine_state, "opaque 99");
  EXPECT_EQ(got->resources.at("uid_base"), "65536");
  EXPECT_EQ(got->state, S::kPaused);
  EXPECT_EQ(store_->UpdateTtl("sbx-e", -1).error().code(), ErrorCode::kInvalidArgument);

  InState("sbx-gone", S::kDestroyed);
  for (const Error& e :
       {store_->UpdateTtl("sbx-gone", 5).error(), store_->UpdateMetadata("sbx-gone", {}).error(),
        store_->SetRuntimeInfo("sbx-gone", "", {}).error()}) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_EQ(e.message(), "sandbox sbx-gone is destroyed");
  }
  EXPECT_EQ(store_->UpdateTtl("sbx-missing", 5).error().code(), ErrorCode::kNotFound);
}

TEST_F(StoreTest, ListFiltersByStateAndMetadata) {
  auto with_meta = [&](std::string id, std::map<std::string, std::string> meta, S state) {
    InState(id, state, std::move(meta));
    now_ += 1;
  };
  with_meta("sbx-1", {{"team", "red"}, {"env", "ci"}}, S::kRunning);
  with_meta("sbx-2", {{"team", "red"}, {"env", "dev"}}, S::kPaused);
  with_meta("sbx-3", {{"team", "blue"}, {"env", "ci"}}, S::kRunning);
  with_meta("sbx-4", {{"team", "none"}}, S::kDestroyed);

  auto ids = [&](const ListFilter& f) {
    std::vector<std::string> out;
    auto listed = store_->List(f);
    AIRLOCK_CHECK(listed.has_value());
    for (const auto& r : *listed) out.push_back(r.id);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(ids({}), (V{"sbx-1", "sbx-2", "sbx-3", "sbx-4"}));
  EXPECT_EQ(ids({.states = {S::kRunning}}), (V{"sbx-1", "sbx-3"}));
  EXPECT_EQ(ids({.states = {S::kPaused, S::kDestroyed}}), (V{"sbx-2", "sbx-4"}));
  EXPECT_EQ(ids({.metadata = {{"team", "red"}}}), (V{"sbx-1", "sbx-2"}));
  EXPECT_EQ(ids({.metadata = {{"team", "red"}, {"env", "ci"}}}), (V{"sbx-1"}));
  EXPECT_EQ(ids({.states = {S::kRunning}, .metadata = {{"env", "ci"}}}), (V{"sbx-1", "sbx-3"}));
  EXPECT_EQ(ids({.states = {S::kPaused}, .metadata = {{"env", "ci"}}}), V{});
  EXPECT_EQ(ids({.metadata = {{"team", "green"}}}), V{});
  EXPECT_EQ(ids({.metadata = {{"red", "team"}}}), V{}) << "key and value must not be swapped";
}

TEST_F(StoreTest, ExpiredReturnsPassedDeadlinesOfLiveRecords) {
  auto with_ttl = [&](std::string id, S state, int64_t expires) {
    InState(id, state);
    ASSERT_TRUE(store_->UpdateTtl(id, expires).has_value());
  };
  with_ttl("sbx-past", S::kRunning, kT0 - 1000);
  with_ttl("sbx-exact", S::kPaused, kT0);
  with_ttl("sbx-future", S::kRunning, kT0 + 1);
  with_ttl("sbx-none", S::kRunning, 0);
  with_ttl("sbx-failed", S::kFailed, kT0 - 5);
  with_ttl("sbx-creating", S::kCreating, kT0 - 2000);
  with_ttl("sbx-destroying", S::kDestroying, kT0 - 1000);
  InState("sbx-destroyed", S::kDestroying);
  ASSERT_TRUE(store_->UpdateTtl("sbx-destroyed", kT0 - 1000).has_value());
  ASSERT_TRUE(store_->Transition("sbx-destroyed", {}, S::kDestroyed).has_value());

  auto expired = store_->Expired(kT0);
  ASSERT_TRUE(expired.has_value());
  EXPECT_EQ(*expired,
            (std::vector<std::string>{"sbx-creating", "sbx-past", "sbx-failed", "sbx-exact"}));
  auto later = store_->Expired(kT0 + 1);
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->size(), 5u);
  EXPECT_TRUE(store_->Expired(0)->empty());
}

TEST_F(StoreTest, DeleteAndPurgeRemoveOnlyDestroyedRecords) {
  InState("sbx-live", S::kRunning);
  InState("sbx-old", S::kDestroyed);
  now_ = kT0 + 10'000;
  InState("sbx-new", S::kDestroyed);

  auto refused = store_->Delete("sbx-live");
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().message(), "sandbox sbx-live is running, not destroyed");
  EXPECT_EQ(store_->Delete("sbx-absent").error().code(), ErrorCode::kNotFound);

  auto purged = store_->PurgeDestroyed(kT0 + 5'000);
  ASSERT_TRUE(purged.has_value());
  EXPECT_EQ(*purged, 1);
  EXPECT_EQ(store_->Get("sbx-old").error().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(store_->Get("sbx-new").has_value());
  EXPECT_TRUE(store_->Get("sbx-live").has_value());

  ASSERT_TRUE(store_->Delete("sbx-new").has_value());
  EXPECT_EQ(store_->Get("sbx-new").error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(*store_->PurgeDestroyed(kT0 + 1'000'000), 0);
}

TEST_F(StoreTest, CountByStateCoversEveryState) {
  InState("sbx-a", S::kRunning);
  InState("sbx-b", S::kRunning);
  InState("sbx-c", S::kFailed);
  auto counts = store_->CountByState();
  ASSERT_TRUE(counts.has_value());
  EXPECT_EQ(counts->size(), std::size(kAllSandboxStates));
  EXPECT_EQ(counts->at(S::kRunning), 2);
  EXPECT_EQ(counts->at(S::kFailed), 1);
  EXPECT_EQ(counts->at(S::kCreating), 0);
  EXPECT_EQ(counts->at(S::kDestroyed), 0);
}

TEST_F(StoreTest, ConcurrentInsertsAndTransitionsFromEightThreads) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::string id = "sbx-t" + std::to_string(t) + "-" + std::to_string(i);
        if (!store_->Insert(MakeRecord(id)).has_value()) ++failures;
        if (!store_->Transition(id, {}, S::kRunning).has_value()) ++failures;
        if (!store_->List({.states = {S::kRunning}}).has_value()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto counts = store_->CountByState();
  ASSERT_TRUE(counts.has_value());
  EXPECT_EQ(counts->at(S::kRunning), kThreads * kPerThread);
  EXPECT_TRUE(store_->CheckIntegrity().has_value());
}

// --- Durability ------------------------------------------------------------------------------

// The child: inserts records forever and, every third one, destroys and deletes an earlier
// one. "I id" / "D id" are sent only after the insert / delete was committed; "P id" before a
// delete starts, since a delete may commit and the kill land before its "D".
[[noreturn]] void DurabilityChild(const std::string& db_path, int ack_fd) {
  auto opened = Store::Open(db_path);
  if (!opened) {
    (void)WriteAll(ack_fd, "E " + opened.error().message() + "\n");
    _exit(1);
  }
  // Opened: the parent's kill window starts now (opening took seconds under the sanitizers on a
  // loaded host, and a kill that always came first exercised nothing).
  if (!WriteAll(ack_fd, "O -\n")) _exit(1);
  Store& store = **opened;
  std::vector<std::string> undeleted;
  for (int i = 0;; ++i) {
    std::string id = NewSandboxId();
    auto inserted = store.Insert(MakeRecord(id));
    if (!inserted) {
      (void)WriteAll(ack_fd, "E " + inserted.error().message() + "\n");
      _exit(1);
    }
    if (!WriteAll(ack_fd, "I " + id + "\n")) _exit(1);
    undeleted.push_back(id);
    if (i % 3 == 2) {
      std::string victim = undeleted.front();
      undeleted.erase(undeleted.begin());
      if (!WriteAll(ack_fd, "P " + victim + "\n")) _exit(1);
      if (!store.Transition(victim, {}, S::kDestroying) ||
          !store.Transition(victim, {}, S::kDestroyed) || !store.Delete(victim)) {
        (void)WriteAll(ack_fd, "E deleting " + victim + "\n");
        _exit(1);
      }
      if (!WriteAll(ack_fd, "D " + victim + "\n")) _exit(1);
    }
  }
}

TEST(StoreDurabilityTest, SigkillNeverLosesAnAcknowledgedWrite) {
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed());
  constexpr int kRounds = 20;
  size_t total_acked = 0;
  for (int round = 0; round < kRounds; ++round) {
    TempDir dir;
    const std::string db_path = dir.path() + "/store.db";
    std::set<std::string> inserted, pending, deleted;
    // Several kills per database: later rounds of the same db start from a crashed state.
    for (int kill = 0; kill < 3; ++kill) {
      UniqueFd ends[2];
      ASSERT_TRUE(MakePipe(ends).has_value());
      pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ends[0].Reset();
        DurabilityChild(db_path, ends[1].get());
      }
      ends[1].Reset();
      const int delay_ms = std::uniform_int_distribution<int>(0, 60)(rng);
      // Until the child says it has opened the store: at most 10 s, then the kill comes anyway.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      bool opened = false;
      std::string acks;
      char buf[4096];
      bool killed = false;
      while (true) {  // read while waiting, so a full pipe never stalls the child
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now())
                        .count();
        if (!killed && left <= 0) {
          ASSERT_EQ(::kill(pid, SIGKILL), 0);
          killed = true;
        }
        pollfd pfd{ends[0].get(), POLLIN, 0};
        int ready = ::poll(&pfd, 1, killed ? 5000 : static_cast<int>(left));
        if (ready <= 0) {
          ASSERT_FALSE(killed) << "the killed child's pipe never closed";
          continue;
        }
        ssize_t n = RetryEintr([&] { return ::read(ends[0].get(), buf, sizeof(buf)); });
        ASSERT_GE(n, 0);
        if (n == 0) break;
        acks.append(buf, static_cast<size_t>(n));
        if (!opened && !killed) {
          opened = true;
          deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms);
        }
      }
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
          << "child ended on its own: " << acks.substr(acks.rfind('\n', acks.size() - 2) + 1);
      std::istringstream lines(acks);
      std::string line;
      while (std::getline(lines, line)) {
        if (lines.eof()) break;  // a line cut by the kill was not fully acknowledged
        ASSERT_GE(line.size(), 3u);
        ASSERT_NE(line[0], 'E') << line;
        std::string id = line.substr(2);
        switch (line[0]) {
          case 'I':
            inserted.insert(id);
            break;
          case 'P':
            pending.insert(id);
            break;
          case 'D':
            deleted.insert(id);
            break;
          case 'O':
            break;
          default:
            FAIL() << "unexpected line from the child: " << line;
        }
      }
    }
    auto store = Store::Open(db_path);
    ASSERT_TRUE(store.has_value()) << "round " << round << ": " << store.error().message();
    EXPECT_TRUE((*store)->CheckIntegrity().has_value()) << "round " << round;
    for (const std::string& id : inserted) {
      auto got = (*store)->Get(id);
      if (deleted.contains(id)) {
        EXPECT_FALSE(got.has_value()) << "acknowledged delete of " << id << " undone";
      } else if (pending.contains(id)) {
        continue;  // deleted or not: both are fine for a delete nobody acknowledged
      } else {
        EXPECT_TRUE(got.has_value()) << "round " << round << ": acknowledged " << id << " lost";
      }
    }
    total_acked += inserted.size();
  }
  // Not an assertion on speed: only that the test exercised something.
  EXPECT_GT(total_acked, 0u) << "no child ever acknowledged a write";
  std::printf("durability: %zu acknowledged inserts over %d rounds\n", total_acked, kRounds);
}

// --- API keys --------------------------------------------------------------------------------

TEST_F(StoreTest, CreatedKeyAuthenticatesAndOnlyItsHashIsStored) {
  auto key = store_->CreateKey("ci-bot");
  ASSERT_TRUE(key.has_value()) << key.error().message();
  EXPECT_EQ(key->plaintext.size(), 67u);
  EXPECT_TRUE(key->plaintext.starts_with("al_"));
  EXPECT_EQ(key->info.name, "ci-bot");
  EXPECT_FALSE(key->info.admin);
  auto who = store_->Authenticate(key->plaintext);
  ASSERT_TRUE(who.has_value()) << who.error().message();
  EXPECT_EQ(who->id, key->info.id);
  EXPECT_EQ(who->name, "ci-bot");

  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM api_keys WHERE hash LIKE '%" +
                                   key->plaintext.substr(3, 16) + "%' OR name LIKE '%" +
                                   key->plaintext.substr(3, 16) + "%'"),
            "0");
  EXPECT_EQ(RawQuery(db_path_, "SELECT length(hash) FROM api_keys"), "64");

  auto other = store_->CreateKey("ci-bot");  // names need not be unique; keys always are
  ASSERT_TRUE(other.has_value());
  EXPECT_NE(other->plaintext, key->plaintext);
  EXPECT_EQ(store_->Authenticate(other->plaintext)->id, other->info.id);
}

TEST_F(StoreTest, EveryAuthenticationFailureLooksTheSame) {
  auto key = store_->CreateKey("user");
  ASSERT_TRUE(key.has_value());
  auto revoked = store_->CreateKey("revoked");
  ASSERT_TRUE(revoked.has_value());
  ASSERT_TRUE(store_->RevokeKey(revoked->info.id).has_value());

  std::string flipped = key->plaintext;
  flipped.back() = flipped.back() == '0' ? '1' : '0';
  const std::string presented[] = {
      "",
      flipped,
      revoked->plaintext,
      key->plaintext.substr(0, 66),
      key->plaintext + "0",
      "Bearer " + key->plaintext,
      "al_" + std::string(64, 'g'),
      std::string(67, '\0'),
      "' OR '1'='1",
  };
  std::set<std::string> messages;
  for (const std::string& p : presented) {
    auto who = store_->Authenticate(p);
    ASSERT_FALSE(who.has_value()) << p;
    EXPECT_EQ(who.error().code(), ErrorCode::kUnauthenticated) << p;
    EXPECT_EQ(HttpStatus(who.error().code()), 401);
    messages.insert(who.error().message());
  }
  EXPECT_EQ(messages.size(), 1u);
  EXPECT_TRUE(store_->Authenticate(key->plaintext).has_value());
  EXPECT_EQ(store_->RevokeKey(12345).error().code(), ErrorCode::kNotFound);
  auto keys = store_->ListKeys();
  ASSERT_TRUE(keys.has_value());
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_FALSE((*keys)[0].revoked);
  EXPECT_TRUE((*keys)[1].revoked);
}

TEST_F(StoreTest, KeyNamesAreValidated) {
  for (std::string_view name :
       {std::string_view(""), std::string_view("tab\there"), std::string_view("nul\0", 4)}) {
    auto key = store_->CreateKey(name);
    ASSERT_FALSE(key.has_value());
    EXPECT_EQ(key.error().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_FALSE(store_->CreateKey(std::string(65, 'n')).has_value());
  EXPECT_TRUE(store_->CreateKey(std::string(64, 'n')).has_value());
}

class AdminKeyTest : public StoreTest {
 protected:
  std::string key_path_ = dir_.path() + "/admin.key";

  std::string ReadKeyFile() {
    auto text = ReadFileToString(key_path_);
    AIRLOCK_CHECK(text.has_value());
    return *text;
  }
};

TEST_F(AdminKeyTest, FirstStartWritesAPrivateKeyFileThatAuthenticatesAsAdmin) {
  auto state = store_->EnsureAdminKey(dir_.path());
  ASSERT_TRUE(state.has_value()) << state.error().message();
  EXPECT_EQ(*state, AdminKeyState::kCreated);
  struct stat st {};
  ASSERT_EQ(::lstat(key_path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(std::filesystem::exists(key_path_ + ".tmp"));
  std::string text = ReadKeyFile();
  ASSERT_TRUE(text.ends_with("\n"));
  text.pop_back();
  auto who = store_->Authenticate(text);
  ASSERT_TRUE(who.has_value()) << who.error().message();
  EXPECT_TRUE(who->admin);
  EXPECT_EQ(who->name, "admin");
}

TEST_F(AdminKeyTest, LaterStartsLeaveTheFileAlone) {
  ASSERT_EQ(*store_->EnsureAdminKey(dir_.path()), AdminKeyState::kCreated);
  std::string before = ReadKeyFile();
  struct stat st_before {
  }, st_after{};
  ASSERT_EQ(::stat(key_path_.c_str(), &st_before), 0);
  Reopen();
  auto state = store_->EnsureAdminKey(dir_.path());
  ASSERT_TRUE(state.has_value()) << state.error().message();
  EXPECT_EQ(*state, AdminKeyState::kPresent);
  ASSERT_EQ(::stat(key_path_.c_str(), &st_after), 0);
  EXPECT_EQ(ReadKeyFile(), before);
  EXPECT_EQ(st_after.st_ino, st_before.st_ino);
  EXPECT_EQ(st_after.st_mtim.tv_nsec, st_before.st_mtim.tv_nsec);
  EXPECT_EQ(store_->ListKeys()->size(), 1u);
}

TEST_F(AdminKeyTest, DeletedFileIsReportedNotRecreated) {
  ASSERT_EQ(*store_->EnsureAdminKey(dir_.path()), AdminKeyState::kCreated);
  ASSERT_EQ(::unlink(key_path_.c_str()), 0);
  auto state = store_->EnsureAdminKey(dir_.path());
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(*state, AdminKeyState::kFileMissing);
  EXPECT_FALSE(std::filesystem::exists(key_path_));
  EXPECT_EQ(store_->ListKeys()->size(), 1u);
}

TEST_F(AdminKeyTest, FileWithoutHashIsAdopted) {
  // What a crash between writing the file and storing its hash leaves behind.
  const std::string key = "al_" + std::string(64, 'a');
  {
    auto fd = OpenFile(key_path_, O_WRONLY | O_CREAT | O_EXCL, 0644);
    ASSERT_TRUE(fd.has_value());
    ASSERT_TRUE(WriteAll(fd->get(), key + "\n").has_value());
  }
  auto state = store_->EnsureAdminKey(dir_.path());
  ASSERT_TRUE(state.has_value()) << state.error().message();
  EXPECT_EQ(*state, AdminKeyState::kAdopted);
  auto who = store_->Authenticate(key);
  ASSERT_TRUE(who.has_value());
  EXPECT_TRUE(who->admin);
  struct stat st {};
  ASSERT_EQ(::stat(key_path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(*store_->EnsureAdminKey(dir_.path()), AdminKeyState::kPresent);
}

TEST_F(AdminKeyTest, MalformedFileOrSymlinkIsRefused) {
  {
    auto fd = OpenFile(key_path_, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ASSERT_TRUE(fd.has_value());
    ASSERT_TRUE(WriteAll(fd->get(), "al_short").has_value());
  }
  auto state = store_->EnsureAdminKey(dir_.path());
  ASSERT_FALSE(state.has_value());
  EXPECT_EQ(state.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(store_->ListKeys()->empty());

  ASSERT_EQ(::unlink(key_path_.c_str()), 0);
  ASSERT_EQ(::symlink("/etc/passwd", key_path_.c_str()), 0);
  state = store_->EnsureAdminKey(dir_.path());
  ASSERT_FALSE(state.has_value());
  EXPECT_EQ(state.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(store_->ListKeys()->empty());
}

// --- Warm pools ------------------------------------------------------------------------------

// A ready pooled record: made by the filler (pooled), then running.
SandboxRecord Pooled(Store& store, const std::string& id, const std::string& template_name) {
  SandboxRecord r;
  r.id = id;
  r.engine = "jail";
  r.template_name = template_name;
  r.pooled = true;
  AIRLOCK_CHECK(store.Insert(r).has_value());
  auto running = store.Transition(id, {}, S::kRunning);
  AIRLOCK_CHECK(running.has_value());
  return *running;
}

TEST_F(StoreTest, PooledRecordsAreKeptApartFromTheOthers) {
  Pooled(*store_, "sbx-pool1", "base");
  InState("sbx-user1", S::kRunning);
  auto got = store_->Get("sbx-pool1");
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->pooled);
  EXPECT_EQ(got->expires_at_ms, 0);
  Reopen();  // the flag is durable
  EXPECT_TRUE(store_->Get("sbx-pool1")->pooled);
  EXPECT_FALSE(store_->Get("sbx-user1")->pooled);

  auto unpooled = store_->List({.pooled = false});
  ASSERT_TRUE(unpooled.has_value());
  ASSERT_EQ(unpooled->size(), 1u);
  EXPECT_EQ((*unpooled)[0].id, "sbx-user1");
  auto pooled = store_->List({.pooled = true});
  ASSERT_EQ(pooled->size(), 1u);
  EXPECT_EQ((*pooled)[0].id, "sbx-pool1");
  EXPECT_EQ(store_->List()->size(), 2u);  // recovery sees both

  // The state gauge counts the user's sandboxes only; the pool has its own.
  EXPECT_EQ((*store_->CountByState())[S::kRunning], 1);
  EXPECT_EQ(*store_->CountPooledReady(), (std::map<std::string, int64_t>{{"base", 1}}));
}

TEST_F(StoreTest, ClaimTakesTheOldestReadyPooledRecordOnce) {
  Pooled(*store_, "sbx-old", "base");
  now_ += 10;
  Pooled(*store_, "sbx-new", "base");
  Pooled(*store_, "sbx-other", "py");
  ASSERT_TRUE(store_->Insert({.id = "sbx-making", .template_name = "base", .pooled = true}));

  auto claimed = store_->ClaimPooled("base", [](SandboxRecord& r) {
    r.metadata = {{"team", "ml"}};
    r.env = {"A=1"};
    r.expires_at_ms = kT0 + 60'000;
    r.limits.memory_mb = 256;
    r.id = "sbx-hijack";  // ignored: the id is kept
    r.template_name = "py";  // and the template
  });
  ASSERT_TRUE(claimed.has_value()) << claimed.error().message();
  ASSERT_TRUE(claimed->has_value());
  EXPECT_EQ((*claimed)->id, "sbx-old");
  EXPECT_EQ((*claimed)->template_name, "base");
  EXPECT_FALSE((*claimed)->pooled);
  EXPECT_EQ((*claimed)->state, S::kRunning);
  EXPECT_EQ(*store_->Get("sbx-old"), **claimed);  // committed as returned
  EXPECT_EQ(store_->Get("sbx-old")->metadata.at("team"), "ml");
  EXPECT_EQ(store_->Get("sbx-old")->expires_at_ms, kT0 + 60'000);

  auto second = store_->ClaimPooled("base", {});
  ASSERT_TRUE(second.has_value() && second->has_value());
  EXPECT_EQ((*second)->id, "sbx-new");
  // A record still being made (creating) is never handed out.
  auto none = store_->ClaimPooled("base", {});
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(*store_->CountPooledReady(), (std::map<std::string, int64_t>{{"py", 1}}));
}

TEST_F(StoreTest, ConcurrentClaimsNeverShareARecord) {
  for (int i = 0; i < 8; ++i) Pooled(*store_, "sbx-c" + std::to_string(i), "base");
  std::mutex mu;
  std::multiset<std::string> got;
  int empty = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      auto claimed = store_->ClaimPooled("base", {});
      ASSERT_TRUE(claimed.has_value()) << claimed.error().message();
      std::lock_guard lock(mu);
      if (*claimed) {
        got.insert((*claimed)->id);
      } else {
        ++empty;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(got.size(), 8u);
  EXPECT_EQ(std::set<std::string>(got.begin(), got.end()).size(), 8u);
  EXPECT_EQ(empty, 8);
}

TEST_F(StoreTest, TakeForDestroyKeepsTheRecordHidden) {
  Pooled(*store_, "sbx-shrink", "base");
  auto taken = store_->TakePooledForDestroy("base");
  ASSERT_TRUE(taken.has_value() && taken->has_value());
  EXPECT_EQ((*taken)->state, S::kDestroying);
  EXPECT_TRUE((*taken)->pooled);
  EXPECT_FALSE(store_->ClaimPooled("base", {})->has_value());
  EXPECT_FALSE(store_->TakePooledForDestroy("base")->has_value());
  ASSERT_TRUE(store_->Transition("sbx-shrink", {}, S::kDestroyed).has_value());
  EXPECT_TRUE(store_->List({.pooled = false})->empty());
}

TEST_F(StoreTest, ExpiredNeverNamesAPooledRecord) {
  Pooled(*store_, "sbx-pooled", "base");
  // Only a claim sets a deadline; even a stray one does not make the reaper take it.
  ASSERT_TRUE(store_->UpdateTtl("sbx-pooled", kT0 - 1).has_value());
  EXPECT_TRUE(store_->Expired(kT0)->empty());
}

TEST_F(StoreTest, PoolSizesAreDurableAndValidated) {
  EXPECT_TRUE(store_->PoolSizes()->empty());
  ASSERT_TRUE(store_->SetPoolSize("base", 4).has_value());
  ASSERT_TRUE(store_->SetPoolSize("py", 0).has_value());
  ASSERT_TRUE(store_->SetPoolSize("base", 2).has_value());  // replaces
  EXPECT_EQ(store_->SetPoolSize("base", -1).error().code(), ErrorCode::kInvalidArgument);
  Reopen();
  EXPECT_EQ(*store_->PoolSizes(), (std::map<std::string, int64_t>{{"base", 2}, {"py", 0}}));
}

TemplateRecord MakeTemplate(const std::string& name, std::vector<std::string> layers = {}) {
  TemplateRecord t;
  t.name = name;
  t.source = "build";
  t.spec = R"({"base": "base"})";
  t.layers = std::move(layers);
  return t;
}

TEST_F(StoreTest, TemplatesAreDurableAndNamesAreUnique) {
  auto made = store_->InsertTemplate(MakeTemplate("app"));
  ASSERT_TRUE(made.has_value()) << made.error().message();
  EXPECT_EQ(made->state, TemplateState::kBuilding);
  EXPECT_EQ(made->created_at_ms, now_.load());
  EXPECT_EQ(store_->InsertTemplate(MakeTemplate("app")).error().code(),
            ErrorCode::kAlreadyExists);
  TemplateRecord ready = *made;
  ready.state = TemplateState::kReady;
  ready.layers = {"l2", "l1"};
  ASSERT_TRUE(store_->UpdateTemplate(ready).has_value());
  Reopen();
  auto got = store_->GetTemplate("app");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->state, TemplateState::kReady);
  EXPECT_EQ(got->layers, (std::vector<std::string>{"l2", "l1"}));
  EXPECT_EQ(store_->GetTemplate("nope").error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->UpdateTemplate(MakeTemplate("nope")).error().code(), ErrorCode::kNotFound);
  TemplateRecord bad = MakeTemplate("bad");
  bad.spec = "[1]";
  EXPECT_EQ(store_->InsertTemplate(bad).error().code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(store_->InsertTemplate(MakeTemplate("b-second")).has_value());
  auto all = store_->ListTemplates();
  ASSERT_TRUE(all.has_value());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].name, "app");  // by name
}

TEST_F(StoreTest, ATemplateInUseOrBuildingIsNotDeleted) {
  TemplateRecord t = MakeTemplate("python-3.11", {"l1"});
  t.state = TemplateState::kBuilding;
  ASSERT_TRUE(store_->InsertTemplate(t).has_value());
  EXPECT_EQ(store_->DeleteTemplate("python-3.11").error().code(), ErrorCode::kFailedPrecondition);
  t.state = TemplateState::kReady;
  ASSERT_TRUE(store_->UpdateTemplate(t).has_value());
  InState("sbx-user1", S::kRunning);  // MakeRecord's template is python-3.11
  auto busy = store_->DeleteTemplate("python-3.11");
  ASSERT_FALSE(busy.has_value());
  EXPECT_EQ(busy.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(busy.error().message().find("sbx-user1"), std::string::npos);
  ASSERT_TRUE(store_->Transition("sbx-user1", {}, S::kDestroying).has_value());
  ASSERT_TRUE(store_->Transition("sbx-user1", {}, S::kDestroyed).has_value());
  // A pooled sandbox of it counts too, and its pool size goes with the template.
  Pooled(*store_, "sbx-pool1", "python-3.11");
  ASSERT_TRUE(store_->SetPoolSize("python-3.11", 1).has_value());
  EXPECT_EQ(store_->DeleteTemplate("python-3.11").error().code(), ErrorCode::kFailedPrecondition);
  ASSERT_TRUE(store_->Transition("sbx-pool1", {}, S::kFailed).has_value());
  ASSERT_TRUE(store_->DeleteTemplate("python-3.11").has_value());
  EXPECT_EQ(store_->GetTemplate("python-3.11").error().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(store_->PoolSizes()->empty());
  EXPECT_EQ(store_->DeleteTemplate("python-3.11").error().code(), ErrorCode::kNotFound);
}

TEST_F(StoreTest, LayersInUseAreThoseOfTemplatesAndLiveSandboxes) {
  ASSERT_TRUE(store_->InsertTemplate(MakeTemplate("t", {"a", "b"})).has_value());
  SandboxRecord live = MakeRecord("sbx-live");
  live.layers = {"c", "b"};
  ASSERT_TRUE(store_->Insert(live).has_value());
  SandboxRecord gone = MakeRecord("sbx-gone");
  gone.layers = {"d"};
  ASSERT_TRUE(store_->Insert(gone).has_value());
  ASSERT_TRUE(store_->Transition("sbx-gone", {}, S::kFailed).has_value());
  EXPECT_EQ(store_->Get("sbx-live")->layers, (std::vector<std::string>{"c", "b"}));
  EXPECT_EQ(*store_->LayersInUse(), (std::set<std::string>{"a", "b", "c"}));
}

// --- Network verdicts -------------------------------------------------------------------------

NetworkEventRecord Verdict(std::string name, std::string verdict = "denied") {
  NetworkEventRecord e;
  e.at_ms = kT0;
  e.kind = "http";
  e.name = std::move(name);
  e.host = e.name;
  e.dest = "198.18.0.2";
  e.port = 80;
  e.verdict = std::move(verdict);
  e.rule = "allowlist";
  e.reason = "not in this sandbox's allowlist";
  return e;
}

NetworkEventBatch Batch(std::string sandbox, int from, int count, int64_t dropped = 0) {
  NetworkEventBatch b{.sandbox = std::move(sandbox), .dropped = dropped};
  for (int i = from; i < from + count; ++i) b.events.push_back(Verdict("n" + std::to_string(i)));
  return b;
}

std::vector<std::string> Names(const NetworkEventPage& page) {
  std::vector<std::string> out;
  for (const auto& e : page.events) out.push_back(e.name);
  return out;
}

TEST_F(StoreTest, NetworkEventsAreNumberedPerSandboxAndReadInPages) {
  InState("sbx-a", S::kRunning);
  InState("sbx-b", S::kRunning);
  NetworkEventRecord full = Verdict("allowed.test", "closed");
  full.kind = "connect";
  full.sni = "allowed.test";
  full.bytes_up = 123;
  full.bytes_down = 4567;
  full.reason = "it's \"quoted\"; DROP TABLE network_events; --";
  NetworkEventBatch a = Batch("sbx-a", 0, 3);
  a.events.push_back(full);
  const NetworkEventBatch batches[] = {a, Batch("sbx-b", 100, 2, /*dropped=*/7)};
  ASSERT_TRUE(store_->AppendNetworkEvents(batches, 1000).has_value());
  const NetworkEventBatch more[] = {Batch("sbx-a", 3, 2)};
  ASSERT_TRUE(store_->AppendNetworkEvents(more, 1000).has_value());

  auto all = store_->NetworkEvents("sbx-a", 0, 100);
  ASSERT_TRUE(all.has_value()) << all.error().message();
  EXPECT_EQ(Names(*all), (std::vector<std::string>{"n0", "n1", "n2", "allowed.test", "n3", "n4"}));
  for (size_t i = 0; i < all->events.size(); ++i) EXPECT_EQ(all->events[i].seq, int64_t(i) + 1);
  full.seq = 4;
  EXPECT_EQ(all->events[3], full) << "every field round-trips";
  EXPECT_FALSE(all->more);
  EXPECT_EQ(all->last_seq, 6);
  EXPECT_EQ(all->dropped, 0);

  // Pages of two, each after the last seq of the one before.
  std::vector<std::string> paged;
  int64_t after = 0;
  int pages = 0;
  while (true) {
    auto page = store_->NetworkEvents("sbx-a", after, 2);
    ASSERT_TRUE(page.has_value());
    ++pages;
    for (const auto& e : page->events) paged.push_back(e.name);
    if (!page->more) break;
    after = page->events.back().seq;
  }
  EXPECT_EQ(paged, Names(*all));
  EXPECT_EQ(pages, 3);

  auto b = store_->NetworkEvents("sbx-b", 0, 100);
  EXPECT_EQ(Names(*b), (std::vector<std::string>{"n100", "n101"}));
  EXPECT_EQ(b->events.front().seq, 1) << "numbers are per sandbox";
  EXPECT_EQ(b->dropped, 7);
  auto none = store_->NetworkEvents("sbx-a", 6, 100);
  EXPECT_TRUE(none->events.empty());
  EXPECT_FALSE(none->more);
  InState("sbx-quiet", S::kRunning);
  auto quiet = store_->NetworkEvents("sbx-quiet", 0, 10);
  ASSERT_TRUE(quiet.has_value());
  EXPECT_TRUE(quiet->events.empty());
  EXPECT_EQ(quiet->last_seq, 0);
  EXPECT_EQ(store_->NetworkEvents("../etc", 0, 10).error().code(), ErrorCode::kInvalidArgument);
}

TEST_F(StoreTest, NetworkEventsKeepOnlyTheNewestAndCountWhatWasRemoved) {
  InState("sbx-a", S::kRunning);
  InState("sbx-b", S::kRunning);
  const NetworkEventBatch first[] = {Batch("sbx-a", 0, 8), Batch("sbx-b", 0, 3)};
  ASSERT_TRUE(store_->AppendNetworkEvents(first, 5).has_value());
  auto page = store_->NetworkEvents("sbx-a", 0, 100);
  EXPECT_EQ(Names(*page), (std::vector<std::string>{"n3", "n4", "n5", "n6", "n7"}));
  EXPECT_EQ(page->events.front().seq, 4);
  EXPECT_EQ(page->trimmed, 3);
  EXPECT_EQ(page->last_seq, 8);
  EXPECT_EQ(store_->NetworkEvents("sbx-b", 0, 100)->events.size(), 3u) << "the cap is per sandbox";

  // A later batch pushes the oldest out; numbers go on, and one larger than the cap keeps
  // only its newest.
  const NetworkEventBatch second[] = {Batch("sbx-a", 8, 2)};
  ASSERT_TRUE(store_->AppendNetworkEvents(second, 5).has_value());
  EXPECT_EQ(Names(*store_->NetworkEvents("sbx-a", 0, 100)),
            (std::vector<std::string>{"n5", "n6", "n7", "n8", "n9"}));
  const NetworkEventBatch burst[] = {Batch("sbx-a", 10, 12, /*dropped=*/4)};
  ASSERT_TRUE(store_->AppendNetworkEvents(burst, 5).has_value());
  page = store_->NetworkEvents("sbx-a", 0, 100);
  EXPECT_EQ(Names(*page), (std::vector<std::string>{"n17", "n18", "n19", "n20", "n21"}));
  EXPECT_EQ(page->events.back().seq, 22);
  EXPECT_EQ(page->trimmed, 17);
  EXPECT_EQ(page->dropped, 4);
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM network_events WHERE sandbox_id = 'sbx-a'"),
            "5");
  // A client that paged up to seq 3 sees the jump: the next page starts at 18.
  EXPECT_EQ(store_->NetworkEvents("sbx-a", 3, 1)->events.front().seq, 18);
}

TEST_F(StoreTest, NetworkEventsGoWithTheirRecord) {
  InState("sbx-live", S::kRunning);
  InState("sbx-old", S::kDestroyed);
  InState("sbx-deleted", S::kDestroyed);
  const NetworkEventBatch batches[] = {Batch("sbx-live", 0, 2), Batch("sbx-old", 0, 2, 1),
                                       Batch("sbx-deleted", 0, 2),
                                       Batch("sbx-never-stored", 0, 2)};
  ASSERT_TRUE(store_->AppendNetworkEvents(batches, 100).has_value())
      << "a batch of a sandbox without a record is skipped, not an error";
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM network_events"), "6");
  EXPECT_EQ(store_->NetworkEvents("sbx-never-stored", 0, 10)->events.size(), 0u);

  ASSERT_TRUE(store_->Delete("sbx-deleted").has_value());
  now_ = kT0 + 10'000;
  ASSERT_EQ(*store_->PurgeDestroyed(kT0 + 5'000), 1);
  EXPECT_EQ(RawQuery(db_path_, "SELECT group_concat(DISTINCT sandbox_id) FROM network_events"),
            "sbx-live");
  EXPECT_EQ(RawQuery(db_path_, "SELECT group_concat(sandbox_id) FROM network_event_counters"),
            "sbx-live");
  EXPECT_EQ(store_->NetworkEvents("sbx-live", 0, 10)->events.size(), 2u);
  // A new record with a purged one's id starts from 1 again.
  InState("sbx-old", S::kRunning);
  const NetworkEventBatch again[] = {Batch("sbx-old", 5, 1)};
  ASSERT_TRUE(store_->AppendNetworkEvents(again, 100).has_value());
  auto page = store_->NetworkEvents("sbx-old", 0, 10);
  ASSERT_EQ(page->events.size(), 1u);
  EXPECT_EQ(page->events[0].seq, 1);
  EXPECT_EQ(page->dropped, 0);
}

TEST_F(StoreTest, NetworkEventsSurviveAReopen) {
  InState("sbx-a", S::kRunning);
  const NetworkEventBatch first[] = {Batch("sbx-a", 0, 3, 2)};
  ASSERT_TRUE(store_->AppendNetworkEvents(first, 100).has_value());
  Reopen();
  const NetworkEventBatch second[] = {Batch("sbx-a", 3, 1)};
  ASSERT_TRUE(store_->AppendNetworkEvents(second, 100).has_value());
  auto page = store_->NetworkEvents("sbx-a", 0, 10);
  EXPECT_EQ(Names(*page), (std::vector<std::string>{"n0", "n1", "n2", "n3"}));
  EXPECT_EQ(page->events.back().seq, 4) << "numbering goes on after a reopen";
  EXPECT_EQ(page->dropped, 2);
}

TEST_F(StoreTest, MigrationFromVersionFourAddsTheVerdictTablesAndKeepsRecords) {
  // A database as the previous schema left it: version 4, a record, no verdict tables.
  InState("sbx-old", S::kRunning);
  store_.reset();
  RawQuery(db_path_, "DROP TABLE network_events");
  RawQuery(db_path_, "DROP TABLE network_event_counters");
  UndoTenancyMigration(db_path_);
  RawQuery(db_path_, "PRAGMA user_version = 4");
  ASSERT_EQ(RawQuery(db_path_, "SELECT count(*) FROM sqlite_master WHERE name LIKE 'network%'"),
            "0");
  Reopen();
  EXPECT_EQ(RawQuery(db_path_, "PRAGMA user_version"),
            std::to_string(Store::CurrentSchemaVersion()));
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM sqlite_master WHERE name LIKE 'network%'"),
            "2");
  auto old = store_->Get("sbx-old");
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->state, S::kRunning);
  const NetworkEventBatch batches[] = {Batch("sbx-old", 0, 2)};
  ASSERT_TRUE(store_->AppendNetworkEvents(batches, 100).has_value());
  EXPECT_EQ(store_->NetworkEvents("sbx-old", 0, 10)->events.size(), 2u);
  EXPECT_TRUE(store_->CheckIntegrity().has_value());
}

TEST_F(StoreTest, MigrationFromVersionSixMovesTheAgentsPidIntoEngineState) {
  InState("sbx-old", S::kRunning);
  InState("sbx-none", S::kDestroyed);
  store_.reset();
  UndoEngineStateMigration(db_path_);
  RawQuery(db_path_, "UPDATE sandboxes SET init_pid = 4321, resources = "
                     "'{\"uid_base\":\"65536\",\"dir\":\"/x\",\"cgroup0\":\"/c\","
                     "\"net.slot\":\"3\"}' WHERE id = 'sbx-old'");
  Reopen();
  EXPECT_EQ(RawQuery(db_path_, "PRAGMA user_version"),
            std::to_string(Store::CurrentSchemaVersion()));
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM pragma_table_info('sandboxes') "
                               "WHERE name = 'init_pid'"),
            "0");
  auto old = store_->Get("sbx-old");
  ASSERT_TRUE(old.has_value()) << old.error().message();
  EXPECT_EQ(old->engine_state, "{\"init_pid\":4321}");
  EXPECT_EQ(old->resources, (std::map<std::string, std::string>{{"net.slot", "3"}}))
      << "the jail's entries left for its state, the daemon's stayed";
  EXPECT_EQ(RawQuery(db_path_, "SELECT engine_state FROM sandboxes WHERE id = 'sbx-none'"), "")
      << "no pid, no state";
  EXPECT_TRUE(store_->CheckIntegrity().has_value());
}

TEST_F(StoreTest, MigrationFromVersionSevenAllowsHibernatedAndKeepsEverything) {
  InState("sbx-old", S::kRunning);
  InState("sbx-gone", S::kDestroyed);
  const NetworkEventBatch batches[] = {Batch("sbx-old", 0, 3), Batch("sbx-gone", 0, 2)};
  ASSERT_TRUE(store_->AppendNetworkEvents(batches, 100).has_value());
  auto before = store_->Get("sbx-old");
  ASSERT_TRUE(before.has_value());
  store_.reset();
  UndoHibernatedMigration(db_path_);
  // The control: the old schema refuses the new state.
  RawQuery(db_path_, "UPDATE sandboxes SET state = 'hibernated' WHERE id = 'sbx-old'");
  ASSERT_EQ(RawQuery(db_path_, "SELECT state FROM sandboxes WHERE id = 'sbx-old'"), "running");
  Reopen();
  EXPECT_EQ(RawQuery(db_path_, "PRAGMA user_version"),
            std::to_string(Store::CurrentSchemaVersion()));
  auto old = store_->Get("sbx-old");
  ASSERT_TRUE(old.has_value()) << old.error().message();
  EXPECT_EQ(old->state, S::kRunning);
  EXPECT_EQ(old->metadata, before->metadata);
  EXPECT_EQ(old->created_at_ms, before->created_at_ms);
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM network_events"), "5")
      << "making the table again took the network events with it";
  const S running[] = {S::kRunning};
  auto hibernated = store_->Transition("sbx-old", running, S::kHibernated);
  ASSERT_TRUE(hibernated.has_value()) << hibernated.error().message();
  EXPECT_EQ(store_->Get("sbx-old")->state, S::kHibernated);
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND "
                               "tbl_name = 'sandboxes' AND name LIKE 'sandboxes_%'"),
            "4");
  // Foreign keys are on again after the migration: a purge takes the verdicts along.
  now_ = kT0 + 10'000'000;
  ASSERT_EQ(*store_->PurgeDestroyed(now_), 1);
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM network_events"), "3");
  EXPECT_TRUE(store_->CheckIntegrity().has_value());
}

// --- Tenancy (docs/design/tenancy.md) --------------------------------------------------------

TEST_F(StoreTest, MigrationFromVersionFiveGivesEveryOldRowToAdmin) {
  InState("sbx-old", S::kRunning);
  auto key = store_->CreateKey("old-key");
  ASSERT_TRUE(key.has_value());
  ASSERT_TRUE(store_->InsertTemplate(MakeTemplate("old-template")).has_value());
  store_.reset();
  UndoTenancyMigration(db_path_);
  ASSERT_EQ(RawQuery(db_path_, "SELECT count(*) FROM pragma_table_info('sandboxes') "
                               "WHERE name = 'tenant'"),
            "0");

  Reopen();
  EXPECT_EQ(RawQuery(db_path_, "PRAGMA user_version"),
            std::to_string(Store::CurrentSchemaVersion()));
  EXPECT_EQ(Store::CurrentSchemaVersion(), 13);
  auto old = store_->Get("sbx-old");
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->tenant, "admin");
  EXPECT_EQ(old->state, S::kRunning);
  auto who = store_->Authenticate(key->plaintext);
  ASSERT_TRUE(who.has_value());
  EXPECT_EQ(who->tenant, "admin");
  auto t = store_->GetTemplate("old-template");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->tenant, "") << "templates from before tenancy are shared";
  EXPECT_TRUE(store_->CheckIntegrity().has_value());

  // New rows after the migration keep the tenant they are given.
  SandboxRecord mine = MakeRecord("sbx-new");
  mine.tenant = "team-a";
  ASSERT_TRUE(store_->Insert(mine).has_value());
  EXPECT_EQ(store_->Get("sbx-new")->tenant, "team-a");
}

TEST_F(StoreTest, TenantNamesAreValidated) {
  for (std::string_view bad : {std::string_view(""), std::string_view("a b"),
                               std::string_view("a/b"), std::string_view("caf\xc3\xa9"),
                               std::string_view("x\0y", 3), std::string_view("a;DROP")}) {
    EXPECT_EQ(ValidateTenant(bad).error().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_EQ(store_->CreateKey("k", false, bad).error().code(), ErrorCode::kInvalidArgument);
    SandboxRecord r = MakeRecord("sbx-bad");
    r.tenant = std::string(bad);
    EXPECT_EQ(store_->Insert(r).error().code(), ErrorCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ValidateTenant(std::string(65, 't')).error().code(), ErrorCode::kInvalidArgument);
  // Positive controls: the whole alphabet, and the longest name.
  for (std::string_view good : {std::string_view("A-z_0.9"), std::string_view("admin")}) {
    EXPECT_TRUE(ValidateTenant(good).has_value()) << good;
  }
  auto key = store_->CreateKey("k", false, std::string(64, 't'));
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(store_->Authenticate(key->plaintext)->tenant, std::string(64, 't'));
  EXPECT_FALSE(store_->Get("sbx-bad").has_value()) << "no bad record was written";
}

TEST_F(StoreTest, ListFiltersByTenant) {
  SandboxRecord a = MakeRecord("sbx-a");
  a.tenant = "team-a";
  SandboxRecord b = MakeRecord("sbx-b");
  b.tenant = "team-b";
  ASSERT_TRUE(store_->Insert(a).has_value());
  ASSERT_TRUE(store_->Insert(b).has_value());
  auto only_a = store_->List({.tenant = "team-a"});
  ASSERT_TRUE(only_a.has_value());
  ASSERT_EQ(only_a->size(), 1u);
  EXPECT_EQ((*only_a)[0].id, "sbx-a");
  EXPECT_EQ(store_->List({.tenant = "nobody"})->size(), 0u);
  EXPECT_EQ(store_->List()->size(), 2u);  // positive control: no filter, both
  // With the other filters' parameters bound around it.
  auto both = store_->List({.states = {S::kCreating},
                            .metadata = {{"owner", "alice"}},
                            .tenant = "team-b"});
  ASSERT_TRUE(both.has_value());
  ASSERT_EQ(both->size(), 1u);
  EXPECT_EQ((*both)[0].id, "sbx-b");
}

TEST_F(StoreTest, KeysCarryTheirTenantAndTheLastAdminKeyStays) {
  auto admin = store_->CreateKey("root", /*admin=*/true);
  ASSERT_TRUE(admin.has_value());
  auto user = store_->CreateKey("ci", false, "team-a");
  ASSERT_TRUE(user.has_value());
  EXPECT_EQ(user->info.tenant, "team-a");
  auto keys = store_->ListKeys();
  ASSERT_TRUE(keys.has_value());
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0].tenant, "admin");
  EXPECT_EQ((*keys)[1].tenant, "team-a");

  auto refused = store_->RevokeKey(admin->info.id);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(store_->Authenticate(admin->plaintext).has_value()) << "still valid";
  // Positive controls: a non-admin key goes at once; with a second admin key the first goes.
  ASSERT_TRUE(store_->RevokeKey(user->info.id).has_value());
  EXPECT_FALSE(store_->Authenticate(user->plaintext).has_value());
  EXPECT_TRUE(store_->RevokeKey(user->info.id).has_value()) << "revoking twice is fine";
  auto second = store_->CreateKey("root2", /*admin=*/true, "ops");
  ASSERT_TRUE(second.has_value());
  ASSERT_TRUE(store_->RevokeKey(admin->info.id).has_value());
  EXPECT_FALSE(store_->Authenticate(admin->plaintext).has_value());
  EXPECT_EQ(store_->RevokeKey(second->info.id).error().code(), ErrorCode::kFailedPrecondition);
}

TEST_F(StoreTest, TemplatesKeepTheirTenant) {
  TemplateRecord mine = MakeTemplate("mine");
  mine.tenant = "team-a";
  ASSERT_TRUE(store_->InsertTemplate(mine).has_value());
  ASSERT_TRUE(store_->InsertTemplate(MakeTemplate("shared")).has_value());
  EXPECT_EQ(store_->GetTemplate("mine")->tenant, "team-a");
  EXPECT_EQ(store_->GetTemplate("shared")->tenant, "");
  TemplateRecord bad = MakeTemplate("bad");
  bad.tenant = "no spaces";
  EXPECT_EQ(store_->InsertTemplate(bad).error().code(), ErrorCode::kInvalidArgument);
}

// --- Secrets (docs/design/secrets-store.md) --------------------------------------------------

// A sealed value as the store takes it: the store never looks inside, so any bytes do.
SecretRecord Sealed(std::string tenant, std::string name, std::string ciphertext) {
  return SecretRecord{.tenant = std::move(tenant),
                      .name = std::move(name),
                      .ciphertext = std::move(ciphertext),
                      .nonce = std::string("\0nonce-12b\xff\x01", 12),
                      .key_id = "key-1"};
}

TEST_F(StoreTest, SecretsAreStoredSealedAndNumberedPerWrite) {
  const std::string bytes("\x00\x01ciphertext+tag\xff\x00bytes", 31);
  auto made = store_->InsertSecret(Sealed("team-a", "GITHUB_TOKEN", bytes));
  ASSERT_TRUE(made.has_value()) << made.error().message();
  EXPECT_EQ(made->version, 1);
  EXPECT_EQ(made->created_at_ms, kT0);
  EXPECT_EQ(made->updated_at_ms, kT0);

  auto got = store_->GetSecret("team-a", "GITHUB_TOKEN");
  ASSERT_TRUE(got.has_value()) << got.error().message();
  EXPECT_EQ(*got, *made);
  EXPECT_EQ(got->ciphertext, bytes) << "a BLOB keeps every byte, NULs included";
  EXPECT_EQ(RawQuery(db_path_, "SELECT typeof(ciphertext) || typeof(nonce) FROM secrets"),
            "blobblob");

  now_ = kT0 + 5'000;
  SecretRecord next = Sealed("team-a", "GITHUB_TOKEN", "another sealed value");
  next.key_id = "key-2";
  auto updated = store_->UpdateSecret(next);
  ASSERT_TRUE(updated.has_value()) << updated.error().message();
  EXPECT_EQ(updated->version, 2);
  EXPECT_EQ(updated->created_at_ms, kT0);
  EXPECT_EQ(updated->updated_at_ms, kT0 + 5'000);
  EXPECT_EQ(updated->ciphertext, "another sealed value");
  EXPECT_EQ(updated->key_id, "key-2");
  ASSERT_TRUE(store_->UpdateSecret(next).has_value());
  Reopen();
  auto reread = store_->GetSecret("team-a", "GITHUB_TOKEN");
  ASSERT_TRUE(reread.has_value());
  EXPECT_EQ(reread->version, 3) << "versions survive a reopen";
  EXPECT_EQ(reread->ciphertext, "another sealed value");

  auto listed = store_->ListSecrets("team-a");
  ASSERT_TRUE(listed.has_value()) << listed.error().message();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].name, "GITHUB_TOKEN");
  EXPECT_EQ((*listed)[0].version, 3);
  EXPECT_TRUE((*listed)[0].ciphertext.empty()) << "a list carries no sealed value";
  EXPECT_TRUE((*listed)[0].nonce.empty());

  ASSERT_TRUE(store_->DeleteSecret("team-a", "GITHUB_TOKEN").has_value());
  EXPECT_EQ(store_->GetSecret("team-a", "GITHUB_TOKEN").error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->DeleteSecret("team-a", "GITHUB_TOKEN").error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->UpdateSecret(next).error().code(), ErrorCode::kNotFound)
      << "an update does not bring a deleted secret back";
  EXPECT_TRUE(store_->ListSecrets("team-a")->empty());
}

TEST_F(StoreTest, ASecretNameIsItsTenantsOwn) {
  ASSERT_TRUE(store_->InsertSecret(Sealed("team-a", "TOKEN", "a's sealed value.")).has_value());
  auto again = store_->InsertSecret(Sealed("team-a", "TOKEN", "other sealed value"));
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error().code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(again.error().message(), "secret 'TOKEN' already exists");
  // The same name in another tenant is another secret.
  ASSERT_TRUE(store_->InsertSecret(Sealed("team-b", "TOKEN", "b's sealed value.")).has_value());
  EXPECT_EQ(store_->GetSecret("team-a", "TOKEN")->ciphertext, "a's sealed value.");
  EXPECT_EQ(store_->GetSecret("team-b", "TOKEN")->ciphertext, "b's sealed value.");

  // Team c has none: each call answers as for a name nobody has.
  auto absent = store_->GetSecret("team-c", "TOKEN");
  ASSERT_FALSE(absent.has_value());
  EXPECT_EQ(absent.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(absent.error().message(), "secret 'TOKEN' does not exist");
  EXPECT_EQ(store_->GetSecret("team-a", "NOBODY").error().message(),
            "secret 'NOBODY' does not exist");
  EXPECT_EQ(store_->UpdateSecret(Sealed("team-c", "TOKEN", "x's sealed value.")).error().code(),
            ErrorCode::kNotFound);
  EXPECT_EQ(store_->DeleteSecret("team-c", "TOKEN").error().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(store_->ListSecrets("team-c")->empty());

  // B's delete took B's only.
  ASSERT_TRUE(store_->DeleteSecret("team-b", "TOKEN").has_value());
  EXPECT_EQ(store_->GetSecret("team-a", "TOKEN")->ciphertext, "a's sealed value.");
  EXPECT_EQ(store_->GetSecret("team-a", "TOKEN")->version, 1);
  EXPECT_EQ(store_->ListSecrets("team-a")->size(), 1u);
}

TEST_F(StoreTest, SecretNamesAndSealedValuesAreValidated) {
  for (const std::string& name :
       std::vector<std::string>{"A", "_", "a1", "GITHUB_TOKEN", std::string(128, 'x')}) {
    EXPECT_TRUE(ValidateSecretName(name).has_value()) << name;
    EXPECT_TRUE(store_->InsertSecret(Sealed("t", name, "sealed value!!!!!")).has_value()) << name;
  }
  for (const std::string& name :
       std::vector<std::string>{"", "1A", "A-B", "A B", "A.B", "A=B", "\xc3\xa9",
                                std::string(129, 'x'), std::string("A\0B", 3)}) {
    auto st = ValidateSecretName(name);
    ASSERT_FALSE(st.has_value()) << name;
    EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(store_->InsertSecret(Sealed("t", name, "sealed value!!!!!")).error().code(),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(store_->GetSecret("t", name).error().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(store_->InsertSecret(Sealed("not a tenant", "A", "sealed value!!!!!")).error().code(),
            ErrorCode::kInvalidArgument);
  SecretRecord short_nonce = Sealed("t", "SHORT", "sealed value!!!!!");
  short_nonce.nonce = "123";
  EXPECT_EQ(store_->InsertSecret(short_nonce).error().code(), ErrorCode::kInternal);
  EXPECT_EQ(store_->InsertSecret(Sealed("t", "BARE", "only a tag")).error().code(),
            ErrorCode::kInternal)
      << "16 bytes or fewer cannot be a value and its tag";
}

TEST_F(StoreTest, SecretsAreCountedByTheKeyThatSealedThem) {
  EXPECT_TRUE(store_->CountSecretsByKey()->empty());
  ASSERT_TRUE(store_->InsertSecret(Sealed("a", "ONE", "sealed value one!")).has_value());
  ASSERT_TRUE(store_->InsertSecret(Sealed("b", "ONE", "sealed value one!")).has_value());
  SecretRecord other = Sealed("b", "TWO", "sealed value two!");
  other.key_id = "key-2";
  ASSERT_TRUE(store_->InsertSecret(other).has_value());
  EXPECT_EQ(*store_->CountSecretsByKey(),
            (std::map<std::string, int64_t>{{"key-1", 2}, {"key-2", 1}}));
}

TEST_F(StoreTest, MigrationFromVersionEightAddsTheSecretsTable) {
  InState("sbx-old", S::kRunning);
  store_.reset();
  UndoSecretsMigration(db_path_);
  ASSERT_EQ(RawQuery(db_path_, "SELECT count(*) FROM sqlite_master WHERE name = 'secrets'"), "0");
  Reopen();
  EXPECT_EQ(RawQuery(db_path_, "PRAGMA user_version"),
            std::to_string(Store::CurrentSchemaVersion()));
  EXPECT_EQ(store_->Get("sbx-old")->state, S::kRunning);
  EXPECT_TRUE(store_->InsertSecret(Sealed("admin", "TOKEN", "sealed value!!!!!")).has_value());
  EXPECT_TRUE(store_->CheckIntegrity().has_value());
}

TEST_F(StoreTest, MigrationFromVersionNineKeepsSandboxesWithNoSecretsBound) {
  InState("sbx-old", S::kRunning);
  store_.reset();
  UndoBoundSecretsMigration(db_path_);
  Reopen();
  EXPECT_EQ(RawQuery(db_path_, "PRAGMA user_version"),
            std::to_string(Store::CurrentSchemaVersion()));
  auto old = store_->Get("sbx-old");
  ASSERT_TRUE(old.has_value());
  EXPECT_EQ(old->secrets, "");
  // The bindings a record keeps (placeholders, never values) come back as written.
  auto bound = store_->UpdateNetwork("sbx-old", R"({"mode":"allowlist","allow":[],"deny":[]})",
                                     R"([{"name":"GH","hosts":["api.github.com"]}])");
  ASSERT_TRUE(bound.has_value());
  EXPECT_EQ(store_->Get("sbx-old")->secrets, R"([{"name":"GH","hosts":["api.github.com"]}])");
  EXPECT_TRUE(store_->CheckIntegrity().has_value());
}

TEST_F(StoreTest, QuotasAreSetReadRemovedAndValidated) {
  EXPECT_TRUE(store_->GetQuota("team-a")->empty()) << "none set: every field 0";
  const TenantQuota q{.sandboxes = 3, .cpus = 2.5, .memory_mb = 4096, .creates_per_minute = 10};
  ASSERT_TRUE(store_->SetQuota("team-a", q).has_value());
  EXPECT_EQ(*store_->GetQuota("team-a"), q);
  EXPECT_TRUE(store_->GetQuota("team-b")->empty()) << "another tenant's is its own";
  Reopen();
  EXPECT_EQ(*store_->GetQuota("team-a"), q);
  ASSERT_TRUE(store_->SetQuota("team-a", {}).has_value());  // all zero: removed
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM tenant_quotas"), "0");
  EXPECT_FALSE(store_->SetQuota("team a", q).has_value());
  EXPECT_FALSE(store_->SetQuota("team-a", {.sandboxes = -1}).has_value());
  EXPECT_TRUE(store_->GetQuota("team-a")->empty());
}

TEST_F(StoreTest, UsageSumsTheTenantsLiveUnpooledRecords) {
  auto own = [&](const std::string& id, S state, const std::string& tenant, bool pooled = false) {
    SandboxRecord r = MakeRecord(id);  // 1.5 cpus, 512 MiB, 1024 MiB of disk
    r.tenant = tenant;
    r.pooled = pooled;
    ASSERT_TRUE(store_->Insert(r).has_value());
    if (state != S::kCreating) {
      ASSERT_TRUE(store_->Transition(id, {}, S::kRunning).has_value());
      if (state != S::kRunning) {
        ASSERT_TRUE(store_->Transition(id, {}, state).has_value());
      }
    }
  };
  own("sbx-1", S::kCreating, "team-a");
  own("sbx-2", S::kRunning, "team-a");
  own("sbx-3", S::kPaused, "team-a");
  own("sbx-4", S::kFailed, "team-a");
  own("sbx-5", S::kRunning, "team-a", /*pooled=*/true);
  own("sbx-6", S::kRunning, "team-b");
  auto usage = store_->Usage("team-a");
  ASSERT_TRUE(usage.has_value());
  EXPECT_EQ(usage->sandboxes, 3);
  EXPECT_DOUBLE_EQ(usage->cpus, 4.5);
  EXPECT_EQ(usage->memory_mb, 1536);
  EXPECT_EQ(usage->disk_mb, 3072);
  EXPECT_EQ(store_->Usage("team-c")->sandboxes, 0);
}

TEST_F(StoreTest, MigrationFromVersionTenAddsTheRecorderAndQuotas) {
  InState("sbx-old", S::kRunning);
  store_.reset();
  UndoRecorderMigration(db_path_);
  Reopen();
  EXPECT_EQ(RawQuery(db_path_, "PRAGMA user_version"), "13");
  EXPECT_TRUE(store_->AppendEvents(std::vector<EventBatch>{{.sandbox = "sbx-old",
                                                            .events = {{.at_ms = 1,
                                                                        .type = "exec.start",
                                                                        .data = "{}"}}}},
                                   10, 10)
                  .has_value());
  EXPECT_EQ(store_->Events("sbx-old", 0, {}, 10)->events.size(), 1u);
  EXPECT_TRUE(store_->SetQuota("admin", {.sandboxes = 1}).has_value());
  EXPECT_EQ(store_->Get("sbx-old")->state, S::kRunning);
  EXPECT_TRUE(store_->CheckIntegrity().has_value());
}

// --- Metric samples ----------------------------------------------------------------------------

MetricSample Sample(int64_t at_ms, double cpu) {
  MetricSample m;
  m.at_ms = at_ms;
  m.cpu_seconds = cpu;
  m.cpu_cores = cpu / 10;
  m.memory_bytes = 1000 + at_ms % 1000;
  m.memory_peak_bytes = 5000;
  m.pids = 3;
  m.disk_bytes = 4096;
  m.net_rx_bytes = 10;
  m.net_tx_bytes = 20;
  return m;
}

std::vector<int64_t> Times(const MetricPage& page) {
  std::vector<int64_t> out;
  for (const auto& m : page.samples) out.push_back(m.at_ms);
  return out;
}

TEST_F(StoreTest, MetricsAreKeptPerSandboxNewestFirstAndReadByWindow) {
  InState("sbx-a", S::kRunning);
  InState("sbx-b", S::kRunning);
  for (int i = 0; i < 8; ++i) {
    const std::pair<std::string, MetricSample> pass[] = {{"sbx-a", Sample(kT0 + i * 1000, i)},
                                                         {"sbx-b", Sample(kT0 + i * 1000, 2 * i)}};
    ASSERT_TRUE(store_->AppendMetrics(pass, 5).has_value());
  }
  auto all = store_->Metrics("sbx-a", 0, INT64_MAX, 100);
  ASSERT_TRUE(all.has_value()) << all.error().message();
  EXPECT_EQ(Times(*all), (std::vector<int64_t>{kT0 + 3000, kT0 + 4000, kT0 + 5000, kT0 + 6000,
                                               kT0 + 7000}))
      << "the newest 5 are kept, oldest first";
  EXPECT_FALSE(all->truncated);
  EXPECT_EQ(all->samples.back(), Sample(kT0 + 7000, 7)) << "every field round-trips";
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM sandbox_metrics WHERE sandbox_id = 'sbx-b'"),
            "5")
      << "the cap is per sandbox";

  auto window = store_->Metrics("sbx-a", kT0 + 4000, kT0 + 6000, 100);
  EXPECT_EQ(Times(*window), (std::vector<int64_t>{kT0 + 4000, kT0 + 5000, kT0 + 6000}));
  auto newest = store_->Metrics("sbx-a", 0, INT64_MAX, 2);
  EXPECT_EQ(Times(*newest), (std::vector<int64_t>{kT0 + 6000, kT0 + 7000}))
      << "a limit keeps the newest of the window";
  EXPECT_TRUE(newest->truncated);
  EXPECT_TRUE(store_->Metrics("sbx-a", kT0 + 7001, INT64_MAX, 10)->samples.empty());
  InState("sbx-quiet", S::kRunning);
  EXPECT_TRUE(store_->Metrics("sbx-quiet", 0, INT64_MAX, 10)->samples.empty());
  EXPECT_EQ(store_->Metrics("../etc", 0, 1, 10).error().code(), ErrorCode::kInvalidArgument);

  // A second sample at the same time replaces the first.
  const std::pair<std::string, MetricSample> again[] = {{"sbx-a", Sample(kT0 + 7000, 99)}};
  ASSERT_TRUE(store_->AppendMetrics(again, 5).has_value());
  EXPECT_EQ(store_->Metrics("sbx-a", kT0 + 7000, kT0 + 7000, 10)->samples.at(0).cpu_seconds, 99);
}

TEST_F(StoreTest, MigrationFromVersionTwelveAddsAnEmptyMetricsTable) {
  InState("sbx-old", S::kRunning);
  store_.reset();
  UndoMetricsMigration(db_path_);
  Reopen();
  EXPECT_EQ(RawQuery(db_path_, "PRAGMA user_version"),
            std::to_string(Store::CurrentSchemaVersion()));
  EXPECT_TRUE(store_->Metrics("sbx-old", 0, INT64_MAX, 10)->samples.empty());
  const std::pair<std::string, MetricSample> pass[] = {{"sbx-old", Sample(kT0, 1)}};
  ASSERT_TRUE(store_->AppendMetrics(pass, 10).has_value());
  EXPECT_EQ(store_->Metrics("sbx-old", 0, INT64_MAX, 10)->samples.size(), 1u);
}

TEST_F(StoreTest, MetricsGoWithTheirRecord) {
  InState("sbx-live", S::kRunning);
  InState("sbx-old", S::kDestroyed);
  const std::pair<std::string, MetricSample> pass[] = {{"sbx-live", Sample(kT0, 1)},
                                                       {"sbx-old", Sample(kT0, 1)},
                                                       {"sbx-never-stored", Sample(kT0, 1)}};
  ASSERT_TRUE(store_->AppendMetrics(pass, 10).has_value())
      << "a sample of a sandbox without a record is skipped, not an error";
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM sandbox_metrics"), "2");
  EXPECT_EQ(store_->Metrics("sbx-old", 0, INT64_MAX, 10)->samples.size(), 1u)
      << "a destroyed sandbox's samples stay until its record goes";
  now_ = kT0 + 10'000;
  ASSERT_EQ(*store_->PurgeDestroyed(kT0 + 5'000), 1);
  EXPECT_EQ(RawQuery(db_path_, "SELECT count(*) FROM sandbox_metrics"), "1");
  EXPECT_TRUE(store_->Metrics("sbx-old", 0, INT64_MAX, 10)->samples.empty());
  const std::pair<std::string, MetricSample> bad[] = {{"../x", Sample(kT0, 1)}};
  EXPECT_EQ(store_->AppendMetrics(bad, 10).error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace airlock::store
