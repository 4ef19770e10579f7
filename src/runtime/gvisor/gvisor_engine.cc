#include "runtime/gvisor/gvisor_engine.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/elf.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "common/syscall.h"
#include "protocol/client.h"
#include "runtime/cgroup_stats.h"
#include "runtime/guest.h"
#include "runtime/guest_files.h"
#include "runtime/seccomp_policy.h"

extern char** environ;

namespace airlock::gvisor {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using runtime::SandboxInfo;
using runtime::SandboxSpec;
using Clock = std::chrono::steady_clock;

// Where the agent is, inside: its binary and the directory of the host it listens in.
constexpr const char* kAgentInside = "/.airlock/agent";
constexpr const char* kRunInside = "/.airlock/run";
constexpr const char* kAgentSocket = "agent.sock";
// The file whose appearance in the agent's directory wakes a quiesced agent (protocol::Quiesce):
// the engine makes it before a restore.
constexpr const char* kWakeFile = "wake";
// Where a hibernated sandbox's memory image is, in its directory (on the state dir's disk, not
// in the writable layer's tmpfs).
constexpr const char* kMemoryImage = "memory";
// The sandbox seccomp policy, compiled at Open (runtime/seccomp_policy.h): the agent installs it
// on itself before it serves, so the Sentry applies it to every command.
constexpr const char* kSeccompInside = "/.airlock/seccomp";
// How long a create waits for runsc, and then for the agent's socket.
constexpr auto kRunscTimeout = std::chrono::seconds(30);
constexpr auto kAgentTimeout = std::chrono::seconds(15);
// How long a trial sandbox on KVM may take to run `true` (ChoosePlatform); one that works takes
// a fraction of a second.
constexpr auto kKvmTrial = std::chrono::seconds(3);
// Layers a root may stack: the overlay is the host's, mounted as the jail's is, so as many
// (their /proc/self/fd/N paths fit the mount's page). The EINVAL once taken for a limit of the
// layers is runsc's statx (docs/design/gvisor.md, "A statx finding").
constexpr uint32_t kMaxLayers = 64;

Status MakeDir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) < 0 && errno != EEXIST) return FailErrno("mkdir " + path, errno);
  if (::chmod(path.c_str(), mode) < 0) return FailErrno("chmod " + path, errno);
  return {};
}

Status WriteText(const std::string& path, std::string_view text, mode_t mode) {
  auto fd = OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
  if (!fd) return std::unexpected(fd.error());
  return WriteAll(fd->get(), text);
}

// The inode cap of a tmpfs of `mb` MiB: one inode per 4 KiB, at least 1024 (as the jail's).
uint64_t InodesFor(uint64_t mb) { return std::max<uint64_t>(1024, mb * 256); }

