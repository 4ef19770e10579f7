#pragma once
// A real airlockd for end-to-end tests: started on a kernel-chosen port with its own state dir,
// driven over HTTP the way a client would, and stopped (then killed by pid) on every path.
// Needs root (the jail engine); DaemonTest skips with the reason otherwise.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/http.h"
#include "support/programs.h"
#include "support/slot.h"

namespace airlock::testing {

namespace fs = std::filesystem;

// The flags that turn gVisor on in a test daemon (it is off unless a test asks).
// The platform is named: "auto" tries KVM first, which costs seconds where /dev/kvm cannot run
// a guest (EnginesTest checks auto on its own).
inline const std::vector<std::string> kWithGvisor = {"--engine.gvisor.enabled", "true",
                                                     "--engine.gvisor.platform", "ptrace"};

// The daemon under test: started on port 0, killed by pid on every path.
class Daemon {
 public:
  // `extra_args` go on airlockd's command line after the ones every test needs.
  explicit Daemon(std::string state_dir, std::vector<std::string> extra_args = {})
      : state_dir_(std::move(state_dir)), extra_args_(std::move(extra_args)) {
    // Networking of its own, named and numbered after this test process's slot (tests run two
    // at a time): its nftables table, namespaces and veths are found by that name and removed at
    // the end, also after a SIGKILL; no links made ahead unless a test asks.
    network_id_ = "t" + std::to_string(TestSlot());
  }
  Daemon(const Daemon&) = delete;
  ~Daemon() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    RemoveNetworkLeftovers();
  }

  const std::string& network_id() const { return network_id_; }

  // What a daemon killed before its stop left of its networking (nothing after a clean stop).
  void RemoveNetworkLeftovers() const {
    const std::string script =
        "nft delete table inet airlock_" + network_id_ + " 2>/dev/null; "
        "for n in $(ls /run/netns 2>/dev/null | grep '^airlock-" + network_id_ + "-'); do "
        "ip link del al" + network_id_ + "-${n##*-} 2>/dev/null; ip netns del $n; done; true";
    (void)!std::system(script.c_str());
  }

