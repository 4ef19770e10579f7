// Store: the network verdicts of each sandbox (docs/design/network.md, "Verdicts").

#include "common/ids.h"
#include "daemon/store/store.h"

namespace airlock::store {
namespace {

constexpr std::string_view kEventColumns =
    "seq, at_ms, kind, name, sni, host, dest, port, verdict, rule, reason, bytes_up, bytes_down";

}  // namespace

Status Store::AppendNetworkEvents(std::span<const NetworkEventBatch> batches, int64_t keep) {
  AIRLOCK_CHECK(keep >= 1);
  std::lock_guard lock(mu_);
  auto tx = Transaction::Begin(db_);
  if (!tx) return std::unexpected(std::move(tx.error()));
  auto exists = db_.Prepare("SELECT 1 FROM sandboxes WHERE id = ?");
  auto counters = db_.Prepare(
      "INSERT INTO network_event_counters (sandbox_id, last_seq, dropped, trimmed) "
      "VALUES (?1, 0, 0, 0) ON CONFLICT (sandbox_id) DO NOTHING");
  auto last = db_.Prepare("SELECT last_seq FROM network_event_counters WHERE sandbox_id = ?");
  auto insert = db_.Prepare("INSERT INTO network_events (sandbox_id, " + std::string(kEventColumns) +
                            ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  auto trim = db_.Prepare("DELETE FROM network_events WHERE sandbox_id = ? AND seq <= ?");
  auto update = db_.Prepare(
      "UPDATE network_event_counters SET last_seq = ?2, dropped = dropped + ?3, "
      "trimmed = trimmed + ?4 WHERE sandbox_id = ?1");
  for (auto* stmt : {&exists, &counters, &last, &insert, &trim, &update}) {
    if (!*stmt) return std::unexpected(std::move(stmt->error()));
  }
  for (const NetworkEventBatch& batch : batches) {
    if (auto valid = ValidateSandboxId(batch.sandbox); !valid) return valid;
    if (batch.events.empty() && batch.dropped == 0) continue;
    const std::string what = "recording the network events of " + batch.sandbox;
    exists->Reset();
    exists->Bind(1, batch.sandbox);
    auto found = exists->Step();
    if (!found) return std::unexpected(std::move(found.error()).Wrap(what));
    if (!*found) continue;  // purged since its verdicts were made

    counters->Reset();
    counters->Bind(1, batch.sandbox);
    if (auto st = counters->Run(); !st) return std::unexpected(std::move(st.error()).Wrap(what));
    last->Reset();
    last->Bind(1, batch.sandbox);
    auto row = last->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap(what));
    AIRLOCK_CHECK(*row);  // inserted just above, in this transaction
    int64_t seq = last->ColumnInt(0);

    // Of a batch longer than `keep`, the oldest would be removed at once: they get their
    // numbers but are not written.
    const int64_t count = static_cast<int64_t>(batch.events.size());
    const int64_t skipped = count > keep ? count - keep : 0;
    seq += skipped;
    for (int64_t i = skipped; i < count; ++i) {
      const NetworkEventRecord& e = batch.events[static_cast<size_t>(i)];
      insert->Reset();
      insert->Bind(1, batch.sandbox)
          .Bind(2, ++seq)
          .Bind(3, e.at_ms)
          .Bind(4, e.kind)
          .Bind(5, e.name)
          .Bind(6, e.sni)
          .Bind(7, e.host)
          .Bind(8, e.dest)
          .Bind(9, e.port)
          .Bind(10, e.verdict)
          .Bind(11, e.rule)
          .Bind(12, e.reason)
          .Bind(13, e.bytes_up)
          .Bind(14, e.bytes_down);
      if (auto st = insert->Run(); !st) return std::unexpected(std::move(st.error()).Wrap(what));
    }
    trim->Reset();
    trim->Bind(1, batch.sandbox).Bind(2, seq - keep);
    if (auto st = trim->Run(); !st) return std::unexpected(std::move(st.error()).Wrap(what));
    const int64_t trimmed = db_.Changes() + skipped;
    update->Reset();
    update->Bind(1, batch.sandbox).Bind(2, seq).Bind(3, batch.dropped).Bind(4, trimmed);
    if (auto st = update->Run(); !st) return std::unexpected(std::move(st.error()).Wrap(what));
  }
  return tx->Commit();
}

Result<NetworkEventPage> Store::NetworkEvents(std::string_view id, int64_t after, int64_t limit) {
  auto valid = ValidateSandboxId(id);
  if (!valid) return std::unexpected(std::move(valid.error()));
  AIRLOCK_CHECK(limit >= 1);
  const std::string what = "reading the network events of " + std::string(id);
  // Under the lock no write comes between the page and the counters: they agree.
  std::lock_guard lock(mu_);

  NetworkEventPage page;
  auto stmt = db_.Prepare("SELECT " + std::string(kEventColumns) +
                          " FROM network_events WHERE sandbox_id = ? AND seq > ? ORDER BY seq "
                          "LIMIT ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, id).Bind(2, after).Bind(3, limit + 1);  // one more: are there more?
  while (true) {
    auto row = stmt->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap(what));
    if (!*row) break;
    if (static_cast<int64_t>(page.events.size()) == limit) {
      page.more = true;
      break;
    }
    NetworkEventRecord e;
    e.seq = stmt->ColumnInt(0);
    e.at_ms = stmt->ColumnInt(1);
    e.kind = stmt->ColumnText(2);
    e.name = stmt->ColumnText(3);
    e.sni = stmt->ColumnText(4);
    e.host = stmt->ColumnText(5);
    e.dest = stmt->ColumnText(6);
    e.port = stmt->ColumnInt(7);
    e.verdict = stmt->ColumnText(8);
    e.rule = stmt->ColumnText(9);
    e.reason = stmt->ColumnText(10);
    e.bytes_up = stmt->ColumnInt(11);
    e.bytes_down = stmt->ColumnInt(12);
    page.events.push_back(std::move(e));
  }
  auto counters = db_.Prepare(
      "SELECT last_seq, dropped, trimmed FROM network_event_counters WHERE sandbox_id = ?");
  if (!counters) return std::unexpected(std::move(counters.error()));
  counters->Bind(1, id);
  auto row = counters->Step();
  if (!row) return std::unexpected(std::move(row.error()).Wrap(what));
  if (*row) {
    page.last_seq = counters->ColumnInt(0);
    page.dropped = counters->ColumnInt(1);
    page.trimmed = counters->ColumnInt(2);
  }
  return page;
}

}  // namespace airlock::store
