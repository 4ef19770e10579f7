#pragma once
// The network verdicts of every sandbox on their way to the store (docs/design/network.md,
// "Verdicts"). The egress proxy and the DNS stubs hand each verdict to Add, which only queues
// it: they never wait on SQLite. A writer thread commits what is queued in one transaction
// every `interval`, or sooner once `batch` are waiting. Everything is bounded: the queue (in
// all and per sandbox; a verdict that does not fit is counted as dropped for its sandbox, and
// the count is stored with the next write) and what the store keeps (the newest `keep` per
// sandbox).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "common/error.h"
#include "daemon/server/metrics.h"
#include "daemon/store/store.h"
#include "net/networks.h"

namespace airlock::daemon {

struct NetworkEventLogOptions {
  int64_t keep = 10000;            // stored verdicts per sandbox, the newest (>= 1)
  size_t max_queued = 20000;       // verdicts waiting, across sandboxes
  size_t max_queued_per_sandbox = 5000;  // so that one sandbox cannot crowd the others out
  size_t batch = 500;              // this many waiting wakes the writer before `interval`
  std::chrono::milliseconds interval{250};
};

class NetworkEventLog {
 public:
  // Starts the writer thread. `store` outlives this.
  NetworkEventLog(store::Store& store, NetworkEventLogOptions options = {});
  // Writes what is queued, then stops the writer. Nothing may call Add meanwhile or after.
  ~NetworkEventLog();
  NetworkEventLog(const NetworkEventLog&) = delete;
  NetworkEventLog& operator=(const NetworkEventLog&) = delete;

  // Queues one verdict of `sandbox`, or counts it as dropped when the queue is full. Any
  // thread; holds a mutex only for the push, never waits on the store.
  void Add(const std::string& sandbox, const net::NetworkEvent& event);
  // Writes everything queued before the call; returns once it is committed. Any thread.
  [[nodiscard]] Status Flush();
  // What Add took since start, for /metrics. Any thread.
  VerdictCounts counts() const;

 private:
  void Run();

  store::Store& store_;
  const NetworkEventLogOptions options_;

  mutable std::mutex mu_;  // guards what follows up to write_mu_
  std::condition_variable cv_;
  std::deque<std::pair<std::string, store::NetworkEventRecord>> queue_;
  std::map<std::string, size_t> queued_;    // per sandbox: how many of queue_ are its
  std::map<std::string, int64_t> dropped_;  // per sandbox, not yet stored
  VerdictCounts counts_;
  bool stopping_ = false;

  // Held from taking the queue to the commit, so that verdicts are numbered in queue order
  // whoever writes them (the thread or a Flush).
  std::mutex write_mu_;
  std::thread writer_;
};

}  // namespace airlock::daemon
