// airlockd end to end: the real binary on a kernel-chosen port with its own state dir, driven over
// HTTP the way a client would. Needs root (the jail engine); skips with the reason otherwise.

#include "support/airlockd.h"

#include <thread>

#include <sstream>

#include "client/http_client.h"
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

TEST_F(DaemonTest, RestartAfterSigkillAdoptsLiveSandboxes) {
  const std::string a = CreateSandbox(R"({"metadata": {"k": "v"}})");
  const std::string b = CreateSandbox();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  ASSERT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + a + "/exec",
                          R"({"cmd": "echo kept > /tmp/mark"})")
                .status,
            200);
  ASSERT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + b + "/pause").status, 200);
  const int status = daemon_->Stop(SIGKILL);
  ASSERT_TRUE(WIFSIGNALED(status));
  const std::string state_dir = daemon_->state_dir();
  daemon_.reset();
  daemon_.emplace(state_dir);
  ASSERT_TRUE(daemon_->Start());
  // The running one is adopted with its files and metadata; the paused one stays paused.
  Reply got = daemon_->Call(http::verb::get, "/v1/sandboxes/" + a);
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["state"], "running");
  EXPECT_EQ(got.Json()["metadata"]["k"], "v");
  Reply exec = daemon_->Call(http::verb::post, "/v1/sandboxes/" + a + "/exec",
                             R"({"cmd": "cat /tmp/mark"})");
  ASSERT_EQ(exec.status, 200) << exec.body;
  EXPECT_EQ(exec.Json()["stdout"], "kept\n");
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + b).Json()["state"], "paused");
  ASSERT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + b + "/resume").status, 200);
  EXPECT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + b + "/exec", R"({"cmd": "echo b"})")
                .Json()["stdout"],
            "b\n");
  // The admin key of the first run still works, and new sandboxes come up beside the old.
  EXPECT_FALSE(CreateSandbox().empty());
}

TEST_F(DaemonTest, RestartMarksWhatItCannotRecoverAndRemovesOrphans) {
  const std::string dead = CreateSandbox();
  ASSERT_FALSE(dead.empty());
  const int status = daemon_->Stop(SIGKILL);
  ASSERT_TRUE(WIFSIGNALED(status));
  const std::string state_dir = daemon_->state_dir();
  // While the daemon is down, the sandbox's agent dies (everything in its cgroup is killed),
  // and an orphan appears: a jail directory that no record names.
  for (const std::string& dir : CgroupsNamed(dead)) {
    std::ofstream kill(dir + "/cgroup.kill");  // v2
    if (fs::exists(dir + "/cgroup.procs") && !fs::exists(dir + "/cgroup.kill")) {
      std::ifstream procs(dir + "/cgroup.procs");
      for (pid_t pid; procs >> pid;) ::kill(pid, SIGKILL);
    } else {
      kill << "1";
    }
  }
  const std::string orphan = "sbx-orphanorphanorph";
  ASSERT_TRUE(fs::create_directories(state_dir + "/jail/" + orphan + "/disk"));
  daemon_.reset();
  daemon_.emplace(state_dir);
  ASSERT_TRUE(daemon_->Start());
  // The dead one is listed as failed with the reason, and its leftovers are gone.
  Reply got = daemon_->Call(http::verb::get, "/v1/sandboxes/" + dead);
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["state"], "failed") << got.body;
  EXPECT_NE(got.Json().value("error", "").find("is gone"), std::string::npos) << got.body;
  EXPECT_FALSE(fs::exists(state_dir + "/jail/" + dead));
  EXPECT_TRUE(CgroupsNamed(dead).empty());
  EXPECT_FALSE(fs::exists(state_dir + "/jail/" + orphan));
  // A failed sandbox can still be deleted, and then it is gone.
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + dead).status, 204);
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + dead).status, 404);
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

namespace {

std::string AllBytes() {
  std::string data;
  for (int round = 0; round < 300; ++round) {
    for (int b = 0; b < 256; ++b) data += static_cast<char>(b);
  }
  return data;
}


TEST_F(DaemonTest, FilesRoundTripBinarySafe) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  const std::string files = "/v1/sandboxes/" + id + "/files";
  const std::string data = AllBytes();

