// airlockd's WebSocket sessions end to end (docs/design/processes.md): exec/ws and
// processes/{pid}/ws on a real daemon, driven by the client library's WsClient the way the CLI
// drives them. Needs root (the jail engine); skips otherwise. No timing is asserted: waits are
// bounded by generous deadlines, and a test fails only when what it waits for never comes.

#include <sys/resource.h>

#include <algorithm>
#include <regex>

#include "client/ws_client.h"
#include "support/airlockd.h"

namespace {

using namespace airlock::testing;
using airlock::ErrorCode;
using airlock::client::HttpResponse;
using airlock::client::WsClient;
using airlock::client::WsMessage;

constexpr auto kDeadline = std::chrono::seconds(60);

// What a session sent, event by event.
struct Session {
  std::unique_ptr<WsClient> ws;
  std::string out, err;  // stdout and stderr data, decoded
  std::vector<json> events;
  std::optional<json> exit, error;
  std::optional<WsMessage> close;  // the server's close, once it came
  std::string broken;              // why the connection ended without a close, if it did

  // Reads until `done()` holds (true), or the session ends or the deadline passes (false).
  template <typename Done>
  bool ReadUntil(Done done) {
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (!done()) {
      if (close || !broken.empty() || std::chrono::steady_clock::now() > deadline) return false;
      auto msg = ws->Read(std::chrono::milliseconds(200));
      if (!msg) {
        if (msg.error().code() != ErrorCode::kDeadlineExceeded) broken = msg.error().message();
        continue;
      }
      if (msg->type == WsMessage::Type::kClose) {
        close = std::move(*msg);
        continue;
      }
      EXPECT_EQ(msg->type, WsMessage::Type::kText) << "the server sends text messages only";
      EXPECT_FALSE(msg->data.ends_with('\n')) << msg->data;
      json event = json::parse(msg->data, nullptr, /*allow_exceptions=*/false);
      EXPECT_TRUE(event.is_object() && event.contains("type") && event.contains("time"))
          << msg->data;
      if (!event.is_object()) continue;
      const std::string type = event.value("type", "");
      if (type == "stdout" || type == "stderr") {
        std::string data = event["data"];
        if (event["data_encoding"] == "base64") data = Base64Decode(data);
        (type == "stdout" ? out : err) += data;
      } else if (type == "exit") {
        exit = event;
      } else if (type == "error") {
        error = event;
      }
      events.push_back(std::move(event));
    }
    return true;
  }
  bool ReadUntilOutput(const std::string& needle, size_t from = 0) {
    return ReadUntil([&] { return out.size() >= from && out.find(needle, from) != std::string::npos; });
  }
  // Until the server's close (after the last event).
  bool ReadToClose() { return ReadUntil([&] { return close.has_value(); }); }

  void Send(const json& message) {
    auto sent = ws->SendText(message.dump());
    EXPECT_TRUE(sent.has_value()) << sent.error().message();
  }
  void SendStdin(const std::string& text) { Send({{"type", "stdin"}, {"data", text}}); }

  static std::string Base64Decode(const std::string& text) {
    static const std::string kAlphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    uint32_t acc = 0;
    int bits = 0;
    for (char c : text) {
      if (c == '=') break;
      acc = (acc << 6) | static_cast<uint32_t>(kAlphabet.find(c));
      bits += 6;
      if (bits >= 8) {
        bits -= 8;
        out += static_cast<char>((acc >> bits) & 0xff);
      }
    }
    return out;
  }
};

class WsTest : public DaemonTest {
 protected:
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(daemon_->port()); }

  // A session on `target`, or a test failure.
  Session Open(const std::string& target) {
    Session s;
    HttpResponse refusal;
    auto ws = WsClient::Connect(Url(), daemon_->key(), target, &refusal);
    EXPECT_TRUE(ws.has_value()) << target << ": " << (ws ? "" : ws.error().message());
    if (ws) s.ws = std::move(*ws);
    return s;
  }
  // exec/ws with `request` as the first message.
  Session Exec(const std::string& id, const json& request) {
    Session s = Open("/v1/sandboxes/" + id + "/exec/ws");
    if (s.ws) s.Send(request);
    return s;
  }
  // The status of a refused upgrade (0 if it was accepted), and its body.
  std::pair<int, json> Refused(const std::string& target, const std::string& key) {
    HttpResponse refusal;
    auto ws = WsClient::Connect(Url(), key, target, &refusal);
    if (ws) return {0, json()};
    return {refusal.status, json::parse(refusal.body, nullptr, false)};
  }

