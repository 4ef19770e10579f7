#pragma once
// The agent's event loop: one thread, one epoll set, every channel, process pipe and signal
// in it. Runs as PID 1 in a sandbox (reaping every zombie, forwarding signals) or as an
// ordinary process in tests. docs/agent.md describes its behaviour for users.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/exec.h"
#include "agent/files.h"
#include "agent/process_tree.h"
#include "common/error.h"
#include "common/unique_fd.h"
#include "protocol/channel_state.h"
#include "protocol/frame_decoder.h"
#include "protocol/messages.h"

namespace airlock::agent {

struct AgentOptions {
  std::string file_root = "/";  // file operations are confined below this directory
  ExecDefaults exec;
  uint64_t default_output_cap = 16 << 20;  // stdout + stderr bytes delivered per exec
  uint32_t default_kill_grace_ms = 1000;   // SIGTERM -> SIGKILL on timeout and shutdown
  uint32_t linger_ms = 200;           // after the command exits, how long a background process that
                                      // kept its stdout open may hold up the result
  size_t send_high_water = 4 << 20;   // stop reading process output above this much unsent
  size_t send_low_water = 1 << 20;    // and start again below this
  size_t stdin_buffer_cap = 1 << 20;  // stop reading the channel while a stdin buffer is fuller
  uint32_t default_ring_bytes = 1 << 20;  // recent output kept per background process
  size_t max_exited_background = 64;      // exited background processes remembered
};

// The recent output of a background process: a window of the byte sequence it wrote (stdout
// and stderr interleaved in the order the agent read them), addressed by absolute offsets.
// Appending past the capacity forgets the oldest bytes.
class OutputRing {
 public:
  explicit OutputRing(size_t capacity) : capacity_(capacity) {}
  void Append(protocol::OutputFd fd, std::string_view data);
  uint64_t start() const { return start_; }  // the oldest offset still held
  uint64_t end() const { return end_; }      // one past the newest
  // Up to `max` bytes from `offset` (start() <= offset < end()), all from one fd.
  std::pair<protocol::OutputFd, std::string_view> Read(uint64_t offset, size_t max) const;

 private:
  struct Chunk {
    uint64_t offset;
    protocol::OutputFd fd;
    std::string data;
  };
  size_t capacity_;
  std::deque<Chunk> chunks_;
  std::string spare_;  // a dropped chunk's buffer, for the next chunk
  uint64_t start_ = 0, end_ = 0;
};

class Agent {
 public:
  static Result<std::unique_ptr<Agent>> Create(AgentOptions options);
  ~Agent();

  // Serves a connected stream socket (or any bidirectional fd). Without a listener the agent
  // exits once its last channel closes.
  [[nodiscard]] Status AddChannel(UniqueFd fd);
  // Accepts channels on a unix socket at `path` until shutdown.
  [[nodiscard]] Status Listen(const std::string& path);
  // Accepts channels on an inherited listening socket (bound by whoever started the agent; the
  // jail binds it on the host side, outside the sandbox's view). Not unlinked at exit.
  [[nodiscard]] Status ListenOn(UniqueFd fd);
  // Runs the loop until shutdown (SIGTERM or SIGINT, or the last channel gone without a
  // listener). Returns the process exit code.
  int Run();

 private:
  // Accepts channels on `fd`, a socket that listens.
  Status Serve(UniqueFd fd);

  struct Connection;
  struct ExecState;
  struct Attachment;
  struct Watch {
    enum Kind { kSignal, kListen, kChannel, kStdout, kStderr, kStdin } kind;
    Connection* conn = nullptr;
    ExecState* exec = nullptr;
  };
  using Clock = std::chrono::steady_clock;

  // A process the agent started: foreground (its output goes to the exec stream of `conn`, and
  // it dies with that channel) or background (owned by the agent, output into `ring`).
  struct ExecState {
    Connection* conn = nullptr;  // the owning channel; nullptr for a background process
    uint32_t stream = 0;
    pid_t pid;
    bool pty;
    bool background = false;
    std::string command;  // for listings
    std::chrono::system_clock::time_point started_wall, ended_wall;
    std::optional<OutputRing> ring;          // background only
    std::optional<protocol::Exited> result;  // set once finished (background: kept for listing)
    std::vector<Attachment*> attachments;
    UniqueFd in, out, err;
    UniqueFd pty_master;  // held after output ended, until the command is reaped
    Watch in_watch{Watch::kStdin}, out_watch{Watch::kStdout}, err_watch{Watch::kStderr};
    std::string stdin_buf;
    bool stdin_close_pending = false;
    bool pty_mid_line = false;  // the last byte typed into the terminal did not end a line
    bool eof_typed = false;     // the EOF character is queued for the terminal
    bool exited = false;
    int wait_status = 0;
    Clock::time_point started, ended;
    std::optional<Clock::time_point> deadline, kill_at, linger_until;
    uint64_t cap = 0, delivered = 0, stdout_bytes = 0, stderr_bytes = 0;
    uint32_t kill_grace_ms = 0;
    bool truncated = false, timed_out = false, oom_killed = false;
    std::vector<ProcId> doomed;  // the tree as it was when SIGTERM went out
    // Their sessions. What a process forks as it exits on SIGTERM is handed to the agent, out
    // of the tree, but stays in its session.
    std::vector<pid_t> doomed_sessions;
  };

