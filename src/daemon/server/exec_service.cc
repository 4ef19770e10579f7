#include "daemon/server/exec_service.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include <atomic>

#include "common/clock.h"

namespace airlock::daemon {
namespace {

// `sandbox_env` first, so that the request's env wins as it does over the agent's own.
protocol::Exec ToProtocolExec(const api::ExecRequest& request, std::vector<std::string> sandbox_env,
                              std::string sandbox_cwd) {
  protocol::Exec exec;
  if (request.is_shell()) {
    exec.shell = request.cmd;
  } else {
    exec.argv = request.argv;
  }
  exec.cwd = request.cwd.empty() ? std::move(sandbox_cwd) : request.cwd;
  exec.env = std::move(sandbox_env);
  for (std::string& kv : api::EnvList(request.env)) exec.env.push_back(std::move(kv));
  exec.user = request.user;
  exec.stdin_mode = request.stdin_data.empty() && !request.stdin_open ? protocol::StdinMode::kNull
                                                                      : protocol::StdinMode::kPipe;
  exec.timeout_ms =
      std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(request.timeout_seconds * 1000)));
  // A background command has no timeout unless the request gives one.
  if (request.background && !request.timeout_given) exec.timeout_ms = 0;
  exec.background = request.background;
  if (request.pty) {
    exec.pty = true;
    exec.pty_cols = request.pty->cols;
    exec.pty_rows = request.pty->rows;
  }
  return exec;
}

// How long one wait on the agent may be before a silent channel counts as broken.
constexpr auto kForever = std::chrono::hours(24 * 365);

// What an exec.start event keeps of a command line (docs/design/recorder.md).
constexpr size_t kMaxRecordedCommand = 4096;
constexpr size_t kMaxRecordedArgs = 64;

// A number for each command run through the API, so that its exec.start and exec.end pair up:
// unique in this daemon's life, and, starting from the clock, across restarts.
uint64_t NextCommandNumber() {
  static std::atomic<uint64_t> next{static_cast<uint64_t>(UnixNowMs()) * 1000};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// The data of an exec.start event: the command as the request gave it (capped), where and as
// whom it runs, and the names of the variables it sets, never their values.
nlohmann::json StartData(const api::ExecRequest& r, uint64_t command) {
  nlohmann::json data = {{"command", command}};
  bool truncated = false;
  if (r.is_shell()) {
    truncated = r.cmd.size() > kMaxRecordedCommand;
    data["cmd"] = r.cmd.substr(0, kMaxRecordedCommand);
  } else {
    nlohmann::json argv = nlohmann::json::array();
    size_t bytes = 0;
    for (const std::string& arg : r.argv) {
      if (argv.size() == kMaxRecordedArgs || bytes + arg.size() > kMaxRecordedCommand) {
        truncated = true;
        break;
      }
      bytes += arg.size();
      argv.push_back(arg);
    }
    data["argv"] = std::move(argv);
  }
  if (truncated) data["truncated"] = true;
  if (!r.cwd.empty()) data["cwd"] = r.cwd;
  if (!r.user.empty()) data["user"] = r.user;
  if (!r.env.empty()) {
    nlohmann::json names = nlohmann::json::array();
    for (const auto& [name, value] : r.env) names.push_back(name);
    data["env"] = std::move(names);
  }
  if (r.background) data["background"] = true;
  if (r.stream) data["stream"] = true;
  if (r.pty) data["pty"] = true;
  if (!r.stdin_data.empty()) data["stdin_bytes"] = r.stdin_data.size();
  data["timeout_seconds"] = r.timeout_seconds;
  return data;
}

// The output a command sent through the daemon: stdout and stderr bytes.
using OutputBytes = std::pair<uint64_t, uint64_t>;

// The data of an exec.end event; `output` when the output came through the daemon.
nlohmann::json EndData(uint64_t command, int32_t pid, const protocol::Exited& exit,
                       std::optional<OutputBytes> output) {
  nlohmann::json data = {{"command", command},
                         {"pid", pid},
                         {"exit_code", exit.exit_code},
                         {"duration_ms", exit.duration_us / 1000}};
  if (output) {
    data["stdout_bytes"] = output->first;
    data["stderr_bytes"] = output->second;
  }
  if (exit.term_signal != 0) data["signal"] = exit.term_signal;
  if (exit.timed_out) data["timed_out"] = true;
  if (exit.oom_killed) data["oom_killed"] = true;
  if (exit.truncated) data["truncated"] = true;
  return data;
}

nlohmann::json FailedData(uint64_t command, const Error& error) {
  return {{"command", command}, {"error", error.message()}};
}

}  // namespace

