#include "daemon/server/pool_service.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "common/clock.h"
#include "common/log.h"

namespace airlock::daemon {
namespace {

using store::SandboxRecord;

// What the filler creates with. A request that asks for something else that the engine cannot
// change on a live sandbox takes the cold path.
const runtime::Limits kPoolLimits{};

// Miss reasons, each a label value of airlock_pool_claims_total.
constexpr const char* kMissEmpty = "empty";    // no pooled sandbox was ready
constexpr const char* kMissDisk = "disk";      // the request's disk / tmp / nofile differ
constexpr const char* kMissLimits = "limits";  // the engine refused the request's limits
constexpr const char* kMissEnv = "env";        // the env is too big to send with every command
constexpr const char* kMissEngine = "engine";  // another engine than the pool's was asked for
constexpr const char* kMissError = "error";    // the store or the pooled sandbox failed
constexpr const char* kMissReasons[] = {kMissEmpty, kMissDisk,   kMissLimits,
                                        kMissEnv,   kMissEngine, kMissError};

// A claimed sandbox's env travels with every command (its agent started without it), and a
// command's message is at most protocol::kMaxPayload (1 MiB) with the command's own env in it;
// a bigger sandbox env takes the cold path, where the agent gets it once at start.
constexpr size_t kMaxClaimedEnvBytes = 256 * 1024;

// The filler's pause after an engine error; doubles up to the cap while errors go on.
constexpr auto kFirstBackoff = std::chrono::milliseconds(500);
constexpr auto kMaxBackoff = std::chrono::seconds(30);
// How often an idle filler looks again even when nothing woke it (a pooled sandbox that died
// is noticed by recovery only; this is for sizes that changed without a wake-up).
constexpr auto kIdlePoll = std::chrono::seconds(1);

int64_t DeadlineMs(int64_t ttl_seconds) { return UnixNowMs() + ttl_seconds * 1000; }

}  // namespace

void PoolService::CountMiss(const std::string& template_name, const std::string& reason) {
  std::lock_guard lock(mu_);
  ++pools_[template_name].misses[reason];
}

std::optional<Result<SandboxRecord>> PoolService::Claim(const api::CreateSandboxRequest& request,
                                                        const std::string& template_engine) {
  const std::string& name = request.template_name;
  {
    std::lock_guard lock(mu_);
    auto it = pools_.find(name);
    if (it == pools_.end() || it->second.size == 0) return std::nullopt;  // no pool: no miss
  }
  // The filler makes a template's pool on the engine a create of it without one gets.
  const std::string& pool_engine =
      template_engine.empty() ? engines_.default_name() : template_engine;
  if (!request.engine.empty() && request.engine != pool_engine) {
    CountMiss(name, kMissEngine);
    return std::nullopt;
  }
  // cpus, memory and pids are changed at claim, by an engine that can.
  const bool same_limits = request.limits.cpus == kPoolLimits.cpus &&
                           request.limits.memory_mb == kPoolLimits.memory_mb &&
                           request.limits.pids_max == kPoolLimits.pids_max;
  if (auto engine = engines_.Get(pool_engine);
      !same_limits && engine && !(*engine)->capabilities().live_limits) {
    CountMiss(name, kMissLimits);
    return std::nullopt;
  }
  // The writable layer, /tmp and RLIMIT_NOFILE are fixed when the sandbox is made.
  if (request.limits.disk_mb != kPoolLimits.disk_mb ||
      request.limits.tmp_mb != kPoolLimits.tmp_mb || request.limits.nofile != kPoolLimits.nofile) {
    CountMiss(name, kMissDisk);
    return std::nullopt;
  }
  const std::vector<std::string> env = api::EnvList(request.env);
  size_t env_bytes = 0;
  for (const std::string& kv : env) env_bytes += kv.size() + 1;
  if (env_bytes > kMaxClaimedEnvBytes) {
    CountMiss(name, kMissEnv);
    return std::nullopt;
  }
  // The filler refills the pool (and takes a claimed sandbox's unused link away) once this
  // claim is done, whatever its outcome, so that its work does not slow the claim's own.
  struct WakeFiller {
    PoolService& pools;
    ~WakeFiller() {
      {
        std::lock_guard lock(pools.mu_);
        pools.wake_ = true;
      }
      pools.cv_.notify_all();
    }
  } wake_filler{*this};
  const bool networked = request.network.mode() != net::NetworkMode::kNone;
  bool linked = false;  // the pooled sandbox has a (parked) link
  // One transaction: the record stops being pooled and takes the request's settings, so no
  // other create can have it and a crash after it leaves a normal running sandbox.
  const store::SandboxLimits limits{.cpus = request.limits.cpus,
                                    .memory_mb = static_cast<int64_t>(request.limits.memory_mb),
                                    .pids_max = static_cast<int64_t>(request.limits.pids_max),
                                    .disk_mb = static_cast<int64_t>(request.limits.disk_mb)};
  // The claim is what makes the sandbox count for the tenant: admitted by its quota.
  Result<std::optional<SandboxRecord>> claimed = std::optional<SandboxRecord>();
  auto admitted = quotas_.Admit(request.tenant, limits, [&]() -> Result<bool> {
    claimed = store_.ClaimPooled(name, [&](SandboxRecord& r) {
      r.limits = limits;
      r.env = env;
      r.metadata = request.metadata;
      r.tenant = request.tenant;  // the claimer's from now on
      r.expires_at_ms = DeadlineMs(request.ttl_seconds);
      // Recovery must know that this agent lacks the env and the controller sends it.
      r.resources.try_emplace(kEnvPerCommand, "yes");
      // The record says the network the sandbox has from now on: the request's policy on its
      // link (recovery adopts it with that policy), or none, its link being taken away below
      // (and, should the daemon die first, by the next start's RemoveUnclaimed).
      linked = r.resources.contains(kNetSlot);
      if (networked) {
        r.network = request.network.ToJson().dump();
        const std::vector<net::SecretBinding>& secrets = request.network.secrets();
        r.secrets = secrets.empty() ? "" : net::SecretBindingsToJson(secrets).dump();
      } else {
        r.resources.erase(kNetSlot);
        r.resources.erase(kNetAddress);
        r.resources.erase(kNetAddress6);
      }
    });
    if (!claimed) return false;  // said below
    return claimed->has_value();
  });
  if (!admitted) return Result<SandboxRecord>(std::unexpected(std::move(admitted.error())));
  if (!claimed) {
    spdlog::error("pool {}: claiming: {}", name, claimed.error().message());
    CountMiss(name, kMissError);
    return std::nullopt;
  }
  if (!*claimed) {
    CountMiss(name, kMissEmpty);
    return std::nullopt;
  }
  SandboxRecord& record = **claimed;
  const std::string id = record.id;
  // Gives the sandbox up and sends the create down the cold path.
  auto abandon = [&](const char* reason, const std::string& why) {
    spdlog::warn("pool {}: {} claimed but {}; destroying it", name, id, why);
    if (auto st = lifecycle_.destroy(id); !st) {
      spdlog::error("pool {}: {}", name, st.error().message());
    }
    CountMiss(name, reason);
    return std::nullopt;
  };
  std::shared_ptr<HeldSandbox> live = sandboxes_.Find(id);
  if (!live) return abandon(kMissError, "it is not held by this daemon");
  if (!same_limits) {
    if (auto st = live->engine->UpdateLimits(id, request.limits); !st) {
      return abandon(kMissLimits, st.error().message());
    }
  }
  std::vector<std::string> sandbox_env = env;
  if (networked) {
    // The firewall set of its mode and the policy the proxy and the DNS stub judge it by: one
    // nftables transaction. resolv.conf names its gateway since it was made.
    if (!linked) return abandon(kMissError, "it was made without a network link");
    if (auto st = networks_->Update(id, request.network); !st) {
      return abandon(kMissError, st.error().message());
    }
    // A cold create's agent has HTTP_PROXY and friends from its start; this one's commands
    // carry them (after the request's env, as there).
    if (request.network.mode() == net::NetworkMode::kAllowlist) {
      for (std::string& kv : networks_->ProxyEnv(id)) sandbox_env.push_back(std::move(kv));
    }
    if (!request.network.secrets().empty()) {
      live->SetSecretEnv(net::SecretEnv(request.network.secrets()));
      if (auto st = sandboxes_.TrustEgressCa(id, live, networks_->config().egress_ca_pem); !st) {
        return abandon(kMissError, "installing the egress CA: " + st.error().message());
      }
    }
  } else if (linked) {
    // Mode none: the link goes, taken apart by the filler after the claim (parked until then,
    // it sends nothing; the record names it no more), and resolv.conf stops naming a gateway,
    // as in a cold sandbox without a network.
    {
      std::lock_guard lock(mu_);
      unlink_.push_back(id);
    }
    if (auto st = sandboxes_.WriteHeldFile(id, live, "/etc/resolv.conf", kNoNetworkResolvConf);
        !st) {
      return abandon(kMissError, "rewriting its resolv.conf: " + st.error().message());
    }
  }
  live->SetEnv(std::move(sandbox_env));
  {
    std::lock_guard lock(mu_);
    ++pools_[name].hits;
  }
  spdlog::info("created {} from the {} pool", id, name);
  return Result<SandboxRecord>(std::move(record));
}

Status PoolService::Configure(const std::map<std::string, int>& configured) {
  auto stored = store_.PoolSizes();
  if (!stored) return std::unexpected(stored.error().Wrap("reading pool sizes"));
  std::map<std::string, int64_t> sizes(configured.begin(), configured.end());
  for (const auto& [name, size] : *stored) sizes[name] = size;  // set through the API: it wins
  for (const auto& [name, size] : sizes) {
    if (auto st = lifecycle_.check_template(name); !st) {
      return std::unexpected(st.error().Wrap("pool." + name));
    }
  }
  {
    std::lock_guard lock(mu_);
    // At a reload: a pool the config file sized before and no longer names (nor the API) empties.
    for (const std::string& name : configured_) {
      if (!sizes.contains(name) && pools_.contains(name)) sizes[name] = 0;
    }
    for (const auto& [name, size] : sizes) {
      Pool& pool = pools_[name];
      if (pool.size != size || pool.misses.empty()) spdlog::info("pool {}: size {}", name, size);
      pool.size = size;
      for (const char* reason : kMissReasons) pool.misses.try_emplace(reason, 0);
    }
    configured_.clear();
    for (const auto& [name, size] : configured) configured_.insert(name);
    wake_ = resized_ = true;
  }
  cv_.notify_all();
  return {};
}

Result<PoolStats> PoolService::SetSize(const std::string& template_name, int64_t size) {
  if (auto st = lifecycle_.check_template(template_name); !st) return std::unexpected(st.error());
  if (auto st = store_.SetPoolSize(template_name, size); !st) return std::unexpected(st.error());
  {
    std::lock_guard lock(mu_);
    Pool& pool = pools_[template_name];
    pool.size = size;
    for (const char* reason : kMissReasons) pool.misses.try_emplace(reason, 0);
    wake_ = resized_ = true;
  }
  cv_.notify_all();
  spdlog::info("pool {}: size set to {}", template_name, size);
  auto all = List();
  if (!all) return std::unexpected(all.error());
  for (PoolStats& p : *all) {
    if (p.template_name == template_name) return std::move(p);
  }
  Panic("PoolService::SetSize: the pool just set is missing");
}

Result<std::vector<PoolStats>> PoolService::List() {
  auto ready = store_.CountPooledReady();
  if (!ready) return std::unexpected(ready.error());
  std::vector<PoolStats> out;
  std::lock_guard lock(mu_);
  for (const auto& [name, pool] : pools_) {
    PoolStats p;
    p.template_name = name;
    p.size = pool.size;
    auto it = ready->find(name);
    p.ready = it == ready->end() ? 0 : it->second;
    p.hits = pool.hits;
    p.misses = pool.misses;
    out.push_back(std::move(p));
  }
  return out;
}

Result<bool> PoolService::FillStep() {
  std::map<std::string, int64_t> sizes;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, pool] : pools_) sizes[name] = pool.size;
  }
  auto ready = store_.CountPooledReady();
  if (!ready) return std::unexpected(ready.error());
  // Templates with ready sandboxes but no size (a pool dropped from the config) shrink to 0.
  for (const auto& [name, n] : *ready) sizes.try_emplace(name, 0);
  for (const auto& [name, size] : sizes) {
    auto it = ready->find(name);
    const int64_t have = it == ready->end() ? 0 : it->second;
    if (have > size) {
      auto taken = store_.TakePooledForDestroy(name);
      if (!taken) return std::unexpected(taken.error());
      if (!*taken) continue;  // claimed meanwhile
      const std::string id = (*taken)->id;
      std::shared_ptr<HeldSandbox> live = sandboxes_.Find(id);
      std::unique_lock<std::mutex> lock;
      if (live) lock = std::unique_lock(live->lifecycle_mu);
      if (auto st = lifecycle_.finish_destroy(id); !st) return std::unexpected(st.error());
      return true;
    }
  }
  // Grow after shrinking, and the emptiest pool first, so one busy template does not keep the
  // others empty.
  std::string neediest;
  double fill = 1;
  for (const auto& [name, size] : sizes) {
    auto it = ready->find(name);
    const int64_t have = it == ready->end() ? 0 : it->second;
    if (size > 0 && have < size && static_cast<double>(have) / static_cast<double>(size) < fill) {
      fill = static_cast<double>(have) / static_cast<double>(size);
      neediest = name;
    }
  }
  if (neediest.empty()) return false;
  api::CreateSandboxRequest request;
  request.template_name = neediest;
  request.limits = kPoolLimits;
  auto made = lifecycle_.create_pooled(request);
  if (!made) return std::unexpected(made.error().Wrap("filling the " + neediest + " pool"));
  return true;
}

