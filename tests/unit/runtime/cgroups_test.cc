// Sandbox cgroups: the v1 and v2 logic against fake trees in a temp dir, and the limits, freeze
// and kill against the real cgroups of this host (root only; skipped with the reason otherwise).
//
// Every real test owns its cgroup and its children through a guard that destroys the cgroup and
// kills and reaps the children, whatever the test's outcome. The environment removes the empty
// "airlock" parents at the end, so nothing named airlock is left under /sys/fs/cgroup.

#include "runtime/jail/cgroups.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/syscall.h"
#include "common/unique_fd.h"

namespace airlock::jail {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMiB = 1ull << 20;
constexpr char kCgroupRoot[] = "/sys/fs/cgroup";

// ---------------------------------------------------------------------------------------------
// Files and directories

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The file's text, or a marker that no expected value equals.
std::string Slurp(const std::string& path) {
  auto text = ReadFileToString(path);
  return text ? *text : "<unreadable: " + text.error().message() + ">";
}

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

void Put(const std::string& path, std::string_view text) {
  auto fd = OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_TRUE(fd) << fd.error().message();
  ASSERT_TRUE(WriteAll(fd->get(), text));
}

void MakeDirs(const std::string& path) {
  for (size_t slash = 1; slash != std::string::npos;) {
    slash = path.find('/', slash + 1);
    std::string prefix = path.substr(0, slash);
    ASSERT_TRUE(::mkdir(prefix.c_str(), 0755) == 0 || errno == EEXIST) << prefix;
  }
}

void RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* dir = ::opendir(path.c_str())) {
      std::vector<std::string> names;
      while (dirent* e = ::readdir(dir)) {
        std::string name = e->d_name;
        if (name != "." && name != "..") names.push_back(name);
      }
      ::closedir(dir);
      for (const auto& name : names) RemoveTree(path + "/" + name);
    }
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/airlock-cgtest-XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    if (made == nullptr) std::abort();
    path_ = made;
  }
  ~TempDir() { RemoveTree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(std::string_view rel) const { return path_ + "/" + std::string(rel); }

 private:
  std::string path_;
};

std::string UniqueId(std::string_view tag) {
  static int counter = 0;
  return "sbx-" + std::string(tag) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(++counter);
}

// ---------------------------------------------------------------------------------------------
// The real cgroups of this host, detected once per test binary run.

struct RealCgroups {
  bool usable = false;
  std::string skip_reason;
  CgroupLayout layout;
  // v2 only: what Detect changed around the daemon's own cgroup.
  std::string v2_own_dir;
  bool v2_leaf_made = false;
  std::string v2_own_subtree_before;
};
RealCgroups g_real;

// The v2 own cgroup as Detect will see it, so that the environment can undo its changes.
std::string V2OwnDir() {
  std::string text = Slurp("/proc/self/cgroup");
  size_t at = text.find("0::");
  if (at == std::string::npos) return "";
  std::string own = Trimmed(text.substr(at + 3, text.find('\n', at) - at - 3));
  if (own.ends_with("/airlockd")) own.resize(own.size() - 9);
  return own.empty() || own == "/" ? kCgroupRoot : kCgroupRoot + own;
}

class CgroupEnvironment : public testing::Environment {
 public:
  void SetUp() override {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // orphaned grandchildren come back to us to reap
    if (::geteuid() != 0) {
      g_real.skip_reason = "needs root to create cgroups";
      return;
    }
    bool v2 = Exists(std::string(kCgroupRoot) + "/cgroup.controllers");
    if (v2) {
      g_real.v2_own_dir = V2OwnDir();
      g_real.v2_leaf_made = !Exists(g_real.v2_own_dir + "/airlockd");
      g_real.v2_own_subtree_before = Slurp(g_real.v2_own_dir + "/cgroup.subtree_control");
    }
    auto layout = CgroupLayout::Detect();
    if (!layout) {
      g_real.skip_reason = "no usable cgroups: " + layout.error().message();
      return;
    }
    g_real.layout = *layout;
    // A probe: some containers let root see cgroups but not make them.
    std::string probe = UniqueId("cgprobe");
    auto cgroup = SandboxCgroup::Create(g_real.layout, probe, CgroupLimits{});
    if (!cgroup) {
      g_real.skip_reason = "cannot create a cgroup here: " + cgroup.error().message();
      return;
    }
    if (auto destroyed = cgroup->Destroy(); !destroyed) {
      g_real.skip_reason = "cannot destroy a cgroup here: " + destroyed.error().message();
      return;
    }
    g_real.usable = true;
  }

  // Removes the airlock parents when empty, whoever made them: under ctest -j another test
  // process may have made one this process uses, and Create remakes a parent it needs.
  void TearDown() override {
    for (const auto& [controller, parent] : g_real.layout.v1_parents) ::rmdir(parent.c_str());
    if (g_real.v2_own_dir.empty()) return;
    const std::string& own = g_real.v2_own_dir;
    ::rmdir((own + "/airlock").c_str());
    if (!g_real.v2_leaf_made || Exists(own + "/airlock")) return;
    // Undo the leaf move: stop delegating what we enabled, go back, remove the leaf.
    std::string disable;
    for (std::string_view c : {"memory", "cpu", "pids"}) {
      if (g_real.v2_own_subtree_before.find(c) == std::string::npos) {
        disable += (disable.empty() ? "-" : " -") + std::string(c);
      }
    }
    if (auto fd = OpenFile(own + "/cgroup.subtree_control", O_WRONLY); fd && !disable.empty()) {
      (void)WriteAll(fd->get(), disable);
    }
    if (auto fd = OpenFile(own + "/cgroup.procs", O_WRONLY)) (void)WriteAll(fd->get(), "0");
    ::rmdir((own + "/airlockd").c_str());
  }
};

