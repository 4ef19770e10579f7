// Templates, snapshots and forks end to end (docs/design/templates.md), through a real airlockd
// on the jail engine: builds run their steps in a real build sandbox, sandboxes start from the
// layers, and nothing (sandbox, layer) is left once nothing uses it. Needs root; skips otherwise.

#include <set>

#include "common/elf.h"
#include "support/airlockd.h"
#include "support/host_usr_canaries.h"
#include "support/oci_image.h"

namespace {

using namespace airlock::testing;

class TemplateTest : public DaemonTest {
 protected:
  Reply Build(const json& request) {
    return daemon_->Call(http::verb::post, "/v1/templates", request.dump());
  }

  // stdout of `cmd` in sandbox `id` (with a test failure unless it exits 0).
  std::string Run(const std::string& id, const std::string& cmd) {
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                            json{{"cmd", cmd}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    const json doc = r.Json();
    EXPECT_EQ(doc["exit_code"], 0) << r.body;
    return doc.value("stdout", "");
  }

  void Delete(const std::string& id) {
    Reply r = daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id);
    EXPECT_EQ(r.status, 204) << r.body;
  }

  std::set<std::string> Layers() {
    std::set<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(daemon_->state_dir() + "/layers", ec)) {
      out.insert(e.path().filename().string());
    }
    return out;
  }
};

TEST_F(TemplateTest, BuildRunsItsStepsAndSandboxesStartFromIt) {
  Reply built = Build({{"name", "app"},
                       {"steps",
                        {{{"run", "mkdir -p /opt/app && echo built > /opt/app/state && "
                                  "chmod 777 /opt/app && chmod 666 /opt/app/state"}},
                         {{"copy",
                           {{"path", "/opt/app/main.sh"},
                            {"content", "#!/bin/sh\necho main $GREETING\n"},
                            {"mode", "0755"}}}}}},
                       {"env", {{"GREETING", "hi"}}},
                       {"workdir", "/opt/app"},
                       {"memory_mb", 256}});
  ASSERT_EQ(built.status, 201) << built.body;
  const json t = built.Json();
  EXPECT_EQ(t["state"], "ready");
  EXPECT_EQ(t["layers"].size(), 1u);
  EXPECT_EQ(t["env_keys"], json::array({"GREETING"})) << "env values are never shown";
  EXPECT_EQ(t["steps"].size(), 2u);
  EXPECT_EQ(Layers(), std::set<std::string>{t["layers"][0].get<std::string>()});
  EXPECT_TRUE(Listed().empty()) << "the build sandbox is gone";

  Reply list = daemon_->Call(http::verb::get, "/v1/templates");
  ASSERT_EQ(list.status, 200);
  std::set<std::string> names;
  const json listed = list.Json();  // kept: a range-for over a temporary's member dangles
  for (const json& one : listed["templates"]) names.insert(one["name"].get<std::string>());
  EXPECT_EQ(names, (std::set<std::string>{"app", "base"}));

  const std::string a = CreateSandbox(R"({"template": "app"})");
  ASSERT_FALSE(a.empty());
  Reply got = daemon_->Call(http::verb::get, "/v1/sandboxes/" + a);
  EXPECT_EQ(got.Json()["limits"]["memory_mb"], 256) << got.body;
  EXPECT_EQ(got.Json()["template"], "app");
  EXPECT_EQ(Run(a, "cat state; ./main.sh; pwd; stat -c %a main.sh"),
            "built\nmain hi\n/opt/app\n755\n");
  // A request's env and limits win over the template's.
  const std::string b = CreateSandbox(R"({"template": "app", "env": {"GREETING": "yo"},
                                          "memory_mb": 128})");
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(Run(b, "./main.sh"), "main yo\n");
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/sandboxes/" + b).Json()["limits"]["memory_mb"],
            128);
  // What one sandbox writes stays its own.
  Run(a, "echo changed > state");
  EXPECT_EQ(Run(b, "cat state"), "built\n");

  // The template outlives the daemon.
  daemon_->Stop(SIGTERM);
  ASSERT_TRUE(daemon_->Start());
  const std::string c = CreateSandbox(R"({"template": "app"})");
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(Run(c, "cat state"), "built\n");
}

