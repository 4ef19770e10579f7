// airlock-agent-demo: starts airlock-agent on a socketpair, as the daemon will, and shows it at
// work: a command, stdin, a file round trip, parallel commands, and a timeout that takes a
// daemonised grandchild with it. scripts/run shows this until the daemon exists.

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "protocol/client.h"

namespace p = airlock::protocol;

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "airlock-agent-demo: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Check(airlock::Result<T> r, const char* what) {
  if (!r) Die(std::string(what) + ": " + r.error().message());
  return std::move(*r);
}

void Check(airlock::Status st, const char* what) {
  if (!st) Die(std::string(what) + ": " + st.error().message());
}

p::Exec Shell(std::string cmd) {
  p::Exec e;
  e.shell = std::move(cmd);
  return e;
}

void Show(const char* title, const p::ExecResult& r) {
  std::printf("\n$ %s\n%s", title, r.stdout_data.c_str());
  if (!r.stderr_data.empty()) std::printf("[stderr] %s", r.stderr_data.c_str());
  std::printf(
      "-> exit %d%s, %.2f ms%s\n", r.exit.exit_code,
      r.exit.term_signal ? (" (signal " + std::to_string(r.exit.term_signal) + ")").c_str() : "",
      r.exit.duration_us / 1000.0, r.exit.timed_out ? ", timed out" : "");
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path self = std::filesystem::canonical("/proc/self/exe");
  std::string agent = argc > 1 ? argv[1] : (self.parent_path() / "airlock-agent").string();
  std::string root =
      std::filesystem::temp_directory_path() / ("airlock-demo-" + std::to_string(getpid()));
  std::filesystem::create_directories(root);

  auto agent_process = Check(p::StartLocalAgent(agent, {"--root", root, "--kill-grace-ms", "200"}),
                             "starting the agent");
  pid_t pid = agent_process.pid;
  auto client =
      Check(p::BlockingClient::Connect(std::move(agent_process.channel), "airlock-agent-demo"),
            "connecting to the agent");
  std::printf("agent: %s (pid %d), protocol v%d, files confined to %s\n",
              client.peer_hello().build_id.c_str(), pid, client.peer_hello().version, root.c_str());

  Show("uname -sr; id -un; echo to stderr >&2",
       Check(client.Exec(Shell("uname -sr; id -un; echo to stderr >&2")), "exec"));

  p::Exec wc = Shell("tr a-z A-Z");
  wc.stdin_mode = p::StdinMode::kPipe;
  Show("tr a-z A-Z  <<< 'hello from stdin'",
       Check(client.Exec(wc, "hello from stdin\n"), "exec with stdin"));

  Check(client.WriteFile("/work/notes.txt", "written through the agent\n", 0644, true),
        "write file");
  Show("cat work/notes.txt (uploaded by the agent, relative to its root)",
       Check(client.Exec(Shell("cat " + root + "/work/notes.txt")), "exec"));
  std::printf("read back: %s", Check(client.ReadFile("/work/notes.txt"), "read file").c_str());

  auto t0 = std::chrono::steady_clock::now();
  std::vector<uint32_t> streams;
  for (int i = 0; i < 20; ++i) {
    streams.push_back(
        Check(client.StartExec(Shell("sleep 0.2; echo " + std::to_string(i))), "start exec"));
  }
  auto all = Check(client.WaitAll(streams), "wait");
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n20 commands of 'sleep 0.2' at once on one channel: all done in %.0f ms\n", ms);
  for (auto& [s, r] : all) Check(std::move(r), "parallel exec");

  std::string pidfile = root + "/daemon.pid";
  p::Exec slow = Shell("(setsid sh -c 'sleep 600 & echo $! > " + pidfile + "') ; sleep 600");
  slow.timeout_ms = 500;
  auto r = Check(client.Exec(slow), "exec with timeout");
  Show("a daemonised 'sleep 600' and a 'sleep 600', with a 500 ms timeout", r);
  auto daemon_pid = std::stoi(Check(client.ReadFile("/daemon.pid"), "read pid file"));
  std::printf("the daemonised child %d is %s\n", daemon_pid,
              ::kill(daemon_pid, 0) == 0 ? "STILL RUNNING" : "gone");

  ::shutdown(client.fd(), SHUT_RDWR);  // the agent exits when its channel closes
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::filesystem::remove_all(root);
  std::printf("\nagent exited with status %d after its channel closed\n", WEXITSTATUS(status));
  return 0;
}
