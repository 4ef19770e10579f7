// The agent's process table: background commands, attachments (control, replay, live output),
// the output ring, listing, and what outlives a channel. A real airlock-agent listening on a unix
// socket, so that a test can open, drop and reopen channels as the daemon does.

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "agent/process_tree.h"
#include "agent_fixture.h"
#include "protocol/messages.h"

namespace airlock::agent::test {
namespace {

namespace p = protocol;
using Clock = std::chrono::steady_clock;

class ProcessTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    ::signal(SIGPIPE, SIG_IGN);
    socket_ = dir_.Sub("agent.sock");
    std::vector<std::string> env = {"HOME=" + dir_.path(), "PATH=/usr/bin:/bin"};
#if defined(AIRLOCK_SANITIZED_PROGRAMS)
    // The memory checks below measure what the agent holds. ASan keeps up to 256 MiB of freed
    // memory in quarantine, which would count; without it, the high-water mark is live memory.
    // (First in the environment, so it wins over the inherited ASAN_OPTIONS appended later.)
    const char* inherited = std::getenv("ASAN_OPTIONS");
    env.insert(env.begin(), std::string("ASAN_OPTIONS=") + (inherited ? inherited : "") +
                                (inherited && *inherited ? ":" : "") + "quarantine_size_mb=0");
#endif
    agent_ = std::make_unique<AgentProcess>(
        std::vector<std::string>{"--listen", socket_, "--root", dir_.path(), "--log-level",
                                 "warn"},
        std::move(env), AgentProcess::kListen);
  }
  void TearDown() override { agent_.reset(); }  // SIGTERM: the agent ends what it runs

  // A new channel to the agent.
  p::BlockingClient Connect() {
    auto client = ConnectUnix(socket_);
    AIRLOCK_CHECK(client.has_value());
    return std::move(*client);
  }

  // The agent's peak memory stayed under AgentRssLimitKb (taken at `limit`).
  void ExpectAgentStayedSmall(int64_t limit) {
    const int64_t hwm = ProcStatusKb(agent_->pid(), "VmHWM");
    ASSERT_GT(hwm, 0);
    EXPECT_LT(hwm, limit) << "agent peak RSS " << hwm << " kB";
  }

  // Starts a background command on `c` and returns its pid (0 after a test failure).
  static int32_t StartBackground(p::BlockingClient& c, p::Exec exec) {
    exec.background = true;
    auto stream = c.StartExec(exec);
    EXPECT_TRUE(stream);
    if (!stream) return 0;
    auto msg = c.NextFor(*stream);
    EXPECT_TRUE(msg && std::holds_alternative<p::Started>(*msg));
    if (!msg || !std::holds_alternative<p::Started>(*msg)) return 0;
    return std::get<p::Started>(*msg).pid;
  }

  static std::optional<p::ProcessInfo> Find(p::BlockingClient& c, int32_t pid) {
    auto all = c.ListProcesses();
    EXPECT_TRUE(all) << (all ? "" : all.error().message());
    if (!all) return std::nullopt;
    for (const auto& info : *all) {
      if (info.pid == pid) return info;
    }
    return std::nullopt;
  }

  // Reads an attach stream to its end: output by fd, bytes reported dropped, the last message.
  struct Drained {
    std::string out, err;
    uint64_t dropped = 0;
    std::optional<p::Message> last;
  };
  static Drained Drain(p::BlockingClient& c, uint32_t stream) {
    Drained d;
    while (true) {
      auto msg = c.NextFor(stream, 60s);
      EXPECT_TRUE(msg) << msg.error().message();
      if (!msg) return d;
      if (auto* out = std::get_if<p::Output>(&*msg)) {
        (out->fd == p::OutputFd::kStdout ? d.out : d.err) += out->data;
      } else if (auto* dropped = std::get_if<p::Dropped>(&*msg)) {
        d.dropped += dropped->bytes;
      } else {
        d.last = std::move(*msg);
        return d;
      }
    }
  }

  // Waits (through an attachment) for `pid` to end and returns how.
  static std::optional<p::Exited> WaitExit(p::BlockingClient& c, int32_t pid) {
    auto attached = c.Attach({.pid = pid});
    EXPECT_TRUE(attached) << attached.error().message();
    if (!attached) return std::nullopt;
    auto d = Drain(c, attached->first);
    if (!d.last || !std::holds_alternative<p::Exited>(*d.last)) {
      ADD_FAILURE() << "the attachment did not end with exited";
      return std::nullopt;
    }
    return std::get<p::Exited>(*d.last);
  }

