// What only the jail engine has, end to end: real sandboxes (root only; skipped with the reason
// otherwise), driven through their agents as the daemon will drive them, and checked from the
// host. What every engine must do (limits, pause, snapshots, destroy leaving nothing) is in the
// conformance suite, tests/engine/. Every sandbox a test makes is destroyed by a guard, whatever
// the test's outcome.

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/ids.h"
#include "common/syscall.h"
#include "protocol/client.h"
#include "runtime/guest_files.h"
#include "runtime/jail/contain.h"
#include "runtime/jail/jail_engine.h"
#include "runtime/jail/posture.h"
#include "support/host_usr_canaries.h"

namespace airlock::jail {
namespace {

namespace fs = std::filesystem;
namespace p = airlock::protocol;
using namespace std::chrono_literals;

std::string Slurp(const std::string& path) {
  return ReadFileToString(path, 1 << 20).value_or("<unreadable>");
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename());
  return out;
}

class JailTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (::geteuid() != 0) return;
    char tmpl[] = "/tmp/airlock-jail-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    state_dir_ = new std::string(tmpl);
    layers_ = new runtime::LayerStore(*state_dir_ + "/layers", *state_dir_ + "/staging");
    if (auto st = layers_->Prepare(); !st) {
      open_error_ = new std::string(st.error().message());
      return;
    }
    JailOptions options;
    options.state_dir = *state_dir_;
    options.launcher_path = AIRLOCK_JAIL_LAUNCHER_PATH;
    options.agent_path = AIRLOCK_AGENT_PATH;
    options.layers = layers_;
    auto rt = JailEngine::Open(options);
    if (!rt) {
      open_error_ = new std::string(rt.error().message());
      return;
    }
    runtime_ = rt->release();
  }
  static void TearDownTestSuite() {
    delete runtime_;
    runtime_ = nullptr;
    delete layers_;
    layers_ = nullptr;
    if (state_dir_) {
      std::error_code ec;
      fs::remove_all(*state_dir_, ec);
      delete state_dir_;
      state_dir_ = nullptr;
    }
  }
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "the jail engine needs root";
    if (!runtime_) GTEST_SKIP() << "the jail engine is not usable here: " << *open_error_;
  }
  void TearDown() override {
    for (const auto& id : made_) {
      if (auto st = runtime_->Destroy(id); !st) ADD_FAILURE() << st.error().message();
    }
  }

  struct Box {
    std::string id;
    pid_t init_pid = 0;
    std::optional<p::BlockingClient> client;
  };

  // A sandbox with a connected agent; destroyed when the test ends.
  Box Make(runtime::Limits limits = {}, std::vector<std::string> layers = {},
           bool host_usr = true) {
    runtime::SandboxSpec spec;
    spec.id = NewSandboxId();
    spec.root = {host_usr, std::move(layers)};
    spec.limits = limits;
    auto sbx = runtime_->Create(spec);
    EXPECT_TRUE(sbx) << (sbx ? "" : sbx.error().message());
    Box box{spec.id};
    if (!sbx) return box;
    made_.push_back(spec.id);
    box.init_pid = JailEngine::InitPidOf((*sbx)->info().engine_state);
    auto client = p::BlockingClient::Connect((*sbx)->TakeAgentChannel());
    EXPECT_TRUE(client) << (client ? "" : client.error().message());
    if (client) box.client.emplace(std::move(*client));
    return box;
  }

  void Destroy(const std::string& id) {
    ASSERT_TRUE(runtime_->Destroy(id));
    std::erase(made_, id);
  }

  static p::ExecResult Run(Box& box, const std::string& shell, const std::string& user = "") {
    p::Exec e;
    e.shell = shell;
    e.user = user;
    e.timeout_ms = 30000;
    if (!box.client) {
      ADD_FAILURE() << "no agent";
      return {};
    }
    auto r = box.client->Exec(e);
    EXPECT_TRUE(r) << (r ? "" : r.error().message());
    return r ? std::move(*r) : p::ExecResult{};
  }

  SandboxCgroup CgroupOf(const std::string& id) {
    return SandboxCgroup::Open(runtime_->cgroup_layout(), id);
  }

  static inline JailEngine* runtime_ = nullptr;
  static inline runtime::LayerStore* layers_ = nullptr;
  static inline std::string* state_dir_ = nullptr;
  static inline std::string* open_error_ = nullptr;
  std::vector<std::string> made_;
};

