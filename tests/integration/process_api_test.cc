// Background processes, stdin, signals and terminals through the HTTP API of a real airlockd
// (docs/design/processes.md): each test makes its own sandbox, which the daemon destroys when the
// fixture stops it.

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "daemon/api/base64.h"
#include "support/airlockd.h"

namespace {

using namespace airlock::testing;
using namespace std::chrono_literals;

class ProcessApiTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    id_ = CreateSandbox();
    ASSERT_FALSE(id_.empty());
    base_ = "/v1/sandboxes/" + id_;
  }

  Reply Post(const std::string& path, const std::string& body) {
    return daemon_->Call(http::verb::post, base_ + path, body);
  }
  Reply Get(const std::string& path) { return daemon_->Call(http::verb::get, base_ + path); }

  // Starts a background command (the request's JSON fields without "background") and returns
  // its pid, 0 after a test failure.
  int Start(const std::string& fields) {
    Reply r = Post("/exec", "{\"background\": true, " + fields + "}");
    EXPECT_EQ(r.status, 200) << r.body;
    if (r.status != 200) return 0;
    const json doc = r.Json();
    EXPECT_EQ(doc["state"], "running") << r.body;
    EXPECT_EQ(doc["background"], true) << r.body;
    return doc["pid"].get<int>();
  }
  std::string Proc(int pid, const std::string& action = "") {
    return "/processes/" + std::to_string(pid) + (action.empty() ? "" : "/" + action);
  }
  json Wait(int pid, double seconds = 30) {
    Reply r = Post(Proc(pid, "wait"), "{\"timeout_seconds\": " + std::to_string(seconds) + "}");
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.Json() : json();
  }
  // The stdout of the output route (replay, no follow), and its last event.
  std::pair<std::string, json> Output(int pid) {
    RawStream s(daemon_->port(), daemon_->key(), base_ + Proc(pid, "output"), "", "GET");
    EXPECT_TRUE(s.ReadUntil("\r\n0\r\n\r\n")) << s.got();
    std::string out;
    const std::vector<json> events = s.Events();
    for (const json& e : events) {
      if (e["type"] == "stdout") out += Bytes(e);
    }
    return {out, events.empty() ? json() : events.back()};
  }
  // The process's output (replayed) once it holds at least `bytes` bytes, or what it held after
  // 30 s.
  std::string OutputOf(int pid, size_t bytes) {
    std::string out;
    for (auto deadline = std::chrono::steady_clock::now() + 30s;
         out.size() < bytes && std::chrono::steady_clock::now() < deadline;) {
      out = Output(pid).first;
    }
    return out;
  }

  // An output event's bytes (its data, decoded when it is base64).
  static std::string Bytes(const json& event) {
    const std::string data = event["data"];
    if (event["data_encoding"] != "base64") return data;
    auto decoded = airlock::api::Base64Decode(data);
    EXPECT_TRUE(decoded.has_value()) << data;
    return decoded.value_or("");
  }

  // The names of the processes running in the sandbox (from /proc inside it).
  std::string RunningCommands() {
    Reply r = Post("/exec", R"({"cmd": "cat /proc/[0-9]*/comm"})");
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.Json()["stdout"].get<std::string>() : "";
  }

  std::string id_, base_;
};