  // Runs `cmd` with a plain exec; its exit code.
  int ExecCode(const std::string& id, const std::string& cmd) {
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                            json({{"cmd", cmd}}).dump());
    EXPECT_EQ(r.status, 200) << r.body;
    const json doc = r.Json();
    return doc.value("exit_code", json()).is_number_integer() ? doc["exit_code"].get<int>() : -1;
  }

  // Waits until `cmd` exits 0 in the sandbox (true), or the deadline passes.
  bool WaitFor(const std::string& id, const std::string& cmd) {
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (std::chrono::steady_clock::now() < deadline) {
      if (ExecCode(id, cmd) == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // Starts a background command; its pid (0 with a test failure).
  int32_t Background(const std::string& id, json request) {
    request["background"] = true;
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec", request.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    const json doc = r.Json();
    EXPECT_EQ(doc.value("state", ""), "running") << r.body;
    return doc.value("pid", json()).is_number_integer() ? doc["pid"].get<int32_t>() : 0;
  }
};

TEST_F(WsTest, AShellOnATerminal) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  Session s = Exec(id, {{"argv", {"bash", "--norc", "--noprofile", "-i"}},
                        {"pty", {{"cols", 80}, {"rows", 24}}}});
  ASSERT_TRUE(s.ws);
  ASSERT_TRUE(s.ReadUntil([&] { return !s.events.empty(); })) << s.broken;
  ASSERT_EQ(s.events.front()["type"], "start") << s.events.front();
  EXPECT_GT(s.events.front()["pid"].get<int>(), 1);

  // The terminal echoes what is typed ("$((6*7))"); only the shell's answer holds "42".
  size_t mark = s.out.size();
  s.SendStdin("echo $((6*7))\n");
  ASSERT_TRUE(s.ReadUntilOutput("42", mark)) << s.out;

  mark = s.out.size();
  s.SendStdin("stty size\n");
  ASSERT_TRUE(s.ReadUntilOutput("24 80", mark)) << s.out;
  s.Send({{"type", "resize"}, {"cols", 132}, {"rows", 43}});
  mark = s.out.size();
  // Binary messages are stdin too.
  ASSERT_TRUE(s.ws->SendBinary("stty size\n").has_value());
  ASSERT_TRUE(s.ReadUntilOutput("43 132", mark)) << s.out;

  mark = s.out.size();
  s.SendStdin("tty; echo TERM=$TERM\n");
  ASSERT_TRUE(s.ReadUntilOutput("TERM=xterm-256color", mark)) << s.out;
  // (bash may put terminal mode sequences, such as bracketed paste's, before its output)
  EXPECT_TRUE(std::regex_search(s.out.substr(mark), std::regex("/dev/pts/[0-9]+\r\n")))
      << s.out.substr(mark);

  s.SendStdin("exit 3\n");
  ASSERT_TRUE(s.ReadToClose()) << s.broken << "\n" << s.out;
  ASSERT_TRUE(s.exit.has_value()) << s.out;
  EXPECT_EQ((*s.exit)["exit_code"], 3) << *s.exit;
  EXPECT_EQ(s.events.back(), *s.exit) << "exit is the last event";
  EXPECT_EQ(s.close->close_code, 1000);
  EXPECT_TRUE(s.err.empty()) << "a terminal has one output stream: " << s.err;
}

TEST_F(WsTest, StdinRoundTripWithoutATerminal) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  Session s = Exec(id, {{"argv", {"cat"}}});
  ASSERT_TRUE(s.ws);
  std::string bytes;
  for (int round = 0; round < 4; ++round) {
    for (int b = 0; b < 256; ++b) bytes += static_cast<char>(b);  // NUL and 0xff included
  }
  ASSERT_TRUE(s.ws->SendBinary(bytes).has_value());
  // Text messages carry bytes too, base64-encoded or as UTF-8.
  s.Send({{"type", "stdin"}, {"data", "AP8A/w=="}, {"encoding", "base64"}});
  s.Send({{"type", "stdin"}, {"data", "h\u00e9llo"}, {"encoding", "utf-8"}});
  const std::string expected = bytes + std::string("\x00\xff\x00\xff", 4) + "h\xc3\xa9llo";
  ASSERT_TRUE(s.ReadUntil([&] { return s.out.size() >= expected.size(); })) << s.out.size();
  EXPECT_TRUE(s.out == expected) << "got " << s.out.size() << " bytes back";
  EXPECT_FALSE(s.exit.has_value()) << "cat ended before its stdin was closed";

  s.Send({{"type", "stdin_close"}});
  ASSERT_TRUE(s.ReadToClose()) << s.broken;
  ASSERT_TRUE(s.exit.has_value());
  EXPECT_EQ((*s.exit)["exit_code"], 0) << *s.exit;
  EXPECT_EQ(s.close->close_code, 1000);
  EXPECT_TRUE(s.out == expected);
}