TEST_F(JailTest, CommandRunsAsItsUserInAWorldOfItsOwn) {
  Box box = Make();
  auto r = Run(box, "id -u; id -g; hostname; echo $HOME; pwd; ls /");
  EXPECT_EQ(r.exit.exit_code, 0) << r.stderr_data;
  std::istringstream out(r.stdout_data);
  std::string uid, gid, host, home, cwd;
  out >> uid >> gid >> host >> home >> cwd;
  EXPECT_EQ(uid, "1000");
  EXPECT_EQ(gid, "1000");
  EXPECT_EQ(host, box.id);
  EXPECT_EQ(home, "/home/user");
  EXPECT_EQ(cwd, "/home/user");
  auto root = Run(box, "id -u; touch /root/x && echo wrote", "root");
  EXPECT_EQ(root.stdout_data, "0\nwrote\n") << root.stderr_data;
}

TEST_F(JailTest, PostureFromTheHost) {
  Box box = Make();
  ASSERT_GT(box.init_pid, 0);
  Box other = Make();
  ASSERT_GT(other.init_pid, 0);
  // The agent: seccomp, no new privileges, only its few namespaced capabilities, ids of a range
  // of its own that no other sandbox shares, namespaces that are not ours, stdio and its
  // channel, its rlimits and its cgroup (runtime/jail/posture.h).
  PostureExpectations expect;
  expect.host_pid = ::getpid();
  expect.agent_caps = AgentCapabilityMask();
  expect.nofile = runtime::Limits{}.nofile;
  expect.cgroup_suffix = "/airlock/" + box.id;
  expect.other_sandboxes = {other.init_pid};
  ASSERT_TRUE(IsNamespaceInit(box.init_pid));
  for (const auto& f : Findings(CheckPosture({box.init_pid}, expect))) {
    ADD_FAILURE() << "agent: " << f.check << ": " << f.detail;
  }
  std::istringstream map(Slurp("/proc/" + std::to_string(box.init_pid) + "/uid_map"));
  uint64_t inside = 1, outside = 0, count = 0;
  map >> inside >> outside >> count;
  EXPECT_EQ(inside, 0u);
  EXPECT_GE(outside, 1u << 30);
  EXPECT_EQ(count, 65536u);

  // A command, as user and as root: no capabilities at all, and only stdio open.
  for (const char* user : {"", "root"}) {
    p::Exec e;
    e.argv = {"sleep", "30"};
    e.user = user;
    auto stream = box.client->StartExec(e);
    ASSERT_TRUE(stream);
    auto started = box.client->Receive();
    ASSERT_TRUE(started);
    // "started" comes once the agent has forked; the child may not have exec'd sleep yet (a
    // sanitizer build on a loaded machine is slow), so it is looked for until it has.
    pid_t sleeper = 0;
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
         sleeper == 0 && std::chrono::steady_clock::now() < deadline;) {
      auto procs = CgroupOf(box.id).Processes();
      ASSERT_TRUE(procs);
      for (pid_t pid : *procs) {
        if (Slurp("/proc/" + std::to_string(pid) + "/comm") == "sleep\n") sleeper = pid;
      }
      if (sleeper == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GT(sleeper, 0) << "the command is not in the sandbox's cgroup";
    // Once sleep has started up (its libc opens and closes the locale archive as it starts: a
    // leaked fd stays, that one goes).
    std::vector<PostureCheck> findings;
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
         std::chrono::steady_clock::now() < deadline;) {
      findings = Findings(CheckPosture({sleeper}, expect));
      if (findings.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (const auto& f : findings) {
      ADD_FAILURE() << "command as '" << user << "': " << f.check << ": " << f.detail;
    }
    ASSERT_TRUE(box.client->Send(*stream, p::Signal{SIGKILL}));
    auto done = box.client->WaitAll({*stream});
    ASSERT_TRUE(done);
  }
}

TEST_F(JailTest, HostFilesAndProcessesAreOutOfReach) {
  std::string canary = "/tmp/airlock-canary-" + NewSandboxId();
  { std::ofstream(canary) << "host secret"; }
  Box box = Make();
  auto r = Run(box, "cat /etc/shadow " + canary +
                        "; ls /proc | grep -c '^[0-9]'; touch /usr/x;"
                        " echo h > /proc/sys/kernel/hostname; echo end");
  EXPECT_EQ(r.stdout_data.find("host secret"), std::string::npos);
  EXPECT_NE(r.stderr_data.find("/etc/shadow: No such file"), std::string::npos) << r.stderr_data;
  EXPECT_NE(r.stderr_data.find(canary + ": No such file"), std::string::npos) << r.stderr_data;
  EXPECT_NE(r.stderr_data.find("'/usr/x': Read-only file system"), std::string::npos)
      << r.stderr_data;
  EXPECT_NE(r.stderr_data.find("/proc/sys/kernel/hostname: Read-only file system"),
            std::string::npos)
      << r.stderr_data;
  EXPECT_LE(std::atoi(r.stdout_data.c_str()), 4) << "it sees processes that are not its own";
  EXPECT_EQ(Slurp(canary), "host secret");
  fs::remove(canary);
  // What /proc must not show reads as empty (for those this kernel has at all).
  for (const char* f : {"kcore", "keys", "key-users", "timer_list", "sched_debug", "kallsyms"}) {
    if (!fs::exists(std::string("/proc/") + f)) continue;
    auto masked = Run(box, std::string("wc -c < /proc/") + f, "root");
    EXPECT_EQ(masked.stdout_data, "0\n") << f << ": " << masked.stderr_data;
  }
  // Its own home is writable.
  auto w = Run(box, "echo hi > /home/user/f && cat /home/user/f");
  EXPECT_EQ(w.stdout_data, "hi\n") << w.stderr_data;
}

// The mounts of /proc/self/mountinfo (as a sandbox's command reads it) at or below `prefix`:
// mount point -> its per-mount options ("ro,nosuid,nodev,relatime").
std::map<std::string, std::string> MountsBelow(const std::string& mountinfo,
                                               const std::string& prefix) {
  std::map<std::string, std::string> out;
  std::istringstream in(mountinfo);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, point, options;
    fields >> id >> parent >> dev >> root >> point >> options;
    if (point == prefix || point.starts_with(prefix + "/")) out[point] = options;
  }
  return out;
}

bool HasOption(const std::string& options, const std::string& option) {
  return ("," + options + ",").find("," + option + ",") != std::string::npos;
}

TEST_F(JailTest, TheBaseRootShowsOnlyTheListedDirectoriesOfTheHostsUsr) {
  testing::HostUsrCanaries canaries;
  ASSERT_EQ(canaries.error(), "");
  Box box = Make();
  // The host's /usr/local and /usr/src are not there at all; its /usr/bin is (the positive
  // control: a canary made the same way, in a listed directory), and python3 runs.
  std::string expected = canaries.Unseen(canaries.local()) + canaries.Seen(canaries.bin());
  if (!canaries.src().empty()) expected += canaries.Unseen(canaries.src());
  for (const char* user : {"", "root"}) {
    auto r = Run(box, canaries.Probe(canaries.paths()) + "python3 -c 'print(6 * 7)'", user);
    EXPECT_EQ(r.stdout_data, expected + "42\n") << "as " << user << ": " << r.stderr_data;
  }

  // /usr holds what the host has of kHostUsrDirs, and /usr/local; nothing else of the host's.
  std::set<std::string> want = {"local"};
  for (const char* dir : runtime::guest::kHostUsrDirs) {
    if (fs::is_symlink("/usr/" + std::string(dir)) ||
        fs::is_directory("/usr/" + std::string(dir))) {
      want.insert(dir);
    }
  }
  auto listed = Run(box, "ls -A /usr");
  std::set<std::string> got;
  std::istringstream names(listed.stdout_data);
  for (std::string name; names >> name;) got.insert(name);
  EXPECT_EQ(got, want) << listed.stderr_data;

  // Every mount at or below /usr is nosuid and nodev, and read-only but the sandbox's own
  // /usr/local; one per listed directory the host has, and no other (but what the host has
  // mounted below those).
  auto mounts = MountsBelow(Run(box, "cat /proc/self/mountinfo").stdout_data, "/usr");
  std::set<std::string> points, expected_points = {"/usr", "/usr/local"};
  for (const char* dir : runtime::guest::kHostUsrDirs) {
    if (fs::is_directory("/usr/" + std::string(dir)) &&
        !fs::is_symlink("/usr/" + std::string(dir))) {
      expected_points.insert("/usr/" + std::string(dir));
    }
  }
  for (const auto& [point, options] : mounts) {
    if (std::ranges::none_of(expected_points, [&](const std::string& p) {
          return p != "/usr" && p != "/usr/local" && point.starts_with(p + "/");
        })) {
      points.insert(point);
    }
    EXPECT_TRUE(HasOption(options, "nosuid") && HasOption(options, "nodev"))
        << point << " " << options;
    EXPECT_TRUE(HasOption(options, point == "/usr/local" ? "rw" : "ro")) << point << " " << options;
  }
  EXPECT_EQ(points, expected_points);

  // Root cannot write the host's directories nor /usr itself; /usr/local is its own (a pip
  // install's target), which its user cannot write, and nothing written there reaches the host.
  const std::string mine = "airlock-own-" + box.id;
  auto writes = Run(box,
                    "for d in /usr /usr/bin /usr/lib /usr/share; do touch $d/" + mine +
                        " 2>&1 | grep -q 'Read-only file system' && echo $d ro; done; "
                        "mkdir -p /usr/local/lib/python3/dist-packages/" +
                        mine + " && touch /usr/local/bin/" + mine + " && echo local rw",
                    "root");
  EXPECT_EQ(writes.stdout_data, "/usr ro\n/usr/bin ro\n/usr/lib ro\n/usr/share ro\nlocal rw\n")
      << writes.stderr_data;
  auto user =
      Run(box, "touch /usr/local/" + mine + " 2>&1 | grep -q 'Permission denied' && echo denied");
  EXPECT_EQ(user.stdout_data, "denied\n") << user.stderr_data;
  EXPECT_FALSE(fs::exists("/usr/local/bin/" + mine));
  EXPECT_FALSE(fs::exists("/usr/local/lib/python3/dist-packages/" + mine));
}

TEST_F(JailTest, UsrLocalGoesIntoSnapshotsAndStacksOnTheBaseRoot) {
  Box a = Make();
  const std::string tool = "airlock-tool-" + a.id;
  auto made = Run(a,
                  "printf '#!/bin/sh\\necho tool\\n' > /usr/local/bin/" + tool +
                      " && chmod 755 /usr/local/bin/" + tool + " && mkdir /usr/local/lib/" + tool +
                      " && echo v1 > /usr/local/lib/" + tool + "/data && echo ok",
                  "root");
  ASSERT_EQ(made.stdout_data, "ok\n") << made.stderr_data;
  auto layer = runtime_->SnapshotLayer(a.id);
  ASSERT_TRUE(layer) << layer.error().message();

  // On the layer, under the host's /usr as before: the tool on PATH, python3 still the host's.
  Box b = Make({}, {layer->digest});
  auto seen = Run(b, tool + "; cat /usr/local/lib/" + tool + "/data; python3 -c 'print(1)'");
  EXPECT_EQ(seen.stdout_data, "tool\nv1\n1\n") << seen.stderr_data;
  // What b writes over the layer's file is b's own.
  EXPECT_EQ(Run(b, "echo v2 > /usr/local/lib/" + tool + "/data && echo ok", "root").stdout_data,
            "ok\n");
  EXPECT_EQ(Run(a, "cat /usr/local/lib/" + tool + "/data").stdout_data, "v1\n");
  EXPECT_EQ(Slurp(*state_dir_ + "/layers/" + layer->digest + "/usr/local/lib/" + tool + "/data"),
            "v1\n");
  EXPECT_FALSE(fs::exists("/usr/local/bin/" + tool)) << "the host's /usr/local was written";
}

TEST_F(JailTest, NestedNamespacesAndMountsAreRefused) {
  Box box = Make();
  auto r = Run(box, "unshare -U true; echo u=$?; unshare -m true; echo m=$?", "root");
  EXPECT_NE(r.stdout_data.find("u=1"), std::string::npos) << r.stdout_data << r.stderr_data;
  EXPECT_NE(r.stdout_data.find("m=1"), std::string::npos) << r.stdout_data << r.stderr_data;
  auto m = Run(box, "mount -t tmpfs none /mnt 2>&1; echo rc=$?", "root");
  EXPECT_EQ(m.stdout_data.find("rc=0"), std::string::npos) << m.stdout_data;
}

// The OOM kill itself, and that the neighbour is spared, are checked on every engine
// (tests/engine/); here, the jail's own account of it and what a sandbox sees of its cgroup.
TEST_F(JailTest, ItsCgroupCountsOomKillsAndIsReadOnlyInside) {
  runtime::Limits small;
  small.memory_mb = 64;
  Box box = Make(small);
  auto before = CgroupOf(box.id).OomKills();
  ASSERT_TRUE(before);
  auto r = Run(box, "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}");
  EXPECT_TRUE(r.exit.oom_killed) << r.stdout_data << r.stderr_data;
  auto after = CgroupOf(box.id).OomKills();
  ASSERT_TRUE(after);
  EXPECT_GT(*after, *before);
  bool v2 = runtime_->cgroup_layout().version == CgroupVersion::kV2;
  std::string limit_file =
      v2 ? "/sys/fs/cgroup/memory.max" : "/sys/fs/cgroup/memory/memory.limit_in_bytes";
  auto ro = Run(box, "cat " + limit_file + " && echo 1 > " + limit_file, "root");
  EXPECT_EQ(ro.stdout_data, "67108864\n") << ro.stderr_data;
  EXPECT_NE(ro.stderr_data.find("Read-only file system"), std::string::npos) << ro.stderr_data;
}

// A layer made from a directory tree on the host (as an image import makes one).
std::string ImportTree(const runtime::LayerStore& store,
                       const std::function<void(const std::string&)>& fill) {
  auto imported = store.ImportTree([&](const std::string& dir) -> Status {
    fill(dir);
    return {};
  });
  EXPECT_TRUE(imported) << (imported ? "" : imported.error().message());
  return imported ? imported->digest : "";
}

void WriteText(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST_F(JailTest, ARootFileSystemLayerIsTheWholeRoot) {
  if (::access("/bin/busybox", X_OK) != 0) GTEST_SKIP() << "/bin/busybox (busybox-static) is absent";
  if (!runtime_->agent_is_static()) {
    GTEST_SKIP() << "the agent is dynamically linked (a sanitizer build): no rootfs sandbox";
  }
  const std::string digest = ImportTree(*layers_, [](const std::string& dir) {
    fs::create_directories(dir + "/bin");
    fs::create_directories(dir + "/usr/share/marker");
    fs::copy_file("/bin/busybox", dir + "/bin/busybox");
    for (const char* applet : {"sh", "cat", "ls", "id", "test", "echo", "stat"}) {
      fs::create_symlink("busybox", dir + "/bin/" + applet);
    }
    WriteText(dir + "/etc/passwd",
              "root:x:0:0:root:/root:/bin/sh\ndaemon:x:1:1:daemon:/:/bin/sh\n"
              "user:x:1001:1001:theirs:/:/bin/sh\n");
    WriteText(dir + "/etc/group", "root:x:0:\ndaemon:x:1:\nuser:x:1001:\n");
    WriteText(dir + "/etc/os-release", "ID=test-image\n");
    fs::create_symlink("/run/resolv.conf", dir + "/etc/resolv.conf");
  });
  ASSERT_FALSE(digest.empty());
  // Nothing of the import is left in the staging directory.
  EXPECT_TRUE(ListDir(*state_dir_ + "/staging").empty());

  Box box = Make({}, {digest}, /*host_usr=*/false);
  auto seen = Run(box,
                  "cat /etc/os-release; ls /usr; test -e /usr/bin/env || echo no-host-usr; "
                  "id -u; cat /etc/passwd; stat -c %F /etc/resolv.conf");
  EXPECT_EQ(seen.stdout_data,
            "ID=test-image\nshare\nno-host-usr\n1000\n"
            "root:x:0:0:root:/root:/bin/sh\n"
            "user:x:1000:1000:user:/home/user:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            "daemon:x:1:1:daemon:/:/bin/sh\n"
            "regular file\n")
      << seen.stderr_data;
  EXPECT_EQ(Run(box, "cat /etc/group").stdout_data,
            "root:x:0:\ntty:x:5:user\nuser:x:1000:\nnogroup:x:65534:\ndaemon:x:1:\n");

  // Without its layer a rootfs sandbox has no root: refused before anything is made.
  runtime::SandboxSpec bare;
  bare.id = NewSandboxId();
  bare.root.host_usr = false;
  auto refused = runtime_->Create(bare);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument);
}

TEST_F(JailTest, SymlinksALayerLeftInEtcReachNothingOnTheHost) {
  // A world-writable host directory: what the sandbox's setup writes would land here if it
  // followed a layer's symlinks before entering the sandbox's root.
  char canary_tmpl[] = "/tmp/airlock-canary-XXXXXX";
  ASSERT_NE(::mkdtemp(canary_tmpl), nullptr);
  const std::string canary = canary_tmpl;
  ASSERT_EQ(::chmod(canary.c_str(), 01777), 0);
  const std::string files = ImportTree(*layers_, [&](const std::string& dir) {
    fs::create_directories(dir + "/etc");
    for (const char* name : {"hostname", "passwd", "hosts"}) {
      fs::create_symlink(canary + "/" + name, dir + "/etc/" + name);
    }
  });
  const std::string whole = ImportTree(*layers_, [&](const std::string& dir) {
    fs::create_symlink(canary, dir + "/etc");
  });
  ASSERT_FALSE(files.empty());
  ASSERT_FALSE(whole.empty());

  // Symlinked files are replaced inside the sandbox.
  Box box = Make({}, {files});
  EXPECT_EQ(Run(box, "stat -c %F /etc/hostname /etc/passwd; cat /etc/hostname").stdout_data,
            "regular file\nregular file\n" + box.id + "\n");
  // A symlinked /etc is refused, naming why.
  runtime::SandboxSpec spec;
  spec.id = NewSandboxId();
  spec.root.layers = {whole};
  auto refused = runtime_->Create(spec);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("mount point is not a directory"), std::string::npos)
      << refused.error().message();
  EXPECT_TRUE(ListDir(canary).empty());
  fs::remove_all(canary);
}