  Reply put = daemon_->Call(http::verb::put, files + "?path=/home/user/in/data.bin&parents=true&mode=0600",
                            data);
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(put.Json()["name"], "data.bin");
  EXPECT_EQ(put.Json()["type"], "file");
  EXPECT_EQ(put.Json()["mode"], "0600");
  EXPECT_EQ(put.Json()["size"], data.size());

  Reply got = daemon_->Call(http::verb::get, files + "?path=/home/user/in/data.bin");
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.headers["Content-Type"], "application/octet-stream");
  EXPECT_EQ(got.body, data);

  // The command side sees the same bytes; relative paths start at the user's home.
  Reply sum = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                            R"({"cmd": "wc -c < in/data.bin; stat -c %a in/data.bin"})");
  ASSERT_EQ(sum.status, 200) << sum.body;
  EXPECT_EQ(sum.Json()["stdout"], std::to_string(data.size()) + "\n600\n");
  EXPECT_EQ(daemon_->Call(http::verb::get, files + "?path=in/data.bin").body, data);

  Reply made = daemon_->Call(http::verb::post, files + "/mkdir?path=/home/user/a/b&parents=true");
  ASSERT_EQ(made.status, 201) << made.body;
  EXPECT_EQ(made.Json()["type"], "directory");
  Reply list = daemon_->Call(http::verb::get, files + "/list?path=/home/user");
  ASSERT_EQ(list.status, 200) << list.body;
  std::set<std::string> names;
  const json listed = list.Json();
  for (const auto& e : listed["entries"]) names.insert(e["name"].get<std::string>());
  EXPECT_TRUE(names.contains("in") && names.contains("a")) << list.body;

  // Errors: a missing file, a directory read as a file, a non-empty directory without
  // recursive, and a file read after its delete.
  EXPECT_EQ(daemon_->Call(http::verb::get, files + "?path=/nope").status, 404);
  EXPECT_EQ(daemon_->Call(http::verb::get, files + "?path=/home/user/a").status, 400);
  EXPECT_EQ(daemon_->Call(http::verb::delete_, files + "?path=/home/user/a").status, 409);
  EXPECT_EQ(daemon_->Call(http::verb::delete_, files + "?path=/home/user/a&recursive=true").status,
            204);
  EXPECT_EQ(daemon_->Call(http::verb::delete_, files + "?path=/home/user/in/data.bin").status, 204);
  EXPECT_EQ(daemon_->Call(http::verb::get, files + "?path=/home/user/in/data.bin").status, 404);

  // Paused: files are refused like commands, with the state in the message.
  ASSERT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/pause").status, 200);
  Reply refused = daemon_->Call(http::verb::get, files + "/list?path=/");
  EXPECT_EQ(refused.status, 409) << refused.body;
  EXPECT_NE(refused.body.find("paused"), std::string::npos) << refused.body;
}

TEST_F(DaemonTest, TarDownloadAndUploadCopyATree) {
  const std::string a = CreateSandbox();
  const std::string b = CreateSandbox();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  const std::string data = AllBytes();
  ASSERT_EQ(daemon_->Call(http::verb::put,
                          "/v1/sandboxes/" + a + "/files?path=/home/user/proj/src/blob&parents=true",
                          data)
                .status,
            200);
  ASSERT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + a + "/exec",
                          R"({"cmd": "cd proj && echo hi > 'a file' && ln -s src/blob link"})")
                .status,
            200);
  Reply tar = daemon_->Call(http::verb::get, "/v1/sandboxes/" + a + "/files/tar?path=/home/user/proj");
  ASSERT_EQ(tar.status, 200) << tar.body.substr(0, 300);
  EXPECT_EQ(tar.headers["Content-Type"], "application/x-tar");
  ASSERT_GT(tar.body.size(), data.size());

  Reply put = daemon_->Call(http::verb::put, "/v1/sandboxes/" + b + "/files/tar?path=copy", tar.body);
  ASSERT_EQ(put.status, 204) << put.body;
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + b + "/files?path=copy/src/blob").body,
            data);
  Reply check = daemon_->Call(http::verb::post, "/v1/sandboxes/" + b + "/exec",
                              R"({"cmd": "cd copy && cat 'a file' && readlink link && stat -c %U src/blob"})");
  ASSERT_EQ(check.status, 200) << check.body;
  EXPECT_EQ(check.Json()["stdout"], "hi\nsrc/blob\nuser\n") << check.body;

  // Not a directory, not there, not a tar: clear 4xx answers.
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + a + "/files/tar?path=/home/user/proj/a%20file")
                .status,
            400);
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + a + "/files/tar?path=/nope").status, 404);
  Reply junk = daemon_->Call(http::verb::put, "/v1/sandboxes/" + b + "/files/tar?path=junk",
                             "this is not a tar archive");
  EXPECT_EQ(junk.status, 400) << junk.body;
}

