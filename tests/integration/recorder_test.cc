// The flight recorder end to end (docs/design/recorder.md): a small agent task on a real daemon
// (commands, a pipeline that starts processes of its own, files, allowed and denied network
// attempts, a background process and a signal, an expiry), and the exact record it leaves, read
// as a page, as JSON Lines, as a live stream; before and after the sandbox is destroyed, and
// after a SIGKILL of the daemon and a restart. On each engine.

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "support/airlockd.h"
#include "support/engines.h"
#include "support/fake_internet.h"
#include "support/prometheus.h"

namespace {

using namespace airlock::testing;

constexpr char kSomeBytesSha256[] = "0d22cdcc10e6d049dbe1af5123d50873fdfc1a4f58306e58cb6241be9472014d";

class RecorderTest : public DaemonTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    if (const std::string missing = FakeInternet::Missing(); !missing.empty()) {
      GTEST_SKIP() << missing;
    }
    internet_.emplace();
    ASSERT_EQ(internet_->Start(), "");
    internet_->dns().Set("allowed.test", {.a = {internet_->site}});
    internet_->dns().Set("denied.test", {.a = {internet_->other_site}});
    char tmpl[] = "/tmp/airlockd-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    daemon_.emplace(dir_ + "/state", Args());
    ASSERT_TRUE(daemon_->Start());
    if (const std::string lacks = EngineLacks(*daemon_, GetParam(), "networking"); !lacks.empty()) {
      GTEST_SKIP() << lacks;
    }
  }
  void TearDown() override {
    DaemonTest::TearDown();
    internet_.reset();
  }
  std::vector<std::string> Args() const {
    std::vector<std::string> args = internet_->DaemonArgs();
    args.insert(args.end(), {"--network-subnet", "10.216." + internet_->net + ".0/24",
                             "--network-events-flush-ms", "50"});
    if (GetParam() == "gvisor") args.insert(args.end(), kWithGvisor.begin(), kWithGvisor.end());
    return args;
  }

  // Every event of `id` (all pages), or those of `types`.
  json Events(const std::string& id, const std::string& types = "") {
    json all = json::array();
    int64_t after = 0;
    while (true) {
      std::string target = "/v1/sandboxes/" + id + "/events?limit=7&after=" + std::to_string(after);
      if (!types.empty()) target += "&type=" + types;
      Reply r = daemon_->Call(http::verb::get, target);
      EXPECT_EQ(r.status, 200) << r.body;
      const json page = r.Json();
      if (r.status != 200 || !page.is_object()) return all;
      for (const json& e : page["events"]) all.push_back(e);
      after = page["next_after"].get<int64_t>();
      if (!page["has_more"].get<bool>()) return all;
    }
  }
  static std::vector<std::string> TypesOf(const json& events) {
    std::vector<std::string> out;
    for (const json& e : events) out.push_back(e["type"].get<std::string>());
    return out;
  }
  static const json* First(const json& events, const std::string& type) {
    for (const json& e : events) {
      if (e["type"] == type) return &e;
    }
    return nullptr;
  }

  std::optional<FakeInternet> internet_;
};

// What the API did to the sandbox, in order: the types other than network verdicts and
// processes seen inside (whose number depends on the engine and on timing).
json ApiEvents(const json& events) {
  json out = json::array();
  for (const json& e : events) {
    const std::string type = e["type"];
    if (!type.starts_with("net.") && !type.starts_with("proc.")) out.push_back(e);
  }
  return out;
}
std::vector<std::string> ApiTypes(const json& events) {
  std::vector<std::string> out;
  for (const json& e : ApiEvents(events)) out.push_back(e["type"].get<std::string>());
  return out;
}

