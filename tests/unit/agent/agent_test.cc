// The agent as the daemon drives it: a real airlock-agent process per test, on a socketpair,
// with its file root in a fresh temporary directory.

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "agent/process_tree.h"
#include "agent_fixture.h"
#include "protocol/frame_decoder.h"
#include "protocol/messages.h"
#include "protocol/wire.h"
#include "runtime/seccomp_policy.h"

namespace airlock::agent::test {
namespace {

namespace fs = std::filesystem;
namespace p = protocol;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1 << 20;
std::map<std::string, std::string> ParseEnv(const std::string& text) {
  std::map<std::string, std::string> env;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(start, nl - start);
    size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    start = nl + 1;
  }
  return env;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(gen() & 0xff);
  return out;
}

// --- Handshake and channel messages ---------------------------------------------------------

TEST_F(AgentTest, HelloCarriesBuildIdAndVersion) {
  const p::Hello& hello = client().peer_hello();
  EXPECT_TRUE(hello.build_id.starts_with("airlock-agent")) << hello.build_id;
  EXPECT_EQ(hello.version, p::kProtocolVersion);
  EXPECT_EQ(hello.features, 0u);
}

TEST_F(AgentTest, PingIsAnsweredWithTheSameNonce) {
  for (uint64_t nonce : {0ull, 1ull, 0xdeadbeefcafef00dull}) {
    auto st = client().Ping(nonce);
    EXPECT_TRUE(st) << st.error().message();
  }
}

TEST_F(AgentTest, PongFromTheDaemonIsIgnored) {
  ASSERT_TRUE(client().Send(0, p::Pong{7}));
  auto st = client().Ping(8);
  EXPECT_TRUE(st) << st.error().message();
}

// --- Exec -----------------------------------------------------------------------------------

TEST_F(AgentTest, ExecArgvIsNotInterpretedByAShell) {
  auto r = MustExec(ArgvExec({"printf", "%s|%s", "$HOME;*", "two words"}));
  EXPECT_EQ(r.stdout_data, "$HOME;*|two words");
  EXPECT_EQ(r.exit.exit_code, 0);
  EXPECT_GT(r.pid, 0);
}

TEST_F(AgentTest, ExecShellSeparatesStdoutAndStderr) {
  auto r = MustShell("echo $((6 * 7)); echo oops >&2; exit 3");
  EXPECT_EQ(r.stdout_data, "42\n");
  EXPECT_EQ(r.stderr_data, "oops\n");
  EXPECT_EQ(r.exit.exit_code, 3);
  EXPECT_EQ(r.exit.term_signal, 0);
  EXPECT_EQ(r.exit.stdout_bytes, 3u);
  EXPECT_EQ(r.exit.stderr_bytes, 5u);
  EXPECT_FALSE(r.exit.truncated);
  EXPECT_FALSE(r.exit.timed_out);
}

TEST_F(AgentTest, ExecRunsInTheRequestedDirectoryElseHome) {
  fs::create_directories(root_.Sub("work dir"));
  auto req = ArgvExec({"pwd"});
  req.cwd = root_.Sub("work dir");
  EXPECT_EQ(MustExec(req).stdout_data, root_.Sub("work dir") + "\n");
  // No cwd: the home directory (the agent's HOME here, as no user is named).
  EXPECT_EQ(MustExec(ArgvExec({"pwd"})).stdout_data, root_.path() + "\n");
}

TEST_F(AgentTest, ExecEnvironmentHasDefaultsAndRequestOverrides) {
  auto env = ParseEnv(MustExec(ArgvExec({"/usr/bin/env"})).stdout_data);
  EXPECT_EQ(env["PATH"], "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  EXPECT_EQ(env["HOME"], root_.path());
  EXPECT_EQ(env["LANG"], "C.UTF-8");
  EXPECT_FALSE(env.contains("TERM")) << "TERM is for terminals only";
  EXPECT_FALSE(env.contains("AIRLOCK_TEST_AGENT_ONLY")) << "the agent's own environment leaked";

  auto req = ArgvExec({"/usr/bin/env"});
  req.env = {"PATH=/bin:/usr/bin", "HOME=/nowhere", "FOO=bar=baz", "EMPTY="};
  env = ParseEnv(MustExec(req).stdout_data);
  EXPECT_EQ(env["PATH"], "/bin:/usr/bin");
  EXPECT_EQ(env["HOME"], "/nowhere");
  EXPECT_EQ(env["FOO"], "bar=baz");
  EXPECT_TRUE(env.contains("EMPTY"));
  EXPECT_EQ(env["LANG"], "C.UTF-8");
}

TEST_F(AgentTest, AgentEnvFlagSitsBetweenDefaultsAndTheRequest) {
  ASSERT_NO_FATAL_FAILURE(StartAgent({"--env", "FOO=agent", "--env", "BAR=agent"}));
  auto req = ArgvExec({"/usr/bin/env"});
  req.env = {"FOO=request"};
  auto env = ParseEnv(MustExec(req).stdout_data);
  EXPECT_EQ(env["FOO"], "request");
  EXPECT_EQ(env["BAR"], "agent");
}

// --seccomp: the agent installs the sandbox policy on itself before it serves (gVisor's case),
// so every command runs under it.
TEST_F(AgentTest, SeccompFlagPutsEveryCommandUnderThePolicy) {
  // Positive control: without the flag, a command here runs without a filter.
  EXPECT_EQ(MustShell("grep '^Seccomp:' /proc/self/status").stdout_data, "Seccomp:\t0\n");
  auto program = runtime::SeccompProgram::Compile();
  ASSERT_TRUE(program) << program.error().message();
  const std::string path = root_.path() + "/policy.bpf";
  {
    std::ofstream out(path, std::ios::binary);
    out << program->bytes();
  }
  ASSERT_NO_FATAL_FAILURE(StartAgent({"--seccomp", path}));
  EXPECT_EQ(MustShell("grep '^Seccomp:' /proc/self/status").stdout_data, "Seccomp:\t2\n");
  // A denied call answers as the policy says; an allowed one works.
  auto r = MustShell("unshare -U true 2>&1; echo $?; mkfifo " + root_.path() + "/fifo && echo made");
  EXPECT_NE(r.stdout_data.find("Operation not permitted"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("made"), std::string::npos) << r.stdout_data;
}

TEST_F(AgentTest, SeccompFlagWithAProgramThatIsNotOneEndsTheAgent) {
  const std::string path = root_.path() + "/bad.bpf";
  {
    std::ofstream out(path, std::ios::binary);
    out << "1234567";  // not a whole BPF instruction
  }
  StopAgent();
  AgentProcess agent({"--root", root_.path(), "--seccomp", path}, {"PATH=/usr/bin:/bin"});
  auto status = agent.WaitExit(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value()) << "the agent served without its policy";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << *status;
  AgentProcess missing({"--root", root_.path(), "--seccomp", root_.path() + "/none"},
                       {"PATH=/usr/bin:/bin"});
  status = missing.WaitExit(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value()) << "the agent served without its policy";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << *status;
}

TEST_F(AgentTest, StdinLargerThanOneMebibyteRoundTripsThroughCat) {
  std::string data = RandomBytes(3 * kMiB + 12345, 1);
  auto req = ArgvExec({"cat"});
  req.stdin_mode = p::StdinMode::kPipe;
  req.output_cap = 16 * kMiB;
  auto r = MustExec(req, data);
  EXPECT_EQ(r.exit.exit_code, 0);
  EXPECT_EQ(r.stdout_data.size(), data.size());
  EXPECT_EQ(Fnv1a(r.stdout_data), Fnv1a(data)) << "cat returned different bytes";
  EXPECT_EQ(r.exit.stdout_bytes, data.size());
}

TEST_F(AgentTest, StdinCloseEndsTheCommandsInput) {
  ExecWatcher w(client());
  auto req = ArgvExec({"wc", "-c"});
  req.stdin_mode = p::StdinMode::kPipe;
  auto stream = client().StartExec(req);
  ASSERT_TRUE(stream);
  ASSERT_TRUE(client().Send(*stream, p::StdinData{"hello"}));
  ASSERT_TRUE(client().Send(*stream, p::StdinData{" world"}));
  // Without stdin_close wc waits for more.
  EXPECT_FALSE(w.WaitFinished(*stream, 300ms));
  ASSERT_TRUE(client().Send(*stream, p::StdinClose{}));
  ASSERT_TRUE(w.WaitFinished(*stream));
  ASSERT_TRUE(w[*stream].exited);
  EXPECT_EQ(w[*stream].stdout_data, "11\n");
  EXPECT_EQ(w[*stream].exited->exit_code, 0);
}

TEST_F(AgentTest, SignalReachesTheCommand) {
  ExecWatcher w(client());
  auto stream = client().StartExec(ArgvExec({"sleep", "100"}));
  ASSERT_TRUE(stream);
  ASSERT_TRUE(w.WaitStarted(*stream));
  ASSERT_TRUE(client().Send(*stream, p::Signal{SIGTERM}));
  ASSERT_TRUE(w.WaitFinished(*stream, 10s));
  ASSERT_TRUE(w[*stream].exited);
  EXPECT_EQ(w[*stream].exited->term_signal, SIGTERM);
  EXPECT_EQ(w[*stream].exited->exit_code, -1);
  EXPECT_FALSE(w[*stream].exited->timed_out);
}

TEST_F(AgentTest, PtyExecHasATerminalAndOutputOnStdout) {
  auto req = ShellExec("test -t 0 && test -t 1 && test -t 2 && echo on-a-tty; echo \"TERM=$TERM\"");
  req.pty = true;
  auto r = MustExec(req);
  EXPECT_EQ(r.exit.exit_code, 0);
  EXPECT_NE(r.stdout_data.find("on-a-tty"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("TERM=xterm-256color"), std::string::npos) << r.stdout_data;
  EXPECT_EQ(r.stderr_data, "");
}

TEST_F(AgentTest, PtyExecStartsWithTheRequestedSize) {
  auto req = ArgvExec({"stty", "size"});
  req.pty = true;
  req.pty_rows = 30;
  req.pty_cols = 100;
  auto r = MustExec(req);
  EXPECT_NE(r.stdout_data.find("30 100"), std::string::npos) << r.stdout_data;
}

TEST_F(AgentTest, ResizeChangesThePtySize) {
  ExecWatcher w(client());
  auto req = ShellExec("read line; stty size");
  req.pty = true;
  req.stdin_mode = p::StdinMode::kPipe;
  auto stream = client().StartExec(req);
  ASSERT_TRUE(stream);
  // Frames are handled in order: the size is set before the line that lets stty run arrives.
  ASSERT_TRUE(client().Send(*stream, p::Resize{40, 132}));
  ASSERT_TRUE(client().Send(*stream, p::StdinData{"go\n"}));
  ASSERT_TRUE(w.WaitFinished(*stream, 10s));
  ASSERT_TRUE(w[*stream].exited);
  EXPECT_EQ(w[*stream].exited->exit_code, 0);
  EXPECT_NE(w[*stream].stdout_data.find("40 132"), std::string::npos) << w[*stream].stdout_data;
}

TEST_F(AgentTest, PtyStdinCloseSendsEndOfFile) {
  auto req = ArgvExec({"cat"});
  req.pty = true;
  req.stdin_mode = p::StdinMode::kPipe;
  auto r = MustExec(req, "typed line\n");
  EXPECT_EQ(r.exit.exit_code, 0);
  EXPECT_NE(r.stdout_data.find("typed line"), std::string::npos) << r.stdout_data;
}

TEST_F(AgentTest, PtyStdinCloseAfterAPartialLineEndsInput) {
  auto req = ArgvExec({"wc", "-c"});
  req.pty = true;
  req.stdin_mode = p::StdinMode::kPipe;
  ExecWatcher w(client());
  auto stream = client().StartExec(req);
  ASSERT_TRUE(stream);
  ASSERT_TRUE(client().Send(*stream, p::StdinData{"abc"}));  // no newline
  ASSERT_TRUE(client().Send(*stream, p::StdinClose{}));
  ASSERT_TRUE(w.WaitFinished(*stream, 5s)) << "the command never saw the end of its input";
  ASSERT_TRUE(w[*stream].exited);
  EXPECT_EQ(w[*stream].exited->exit_code, 0);
  EXPECT_TRUE(w[*stream].stdout_data.ends_with("3\r\n")) << w[*stream].stdout_data;
}

TEST_F(AgentTest, MissingBinaryIsNotFoundAndClosesTheStream) {
  for (const char* name : {"/nonexistent/airlock-no-such-binary", "airlock-no-such-command"}) {
    ExecWatcher w(client());
    auto stream = client().StartExec(ArgvExec({name}));
    ASSERT_TRUE(stream);
    ASSERT_TRUE(w.WaitFinished(*stream, 10s));
    ASSERT_TRUE(w[*stream].error) << name;
    EXPECT_EQ(w[*stream].error->code, ErrorCode::kNotFound) << w[*stream].error->message;
    EXPECT_EQ(w[*stream].error->sys_errno, ENOENT);
    EXPECT_NE(w[*stream].error->message.find("execve"), std::string::npos)
        << w[*stream].error->message;
    EXPECT_EQ(w[*stream].pid, 0) << "started was sent for a command that never ran";
    // The stream is closed on both sides: a signal for it is late and dropped, and nothing more
    // arrives on it (the client would reject a frame on a closed stream).
    ASSERT_TRUE(client().Send(*stream, p::Signal{SIGTERM}));
    auto st = client().Ping(1);
    EXPECT_TRUE(st) << st.error().message();
  }
  EXPECT_EQ(MustShell("echo still-here").stdout_data, "still-here\n");
}

TEST_F(AgentTest, BadCwdIsAnError) {
  auto req = ArgvExec({"true"});
  req.cwd = "/nonexistent/airlock-dir";
  auto r = client().Exec(req);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound) << r.error().message();
  EXPECT_NE(r.error().message().find("chdir"), std::string::npos) << r.error().message();
}

TEST_F(AgentTest, UnknownUserIsAnError) {
  auto req = ArgvExec({"true"});
  req.user = "airlock-no-such-user";
  auto r = client().Exec(req);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << r.error().message();
}

TEST_F(AgentTest, ExitCodesAndDeathBySignal) {
  for (int code : {0, 1, 255}) {
    auto r = MustShell("exit " + std::to_string(code));
    EXPECT_EQ(r.exit.exit_code, code);
    EXPECT_EQ(r.exit.term_signal, 0);
  }
  auto r = MustShell("kill -KILL $$");
  EXPECT_EQ(r.exit.exit_code, -1);
  EXPECT_EQ(r.exit.term_signal, SIGKILL);
  EXPECT_FALSE(r.exit.timed_out);
  r = MustShell("kill -SEGV $$");
  EXPECT_EQ(r.exit.term_signal, SIGSEGV);
}

TEST_F(AgentTest, HundredsOfParallelExecsOnOneChannel) {
  std::vector<uint32_t> streams;
  for (int i = 0; i < 100; ++i) {
    auto s = client().StartExec(ShellExec("echo " + std::to_string(i)));
    ASSERT_TRUE(s) << s.error().message();
    streams.push_back(*s);
  }
  auto all = client().WaitAll(streams);
  ASSERT_TRUE(all) << all.error().message();
  ASSERT_EQ(all->size(), 100u);
  for (int i = 0; i < 100; ++i) {
    auto& r = all->at(streams[static_cast<size_t>(i)]);
    ASSERT_TRUE(r) << r.error().message();
    EXPECT_EQ(r->stdout_data, std::to_string(i) + "\n");
    EXPECT_EQ(r->exit.exit_code, 0);
  }

  streams.clear();
  for (int i = 0; i < 300; ++i) {
    auto s = client().StartExec(ArgvExec({"true"}));
    ASSERT_TRUE(s) << s.error().message();
    streams.push_back(*s);
  }
  all = client().WaitAll(streams);
  ASSERT_TRUE(all) << all.error().message();
  ASSERT_EQ(all->size(), 300u);
  int ok = 0;
  for (auto& [stream, r] : *all) {
    EXPECT_TRUE(r) << "stream " << stream << ": " << r.error().message();
    if (r && r->exit.exit_code == 0) ++ok;
  }
  EXPECT_EQ(ok, 300);
}

TEST_F(AgentTest, ThreeHundredCommandsAliveAtOnce) {
  std::vector<uint32_t> streams;
  for (int i = 0; i < 300; ++i) {
    auto s = client().StartExec(ArgvExec({"sleep", "1"}));
    ASSERT_TRUE(s) << s.error().message();
    streams.push_back(*s);
  }
  auto all = client().WaitAll(streams);
  ASSERT_TRUE(all) << all.error().message();
  int ok = 0;
  for (auto& [stream, r] : *all) {
    EXPECT_TRUE(r) << "stream " << stream << ": " << r.error().message();
    if (r && r->exit.exit_code == 0) ++ok;
  }
  EXPECT_EQ(ok, 300);
}

TEST_F(AgentTest, SignalsToTheAgentAreForwardedToCommands) {
  ExecWatcher w(client());
  auto stream =
      client().StartExec(ShellExec("trap 'echo got-usr1; exit 0' USR1; echo ready; "
                                   "while :; do sleep 0.05; done"));
  ASSERT_TRUE(stream);
  ASSERT_TRUE(w.ReadUntil([&] {
    return w[*stream].stdout_data.find("ready") != std::string::npos || w[*stream].finished();
  }));
  ASSERT_EQ(::kill(agent_pid(), SIGUSR1), 0);
  ASSERT_TRUE(w.WaitFinished(*stream, 10s));
  ASSERT_TRUE(w[*stream].exited);
  EXPECT_EQ(w[*stream].stdout_data, "ready\ngot-usr1\n");
  EXPECT_EQ(w[*stream].exited->exit_code, 0);
  EXPECT_TRUE(client().Ping(1)) << "the agent itself must survive SIGUSR1";
}

TEST_F(AgentTest, DefaultUserFlagRunsCommandsAndOwnsUploads) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run commands as another user";
  TempDir etc;
  WriteWholeFile(etc.Sub("passwd"),
                 "root:x:0:0::/root:/bin/sh\n"
                 "sandbox:x:1000:1000::/:/bin/sh\n");
  WriteWholeFile(etc.Sub("group"), "sandbox:x:1000:\nextra:x:1500:sandbox\n");
  ASSERT_NO_FATAL_FAILURE(StartAgent({"--user", "sandbox", "--etc", etc.path()}));
  auto r = MustShell("id -u; id -G; echo $USER");
  EXPECT_EQ(r.stdout_data, "1000\n1000 1500\nsandbox\n") << r.stderr_data;
  // A request may name another user, root included.
  auto req = ArgvExec({"id", "-u"});
  req.user = "root";
  EXPECT_EQ(MustExec(req).stdout_data, "0\n");
  ASSERT_TRUE(client().WriteFile("/up/loaded.txt", "x", 0644, true));
  for (const char* path : {"up", "up/loaded.txt"}) {
    struct stat st;
    ASSERT_EQ(::stat(root_.Sub(path).c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_uid, 1000u) << path;
    EXPECT_EQ(st.st_gid, 1000u) << path;
  }
}

// --- Timeouts -------------------------------------------------------------------------------

TEST_F(AgentTest, TimeoutEndsACommandPromptly) {
  auto req = ArgvExec({"sleep", "100"});
  req.timeout_ms = 300;
  auto t0 = Clock::now();
  auto r = MustExec(req);
  auto elapsed = Clock::now() - t0;
  EXPECT_TRUE(r.exit.timed_out);
  EXPECT_EQ(r.exit.term_signal, SIGTERM);
  EXPECT_GE(r.exit.duration_us, 300000u);
  EXPECT_LT(elapsed, 5s);
}

// The pid in a file the command wrote, once it is there.
std::optional<ProcId> WaitPidFile(const std::string& path) {
  auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline) {
    std::string text = ReadWholeFile(path);
    if (!text.empty() && text.back() == '\n') return IdOf(std::atoi(text.c_str()));
    std::this_thread::sleep_for(10ms);
  }
  return std::nullopt;
}

bool IgnoresSigterm(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("SigIgn:")) {
      uint64_t mask = std::strtoull(line.c_str() + 7, nullptr, 16);
      return mask & (1ull << (SIGTERM - 1));
    }
  }
  return false;
}