api::ExecResultView ToResultView(protocol::ExecResult result) {
  api::ExecResultView view;
  view.exit_code = result.exit.exit_code;
  view.signal = result.exit.term_signal;
  view.stdout_bytes = std::move(result.stdout_data);
  view.stderr_bytes = std::move(result.stderr_data);
  view.duration_ms = result.exit.duration_us / 1000;
  view.timed_out = result.exit.timed_out;
  view.oom_killed = result.exit.oom_killed;
  view.truncated = result.exit.truncated;
  return view;
}

Error ExecService::ExecError(const std::string& id, Error error) {
  error = sandboxes_.Explain(id, std::move(error).Wrap("exec in " + id));
  // The agent's "not found" / "permission denied" are about the command, its cwd or its
  // user, not the sandbox: the caller must change the request (400), not look for the id.
  if (error.code() == ErrorCode::kNotFound || error.code() == ErrorCode::kPermissionDenied) {
    return Error(ErrorCode::kInvalidArgument, error.message());
  }
  return error;
}

Result<protocol::ExecResult> ExecService::Exec(const std::string& id,
                                               const api::ExecRequest& request) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  Recorder& recorder = sandboxes_.recorder();
  const uint64_t command = NextCommandNumber();
  recorder.Record(id, "exec.start", StartData(request, command));
  protocol::Exec exec = ToProtocolExec(request, channel->sandbox_env(), channel->sandbox_cwd());
  // The agent ends the command at its timeout (plus the kill grace); until then it may be
  // silent for as long as it likes.
  (*channel)->set_receive_timeout(std::chrono::milliseconds(exec.timeout_ms) +
                                  std::chrono::seconds(30));
  auto result = (*channel)->Exec(exec, request.stdin_data);
  if (!result) {
    Error error = ExecError(id, std::move(result.error()));
    recorder.Record(id, "exec.end", FailedData(command, error));
    return std::unexpected(std::move(error));
  }
  channel->Keep();
  // The agent counts what it dropped past its cap in the exit's flags; the bytes are what came.
  recorder.Record(id, "exec.end",
                  EndData(command, result->pid, result->exit,
                          OutputBytes(result->stdout_data.size(), result->stderr_data.size())));
  return result;
}

// The events of an exec stream or an attach stream.
class ExecService::StreamingExec : public EventStream {
 public:
  // `command`: the number of the exec.start this stream's end is recorded for (0: an attachment,
  // whose end the process calls record).
  StreamingExec(ExecService& service, std::string id, AgentChannel channel, uint32_t stream,
                std::chrono::milliseconds silence_limit, int32_t pid, api::Event first, bool done,
                uint64_t command = 0)
      : command_(command),
        service_(service),
        id_(std::move(id)),
        channel_(std::move(channel)),
        stream_(stream),
        silence_limit_(silence_limit),
        pid_(pid),
        first_(std::move(first)),
        done_(done) {}

  int32_t pid() const override { return pid_; }

