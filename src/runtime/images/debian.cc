#include "runtime/images/debian.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "common/syscall.h"
#include "common/unique_fd.h"

namespace airlock::images {
namespace {

// How much of the end of mmdebstrap's output an error carries.
constexpr size_t kTailBytes = 2048;
// A line longer than this is passed on in pieces.
constexpr size_t kMaxLineBytes = 4096;

bool InPath(const char* program) {
  for (const char* dir : {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin",
                          "/bin"}) {
    if (::access((std::string(dir) + "/" + program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

}  // namespace

Status MakeDebianRoot(const DebianOptions& options, const std::string& dir,
                      const std::function<void(std::string_view line)>& on_output,
                      const std::function<bool()>& cancelled) {
  if (!InPath("mmdebstrap")) {
    return Fail(ErrorCode::kUnimplemented,
                "mmdebstrap is not installed on the daemon's host (apt-get install mmdebstrap)");
  }
  if (!InPath("unshare")) return Fail(ErrorCode::kUnimplemented, "unshare (util-linux) is missing");
  // unshare --mount: mmdebstrap's mounts (proc, sys, dev in the tree) live in a namespace that
  // ends with it, however it ends, so removing the tree never reaches through a leftover mount.
  std::vector<std::string> args = {"unshare",        "--mount",
                                   "--propagation",  "private",
                                   "--",             "mmdebstrap",
                                   "--mode=root",    "--format=directory",
                                   "--variant=" + options.variant,
                                   options.suite,    dir,
                                   options.mirror};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string env_path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  std::string env_lang = "LC_ALL=C.UTF-8", env_frontend = "DEBIAN_FRONTEND=noninteractive";
  char* envp[] = {env_path.data(), env_lang.data(), env_frontend.data(), nullptr};

  UniqueFd out[2];
  if (auto st = MakePipe(out); !st) return st;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1].get(), 1);
  posix_spawn_file_actions_adddup2(&actions, out[1].get(), 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // A process group of its own: apt and dpkg under it end with it.
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  int spawned = ::posix_spawnp(&pid, "unshare", &actions, &attr, argv.data(), envp);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawned != 0) return FailErrno("starting mmdebstrap", spawned);
  out[1].Reset();

  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  std::string pending, tail;
  auto emit = [&](std::string_view line) {
    on_output(line);
    tail.append(line).push_back('\n');
    if (tail.size() > kTailBytes) tail.erase(0, tail.size() - kTailBytes);
  };
  Status ended;  // why it was stopped, if it was
  while (true) {
    pollfd p{out[0].get(), POLLIN, 0};
    int ready = RetryEintr([&] { return ::poll(&p, 1, 1000); });
    if (ready > 0) {
      char buf[8192];
      ssize_t n = RetryEintr([&] { return ::read(out[0].get(), buf, sizeof buf); });
      if (n <= 0) break;  // its end of the pipe closed: it exited
      pending.append(buf, static_cast<size_t>(n));
      for (size_t nl; (nl = pending.find('\n')) != std::string::npos || pending.size() > kMaxLineBytes;) {
        const size_t len = nl == std::string::npos ? kMaxLineBytes : nl;
        emit(std::string_view(pending).substr(0, len));
        pending.erase(0, nl == std::string::npos ? len : len + 1);
      }
    }
    if (cancelled()) {
      ended = Fail(ErrorCode::kUnavailable, "making the Debian root was cancelled");
    } else if (std::chrono::steady_clock::now() > deadline) {
      ended = Fail(ErrorCode::kDeadlineExceeded,
                   "mmdebstrap did not finish within " + std::to_string(options.timeout.count()) +
                       " s");
    }
    if (!ended) {
      ::kill(-pid, SIGKILL);
      break;
    }
  }
  if (!pending.empty()) emit(pending);
  int status = 0;
  RetryEintr([&] { return ::waitpid(pid, &status, 0); });
  ::kill(-pid, SIGKILL);  // anything of its group that outlived it
  if (!ended) return ended;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  const std::string how = WIFEXITED(status) ? "exited " + std::to_string(WEXITSTATUS(status))
                                            : "was killed by signal " +
                                                  std::to_string(WTERMSIG(status));
  return Fail(ErrorCode::kFailedPrecondition,
              "mmdebstrap " + options.suite + " " + how + "; its output ended with: " + tail);
}

}  // namespace airlock::images