// Connects to `dir`/agent.sock through an O_PATH descriptor of `dir`, so that a long state dir
// cannot overflow sun_path. kUnavailable while nothing listens there.
Result<UniqueFd> ConnectSocketIn(const std::string& dir) {
  auto dir_fd = OpenFile(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (!dir_fd) return std::unexpected(dir_fd.error());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path =
      "/proc/self/fd/" + std::to_string(dir_fd->get()) + "/" + kAgentSocket;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return FailErrno("socket", errno);
  if (RetryEintr([&] {
        return ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
      }) < 0) {
    Error e = ErrnoError("connecting to the agent at " + dir + "/" + kAgentSocket, errno);
    if (e.sys_errno() == ENOENT || e.sys_errno() == ECONNREFUSED) {
      e = Error(ErrorCode::kUnavailable, e.message(), e.sys_errno());
    }
    return std::unexpected(std::move(e));
  }
  return fd;
}

// The last `n` bytes of a file, for an error message.
std::string Tail(const std::string& path, size_t n = 600) {
  std::string text = ReadFileToString(path, 1 << 20).value_or("");
  if (text.size() > n) text = "..." + text.substr(text.size() - n);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// runsc's output and the agent's stdio. In the writable layer's tmpfs, not beside it: a command
// can open the agent's descriptors through gVisor's /proc, and what it writes there must count
// against the sandbox's own disk cap, not fill the host's.
std::string ConsoleLog(const std::string& dir) { return dir + "/disk/console.log"; }

constexpr const char* kAlternatives = "/etc/alternatives";
bool HostHasAlternatives() {
  struct stat st;
  return ::lstat(kAlternatives, &st) == 0 && S_ISDIR(st.st_mode);
}

// The sandbox's OCI runtime spec (config.json in its bundle).
json RuntimeSpec(const SandboxSpec& spec, const std::string& dir, const std::string& agent,
                 const std::string& seccomp, const std::vector<std::string>& top_dirs,
                 const std::vector<std::string>& usr_dirs, const std::string& cgroup_parent) {
  std::vector<std::string> args = {kAgentInside,
                                   "--listen",
                                   std::string(kRunInside) + "/" + kAgentSocket,
                                   "--root",
                                   std::string(runtime::guest::kAgentRoot),
                                   "--user",
                                   spec.user.empty() ? std::string(runtime::guest::kUser)
                                                     : spec.user,
                                   "--drop-caps",
                                   "--log-level",
                                   "warn",
                                   "--seccomp",
                                   kSeccompInside};
  for (const std::string& kv : spec.env) args.insert(args.end(), {"--env", kv});
  // The agent's own capabilities (it switches users, drops every capability from commands,
  // signals them, and works on files their users own); commands get none (--drop-caps).
  const json caps = {"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL",
                     "CAP_SETGID", "CAP_SETUID",      "CAP_SETPCAP"};
  json mounts = json::array({
      {{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}},
      {{"destination", "/dev"},
       {"type", "tmpfs"},
       {"source", "tmpfs"},
       {"options", {"nosuid", "strictatime", "mode=755", "size=65536k"}}},
      {{"destination", "/dev/pts"},
       {"type", "devpts"},
       {"source", "devpts"},
       {"options", {"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}}},
      {{"destination", "/dev/shm"},
       {"type", "tmpfs"},
       {"source", "shm"},
       {"options", {"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}}},
      {{"destination", "/sys"},
       {"type", "sysfs"},
       {"source", "sysfs"},
       {"options", {"nosuid", "noexec", "nodev", "ro"}}},
      {{"destination", "/tmp"},
       {"type", "tmpfs"},
       {"source", "tmpfs"},
       {"options",
        {"nosuid", "nodev", "mode=1777", "size=" + std::to_string(spec.limits.tmp_mb) + "m"}}},
      {{"destination", kAgentInside},
       {"type", "bind"},
       {"source", agent},
       {"options", {"bind", "ro"}}},
      {{"destination", kSeccompInside},
       {"type", "bind"},
       {"source", seccomp},
       {"options", {"bind", "ro"}}},
      {{"destination", kRunInside},
       {"type", "bind"},
       {"source", dir + "/run"},
       {"options", {"bind", "rw", "nosuid", "nodev", "noexec"}}},
  });
  // The host-/usr root, as the jail's: /usr read-only (the root's own directory, bound over
  // itself), the host's directories in it read-only, and /usr/local the sandbox's own, writable.
  auto bind = [&](const std::string& to, const std::string& from, bool writable) {
    mounts.push_back({{"destination", to},
                      {"type", "bind"},
                      {"source", from},
                      {"options", {"rbind", writable ? "rw" : "ro", "nosuid", "nodev"}}});
  };
  if (spec.root.host_usr) {
    // Debian's /usr/bin/awk, which, editor, ... are symlinks through /etc/alternatives: the
    // host's, read-only (symlinks only: nothing in it is secret), as the jail binds it.
    if (HostHasAlternatives()) bind(kAlternatives, kAlternatives, false);
    for (const std::string& top : top_dirs) bind("/" + top, "/" + top, false);
    bind("/usr", dir + "/rootfs/usr", false);
    for (const std::string& usr : usr_dirs) bind("/usr/" + usr, "/usr/" + usr, false);
    bind("/usr/local", dir + "/rootfs/usr/local", true);
  }
  json namespaces = json::array({{{"type", "pid"}}, {{"type", "ipc"}}, {{"type", "uts"}},
                                 {{"type", "mount"}}});
  json network = {{"type", "network"}};
  if (!spec.netns.empty()) network["path"] = spec.netns;
  namespaces.push_back(network);
  const int64_t memory = static_cast<int64_t>(spec.limits.memory_mb) << 20;
  constexpr int64_t kPeriod = 100000;
  return {
      {"ociVersion", "1.0.2"},
      {"process",
       {{"terminal", false},
        {"user", {{"uid", 0}, {"gid", 0}}},
        {"args", args},
        {"env", {"PATH=" + std::string(runtime::guest::kDefaultPath)}},
        {"cwd", "/"},
        {"noNewPrivileges", true},
        {"capabilities",
         {{"bounding", caps}, {"effective", caps}, {"permitted", caps}, {"inheritable", json::array()}}},
        {"rlimits",
         {{{"type", "RLIMIT_NOFILE"}, {"hard", spec.limits.nofile}, {"soft", spec.limits.nofile}}}}}},
      {"root", {{"path", dir + "/rootfs"}, {"readonly", false}}},
      {"hostname", spec.id},
      {"mounts", mounts},
      {"linux",
       {{"namespaces", namespaces},
        {"resources",
         {{"memory", {{"limit", memory}, {"swap", memory}}},
          {"cpu",
           {{"quota", static_cast<int64_t>(spec.limits.cpus * kPeriod)}, {"period", kPeriod}}},
          {"pids", {{"limit", spec.limits.pids_max}}}}},
        {"cgroupsPath", "/" + cgroup_parent + "/" + spec.id}}},
  };
}

// The guest contract's files, written into the mounted root (they land in its writable layer):
// /etc's files (accounts merged into a root file system's own), the homes, the agent's mount
// points.
Status WriteGuestFiles(const std::string& root, const SandboxSpec& spec) {
  if (auto st = MakeDir(root + "/etc", 0755); !st) return st;
  for (auto& [name, text] : runtime::guest::EtcFiles(spec.id, spec.nameserver)) {
    const std::string path = root + "/etc/" + name;
    if (!spec.root.host_usr && (name == "passwd" || name == "group")) {
      struct stat st;
      if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
        auto existing = ReadFileToString(path, 1 << 20);
        if (!existing) return std::unexpected(existing.error());
        text = runtime::guest::MergeAccounts(*existing, text);
      }
    }
    // What a layer has there (a symlink, say) is replaced, not written through.
    if (::unlink(path.c_str()) < 0 && errno != ENOENT) return FailErrno("replacing " + path, errno);
    if (auto st = WriteText(path, text, 0644); !st) return st;
  }
  const std::string home = root + std::string(runtime::guest::kHome);
  if (auto st = MakeDir(root + "/home", 0755); !st) return st;
  if (auto st = MakeDir(home, 0755); !st) return st;
  if (::lchown(home.c_str(), runtime::guest::kUserUid, runtime::guest::kUserGid) < 0) {
    return FailErrno("chown " + home, errno);
  }
  if (auto st = MakeDir(root + std::string(runtime::guest::kRootHome), 0700); !st) return st;
  for (const char* point : {"/proc", "/dev", "/sys", "/tmp", "/.airlock", kRunInside}) {
    if (auto st = MakeDir(root + point, 0755); !st) return st;
  }
  if (spec.root.host_usr && HostHasAlternatives()) {
    if (auto st = MakeDir(root + kAlternatives, 0755); !st) return st;
  }
  // The files bound in over these (what a layer has there is replaced, not written through).
  for (const char* file : {kAgentInside, kSeccompInside}) {
    const std::string point = root + file;
    if (::unlink(point.c_str()) < 0 && errno != ENOENT) return FailErrno("replacing " + point, errno);
    if (auto st = WriteText(point, "", 0755); !st) return st;
  }
  return {};
}

// Starts `argv` with stdin from /dev/null and stdout and stderr appended to `log`, and waits for
// it at most `timeout` (then SIGKILL). The exit code; -1 if a signal ended it.
Result<int> RunLogged(const std::vector<std::string>& argv, const std::string& log,
                      std::chrono::milliseconds timeout) {
  std::vector<char*> args;
  std::vector<std::string> copy = argv;
  for (auto& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  // Nothing else of the daemon's: its sockets (the API's, the DNS stubs') are not all
  // close-on-exec, and runsc's sandbox and gofer, which outlive this call, would inherit them.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  pid_t pid = 0;
  const int err = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return FailErrno("starting " + argv[0], err);
  const auto deadline = Clock::now() + timeout;
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return FailErrno("waitpid", errno);
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return Fail(ErrorCode::kDeadlineExceeded, argv[0] + " did not finish in time");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Each cgroup directory <root>/<controller...>/<parent>/<id> on this host (v1: one per
// hierarchy; v2: one).
std::vector<std::string> CgroupDirs(const std::string& relative) {
  std::vector<std::string> dirs;
  std::error_code ec;
  const std::string unified = "/sys/fs/cgroup/" + relative;
  if (fs::is_directory(unified, ec)) dirs.push_back(unified);
  for (const auto& entry : fs::directory_iterator("/sys/fs/cgroup", ec)) {
    const std::string dir = entry.path().string() + "/" + relative;
    if (entry.is_directory(ec) && !entry.is_symlink(ec) && fs::is_directory(dir, ec)) {
      dirs.push_back(dir);
    }
  }
  return dirs;
}

// Ends a runsc sandbox by its cgroups <parent>/<name>: the Sentry, the gofer and their helpers
// are all in them, SIGKILLed there until none is left; then the cgroups are removed, and the
// parents when this was the last sandbox in them (as the jail's are).
Status RemoveSandboxCgroups(const std::string& parent, const std::string& name) {
  Status result;
  const std::vector<std::string> cgroups = CgroupDirs(parent + "/" + name);
  auto kill_all = [&] {
    bool any = false;
    for (const std::string& cgroup : cgroups) {
      std::ifstream procs(cgroup + "/cgroup.procs");
      for (pid_t pid; procs >> pid;) {
        ::kill(pid, SIGKILL);
        any = true;
      }
    }
    return any;
  };
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (kill_all() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (const std::string& cgroup : cgroups) {
    if (::rmdir(cgroup.c_str()) < 0 && errno != ENOENT && result) {
      result = FailErrno("removing cgroup " + cgroup, errno);
    }
  }
  for (const std::string& dir : CgroupDirs(parent)) ::rmdir(dir.c_str());
  return result;
}

// The OOM kills the kernel counted in a sandbox's memory cgroup (v1: memory.oom_control; v2:
// memory.events), 0 when it cannot tell.
uint64_t OomKills(const std::vector<std::string>& cgroups) {
  for (const std::string& dir : cgroups) {
    for (const char* file : {"/memory.oom_control", "/memory.events"}) {
      std::ifstream in(dir + file);
      std::string key;
      for (uint64_t value = 0; in >> key >> value;) {
        if (key == "oom_kill") return value;
      }
    }
  }
  return 0;
}

// Whether the sandbox in `dir` joined a network namespace (its spec names one): runsc runs it on
// its host networking then, which `runsc checkpoint` refuses.
bool HasNetwork(const std::string& dir) {
  auto text = ReadFileToString(dir + "/config.json", 1 << 20);
  if (!text) return true;  // unknown: judged as the case that cannot be saved
  auto doc = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  const json* namespaces = doc.is_object() && doc["linux"].is_object()
                               ? &doc["linux"]["namespaces"]
                               : nullptr;
  if (!namespaces || !namespaces->is_array()) return true;
  for (const json& ns : *namespaces) {
    if (ns.is_object() && ns.value("type", "") == "network" && ns.contains("path")) return true;
  }
  return false;
}

// Where runsc writes the sandbox's pid (--pid-file): what `runsc state` says, without the 20 to
// 50 ms of asking it.
std::string PidFile(const std::string& dir) { return dir + "/runsc.pid"; }
Result<int> ReadPid(const std::string& dir) {
  auto text = ReadFileToString(PidFile(dir), 64);
  if (!text) return std::unexpected(text.error().Wrap("reading the sandbox's pid"));
  const int pid = std::atoi(text->c_str());
  if (pid <= 1) return Fail(ErrorCode::kInternal, "runsc wrote pid '" + *text + "'");
  return pid;
}

// Whether `image` is a memory image's name as SaveMemoryImage makes them ("mem-" and the rest
// of a sandbox id): nothing else reaches a path.
bool IsMemoryImageId(const std::string& image) {
  return image.starts_with("mem-") && ValidateSandboxId("sbx-" + image.substr(4)).has_value();
}

// The bytes of the regular files under `dir`.
uint64_t TreeBytes(const std::string& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) bytes += it->file_size(ec);
  }
  return bytes;
}

}  // namespace

GvisorEngine::GvisorEngine(GvisorOptions options) : options_(std::move(options)) {
  // Not all of Limits holds as the contract says (docs/design/gvisor.md): the CPU quota and the
  // disk cap do, but memory_mb caps the whole sandbox (the host's OOM killer ends the Sentry,
  // not the one command) and pids_max counts the Sentry's host threads, not the sandbox's
  // processes. Each is applied all the same.
  capabilities_.limits = false;
  capabilities_.pause = true;      // runsc pause: the cgroup freezer
  capabilities_.live_limits = false;
  capabilities_.layer_snapshot = true;
  // runsc checkpoint / restore, for sandboxes without a network (Hibernate).
  capabilities_.memory_checkpoint = true;
  capabilities_.memory_fork = true;  // SaveMemoryImage, and creates from the image
  capabilities_.host_usr_root = true;  // the host's /usr bound in read-only
  // The daemon's namespace, joined through the spec with runsc's host networking in it (this
  // runsc's own stack refuses to start on kernels since 6.x: docs/design/gvisor.md): the daemon's
  // firewall, proxy and DNS stub on the host's end of the veth see the same packets as the jail's.
  capabilities_.networking = true;
  capabilities_.max_layers = kMaxLayers;
  capabilities_.isolation =
      "gVisor's user-space kernel (runsc, platform " + options_.platform +
      (options_.platform_why.empty() ? "" : "; " + options_.platform_why) +
      ") between the sandbox and the host's kernel";
  capabilities_.platform = options_.platform;
  capabilities_.agent_channel =
      "a unix socket the agent makes in a directory of the host bound into the sandbox";
  // runsc's trace points, sent to a socket in each sandbox's directory: its path must fit a
  // sockaddr_un (for the daemon's ids, "sbx-" and 16 characters).
  const size_t longest = TraceSocket("sbx-0123456789abcdef").size();
  if (longest >= sizeof(sockaddr_un::sun_path)) {
    process_events_unavailable_ = "the state dir's path is too long for the trace sockets (" +
                                  std::to_string(longest) + " bytes, at most " +
                                  std::to_string(sizeof(sockaddr_un::sun_path) - 1) + ")";
  }
  capabilities_.process_events = process_events_unavailable_.empty();
}

Result<std::unique_ptr<GvisorEngine>> GvisorEngine::Open(GvisorOptions options) {
  if (::geteuid() != 0) {
    return Fail(ErrorCode::kFailedPrecondition, "the gVisor engine needs root (runsc, mounts)");
  }
  if (options.runsc_path.find('/') == std::string::npos) {
    for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin"}) {
      const std::string path = std::string(dir) + "/" + options.runsc_path;
      if (::access(path.c_str(), X_OK) == 0) {
        options.runsc_path = path;
        break;
      }
    }
  }
  if (::access(options.runsc_path.c_str(), X_OK) != 0) {
    return Fail(ErrorCode::kFailedPrecondition,
                "runsc is not installed (" + options.runsc_path + "; Debian's package runsc)");
  }
  if (::access(options.agent_path.c_str(), X_OK) != 0) {
    return Fail(ErrorCode::kFailedPrecondition, "no agent at " + options.agent_path);
  }
  if (!options.layers) return Fail(ErrorCode::kInvalidArgument, "no layer store");
  if (options.platform == "auto") {
    PlatformChoice choice =
        ChoosePlatform(options.runsc_path, options.state_dir + "/gvisor-platform-trial",
                       options.cgroup_parent);
    options.platform = std::move(choice.platform);
    options.platform_why = "chosen: " + choice.why;
  }
  std::unique_ptr<GvisorEngine> e(new GvisorEngine(std::move(options)));
  std::error_code ec;
  fs::create_directories(e->options_.state_dir, ec);
  if (ec) return Fail(ErrorCode::kInternal, "making " + e->options_.state_dir + ": " + ec.message());
  for (const std::string& dir :
       {e->options_.state_dir + "/gvisor", e->options_.state_dir + "/gvisor/sandboxes",
        e->options_.state_dir + "/gvisor/memory-images"}) {
    if (auto st = MakeDir(dir, 0700); !st) return std::unexpected(st.error());
  }
  if (auto st = e->PrepareSkeletons(); !st) return std::unexpected(st.error());
  auto seccomp = runtime::SeccompProgram::Compile();
  if (!seccomp) return std::unexpected(seccomp.error().Wrap("gVisor engine: the seccomp policy"));
  if (auto st = WriteText(e->SeccompPath(), seccomp->bytes(), 0644); !st) {
    return std::unexpected(st.error());
  }
  auto interp = ElfNeedsInterpreter(e->options_.agent_path);
  if (!interp) return std::unexpected(interp.error().Wrap("gVisor engine: the agent"));
  e->agent_static_ = !*interp;
  return e;
}

std::string GvisorEngine::SandboxDir(const std::string& id) const {
  return options_.state_dir + "/gvisor/sandboxes/" + id;
}

std::string GvisorEngine::SeccompPath() const {
  return options_.state_dir + "/gvisor/seccomp.bpf";
}

std::string GvisorEngine::SkeletonDir(bool host_usr) const {
  return options_.state_dir + (host_usr ? "/gvisor/base" : "/gvisor/rootfs");
}

Status GvisorEngine::PrepareSkeletons() {
  for (bool host_usr : {false, true}) {
    const std::string dir = SkeletonDir(host_usr);
    if (auto st = MakeDir(dir, 0755); !st) return st;
    for (const char* sub : {"proc", "dev", "tmp", "sys", "etc", ".airlock"}) {
      if (auto st = MakeDir(dir + "/" + sub, 0755); !st) return st;
    }
  }
  // The host-/usr root: /bin, /lib, ... as the host has them (symlinks into /usr on a
  // merged-/usr host, else bound read-only), and in /usr mount points for kHostUsrDirs and a
  // /usr/local of the sandbox's own.
  const std::string base = SkeletonDir(true);
  if (auto st = MakeDir(base + "/usr", 0755); !st) return st;
  auto top = runtime::guest::MirrorHostEntries("", base, runtime::guest::kHostTopDirs);
  if (!top) return std::unexpected(top.error());
  top_dirs_ = std::move(*top);
  auto usr = runtime::guest::MirrorHostEntries("/usr", base + "/usr", runtime::guest::kHostUsrDirs);
  if (!usr) return std::unexpected(usr.error());
  usr_dirs_ = std::move(*usr);
  if (auto st = MakeDir(base + "/usr/local", 0755); !st) return st;
  for (const char* sub : runtime::guest::kUsrLocalDirs) {
    if (auto st = MakeDir(base + "/usr/local/" + sub, 0755); !st) return st;
  }
  return {};
}

std::string GvisorEngine::RunscRoot(const std::string& id) const {
  return SandboxDir(id) + "/runsc";
}

Status GvisorEngine::Runsc(const std::string& id, const std::string& command) const {
  return RunProgramOk({options_.runsc_path, "--root", RunscRoot(id), command, id}, "",
                      kRunscTimeout);
}

Result<std::pair<std::string, int>> GvisorEngine::State(const std::string& id) const {
  auto r = RunProgram({options_.runsc_path, "--root", RunscRoot(id), "state", id}, "",
                      kRunscTimeout);
  if (!r) return std::unexpected(r.error());
  if (r->exit_code != 0) {
    return Fail(ErrorCode::kNotFound, "runsc has no sandbox " + id + ": " + r->output);
  }
  auto doc = json::parse(r->output, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc["status"].is_string() || !doc["pid"].is_number_integer()) {
    return Fail(ErrorCode::kInternal, "runsc state of " + id + " said: " + r->output);
  }
  return std::pair{doc["status"].get<std::string>(), doc["pid"].get<int>()};
}

bool GvisorEngine::Holds(const std::string& id) {
  std::lock_guard lock(mu_);
  return live_.contains(id);
}

bool GvisorEngine::IsHibernated(const std::string& id) {
  std::lock_guard lock(mu_);
  return hibernated_.contains(id);
}

std::vector<std::string> GvisorEngine::RunscFlags(const std::string& id, bool networked) {
  // --cpu-num-from-quota: the Sentry's CPU count (nproc, sched_getaffinity, os.cpu_count()
  // inside) is ceil(cpus), but never below 2 in this runsc (docs/design/gvisor.md, "Limits seen
  // from inside"); its memory (MemTotal) follows the memory limit without a flag.
  std::vector<std::string> flags = {
      options_.runsc_path, "--root",       RunscRoot(id), "--platform", options_.platform,
      "--network",         networked ? "host" : "none",  "--host-uds", "all",
      "--cpu-num-from-quota"};
  if (Traced(id)) flags.insert(flags.end(), {"--pod-init-config", TraceConfig(id)});
  return flags;
}

std::string GvisorEngine::TraceSocket(const std::string& id) const {
  return SandboxDir(id) + "/trace.sock";
}

std::string GvisorEngine::TraceConfig(const std::string& id) const {
  return SandboxDir(id) + "/trace.json";
}

bool GvisorEngine::Traced(const std::string& id) {
  std::lock_guard lock(mu_);
  return watch_ && watch_->Watching(id);
}

bool GvisorEngine::Trace(const std::string& id, bool running) {
  TraceWatch* watch = nullptr;
  {
    std::lock_guard lock(mu_);
    watch = watch_.get();
  }
  if (!watch) return false;
  Status st = WriteText(TraceConfig(id), TraceWatch::SessionConfig(TraceSocket(id)), 0600);
  if (st) st = watch->Add(id, TraceSocket(id));
  if (st && running) {
    // --force: the session of the same name, sending to the daemon that is gone, is replaced.
    st = RunProgramOk({options_.runsc_path, "--root", RunscRoot(id), "trace", "create", "--force",
                       "--config", TraceConfig(id), id},
                      "", kRunscTimeout);
  }
  if (!st) {
    spdlog::warn("process events of {}: {}", id, st.error().message());
    watch->Remove(id);
    return false;
  }
  return true;
}

Status GvisorEngine::WatchProcesses(runtime::ProcessEventSink sink) {
  if (!capabilities_.process_events) {
    return std::unexpected(runtime::Lacks(
        name(), "process_events",
        "report the processes of its sandboxes (" + process_events_unavailable_ + ")"));
  }
  std::vector<std::pair<std::string, bool>> held;  // id, running
  {
    std::lock_guard lock(mu_);
    if (watch_) return Fail(ErrorCode::kFailedPrecondition, "gVisor's processes are watched already");
    auto watch = TraceWatch::Start(std::move(sink));
    if (!watch) return std::unexpected(watch.error().Wrap("watching gVisor's processes"));
    watch_ = std::move(*watch);
    for (const std::string& id : live_) held.emplace_back(id, !hibernated_.contains(id));
  }
  for (const auto& [id, running] : held) Trace(id, running);
  return {};
}

runtime::ProcessEventCounters GvisorEngine::ProcessEventCounts() const {
  std::lock_guard lock(mu_);
  return watch_ ? watch_->Counts() : runtime::ProcessEventCounters{};
}

Result<int> GvisorEngine::StartRunsc(const std::string& id, const std::vector<std::string>& argv,
                                     const std::string& log) {
  // Every sandbox's cgroups are under one parent, which runsc makes as it starts one and the
  // last sandbox out removes (StopProcesses): a start that meets that removal fails to make its
  // own ("cannot set up cgroup ... no such file or directory") and is tried again, cleanly.
  for (int attempt = 1;; ++attempt) {
    auto ran = RunLogged(argv, log, kRunscTimeout);
    if (!ran || *ran == 0 || attempt == 3 ||
        Tail(log).find("cannot set up cgroup") == std::string::npos) {
      return ran;
    }
    if (auto st = ClearRun(id); !st) return std::unexpected(st.error());
  }
}

Result<UniqueFd> GvisorEngine::AwaitAgent(const std::string& id) {
  const std::string dir = SandboxDir(id);
  Result<UniqueFd> channel = Fail(ErrorCode::kUnavailable, "the agent did not listen");
  const auto deadline = Clock::now() + kAgentTimeout;
  while (!channel && Clock::now() < deadline) {
    channel = ConnectSocketIn(dir + "/run");
    if (!channel) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!channel) return std::unexpected(channel.error().Wrap(Tail(ConsoleLog(dir))));
  return channel;
}

Result<std::unique_ptr<runtime::Sandbox>> GvisorEngine::Create(const SandboxSpec& spec) {
  if (auto st = ValidateSandboxId(spec.id); !st) return std::unexpected(st.error());
  const runtime::RootSpec& root = spec.root;
  if (!root.host_usr && root.layers.empty()) {
    return Fail(ErrorCode::kInvalidArgument,
                "a root without the host's /usr needs the layer that holds its root file system");
  }
  if (!root.host_usr && !agent_static_) {
    return Fail(ErrorCode::kUnimplemented,
                "a sandbox on its own root file system needs a statically linked airlock-agent; "
                "this one is dynamic (a sanitizer build?)");
  }
  if (root.layers.size() > kMaxLayers) {
    return Fail(ErrorCode::kInvalidArgument,
                "a sandbox stacks at most " + std::to_string(kMaxLayers) + " layers");
  }
  for (const std::string& layer : root.layers) {
    if (!options_.layers->Has(layer)) {
      return Fail(ErrorCode::kNotFound, "layer " + layer + " does not exist");
    }
  }
  if (!spec.memory_image.empty()) {
    if (!IsMemoryImageId(spec.memory_image) ||
        !fs::is_directory(MemoryImageDir(spec.memory_image) + "/checkpoint")) {
      return Fail(ErrorCode::kNotFound, "memory image " + spec.memory_image + " does not exist");
    }
    if (!spec.netns.empty()) {
      return Fail(ErrorCode::kFailedPrecondition,
                  "a sandbox from a memory image cannot have a network on gVisor here (runsc "
                  "cannot save one on its host networking)");
    }
  }
  // The directory is the claim on the id: of two creates of one id exactly one goes on.
  const std::string dir = SandboxDir(spec.id);
  if (::mkdir(dir.c_str(), 0700) < 0) {
    if (errno == EEXIST) return Fail(ErrorCode::kAlreadyExists, "sandbox " + spec.id + " exists");
    return FailErrno("mkdir " + dir, errno);
  }
  auto fail = [&](Error e) -> Result<std::unique_ptr<runtime::Sandbox>> {
    (void)TearDown(spec.id);
    return std::unexpected(std::move(e).Wrap("creating gVisor sandbox " + spec.id));
  };
  for (const char* sub : {"/disk", "/rootfs", "/run", "/runsc"}) {
    if (auto st = MakeDir(dir + sub, 0700); !st) return fail(st.error());
  }
  // The writable layer: a tmpfs capped at disk_mb (size and inodes), as the jail's.
  const std::string disk = dir + "/disk";
  const std::string disk_opts = "size=" + std::to_string(spec.limits.disk_mb) +
                                "m,nr_inodes=" + std::to_string(InodesFor(spec.limits.disk_mb)) +
                                ",mode=0755";
  if (::mount("tmpfs", disk.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, disk_opts.c_str()) < 0) {
    return fail(ErrnoError("mounting the writable layer", errno));
  }
  // From a memory image: its files as the saved memory knows them (the writable layer of the
  // sandbox it was saved from, the guest files with it).
  const std::string image = spec.memory_image.empty() ? "" : MemoryImageDir(spec.memory_image);
  if (!image.empty()) {
    auto copied = RunProgramOk({"cp", "-a", "--", image + "/upper", disk + "/upper"}, "",
                               kRunscTimeout);
    if (!copied) return fail(copied.error().Wrap("copying the memory image's files"));
  }
  for (const char* sub : {"/upper", "/work"}) {
    if (auto st = MakeDir(disk + sub, 0755); !st) return fail(st.error());
  }
  // The layers by descriptor (a page holds many "/proc/self/fd/N:", not many long paths).
  std::vector<UniqueFd> layer_fds;
  std::string lowerdirs;
  for (const std::string& layer : root.layers) {
    auto fd = OpenFile(options_.layers->Path(layer), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (!fd) return fail(fd.error());
    lowerdirs += "/proc/self/fd/" + std::to_string(fd->get()) + ":";
    layer_fds.push_back(std::move(*fd));
  }
  const std::string overlay = "lowerdir=" + lowerdirs + SkeletonDir(root.host_usr) +
                              ",upperdir=" + disk + "/upper,workdir=" + disk + "/work,userxattr";
  const std::string rootfs = dir + "/rootfs";
  if (::mount("overlay", rootfs.c_str(), "overlay", MS_NOSUID | MS_NODEV, overlay.c_str()) < 0) {
    return fail(ErrnoError("mounting the root overlay", errno));
  }
  layer_fds.clear();
  if (image.empty()) {
    if (auto st = WriteGuestFiles(rootfs, spec); !st) return fail(st.error());
  }
  const json config = RuntimeSpec(spec, dir, options_.agent_path, SeccompPath(), top_dirs_,
                                  usr_dirs_, options_.cgroup_parent);
  if (auto st = WriteText(dir + "/config.json", config.dump(1), 0600); !st) return fail(st.error());
  Trace(spec.id, /*running=*/false);  // runsc connects as it starts (RunscFlags)
  if (!image.empty()) {
    {
      std::lock_guard lock(mu_);
      live_.insert(spec.id);
    }
    auto restored = RestoreFrom(spec.id, image + "/checkpoint");
    if (!restored) return fail(restored.error());
    SandboxInfo info;
    info.id = spec.id;
    info.engine_state = json{{"pid", restored->second}}.dump();
    return std::make_unique<runtime::CreatedSandbox>(std::move(info),
                                                     std::move(restored->first));
  }

  const std::string log = ConsoleLog(dir);
  std::vector<std::string> argv = RunscFlags(spec.id, !spec.netns.empty());
  argv.insert(argv.end(),
              {"run", "--detach", "--pid-file", PidFile(dir), "--bundle", dir, spec.id});
  auto ran = StartRunsc(spec.id, argv, log);
  if (!ran) return fail(ran.error());
  if (*ran != 0) {
    return fail(Error(ErrorCode::kInternal, "runsc run exited " + std::to_string(*ran) + ": " +
                                                Tail(log)));
  }
  {
    std::lock_guard lock(mu_);
    live_.insert(spec.id);
  }
  auto channel = AwaitAgent(spec.id);
  if (!channel) return fail(channel.error());
  auto pid = ReadPid(dir);
  if (!pid) return fail(pid.error());
  SandboxInfo info;
  info.id = spec.id;
  info.engine_state = json{{"pid", *pid}}.dump();
  return std::make_unique<runtime::CreatedSandbox>(std::move(info), std::move(*channel));
}

Status GvisorEngine::StopProcesses(const std::string& id) {
  // Not `runsc delete`: it waits a second or more for a sandbox to stop, and needs state a crash
  // may have lost.
  return RemoveSandboxCgroups(options_.cgroup_parent, id);
}

Status GvisorEngine::TearDown(const std::string& id) {
  const std::string dir = SandboxDir(id);
  {
    std::lock_guard lock(mu_);
    if (watch_) watch_->Remove(id);
  }
  // runsc's state goes with the sandbox's directory (its --root is in it).
  Status result = StopProcesses(id);
  for (const char* sub : {"/rootfs", "/disk"}) {
    const std::string point = dir + sub;
    if (::umount2(point.c_str(), MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT &&
        result) {
      result = FailErrno("unmounting " + point, errno);
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec && result) result = Fail(ErrorCode::kInternal, "removing " + dir + ": " + ec.message());
  {
    std::lock_guard lock(mu_);
    live_.erase(id);
    hibernated_.erase(id);
  }
  return result;
}

Status GvisorEngine::Destroy(const std::string& id) {
  if (auto st = ValidateSandboxId(id); !st) return st;
  if (auto st = TearDown(id); !st) return std::unexpected(st.error().Wrap("destroying " + id));
  return {};
}

Result<UniqueFd> GvisorEngine::ConnectAgent(const std::string& id) {
  if (auto st = ValidateSandboxId(id); !st) return std::unexpected(st.error());
  if (!Holds(id)) return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held here");
  if (IsHibernated(id)) {
    return Fail(ErrorCode::kFailedPrecondition, "sandbox " + id + " is hibernated");
  }
  return ConnectSocketIn(SandboxDir(id) + "/run");
}

Result<SandboxInfo> GvisorEngine::Adopt(const std::string& id, const std::string& engine_state,
                                        runtime::SandboxState wanted) {
  if (auto st = ValidateSandboxId(id); !st) return std::unexpected(st.error());
  auto doc = json::parse(engine_state, nullptr, /*allow_exceptions=*/false);
  const bool hibernated = wanted == runtime::SandboxState::kHibernated;
  const bool valid =
      doc.is_object() && doc.size() == 1 &&
      (hibernated ? doc["hibernated"].is_boolean() && doc["hibernated"].get<bool>()
                  : doc["pid"].is_number_integer() && doc["pid"].get<int64_t>() > 1);
  if (!valid) {
    return Fail(ErrorCode::kInvalidArgument, "engine state of " + id + " is not the gVisor "
                                             "engine's for a " +
                                             (hibernated ? "hibernated" : "live") +
                                             " sandbox: " + engine_state);
  }
  if (Holds(id)) return Fail(ErrorCode::kAlreadyExists, "sandbox " + id + " is held already");
  SandboxInfo info;
  info.id = id;
  info.state = wanted;
  if (hibernated) {
    // Nothing of it runs: its image and its files are what there is to take over.
    if (!fs::is_directory(HibernationImage(id))) {
      return Fail(ErrorCode::kNotFound,
                  "sandbox " + id + " has no memory image (" + HibernationImage(id) + ")");
    }
    info.engine_state = engine_state;
    {
      std::lock_guard lock(mu_);
      live_.insert(id);
      hibernated_.insert(id);
    }
    Trace(id, /*running=*/false);  // for its wake
    return info;
  }
  auto state = State(id);
  const std::string image = HibernationImage(id);
  if ((!state || state->first == "stopped") && wanted == runtime::SandboxState::kRunning &&
      fs::is_directory(image)) {
    // A daemon that stopped after a hibernate's checkpoint and before recording it: the sandbox
    // is saved whole, and is restored here, running as its record says.
    (void)ClearRun(id);
    Trace(id, /*running=*/false);
    auto restored = RestoreFrom(id, image);
    if (!restored) return std::unexpected(restored.error().Wrap("restoring its saved memory"));
    std::error_code ec;
    fs::remove_all(image, ec);
    std::lock_guard lock(mu_);
    live_.insert(id);
    info.engine_state = json{{"pid", restored->second}}.dump();
    return info;
  }
  if (!state) return std::unexpected(state.error());
  const auto& [status, pid] = *state;
  if (pid != doc["pid"].get<int>() || (status != "running" && status != "paused")) {
    return Fail(ErrorCode::kNotFound, "sandbox " + id + " is " + status + " (pid " +
                                          std::to_string(pid) + "), not the one recorded");
  }
  const bool paused = wanted == runtime::SandboxState::kPaused;
  if (paused && status == "running") {
    if (auto st = Runsc(id, "pause"); !st) return std::unexpected(st.error());
  } else if (!paused && status == "paused") {
    if (auto st = Runsc(id, "resume"); !st) return std::unexpected(st.error());
  }
  // A daemon that stopped between its agent's quiesce and the checkpoint (of a hibernate or a
  // fork with memory) left the agent without a socket, waiting for its wake file: woken here.
  const std::string run = SandboxDir(id) + "/run/";
  struct stat socket;
  if (!paused && ::lstat((run + kAgentSocket).c_str(), &socket) < 0) {
    if (auto st = WriteText(run + kWakeFile, "", 0600); !st) return std::unexpected(st.error());
    auto channel = AwaitAgent(id);
    if (!channel) return std::unexpected(channel.error().Wrap("waking its quiesced agent"));
  }
  {
    std::lock_guard lock(mu_);
    live_.insert(id);
  }
  Trace(id, /*running=*/true);
  info.engine_state = json{{"pid", pid}}.dump();
  return info;
}

Result<std::vector<std::string>> GvisorEngine::ListSandboxes() {
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.state_dir + "/gvisor/sandboxes", ec)) {
    ids.push_back(entry.path().filename());
  }
  if (ec) return Fail(ErrorCode::kInternal, "listing gVisor sandboxes: " + ec.message());
  return ids;
}

Status GvisorEngine::UpdateLimits(const std::string&, const runtime::Limits&) {
  return std::unexpected(runtime::Lacks(name(), "live_limits", "change a running sandbox's limits"));
}

Result<runtime::LayerSnapshot> GvisorEngine::SnapshotLayer(const std::string& id) {
  if (auto st = ValidateSandboxId(id); !st) return std::unexpected(st.error());
  if (!Holds(id)) return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held here");
  if (IsHibernated(id)) {
    return Fail(ErrorCode::kFailedPrecondition, "sandbox " + id + " is hibernated");
  }
  // Frozen while copied, so that the layer is one moment of it.
  if (auto st = Runsc(id, "pause"); !st) return std::unexpected(st.error());
  auto upper = OpenFile(SandboxDir(id) + "/disk/upper", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  Result<runtime::LayerSnapshot> layer =
      upper ? options_.layers->Import(upper->get(), 0) : std::unexpected(upper.error());
  if (auto st = Runsc(id, "resume"); !st && layer) return std::unexpected(st.error());
  return layer;
}

Result<runtime::SandboxStats> GvisorEngine::Stats(const std::string& id) {
  if (auto st = ValidateSandboxId(id); !st) return std::unexpected(st.error());
  if (!Holds(id)) return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held here");
  if (IsHibernated(id)) {
    return Fail(ErrorCode::kFailedPrecondition, "sandbox " + id + " is hibernated");
  }
  // runsc's cgroups hold the Sentry, the gofer and their threads: the host's view of the
  // sandbox (its memory is the Sentry's, which includes the sandbox's processes and /tmp).
  runtime::SandboxStats stats;
  runtime::ReadCgroupStats(CgroupDirs(options_.cgroup_parent + "/" + id), stats);
  stats.disk_bytes = runtime::FileSystemUsedBytes(SandboxDir(id) + "/disk");
  return stats;
}

Status GvisorEngine::Alive(const std::string& id) {
  if (auto st = ValidateSandboxId(id); !st) return st;
  if (!Holds(id)) return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held here");
  if (IsHibernated(id)) {
    if (fs::is_directory(HibernationImage(id))) return {};
    return Fail(ErrorCode::kFailedPrecondition,
                "its memory image is gone (" + HibernationImage(id) + ")");
  }
  auto state = State(id);
  if (state && (state->first == "running" || state->first == "paused") &&
      ProcessRuns(state->second)) {
    return {};
  }
  // The Sentry is the sandbox's kernel: when the host's OOM killer ends it (memory_mb caps the
  // whole sandbox on gVisor), every process in the sandbox goes with it.
  if (OomKills(CgroupDirs(options_.cgroup_parent + "/" + id)) > 0) {
    return Fail(ErrorCode::kFailedPrecondition,
                "the host's OOM killer ended its gVisor sandbox: together its processes and "
                "gVisor's kernel used more than its memory limit (memory_mb)");
  }
  return Fail(ErrorCode::kFailedPrecondition,
              "its gVisor sandbox stopped (" +
                  (state ? "runsc says " + state->first : state.error().message()) + ")");
}

Status GvisorEngine::Pause(const std::string& id) {
  if (!Holds(id)) return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held here");
  if (IsHibernated(id)) {
    return Fail(ErrorCode::kFailedPrecondition, "sandbox " + id + " is hibernated");
  }
  return Runsc(id, "pause");
}

Status GvisorEngine::Resume(const std::string& id) {
  if (!Holds(id)) return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held here");
  if (IsHibernated(id)) {
    return Fail(ErrorCode::kFailedPrecondition, "sandbox " + id + " is hibernated (wake it)");
  }
  return Runsc(id, "resume");
}

Status GvisorEngine::CheckSaveable(const std::string& id) {
  if (auto st = ValidateSandboxId(id); !st) return st;
  if (!Holds(id)) return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held here");
  if (IsHibernated(id)) {
    return Fail(ErrorCode::kFailedPrecondition, "sandbox " + id + " is hibernated");
  }
  if (HasNetwork(SandboxDir(id))) {
    return Fail(ErrorCode::kFailedPrecondition,
                "sandbox " + id + " has a network, and runsc cannot save a sandbox on its host "
                "networking (gVisor's own network stack does not start on this kernel: "
                "docs/design/gvisor.md); only a sandbox made with network mode \"none\" can be "
                "saved with its memory on gVisor here");
  }
  return {};
}

Status GvisorEngine::SaveTo(const std::string& id, const std::string& image) {
  const std::string dir = SandboxDir(id);
  const std::string wake = dir + "/run/" + kWakeFile;
  if (::unlink(wake.c_str()) < 0 && errno != ENOENT) return FailErrno("removing " + wake, errno);
  // The agent closes its listener and every channel (a host socket cannot be saved), or refuses
  // while something is in progress; the sandbox runs on either way.
  auto fd = ConnectSocketIn(dir + "/run");
  if (!fd) return std::unexpected(fd.error());
  auto client = protocol::BlockingClient::Connect(std::move(*fd), "airlock gVisor engine");
  if (!client) return std::unexpected(client.error());
  if (auto st = client->Quiesce(std::string(kRunInside) + "/" + kWakeFile); !st) {
    return std::unexpected(st.error().Wrap("the agent"));
  }
  // Written aside and renamed once whole: an image under its own name is a complete one (what
  // Adopt restores after a crash).
  const std::string partial = image + ".partial";
  std::error_code ec;
  fs::remove_all(image, ec);
  fs::remove_all(partial, ec);
  const std::string log = ConsoleLog(dir);
  auto ran = RunLogged({options_.runsc_path, "--root", RunscRoot(id), "checkpoint",
                        "--image-path", partial, id},
                       log, kRunscTimeout);
  if (ran && *ran == 0) {
    if (::rename(partial.c_str(), image.c_str()) == 0) return {};
    ran = std::unexpected(ErrnoError("renaming the image", errno));
  }
  Error why = ran ? Error(ErrorCode::kInternal,
                          "runsc checkpoint exited " + std::to_string(*ran) + ": " + Tail(log))
                  : ran.error();
  fs::remove_all(partial, ec);
  // A checkpoint refused before it began leaves the sandbox running: its agent is woken and
  // listens again. One that failed midway leaves it stopped (runsc's own doing): it is gone.
  auto state = State(id);
  if (state && state->first == "running") {
    if (auto st = WriteText(wake, "", 0600); st && AwaitAgent(id)) {
      return std::unexpected(why.Wrap("(it runs on)"));
    }
  }
  (void)StopProcesses(id);
  return std::unexpected(why.Wrap("(it stopped)"));
}

Status GvisorEngine::ClearRun(const std::string& id) {
  // The Sentry ends after a checkpoint; what is left of the sandbox's processes and runsc's
  // record of it goes, so that a restore starts clean under the same id.
  Status stopped = StopProcesses(id);
  std::error_code ec;
  fs::remove_all(RunscRoot(id), ec);
  if (auto st = MakeDir(RunscRoot(id), 0700); !st) return st;
  return stopped;
}

Result<std::pair<UniqueFd, int>> GvisorEngine::RestoreFrom(const std::string& id,
                                                           const std::string& image) {
  const std::string dir = SandboxDir(id);
  auto fail = [&](Error e) -> Result<std::pair<UniqueFd, int>> {
    (void)ClearRun(id);
    return std::unexpected(std::move(e));
  };
  // The agent looks for this as soon as it runs again.
  if (auto st = WriteText(dir + "/run/" + kWakeFile, "", 0600); !st) return fail(st.error());
  // stdio: files, never pipes. The restored processes keep what the restore had, and a pipe
  // would hold whoever reads it for as long as the sandbox lives.
  const std::string log = ConsoleLog(dir);
  std::vector<std::string> argv = RunscFlags(id, HasNetwork(dir));
  argv.insert(argv.end(), {"restore", "--image-path", image, "--pid-file", PidFile(dir),
                           "--bundle", dir, "--detach", id});
  auto ran = StartRunsc(id, argv, log);
  if (!ran) return fail(ran.error());
  if (*ran != 0) {
    return fail(Error(ErrorCode::kInternal,
                      "runsc restore exited " + std::to_string(*ran) + ": " + Tail(log)));
  }
  auto channel = AwaitAgent(id);
  if (!channel) return fail(channel.error());
  auto pid = ReadPid(dir);
  if (!pid) return fail(pid.error());
  return std::pair{std::move(*channel), *pid};
}

Result<runtime::Hibernation> GvisorEngine::Hibernate(const std::string& id) {
  if (auto st = CheckSaveable(id); !st) return std::unexpected(st.error().Wrap("hibernating " + id));
  const std::string image = HibernationImage(id);
  if (auto st = SaveTo(id, image); !st) return std::unexpected(st.error().Wrap("hibernating " + id));
  if (auto st = ClearRun(id); !st) return std::unexpected(st.error());
  {
    std::lock_guard lock(mu_);
    hibernated_.insert(id);
  }
  return runtime::Hibernation{.image_bytes = TreeBytes(image),
                              .engine_state = json{{"hibernated", true}}.dump()};
}

Result<std::unique_ptr<runtime::Sandbox>> GvisorEngine::Wake(const std::string& id) {
  if (auto st = ValidateSandboxId(id); !st) return std::unexpected(st.error());
  if (!Holds(id)) return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held here");
  if (!IsHibernated(id)) {
    return Fail(ErrorCode::kFailedPrecondition, "sandbox " + id + " is not hibernated");
  }
  const std::string image = HibernationImage(id);
  auto restored = RestoreFrom(id, image);
  if (!restored) return std::unexpected(restored.error().Wrap("waking " + id));
  std::error_code ec;
  fs::remove_all(image, ec);  // spent: the sandbox has moved on from it
  {
    std::lock_guard lock(mu_);
    hibernated_.erase(id);
  }
  SandboxInfo info;
  info.id = id;
  info.engine_state = json{{"pid", restored->second}}.dump();
  return std::make_unique<runtime::CreatedSandbox>(std::move(info), std::move(restored->first));
}

std::string GvisorEngine::HibernationImage(const std::string& id) const {
  return SandboxDir(id) + "/" + kMemoryImage;
}

std::string GvisorEngine::MemoryImageDir(const std::string& image) const {
  return options_.state_dir + "/gvisor/memory-images/" + image;
}

Result<runtime::MemoryImage> GvisorEngine::SaveMemoryImage(const std::string& id,
                                                           const ImageSaved& saved) {
  if (auto st = CheckSaveable(id); !st) {
    return std::unexpected(st.error().Wrap("saving the memory of " + id));
  }
  runtime::MemoryImage image;
  image.id = "mem-" + NewSandboxId().substr(4);
  const std::string dir = MemoryImageDir(image.id);
  if (::mkdir(dir.c_str(), 0700) < 0) return FailErrno("mkdir " + dir, errno);
  auto fail = [&](Error e) -> Result<runtime::MemoryImage> {
    std::error_code ec;
    fs::remove_all(dir, ec);
    return std::unexpected(std::move(e).Wrap("saving the memory of " + id));
  };
  if (auto st = SaveTo(id, dir + "/checkpoint"); !st) return fail(st.error());
  // The files as the memory knows them: the sandbox's writable layer at the checkpoint (it is
  // stopped until the restore below).
  auto copied = RunProgramOk(
      {"cp", "-a", "--", SandboxDir(id) + "/disk/upper", dir + "/upper"}, "", kRunscTimeout);
  // Whole: the caller may start sandboxes from it while this one comes back.
  bool handed_out = false;
  if (copied) {
    image.bytes = TreeBytes(dir);
    if (saved) {
      saved(image);
      handed_out = true;
    }
  }
  // The sandbox goes on from its own image, whatever happened to the copy.
  (void)ClearRun(id);
  auto restored = RestoreFrom(id, dir + "/checkpoint");
  if (!restored) {
    Error why = restored.error().Wrap("restoring it after the save (it is stopped)");
    if (handed_out) return std::unexpected(std::move(why).Wrap("saving the memory of " + id));
    return fail(std::move(why));
  }
  if (!copied) return fail(copied.error().Wrap("copying its writable layer"));
  image.engine_state = json{{"pid", restored->second}}.dump();
  return image;
}

Status GvisorEngine::RemoveMemoryImage(const std::string& image) {
  if (!IsMemoryImageId(image)) {
    return Fail(ErrorCode::kInvalidArgument, "not a memory image: " + image);
  }
  std::error_code ec;
  fs::remove_all(MemoryImageDir(image), ec);
  if (ec) return Fail(ErrorCode::kInternal, "removing memory image " + image + ": " + ec.message());
  return {};
}

Result<std::vector<std::string>> GvisorEngine::ListMemoryImages() {
  std::vector<std::string> images;
  std::error_code ec;
  for (fs::directory_iterator it(options_.state_dir + "/gvisor/memory-images", ec), end;
       !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (IsMemoryImageId(name)) images.push_back(std::move(name));
  }
  if (ec) return Fail(ErrorCode::kInternal, "listing memory images: " + ec.message());
  return images;
}

Status GvisorEngine::Probe() {
  runtime::SandboxSpec spec;
  spec.limits.memory_mb = 64;
  spec.limits.disk_mb = 16;
  spec.limits.tmp_mb = 16;
  return runtime::ProbeByCreate(*this, std::move(spec));
}

PlatformChoice ChoosePlatform(const std::string& runsc_path, const std::string& work,
                              const std::string& cgroup_parent) {
  const int kvm = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (kvm < 0) return {"ptrace", std::string("no usable /dev/kvm: ") + std::strerror(errno)};
  ::close(kvm);
  // A sandbox of the host's root, read-only, that runs `true`: on a KVM that cannot run a
  // guest runsc hangs as the Sentry starts, so the trial has a deadline. Its cgroups are under
  // the engine's parent, named for this process (daemons may start side by side), and go after.
  const std::string cgroup = "platform-trial-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(work, ec);
  const json config = {
      {"ociVersion", "1.0.0"},
      {"process",
       {{"user", {{"uid", 0}, {"gid", 0}}},
        {"args", {"/bin/true"}},
        {"env", {"PATH=/usr/bin:/bin"}},
        {"cwd", "/"}}},
      {"root", {{"path", "/"}, {"readonly", true}}},
      {"hostname", "airlock-platform-trial"},
      {"mounts", {{{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}}}},
      {"linux",
       {{"namespaces",
         {{{"type", "pid"}}, {{"type", "ipc"}}, {{"type", "uts"}}, {{"type", "mount"}}}},
        {"cgroupsPath", "/" + cgroup_parent + "/" + cgroup}}}};
  PlatformChoice choice{"ptrace", ""};
  if (auto st = MakeDir(work, 0700); !st) {
    choice.why = "the KVM trial could not be set up: " + st.error().message();
  } else if (auto written = WriteText(work + "/config.json", config.dump(), 0600); !written) {
    choice.why = "the KVM trial could not be set up: " + written.error().message();
  } else {
    const std::vector<std::string> runsc = {runsc_path, "--root", work + "/runsc", "--platform",
                                            "kvm", "--network", "none"};
    std::vector<std::string> run = runsc;
    run.insert(run.end(), {"run", "--bundle", work, "airlock-platform-trial"});
    auto ran = RunProgram(run, "", kKvmTrial);
    if (ran && ran->exit_code == 0) {
      choice = {"kvm", "a runsc sandbox on KVM ran"};
    } else {
      const std::string output =
          ran && ran->output.size() > 600 ? ran->output.substr(ran->output.size() - 600)
          : ran                           ? ran->output
                                          : "";
      choice.why = ran ? "/dev/kvm is there but a runsc sandbox on KVM failed: " + output
                       : "/dev/kvm is there but a runsc sandbox on KVM did not run `true` "
                         "within " + std::to_string(kKvmTrial.count()) + " s";
      // What the trial left (a sandbox runsc did not end when it was killed) goes.
      std::vector<std::string> del = runsc;
      del.insert(del.end(), {"delete", "--force", "airlock-platform-trial"});
      (void)RunProgram(del, "", std::chrono::seconds(5));
    }
  }
  if (auto removed = RemoveSandboxCgroups(cgroup_parent, cgroup); !removed) {
    choice.why += " (" + removed.error().message() + ")";
  }
  fs::remove_all(work, ec);
  return choice;
}

Result<std::unique_ptr<runtime::Engine>> MakeEngine(
    const runtime::EngineContext& context, const std::map<std::string, std::string>& options) {
  GvisorOptions o;
  o.platform = "auto";
  o.state_dir = context.state_dir;
  o.agent_path = context.agent_path;
  o.layers = context.layers;
  auto bad = [](const std::string& key, const std::string& why) {
    return Fail(ErrorCode::kInvalidArgument, key + ": " + why);
  };
  for (const auto& [key, value] : options) {
    if (key == "runsc") {
      if (!value.starts_with('/')) return bad(key, "must be an absolute path");
      o.runsc_path = value;
    } else if (key == "platform") {
      if (value != "ptrace" && value != "kvm" && value != "auto") {
        return bad(key, "must be auto, ptrace or kvm");
      }
      o.platform = value;
    } else if (key == "cgroup_parent") {
      if (value.empty() || value.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-_") !=
                               std::string::npos) {
        return bad(key, "must be a name of [a-z0-9_-]");
      }
      o.cgroup_parent = value;
    } else {
      return bad(key, "the gVisor engine has no such option (runsc, platform, cgroup_parent)");
    }
  }
  auto engine = GvisorEngine::Open(std::move(o));
  if (!engine) return std::unexpected(engine.error());
  return std::unique_ptr<runtime::Engine>(std::move(*engine));
}

}  // namespace airlock::gvisor
