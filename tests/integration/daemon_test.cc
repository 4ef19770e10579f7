// airlockd end to end: the real binary on a kernel-chosen port with its own state dir, driven over
// HTTP the way a client would. Needs root (the jail engine); skips with the reason otherwise.

#include "support/airlockd.h"

#include <thread>

#include "daemon/store/store.h"

namespace {

using namespace airlock::testing;

TEST_F(DaemonTest, HealthzNeedsNoKey) {
  Reply r = Http(daemon_->port(), http::verb::get, "/healthz", "", std::nullopt);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.Json(), json({{"status", "ok"}}));
  EXPECT_EQ(Http(daemon_->port(), http::verb::post, "/healthz", "", std::nullopt).status, 405);
}

TEST_F(DaemonTest, EveryAuthFailureIsTheSame401) {
  const uint16_t port = daemon_->port();
  std::set<std::string> bodies;
  const std::vector<std::optional<std::string>> credentials = {
      std::nullopt,
      "Bearer al_0000000000000000000000000000000000000000000000000000000000000000",
      "Bearer ",
      "Bearer wrong",
      "Basic YWRtaW46YWRtaW4=",
      "bearer " + std::string(64, 'a'),
  };
  for (const auto& credential : credentials) {
    for (const char* target : {"/v1/sandboxes", "/v1/sandboxes/sbx-aaaaaaaaaaaaaaaa", "/v1/nope"}) {
      Reply r = Http(port, http::verb::get, target, "", credential);
      EXPECT_EQ(r.status, 401) << target << " with " << credential.value_or("(none)");
      bodies.insert(r.body);
    }
  }
  EXPECT_EQ(bodies.size(), 1u) << "the 401 body differs with the reason";
  EXPECT_EQ(json::parse(*bodies.begin())["error"]["code"], "unauthenticated");
  // Nothing was created by the refused calls.
  EXPECT_TRUE(Listed().empty());
}

TEST_F(DaemonTest, SandboxLifecycle) {
  const std::string id = CreateSandbox(R"({"metadata": {"team": "ml"}})");
  ASSERT_FALSE(id.empty());
  const std::string path = "/v1/sandboxes/" + id;

  Reply got = daemon_->Call(http::verb::get, path);
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["state"], "running");
  EXPECT_EQ(got.Json()["engine"], "jail");
  EXPECT_EQ(got.Json()["metadata"]["team"], "ml");

  Reply exec = daemon_->Call(http::verb::post, path + "/exec", R"({"cmd": "echo hi"})");
  ASSERT_EQ(exec.status, 200) << exec.body;
  EXPECT_EQ(exec.Json()["stdout"], "hi\n");
  EXPECT_EQ(exec.Json()["exit_code"], 0);
  EXPECT_TRUE(exec.Json()["signal"].is_null());

  Reply argv = daemon_->Call(http::verb::post, path + "/exec",
                             R"({"argv": ["sh", "-c", "echo err >&2; exit 3"]})");
  ASSERT_EQ(argv.status, 200) << argv.body;
  EXPECT_EQ(argv.Json()["stderr"], "err\n");
  EXPECT_EQ(argv.Json()["exit_code"], 3);

  // Filters.
  EXPECT_EQ(Listed().count(id), 1u);
  Reply by_meta = daemon_->Call(http::verb::get, "/v1/sandboxes?metadata.team=ml&state=running");
  ASSERT_EQ(by_meta.status, 200) << by_meta.body;
  EXPECT_EQ(by_meta.Json()["sandboxes"].size(), 1u);
  Reply other = daemon_->Call(http::verb::get, "/v1/sandboxes?metadata.team=web");
  ASSERT_EQ(other.status, 200) << other.body;
  EXPECT_TRUE(other.Json()["sandboxes"].empty());

  Reply paused = daemon_->Call(http::verb::post, path + "/pause");
  ASSERT_EQ(paused.status, 200) << paused.body;
  EXPECT_EQ(paused.Json()["state"], "paused");
  Reply refused = daemon_->Call(http::verb::post, path + "/exec", R"({"cmd": "echo hi"})");
  EXPECT_EQ(refused.status, 409) << refused.body;
  EXPECT_NE(refused.Json()["error"]["message"].get<std::string>().find("paused"), std::string::npos)
      << refused.body;
  EXPECT_EQ(daemon_->Call(http::verb::post, path + "/pause").status, 409);

  Reply resumed = daemon_->Call(http::verb::post, path + "/resume");
  ASSERT_EQ(resumed.status, 200) << resumed.body;
  EXPECT_EQ(resumed.Json()["state"], "running");
  EXPECT_EQ(daemon_->Call(http::verb::post, path + "/resume").status, 409);
  Reply again = daemon_->Call(http::verb::post, path + "/exec", R"({"cmd": "echo again"})");
  EXPECT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.Json()["stdout"], "again\n");

  Reply deleted = daemon_->Call(http::verb::delete_, path);
  EXPECT_EQ(deleted.status, 204) << deleted.body;
  EXPECT_EQ(daemon_->Call(http::verb::get, path).status, 404);
  EXPECT_EQ(daemon_->Call(http::verb::delete_, path).status, 404);
  EXPECT_EQ(daemon_->Call(http::verb::post, path + "/exec", R"({"cmd": "true"})").status, 404);
  EXPECT_EQ(Listed().count(id), 0u);
  EXPECT_FALSE(fs::exists(daemon_->state_dir() + "/jail/" + id));
  EXPECT_TRUE(CgroupsNamed(id).empty());
}

