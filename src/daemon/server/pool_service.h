#pragma once
// PoolService: warm pools (docs/design/pools.md). Sandboxes made ahead of time per template, on
// the engine a create of that template gets, hidden from the API until a create claims one and
// gives it the request's settings (limits, env, metadata, tenant, TTL, network policy). The
// filler thread keeps every pool at its size, one create or destroy at a time, with a backoff
// while the engine fails. The sandboxes themselves are made and destroyed by the lifecycle
// (the controller), through the functions it gives.
//
// Owns the pools' sizes and counters, the filler thread and pool_mu_ (which guards them; never
// held across a call to the store, an engine or the lifecycle). Thread-safe.

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "daemon/api/types.h"
#include "daemon/server/metrics.h"
#include "daemon/server/quota_gate.h"
#include "daemon/server/sandbox_table.h"
#include "daemon/store/store.h"
#include "net/networks.h"
#include "runtime/registry.h"

namespace airlock::daemon {

class PoolService {
 public:
  // What the pools need of the lifecycle.
  struct Lifecycle {
    // A cold create of a pooled sandbox (hidden, on failure left destroyed, with a parked link
    // when the daemon has sandbox networking).
    std::function<Result<store::SandboxRecord>(const api::CreateSandboxRequest&)> create_pooled;
    // Tears a sandbox down whose record the pool moved to destroying (its lifecycle lock held).
    std::function<Status(const std::string& id)> finish_destroy;
    // Destroys a pooled or claimed sandbox (a claim that went wrong).
    std::function<Status(const std::string& id)> destroy;
    // Whether sandboxes can be made from a template now (a pool's size names one).
    std::function<Status(const std::string& template_name)> check_template;
    // Takes a sandbox's network link away.
    std::function<void(const std::string& id)> detach_network;
  };

  // All four outlive the service.
  PoolService(store::Store& store, runtime::EngineRegistry& engines, SandboxTable& sandboxes,
              QuotaGate& quotas, Lifecycle lifecycle)
      : store_(store),
        engines_(engines),
        sandboxes_(sandboxes),
        quotas_(quotas),
        lifecycle_(std::move(lifecycle)) {}
  ~PoolService() { StopFiller(); }
  PoolService(const PoolService&) = delete;
  PoolService& operator=(const PoolService&) = delete;

  // Call before the filler starts; nullptr (the default): no sandbox networking.
  void SetNetworks(net::Networks* networks) { networks_ = networks; }

  // After recovery and before serving, and again at each reload: the sizes from the config file,
  // each overridden by the size set through the API (kept in the store); a pool an earlier call
  // sized and this one does not is emptied. kNotFound for a template that does not exist
  // (nothing changes then).
  [[nodiscard]] Status Configure(const std::map<std::string, int>& configured);
  // Sets (and records) a pool's size; the filler grows or shrinks the pool in the background.
  [[nodiscard]] Result<PoolStats> SetSize(const std::string& template_name, int64_t size);
  // Every pool that has a size (0 included), by template.
  [[nodiscard]] Result<std::vector<PoolStats>> List();
  // The template is gone (its pooled sandboxes went with it): its pool goes too.
  void Forget(const std::string& template_name);

  // The warm path of a create of `request` (its template's settings applied; `template_engine`:
  // the engine its template names, "" for the default): a claimed pooled sandbox with the
  // request's settings, or nullopt for the cold path (counted as a miss, by reason, when the
  // template has a pool). The claim is admitted by the tenant's quota (QuotaGate): a refusal
  // is returned as the create's answer (429).
  std::optional<Result<store::SandboxRecord>> Claim(const api::CreateSandboxRequest& request,
                                                    const std::string& template_engine);

  // The filler. Stopped by StopFiller or the destructor.
  void StartFiller();
  void StopFiller();

 private:
  struct Pool {
    int64_t size = 0;
    uint64_t hits = 0;
    std::map<std::string, uint64_t> misses;  // by reason
  };
  // One step of the filler: true when it created or destroyed a sandbox.
  Result<bool> FillStep();
  void CountMiss(const std::string& template_name, const std::string& reason);
  // Detaches the networks of unlink_, with `lock` (on mu_) released meanwhile.
  void UnlinkClaimed(std::unique_lock<std::mutex>& lock);

  store::Store& store_;
  runtime::EngineRegistry& engines_;
  SandboxTable& sandboxes_;
  QuotaGate& quotas_;
  Lifecycle lifecycle_;
  net::Networks* networks_ = nullptr;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Pool> pools_;  // guarded by mu_
  std::set<std::string> configured_;   // the templates the last Configure's file named; mu_
  bool stop_ = false;                  // guarded by mu_
  bool wake_ = false;                  // a claim or resize happened; guarded by mu_
  bool resized_ = false;               // ends an error backoff early; guarded by mu_
  // Sandboxes claimed with network mode none whose parked link the filler takes away (the
  // claim does not wait for it); guarded by mu_.
  std::vector<std::string> unlink_;
  std::thread filler_;
};

}  // namespace airlock::daemon