TEST_F(AgentTest, TimeoutKillsGrandchildrenAndADaemonThatIgnoresSigterm) {
  std::string bg = root_.Sub("bg.pid"), daemon = root_.Sub("daemon.pid");
  std::string daemon_child = root_.Sub("daemon-child.pid");
  // A background child, and a double-forked daemon in its own session that ignores SIGTERM
  // (as does its child): only the SIGKILL after the grace period can end those two.
  std::string cmd = "sleep 1000 & echo $! > " + bg + "; (setsid sh -c 'trap \"\" TERM; " +
                    "sleep 1000 & echo $! > " + daemon_child + "; echo $$ > " + daemon +
                    "; wait' &); sleep 1000";
  auto req = ShellExec(cmd);
  req.timeout_ms = 2000;
  req.kill_grace_ms = 300;
  ExecWatcher w(client());
  auto t0 = Clock::now();
  auto stream = client().StartExec(req);
  ASSERT_TRUE(stream);
  ASSERT_TRUE(w.WaitStarted(*stream));
  std::vector<ProcId> procs;
  for (const auto& file : {bg, daemon, daemon_child}) {
    auto id = WaitPidFile(file);
    ASSERT_TRUE(id) << "no live pid in " << file;
    procs.push_back(*id);
  }
  ASSERT_LT(Clock::now() - t0, 1900ms) << "too slow to set up before the timeout";
  EXPECT_TRUE(IgnoresSigterm(procs[1].pid)) << "the daemon should ignore SIGTERM";
  EXPECT_TRUE(IgnoresSigterm(procs[2].pid)) << "the daemon's child should ignore SIGTERM";
  auto shell = IdOf(w[*stream].pid);
  ASSERT_TRUE(shell);
  procs.push_back(*shell);

  ASSERT_TRUE(w.WaitFinished(*stream, 20s));
  ASSERT_TRUE(w[*stream].exited);
  EXPECT_TRUE(w[*stream].exited->timed_out);
  EXPECT_LT(Clock::now() - t0, 10s);
  EXPECT_TRUE(AllGone(procs));
}

