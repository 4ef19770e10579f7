// The hostile payload suite (shared/SECURITY.md, "Test classes"): airlock-payload is uploaded
// into real sandboxes of a real airlockd through the files API and run through the exec API,
// one test per class. Every attempt is judged here, on the host, and recorded as a Verdict in
// the report (build/security-report/payloads.{md,json} under ctest); every deny sits beside a
// positive control that shows the same mechanism working where it should; and after every
// attempt two host canary files (random names and contents, one beside the daemon's state dir,
// one in /tmp) must have their content and mtime unchanged. Needs root (skips otherwise).

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <random>
#include <set>
#include <thread>

#include "runtime/jail/contain.h"
#include "runtime/jail/posture.h"
#include "runtime/registry.h"
#include "security/report.h"
#include "support/airlockd.h"
#include "support/host_usr_canaries.h"
#include "support/tenancy.h"

namespace airlock::security {
namespace {

using airlock::testing::Daemon;
using airlock::testing::Reply;
namespace fs = std::filesystem;
namespace http = boost::beast::http;
using nlohmann::json;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The payload's hash (FNV-1a 64) of a file's bytes, to compare with what a payload read.
std::string Fnv(const std::string& data) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string Random(size_t n) {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::string s;
  for (size_t i = 0; i < n; ++i) s += kChars[rd() % 36];
  return s;
}

// A host file no sandbox may read or change.
struct Canary {
  std::string path, content;
  timespec mtime{};

  void Make(const std::string& dir) {
    fs::create_directories(dir);
    path = dir + "/canary-" + Random(12);
    content = "airlock host canary " + Random(32) + "\n";
    std::ofstream(path) << content;
    struct stat st {};
    ::stat(path.c_str(), &st);
    mtime = st.st_mtim;
  }
  // Content and mtime as made.
  bool Intact() const {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return false;
    return Slurp(path) == content && st.st_mtim.tv_sec == mtime.tv_sec &&
           st.st_mtim.tv_nsec == mtime.tv_nsec;
  }
  std::string dir() const { return fs::path(path).parent_path(); }
  std::string name() const { return fs::path(path).filename(); }
};

// Every test runs once per engine of this build (runtime/engines.cc), on the same daemon: its
// sandboxes are made with "engine" set. An engine the daemon lists as unavailable skips with the
// daemon's reason; checks made from the host that only the jail can answer (its posture, its
// agent's host pid) skip on the others, whose own posture checks come with them.
class PayloadsTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    if (::geteuid() != 0) return;
    char tmpl[] = "/tmp/airlock-payloads-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    fs::permissions(*dir_, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    canaries_ = new Canary[2];
    canaries_[0].Make(*dir_ + "/host");           // beside the daemon's state dir
    canaries_[1].Make("/tmp/airlock-canary-" + Random(8));  // a host dir of its own
    payload_ = new std::string(Slurp(AIRLOCK_PAYLOAD_PATH));
    agent_fnv_ = new std::string(Fnv(Slurp(AIRLOCK_AGENT_PATH)));
    daemon_ = new Daemon(*dir_ + "/state", testing::kWithGvisor);
    auto started = daemon_->Start();
    if (!started) {
      start_error_ = new std::string(started.message());
      return;
    }
    Report::Global().Note("kernel: " + Kernel());
    Reply engines = daemon_->Call(http::verb::get, "/v1/engines");
    if (engines.status != 200) {
      start_error_ = new std::string("GET /v1/engines: " + std::to_string(engines.status) + " " +
                                     engines.body);
      return;
    }
    engines_ = new json(engines.Json()["engines"]);
  }
  static void TearDownTestSuite() {
    if (daemon_ != nullptr) {
      if (daemon_->running()) daemon_->Stop(SIGTERM);
      delete daemon_;
      daemon_ = nullptr;
    }
    if (canaries_ != nullptr) {
      std::error_code ec;
      fs::remove_all(canaries_[1].dir(), ec);
      delete[] canaries_;
      canaries_ = nullptr;
    }
    if (dir_ != nullptr) {
      std::error_code ec;
      fs::remove_all(*dir_, ec);
      delete dir_;
      dir_ = nullptr;
    }
  }
  void SetUp() override {
    engine_ = GetParam();
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: airlockd makes namespaces and cgroups";
    ASSERT_EQ(start_error_, nullptr) << *start_error_;
    ASSERT_FALSE(payload_->empty()) << "no payload at " << AIRLOCK_PAYLOAD_PATH;
    const json* listed = nullptr;
    for (const json& e : *engines_) {
      if (e.value("name", "") == engine_) listed = &e;
    }
    ASSERT_NE(listed, nullptr) << "airlockd does not list the " << engine_ << " engine";
    if (!listed->value("available", false)) {
      GTEST_SKIP() << "the " << engine_ << " engine is unavailable here: "
                   << listed->value("reason", "");
    }
    Report::Global().Note("engine: " + engine_);
  }
  // Checks made from the host that know the jail's layout (its agent is a host process in the
  // sandbox's cgroup): another engine brings its own.
  static constexpr const char* kJailOnly =
      "this check reads the jail's processes from the host; another engine brings its own";
  void TearDown() override {
    for (const std::string& id : made_) {
      EXPECT_EQ(daemon_->Call(http::verb::delete_, "/v1/sandboxes/" + id).status, 204);
    }
    if (HasFailure()) std::fprintf(stderr, "--- airlockd log ---\n%s", daemon_->Log().c_str());
  }

  static std::string Kernel() {
    std::string release = Slurp("/proc/sys/kernel/osrelease");
    if (!release.empty() && release.back() == '\n') release.pop_back();
    return release;
  }

  // A new sandbox with the payload at /home/user/payload; deleted when the test ends.
  std::string Make(json body = json::object()) {
    body["engine"] = engine_;
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes", body.dump());
    EXPECT_EQ(r.status, 201) << r.body;
    if (r.status != 201) return "";
    const std::string id = r.Json()["id"];
    made_.push_back(id);
    Reply put = daemon_->Call(http::verb::put,
                              "/v1/sandboxes/" + id + "/files?path=/home/user/payload&mode=0755",
                              *payload_);
    EXPECT_EQ(put.status, 200) << put.body;
    return id;
  }

  Reply Exec(const std::string& id, const json& request) {
    return daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec", request.dump());
  }

  // Runs the payload with `attempts` as `user`; the result line of each attempt, by attempt.
  std::map<std::string, json> Run(const std::string& id, const std::vector<std::string>& attempts,
                                   const std::string& user = "user") {
    json argv = json::array({"/home/user/payload"});
    for (const auto& a : attempts) argv.push_back(a);
    Reply r = Exec(id, {{"argv", argv}, {"user", user}, {"timeout_seconds", 120}});
    EXPECT_EQ(r.status, 200) << r.body;
    return Parse(r.Json().value("stdout", ""));
  }