TEST_F(DaemonTest, TarWithEscapingNamesStaysInside) {
  const std::string a = CreateSandbox();
  ASSERT_FALSE(a.empty());
  const std::string exec = "/v1/sandboxes/" + a + "/exec";
  // Build a hostile archive inside the sandbox itself: a member named with "..", and one with
  // an absolute name; then unpack it through the API into a fresh directory.
  Reply made = daemon_->Call(
      http::verb::post, exec,
      R"({"cmd": "mkdir -p /tmp/h/d && echo evil > /tmp/h/evil && cd /tmp/h/d && tar -cf /tmp/evil.tar -P ../evil /tmp/h/evil"})");
  ASSERT_EQ(made.status, 200) << made.body;
  ASSERT_EQ(made.Json()["exit_code"], 0) << made.body;
  Reply tar = daemon_->Call(http::verb::get, "/v1/sandboxes/" + a + "/files?path=/tmp/evil.tar");
  ASSERT_EQ(tar.status, 200);
  ASSERT_EQ(daemon_->Call(http::verb::post, exec, R"({"cmd": "rm -rf /tmp/h"})").status, 200);
  Reply put = daemon_->Call(http::verb::put, "/v1/sandboxes/" + a + "/files/tar?path=/home/user/x",
                            tar.body);
  EXPECT_EQ(put.status, 400) << put.body;  // tar refuses the ".." member
  Reply where = daemon_->Call(http::verb::post, exec,
                              R"({"cmd": "ls /home/user/evil /tmp/h/evil 2>&1; find /home/user/x"})");
  ASSERT_EQ(where.status, 200);
  const std::string out = where.Json()["stdout"];
  EXPECT_NE(out.find("cannot access '/home/user/evil'"), std::string::npos) << out;
  EXPECT_NE(out.find("cannot access '/tmp/h/evil'"), std::string::npos) << out;
}

// Reads one sample from Prometheus text: the value of the line starting with `series`.
double Sample(const std::string& text, const std::string& series) {
  size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::atof(text.c_str() + at + series.size() + 2);
}

TEST_F(DaemonTest, MetricsCountSandboxesOperationsAndErrors) {
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec", R"({"cmd": "true"})")
                .status,
            200);
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/sbx-aaaaaaaaaaaaaaaa").status, 404);
  EXPECT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes", "{bad").status, 400);

  EXPECT_EQ(Http(daemon_->port(), http::verb::get, "/metrics", "", std::nullopt).status, 401);
  Reply m = daemon_->Call(http::verb::get, "/metrics");
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_TRUE(m.headers["Content-Type"].starts_with("text/plain; version=0.0.4")) << m.headers["Content-Type"];
  const std::string& t = m.body;
  EXPECT_EQ(Sample(t, R"(airlock_sandboxes{state="running"})"), 1) << t;
  EXPECT_EQ(Sample(t, R"(airlock_operations_total{op="create",result="ok"})"), 1) << t;
  EXPECT_EQ(Sample(t, R"(airlock_operations_total{op="exec",result="ok"})"), 1) << t;
  EXPECT_EQ(Sample(t, R"(airlock_operation_seconds_count{op="create",result="ok"})"), 1) << t;
  EXPECT_EQ(Sample(t, R"(airlock_operation_seconds_bucket{op="exec",result="ok",le="+Inf"})"), 1)
      << t;
  EXPECT_GE(Sample(t, R"(airlock_api_errors_total{code="not_found"})"), 1) << t;
  EXPECT_GE(Sample(t, R"(airlock_api_errors_total{code="invalid_argument"})"), 1) << t;
  EXPECT_GE(Sample(t, R"(airlock_api_errors_total{code="unauthenticated"})"), 1) << t;
  // Every line is a comment or "name{labels} value".
  std::istringstream lines(t);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("#")) continue;
    EXPECT_NE(line.rfind(' '), std::string::npos) << line;
    EXPECT_TRUE(line.starts_with("airlock_")) << line;
  }
}