[[maybe_unused]] testing::Environment* const g_environment =
    testing::AddGlobalTestEnvironment(new CgroupEnvironment);

// ---------------------------------------------------------------------------------------------
// Children

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Reaps orphans that PR_SET_CHILD_SUBREAPER handed to us; they may still be dying.
void ReapOrphans() {
  for (int i = 0; i < 40; ++i) {
    pid_t reaped;
    while ((reaped = ::waitpid(-1, nullptr, WNOHANG)) > 0) {
    }
    if (reaped < 0 && errno == ECHILD) return;
    SleepMs(5);
  }
}

void SpinForever() {
  volatile uint64_t n = 0;
  while (true) n = n + 1;
}

// The CPU time a process has used, in clock ticks (utime + stime of /proc/<pid>/stat).
long CpuTicks(pid_t pid) {
  std::string stat = Slurp("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::vector<std::string> fields;
  size_t pos = paren + 2;
  while (pos < stat.size()) {
    size_t end = stat.find(' ', pos);
    if (end == std::string::npos) end = stat.size();
    fields.push_back(stat.substr(pos, end - pos));
    pos = end + 1;
  }
  // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
  if (fields.size() < 13) return -1;
  return std::atol(fields[11].c_str()) + std::atol(fields[12].c_str());
}

double Seconds(const timeval& tv) { return static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6; }

// Reads exactly `size` bytes from a pipe within `timeout_ms`. False on timeout or EOF.
bool ReadWithin(int fd, void* buf, size_t size, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  size_t done = 0;
  while (done < size) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) continue;
    ssize_t n = ::read(fd, static_cast<char*>(buf) + done, size - done);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// A sandbox cgroup and the children a test forked, cleaned up whatever happens: the cgroup
// destroyed (which kills what is in it), every child killed and reaped.
class CgroupGuard {
 public:
  CgroupGuard() = default;
  CgroupGuard(const CgroupGuard&) = delete;
  CgroupGuard& operator=(const CgroupGuard&) = delete;
  ~CgroupGuard() {
    if (cgroup) {
      if (auto destroyed = cgroup->Destroy(); !destroyed) {
        ADD_FAILURE() << "cleanup: " << destroyed.error().message();
      }
    }
    for (pid_t pid : children_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    ReapOrphans();
  }

  // Forks a child that runs `body` and _exits with its result. Unless `join` is false, the
  // child is in the cgroup (AddProcess on its pid) before `body` starts. -1 on failure.
  pid_t Start(std::function<int()> body, bool join = true) {
    UniqueFd gate[2];
    if (!MakePipe(gate)) return -1;
    pid_t pid = ::fork();
    if (pid < 0) return -1;
    if (pid == 0) {
      gate[1].Reset();
      char go = 0;
      if (::read(gate[0].get(), &go, 1) != 1) ::_exit(99);
      ::_exit(body());
    }
    children_.push_back(pid);
    gate[0].Reset();
    if (join) {
      if (auto added = cgroup->AddProcess(pid); !added) {
        ADD_FAILURE() << added.error().message();
        return -1;
      }
    }
    if (::write(gate[1].get(), "g", 1) != 1) return -1;
    return pid;
  }

  // Reaps a child; its wait status, with its resource usage in `usage`.
  int Wait(pid_t pid, rusage* usage = nullptr) {
    int status = 0;
    rusage ignored;
    pid_t got = RetryEintr([&] { return ::wait4(pid, &status, 0, usage ? usage : &ignored); });
    if (got == pid) std::erase(children_, pid);
    return got == pid ? status : -1;
  }

  std::optional<SandboxCgroup> cgroup;

 private:
  std::vector<pid_t> children_;
};

class RealCgroupTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!g_real.usable) GTEST_SKIP() << g_real.skip_reason;
  }
  const CgroupLayout& layout() const { return g_real.layout; }

  // Creates a cgroup into `guard`, failing the test if it cannot.
  void CreateInto(CgroupGuard& guard, const CgroupLimits& limits, std::string id = "") {
    if (id.empty()) id = UniqueId("cgt");
    auto cgroup = SandboxCgroup::Create(layout(), id, limits);
    ASSERT_TRUE(cgroup) << cgroup.error().message();
    guard.cgroup = std::move(*cgroup);
  }

  // The directory of `controller` (v1), or the one directory (v2).
  static std::string DirFor(const SandboxCgroup& cgroup, const std::string& controller) {
    for (const auto& dir : cgroup.dirs()) {
      if (g_real.layout.version == CgroupVersion::kV2) return dir;
      if (dir.starts_with(g_real.layout.v1_parents.at(controller) + "/")) return dir;
    }
    return "<none>";
  }
};

// ---------------------------------------------------------------------------------------------
// Real cgroups

TEST_F(RealCgroupTest, DetectMatchesThisHost) {
  bool v2 = Exists(std::string(kCgroupRoot) + "/cgroup.controllers");
  if (v2) {
    EXPECT_EQ(layout().version, CgroupVersion::kV2);
    EXPECT_TRUE(layout().v2_parent.ends_with("/airlock")) << layout().v2_parent;
    EXPECT_TRUE(Exists(layout().v2_parent));
    return;
  }
  ASSERT_EQ(layout().version, CgroupVersion::kV1);
  std::string proc = Slurp("/proc/self/cgroup");
  for (std::string controller : {"memory", "cpu", "pids", "freezer"}) {
    ASSERT_TRUE(layout().v1_parents.contains(controller)) << controller;
    const std::string& parent = layout().v1_parents.at(controller);
    EXPECT_TRUE(parent.starts_with(std::string(kCgroupRoot) + "/")) << parent;
    EXPECT_TRUE(parent.ends_with("/airlock")) << parent;
    // <hierarchy><own path from /proc/self/cgroup>/airlock
    std::string own_dir = parent.substr(0, parent.size() - std::string("/airlock").size());
    EXPECT_TRUE(Exists(own_dir + "/cgroup.procs")) << own_dir;
  }
  size_t memory_line = proc.find(":memory:");
  ASSERT_NE(memory_line, std::string::npos);
  std::string own =
      Trimmed(proc.substr(memory_line + 8, proc.find('\n', memory_line) - memory_line - 8));
  if (own != "/") {
    EXPECT_NE(layout().v1_parents.at("memory").find(own), std::string::npos);
  }
}

