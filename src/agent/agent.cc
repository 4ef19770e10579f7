#include "agent/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/build_id.h"
#include "common/log.h"
#include "common/syscall.h"

namespace airlock::agent {
namespace {

using protocol::Message;
namespace p = protocol;

constexpr size_t kReadChunk = p::kMaxChunk;
// Reads per output event, so one noisy process cannot starve the others.
constexpr int kReadsPerEvent = 8;
constexpr size_t kChannelReadPerEvent = 1 << 20;
// How often a quiesced agent looks for its wake file: the most a resume waits for it.
constexpr auto kWakePoll = std::chrono::milliseconds(2);

// Signals the agent handles through its signalfd. The ones it forwards go to every running
// command's process group.
constexpr int kHandledSignals[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

std::string BuildId() { return std::string("airlock-agent ") + kBuildId; }

}  // namespace

uint64_t ReadOomKillCount() {
  auto cgroups = ReadFileToString("/proc/self/cgroup", 64 << 10);
  if (!cgroups) return 0;
  std::string file;
  std::string_view rest(*cgroups);
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (line.starts_with("0::")) {
      file = "/sys/fs/cgroup" + std::string(line.substr(3)) + "/memory.events";
    } else if (size_t m = line.find(":memory:"); m != std::string_view::npos) {
      file = "/sys/fs/cgroup/memory" + std::string(line.substr(m + 8)) + "/memory.oom_control";
      break;  // v1 memory controller wins over the v2 line in a hybrid layout
    }
  }
  auto text = file.empty() ? Result<std::string>(std::string()) : ReadFileToString(file);
  if (!text) return 0;
  size_t at = text->find("oom_kill ");
  return at == std::string::npos ? 0 : std::strtoull(text->c_str() + at + 9, nullptr, 10);
}

void OutputRing::Append(p::OutputFd fd, std::string_view data) {
  if (data.empty()) return;
  // Small reads of one fd are merged, so a chatty process does not make a chunk per line.
  if (!chunks_.empty() && chunks_.back().fd == fd && chunks_.back().data.size() < kReadChunk) {
    chunks_.back().data.append(data);
  } else {
    // The buffer of the last chunk dropped is reused: a process that writes without end does
    // not make the agent allocate and free for every chunk.
    std::string buffer = std::move(spare_);
    spare_ = std::string();
    buffer.assign(data);
    chunks_.push_back(Chunk{end_, fd, std::move(buffer)});
  }
  end_ += data.size();
  while (end_ - start_ > capacity_) {
    Chunk& first = chunks_.front();
    const uint64_t excess = end_ - start_ - capacity_;
    if (first.data.size() <= excess) {
      start_ += first.data.size();
      if (first.data.capacity() > spare_.capacity()) spare_ = std::move(first.data);
      chunks_.pop_front();
    } else {
      first.data.erase(0, excess);
      first.offset += excess;
      start_ += excess;
    }
  }
}

std::pair<p::OutputFd, std::string_view> OutputRing::Read(uint64_t offset, size_t max) const {
  // The last chunk that starts at or before `offset`.
  auto it = std::upper_bound(chunks_.begin(), chunks_.end(), offset,
                             [](uint64_t off, const Chunk& c) { return off < c.offset; });
  AIRLOCK_CHECK(it != chunks_.begin());
  const Chunk& c = *std::prev(it);
  std::string_view data(c.data);
  data.remove_prefix(offset - c.offset);
  return {c.fd, data.substr(0, max)};
}

Result<std::unique_ptr<Agent>> Agent::Create(AgentOptions options) {
  auto owner = options.exec.default_user
                   ? std::optional(std::make_pair(options.exec.default_user->uid,
                                                  options.exec.default_user->gid))
                   : std::nullopt;
  if (::geteuid() != 0) owner.reset();  // only root can give files away
  auto root = FileRoot::Open(options.file_root, owner);
  if (!root) return std::unexpected(root.error());
  std::unique_ptr<Agent> agent(new Agent(std::move(options), std::move(*root)));
  if (auto st = agent->Init(); !st) return std::unexpected(st.error());
  return agent;
}

Agent::~Agent() {
  for (auto& e : processes_) DropExec(*e);
  if (!listen_path_.empty()) ::unlink(listen_path_.c_str());
}

Status Agent::Init() {
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) return FailErrno("epoll_create1", errno);
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : kHandledSignals) sigaddset(&mask, sig);
  if (::sigprocmask(SIG_BLOCK, &mask, nullptr) < 0) return FailErrno("sigprocmask", errno);
  signal_fd_.Reset(::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signal_fd_) return FailErrno("signalfd", errno);
  AddWatch(signal_fd_.get(), &signal_watch_, EPOLLIN);
  oom_kills_seen_ = ReadOomKillCount();
  return {};
}

void Agent::AddWatch(int fd, Watch* w, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = w;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) < 0) {
    Panic("epoll_ctl(ADD) failed: " + ErrnoName(errno));
  }
}

void Agent::ModWatch(int fd, Watch* w, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = w;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev) < 0) {
    Panic("epoll_ctl(MOD) failed: " + ErrnoName(errno));
  }
}

void Agent::DelWatch(int fd) { ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr); }

