#include "daemon/server/network_event_log.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <thread>

namespace airlock::daemon {
namespace {

class NetworkEventLogTest : public ::testing::Test {
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
NetworkEventLogOptions Manual() {
  NetworkEventLogOptions o;
  o.batch = 1'000'000;
  o.interval = std::chrono::hours(1);
  return o;
}

TEST_F(NetworkEventLogTest, FlushWritesWhatWasQueuedInOrderWithEveryField) {
  NetworkEventLog log(*store_, Manual());
  net::NetworkEvent closed = Event("allowed.test", true);
  closed.closed = true;
  closed.kind = "connect";
  closed.sni = "allowed.test";
  closed.dest = "198.18.0.2";
  closed.port = 443;
  closed.bytes_up = 10;
  closed.bytes_down = 20;
  log.Add("sbx-a", Event("one"));
  log.Add("sbx-b", Event("two", true));
  log.Add("sbx-a", closed);
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
  const VerdictCounts counts = log.counts();
  EXPECT_EQ(counts.allowed, 1u);
  EXPECT_EQ(counts.denied, 1u);
  EXPECT_EQ(counts.closed, 1u);
  EXPECT_EQ(counts.dropped, 0u);
  EXPECT_TRUE(log.Flush().has_value()) << "an empty flush writes nothing and succeeds";
}

TEST_F(NetworkEventLogTest, AFullQueueCountsDropsPerSandboxInsteadOfGrowing) {
  NetworkEventLogOptions o = Manual();
  o.max_queued = 5;
  o.max_queued_per_sandbox = 3;
  NetworkEventLog log(*store_, o);
  for (int i = 0; i < 5; ++i) log.Add("sbx-a", Event("a" + std::to_string(i)));  // 3 fit
  for (int i = 0; i < 4; ++i) log.Add("sbx-b", Event("b" + std::to_string(i)));  // 2 fit
  ASSERT_TRUE(log.Flush().has_value());
  EXPECT_EQ(Names("sbx-a"), (std::vector<std::string>{"a0", "a1", "a2"}));
  EXPECT_EQ(Names("sbx-b"), (std::vector<std::string>{"b0", "b1"}));
  EXPECT_EQ(store_->NetworkEvents("sbx-a", 0, 10)->dropped, 2);
  EXPECT_EQ(store_->NetworkEvents("sbx-b", 0, 10)->dropped, 2);
  // /metrics sees the same: 5 queued (all denied), 4 dropped.
  const VerdictCounts counts = log.counts();
  EXPECT_EQ(counts.denied, 5u);
  EXPECT_EQ(counts.allowed + counts.closed, 0u);
  EXPECT_EQ(counts.dropped, 4u);
  // Once written, the queue takes verdicts again.
  log.Add("sbx-a", Event("a5"));
  ASSERT_TRUE(log.Flush().has_value());
  auto a = store_->NetworkEvents("sbx-a", 0, 10);
  EXPECT_EQ(a->events.back().name, "a5");
  EXPECT_EQ(a->events.back().seq, 4);
  EXPECT_EQ(a->dropped, 2);
}

TEST_F(NetworkEventLogTest, TheStoreKeepsTheNewestOfEachSandbox) {
  NetworkEventLogOptions o = Manual();
  o.keep = 2;
  NetworkEventLog log(*store_, o);
  for (int i = 0; i < 5; ++i) log.Add("sbx-a", Event("a" + std::to_string(i)));
  ASSERT_TRUE(log.Flush().has_value());
  EXPECT_EQ(Names("sbx-a"), (std::vector<std::string>{"a3", "a4"}));
  EXPECT_EQ(store_->NetworkEvents("sbx-a", 0, 10)->trimmed, 3);
}

TEST_F(NetworkEventLogTest, TheDestructorWritesWhatIsQueued) {
  {
    NetworkEventLog log(*store_, Manual());
    log.Add("sbx-a", Event("last"));
  }
  EXPECT_EQ(Names("sbx-a"), (std::vector<std::string>{"last"}));
}

TEST_F(NetworkEventLogTest, TheWriterCommitsOnItsOwn) {
  NetworkEventLogOptions o;
  o.interval = std::chrono::milliseconds(20);
  NetworkEventLog log(*store_, o);
  log.Add("sbx-a", Event("soon"));
  for (int i = 0; i < 500 && Names("sbx-a").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Names("sbx-a"), (std::vector<std::string>{"soon"}));
  // A full batch wakes it before the interval.
  NetworkEventLogOptions batched = Manual();
  batched.batch = 3;
  NetworkEventLog quick(*store_, batched);
  for (int i = 0; i < 3; ++i) quick.Add("sbx-b", Event("b" + std::to_string(i)));
  for (int i = 0; i < 500 && Names("sbx-b").size() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Names("sbx-b").size(), 3u);
}

TEST_F(NetworkEventLogTest, VerdictsOfASandboxWithoutARecordAreSkipped) {
  NetworkEventLog log(*store_, Manual());
  log.Add("sbx-gone", Event("x"));
  log.Add("sbx-a", Event("kept"));
  ASSERT_TRUE(log.Flush().has_value());
  EXPECT_EQ(Names("sbx-a"), (std::vector<std::string>{"kept"}));
}

}  // namespace
}  // namespace airlock::daemon
