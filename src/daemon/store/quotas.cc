// Store: tenant quotas and what a tenant's sandboxes hold (docs/design/tenancy.md, "Quotas").
// The check against them is the daemon's (daemon::QuotaGate); the store keeps the numbers.

#include "daemon/store/store.h"

namespace airlock::store {

Status Store::SetQuota(std::string_view tenant, const TenantQuota& quota) {
  if (auto st = ValidateTenant(tenant); !st) return st;
  if (quota.sandboxes < 0 || quota.cpus < 0 || quota.memory_mb < 0 || quota.disk_mb < 0 ||
      quota.creates_per_minute < 0) {
    return Fail(ErrorCode::kInvalidArgument, "a quota's fields are 0 (unlimited) or more");
  }
  std::lock_guard lock(mu_);
  if (quota.empty()) {
    auto stmt = db_.Prepare("DELETE FROM tenant_quotas WHERE tenant = ?");
    if (!stmt) return std::unexpected(std::move(stmt.error()));
    stmt->Bind(1, tenant);
    return stmt->Run();
  }
  auto stmt = db_.Prepare(
      "INSERT INTO tenant_quotas (tenant, sandboxes, cpus, memory_mb, disk_mb, "
      "creates_per_minute, updated_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) "
      "ON CONFLICT (tenant) DO UPDATE SET sandboxes = ?2, cpus = ?3, memory_mb = ?4, "
      "disk_mb = ?5, creates_per_minute = ?6, updated_at_ms = ?7");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, tenant)
      .Bind(2, quota.sandboxes)
      .Bind(3, quota.cpus)
      .Bind(4, quota.memory_mb)
      .Bind(5, quota.disk_mb)
      .Bind(6, quota.creates_per_minute)
      .Bind(7, options_.now_ms());
  if (auto done = stmt->Run(); !done) {
    return std::unexpected(
        std::move(done.error()).Wrap("storing the quota of " + std::string(tenant)));
  }
  return {};
}

Result<TenantQuota> Store::GetQuota(std::string_view tenant) {
  if (auto st = ValidateTenant(tenant); !st) return std::unexpected(st.error());
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare(
      "SELECT sandboxes, cpus, memory_mb, disk_mb, creates_per_minute FROM tenant_quotas "
      "WHERE tenant = ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, tenant);
  auto row = stmt->Step();
  if (!row) return std::unexpected(std::move(row.error()).Wrap("reading a quota"));
  if (!*row) return TenantQuota{};
  return TenantQuota{.sandboxes = stmt->ColumnInt(0),
                     .cpus = stmt->ColumnDouble(1),
                     .memory_mb = stmt->ColumnInt(2),
                     .disk_mb = stmt->ColumnInt(3),
                     .creates_per_minute = stmt->ColumnInt(4)};
}

Result<TenantUsage> Store::Usage(std::string_view tenant) {
  if (auto st = ValidateTenant(tenant); !st) return std::unexpected(st.error());
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare(
      "SELECT count(*), coalesce(sum(cpus), 0.0), coalesce(sum(memory_mb), 0), "
      "coalesce(sum(disk_mb), 0) FROM sandboxes WHERE tenant = ? AND pooled = 0 AND "
      "state NOT IN ('destroyed', 'failed')");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, tenant);
  auto row = stmt->Step();
  if (!row) return std::unexpected(std::move(row.error()).Wrap("summing a tenant's sandboxes"));
  if (!*row) return TenantUsage{};
  return TenantUsage{.sandboxes = stmt->ColumnInt(0),
                     .cpus = stmt->ColumnDouble(1),
                     .memory_mb = stmt->ColumnInt(2),
                     .disk_mb = stmt->ColumnInt(3)};
}

}  // namespace airlock::store