void PoolService::UnlinkClaimed(std::unique_lock<std::mutex>& lock) {
  std::vector<std::string> ids;
  ids.swap(unlink_);
  lock.unlock();
  for (const std::string& id : ids) lifecycle_.detach_network(id);
  lock.lock();
}

void PoolService::Forget(const std::string& template_name) {
  std::lock_guard lock(mu_);
  pools_.erase(template_name);
}

void PoolService::StartFiller() {
  filler_ = std::thread([this] {
    std::chrono::milliseconds backoff{0};
    std::unique_lock lock(mu_);
    while (!stop_) {
      UnlinkClaimed(lock);
      lock.unlock();
      auto worked = FillStep();
      lock.lock();
      if (!worked) {
        // Logged once per run of errors: an engine that cannot create must not flood the log.
        if (backoff.count() == 0) {
          spdlog::error("pool: {}; retrying with backoff", worked.error().message());
        }
        backoff = std::min<std::chrono::milliseconds>(
            kMaxBackoff, backoff.count() == 0 ? kFirstBackoff : backoff * 2);
        cv_.wait_for(lock, backoff, [this] { return stop_ || resized_ || !unlink_.empty(); });
        resized_ = false;
        continue;
      }
      if (backoff.count() != 0) spdlog::info("pool: working again");
      backoff = std::chrono::milliseconds(0);
      if (!*worked) {
        cv_.wait_for(lock, kIdlePoll, [this] { return stop_ || wake_; });
        wake_ = false;
      }
    }
  });
}

void PoolService::StopFiller() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (filler_.joinable()) filler_.join();
  std::unique_lock lock(mu_);
  UnlinkClaimed(lock);  // what the last claims left it
}

}  // namespace airlock::daemon