TEST_F(ProcessApiTest, BackgroundProcessTakesStdinShowsOutputAndIsWaitedFor) {
  const int pid = Start(R"("cmd": "cat", "stdin_open": true)");
  ASSERT_GT(pid, 0);
  Reply listed = Get("/processes");
  ASSERT_EQ(listed.status, 200) << listed.body;
  bool found = false;
  const json list = listed.Json();
  for (const json& p : list["processes"]) {
    if (p["pid"] == pid) {
      found = true;
      EXPECT_EQ(p["command"], "cat");
      EXPECT_EQ(p["state"], "running");
      EXPECT_EQ(p["stdin_open"], true);
    }
  }
  EXPECT_TRUE(found) << listed.body;

  Reply in = Post(Proc(pid, "stdin"), R"({"data": "hello\n"})");
  ASSERT_EQ(in.status, 200) << in.body;
  // Binary input, base64.
  in = Post(Proc(pid, "stdin"), R"({"data": "/wB4Cg==", "encoding": "base64"})");
  ASSERT_EQ(in.status, 200) << in.body;
  const std::string sent = "hello\n" + std::string("\xff\0x\n", 4);
  const std::string out = OutputOf(pid, sent.size());
  EXPECT_EQ(out, sent) << "cat echoes what it got before its stdin closes";

  // Still running (a wait that times out says so), until stdin closes.
  json waited = Wait(pid, 0.3);
  EXPECT_EQ(waited["state"], "running") << waited;
  ASSERT_EQ(Post(Proc(pid, "stdin"), R"({"close": true})").status, 200);
  waited = Wait(pid);
  EXPECT_EQ(waited["state"], "exited") << waited;
  EXPECT_EQ(waited["exit_code"], 0) << waited;
  EXPECT_TRUE(waited.contains("ended_at")) << waited;

  // The whole output replays after the end, bytes that are not UTF-8 in base64, then the exit.
  RawStream s(daemon_->port(), daemon_->key(), base_ + Proc(pid, "output"), "", "GET");
  ASSERT_TRUE(s.ReadUntil("\r\n0\r\n\r\n")) << s.got();
  const std::vector<json> events = s.Events();
  ASSERT_GE(events.size(), 3u) << s.got();
  EXPECT_EQ(events.front()["type"], "start");
  EXPECT_EQ(events.back()["type"], "exit");
  EXPECT_EQ(events.back()["exit_code"], 0);
  std::string replayed;
  for (const json& e : events) {
    if (e["type"] == "stdout") replayed += Bytes(e);
  }
  EXPECT_EQ(replayed, sent) << s.got();

  // A closed stdin takes nothing more.
  Reply refused = Post(Proc(pid, "stdin"), R"({"data": "late"})");
  EXPECT_EQ(refused.status, 409) << refused.body;
  EXPECT_EQ(refused.Json()["error"]["code"], "failed_precondition") << refused.body;
}

TEST_F(ProcessApiTest, SignalsByNameAndNumberReachTheProcess) {
  const int sleeper = Start(R"("argv": ["sleep", "1000"])");
  ASSERT_GT(sleeper, 0);
  Reply r = Post(Proc(sleeper, "signal"), R"({"signal": "INT"})");
  ASSERT_EQ(r.status, 200) << r.body;
  json done = Wait(sleeper);
  EXPECT_EQ(done["state"], "exited") << done;
  EXPECT_EQ(done["signal"], 2) << done;
  EXPECT_TRUE(done["exit_code"].is_null()) << done;

  // A process that ignores TERM survives it (the negative), and KILL by number ends it.
  const int stubborn = Start(R"("cmd": "trap '' TERM; echo ready; while :; do sleep 0.05; done")");
  ASSERT_GT(stubborn, 0);
  // The trap is set once it says so; a TERM before that would end it.
  ASSERT_EQ(OutputOf(stubborn, 6), "ready\n");
  ASSERT_EQ(Post(Proc(stubborn, "signal"), R"({"signal": "SIGTERM"})").status, 200);
  EXPECT_EQ(Wait(stubborn, 1)["state"], "running");
  ASSERT_EQ(Post(Proc(stubborn, "signal"), R"({"signal": 9})").status, 200);
  done = Wait(stubborn);
  EXPECT_EQ(done["state"], "exited") << done;
  EXPECT_EQ(done["signal"], 9) << done;
}

TEST_F(ProcessApiTest, BackgroundTimeoutKillsTheWholeTree) {
  const int pid = Start(
      R"("cmd": "sleep 1001 & sh -c 'sleep 1002' & (trap '' TERM; sleep 1003) & wait", "timeout_seconds": 2)");
  ASSERT_GT(pid, 0);
  // Positive control: the tree is there before the timeout.
  std::string running;
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       std::chrono::steady_clock::now() < deadline;) {
    running = RunningCommands();
    size_t sleeps = 0;
    for (size_t at = running.find("sleep"); at != std::string::npos;
         at = running.find("sleep", at + 1)) {
      ++sleeps;
    }
    if (sleeps >= 3) break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_NE(running.find("sleep"), std::string::npos) << running;
  const json done = Wait(pid);
  EXPECT_EQ(done["state"], "exited") << done;
  EXPECT_EQ(done["timed_out"], true) << done;
  EXPECT_EQ(RunningCommands().find("sleep"), std::string::npos)
      << "a grandchild outlived the timeout";
}