Status Agent::AddChannel(UniqueFd fd) {
  if (auto st = SetNonBlocking(fd.get(), true); !st) return st;
  auto c = std::make_unique<Connection>();
  c->fd = std::move(fd);
  c->watch.conn = c.get();
  c->epoll_events = EPOLLIN;
  AddWatch(c->fd.get(), &c->watch, c->epoll_events);
  connections_.push_back(std::move(c));
  return {};
}

Status Agent::Listen(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return Fail(ErrorCode::kInvalidArgument, "socket path too long: " + path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return FailErrno("socket", errno);
  ::unlink(path.c_str());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) {
    return FailErrno("bind " + path, errno);
  }
  // Only the agent's own user (root, in a sandbox) may connect; the daemon reaches it from the
  // host side, where the socket's directory is private to the daemon.
  if (::chmod(path.c_str(), 0600) < 0) return FailErrno("chmod " + path, errno);
  if (::listen(fd.get(), 64) < 0) return FailErrno("listen " + path, errno);
  listen_path_ = path;
  // Not ListenOn's checks: this socket is known to listen, and gVisor has no SO_ACCEPTCONN.
  return Serve(std::move(fd));
}

Status Agent::ListenOn(UniqueFd fd) {
  int type = 0, listening = 0;
  socklen_t len = sizeof type;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_STREAM) {
    return Fail(ErrorCode::kInvalidArgument, "the listening fd is not a stream socket");
  }
  len = sizeof listening;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) < 0 || !listening) {
    return Fail(ErrorCode::kInvalidArgument, "the listening fd is not listening");
  }
  return Serve(std::move(fd));
}

Status Agent::Serve(UniqueFd fd) {
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) < 0 ||
      ::fcntl(fd.get(), F_SETFD, FD_CLOEXEC) < 0) {
    return FailErrno("fcntl on the listening fd", errno);
  }
  listen_fd_ = std::move(fd);
  AddWatch(listen_fd_.get(), &listen_watch_, EPOLLIN);
  return {};
}

int Agent::Run() {
  epoll_event events[256];
  while (true) {
    auto now = Clock::now();
    bool serving = listen_fd_.valid() || !connections_.empty() || !wake_path_.empty();
    if (!serving) break;
    if (shutting_down_) {
      bool busy = false;
      for (auto& e : processes_) busy |= !e->result.has_value();
      for (auto& c : connections_) busy |= c->pending() > 0;
      if (!busy || (shutdown_deadline_ && now >= *shutdown_deadline_)) break;
    }
    int n = RetryEintr([&] { return ::epoll_wait(epoll_.get(), events, 256, NextTimeoutMs(now)); });
    if (n < 0) Panic("epoll_wait failed: " + ErrnoName(errno));
    for (int i = 0; i < n; ++i) {
      auto* w = static_cast<Watch*>(events[i].data.ptr);
      uint32_t ev = events[i].events;
      switch (w->kind) {
        case Watch::kSignal:
          OnSignal();
          break;
        case Watch::kListen:
          OnAccept();
          break;
        case Watch::kChannel:
          if (ev & EPOLLOUT) OnChannelWritable(*w->conn);
          if (!w->conn->closing && (ev & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
            OnChannelReadable(*w->conn);
          }
          break;
        case Watch::kStdout:
          OnOutput(*w->exec, false);
          break;
        case Watch::kStderr:
          OnOutput(*w->exec, true);
          break;
        case Watch::kStdin:
          OnStdinWritable(*w->exec);
          break;
      }
    }
    OnTimers(Clock::now());
    if (!wake_path_.empty()) CheckWake();
    for (size_t i = 0; i < processes_.size();) {
      ExecState& e = *processes_[i];
      MaybeFinish(e);  // may remove it
      if (i < processes_.size() && processes_[i].get() == &e) ++i;
    }
    ForgetExited();
    // Connections are only removed here, after every event of this round was handled.
    for (size_t i = 0; i < connections_.size();) {
      Connection& c = *connections_[i];
      PumpDownloads(c);
      PumpAttachments(c);
      Flush(c);
      if (c.closing && (c.pending() == 0 || !c.fd.valid())) {
        CloseConnection(c);
        connections_.erase(connections_.begin() + static_cast<ptrdiff_t>(i));
        continue;
      }
      UpdateConnection(c);
      ++i;
    }
  }
  for (auto& e : processes_) DropExec(*e);
  processes_.clear();
  return 0;
}

int Agent::NextTimeoutMs(Clock::time_point now) const {
  std::optional<Clock::time_point> next = shutdown_deadline_;
  auto consider = [&](const std::optional<Clock::time_point>& t) {
    if (t && (!next || *t < *next)) next = t;
  };
  for (const auto& c : connections_) {
    if (c->output_paused) continue;
    if (!c->downloads.empty()) return 0;
    for (const auto& [stream, a] : c->attachments) {
      if (AttachmentHasWork(*a)) return 0;
    }
  }
  for (const auto& e : processes_) {
    consider(e->deadline);
    consider(e->kill_at);
    consider(e->linger_until);
  }
  // Quiesced: the wake file is looked for this often (nothing can tell the agent it is there).
  if (!wake_path_.empty()) consider(now + kWakePoll);
  if (!next) return -1;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(*next - now).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 60000));
}