TEST_F(AgentTest, TimeoutKillsWhatADaemonForksAsItExitsOnSigterm) {
  // On SIGTERM the daemon starts a child and exits. The child is handed to the agent, outside the
  // command's process tree, but it is still in the daemon's session.
  std::string daemon = root_.Sub("daemon.pid"), heir = root_.Sub("heir.pid");
  std::string cmd = "(setsid sh -c 'echo $$ > " + daemon + "; trap \"sleep 1000 & echo \\$! > " +
                    heir + "; exit\" TERM; while :; do sleep 0.05; done' &); sleep 1000";
  auto req = ShellExec(cmd);
  req.timeout_ms = 1000;
  req.kill_grace_ms = 500;
  ExecWatcher w(client());
  auto stream = client().StartExec(req);
  ASSERT_TRUE(stream);
  auto daemon_id = WaitPidFile(daemon);
  ASSERT_TRUE(daemon_id);
  ASSERT_TRUE(w.WaitFinished(*stream, 20s));
  ASSERT_TRUE(w[*stream].exited);
  EXPECT_TRUE(w[*stream].exited->timed_out);
  std::vector<ProcId> procs = {*daemon_id};
  // The heir may have been killed before it wrote its pid; if it wrote one, it must be dead.
  std::string text = ReadWholeFile(heir);
  pid_t heir_pid = text.empty() ? 0 : std::atoi(text.c_str());
  if (heir_pid > 0) {
    auto st = ReadProcStat(heir_pid);
    if (st) procs.push_back(ProcId{heir_pid, st->start_time});
  }
  EXPECT_TRUE(AllGone(procs));
}