TEST_F(RealCgroupTest, CreateAppliesLimits) {
  CgroupGuard guard;
  CreateInto(guard, {.cpus = 0.25, .memory_bytes = 64 * kMiB, .pids_max = 8});
  ASSERT_TRUE(guard.cgroup);
  const SandboxCgroup& cg = *guard.cgroup;
  for (const auto& dir : cg.dirs()) EXPECT_TRUE(Exists(dir)) << dir;
  if (layout().version == CgroupVersion::kV2) {
    ASSERT_EQ(cg.dirs().size(), 1u);
    const std::string& dir = cg.dirs()[0];
    EXPECT_EQ(Trimmed(Slurp(dir + "/memory.max")), "67108864");
    if (Exists(dir + "/memory.swap.max")) {
      EXPECT_EQ(Trimmed(Slurp(dir + "/memory.swap.max")), "0");
    }
    EXPECT_EQ(Trimmed(Slurp(dir + "/cpu.max")), "25000 100000");
    EXPECT_EQ(Trimmed(Slurp(dir + "/pids.max")), "8");
    return;
  }
  // One per hierarchy: memory, cpu, pids, freezer, and cpuacct where it is mounted apart.
  std::set<std::string> hierarchies;
  for (const auto& [controller, parent] : layout().v1_parents) hierarchies.insert(parent);
  EXPECT_EQ(cg.dirs().size(), hierarchies.size());
  EXPECT_GE(cg.dirs().size(), 4u);
  std::string memory = DirFor(cg, "memory");
  EXPECT_EQ(Trimmed(Slurp(memory + "/memory.limit_in_bytes")), "67108864");
  if (Exists(memory + "/memory.memsw.limit_in_bytes")) {
    EXPECT_EQ(Trimmed(Slurp(memory + "/memory.memsw.limit_in_bytes")), "67108864");
  }
  std::string cpu = DirFor(cg, "cpu");
  EXPECT_EQ(Trimmed(Slurp(cpu + "/cpu.cfs_period_us")), "100000");
  EXPECT_EQ(Trimmed(Slurp(cpu + "/cpu.cfs_quota_us")), "25000");
  EXPECT_EQ(Trimmed(Slurp(DirFor(cg, "pids") + "/pids.max")), "8");
  EXPECT_EQ(Trimmed(Slurp(DirFor(cg, "freezer") + "/freezer.state")), "THAWED");
}

TEST_F(RealCgroupTest, CreateOfAnExistingIdFailsAndLeavesTheFirstAlone) {
  CgroupGuard guard;
  std::string id = UniqueId("cgdup");
  CreateInto(guard, {}, id);
  ASSERT_TRUE(guard.cgroup);
  auto second = SandboxCgroup::Create(layout(), id, {});
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), ErrorCode::kAlreadyExists) << second.error().message();
  for (const auto& dir : guard.cgroup->dirs()) EXPECT_TRUE(Exists(dir)) << dir;
}

TEST_F(RealCgroupTest, FailedCreateLeavesNothing) {
  std::string id = UniqueId("cgroll");
  SandboxCgroup planned = SandboxCgroup::Open(layout(), id);
  ASSERT_FALSE(planned.dirs().empty());
  CgroupGuard guard;
  guard.cgroup = planned;  // removes the squatter below, whatever happens
  // Squat on the last directory Create makes, so that it fails after making the others.
  const std::string& last = planned.dirs().back();
  MakeDirs(last);
  auto created = SandboxCgroup::Create(layout(), id, {});
  ASSERT_FALSE(created);
  EXPECT_EQ(created.error().code(), ErrorCode::kAlreadyExists) << created.error().message();
  for (const auto& dir : planned.dirs()) {
    if (dir != last) {
      EXPECT_FALSE(Exists(dir)) << dir << " was left behind";
    }
  }
  EXPECT_TRUE(Exists(last)) << "the squatter is not Create's to remove";
}

TEST_F(RealCgroupTest, CreateRejectsBadIdsAndLimits) {
  for (const std::string& id :
       std::vector<std::string>{"", "..", "a/b", "-x", std::string(65, 'a')}) {
    auto created = SandboxCgroup::Create(layout(), id, {});
    ASSERT_FALSE(created) << id;
    EXPECT_EQ(created.error().code(), ErrorCode::kInvalidArgument) << id;
  }
  std::string id = UniqueId("cgbad");
  for (CgroupLimits limits :
       {CgroupLimits{.cpus = 0}, CgroupLimits{.cpus = -1}, CgroupLimits{.cpus = 1e9},
        CgroupLimits{.memory_bytes = 0}, CgroupLimits{.pids_max = 0}}) {
    auto created = SandboxCgroup::Create(layout(), id, limits);
    ASSERT_FALSE(created);
    EXPECT_EQ(created.error().code(), ErrorCode::kInvalidArgument) << created.error().message();
  }
  SandboxCgroup never_made = SandboxCgroup::Open(layout(), id);
  for (const auto& dir : never_made.dirs()) EXPECT_FALSE(Exists(dir)) << dir;
}