void Agent::OnSignal() {
  signalfd_siginfo info;
  while (::read(signal_fd_.get(), &info, sizeof info) == sizeof info) {
    int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) {
      ReapChildren();
    } else if (sig == SIGTERM || sig == SIGINT) {
      spdlog::info("signal {}: shutting down", sig);
      BeginShutdown();
    } else {
      for (auto& e : processes_) {
        if (!e->exited) ::kill(-e->pid, sig);
      }
    }
  }
  // A SIGCHLD may have been merged with another signal: reaping is cheap, always do it.
  ReapChildren();
}

void Agent::ReapChildren() {
  while (true) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    ExecState* found = FindRunning(pid);
    if (!found) continue;  // an orphan we adopted as PID 1 or subreaper
    ExecState& e = *found;
    e.exited = true;
    e.ended_wall = std::chrono::system_clock::now();
    e.wait_status = status;
    e.ended = Clock::now();
    e.deadline.reset();
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && !e.timed_out) {
      uint64_t kills = ReadOomKillCount();
      e.oom_killed = kills > oom_kills_seen_;
      oom_kills_seen_ = kills;
    }
    if (e.out || e.err) e.linger_until = e.ended + std::chrono::milliseconds(options_.linger_ms);
  }
}

void Agent::OnAccept() {
  while (true) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a transient failure the next event retries
    if (shutting_down_) {
      ::close(fd);
      continue;
    }
    if (auto st = AddChannel(UniqueFd(fd)); !st) spdlog::warn("{}", st.error().message());
  }
}

void Agent::OnChannelReadable(Connection& c) {
  char buf[65536];
  size_t total = 0;
  while (total < kChannelReadPerEvent && !c.closing) {
    ssize_t n = ::read(c.fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      c.closing = true;
      c.fd.Reset();
      return;
    }
    if (n == 0) {  // the daemon went away
      c.closing = true;
      c.out.clear();
      c.out_pos = 0;
      return;
    }
    total += static_cast<size_t>(n);
    c.decoder.Feed(std::string_view(buf, static_cast<size_t>(n)));
    while (!c.closing) {
      auto frame = c.decoder.Next();
      if (!frame) {
        ProtocolError(c, frame.error());
        return;
      }
      if (!*frame) break;
      HandleFrame(c, std::move(**frame));
    }
  }
}

void Agent::OnChannelWritable(Connection& c) { Flush(c); }

void Agent::Flush(Connection& c) {
  while (c.pending() > 0 && c.fd.valid()) {
    ssize_t n = ::write(c.fd.get(), c.out.data() + c.out_pos, c.pending());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      c.closing = true;  // EPIPE / ECONNRESET: the daemon is gone
      c.fd.Reset();
      c.out.clear();
      c.out_pos = 0;
      return;
    }
    c.out_pos += static_cast<size_t>(n);
  }
  if (c.out_pos == c.out.size()) {
    c.out.clear();
    c.out_pos = 0;
  } else if (c.out_pos > (1 << 20)) {
    c.out.erase(0, c.out_pos);
    c.out_pos = 0;
  }
}

// Applies flow control after a round: process output stops while the daemon is behind, the
// channel stops being read while a command is not taking its stdin.
void Agent::UpdateConnection(Connection& c) {
  if (!c.fd.valid()) return;
  if (!c.output_paused && c.pending() > options_.send_high_water) {
    c.output_paused = true;
    for (auto& [stream, e] : c.execs) {
      if (e->out) ModWatch(e->out.get(), &e->out_watch, 0);
      if (e->err) ModWatch(e->err.get(), &e->err_watch, 0);
    }
  } else if (c.output_paused && c.pending() < options_.send_low_water) {
    c.output_paused = false;
    for (auto& [stream, e] : c.execs) {
      if (e->out) ModWatch(e->out.get(), &e->out_watch, EPOLLIN);
      if (e->err) ModWatch(e->err.get(), &e->err_watch, EPOLLIN);
    }
  }
  bool stdin_full = false;
  for (auto& [stream, e] : c.execs) stdin_full |= e->stdin_buf.size() > options_.stdin_buffer_cap;
  for (auto& [stream, a] : c.attachments) {
    stdin_full |= a->proc && a->proc->stdin_buf.size() > options_.stdin_buffer_cap;
  }
  uint32_t events =
      (stdin_full || c.closing ? 0u : uint32_t{EPOLLIN}) | (c.pending() ? uint32_t{EPOLLOUT} : 0u);
  if (events != c.epoll_events) {
    c.epoll_events = events;
    ModWatch(c.fd.get(), &c.watch, events);
  }
}

void Agent::CloseConnection(Connection& c) {
  // Its foreground commands die with it; background ones only lose the attachments.
  for (auto& [stream, a] : c.attachments) {
    if (a->proc) std::erase(a->proc->attachments, a.get());
  }
  c.attachments.clear();
  auto execs = std::move(c.execs);
  for (auto& [stream, e] : execs) {
    DropExec(*e);
    RemoveProcess(*e);
  }
  c.uploads.clear();
  c.downloads.clear();
  if (c.fd) DelWatch(c.fd.get());
  c.fd.Reset();
  // An agent serving one inherited channel (no listener) ends with it; a quiesced one waits.
  if (!listen_fd_ && wake_path_.empty() && connections_.size() == 1) BeginShutdown();
}