  static std::map<std::string, json> Parse(const std::string& out) {
    std::map<std::string, json> by_attempt;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      json j = json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("attempt")) by_attempt[j["attempt"]] = j;
    }
    return by_attempt;
  }

  // Both canaries as made.
  static bool CanariesIntact() { return canaries_[0].Intact() && canaries_[1].Intact(); }

  // Records a verdict (contained only if the canaries are intact too) and fails the test if
  // the attack was not contained.
  static void Judge(const std::string& klass, const std::string& name, bool contained,
                    const std::string& detail) {
    const bool canaries = CanariesIntact();
    Verdict v{klass, name, contained && canaries,
              detail + (canaries ? "" : " [HOST CANARY CHANGED]"), engine_};
    EXPECT_TRUE(v.contained) << klass << ": " << name << ": " << v.detail;
    Report::Global().Add(std::move(v));
  }
  static void Judge(const std::string& klass, const std::string& name, const json& result,
                    bool contained) {
    Judge(klass, name, contained, result.is_null() ? "no result line" : result.dump());
  }

  // The attempt failed with exactly `err`.
  static bool Failed(const json& r, const std::string& err) {
    return r.is_object() && r.value("ret", 0) < 0 && r.value("errno", "") == err;
  }
  static bool Succeeded(const json& r) {
    return r.is_object() && !r.contains("signal") && !r.contains("error") && r.value("ret", -1) >= 0;
  }

  // The host pids in a sandbox's cgroup (the pids hierarchy on v1, the one cgroup on v2).
  static std::vector<pid_t> SandboxPids(const std::string& id) {
    std::vector<pid_t> pids;
    for (const std::string& dir : airlock::testing::CgroupsNamed(id)) {
      if (dir.find("/pids/") == std::string::npos && fs::exists("/sys/fs/cgroup/pids")) continue;
      std::istringstream in(Slurp(dir + "/cgroup.procs"));
      for (pid_t pid; in >> pid;) pids.push_back(pid);
      break;
    }
    return pids;
  }
  static pid_t AgentPid(const std::string& id) {
    for (pid_t pid : SandboxPids(id)) {
      if (jail::IsNamespaceInit(pid)) return pid;
    }
    return 0;
  }

  static inline std::string* dir_ = nullptr;
  static inline std::string* start_error_ = nullptr;
  static inline std::string* payload_ = nullptr;
  static inline std::string* agent_fnv_ = nullptr;
  static inline Canary* canaries_ = nullptr;
  static inline Daemon* daemon_ = nullptr;
  static inline json* engines_ = nullptr;  // GET /v1/engines' list
  static inline std::string engine_;       // the engine of the test that runs
  std::vector<std::string> made_;
};

// ---------------------------------------------------------------------------------------------

// Whether this host's kernel serves int $0x80 at all (its i386 entry; ia32_emulation): asked
// from a child of the test, outside any sandbox and filter.
bool HostServesI386() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGSEGV, SIG_DFL);
    long r = 20;  // getpid on i386
    asm volatile("int $0x80" : "+a"(r) : : "memory");
    ::_exit(0);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return true;
  return !(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
}

TEST_P(PayloadsTest, HostFiles) {
  // In the host's /usr/local and /usr/src, which a sandbox does not see, and /usr/bin, which it
  // does (read-only): removed when the test ends, whatever its outcome.
  const testing::HostUsrCanaries usr;
  ASSERT_EQ(usr.error(), "");
  const std::string id = Make();
  const Canary& a = canaries_[0];
  const Canary& b = canaries_[1];
  const std::string shadow_fnv = Fnv(Slurp("/etc/shadow"));
  // A read is contained if it fails or reads something other than the host's file.
  struct Read {
    std::string path, host_fnv;
  };
  std::vector<Read> reads = {
      {"/etc/shadow", shadow_fnv},
      {a.path, Fnv(a.content)},
      {b.path, Fnv(b.content)},
      {"/proc/1/root" + a.path, Fnv(a.content)},
      {"/proc/1/root/etc/shadow", shadow_fnv},
      {"/proc/self/root" + b.path, Fnv(b.content)},
      {"/proc/1/cwd/../../../../.." + a.path, Fnv(a.content)},
      {usr.local(), Fnv(usr.content())},
  };
  if (!usr.src().empty()) reads.push_back({usr.src(), Fnv(usr.content())});
  for (const std::string user : {"user", "root"}) {
    const std::string home = user == "root" ? "/root" : "/home/user";
    std::vector<std::string> attempts;
    for (const Read& r : reads) attempts.push_back("read:" + r.path);
    attempts.insert(attempts.end(),
                    {"create:/usr/airlock-x", "create:/usr/bin/airlock-x", "create:/bin/airlock-x",
                     "openw:/proc/sys/kernel/hostname", "append:" + a.path, "create:" + b.path,
                     "mknod:/tmp/sda-" + user,
                     // Positive controls: its own files read and write, and the host's
                     // /usr/bin reads.
                     "read:/etc/passwd", "create:" + home + "/own", "create:/tmp/own-" + user,
                     "read:" + usr.bin()});
    auto got = Run(id, attempts, user);
    for (const Read& r : reads) {
      const json& res = got["read:" + r.path];
      Judge("host files", "read " + r.path + " as " + user, res,
            res.is_object() && (res.value("ret", 0) < 0 || res.value("fnv", "") != r.host_fnv));
    }
    for (const char* path : {"/usr/airlock-x", "/usr/bin/airlock-x", "/bin/airlock-x"}) {
      const json& res = got[std::string("create:") + path];
      Judge("host files", std::string("write the read-only ") + path + " as " + user, res,
            Failed(res, "EROFS") || Failed(res, "EACCES"));
    }
    const json& hostname = got["openw:/proc/sys/kernel/hostname"];
    Judge("host files", "open /proc/sys/kernel/hostname for writing as " + user, hostname,
          Failed(hostname, "EROFS") || Failed(hostname, "EACCES"));
    // Where the canaries are on the host is nothing inside: the writes fail or stay inside.
    Judge("host files", "append to the host canary's path as " + user, got["append:" + a.path],
          true);
    Judge("host files", "create the host canary's path as " + user, got["create:" + b.path],
          true);
    const std::string node = "mknod:/tmp/sda-" + user;
    Judge("host files", "mknod a block device (8:0) as " + user, got[node],
          Failed(got[node], "EPERM"));
    for (const std::string& own : {std::string("read:/etc/passwd"), "create:" + home + "/own",
                                   "create:/tmp/own-" + user}) {
      Judge("host files", "positive control: " + own + " as " + user, got[own],
            Succeeded(got[own]));
    }
    const json& listed = got["read:" + usr.bin()];
    Judge("host files", "positive control: read a canary in the host's /usr/bin as " + user,
          listed, Succeeded(listed) && listed.value("fnv", "") == Fnv(usr.content()));
  }
}