TEST_F(TemplateTest, AFailedStepFailsTheBuildSaysWhyAndLeavesNothing) {
  Reply built = Build({{"name", "broken"},
                       {"steps", {{{"run", "echo fine"}}, {{"run", "echo oops >&2; exit 3"}}}}});
  EXPECT_EQ(built.status, 409) << built.body;
  const std::string message = built.Json()["error"]["message"];
  EXPECT_NE(message.find("step 2"), std::string::npos) << message;
  EXPECT_NE(message.find("exited 3"), std::string::npos) << message;
  EXPECT_NE(message.find("oops"), std::string::npos) << message;
  Reply got = daemon_->Call(http::verb::get, "/v1/templates/broken");
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["state"], "failed");
  EXPECT_NE(got.Json()["error"].get<std::string>().find("oops"), std::string::npos);
  EXPECT_TRUE(Listed().empty());
  EXPECT_TRUE(Layers().empty());
  // A failed template cannot be used, and its name is free again once it is deleted.
  Reply refused = daemon_->Call(http::verb::post, "/v1/sandboxes", R"({"template": "broken"})");
  EXPECT_EQ(refused.status, 409) << refused.body;
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/templates/broken").status, 204);
  EXPECT_EQ(Build({{"name", "broken"}, {"steps", {{{"run", "true"}}}}}).status, 201);
}

TEST_F(TemplateTest, ATemplateInUseCannotBeDeleted) {
  ASSERT_EQ(Build({{"name", "used"}, {"steps", {{{"run", "echo x > /home/user/x"}, {"user", "user"}}}}}).status, 201);
  const std::string id = CreateSandbox(R"({"template": "used"})");
  ASSERT_FALSE(id.empty());
  Reply busy = daemon_->Call(http::verb::delete_, "/v1/templates/used");
  EXPECT_EQ(busy.status, 409) << busy.body;
  EXPECT_NE(busy.body.find(id), std::string::npos) << busy.body;
  EXPECT_EQ(Layers().size(), 1u);
  Delete(id);
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/templates/used").status, 204);
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/templates/used").status, 404);
  EXPECT_TRUE(Layers().empty()) << "the template's layer went with it";
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/templates/base").status, 409);
}

TEST_F(TemplateTest, BuildLogsStreamAsTheyHappen) {
  RawStream stream(daemon_->port(), daemon_->key(), "/v1/templates",
                   json{{"name", "logged"},
                        {"stream", true},
                        {"steps", {{{"run", "for i in 1 2 3; do echo line $i; done"}},
                                   {{"copy", {{"path", "/home/user/f"}, {"content", "x"}}}}}}}
                       .dump());
  ASSERT_TRUE(stream.ReadUntil("\"type\":\"done\"")) << stream.got();
  std::vector<std::string> types;
  std::string out;
  for (const json& e : stream.Events()) {
    types.push_back(e["type"]);
    if (e["type"] == "stdout") out += e["data"].get<std::string>();
  }
  EXPECT_EQ(out, "line 1\nline 2\nline 3\n");
  ASSERT_GE(types.size(), 5u);
  EXPECT_EQ(types.front(), "step");
  EXPECT_EQ(types.back(), "done");
  EXPECT_EQ(std::count(types.begin(), types.end(), "step"), 2);
  EXPECT_EQ(std::count(types.begin(), types.end(), "snapshot"), 1);
  EXPECT_EQ(daemon_->Call(http::verb::get, "/v1/templates/logged").Json()["state"], "ready");
}

TEST_F(TemplateTest, ABuildCutByACrashFailsAndLeavesNothing) {
  RawStream stream(daemon_->port(), daemon_->key(), "/v1/templates",
                   json{{"name", "cut"},
                        {"stream", true},
                        {"steps", {{{"run", "echo started; sleep 600"}}}}}
                       .dump());
  ASSERT_TRUE(stream.ReadUntil("started")) << stream.got();
  daemon_->Stop(SIGKILL);
  ASSERT_TRUE(daemon_->Start());
  Reply got = daemon_->Call(http::verb::get, "/v1/templates/cut");
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["state"], "failed");
  EXPECT_NE(got.body.find("stopped during the build"), std::string::npos) << got.body;
  EXPECT_TRUE(Listed().empty()) << "the build sandbox was destroyed at the start";
  EXPECT_TRUE(Layers().empty());
}