// --- Output limits and flow control ----------------------------------------------------------

TEST_F(AgentTest, OutputCapDeliversExactlyTheCap) {
  auto req = ShellExec("head -c " + std::to_string(10 * kMiB) + " /dev/zero");
  req.output_cap = kMiB;
  auto r = MustExec(req);
  EXPECT_EQ(r.exit.exit_code, 0);
  EXPECT_EQ(r.stdout_data.size(), kMiB);
  EXPECT_TRUE(r.exit.truncated);
  EXPECT_EQ(r.exit.stdout_bytes, 10 * kMiB);
}

TEST_F(AgentTest, OutputCapCountsStdoutAndStderrTogether) {
  auto req = ShellExec("head -c 700000 /dev/zero; head -c 700000 /dev/zero >&2");
  req.output_cap = kMiB;
  auto r = MustExec(req);
  EXPECT_EQ(r.stdout_data.size() + r.stderr_data.size(), kMiB);
  EXPECT_TRUE(r.exit.truncated);
  EXPECT_EQ(r.exit.stdout_bytes, 700000u);
  EXPECT_EQ(r.exit.stderr_bytes, 700000u);
}

TEST_F(AgentTest, OutputUnderTheCapIsNotTruncated) {
  auto req = ShellExec("head -c 1000 /dev/zero");
  req.output_cap = 1000;
  auto r = MustExec(req);
  EXPECT_EQ(r.stdout_data.size(), 1000u);
  EXPECT_FALSE(r.exit.truncated);
}