  std::optional<std::vector<api::Event>> Next() override {
    if (first_) {
      std::vector<api::Event> events{std::move(*first_)};
      first_.reset();
      return events;
    }
    if (done_) return std::nullopt;
    // Waits a second at a time, so that the server can check on its client between waits (an
    // empty list sends nothing).
    auto msg = channel_->NextFor(stream_, std::chrono::seconds(1));
    if (!msg && msg.error().code() == ErrorCode::kDeadlineExceeded) {
      silent_ += std::chrono::seconds(1);
      if (silent_ < silence_limit_) return std::vector<api::Event>{};
    }
    silent_ = {};
    std::vector<api::Event> events;
    // Then whatever else has already arrived, up to a bound: one piece (one HTTP chunk, one
    // trip between the worker pool and the IO thread) for many events when output is heavy.
    constexpr size_t kMaxPiece = 1 << 20;
    size_t bytes = 0;
    while (true) {
      bytes += Add(std::move(msg), events);
      if (done_ || bytes >= kMaxPiece) break;
      msg = channel_->NextFor(stream_, std::chrono::milliseconds(0));
      if (!msg && msg.error().code() == ErrorCode::kDeadlineExceeded) break;
    }
    if (events.empty() && done_) return std::nullopt;  // an attachment's end without an event
    return events;
  }

 private:
  // Appends the event for `msg` (or for the failure to read one) to `out`; the output bytes it
  // carries.
  size_t Add(Result<protocol::Message> msg, std::vector<api::Event>& out) {
    if (!msg) {
      done_ = true;
      Error error = service_.ExecError(id_, std::move(msg.error()));
      if (command_) service_.sandboxes_.recorder().Record(id_, "exec.end", FailedData(command_, error));
      out.push_back({api::ErrorEvent{std::move(error)}});
    } else if (auto* output = std::get_if<protocol::Output>(&*msg)) {
      const size_t bytes = output->data.size();
      (output->fd == protocol::OutputFd::kStdout ? stdout_bytes_ : stderr_bytes_) += bytes;
      out.push_back(
          {api::OutputEvent{output->fd == protocol::OutputFd::kStdout, std::move(output->data)}});
      return bytes;
    } else if (auto* dropped = std::get_if<protocol::Dropped>(&*msg)) {
      out.push_back({api::DroppedEvent{dropped->bytes}});
    } else if (auto* exited = std::get_if<protocol::Exited>(&*msg)) {
      done_ = true;
      channel_.Keep();
      if (command_) {
        service_.sandboxes_.recorder().Record(
            id_, "exec.end",
            EndData(command_, pid_, *exited, OutputBytes(stdout_bytes_, stderr_bytes_)));
      }
      out.push_back({api::ExitEvent{ToResultView({.exit = *exited})}});
    } else if (std::holds_alternative<protocol::Done>(*msg)) {  // an attachment's replay ended
      done_ = true;
      channel_.Keep();
    } else if (auto* error = std::get_if<protocol::ErrorMsg>(&*msg)) {
      done_ = true;
      Error e = service_.ExecError(id_, Error(error->code, error->message, error->sys_errno));
      if (command_) service_.sandboxes_.recorder().Record(id_, "exec.end", FailedData(command_, e));
      out.push_back({api::ErrorEvent{std::move(e)}});
    }
    return 0;
  }

  const uint64_t command_;
  uint64_t stdout_bytes_ = 0, stderr_bytes_ = 0;

  ExecService& service_;
  std::string id_;
  AgentChannel channel_;
  uint32_t stream_;
  // The agent ends the command at its timeout; a channel silent for longer than that (plus a
  // margin) is broken.
  std::chrono::milliseconds silence_limit_;
  std::chrono::milliseconds silent_{0};
  int32_t pid_;
  std::optional<api::Event> first_;  // handed over before anything read from the channel
  bool done_;
};

