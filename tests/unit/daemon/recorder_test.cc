#include "daemon/server/recorder.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <thread>

namespace airlock::daemon {
namespace {

class RecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "airlock-events-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto opened = store::Store::Open(dir_ + "/store.db");
    ASSERT_TRUE(opened.has_value()) << opened.error().message();
    store_ = std::move(*opened);
    for (const char* id : {"sbx-a", "sbx-b"}) {
      store::SandboxRecord r;
      r.id = id;
      r.engine = "jail";
      r.template_name = "base";
      ASSERT_TRUE(store_->Insert(r).has_value());
    }
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  static net::NetworkEvent Event(const std::string& name, bool allowed = false) {
    net::NetworkEvent e;
    e.at_ms = 1'700'000'000'000;
    e.kind = "http";
    e.name = name;
    e.port = 80;
    e.allowed = allowed;
    e.rule = "allowlist";
    return e;
  }
  std::vector<std::string> Names(const std::string& sandbox) {
    auto page = store_->NetworkEvents(sandbox, 0, 1000);
    EXPECT_TRUE(page.has_value());
    std::vector<std::string> out;
    for (const auto& e : page->events) out.push_back(e.name);
    return out;
  }

  std::string dir_;
  std::unique_ptr<store::Store> store_;
};

// Options under which the writer thread never writes by itself: only Flush and the destructor.
RecorderOptions Manual() {
  RecorderOptions o;
  o.batch = 1'000'000;
  o.interval = std::chrono::hours(1);
  return o;
}

TEST_F(RecorderTest, FlushWritesWhatWasQueuedInOrderWithEveryField) {
  Recorder log(*store_, Manual());
  net::NetworkEvent closed = Event("allowed.test", true);
  closed.closed = true;
  closed.kind = "connect";
  closed.sni = "allowed.test";
  closed.dest = "198.18.0.2";
  closed.port = 443;
  closed.bytes_up = 10;
  closed.bytes_down = 20;
  log.Verdict("sbx-a", Event("one"));
  log.Verdict("sbx-b", Event("two", true));
  log.Verdict("sbx-a", closed);
  EXPECT_TRUE(Names("sbx-a").empty()) << "nothing is written before a flush";
  ASSERT_TRUE(log.Flush().has_value());
  auto a = store_->NetworkEvents("sbx-a", 0, 10);
  ASSERT_EQ(a->events.size(), 2u);
  EXPECT_EQ(a->events[0].name, "one");
  EXPECT_EQ(a->events[0].verdict, "denied");
  EXPECT_EQ(a->events[0].bytes_up, 0);
  const store::NetworkEventRecord& c = a->events[1];
  EXPECT_EQ(c.seq, 2);
  EXPECT_EQ(c.verdict, "closed");
  EXPECT_EQ(c.kind, "connect");
  EXPECT_EQ(c.sni, "allowed.test");
  EXPECT_EQ(c.dest, "198.18.0.2");
  EXPECT_EQ(c.port, 443);
  EXPECT_EQ(c.bytes_up, 10);
  EXPECT_EQ(c.bytes_down, 20);
  EXPECT_EQ(c.at_ms, 1'700'000'000'000);
  auto b = store_->NetworkEvents("sbx-b", 0, 10);
  ASSERT_EQ(b->events.size(), 1u);
  EXPECT_EQ(b->events[0].verdict, "allowed");
  const VerdictCounts counts = log.verdicts();
  EXPECT_EQ(counts.allowed, 1u);
  EXPECT_EQ(counts.denied, 1u);
  EXPECT_EQ(counts.closed, 1u);
  EXPECT_EQ(counts.dropped, 0u);
  EXPECT_TRUE(log.Flush().has_value()) << "an empty flush writes nothing and succeeds";
}

TEST_F(RecorderTest, AFullQueueCountsDropsPerSandboxInsteadOfGrowing) {
  RecorderOptions o = Manual();
  o.max_queued = 5;
  o.max_queued_per_sandbox = 3;
  Recorder log(*store_, o);
  for (int i = 0; i < 5; ++i) log.Verdict("sbx-a", Event("a" + std::to_string(i)));  // 3 fit
  for (int i = 0; i < 4; ++i) log.Verdict("sbx-b", Event("b" + std::to_string(i)));  // 2 fit
  ASSERT_TRUE(log.Flush().has_value());
  EXPECT_EQ(Names("sbx-a"), (std::vector<std::string>{"a0", "a1", "a2"}));
  EXPECT_EQ(Names("sbx-b"), (std::vector<std::string>{"b0", "b1"}));
  EXPECT_EQ(store_->NetworkEvents("sbx-a", 0, 10)->dropped, 2);
  EXPECT_EQ(store_->NetworkEvents("sbx-b", 0, 10)->dropped, 2);
  // /metrics sees the same: 5 queued (all denied), 4 dropped.
  const VerdictCounts counts = log.verdicts();
  EXPECT_EQ(counts.denied, 5u);
  EXPECT_EQ(counts.allowed + counts.closed, 0u);
  EXPECT_EQ(counts.dropped, 4u);
  // Once written, the queue takes verdicts again.
  log.Verdict("sbx-a", Event("a5"));
  ASSERT_TRUE(log.Flush().has_value());
  auto a = store_->NetworkEvents("sbx-a", 0, 10);
  EXPECT_EQ(a->events.back().name, "a5");
  EXPECT_EQ(a->events.back().seq, 4);
  EXPECT_EQ(a->dropped, 2);
}

TEST_F(RecorderTest, TheStoreKeepsTheNewestOfEachSandbox) {
  RecorderOptions o = Manual();
  o.verdicts_keep = 2;
  Recorder log(*store_, o);
  for (int i = 0; i < 5; ++i) log.Verdict("sbx-a", Event("a" + std::to_string(i)));
  ASSERT_TRUE(log.Flush().has_value());
  EXPECT_EQ(Names("sbx-a"), (std::vector<std::string>{"a3", "a4"}));
  EXPECT_EQ(store_->NetworkEvents("sbx-a", 0, 10)->trimmed, 3);
}

TEST_F(RecorderTest, TheDestructorWritesWhatIsQueued) {
  {
    Recorder log(*store_, Manual());
    log.Verdict("sbx-a", Event("last"));
  }
  EXPECT_EQ(Names("sbx-a"), (std::vector<std::string>{"last"}));
}

TEST_F(RecorderTest, TheWriterCommitsOnItsOwn) {
  RecorderOptions o;
  o.interval = std::chrono::milliseconds(20);
  Recorder log(*store_, o);
  log.Verdict("sbx-a", Event("soon"));
  for (int i = 0; i < 500 && Names("sbx-a").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Names("sbx-a"), (std::vector<std::string>{"soon"}));
  // A full batch wakes it before the interval.
  RecorderOptions batched = Manual();
  batched.batch = 3;
  Recorder quick(*store_, batched);
  for (int i = 0; i < 3; ++i) quick.Verdict("sbx-b", Event("b" + std::to_string(i)));
  for (int i = 0; i < 500 && Names("sbx-b").size() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Names("sbx-b").size(), 3u);
}

TEST_F(RecorderTest, VerdictsOfASandboxWithoutARecordAreSkipped) {
  Recorder log(*store_, Manual());
  log.Verdict("sbx-gone", Event("x"));
  log.Verdict("sbx-a", Event("kept"));
  ASSERT_TRUE(log.Flush().has_value());
  EXPECT_EQ(Names("sbx-a"), (std::vector<std::string>{"kept"}));
}

std::vector<std::string> Types(store::Store& store, const std::string& sandbox,
                               std::vector<std::string> filter = {}) {
  auto page = store.Events(sandbox, 0, filter, 1000);
  EXPECT_TRUE(page.has_value());
  std::vector<std::string> out;
  for (const auto& e : page->events) out.push_back(e.type);
  return out;
}

TEST_F(RecorderTest, EventsAreNumberedPerSandboxWithTheirDataAndVerdictsJoinTheLog) {
  Recorder log(*store_, Manual());
  log.Record("sbx-a", "sandbox.created", {{"engine", "jail"}});
  log.Record("sbx-a", "exec.start", {{"command", 7}, {"argv", nlohmann::json::array({"true"})}});
  log.Verdict("sbx-a", Event("denied.test"));
  log.Record("sbx-b", "file.write", {{"path", "/x"}});
  log.Record("sbx-a", "exec.end", {{"command", 7}, {"exit_code", 0}});
  ASSERT_TRUE(log.Flush().has_value());
  auto a = store_->Events("sbx-a", 0, {}, 100);
  ASSERT_TRUE(a.has_value());
  ASSERT_EQ(a->events.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(a->events[i].seq, static_cast<int64_t>(i + 1));
  EXPECT_EQ(a->events[0].type, "sandbox.created");
  EXPECT_EQ(nlohmann::json::parse(a->events[1].data)["argv"][0], "true");
  EXPECT_EQ(a->events[2].type, "net.http");
  const auto verdict = nlohmann::json::parse(a->events[2].data);
  EXPECT_EQ(verdict["name"], "denied.test");
  EXPECT_EQ(verdict["verdict"], "denied");
  EXPECT_EQ(verdict["rule"], "allowlist");
  EXPECT_EQ(a->last_seq, 4);
  EXPECT_EQ(a->dropped, 0);
  // The verdict is in the verdicts' own log too, numbered there.
  EXPECT_EQ(Names("sbx-a"), (std::vector<std::string>{"denied.test"}));
  EXPECT_EQ(Types(*store_, "sbx-b"), (std::vector<std::string>{"file.write"}));
  EXPECT_EQ(log.counts().recorded, 5u);
}

TEST_F(RecorderTest, ATypeFilterTakesWholeTypesAndPrefixesBeforeADot) {
  Recorder log(*store_, Manual());
  for (const char* type : {"exec.start", "exec.end", "execution.x", "net.dns", "net.connect",
                           "proc.exec", "sandbox.created"}) {
    log.Record("sbx-a", type);
  }
  ASSERT_TRUE(log.Flush().has_value());
  EXPECT_EQ(Types(*store_, "sbx-a", {"exec"}),
            (std::vector<std::string>{"exec.start", "exec.end"}));
  EXPECT_EQ(Types(*store_, "sbx-a", {"net.dns", "sandbox"}),
            (std::vector<std::string>{"net.dns", "sandbox.created"}));
  EXPECT_EQ(Types(*store_, "sbx-a", {"proc.exec"}), (std::vector<std::string>{"proc.exec"}));
  EXPECT_TRUE(Types(*store_, "sbx-a", {"ex"}).empty()) << "a prefix counts only before a dot";
  EXPECT_TRUE(Types(*store_, "sbx-a", {"%"}).empty()) << "no LIKE wildcards";
  // Paging over a filter: `more` is about the filtered events.
  auto page = store_->Events("sbx-a", 0, std::vector<std::string>{"net"}, 1);
  ASSERT_TRUE(page.has_value());
  ASSERT_EQ(page->events.size(), 1u);
  EXPECT_TRUE(page->more);
  EXPECT_EQ(page->last_seq, 7);
}

TEST_F(RecorderTest, ASandboxOverItsRateLosesItsOwnEventsAndTheLogSaysHowMany) {
  RecorderOptions o = Manual();
  o.rate = 0.001;  // no refill within the test
  o.burst = 3;
  Recorder log(*store_, o);
  for (int i = 0; i < 10; ++i) log.Record("sbx-a", "proc.exec", {{"pid", i}});
  log.Record("sbx-a", "sandbox.deleted");  // lifecycle events pass whatever the rate
  for (int i = 0; i < 2; ++i) log.Record("sbx-b", "proc.exec", {{"pid", i}});  // b is not hurt
  ASSERT_TRUE(log.Flush().has_value());
  auto a = store_->Events("sbx-a", 0, {}, 100);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(Types(*store_, "sbx-a"),
            (std::vector<std::string>{"proc.exec", "proc.exec", "proc.exec", "sandbox.deleted",
                                      "recorder.dropped"}));
  EXPECT_EQ(nlohmann::json::parse(a->events.back().data)["count"], 7);
  EXPECT_EQ(a->dropped, 7);
  EXPECT_EQ(Types(*store_, "sbx-b"), (std::vector<std::string>{"proc.exec", "proc.exec"}));
  EXPECT_EQ(log.counts().dropped, 7u);
  EXPECT_EQ(log.counts().recorded, 6u);
}

TEST_F(RecorderTest, TheStoreKeepsTheNewestEventsOfEachSandbox) {
  RecorderOptions o = Manual();
  o.keep = 3;
  Recorder log(*store_, o);
  for (int i = 0; i < 5; ++i) log.Record("sbx-a", "exec.start", {{"command", i}});
  ASSERT_TRUE(log.Flush().has_value());
  auto a = store_->Events("sbx-a", 0, {}, 100);
  ASSERT_EQ(a->events.size(), 3u);
  EXPECT_EQ(a->events.front().seq, 3);
  EXPECT_EQ(a->trimmed, 2);
}

TEST_F(RecorderTest, AFollowerIsWokenByTheNextWrite) {
  Recorder log(*store_, Manual());
  const uint64_t seen = log.writes();
  EXPECT_EQ(log.WaitForWrite(seen, std::chrono::milliseconds(10)), seen) << "nothing written";
  std::thread writer([&] {
    log.Record("sbx-a", "exec.start");
    ASSERT_TRUE(log.Flush().has_value());
  });
  EXPECT_GT(log.WaitForWrite(seen, std::chrono::seconds(30)), seen);
  writer.join();
  EXPECT_EQ(Types(*store_, "sbx-a"), (std::vector<std::string>{"exec.start"}));
}

TEST_F(RecorderTest, AProcessEventLeavesOutWhatTheEngineCouldNotTell) {
  Recorder log(*store_, Manual());
  runtime::ProcessEvent exec;
  exec.pid = 7;
  exec.ppid = 1;
  exec.uid = 1000;
  exec.argv = {"sh", "-c", "true"};
  RecordProcess(log, "sbx-a", exec);
  runtime::ProcessEvent vanished;  // gone before it was looked at: no pid, no uid, no argv
  vanished.ppid = 1;
  vanished.argv_lost = true;
  RecordProcess(log, "sbx-a", vanished);
  runtime::ProcessEvent killed;
  killed.kind = runtime::ProcessEvent::Kind::kExit;
  killed.pid = 7;
  killed.signal = 9;
  RecordProcess(log, "sbx-a", killed);
  ASSERT_TRUE(log.Flush().has_value());
  auto page = store_->Events("sbx-a", 0, {}, 100);
  ASSERT_TRUE(page.has_value());
  ASSERT_EQ(page->events.size(), 3u);
  EXPECT_EQ(nlohmann::json::parse(page->events[0].data),
            (nlohmann::json{{"pid", 7}, {"ppid", 1}, {"uid", 1000},
                            {"argv", nlohmann::json::array({"sh", "-c", "true"})}}));
  EXPECT_EQ(nlohmann::json::parse(page->events[1].data),
            (nlohmann::json{{"ppid", 1}, {"argv", nlohmann::json::array()}, {"argv_lost", true}}));
  EXPECT_EQ(page->events[2].type, "proc.exit");
  EXPECT_EQ(nlohmann::json::parse(page->events[2].data), (nlohmann::json{{"pid", 7}, {"signal", 9}}));
}

}  // namespace
}  // namespace airlock::daemon