TEST_F(DaemonTest, MalformedRequestsAreRefusedAndChangeNothing) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  const std::string path = "/v1/sandboxes/" + id;
  const auto before = Listed();

  struct Case {
    http::verb method;
    std::string target;
    std::string body;
    int status;
  };
  const std::vector<Case> cases = {
      {http::verb::post, "/v1/sandboxes", R"({"cpu": 1})", 400},
      {http::verb::post, "/v1/sandboxes", "not json", 400},
      {http::verb::post, "/v1/sandboxes", "[]", 400},
      {http::verb::post, "/v1/sandboxes", R"({"cpus": -1})", 400},
      {http::verb::post, "/v1/sandboxes", R"({"memory_mb": "lots"})", 400},
      {http::verb::post, "/v1/sandboxes", R"({"ttl_seconds": 1.5})", 400},
      {http::verb::post, "/v1/sandboxes", R"({"env": {"1X": "y"}})", 400},
      {http::verb::post, "/v1/sandboxes", R"({"cpus": 1, "cpus": 2})", 400},
      {http::verb::post, "/v1/sandboxes?x=1", "{}", 400},
      {http::verb::post, path + "/exec", "{}", 400},
      {http::verb::post, path + "/exec", R"({"cmd": "x", "argv": ["y"]})", 400},
      {http::verb::post, path + "/exec", R"({"argv": []})", 400},
      {http::verb::post, path + "/exec", R"({"cmd": "true", "timeout_seconds": 0})", 400},
      {http::verb::post, path + "/exec", R"({"cmd": "true", "bogus": 1})", 400},
      {http::verb::get, "/v1/sandboxes/bad_id", "", 400},
      {http::verb::delete_, "/v1/sandboxes/" + std::string(65, 'a'), "", 400},
      {http::verb::get, "/v1/sandboxes?state=bogus", "", 400},
      {http::verb::get, "/v1/sandboxes?metadata.=x", "", 400},
      {http::verb::get, "/v1/sandboxes?state=%zz", "", 400},
      {http::verb::get, path + "?verbose=1", "", 400},
      {http::verb::get, "/v1/sandboxes/sbx-aaaaaaaaaaaaaaaa", "", 404},
      {http::verb::get, "/v1/nope", "", 404},
      {http::verb::get, path + "/nope", "", 404},
      {http::verb::put, "/v1/sandboxes", "", 405},
      {http::verb::get, path + "/exec", "", 405},
      {http::verb::post, "/v1/sandboxes", std::string(9u << 20, ' '), 413},
  };
  for (const Case& c : cases) {
    Reply r = daemon_->Call(c.method, c.target, c.body);
    EXPECT_EQ(r.status, c.status) << http::to_string(c.method) << " " << c.target.substr(0, 80)
                                  << " " << c.body.substr(0, 80) << " -> " << r.body;
    if (r.status >= 400) {
      json err = r.Json();
      EXPECT_TRUE(err.is_object() && err.contains("error") && err["error"].contains("code") &&
                  err["error"].contains("message"))
          << r.body;
    }
  }
  // Bytes that are not HTTP at all.
  EXPECT_EQ(RawStatus(daemon_->port(), "GARBAGE\r\n\r\n"), 400);
  EXPECT_EQ(RawStatus(daemon_->port(), "GET /healthz HTTP/1.1\r\nContent-Length: x\r\n\r\n"), 400);

  EXPECT_EQ(Listed(), before);
  Reply exec = daemon_->Call(http::verb::post, path + "/exec", R"({"cmd": "echo still"})");
  EXPECT_EQ(exec.status, 200) << exec.body;
  EXPECT_EQ(exec.Json()["stdout"], "still\n");
}

