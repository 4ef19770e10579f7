#include "daemon/server/quota_gate.h"

#include <algorithm>
#include <cmath>

#include "common/clock.h"
#include "common/log.h"

namespace airlock::daemon {
namespace {

constexpr int64_t kWindowMs = 60'000;

// cpus as the API writes them: 1.5, 2, 0.25 (no trailing zeros).
std::string Cpus(double cpus) { return fmt::format("{:g}", std::round(cpus * 1000) / 1000); }

}  // namespace

std::deque<int64_t>& QuotaGate::Window(const std::string& tenant, int64_t now_ms) {
  std::deque<int64_t>& window = creates_[tenant];
  while (!window.empty() && window.front() <= now_ms - kWindowMs) window.pop_front();
  return window;
}

Error QuotaGate::Refuse(const std::string& tenant, std::string what) {
  Error error(ErrorCode::kResourceExhausted, "tenant " + tenant + ": " + what);
  spdlog::info("quota: {}", error.message());
  return error;
}

Status QuotaGate::Fits(const std::string& tenant, const store::TenantQuota& quota,
                       const store::TenantUsage& usage, const store::TenantUsage& asked) {
  if (quota.sandboxes > 0 && asked.sandboxes > 0 &&
      usage.sandboxes + asked.sandboxes > quota.sandboxes) {
    return std::unexpected(
        Refuse(tenant, fmt::format("sandboxes {} in use + {} asked > quota {}", usage.sandboxes,
                                   asked.sandboxes, quota.sandboxes)));
  }
  // cpus are compared in thousandths, so that 0.1 + 0.2 fits a quota of 0.3.
  auto milli = [](double cpus) { return std::llround(cpus * 1000); };
  if (quota.cpus > 0 && asked.cpus > 0 &&
      milli(usage.cpus) + milli(asked.cpus) > milli(quota.cpus)) {
    return std::unexpected(Refuse(tenant, "cpus " + Cpus(usage.cpus) + " in use + " +
                                              Cpus(asked.cpus) + " asked > quota " +
                                              Cpus(quota.cpus)));
  }
  if (quota.memory_mb > 0 && asked.memory_mb > 0 &&
      usage.memory_mb + asked.memory_mb > quota.memory_mb) {
    return std::unexpected(
        Refuse(tenant, fmt::format("memory {} MiB in use + {} asked > quota {} MiB",
                                   usage.memory_mb, asked.memory_mb, quota.memory_mb)));
  }
  if (quota.disk_mb > 0 && asked.disk_mb > 0 && usage.disk_mb + asked.disk_mb > quota.disk_mb) {
    return std::unexpected(
        Refuse(tenant, fmt::format("disk {} MiB in use + {} asked > quota {} MiB", usage.disk_mb,
                                   asked.disk_mb, quota.disk_mb)));
  }
  return {};
}

Status QuotaGate::Admit(const std::string& tenant, const store::SandboxLimits& limits,
                        const Reserve& reserve) {
  std::lock_guard lock(mu_);
  auto quota = store_.GetQuota(tenant);
  if (!quota) return std::unexpected(quota.error());
  if (quota->empty()) {
    auto took = reserve();
    if (!took) return std::unexpected(took.error());
    return {};
  }
  const int64_t now = SteadyNowMs();
  std::deque<int64_t>& window = Window(tenant, now);
  const int64_t made = static_cast<int64_t>(window.size());
  if (quota->creates_per_minute > 0 && made + 1 > quota->creates_per_minute) {
    return std::unexpected(Refuse(tenant, fmt::format("creates {} in the last minute + 1 asked "
                                                      "> quota {} per minute",
                                                      made, quota->creates_per_minute)));
  }
  auto usage = store_.Usage(tenant);
  if (!usage) return std::unexpected(usage.error());
  const store::TenantUsage asked{.sandboxes = 1,
                                 .cpus = limits.cpus,
                                 .memory_mb = limits.memory_mb,
                                 .disk_mb = limits.disk_mb};
  if (auto st = Fits(tenant, *quota, *usage, asked); !st) return st;
  auto took = reserve();
  if (!took) return std::unexpected(took.error());
  if (*took) window.push_back(now);
  return {};
}

Status QuotaGate::Change(const std::string& tenant, const store::SandboxLimits& from,
                         const store::SandboxLimits& to, const std::function<Status()>& apply) {
  std::lock_guard lock(mu_);
  auto quota = store_.GetQuota(tenant);
  if (!quota) return std::unexpected(quota.error());
  if (!quota->empty()) {
    auto usage = store_.Usage(tenant);
    if (!usage) return std::unexpected(usage.error());
    // Only what grows is asked for; the sandbox's own share is in the usage already.
    const store::TenantUsage asked{.cpus = std::max(0.0, to.cpus - from.cpus),
                                   .memory_mb = std::max<int64_t>(0, to.memory_mb - from.memory_mb),
                                   .disk_mb = std::max<int64_t>(0, to.disk_mb - from.disk_mb)};
    if (auto st = Fits(tenant, *quota, *usage, asked); !st) return st;
  }
  return apply();
}

Result<QuotaGate::TenantState> QuotaGate::State(const std::string& tenant) {
  TenantState state;
  auto quota = store_.GetQuota(tenant);
  if (!quota) return std::unexpected(quota.error());
  auto usage = store_.Usage(tenant);
  if (!usage) return std::unexpected(usage.error());
  state.quota = *quota;
  state.usage = *usage;
  std::lock_guard lock(mu_);
  state.creates_last_minute = static_cast<int64_t>(Window(tenant, SteadyNowMs()).size());
  return state;
}

}  // namespace airlock::daemon