TEST_F(TemplateTest, StartAndReadyCommandsRunBeforeTheCreateReturns) {
  ASSERT_EQ(Build({{"name", "server"},
                   {"start_cmd", "sleep 0.3; touch /tmp/ready; exec sleep 1000"},
                   {"ready_cmd", "test -f /tmp/ready"}})
                .status,
            201);
  const std::string id = CreateSandbox(R"({"template": "server"})");
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(Run(id, "test -f /tmp/ready && echo yes"), "yes\n");
  Reply ps = daemon_->Call(http::verb::get, "/v1/sandboxes/" + id + "/processes");
  EXPECT_NE(ps.body.find("sleep 1000"), std::string::npos) << ps.body;

  // A ready_cmd that never succeeds fails the create, which leaves nothing.
  ASSERT_EQ(Build({{"name", "never"}, {"ready_cmd", "false"}, {"ready_timeout_seconds", 0.5}})
                .status,
            201);
  Reply refused = daemon_->Call(http::verb::post, "/v1/sandboxes", R"({"template": "never"})");
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_EQ(Listed().size(), 1u);
}

TEST_F(TemplateTest, SnapshotAndForkCarryTheFileSystem) {
  const std::string src = CreateSandbox();
  ASSERT_FALSE(src.empty());
  Run(src, "echo work > /home/user/work.txt && mkdir -p /home/user/proj && echo p > /home/user/proj/a");
  Reply snap = daemon_->Call(http::verb::post, "/v1/sandboxes/" + src + "/snapshot",
                             R"({"name": "snap"})");
  ASSERT_EQ(snap.status, 201) << snap.body;
  EXPECT_EQ(snap.Json()["source"], "snapshot of " + src);
  const std::string from_snap = CreateSandbox(R"({"template": "snap"})");
  ASSERT_FALSE(from_snap.empty());
  EXPECT_EQ(Run(from_snap, "cat /home/user/work.txt /home/user/proj/a"), "work\np\n");

  Run(src, "echo later > /home/user/later.txt");
  Reply fork = daemon_->Call(http::verb::post, "/v1/sandboxes/" + src + "/fork", R"({"count": 3})");
  ASSERT_EQ(fork.status, 201) << fork.body;
  const json forked = fork.Json();
  EXPECT_EQ(forked["memory_carried"], false);
  ASSERT_EQ(forked["sandboxes"].size(), 3u);
  std::vector<std::string> ids;
  for (const json& s : forked["sandboxes"]) {
    ids.push_back(s["id"]);
    EXPECT_EQ(s["metadata"]["airlock.forked_from"], src);
  }
  for (const std::string& id : ids) {
    EXPECT_EQ(Run(id, "cat /home/user/work.txt /home/user/later.txt"), "work\nlater\n");
  }
  // Copy on write: each fork's changes are its own, and the source goes on unchanged.
  Run(ids[0], "echo mine > /home/user/work.txt && rm /home/user/later.txt");
  EXPECT_EQ(Run(ids[1], "cat /home/user/work.txt /home/user/later.txt"), "work\nlater\n");
  EXPECT_EQ(Run(src, "cat /home/user/work.txt"), "work\n");
  EXPECT_EQ(Layers().size(), 2u) << "the snapshot template's layer and the forks' layer";

  // The forks' layer goes with the last fork; the template's stays.
  for (const std::string& id : ids) Delete(id);
  EXPECT_EQ(Layers(), std::set<std::string>{snap.Json()["layers"][0].get<std::string>()});
}

