#pragma once
// Shared helpers for the agent tests: a temporary directory, a real airlock-agent process on a
// socketpair, and checks on processes. Everything a test makes is undone when it ends, even when
// it fails: the channel is closed, the agent is waited for (SIGKILLed after 10 s), whatever it
// left running is killed and reaped, and the directory is removed.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "agent/process_tree.h"
#include "common/error.h"
#include "common/unique_fd.h"
#include "protocol/client.h"
#include "protocol/messages.h"

namespace airlock::agent::test {

using namespace std::chrono_literals;

// A fresh directory under /tmp, removed with everything in it (symlinks are removed, never
// followed) when the object goes.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/airlock-agent-test-XXXXXX";
    AIRLOCK_CHECK(::mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // `rel` below the directory.
  std::string Sub(std::string_view rel) const { return path_ + "/" + std::string(rel); }

 private:
  std::string path_;
};

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteWholeFile(const std::string& path, std::string_view data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
  AIRLOCK_CHECK(out.good());
}

// FNV-1a, to compare large buffers without printing them on failure.
inline uint64_t Fnv1a(std::string_view data) {
  uint64_t h = 14695981039346656037ull;
  for (char c : data) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ull;
  }
  return h;
}

// A field of /proc/<pid>/status in kB ("VmHWM", "VmRSS"), or -1.
inline int64_t ProcStatusKb(pid_t pid, std::string_view field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with(field) && line.size() > field.size() && line[field.size()] == ':') {
      return std::strtoll(line.c_str() + field.size() + 1, nullptr, 10);
    }
  }
  return -1;
}

// The process as it is now (pid and start time), so that a reused pid is not taken for it.
inline std::optional<ProcId> IdOf(pid_t pid) {
  auto st = ReadProcStat(pid);
  if (!st || st->state == 'Z') return std::nullopt;
  return ProcId{pid, st->start_time};
}

// True once `proc` no longer exists. A zombie does not count as gone; one that is this
// process's own child (an orphan handed to us, the tests being a child subreaper) is reaped.
inline bool WaitGone(const ProcId& proc, std::chrono::milliseconds timeout = 5s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto st = ReadProcStat(proc.pid);
    if (!st || st->start_time != proc.start_time) return true;
    if (st->state == 'Z' && st->ppid == ::getpid()) ::waitpid(proc.pid, nullptr, WNOHANG);
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
}

