// Per-sandbox metrics and auto-pause through a real airlockd (docs/design/metrics.md): the
// samples move when a sandbox burns CPU, holds memory, writes a file and sends bytes; they are
// bounded, readable after the destroy and only by the sandbox's tenant; /metrics totals per
// engine and per tenant; a sandbox with auto_pause pauses when idle, a call resumes it, a
// command in the foreground keeps it awake, and all of it holds across a daemon restart.

#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "support/airlockd.h"
#include "support/engines.h"
#include "support/prometheus.h"

namespace {

using namespace airlock::testing;

// Samples every 300 ms, the newest 6 kept: tests see them move within seconds.
const std::vector<std::string> kFastSampling = {"--metrics-interval-ms", "300", "--metrics-keep",
                                                "6"};

class MetricsTest : public DaemonTest, public ::testing::WithParamInterface<std::string> {
 protected:
  std::vector<std::string> DaemonArgs() const override {
    std::vector<std::string> args = kFastSampling;
    if (GetParam() == "gvisor") args.insert(args.end(), kWithGvisor.begin(), kWithGvisor.end());
    return args;
  }
  void SetUp() override {
    DaemonTest::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    if (std::string lacks = EngineLacks(*daemon_, GetParam()); !lacks.empty()) GTEST_SKIP() << lacks;
  }
  std::string Create(json body = json::object()) {
    body["engine"] = GetParam();
    return CreateSandbox(body.dump());
  }
  json Samples(const std::string& id, const std::string& query = "") {
    Reply r = daemon_->Call(http::verb::get, "/v1/sandboxes/" + id + "/metrics" + query);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.Json()["samples"] : json::array();
  }
  // The first sample of `id` (up to 60 s of waiting) for which `pred` holds; null if none came.
  template <typename Pred>
  json WaitSample(const std::string& id, Pred pred) {
    for (int i = 0; i < 600; ++i) {
      for (const json& m : Samples(id)) {
        if (pred(m)) return m;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return json();
  }
  std::string State(const std::string& id) {
    return daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).Json().value("state", "");
  }
  // Waits up to 60 s for sandbox `id` to be in `state`.
  bool WaitState(const std::string& id, const std::string& state) {
    for (int i = 0; i < 600; ++i) {
      if (State(id) == state) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
};

TEST_P(MetricsTest, SamplesMoveWithCpuMemoryDiskAndNetwork) {
  // A network of its own (allowlist: nothing beyond the daemon's proxy and DNS stub).
  const std::string id = Create({{"network", {{"mode", "allowlist"}, {"allow", {"allowed.test"}}}}});
  ASSERT_FALSE(id.empty());
  const json first = WaitSample(id, [](const json&) { return true; });
  ASSERT_TRUE(first.is_object()) << "no sample within a minute\n" << daemon_->Log();
  for (const char* key : {"at_ms", "cpu_seconds", "cpu_cores", "memory_bytes", "memory_peak_bytes",
                          "pids", "disk_bytes", "net_rx_bytes", "net_tx_bytes"}) {
    EXPECT_TRUE(first.contains(key)) << key << " in " << first;
  }
  EXPECT_GT(first["memory_bytes"].get<int64_t>(), 0) << first;
  EXPECT_GE(first["pids"].get<int64_t>(), 1) << first;

  // CPU: a busy loop of about a second or more.
  ASSERT_EQ(Run(id, "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; echo done"), "done\n");
  const double cpu_before = first["cpu_seconds"].get<double>();
  json busy = WaitSample(id, [&](const json& m) { return m["cpu_seconds"] > cpu_before + 0.3; });
  EXPECT_TRUE(busy.is_object()) << "CPU seconds did not move from " << cpu_before;
  // Disk: 8 MB written to its writable layer.
  const int64_t disk_before = first["disk_bytes"].get<int64_t>();
  ASSERT_EQ(Run(id, "head -c 8000000 /dev/urandom > /home/user/blob; echo ok"), "ok\n");
  json wrote = WaitSample(
      id, [&](const json& m) { return m["disk_bytes"].get<int64_t>() >= disk_before + 7'000'000; });
  EXPECT_TRUE(wrote.is_object()) << "disk bytes did not move from " << disk_before << ": "
                                 << Samples(id);
  // Memory: 96 MiB written and held by a background process while samples are taken.
  const int64_t memory_before = first["memory_bytes"].get<int64_t>();
  Reply held = daemon_->Call(
      http::verb::post, "/v1/sandboxes/" + id + "/exec",
      json{{"cmd", "python3 -c 'import time; a = b\"x\" * (96 << 20); time.sleep(120)'"},
           {"background", true}}
          .dump());
  ASSERT_EQ(held.status, 200) << held.body;
  json holding = WaitSample(id, [&](const json& m) {
    return m["memory_bytes"].get<int64_t>() >= memory_before + (80 << 20);
  });
  EXPECT_TRUE(holding.is_object()) << "memory did not move from " << memory_before << ": "
                                   << Samples(id);
  // Network: 200 datagrams of 1000 bytes to the gateway (its DNS stub's address, which the
  // daemon made; port 9, which nothing serves there) leave through its veth.
  ASSERT_EQ(Run(id, "python3 -c '\nimport socket\n"
                    "gw = [l.split()[1] for l in open(\"/etc/resolv.conf\") if l.startswith(\"nameserver\")][0]\n"
                    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                    "for _ in range(200): s.sendto(b\"x\" * 1000, (gw, 9))\n"
                    "print(\"sent\")'"),
            "sent\n");
  json sent = WaitSample(id, [&](const json& m) { return m["net_tx_bytes"].get<int64_t>() >= 200'000; });
  EXPECT_TRUE(sent.is_object()) << Samples(id);

  // Bounded: never more than metrics_keep (6) of one sandbox, the newest.
  std::this_thread::sleep_for(std::chrono::seconds(3));  // 10 passes at 300 ms
  json all = Samples(id);
  EXPECT_EQ(all.size(), 6u) << all;
  EXPECT_EQ(Samples(id, "?limit=2").size(), 2u);
  const int64_t newest = all.back()["at_ms"].get<int64_t>();
  json window = Samples(id, "?start=" + std::to_string(newest) + "&end=" + std::to_string(newest));
  ASSERT_EQ(window.size(), 1u) << window;
  EXPECT_EQ(window[0]["at_ms"], newest);
  for (const char* bad : {"?start=abc", "?start=5&end=4", "?limit=0", "?limit=10001", "?x=1",
                          "?start=-1"}) {
    EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + id + "/metrics" + bad).status, 400)
        << bad;
  }
  EXPECT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/metrics").status, 405);

  // /metrics: this engine's and this tenant's totals, valid exposition, no sandbox id.
  Reply prom = daemon_->Call(http::verb::get, "/metrics");
  ASSERT_EQ(prom.status, 200) << prom.body;
  EXPECT_EQ(ExpositionProblems(prom.body), "") << prom.body;
  EXPECT_EQ(prom.body.find(id), std::string::npos) << "a per-sandbox label";
  const std::string engine = "engine=\"" + GetParam() + "\"";
  EXPECT_EQ(SeriesValue(prom.body, "airlock_usage_sandboxes{" + engine + ",state=\"running\"}"), 1)
      << prom.body;
  EXPECT_GT(SeriesValue(prom.body, "airlock_usage_cpu_seconds_total{tenant=\"admin\"}"), 0.3)
      << prom.body;
  EXPECT_GE(SeriesValue(prom.body, "airlock_usage_memory_bytes{" + engine + "}"), 80 << 20)
      << prom.body;
  EXPECT_GE(SeriesValue(prom.body, "airlock_usage_disk_bytes{" + engine + "}"), 7'000'000)
      << prom.body;
  EXPECT_GE(SeriesValue(prom.body,
                        "airlock_usage_network_bytes_total{" + engine + ",direction=\"tx\"}"),
            0)
      << prom.body;

  // Kept after the destroy (the sandbox itself is destroyed), no longer sampled.
  ASSERT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204);
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).Json()["state"], "destroyed");
  json kept = Samples(id);
  EXPECT_FALSE(kept.empty());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_EQ(Samples(id), kept) << "a destroyed sandbox is still sampled";
}

TEST_P(MetricsTest, OnlyTheSandboxsTenantReadsItsMetrics) {
  Reply key = daemon_->Call(http::verb::post, "/v1/keys",
                            json{{"name", "other"}, {"tenant", "team-x"}}.dump());
  ASSERT_EQ(key.status, 201) << key.body;
  const std::string other = "Bearer " + key.Json()["key"].get<std::string>();
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitSample(id, [](const json&) { return true; }).is_object());
  Reply theirs = Http(daemon_->port(), http::verb::get, "/v1/sandboxes/" + id + "/metrics", "", other);
  EXPECT_EQ(theirs.status, 404) << theirs.body;
  Reply unknown =
      Http(daemon_->port(), http::verb::get, "/v1/sandboxes/sbx-unknown1/metrics", "", other);
  EXPECT_EQ(unknown.status, 404);
  std::string same = unknown.body;
  same.replace(same.find("sbx-unknown1"), std::string("sbx-unknown1").size(), id);
  EXPECT_EQ(theirs.body, same) << "another tenant's sandbox looks like none at all";
  // Positive control: the owner (here the admin) reads them.
  EXPECT_FALSE(Samples(id).empty());
}