  TempDir dir_;
  std::string socket_;
  std::unique_ptr<AgentProcess> agent_;
};

TEST_F(ProcessTableTest, BackgroundProcessOutlivesItsChannelAndIsListed) {
  int32_t pid = 0;
  {
    auto first = Connect();
    pid = StartBackground(first, ArgvExec({"sleep", "100"}));
    ASSERT_GT(pid, 0);
  }  // the channel that started it is closed
  auto second = Connect();
  auto info = Find(second, pid);
  ASSERT_TRUE(info);
  EXPECT_TRUE(info->running);
  EXPECT_TRUE(info->background);
  EXPECT_FALSE(info->pty);
  EXPECT_EQ(info->command, "sleep 100");
  EXPECT_GT(info->started_unix_ms, 1700000000000);
  EXPECT_TRUE(IdOf(pid)) << "the process died with the channel that started it";

  // Killable from the new channel; the end is recorded.
  auto attached = second.Attach({.pid = pid});
  ASSERT_TRUE(attached) << attached.error().message();
  EXPECT_TRUE(attached->second.running);
  EXPECT_TRUE(attached->second.background);
  ASSERT_TRUE(second.Send(attached->first, p::Signal{SIGKILL}));
  auto d = Drain(second, attached->first);
  ASSERT_TRUE(d.last && std::holds_alternative<p::Exited>(*d.last));
  EXPECT_EQ(std::get<p::Exited>(*d.last).term_signal, SIGKILL);
  info = Find(second, pid);
  ASSERT_TRUE(info);
  EXPECT_FALSE(info->running);
  EXPECT_EQ(info->exit.term_signal, SIGKILL);
  EXPECT_GE(info->ended_unix_ms, info->started_unix_ms);
}

TEST_F(ProcessTableTest, AttachReplaysThenFollowsLiveAndTakesStdin) {
  auto c = Connect();
  auto exec = ShellExec("echo first; read x; echo \"got $x\"; echo to-stderr >&2; exit 3");
  exec.stdin_mode = p::StdinMode::kPipe;
  const int32_t pid = StartBackground(c, exec);
  ASSERT_GT(pid, 0);
  auto attached = c.Attach({.pid = pid, .output = p::AttachOutput::kReplay, .follow = true});
  ASSERT_TRUE(attached) << attached.error().message();
  EXPECT_TRUE(attached->second.stdin_open);
  // The first line, replayed or live, arrives before any input is given.
  auto msg = c.NextFor(attached->first, 30s);
  ASSERT_TRUE(msg) << msg.error().message();
  ASSERT_TRUE(std::holds_alternative<p::Output>(*msg));
  EXPECT_EQ(std::get<p::Output>(*msg).data, "first\n");
  ASSERT_TRUE(c.Send(attached->first, p::StdinData{"abc\n"}));
  auto d = Drain(c, attached->first);
  EXPECT_EQ(d.out, "got abc\n");
  EXPECT_EQ(d.err, "to-stderr\n");
  EXPECT_EQ(d.dropped, 0u);
  ASSERT_TRUE(d.last && std::holds_alternative<p::Exited>(*d.last));
  EXPECT_EQ(std::get<p::Exited>(*d.last).exit_code, 3);

  // After the end the whole output is still there to replay, followed by the exit.
  auto again = c.Attach({.pid = pid, .output = p::AttachOutput::kReplay, .follow = true});
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->second.running);
  EXPECT_FALSE(again->second.stdin_open);
  d = Drain(c, again->first);
  EXPECT_EQ(d.out, "first\ngot abc\n");
  EXPECT_EQ(d.err, "to-stderr\n");
  ASSERT_TRUE(d.last && std::holds_alternative<p::Exited>(*d.last));
}