inline ::testing::AssertionResult AllGone(const std::vector<ProcId>& procs,
                                          std::chrono::milliseconds timeout = 5s) {
  std::string alive;
  for (const auto& p : procs) {
    if (!WaitGone(p, timeout)) {
      auto st = ReadProcStat(p.pid);
      alive += " " + std::to_string(p.pid) + "(" + (st ? std::string(1, st->state) : "?") + ")";
    }
  }
  if (alive.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "still alive after " << timeout.count() << " ms:" << alive;
}

// The agents started by AgentProcess and not yet reaped: KillAndReapChildren leaves them alone.
inline std::set<pid_t>& LiveAgents() {
  static std::set<pid_t> pids;
  return pids;
}

// Kills and reaps every child of this process but the live agents, with everything below them.
// (Orphans of an agent that exited come here, the tests being a child subreaper.)
inline void KillAndReapChildren() {
  pid_t self = ::getpid();
  for (int round = 0; round < 5; ++round) {
    std::vector<pid_t> children;
    std::vector<ProcId> running;
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      pid_t pid = std::atoi(entry.path().filename().c_str());
      if (pid <= 0 || LiveAgents().contains(pid)) continue;
      auto st = ReadProcStat(pid);
      if (!st || st->ppid != self) continue;
      children.push_back(pid);
      if (st->state != 'Z') running.push_back({pid, st->start_time});
    }
    if (children.empty()) return;
    KillTree(running);  // their children, orphaned, come to us for the next round
    auto deadline = std::chrono::steady_clock::now() + 2s;
    for (pid_t pid : children) {
      while (::waitpid(pid, nullptr, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(2ms);
      }
    }
  }
}

// An airlock-agent serving one end of a socketpair as fd 3 ("--fd 3"), as the daemon runs it;
// or, with kListen, started with `args` alone (which then say where it listens).
class AgentProcess {
 public:
  enum Mode { kChannel, kListen, kListenFd };
  // `env` is the agent's whole environment (sanitizer options are passed through). kListenFd
  // hands `listen_fd` to the agent as its fd 3 with --listen-fd 3.
  AgentProcess(const std::vector<std::string>& args, std::vector<std::string> env,
               Mode mode = kChannel, int listen_fd = -1) {
    for (const char* keep : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"}) {
      if (const char* v = std::getenv(keep)) env.push_back(std::string(keep) + "=" + v);
    }
    std::vector<std::string> argv = {AIRLOCK_AGENT_PATH};
    if (mode == kChannel) argv.insert(argv.end(), {"--fd", "3"});
    if (mode == kListenFd) argv.insert(argv.end(), {"--listen-fd", "3"});
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);

    int sv[2];
    AIRLOCK_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    UniqueFd ours(sv[0]), theirs(sv[1]);
    pid_ = ::fork();
    AIRLOCK_CHECK(pid_ >= 0);
    if (pid_ == 0) {
      // The agent must not outlive a test binary that crashes.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      if (mode == kListen) {
        // No channel to inherit.
      } else if (mode == kListenFd) {
        // dup2 clears close-on-exec, except onto itself.
        if (listen_fd == 3 ? ::fcntl(3, F_SETFD, 0) < 0 : ::dup2(listen_fd, 3) < 0) _exit(126);
      } else if (theirs.get() == 3) {
        ::fcntl(3, F_SETFD, 0);
      } else if (::dup2(theirs.get(), 3) < 0) {
        _exit(126);
      }
      ::execve(cargv[0], cargv.data(), cenv.data());
      _exit(127);
    }
    channel_ = std::move(ours);
    mode_ = mode;
    LiveAgents().insert(pid_);
  }
  ~AgentProcess() { Stop(); }
  AgentProcess(const AgentProcess&) = delete;
  AgentProcess& operator=(const AgentProcess&) = delete;

  pid_t pid() const { return pid_; }
  UniqueFd TakeChannel() { return std::move(channel_); }
  // The wait status once the agent has exited (it is reaped), nullopt if it still runs after
  // `timeout`.
  std::optional<int> WaitExit(std::chrono::milliseconds timeout) {
    if (status_) return status_;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        LiveAgents().erase(pid_);
        status_ = status;
        return status_;
      }
      if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(5ms);
    }
  }
  // Waits up to 10 s for the agent to exit (the caller has closed the channel; a listening agent
  // is sent SIGTERM), then kills it; then kills and reaps whatever it left behind. Returns the
  // wait status.
  int Stop() {
    channel_.Reset();
    if (mode_ == kListen && !status_) ::kill(pid_, SIGTERM);
    if (!WaitExit(10s)) {
      ADD_FAILURE() << "the agent did not exit within 10 s of its channel closing";
      ::kill(pid_, SIGKILL);
      WaitExit(10s);
    }
    KillAndReapChildren();
    return status_.value_or(-1);
  }

 private:
  pid_t pid_ = -1;
  Mode mode_ = kChannel;
  UniqueFd channel_;
  std::optional<int> status_;
};

// What arrived so far for one exec stream.
struct ExecProgress {
  int32_t pid = 0;
  std::string stdout_data, stderr_data;
  uint64_t stdout_received = 0, stderr_received = 0;
  bool keep_data = true;  // false: only count the bytes
  std::optional<protocol::Exited> exited;
  std::optional<protocol::ErrorMsg> error;
  bool finished() const { return exited || error; }
};

// Reads the channel frame by frame, for tests that need to see an exec's start before its end
// (BlockingClient::WaitAll only returns finished commands).
class ExecWatcher {
 public:
  explicit ExecWatcher(protocol::BlockingClient& client) : client_(client) {}

  ExecProgress& operator[](uint32_t stream) { return streams_[stream]; }
  const std::vector<protocol::ErrorMsg>& channel_errors() const { return channel_errors_; }