TEST_F(TemplateTest, AnOciImageArchiveIsABaseWithNothingOfTheHost) {
  if (::access("/bin/busybox", X_OK) != 0) GTEST_SKIP() << "/bin/busybox (busybox-static) is absent";
  if (auto dynamic = airlock::ElfNeedsInterpreter(Program(AIRLOCK_AGENT_PATH)); !dynamic || *dynamic) {
    GTEST_SKIP() << "the agent is dynamically linked (a sanitizer build): no rootfs sandbox";
  }
  // Image archives are read from the daemon's image_dir only (<state_dir>/images by default).
  const std::string images = daemon_->state_dir() + "/images";
  fs::create_directories(images);
  fs::create_directories(dir_ + "/work");
  ASSERT_TRUE(WriteBusyboxImage(dir_ + "/work", images + "/busybox.tar"));

  Reply built = Build({{"name", "bb"},
                       {"base", images + "/busybox.tar"},
                       {"steps", {{{"run", "echo built > built.txt"}}}}});
  ASSERT_EQ(built.status, 201) << built.body;
  const json t = built.Json();
  EXPECT_EQ(t["layers"].size(), 2u) << "the step's layer on the image's";
  const std::string a = CreateSandbox(R"({"template": "bb"})");
  ASSERT_FALSE(a.empty());
  // The image's files, env and workdir; its whiteout applied; not the host's /usr; our user.
  EXPECT_EQ(Run(a, "cat /etc/os-release; echo $GREETING; pwd; cat built.txt; "
                   "test -e /bin/vi || echo no-vi; test -e /usr/bin/env || echo no-host-usr; id -u"),
            "ID=airlock-test\nhello\n/srv/app\nbuilt\nno-vi\nno-host-usr\n1000\n");

  // A fork starts on the same root.
  Run(a, "echo mine > /home/user/mine");
  Reply fork = daemon_->Call(http::verb::post, "/v1/sandboxes/" + a + "/fork", "{}");
  ASSERT_EQ(fork.status, 201) << fork.body;
  const std::string f = fork.Json()["sandboxes"][0]["id"];
  EXPECT_EQ(Run(f, "cat /etc/os-release /home/user/mine; test -e /usr/bin/env || echo no-host-usr"),
            "ID=airlock-test\nmine\nno-host-usr\n");

  // Outside image_dir, or not there at all: refused, and no template is left.
  Reply outside = Build({{"name", "x"}, {"base", "/etc/passwd"}});
  EXPECT_EQ(outside.status, 403) << outside.body;
  Reply missing = Build({{"name", "y"}, {"base", images + "/missing.tar"}});
  EXPECT_EQ(missing.status, 404) << missing.body;
  fs::copy_file("/etc/hostname", images + "/not-an-image.tar");
  Reply garbage = Build({{"name", "z"}, {"base", images + "/not-an-image.tar"}});
  EXPECT_EQ(garbage.status, 400) << garbage.body;
  for (const char* name : {"x", "y", "z"}) {
    EXPECT_EQ(daemon_->Call(http::verb::get, std::string("/v1/templates/") + name).status, 404);
  }
  Delete(f);
  Delete(a);
  EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/templates/bb").status, 204);
  EXPECT_TRUE(Layers().empty()) << "the image's layer goes with its last template";
  std::error_code ec;
  EXPECT_TRUE(fs::is_empty(daemon_->state_dir() + "/staging", ec)) << "imports leave nothing";
}

