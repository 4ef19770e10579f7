#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "common/syscall.h"
#include "common/unique_fd.h"

namespace airlock {
namespace {

constexpr size_t kMaxOutput = 64 * 1024;

std::string FindProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin"}) {
    std::string path = std::string(dir) + "/" + name;
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

}  // namespace

Result<ProgramResult> RunProgram(const std::vector<std::string>& argv, const std::string& input,
                                 std::chrono::milliseconds timeout) {
  if (argv.empty()) return Fail(ErrorCode::kInvalidArgument, "no program to run");
  const std::string path = FindProgram(argv[0]);
  if (path.empty()) return Fail(ErrorCode::kUnimplemented, argv[0] + " is not installed");
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::string env_path = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
  char* envp[] = {env_path.data(), nullptr};

  UniqueFd in[2], out[2];
  if (auto st = MakePipe(in); !st) return std::unexpected(st.error());
  if (auto st = MakePipe(out); !st) return std::unexpected(st.error());
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0].get(), 0);
  posix_spawn_file_actions_adddup2(&actions, out[1].get(), 1);
  posix_spawn_file_actions_adddup2(&actions, out[1].get(), 2);
  // Nothing else of the caller's: not every library marks its descriptors close-on-exec (Asio's
  // sockets are not), and a program that lingers (runsc's sandbox) would hold them.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  int spawned = ::posix_spawn(&pid, path.c_str(), &actions, &attr, cargv.data(), envp);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawned != 0) return FailErrno("starting " + argv[0], spawned);
  in[0].Reset();
  out[1].Reset();

  // Input first (small: a batch of commands), then output until the program closes it.
  size_t written = 0;
  while (written < input.size()) {
    ssize_t n = RetryEintr(
        [&] { return ::write(in[1].get(), input.data() + written, input.size() - written); });
    if (n <= 0) break;  // it exited or closed stdin: its exit status says the rest
    written += static_cast<size_t>(n);
  }
  in[1].Reset();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  ProgramResult result;
  bool timed_out = false;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd p{out[0].get(), POLLIN, 0};
    if (RetryEintr([&] { return ::poll(&p, 1, static_cast<int>(left.count())); }) <= 0) continue;
    char buf[4096];
    ssize_t n = RetryEintr([&] { return ::read(out[0].get(), buf, sizeof buf); });
    if (n <= 0) break;
    if (result.output.size() < kMaxOutput) {
      result.output.append(buf, std::min(static_cast<size_t>(n), kMaxOutput - result.output.size()));
    }
  }
  int status = 0;
  RetryEintr([&] { return ::waitpid(pid, &status, 0); });
  if (timed_out) {
    return Fail(ErrorCode::kDeadlineExceeded, argv[0] + " did not finish in time");
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

Status RunProgramOk(const std::vector<std::string>& argv, const std::string& input,
                    std::chrono::milliseconds timeout) {
  auto ran = RunProgram(argv, input, timeout);
  if (!ran) return std::unexpected(ran.error());
  if (ran->exit_code == 0) return {};
  std::string out = ran->output;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  std::string cmd;
  for (const std::string& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  return Fail(ErrorCode::kInternal, cmd + " failed (exit " + std::to_string(ran->exit_code) +
                                        "): " + out);
}

}  // namespace airlock