TEST_F(RealCgroupTest, AddProcessPutsAChildInEveryHierarchy) {
  CgroupGuard guard;
  CreateInto(guard, {});
  ASSERT_TRUE(guard.cgroup);
  pid_t child = guard.Start([] {
    ::pause();
    return 0;
  });
  ASSERT_GT(child, 0);
  auto pids = guard.cgroup->Processes();
  ASSERT_TRUE(pids) << pids.error().message();
  EXPECT_EQ(*pids, std::vector<pid_t>{child});
  // /proc/<pid>/cgroup names the sandbox's cgroup in every hierarchy we use.
  std::string proc = Slurp("/proc/" + std::to_string(child) + "/cgroup");
  std::string id_part = guard.cgroup->dirs()[0].substr(guard.cgroup->dirs()[0].rfind('/'));
  size_t count = 0;
  for (size_t at = proc.find("/airlock" + id_part); at != std::string::npos;
       at = proc.find("/airlock" + id_part, at + 1)) {
    ++count;
  }
  EXPECT_GE(count, layout().version == CgroupVersion::kV2 ? 1u : 4u) << proc;
}

TEST_F(RealCgroupTest, AddProcessZeroMovesTheCaller) {
  CgroupGuard guard;
  CreateInto(guard, {});
  ASSERT_TRUE(guard.cgroup);
  UniqueFd report[2];
  ASSERT_TRUE(MakePipe(report));
  const SandboxCgroup& cg = *guard.cgroup;
  pid_t child = guard.Start(
      [&] {
        char ok = cg.AddProcess(0) ? 'y' : 'n';
        if (::write(report[1].get(), &ok, 1) != 1) return 2;
        ::pause();
        return 0;
      },
      /*join=*/false);
  ASSERT_GT(child, 0);
  report[1].Reset();
  char ok = 0;
  ASSERT_TRUE(ReadWithin(report[0].get(), &ok, 1, 5000));
  EXPECT_EQ(ok, 'y');
  auto pids = cg.Processes();
  ASSERT_TRUE(pids) << pids.error().message();
  EXPECT_EQ(*pids, std::vector<pid_t>{child});
}

TEST_F(RealCgroupTest, AddProcessErrorNamesTheFileAndTheValue) {
  CgroupGuard guard;
  CreateInto(guard, {});
  ASSERT_TRUE(guard.cgroup);
  auto added = guard.cgroup->AddProcess(999999999);  // above any pid_max
  ASSERT_FALSE(added);
  EXPECT_NE(added.error().message().find("writing 999999999 to " + guard.cgroup->dirs()[0] +
                                         "/cgroup.procs: "),
            std::string::npos)
      << added.error().message();
}