  // Starts airlockd and reads "listening on HOST:PORT" from its stdout.
  ::testing::AssertionResult Start() {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return ::testing::AssertionFailure() << "pipe";
    const std::string log = state_dir_ + ".log";
    // Built before the fork: the child of a threaded process must not allocate.
    std::vector<std::string> args = {Program(AIRLOCKD_PATH), "--listen", "127.0.0.1:0", "--state-dir",
                                     state_dir_,     "--agent",  Program(AIRLOCK_AGENT_PATH),
                                     "--launcher",   Program(AIRLOCK_JAIL_LAUNCHER_PATH),
                                     "--log-level", "debug",
                                     "--on-shutdown", "destroy",
                                     "--network-id", network_id_,
                                     "--network-subnet",
                                     "10.213." + std::to_string(TestSlot()) + ".0/24",
                                     "--network-warm-links", "0",
                                     // gVisor's probe makes a real runsc sandbox (about 200 ms):
                                     // only daemons that run sandboxes on it pay for it
                                     // (kWithGvisor among their extra flags, which come last).
                                     "--engine.gvisor.enabled", "false"};
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t test_pid = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      // The daemon goes with the test process, however that ends (an abort skips every
      // destructor): SIGTERM, on which it destroys its sandboxes (--on-shutdown destroy).
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != test_pid) ::_exit(127);
      ::dup2(out[1], STDOUT_FILENO);
      int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (err >= 0) ::dup2(err, STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd pfd{out[0], POLLIN, 0};
      if (::poll(&pfd, 1, 1000) <= 0) continue;
      char buf[256];
      ssize_t n = ::read(out[0], buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    ::close(out[0]);
    const std::string prefix = "listening on 127.0.0.1:";
    if (!line.starts_with(prefix) || line.find('\n') == std::string::npos) {
      return ::testing::AssertionFailure()
             << "airlockd did not say where it listens; stdout: " << line << "\nlog:\n"
             << Log();
    }
    port_ = static_cast<uint16_t>(std::atoi(line.substr(prefix.size()).c_str()));
    std::ifstream key_file(state_dir_ + "/admin.key");
    std::getline(key_file, key_);
    if (key_.empty()) return ::testing::AssertionFailure() << "no admin key in the state dir";
    return ::testing::AssertionSuccess();
  }

  // Sends `signo` and waits up to `timeout` for the exit; SIGKILL after that. The wait status.
  int Stop(int signo, std::chrono::seconds timeout = std::chrono::seconds(60)) {
    ::kill(pid_, signo);
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    return status;
  }

  std::string Log() const {
    std::ifstream in(state_dir_ + ".log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  Reply Call(http::verb method, const std::string& target, const std::string& body = "") {
    return Http(port_, method, target, body, "Bearer " + key_);
  }
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& key() const { return key_; }
  bool running() const { return pid_ > 0; }
  const std::string& state_dir() const { return state_dir_; }

 private:
  std::string state_dir_;
  std::vector<std::string> extra_args_;
  std::string network_id_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  std::string key_;
};

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0)
      GTEST_SKIP() << "needs root: the jail engine makes namespaces and cgroups";
    char tmpl[] = "/tmp/airlockd-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // The sandboxes' unprivileged uids must reach their layers under the state dir.
    fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    daemon_.emplace(dir_ + "/state", DaemonArgs());
    ASSERT_TRUE(daemon_->Start());
  }
  // Flags a fixture adds to the daemon's command line.
  virtual std::vector<std::string> DaemonArgs() const { return {}; }
  void TearDown() override {
    if (HasFailure() && daemon_)
      std::fprintf(stderr, "--- airlockd log ---\n%s", daemon_->Log().c_str());
    // A graceful stop destroys the daemon's sandboxes (SIGKILL after a minute); a SIGKILL
    // straight away would leave their cgroups behind.
    if (daemon_ && daemon_->running()) {
      const int status = daemon_->Stop(SIGTERM);
      EXPECT_TRUE(WIFEXITED(status)) << "airlockd did not stop within a minute of SIGTERM";
    }
    // What a killed daemon left (a test that SIGKILLed it last, or a stop that timed out): a new
    // daemon on the same state dir adopts it and destroys it as it stops. Nothing outlives the
    // test, whatever happened in it.
    std::error_code ec;
    auto holds = [&](const std::string& dir) {
      std::error_code e;
      return !fs::is_empty(daemon_->state_dir() + dir, e) && !e;
    };
    if (daemon_ && (holds("/jail") || holds("/gvisor/sandboxes")) && daemon_->Start()) {
      daemon_->Stop(SIGTERM);
    }
    daemon_.reset();
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  // Creates a sandbox and returns its id (empty, with a test failure, if that failed).
  std::string CreateSandbox(const std::string& body = "{}") {
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes", body);
    EXPECT_EQ(r.status, 201) << r.body;
    if (r.status != 201) return "";
    EXPECT_EQ(r.Json()["state"], "running") << r.body;
    return r.Json()["id"].get<std::string>();
  }

  // Runs `cmd` in sandbox `id` (30 s at most); its stdout, and its exit code through `code`.
  std::string Run(const std::string& id, const std::string& cmd, int* code = nullptr,
                  std::string* err = nullptr) {
    Reply r = daemon_->Call(http::verb::post, "/v1/sandboxes/" + id + "/exec",
                            json{{"cmd", cmd}, {"timeout_seconds", 30}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    const json doc = r.Json();
    if (code) *code = doc.value("exit_code", -1);
    if (err) *err = doc.value("stderr", "");
    return doc.value("stdout", "");
  }

  // {id: state} of every listed sandbox.
  std::map<std::string, std::string> Listed() {
    Reply r = daemon_->Call(http::verb::get, "/v1/sandboxes");
    EXPECT_EQ(r.status, 200) << r.body;
    std::map<std::string, std::string> out;
    const json doc = r.Json();
    for (const auto& s : doc["sandboxes"]) out[s["id"].get<std::string>()] = s["state"];
    return out;
  }

  std::string dir_;
  std::optional<Daemon> daemon_;
};

// What a finished child process did.
struct ProcessResult {
  int status = -1;  // as waitpid reports it
  std::string out, err;
  // The exit code; -1 if a signal ended the process.
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

// A child process with its stdin, stdout and stderr on pipes; killed by pid if still running
// when destroyed. Not for use from more than one thread.
class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : {in_, out_, err_}) {
      if (fd >= 0) ::close(fd);
    }
  }

  // Starts argv[0] (a path) with this process's environment, less every AIRLOCK_* variable,
  // plus `env`. `stdin_data` is fed by Finish, then stdin is closed.
  ::testing::AssertionResult Start(const std::vector<std::string>& argv,
                                   const std::map<std::string, std::string>& env,
                                   std::string stdin_data = "") {
    stdin_data_ = std::move(stdin_data);
    ::signal(SIGPIPE, SIG_IGN);  // a child that exits without reading its stdin is not fatal
    // Built before the fork: the child of a threaded process must not allocate.
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      if (!std::string_view(*e).starts_with("AIRLOCK_")) env_strings.emplace_back(*e);
    }
    for (const auto& [key, value] : env) env_strings.push_back(key + "=" + value);
    std::vector<std::string> args = argv;
    std::vector<char*> argp, envp;
    for (auto& a : args) argp.push_back(a.data());
    argp.push_back(nullptr);
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 ||
        ::pipe2(err, O_CLOEXEC) != 0) {
      return ::testing::AssertionFailure() << "pipe2: " << std::strerror(errno);
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::execve(argp[0], argp.data(), envp.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    in_ = in[1];
    out_ = out[0];
    err_ = err[0];
    if (pid_ < 0) return ::testing::AssertionFailure() << "fork: " << std::strerror(errno);
    ::fcntl(in_, F_SETFL, O_NONBLOCK);
    return ::testing::AssertionSuccess();
  }

  pid_t pid() const { return pid_; }

  // Feeds stdin, reads stdout and stderr until both close, and reaps the child; SIGKILL once
  // `timeout` has passed.
  ProcessResult Finish(std::chrono::seconds timeout = std::chrono::seconds(180)) {
    ProcessResult result;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    size_t sent = 0;
    if (stdin_data_.empty()) CloseFd(&in_);
    while (out_ >= 0 || err_ >= 0) {
      if (std::chrono::steady_clock::now() > deadline && pid_ > 0) ::kill(pid_, SIGKILL);
      pollfd fds[3];
      nfds_t n = 0;
      if (out_ >= 0) fds[n++] = {out_, POLLIN, 0};
      if (err_ >= 0) fds[n++] = {err_, POLLIN, 0};
      if (in_ >= 0) fds[n++] = {in_, POLLOUT, 0};
      if (::poll(fds, n, 500) < 0 && errno != EINTR) break;
      for (nfds_t k = 0; k < n; ++k) {
        if (fds[k].revents == 0) continue;
        if (fds[k].fd == in_) {
          ssize_t w = ::write(in_, stdin_data_.data() + sent, stdin_data_.size() - sent);
          if (w > 0) sent += static_cast<size_t>(w);
          if ((w < 0 && errno != EAGAIN) || sent == stdin_data_.size()) CloseFd(&in_);
          continue;
        }
        char buf[65536];
        ssize_t r = ::read(fds[k].fd, buf, sizeof buf);
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        const bool is_out = fds[k].fd == out_;
        if (r <= 0) {
          CloseFd(is_out ? &out_ : &err_);
          continue;
        }
        (is_out ? result.out : result.err).append(buf, static_cast<size_t>(r));
      }
    }
    CloseFd(&in_);
    if (pid_ > 0) {
      ::waitpid(pid_, &result.status, 0);
      pid_ = -1;
    }
    return result;
  }

 private:
  static void CloseFd(int* fd) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  std::string stdin_data_;
};

// Runs argv to completion (see ChildProcess::Start for `env`).
inline ProcessResult RunProcess(const std::vector<std::string>& argv,
                                const std::map<std::string, std::string>& env,
                                std::string stdin_data = "") {
  ChildProcess child;
  if (auto started = child.Start(argv, env, std::move(stdin_data)); !started) {
    ADD_FAILURE() << started.message();
    return {};
  }
  return child.Finish();
}

// Every directory under the cgroup roots whose name contains `id`.
inline std::vector<std::string> CgroupsNamed(const std::string& id) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(
           "/sys/fs/cgroup", fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec) && it->path().filename().string().find(id) != std::string::npos) {
      found.push_back(it->path().string());
    }
  }
  return found;
}

}  // namespace airlock::testing
