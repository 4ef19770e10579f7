#pragma once
// QuotaGate: tenant quotas (docs/design/tenancy.md, "Quotas"). Every way a sandbox comes to
// count for a tenant (a cold create, a fork, a template build, a pool claim) and every live
// increase of a sandbox's limits passes through it: the check against the tenant's quota and
// the write that makes the sandbox count (its record inserted, claimed or changed) happen under
// one lock, so two creates racing for the last place cannot both pass.
//
// Which sandboxes count: every record of the tenant that is not pooled, destroyed or failed,
// at the limits in its record (every sandbox has limits: the request's, else its template's,
// else the defaults). Creates per minute: a sliding window of the last 60 s per tenant, in
// memory (a restart forgets it).
//
// Refuse() is the one place a refusal is made (kResourceExhausted, 429, saying what is used,
// asked and allowed), for an event log to hook. Thread-safe.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "common/error.h"
#include "daemon/store/store.h"

namespace airlock::daemon {

class QuotaGate {
 public:
  explicit QuotaGate(store::Store& store) : store_(store) {}

  // What makes a sandbox count (insert or claim its record): true when it does now, false when
  // nothing was taken (an empty pool: the create goes on elsewhere and is admitted there).
  using Reserve = std::function<Result<bool>()>;
  // Admits one more sandbox of `limits` for `tenant` and runs `reserve` under the gate's lock;
  // 429 (reserve not run) when it would go over the tenant's quota.
  [[nodiscard]] Status Admit(const std::string& tenant, const store::SandboxLimits& limits,
                             const Reserve& reserve);
  // A live change of a sandbox's limits from `from` to `to`: the increases must fit the quota
  // (decreases always pass); `apply` (engine, then record) runs under the gate's lock.
  [[nodiscard]] Status Change(const std::string& tenant, const store::SandboxLimits& from,
                              const store::SandboxLimits& to, const std::function<Status()>& apply);

  struct TenantState {
    store::TenantQuota quota;
    store::TenantUsage usage;
    int64_t creates_last_minute = 0;
  };
  [[nodiscard]] Result<TenantState> State(const std::string& tenant);

 private:
  // The creates of the last minute (steady ms), older ones dropped. Caller holds mu_.
  std::deque<int64_t>& Window(const std::string& tenant, int64_t now_ms);
  // Whether `usage` plus `asked` fits `quota` (only the kinds `asked` grows are checked).
  Status Fits(const std::string& tenant, const store::TenantQuota& quota,
              const store::TenantUsage& usage, const store::TenantUsage& asked);
  Error Refuse(const std::string& tenant, std::string what);

  store::Store& store_;
  std::mutex mu_;
  std::map<std::string, std::deque<int64_t>> creates_;  // guarded by mu_
};

}  // namespace airlock::daemon