TEST_F(AgentTest, TenGibibytesOfOutputKeepTheAgentSmall) {
  const int64_t limit = AgentRssLimitKb(agent_pid());
  ExecWatcher w(client());
  auto req = ArgvExec({"head", "-c", "10G", "/dev/zero"});
  req.output_cap = kMiB;
  auto stream = client().StartExec(req);
  ASSERT_TRUE(stream);
  w[*stream].keep_data = false;
  ASSERT_TRUE(w.WaitFinished(*stream, 240s));
  ASSERT_TRUE(w[*stream].exited);
  const auto& done = *w[*stream].exited;
  EXPECT_EQ(done.exit_code, 0);
  EXPECT_TRUE(done.truncated);
  EXPECT_EQ(done.stdout_bytes, 10737418240u);
  EXPECT_EQ(w[*stream].stdout_received, kMiB);
  int64_t hwm = ProcStatusKb(agent_pid(), "VmHWM");
  ASSERT_GT(hwm, 0);
  EXPECT_LT(hwm, limit) << "agent peak RSS " << hwm << " kB";
}

TEST_F(AgentTest, ASlowDaemonHoldsBackOutputWithoutGrowingTheAgent) {
  constexpr uint64_t kTotal = 200 * kMiB;
  const int64_t limit = AgentRssLimitKb(agent_pid());
  ExecWatcher w(client());
  auto req = ArgvExec({"head", "-c", std::to_string(kTotal), "/dev/zero"});
  req.output_cap = 256 * kMiB;
  auto stream = client().StartExec(req);
  ASSERT_TRUE(stream);
  w[*stream].keep_data = false;
  ASSERT_TRUE(w.WaitStarted(*stream));
  std::this_thread::sleep_for(2s);  // not reading the channel
  int64_t rss = ProcStatusKb(agent_pid(), "VmRSS");
  ASSERT_GT(rss, 0);
  EXPECT_LT(rss, limit) << "agent RSS " << rss << " kB while the daemon was not reading";
  EXPECT_FALSE(w[*stream].finished());

  ASSERT_TRUE(w.WaitFinished(*stream, 120s));
  ASSERT_TRUE(w[*stream].exited);
  EXPECT_EQ(w[*stream].stdout_received, kTotal);
  EXPECT_EQ(w[*stream].exited->stdout_bytes, kTotal);
  EXPECT_FALSE(w[*stream].exited->truncated);
  EXPECT_EQ(w[*stream].exited->exit_code, 0);
  int64_t hwm = ProcStatusKb(agent_pid(), "VmHWM");
  EXPECT_LT(hwm, limit) << "agent peak RSS " << hwm << " kB";
}

TEST_F(AgentTest, BackgroundProcessHoldingStdoutDoesNotHoldUpTheResult) {
  auto t0 = Clock::now();
  auto r = MustShell("sleep 5 & echo started; exit 0");
  EXPECT_EQ(r.exit.exit_code, 0);
  EXPECT_EQ(r.stdout_data, "started\n");
  EXPECT_LT(Clock::now() - t0, 4s) << "the result waited for the background process";
}

TEST_F(AgentTest, BackgroundWriterThatNeverStopsDoesNotHoldUpTheResult) {
  auto t0 = Clock::now();
  auto req = ShellExec("yes & exit 0");
  req.output_cap = kMiB;
  auto r = MustExec(req);
  EXPECT_EQ(r.exit.exit_code, 0);
  EXPECT_EQ(r.stdout_data.size(), kMiB);
  EXPECT_TRUE(r.exit.truncated);
  EXPECT_LT(Clock::now() - t0, 4s);
  EXPECT_EQ(MustShell("echo next").stdout_data, "next\n");
}

// --- Files through the protocol --------------------------------------------------------------

