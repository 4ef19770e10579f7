#include "runtime/jail/jail_engine.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <optional>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <thread>

#include "common/elf.h"
#include "common/helpers.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/syscall.h"
#include "protocol/client.h"
#include "runtime/cgroup_stats.h"
#include "runtime/guest_files.h"
#include "runtime/jail/contain.h"
#include "runtime/jail/limits_view.h"
#include "runtime/seccomp_policy.h"

extern char** environ;

namespace airlock::jail {
namespace {

namespace fs = std::filesystem;

// How often the viewer thread rewrites every sandbox's /proc/meminfo view.
constexpr auto kViewRefresh = std::chrono::seconds(1);
using runtime::SandboxInfo;
using runtime::SandboxSpec;

Status MakeDir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) < 0 && errno != EEXIST) return FailErrno("mkdir " + path, errno);
  if (::chmod(path.c_str(), mode) < 0) return FailErrno("chmod " + path, errno);
  return {};
}

// An fd number above the ones posix_spawn will dup onto, so that no dup2 is onto itself.
Result<UniqueFd> HighDup(int fd) {
  int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  if (high < 0) return FailErrno("fcntl(F_DUPFD_CLOEXEC)", errno);
  return UniqueFd(high);
}

// Reads one line (up to 512 bytes) from `fd`, waiting at most `timeout`.
Result<std::string> ReadLine(int fd, std::chrono::milliseconds timeout) {
  std::string line;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (line.find('\n') == std::string::npos && line.size() < 512) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    int r = RetryEintr(
        [&] { return ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))); });
    if (r < 0) return FailErrno("poll", errno);
    if (r == 0)
      return Fail(ErrorCode::kDeadlineExceeded, "the jail launcher did not report in time");
    char buf[128];
    ssize_t n = RetryEintr([&] { return ::read(fd, buf, sizeof buf); });
    if (n < 0) return FailErrno("reading the jail launcher's report", errno);
    if (n == 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  return line;
}

// The agent's socket: bound and connected through an O_PATH descriptor of the sandbox directory,
// so that a long state dir cannot overflow sun_path.
constexpr const char* kAgentSocket = "agent.sock";

// A fresh socket and the address of `dir`/agent.sock, reached through `dir_fd` (kept open
// while the address is used).
struct AgentSocket {
  UniqueFd dir_fd;
  UniqueFd fd;
  sockaddr_un addr{};
};

Result<AgentSocket> OpenAgentSocket(const std::string& dir) {
  AgentSocket s;
  auto dir_fd = OpenFile(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (!dir_fd) return std::unexpected(dir_fd.error());
  s.dir_fd = std::move(*dir_fd);
  s.addr.sun_family = AF_UNIX;
  const std::string path = "/proc/self/fd/" + std::to_string(s.dir_fd.get()) + "/" + kAgentSocket;
  std::memcpy(s.addr.sun_path, path.c_str(), path.size() + 1);
  s.fd = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.fd) return FailErrno("socket", errno);
  return s;
}

// A listening socket at `dir`/agent.sock, mode 0600 (root on the host only).
Result<UniqueFd> ListenAgentSocket(const std::string& dir) {
  auto s = OpenAgentSocket(dir);
  if (!s) return std::unexpected(s.error());
  if (::bind(s->fd.get(), reinterpret_cast<const sockaddr*>(&s->addr), sizeof s->addr) < 0) {
    return FailErrno("binding " + dir + "/" + kAgentSocket, errno);
  }
  if (::fchmodat(s->dir_fd.get(), kAgentSocket, 0600, 0) < 0) {
    return FailErrno("chmod " + dir + "/" + kAgentSocket, errno);
  }
  if (::listen(s->fd.get(), 128) < 0) return FailErrno("listen", errno);
  return std::move(s->fd);
}

Result<UniqueFd> ConnectAgentSocket(const std::string& dir) {
  auto s = OpenAgentSocket(dir);
  if (!s) return std::unexpected(s.error());
  if (RetryEintr([&] {
        return ::connect(s->fd.get(), reinterpret_cast<const sockaddr*>(&s->addr), sizeof s->addr);
      }) < 0) {
    const int err = errno;
    Error e = ErrnoError("connecting to the agent at " + dir + "/" + kAgentSocket, err);
    if (e.sys_errno() == ENOENT || e.sys_errno() == ECONNREFUSED) {
      e = Error(ErrorCode::kUnavailable, e.message(), e.sys_errno());
    }
    return std::unexpected(std::move(e));
  }
  return std::move(s->fd);
}

