// What a sandbox sees of the host's /usr, through a real airlockd (docs/design/jail.md, "What a
// sandbox sees of the host"): on `base`, the listed directories only and a /usr/local of its
// own, unless the daemon is told to show the host's (base_usr_local); on an image's root,
// nothing of the host. Canary files in the host's /usr (support/host_usr_canaries.h) are
// removed whatever the outcome. Needs root; skips otherwise.

#include "common/elf.h"
#include "support/airlockd.h"
#include "support/host_usr_canaries.h"
#include "support/oci_image.h"

namespace {

using namespace airlock::testing;

class HostUsrTest : public DaemonTest {
 protected:
  // stdout of `cmd` in sandbox `id` as `user`, with a test failure unless it exits 0.
  std::string RunAs(const std::string& id, const std::string& cmd, const std::string& user) {
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                            json{{"cmd", cmd}, {"user", user}, {"timeout_seconds", 30}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    const json doc = r.Json();
    EXPECT_EQ(doc["exit_code"], 0) << r.body;
    return doc.value("stdout", "");
  }

  // Probe's lines for the canaries in a base sandbox: the host's /usr/bin seen; /usr/local
  // seen only if `local_seen`; /usr/src never.
  static std::string OnBase(const HostUsrCanaries& c, bool local_seen) {
    std::string lines = (local_seen ? c.Seen(c.local()) : c.Unseen(c.local())) + c.Seen(c.bin());
    if (!c.src().empty()) lines += c.Unseen(c.src());
    return lines;
  }

  // The files API's answer for `path` in sandbox `id`: its status and body.
  Reply ReadFile(const std::string& id, const std::string& path) {
    return daemon_->Call(http::verb::get, "/v1/sandboxes/" + id + "/files?path=" + path);
  }
};

TEST_F(HostUsrTest, ABaseSandboxSeesOnlyTheListedDirectoriesOfTheHostsUsr) {
  HostUsrCanaries canaries;
  ASSERT_EQ(canaries.error(), "");
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  for (const char* user : {"user", "root"}) {
    EXPECT_EQ(RunAs(id, HostUsrCanaries::Probe(canaries.paths()), user), OnBase(canaries, false))
        << "as " << user;
  }
  // The files API (the agent, with its capabilities) finds no more: the host's /usr/local and
  // /usr/src are not in the sandbox at all; a canary in /usr/bin reads whole.
  for (const std::string& hidden : {canaries.local(), canaries.src()}) {
    if (hidden.empty()) continue;
    Reply r = ReadFile(id, hidden);
    EXPECT_EQ(r.status, 404) << hidden << ": " << r.body;
  }
  Reply seen = ReadFile(id, canaries.bin());
  EXPECT_EQ(seen.status, 200) << seen.body;
  EXPECT_EQ(seen.body, canaries.content());
  // What agents run is there: python3 from the host's /usr, and a writable /usr/local.
  EXPECT_EQ(RunAs(id,
                  "python3 -c 'print(6 * 7)' && touch /usr/local/bin/mine && ls /usr/local/bin && "
                  "(touch /usr/bin/mine 2>&1 | grep -c 'Read-only')",
                  "root"),
            "42\nmine\n1\n");
}

TEST_F(HostUsrTest, WhatATemplateInstallsInUsrLocalStacksOnTheBaseRoot) {
  HostUsrCanaries canaries;
  ASSERT_EQ(canaries.error(), "");
  const std::string tool = canaries.name() + "-tool";
  Reply built =
      daemon_->Call(http::verb::post, "/v1/templates",
                    json{{"name", "tools"},
                         {"steps",
                          {{{"run", "printf '#!/bin/sh\\necho tool\\n' > /usr/local/bin/" + tool +
                                        " && chmod 755 /usr/local/bin/" + tool}}}}}
                        .dump());
  ASSERT_EQ(built.status, 201) << built.body;
  EXPECT_FALSE(fs::exists("/usr/local/bin/" + tool)) << "the build wrote the host's /usr/local";
  const std::string id = CreateSandbox(R"({"template": "tools"})");
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(RunAs(id, tool + " && python3 -c 'print(1)'", "user"), "tool\n1\n");
  EXPECT_EQ(RunAs(id, HostUsrCanaries::Probe(canaries.paths()), "user"), OnBase(canaries, false));
  // A fork stacks one more layer, on the same root.
  Reply fork = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/fork", "{}");
  ASSERT_EQ(fork.status, 201) << fork.body;
  const std::string forked = fork.Json()["sandboxes"][0]["id"];
  EXPECT_EQ(RunAs(forked, tool + " && " + HostUsrCanaries::Probe(canaries.paths()), "user"),
            "tool\n" + OnBase(canaries, false));
}

// A daemon told by its config file to show the host's /usr/local to base sandboxes.
class HostUsrLocalTest : public HostUsrTest {
 protected:
  std::vector<std::string> DaemonArgs() const override {
    const std::string config = dir_ + "/airlockd.toml";
    std::ofstream(config) << "base_usr_local = true\n";
    return {"--config", config};
  }
};

TEST_F(HostUsrLocalTest, TheHostsUsrLocalIsShownReadOnlyWhenAskedFor) {
  HostUsrCanaries canaries;
  ASSERT_EQ(canaries.error(), "");
  const std::string id = CreateSandbox();
  ASSERT_FALSE(id.empty());
  for (const char* user : {"user", "root"}) {
    EXPECT_EQ(RunAs(id, HostUsrCanaries::Probe(canaries.paths()), user), OnBase(canaries, true))
        << "as " << user;
  }
  EXPECT_EQ(RunAs(id, "touch /usr/local/mine 2>&1 | grep -c 'Read-only'", "root"), "1\n");
  EXPECT_FALSE(fs::exists("/usr/local/mine"));

  // The flag does the same; without either, the host's /usr/local is hidden again.
  for (const bool flag : {true, false}) {
    daemon_->Stop(SIGTERM);
    std::vector<std::string> args;
    if (flag) args.push_back("--base-usr-local");
    daemon_.emplace(dir_ + "/state", args);
    ASSERT_TRUE(daemon_->Start());
    const std::string again = CreateSandbox();
    ASSERT_FALSE(again.empty());
    EXPECT_EQ(RunAs(again, HostUsrCanaries::Probe(canaries.paths()), "user"),
              OnBase(canaries, flag))
        << (flag ? "with --base-usr-local" : "without it");
  }
}

TEST_F(HostUsrLocalTest, AnImageSandboxSeesNothingOfTheHostsUsrEvenThen) {
  if (::access("/bin/busybox", X_OK) != 0)
    GTEST_SKIP() << "/bin/busybox (busybox-static) is absent";
  if (auto dynamic = airlock::ElfNeedsInterpreter(Program(AIRLOCK_AGENT_PATH)); !dynamic || *dynamic) {
    GTEST_SKIP() << "the agent is dynamically linked (a sanitizer build): no rootfs sandbox";
  }
  HostUsrCanaries canaries;
  ASSERT_EQ(canaries.error(), "");
  const std::string images = daemon_->state_dir() + "/images";
  fs::create_directories(images);
  fs::create_directories(dir_ + "/work");
  ASSERT_TRUE(WriteBusyboxImage(dir_ + "/work", images + "/busybox.tar"));
  Reply built = daemon_->Call(http::verb::post, "/v1/templates",
                              json{{"name", "bb"}, {"base", images + "/busybox.tar"}}.dump());
  ASSERT_EQ(built.status, 201) << built.body;
  const std::string id = CreateSandbox(R"({"template": "bb"})");
  ASSERT_FALSE(id.empty());
  // The image's own files (the positive control), and none of the host's /usr: not even the
  // directories a base sandbox sees.
  std::string unseen;
  for (const std::string& path : canaries.paths()) unseen += HostUsrCanaries::Unseen(path);
  for (const char* user : {"user", "root"}) {
    EXPECT_EQ(RunAs(id,
                    "cat /etc/os-release; test -e /usr || echo no-usr; " +
                        HostUsrCanaries::Probe(canaries.paths()),
                    user),
              "ID=airlock-test\nno-usr\n" + unseen)
        << "as " << user;
  }
  Reply r = ReadFile(id, canaries.bin());
  EXPECT_EQ(r.status, 404) << r.body;
}

}  // namespace