TEST_F(AgentTest, FileOperations) {
  // mkdir with parents, then without (the parent exists now).
  ASSERT_TRUE(client().Mkdir("/a/b", 0750, true));
  ASSERT_TRUE(client().Mkdir("/a/b/c", 0700, false));
  EXPECT_TRUE(fs::is_directory(root_.Sub("a/b/c")));
  auto missing_parent = client().Mkdir("/no/such/parent", 0755, false);
  ASSERT_FALSE(missing_parent);
  EXPECT_EQ(missing_parent.error().code(), ErrorCode::kNotFound);

  // file_write, data (several frames), data_end.
  std::string content = RandomBytes(300000, 2);
  ASSERT_TRUE(client().WriteFile("/a/b/c/f.bin", content, 0640));
  EXPECT_EQ(Fnv1a(ReadWholeFile(root_.Sub("a/b/c/f.bin"))), Fnv1a(content));
  ASSERT_TRUE(client().WriteFile("/x/y/z.txt", "made with parents\n", 0644, true));
  EXPECT_EQ(ReadWholeFile(root_.Sub("x/y/z.txt")), "made with parents\n");
  ASSERT_TRUE(client().WriteFile("/empty", ""));
  EXPECT_TRUE(fs::exists(root_.Sub("empty")));
  EXPECT_EQ(fs::file_size(root_.Sub("empty")), 0u);

  // file_read: all, a range, a tail, past the end.
  auto all = client().ReadFile("/a/b/c/f.bin");
  ASSERT_TRUE(all) << all.error().message();
  EXPECT_EQ(Fnv1a(*all), Fnv1a(content));
  auto range = client().ReadFile("/a/b/c/f.bin", 1000, 5000);
  ASSERT_TRUE(range);
  EXPECT_EQ(*range, content.substr(1000, 5000));
  auto tail = client().ReadFile("/a/b/c/f.bin", content.size() - 10);
  ASSERT_TRUE(tail);
  EXPECT_EQ(*tail, content.substr(content.size() - 10));
  auto past = client().ReadFile("/a/b/c/f.bin", content.size() + 100, 10);
  ASSERT_TRUE(past);
  EXPECT_EQ(*past, "");
  auto nofile = client().ReadFile("/not/there");
  ASSERT_FALSE(nofile);
  EXPECT_EQ(nofile.error().code(), ErrorCode::kNotFound);

  // stat
  auto st = client().Stat("/a/b/c/f.bin");
  ASSERT_TRUE(st) << st.error().message();
  EXPECT_EQ(st->type, p::FileType::kFile);
  EXPECT_EQ(st->size, content.size());
  EXPECT_EQ(st->mode, 0640u);
  st = client().Stat("/a/b");
  ASSERT_TRUE(st);
  EXPECT_EQ(st->type, p::FileType::kDirectory);
  EXPECT_EQ(st->mode, 0750u);
  fs::create_symlink("a/b/c/f.bin", root_.Sub("link"));
  st = client().Stat("/link");
  ASSERT_TRUE(st);
  EXPECT_EQ(st->type, p::FileType::kSymlink);
  EXPECT_EQ(st->link_target, "a/b/c/f.bin");

  // list
  auto entries = client().List("/");
  ASSERT_TRUE(entries) << entries.error().message();
  std::vector<std::string> names;
  for (const auto& e : *entries) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "empty", "link", "x"}));

  // remove: not recursive on a non-empty directory fails; recursive takes the tree.
  EXPECT_FALSE(client().Remove("/a", false));
  auto removed = client().Remove("/a", true);
  ASSERT_TRUE(removed) << removed.error().message();
  EXPECT_EQ(*removed, 4u);  // a, b, c, f.bin
  EXPECT_FALSE(fs::exists(root_.Sub("a")));
  removed = client().Remove("/link");
  ASSERT_TRUE(removed);
  EXPECT_EQ(*removed, 1u);
  EXPECT_FALSE(client().Remove("/"));
  EXPECT_TRUE(fs::is_directory(root_.path()));
}

TEST_F(AgentTest, FileWriteFailureEndsTheStreamAndLaterDataIsDropped) {
  uint32_t stream = client().NextStream();
  ASSERT_TRUE(client().Send(stream, p::FileWrite{"/missing-dir/f", 0644, false, false}));
  auto got = client().Receive(10s);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got->first, stream);
  ASSERT_TRUE(std::holds_alternative<p::ErrorMsg>(got->second));
  // The daemon's data was already on its way: late, ignored.
  ASSERT_TRUE(client().Send(stream, p::Data{"late"}));
  ASSERT_TRUE(client().Send(stream, p::DataEnd{}));
  auto st = client().Ping(3);
  EXPECT_TRUE(st) << st.error().message();
}

TEST_F(AgentTest, LargeFileReadIsFlowControlled) {
  const uint64_t size = 96 * kMiB + 7;
  const int64_t limit = AgentRssLimitKb(agent_pid());
  // Random mebibytes, each told apart by its first byte.
  const std::string block = RandomBytes(kMiB, 3);
  std::string content;
  while (content.size() < size) {
    content += block;
    content[content.size() - kMiB] = static_cast<char>(content.size() / kMiB);
  }
  content.resize(size);
  WriteWholeFile(root_.Sub("big.bin"), content);
  uint32_t stream = client().NextStream();
  ASSERT_TRUE(client().Send(stream, p::FileRead{"/big.bin", 0, 0}));
  std::this_thread::sleep_for(1s);  // not reading the channel
  int64_t rss = ProcStatusKb(agent_pid(), "VmRSS");
  EXPECT_LT(rss, limit) << "agent RSS " << rss << " kB while the daemon was not reading";
  std::string got;
  while (true) {
    auto frame = client().Receive(30s);
    ASSERT_TRUE(frame) << frame.error().message();
    ASSERT_EQ(frame->first, stream);
    if (auto* data = std::get_if<p::Data>(&frame->second)) {
      got += data->data;
      continue;
    }
    ASSERT_TRUE(std::holds_alternative<p::Done>(frame->second));
    EXPECT_EQ(std::get<p::Done>(frame->second).count, size);
    break;
  }
  EXPECT_EQ(got.size(), size);
  EXPECT_EQ(Fnv1a(got), Fnv1a(content));
}

TEST_F(AgentTest, LongListingsComeInSeveralFrames) {
  fs::create_directory(root_.Sub("many"));
  const std::string stem(120, 'n');
  for (int i = 0; i < 5000; ++i) WriteWholeFile(root_.Sub("many/" + stem + std::to_string(i)), "");
  uint32_t stream = client().NextStream();
  ASSERT_TRUE(client().Send(stream, p::List{"/many"}));
  size_t frames = 0, entries = 0;
  while (true) {
    auto frame = client().Receive(30s);
    ASSERT_TRUE(frame) << frame.error().message();
    if (auto* batch = std::get_if<p::Entries>(&frame->second)) {
      ++frames;
      entries += batch->entries.size();
      continue;
    }
    ASSERT_TRUE(std::holds_alternative<p::Done>(frame->second));
    EXPECT_EQ(std::get<p::Done>(frame->second).count, 5000u);
    break;
  }
  EXPECT_EQ(entries, 5000u);
  EXPECT_GT(frames, 1u);
}

// --- Late input, shutdown and bad input ------------------------------------------------------

TEST_F(AgentTest, LateStdinAfterExitIsIgnored) {
  auto req = ArgvExec({"true"});
  req.stdin_mode = p::StdinMode::kPipe;
  ExecWatcher w(client());
  auto stream = client().StartExec(req);
  ASSERT_TRUE(stream);
  ASSERT_TRUE(w.WaitFinished(*stream, 10s));
  ASSERT_TRUE(w[*stream].exited);
  ASSERT_TRUE(client().Send(*stream, p::StdinData{"too late"}));
  ASSERT_TRUE(client().Send(*stream, p::StdinClose{}));
  EXPECT_EQ(MustShell("echo next").stdout_data, "next\n");

  // Stdin sent while the command is exiting, without waiting for it.
  auto quick = ShellExec("exit 3");
  quick.stdin_mode = p::StdinMode::kPipe;
  auto r = MustExec(quick, std::string(512 * 1024, 'x'));
  EXPECT_EQ(r.exit.exit_code, 3);
  EXPECT_EQ(MustShell("echo after").stdout_data, "after\n");
}

