#pragma once
// Expiry: the reaper thread. It destroys sandboxes whose TTL has passed (through the lifecycle's
// destroy, so a sandbox goes the same way whoever ends it), purges destroyed records older
// than the retention (with their network verdicts), and runs the lifecycle's sweep (idle
// sandboxes hibernated). Owns its thread and reaper_mu_ (its stop
// flag); holds no lock while it destroys or purges. Thread-safe.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/error.h"
#include "daemon/store/store.h"

namespace airlock::daemon {

class Expiry {
 public:
  using DestroyFn = std::function<Status(const std::string& id)>;
  // `store` outlives the expiry; `destroy` ends one sandbox (Controller::Destroy).
  Expiry(store::Store& store, DestroyFn destroy) : store_(store), destroy_(std::move(destroy)) {}
  ~Expiry() { Stop(); }
  Expiry(const Expiry&) = delete;
  Expiry& operator=(const Expiry&) = delete;

  // How long a destroyed sandbox's record (with its network verdicts) is kept; zero (the
  // default) keeps it for ever. The reaper purges older ones on its first pass and then about
  // once a minute (or once per `keep`, if shorter). Call before Start.
  // How long destroyed records are kept (0: for ever); may change while it runs (a reload).
  void SetDestroyedRetention(std::chrono::seconds keep) { destroyed_keep_s_ = keep.count(); }
  // Also run on every pass, after the reaping (the lifecycle's auto-hibernate). Call before
  // Start.
  void SetSweep(std::function<void()> sweep) { sweep_ = std::move(sweep); }
  // Starts the thread: a pass about every `period` (sandboxes are destroyed within about
  // `period` of their deadline). Stopped by Stop or the destructor.
  void Start(std::chrono::milliseconds period);
  void Stop();
  // One pass (also what the thread runs): the number of sandboxes destroyed.
  int ReapExpired();
  // One purge (also what the thread runs): the number of records removed.
  int64_t PurgeDestroyed();
  // Since start: sandboxes the reaper destroyed, records purged.
  uint64_t expired_total() const { return expired_total_; }
  uint64_t purged_total() const { return purged_total_; }

 private:
  bool Stopping();  // stop_, under mu_

  store::Store& store_;
  DestroyFn destroy_;
  std::function<void()> sweep_;
  std::chrono::seconds destroyed_keep() const { return std::chrono::seconds(destroyed_keep_s_); }
  std::atomic<int64_t> destroyed_keep_s_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
  std::atomic<uint64_t> expired_total_{0};
  std::atomic<uint64_t> purged_total_{0};
};

}  // namespace airlock::daemon