TEST_F(JailTest, ALayerCannotRedirectTheUsrMountPoints) {
  // A world-writable host directory: a bind that followed a layer's symlink would put the
  // host's /usr/bin here, and a write through it would land here.
  char canary_tmpl[] = "/tmp/airlock-canary-XXXXXX";
  ASSERT_NE(::mkdtemp(canary_tmpl), nullptr);
  const std::string canary = canary_tmpl;
  struct Remove {
    std::string dir;
    ~Remove() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove{canary};
  ASSERT_EQ(::chmod(canary.c_str(), 01777), 0);
  auto symlinked = [&](const std::string& at) {
    return ImportTree(*layers_, [&](const std::string& dir) {
      fs::create_directories(fs::path(dir + at).parent_path());
      fs::create_symlink(canary, dir + at);
    });
  };
  const std::string bin = symlinked("/usr/bin"), usr = symlinked("/usr"),
                    local = symlinked("/usr/local");
  ASSERT_FALSE(bin.empty() || usr.empty() || local.empty());

  // A symlinked mount point is refused, naming why; a /usr that hides the mount points (the
  // overlay merges no directory below a non-directory) fails at its first bind.
  for (const auto& [layer, why] :
       {std::pair{bin, "mount point is not a directory"}, std::pair{usr, "bind /usr directory"}}) {
    runtime::SandboxSpec spec;
    spec.id = NewSandboxId();
    spec.root.layers = {layer};
    auto refused = runtime_->Create(spec);
    if (refused) made_.push_back(spec.id);
    ASSERT_FALSE(refused) << "a layer with a symlinked /usr or /usr/bin was accepted";
    EXPECT_NE(refused.error().message().find(why), std::string::npos) << refused.error().message();
  }
  // /usr/local is the sandbox's own directory, which a lower layer's symlink cannot replace.
  Box box = Make({}, {local});
  EXPECT_EQ(Run(box, "stat -c %F /usr/local && touch /usr/local/x && echo ok", "root").stdout_data,
            "directory\nok\n");
  EXPECT_TRUE(ListDir(canary).empty());
}

TEST_F(JailTest, ANetworkNamespaceTheHostMadeIsJoinedAndCannotBeChanged) {
  if (::access("/usr/sbin/ip", X_OK) != 0 && ::access("/sbin/ip", X_OK) != 0) {
    GTEST_SKIP() << "ip (iproute2) is not installed";
  }
  // A namespace with a veth to the host, as the daemon's network manager makes one.
  const std::string ns = "airlock-jt-" + std::to_string(::getpid());
  const std::string host_if = "aljt" + std::to_string(::getpid() % 100000);
  const std::string setup =
      "ip netns add " + ns + " && ip link add " + host_if + " type veth peer name eth0 netns " +
      ns + " && ip addr add 10.251.7.1/30 dev " + host_if + " && ip link set " + host_if +
      " up && ip -n " + ns + " link set lo up && ip -n " + ns +
      " addr add 10.251.7.2/30 dev eth0 && ip -n " + ns + " link set eth0 up && ip -n " + ns +
      " route add default via 10.251.7.1";
  struct Cleanup {
    std::string ns;
    ~Cleanup() { (void)!std::system(("ip netns del " + ns + " 2>/dev/null").c_str()); }
  } cleanup{ns};
  ASSERT_EQ(std::system(setup.c_str()), 0) << setup;

  runtime::SandboxSpec spec;
  spec.id = NewSandboxId();
  spec.netns = "/run/netns/" + ns;
  spec.nameserver = "10.251.7.1";
  auto sbx = runtime_->Create(spec);
  ASSERT_TRUE(sbx) << sbx.error().message();
  made_.push_back(spec.id);
  auto client = p::BlockingClient::Connect((*sbx)->TakeAgentChannel());
  ASSERT_TRUE(client) << client.error().message();
  Box box{spec.id, JailEngine::InitPidOf((*sbx)->info().engine_state)};
  box.client.emplace(std::move(*client));

  EXPECT_EQ(Run(box, "cat /etc/resolv.conf | head -1; ls /sys/class/net 2>/dev/null || "
                     "awk 'NR>2 {print $1}' /proc/net/dev | tr -d : | sort")
                .stdout_data,
            "nameserver 10.251.7.1\neth0\nlo\n");
  // Root in the sandbox has no say over a namespace the host's user namespace owns.
  auto changed = Run(box, "ip link set eth0 down; ip addr add 10.9.9.9/32 dev eth0; echo done",
                     "root");
  EXPECT_NE(changed.stderr_data.find("Operation not permitted"), std::string::npos)
      << changed.stderr_data;
  EXPECT_EQ(std::system(("ip -n " + ns + " -br addr show eth0 | grep -q ' UP .*10.251.7.2/30'")
                            .c_str()),
            0);
  // A namespace that is not there fails the create, naming the step.
  runtime::SandboxSpec missing;
  missing.id = NewSandboxId();
  missing.netns = "/run/netns/airlock-not-there";
  auto refused = runtime_->Create(missing);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message().find("open network namespace"), std::string::npos)
      << refused.error().message();
}

