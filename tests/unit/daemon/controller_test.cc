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

#include "runtime/guest.h"
#include "support/fake_engine.h"
#include "support/prometheus.h"

namespace airlock::daemon {
namespace {

namespace fs = std::filesystem;
using testing::ExpositionProblems;
using testing::FakeEngine;
using testing::SeriesValue;

class ControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/airlock-controller-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto store = store::Store::Open(dir_ + "/store.db");
    ASSERT_TRUE(store) << store.error().message();
    store_ = std::move(*store);
    recorder_ = std::make_unique<Recorder>(*store_);
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
    recorder_.reset();  // writes what it holds to the store first
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
    controller_ = std::make_unique<Controller>(*store_, *registry_, *recorder_);
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
  std::unique_ptr<Recorder> recorder_;
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

// The services hand over typed events; nothing in the daemon parses JSON back.
TEST_F(ControllerTest, AStreamedCommandHandsOverTypedEventsInOrder) {
  store::SandboxRecord r = Create();
  api::ExecRequest exec;
  exec.cmd = "echo out; echo err >&2; exit 3";
  exec.stream = true;
  auto stream = controller_->exec().StartExec(r.id, exec);
  ASSERT_TRUE(stream) << stream.error().message();
  std::vector<api::Event> events;
  while (auto more = (*stream)->Next()) {
    for (api::Event& e : *more) events.push_back(std::move(e));
  }
  ASSERT_GE(events.size(), 2u);
  auto* start = std::get_if<api::StartEvent>(&events.front().what);
  ASSERT_NE(start, nullptr) << "the first event is the start";
  EXPECT_GT(start->pid, 0);
  EXPECT_EQ(start->pid, (*stream)->pid());
  std::string out, err;
  for (const api::Event& e : events) {
    if (auto* o = std::get_if<api::OutputEvent>(&e.what)) (o->is_stdout ? out : err) += o->data;
  }
  EXPECT_EQ(out, "out\n");
  EXPECT_EQ(err, "err\n");
  auto* exit = std::get_if<api::ExitEvent>(&events.back().what);
  ASSERT_NE(exit, nullptr) << "the last event is the exit";
  EXPECT_EQ(exit->result.exit_code, 3);
  // Rendered only at the edge: one NDJSON line per event.
  const std::string line = api::RenderEvent(events.back());
  EXPECT_NE(line.find("\"type\":\"exit\""), std::string::npos) << line;
  EXPECT_TRUE(line.ends_with("\n"));

  // A command that cannot start: its stream is one error event, not a failed call.
  exec.cmd.clear();
  exec.argv = {"/no/such/program"};
  auto failed = controller_->exec().StartExec(r.id, exec);
  ASSERT_TRUE(failed) << failed.error().message();
  auto first = (*failed)->Next();
  ASSERT_TRUE(first && first->size() == 1u);
  auto* error = std::get_if<api::ErrorEvent>(&first->front().what);
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(error->error.code(), ErrorCode::kInvalidArgument) << error->error.message();
  EXPECT_FALSE((*failed)->Next()) << "nothing after the error";
}

TEST_F(ControllerTest, ARelativeFilePathStartsAtTheGuestsHome) {
  store::SandboxRecord r = Create();
  api::FileQuery relative;
  relative.path = "notes/today.txt";
  relative.parents = true;
  ASSERT_TRUE(controller_->files().WriteFile(r.id, relative, "written relative"));
  api::FileQuery absolute;
  absolute.path = std::string(runtime::guest::kHome) + "/notes/today.txt";
  EXPECT_EQ(controller_->files().ReadFile(r.id, absolute).value_or(""), "written relative");
  // The control: an absolute path is taken as it is.
  absolute.path = "/tmp/abs.txt";
  ASSERT_TRUE(controller_->files().WriteFile(r.id, absolute, "at /tmp"));
  EXPECT_EQ(controller_->files().ReadFile(r.id, absolute).value_or(""), "at /tmp");
  relative.path = "tmp/abs.txt";
  EXPECT_FALSE(controller_->files().ReadFile(r.id, relative)) << "not at the home's tmp/";
}

TEST_F(ControllerTest, AFailedBuildStepSaysHowItEndedAndWhatItPrinted) {
  api::CreateTemplateRequest build;
  build.name = "broken";
  api::TemplateStep ok;
  ok.run = "echo first step";
  api::TemplateStep bad;
  bad.run = "echo the last words; exit 7";
  build.steps = {ok, bad};
  std::vector<api::Event> log;
  auto built = controller_->templates().Build(build, [&](api::Event e) { log.push_back(e); });
  ASSERT_FALSE(built);
  EXPECT_NE(built.error().message().find("step 2"), std::string::npos) << built.error().message();
  EXPECT_NE(built.error().message().find("exited 7"), std::string::npos) << built.error().message();
  EXPECT_NE(built.error().message().find("the last words"), std::string::npos)
      << built.error().message();
  int steps = 0;
  for (const api::Event& e : log) steps += std::holds_alternative<api::StepEvent>(e.what);
  EXPECT_EQ(steps, 2) << "a step event for each step run";
  auto record = controller_->templates().Get("broken");
  ASSERT_TRUE(record);
  EXPECT_EQ(record->state, store::TemplateState::kFailed);
  // The build sandbox went with the build.
  EXPECT_TRUE(controller_->List({})->empty());

  // The control: the same build without the failing step is ready.
  build.name = "fine";
  build.steps = {ok};
  auto fine = controller_->templates().Build(build, [](api::Event) {});
  ASSERT_TRUE(fine) << fine.error().message();
  EXPECT_EQ(fine->state, store::TemplateState::kReady);
}

TEST_F(ControllerTest, AWarmPoolServesACreateWithTheRequestsSettings) {
  ASSERT_TRUE(controller_->pools().SetSize(std::string(api::kDefaultTemplate), 1));
  controller_->pools().StartFiller();
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
       std::chrono::steady_clock::now() < deadline;) {
    auto pools = controller_->pools().List();
    if (pools && !pools->empty() && pools->front().ready == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(controller_->pools().List()->front().ready, 1) << "the pool never filled";
  EXPECT_TRUE(controller_->List({})->empty()) << "a pooled sandbox is nobody's yet";

  api::CreateSandboxRequest request;
  request.env = {{"GREETING", "from the claim"}};
  request.metadata = {{"owner", "test"}};
  store::SandboxRecord r = Create(request);
  EXPECT_EQ(controller_->pools().List()->front().hits, 1u);
  EXPECT_EQ(r.metadata.at("owner"), "test");
  EXPECT_EQ(Run(r.id, "echo \"$GREETING\""), "from the claim\n")
      << "the claim's env reaches its commands";
  controller_->pools().StopFiller();
}

// --- Metrics per sandbox (sampler.h) ----------------------------------------------------------

TEST_F(ControllerTest, TheSamplerRecordsWhatEachLiveSandboxUsesAndTotalsIt) {
  controller_->sampler().Start(std::chrono::milliseconds(0), /*keep=*/3);  // no thread
  store::SandboxRecord a = Create();
  api::CreateSandboxRequest other;
  other.tenant = "team-b";
  store::SandboxRecord b = Create(other);
  EXPECT_EQ(controller_->sampler().Sample(), 2) << "one sample per live sandbox";
  auto first = controller_->Metrics(a.id, {});
  ASSERT_TRUE(first) << first.error().message();
  ASSERT_EQ(first->samples.size(), 1u);
  EXPECT_EQ(first->samples[0].cpu_cores, 0) << "no rate without a sample before";
  EXPECT_GT(first->samples[0].memory_bytes, 0);
  EXPECT_GE(first->samples[0].pids, 1);

  // CPU burnt by a command and a file written show in the next sample. (The FakeEngine's
  // commands run on the host: the file goes through the file API, confined to its root.)
  Run(a.id, "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo done");
  api::FileQuery blob;
  blob.path = "blob";
  ASSERT_TRUE(controller_->files().WriteFile(a.id, blob, std::string(200000, 'x')));
  EXPECT_EQ(controller_->sampler().Sample(), 2);
  auto second = controller_->Metrics(a.id, {});
  ASSERT_EQ(second->samples.size(), 2u);
  const store::MetricSample& now = second->samples[1];
  EXPECT_GT(now.cpu_seconds, first->samples[0].cpu_seconds);
  EXPECT_GT(now.cpu_cores, 0);
  EXPECT_GE(now.disk_bytes, 200000);
  EXPECT_GT(now.at_ms, first->samples[0].at_ms - 1);

  // Totals per engine and per tenant, never per sandbox; valid exposition text.
  const std::string text = RenderUsageMetrics(controller_->sampler().Totals());
  EXPECT_EQ(ExpositionProblems(text), "") << text;
  EXPECT_EQ(text.find(a.id), std::string::npos) << "no per-sandbox label";
  EXPECT_EQ(SeriesValue(text, R"(airlock_usage_sandboxes{engine="fake",state="running"})"), 2) << text;
  EXPECT_EQ(SeriesValue(text, R"(airlock_usage_sandboxes{tenant="team-b",state="running"})"), 1) << text;
  EXPECT_GT(SeriesValue(text, R"(airlock_usage_cpu_seconds_total{tenant="admin"})"), 0) << text;
  EXPECT_GT(SeriesValue(text, R"(airlock_usage_memory_bytes{engine="fake"})"), 0) << text;
  EXPECT_EQ(SeriesValue(text, "airlock_metrics_sampling_passes_total"), 2) << text;

  // Bounded: the newest `keep` stay. Kept after the destroy (not sampled any more), until the
  // record is purged.
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // distinct at_ms
    controller_->sampler().Sample();
  }
  EXPECT_EQ(controller_->Metrics(a.id, {})->samples.size(), 3u);
  ASSERT_TRUE(controller_->Destroy(b.id));
  EXPECT_EQ(controller_->sampler().Sample(), 1);
  auto kept = controller_->Metrics(b.id, {});
  ASSERT_TRUE(kept) << kept.error().message();
  EXPECT_EQ(kept->samples.size(), 3u);
  const std::string after = RenderUsageMetrics(controller_->sampler().Totals());
  EXPECT_EQ(SeriesValue(after, R"(airlock_usage_sandboxes{tenant="team-b",state="running"})"), -1);
  EXPECT_GT(SeriesValue(after, R"(airlock_usage_cpu_seconds_total{engine="fake"})"),
            SeriesValue(text, R"(airlock_usage_cpu_seconds_total{engine="fake"})") - 1e-9)
      << "a counter never goes down";
  EXPECT_EQ(controller_->Metrics("sbx-unknown1", {}).error().code(), ErrorCode::kNotFound);
}

TEST_F(ControllerTest, AutoPauseIsRefusedOnAnEngineWithoutPause) {
  api::CreateSandboxRequest request;
  request.auto_pause_seconds = 30;
  auto refused = controller_->Create(request);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message().find("pause"), std::string::npos)
      << refused.error().message();
  request.auto_pause_memory = true;
  refused = controller_->Create(request);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("memory_checkpoint"), std::string::npos)
      << refused.error().message();
  EXPECT_TRUE(controller_->List({})->empty()) << "nothing made";
}

}  // namespace
}  // namespace airlock::daemon
