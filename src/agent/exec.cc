#include "agent/exec.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <map>

#include "common/syscall.h"

namespace airlock::agent {
namespace {

constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// What the child reads. Everything is laid out before clone(): the child allocates nothing.
struct ChildArgs {
  const char* const* candidates;
  char* const* argv;
  char* const* envp;
  const char* cwd;   // required, or nullptr
  const char* home;  // tried when cwd is nullptr, then "/"
  const gid_t* groups;
  size_t ngroups;
  gid_t gid;
  uid_t uid;
  bool switch_user;
  int stdin_fd, stdout_fd, stderr_fd;  // become 0, 1, 2
  int pty_slave;                       // -1 without a pty
  const winsize* size;
  const rlimit* nofile;  // or nullptr
  bool drop_caps;
  // Written by the child on failure, read by the parent once the child has exec'd or died.
  const char* failed_step;
  int failed_errno;
};

// A getdents64 record (linux_dirent64, which glibc does not declare).
struct linux_dirent64_view {
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[];
};

[[noreturn]] void ChildFail(ChildArgs* a, const char* step) {
  a->failed_step = step;
  a->failed_errno = errno;
  _exit(127);
}

// close_range(CLOSE_RANGE_CLOEXEC) where the kernel lacks it (Linux before 5.11): FD_CLOEXEC on
// every fd above 2 that /proc/self/fd lists. Raw syscalls and a buffer on the stack only (it runs in the
// child before execve). 0, or -1 with errno.
int SetCloexecFromProc() {
  const int dir = static_cast<int>(
      ::syscall(SYS_openat, AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir < 0) return -1;
  alignas(8) char buf[4096];
  while (true) {
    const long n = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n < 0) {
      ::close(dir);
      return -1;
    }
    if (n == 0) break;
    for (long off = 0; off < n;) {
      const auto* d = reinterpret_cast<const struct linux_dirent64_view*>(buf + off);
      off += d->reclen;
      int fd = 0;
      bool number = d->name[0] != '\0';
      for (const char* c = d->name; *c != '\0'; ++c) {
        if (*c < '0' || *c > '9') number = false;
        fd = fd * 10 + (*c - '0');
      }
      if (number && fd > 2 && fd != dir && ::fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 && errno != EBADF) {
        ::close(dir);
        return -1;
      }
    }
  }
  ::close(dir);
  return 0;
}

// Runs in the child, sharing the agent's memory until execve: async-signal-safe calls only.
int ChildMain(void* arg) {
  auto* a = static_cast<ChildArgs*>(arg);
  if (::setsid() < 0) ChildFail(a, "setsid");
  if (a->pty_slave >= 0) {
    if (::ioctl(a->pty_slave, TIOCSCTTY, 0) < 0) ChildFail(a, "ioctl(TIOCSCTTY)");
    if (a->size && ::ioctl(a->pty_slave, TIOCSWINSZ, a->size) < 0) ChildFail(a, "TIOCSWINSZ");
  }
  if (::dup2(a->stdin_fd, 0) < 0 || ::dup2(a->stdout_fd, 1) < 0 || ::dup2(a->stderr_fd, 2) < 0) {
    ChildFail(a, "dup2");
  }
  // Every other fd is the agent's: close them at exec. The upper end is INT_MAX, not ~0u: no fd
  // is above it, and gVisor's kernel refuses ~0u (EINVAL), which sent every command through the
  // /proc/self/fd listing below, and each listing left the Sentry more to save and restore: a
  // hibernate of a sandbox that had run 100 commands took 5 times as long as a fresh one's.
  if (::syscall(SYS_close_range, 3u, static_cast<unsigned>(INT_MAX), CLOSE_RANGE_CLOEXEC) < 0 &&
      ((errno != EINVAL && errno != ENOSYS) || SetCloexecFromProc() < 0)) {
    ChildFail(a, "close_range");
  }
  // The agent ignores SIGPIPE and handles nothing else (main resets the rest at start).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  if (::sigaction(SIGPIPE, &dfl, nullptr) < 0) ChildFail(a, "sigaction");
  sigset_t empty;
  sigemptyset(&empty);
  if (::sigprocmask(SIG_SETMASK, &empty, nullptr) < 0) ChildFail(a, "sigprocmask");
  if (a->nofile && ::setrlimit(RLIMIT_NOFILE, a->nofile) < 0) ChildFail(a, "setrlimit");
  ::umask(022);  // the agent's own is 0, so that file modes it sets are exact
  // A kernel without child subreapers (gVisor's) leaves a double-forked daemon to the agent,
  // outside the command's tree: its session still ties it to the command (process_tree.h).
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) < 0 && errno != EINVAL) {
    ChildFail(a, "prctl(PR_SET_CHILD_SUBREAPER)");
  }
  // The bounding set first (that needs CAP_SETPCAP), then the user switch (CAP_SETUID and
  // CAP_SETGID), then everything that is left: even as uid 0, the command execs with nothing.
  if (a->drop_caps) {
    for (int cap = 0; cap < 64; ++cap) {
      if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) {
        ChildFail(a, "prctl(PR_CAPBSET_DROP)");
      }
    }
  }
  if (a->switch_user) {
    if (::setgroups(a->ngroups, a->groups) < 0) ChildFail(a, "setgroups");
    if (::setresgid(a->gid, a->gid, a->gid) < 0) ChildFail(a, "setgid");
    if (::setresuid(a->uid, a->uid, a->uid) < 0) ChildFail(a, "setuid");
  }
  if (a->drop_caps) {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct none[2]{};
    if (::syscall(SYS_capset, &header, none) < 0) ChildFail(a, "capset");
    // The capset above cleared the ambient set already (it may hold only what is permitted and
    // inheritable); EINVAL is a kernel without ambient capabilities (gVisor's).
    if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL) {
      ChildFail(a, "prctl(PR_CAP_AMBIENT_CLEAR_ALL)");
    }
  }
  if (a->cwd) {
    if (::chdir(a->cwd) < 0) ChildFail(a, "chdir");
  } else if (::chdir(a->home) < 0 && ::chdir("/") < 0) {
    ChildFail(a, "chdir");
  }
  int first_error = ENOENT;
  for (const char* const* c = a->candidates; *c; ++c) {
    ::execve(*c, a->argv, a->envp);
    // Like execvp: keep searching past missing or inaccessible entries, report the first
    // error that says more than "not here".
    if (errno != ENOENT && errno != ENOTDIR && first_error == ENOENT) first_error = errno;
  }
  errno = first_error;
  ChildFail(a, "execve");
}