Result<std::unique_ptr<EventStream>> ExecService::StartExec(const std::string& id,
                                                            const api::ExecRequest& request) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  protocol::Exec exec = ToProtocolExec(request, channel->sandbox_env(), channel->sandbox_cwd());
  // A stream holds nothing in the daemon (each piece waits for the client to take the last),
  // so the output is not capped; a plain exec keeps the agent's default cap (16 MiB).
  exec.output_cap = uint64_t{1} << 50;
  const auto silence_limit =
      exec.timeout_ms ? std::chrono::milliseconds(exec.timeout_ms) + std::chrono::seconds(30)
                      : std::chrono::milliseconds(kForever);
  const uint64_t command = NextCommandNumber();
  Recorder& recorder = sandboxes_.recorder();
  recorder.Record(id, "exec.start", StartData(request, command));
  auto failed = [&](Error error) -> Result<std::unique_ptr<EventStream>> {
    error = ExecError(id, std::move(error));
    recorder.Record(id, "exec.end", FailedData(command, error));
    return std::unexpected(std::move(error));
  };
  auto stream = (*channel)->StartExec(exec);
  if (!stream) return failed(std::move(stream.error()));
  if (exec.stdin_mode == protocol::StdinMode::kPipe) {
    const std::string_view in = request.stdin_data;
    for (size_t off = 0; off < in.size(); off += protocol::kMaxChunk) {
      auto st = (*channel)->Send(
          *stream, protocol::StdinData{std::string(in.substr(off, protocol::kMaxChunk))});
      if (!st) return failed(std::move(st.error()));
    }
    if (!request.stdin_open) {
      if (auto st = (*channel)->Send(*stream, protocol::StdinClose{}); !st) {
        return failed(std::move(st.error()));
      }
    }
  }
  // The first answer: the pid, or why the command could not start (an error event, so that the
  // stream still answers 200 like any command that ran and failed).
  auto first = (*channel)->NextFor(*stream);
  if (!first) return failed(std::move(first.error()));
  if (auto* started = std::get_if<protocol::Started>(&*first)) {
    return std::make_unique<StreamingExec>(*this, id, std::move(*channel), *stream, silence_limit,
                                           started->pid, api::Event{api::StartEvent{started->pid}},
                                           false, command);
  }
  if (auto* error = std::get_if<protocol::ErrorMsg>(&*first)) {
    Error e = ExecError(id, Error(error->code, error->message, error->sys_errno));
    recorder.Record(id, "exec.end", FailedData(command, e));
    channel->Keep();
    return std::make_unique<StreamingExec>(*this, id, std::move(*channel), *stream, silence_limit,
                                           0, api::Event{api::ErrorEvent{std::move(e)}}, true);
  }
  return Fail(ErrorCode::kProtocol,
              "the agent answered exec with " +
                  std::string(protocol::MsgTypeName(protocol::TypeOf(*first))));
}

api::ProcessView ToProcessView(const protocol::ProcessInfo& info) {
  api::ProcessView view;
  view.pid = info.pid;
  view.command = info.command;
  view.running = info.running;
  view.background = info.background;
  view.pty = info.pty;
  view.stdin_open = info.stdin_open;
  view.started_at = FromUnixMs(info.started_unix_ms);
  if (!info.running) {
    view.ended_at = FromUnixMs(info.ended_unix_ms);
    view.exit = ToResultView({.exit = info.exit});
  }
  return view;
}

Error ExecService::ProcessError(const std::string& id, int32_t pid, Error error) {
  return sandboxes_.Explain(id,
                            std::move(error).Wrap("process " + std::to_string(pid) + " in " + id));
}

Result<protocol::ProcessInfo> ExecService::FindProcess(const std::string& id, AgentChannel& channel,
                                                       int32_t pid) {
  auto all = channel->ListProcesses();
  if (!all) return std::unexpected(sandboxes_.Explain(id, std::move(all.error())));
  // The running one with this pid, else the latest that had it.
  const protocol::ProcessInfo* found = nullptr;
  for (const auto& p : *all) {
    if (p.pid == pid && (!found || p.running || !found->running)) found = &p;
  }
  if (!found) {
    return Fail(ErrorCode::kNotFound, "no process " + std::to_string(pid) + " in " + id +
                                          " (never started by the API, or forgotten)");
  }
  return *found;
}