void Agent::Send(Connection& c, uint32_t stream, const Message& msg) {
  if (!c.fd.valid()) return;
  c.state.Send(stream, msg);
  p::AppendFrame(c.out, stream, msg);
}

void Agent::SendError(Connection& c, uint32_t stream, const Error& error) {
  Send(c, stream, p::ToErrorMsg(error));
}

void Agent::ProtocolError(Connection& c, const Error& error) {
  spdlog::warn("closing channel: {}", error.message());
  // One try to tell the peer why; the channel closes this round whether or not it got there.
  SendError(c, 0, error);
  Flush(c);
  c.out.clear();
  c.out_pos = 0;
  c.closing = true;
}

void Agent::HandleFrame(Connection& c, p::Frame frame) {
  auto msg = p::DecodeMessage(frame.type, frame.payload);
  if (!msg) return ProtocolError(c, msg.error());
  auto verdict = c.state.Receive(frame.stream, *msg);
  if (!verdict) return ProtocolError(c, verdict.error());
  if (*verdict == p::Verdict::kLate) return;
  uint32_t stream = frame.stream;
  switch (frame.type) {
    case p::MsgType::kHello:
      Send(c, 0, p::Hello{p::kProtocolVersion, BuildId(), 0});
      return;
    case p::MsgType::kPing:
      Send(c, 0, p::Pong{std::get<p::Ping>(*msg).nonce});
      return;
    case p::MsgType::kPong:
      return;
    case p::MsgType::kError:
      spdlog::warn("daemon reported: {}", std::get<p::ErrorMsg>(*msg).message);
      c.closing = true;
      return;
    case p::MsgType::kExec:
      return StartExec(c, stream, std::get<p::Exec>(*msg));
    case p::MsgType::kAttach:
      return StartAttach(c, stream, std::get<p::Attach>(*msg));
    case p::MsgType::kProcList:
      return SendProcessList(c, stream);
    case p::MsgType::kQuiesce:
      return Quiesce(c, stream, std::get<p::Quiesce>(*msg));
    case p::MsgType::kDetach: {
      auto it = c.attachments.find(stream);
      if (it == c.attachments.end()) return;  // already ended (the process exited): late
      Attachment& a = *it->second;
      return EndAttachment(a, p::Done{a.sent});
    }
    case p::MsgType::kStdinData:
    case p::MsgType::kStdinClose: {
      ExecState* e = ProcessFor(c, stream);
      if (!e) return;  // an attachment to a process that ended
      if (frame.type == p::MsgType::kStdinClose) {
        e->stdin_close_pending = true;
      } else if (e->in && !e->stdin_close_pending) {
        // After the command closed its stdin (or someone closed it), input is dropped.
        e->stdin_buf += std::get<p::StdinData>(*msg).data;
      }
      WriteStdin(*e);
      return;
    }
    case p::MsgType::kSignal: {
      ExecState* e = ProcessFor(c, stream);
      if (e && !e->exited) ::kill(-e->pid, std::get<p::Signal>(*msg).signo);
      return;
    }
    case p::MsgType::kResize: {
      ExecState* e = ProcessFor(c, stream);
      const auto& r = std::get<p::Resize>(*msg);
      winsize size{r.rows, r.cols, 0, 0};
      if (e && e->pty && e->out) ::ioctl(e->out.get(), TIOCSWINSZ, &size);
      return;
    }
    default:
      return HandleFileOp(c, stream, *msg);
  }
}

void Agent::StartExec(Connection& c, uint32_t stream, const p::Exec& req) {
  if (shutting_down_) {
    return SendError(c, stream, Error(ErrorCode::kUnavailable, "the agent is shutting down"));
  }
  auto plan = PlanExec(req, options_.exec);
  if (!plan) return SendError(c, stream, plan.error());
  auto spawned = Spawn(*plan);
  if (!spawned) return SendError(c, stream, spawned.error());

  auto e = std::make_unique<ExecState>();
  e->background = req.background;
  if (!e->background) {
    e->conn = &c;
    e->stream = stream;
  } else {
    e->ring.emplace(req.ring_bytes ? req.ring_bytes : options_.default_ring_bytes);
  }
  e->pid = spawned->pid;
  e->pty = req.pty;
  e->started_wall = std::chrono::system_clock::now();
  if (!req.shell.empty()) {
    e->command = req.shell;
  } else {
    for (const auto& arg : req.argv) {
      if (!e->command.empty()) e->command += ' ';
      e->command += arg;
      if (e->command.size() >= p::kMaxCommandInfo) break;
    }
  }
  if (e->command.size() > p::kMaxCommandInfo) e->command.resize(p::kMaxCommandInfo);
  e->in = std::move(spawned->stdin_fd);
  e->out = std::move(spawned->stdout_fd);
  e->err = std::move(spawned->stderr_fd);
  e->started = Clock::now();
  e->cap = req.output_cap ? req.output_cap : options_.default_output_cap;
  if (req.timeout_ms) {
    // Clamped to a year so that no value overflows the clock arithmetic.
    constexpr uint64_t kMaxTimeoutMs = 365ull * 24 * 3600 * 1000;
    e->deadline = e->started + std::chrono::milliseconds(std::min(req.timeout_ms, kMaxTimeoutMs));
  }
  e->kill_grace_ms = req.kill_grace_ms ? req.kill_grace_ms : options_.default_kill_grace_ms;
  for (Watch* w : {&e->in_watch, &e->out_watch, &e->err_watch}) {
    w->conn = e->conn;
    w->exec = e.get();
  }
  // A background process is never held back: its output goes to the ring.
  uint32_t out_events = e->conn && c.output_paused ? 0u : uint32_t{EPOLLIN};
  if (e->out) AddWatch(e->out.get(), &e->out_watch, out_events);
  if (e->err) AddWatch(e->err.get(), &e->err_watch, out_events);
  if (e->in) AddWatch(e->in.get(), &e->in_watch, 0);
  Send(c, stream, p::Started{e->pid});  // closes the stream of a background exec
  if (e->conn) c.execs.emplace(stream, e.get());
  // A pid the kernel reused: the exited process that had it is forgotten.
  std::erase_if(processes_, [&](const std::unique_ptr<ExecState>& old) {
    return old->pid == e->pid && old->attachments.empty();
  });
  processes_.push_back(std::move(e));
}