TEST_F(WsTest, BulkOutputArrivesWholeOneEventPerMessage) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  // Output faster than it is sent: the daemon reads many events at once, and each still goes
  // as a message of its own (Session::ReadUntil checks every message is one JSON object).
  Session s = Exec(id, {{"cmd", "seq 1 200000; seq 1 50000 >&2"}});
  ASSERT_TRUE(s.ws);
  ASSERT_TRUE(s.ReadToClose()) << s.broken;
  std::string expected, expected_err;
  for (int i = 1; i <= 200000; ++i) expected += std::to_string(i) + "\n";
  for (int i = 1; i <= 50000; ++i) expected_err += std::to_string(i) + "\n";
  EXPECT_TRUE(s.out == expected) << s.out.size() << " bytes of stdout";
  EXPECT_TRUE(s.err == expected_err) << s.err.size() << " bytes of stderr";
  ASSERT_TRUE(s.exit.has_value());
  EXPECT_EQ((*s.exit)["exit_code"], 0);
  EXPECT_GT(s.events.size(), 3u);
}

TEST_F(WsTest, SignalReachesTheCommand) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  for (const json& signal : {json("INT"), json("SIGINT"), json(2)}) {
    Session s = Exec(id, {{"cmd", "echo up; exec sleep 1000"}});
    ASSERT_TRUE(s.ws);
    ASSERT_TRUE(s.ReadUntilOutput("up")) << s.broken;
    s.Send({{"type", "signal"}, {"signal", signal}});
    ASSERT_TRUE(s.ReadToClose()) << s.broken;
    ASSERT_TRUE(s.exit.has_value()) << signal;
    EXPECT_EQ((*s.exit)["signal"], 2) << *s.exit;
    EXPECT_TRUE((*s.exit)["exit_code"].is_null()) << *s.exit;
  }
}

TEST_F(WsTest, AGivenTimeoutEndsTheCommand) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  Session s = Exec(id, {{"argv", {"sleep", "30"}}, {"timeout_seconds", 0.5}});
  ASSERT_TRUE(s.ws);
  ASSERT_TRUE(s.ReadToClose()) << s.broken;
  ASSERT_TRUE(s.exit.has_value());
  EXPECT_EQ((*s.exit)["timed_out"], true) << *s.exit;
}

TEST_F(WsTest, AClientThatVanishesEndsItsCommand) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  {
    Session s = Exec(id, {{"cmd", "echo up; exec sleep 301"}});
    ASSERT_TRUE(s.ws);
    ASSERT_TRUE(s.ReadUntilOutput("up")) << s.broken;
    ASSERT_EQ(ExecCode(id, "pgrep -f 'sleep [3]01'"), 0) << "positive control: it runs";
    s.ws->Abort();  // no close frame: the TCP connection just ends
  }
  EXPECT_TRUE(WaitFor(id, "! pgrep -f 'sleep [3]01'")) << "the command outlived its client";

  // A client that closes properly ends its command the same way.
  Session s = Exec(id, {{"cmd", "echo up; exec sleep 302"}});
  ASSERT_TRUE(s.ws);
  ASSERT_TRUE(s.ReadUntilOutput("up")) << s.broken;
  ASSERT_EQ(ExecCode(id, "pgrep -f 'sleep [3]02'"), 0);
  EXPECT_TRUE(s.ws->Close().has_value());
  EXPECT_TRUE(WaitFor(id, "! pgrep -f 'sleep [3]02'")) << "the command outlived its client";
}

