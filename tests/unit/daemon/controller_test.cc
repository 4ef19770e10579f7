// The controller on the FakeEngine (tests/support/fake_engine.h): the sandbox lifecycle, the
// engine's choice and capabilities, recovery per engine, snapshots and the TTL, with a real
// store and real agents but no root, no namespaces and no HTTP: fast, and run everywhere.

#include "daemon/server/controller.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/fake_engine.h"

namespace airlock::daemon {
namespace {

namespace fs = std::filesystem;
using testing::FakeEngine;

class ControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/airlock-controller-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto store = store::Store::Open(dir_ + "/store.db");
    ASSERT_TRUE(store) << store.error().message();
    store_ = std::move(*store);
    Start({"fake"});
  }
  void TearDown() override {
    if (controller_) controller_->DestroyAll();
    controller_.reset();
    registry_.reset();
    // What a test left behind on purpose (an engine it took away) goes too.
    auto layers = std::make_unique<runtime::LayerStore>(dir_ + "/layers", dir_ + "/staging");
    for (const char* name : {"fake", "other"}) {
      FakeEngine sweeper(dir_, AIRLOCK_AGENT_PATH, layers.get(), name);
      if (auto left = sweeper.ListSandboxes()) {
        for (const std::string& id : *left) (void)sweeper.Destroy(id);
      }
    }
    store_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A controller (as a daemon's start makes one) with FakeEngines of these names; the first is
  // the default. The previous one, if any, goes first, keeping its sandboxes.
  void Start(const std::vector<std::string>& engines) {
    controller_.reset();
    registry_.reset();
    auto layers = std::make_unique<runtime::LayerStore>(dir_ + "/layers", dir_ + "/staging");
    ASSERT_TRUE(layers->Prepare());
    std::vector<std::unique_ptr<runtime::Engine>> made;
    for (const std::string& name : engines) {
      made.push_back(std::make_unique<FakeEngine>(dir_, AIRLOCK_AGENT_PATH, layers.get(), name));
    }
    registry_ = runtime::EngineRegistry::With(std::move(made), std::move(layers), engines.front());
    controller_ = std::make_unique<Controller>(*store_, *registry_);
  }

  store::SandboxRecord Create(api::CreateSandboxRequest request = {}) {
    auto made = controller_->Create(request);
    EXPECT_TRUE(made) << (made ? "" : made.error().message());
    return made ? *made : store::SandboxRecord{};
  }
  std::string Run(const std::string& id, const std::string& cmd) {
    api::ExecRequest exec;
    exec.cmd = cmd;
    auto r = controller_->exec().Exec(id, exec);
    EXPECT_TRUE(r) << (r ? "" : r.error().message());
    return r ? r->stdout_data : "";
  }

  std::string dir_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<runtime::EngineRegistry> registry_;
  std::unique_ptr<Controller> controller_;
};

TEST_F(ControllerTest, ASandboxIsMadeRunsAndGoesOnItsEngine) {
  store::SandboxRecord r = Create();
  EXPECT_EQ(r.state, store::SandboxState::kRunning);
  EXPECT_EQ(r.engine, "fake");
  EXPECT_FALSE(r.engine_state.empty()) << "the engine's state is recorded for its adopt";
  EXPECT_EQ(Run(r.id, "echo hello"), "hello\n");
  // Files: a relative path is the user's home (docs/design/guest.md).
  api::FileQuery q;
  q.path = "notes.txt";
  ASSERT_TRUE(controller_->files().WriteFile(r.id, q, "kept"));
  q.path = "/home/user/notes.txt";
  EXPECT_EQ(controller_->files().ReadFile(r.id, q).value_or(""), "kept");
  ASSERT_TRUE(controller_->Destroy(r.id));
  EXPECT_EQ(controller_->Get(r.id).error().code(), ErrorCode::kNotFound);
  auto engine = registry_->Get("fake");
  ASSERT_TRUE(engine);
  EXPECT_TRUE((*engine)->ListSandboxes()->empty()) << "the engine still holds it";
}

TEST_F(ControllerTest, AnEngineIsChosenByNameAndNeverSubstituted) {
  Start({"fake", "other"});
  api::CreateSandboxRequest on_other;
  on_other.engine = "other";
  EXPECT_EQ(Create(on_other).engine, "other");
  EXPECT_EQ(Create().engine, "fake") << "none named: the default";
  api::CreateSandboxRequest unknown;
  unknown.engine = "nope";
  auto refused = controller_->Create(unknown);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.error().message().find("there are: fake, other"), std::string::npos)
      << refused.error().message();
  auto listed = controller_->List({});
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->size(), 2u) << "a refused create left a record";
}