TEST_P(RecorderTest, AnAgentTaskLeavesAnExactRecordThatOutlivesTheSandbox) {
  const std::string id = CreateSandbox(
      json{{"engine", GetParam()},
           {"ttl_seconds", 600},
           {"metadata", {{"task", "t1"}}},
           {"network", {{"mode", "allowlist"}, {"allow", {"allowed.test"}}}}}
          .dump());
  ASSERT_FALSE(id.empty());
  const std::string path = "/v1/sandboxes/" + id;
  // A pipeline whose processes are its own, and one allowed and one denied request.
  int code = -1;
  Run(id, "echo hello | tr h H > /tmp/out.txt", &code);
  EXPECT_EQ(code, 0);
  const std::string fetch =
      "python3 -c \"import sys, urllib.request as u\n"
      "try:\n    u.urlopen('http://' + sys.argv[1] + '/', timeout=10).read(); print('ok')\n"
      "except Exception as e:\n    print('refused')\" ";
  EXPECT_EQ(Run(id, fetch + "allowed.test"), "ok\n");
  EXPECT_EQ(Run(id, fetch + "denied.test"), "refused\n");
  // Files through the API, with the secret-looking env of a command never recorded.
  ASSERT_EQ(daemon_->Call(http::verb::put, path + "/files?path=/tmp/in.txt", "some bytes").status,
            200);
  Reply read = daemon_->Call(http::verb::get, path + "/files?path=/tmp/out.txt");
  ASSERT_EQ(read.status, 200) << read.body;
  EXPECT_EQ(read.body, "Hello\n");
  Reply with_env = daemon_->Call(
      http::verb::post, path + "/exec",
      json{{"argv", {"sh", "-c", "exit 7"}}, {"env", {{"API_TOKEN", "value-never-recorded"}}}}.dump());
  ASSERT_EQ(with_env.status, 200) << with_env.body;
  // A background process and a signal to it.
  Reply bg = daemon_->Call(http::verb::post, path + "/exec",
                           R"({"cmd": "sleep 300", "background": true})");
  ASSERT_EQ(bg.status, 200) << bg.body;
  const int pid = bg.Json()["pid"].get<int>();
  ASSERT_EQ(daemon_->Call(http::verb::post, path + "/processes/" + std::to_string(pid) + "/signal",
                          R"({"signal": 15})")
                .status,
            200);
  // Waiting sees its end, which goes on record once.
  Reply waited = daemon_->Call(http::verb::post,
                               path + "/processes/" + std::to_string(pid) + "/wait", R"({"timeout_seconds": 20})");
  ASSERT_EQ(waited.status, 200) << waited.body;

  const json events = Events(id);
  const json api = ApiEvents(events);
  EXPECT_EQ(ApiTypes(events),
            (std::vector<std::string>{"sandbox.created", "exec.start", "exec.end", "exec.start",
                                      "exec.end", "exec.start", "exec.end", "file.write",
                                      "file.read", "exec.start", "exec.end", "exec.start",
                                      "process.signal", "exec.end"}))
      << events.dump(1);
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["seq"], static_cast<int64_t>(i + 1)) << "numbered from 1, no gaps";
  }
  ASSERT_EQ(api.size(), 14u);
  const json& created = api[0]["data"];
  EXPECT_EQ(created["engine"], GetParam());
  EXPECT_EQ(created["template"], "base");
  EXPECT_EQ(created["network"], "allowlist");
  EXPECT_EQ(created["from_pool"], false);
  EXPECT_EQ(created["metadata"]["task"], "t1");
  EXPECT_TRUE(created["by"]["key"].is_string()) << "the key that asked";
  // The pipeline: its start and end pair up by command number.
  const json& start = api[1]["data"];
  const json& end = api[2]["data"];
  EXPECT_EQ(start["cmd"], "echo hello | tr h H > /tmp/out.txt");
  EXPECT_EQ(start["command"], end["command"]);
  EXPECT_EQ(end["exit_code"], 0);
  EXPECT_TRUE(end["pid"].is_number_integer());
  EXPECT_EQ(end["stdout_bytes"], 0);
  // Files: size and SHA-256 of the bytes, never the bytes.
  const json* written = First(events, "file.write");
  ASSERT_NE(written, nullptr);
  EXPECT_EQ((*written)["data"]["path"], "/tmp/in.txt");
  EXPECT_EQ((*written)["data"]["size"], 10);
  // sha256("some bytes")
  EXPECT_EQ((*written)["data"]["sha256"], kSomeBytesSha256);
  const json* was_read = First(events, "file.read");
  ASSERT_NE(was_read, nullptr);
  EXPECT_EQ((*was_read)["data"]["size"], 6);
  // Env names only.
  const json& env_start = api[9]["data"];
  EXPECT_EQ(env_start["env"], json::array({"API_TOKEN"}));
  EXPECT_EQ(api[10]["data"]["exit_code"], 7);
  EXPECT_EQ(events.dump().find("value-never-recorded"), std::string::npos);
  // The background command: its start has its pid, the signal names it, its end the signal.
  EXPECT_EQ(api[11]["data"]["pid"], pid);
  EXPECT_EQ(api[11]["data"]["background"], true);
  EXPECT_EQ(api[12]["data"], (json{{"pid", pid}, {"signal", 15}}));
  EXPECT_EQ(api[13]["data"]["signal"], 15);
  EXPECT_EQ(api[13]["data"]["command"], api[11]["data"]["command"]);
  // The network: the allowed request and the denied name, as the verdicts' own log has them.
  bool allowed = false, denied = false;
  for (const json& e : events) {
    const std::string type = e["type"];
    if (!type.starts_with("net.")) continue;
    const json& d = e["data"];
    allowed = allowed || (d["name"] == "allowed.test" && d["verdict"] == "allowed");
    denied = denied || (d["name"] == "denied.test" && d["verdict"] == "denied");
  }
  EXPECT_TRUE(allowed) << events.dump(1);
  EXPECT_TRUE(denied) << events.dump(1);
  // A filter: only the exec events, in the same order and numbers.
  const json execs = Events(id, "exec");
  EXPECT_EQ(execs.size(), 10u);
  for (const json& e : execs) EXPECT_TRUE(e["type"].get<std::string>().starts_with("exec."));

  // The end: an expiry. The record says so, and stays readable with why it ended.
  ASSERT_EQ(daemon_->Call(http::verb::patch, path, R"({"ttl_seconds": 1})").status, 200);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string state;
  while (std::chrono::steady_clock::now() < deadline && state != "destroyed") {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    state = daemon_->Call(http::verb::get, path).Json().value("state", "");
  }
  Reply ended = daemon_->Call(http::verb::get, path);
  ASSERT_EQ(ended.Json()["state"], "destroyed") << ended.body;
  EXPECT_EQ(ended.Json()["end_reason"], "expired");
  const json after = Events(id);
  std::vector<std::string> tail = ApiTypes(after);
  ASSERT_GE(tail.size(), 3u);
  tail.erase(tail.begin(), tail.end() - 3);
  EXPECT_EQ(tail, (std::vector<std::string>{"sandbox.updated", "sandbox.expired",
                                            "sandbox.destroyed"}));
  EXPECT_EQ(after.back()["data"]["reason"], "expired");
  EXPECT_EQ(after.back()["type"], "sandbox.destroyed") << "nothing after the end";
  // Calls on the ended sandbox are refused and add nothing to its record.
  EXPECT_EQ(daemon_->Call(http::verb::get, path + "/files?path=/tmp/in.txt").status, 404);
  EXPECT_EQ(daemon_->Call(http::verb::post, path + "/processes/" + std::to_string(pid) + "/signal",
                          R"({"signal": 9})")
                .status,
            404);
  EXPECT_EQ(Events(id), after);
  // The same record after a SIGKILL and a restart.
  ASSERT_TRUE(WIFSIGNALED(daemon_->Stop(SIGKILL)));
  ASSERT_TRUE(daemon_->Start());
  EXPECT_EQ(Events(id), after);
  EXPECT_EQ(daemon_->Call(http::verb::get, path).Json()["end_reason"], "expired");
}

