#pragma once
// A scratch directory and a real airlockd for the benchmarks that drive the REST API
// (airlock-bench-api, airlock-bench-stream). Both are cleaned up on every path. Needs root.
//
// The including target defines AIRLOCKD_PATH, AIRLOCK_AGENT_PATH and AIRLOCK_JAIL_LAUNCHER_PATH.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common/error.h"

namespace airlock::bench {

// Set by SIGINT / SIGTERM (InstallSignalHandlers): the run in hand finishes, then everything is
// cleaned up and the benchmark ends without a report.
inline std::atomic<bool> g_interrupted{false};
inline const char* g_bench_tag = "airlock-bench";

inline void OnInterruptSignal(int) {
  g_interrupted.store(true);
  // write(2) only: async-signal-safe.
  constexpr char kMsg[] = ": interrupted; cleaning up\n";
  ssize_t ignored = ::write(STDERR_FILENO, "\n", 1);
  ignored = ::write(STDERR_FILENO, g_bench_tag, std::strlen(g_bench_tag));
  ignored = ::write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
  (void)ignored;
}

// `tag` (a string literal) names the benchmark in the message.
inline void InstallSignalHandlers(const char* tag) {
  g_bench_tag = tag;
  struct sigaction sa {};
  sa.sa_handler = OnInterruptSignal;
  sa.sa_flags = SA_RESTART;  // calls in flight complete; the loops check the flag
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

// Writes `text` to `path`; false (with a message naming `tag`) when it could not.
inline bool WriteResults(const char* tag, const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text << "\n";
  if (!out) std::fprintf(stderr, "%s: cannot write %s\n", tag, path.c_str());
  return static_cast<bool>(out);
}

// A directory under /tmp for a daemon's or an engine's state, removed with everything in it
// when this goes out of scope. 0711: the sandboxes' unprivileged uids must reach their layers.
// `tag` (the benchmark's name) prefixes the directory's name and the messages.
class ScratchDir {
 public:
  explicit ScratchDir(std::string tag) : tag_(std::move(tag)) {}
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    if (ec)
      std::fprintf(stderr, "%s: removing %s: %s\n", tag_.c_str(), path_.c_str(),
                   ec.message().c_str());
  }

  [[nodiscard]] Status Make() {
    std::string tmpl = "/tmp/" + tag_ + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) return FailErrno("mkdtemp /tmp", errno);
    path_ = tmpl;
    if (::chmod(path_.c_str(), 0711) != 0) return FailErrno("chmod " + path_, errno);
    return {};
  }
  const std::string& path() const { return path_; }

 private:
  std::string tag_;
  std::string path_;
};

// A real airlockd, started on a kernel-chosen loopback port without auth. Stopped with SIGTERM
// (which destroys its sandboxes), SIGKILL after a minute, on every path: Stop or the destructor.
// It runs in its own process group, so a Ctrl-C reaches only the benchmark, which then stops
// it in order; and it gets SIGTERM if the benchmark dies without doing so. `interrupted` (set
// by the benchmark's SIGINT handler) cuts the wait for the daemon to start short.
class DaemonProcess {
 public:
  DaemonProcess(std::string tag, const std::atomic<bool>& interrupted)
      : tag_(std::move(tag)), interrupted_(interrupted) {}
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;
  ~DaemonProcess() {
    if (auto st = Stop(); !st)
      std::fprintf(stderr, "%s: %s\n", tag_.c_str(), st.error().message().c_str());
  }

  // Starts airlockd with its state in `state_dir` and its log (stderr) in `log_path`, and waits
  // up to a minute for "listening on 127.0.0.1:PORT". `extra_args` go last (a later flag wins
  // over an earlier one). Call once, from the main thread.
  [[nodiscard]] Status Start(const std::string& state_dir, const std::string& log_path,
                             const std::vector<std::string>& extra_args = {}) {
    using Clock = std::chrono::steady_clock;
    log_path_ = log_path;
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return FailErrno("pipe2", errno);
    int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (log < 0) {
      ::close(out[0]);
      ::close(out[1]);
      return FailErrno("opening " + log_path, errno);
    }
    // Built before the fork: the child of a threaded process must not allocate.
    std::vector<std::string> args = {AIRLOCKD_PATH,      "--listen",    "127.0.0.1:0",
                                     "--state-dir",      state_dir,     "--agent",
                                     AIRLOCK_AGENT_PATH, "--launcher",  AIRLOCK_JAIL_LAUNCHER_PATH,
                                     "--no-auth",        "--log-level", "warn",
                                     "--on-shutdown",    "destroy",
                                     // networks of its own; DNS on loopback: nothing leaves
                                     "--network-id",     "bn",          "--network-subnet",
                                     "10.217.0.0/20",    "--network-dns", "127.0.0.1:9"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(126);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
      ::execv(AIRLOCKD_PATH, argv.data());
      ::_exit(127);
    }
    const int fork_errno = errno;
    ::close(out[1]);
    ::close(log);
    if (pid_ < 0) {
      ::close(out[0]);
      return FailErrno("fork", fork_errno);
    }
    std::string line;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (line.find('\n') == std::string::npos && Clock::now() < deadline &&
           !interrupted_.load()) {
      pollfd pfd{out[0], POLLIN, 0};
      if (::poll(&pfd, 1, 200) <= 0) continue;
      char buf[256];
      ssize_t n = ::read(out[0], buf, sizeof buf);
      if (n <= 0) break;  // airlockd exited (or closed stdout) before saying where it listens
      line.append(buf, static_cast<size_t>(n));
    }
    ::close(out[0]);
    const std::string prefix = "listening on 127.0.0.1:";
    if (interrupted_.load()) return Fail(ErrorCode::kUnavailable, "interrupted");
    if (!line.starts_with(prefix) || line.find('\n') == std::string::npos) {
      return Fail(ErrorCode::kUnavailable,
                  "airlockd did not say where it listens; stdout: '" + line + "'");
    }
    url_ = "http://127.0.0.1:" + std::to_string(std::atoi(line.substr(prefix.size()).c_str()));
    return {};
  }

  // SIGTERM, then waits up to a minute for the exit (SIGKILL after that). An error unless
  // airlockd exited 0 on its own. Does nothing if it is not running.
  [[nodiscard]] Status Stop() {
    using Clock = std::chrono::steady_clock;
    if (pid_ <= 0) return {};
    ::kill(pid_, SIGTERM);
    int status = 0;
    bool killed = false;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (true) {
      pid_t got = ::waitpid(pid_, &status, WNOHANG);
      if (got == pid_ || (got < 0 && errno != EINTR)) break;
      if (!killed && Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        killed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    if (killed) {
      return Fail(ErrorCode::kDeadlineExceeded,
                  "airlockd did not stop within 60 s of SIGTERM and was killed; its "
                  "sandboxes may be left behind");
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return Fail(ErrorCode::kInternal,
                  "airlockd stopped with wait status " + std::to_string(status));
    }
    return {};
  }

  const std::string& url() const { return url_; }
  // airlockd's pid while it runs (for its memory), else -1.
  pid_t pid() const { return pid_; }

  // The end of airlockd's log, for error reports.
  std::string LogTail(size_t bytes = 4000) const {
    std::ifstream in(log_path_);
    std::string log((std::istreambuf_iterator<char>(in)), {});
    return log.size() > bytes ? log.substr(log.size() - bytes) : log;
  }

 private:
  std::string tag_;
  const std::atomic<bool>& interrupted_;
  pid_t pid_ = -1;
  std::string url_;
  std::string log_path_;
};

}  // namespace airlock::bench