TEST_P(PayloadsTest, FdAndCwdLeaks) {
  const std::string id = Make();
  const Canary& a = canaries_[0];
  // Processes to look at: background ones with a cwd of their own, as user and as root.
  for (const std::string user : {"user", "root"}) {
    Reply bg = Exec(id, {{"argv", {"sleep", "60"}}, {"background", true}, {"cwd", "/tmp"},
                         {"user", user}});
    ASSERT_EQ(bg.status, 200) << bg.body;
  }
  for (const std::string user : {"user", "root"}) {
    auto got = Run(id, {"fds", "procs:" + a.path, "cwdwalk:" + a.path}, user);
    const json& fds = got["fds"];
    bool stdio_only = fds.is_object() && fds.contains("fds");
    for (const auto& f : fds.value("fds", json::array())) {
      const std::string s = f.get<std::string>();
      stdio_only &= s.starts_with("0=") || s.starts_with("1=") || s.starts_with("2=");
    }
    Judge("fd / cwd leaks", "a command's open fds are stdio only (" + user + ")", fds, stdio_only);

    const json& procs = got["procs:" + a.path];
    Judge("fd / cwd leaks", "'..' walks from every process's cwd, root and fds end at the sandbox root (" + user + ")",
          procs, procs.value("escaped", -1) == 0 && procs.value("canary_hits", -1) == 0);
    // The agent's cwd and root are closed on every engine; its descriptors too on the jail (the
    // kernel's ptrace check refuses a command without capabilities the agent's). gVisor's procfs
    // (20221219) lists and opens another process's descriptors without that check: there what
    // they lead to is judged instead (the walks above, and the fill of its stdio below).
    const bool fds_open_here = engine_ == "gvisor";
    bool agent_denied = procs.contains("links");
    size_t agent_links = 0;
    for (const auto& l : procs.value("links", json::array())) {
      const std::string s = l.get<std::string>();
      if (!s.starts_with("1/") || (fds_open_here && s.starts_with("1/fd/"))) continue;
      ++agent_links;
      agent_denied &= s.ends_with("=EACCES") || s.ends_with("=EPERM");
    }
    Judge("fd / cwd leaks",
          std::string("the agent's cwd, root") + (fds_open_here ? "" : " and fds") +
              " (/proc/1/...) are closed to a command (" + user + ")",
          procs, agent_denied && agent_links >= 2);
    // Positive control: the same walk opened other processes' cwd and root (a child of the
    // payload's own on every engine; on the jail the sleepers' too, its own user's or all as
    // root) and saw them end at this sandbox's root.
    Judge("fd / cwd leaks", "positive control: the walk opens other commands' cwd and root (" + user + ")",
          procs, procs.value("opened", 0) >= 2);
    const json& cwd = got["cwdwalk:" + a.path];
    Judge("fd / cwd leaks", "'..' from the cwd ends at the sandbox root (" + user + ")", cwd,
          cwd.value("cwd_top_is_own_root", false) && !cwd.value("cwd_canary_opened", true));
  }

  // The agent's stdio, written through /proc as root: refused, or bounded by the sandbox's own
  // disk cap (on gVisor they are a file of the host's, which must not be the host's disk to fill).
  constexpr int kDiskMb = 16, kFillMb = 3 * kDiskMb;
  const std::string small = Make({{"disk_mb", kDiskMb}});
  const std::vector<std::string> fills = {"fill:/proc/1/fd/1:" + std::to_string(kFillMb),
                                          "fill:/proc/1/fd/2:" + std::to_string(kFillMb),
                                          "fill:/tmp/own:1"};
  auto filled = Run(small, fills, "root");
  for (const std::string& f : {fills[0], fills[1]}) {
    const json& res = filled[f];
    const bool refused = res.value("ret", 0) < 0;
    const bool capped = res.value("written", int64_t{-1}) >= 0 &&
                        res.value("written", int64_t{-1}) <= int64_t{kDiskMb} << 20 &&
                        res.contains("write_errno");
    Judge("fd / cwd leaks", "write " + std::to_string(kFillMb) + " MiB to the agent's " + f.substr(5, 12) +
              " (root, disk cap " + std::to_string(kDiskMb) + " MiB)",
          res, res.is_object() && (refused || capped));
  }
  Judge("fd / cwd leaks", "positive control: the fill writes a file of its own", filled[fills[2]],
        filled[fills[2]].value("written", 0) == 1 << 20);
}

TEST_P(PayloadsTest, ProcSelfExeOverwrite) {
  const std::string id = Make();
  ASSERT_EQ(Fnv(Slurp(AIRLOCK_AGENT_PATH)), *agent_fnv_);
  // The payload scans every /proc/<pid>/exe for 3 s while commands start (each is the agent's
  // child between its fork and its exec): CVE-2019-5736.
  std::map<std::string, json> got;
  std::atomic<bool> done = false;
  std::thread racer([&] {
    got = Run(id, {"exerace:2", "selfexe", "read:/proc/self/exe"}, "root");
    done = true;
  });
  int execs = 0;
  while (!done) {
    Reply r = Exec(id, {{"argv", {"true"}}});
    EXPECT_EQ(r.status, 200) << r.body;
    ++execs;
  }
  racer.join();
  const json& race = got["exerace:2"];
  Judge("/proc/self/exe overwrite", "open every /proc/<pid>/exe for writing while " +
            std::to_string(execs) + " commands start (root)",
        race, race.value("write_opens", -1) == 0 && race.value("tries", 0) > 0);
  Judge("/proc/self/exe overwrite", "open the agent's /proc/1/exe for reading (root)", race,
        race.value("agent_reads", -1) == 0);
  Judge("/proc/self/exe overwrite", "open its own /proc/self/exe for writing", got["selfexe"],
        Failed(got["selfexe"], "ETXTBSY") || Failed(got["selfexe"], "EACCES"));
  Judge("/proc/self/exe overwrite", "positive control: read its own /proc/self/exe",
        got["read:/proc/self/exe"], Succeeded(got["read:/proc/self/exe"]) &&
                                        got["read:/proc/self/exe"].value("fnv", "") ==
                                            Fnv(payload_->substr(0, 1 << 20)));  // it reads 1 MiB
  const std::string after = Fnv(Slurp(AIRLOCK_AGENT_PATH));
  Judge("/proc/self/exe overwrite", "the agent binary on the host is unchanged", after == *agent_fnv_,
        "fnv " + after + " (before " + *agent_fnv_ + ")");
}

