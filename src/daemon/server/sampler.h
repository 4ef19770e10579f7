#pragma once
// Sampler: what every live sandbox uses, read every few seconds (docs/design/metrics.md). One
// pass reads the records of the live sandboxes (one query), asks each one's engine for its
// Stats (a few cgroup files and a statfs: no fork), adds its network bytes (the host side of its
// veth), writes every sample in one transaction (the newest `keep` per sandbox stay) and keeps
// the totals per engine and per tenant that /metrics shows. Owns its thread; thread-safe.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "daemon/server/metrics.h"
#include "daemon/server/sandbox_table.h"
#include "daemon/store/store.h"

namespace airlock::daemon {

// Bytes through a sandbox's network: received by the sandbox, sent by it.
struct NetBytes {
  uint64_t rx = 0, tx = 0;
};

class Sampler {
 public:
  using NetBytesFn = std::function<std::optional<NetBytes>(const std::string& sandbox)>;
  // `store` and `table` outlive the sampler; `net` (may be empty): a sandbox's network bytes,
  // nullopt when it has no network.
  Sampler(store::Store& store, SandboxTable& table) : store_(store), table_(table) {}
  ~Sampler() { Stop(); }
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // Call before Start.
  void SetNetBytes(NetBytesFn net) { net_ = std::move(net); }
  // A pass every `interval` (0: never; Sample still works), keeping the newest `keep` samples of
  // each sandbox.
  void Start(std::chrono::milliseconds interval, int64_t keep);
  void Stop();
  // One pass: the number of samples written.
  int Sample();
  int64_t keep() const { return keep_; }
  std::chrono::milliseconds interval() const { return interval_; }
  UsageTotals Totals() const;

 private:
  struct Previous {
    double cpu_seconds = 0;
    int64_t steady_ms = 0;
    NetBytes net;
  };

  store::Store& store_;
  SandboxTable& table_;
  NetBytesFn net_;
  std::chrono::milliseconds interval_{0};
  int64_t keep_ = 720;
  std::mutex pass_mu_;  // one pass at a time (the thread's, a test's); guards previous_
  std::map<std::string, Previous> previous_;
  mutable std::mutex totals_mu_;
  UsageTotals totals_;  // guarded by totals_mu_
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace airlock::daemon