  // Reads frames until `done()` holds. Fails on a broken channel, an error on stream 0 or after
  // `timeout`.
  ::testing::AssertionResult ReadUntil(const std::function<bool()>& done,
                                       std::chrono::milliseconds timeout = 60s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return ::testing::AssertionFailure() << "timed out";
      auto got = client_.Receive(left);
      if (!got) return ::testing::AssertionFailure() << got.error().message();
      auto& [stream, msg] = *got;
      if (stream == 0) {
        if (auto* err = std::get_if<protocol::ErrorMsg>(&msg)) {
          channel_errors_.push_back(*err);
          return ::testing::AssertionFailure() << "channel error: " << err->message;
        }
        continue;
      }
      ExecProgress& p = streams_[stream];
      if (auto* started = std::get_if<protocol::Started>(&msg)) {
        p.pid = started->pid;
      } else if (auto* out = std::get_if<protocol::Output>(&msg)) {
        bool is_stdout = out->fd == protocol::OutputFd::kStdout;
        (is_stdout ? p.stdout_received : p.stderr_received) += out->data.size();
        if (p.keep_data) (is_stdout ? p.stdout_data : p.stderr_data) += out->data;
      } else if (auto* exited = std::get_if<protocol::Exited>(&msg)) {
        p.exited = *exited;
      } else if (auto* error = std::get_if<protocol::ErrorMsg>(&msg)) {
        p.error = *error;
      }
    }
    return ::testing::AssertionSuccess();
  }
  ::testing::AssertionResult WaitStarted(uint32_t stream) {
    return ReadUntil([&] { return streams_[stream].pid != 0 || streams_[stream].finished(); });
  }
  ::testing::AssertionResult WaitFinished(uint32_t stream,
                                          std::chrono::milliseconds timeout = 60s) {
    return ReadUntil([&] { return streams_[stream].finished(); }, timeout);
  }

 private:
  protocol::BlockingClient& client_;
  std::map<uint32_t, ExecProgress> streams_;
  std::vector<protocol::ErrorMsg> channel_errors_;
};

inline constexpr int64_t kRssLimitKb = 64 * 1024;

// The agent's memory limit in the tests that check it. An ASan build's runtime alone takes ~40 MiB
// (shadow memory, allocator), so there the limit is on top of what the agent held at start.
inline int64_t AgentRssLimitKb(pid_t agent) {
#if defined(AIRLOCK_SANITIZED_PROGRAMS)
  return kRssLimitKb + ProcStatusKb(agent, "VmRSS");
#else
  (void)agent;
  return kRssLimitKb;
#endif
}

// A channel to an agent listening on `path` (retried while the agent starts).
inline Result<protocol::BlockingClient> ConnectUnix(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) {
    if (std::chrono::steady_clock::now() > deadline) return FailErrno("connect " + path, errno);
    std::this_thread::sleep_for(10ms);  // the agent is still starting
  }
  return protocol::BlockingClient::Connect(std::move(fd));
}

inline protocol::Exec ShellExec(std::string command) {
  protocol::Exec e;
  e.shell = std::move(command);
  return e;
}

inline protocol::Exec ArgvExec(std::vector<std::string> argv) {
  protocol::Exec e;
  e.argv = std::move(argv);
  return e;
}

// A test with its own agent: a fresh file root, the agent started on a socketpair with
// `--root <root>` and HOME set to the root, and a connected BlockingClient.
class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Orphans of an agent that exits come to the test, which reaps them.
    ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    // A write to a channel the agent has closed must fail, not kill the test.
    ::signal(SIGPIPE, SIG_IGN);
    ASSERT_NO_FATAL_FAILURE(StartAgent());
  }
  void TearDown() override { StopAgent(); }

  // (Re)starts the agent with extra flags and connects to it.
  void StartAgent(std::vector<std::string> extra = {}) {
    StopAgent();
    std::vector<std::string> args = {"--root", root_.path(), "--log-level", "warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    agent_ = std::make_unique<AgentProcess>(
        args, std::vector<std::string>{"HOME=" + root_.path(), "PATH=/usr/bin:/bin",
                                       "AIRLOCK_TEST_AGENT_ONLY=1"});
    auto client = protocol::BlockingClient::Connect(agent_->TakeChannel(), "airlock-agent-test");
    ASSERT_TRUE(client) << client.error().message();
    client_.emplace(std::move(*client));
  }
  // Closes the channel and waits for the agent (see AgentProcess::Stop). Returns its wait
  // status, or -1 when no agent was running.
  int StopAgent() {
    client_.reset();
    if (!agent_) return -1;
    int status = agent_->Stop();
    agent_.reset();
    return status;
  }

  protocol::BlockingClient& client() { return *client_; }
  pid_t agent_pid() const { return agent_->pid(); }

  // Runs a command to completion; a failure to run it fails the test.
  protocol::ExecResult MustExec(const protocol::Exec& request, std::string_view stdin_data = {}) {
    auto r = client().Exec(request, stdin_data);
    EXPECT_TRUE(r) << (r ? "" : r.error().message());
    return r ? std::move(*r) : protocol::ExecResult{};
  }
  protocol::ExecResult MustShell(std::string command) {
    return MustExec(ShellExec(std::move(command)));
  }

  TempDir root_;
  std::unique_ptr<AgentProcess> agent_;
  std::optional<protocol::BlockingClient> client_;
};

}  // namespace airlock::agent::test