TEST_F(ProcessTableTest, RingKeepsTheNewestBytesAndReportsWhatItDropped) {
  auto c = Connect();
  auto exec = ShellExec("seq 1 100000");
  exec.ring_bytes = 4096;
  const int32_t pid = StartBackground(c, exec);
  ASSERT_GT(pid, 0);
  auto exited = WaitExit(c, pid);
  ASSERT_TRUE(exited);
  std::string all;
  for (int i = 1; i <= 100000; ++i) all += std::to_string(i) + "\n";
  EXPECT_EQ(exited->stdout_bytes, all.size());

  auto attached = c.Attach({.pid = pid, .output = p::AttachOutput::kReplay, .follow = false});
  ASSERT_TRUE(attached);
  auto d = Drain(c, attached->first);
  EXPECT_EQ(d.out.size(), 4096u);
  EXPECT_TRUE(d.out == all.substr(all.size() - 4096)) << "the ring does not hold the newest bytes";
  EXPECT_EQ(d.dropped, all.size() - 4096);
  ASSERT_TRUE(d.last && std::holds_alternative<p::Exited>(*d.last));
}

TEST_F(ProcessTableTest, ReplayWithoutFollowEndsWithDoneWhileTheProcessRuns) {
  auto c = Connect();
  const int32_t pid = StartBackground(c, ShellExec("echo hello; exec sleep 100"));
  ASSERT_GT(pid, 0);
  // Until the line is in the ring (each replay without follow ends at once).
  Drained d;
  for (auto deadline = Clock::now() + 30s; d.out.empty() && Clock::now() < deadline;) {
    auto attached = c.Attach({.pid = pid, .output = p::AttachOutput::kReplay, .follow = false});
    ASSERT_TRUE(attached);
    d = Drain(c, attached->first);
    ASSERT_TRUE(d.last && std::holds_alternative<p::Done>(*d.last));
    if (d.out.empty()) std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(d.out, "hello\n");
  EXPECT_TRUE(IdOf(pid));
}

TEST_F(ProcessTableTest, LiveAttachSeesOnlyNewOutputAndDetachLeavesTheProcess) {
  auto c = Connect();
  auto exec = ArgvExec({"cat"});
  exec.stdin_mode = p::StdinMode::kPipe;
  const int32_t pid = StartBackground(c, exec);
  ASSERT_GT(pid, 0);
  // "one" goes through the ring before the live attachment exists: it is replayed, not live.
  auto control = c.Attach({.pid = pid});
  ASSERT_TRUE(control);
  ASSERT_TRUE(c.Send(control->first, p::StdinData{"one\n"}));
  std::string replayed;
  for (auto deadline = Clock::now() + 30s; replayed.empty() && Clock::now() < deadline;) {
    auto r = c.Attach({.pid = pid, .output = p::AttachOutput::kReplay, .follow = false});
    ASSERT_TRUE(r);
    replayed = Drain(c, r->first).out;
  }
  ASSERT_EQ(replayed, "one\n");
  auto live = c.Attach({.pid = pid, .output = p::AttachOutput::kLive, .follow = true});
  ASSERT_TRUE(live);
  ASSERT_TRUE(c.Send(control->first, p::StdinData{"two\n"}));
  auto msg = c.NextFor(live->first, 30s);
  ASSERT_TRUE(msg && std::holds_alternative<p::Output>(*msg));
  EXPECT_EQ(std::get<p::Output>(*msg).data, "two\n");

  auto end = c.Detach(live->first);
  ASSERT_TRUE(end) << end.error().message();
  EXPECT_TRUE(std::holds_alternative<p::Done>(*end));
  end = c.Detach(control->first);
  ASSERT_TRUE(end && std::holds_alternative<p::Done>(*end));
  EXPECT_TRUE(IdOf(pid)) << "detaching ended the process";
  auto info = Find(c, pid);
  ASSERT_TRUE(info);
  EXPECT_TRUE(info->running);
  EXPECT_TRUE(info->stdin_open);

  // Closing stdin through a new attachment ends cat.
  auto closer = c.Attach({.pid = pid});
  ASSERT_TRUE(closer);
  ASSERT_TRUE(c.Send(closer->first, p::StdinClose{}));
  auto d = Drain(c, closer->first);
  ASSERT_TRUE(d.last && std::holds_alternative<p::Exited>(*d.last));
  EXPECT_EQ(std::get<p::Exited>(*d.last).exit_code, 0);
}

TEST_F(ProcessTableTest, ForegroundCommandsAreListedAndCanBeSignalledByPid) {
  auto owner = Connect();
  auto other = Connect();
  ExecWatcher w(owner);
  auto stream = owner.StartExec(ArgvExec({"sleep", "100"}));
  ASSERT_TRUE(stream);
  ASSERT_TRUE(w.WaitStarted(*stream));
  const int32_t pid = w[*stream].pid;
  auto info = Find(other, pid);
  ASSERT_TRUE(info);
  EXPECT_FALSE(info->background);
  EXPECT_TRUE(info->running);

  // Its output belongs to its exec stream: no replay.
  auto refused = other.Attach({.pid = pid, .output = p::AttachOutput::kReplay});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);

  auto attached = other.Attach({.pid = pid});
  ASSERT_TRUE(attached);
  EXPECT_FALSE(attached->second.background);
  ASSERT_TRUE(other.Send(attached->first, p::Signal{SIGTERM}));
  auto d = Drain(other, attached->first);
  ASSERT_TRUE(d.last && std::holds_alternative<p::Exited>(*d.last));
  EXPECT_EQ(std::get<p::Exited>(*d.last).term_signal, SIGTERM);
  ASSERT_TRUE(w.WaitFinished(*stream));
  ASSERT_TRUE(w[*stream].exited);
  EXPECT_EQ(w[*stream].exited->term_signal, SIGTERM);
  // A finished foreground command leaves the table.
  EXPECT_FALSE(Find(other, pid));
}