TEST_F(ProcessApiTest, FollowedOutputArrivesLiveInOrderThenTheExit) {
  const int pid = Start(
      R"("cmd": "read go; for i in 1 2 3 4 5; do echo line $i; sleep 0.1; done; echo oops >&2; exit 6", "stdin_open": true)");
  ASSERT_GT(pid, 0);
  RawStream s(daemon_->port(), daemon_->key(), base_ + Proc(pid, "output?follow=true"), "",
              "GET");
  ASSERT_TRUE(s.ReadUntil("\"start\"")) << s.got();
  // Nothing is printed before this input: what follows is live, not replayed.
  ASSERT_EQ(Post(Proc(pid, "stdin"), R"({"data": "go\n"})").status, 200);
  ASSERT_TRUE(s.ReadUntil("\r\n0\r\n\r\n")) << s.got();
  std::string out, err;
  const std::vector<json> events = s.Events();
  for (const json& e : events) {
    if (e["type"] == "stdout") out += e["data"].get<std::string>();
    if (e["type"] == "stderr") err += e["data"].get<std::string>();
  }
  EXPECT_EQ(out, "line 1\nline 2\nline 3\nline 4\nline 5\n");
  EXPECT_EQ(err, "oops\n");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["type"], "exit");
  EXPECT_EQ(events.back()["exit_code"], 6);
}

TEST_F(ProcessApiTest, AProcessOutlivesItsClientAndADaemonRestart) {
  const int pid = Start(R"("cmd": "echo before; exec sleep 1000")");
  ASSERT_GT(pid, 0);
  // The daemon dies without warning and comes back: it adopts the sandbox, and the agent still
  // has the process, its output and its entry.
  ASSERT_TRUE(WIFSIGNALED(daemon_->Stop(SIGKILL)));
  ASSERT_TRUE(daemon_->Start());
  Reply got = Get(Proc(pid));
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["state"], "running") << got.body;
  EXPECT_EQ(OutputOf(pid, 7), "before\n");
  ASSERT_EQ(Post(Proc(pid, "signal"), R"({"signal": "KILL"})").status, 200);
  EXPECT_EQ(Wait(pid)["signal"], 9);
}

TEST_F(ProcessApiTest, ShutdownCutsStreamsThatWouldNeverEnd) {
  // Followed output of a process that runs on, and a streaming exec of one: neither ends by
  // itself, and neither may hold up a shutdown (which destroys the sandboxes).
  const int pid = Start(R"("cmd": "echo up; exec sleep 1000")");
  ASSERT_GT(pid, 0);
  RawStream follow(daemon_->port(), daemon_->key(), base_ + Proc(pid, "output?follow=true"), "",
                   "GET");
  ASSERT_TRUE(follow.ReadUntil("up")) << follow.got();
  RawStream exec(daemon_->port(), daemon_->key(), base_ + "/exec",
                 R"({"stream": true, "cmd": "echo running; exec sleep 1000"})");
  ASSERT_TRUE(exec.ReadUntil("running")) << exec.got();
  const int status = daemon_->Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "airlockd was killed after waiting on its streams (status " << status << ")";
  // The streams were cut, not finished: no last chunk.
  EXPECT_FALSE(follow.ReadUntil("\r\n0\r\n\r\n"));
  EXPECT_FALSE(exec.ReadUntil("\r\n0\r\n\r\n"));
  std::error_code ec;
  EXPECT_TRUE(fs::is_empty(daemon_->state_dir() + "/jail", ec)) << "a sandbox outlived the stop";
  EXPECT_TRUE(CgroupsNamed(id_).empty());
}

TEST_F(ProcessApiTest, ForegroundCommandsAreListedWhileTheyRun) {
  RawStream s(daemon_->port(), daemon_->key(), base_ + "/exec",
              R"({"stream": true, "cmd": "echo up; exec sleep 1000"})");
  ASSERT_TRUE(s.ReadUntil("up")) << s.got();
  const int pid = s.Events().front()["pid"].get<int>();
  Reply got = Get(Proc(pid));
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["background"], false);
  EXPECT_EQ(got.Json()["state"], "running");
  // Killable by pid from another request; its stream ends with the signal.
  ASSERT_EQ(Post(Proc(pid, "signal"), R"({"signal": "TERM"})").status, 200);
  ASSERT_TRUE(s.ReadUntil("\r\n0\r\n\r\n")) << s.got();
  EXPECT_EQ(s.Events().back()["signal"], 15) << s.got();
  // Its output was its stream's; there is nothing to replay, and after its end it is gone.
  EXPECT_EQ(Get(Proc(pid)).status, 404);

  // A wait on a foreground command answers with its end, although it leaves the table as it ends.
  RawStream short_one(daemon_->port(), daemon_->key(), base_ + "/exec",
                      R"({"stream": true, "cmd": "echo up; sleep 0.5; exit 3"})");
  ASSERT_TRUE(short_one.ReadUntil("up")) << short_one.got();
  const json waited = Wait(short_one.Events().front()["pid"].get<int>());
  EXPECT_EQ(waited["state"], "exited") << waited;
  EXPECT_EQ(waited["exit_code"], 3) << waited;
  EXPECT_EQ(waited["background"], false) << waited;
}