INSTANTIATE_TEST_SUITE_P(Engines, MetricsTest, ::testing::ValuesIn(EnginesOfThisBuild()),
                         EngineName);

// Auto-pause on engines with pause (the jail freezes; gVisor pauses with runsc).
class AutoPauseTest : public MetricsTest {
 protected:
  void SetUp() override {
    MetricsTest::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    if (std::string lacks = EngineLacks(*daemon_, GetParam(), "pause"); !lacks.empty()) {
      GTEST_SKIP() << lacks;
    }
  }
};

TEST_P(AutoPauseTest, AnIdleSandboxPausesAndTheNextCallResumesIt) {
  const std::string id = Create({{"auto_pause", {{"idle_seconds", 2}}}});
  ASSERT_FALSE(id.empty());
  Reply got = daemon_->Call(http::verb::get, "/v1/sandboxes/" + id);
  EXPECT_EQ(got.Json()["auto_pause"], (json{{"idle_seconds", 2}, {"memory", false}})) << got.body;
  ASSERT_EQ(Run(id, "echo 42 > /home/user/answer; echo ok"), "ok\n");
  ASSERT_TRUE(WaitState(id, "paused")) << daemon_->Log();
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).Json().value("auto_paused", false),
            true);
  // An exec just works, and the sandbox runs again.
  EXPECT_EQ(Run(id, "cat /home/user/answer"), "42\n");
  EXPECT_EQ(State(id), "running");
  EXPECT_FALSE(daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).Json().contains("auto_paused"));
  // Files too.
  ASSERT_TRUE(WaitState(id, "paused"));
  Reply file = daemon_->Call(http::verb::get, "/v1/sandboxes/" + id + "/files?path=answer");
  EXPECT_EQ(file.status, 200) << file.body;
  EXPECT_EQ(file.body, "42\n");

  // A command in the foreground keeps it awake however long it runs: the state, watched all
  // along, never leaves running.
  std::atomic<bool> done{false};
  std::atomic<int> not_running{0};
  std::thread watch([&] {
    while (!done) {
      if (State(id) != "running") ++not_running;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  EXPECT_EQ(Run(id, "sleep 5; echo awake"), "awake\n");
  done = true;
  watch.join();
  EXPECT_EQ(not_running, 0) << "paused under a running command";

  // A pause the user asked for is not undone by a call: 409 as before.
  ASSERT_TRUE(WaitState(id, "paused"));
  ASSERT_EQ(Run(id, "true"), "");
  ASSERT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/pause", "{}").status, 200);
  Reply refused = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                                json{{"cmd", "true"}}.dump());
  EXPECT_EQ(refused.status, 409) << refused.body;
  EXPECT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/resume").status, 200);
}

TEST_P(AutoPauseTest, AutoPauseHoldsAcrossADaemonRestart) {
  const std::string id = Create({{"auto_pause", {{"idle_seconds", 1}}}});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitState(id, "paused")) << daemon_->Log();
  // Killed while the sandbox is auto-paused: the next start adopts it paused, and a call
  // resumes it.
  daemon_->Stop(SIGKILL);
  ASSERT_TRUE(daemon_->Start());
  EXPECT_EQ(State(id), "paused");
  EXPECT_EQ(Run(id, "echo back"), "back\n");
  EXPECT_EQ(State(id), "running");
  // Killed while it runs: the restarted daemon still pauses it when idle.
  daemon_->Stop(SIGKILL);
  ASSERT_TRUE(daemon_->Start());
  ASSERT_TRUE(WaitState(id, "paused")) << daemon_->Log();
  EXPECT_EQ(Run(id, "echo again"), "again\n");
}