TEST_F(AgentTest, SigtermToTheAgentEndsCommandsAndTheAgent) {
  ExecWatcher w(client());
  auto stream = client().StartExec(ArgvExec({"sleep", "100"}));
  ASSERT_TRUE(stream);
  ASSERT_TRUE(w.WaitStarted(*stream));
  auto sleeper = IdOf(w[*stream].pid);
  ASSERT_TRUE(sleeper);
  ASSERT_EQ(::kill(agent_pid(), SIGTERM), 0);
  ASSERT_TRUE(w.WaitFinished(*stream, 10s));
  ASSERT_TRUE(w[*stream].exited);
  EXPECT_EQ(w[*stream].exited->term_signal, SIGTERM);
  auto status = agent_->WaitExit(10s);
  ASSERT_TRUE(status) << "the agent did not exit after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
  EXPECT_TRUE(AllGone({*sleeper}));
}

TEST_F(AgentTest, ClosingTheChannelKillsRunningCommands) {
  ExecWatcher w(client());
  std::vector<uint32_t> streams;
  for (const char* cmd : {"sleep 100", "sleep 100 & sleep 100", "trap '' TERM; sleep 100"}) {
    auto s = client().StartExec(ShellExec(cmd));
    ASSERT_TRUE(s);
    streams.push_back(*s);
  }
  for (uint32_t s : streams) ASSERT_TRUE(w.WaitStarted(s));
  std::this_thread::sleep_for(100ms);  // let the shells start their children
  std::vector<ProcId> procs;
  for (const auto& proc : ProcessTree(agent_pid())) {
    if (proc.pid != agent_pid()) procs.push_back(proc);
  }
  EXPECT_GE(procs.size(), 4u);
  client_.reset();
  auto status = agent_->WaitExit(10s);
  ASSERT_TRUE(status) << "the agent did not exit when its channel closed";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
  EXPECT_TRUE(AllGone(procs));
}

TEST_F(AgentTest, ErrorFromTheDaemonClosesTheChannel) {
  ASSERT_TRUE(client().Send(0, p::ErrorMsg{ErrorCode::kInternal, 0, "daemon giving up"}));
  auto got = client().Receive(10s);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), ErrorCode::kUnavailable) << got.error().message();
  auto status = agent_->WaitExit(10s);
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
}

// A frame header with chosen fields.
std::string Header(uint32_t len, uint8_t version, p::MsgType type, uint32_t stream) {
  std::string out;
  p::AppendHeader(out, p::FrameHeader{len, version, type, 0, stream});
  return out;
}

class AgentBadInputTest : public AgentTest {
 protected:
  // With a command running, sends what `send_bad` sends and checks that the agent answers with
  // a protocol error on stream 0, closes the channel, exits 0 and leaves no process behind.
  void ExpectProtocolError(const std::function<void()>& send_bad) {
    ExecWatcher w(client());
    auto stream = client().StartExec(ArgvExec({"sleep", "100"}));
    ASSERT_TRUE(stream);
    ASSERT_TRUE(w.WaitStarted(*stream));
    auto sleeper = IdOf(w[*stream].pid);
    ASSERT_TRUE(sleeper);

    send_bad();
    std::optional<p::ErrorMsg> error;
    while (true) {
      auto got = client().Receive(10s);
      if (!got) {
        EXPECT_EQ(got.error().code(), ErrorCode::kUnavailable) << got.error().message();
        break;
      }
      if (got->first == 0 && std::holds_alternative<p::ErrorMsg>(got->second)) {
        EXPECT_FALSE(error) << "two errors on stream 0";
        error = std::get<p::ErrorMsg>(got->second);
      }
    }
    ASSERT_TRUE(error) << "no error frame on stream 0";
    EXPECT_EQ(error->code, ErrorCode::kProtocol) << error->message;
    auto status = agent_->WaitExit(10s);
    ASSERT_TRUE(status) << "the agent did not exit";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
    EXPECT_TRUE(AllGone({*sleeper}));
  }
};

TEST_F(AgentBadInputTest, GarbageBytes) {
  ExpectProtocolError(
      [&] { ASSERT_TRUE(client().SendRaw("GET / HTTP/1.1\r\nHost: airlock\r\n\r\n")); });
}

TEST_F(AgentBadInputTest, FrameWithAnotherVersion) {
  ExpectProtocolError([&] {
    std::string ping = p::EncodeFrame(0, p::Ping{1});
    ping[4] = p::kProtocolVersion + 1;
    ASSERT_TRUE(client().SendRaw(ping));
  });
}

TEST_F(AgentBadInputTest, OversizedLength) {
  ExpectProtocolError([&] {
    ASSERT_TRUE(client().SendRaw(
        Header(p::kMaxPayload + 1, p::kProtocolVersion, p::MsgType::kStdinData, 1)));
  });
}

TEST_F(AgentBadInputTest, UndecodablePayload) {
  ExpectProtocolError([&] {
    // A ping's payload is 8 bytes.
    ASSERT_TRUE(client().SendRaw(Header(3, p::kProtocolVersion, p::MsgType::kPing, 0) + "abc"));
  });
}

TEST_F(AgentBadInputTest, ExecOnStreamZero) {
  ExpectProtocolError([&] { ASSERT_TRUE(client().SendRaw(p::EncodeFrame(0, ArgvExec({"id"})))); });
}

TEST_F(AgentBadInputTest, StreamIdReused) {
  // The running sleep holds stream 1.
  ExpectProtocolError([&] { ASSERT_TRUE(client().SendRaw(p::EncodeFrame(1, ArgvExec({"id"})))); });
}

TEST_F(AgentBadInputTest, StdinOnAStreamNeverOpened) {
  ExpectProtocolError(
      [&] { ASSERT_TRUE(client().SendRaw(p::EncodeFrame(77, p::StdinData{"x"}))); });
}