TEST_P(PayloadsTest, SeccompTable) {
  const std::string id = Make();
  // shared/SECURITY.md's table: the result each denied syscall must give.
  const std::vector<std::pair<std::string, std::string>> denied = {
      {"unshare", "EPERM"},         {"setns", "EPERM"},          {"mount", "EPERM"},
      {"umount2", "EPERM"},         {"pivot_root", "EPERM"},     {"chroot", "EPERM"},
      {"reboot", "EPERM"},          {"kexec_load", "EPERM"},     {"kexec_file_load", "EPERM"},
      {"init_module", "EPERM"},     {"finit_module", "EPERM"},   {"delete_module", "EPERM"},
      {"swapon", "EPERM"},          {"swapoff", "EPERM"},        {"acct", "EPERM"},
      {"quotactl", "EPERM"},        {"syslog", "EPERM"},         {"settimeofday", "EPERM"},
      {"clock_settime", "EPERM"},   {"sethostname", "EPERM"},    {"setdomainname", "EPERM"},
      {"vhangup", "EPERM"},         {"iopl", "EPERM"},           {"ioperm", "EPERM"},
      {"modify_ldt", "EPERM"},      {"uselib", "EPERM"},         {"ustat", "EPERM"},
      {"sysfs", "EPERM"},           {"_sysctl", "EPERM"},        {"lookup_dcookie", "EPERM"},
      {"personality", "EPERM"},     {"personality_no_aslr", "EPERM"},
      {"ptrace", "EPERM"},          {"process_vm_readv", "EPERM"},
      {"process_vm_writev", "EPERM"}, {"kcmp", "EPERM"},         {"pidfd_getfd", "EPERM"},
      {"process_madvise", "EPERM"}, {"bpf", "EPERM"},            {"perf_event_open", "EPERM"},
      {"userfaultfd", "EPERM"},     {"add_key", "EPERM"},        {"keyctl", "EPERM"},
      {"request_key", "EPERM"},     {"fanotify_init", "EPERM"},  {"open_by_handle_at", "EPERM"},
      {"name_to_handle_at", "EPERM"}, {"mbind", "EPERM"},        {"set_mempolicy", "EPERM"},
      {"migrate_pages", "EPERM"},   {"move_pages", "EPERM"},
      {"clone3", "ENOSYS"},         {"open_tree", "ENOSYS"},     {"move_mount", "ENOSYS"},
      {"fsopen", "ENOSYS"},         {"fsconfig", "ENOSYS"},      {"fsmount", "ENOSYS"},
      {"fspick", "ENOSYS"},         {"mount_setattr", "ENOSYS"}, {"io_uring_setup", "ENOSYS"},
      {"io_uring_enter", "ENOSYS"}, {"io_uring_register", "ENOSYS"},
  };
  const std::vector<std::string> allowed = {"getpid", "personality_query", "personality_linux",
                                            "uname", "fork", "pidfd_open_self", "socketpair_unix"};
  // clone with each CLONE_NEW* flag -> EPERM; plain clone (fork) works.
  const std::vector<std::pair<std::string, std::string>> clones = {
      {"0x10000000", "CLONE_NEWUSER"}, {"0x20000", "CLONE_NEWNS"},
      {"0x20000000", "CLONE_NEWPID"},  {"0x40000000", "CLONE_NEWNET"},
      {"0x4000000", "CLONE_NEWUTS"},   {"0x8000000", "CLONE_NEWIPC"},
      {"0x2000000", "CLONE_NEWCGROUP"}};
  // socket(family, type, protocol) -> the errno; high bits set on the family must not help.
  const std::vector<std::tuple<std::string, std::string, std::string>> sockets = {
      {"17:3:0", "AF_PACKET", "EAFNOSUPPORT"},
      {"0x100000011:3:0", "AF_PACKET with high bits set", "EAFNOSUPPORT"},
      {"40:1:0", "AF_VSOCK", "EAFNOSUPPORT"},
      {"38:5:0", "AF_ALG", "EAFNOSUPPORT"},
      {"15:3:2", "AF_KEY", "EAFNOSUPPORT"},
      {"2:3:1", "AF_INET SOCK_RAW", "EPERM"},
      {"10:3:58", "AF_INET6 SOCK_RAW", "EPERM"},
      {"2:10:0", "AF_INET SOCK_PACKET", "EPERM"},
      {"16:3:9", "AF_NETLINK NETLINK_AUDIT", "EPROTONOSUPPORT"},
      {"16:3:15", "AF_NETLINK NETLINK_KOBJECT_UEVENT", "EPROTONOSUPPORT"},
  };
  const std::vector<std::pair<std::string, std::string>> sockets_allowed = {
      {"1:1:0", "AF_UNIX"}, {"2:1:0", "AF_INET SOCK_STREAM"}, {"10:2:0", "AF_INET6 SOCK_DGRAM"},
      {"16:3:0", "AF_NETLINK NETLINK_ROUTE"}};
  // ioctl on stdin (/dev/null): TIOCSTI and TIOCLINUX -> EPERM whatever the high bits; any
  // other request reaches the kernel (ENOTTY on /dev/null).
  const std::vector<std::string> ioctls_denied = {"0x5412", "0x100005412", "0xffffffff00005412",
                                                  "0x541c", "0x10000541c"};
  const std::vector<std::string> ioctls_allowed = {"0x5413", "0x541b"};

  std::vector<std::string> attempts = {"x32", "i386"};
  for (const auto& [name, err] : denied) attempts.push_back("sys:" + name);
  for (const auto& name : allowed) attempts.push_back("sys:" + name);
  for (const auto& [flags, name] : clones) attempts.push_back("clone:" + flags);
  attempts.push_back("clone:0");
  for (const auto& [args, name, err] : sockets) attempts.push_back("socket:" + args);
  for (const auto& [args, name] : sockets_allowed) attempts.push_back("socket:" + args);
  for (const auto& r : ioctls_denied) attempts.push_back("ioctl:" + r);
  for (const auto& r : ioctls_allowed) attempts.push_back("ioctl:" + r);

  auto got = Run(id, attempts, "root");
  const std::string k = "seccomp table";
  Judge(k, "x32 syscall ABI kills the process", got["x32"], got["x32"].value("signal", "") == "SIGSYS");
  // gVisor's kernel has no i386 ABI: int 0x80 never reaches a kernel as an i386 call (the Sentry
  // takes the number as a 64-bit one, 20 = writev, which fails on its arguments); the jail's
  // filter kills it. Either way i386 getpid is not served.
  // A host kernel without the i386 entry (ia32_emulation off) answers int $0x80 with SIGSEGV
  // before any system call table, the filter's included, is looked at: that too is not served.
  const json& i386 = got["i386"];
  const bool no_entry = !HostServesI386() && i386.value("signal", "") == "SIGSEGV";
  if (engine_ == "gvisor") {
    Judge(k, "i386 syscall ABI is not served (gVisor's kernel has none)", i386,
          i386.value("signal", "") == "SIGSYS" || i386.value("ret", 0) < 0 || no_entry);
  } else {
    Judge(k, "i386 syscall ABI kills the process", i386,
          i386.value("signal", "") == "SIGSYS" || no_entry);
  }
  for (const auto& [name, err] : denied) {
    Judge(k, name + " -> " + err, got["sys:" + name], Failed(got["sys:" + name], err));
  }
  // What gVisor's kernel (20221219) lacks itself: the filter lets the call through, and the
  // Sentry answers it so.
  const std::map<std::string, std::string> sentry_lacks =
      engine_ == "gvisor" ? std::map<std::string, std::string>{{"personality_query", "EINVAL"},
                                                               {"personality_linux", "EINVAL"},
                                                               {"pidfd_open_self", "ENOSYS"}}
                          : std::map<std::string, std::string>{};
  for (const auto& name : allowed) {
    const json& res = got["sys:" + name];
    auto lacks = sentry_lacks.find(name);
    if (lacks != sentry_lacks.end()) {
      Judge(k, "positive control: " + name + " passes the filter (gVisor answers " +
                   lacks->second + ")",
            res, Succeeded(res) || Failed(res, lacks->second));
    } else {
      Judge(k, "positive control: " + name + " works", res, Succeeded(res));
    }
  }
  for (const auto& [flags, name] : clones) {
    Judge(k, "clone(" + name + ") -> EPERM", got["clone:" + flags],
          Failed(got["clone:" + flags], "EPERM"));
  }
  Judge(k, "positive control: clone without namespace flags", got["clone:0"],
        Succeeded(got["clone:0"]));
  for (const auto& [args, name, err] : sockets) {
    Judge(k, "socket " + name + " -> " + err, got["socket:" + args],
          Failed(got["socket:" + args], err));
  }
  for (const auto& [args, name] : sockets_allowed) {
    Judge(k, "positive control: socket " + name, got["socket:" + args],
          Succeeded(got["socket:" + args]));
  }
  for (const auto& r : ioctls_denied) {
    Judge(k, "ioctl " + r + " (TIOCSTI / TIOCLINUX) -> EPERM", got["ioctl:" + r],
          Failed(got["ioctl:" + r], "EPERM"));
  }
  for (const auto& r : ioctls_allowed) {
    const json& res = got["ioctl:" + r];
    Judge(k, "positive control: ioctl " + r + " reaches the kernel", res,
          res.is_object() && res.value("errno", "") != "EPERM" && !res.contains("signal"));
  }
}

