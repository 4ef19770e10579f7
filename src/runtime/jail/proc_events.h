#pragma once
// The jail's process events (Capabilities::process_events, docs/design/jail.md "Process
// events"): the kernel's process events connector (netlink, CN_IDX_PROC) tells of every exec and
// exit on the host; a process is the sandbox's when it is in the sandbox's pid namespace (the
// jail's seccomp policy refuses new pid namespaces, so a sandbox's processes are all in its own),
// and it is looked at in /proc at once: its argv, effective uid, pid and parent as the sandbox
// sees them.
//
// Bounded: the events waiting for the sink (runtime::ProcessEventQueue), the processes whose
// exit is awaited and those that vanished before they were looked at; beyond a bound events are
// dropped and counted. The sink runs on a thread of its own, so a slow sink makes the watch drop,
// never the kernel (nor the sandbox) wait.

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/error.h"
#include "common/unique_fd.h"
#include "runtime/engine.h"
#include "runtime/process_event_queue.h"

namespace airlock::jail {

class ProcessWatch {
 public:
  static constexpr size_t kMaxTracked = 16384;   // processes whose exit is awaited
  static constexpr size_t kMaxVanished = 1024;   // execs gone before they were looked at

  // Subscribes and checks that the kernel took the subscription: "" when it did, else why not
  // (the connector needs CAP_NET_ADMIN in the initial user, pid and network namespaces).
  static std::string CanSubscribe();
  // Subscribes and starts the threads; `sink` is called on one of them until the watch is gone.
  [[nodiscard]] static Result<std::unique_ptr<ProcessWatch>> Start(runtime::ProcessEventSink sink);
  // Stops and joins both threads, unsubscribes and closes the socket.
  ~ProcessWatch();
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  // Reports the processes of sandbox `id` from now on: those in the pid namespace of `init_pid`
  // (its PID 1, on the host), whose ids 0..65535 are uid_base.. on the host.
  Status Add(const std::string& id, pid_t init_pid, uid_t uid_base);
  // No more of its events (not even the exits of its processes, which its destroy kills).
  void Remove(const std::string& id);
  runtime::ProcessEventCounters Counts() const;

 private:
  // A sandbox as the watch knows it.
  struct Box {
    std::string id;
    std::pair<uint64_t, uint64_t> pidns;  // dev, inode of its pid namespace
    size_t level = 0;  // NSpid fields of a process in it: the last is the sandbox's pid
    uid_t uid_base = 0;
  };
  // A process whose exec was reported, until its exit.
  struct Tracked {
    std::string id;
    int64_t pid = 0;
    int64_t ppid = 0;
    int64_t uid = -1;
  };

  ProcessWatch(UniqueFd socket, UniqueFd stop, runtime::ProcessEventSink sink);
  void ReadLoop();
  // What one proc_event (its bytes) means for the sandboxes.
  void OnEvent(const void* data, size_t size);
  void OnExec(pid_t tgid, int64_t at_ms);
  void OnExit(pid_t tgid, pid_t parent_tgid, uint32_t exit_code, int64_t at_ms);
  // The sandbox whose pid namespace `pid` (on the host) is in, if any.
  std::optional<Box> BoxOf(pid_t pid) const;
  // The sandbox of pid namespace `pidns` (dev, inode), if any.
  std::optional<Box> BoxIn(const std::pair<uint64_t, uint64_t>& pidns) const;
  bool Held(const std::string& id) const;
  // Drops tracked processes that no longer exist (after events were lost, or when full).
  void Prune();

  UniqueFd socket_;
  UniqueFd stop_;  // an eventfd: readable when the watch is to stop
  std::atomic<bool> stop_requested_{false};
  mutable std::mutex boxes_mu_;
  std::map<std::string, Box> boxes_;

  // The reader thread's own.
  std::unordered_map<pid_t, Tracked> tracked_;
  std::unordered_map<pid_t, int64_t> vanished_;  // host pid -> when its exec was seen

  runtime::ProcessEventQueue queue_;
  std::thread reader_;
};

// Splits /proc/PID/cmdline's bytes into an argv, capped at ProcessEvent::kMaxArgs arguments
// and kMaxArgvBytes bytes (the cut argument keeps what fits); `more` says the bytes given are
// only the start of the file.
void ParseCmdline(std::string_view bytes, bool more, runtime::ProcessEvent& event);

}  // namespace airlock::jail