TEST_F(WsTest, BadMessagesGetAnErrorAndClose1008) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  struct Case {
    std::string name;
    std::vector<std::string> messages;  // after the exec request; "" sends none
    json request;
    std::string expected;  // in the error message
  };
  const json cat = {{"argv", {"cat"}}};
  const std::vector<Case> cases = {
      {"not json", {}, "not json", "not valid JSON"},
      {"stream", {}, {{"cmd", "true"}, {"stream", true}}, "neither stream nor background"},
      {"background", {}, {{"cmd", "true"}, {"background", true}}, "neither stream nor background"},
      {"bad request", {}, {{"cmd", "true"}, {"cpus", 1}}, "unknown field \"cpus\""},
      {"unknown type", {R"({"type": "bogus"})"}, cat, "unknown message type"},
      {"unknown field", {R"({"type": "stdin", "data": "x", "extra": 1})"}, cat, "unknown field"},
      {"bad signal", {R"({"type": "signal", "signal": "NOPE"})"}, cat, "signal must be"},
      {"bad size", {R"({"type": "resize", "cols": 0, "rows": 24})"}, cat, "cols must be"},
      {"resize without a terminal", {R"({"type": "resize", "cols": 80, "rows": 24})"}, cat,
       "has no terminal"},
      {"stdin after close", {R"({"type": "stdin_close"})", R"({"type": "stdin", "data": "x"})"},
       {{"cmd", "cat; sleep 1000"}}, "closed by an earlier stdin_close"},
      {"array", {"[1]"}, cat, "must be a JSON object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Session s = Open("/v1/sandboxes/" + id + "/exec/ws");
    ASSERT_TRUE(s.ws);
    ASSERT_TRUE(s.ws->SendText(c.request.is_string() ? c.request.get<std::string>()
                                                     : c.request.dump())
                    .has_value());
    if (!c.messages.empty()) {
      ASSERT_TRUE(s.ReadUntil([&] { return !s.events.empty(); }));
    }
    for (const auto& m : c.messages) ASSERT_TRUE(s.ws->SendText(m).has_value());
    ASSERT_TRUE(s.ReadToClose()) << s.broken;
    ASSERT_TRUE(s.error.has_value()) << "no error event";
    EXPECT_EQ(s.events.back(), *s.error) << "the error is the last event";
    EXPECT_NE((*s.error)["error"]["message"].get<std::string>().find(c.expected),
              std::string::npos)
        << *s.error;
    EXPECT_EQ(s.close->close_code, 1008) << *s.error;
  }
  // A binary first message is not a request.
  Session binary = Open("/v1/sandboxes/" + id + "/exec/ws");
  ASSERT_TRUE(binary.ws);
  ASSERT_TRUE(binary.ws->SendBinary("{\"cmd\": \"true\"}").has_value());
  ASSERT_TRUE(binary.ReadToClose());
  ASSERT_TRUE(binary.error.has_value());
  EXPECT_EQ(binary.close->close_code, 1008);
  // A message over the cap (1 MiB) is refused by the WebSocket layer itself: 1009.
  Session big = Exec(id, cat);
  ASSERT_TRUE(big.ws);
  ASSERT_TRUE(big.ReadUntil([&] { return !big.events.empty(); }));
  (void)big.ws->SendBinary(std::string((1u << 20) + 1, 'x'));
  ASSERT_TRUE(big.ReadToClose()) << big.broken;
  EXPECT_EQ(big.close->close_code, 1009);
  // The daemon is fine: another session works.
  Session after = Exec(id, {{"cmd", "echo fine"}});
  ASSERT_TRUE(after.ws);
  ASSERT_TRUE(after.ReadToClose());
  EXPECT_EQ(after.out, "fine\n");
}