TEST_P(PayloadsTest, NestedNamespaces) {
  const std::string id = Make();
  const std::string k = "nested namespaces";
  // unshare(1) as the sandbox's root: refused. On the host the same command works.
  for (const char* cmd : {"unshare -Ur true", "unshare -Urm true", "unshare -Urn true"}) {
    Reply r = Exec(id, {{"cmd", cmd}, {"user", "root"}});
    const json res = r.Json();
    Judge(k, std::string(cmd) + " (root)", res, r.status == 200 && res.value("exit_code", 0) != 0);
  }
  auto host = airlock::testing::RunProcess({"/usr/bin/unshare", "-Ur", "true"}, {});
  Judge(k, "positive control: unshare -Ur true on the host", host.exit_code() == 0,
        "exit " + std::to_string(host.exit_code()) + " " + host.err);

  auto got = Run(id, {"mount:cgroup:/tmp/cg:cgroup:memory", "mount:cgroup2:/tmp/cg2:cgroup2",
                      "mount:overlay:/tmp/ov:overlay:lowerdir=/usr,upperdir=/tmp/u,workdir=/tmp/w",
                      "mount:proc:/tmp/p:proc", "mount:tmpfs:/tmp/t:tmpfs", "list:/sys/fs/cgroup"},
                 "root");
  for (const char* m : {"mount:cgroup:/tmp/cg:cgroup:memory", "mount:cgroup2:/tmp/cg2:cgroup2",
                        "mount:overlay:/tmp/ov:overlay:lowerdir=/usr,upperdir=/tmp/u,workdir=/tmp/w",
                        "mount:proc:/tmp/p:proc", "mount:tmpfs:/tmp/t:tmpfs"}) {
    Judge(k, std::string(m) + " (root)", got[m], Failed(got[m], "EPERM"));
  }
  // release_agent: whatever cgroup files the sandbox sees, none opens for writing.
  std::vector<std::string> agents = {"openw:/sys/fs/cgroup/release_agent"};
  for (const auto& name : got["list:/sys/fs/cgroup"].value("names", json::array())) {
    agents.push_back("openw:/sys/fs/cgroup/" + name.get<std::string>() + "/release_agent");
  }
  auto opened = Run(id, agents, "root");
  for (const auto& a : agents) {
    Judge(k, "open " + a.substr(6) + " for writing (root)", opened[a],
          opened[a].is_object() && opened[a].value("ret", 0) < 0);
  }
}

TEST_P(PayloadsTest, ProcfsAndSysfs) {
  const std::string id = Make();
  const std::string k = "procfs / sysfs";
  const std::string core_pattern = Slurp("/proc/sys/kernel/core_pattern");
  const std::vector<std::string> writes = {
      "/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger", "/sys/kernel/uevent_helper",
      "/proc/sys/fs/binfmt_misc/register", "/proc/sys/kernel/modprobe",
      "/proc/sys/vm/drop_caches", "/sys/kernel/mm/transparent_hugepage/enabled",
      "/proc/sys/kernel/hostname"};
  // Reads: fail, or nothing (masked with an empty file).
  const std::vector<std::string> reads = {"/proc/kcore",   "/proc/kmsg",       "/proc/keys",
                                          "/proc/key-users", "/proc/kallsyms", "/proc/timer_list",
                                          "/proc/sched_debug", "/sys/kernel/debug/tracing/trace"};
  std::vector<std::string> attempts;
  for (const auto& w : writes) attempts.push_back("openw:" + w);
  for (const auto& r : reads) attempts.push_back("read:" + r);
  for (const char* own : {"read:/proc/self/status", "openw:/proc/self/comm", "read:/proc/uptime"}) {
    attempts.push_back(own);
  }
  auto got = Run(id, attempts, "root");
  for (const auto& w : writes) {
    const json& res = got["openw:" + w];
    Judge(k, "open " + w + " for writing (root)", res, res.is_object() && res.value("ret", 0) < 0);
  }
  for (const auto& r : reads) {
    const json& res = got["read:" + r];
    Judge(k, "read " + r + " (root)", res,
          res.is_object() && (res.value("ret", 0) < 0 || res.value("bytes", 1) == 0));
  }
  for (const char* own : {"read:/proc/self/status", "openw:/proc/self/comm", "read:/proc/uptime"}) {
    Judge(k, std::string("positive control: ") + own, got[own], Succeeded(got[own]));
  }
  Judge(k, "the host's core_pattern is unchanged",
        Slurp("/proc/sys/kernel/core_pattern") == core_pattern, core_pattern);
}

