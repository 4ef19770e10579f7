#include "cli/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/unique_fd.h"

namespace airlock::cli {

Outcome<Ran> RunCaptured(const std::vector<std::string>& argv, std::string_view input) {
  const std::string name = argv.at(0);
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return CommandError("pipe: " + std::string(strerror(errno)));
  UniqueFd in_r(in[0]), in_w(in[1]);
  if (::pipe2(out, O_CLOEXEC) != 0) return CommandError("pipe: " + std::string(strerror(errno)));
  UniqueFd out_r(out[0]), out_w(out[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) return CommandError("pipe: " + std::string(strerror(errno)));
  UniqueFd err_r(err[0]), err_w(err[1]);

  std::vector<std::string> copy = argv;
  std::vector<char*> args;
  for (auto& a : copy) args.push_back(a.data());
  args.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid < 0) return CommandError("fork: " + std::string(strerror(errno)));
  if (pid == 0) {
    ::dup2(in_r.get(), STDIN_FILENO);
    ::dup2(out_w.get(), STDOUT_FILENO);
    ::dup2(err_w.get(), STDERR_FILENO);
    ::execvp(args[0], args.data());
    static constexpr char kMsg[] = "cannot run the program\n";
    (void)!::write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    ::_exit(127);
  }
  in_r.Reset();
  out_w.Reset();
  err_w.Reset();
  if (input.empty()) in_w.Reset();
  ::fcntl(in_w.get(), F_SETFL, O_NONBLOCK);

  std::string stdout_bytes, stderr_bytes;
  size_t sent = 0;
  while (out_r || err_r) {
    pollfd fds[3];
    int n = 0;
    if (out_r) fds[n++] = {out_r.get(), POLLIN, 0};
    if (err_r) fds[n++] = {err_r.get(), POLLIN, 0};
    if (in_w) fds[n++] = {in_w.get(), POLLOUT, 0};
    if (::poll(fds, static_cast<nfds_t>(n), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int k = 0; k < n; ++k) {
      if (fds[k].revents == 0) continue;
      if (in_w && fds[k].fd == in_w.get()) {
        ssize_t w = ::write(in_w.get(), input.data() + sent, input.size() - sent);
        if (w > 0) sent += static_cast<size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || sent == input.size()) in_w.Reset();
        continue;
      }
      char buf[65536];
      ssize_t r = ::read(fds[k].fd, buf, sizeof buf);
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      const bool is_out = out_r && fds[k].fd == out_r.get();
      if (r <= 0) {
        (is_out ? out_r : err_r).Reset();
        continue;
      }
      (is_out ? stdout_bytes : stderr_bytes).append(buf, static_cast<size_t>(r));
    }
  }
  in_w.Reset();
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && stdout_bytes.empty() &&
      stderr_bytes == "cannot run the program\n") {
    return CommandError("cannot run " + name);
  }
  return Ran{status, std::move(stdout_bytes), std::move(stderr_bytes)};
}

Outcome<std::string> RunProgram(const std::vector<std::string>& argv, std::string_view input) {
  auto ran = RunCaptured(argv, input);
  if (!ran) return std::unexpected(ran.error());
  const int status = ran->status;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return std::move(ran->out);
  std::string first = ran->err.substr(0, ran->err.find('\n'));
  if (first.empty()) {
    first = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                : "exit status " + std::to_string(WEXITSTATUS(status));
  }
  return CommandError(argv.at(0) + " failed: " + first);
}

}  // namespace airlock::cli
