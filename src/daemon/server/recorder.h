#pragma once
// The flight recorder: every sandbox's events on their way to the store (docs/design/recorder.md).
// Whoever sees something happen (the controller, the exec and file services, the egress proxy
// and DNS stubs, the engines' process watchers) hands it to Record or Verdict, which only queue
// it: nobody waits on SQLite. A writer thread commits what is queued in one transaction every
// `interval`, or sooner once `batch` are waiting, and wakes the readers that follow a log.
//
// Everything is bounded. Per sandbox, a token bucket (`rate` a second, `burst` at once) caps what
// it may queue, so that an exec storm or a fork bomb costs it its own record only; the queue is
// capped in all and per sandbox. What does not fit is counted as dropped for its sandbox, and the
// store says so in the log itself (a "recorder.dropped" event) with the next write. Lifecycle
// events ("sandbox.*") are essential: no bucket or cap refuses them (they come one per API call
// at most).
// The store keeps the newest `keep` events per sandbox.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "daemon/server/metrics.h"
#include "daemon/store/store.h"
#include "net/networks.h"
#include "runtime/engine.h"

namespace airlock::daemon {

struct RecorderOptions {
  // Off: Record does nothing (network verdicts are still kept for GET .../network/events). For
  // measuring what the recorder costs (bench/recorder_bench.cc); a daemon records by default.
  bool enabled = true;
  int64_t keep = 100000;         // stored events per sandbox, the newest (>= 1)
  int64_t verdicts_keep = 10000;  // stored network verdicts per sandbox (GET .../network/events)
  double rate = 1000;            // events a second a sandbox may queue, on average
  double burst = 5000;           // ... and at once
  size_t max_queued = 50000;     // events waiting, across sandboxes
  size_t max_queued_per_sandbox = 10000;  // so that one sandbox cannot crowd the others out
  size_t batch = 500;            // this many waiting wakes the writer before `interval`
  std::chrono::milliseconds interval{250};
};

// What the recorder took since start, for /metrics.
struct RecorderCounts {
  uint64_t recorded = 0;  // queued for the store
  uint64_t dropped = 0;   // never stored: over a sandbox's rate, a full queue, a failed write
};

class Recorder {
 public:
  // Starts the writer thread. `store` outlives this.
  explicit Recorder(store::Store& store, RecorderOptions options = {});
  // Writes what is queued, then stops the writer. Nothing may call Record meanwhile or after.
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Queues one event of `sandbox` (type as in recorder.md, data a JSON object), or counts it as
  // dropped. Lifecycle events ("sandbox.*") are the essential ones, and carry "by": the key of
  // the request this thread serves (actor.h), if any. Any thread; holds a mutex only for the
  // push.
  void Record(const std::string& sandbox, std::string type,
              nlohmann::json data = nlohmann::json::object());
  // A network verdict: an event "net.<kind>", and a row of GET .../network/events.
  void Verdict(const std::string& sandbox, const net::NetworkEvent& event);
  // Writes everything queued before the call; returns once it is committed. Any thread.
  [[nodiscard]] Status Flush();
  // Counts of network verdicts queued since start, by verdict (for /metrics).
  VerdictCounts verdicts() const;
  RecorderCounts counts() const;
  // How many writes were committed since start; WaitForWrite blocks until that is more than
  // `seen` or `timeout` passed, and returns it. Followers of a log wait here.
  uint64_t writes() const;
  uint64_t WaitForWrite(uint64_t seen, std::chrono::milliseconds timeout);

 private:
  struct Queued {
    std::string sandbox;
    store::EventRecord event;
    std::optional<store::NetworkEventRecord> verdict;
  };
  struct Bucket {
    double tokens = 0;
    int64_t at_ms = 0;
  };
  // Whether `sandbox` may queue one more (takes a token and a place); counts a drop otherwise.
  // Caller holds mu_.
  bool Admit(const std::string& sandbox, bool essential, bool verdict);
  // Queues `queued` if Admit lets it.
  void Push(Queued queued);
  void Run();

  store::Store& store_;
  const RecorderOptions options_;

  mutable std::mutex mu_;  // guards what follows up to write_mu_
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  std::map<std::string, size_t> queued_;    // per sandbox: how many of queue_ are its
  std::map<std::string, Bucket> buckets_;   // per sandbox that queued lately
  std::map<std::string, int64_t> dropped_;  // per sandbox, not yet stored
  std::map<std::string, int64_t> verdicts_dropped_;  // likewise, the verdicts among them
  VerdictCounts verdicts_;
  RecorderCounts counts_;
  uint64_t writes_ = 0;
  std::condition_variable written_;
  bool stopping_ = false;

  // Held from taking the queue to the commit, so that events are numbered in queue order
  // whoever writes them (the thread or a Flush).
  std::mutex write_mu_;
  std::thread writer_;
};

// A network verdict's fields as GET .../network/events shows them, less seq, time and kind:
// the data of its net.<kind> event, and the rest of the verdicts' page.
nlohmann::json VerdictJson(const store::NetworkEventRecord& verdict);

// Records a process an engine saw start or end inside `sandbox` (Engine::WatchProcesses) as
// proc.exec or proc.exit.
void RecordProcess(Recorder& recorder, const std::string& sandbox,
                   const runtime::ProcessEvent& event);

}  // namespace airlock::daemon