TEST_P(PayloadsTest, OtherProcesses) {
  if (engine_ != "jail") GTEST_SKIP() << kJailOnly;
  const std::string a = Make();
  const std::string b = Make();
  const std::string k = "other processes";
  const pid_t b_agent = AgentPid(b);
  ASSERT_GT(b_agent, 0);
  const std::string daemon = std::to_string(daemon_->pid());
  const std::string other = std::to_string(b_agent);
  // A host process of the test's own, which nothing in a sandbox may signal.
  airlock::testing::ChildProcess host_sleeper;
  ASSERT_TRUE(host_sleeper.Start({"/bin/sleep", "60"}, {}));
  const std::string host = std::to_string(host_sleeper.pid());
  Reply bg = Exec(a, {{"argv", {"sleep", "60"}}, {"background", true}, {"user", "root"}});
  ASSERT_EQ(bg.status, 200) << bg.body;
  const std::string own = std::to_string(bg.Json()["pid"].get<int>());

  auto got = Run(a, {"kill:" + daemon + ":0", "pidfd:" + daemon, "ptrace:" + daemon,
                     "kill:" + other + ":0", "pidfd:" + other, "ptrace:" + other,
                     "kill:" + host + ":0", "procs", "kill:" + own + ":0", "pidfd:" + own},
                 "root");
  for (const auto& [pid, who] : {std::pair{daemon, "airlockd"}, std::pair{other, "another sandbox's agent"},
                                 std::pair{host, "a host process"}}) {
    Judge(k, std::string("kill(") + who + ", 0) (root)", got["kill:" + pid + ":0"],
          Failed(got["kill:" + pid + ":0"], "ESRCH"));
  }
  for (const auto& [pid, who] : {std::pair{daemon, "airlockd"}, std::pair{other, "another sandbox's agent"}}) {
    Judge(k, std::string("pidfd_open(") + who + ") (root)", got["pidfd:" + pid],
          Failed(got["pidfd:" + pid], "ESRCH"));
    Judge(k, std::string("ptrace(PTRACE_ATTACH, ") + who + ") (root)", got["ptrace:" + pid],
          Failed(got["ptrace:" + pid], "EPERM"));
  }
  Judge(k, "positive control: kill(own background process, 0)", got["kill:" + own + ":0"],
        Succeeded(got["kill:" + own + ":0"]));
  Judge(k, "positive control: pidfd_open(own background process)", got["pidfd:" + own],
        Succeeded(got["pidfd:" + own]));
  // /proc shows this sandbox's processes only: the agent, the sleeper and the payload's own.
  const json& procs = got["procs"];
  std::set<std::string> comms;
  for (const auto& p : procs.value("procs", json::array())) {
    const std::string s = p.get<std::string>();
    comms.insert(s.substr(s.find(':') + 1));
  }
  const size_t count = procs.value("procs", json::array()).size();
  Judge(k, "/proc lists only the sandbox's own processes", procs,
        count >= 2 && count <= 4 && !comms.contains("airlockd") && comms.contains("sleep"));

  // kill(1, SIGKILL) and then kill(-1, SIGKILL) as the sandbox's root: its own commands die
  // (the payload with them), the agent (its PID 1), the daemon, the other sandbox and the host
  // process live on.
  auto killed = Run(a, {"kill:1:9"}, "root");
  Reply after = Exec(a, {{"cmd", "echo alive"}});
  Judge(k, "kill(1, SIGKILL) (root): the agent lives on", killed["kill:1:9"],
        after.status == 200 && after.Json().value("stdout", "") == "alive\n");
  Reply all = Exec(a, {{"argv", {"/home/user/payload", "kill:-1:9"}}, {"user", "root"}});
  Reply again = Exec(a, {{"cmd", "echo alive"}});
  Judge(k, "kill(-1, SIGKILL) (root): only the sandbox's own commands die",
        all.status == 200 && ::kill(host_sleeper.pid(), 0) == 0 &&
            ::kill(daemon_->pid(), 0) == 0 && ::kill(b_agent, 0) == 0 &&
            again.Json().value("stdout", "") == "alive\n",
        all.body.substr(0, 200));
  Reply neighbour = Exec(b, {{"cmd", "echo fine"}});
  Judge(k, "the other sandbox still runs commands", neighbour.status == 200 &&
            neighbour.Json().value("stdout", "") == "fine\n", neighbour.body);
}

TEST_P(PayloadsTest, TtyInjection) {
  const std::string id = Make();
  const std::string k = "TTY injection";
  // On a pty exec, stdin is the terminal: pushed input (byte 81, 'Q') would wait there to be
  // read by whoever reads next, and the terminal would echo it to the pty master.
  const std::vector<std::string> attempts = {"ioctl:0x5412:81", "ioctl:0x100005412:81",
                                             "ioctl:0xffffffff00005412:81", "ioctl:0x541c:3",
                                             "ioctl:0x10000541c:3", "pending"};
  std::string cmd = "/home/user/payload";
  for (const auto& a : attempts) cmd += " " + a;
  for (const std::string user : {"user", "root"}) {
    Reply r = Exec(id, {{"cmd", cmd}, {"pty", json::object()}, {"user", user}});
    ASSERT_EQ(r.status, 200) << r.body;
    const std::string out = r.Json().value("stdout", "");
    auto got = Parse(out);
    for (size_t i = 0; i + 1 < attempts.size(); ++i) {
      Judge(k, attempts[i] + " on the terminal -> EPERM (" + user + ")", got[attempts[i]],
            Failed(got[attempts[i]], "EPERM"));
    }
    const json& pending = got["pending"];
    Judge(k, "nothing waits on the terminal to be read (" + user + ")", pending,
          Succeeded(pending) && pending.value("pending", -1) == 0);
    Judge(k, "the pty master got no injected byte (" + user + ")",
          out.find('Q') == std::string::npos, out.substr(0, 200));
    Judge(k, "positive control: stdin is the terminal, 80x24 (" + user + ")", pending,
          pending.value("isatty", false) && pending.value("cols", 0) == 80 &&
              pending.value("rows", 0) == 24);
  }
}