// Waits up to `timeout` for GET of `id` to answer `status`.
bool WaitForStatus(Daemon& d, const std::string& id, int status, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (d.Call(http::verb::get, "/v1/sandboxes/" + id).status == status) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST_F(DaemonTest, TtlExpiryDestroysTheSandbox) {
  const std::string short_lived = CreateSandbox(R"({"ttl_seconds": 1})");
  const std::string long_lived = CreateSandbox(R"({"ttl_seconds": 600})");
  ASSERT_FALSE(short_lived.empty());
  ASSERT_FALSE(long_lived.empty());
  EXPECT_TRUE(WaitForStatus(*daemon_, short_lived, 404, std::chrono::seconds(15)));
  EXPECT_FALSE(fs::exists(daemon_->state_dir() + "/jail/" + short_lived));
  EXPECT_TRUE(CgroupsNamed(short_lived).empty());
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + long_lived).Json()["state"],
            "running");
  EXPECT_EQ(Sample(daemon_->Call(http::verb::get, "/metrics").body, "airlock_ttl_expired_total"), 1);
  // PATCH restarts the clock: a sandbox given more time outlives its first deadline.
  const std::string extended = CreateSandbox(R"({"ttl_seconds": 1})");
  ASSERT_FALSE(extended.empty());
  ASSERT_EQ(daemon_->Call(http::verb::patch, "/v1/sandboxes/" + extended, R"({"ttl_seconds": 600})")
                .status,
            200);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + extended).status, 200);
}

TEST_F(DaemonTest, TtlDeadlinePassedWhileDownIsHonouredAtStart) {
  const std::string id = CreateSandbox(R"({"ttl_seconds": 2})");
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WIFSIGNALED(daemon_->Stop(SIGKILL)));
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const std::string state_dir = daemon_->state_dir();
  daemon_.reset();
  daemon_.emplace(state_dir);
  ASSERT_TRUE(daemon_->Start());
  EXPECT_TRUE(WaitForStatus(*daemon_, id, 404, std::chrono::seconds(10)));
  EXPECT_FALSE(fs::exists(state_dir + "/jail/" + id));
  EXPECT_TRUE(CgroupsNamed(id).empty());
}

TEST_F(DaemonTest, ConfigFileAppliesAndFlagsOverrideIt) {
  const std::string config = dir_ + "/airlockd.toml";
  {
    std::ofstream out(config);
    out << "# test config\nno_auth = true\non-shutdown = \"keep\"   # flags win\nworkers = 8\n";
  }
  const std::string state_dir = daemon_->state_dir();
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  daemon_.reset();
  // The fixture's flags include --on-shutdown destroy, which overrides the file's keep.
  daemon_.emplace(state_dir, std::vector<std::string>{"--config", config});
  ASSERT_TRUE(daemon_->Start());
  EXPECT_EQ(Http(daemon_->port(), http::verb::get, "/v1/sandboxes", "", std::nullopt).status, 200)
      << "no_auth from the file did not apply";
  const std::string gone = CreateSandbox();
  ASSERT_FALSE(gone.empty());
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  EXPECT_FALSE(fs::exists(state_dir + "/jail/" + gone));

  // on_shutdown keep: SIGTERM leaves the sandbox running for the next start to adopt.
  daemon_.reset();
  daemon_.emplace(state_dir, std::vector<std::string>{"--on-shutdown", "keep"});
  ASSERT_TRUE(daemon_->Start());
  const std::string kept = CreateSandbox();
  ASSERT_FALSE(kept.empty());
  ASSERT_EQ(daemon_->Stop(SIGTERM), 0);
  EXPECT_TRUE(fs::exists(state_dir + "/jail/" + kept));
  daemon_.reset();
  daemon_.emplace(state_dir);
  ASSERT_TRUE(daemon_->Start());
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + kept).Json()["state"], "running");

  // A bad file stops the start, naming the line.
  {
    std::ofstream out(config);
    out << "listen = \"127.0.0.1:0\"\nbogus = 1\n";
  }
  Daemon bad(dir_ + "/state2", {"--config", config});
  EXPECT_FALSE(bad.Start());
  const std::string log = bad.Log();
  EXPECT_NE(log.find("line 2: unknown setting 'bogus'"), std::string::npos) << log;
}

}  // namespace