TEST_F(JailTest, ItsCapabilitiesAreWhatItDoes) {
  const runtime::Capabilities& can = runtime_->capabilities();
  EXPECT_TRUE(can.pause);
  EXPECT_TRUE(can.live_limits);
  EXPECT_TRUE(can.layer_snapshot);
  EXPECT_TRUE(can.host_usr_root);
  EXPECT_TRUE(can.networking);
  EXPECT_EQ(can.max_layers, kMaxLayers);
  EXPECT_FALSE(can.memory_checkpoint) << "the jail keeps no memory image";
  EXPECT_FALSE(can.memory_fork);
}

TEST_F(JailTest, SetupFailureNamesTheStepAndLeavesNothing) {
  // A template without its /proc mount point.
  std::string proc = *state_dir_ + "/templates/base/proc";
  ASSERT_EQ(::rmdir(proc.c_str()), 0);
  runtime::SandboxSpec spec;
  spec.id = NewSandboxId();
  auto sbx = runtime_->Create(spec);
  ASSERT_EQ(::mkdir(proc.c_str(), 0755), 0);
  ASSERT_FALSE(sbx);
  EXPECT_NE(sbx.error().message().find("jail setup step 'mount /proc' failed: ENOENT"),
            std::string::npos)
      << sbx.error().message();
  EXPECT_FALSE(fs::exists(runtime_->SandboxDir(spec.id)));
  EXPECT_EQ(std::ranges::count(ListSandboxCgroups(runtime_->cgroup_layout()), spec.id), 0);
}

}  // namespace
}  // namespace airlock::jail