Result<protocol::ProcessInfo> ExecService::StartBackground(const std::string& id,
                                                           const api::ExecRequest& request) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  protocol::Exec exec = ToProtocolExec(request, channel->sandbox_env(), channel->sandbox_cwd());
  const uint64_t command = NextCommandNumber();
  Recorder& recorder = sandboxes_.recorder();
  nlohmann::json start = StartData(request, command);
  auto failed = [&](Error error) -> Result<protocol::ProcessInfo> {
    error = ExecError(id, std::move(error));
    recorder.Record(id, "exec.start", std::move(start));
    recorder.Record(id, "exec.end", FailedData(command, error));
    return std::unexpected(std::move(error));
  };
  auto stream = (*channel)->StartExec(exec);
  if (!stream) return failed(std::move(stream.error()));
  auto first = (*channel)->NextFor(*stream);
  if (!first) return failed(std::move(first.error()));
  if (auto* error = std::get_if<protocol::ErrorMsg>(&*first)) {
    return failed(Error(error->code, error->message, error->sys_errno));
  }
  auto* started = std::get_if<protocol::Started>(&*first);
  if (!started) return Fail(ErrorCode::kProtocol, "the agent did not answer exec with started");
  const int32_t pid = started->pid;
  // Its end goes on record when a call first sees it (NoteEnds), keyed by its pid.
  start["pid"] = pid;
  recorder.Record(id, "exec.start", std::move(start));
  channel->held().RememberBackground(pid, command);
  if (!request.stdin_data.empty() ||
      (exec.stdin_mode == protocol::StdinMode::kPipe && !request.stdin_open)) {
    auto attached = (*channel)->Attach({.pid = pid});
    if (!attached) return std::unexpected(ProcessError(id, pid, std::move(attached.error())));
    const uint32_t s = attached->first;
    for (size_t off = 0; off < request.stdin_data.size(); off += protocol::kMaxChunk) {
      auto st = (*channel)->Send(
          s, protocol::StdinData{request.stdin_data.substr(off, protocol::kMaxChunk)});
      if (!st) return std::unexpected(ProcessError(id, pid, std::move(st.error())));
    }
    if (!request.stdin_open) {
      if (auto st = (*channel)->Send(s, protocol::StdinClose{}); !st) {
        return std::unexpected(ProcessError(id, pid, std::move(st.error())));
      }
    }
    if (auto end = (*channel)->Detach(s); !end) {
      return std::unexpected(ProcessError(id, pid, std::move(end.error())));
    }
  }
  auto info = FindProcess(id, *channel, pid);
  if (info) channel->Keep();
  return info;
}

void ExecService::NoteEnd(const std::string& id, const protocol::ProcessInfo& info) {
  if (info.running || !info.background) return;
  std::shared_ptr<HeldSandbox> held = sandboxes_.Find(id);
  if (!held) return;
  if (std::optional<uint64_t> command = held->TakeBackground(info.pid)) {
    // Its output went to the agent's ring, not through the daemon: not counted here.
    sandboxes_.recorder().Record(id, "exec.end",
                                 EndData(*command, info.pid, info.exit, std::nullopt));
  }
}

Result<std::vector<protocol::ProcessInfo>> ExecService::ListProcesses(const std::string& id) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  auto all = (*channel)->ListProcesses();
  if (!all) return std::unexpected(sandboxes_.Explain(id, std::move(all.error())));
  channel->Keep();
  for (const protocol::ProcessInfo& p : *all) NoteEnd(id, p);
  return all;
}

Result<protocol::ProcessInfo> ExecService::GetProcess(const std::string& id, int32_t pid) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  auto info = FindProcess(id, *channel, pid);
  if (info || info.error().code() == ErrorCode::kNotFound) channel->Keep();
  if (info) NoteEnd(id, *info);
  return info;
}