TEST_P(PayloadsTest, FileApi) {
  const std::string id = Make();
  const std::string k = "file API";
  const Canary& a = canaries_[0];
  const Canary& b = canaries_[1];
  const std::string files = "/v1/sandboxes/" + id + "/files";
  // Links the sandbox makes to host paths, to climb, and to the agent's root.
  Reply links = Exec(id, {{"cmd", "cd /home/user && ln -s " + a.path + " l_canary && ln -s /etc/shadow l_shadow"
                                  " && ln -s ../../../../../../../.. l_up && ln -s " + b.dir() +
                                  " l_dir && ln -s /proc/1/root l_proc && mkdir real && echo own > real/" + b.name()}});
  ASSERT_EQ(links.status, 200) << links.body;
  ASSERT_EQ(links.Json().value("exit_code", -1), 0) << links.body;

  auto get_contained = [&](const std::string& path) {
    Reply r = daemon_->Call(http::verb::get, files + "?path=" + path);
    const bool leaked = r.body.find(a.content) != std::string::npos ||
                        r.body.find(b.content) != std::string::npos ||
                        (r.status == 200 && Fnv(r.body) == Fnv(Slurp("/etc/shadow")));
    Judge(k, "GET " + path, !leaked, std::to_string(r.status) + " " + r.body.substr(0, 120));
  };
  for (const std::string& p : {std::string("/home/user/l_canary"), std::string("/home/user/l_shadow"),
                               "/home/user/l_up" + a.path, "/home/user/l_dir/" + b.name(),
                               "/home/user/l_proc" + a.path, "/../../.." + a.path,
                               "../../../.." + b.path, "/proc/1/root" + a.path, a.path}) {
    get_contained(p);
  }
  // Listings and archives through a link to the host dir show the sandbox's own (missing) dir.
  for (const std::string& route : {std::string("/list?path=/home/user/l_dir"),
                                   std::string("/tar?path=/home/user/l_dir"),
                                   std::string("/list?path=/home/user/l_up") + b.dir()}) {
    Reply r = daemon_->Call(http::verb::get, files + route);
    Judge(k, "GET files" + route, r.body.find(b.name()) == std::string::npos &&
                                      r.body.find(b.content) == std::string::npos,
          std::to_string(r.status) + " " + r.body.substr(0, 120));
  }
  // Writes through links and climbs: the host canaries stay as they were.
  for (const std::string& p : {std::string("/home/user/l_canary"), "/home/user/l_dir/" + b.name(),
                               "/home/user/l_up" + a.path, "../../.." + b.path}) {
    Reply r = daemon_->Call(http::verb::put, files + "?path=" + p + "&parents=true", "pwned\n");
    Judge(k, "PUT " + p, true, std::to_string(r.status) + " " + r.body.substr(0, 120));
  }
  Reply mk = daemon_->Call(http::verb::post, files + "/mkdir?path=/home/user/l_dir/made-inside&parents=true");
  Judge(k, "mkdir through a link to a host dir", !fs::exists(b.dir() + "/made-inside"),
        std::to_string(mk.status) + " " + mk.body.substr(0, 120));
  Reply del = daemon_->Call(http::verb::delete_, files + "?path=/home/user/l_dir/" + b.name());
  Judge(k, "DELETE through a link to a host dir", fs::exists(b.path),
        std::to_string(del.status) + " " + del.body.substr(0, 120));
  // Positive control: the files API reads and writes the sandbox's own files.
  Reply own = daemon_->Call(http::verb::get, files + "?path=/home/user/real/" + b.name());
  Judge(k, "positive control: GET a file of the sandbox's own", own.status == 200 && own.body == "own\n",
        std::to_string(own.status));

  // A rename race: inside, /home/user/race flips between a link to the host canary's dir and a
  // real dir, while the API reads and writes through it.
  Reply racer = Exec(id, {{"cmd", "cd /home/user && mkdir -p realdir && echo inside > realdir/" +
                                      b.name() + " && while :; do ln -sfn " + b.dir() +
                                      " t1 && mv -Tf t1 race; ln -sfn realdir t2 && mv -Tf t2 race; "
                                      "rm -f race; mkdir race 2>/dev/null; rmdir race; done"},
                          {"background", true}});
  ASSERT_EQ(racer.status, 200) << racer.body;
  int reads = 0, leaks = 0, inside = 0;
  for (int i = 0; i < 60; ++i) {
    Reply r = daemon_->Call(http::verb::get, files + "?path=/home/user/race/" + b.name());
    ++reads;
    if (r.body.find(b.content) != std::string::npos) ++leaks;
    if (r.status == 200 && r.body == "inside\n") ++inside;
    (void)daemon_->Call(http::verb::put, files + "?path=/home/user/race/" + b.name(), "pwned\n");
  }
  const int pid = racer.Json()["pid"];
  (void)daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/processes/" + std::to_string(pid) + "/signal",
                      R"({"signal": 9})");
  Judge(k, "GET and PUT through a link swapped by a rename race", leaks == 0,
        std::to_string(reads) + " reads, " + std::to_string(leaks) + " leaks, " +
            std::to_string(inside) + " read the sandbox's own file");
}

TEST_P(PayloadsTest, NoNetworkMode) {
  const std::string id = Make();
  const std::string k = "egress (no network)";
  // A sandbox made without a network has loopback only: nothing else is routable, and no packet
  // leaves its namespace.
  auto got = Run(id, {"connect:192.0.2.1:80", "connect:169.254.169.254:80", "connect:10.0.0.1:443",
                      "connectlo"});
  // No route: the host kernel says ENETUNREACH, gVisor's network stack EHOSTUNREACH.
  const std::string no_route = engine_ == "gvisor" ? "EHOSTUNREACH" : "ENETUNREACH";
  for (const char* c : {"connect:192.0.2.1:80", "connect:169.254.169.254:80", "connect:10.0.0.1:443"}) {
    Judge(k, c, got[c], Failed(got[c], no_route));
  }
  Judge(k, "positive control: connect to a listener on 127.0.0.1", got["connectlo"],
        Succeeded(got["connectlo"]));
}

TEST_P(PayloadsTest, PostureAtCreateAndAfterExec) {
  if (engine_ != "jail") GTEST_SKIP() << kJailOnly;
  const std::string id = Make();
  const std::string other = Make();
  const pid_t other_agent = AgentPid(other);
  ASSERT_GT(other_agent, 0);
  jail::PostureExpectations expect;
  expect.host_pid = daemon_->pid();
  expect.agent_caps = jail::AgentCapabilityMask();
  expect.nofile = 4096;  // runtime::Limits' default
  expect.cgroup_suffix = "/airlock/" + id;
  expect.other_sandboxes = {other_agent};
  auto record = [&](const std::string& when, const std::vector<jail::PostureCheck>& checks) {
    for (const auto& c : checks) {
      Judge("posture", when + ": " + c.process + " (" + std::to_string(c.pid) + ") " + c.check,
            c.ok, c.detail);
    }
  };
  const auto at_create = SandboxPids(id);
  ASSERT_EQ(at_create.size(), 1u) << "a new sandbox holds its agent only";
  record("at create", jail::CheckPosture(at_create, expect));

  // A command that starts more processes, as user and as root; checked while it runs.
  for (const std::string user : {"user", "root"}) {
    Reply bg = Exec(id, {{"cmd", "sleep 30 & sleep 30 & wait"}, {"background", true},
                         {"user", user}});
    ASSERT_EQ(bg.status, 200) << bg.body;
  }
  std::vector<pid_t> pids;
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       std::chrono::steady_clock::now() < deadline;) {
    pids = SandboxPids(id);
    int sleeping = 0;
    for (pid_t p : pids) sleeping += Slurp("/proc/" + std::to_string(p) + "/comm") == "sleep\n";
    if (sleeping == 4) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(pids.size(), 7u) << "the agent, two shells and four sleeps";
  record("after exec", jail::CheckPosture(pids, expect));
}