TEST_F(DaemonTest, KeepAliveServesManyRequestsOnOneConnection) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  stream.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), daemon_->port()));
  beast::flat_buffer buffer;
  for (int i = 0; i < 5; ++i) {
    http::request<http::string_body> req{http::verb::get, "/healthz", 11};
    req.set(http::field::host, "127.0.0.1");
    http::write(stream, req);
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    EXPECT_EQ(res.result_int(), 200u);
    EXPECT_TRUE(res.keep_alive());
  }
}

TEST_F(DaemonTest, ExecResultsAndCommandErrors) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  const std::string exec = "/v1/sandboxes/" + id + "/exec";
  Reply in = daemon_->Call(http::verb::post, exec, R"({"cmd": "cat", "stdin": "abc"})");
  ASSERT_EQ(in.status, 200) << in.body;
  EXPECT_EQ(in.Json()["stdout"], "abc");
  Reply timed =
      daemon_->Call(http::verb::post, exec, R"({"cmd": "sleep 30", "timeout_seconds": 0.5})");
  ASSERT_EQ(timed.status, 200) << timed.body;
  EXPECT_EQ(timed.Json()["timed_out"], true);
  EXPECT_TRUE(timed.Json()["exit_code"].is_null());
  EXPECT_FALSE(timed.Json()["signal"].is_null());
  Reply binary = daemon_->Call(http::verb::post, exec, R"({"cmd": "printf '\\377'"})");
  ASSERT_EQ(binary.status, 200) << binary.body;
  EXPECT_EQ(binary.Json()["stdout_encoding"], "base64");
  // A command that cannot start is the request's fault (400), not an unknown sandbox (404).
  EXPECT_EQ(daemon_->Call(http::verb::post, exec, R"({"argv": ["/nonexistent"]})").status, 400);
  EXPECT_EQ(
      daemon_->Call(http::verb::post, exec, R"({"cmd": "true", "cwd": "/nonexistent"})").status,
      400);
  EXPECT_EQ(daemon_->Call(http::verb::post, exec, R"({"cmd": "true", "user": "nobodyx"})").status,
            400);
  // The channel still works after the errors.
  EXPECT_EQ(daemon_->Call(http::verb::post, exec, R"({"cmd": "echo ok"})").Json()["stdout"],
            "ok\n");
}

TEST_F(DaemonTest, ASlowExecBlocksNobodyElse) {
  const std::string a = CreateSandbox();
  const std::string b = CreateSandbox();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  const uint16_t port = daemon_->port();
  Reply slow;
  std::thread t([&] {
    slow = daemon_->Call(http::verb::post, "/v1/sandboxes/" + a + "/exec",
                         R"({"cmd": "sleep 3; echo done"})");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Http(port, http::verb::get, "/healthz", "", std::nullopt).status, 200);
  Reply other =
      daemon_->Call(http::verb::post, "/v1/sandboxes/" + b + "/exec", R"({"cmd": "echo b"})");
  EXPECT_EQ(other.status, 200) << other.body;
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + a).Json()["state"], "running");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  t.join();
  EXPECT_EQ(slow.status, 200) << slow.body;
  EXPECT_EQ(slow.Json()["stdout"], "done\n");
}

