#pragma once
// ExecService: commands and processes in a sandbox, through its agent (docs/design/processes.md):
// a command run to its end, a command whose events stream as they happen, background processes,
// their table, input, signals, waits and output. It owns no state of its own: every call borrows
// an agent channel from the SandboxTable (which checks that the sandbox is held here and
// running) and gives it back when the agent's stream ended cleanly. Holds no lock across a call
// to the agent. Every method blocks: call them on the worker pool.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "daemon/api/render.h"
#include "daemon/api/types.h"
#include "daemon/server/sandbox_table.h"
#include "protocol/client.h"

namespace airlock::daemon {

// Events read as they happen (a streaming exec, an attachment, a template build). Next() blocks
// (call it on the worker pool) until the next events; dropping the stream before the end closes
// its channel, which ends a command (and detaches from a background process).
class EventStream {
 public:
  virtual ~EventStream() = default;
  // The events that had arrived (one or more, up to about 1 MiB of output), an empty list when
  // nothing happened for a second (the caller may check on its client), nullopt after the last.
  virtual std::optional<std::vector<api::Event>> Next() = 0;
  // The process the events are about (inside the sandbox); 0 for a build.
  virtual int32_t pid() const = 0;
};

// Input to a process the agent started (any of its running ones): stdin, signals, terminal
// size. Holds one agent channel (an attachment); dropping it detaches, the process runs on.
// Calls block briefly (call them on the worker pool). Not thread-safe, but independent of any
// EventStream on the same process, so one thread may read events while another gives input.
class ProcessControl {
 public:
  virtual ~ProcessControl() = default;
  virtual const protocol::Attached& info() const = 0;
  // kFailedPrecondition when the process's stdin is not open (any more).
  virtual Status WriteStdin(std::string_view data) = 0;
  virtual Status CloseStdin() = 0;
  virtual Status Signal(int signo) = 0;
  // kFailedPrecondition without a terminal.
  virtual Status Resize(uint16_t cols, uint16_t rows) = 0;
};

// The API's view of a finished command, and of a process table entry.
api::ExecResultView ToResultView(protocol::ExecResult result);
api::ProcessView ToProcessView(const protocol::ProcessInfo& info);

class ExecService {
 public:
  explicit ExecService(SandboxTable& sandboxes) : sandboxes_(sandboxes) {}

  // Runs one command through the sandbox's agent. Commands in one sandbox run concurrently,
  // each on its own channel.
  [[nodiscard]] Result<protocol::ExecResult> Exec(const std::string& id,
                                                  const api::ExecRequest& request);
  // Starts a command and returns its events (the first is a StartEvent, or an ErrorEvent when
  // the command could not start). Errors before the command exists are returned like Exec's.
  [[nodiscard]] Result<std::unique_ptr<EventStream>> StartExec(const std::string& id,
                                                               const api::ExecRequest& request);

  // Processes. Unknown pids are kNotFound.
  // Starts a background command ("background": true) and returns its entry at once.
  [[nodiscard]] Result<protocol::ProcessInfo> StartBackground(const std::string& id,
                                                              const api::ExecRequest& request);
  [[nodiscard]] Result<std::vector<protocol::ProcessInfo>> ListProcesses(const std::string& id);
  [[nodiscard]] Result<protocol::ProcessInfo> GetProcess(const std::string& id, int32_t pid);
  // Signals the process's group; the entry after.
  [[nodiscard]] Result<protocol::ProcessInfo> SignalProcess(const std::string& id, int32_t pid,
                                                            int signo);
  [[nodiscard]] Result<protocol::ProcessInfo> WriteProcessStdin(const std::string& id, int32_t pid,
                                                                std::string_view data, bool close);
  // Until the process ends or `timeout` passes; the entry either way.
  [[nodiscard]] Result<protocol::ProcessInfo> WaitProcess(const std::string& id, int32_t pid,
                                                          std::chrono::milliseconds timeout);
  // A background process's output as events: the ring's contents (`replay`), then, with
  // `follow`, live output until the exit. Without follow it ends after the replay (the exit
  // first if the process has ended). Dropping the stream detaches; the process runs on.
  [[nodiscard]] Result<std::unique_ptr<EventStream>> AttachOutput(const std::string& id,
                                                                  int32_t pid, bool replay,
                                                                  bool follow);
  [[nodiscard]] Result<std::unique_ptr<ProcessControl>> Control(const std::string& id, int32_t pid);

 private:
  class StreamingExec;
  class AttachedControl;
  // Exec's and StartExec's mapping of an error of the agent about the command.
  Error ExecError(const std::string& id, Error error);
  Error ProcessError(const std::string& id, int32_t pid, Error error);
  // Records the end of a background command started here, the first time a call sees it.
  void NoteEnd(const std::string& id, const protocol::ProcessInfo& info);
  // The entry for `pid` from the agent's table (kNotFound if it has none).
  Result<protocol::ProcessInfo> FindProcess(const std::string& id, AgentChannel& channel,
                                            int32_t pid);
  // Attaches to `pid`, runs `action` on the attachment (which returns the process's end if it
  // saw the stream end with it), detaches; then the entry (the one from before, updated with the
  // end, if the process has left the table: a foreground command does as it ends).
  Result<protocol::ProcessInfo> ControlOnce(
      const std::string& id, int32_t pid,
      const std::function<Result<std::optional<protocol::Exited>>(
          AgentChannel&, uint32_t, const protocol::Attached&)>& action);

  SandboxTable& sandboxes_;
};

}  // namespace airlock::daemon