  // A stream attached to a process (protocol::Attach): control, and for background processes
  // a cursor into its output ring.
  struct Attachment {
    Connection* conn;
    uint32_t stream;
    ExecState* proc;
    bool output = false;  // sends the ring's bytes from `cursor`
    bool follow = true;
    uint64_t cursor = 0;
    std::optional<uint64_t> stop_at;  // without follow: the ring's end when attached
    uint64_t sent = 0;
  };

  struct Download {
    UniqueFd fd;
    uint64_t remaining;
    uint64_t sent = 0;
  };
  struct Upload {
    UniqueFd fd;
    uint64_t written = 0;
  };

  struct Connection {
    UniqueFd fd;
    Watch watch{Watch::kChannel};
    protocol::FrameDecoder decoder;
    protocol::ChannelState state{protocol::Role::kAgent};
    std::string out;
    size_t out_pos = 0;
    uint32_t epoll_events = 0;
    bool output_paused = false;
    bool closing = false;  // a fatal error was queued: stop reading, close once flushed
    std::map<uint32_t, ExecState*> execs;  // its foreground processes, by stream
    std::map<uint32_t, std::unique_ptr<Attachment>> attachments;
    std::map<uint32_t, Upload> uploads;
    std::map<uint32_t, Download> downloads;
    size_t pending() const { return out.size() - out_pos; }
  };

  explicit Agent(AgentOptions options, FileRoot root)
      : options_(std::move(options)), files_(std::move(root)) {}
  Status Init();

  void OnSignal();
  void OnAccept();
  void OnChannelReadable(Connection& c);
  void OnChannelWritable(Connection& c);
  void OnOutput(ExecState& e, bool is_stderr);
  // One read of a command's output: 1 = got data, 0 = end (closed), -1 = nothing now.
  int ReadOutputOnce(ExecState& e, bool is_stderr);
  void OnStdinWritable(ExecState& e);
  void ReapChildren();
  void OnTimers(Clock::time_point now);
  void PumpDownloads(Connection& c);
  // Sends what attachments of `c` have not yet sent of their rings, and their ends.
  void PumpAttachments(Connection& c);
  bool AttachmentHasWork(const Attachment& a) const;
  void EndAttachment(Attachment& a, const protocol::Message& last);
  void StartAttach(Connection& c, uint32_t stream, const protocol::Attach& req);
  void SendProcessList(Connection& c, uint32_t stream);
  // protocol::Quiesce: every channel and the listener closed, then waiting for the wake file.
  void Quiesce(Connection& c, uint32_t stream, const protocol::Quiesce& req);
  // While quiesced: listens again once the wake file is there.
  void CheckWake();
  // The process a stream of `c` controls (its exec or attachment), or nullptr.
  ExecState* ProcessFor(Connection& c, uint32_t stream);
  ExecState* FindRunning(pid_t pid);
  // Forgets the oldest exited background processes past the limit (not while attached).
  void ForgetExited();

  void HandleFrame(Connection& c, protocol::Frame frame);
  void StartExec(Connection& c, uint32_t stream, const protocol::Exec& req);
  void WriteStdin(ExecState& e);
  void HandleFileOp(Connection& c, uint32_t stream, protocol::Message& msg);

  void Send(Connection& c, uint32_t stream, const protocol::Message& msg);
  void SendError(Connection& c, uint32_t stream, const Error& error);
  void ProtocolError(Connection& c, const Error& error);
  void Flush(Connection& c);
  void UpdateConnection(Connection& c);
  void CloseConnection(Connection& c);

  void CloseOutput(ExecState& e, bool is_stderr);
  void DrainOutput(ExecState& e);
  void BeginKill(ExecState& e, Clock::time_point now);
  void FinishKill(ExecState& e);
  void MaybeFinish(ExecState& e);
  void DropExec(ExecState& e);  // kills the tree, sending nothing (the caller forgets it)
  void RemoveProcess(ExecState& e);  // out of the table, its attachments ended
  void BeginShutdown();

  void AddWatch(int fd, Watch* w, uint32_t events);
  void ModWatch(int fd, Watch* w, uint32_t events);
  void DelWatch(int fd);
  int NextTimeoutMs(Clock::time_point now) const;

  AgentOptions options_;
  FileRoot files_;
  UniqueFd epoll_;
  UniqueFd signal_fd_;
  UniqueFd listen_fd_;
  std::string listen_path_;
  Watch signal_watch_{Watch::kSignal};
  Watch listen_watch_{Watch::kListen};
  std::vector<std::unique_ptr<Connection>> connections_;
  // Every process the agent started that is running, and the exited background ones it still
  // remembers, in the order they started.
  std::vector<std::unique_ptr<ExecState>> processes_;
  bool shutting_down_ = false;
  // Set while quiesced: the file whose appearance ends it (the sandbox was restored).
  std::string wake_path_;
  std::optional<Clock::time_point> shutdown_deadline_;
  uint64_t oom_kills_seen_ = 0;
};

// The kernel's count of OOM kills in the agent's own memory cgroup (v2 memory.events or v1
// memory.oom_control), 0 when it cannot be read.
uint64_t ReadOomKillCount();

}  // namespace airlock::agent
