#pragma once
// Metrics: airlockd's counters and latency histograms, rendered in the Prometheus text format
// (version 0.0.4) for GET /metrics. Lock-free on the request path (atomics only).

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace airlock::daemon {

// A cumulative histogram with fixed bucket bounds in seconds.
class Histogram {
 public:
  static constexpr std::array<double, 15> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025,
                                                     0.05,  0.1,    0.25,  0.5,  1,
                                                     2.5,   5,      10,    30,   60};
  void Observe(std::chrono::nanoseconds elapsed);
  // "# TYPE name histogram" and its _bucket / _sum / _count lines, with `labels` ("" or
  // `result="ok"`) on every one.
  void Render(std::string& out, std::string_view name, std::string_view labels) const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};  // the last is +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

// One warm pool at scrape time (the controller's counters and the store's ready count).
struct PoolStats {
  std::string template_name;
  int64_t size = 0;
  int64_t ready = 0;
  uint64_t hits = 0;
  std::map<std::string, uint64_t> misses;  // by reason: empty, disk, env, limits, error
  uint64_t miss_total() const {
    uint64_t n = 0;
    for (const auto& [reason, count] : misses) n += count;
    return n;
  }
};

// airlock_pool_size, airlock_pool_ready and airlock_pool_claims_total, per template.
std::string RenderPoolMetrics(const std::vector<PoolStats>& pools);

// What the network verdict log (recorder.h) has taken since start.
struct VerdictCounts {
  uint64_t allowed = 0, denied = 0, closed = 0;  // queued for the store, by verdict
  uint64_t dropped = 0;  // never stored: the queue was full or the write failed
};

// airlock_network_verdicts_total (by verdict) and airlock_network_verdicts_dropped_total.
std::string RenderVerdictMetrics(const VerdictCounts& counts);

// airlock_events_recorded_total and airlock_events_dropped_total (the flight recorder).
std::string RenderRecorderMetrics(uint64_t recorded, uint64_t dropped);

// The process watches' counts, per engine (those with process_events): the events each gave
// the recorder, dropped (a bound was hit) and lost (before the engine saw them).
struct ProcessWatchCounts {
  uint64_t reported = 0, dropped = 0, lost = 0;
};
// airlock_process_events_total{engine,outcome="reported"|"dropped"|"lost"}.
std::string RenderProcessWatchMetrics(const std::map<std::string, ProcessWatchCounts>& by_engine);

// airlock_secrets: how many secrets are stored, every tenant's (never a name or a value).
std::string RenderSecretMetrics(int64_t stored);

// Totals over a group of sandboxes (one engine's, one tenant's), for /metrics.
struct UsageGroup {
  std::map<std::string, int64_t> sandboxes;  // by state: running, paused, hibernated
  double cpu_seconds_total = 0;  // counter: CPU time used while sampled, since the daemon started
  double cpu_cores = 0;          // gauge: cores in use at the last pass
  int64_t memory_bytes = 0, pids = 0, disk_bytes = 0;  // gauges: the last pass's sums
  uint64_t net_rx_bytes_total = 0, net_tx_bytes_total = 0;  // counters, as cpu_seconds_total
};

struct UsageTotals {
  std::map<std::string, UsageGroup> by_engine, by_tenant;
  uint64_t passes = 0;                 // since start
  double pass_seconds_total = 0;       // time spent in passes
  uint64_t samples_total = 0;          // samples written
};

// Per engine and per tenant (bounded labels: never one per sandbox): airlock_usage_sandboxes,
// airlock_usage_cpu_seconds_total, airlock_usage_cpu_cores, airlock_usage_memory_bytes,
// airlock_usage_pids, airlock_usage_disk_bytes, airlock_usage_network_bytes_total, and the
// sampler's own airlock_metrics_sampling_passes_total / _seconds_total / samples_total.
std::string RenderUsageMetrics(const UsageTotals& totals);

class Metrics {
 public:
  enum class Op { kCreate, kExec, kDestroy, kFiles };

  // One API operation that reached the controller, and how long it took.
  void Observe(Op op, bool ok, std::chrono::nanoseconds elapsed);
  // One HTTP answer: its status, and the error code name when it is an error ("" otherwise).
  void CountReply(unsigned status, std::string_view error_code);
  void SetRecovery(int adopted, int failed, int finished, int orphans);

  // The exposition text. `sandboxes_by_state` comes from the store, `expired_total` and
  // `purged_total` (destroyed records removed) from the controller's reaper, at scrape time.
  std::string Render(const std::map<std::string, int64_t>& sandboxes_by_state,
                     uint64_t expired_total, uint64_t purged_total) const;

 private:
  struct OpStats {
    Histogram ok_latency, error_latency;
    std::atomic<uint64_t> ok{0}, errors{0};
  };
  OpStats& Stats(Op op) { return ops_[static_cast<size_t>(op)]; }

  std::array<OpStats, 4> ops_;
  std::atomic<int64_t> recovery_[4] = {};  // adopted, failed, finished, orphans

  mutable std::mutex mu_;  // the maps below: small, and only touched once per reply
  std::map<unsigned, uint64_t> replies_by_status_;
  std::map<std::string, uint64_t> errors_by_code_;
};

}  // namespace airlock::daemon