// Tenancy: tenant B's calls on tenant A's sandbox, on every /v1/sandboxes/{id} route the API
// documents (read from docs/api/openapi.yaml) and both WebSocket routes, must get exactly the
// 404 of a sandbox that does not exist; A's sandbox must be untouched; B's list must not show it;
// the admin-only routes refuse B. Controls: A's own call, and the admin's.
TEST_P(PayloadsTest, Tenancy) {
  using namespace airlock::testing;
  const std::string k = "tenancy";
  auto make_key = [](const std::string& name, const std::string& tenant) {
    Reply r = daemon_->Call(http::verb::post, "/v1/keys",
                            json{{"name", name}, {"tenant", tenant}}.dump());
    EXPECT_EQ(r.status, 201) << r.body;
    return r.status == 201 ? r.Json()["key"].get<std::string>() : std::string();
  };
  const std::string tenant_a = "sec-a-" + Random(6), tenant_b = "sec-b-" + Random(6);
  const std::string key_a = make_key("security-a", tenant_a);
  const std::string key_b = make_key("security-b", tenant_b);
  ASSERT_FALSE(key_a.empty());
  ASSERT_FALSE(key_b.empty());
  auto as = [](const std::string& key, http::verb verb, const std::string& target,
               const std::string& body = "") {
    return Http(daemon_->port(), verb, target, body, "Bearer " + key);
  };

  Reply created =
      as(key_a, http::verb::post, "/v1/sandboxes", json{{"engine", engine_}}.dump());
  ASSERT_EQ(created.status, 201) << created.body;
  const std::string victim = created.Json()["id"];
  made_.push_back(victim);  // deleted by the admin key at the end
  const std::string v = "/v1/sandboxes/" + victim;
  const std::string secret = "tenant A's data " + Random(16);
  ASSERT_EQ(as(key_a, http::verb::put, v + "/files?path=/tmp/secret", secret).status, 200);
  Reply started = as(key_a, http::verb::post, v + "/exec",
                     R"({"argv": ["sleep", "600"], "background": true, "stdin_open": true})");
  ASSERT_EQ(started.status, 200) << started.body;
  const std::string pid = std::to_string(started.Json()["pid"].get<int64_t>());
  const std::string missing = UnusedId();

  const std::vector<Route> routes = SandboxRoutes(AIRLOCK_OPENAPI_PATH);
  ASSERT_GE(routes.size(), 20u) << "the spec reader found too few routes";
  const std::map<std::string, CallShape> shapes = Shapes();
  auto call = [&](const std::string& key, const Route& r, const std::string& id) {
    auto shape = shapes.find(r.method + " " + r.path);
    std::string target = Replace(Replace(r.path, "{id}", id), "{pid}", pid);
    if (shape != shapes.end()) target += shape->second.query;
    if (r.websocket) return WsHandshake(daemon_->port(), key, target);
    return as(key, Verb(r.method), target, shape == shapes.end() ? "" : shape->second.body);
  };
  for (const Route& r : routes) {
    Reply theirs = call(key_b, r, victim);
    Reply nobodys = call(key_b, r, missing);
    const bool same = theirs.status == 404 && nobodys.status == 404 &&
                      Replace(theirs.body, victim, missing) == nobodys.body &&
                      theirs.StableHeaders() == nobodys.StableHeaders();
    Judge(k, "B: " + r.method + " " + r.path + (r.websocket ? " (WebSocket)" : "") + " on A's",
          same,
          std::to_string(theirs.status) + " " + theirs.body.substr(0, 160) +
              (same ? " (identical to an unused id's)" : " vs unused id: " +
                                                           std::to_string(nobodys.status) + " " +
                                                           nobodys.body.substr(0, 160)));
  }

  // A's sandbox after all of that.
  Reply state = as(key_a, http::verb::get, v);
  Judge(k, "A's sandbox still running, metadata untouched",
        state.status == 200 && state.Json()["state"] == "running" &&
            !state.Json()["metadata"].contains("touched"),
        std::to_string(state.status) + " " + state.body.substr(0, 200));
  Reply file = as(key_a, http::verb::get, v + "/files?path=/tmp/secret");
  Judge(k, "A's file unchanged", file.status == 200 && file.body == secret,
        std::to_string(file.status) + " " + std::to_string(file.body.size()) + " bytes");
  Reply process = as(key_a, http::verb::get, v + "/processes/" + pid);
  Judge(k, "A's process still running, stdin open",
        process.Json()["state"] == "running" && process.Json()["stdin_open"] == true,
        process.body.substr(0, 200));
  Reply stolen = daemon_->Call(http::verb::get, "/v1/templates/stolen");
  Judge(k, "no template snapshotted from A's sandbox by B", stolen.status == 404,
        std::to_string(stolen.status));
  const json everything = daemon_->Call(http::verb::get, "/v1/sandboxes").Json();
  int forks = 0;
  for (const json& s : everything["sandboxes"]) {
    forks += s["metadata"].value("airlock.forked_from", "") == victim;
  }
  Judge(k, "no fork of A's sandbox made by B", forks == 0, std::to_string(forks) + " forks");
  const std::string listed_b = as(key_b, http::verb::get, "/v1/sandboxes").body;
  Judge(k, "B's list does not show A's sandbox", listed_b.find(victim) == std::string::npos,
        listed_b.substr(0, 200));
  Reply filter = as(key_b, http::verb::get, "/v1/sandboxes?tenant=" + tenant_a);
  Judge(k, "B's list of tenant A refused (403)",
        filter.status == 403 && filter.body.find(victim) == std::string::npos,
        std::to_string(filter.status) + " " + filter.body);
  for (const auto& [verb, target, body] :
       std::vector<std::tuple<http::verb, std::string, std::string>>{
           {http::verb::get, "/v1/keys", ""},
           {http::verb::post, "/v1/keys", R"({"name": "b-admin", "tenant": "x", "admin": true})"},
           {http::verb::delete_, "/v1/keys/1", ""},
           {http::verb::get, "/v1/pools", ""},
           {http::verb::get, "/metrics", ""}}) {
    Reply r = as(key_b, verb, target, body);
    Judge(k, std::string("B: ") + std::string(http::to_string(verb)) + " " + target + " (admin only)",
          r.status == 403, std::to_string(r.status) + " " + r.body.substr(0, 160));
  }

  // Positive controls: A's own calls and the admin's reach the sandbox.
  Reply own = as(key_a, http::verb::post, v + "/exec", R"({"cmd": "cat /tmp/secret"})");
  Judge(k, "positive control: A execs in its own sandbox",
        own.status == 200 && own.Json().value("stdout", "") == secret,
        std::to_string(own.status) + " " + own.body.substr(0, 160));
  Reply own_ws = WsHandshake(daemon_->port(), key_a, v + "/exec/ws");
  Judge(k, "positive control: A opens exec/ws on its own sandbox", own_ws.status == 101,
        std::to_string(own_ws.status) + " " + own_ws.body);
  Reply admin = daemon_->Call(http::verb::get, v);
  Judge(k, "positive control: the admin key reads A's sandbox",
        admin.status == 200 && admin.Json()["tenant"] == tenant_a,
        std::to_string(admin.status) + " " + admin.body.substr(0, 160));
  Reply keys = daemon_->Call(http::verb::get, "/v1/keys");
  Judge(k, "positive control: the admin key lists keys", keys.status == 200,
        std::to_string(keys.status));
}

std::vector<std::string> EnginesOfThisBuild() {
  std::vector<std::string> names;
  for (const auto& e : runtime::RegisteredEngines()) names.emplace_back(e.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Engines, PayloadsTest, ::testing::ValuesIn(EnginesOfThisBuild()),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace airlock::security

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new airlock::security::ReportEnvironment(
      "payloads", "Hostile payloads in real sandboxes"));
  return airlock::security::RunAllTestsForCtest();
}