TEST_F(WsTest, UpgradesAreRefusedBeforeTheyHappen) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  const std::string exec = "/v1/sandboxes/" + id + "/exec/ws";
  const json unauthenticated =
      json::parse(Http(daemon_->port(), http::verb::get, "/v1/sandboxes", "", std::nullopt).body);
  for (const std::string& key : {std::string(), std::string("wrong"), std::string("al_0")}) {
    for (const std::string& target : std::vector<std::string>{
             exec, "/v1/sandboxes/sbx-aaaaaaaaaaaaaaaa/exec/ws",
             "/v1/sandboxes/" + id + "/processes/1/ws", "/v1/sandboxes/bad_id/exec/ws"}) {
      auto [status, body] = Refused(target, key);
      EXPECT_EQ(status, 401) << target << " with key '" << key << "'";
      EXPECT_EQ(body, unauthenticated) << "every 401 is the same";
    }
  }
  const std::string key = daemon_->key();
  struct Case {
    std::string target;
    int status;
    std::string code;
  };
  const std::vector<Case> cases = {
      {"/v1/sandboxes/sbx-aaaaaaaaaaaaaaaa/exec/ws", 404, "not_found"},
      {"/v1/sandboxes/bad_id/exec/ws", 400, "invalid_argument"},
      {exec + "?x=1", 400, "invalid_argument"},
      {"/v1/sandboxes/" + id + "/processes/abc/ws", 400, "invalid_argument"},
      {"/v1/sandboxes/" + id + "/processes/0/ws", 400, "invalid_argument"},
      {"/v1/sandboxes/" + id + "/processes/-1/ws", 400, "invalid_argument"},
      {"/v1/sandboxes/" + id + "/processes/99999999999/ws", 400, "invalid_argument"},
      {"/v1/sandboxes/" + id + "/processes/1/ws?replay=maybe", 400, "invalid_argument"},
      {"/v1/sandboxes/" + id + "/processes/1/ws?follow=true", 400, "invalid_argument"},
      {"/v1/sandboxes/" + id + "/processes/4000000/ws", 404, "not_found"},
      {"/v1/sandboxes/sbx-aaaaaaaaaaaaaaaa/processes/5/ws", 404, "not_found"},
  };
  for (const Case& c : cases) {
    auto [status, body] = Refused(c.target, key);
    EXPECT_EQ(status, c.status) << c.target << " -> " << body;
    EXPECT_EQ(body["error"]["code"], c.code) << c.target << " -> " << body;
  }
  // Without the upgrade, or with another method, these routes are not served.
  Reply plain = daemon_->Call(http::verb::get, exec);
  EXPECT_EQ(plain.status, 400) << plain.body;
  EXPECT_NE(plain.body.find("WebSocket"), std::string::npos) << plain.body;
  Reply post = daemon_->Call(http::verb::post, exec, "{}");
  EXPECT_EQ(post.status, 405) << post.body;
  EXPECT_EQ(post.headers["Allow"], "GET");

  // A paused sandbox takes no new command.
  ASSERT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/pause").status, 200);
  auto [paused, paused_body] = Refused(exec, key);
  EXPECT_EQ(paused, 409) << paused_body;
  ASSERT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/resume").status, 200);
  EXPECT_EQ(Refused(exec, key).first, 0) << "accepted once running again";
}

TEST_F(WsTest, AttachReplaysThenFollowsAndReportsTheExit) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  const int32_t pid = Background(
      id, {{"cmd", "echo before; touch /tmp/ready; while [ ! -e /tmp/go ]; do sleep 0.05; done; "
                   "echo after; exit 7"}});
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(WaitFor(id, "test -e /tmp/ready"));
  const std::string target = "/v1/sandboxes/" + id + "/processes/" + std::to_string(pid) + "/ws";

  // Without replay, what came before the attach is not shown.
  Session live = Open(target + "?replay=false");
  ASSERT_TRUE(live.ws);
  // With it (the default), it is, and then what comes live.
  Session s = Open(target);
  ASSERT_TRUE(s.ws);
  ASSERT_TRUE(s.ReadUntilOutput("before\n")) << s.broken;
  EXPECT_EQ(ExecCode(id, "touch /tmp/go"), 0);
  ASSERT_TRUE(s.ReadToClose()) << s.broken << "\n" << s.out;
  EXPECT_EQ(s.out, "before\nafter\n");
  ASSERT_TRUE(s.exit.has_value());
  EXPECT_EQ((*s.exit)["exit_code"], 7) << *s.exit;
  EXPECT_EQ(s.close->close_code, 1000);

  ASSERT_TRUE(live.ReadToClose()) << live.broken;
  EXPECT_EQ(live.out, "after\n");
  ASSERT_TRUE(live.exit.has_value());
  EXPECT_EQ((*live.exit)["exit_code"], 7);

  // Attaching after the end replays the output and the exit.
  Session late = Open(target);
  ASSERT_TRUE(late.ws);
  ASSERT_TRUE(late.ReadToClose()) << late.broken;
  EXPECT_EQ(late.out, "before\nafter\n");
  ASSERT_TRUE(late.exit.has_value());
  EXPECT_EQ((*late.exit)["exit_code"], 7);
}