TEST_F(ProcessApiTest, InterleavedStdoutAndStderrKeepEachStreamsOrder) {
  RawStream s(daemon_->port(), daemon_->key(), base_ + "/exec",
              R"({"stream": true, "cmd": "i=1; while [ $i -le 300 ]; do echo o$i; echo e$i >&2; [ $((i % 50)) -eq 0 ] && sleep 0.1; i=$((i+1)); done"})");
  ASSERT_TRUE(s.ReadUntil("\r\n0\r\n\r\n")) << s.got();
  std::string out, err, expect_out, expect_err;
  int switches = 0;
  std::string last;
  for (const json& e : s.Events()) {
    const std::string type = e["type"];
    if (type == "stdout") out += e["data"].get<std::string>();
    if (type == "stderr") err += e["data"].get<std::string>();
    if ((type == "stdout" || type == "stderr") && type != last) {
      ++switches;
      last = type;
    }
  }
  for (int i = 1; i <= 300; ++i) {
    expect_out += "o" + std::to_string(i) + "\n";
    expect_err += "e" + std::to_string(i) + "\n";
  }
  EXPECT_EQ(out, expect_out);
  EXPECT_EQ(err, expect_err);
  // Both streams are read as they come, not one after the other: each pause of the writer lets
  // the agent catch up with both.
  EXPECT_GE(switches, 6) << s.got().substr(0, 2000);
}

TEST_F(ProcessApiTest, ATerminalThroughThePlainExecApi) {
  Reply r = Post("/exec", R"({"cmd": "tty; stty size; echo err >&2", "pty": {"cols": 100, "rows": 30}})");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string out = r.Json()["stdout"];
  EXPECT_NE(out.find("/dev/pts/"), std::string::npos) << out;
  EXPECT_NE(out.find("30 100"), std::string::npos) << out;
  EXPECT_NE(out.find("err"), std::string::npos) << "stderr shares the terminal: " << out;
  EXPECT_EQ(r.Json()["stderr"], "");
  // Without a pty there is no terminal.
  r = Post("/exec", R"({"cmd": "tty"})");
  EXPECT_EQ(r.Json()["stdout"], "not a tty\n") << r.body;

  // On its terminal, a command cannot push input into it (TIOCSTI) or use the console ioctls
  // (TIOCLINUX); the terminal's other ioctls work (TIOCGWINSZ, the positive control).
  r = Post("/exec", R"({"argv": ["/usr/bin/perl", "-e", "my $ws = chr(0) x 8; print ioctl(STDIN, 0x5413, $ws) ? \"winsz ok\n\" : \"winsz $!\n\"; my $c = 'x'; print ioctl(STDIN, 0x5412, $c) ? \"sti ok\n\" : \"sti $!\n\"; my $l = chr(2); print ioctl(STDIN, 0x541C, $l) ? \"linux ok\n\" : \"linux $!\n\";"], "pty": {"cols": 80, "rows": 24}})");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string ioctls = r.Json()["stdout"];
  EXPECT_NE(ioctls.find("winsz ok"), std::string::npos) << ioctls;
  EXPECT_NE(ioctls.find("sti Operation not permitted"), std::string::npos) << ioctls;
  EXPECT_NE(ioctls.find("linux Operation not permitted"), std::string::npos) << ioctls;
}