TEST_F(DaemonTest, SigtermAnswersTheRequestInFlightFirst) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  // An idle keep-alive connection must not hold the shutdown up.
  asio::io_context io;
  beast::tcp_stream idle(io);
  idle.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), daemon_->port()));
  Reply slow;
  std::thread t([&] {
    slow = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                         R"({"cmd": "sleep 2; echo finished"})");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int status = daemon_->Stop(SIGTERM);
  t.join();
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(slow.status, 200) << slow.body;
  EXPECT_EQ(slow.Json()["stdout"], "finished\n");
  EXPECT_FALSE(fs::exists(daemon_->state_dir() + "/jail/" + id));
  EXPECT_TRUE(CgroupsNamed(id).empty());
}

TEST_F(DaemonTest, PatchChangesTtlAndMergesMetadata) {
  const std::string id = CreateSandbox(R"({"metadata": {"a": "1", "b": "2"}, "ttl_seconds": 60})");
  ASSERT_FALSE(id.empty());
  const std::string path = "/v1/sandboxes/" + id;
  const json before = daemon_->Call(http::verb::get, path).Json();
  Reply patched = daemon_->Call(http::verb::patch, path,
                                R"({"ttl_seconds": 7200, "metadata": {"a": null, "c": "3"}})");
  ASSERT_EQ(patched.status, 200) << patched.body;
  EXPECT_EQ(patched.Json()["metadata"], json({{"b", "2"}, {"c", "3"}}));
  EXPECT_GT(patched.Json()["expires_at"].get<std::string>(),
            before["expires_at"].get<std::string>());
  // Refused patches change nothing.
  EXPECT_EQ(daemon_->Call(http::verb::patch, path, "{}").status, 400);
  EXPECT_EQ(daemon_->Call(http::verb::patch, path, R"({"metadata": {"x": 1}})").status, 400);
  EXPECT_EQ(daemon_->Call(http::verb::patch, path, R"({"ttl_seconds": -5})").status, 400);
  EXPECT_EQ(daemon_->Call(http::verb::get, path).Json(), patched.Json());
  EXPECT_EQ(daemon_->Call(http::verb::delete_, path).status, 204);
  EXPECT_EQ(daemon_->Call(http::verb::patch, path, R"({"ttl_seconds": 60})").status, 404);
}

TEST_F(DaemonTest, RestartAfterSigkillRemovesWhatThePreviousRunLeft) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  const int status = daemon_->Stop(SIGKILL);
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_TRUE(fs::exists(daemon_->state_dir() + "/jail/" + id)) << "nothing left to clean up";
  const std::string state_dir = daemon_->state_dir();
  daemon_.reset();
  daemon_.emplace(state_dir);
  ASSERT_TRUE(daemon_->Start());
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + id).status, 404);
  EXPECT_FALSE(fs::exists(state_dir + "/jail/" + id));
  EXPECT_TRUE(CgroupsNamed(id).empty());
  // The admin key of the first run still works, and the daemon serves as before.
  EXPECT_FALSE(CreateSandbox().empty());
}

TEST_F(DaemonTest, SigtermDestroysSandboxesAndExitsZero) {
  const std::string a = CreateSandbox();
  const std::string b = CreateSandbox();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  ASSERT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + b + "/pause").status, 200);

  const int status = daemon_->Stop(SIGTERM);
  ASSERT_TRUE(WIFEXITED(status)) << "airlockd did not exit by itself; status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);

  for (const std::string& id : {a, b}) {
    EXPECT_FALSE(fs::exists(daemon_->state_dir() + "/jail/" + id)) << id;
    EXPECT_EQ(CgroupsNamed(id), std::vector<std::string>{}) << id;
  }
  auto store = airlock::store::Store::Open(daemon_->state_dir() + "/airlock.db");
  ASSERT_TRUE(store) << store.error().message();
  for (const std::string& id : {a, b}) {
    auto record = (*store)->Get(id);
    ASSERT_TRUE(record) << record.error().message();
    EXPECT_EQ(record->state, airlock::store::SandboxState::kDestroyed) << id;
  }
}

}  // namespace