TEST_F(ProcessTableTest, ForegroundCommandDiesWithItsChannelBackgroundOneDoesNot) {
  auto keeper = Connect();
  int32_t fg = 0, bg = 0;
  {
    auto c = Connect();
    bg = StartBackground(c, ArgvExec({"sleep", "100"}));
    ExecWatcher w(c);
    auto stream = c.StartExec(ArgvExec({"sleep", "100"}));
    ASSERT_TRUE(stream);
    ASSERT_TRUE(w.WaitStarted(*stream));
    fg = w[*stream].pid;
  }
  auto fg_id = IdOf(fg);
  if (fg_id) {
    EXPECT_TRUE(AllGone({*fg_id}));
  }
  EXPECT_FALSE(Find(keeper, fg));
  ASSERT_TRUE(IdOf(bg));
  auto info = Find(keeper, bg);
  ASSERT_TRUE(info);
  EXPECT_TRUE(info->running);
}

TEST_F(ProcessTableTest, UnknownPidIsNotFound) {
  auto c = Connect();
  auto r = c.Attach({.pid = 999999});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  // The channel is still usable.
  EXPECT_TRUE(c.Ping(1));
}

TEST_F(ProcessTableTest, ExitedBackgroundProcessesAreRememberedUpToTheLimit) {
  auto c = Connect();
  std::vector<int32_t> pids;
  for (int i = 0; i < 70; ++i) {
    pids.push_back(StartBackground(c, ArgvExec({"true"})));
    ASSERT_GT(pids.back(), 0);
  }
  // All of them end; then the table holds the newest 64 (the default limit).
  std::vector<p::ProcessInfo> all;
  for (auto deadline = Clock::now() + 30s; Clock::now() < deadline;) {
    auto list = c.ListProcesses();
    ASSERT_TRUE(list) << ErrorCodeName(list.error().code()) << ": " << list.error().message();
    all = *list;
    bool running = false;
    for (const auto& info : all) running |= info.running;
    if (!running) break;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(all.size(), 64u);
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_FALSE(all[i].running);
    EXPECT_EQ(all[i].exit.exit_code, 0);
    EXPECT_EQ(all[i].pid, pids[i + 6]) << "not the newest, in start order";
  }
  auto forgotten = c.Attach({.pid = pids[0]});
  ASSERT_FALSE(forgotten);
  EXPECT_EQ(forgotten.error().code(), ErrorCode::kNotFound);
}

