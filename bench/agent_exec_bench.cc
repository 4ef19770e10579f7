// Exec round trip of `true` through airlock-agent, beside a bare fork+exec+wait of `true` (the
// target: agent p50 <= 1.5x fork+exec) and posix_spawn, all measured in the same run with the
// samples interleaved, so machine noise falls on every side alike.
//
//   airlock-bench-exec [--iterations N] [--warmup N] [--json FILE] [--agent PATH]

#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "protocol/client.h"
#include "stats.h"

namespace p = airlock::protocol;
using Clock = std::chrono::steady_clock;

extern char** environ;

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "airlock-bench-exec: %s\n", what.c_str());
  std::exit(1);
}

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

const char* TruePath() {
  return access("/usr/bin/true", X_OK) == 0 ? "/usr/bin/true" : "/bin/true";
}

double ForkExec() {
  auto t0 = Clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    char* argv[] = {const_cast<char*>("true"), nullptr};
    execve(TruePath(), argv, environ);
    _exit(127);
  }
  int status;
  waitpid(pid, &status, 0);
  auto t1 = Clock::now();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("fork+exec of true failed");
  return Us(t0, t1);
}

double PosixSpawn() {
  auto t0 = Clock::now();
  pid_t pid;
  char* argv[] = {const_cast<char*>("true"), nullptr};
  if (posix_spawn(&pid, TruePath(), nullptr, nullptr, argv, environ) != 0) Die("posix_spawn");
  int status;
  waitpid(pid, &status, 0);
  auto t1 = Clock::now();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("posix_spawn of true failed");
  return Us(t0, t1);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 2000, warmup = 200;
  std::string json_path, agent = AIRLOCK_AGENT_PATH;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--iterations")
      iterations = std::stoi(next());
    else if (a == "--warmup")
      warmup = std::stoi(next());
    else if (a == "--json")
      json_path = next();
    else if (a == "--agent")
      agent = next();
    else
      Die("unknown argument " + a);
  }
  if (iterations < 1 || warmup < 0) Die("--iterations must be positive");

  std::string root =
      std::filesystem::temp_directory_path() / ("airlock-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(root);
  auto agent_process = p::StartLocalAgent(agent, {"--root", root, "--log-level", "warn"});
  if (!agent_process) Die("starting the agent: " + agent_process.error().message());
  pid_t agent_pid = agent_process->pid;
  auto client = p::BlockingClient::Connect(std::move(agent_process->channel), "airlock-bench");
  if (!client) Die("connecting to the agent: " + client.error().message());

  p::Exec req;
  req.argv = {TruePath()};
  auto agent_exec = [&]() {
    auto t0 = Clock::now();
    auto r = client->Exec(req);
    auto t1 = Clock::now();
    if (!r) Die("exec through the agent: " + r.error().message());
    if (r->exit.exit_code != 0) Die("true exited " + std::to_string(r->exit.exit_code));
    return Us(t0, t1);
  };

  for (int i = 0; i < warmup; ++i) {
    agent_exec();
    ForkExec();
    PosixSpawn();
  }
  std::vector<double> a, f, s;
  for (int i = 0; i < iterations; ++i) {
    // Rotate the order so no side always runs right after another.
    switch (i % 3) {
      case 0:
        a.push_back(agent_exec());
        f.push_back(ForkExec());
        s.push_back(PosixSpawn());
        break;
      case 1:
        f.push_back(ForkExec());
        s.push_back(PosixSpawn());
        a.push_back(agent_exec());
        break;
      default:
        s.push_back(PosixSpawn());
        a.push_back(agent_exec());
        f.push_back(ForkExec());
        break;
    }
  }

  shutdown(client->fd(), SHUT_RDWR);
  int status;
  waitpid(agent_pid, &status, 0);
  std::filesystem::remove_all(root);

  auto sa = airlock::bench::Summarize("agent exec round trip (true)", a);
  auto sf = airlock::bench::Summarize("baseline fork+exec+wait (true)", f);
  auto ss = airlock::bench::Summarize("baseline posix_spawn+wait (true)", s);
  std::printf("agent: %s\n\n", client->peer_hello().build_id.c_str());
  airlock::bench::PrintHeader();
  airlock::bench::Print(sa);
  airlock::bench::Print(sf);
  airlock::bench::Print(ss);
  double r50 = sa.p50 / sf.p50, r99 = sa.p99 / sf.p99;
  std::printf("\nratio agent/fork+exec: p50 %.2fx, p99 %.2fx (target p50 <= 1.50x: %s)\n", r50, r99,
              r50 <= 1.5 ? "met" : "NOT met");
  std::printf("ratio agent/posix_spawn: p50 %.2fx, p99 %.2fx\n", sa.p50 / ss.p50, sa.p99 / ss.p99);
  if (!json_path.empty()) {
    FILE* out = std::fopen(json_path.c_str(), "w");
    if (!out) Die("cannot write " + json_path);
    std::fprintf(out,
                 "{\"benchmark\":\"agent_exec\",\"results\":[%s,%s,%s],"
                 "\"ratio_p50_vs_fork_exec\":%.3f,\"ratio_p99_vs_fork_exec\":%.3f}\n",
                 airlock::bench::Json(sa).c_str(), airlock::bench::Json(sf).c_str(),
                 airlock::bench::Json(ss).c_str(), r50, r99);
    std::fclose(out);
  }
  return 0;
}