void Agent::WriteStdin(ExecState& e) {
  while (e.in) {
    if (e.stdin_buf.empty()) {
      if (!e.stdin_close_pending) break;
      if (e.pty && !e.eof_typed) {
        // A terminal has no half-close: type the EOF character, as a person would (queued like
        // any input, so a full terminal does not lose it). After a partial line the first one
        // only hands that line to the reader: type it twice.
        e.stdin_buf.assign(e.pty_mid_line ? 2 : 1, '\x04');
        e.eof_typed = true;
        continue;
      }
      DelWatch(e.in.get());
      e.in.Reset();
      return;
    }
    ssize_t n = ::write(e.in.get(), e.stdin_buf.data(), e.stdin_buf.size());
    if (n > 0) {
      char last = e.stdin_buf[static_cast<size_t>(n) - 1];
      e.pty_mid_line = last != '\n' && last != '\r';
      e.stdin_buf.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    // EPIPE (or EIO on a terminal nobody holds): the command closed its stdin. What was not
    // taken is dropped.
    e.stdin_buf.clear();
    e.eof_typed = true;
    if (!e.pty) {
      DelWatch(e.in.get());
      e.in.Reset();
      return;
    }
  }
  if (e.in) ModWatch(e.in.get(), &e.in_watch, e.stdin_buf.empty() ? 0u : uint32_t{EPOLLOUT});
}

void Agent::OnStdinWritable(ExecState& e) { WriteStdin(e); }

void Agent::OnOutput(ExecState& e, bool is_stderr) {
  for (int i = 0; i < kReadsPerEvent; ++i) {
    if (ReadOutputOnce(e, is_stderr) != 1) return;
    if (e.conn && e.conn->pending() > options_.send_high_water) return;  // UpdateConnection pauses us
  }
}

int Agent::ReadOutputOnce(ExecState& e, bool is_stderr) {
  UniqueFd& fd = is_stderr ? e.err : e.out;
  if (!fd) return 0;
  char buf[kReadChunk];
  ssize_t n = RetryEintr([&] { return ::read(fd.get(), buf, sizeof buf); });
  if (n < 0 && errno == EAGAIN) return -1;
  if (n <= 0) {  // end of file; EIO on a terminal whose last user closed it
    CloseOutput(e, is_stderr);
    return 0;
  }
  size_t len = static_cast<size_t>(n);
  (is_stderr ? e.stderr_bytes : e.stdout_bytes) += len;
  const auto fd_kind = is_stderr ? p::OutputFd::kStderr : p::OutputFd::kStdout;
  if (e.ring) {
    e.ring->Append(fd_kind, std::string_view(buf, len));
    return 1;
  }
  size_t take = static_cast<size_t>(std::min<uint64_t>(len, e.cap - e.delivered));
  if (take < len) e.truncated = true;  // beyond the cap: read and dropped
  if (take > 0) {
    p::AppendOutputFrame(e.conn->out, e.stream, fd_kind, std::string_view(buf, take));
    e.delivered += take;
  }
  return 1;
}

void Agent::CloseOutput(ExecState& e, bool is_stderr) {
  UniqueFd& fd = is_stderr ? e.err : e.out;
  if (!fd) return;
  DelWatch(fd.get());
  if (e.pty) {
    // Closing the master hangs the terminal up. A SIGHUP that reaches the command while it is
    // still exiting would be reported as its cause of death, so the master is kept until the
    // command has been reaped (the ExecState goes).
    e.pty_master = std::move(fd);
    if (e.in) {  // a dup of the master, for stdin
      DelWatch(e.in.get());
      e.in.Reset();
    }
  }
  fd.Reset();
}

// Reads what the pipes hold right now and closes them: the command has exited, and a
// background process that kept them open does not hold up the result any longer.
void Agent::DrainOutput(ExecState& e) {
  for (bool is_stderr : {false, true}) {
    // Bounded: a pipe holds at most 1 MiB, and a writer still running could refill it forever.
    for (int i = 0; i < 32 && ReadOutputOnce(e, is_stderr) == 1; ++i) {
    }
    CloseOutput(e, is_stderr);
  }
}

void Agent::OnTimers(Clock::time_point now) {
  if (shutdown_deadline_ && now >= *shutdown_deadline_) {
    for (auto& e : processes_) {
      if (!e->exited) FinishKill(*e);
    }
  }
  for (auto& ep : processes_) {
    ExecState& e = *ep;
    if (e.deadline && now >= *e.deadline) {
      e.deadline.reset();
      e.timed_out = true;
      BeginKill(e, now);
    }
    if (e.kill_at && now >= *e.kill_at) FinishKill(e);
    if (e.linger_until && now >= *e.linger_until) {
      if (e.conn && e.conn->output_paused) {
        e.linger_until = now + std::chrono::milliseconds(options_.linger_ms);
      } else {
        e.linger_until.reset();
        DrainOutput(e);
      }
    }
  }
}

void Agent::BeginKill(ExecState& e, Clock::time_point now) {
  e.doomed = ProcessTree(e.pid);
  e.doomed_sessions = SessionsOf(e.doomed);
  SignalAll(e.doomed, SIGTERM);
  ::kill(-e.pid, SIGTERM);
  e.kill_at = now + std::chrono::milliseconds(e.kill_grace_ms);
}

void Agent::FinishKill(ExecState& e) {
  e.kill_at.reset();
  std::vector<ProcId> roots = e.doomed;
  if (!e.exited) {
    for (const auto& p : ProcessTree(e.pid)) roots.push_back(p);
  }
  // A process forked by a daemon as it died on SIGTERM is re-parented to the agent, out of the
  // tree; it is still in the session the command made.
  for (const auto& p : SessionMembers(e.doomed_sessions)) roots.push_back(p);
  KillTree(roots);
  ::kill(-e.pid, SIGKILL);
}

void Agent::MaybeFinish(ExecState& e) {
  if (!e.exited || e.out || e.err || e.result) return;
  // A timed-out command whose first process is gone: what survived SIGTERM goes now.
  if (e.kill_at) FinishKill(e);
  p::Exited done;
  if (WIFSIGNALED(e.wait_status)) {
    done.exit_code = -1;
    done.term_signal = WTERMSIG(e.wait_status);
  } else {
    done.exit_code = WEXITSTATUS(e.wait_status);
  }
  done.duration_us = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(e.ended - e.started).count());
  done.timed_out = e.timed_out;
  done.truncated = e.truncated;
  done.oom_killed = e.oom_killed;
  done.stdout_bytes = e.stdout_bytes;
  done.stderr_bytes = e.stderr_bytes;
  if (e.in) DelWatch(e.in.get());
  e.in.Reset();
  e.stdin_buf.clear();
  e.result = done;
  if (!e.conn) return;  // background: listed until forgotten; attachments send the exit
  Connection& c = *e.conn;
  Send(c, e.stream, done);
  c.execs.erase(e.stream);
  RemoveProcess(e);  // destroys e
}