TEST_F(WsTest, AttachGivesInputAndLeavingOnlyDetaches) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  const int32_t reader =
      Background(id, {{"cmd", "read line; echo got:$line; exit 5"}, {"stdin_open", true}});
  ASSERT_GT(reader, 0);
  const std::string base = "/v1/sandboxes/" + id + "/processes/";
  Session s = Open(base + std::to_string(reader) + "/ws");
  ASSERT_TRUE(s.ws);
  s.SendStdin("hello\n");
  ASSERT_TRUE(s.ReadToClose()) << s.broken;
  EXPECT_EQ(s.out, "got:hello\n");
  ASSERT_TRUE(s.exit.has_value());
  EXPECT_EQ((*s.exit)["exit_code"], 5);

  // A process whose stdin is not open takes no stdin: the client is told.
  const int32_t sleeper = Background(id, {{"cmd", "echo up; exec sleep 303"}});
  ASSERT_GT(sleeper, 0);
  const std::string target = base + std::to_string(sleeper) + "/ws";
  {
    Session no_stdin = Open(target);
    ASSERT_TRUE(no_stdin.ws);
    ASSERT_TRUE(no_stdin.ReadUntilOutput("up\n"));
    no_stdin.SendStdin("x");
    ASSERT_TRUE(no_stdin.ReadToClose());
    ASSERT_TRUE(no_stdin.error.has_value());
    EXPECT_EQ(no_stdin.close->close_code, 1008);
  }
  // Clients that vanish or close only detach: the process runs on...
  {
    Session gone = Open(target);
    ASSERT_TRUE(gone.ws);
    ASSERT_TRUE(gone.ReadUntilOutput("up\n"));
    gone.ws->Abort();
  }
  {
    Session closed = Open(target);
    ASSERT_TRUE(closed.ws);
    ASSERT_TRUE(closed.ReadUntilOutput("up\n"));
    EXPECT_TRUE(closed.ws->Close().has_value());
  }
  // ... (the daemon notices a vanished client within its one-second poll; give it three)
  std::this_thread::sleep_for(std::chrono::seconds(3));
  EXPECT_EQ(ExecCode(id, "pgrep -f 'sleep [3]03'"), 0) << "a detach killed the process";
  // ... and a later attachment can still signal it.
  Session last = Open(target + "?replay=false");
  ASSERT_TRUE(last.ws);
  last.Send({{"type", "signal"}, {"signal", "TERM"}});
  ASSERT_TRUE(last.ReadToClose()) << last.broken;
  ASSERT_TRUE(last.exit.has_value());
  EXPECT_EQ((*last.exit)["signal"], 15) << *last.exit;
}

TEST_F(WsTest, OpenSessionsAreCapped) {
  // Each client here holds a few descriptors (socket, epoll, eventfd): raise our own limit.
  rlimit files{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  files.rlim_cur = std::max<rlim_t>(files.rlim_cur, std::min<rlim_t>(files.rlim_max, 8192));
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &files), 0);
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  const std::string exec = "/v1/sandboxes/" + id + "/exec/ws";
  std::vector<std::unique_ptr<WsClient>> open;
  for (int i = 0; i < 256; ++i) {  // the daemon's kMaxWebSockets
    auto ws = WsClient::Connect(Url(), daemon_->key(), exec);
    ASSERT_TRUE(ws.has_value()) << i << ": " << ws.error().message();
    open.push_back(std::move(*ws));
  }
  auto [status, body] = Refused(exec, daemon_->key());
  EXPECT_EQ(status, 503) << body;
  EXPECT_EQ(body["error"]["code"], "unavailable") << body;
  // REST is not held up by them.
  EXPECT_EQ(ExecCode(id, "true"), 0);
  // Once one closes, a new one is taken (the daemon counts it closed a moment after).
  ASSERT_TRUE(open.back()->Close().has_value());
  open.pop_back();
  bool accepted = false;
  for (int i = 0; i < 600 && !accepted; ++i) {
    accepted = Refused(exec, daemon_->key()).first == 0;
    if (!accepted) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(accepted);
}

TEST_F(WsTest, ShutdownClosesOpenSessionsWith1001) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  Session s = Exec(id, {{"cmd", "echo up; exec sleep 1000"}});
  ASSERT_TRUE(s.ws);
  ASSERT_TRUE(s.ReadUntilOutput("up"));
  const int status = daemon_->Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  ASSERT_TRUE(s.ReadToClose()) << s.broken;
  EXPECT_EQ(s.close->close_code, 1001);
}

}  // namespace