// With memory (engines with memory_checkpoint): hibernated when idle, and an exec restores it
// with what it held in memory (/tmp is memory on gVisor).
TEST_P(AutoPauseTest, WithMemoryAnIdleSandboxHibernatesAndAnExecRestoresIt) {
  if (std::string lacks = EngineLacks(*daemon_, GetParam(), "memory_checkpoint"); !lacks.empty()) {
    GTEST_SKIP() << lacks;
  }
  const std::string id = Create({{"auto_pause", {{"idle_seconds", 2}, {"memory", true}}}});
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(Run(id, "echo 42 > /tmp/answer; echo ok"), "ok\n");
  ASSERT_TRUE(WaitState(id, "hibernated")) << daemon_->Log();
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).Json().value("auto_paused", false),
            true);
  EXPECT_EQ(Run(id, "cat /tmp/answer"), "42\n");
  EXPECT_EQ(State(id), "running");
}

TEST_P(AutoPauseTest, BadAutoPauseRequestsAreRefused) {
  for (const char* bad :
       {R"({"auto_pause": {"idle_seconds": 0}})", R"({"auto_pause": {"idle_seconds": -1}})",
        R"({"auto_pause": {}})", R"({"auto_pause": 5})", R"({"auto_pause": {"idle_seconds": 5, "x": 1}})",
        R"({"auto_pause": {"idle_seconds": 5, "memory": "yes"}})",
        R"({"auto_pause": {"idle_seconds": 5}, "auto_hibernate_seconds": 5})"}) {
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes", bad);
    EXPECT_EQ(r.status, 400) << bad << ": " << r.body;
  }
  // With memory on an engine without memory checkpoints: 409 naming it, nothing made.
  if (GetParam() == "jail") {
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes",
                            R"({"engine": "jail", "auto_pause": {"idle_seconds": 5, "memory": true}})");
    EXPECT_EQ(r.status, 409) << r.body;
    EXPECT_NE(r.body.find("memory_checkpoint"), std::string::npos) << r.body;
  }
  EXPECT_TRUE(Listed().empty());
}

INSTANTIATE_TEST_SUITE_P(Engines, AutoPauseTest, ::testing::ValuesIn(EnginesOfThisBuild()),
                         EngineName);

}  // namespace