TEST_F(AgentBadInputTest, SecondHello) {
  ExpectProtocolError([&] { ASSERT_TRUE(client().SendRaw(p::EncodeFrame(0, p::Hello{}))); });
}

// Reads one frame from a raw channel, or fails.
Result<std::pair<uint32_t, p::Message>> ReadRawFrame(int fd, p::FrameDecoder& decoder) {
  while (true) {
    auto next = decoder.Next();
    if (!next) return std::unexpected(next.error());
    if (*next) {
      auto msg = p::DecodeMessage((*next)->type, (*next)->payload);
      if (!msg) return std::unexpected(msg.error());
      return std::make_pair((*next)->stream, std::move(*msg));
    }
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 10000) <= 0) return Fail(ErrorCode::kDeadlineExceeded, "no frame");
    char buf[4096];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return Fail(ErrorCode::kUnavailable, "channel closed");
    decoder.Feed(std::string_view(buf, static_cast<size_t>(n)));
  }
}

// A fresh agent whose first frame is `first`: it must answer with a protocol error, close the
// channel and exit 0.
void ExpectRejectedFirstFrame(const std::string& first) {
  TempDir root;
  AgentProcess agent({"--root", root.path(), "--log-level", "error"}, {"HOME=/"});
  UniqueFd fd = agent.TakeChannel();
  ASSERT_EQ(::write(fd.get(), first.data(), first.size()), static_cast<ssize_t>(first.size()));
  p::FrameDecoder decoder;
  auto got = ReadRawFrame(fd.get(), decoder);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got->first, 0u);
  ASSERT_TRUE(std::holds_alternative<p::ErrorMsg>(got->second));
  EXPECT_EQ(std::get<p::ErrorMsg>(got->second).code, ErrorCode::kProtocol);
  auto after = ReadRawFrame(fd.get(), decoder);
  ASSERT_FALSE(after);
  EXPECT_EQ(after.error().code(), ErrorCode::kUnavailable) << after.error().message();
  auto status = agent.WaitExit(10s);
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
}

TEST_F(AgentTest, NonHelloFirstFrameIsRejected) {
  ExpectRejectedFirstFrame(p::EncodeFrame(0, p::Ping{1}));
}

TEST_F(AgentTest, HelloWithAnotherProtocolVersionIsRejected) {
  ExpectRejectedFirstFrame(p::EncodeFrame(0, p::Hello{p::kProtocolVersion + 1, "future daemon", 0}));
  ExpectRejectedFirstFrame(p::EncodeFrame(0, p::Hello{p::kProtocolVersion - 1, "older daemon", 0}));
}

// --- Listening on a unix socket ----------------------------------------------------------------

TEST(AgentListenTest, ServesSeveralChannelsUntilSigterm) {
  ::signal(SIGPIPE, SIG_IGN);
  TempDir dir;
  const std::string socket = dir.Sub("agent.sock");
  AgentProcess agent({"--listen", socket, "--root", dir.path(), "--log-level", "warn"}, {"HOME=/"},
                     AgentProcess::kListen);
  auto first = ConnectUnix(socket);
  ASSERT_TRUE(first) << first.error().message();
  auto connected = ConnectUnix(socket);
  ASSERT_TRUE(connected) << connected.error().message();
  std::optional<protocol::BlockingClient> second(std::move(*connected));
  struct stat st;
  ASSERT_EQ(::stat(socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "only the agent's own user may connect";

  auto r1 = first->Exec(ShellExec("echo one"));
  auto r2 = second->Exec(ShellExec("echo two"));
  ASSERT_TRUE(r1 && r2);
  EXPECT_EQ(r1->stdout_data, "one\n");
  EXPECT_EQ(r2->stdout_data, "two\n");

  // One channel going away ends its own commands only; the agent keeps serving.
  ExecWatcher w(*second);
  auto stream = second->StartExec(ArgvExec({"sleep", "100"}));
  ASSERT_TRUE(stream);
  ASSERT_TRUE(w.WaitStarted(*stream));
  auto sleeper = IdOf(w[*stream].pid);
  ASSERT_TRUE(sleeper);
  second.reset();
  EXPECT_TRUE(AllGone({*sleeper}));
  EXPECT_TRUE(first->Ping(5));
  auto third = ConnectUnix(socket);
  ASSERT_TRUE(third) << third.error().message();
  EXPECT_TRUE(third->Ping(6));

  ASSERT_EQ(::kill(agent.pid(), SIGTERM), 0);
  auto status = agent.WaitExit(10s);
  ASSERT_TRUE(status) << "the agent did not exit after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
  EXPECT_FALSE(fs::exists(socket)) << "the socket was left behind";
}

TEST(AgentListenTest, InheritedListeningSocketServesChannelsAndIsNotUnlinked) {
  ::signal(SIGPIPE, SIG_IGN);
  TempDir dir;
  const std::string socket = dir.Sub("agent.sock");
  // Bound by "the daemon", as the jail does, then handed over.
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket.c_str());
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 16), 0);
  AgentProcess agent({"--root", dir.path(), "--log-level", "warn"}, {"HOME=/"},
                     AgentProcess::kListenFd, listener.get());
  listener.Reset();
  auto a = ConnectUnix(socket);
  auto b = ConnectUnix(socket);
  ASSERT_TRUE(a && b);
  auto ra = a->Exec(ShellExec("echo a"));
  auto rb = b->Exec(ShellExec("echo b"));
  ASSERT_TRUE(ra && rb);
  EXPECT_EQ(ra->stdout_data, "a\n");
  EXPECT_EQ(rb->stdout_data, "b\n");
  ASSERT_EQ(::kill(agent.pid(), SIGTERM), 0);
  auto status = agent.WaitExit(10s);
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
  EXPECT_TRUE(fs::exists(socket)) << "the agent removed a socket it did not bind";
}

TEST(AgentListenTest, ListenFdThatIsNotListeningIsRefused) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd one(sv[0]), two(sv[1]);
  AgentProcess agent({"--log-level", "warn"}, {"HOME=/"}, AgentProcess::kListenFd, one.get());
  auto status = agent.WaitExit(10s);
  ASSERT_TRUE(status) << "the agent served a socket that is not listening";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << "wait status " << *status;
}

}  // namespace
}  // namespace airlock::agent::test