TEST_F(RealCgroupTest, MemoryBombIsOomKilledAndCounted) {
  CgroupGuard guard;
  CreateInto(guard, {.memory_bytes = 64 * kMiB});
  ASSERT_TRUE(guard.cgroup);
  auto before = guard.cgroup->OomKills();
  ASSERT_TRUE(before) << before.error().message();
  EXPECT_EQ(*before, 0u);
  pid_t child = guard.Start([] {
    constexpr size_t kSize = 256 * kMiB;
    void* memory =
        ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return 2;
    auto* bytes = static_cast<volatile char*>(memory);
    for (size_t off = 0; off < kSize; off += 4096) bytes[off] = 1;
    return 0;  // survived: the limit did not hold
  });
  ASSERT_GT(child, 0);
  int status = guard.Wait(child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  auto after = guard.cgroup->OomKills();
  ASSERT_TRUE(after) << after.error().message();
  EXPECT_GE(*after, 1u);
}

TEST_F(RealCgroupTest, PidsLimitStopsForks) {
  CgroupGuard guard;
  CreateInto(guard, {.pids_max = 8});
  ASSERT_TRUE(guard.cgroup);
  UniqueFd report[2];
  ASSERT_TRUE(MakePipe(report));
  pid_t child = guard.Start([&] {
    pid_t kids[20];
    int forked = 0;
    int err = 0;
    for (; forked < 20; ++forked) {
      pid_t kid = ::fork();
      if (kid == 0) {
        ::pause();
        ::_exit(0);
      }
      if (kid < 0) {
        err = errno;
        break;
      }
      kids[forked] = kid;
    }
    int result[2] = {forked, err};
    if (::write(report[1].get(), result, sizeof result) != sizeof result) return 2;
    for (int i = 0; i < forked; ++i) {
      ::kill(kids[i], SIGKILL);
      ::waitpid(kids[i], nullptr, 0);
    }
    return 0;
  });
  ASSERT_GT(child, 0);
  report[1].Reset();
  int result[2] = {-1, -1};
  ASSERT_TRUE(ReadWithin(report[0].get(), result, sizeof result, 10000));
  RecordProperty("forks", result[0]);
  // pids.max counts the child itself: 7 more fit (fewer if the runtime has a thread).
  EXPECT_GE(result[0], 5);
  EXPECT_LE(result[0], 7);
  EXPECT_EQ(result[1], EAGAIN) << ErrnoName(result[1]);
  int status = guard.Wait(child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(RealCgroupTest, CpuQuotaHoldsASpinnerToItsShare) {
  CgroupGuard guard;
  CreateInto(guard, {.cpus = 0.25});
  ASSERT_TRUE(guard.cgroup);
  auto spin_one_second = [] {
    timespec start, now;
    ::clock_gettime(CLOCK_MONOTONIC, &start);
    volatile uint64_t n = 0;
    do {
      for (int i = 0; i < 10000; ++i) n = n + 1;
      ::clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) <
             1000000000L);
    return 0;
  };
  // The control is the same spinner outside any sandbox cgroup. It runs SCHED_FIFO where it
  // may (bounded by the kernel's RT throttling and by its 1 s), because on a busy machine (a
  // parallel build; autogroup makes nice useless) a normal spinner gets well under 0.8 s. This
  // is a containment check, not a benchmark.
  auto spin_one_second_rt = [&] {
    sched_param rt{.sched_priority = 1};
    ::sched_setscheduler(0, SCHED_FIFO, &rt);  // best effort
    return spin_one_second();
  };
  pid_t control = guard.Start(spin_one_second_rt, /*join=*/false);
  ASSERT_GT(control, 0);
  rusage usage{};
  ASSERT_EQ(guard.Wait(control, &usage), 0);
  double control_cpu = Seconds(usage.ru_utime) + Seconds(usage.ru_stime);

  pid_t limited = guard.Start(spin_one_second);
  ASSERT_GT(limited, 0);
  ASSERT_EQ(guard.Wait(limited, &usage), 0);
  double limited_cpu = Seconds(usage.ru_utime) + Seconds(usage.ru_stime);

  RecordProperty("control_cpu_ms", static_cast<int>(control_cpu * 1000));
  RecordProperty("limited_cpu_ms", static_cast<int>(limited_cpu * 1000));
  EXPECT_LT(limited_cpu, 0.45) << "0.25 cpus for 1 s of wall time";
  EXPECT_GT(control_cpu, 0.8) << "the same spinner without the cgroup";
  // And it was the quota that held it (v1 and v2 both name the count nr_throttled).
  std::string stat = Slurp(DirFor(*guard.cgroup, "cpu") + "/cpu.stat");
  size_t at = stat.find("nr_throttled ");
  ASSERT_NE(at, std::string::npos) << stat;
  EXPECT_GT(std::atol(stat.c_str() + at + 13), 0) << stat;
}

TEST_F(RealCgroupTest, FreezeStopsASpinnerAndThawResumesIt) {
  CgroupGuard guard;
  CreateInto(guard, {});
  ASSERT_TRUE(guard.cgroup);
  pid_t child = guard.Start([] {
    SpinForever();
    return 0;
  });
  ASSERT_GT(child, 0);
  SleepMs(100);
  auto frozen = guard.cgroup->Freeze();
  ASSERT_TRUE(frozen) << frozen.error().message();
  if (layout().version == CgroupVersion::kV1) {
    EXPECT_EQ(Trimmed(Slurp(DirFor(*guard.cgroup, "freezer") + "/freezer.state")), "FROZEN");
  }
  long t0 = CpuTicks(child);
  SleepMs(300);
  long t1 = CpuTicks(child);
  ASSERT_GE(t0, 0);
  EXPECT_LE(t1 - t0, 1) << "a frozen process ran";
  auto thawed = guard.cgroup->Thaw();
  ASSERT_TRUE(thawed) << thawed.error().message();
  SleepMs(300);
  long t2 = CpuTicks(child);
  RecordProperty("frozen_ticks", static_cast<int>(t1 - t0));
  RecordProperty("thawed_ticks", static_cast<int>(t2 - t1));
  EXPECT_GT(t2 - t1, 5) << "a thawed process did not run";
}

TEST_F(RealCgroupTest, KillAllKillsATreeOfForkedChildren) {
  CgroupGuard guard;
  CreateInto(guard, {});
  ASSERT_TRUE(guard.cgroup);
  UniqueFd ready[2];
  ASSERT_TRUE(MakePipe(ready));
  int ready_fd = ready[1].get();
  // 1 child, 3 children of it, 2 grandchildren each: 10 processes, each says it is up.
  pid_t child = guard.Start([ready_fd] {
    for (int i = 0; i < 3; ++i) {
      if (::fork() == 0) {
        for (int j = 0; j < 2; ++j) {
          if (::fork() == 0) {
            (void)!::write(ready_fd, "g", 1);
            while (true) ::pause();
          }
        }
        (void)!::write(ready_fd, "c", 1);
        while (true) ::pause();
      }
    }
    (void)!::write(ready_fd, "p", 1);
    while (true) ::pause();
    return 0;
  });
  ASSERT_GT(child, 0);
  ready[1].Reset();
  char up[10];
  ASSERT_TRUE(ReadWithin(ready[0].get(), up, sizeof up, 10000));
  auto pids = guard.cgroup->Processes();
  ASSERT_TRUE(pids) << pids.error().message();
  EXPECT_EQ(pids->size(), 10u);

  auto killed = guard.cgroup->KillAll(5000);
  ASSERT_TRUE(killed) << killed.error().message();
  pids = guard.cgroup->Processes();
  ASSERT_TRUE(pids);
  EXPECT_TRUE(pids->empty()) << pids->size() << " left";
  int status = guard.Wait(child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  if (layout().version == CgroupVersion::kV1) {
    EXPECT_EQ(Trimmed(Slurp(DirFor(*guard.cgroup, "freezer") + "/freezer.state")), "THAWED");
  }
}

TEST_F(RealCgroupTest, DestroyRemovesEverythingAndIsIdempotent) {
  CgroupGuard guard;
  CreateInto(guard, {});
  ASSERT_TRUE(guard.cgroup);
  pid_t child = guard.Start([] {
    SpinForever();
    return 0;
  });
  ASSERT_GT(child, 0);
  auto destroyed = guard.cgroup->Destroy();
  ASSERT_TRUE(destroyed) << destroyed.error().message();
  for (const auto& dir : guard.cgroup->dirs()) EXPECT_FALSE(Exists(dir)) << dir;
  int status = guard.Wait(child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  destroyed = guard.cgroup->Destroy();
  EXPECT_TRUE(destroyed) << destroyed.error().message();
  auto pids = guard.cgroup->Processes();
  ASSERT_TRUE(pids) << pids.error().message();
  EXPECT_TRUE(pids->empty());
}

TEST_F(RealCgroupTest, OpenAndDestroyRecoverWhatAnEarlierObjectLeft) {
  CgroupGuard guard;
  std::string id = UniqueId("cgrec");
  guard.cgroup = SandboxCgroup::Open(layout(), id);  // cleanup, should the test fail
  pid_t child = -1;
  {
    auto created = SandboxCgroup::Create(layout(), id, {});
    ASSERT_TRUE(created) << created.error().message();
    child = guard.Start([] {
      SpinForever();
      return 0;
    });
    ASSERT_GT(child, 0);
  }  // the object is gone; the cgroup and the child are not
  std::vector<std::string> listed = ListSandboxCgroups(layout());
  EXPECT_NE(std::find(listed.begin(), listed.end(), id), listed.end());

  SandboxCgroup recovered = SandboxCgroup::Open(layout(), id);
  auto pids = recovered.Processes();
  ASSERT_TRUE(pids) << pids.error().message();
  EXPECT_EQ(*pids, std::vector<pid_t>{child});
  auto destroyed = recovered.Destroy();
  ASSERT_TRUE(destroyed) << destroyed.error().message();
  for (const auto& dir : recovered.dirs()) EXPECT_FALSE(Exists(dir)) << dir;
  int status = guard.Wait(child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  listed = ListSandboxCgroups(layout());
  EXPECT_EQ(std::find(listed.begin(), listed.end(), id), listed.end());
}

TEST_F(RealCgroupTest, HundredCreateDestroyCyclesLeaveNothing) {
  std::string prefix = "sbx-cgcycle-" + std::to_string(::getpid()) + "-";
  auto count_ours = [&] {
    auto ids = ListSandboxCgroups(layout());
    return std::count_if(ids.begin(), ids.end(),
                         [&](const std::string& id) { return id.starts_with(prefix); });
  };
  ASSERT_EQ(count_ours(), 0);
  for (int i = 0; i < 100; ++i) {
    CgroupGuard guard;
    std::string id = prefix + std::to_string(i);
    CreateInto(guard, {.cpus = 0.5, .memory_bytes = 32 * kMiB, .pids_max = 16}, id);
    ASSERT_TRUE(guard.cgroup) << "cycle " << i;
    auto destroyed = guard.cgroup->Destroy();
    ASSERT_TRUE(destroyed) << "cycle " << i << ": " << destroyed.error().message();
    for (const auto& dir : guard.cgroup->dirs()) ASSERT_FALSE(Exists(dir)) << dir;
  }
  EXPECT_EQ(count_ours(), 0);
}

// ---------------------------------------------------------------------------------------------
// Fake trees: a plain directory stands in for /sys/fs/cgroup. Create writes plain files there.

class FakeCgroupTest : public testing::Test {
 protected:
  std::string Root() const { return dir_.Sub("cg"); }
  std::string ProcFile() const { return dir_.Sub("proc_self_cgroup"); }

  // cgroup2 at <root>, the daemon in /svc with a process in it.
  void MakeV2(std::string_view controllers = "cpu memory pids\n") {
    MakeDirs(Root() + "/svc");
    Put(Root() + "/cgroup.controllers", controllers);
    Put(Root() + "/cgroup.procs", "1\n");
    Put(Root() + "/cgroup.subtree_control", "");
    Put(Root() + "/svc/cgroup.type", "domain\n");
    Put(Root() + "/svc/cgroup.procs", "4242\n");
    Put(Root() + "/svc/cgroup.subtree_control", "");
    Put(ProcFile(), "0::/svc\n");
  }

  // v1 hierarchies: memory, pids and freezer with the daemon in /a, cpu mounted with cpuacct
  // and the daemon at its root; a named systemd hierarchy and an empty cgroup2 beside them.
  void MakeV1() {
    MakeDirs(Root() + "/memory/a");
    MakeDirs(Root() + "/cpu,cpuacct");
    MakeDirs(Root() + "/pids/a");
    MakeDirs(Root() + "/freezer/a");
    MakeDirs(Root() + "/systemd");
    MakeDirs(Root() + "/unified");
    Put(Root() + "/unified/cgroup.controllers", "");
    Put(ProcFile(),
        "6:memory:/a\n5:cpu,cpuacct:/\n4:pids:/a\n3:freezer:/a\n2:devices:/x\n"
        "1:name=systemd:/\n0::/\n");
  }

  TempDir dir_;
};

TEST_F(FakeCgroupTest, V2DetectMovesTheDaemonIntoALeafAndEnablesControllers) {
  MakeV2();
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_TRUE(layout) << layout.error().message();
  EXPECT_EQ(layout->version, CgroupVersion::kV2);
  EXPECT_EQ(layout->v2_parent, Root() + "/svc/airlock");
  EXPECT_TRUE(layout->v1_parents.empty());
  EXPECT_EQ(Slurp(Root() + "/svc/airlockd/cgroup.procs"), "0");
  EXPECT_EQ(Slurp(Root() + "/svc/cgroup.subtree_control"), "+memory +cpu +pids");
  EXPECT_EQ(Slurp(Root() + "/svc/airlock/cgroup.subtree_control"), "+memory +cpu +pids");
}

TEST_F(FakeCgroupTest, V2DetectInTheLeafAlreadyUsesItsParent) {
  MakeV2();
  Put(Root() + "/svc/cgroup.procs", "");
  MakeDirs(Root() + "/svc/airlockd");
  Put(ProcFile(), "0::/svc/airlockd\n");
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_TRUE(layout) << layout.error().message();
  EXPECT_EQ(layout->v2_parent, Root() + "/svc/airlock");
  EXPECT_FALSE(Exists(Root() + "/svc/airlockd/cgroup.procs")) << "nothing to move";
  EXPECT_FALSE(Exists(Root() + "/svc/airlockd/airlock"));
}

TEST_F(FakeCgroupTest, V2DetectAtTheRealRootMovesNothing) {
  MakeV2();
  Put(ProcFile(), "0::/\n");
  auto layout = CgroupLayout::Detect(Root() + "/", ProcFile());
  ASSERT_TRUE(layout) << layout.error().message();
  EXPECT_EQ(layout->v2_parent, Root() + "/airlock");
  EXPECT_FALSE(Exists(Root() + "/airlockd")) << "the root may hold processes";
  EXPECT_EQ(Slurp(Root() + "/cgroup.subtree_control"), "+memory +cpu +pids");
}

TEST_F(FakeCgroupTest, V2DetectAtANamespaceRootMovesTheDaemon) {
  MakeV2();
  // A cgroup namespace's root has a cgroup.type: the no-internal-processes rule applies.
  Put(Root() + "/cgroup.type", "domain\n");
  Put(ProcFile(), "0::/\n");
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_TRUE(layout) << layout.error().message();
  EXPECT_EQ(Slurp(Root() + "/airlockd/cgroup.procs"), "0");
}

TEST_F(FakeCgroupTest, V2CreateWritesTheLimits) {
  MakeV2();
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_TRUE(layout) << layout.error().message();
  auto cg = SandboxCgroup::Create(*layout, "sbx-fake",
                                  {.cpus = 0.25, .memory_bytes = 64 * kMiB, .pids_max = 8});
  ASSERT_TRUE(cg) << cg.error().message();
  std::string dir = Root() + "/svc/airlock/sbx-fake";
  EXPECT_EQ(cg->dirs(), std::vector<std::string>{dir});
  EXPECT_EQ(Slurp(dir + "/memory.max"), "67108864");
  EXPECT_EQ(Slurp(dir + "/memory.swap.max"), "0");
  EXPECT_EQ(Slurp(dir + "/cpu.max"), "25000 100000");
  EXPECT_EQ(Slurp(dir + "/pids.max"), "8");

  auto tiny = SandboxCgroup::Create(*layout, "sbx-tiny", {.cpus = 0.001});
  ASSERT_TRUE(tiny) << tiny.error().message();
  EXPECT_EQ(Slurp(Root() + "/svc/airlock/sbx-tiny/cpu.max"), "1000 100000") << "the floor";
  auto many = SandboxCgroup::Create(*layout, "sbx-many", {.cpus = 3});
  ASSERT_TRUE(many) << many.error().message();
  EXPECT_EQ(Slurp(Root() + "/svc/airlock/sbx-many/cpu.max"), "300000 100000");
  EXPECT_EQ(Slurp(Root() + "/svc/airlock/sbx-many/memory.max"), "536870912") << "default";
  EXPECT_EQ(Slurp(Root() + "/svc/airlock/sbx-many/pids.max"), "256") << "default";

  auto again = SandboxCgroup::Create(*layout, "sbx-fake", {});
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code(), ErrorCode::kAlreadyExists);
  EXPECT_EQ(ListSandboxCgroups(*layout),
            (std::vector<std::string>{"sbx-fake", "sbx-many", "sbx-tiny"}));
}

TEST_F(FakeCgroupTest, V2CreateRemakesAMissingParentWithControllers) {
  MakeV2();
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_TRUE(layout) << layout.error().message();
  RemoveTree(layout->v2_parent);  // as a cleanup between two sandboxes might
  auto cg = SandboxCgroup::Create(*layout, "sbx-again", {});
  ASSERT_TRUE(cg) << cg.error().message();
  EXPECT_EQ(Slurp(layout->v2_parent + "/cgroup.subtree_control"), "+memory +cpu +pids");
}

TEST_F(FakeCgroupTest, V2OomKillsAndProcessesReadTheirFiles) {
  MakeV2();
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_TRUE(layout) << layout.error().message();
  auto cg = SandboxCgroup::Create(*layout, "sbx-files", {});
  ASSERT_TRUE(cg) << cg.error().message();
  std::string dir = cg->dirs()[0];
  Put(dir + "/memory.events", "low 0\nhigh 0\nmax 9\noom 3\noom_kill 2\noom_group_kill 0\n");
  auto kills = cg->OomKills();
  ASSERT_TRUE(kills) << kills.error().message();
  EXPECT_EQ(*kills, 2u);
  Put(dir + "/memory.events", "low 0\n");
  EXPECT_FALSE(cg->OomKills());

  auto none = cg->Processes();
  ASSERT_TRUE(none) << none.error().message();
  EXPECT_TRUE(none->empty()) << "no cgroup.procs yet";
  Put(dir + "/cgroup.procs", "30\n10\n20\n");
  auto pids = cg->Processes();
  ASSERT_TRUE(pids) << pids.error().message();
  EXPECT_EQ(*pids, (std::vector<pid_t>{10, 20, 30}));
  Put(dir + "/cgroup.procs", "10\nbogus\n");
  EXPECT_FALSE(cg->Processes());
}

TEST_F(FakeCgroupTest, V1DetectResolvesEachHierarchy) {
  MakeV1();
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_TRUE(layout) << layout.error().message();
  EXPECT_EQ(layout->version, CgroupVersion::kV1);
  EXPECT_EQ(layout->v1_parents, (std::map<std::string, std::string>{
                                    {"memory", Root() + "/memory/a/airlock"},
                                    {"cpu", Root() + "/cpu,cpuacct/airlock"},
                                    {"cpuacct", Root() + "/cpu,cpuacct/airlock"},
                                    {"pids", Root() + "/pids/a/airlock"},
                                    {"freezer", Root() + "/freezer/a/airlock"},
                                }));
  EXPECT_FALSE(Exists(Root() + "/memory/a/airlock")) << "v1 Detect changes nothing";
}

TEST_F(FakeCgroupTest, V1CreateWritesTheLimits) {
  MakeV1();
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_TRUE(layout) << layout.error().message();
  auto cg = SandboxCgroup::Create(*layout, "sbx-one",
                                  {.cpus = 1.5, .memory_bytes = 536870912, .pids_max = 100});
  ASSERT_TRUE(cg) << cg.error().message();
  EXPECT_EQ(cg->dirs().size(), 4u);
  std::string memory = Root() + "/memory/a/airlock/sbx-one";
  EXPECT_EQ(Slurp(memory + "/memory.limit_in_bytes"), "536870912");
  EXPECT_EQ(Slurp(memory + "/memory.memsw.limit_in_bytes"), "536870912");
  std::string cpu = Root() + "/cpu,cpuacct/airlock/sbx-one";
  EXPECT_EQ(Slurp(cpu + "/cpu.cfs_period_us"), "100000");
  EXPECT_EQ(Slurp(cpu + "/cpu.cfs_quota_us"), "150000");
  EXPECT_EQ(Slurp(Root() + "/pids/a/airlock/sbx-one/pids.max"), "100");
  EXPECT_TRUE(Exists(Root() + "/freezer/a/airlock/sbx-one"));

  auto tiny = SandboxCgroup::Create(*layout, "sbx-tiny", {.cpus = 0.0001});
  ASSERT_TRUE(tiny) << tiny.error().message();
  EXPECT_EQ(Slurp(Root() + "/cpu,cpuacct/airlock/sbx-tiny/cpu.cfs_quota_us"), "1000");

  Put(memory + "/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n");
  auto kills = cg->OomKills();
  ASSERT_TRUE(kills) << kills.error().message();
  EXPECT_EQ(*kills, 4u);

  // Processes is the union over the hierarchies.
  Put(memory + "/cgroup.procs", "11\n10\n");
  Put(Root() + "/pids/a/airlock/sbx-one/cgroup.procs", "11\n12\n");
  auto pids = cg->Processes();
  ASSERT_TRUE(pids) << pids.error().message();
  EXPECT_EQ(*pids, (std::vector<pid_t>{10, 11, 12}));

  Put(Root() + "/pids/a/airlock/not-a-dir", "");
  MakeDirs(Root() + "/memory/a/airlock/sbx-memory-only");
  EXPECT_EQ(ListSandboxCgroups(*layout),
            (std::vector<std::string>{"sbx-memory-only", "sbx-one", "sbx-tiny"}));
}

TEST_F(FakeCgroupTest, V1CreateThatFailsRemovesWhatItMade) {
  MakeV1();
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_TRUE(layout) << layout.error().message();
  MakeDirs(Root() + "/pids/a/airlock/sbx-clash");  // pids comes last
  auto cg = SandboxCgroup::Create(*layout, "sbx-clash", {});
  ASSERT_FALSE(cg);
  EXPECT_EQ(cg.error().code(), ErrorCode::kAlreadyExists);
  EXPECT_NE(cg.error().message().find(Root() + "/pids/a/airlock/sbx-clash"), std::string::npos)
      << cg.error().message();
  EXPECT_FALSE(Exists(Root() + "/memory/a/airlock/sbx-clash"));
  EXPECT_FALSE(Exists(Root() + "/cpu,cpuacct/airlock/sbx-clash"));
  EXPECT_FALSE(Exists(Root() + "/freezer/a/airlock/sbx-clash"));
  EXPECT_TRUE(Exists(Root() + "/pids/a/airlock/sbx-clash"));
}

TEST_F(FakeCgroupTest, V1WriteErrorsNameTheFileAndTheValue) {
  MakeV1();
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_TRUE(layout) << layout.error().message();
  SandboxCgroup cg = SandboxCgroup::Open(*layout, "sbx-nothere");
  auto added = cg.AddProcess(1234);
  ASSERT_FALSE(added);
  EXPECT_EQ(added.error().message(),
            "writing 1234 to " + Root() +
                "/cpu,cpuacct/airlock/sbx-nothere/cgroup.procs: ENOENT (No such file or "
                "directory)");
  // Gone altogether: nothing to kill, nothing to remove.
  EXPECT_TRUE(cg.Destroy());
}

TEST_F(FakeCgroupTest, DetectFailsWithoutUsableCgroups) {
  MakeDirs(Root());
  Put(ProcFile(), "0::/\n");
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_FALSE(layout);
  EXPECT_EQ(layout.error().code(), ErrorCode::kUnavailable);
  EXPECT_NE(layout.error().message().find(Root()), std::string::npos) << layout.error().message();

  // cgroup2 without the pids controller is not enough, and there is no v1 to fall back on.
  MakeV2("cpu memory\n");
  layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_FALSE(layout);
  EXPECT_EQ(layout.error().code(), ErrorCode::kUnavailable);

  auto missing = CgroupLayout::Detect(Root(), dir_.Sub("no-such-file"));
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
}

TEST_F(FakeCgroupTest, V1DetectNeedsOwnCgroupInEveryHierarchy) {
  MakeV1();
  Put(ProcFile(), "6:memory:/a\n5:cpu,cpuacct:/\n3:freezer:/a\n0::/\n");  // no pids line
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_FALSE(layout);
  EXPECT_NE(layout.error().message().find("pids"), std::string::npos) << layout.error().message();
  Put(ProcFile(), "6:memory:/gone\n5:cpu,cpuacct:/\n4:pids:/a\n3:freezer:/a\n0::/\n");
  layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_FALSE(layout);
  EXPECT_NE(layout.error().message().find(Root() + "/memory/gone"), std::string::npos)
      << layout.error().message();
}

TEST_F(FakeCgroupTest, OpenOfAnInvalidIdHasNothingToActOn) {
  MakeV1();
  auto layout = CgroupLayout::Detect(Root(), ProcFile());
  ASSERT_TRUE(layout) << layout.error().message();
  for (std::string id : {"..", "", "a/../../b"}) {
    SandboxCgroup cg = SandboxCgroup::Open(*layout, id);
    EXPECT_TRUE(cg.dirs().empty()) << id;
    EXPECT_TRUE(cg.Destroy()) << id;
    EXPECT_FALSE(cg.AddProcess(1)) << id;
  }
  EXPECT_TRUE(Exists(Root() + "/memory/a")) << "nothing removed";
}

}  // namespace
}  // namespace airlock::jail