void Agent::DropExec(ExecState& e) {
  if (!e.exited) {
    FinishKill(e);
    e.exited = true;  // reaped later as an unknown child
  }
  for (UniqueFd* fd : {&e.in, &e.out, &e.err}) {
    if (*fd) DelWatch(fd->get());
    fd->Reset();
  }
}

void Agent::RemoveProcess(ExecState& e) {
  for (Attachment* a : e.attachments) {
    a->proc = nullptr;
    EndAttachment(*a, e.result ? p::Message(*e.result) : p::Message(p::Done{a->sent}));
  }
  std::erase_if(processes_, [&](const std::unique_ptr<ExecState>& p) { return p.get() == &e; });
}

void Agent::Quiesce(Connection& c, uint32_t stream, const p::Quiesce& req) {
  if (shutting_down_) {
    return SendError(c, stream, Error(ErrorCode::kUnavailable, "the agent is shutting down"));
  }
  if (listen_path_.empty()) {
    return SendError(c, stream,
                     Error(ErrorCode::kFailedPrecondition,
                           "this agent serves an inherited socket or channel; only one that "
                           "listens on a path (--listen) can close it and listen again"));
  }
  // A command in the foreground, a transfer or an attachment would lose its channel: refused,
  // so that nothing the caller is waiting for is cut off. (This stream counts as one.)
  size_t in_progress = 0;
  for (const auto& other : connections_) in_progress += other->state.open_streams();
  if (in_progress > 1) {
    return SendError(c, stream,
                     Error(ErrorCode::kFailedPrecondition,
                           std::to_string(in_progress - 1) +
                               " operation(s) in progress (commands in the foreground, file "
                               "transfers, attachments); background processes do not count"));
  }
  // Nothing of the host's stays open: the listener and every channel close now, this one last
  // (the caller reads its end as "all closed").
  DelWatch(listen_fd_.get());
  listen_fd_.Reset();
  ::unlink(listen_path_.c_str());
  wake_path_ = req.wake_path;
  for (auto& other : connections_) {
    if (other.get() == &c) continue;
    other->closing = true;
    CloseConnection(*other);
  }
  Send(c, stream, p::Done{0});
  Flush(c);
  c.closing = true;
  if (c.pending() == 0) CloseConnection(c);
  spdlog::info("quiesced; waiting for {}", wake_path_);
}

void Agent::CheckWake() {
  if (!connections_.empty()) return;  // the quiescing channel is still being flushed
  struct stat st;
  if (::stat(wake_path_.c_str(), &st) < 0) return;
  ::unlink(wake_path_.c_str());
  wake_path_.clear();
  const std::string path = listen_path_;
  if (auto listened = Listen(path); !listened) {
    // Nobody can reach this agent any more: end the sandbox rather than leave it unreachable.
    spdlog::error("listening again after the wake: {}", listened.error().message());
    listen_path_.clear();
    BeginShutdown();
    return;
  }
  spdlog::info("woke; listening on {}", path);
}

