#pragma once
// gVisor's process events (Capabilities::process_events, docs/design/gvisor.md "Process
// events"). Each sandbox's Sentry reports its processes through runsc's trace points, sent by
// the "remote" sink to a unix socket (SOCK_SEQPACKET) this watch listens on, one per sandbox in
// the sandbox's directory: a connection is its sandbox's by where it was made, never by what it
// says. runsc connects when it starts or restores the sandbox (the session is in the
// --pod-init-config file, SessionConfig) and again when a session is made anew on a running one
// (`runsc trace create`, after a daemon restart).
//
// Points read: container/start (the first process, the agent), sentry/clone (who is whose
// parent), sentry/execve and sentry/exit_notify_parent. An exit is reported for the processes
// whose exec was. Nothing is trusted: a malformed message is counted as lost and skipped, argv is
// capped, and the parents known per sandbox are bounded. The Sentry never waits on this watch:
// what does not fit its socket it drops and counts, and the watch adds that count to `lost`.

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/error.h"
#include "common/unique_fd.h"
#include "runtime/engine.h"
#include "runtime/process_event_queue.h"

namespace airlock::gvisor {

class TraceWatch {
 public:
  static constexpr size_t kMaxTracked = 4096;  // per sandbox: processes whose parent is known
  static constexpr size_t kMaxMessage = 64 * 1024;  // what is read of one message at most

  // Starts the reader thread; `sink` is called on another (ProcessEventQueue) until the watch
  // is gone.
  [[nodiscard]] static Result<std::unique_ptr<TraceWatch>> Start(runtime::ProcessEventSink sink);
  // Stops and joins the thread, closes every socket and removes the listening ones' files.
  ~TraceWatch();
  TraceWatch(const TraceWatch&) = delete;
  TraceWatch& operator=(const TraceWatch&) = delete;

  // Listens at `socket_path` (replacing a file there) for sandbox `id`'s Sentry; from then on
  // reports the processes of whatever connects there. Again for the same id: listens anew.
  Status Add(const std::string& id, const std::string& socket_path);
  // Whether Add listens for sandbox `id`.
  bool Watching(const std::string& id) const;
  // No more of its events: its sockets are closed, the listening one's file removed.
  void Remove(const std::string& id);
  runtime::ProcessEventCounters Counts() const;

  // The trace session runsc is given (--pod-init-config, or `runsc trace create --config`),
  // sending to `socket_path`.
  static std::string SessionConfig(const std::string& socket_path);

 private:
  // A process of a sandbox whose start (clone) or exec was seen, until its exit.
  struct Process {
    int32_t ppid = 0;
    int64_t uid = -1;
    bool reported = false;  // its exec was reported: its exit will be
  };
  struct Box {
    std::string path;
    UniqueFd listener;
    UniqueFd conn;
    bool handshaken = false;
    uint32_t dropped_seen = 0;  // the Sentry's dropped count at the last message
    std::unordered_map<int32_t, Process> processes;  // by pid in the sandbox
  };

  TraceWatch(UniqueFd epoll, UniqueFd stop, runtime::ProcessEventSink sink);
  void Loop();
  // Under mu_.
  void Accept(const std::string& id, Box& box);
  void Read(const std::string& id, Box& box);
  void OnMessage(const std::string& id, Box& box, std::string_view message, bool truncated);
  void Hangup(Box& box);  // closes its connection
  void Close(Box& box);   // ... and its listener, and removes the socket's file

  UniqueFd epoll_;
  UniqueFd stop_;  // an eventfd: readable when the watch is to stop
  runtime::ProcessEventQueue queue_;  // the sink's thread; the counts
  mutable std::mutex mu_;  // guards boxes_ and fds_; held while a message is handled
  std::map<std::string, Box> boxes_;
  std::unordered_map<int, std::string> fds_;  // every fd in epoll_ but stop_, to its sandbox
  std::thread reader_;
};

}  // namespace airlock::gvisor