// Waits (bounded) for a child of ours to be gone; a pid that is not our child is not waited for.
void Reap(pid_t pid, std::chrono::milliseconds timeout) {
  if (pid <= 0) return;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    pid_t r = ::waitpid(pid, nullptr, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return;
    if (std::chrono::steady_clock::now() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

Result<std::unique_ptr<JailEngine>> JailEngine::Open(JailOptions options) {
  if (::geteuid() != 0) {
    return Fail(ErrorCode::kFailedPrecondition, "the jail engine needs root (it maps uid ranges)");
  }
  for (const auto* path : {&options.launcher_path, &options.agent_path}) {
    if (::access(path->c_str(), X_OK) != 0) return FailErrno("jail engine: " + *path, errno);
  }
  auto layout = CgroupLayout::Detect(options.cgroup_root);
  if (!layout) return std::unexpected(layout.error().Wrap("jail engine: cgroups"));
  if (options.layers == nullptr) {
    return Fail(ErrorCode::kInvalidArgument, "jail engine: no layer store");
  }
  std::unique_ptr<JailEngine> rt(new JailEngine(std::move(options), std::move(*layout)));
  // Sandbox roots own nothing on the host, so every directory on the way to their mount points
  // must be searchable by anyone (but need not be listable).
  if (auto st = MakeDir(rt->options_.state_dir, 0711); !st) return std::unexpected(st.error());
  for (const char* sub : {"/jail", "/templates"}) {
    if (auto st = MakeDir(rt->options_.state_dir + sub, 0711); !st) {
      return std::unexpected(st.error());
    }
  }
  if (auto st = rt->PrepareTemplates(); !st) return std::unexpected(st.error());
  rt->viewer_ = std::thread([engine = rt.get()] { engine->RefreshViews(); });
  if (rt->options_.base_usr_local) {
    spdlog::warn("base_usr_local: sandboxes on base see the host's /usr/local (read-only)");
  }
  auto interp = ElfNeedsInterpreter(rt->options_.agent_path);
  if (!interp) return std::unexpected(interp.error().Wrap("jail engine: the agent"));
  rt->agent_static_ = !*interp;
  // The seccomp policy is compiled once and handed to every launcher, sealed.
  auto seccomp = runtime::SeccompProgram::Compile();
  if (!seccomp) return std::unexpected(seccomp.error());
  UniqueFd memfd(::memfd_create("airlock-seccomp-bpf", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!memfd) return FailErrno("memfd_create", errno);
  if (auto st = WriteAll(memfd.get(), seccomp->bytes()); !st) return std::unexpected(st.error());
  if (::fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) <
      0) {
    return FailErrno("sealing the seccomp program", errno);
  }
  // Above the fds the launcher gets (3, 4, 5), so that no dup2 onto them clobbers it.
  auto high = HighDup(memfd.get());
  if (!high) return std::unexpected(high.error());
  rt->seccomp_bpf_ = std::move(*high);
  // The flight recorder's processes: a subscription to the kernel's process events, tried now
  // so that the capability says whether WatchProcesses will work.
  rt->process_events_unavailable_ = ProcessWatch::CanSubscribe();
  rt->capabilities_.process_events = rt->process_events_unavailable_.empty();
  if (!rt->capabilities_.process_events) {
    spdlog::warn("jail engine: no process events for the flight recorder: {}",
                 rt->process_events_unavailable_);
  }
  return rt;
}

JailEngine::JailEngine(JailOptions options, CgroupLayout layout)
    : options_(std::move(options)),
      layout_(std::move(layout)),
      uids_(options_.uid_first, options_.uid_slots) {
  capabilities_.limits = true;        // cgroups
  capabilities_.pause = true;         // the cgroup freezer
  capabilities_.live_limits = true;   // cgroup limits written in place
  capabilities_.layer_snapshot = true;
  capabilities_.host_usr_root = true;
  capabilities_.networking = true;    // the launcher joins the namespace before it clones
  capabilities_.max_layers = kMaxLayers;
  capabilities_.isolation =
      "Linux namespaces, seccomp, cgroups and a uid range of its own (the host's kernel)";
  capabilities_.agent_channel = "a unix socket in the sandbox's directory on the host";
}

JailEngine::~JailEngine() {
  watch_.reset();  // its threads joined before anything they read goes
  {
    std::lock_guard lock(viewer_mu_);
    stop_viewer_ = true;
  }
  viewer_cv_.notify_all();
  if (viewer_.joinable()) viewer_.join();
  // rmdir fails (EBUSY, ENOTEMPTY) while any sandbox cgroup is left, which is what we want.
  if (!layout_.v2_parent.empty()) ::rmdir(layout_.v2_parent.c_str());
  for (const auto& [controller, dir] : layout_.v1_parents) ::rmdir(dir.c_str());
}

std::string JailEngine::SandboxDir(const std::string& id) const {
  return options_.state_dir + "/jail/" + id;
}

// The roots' lowest layers: templates/base (the host's /usr) and templates/rootfs.
std::string JailEngine::TemplateDir(bool host_usr) const {
  return options_.state_dir + (host_usr ? "/templates/base" : "/templates/rootfs");
}

// The base root's lowest layer: empty mount points, and /bin, /lib, ... as the host has them
// (symlinks into /usr on a merged-/usr host; otherwise bound read-only at create); in /usr, the
// same for kHostUsrDirs (a mount point, or the host's symlink, such as /usr/lib64 -> lib). The
// rootfs root's: only the mount points, under an imported root file system that may lack them.
Status JailEngine::PrepareTemplates() {
  std::string rootfs = TemplateDir(/*host_usr=*/false);
  if (auto st = MakeDir(rootfs, 0755); !st) return st;
  for (const char* sub : {"proc", "dev", "tmp", "sys"}) {  // chown-free: mount points only
    if (auto st = MakeDir(rootfs + "/" + sub, 0755); !st) return st;
  }
  std::string dir = TemplateDir(/*host_usr=*/true);
  if (auto st = MakeDir(dir, 0755); !st) return st;
  for (const char* sub : {"usr", "proc", "dev", "tmp", "sys", "run"}) {
    if (auto st = MakeDir(dir + "/" + sub, 0755); !st) return st;
  }
  auto top = runtime::guest::MirrorHostEntries("", dir, runtime::guest::kHostTopDirs);
  if (!top) return std::unexpected(top.error());
  ro_binds_.clear();
  for (const std::string& name : *top) ro_binds_.push_back("/" + name);
  auto usr = runtime::guest::MirrorHostEntries("/usr", dir + "/usr", runtime::guest::kHostUsrDirs);
  if (!usr) return std::unexpected(usr.error());
  usr_dirs_ = std::move(*usr);
  // Said now rather than by every create's failed bind.
  struct stat local;
  if (options_.base_usr_local && (::stat("/usr/local", &local) < 0 || !S_ISDIR(local.st_mode))) {
    return Fail(ErrorCode::kInvalidArgument,
                "base_usr_local is set, but the host has no /usr/local directory");
  }
  return {};
}

Result<std::unique_ptr<runtime::Sandbox>> JailEngine::Create(const SandboxSpec& spec) {
  if (auto st = ValidateSandboxId(spec.id); !st) return std::unexpected(st.error());
  if (!spec.memory_image.empty()) {
    return std::unexpected(runtime::Lacks(name(), "memory_fork", "start from a memory image"));
  }
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
    return Fail(ErrorCode::kInvalidArgument, "a sandbox stacks at most " +
                                                 std::to_string(kMaxLayers) + " layers");
  }
  for (const std::string& layer : root.layers) {
    if (!options_.layers->Has(layer)) {
      return Fail(ErrorCode::kNotFound, "layer " + layer + " does not exist");
    }
  }
  {
    std::lock_guard lock(mu_);
    if (live_.contains(spec.id)) {
      return Fail(ErrorCode::kAlreadyExists, "sandbox " + spec.id + " exists");
    }
  }
  // The directory is the claim on the id: mkdir is atomic, so of two creates of one id (or a
  // create over what a crash left behind) exactly one goes on.
  std::string dir = SandboxDir(spec.id);
  if (::mkdir(dir.c_str(), 0755) < 0) {
    if (errno == EEXIST) {
      return Fail(ErrorCode::kAlreadyExists, "sandbox " + spec.id + " exists (" + dir + ")");
    }
    return FailErrno("creating " + dir, errno);
  }
  auto uid_base = uids_.Acquire();
  if (!uid_base) {
    ::rmdir(dir.c_str());
    return std::unexpected(uid_base.error());
  }

  // From here on, a failure undoes everything through TearDown.
  SandboxCgroup cgroup = SandboxCgroup::Open(layout_, spec.id);
  pid_t init_pid = 0;
  auto fail = [&](Error e) -> std::unexpected<Error> {
    (void)TearDown(spec.id, init_pid, *uid_base, cgroup);
    return std::unexpected(std::move(e).Wrap("creating " + spec.id));
  };
  for (const std::string& d : {dir + "/disk", dir + "/rootfs"}) {
    if (auto st = MakeDir(d, 0755); !st) return fail(st.error());
  }
  auto uid_file = OpenFile(dir + "/uid_base", O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (!uid_file) return fail(uid_file.error());
  if (auto st = WriteAll(uid_file->get(), std::to_string(*uid_base)); !st) {
    return fail(st.error().Wrap("recording the uid range"));
  }
  CgroupLimits limits{spec.limits.cpus, spec.limits.memory_mb << 20, spec.limits.pids_max};
  auto made = SandboxCgroup::Create(layout_, spec.id, limits);
  if (!made) return fail(made.error());
  cgroup = std::move(*made);

  // What it sees of its limits (limits_view.h): the CPUs it may run on, which the launcher
  // inherits from this thread (posix_spawn keeps the caller's affinity), and its view files.
  cpu_set_t own;
  CPU_ZERO(&own);
  if (::sched_getaffinity(0, sizeof own, &own) < 0) {
    return fail(ErrnoError("reading this thread's CPU affinity", errno));
  }
  std::vector<int> cpus;
  {
    std::lock_guard lock(mu_);
    cpus = ViewCpus(AllowedCpus(), spec.limits.cpus, next_cpu_++);
  }
  if (auto st = MakeDir(dir + "/view", 0755); !st) return fail(st.error());
  if (auto st = RewriteInPlace(dir + "/view/cpu_online", CpuList(cpus), /*create=*/true); !st) {
    return fail(st.error());
  }
  if (auto st = RewriteInPlace(dir + "/view/meminfo", "", /*create=*/true); !st) {
    return fail(st.error());
  }
  if (auto st = RefreshMeminfo(spec.id, cgroup); !st) return fail(st.error());

  // The agent listens on a socket bound here, on the host side: the sandbox cannot see it, and
  // a restarted daemon can reconnect to it.
  auto listener = ListenAgentSocket(dir);
  if (!listener) return fail(listener.error());
  UniqueFd report_fds[2];
  if (auto st = MakePipe(report_fds); !st) return fail(st.error());
  auto theirs = HighDup(listener->get());
  auto report_w = HighDup(report_fds[1].get());
  if (!theirs || !report_w) return fail(Error(ErrorCode::kInternal, "dup failed"));
  listener->Reset();
  report_fds[1].Reset();

  // The launcher's fds: 3 the agent's listening socket, 4 the report pipe, 5 the seccomp
  // program.
  std::vector<std::string> args = {
      options_.launcher_path,         "--id", spec.id, "--sandbox-dir", dir, "--template-dir",
      TemplateDir(root.host_usr)};
  args.insert(args.end(), {"--uid-base", std::to_string(*uid_base), "--agent", options_.agent_path,
                           "--channel-fd", "3", "--report-fd", "4", "--seccomp-fd", "5"});
  args.insert(args.end(),
              {"--disk-mb", std::to_string(spec.limits.disk_mb), "--tmp-mb",
               std::to_string(spec.limits.tmp_mb), "--nofile", std::to_string(spec.limits.nofile)});
  for (const auto& d : cgroup.dirs())
    args.insert(args.end(), {"--cgroup-procs", d + "/cgroup.procs"});
  if (!spec.netns.empty()) {
    args.insert(args.end(), {"--netns", spec.netns, "--nameserver", spec.nameserver});
  }
  if (!root.host_usr) {
    args.push_back("--rootfs");
  } else {
    for (const auto& b : ro_binds_) args.insert(args.end(), {"--ro-bind", b});
    for (const auto& d : usr_dirs_) args.insert(args.end(), {"--usr-dir", d});
    if (options_.base_usr_local) args.push_back("--host-usr-local");
  }
  for (const auto& layer : root.layers) {
    args.insert(args.end(), {"--layer", options_.layers->Path(layer)});
  }
  // The agent reads its memory cgroup's OOM count from inside (ReadOomKillCount).
  if (layout_.version == CgroupVersion::kV2) {
    args.insert(args.end(), {"--cgroup-bind", cgroup.dirs().at(0) + "=/sys/fs/cgroup"});
  } else if (auto memory = cgroup.Dir("memory"); !memory.empty()) {
    args.insert(args.end(), {"--cgroup-bind", memory + "=/sys/fs/cgroup/memory"});
  }
  args.push_back("--limits-view");
  args.insert(args.end(), {"--", "--listen-fd", "3", "--root", "/", "--user", spec.user, "--drop-caps",
                           "--log-level", "warn"});
  for (const auto& kv : spec.env) args.insert(args.end(), {"--env", kv});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, theirs->get(), 3);
  posix_spawn_file_actions_adddup2(&actions, report_w->get(), 4);
  posix_spawn_file_actions_adddup2(&actions, seccomp_bpf_.get(), 5);
  pid_t launcher = 0;
  const cpu_set_t pinned = CpuSet(cpus);
  int err = ::sched_setaffinity(0, sizeof pinned, &pinned) < 0 ? errno : 0;
  if (err == 0) {
    err = ::posix_spawn(&launcher, options_.launcher_path.c_str(), &actions, nullptr, argv.data(),
                        environ);
    if (::sched_setaffinity(0, sizeof own, &own) < 0) {
      spdlog::error("restoring this thread's CPU affinity: {}", std::strerror(errno));
    }
  }
  posix_spawn_file_actions_destroy(&actions);
  theirs->Reset();
  report_w->Reset();
  if (err != 0) return fail(ErrnoError("starting " + options_.launcher_path, err));

  auto line = ReadLine(report_fds[0].get(), std::chrono::seconds(30));
  int status = 0;
  if (!line) ::kill(launcher, SIGKILL);
  RetryEintr([&] { return ::waitpid(launcher, &status, 0); });
  if (!line) return fail(line.error());
  auto report = ParseReport(*line);
  if (!report) return fail(report.error());
  init_pid = report->pid;
  if (!report->failed_step.empty()) {
    return fail(ErrnoError("jail setup step '" + report->failed_step + "' failed", report->err));
  }

  auto channel = ConnectAgentSocket(dir);
  if (!channel) return fail(channel.error());
  Live live{init_pid, *uid_base, cgroup};
  live.view = true;
  live.cpus = std::move(cpus);
  SandboxInfo info = Info(spec.id, live);
  {
    std::lock_guard lock(mu_);
    WatchLocked(spec.id, init_pid, *uid_base);
    live_.emplace(spec.id, std::move(live));
  }
  return std::make_unique<runtime::CreatedSandbox>(std::move(info), std::move(*channel));
}

SandboxInfo JailEngine::Info(const std::string& id, const Live& live) const {
  SandboxInfo info;
  info.id = id;
  info.state = live.paused ? runtime::SandboxState::kPaused : runtime::SandboxState::kRunning;
  // What Adopt needs after a restart (the agent's host pid), and what an operator looking at a
  // record wants to find (its directory, uid range and cgroups).
  info.engine_state = nlohmann::json{{"init_pid", live.init_pid},
                                     {"uid_base", live.uid_base},
                                     {"dir", SandboxDir(id)},
                                     {"cgroups", live.cgroup.dirs()}}
                          .dump();
  return info;
}

pid_t JailEngine::InitPidOf(const std::string& engine_state) {
  auto doc = nlohmann::json::parse(engine_state, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("init_pid") || !doc["init_pid"].is_number_integer()) {
    return 0;
  }
  const int64_t pid = doc["init_pid"].get<int64_t>();
  return pid > 0 && pid <= INT32_MAX ? static_cast<pid_t>(pid) : 0;
}

pid_t JailEngine::InitPid(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  return it == live_.end() ? 0 : it->second.init_pid;
}

Result<UniqueFd> JailEngine::ConnectAgent(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    if (!live_.contains(id)) {
      return Fail(ErrorCode::kNotFound, "sandbox " + id + " is not held by the jail engine");
    }
  }
  return ConnectAgentSocket(SandboxDir(id));
}

Result<SandboxInfo> JailEngine::Adopt(const std::string& id, const std::string& engine_state,
                                      runtime::SandboxState state) {
  if (state == runtime::SandboxState::kHibernated) {
    return std::unexpected(runtime::Lacks(name(), "memory_checkpoint", "hold a hibernated sandbox"));
  }
  const bool paused = state == runtime::SandboxState::kPaused;
  const pid_t init_pid = InitPidOf(engine_state);
  if (auto st = ValidateSandboxId(id); !st) return std::unexpected(st.error());
  {
    std::lock_guard lock(mu_);
    if (live_.contains(id)) return Fail(ErrorCode::kAlreadyExists, "sandbox " + id + " is held");
  }
  const std::string dir = SandboxDir(id);
  auto uid_text = ReadFileToString(dir + "/uid_base", 64);
  if (!uid_text) return std::unexpected(uid_text.error().Wrap("reading its uid range"));
  const uid_t uid_base = static_cast<uid_t>(std::strtoul(uid_text->c_str(), nullptr, 10));
  if (init_pid <= 0) return Fail(ErrorCode::kNotFound, "no agent pid on record");
  // The pid must be alive and a member of the sandbox's cgroup: a recycled pid is not.
  SandboxCgroup cgroup = SandboxCgroup::Open(layout_, id);
  auto members = cgroup.Processes();
  if (!members) return std::unexpected(members.error().Wrap("listing its processes"));
  if (std::ranges::find(*members, init_pid) == members->end()) {
    return Fail(ErrorCode::kNotFound,
                "its agent (pid " + std::to_string(init_pid) + ") is gone");
  }
  struct stat sock;
  if (::stat((dir + "/" + kAgentSocket).c_str(), &sock) < 0 || !S_ISSOCK(sock.st_mode)) {
    return Fail(ErrorCode::kNotFound, "its agent socket is gone");
  }
  if (auto st = paused ? cgroup.Freeze() : cgroup.Thaw(); !st) return std::unexpected(st.error());
  uids_.MarkUsed(uid_base);
  Live live{init_pid, uid_base, cgroup, paused};
  // Made by an airlockd that gave it a view of its limits: it is refreshed on.
  live.view = ::access((dir + "/view/meminfo").c_str(), F_OK) == 0;
  SandboxInfo info = Info(id, live);
  std::lock_guard lock(mu_);
  WatchLocked(id, init_pid, uid_base);
  live_.emplace(id, std::move(live));
  return info;
}

Result<std::vector<std::string>> JailEngine::ListSandboxes() {
  // The sandbox directories under this state dir, and only those: the cgroup parents are shared
  // by every engine on the host (other daemons, tests), so a cgroup alone proves nothing about
  // whose sandbox it is. A sandbox's directory exists whenever its cgroup does: Create claims
  // the directory first and TearDown removes it last.
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.state_dir + "/jail", ec)) {
    std::string id = entry.path().filename().string();
    if (ValidateSandboxId(id)) ids.push_back(std::move(id));
  }
  if (ec) {
    return Fail(ErrorCode::kInternal, "listing " + options_.state_dir + "/jail: " + ec.message());
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

Status JailEngine::TearDown(const std::string& id, pid_t init_pid, std::optional<uid_t> uid_base,
                             const SandboxCgroup& cgroup) {
  // Killing the cgroup kills every process of the sandbox; its mounts, which live only in its
  // mount namespace, go with the last of them.
  Status killed = cgroup.Destroy();
  if (init_pid > 0) {
    if (!killed) ::kill(init_pid, SIGKILL);  // PID 1's death ends the whole pid namespace
    Reap(init_pid, std::chrono::seconds(5));
  }
  std::error_code ec;
  fs::remove_all(SandboxDir(id), ec);
  if (uid_base) uids_.Release(*uid_base);
  if (!killed) return std::unexpected(killed.error().Wrap("destroying " + id));
  if (ec) return Fail(ErrorCode::kInternal, "removing " + SandboxDir(id) + ": " + ec.message());
  return {};
}

Status JailEngine::Destroy(const std::string& id) {
  if (auto st = ValidateSandboxId(id); !st) return st;
  std::optional<Live> live;
  {
    std::lock_guard lock(mu_);
    if (auto it = live_.find(id); it != live_.end()) {
      live = std::move(it->second);
      live_.erase(it);
    }
    if (watch_) watch_->Remove(id);
  }
  if (live) return TearDown(id, live->init_pid, live->uid_base, live->cgroup);
  // Not one of ours (yet): what a crash may have left behind, found by name.
  std::optional<uid_t> uid_base;
  if (auto text = ReadFileToString(SandboxDir(id) + "/uid_base", 64)) {
    uid_base = static_cast<uid_t>(std::strtoul(text->c_str(), nullptr, 10));
    uids_.MarkUsed(*uid_base);
  }
  return TearDown(id, 0, uid_base, SandboxCgroup::Open(layout_, id));
}

Status JailEngine::UpdateLimits(const std::string& id, const runtime::Limits& limits) {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return Fail(ErrorCode::kNotFound, "sandbox " + id + " does not exist");
  CgroupLimits cgroup_limits{limits.cpus, limits.memory_mb << 20, limits.pids_max};
  Live& live = it->second;
  if (auto st = live.cgroup.SetLimits(cgroup_limits); !st) {
    return std::unexpected(st.error().Wrap("changing the limits of " + id));
  }
  if (!live.view) return {};
  // Its view follows: its CPUs (from the first it had, so that it keeps running where it ran)
  // and its memory.
  const std::vector<int> allowed = AllowedCpus();
  size_t start = 0;
  if (!live.cpus.empty()) {
    start = static_cast<size_t>(std::ranges::find(allowed, live.cpus.front()) - allowed.begin());
  }
  std::vector<int> cpus = ViewCpus(allowed, limits.cpus, start);
  if (auto st = PinCpus(live.cgroup, cpus); !st) {
    return std::unexpected(st.error().Wrap("changing the CPUs of " + id));
  }
  live.cpus = cpus;
  if (auto st = RewriteInPlace(SandboxDir(id) + "/view/cpu_online", CpuList(cpus)); !st) {
    return st;
  }
  return RefreshMeminfo(id, live.cgroup);
}

Status JailEngine::RefreshMeminfo(const std::string& id, const SandboxCgroup& cgroup) {
  auto host = ReadFileToString("/proc/meminfo", 1 << 16);
  if (!host) return std::unexpected(host.error().Wrap("reading /proc/meminfo"));
  auto use = cgroup.Memory();
  if (!use) return std::unexpected(use.error().Wrap("reading the memory cgroup of " + id));
  return RewriteInPlace(SandboxDir(id) + "/view/meminfo", Meminfo(*host, *use));
}

void JailEngine::RefreshViews() {
  std::unique_lock wait(viewer_mu_);
  while (!viewer_cv_.wait_for(wait, kViewRefresh, [this] { return stop_viewer_; })) {
    std::vector<std::pair<std::string, SandboxCgroup>> views;
    {
      std::lock_guard lock(mu_);
      for (const auto& [id, live] : live_) {
        if (live.view) views.emplace_back(id, live.cgroup);
      }
    }
    wait.unlock();
    for (const auto& [id, cgroup] : views) {
      // A sandbox destroyed meanwhile has no file left to write to: nothing is made again.
      if (auto st = RefreshMeminfo(id, cgroup); !st) {
        spdlog::debug("limits view of {}: {}", id, st.error().message());
      }
    }
    wait.lock();
  }
}

Result<runtime::LayerSnapshot> JailEngine::SnapshotLayer(const std::string& id) {
  // Frozen while its layer is copied (a consistent tree); a sandbox paused before stays paused.
  // mu_ is not held during the copy (other sandboxes' calls go on); the caller keeps this
  // sandbox's pause, resume and destroy out of the way meanwhile (the open fd would keep its
  // layer readable even through a destroy).
  pid_t init_pid = 0;
  uid_t uid_base = 0;
  bool was_paused = false;
  std::optional<SandboxCgroup> cgroup;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return Fail(ErrorCode::kNotFound, "sandbox " + id + " does not exist");
    init_pid = it->second.init_pid;
    uid_base = it->second.uid_base;
    was_paused = it->second.paused;
    cgroup = it->second.cgroup;
    if (!was_paused) {
      if (auto st = cgroup->Freeze(); !st) return std::unexpected(st.error());
    }
  }
  auto thaw = [&] {
    if (!was_paused) (void)cgroup->Thaw();
  };
  // PID 1 holds the root of its writable layer as fd 4 (contain.h); upper/ is what it wrote.
  std::string disk =
      "/proc/" + std::to_string(init_pid) + "/fd/" + std::to_string(kWritableLayerFd);
  UniqueFd root(::open(disk.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  struct statfs fs_info;
  if (!root || ::fstatfs(root.get(), &fs_info) < 0 || fs_info.f_type != TMPFS_MAGIC) {
    thaw();
    return Fail(ErrorCode::kFailedPrecondition,
                "sandbox " + id + " does not expose its writable layer (made by an older airlockd?)");
  }
  UniqueFd upper(::openat(root.get(), "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!upper) {
    int err = errno;
    thaw();
    return FailErrno("opening the writable layer of " + id, err);
  }
  auto imported = options_.layers->Import(upper.get(), uid_base);
  thaw();
  if (!imported) return std::unexpected(imported.error().Wrap("snapshotting " + id));
  return imported;
}

Result<runtime::SandboxStats> JailEngine::Stats(const std::string& id) {
  pid_t init_pid = 0;
  std::vector<std::string> dirs;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return Fail(ErrorCode::kNotFound, "sandbox " + id + " does not exist");
    init_pid = it->second.init_pid;
    dirs = it->second.cgroup.dirs();
  }
  runtime::SandboxStats stats;
  runtime::ReadCgroupStats(dirs, stats);
  // PID 1 holds the root of its writable layer (a tmpfs capped at disk_mb) as fd 4 (contain.h).
  stats.disk_bytes = runtime::FileSystemUsedBytes("/proc/" + std::to_string(init_pid) + "/fd/" +
                                                  std::to_string(kWritableLayerFd));
  return stats;
}

Status JailEngine::Alive(const std::string& id) {
  pid_t init_pid = 0;
  std::optional<SandboxCgroup> cgroup;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return Fail(ErrorCode::kNotFound, "sandbox " + id + " does not exist");
    init_pid = it->second.init_pid;
    cgroup = it->second.cgroup;
  }
  // Its agent is the sandbox's init: while it runs, in the sandbox's cgroup, the sandbox does.
  auto members = cgroup->Processes();
  if (members && std::ranges::find(*members, init_pid) != members->end() &&
      ProcessRuns(init_pid)) {
    return {};
  }
  std::string why = "its agent (pid " + std::to_string(init_pid) + ", the sandbox's init) exited";
  if (auto kills = cgroup->OomKills(); kills && *kills > 0) {
    why += "; the kernel's OOM killer ran in the sandbox " + std::to_string(*kills) +
           " time(s) (its memory limit)";
  }
  return Fail(ErrorCode::kFailedPrecondition, why);
}

Status JailEngine::Pause(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return Fail(ErrorCode::kNotFound, "sandbox " + id + " does not exist");
  if (auto st = it->second.cgroup.Freeze(); !st) return st;
  it->second.paused = true;
  return {};
}

Status JailEngine::Resume(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return Fail(ErrorCode::kNotFound, "sandbox " + id + " does not exist");
  if (auto st = it->second.cgroup.Thaw(); !st) return st;
  it->second.paused = false;
  return {};
}

Result<runtime::Hibernation> JailEngine::Hibernate(const std::string&) {
  // CRIU would be the way for the jail; it fails on this kernel's vdso.
  return std::unexpected(runtime::Lacks(name(), "memory_checkpoint", "hibernate a sandbox"));
}

Result<std::unique_ptr<runtime::Sandbox>> JailEngine::Wake(const std::string&) {
  return std::unexpected(runtime::Lacks(name(), "memory_checkpoint", "wake a sandbox"));
}

Result<runtime::MemoryImage> JailEngine::SaveMemoryImage(const std::string&, const ImageSaved&) {
  return std::unexpected(runtime::Lacks(name(), "memory_fork", "save a sandbox's memory"));
}

Status JailEngine::RemoveMemoryImage(const std::string&) {
  return std::unexpected(runtime::Lacks(name(), "memory_fork", "remove a memory image"));
}

void JailEngine::WatchLocked(const std::string& id, pid_t init_pid, uid_t uid_base) {
  if (!watch_) return;
  if (auto st = watch_->Add(id, init_pid, uid_base); !st) {
    spdlog::warn("process events of {}: {}", id, st.error().message());
  }
}

Status JailEngine::WatchProcesses(runtime::ProcessEventSink sink) {
  if (!capabilities_.process_events) {
    return std::unexpected(runtime::Lacks(
        name(), "process_events",
        "report the processes of its sandboxes (" + process_events_unavailable_ + ")"));
  }
  std::lock_guard lock(mu_);
  if (watch_) return Fail(ErrorCode::kFailedPrecondition, "the jail's processes are watched already");
  auto watch = ProcessWatch::Start(std::move(sink));
  if (!watch) return std::unexpected(watch.error().Wrap("watching the jail's processes"));
  watch_ = std::move(*watch);
  for (const auto& [id, live] : live_) WatchLocked(id, live.init_pid, live.uid_base);
  return {};
}

runtime::ProcessEventCounters JailEngine::ProcessEventCounts() const {
  std::lock_guard lock(mu_);
  return watch_ ? watch_->Counts() : runtime::ProcessEventCounters{};
}

Status JailEngine::Probe() {
  // A whole create: launcher, namespaces, cgroups, seccomp, the agent's hello; then a destroy.
  runtime::SandboxSpec spec;
  spec.limits.memory_mb = 64;
  spec.limits.pids_max = 16;
  spec.limits.disk_mb = 16;
  spec.limits.tmp_mb = 16;
  return runtime::ProbeByCreate(*this, std::move(spec));
}

Result<std::unique_ptr<runtime::Engine>> MakeEngine(
    const runtime::EngineContext& context, const std::map<std::string, std::string>& options) {
  JailOptions o;
  o.state_dir = context.state_dir;
  o.agent_path = context.agent_path;
  o.layers = context.layers;
  // airlock-jail where airlockd's helpers are (common/helpers.h), else beside the agent.
  o.launcher_path = FindHelper("airlock-jail");
  if (const fs::path beside = fs::path(context.agent_path).parent_path() / "airlock-jail";
      o.launcher_path.empty() && ::access(beside.c_str(), X_OK) == 0) {
    o.launcher_path = beside;
  }
  auto bad = [](const std::string& key, const std::string& why) {
    return Fail(ErrorCode::kInvalidArgument, key + ": " + why);
  };
  for (const auto& [key, value] : options) {
    if (key == "launcher") {
      if (!value.starts_with('/')) return bad(key, "must be an absolute path");
      o.launcher_path = value;
    } else if (key == "cgroup_root") {
      if (!value.starts_with('/')) return bad(key, "must be an absolute path");
      o.cgroup_root = value;
    } else if (key == "base_usr_local") {
      if (value != "true" && value != "false") return bad(key, "must be true or false");
      o.base_usr_local = value == "true";
    } else if (key == "uid_first" || key == "uid_slots") {
      uint64_t n = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || end != value.data() + value.size() || n == 0 || n > (1u << 31)) {
        return bad(key, "must be a number from 1 to 2^31");
      }
      if (key == "uid_first") {
        o.uid_first = static_cast<uid_t>(n);
      } else {
        o.uid_slots = static_cast<uint32_t>(n);
      }
    } else {
      return bad(key, "the jail engine has no such option (launcher, cgroup_root, "
                      "base_usr_local, uid_first, uid_slots)");
    }
  }
  if (o.launcher_path.empty()) {
    return Fail(ErrorCode::kFailedPrecondition,
                "airlock-jail is neither where airlockd's helpers are nor beside the agent (set "
                "[engine.jail] launcher)");
  }
  auto engine = JailEngine::Open(std::move(o));
  if (!engine) return std::unexpected(engine.error());
  return std::unique_ptr<runtime::Engine>(std::move(*engine));
}

}  // namespace airlock::jail