std::vector<char*> CStrings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

std::string EnvValue(const std::vector<std::string>& env, std::string_view key) {
  for (auto it = env.rbegin(); it != env.rend(); ++it) {
    if (it->size() > key.size() && it->compare(0, key.size(), key) == 0 &&
        (*it)[key.size()] == '=') {
      return it->substr(key.size() + 1);
    }
  }
  return {};
}

}  // namespace

Result<SpawnPlan> PlanExec(const protocol::Exec& req, const ExecDefaults& defaults) {
  SpawnPlan plan;
  std::optional<UserInfo> user = defaults.default_user;
  if (!req.user.empty()) {
    auto u = LookupUser(req.user, defaults.etc_dir);
    if (!u) return std::unexpected(u.error());
    user = std::move(*u);
  }
  if (user && user->uid != ::geteuid()) {
    if (::geteuid() != 0) {
      return Fail(ErrorCode::kPermissionDenied,
                  "the agent runs as uid " + std::to_string(::geteuid()) +
                      " and cannot run commands as uid " + std::to_string(user->uid));
    }
    plan.switch_to = user;
  }
  plan.home = user ? user->home : (std::getenv("HOME") ? std::getenv("HOME") : "/");

  // The environment: defaults, the agent's configured env, then the request's; last one wins.
  std::map<std::string, std::string> env;
  env["PATH"] = kDefaultPath;
  env["HOME"] = plan.home;
  env["LANG"] = "C.UTF-8";
  if (user && !user->name.empty()) {
    env["USER"] = env["LOGNAME"] = user->name;
    env["SHELL"] = user->shell;
  }
  if (req.pty) env["TERM"] = "xterm-256color";
  for (const auto* list : {&defaults.env, &req.env}) {
    for (const auto& kv : *list) {
      size_t eq = kv.find('=');
      env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  for (auto& [k, v] : env) plan.envp.push_back(k + "=" + v);

  if (!req.argv.empty()) {
    plan.argv = req.argv;
  } else {
    plan.argv = {"/bin/sh", "-c", req.shell};
  }
  const std::string& file = plan.argv[0];
  if (file.find('/') != std::string::npos) {
    plan.candidates.push_back(file);
  } else {
    std::string path = EnvValue(plan.envp, "PATH");
    size_t start = 0;
    while (start <= path.size()) {
      size_t colon = path.find(':', start);
      std::string dir = path.substr(start, colon - start);
      plan.candidates.push_back((dir.empty() ? "." : dir) + "/" + file);
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }
  plan.cwd = req.cwd;
  plan.pty = req.pty;
  plan.rows = req.pty_rows ? req.pty_rows : 24;
  plan.cols = req.pty_cols ? req.pty_cols : 80;
  plan.stdin_pipe = req.stdin_mode == protocol::StdinMode::kPipe;
  plan.nofile = defaults.nofile;
  plan.drop_caps = defaults.drop_caps;
  return plan;
}

Result<Spawned> Spawn(const SpawnPlan& plan) {
  Spawned out;
  UniqueFd child_in, child_out, child_err, pty_slave;
  if (plan.pty) {
    UniqueFd master(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK));
    if (!master) return FailErrno("posix_openpt", errno);
    if (::grantpt(master.get()) < 0 || ::unlockpt(master.get()) < 0) {
      return FailErrno("unlockpt", errno);
    }
    char name[64];
    if (::ptsname_r(master.get(), name, sizeof name) != 0) return FailErrno("ptsname", errno);
    // O_NOCTTY: it must never become the agent's own terminal (as PID 1 it leads a session).
    // TIOCSCTTY in the child makes it the command's controlling terminal.
    pty_slave.Reset(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!pty_slave) return FailErrno(std::string("open ") + name, errno);
    if (plan.switch_to) {
      // The user must own its terminal, as login does.
      if (::fchown(pty_slave.get(), plan.switch_to->uid, plan.switch_to->gid) < 0) {
        return FailErrno("fchown pty", errno);
      }
    }
    out.stdin_fd.Reset(::fcntl(master.get(), F_DUPFD_CLOEXEC, 3));
    if (!out.stdin_fd) return FailErrno("dup pty master", errno);
    out.stdout_fd = std::move(master);
  } else {
    UniqueFd p[2];
    if (plan.stdin_pipe) {
      if (auto st = MakePipe(p); !st) return std::unexpected(st.error());
      child_in = std::move(p[0]);
      out.stdin_fd = std::move(p[1]);
      if (auto st = SetNonBlocking(out.stdin_fd.get(), true); !st) {
        return std::unexpected(st.error());
      }
    } else {
      child_in.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (!child_in) return FailErrno("open /dev/null", errno);
    }
    if (auto st = MakePipe(p, O_NONBLOCK); !st) return std::unexpected(st.error());
    out.stdout_fd = std::move(p[0]);
    child_out = std::move(p[1]);
    if (auto st = MakePipe(p, O_NONBLOCK); !st) return std::unexpected(st.error());
    out.stderr_fd = std::move(p[0]);
    child_err = std::move(p[1]);
    // The child's ends block, as programs expect.
    if (auto st = SetNonBlocking(child_out.get(), false); !st) return std::unexpected(st.error());
    if (auto st = SetNonBlocking(child_err.get(), false); !st) return std::unexpected(st.error());
  }

  std::vector<const char*> candidates;
  for (const auto& c : plan.candidates) candidates.push_back(c.c_str());
  candidates.push_back(nullptr);
  auto argv = CStrings(plan.argv);
  auto envp = CStrings(plan.envp);
  winsize size{plan.rows, plan.cols, 0, 0};

  ChildArgs args{};
  args.candidates = candidates.data();
  args.argv = argv.data();
  args.envp = envp.data();
  args.cwd = plan.cwd.empty() ? nullptr : plan.cwd.c_str();
  args.home = plan.home.c_str();
  if (plan.switch_to) {
    args.switch_user = true;
    args.uid = plan.switch_to->uid;
    args.gid = plan.switch_to->gid;
    args.groups = plan.switch_to->groups.data();
    args.ngroups = plan.switch_to->groups.size();
  }
  int slave = pty_slave.get();
  args.stdin_fd = plan.pty ? slave : child_in.get();
  args.stdout_fd = plan.pty ? slave : child_out.get();
  args.stderr_fd = plan.pty ? slave : child_err.get();
  args.pty_slave = plan.pty ? slave : -1;
  args.size = plan.pty ? &size : nullptr;
  args.nofile = plan.nofile ? &*plan.nofile : nullptr;
  args.drop_caps = plan.drop_caps;

  // The agent is single-threaded and the parent sleeps until the child execs or exits, so one
  // stack serves every spawn.
  alignas(64) static char stack[256 * 1024];
  pid_t pid = ::clone(ChildMain, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
  if (pid < 0) return FailErrno("clone", errno);
  if (args.failed_step) {
    int status;
    RetryEintr([&] { return ::waitpid(pid, &status, 0); });
    Error e = ErrnoError(
        std::string("starting '") + plan.argv[0] + "': step '" + args.failed_step + "' failed",
        args.failed_errno);
    return std::unexpected(std::move(e));
  }
  out.pid = pid;
  return out;
}

}  // namespace airlock::agent