TEST_F(ControllerTest, WhatTheEngineLacksIsRefusedBeforeAnythingChanges) {
  store::SandboxRecord r = Create();
  auto paused = controller_->Pause(r.id);
  ASSERT_FALSE(paused);
  EXPECT_EQ(paused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(paused.error().message().find("the fake engine cannot pause a sandbox (it lacks the "
                                          "capability pause"),
            std::string::npos)
      << paused.error().message();
  EXPECT_EQ(controller_->Get(r.id)->state, store::SandboxState::kRunning);
  EXPECT_EQ(Run(r.id, "echo still"), "still\n");
  // A network from a controller that has no networking: refused, nothing recorded.
  api::CreateSandboxRequest networked;
  networked.network = *net::NetworkPolicy::FromJson(nlohmann::json{{"mode", "open"}});
  auto no_network = controller_->Create(networked);
  ASSERT_FALSE(no_network);
  EXPECT_EQ(no_network.error().code(), ErrorCode::kUnimplemented) << "this controller has no "
                                                                      "networking at all";
  EXPECT_EQ(controller_->List({})->size(), 1u);
}

TEST_F(ControllerTest, ASnapshotAndAForkCarryTheFileSystemOnTheSameEngine) {
  store::SandboxRecord r = Create();
  api::FileQuery q;
  q.path = "/home/user/made-here";
  ASSERT_TRUE(controller_->files().WriteFile(r.id, q, "by the source"));
  api::SnapshotRequest snap;
  snap.name = "snap";
  auto t = controller_->snapshots().Snapshot(r.id, snap);
  ASSERT_TRUE(t) << t.error().message();
  api::CreateSandboxRequest from;
  from.template_name = "snap";
  store::SandboxRecord child = Create(from);
  EXPECT_EQ(child.engine, "fake") << "a snapshot's sandboxes go on its engine";
  EXPECT_EQ(controller_->files().ReadFile(child.id, q).value_or(""), "by the source");
  api::ForkRequest fork;
  fork.count = 2;
  auto forked = controller_->snapshots().Fork(r.id, fork);
  ASSERT_TRUE(forked) << forked.error().message();
  ASSERT_EQ(forked->sandboxes.size(), 2u);
  for (const auto& f : forked->sandboxes) {
    EXPECT_EQ(f.engine, "fake");
    EXPECT_EQ(controller_->files().ReadFile(f.id, q).value_or(""), "by the source");
  }
}

TEST_F(ControllerTest, ARestartAdoptsEachSandboxOnItsOwnEngine) {
  Start({"fake", "other"});
  store::SandboxRecord a = Create();
  api::CreateSandboxRequest on_other;
  on_other.engine = "other";
  store::SandboxRecord b = Create(on_other);
  // The daemon restarts: new engines, a new controller, the same store.
  Start({"fake", "other"});
  auto report = controller_->Recover();
  ASSERT_TRUE(report) << report.error().message();
  EXPECT_EQ(report->adopted, 2);
  EXPECT_EQ(report->failed, 0);
  EXPECT_EQ(Run(a.id, "echo a"), "a\n");
  EXPECT_EQ(Run(b.id, "echo b"), "b\n");
}

TEST_F(ControllerTest, ARestartWithoutASandboxsEngineLeavesItAsItWas) {
  Start({"fake", "other"});
  api::CreateSandboxRequest on_other;
  on_other.engine = "other";
  store::SandboxRecord kept = Create(on_other);
  // Restarted without the engine "other": the record is user data, not an orphan.
  Start({"fake"});
  auto report = controller_->Recover();
  ASSERT_TRUE(report) << report.error().message();
  EXPECT_EQ(report->unavailable, 1);
  EXPECT_EQ(report->failed, 0);
  auto record = controller_->Get(kept.id);
  ASSERT_TRUE(record);
  EXPECT_EQ(record->state, store::SandboxState::kRunning);
  api::ExecRequest exec;
  exec.cmd = "true";
  auto refused = controller_->exec().Exec(kept.id, exec);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message().find("other"), std::string::npos)
      << refused.error().message();
  // With the engine back, it is adopted whole.
  Start({"fake", "other"});
  ASSERT_TRUE(controller_->Recover());
  EXPECT_EQ(Run(kept.id, "echo back"), "back\n");
}

TEST_F(ControllerTest, TheReaperDestroysASandboxAtItsTtl) {
  api::CreateSandboxRequest short_lived;
  short_lived.ttl_seconds = 1;
  store::SandboxRecord r = Create(short_lived);
  EXPECT_EQ(controller_->expiry().ReapExpired(), 0) << "not yet";
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(controller_->expiry().ReapExpired(), 1);
  EXPECT_EQ(controller_->Get(r.id).error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(controller_->expiry().expired_total(), 1u);
}

}  // namespace
}  // namespace airlock::daemon