TEST_F(ProcessTableTest, BackgroundTimeoutKillsTheWholeTree) {
  auto c = Connect();
  auto exec = ShellExec("sleep 1000 & sleep 1000 & sh -c 'sleep 1000' & wait");
  exec.timeout_ms = 500;
  const int32_t pid = StartBackground(c, exec);
  ASSERT_GT(pid, 0);
  std::vector<ProcId> tree;
  for (auto deadline = Clock::now() + 10s; tree.size() < 5 && Clock::now() < deadline;) {
    tree = ProcessTree(pid);
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GE(tree.size(), 5u) << "the tree did not start";
  auto exited = WaitExit(c, pid);
  ASSERT_TRUE(exited);
  EXPECT_TRUE(exited->timed_out);
  EXPECT_TRUE(AllGone(tree));
}

TEST_F(ProcessTableTest, NoisyBackgroundProcessDoesNotGrowTheAgent) {
  auto c = Connect();
  const int64_t limit = AgentRssLimitKb(agent_->pid());
  const int32_t pid = StartBackground(c, ShellExec("head -c 1073741824 /dev/zero"));
  ASSERT_GT(pid, 0);
  auto exited = WaitExit(c, pid);
  ASSERT_TRUE(exited);
  EXPECT_EQ(exited->exit_code, 0);
  EXPECT_EQ(exited->stdout_bytes, 1ull << 30);
  ExpectAgentStayedSmall(limit);
}

TEST_F(ProcessTableTest, ASlowAttachmentLosesTheOldestBytesNotMemory) {
  auto c = Connect();
  const int64_t limit = AgentRssLimitKb(agent_->pid());
  auto exec = ShellExec("read go; head -c 536870912 /dev/zero");
  exec.stdin_mode = p::StdinMode::kPipe;
  const int32_t pid = StartBackground(c, exec);
  ASSERT_GT(pid, 0);
  auto live = c.Attach({.pid = pid, .output = p::AttachOutput::kLive, .follow = true});
  ASSERT_TRUE(live);
  ASSERT_TRUE(c.Send(live->first, p::StdinData{"go\n"}));
  // Not read for a while: the agent's send buffer fills, the ring wraps many times.
  std::this_thread::sleep_for(1500ms);
  uint64_t received = 0, dropped = 0;
  bool all_zero = true;
  std::optional<p::Exited> exited;
  while (!exited) {
    auto msg = c.NextFor(live->first, 60s);
    ASSERT_TRUE(msg) << msg.error().message();
    if (auto* out = std::get_if<p::Output>(&*msg)) {
      received += out->data.size();
      all_zero = all_zero && out->data.find_first_not_of('\0') == std::string::npos;
    } else if (auto* gap = std::get_if<p::Dropped>(&*msg)) {
      dropped += gap->bytes;
    } else {
      ASSERT_TRUE(std::holds_alternative<p::Exited>(*msg));
      exited = std::get<p::Exited>(*msg);
    }
  }
  EXPECT_EQ(exited->stdout_bytes, 512ull << 20);
  EXPECT_EQ(received + dropped, 512ull << 20) << "every byte is either sent or counted";
  EXPECT_GT(dropped, 0u);
  EXPECT_TRUE(all_zero);
  ExpectAgentStayedSmall(limit);
}

TEST_F(ProcessTableTest, PtyBackgroundProcessTakesInputAndResize) {
  auto c = Connect();
  auto exec = ShellExec("read line; stty size; echo \"line=$line\"");
  exec.pty = true;
  exec.pty_rows = 24;
  exec.pty_cols = 80;
  const int32_t pid = StartBackground(c, exec);
  ASSERT_GT(pid, 0);
  auto a = c.Attach({.pid = pid, .output = p::AttachOutput::kReplay, .follow = true});
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->second.pty);
  EXPECT_TRUE(a->second.stdin_open);
  ASSERT_TRUE(c.Send(a->first, p::Resize{40, 132}));
  ASSERT_TRUE(c.Send(a->first, p::StdinData{"typed\n"}));
  auto d = Drain(c, a->first);
  ASSERT_TRUE(d.last && std::holds_alternative<p::Exited>(*d.last));
  EXPECT_NE(d.out.find("40 132"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("line=typed"), std::string::npos) << d.out;
}

// --- Quiesce: what a memory checkpoint needs of the agent ---------------------------------------

// Whether one connect to `socket` succeeds now (ConnectUnix retries for seconds).
bool Accepts(const std::string& socket) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket.c_str());
  return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