Result<protocol::ProcessInfo> ExecService::ControlOnce(
    const std::string& id, int32_t pid,
    const std::function<Result<std::optional<protocol::Exited>>(
        AgentChannel&, uint32_t, const protocol::Attached&)>& action) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  // The entry as it was, for when the process is gone from the table afterwards (a foreground
  // command leaves it as it ends).
  auto before = FindProcess(id, *channel, pid);
  if (!before) {
    if (before.error().code() == ErrorCode::kNotFound) channel->Keep();
    return before;
  }
  auto attached = (*channel)->Attach({.pid = pid});
  if (!attached) return std::unexpected(ProcessError(id, pid, std::move(attached.error())));
  auto ended = action(*channel, attached->first, attached->second);
  if (!ended) {
    // The attachment may still be open: the channel is not reused.
    return std::unexpected(ProcessError(id, pid, std::move(ended.error())));
  }
  std::optional<protocol::Exited> exited = *ended;
  if (!exited) {
    auto end = (*channel)->Detach(attached->first);
    if (!end) return std::unexpected(ProcessError(id, pid, std::move(end.error())));
    if (auto* e = std::get_if<protocol::Exited>(&*end)) exited = *e;
  }
  auto after = FindProcess(id, *channel, pid);
  if (after || after.error().code() == ErrorCode::kNotFound) channel->Keep();
  if (after) NoteEnd(id, *after);
  if (after || after.error().code() != ErrorCode::kNotFound) return after;
  if (exited) {
    before->running = false;
    before->stdin_open = false;
    before->exit = *exited;
    before->ended_unix_ms = UnixNowMs();
    NoteEnd(id, *before);
  }
  return before;
}

Result<protocol::ProcessInfo> ExecService::SignalProcess(const std::string& id, int32_t pid,
                                                         int signo) {
  // Before the signal (its end may be seen in the same call); only for a sandbox held here.
  if (sandboxes_.Find(id)) {
    sandboxes_.recorder().Record(id, "process.signal", {{"pid", pid}, {"signal", signo}});
  }
  return ControlOnce(id, pid,
                     [&](AgentChannel& channel, uint32_t stream,
                         const protocol::Attached&) -> Result<std::optional<protocol::Exited>> {
                       if (auto st = channel->Send(stream, protocol::Signal{signo}); !st) {
                         return std::unexpected(st.error());
                       }
                       return std::nullopt;
                     });
}

Result<protocol::ProcessInfo> ExecService::WriteProcessStdin(const std::string& id, int32_t pid,
                                                             std::string_view data, bool close) {
  return ControlOnce(
      id, pid,
      [&](AgentChannel& channel, uint32_t stream,
          const protocol::Attached& info) -> Result<std::optional<protocol::Exited>> {
        if (!info.stdin_open) {
          return Fail(ErrorCode::kFailedPrecondition,
                      info.running ? "its stdin is not open (start it with \"stdin_open\": true, "
                                     "or it was closed)"
                                   : "it has exited");
        }
        for (size_t off = 0; off < data.size(); off += protocol::kMaxChunk) {
          auto st = channel->Send(
              stream, protocol::StdinData{std::string(data.substr(off, protocol::kMaxChunk))});
          if (!st) return std::unexpected(st.error());
        }
        if (close) {
          if (auto st = channel->Send(stream, protocol::StdinClose{}); !st) {
            return std::unexpected(st.error());
          }
        }
        return std::nullopt;
      });
}

