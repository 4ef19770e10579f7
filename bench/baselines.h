#pragma once
// The baselines beside which the benchmarks measure Airlock: bubblewrap (`bwrap --unshare-all`
// over the host's /usr) and gVisor (`runsc` with a trivial OCI bundle), run as commands. Shared
// by airlock-bench-jail and airlock-bench-run.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "common/error.h"

extern char** environ;

namespace airlock::bench {

// True if `tool` is on PATH.
inline bool Have(const char* tool) {
  std::string cmd = std::string("command -v ") + tool + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

namespace detail {

// posix_spawnp of `args` with stdout on /dev/null (stderr too when `quiet`) and, when `fd3` >= 0,
// `fd3` as the child's fd 3.
inline Result<pid_t> Spawn(const std::vector<std::string>& args, int fd3 = -1, bool quiet = false) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  if (quiet) posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  if (fd3 >= 0) posix_spawn_file_actions_adddup2(&fa, fd3, 3);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return FailErrno("spawning " + args[0], rc);
  return pid;
}

}  // namespace detail

// Runs `args` to completion (stdout to /dev/null; stderr too when `quiet`: a process that
// outlives the command, as a restored runsc sandbox does, must not hold the caller's stderr) and
// returns its wall time in microseconds; an error if it could not start or did not exit 0.
inline Result<double> TimeCommand(const std::vector<std::string>& args, bool quiet = false) {
  const auto t0 = std::chrono::steady_clock::now();
  auto pid = detail::Spawn(args, -1, quiet);
  if (!pid) return std::unexpected(pid.error());
  int status = 0;
  while (::waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Fail(ErrorCode::kInternal, args[0] + " " + (args.size() > 1 ? args[1] : "") +
                                          "... ended with wait status " + std::to_string(status));
  }
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

// bwrap with every namespace unshared, the host's /usr read-only and fresh /proc, /dev, /tmp:
// the nearest bubblewrap equivalent of a jail sandbox. `options` go before `command`.
inline std::vector<std::string> BwrapArgs(const std::vector<std::string>& options,
                                          const std::vector<std::string>& command) {
  std::vector<std::string> args = {"bwrap",     "--unshare-all", "--die-with-parent",
                                   "--ro-bind", "/usr",          "/usr",
                                   "--symlink", "usr/bin",       "/bin",
                                   "--symlink", "usr/lib",       "/lib",
                                   "--symlink", "usr/lib64",     "/lib64",
                                   "--proc",    "/proc",         "--dev",
                                   "/dev",      "--tmpfs",       "/tmp"};
  args.insert(args.end(), options.begin(), options.end());
  args.insert(args.end(), command.begin(), command.end());
  return args;
}

// An idle bubblewrap sandbox (`sleep infinity`), killed (with everything in it) and reaped when
// this goes out of scope.
class IdleBwrap {
 public:
  IdleBwrap() = default;
  IdleBwrap(IdleBwrap&& other) noexcept : pid_(other.pid_), child_pid_(other.child_pid_) {
    other.pid_ = -1;
  }
  IdleBwrap& operator=(IdleBwrap&&) = delete;
  IdleBwrap(const IdleBwrap&) = delete;
  ~IdleBwrap() { Kill(); }

  // Starts it and waits (up to 10 s) until bwrap reports the sandbox's pid, i.e. until its
  // namespaces and mounts are in place.
  [[nodiscard]] Status Start() {
    int info[2];
    if (::pipe2(info, O_CLOEXEC) != 0) return FailErrno("pipe2", errno);
    auto pid = detail::Spawn(BwrapArgs({"--info-fd", "3"}, {"sleep", "infinity"}), info[1]);
    ::close(info[1]);
    if (!pid) {
      ::close(info[0]);
      return std::unexpected(pid.error());
    }
    pid_ = *pid;
    // bwrap writes {"child-pid": N} and closes the fd.
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd pfd{info[0], POLLIN, 0};
      if (::poll(&pfd, 1, 100) <= 0) continue;
      char buf[256];
      ssize_t n = ::read(info[0], buf, sizeof buf);
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    ::close(info[0]);
    nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
    if (!doc.is_object() || !doc["child-pid"].is_number_integer()) {
      return Fail(ErrorCode::kInternal, "bwrap did not report its sandbox's pid: '" + text + "'");
    }
    child_pid_ = doc["child-pid"].get<pid_t>();
    return {};
  }

  // The host pid of bwrap itself (outside the sandbox).
  pid_t pid() const { return pid_; }
  // The host pid of the sandbox's first process (inside its namespaces).
  pid_t child_pid() const { return child_pid_; }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);  // --die-with-parent takes the sandbox with it
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  pid_t child_pid_ = -1;
};

// The nearest bubblewrap equivalent of an exec into a running sandbox: nsenter into the idle
// sandbox's namespaces and root, then `true`.
inline std::vector<std::string> NsenterTrueArgs(pid_t target) {
  return {"nsenter", "--target", std::to_string(target), "--all", "--root", "--wd", "true"};
}

// A bundle for runsc in `dir`: a read-only root with the host's /usr bound in, running `args`.
inline Status MakeRunscBundle(const std::string& dir, const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir + "/rootfs/usr", ec);
  if (!ec) fs::create_directories(dir + "/rootfs/proc", ec);
  if (ec) return Fail(ErrorCode::kInternal, "creating " + dir + ": " + ec.message());
  for (const char* l : {"bin", "lib", "lib64"}) {
    fs::create_symlink(std::string("usr/") + l, dir + "/rootfs/" + l, ec);
  }
  nlohmann::json config = nlohmann::json::parse(R"({"ociVersion":"1.0.2",
 "process":{"user":{"uid":0,"gid":0},"env":["PATH=/usr/bin"],"cwd":"/"},
 "root":{"path":"rootfs","readonly":true},"hostname":"bench",
 "mounts":[{"destination":"/usr","type":"bind","source":"/usr","options":["rbind","ro"]},
           {"destination":"/proc","type":"proc","source":"proc"}],
 "linux":{"namespaces":[{"type":"pid"},{"type":"network"},{"type":"ipc"},{"type":"uts"},
                        {"type":"mount"}]}})");
  config["process"]["args"] = args;
  std::ofstream out(dir + "/config.json");
  out << config.dump() << "\n";
  if (!out) return Fail(ErrorCode::kInternal, "writing " + dir + "/config.json");
  return {};
}

// `runsc` with its state under `root`, no network, no cgroups of its own, then `args`.
inline std::vector<std::string> RunscArgs(const std::string& root,
                                          const std::vector<std::string>& args) {
  std::vector<std::string> all = {"runsc", "--root", root, "--network=none", "--ignore-cgroups"};
  all.insert(all.end(), args.begin(), args.end());
  return all;
}

}  // namespace airlock::bench