TEST_F(TemplateTest, ADebianSuiteIsMadeOnceAndSharedByItsTemplates) {
  if (auto dynamic = airlock::ElfNeedsInterpreter(Program(AIRLOCK_AGENT_PATH)); !dynamic || *dynamic) {
    GTEST_SKIP() << "the agent is dynamically linked (a sanitizer build): no rootfs sandbox";
  }
  if (RunProcess({"/bin/sh", "-c", "command -v mmdebstrap"}, {}).status != 0) {
    GTEST_SKIP() << "mmdebstrap is not installed (scripts/setup installs it)";
  }
  HostUsrCanaries canaries;  // in the host's /usr: none of them shows in a Debian sandbox
  ASSERT_EQ(canaries.error(), "");
  Reply first = daemon_->Call(http::verb::post, "/v1/templates",
                              json{{"name", "deb-one"},
                                   {"base", "debian:bookworm"},
                                   {"steps", {{{"run", "echo one > /opt/one"}}}},
                                   {"stream", true}}
                                  .dump());
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_NE(first.body.find(R"("type":"base")"), std::string::npos) << "the base is made now";
  EXPECT_NE(first.body.find(R"("type":"done")"), std::string::npos) << first.body.substr(0, 4096);
  Reply debian = daemon_->Call(http::verb::get, "/v1/templates/debian:bookworm");
  ASSERT_EQ(debian.status, 200) << debian.body;
  EXPECT_EQ(debian.Json()["state"], "ready");
  ASSERT_EQ(debian.Json()["layers"].size(), 1u);

  // A second template on it uses the same layer: nothing is made again.
  Reply second = Build({{"name", "deb-two"}, {"base", "debian:bookworm"}});
  ASSERT_EQ(second.status, 201) << second.body;
  EXPECT_EQ(second.Json()["layers"][1], debian.Json()["layers"][0]);

  const std::string a = CreateSandbox(R"({"template": "deb-one"})");
  ASSERT_FALSE(a.empty());
  const std::string seen =
      Run(a, "cut -d. -f1 /etc/debian_version; cat /opt/one; dpkg-query -W -f '${Package}\\n' "
             "apt; id -un; grep -c '^_apt:' /etc/passwd");
  EXPECT_EQ(seen, "12\none\napt\nuser\n1\n");
  // The suite itself is a template sandboxes can start from.
  const std::string b = CreateSandbox(R"({"template": "debian:bookworm"})");
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(Run(b, "cut -d. -f1 /etc/debian_version"), "12\n");
  // Its /usr is Debian's (the positive control: its own /usr/bin and /usr/local are there),
  // nothing of the host's.
  std::string unseen;
  for (const std::string& path : canaries.paths()) unseen += HostUsrCanaries::Unseen(path);
  for (const std::string& id : {a, b}) {
    EXPECT_EQ(Run(id, "test -x /usr/bin/dpkg && test -d /usr/local/bin && echo debian; " +
                          HostUsrCanaries::Probe(canaries.paths())),
              "debian\n" + unseen);
  }
  Reply in_use = daemon_->Call(http::verb::delete_, "/v1/templates/debian:bookworm");
  EXPECT_EQ(in_use.status, 409) << in_use.body;
}

TEST_F(TemplateTest, BadRequestsAreRefusedClearly) {
  struct Case {
    http::verb method;
    std::string target, body;
    unsigned status;
  };
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  const Case cases[] = {
      {http::verb::post, "/v1/templates", R"({"name": "Bad Name"})", 400},
      {http::verb::post, "/v1/templates", R"({"name": "base"})", 400},
      {http::verb::post, "/v1/templates", R"({"steps": []})", 400},
      {http::verb::post, "/v1/templates", R"({"name": "x", "steps": [{"run": "a", "copy": {}}]})",
       400},
      {http::verb::post, "/v1/templates",
       R"({"name": "x", "steps": [{"copy": {"path": "rel", "content": ""}}]})", 400},
      {http::verb::post, "/v1/templates", R"({"name": "x", "base": "nope"})", 404},
      {http::verb::post, "/v1/templates", R"({"name": "x", "base": "debian:"})", 400},
      {http::verb::post, "/v1/templates", R"({"name": "x", "base": "debian:Bad"})", 400},
      {http::verb::post, "/v1/templates", R"({"name": "x", "base": "rel/image.tar"})", 400},
      {http::verb::post, "/v1/templates", R"({"name": "debian:sid"})", 400},
      {http::verb::post, "/v1/templates", R"({"name": "x", "surprise": 1})", 400},
      {http::verb::get, "/v1/templates/nope", "", 404},
      {http::verb::put, "/v1/templates/x", "{}", 405},
      {http::verb::post, "/v1/sandboxes", R"({"template": "nope"})", 404},
      {http::verb::post, "/v1/sandboxes/" + id + "/fork", R"({"count": 0})", 400},
      {http::verb::post, "/v1/sandboxes/" + id + "/fork", R"({"count": 33})", 400},
      {http::verb::post, "/v1/sandboxes/sbx-nothere/fork", "{}", 404},
      {http::verb::post, "/v1/sandboxes/" + id + "/snapshot", "{}", 400},
      {http::verb::get, "/v1/sandboxes/" + id + "/snapshot", "", 405},
  };
  for (const Case& c : cases) {
    Reply r = daemon_->Call(c.method, c.target, c.body);
    EXPECT_EQ(r.status, c.status) << c.target << " " << c.body << " -> " << r.body;
  }
  ASSERT_EQ(daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/snapshot",
                          R"({"name": "taken"})")
                .status,
            201);
  Reply again = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/snapshot",
                              R"({"name": "taken"})");
  EXPECT_EQ(again.status, 409) << again.body;
  EXPECT_EQ(Layers().size(), 1u) << "the refused snapshot kept no layer";
}

}  // namespace
