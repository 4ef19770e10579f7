// The jail engine, end to end: real sandboxes (root only; skipped with the reason otherwise),
// driven through their agents as the daemon will drive them, and checked from the host.
// Every sandbox a test makes is destroyed by a guard, whatever the test's outcome.

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

size_t CountMountsMentioning(const std::string& text) {
  std::istringstream in(Slurp("/proc/self/mountinfo"));
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) n += line.find(text) != std::string::npos;
  return n;
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
    auto procs = CgroupOf(box.id).Processes();
    ASSERT_TRUE(procs);
    pid_t sleeper = 0;
    for (pid_t pid : *procs) {
      if (Slurp("/proc/" + std::to_string(pid) + "/comm") == "sleep\n") sleeper = pid;
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
  for (const char* dir : kHostUsrDirs) {
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
  for (const char* dir : kHostUsrDirs) {
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

TEST_F(JailTest, MemoryLimitKillsOnlyInsideThatSandbox) {
  runtime::Limits small;
  small.memory_mb = 64;
  Box box = Make(small);
  Box neighbour = Make();
  auto before = CgroupOf(box.id).OomKills();
  ASSERT_TRUE(before);
  // The shell holds 200 MB of output in a variable.
  auto r = Run(box, "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}");
  EXPECT_EQ(r.exit.term_signal, SIGKILL) << r.stdout_data << r.stderr_data;
  EXPECT_TRUE(r.exit.oom_killed) << "the exec result must say the OOM killer ended it";
  auto after = CgroupOf(box.id).OomKills();
  ASSERT_TRUE(after);
  EXPECT_GT(*after, *before);
  auto fine = Run(box, "echo alive");
  EXPECT_EQ(fine.stdout_data, "alive\n");
  EXPECT_FALSE(fine.exit.oom_killed);
  // Its cgroup is visible inside, read-only.
  bool v2 = runtime_->cgroup_layout().version == CgroupVersion::kV2;
  std::string limit_file =
      v2 ? "/sys/fs/cgroup/memory.max" : "/sys/fs/cgroup/memory/memory.limit_in_bytes";
  auto ro = Run(box, "cat " + limit_file + " && echo 1 > " + limit_file, "root");
  EXPECT_EQ(ro.stdout_data, "67108864\n") << ro.stderr_data;
  EXPECT_NE(ro.stderr_data.find("Read-only file system"), std::string::npos) << ro.stderr_data;
  EXPECT_EQ(Run(neighbour, "echo fine").stdout_data, "fine\n");
}

TEST_F(JailTest, PidsLimitStopsAForkBomb) {
  runtime::Limits small;
  small.pids_max = 16;
  Box box = Make(small);
  auto r = Run(box, "for i in $(seq 1 40); do sleep 3 & done; echo launched");
  EXPECT_NE(r.stderr_data.find("fork"), std::string::npos) << "no fork failed: " << r.stderr_data;
  // Counted from the host while the sleeps still run.
  auto procs = CgroupOf(box.id).Processes();
  ASSERT_TRUE(procs);
  EXPECT_GT(procs->size(), 8u);
  EXPECT_LE(procs->size(), 16u) << "more processes than pids_max";
  EXPECT_EQ(Run(box, "echo still").stdout_data.empty(), false);
}

TEST_F(JailTest, CpuQuotaHoldsASpinningCommand) {
  runtime::Limits small;
  small.cpus = 0.25;
  Box box = Make(small);
  // One second of wall time spinning; `times` reports the CPU time its children used.
  auto r = Run(box, "timeout 1 sh -c 'while :; do :; done'; times");
  std::istringstream out(r.stdout_data);
  std::string shell_line, children_user;
  std::getline(out, shell_line);
  out >> children_user;  // "0m0.250000s"
  ASSERT_FALSE(children_user.empty()) << r.stdout_data << r.stderr_data;
  double seconds = std::atof(children_user.substr(children_user.find('m') + 1).c_str());
  EXPECT_LT(seconds, 0.5) << "a quarter of a cpu used " << children_user << " in one second";
  EXPECT_GT(seconds, 0.05) << "the command did not spin at all: " << r.stdout_data;
}

TEST_F(JailTest, DiskLimitFillsOnlyItsOwnLayer) {
  runtime::Limits small;
  small.disk_mb = 16;
  Box box = Make(small);
  Box neighbour = Make();
  auto r = Run(box, "dd if=/dev/zero of=/home/user/fill bs=1M count=64 2>&1; echo rc=$?");
  EXPECT_NE(r.stdout_data.find("No space left on device"), std::string::npos) << r.stdout_data;
  EXPECT_EQ(r.stdout_data.find("rc=0"), std::string::npos);
  auto n = Run(neighbour, "dd if=/dev/zero of=/home/user/f bs=1M count=32 2>/dev/null; echo rc=$?");
  EXPECT_EQ(n.stdout_data, "rc=0\n");
}

TEST_F(JailTest, PauseFreezesAndResumeThaws) {
  Box box = Make();
  ASSERT_TRUE(runtime_->Pause(box.id));
  ASSERT_TRUE(box.client->Send(0, p::Ping{7}));
  auto frozen = box.client->Receive(300ms);
  EXPECT_FALSE(frozen) << "a paused sandbox answered";
  ASSERT_TRUE(runtime_->Resume(box.id));
  auto pong = box.client->Receive(5s);
  ASSERT_TRUE(pong) << pong.error().message();
  EXPECT_EQ(std::get<p::Pong>(pong->second).nonce, 7u);
}

TEST_F(JailTest, ASecondCreateOfTheSameIdIsRefusedAndHarmsNothing) {
  Box box = Make();
  runtime::SandboxSpec spec;
  spec.id = box.id;
  auto again = runtime_->Create(spec);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), ErrorCode::kAlreadyExists);
  auto r = Run(box, "echo still here");
  EXPECT_EQ(r.stdout_data, "still here\n");
  // Bad ids never become paths.
  spec.id = "../../etc";
  auto bad = runtime_->Create(spec);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
}

// What a sandbox wrote becomes a layer that new sandboxes (in other uid ranges) start from:
// owners as the sandbox saw them, deletions and replaced directories, copy-up on write.
TEST_F(JailTest, SnapshotLayersCarryFilesOwnersAndDeletions) {
  Box a = Make();
  auto made = Run(a,
                  "mkdir -p /opt/app/dir && chmod 777 /opt/app && echo old > /opt/app/dir/old"
                  " && cp /bin/true /opt/app/suid"
                  " && chmod 4755 /opt/app/suid && mkfifo /opt/app/fifo && ln -s x /opt/app/link"
                  " && echo ok",
                  "root");
  ASSERT_EQ(made.stdout_data, "ok\n") << made.stderr_data;
  ASSERT_EQ(Run(a, "echo mine > /home/user/notes && ln /home/user/notes /home/user/notes-link && "
                   "echo hello > /opt/app/x && echo ok")
                .stdout_data,
            "ok\n");
  auto first = runtime_->SnapshotLayer(a.id);
  ASSERT_TRUE(first) << first.error().message();
  EXPECT_FALSE(first->existed);
  EXPECT_GT(first->files, 5u);
  // The sandbox goes on (it was frozen only while copied), and the same tree is the same layer.
  EXPECT_EQ(Run(a, "echo alive").stdout_data, "alive\n");
  auto again = runtime_->SnapshotLayer(a.id);
  ASSERT_TRUE(again) << again.error().message();
  EXPECT_EQ(again->digest, first->digest);
  EXPECT_TRUE(again->existed);

  // On the host: root-only, owners as inside, no set-user-ID bit.
  const std::string layer = *state_dir_ + "/layers/" + first->digest;
  struct stat st;
  ASSERT_EQ(::stat((*state_dir_ + "/layers").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((layer + "/opt/app/x").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1000u);
  ASSERT_EQ(::stat((layer + "/opt/app/suid").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  // A hard link stays one (copied apart, links could multiply the bytes without bound).
  struct stat link;
  ASSERT_EQ(::stat((layer + "/home/user/notes").c_str(), &st), 0);
  ASSERT_EQ(::stat((layer + "/home/user/notes-link").c_str(), &link), 0);
  EXPECT_EQ(st.st_ino, link.st_ino);
  EXPECT_EQ(st.st_nlink, 2u);

  // A second generation deletes a file and replaces a directory.
  Box b = Make({}, {first->digest});
  auto changed = Run(b,
                     "cat /opt/app/x && rm /opt/app/x && rm -rf /opt/app/dir && mkdir /opt/app/dir"
                     " && echo new > /opt/app/dir/new && echo ok",
                     "root");
  ASSERT_EQ(changed.stdout_data, "hello\nok\n") << changed.stderr_data;
  auto second = runtime_->SnapshotLayer(b.id);
  ASSERT_TRUE(second) << second.error().message();
  EXPECT_NE(second->digest, first->digest);

  Box c = Make({}, {second->digest, first->digest});
  auto seen = Run(c,
                  "ls /opt/app | tr '\\n' ' '; echo; ls /opt/app/dir; stat -c '%U %a' "
                  "/home/user/notes /opt/app/suid; readlink /opt/app/link; stat -c %F /opt/app/fifo");
  EXPECT_EQ(seen.stdout_data,
            "dir fifo link suid \nnew\nuser 644\nroot 755\nx\nfifo\n")
      << seen.stderr_data;
  // Files from the layers are the sandbox's own: its user appends to one, root changes another's
  // mode (both copied up).
  EXPECT_EQ(Run(c, "echo more >> /home/user/notes && cat /home/user/notes").stdout_data,
            "mine\nmore\n");
  EXPECT_EQ(Run(c, "chmod 700 /opt/app/suid && stat -c %a /opt/app/suid", "root").stdout_data,
            "700\n");
  // and nothing written in c reaches the layer or the other sandboxes.
  EXPECT_EQ(Slurp(layer + "/home/user/notes"), "mine\n");
  EXPECT_EQ(Run(b, "cat /home/user/notes").stdout_data, "mine\n");

  auto listed = layers_->List();
  ASSERT_TRUE(listed);
  EXPECT_NE(std::ranges::find(*listed, first->digest), listed->end());
}

// A tree nested deeper than a layer may hold is refused with a clear error, not copied until
// the daemon runs out of fds or stack; the sandbox goes on and nothing is kept.
TEST_F(JailTest, ASnapshotOfATooDeepTreeIsRefused) {
  Box box = Make();
  auto made = Run(box, "cd /home/user && for i in $(seq 300); do mkdir d && cd d || exit 1; done; "
                       "echo deep");
  ASSERT_EQ(made.stdout_data, "deep\n") << made.stderr_data;
  auto before = layers_->List();
  ASSERT_TRUE(before);
  auto snap = runtime_->SnapshotLayer(box.id);
  ASSERT_FALSE(snap);
  EXPECT_EQ(snap.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(snap.error().message().find("deeper than 256"), std::string::npos)
      << snap.error().message();
  EXPECT_EQ(Run(box, "echo alive").stdout_data, "alive\n");
  EXPECT_EQ(*layers_->List(), *before);
  EXPECT_EQ(ListDir(*state_dir_ + "/layers").size(), before->size()) << "a temporary was left";
}

TEST_F(JailTest, LayersThatDoNotExistAreRefused) {
  auto missing = runtime_->Create(runtime::SandboxSpec{
      .id = NewSandboxId(), .root = {.layers = {std::string(64, 'a')}}});
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  auto bad =
      runtime_->Create(runtime::SandboxSpec{.id = NewSandboxId(), .root = {.layers = {"../x"}}});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(layers_->Has("../../etc"));
  EXPECT_FALSE(layers_->Remove("../../etc"));
  EXPECT_TRUE(layers_->Remove(std::string(64, 'b'))) << "removing no layer succeeds";
  auto snap = runtime_->SnapshotLayer("sbx-nothere");
  ASSERT_FALSE(snap);
  EXPECT_EQ(snap.error().code(), ErrorCode::kNotFound);
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
  // Its probe is a whole create and destroy, leaving nothing.
  const size_t before = ListDir(*state_dir_ + "/jail").size();
  ASSERT_TRUE(runtime_->Probe());
  EXPECT_EQ(ListDir(*state_dir_ + "/jail").size(), before);
}

TEST_F(JailTest, DestroyLeavesNothingAndIsIdempotent) {
  Box box = Make();
  auto r = Run(box, "sleep 100 & sleep 100 & echo started");
  EXPECT_EQ(r.stdout_data, "started\n");
  pid_t init = box.init_pid;
  std::string dir = runtime_->SandboxDir(box.id);
  ASSERT_TRUE(fs::exists(dir));
  Destroy(box.id);
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_NE(::kill(init, 0), 0) << "the sandbox's PID 1 survived";
  EXPECT_EQ(std::ranges::count(ListSandboxCgroups(runtime_->cgroup_layout()), box.id), 0);
  EXPECT_EQ(CountMountsMentioning(box.id), 0u);
  EXPECT_TRUE(runtime_->Destroy(box.id)) << "a second destroy must succeed";
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

TEST_F(JailTest, TwoHundredCyclesLeakNothing) {
  auto fds_before = ListDir("/proc/self/fd").size();
  auto dirs_before = ListDir(*state_dir_ + "/jail").size();
  std::set<std::string> ids;
  for (int i = 0; i < 200; ++i) {
    runtime::SandboxSpec spec;
    spec.id = NewSandboxId();
    ids.insert(spec.id);
    auto sbx = runtime_->Create(spec);
    ASSERT_TRUE(sbx) << "cycle " << i << ": " << sbx.error().message();
    made_.push_back(spec.id);
    auto client = p::BlockingClient::Connect((*sbx)->TakeAgentChannel());
    ASSERT_TRUE(client) << "cycle " << i << ": " << client.error().message();
    ASSERT_TRUE(client->Ping(static_cast<uint64_t>(i)));
    Destroy(spec.id);
  }
  EXPECT_EQ(ListDir("/proc/self/fd").size(), fds_before);
  // The cgroup parents are shared with every engine on the host: only ours are counted.
  for (const std::string& left : ListSandboxCgroups(runtime_->cgroup_layout())) {
    EXPECT_FALSE(ids.contains(left)) << "the cgroup of " << left << " was left behind";
  }
  EXPECT_EQ(ListDir(*state_dir_ + "/jail").size(), dirs_before);
}

}  // namespace
}  // namespace airlock::jail
