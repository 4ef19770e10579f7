// Store: what each sandbox used, sampled by the daemon (docs/design/metrics.md).

#include <algorithm>

#include "common/ids.h"
#include "daemon/store/store.h"

namespace airlock::store {
namespace {

constexpr std::string_view kSampleColumns =
    "at_ms, cpu_seconds, cpu_cores, memory_bytes, memory_peak_bytes, pids, disk_bytes, "
    "net_rx_bytes, net_tx_bytes";

}  // namespace

Status Store::AppendMetrics(std::span<const std::pair<std::string, MetricSample>> samples,
                            int64_t keep) {
  AIRLOCK_CHECK(keep >= 1);
  std::lock_guard lock(mu_);
  auto tx = Transaction::Begin(db_);
  if (!tx) return std::unexpected(std::move(tx.error()));
  // Only for a sandbox that still has a record: INSERT ... SELECT ... WHERE EXISTS.
  auto insert = db_.Prepare("INSERT OR REPLACE INTO sandbox_metrics (sandbox_id, " +
                            std::string(kSampleColumns) +
                            ") SELECT ?1,?2,?3,?4,?5,?6,?7,?8,?9,?10 WHERE EXISTS "
                            "(SELECT 1 FROM sandboxes WHERE id = ?1)");
  // Everything older than the newest `keep`.
  auto trim = db_.Prepare(
      "DELETE FROM sandbox_metrics WHERE sandbox_id = ?1 AND at_ms <= (SELECT at_ms FROM "
      "sandbox_metrics WHERE sandbox_id = ?1 ORDER BY at_ms DESC LIMIT 1 OFFSET ?2)");
  for (auto* stmt : {&insert, &trim}) {
    if (!*stmt) return std::unexpected(std::move(stmt->error()));
  }
  for (const auto& [sandbox, m] : samples) {
    if (auto valid = ValidateSandboxId(sandbox); !valid) return valid;
    const std::string what = "recording the metrics of " + sandbox;
    insert->Reset();
    insert->Bind(1, sandbox)
        .Bind(2, m.at_ms)
        .Bind(3, m.cpu_seconds)
        .Bind(4, m.cpu_cores)
        .Bind(5, m.memory_bytes)
        .Bind(6, m.memory_peak_bytes)
        .Bind(7, m.pids)
        .Bind(8, m.disk_bytes)
        .Bind(9, m.net_rx_bytes)
        .Bind(10, m.net_tx_bytes);
    if (auto st = insert->Run(); !st) return std::unexpected(std::move(st.error()).Wrap(what));
    if (db_.Changes() == 0) continue;  // no record
    trim->Reset();
    trim->Bind(1, sandbox).Bind(2, keep);
    if (auto st = trim->Run(); !st) return std::unexpected(std::move(st.error()).Wrap(what));
  }
  return tx->Commit();
}

Result<MetricPage> Store::Metrics(std::string_view id, int64_t start_ms, int64_t end_ms,
                                  int64_t limit) {
  if (auto valid = ValidateSandboxId(id); !valid) return std::unexpected(std::move(valid.error()));
  AIRLOCK_CHECK(limit >= 1);
  std::lock_guard lock(mu_);
  // Newest first, one more than asked (are there older ones?), then turned around.
  auto stmt = db_.Prepare("SELECT " + std::string(kSampleColumns) +
                          " FROM sandbox_metrics WHERE sandbox_id = ? AND at_ms >= ? AND "
                          "at_ms <= ? ORDER BY at_ms DESC LIMIT ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, id).Bind(2, start_ms).Bind(3, end_ms).Bind(4, limit + 1);
  MetricPage page;
  auto more = stmt->StepPage(limit, [&](const Statement& row) {
    MetricSample m;
    m.at_ms = row.ColumnInt(0);
    m.cpu_seconds = row.ColumnDouble(1);
    m.cpu_cores = row.ColumnDouble(2);
    m.memory_bytes = row.ColumnInt(3);
    m.memory_peak_bytes = row.ColumnInt(4);
    m.pids = row.ColumnInt(5);
    m.disk_bytes = row.ColumnInt(6);
    m.net_rx_bytes = row.ColumnInt(7);
    m.net_tx_bytes = row.ColumnInt(8);
    page.samples.push_back(m);
  });
  if (!more) {
    return std::unexpected(std::move(more.error()).Wrap("reading the metrics of " + std::string(id)));
  }
  page.truncated = *more;
  std::reverse(page.samples.begin(), page.samples.end());
  return page;
}

}  // namespace airlock::store