TEST_F(ProcessTableTest, QuiesceClosesEverythingOfTheHostsAndWakesOnTheFile) {
  p::BlockingClient idle = Connect();
  p::BlockingClient c = Connect();
  ASSERT_TRUE(idle.Ping(1));
  const int32_t counter = StartBackground(
      c, ShellExec("i=0; while :; do i=$((i+1)); echo $i; sleep 0.02; done"));
  ASSERT_GT(counter, 0);
  const std::string wake = dir_.Sub("wake");
  ASSERT_TRUE(c.Quiesce(wake)) << "quiesce of an agent with only a background process";
  // Every channel is closed and nothing listens: the socket is gone.
  EXPECT_FALSE(idle.Ping(2)) << "an idle channel outlived the quiesce";
  struct stat st;
  EXPECT_NE(::stat(socket_.c_str(), &st), 0) << "the socket is still there";
  EXPECT_FALSE(Accepts(socket_)) << "something still accepts on the socket";
  // It stays so until the wake file appears; the background process runs on meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(Accepts(socket_)) << "the agent listened again without the wake file";
  EXPECT_EQ(::kill(counter, 0), 0) << "the background process ended with the quiesce";
  { UniqueFd made(::open(wake.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600)); }
  auto woken = ConnectUnix(socket_);  // retried while the agent looks for the file
  ASSERT_TRUE(woken) << "the agent did not listen again after the wake file";
  EXPECT_FALSE(std::filesystem::exists(wake)) << "the agent left its wake file";
  auto info = Find(*woken, counter);
  ASSERT_TRUE(info) << "the background process is not in the table after the wake";
  EXPECT_TRUE(info->running);
  // And a second round works the same.
  ASSERT_TRUE(woken->Quiesce(wake));
  EXPECT_FALSE(Accepts(socket_));
  { UniqueFd made(::open(wake.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600)); }
  auto again = ConnectUnix(socket_);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->Ping(3));
}

TEST_F(ProcessTableTest, QuiesceIsRefusedWhileSomethingIsInProgress) {
  p::BlockingClient busy = Connect();
  p::BlockingClient c = Connect();
  // A command in the foreground on another channel.
  auto stream = busy.StartExec(ShellExec("sleep 100"));
  ASSERT_TRUE(stream);
  auto started = busy.NextFor(*stream);
  ASSERT_TRUE(started && std::holds_alternative<p::Started>(*started));
  auto refused = c.Quiesce(dir_.Sub("wake"));
  ASSERT_FALSE(refused) << "quiesced with a command in the foreground";
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message().find("in progress"), std::string::npos)
      << refused.error().message();
  // Nothing was closed: both channels and the command go on.
  EXPECT_TRUE(c.Ping(1));
  ASSERT_TRUE(busy.Send(*stream, p::Signal{SIGKILL}));
  auto exited = busy.NextFor(*stream);
  ASSERT_TRUE(exited && std::holds_alternative<p::Exited>(*exited));
  // An attachment, on the quiescing channel itself, counts too.
  const int32_t pid = StartBackground(c, ShellExec("sleep 100"));
  ASSERT_GT(pid, 0);
  auto attached = c.Attach(p::Attach{.pid = pid});
  ASSERT_TRUE(attached);
  auto again = c.Quiesce(dir_.Sub("wake"));
  ASSERT_FALSE(again) << "quiesced with an attachment open";
  EXPECT_EQ(again.error().code(), ErrorCode::kFailedPrecondition);
  ASSERT_TRUE(c.Detach(attached->first));
  EXPECT_TRUE(c.Quiesce(dir_.Sub("wake"))) << "refused with nothing in progress";
}

TEST_F(ProcessTableTest, AQuiescedAgentEndsOnSigterm) {
  p::BlockingClient c = Connect();
  ASSERT_TRUE(c.Quiesce(dir_.Sub("wake")));
  ASSERT_EQ(::kill(agent_->pid(), SIGTERM), 0);
  auto status = agent_->WaitExit(std::chrono::seconds(10));
  ASSERT_TRUE(status) << "a quiesced agent did not end on SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
}

TEST(AgentQuiesceTest, AnAgentOnAnInheritedChannelRefuses) {
  AgentProcess agent({"--log-level", "warn"}, {"HOME=/"});
  auto client = p::BlockingClient::Connect(agent.TakeChannel());
  ASSERT_TRUE(client) << client.error().message();
  auto refused = client->Quiesce("/tmp/wake");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(client->Ping(1)) << "the channel closed after a refused quiesce";
}

}  // namespace
}  // namespace airlock::agent::test