// `bash -c "curl ... | sh"` shows what actually ran: the processes a command starts of its own.
TEST_P(RecorderTest, ProcessesStartedInsideAreOnRecordWithTheirParents) {
  if (const std::string lacks = EngineLacks(*daemon_, GetParam(), "process_events"); !lacks.empty()) {
    GTEST_SKIP() << lacks;
  }
  const std::string id = CreateSandbox(json{{"engine", GetParam()}}.dump());
  ASSERT_FALSE(id.empty());
  int code = -1;
  // The children live long enough to be looked at (a process gone before the engine reads its
  // argv is on record with argv_lost: docs/design/jail.md, "Process events").
  const std::string uid = Run(id, "echo 'sleep 0.5; id -u; exit 5' | sh", &code);
  EXPECT_EQ(code, 5);
  // The engine reports processes as it sees them, on a thread of its own: the last of them may
  // reach the log a moment after the command's end.
  // Every process of the command has ended: wait until each exec on record has its exit.
  auto settled = [](const json& events) {
    int execs = 0, exits = 0;
    for (const json& e : events) {
      execs += e["type"] == "proc.exec";
      exits += e["type"] == "proc.exit";
    }
    return execs >= 4 && exits >= execs;
  };
  json events = Events(id);
  for (int i = 0; i < 100 && !settled(events); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    events = Events(id);
  }
  const json* end = First(events, "exec.end");
  ASSERT_NE(end, nullptr) << events.dump(1);
  const int64_t outer = (*end)["data"]["pid"];
  // The outer shell's children: the inner sh (fed by the pipe), and its child sleep.
  const json* inner = nullptr;
  const json* sleep = nullptr;
  for (const json& e : events) {
    if (e["type"] != "proc.exec") continue;
    if (e["data"]["argv"] == json::array({"sh"})) inner = &e;
    if (e["data"]["argv"] == json::array({"sleep", "0.5"})) sleep = &e;
  }
  ASSERT_NE(inner, nullptr) << events.dump(1);
  ASSERT_NE(sleep, nullptr) << events.dump(1);
  EXPECT_EQ((*inner)["data"]["ppid"], outer);
  EXPECT_EQ((*sleep)["data"]["ppid"], (*inner)["data"]["pid"]);
  EXPECT_EQ(std::to_string((*sleep)["data"]["uid"].get<int64_t>()) + "\n", uid);
  // Their ends: the inner sh's exit 5, in order after its start.
  bool inner_exit = false;
  for (const json& e : events) {
    if (e["type"] == "proc.exit" && e["data"]["pid"] == (*inner)["data"]["pid"]) {
      EXPECT_EQ(e["data"]["exit_code"], 5);
      EXPECT_GT(e["seq"].get<int64_t>(), (*inner)["seq"].get<int64_t>());
      inner_exit = true;
    }
  }
  EXPECT_TRUE(inner_exit) << events.dump(1);
  // Nothing of the host's: every process on record is the sandbox's (pids as it sees them).
  for (const json& e : events) {
    if (e["type"] == "proc.exec") {
      EXPECT_LT(e["data"].value("pid", int64_t{0}), 1000) << e.dump();
    }
  }
  // The engine's watch counts what it gave the recorder in /metrics (at least this sandbox's).
  Reply metrics = daemon_->Call(http::verb::get, "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_EQ(ExpositionProblems(metrics.body), "");
  const std::string engine = "engine=\"" + GetParam() + "\"";
  EXPECT_GE(SeriesValue(metrics.body, "airlock_process_events_total{" + engine +
                                          ",outcome=\"reported\"}"),
            8)
      << metrics.body;
  EXPECT_GE(SeriesValue(metrics.body, "airlock_process_events_total{" + engine +
                                          ",outcome=\"dropped\"}"),
            0)
      << metrics.body;
}

TEST_P(RecorderTest, ALiveStreamSendsEventsAsTheyHappenAndEndsWithTheSandbox) {
  const std::string id = CreateSandbox(json{{"engine", GetParam()}}.dump());
  ASSERT_FALSE(id.empty());
  const std::string path = "/v1/sandboxes/" + id;
  RawStream sse(daemon_->port(), daemon_->key(), path + "/events?follow=1&type=sandbox,exec", "",
                "GET");
  ASSERT_TRUE(sse.ReadUntil("event: sandbox.created")) << sse.got();
  EXPECT_NE(sse.got().find("text/event-stream"), std::string::npos) << sse.got();
  EXPECT_EQ(sse.got().find("event: exec.start"), std::string::npos);
  EXPECT_EQ(Run(id, "echo live"), "live\n");
  ASSERT_TRUE(sse.ReadUntil("event: exec.end")) << sse.got();
  // Each SSE event carries its seq as its id, for a client that reconnects with after=.
  // (sandbox.created is 1, or 2 after the agent's own proc.exec on an engine with process events.)
  EXPECT_TRUE(std::regex_search(sse.got(), std::regex("id: [12]\nevent: sandbox.created\n")))
      << sse.got();
  ASSERT_EQ(daemon_->Call(http::verb::delete_, path).status, 204);
  ASSERT_TRUE(sse.ReadUntil("event: sandbox.destroyed")) << sse.got();
  // ...and the stream ends (the last chunk of a chunked body).
  EXPECT_TRUE(sse.ReadUntil("\r\n0\r\n\r\n")) << sse.got();
  // JSON Lines of the whole log, the same events as the pages.
  RawStream lines(daemon_->port(), daemon_->key(), path + "/events?format=jsonl", "", "GET");
  ASSERT_TRUE(lines.ReadUntil("\r\n0\r\n\r\n")) << lines.got();
  std::vector<json> got = lines.Events();
  EXPECT_EQ(json(got), Events(id));
}

TEST_P(RecorderTest, ARestartRecordsWhatItTookBackAndTheLogGoesOn) {
  const std::string id = CreateSandbox(json{{"engine", GetParam()}}.dump());
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(Run(id, "echo before"), "before\n");
  const size_t before = Events(id).size();
  ASSERT_GE(before, 3u);
  ASSERT_TRUE(WIFSIGNALED(daemon_->Stop(SIGKILL)));
  ASSERT_TRUE(daemon_->Start());
  EXPECT_EQ(Run(id, "echo after"), "after\n");
  const std::vector<std::string> types = ApiTypes(Events(id));
  ASSERT_GE(types.size(), 3u);
  EXPECT_EQ(std::vector<std::string>(types.end() - 3, types.end()),
            (std::vector<std::string>{"sandbox.recovered", "exec.start", "exec.end"}));
}

TEST_P(RecorderTest, BadQueriesAreRefusedAndOtherTenantsSeeNothing) {
  const std::string id = CreateSandbox(json{{"engine", GetParam()}}.dump());
  ASSERT_FALSE(id.empty());
  const std::string events = "/v1/sandboxes/" + id + "/events";
  for (const char* bad : {"?type=Exec", "?type=", "?follow=1&format=json", "?format=xml",
                          "?after=-1", "?limit=0", "?since=3"}) {
    Reply r = daemon_->Call(http::verb::get, events + bad);
    EXPECT_EQ(r.status, 400) << bad << ": " << r.body;
  }
  EXPECT_EQ(daemon_->Call(http::verb::post, events, "{}").status, 405);
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/sbx-aaaaaaaaaaaaaaaa/events").status, 404);
}

INSTANTIATE_TEST_SUITE_P(Engines, RecorderTest, ::testing::ValuesIn(EnginesOfThisBuild()),
                         EngineName);

}  // namespace