void Agent::BeginShutdown() {
  if (shutting_down_) return;
  shutting_down_ = true;
  if (listen_fd_) {
    DelWatch(listen_fd_.get());
    listen_fd_.Reset();
    if (!listen_path_.empty()) ::unlink(listen_path_.c_str());
    listen_path_.clear();
  }
  auto now = Clock::now();
  shutdown_deadline_ = now + std::chrono::milliseconds(options_.default_kill_grace_ms + 1000);
  for (auto& e : processes_) {
    if (!e->exited && !e->kill_at) BeginKill(*e, now);
  }
}

Agent::ExecState* Agent::FindRunning(pid_t pid) {
  for (auto& e : processes_) {
    if (e->pid == pid && !e->exited) return e.get();
  }
  return nullptr;
}

Agent::ExecState* Agent::ProcessFor(Connection& c, uint32_t stream) {
  if (auto it = c.execs.find(stream); it != c.execs.end()) return it->second;
  if (auto it = c.attachments.find(stream); it != c.attachments.end()) return it->second->proc;
  return nullptr;
}

void Agent::StartAttach(Connection& c, uint32_t stream, const p::Attach& req) {
  // The running process with this pid, else the latest exited one that had it.
  ExecState* e = FindRunning(req.pid);
  for (auto it = processes_.rbegin(); !e && it != processes_.rend(); ++it) {
    if ((*it)->pid == req.pid) e = it->get();
  }
  if (!e) {
    return SendError(c, stream, Error(ErrorCode::kNotFound,
                                      "no process " + std::to_string(req.pid) +
                                          " started by the agent (or it was forgotten)"));
  }
  const bool output = req.output != p::AttachOutput::kNone;
  if (output && !e->ring) {
    return SendError(c, stream,
                     Error(ErrorCode::kFailedPrecondition,
                           "process " + std::to_string(req.pid) +
                               " runs in the foreground: its output goes to the exec that "
                               "started it"));
  }
  auto a = std::make_unique<Attachment>();
  a->conn = &c;
  a->stream = stream;
  a->proc = e;
  a->output = output;
  a->follow = req.follow;
  // A replay starts at the very beginning, so that what the ring no longer holds is reported.
  if (e->ring) a->cursor = req.output == p::AttachOutput::kReplay ? 0 : e->ring->end();
  if (!req.follow) a->stop_at = e->ring ? e->ring->end() : a->cursor;
  Send(c, stream,
       p::Attached{.pid = e->pid,
                   .background = e->background,
                   .pty = e->pty,
                   .stdin_open = e->in.valid() && !e->stdin_close_pending,
                   .running = !e->result.has_value()});
  e->attachments.push_back(a.get());
  c.attachments.emplace(stream, std::move(a));
}

bool Agent::AttachmentHasWork(const Attachment& a) const {
  if (!a.proc) return false;
  if (a.output && a.cursor < a.proc->ring->end() && (!a.stop_at || a.cursor < *a.stop_at)) {
    return true;
  }
  // Caught up: an end to send.
  return a.proc->result.has_value() || (a.stop_at && a.cursor >= *a.stop_at);
}

void Agent::PumpAttachments(Connection& c) {
  for (auto it = c.attachments.begin(); it != c.attachments.end();) {
    Attachment& a = *(it++)->second;  // EndAttachment erases it
    if (!a.proc) continue;
    ExecState& e = *a.proc;
    if (a.output) {
      const OutputRing& ring = *e.ring;
      if (a.cursor < ring.start()) {
        Send(c, a.stream, p::Dropped{ring.start() - a.cursor});
        a.cursor = ring.start();
      }
      const uint64_t end = a.stop_at ? std::min(*a.stop_at, ring.end()) : ring.end();
      while (a.cursor < end && c.pending() <= options_.send_high_water) {
        auto [fd, piece] = ring.Read(a.cursor, std::min<uint64_t>(kReadChunk, end - a.cursor));
        p::AppendOutputFrame(c.out, a.stream, fd, piece);
        a.cursor += piece.size();
        a.sent += piece.size();
      }
      if (a.cursor < end) continue;  // more once the channel drains
    }
    if (e.result) {
      EndAttachment(a, *e.result);
    } else if (a.stop_at && a.cursor >= *a.stop_at) {
      EndAttachment(a, p::Done{a.sent});
    }
  }
}

void Agent::EndAttachment(Attachment& a, const Message& last) {
  Connection& c = *a.conn;
  Send(c, a.stream, last);
  if (a.proc) std::erase(a.proc->attachments, &a);
  c.attachments.erase(a.stream);  // destroys a
}

void Agent::ForgetExited() {
  size_t exited = 0;
  for (const auto& e : processes_) exited += e->result.has_value();
  for (auto it = processes_.begin(); exited > options_.max_exited_background && it != processes_.end();) {
    if ((*it)->result && (*it)->attachments.empty()) {
      it = processes_.erase(it);
      --exited;
    } else {
      ++it;
    }
  }
}