TEST_F(ProcessApiTest, BadProcessRequestsAreRefusedAndChangeNothing) {
  const int pid = Start(R"("argv": ["sleep", "1000"])");
  ASSERT_GT(pid, 0);
  const std::string p = Proc(pid);
  struct Case {
    http::verb verb;
    std::string path, body;
    unsigned status;
    std::string code;
  };
  const std::vector<Case> cases = {
      {http::verb::get, "/processes/abc", "", 400, "invalid_argument"},
      {http::verb::get, "/processes/0", "", 400, "invalid_argument"},
      {http::verb::get, "/processes/-1", "", 400, "invalid_argument"},
      {http::verb::get, "/processes/0" + std::to_string(pid), "", 400, "invalid_argument"},
      {http::verb::get, "/processes/99999999999", "", 400, "invalid_argument"},
      {http::verb::get, "/processes/4000000", "", 404, "not_found"},
      {http::verb::post, "/processes/4000000/signal", R"({"signal": 1})", 404, "not_found"},
      {http::verb::get, p + "/nosuch", "", 404, "not_found"},
      {http::verb::get, p + "/signal/extra", "", 404, "not_found"},
      {http::verb::post, p, "", 405, "method_not_allowed"},
      {http::verb::get, p + "/signal", "", 405, "method_not_allowed"},
      {http::verb::post, p + "/output", "", 405, "method_not_allowed"},
      {http::verb::delete_, "/processes", "", 405, "method_not_allowed"},
      {http::verb::post, p + "/signal", R"({"signal": "NOPE"})", 400, "invalid_argument"},
      {http::verb::post, p + "/signal", R"({"signal": 65})", 400, "invalid_argument"},
      {http::verb::post, p + "/signal", R"({"signal": 0})", 400, "invalid_argument"},
      {http::verb::post, p + "/signal", R"({})", 400, "invalid_argument"},
      {http::verb::post, p + "/signal", R"({"signal": "TERM", "x": 1})", 400, "invalid_argument"},
      {http::verb::post, p + "/stdin", R"({})", 400, "invalid_argument"},
      {http::verb::post, p + "/stdin", R"({"data": "!!", "encoding": "base64"})", 400,
       "invalid_argument"},
      {http::verb::post, p + "/stdin", R"({"data": "x"})", 409, "failed_precondition"},
      {http::verb::post, p + "/wait", R"({"timeout_seconds": 0})", 400, "invalid_argument"},
      {http::verb::post, p + "/wait", R"({"timeout_seconds": 301})", 400, "invalid_argument"},
      {http::verb::get, p + "?x=1", "", 400, "invalid_argument"},
      {http::verb::get, p + "/output?follow=maybe", "", 400, "invalid_argument"},
      {http::verb::get, p + "/output?tail=1", "", 400, "invalid_argument"},
      {http::verb::post, "/exec", R"({"cmd": "true", "background": true, "stream": true})", 400,
       "invalid_argument"},
      {http::verb::post, "/exec", R"({"cmd": "true", "background": "yes"})", 400,
       "invalid_argument"},
      {http::verb::post, "/exec", R"({"cmd": "true", "pty": {"cols": 0, "rows": 10}})", 400,
       "invalid_argument"},
      {http::verb::post, "/exec", R"({"cmd": "true", "pty": {"cols": 80, "lines": 10}})", 400,
       "invalid_argument"},
      {http::verb::post, "/exec", R"({"cmd": "true", "pty": true})", 400, "invalid_argument"},
      {http::verb::post, "/exec", R"({"argv": ["/nonexistent"], "background": true})", 400,
       "invalid_argument"},
      {http::verb::post, "/exec", R"({"cmd": "cat", "stdin_open": true})", 400,
       "invalid_argument"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(http::to_string(c.verb)) + " " + c.path + " " + c.body);
    Reply r = daemon_->Call(c.verb, base_ + c.path, c.body);
    EXPECT_EQ(r.status, c.status) << r.body;
    if (c.status != 405) {
      EXPECT_EQ(r.Json()["error"]["code"], c.code) << r.body;
    }
  }
  // Unknown sandboxes are 404 for every process route.
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/sbx-aaaaaaaaaaaaaaaa/processes").status,
            404);
  // The process was not touched by any of it.
  Reply got = Get(p);
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["state"], "running");
}

TEST_F(ProcessApiTest, ProcessesOfAPausedSandboxAreRefusedUntilResumed) {
  const int pid = Start(R"("argv": ["sleep", "1000"])");
  ASSERT_GT(pid, 0);
  ASSERT_EQ(Post("/pause", "").status, 200);
  Reply r = Get("/processes");
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_EQ(Post(Proc(pid, "signal"), R"({"signal": "KILL"})").status, 409);
  ASSERT_EQ(Post("/resume", "").status, 200);
  Reply got = Get(Proc(pid));
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["state"], "running") << "a refused signal was delivered anyway";
}

}  // namespace