Result<protocol::ProcessInfo> ExecService::WaitProcess(const std::string& id, int32_t pid,
                                                       std::chrono::milliseconds timeout) {
  return ControlOnce(
      id, pid,
      [&](AgentChannel& channel, uint32_t stream,
          const protocol::Attached& info) -> Result<std::optional<protocol::Exited>> {
        // An attachment to an exited process ends at once with its kExited.
        auto msg =
            channel->NextFor(stream, info.running ? timeout : std::chrono::milliseconds(60000));
        if (!msg && msg.error().code() == ErrorCode::kDeadlineExceeded) {
          return std::nullopt;  // still running
        }
        if (!msg) return std::unexpected(msg.error());
        if (auto* error = std::get_if<protocol::ErrorMsg>(&*msg)) {
          return std::unexpected(protocol::FromErrorMsg(*error));
        }
        auto* exited = std::get_if<protocol::Exited>(&*msg);
        if (!exited) {
          return Fail(ErrorCode::kProtocol,
                      "unexpected " + std::string(protocol::MsgTypeName(protocol::TypeOf(*msg))) +
                          " on an attachment without output");
        }
        return *exited;
      });
}

Result<std::unique_ptr<EventStream>> ExecService::AttachOutput(const std::string& id, int32_t pid,
                                                               bool replay, bool follow) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  auto attached = (*channel)->Attach(
      {.pid = pid,
       .output = replay ? protocol::AttachOutput::kReplay : protocol::AttachOutput::kLive,
       .follow = follow});
  if (!attached) return std::unexpected(ProcessError(id, pid, std::move(attached.error())));
  return std::make_unique<StreamingExec>(*this, id, std::move(*channel), attached->first,
                                         std::chrono::milliseconds(kForever), pid,
                                         api::Event{api::StartEvent{pid}}, false);
}

class ExecService::AttachedControl final : public ProcessControl {
 public:
  AttachedControl(Recorder& recorder, std::string id, AgentChannel channel, uint32_t stream,
                  protocol::Attached info)
      : recorder_(recorder),
        id_(std::move(id)),
        channel_(std::move(channel)),
        stream_(stream),
        info_(info) {}
  const protocol::Attached& info() const override { return info_; }
  Status WriteStdin(std::string_view data) override {
    if (!info_.stdin_open) {
      return Fail(ErrorCode::kFailedPrecondition,
                  "the stdin of process " + std::to_string(info_.pid) + " is not open");
    }
    for (size_t off = 0; off < data.size(); off += protocol::kMaxChunk) {
      auto st = channel_->Send(
          stream_, protocol::StdinData{std::string(data.substr(off, protocol::kMaxChunk))});
      if (!st) return st;
    }
    return {};
  }
  Status CloseStdin() override {
    if (!info_.stdin_open) return {};
    info_.stdin_open = false;
    return channel_->Send(stream_, protocol::StdinClose{});
  }
  Status Signal(int signo) override {
    if (signo < 1 || signo > 64) {
      return Fail(ErrorCode::kInvalidArgument, "signal " + std::to_string(signo) + " is not 1..64");
    }
    recorder_.Record(id_, "process.signal", {{"pid", info_.pid}, {"signal", signo}});
    return channel_->Send(stream_, protocol::Signal{signo});
  }
  Status Resize(uint16_t cols, uint16_t rows) override {
    if (!info_.pty) {
      return Fail(ErrorCode::kFailedPrecondition,
                  "process " + std::to_string(info_.pid) + " has no terminal");
    }
    if (cols == 0 || rows == 0) {
      return Fail(ErrorCode::kInvalidArgument, "terminal size must be non-zero");
    }
    return channel_->Send(stream_, protocol::Resize{rows, cols});
  }

 private:
  Recorder& recorder_;
  std::string id_;
  AgentChannel channel_;  // dropped with the object: closing it detaches
  uint32_t stream_;
  protocol::Attached info_;
};

Result<std::unique_ptr<ProcessControl>> ExecService::Control(const std::string& id, int32_t pid) {
  auto channel = sandboxes_.Acquire(id);
  if (!channel) return std::unexpected(channel.error());
  auto attached = (*channel)->Attach({.pid = pid});
  if (!attached) return std::unexpected(ProcessError(id, pid, std::move(attached.error())));
  return std::make_unique<AttachedControl>(sandboxes_.recorder(), id, std::move(*channel),
                                           attached->first, attached->second);
}

}  // namespace airlock::daemon