void Agent::SendProcessList(Connection& c, uint32_t stream) {
  const auto unix_ms = [](std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  };
  p::Processes batch;
  size_t bytes = 0;
  for (const auto& e : processes_) {
    p::ProcessInfo info{.pid = e->pid,
                        .command = e->command,
                        .background = e->background,
                        .pty = e->pty,
                        .stdin_open = e->in.valid() && !e->stdin_close_pending,
                        .running = !e->result.has_value(),
                        .started_unix_ms = unix_ms(e->started_wall)};
    if (e->result) {
      info.ended_unix_ms = unix_ms(e->ended_wall);
      info.exit = *e->result;
    }
    bytes += 80 + info.command.size();
    batch.processes.push_back(std::move(info));
    if (bytes > (256 << 10)) {
      Send(c, stream, batch);
      batch.processes.clear();
      bytes = 0;
    }
  }
  if (!batch.processes.empty()) Send(c, stream, batch);
  Send(c, stream, p::Done{processes_.size()});
}

void Agent::PumpDownloads(Connection& c) {
  char buf[kReadChunk];
  for (auto it = c.downloads.begin(); it != c.downloads.end();) {
    if (c.pending() > options_.send_high_water) return;
    uint32_t stream = it->first;
    Download& d = it->second;
    size_t want = static_cast<size_t>(std::min<uint64_t>(sizeof buf, d.remaining));
    ssize_t n = want ? RetryEintr([&] { return ::read(d.fd.get(), buf, want); }) : 0;
    if (n < 0) {
      SendError(c, stream, ErrnoError("read", errno));
      it = c.downloads.erase(it);
      continue;
    }
    if (n == 0) {
      Send(c, stream, p::Done{d.sent});
      it = c.downloads.erase(it);
      continue;
    }
    p::AppendDataFrame(c.out, stream, std::string_view(buf, static_cast<size_t>(n)));
    d.sent += static_cast<uint64_t>(n);
    d.remaining -= static_cast<uint64_t>(n);
    ++it;
  }
}

void Agent::HandleFileOp(Connection& c, uint32_t stream, Message& msg) {
  switch (p::TypeOf(msg)) {
    case p::MsgType::kFileWrite: {
      const auto& m = std::get<p::FileWrite>(msg);
      auto fd = files_.OpenForWrite(m.path, m.mode, m.create_parents, m.append);
      if (!fd) return SendError(c, stream, fd.error());
      c.uploads.emplace(stream, Upload{std::move(*fd)});
      return;
    }
    case p::MsgType::kData: {
      Upload& u = c.uploads.at(stream);
      const std::string& data = std::get<p::Data>(msg).data;
      if (auto st = WriteAll(u.fd.get(), data); !st) {
        c.uploads.erase(stream);
        return SendError(c, stream, st.error());
      }
      u.written += data.size();
      return;
    }
    case p::MsgType::kDataEnd: {
      Upload u = std::move(c.uploads.at(stream));
      c.uploads.erase(stream);
      if (::close(u.fd.Release()) < 0) return SendError(c, stream, ErrnoError("close", errno));
      return Send(c, stream, p::Done{u.written});
    }
    case p::MsgType::kFileRead: {
      const auto& m = std::get<p::FileRead>(msg);
      auto fd = files_.OpenForRead(m.path);
      if (!fd) return SendError(c, stream, fd.error());
      if (m.offset && ::lseek(fd->get(), static_cast<off_t>(m.offset), SEEK_SET) < 0) {
        return SendError(c, stream, ErrnoError("seek " + m.path, errno));
      }
      c.downloads.emplace(stream, Download{std::move(*fd), m.length ? m.length : UINT64_MAX});
      return;
    }
    case p::MsgType::kStat: {
      auto info = files_.Stat(std::get<p::Stat>(msg).path);
      if (!info) return SendError(c, stream, info.error());
      return Send(c, stream, p::StatResult{std::move(*info)});
    }
    case p::MsgType::kList: {
      auto entries = files_.List(std::get<p::List>(msg).path);
      if (!entries) return SendError(c, stream, entries.error());
      // Frames of at most ~256 KiB each, well under kMaxPayload.
      p::Entries batch;
      size_t bytes = 0;
      for (auto& e : *entries) {
        bytes += 48 + e.name.size() + e.link_target.size();
        batch.entries.push_back(std::move(e));
        if (bytes > (256 << 10)) {
          Send(c, stream, batch);
          batch.entries.clear();
          bytes = 0;
        }
      }
      if (!batch.entries.empty()) Send(c, stream, batch);
      return Send(c, stream, p::Done{entries->size()});
    }
    case p::MsgType::kRemove: {
      const auto& m = std::get<p::Remove>(msg);
      auto n = files_.Remove(m.path, m.recursive);
      if (!n) return SendError(c, stream, n.error());
      return Send(c, stream, p::Done{*n});
    }
    case p::MsgType::kMkdir: {
      const auto& m = std::get<p::Mkdir>(msg);
      if (auto st = files_.Mkdir(m.path, m.mode, m.parents); !st) {
        return SendError(c, stream, st.error());
      }
      return Send(c, stream, p::Done{0});
    }
    default:
      // ChannelState lets through only what the daemon may send; every such type is handled.
      Panic("unhandled message type " + std::string(p::MsgTypeName(p::TypeOf(msg))));
  }
}

}  // namespace airlock::agent
