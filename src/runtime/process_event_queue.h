#pragma once
// Between an engine's process watch and its sink (Engine::WatchProcesses): a bounded queue and
// the thread that empties it into the sink, so that a slow sink costs events (dropped, counted),
// never the watch's reading (nor a sandbox's waiting). The counts of ProcessEventCounts.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "runtime/engine.h"

namespace airlock::runtime {

class ProcessEventQueue {
 public:
  static constexpr size_t kMaxQueued = 4096;  // events waiting for the sink

  // Starts the thread that calls `sink`, one event at a time.
  explicit ProcessEventQueue(ProcessEventSink sink);
  // Stops and joins it; what still waits is not delivered. Nothing may Push meanwhile or after.
  ~ProcessEventQueue();
  ProcessEventQueue(const ProcessEventQueue&) = delete;
  ProcessEventQueue& operator=(const ProcessEventQueue&) = delete;

  // Queues an event of sandbox `id`, or counts it dropped when the queue is full.
  void Push(const std::string& id, ProcessEvent event);
  // What the watch itself let go: events it saw but could not report (`dropped`), or that its
  // source lost before it saw them (`lost`).
  void CountDropped(uint64_t n = 1) { dropped_ += n; }
  void CountLost(uint64_t n = 1) { lost_ += n; }
  ProcessEventCounters Counts() const { return {reported_.load(), dropped_.load(), lost_.load()}; }

 private:
  void Deliver();

  ProcessEventSink sink_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, ProcessEvent>> queue_;
  bool stopping_ = false;
  std::atomic<uint64_t> reported_{0}, dropped_{0}, lost_{0};
  std::thread thread_;  // last: started once the rest is
};

}  // namespace airlock::runtime
