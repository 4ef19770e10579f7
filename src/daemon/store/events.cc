// Store: each sandbox's flight recorder (docs/design/recorder.md) and its network verdicts
// (docs/design/network.md, "Verdicts"): both numbered per sandbox, capped per sandbox, counted.

#include <nlohmann/json.hpp>

#include "common/ids.h"
#include "daemon/store/store.h"

namespace airlock::store {

namespace {

constexpr std::string_view kEvents = "sandbox_events";
constexpr std::string_view kEventCounters = "sandbox_event_counters";
constexpr std::string_view kVerdicts = "network_events";
constexpr std::string_view kVerdictCounters = "network_event_counters";

constexpr std::string_view kVerdictColumns =
    "seq, at_ms, kind, name, sni, host, dest, port, verdict, rule, reason, bytes_up, bytes_down";

// Whether `id` has a record (a batch of one purged meanwhile is skipped).
Result<bool> Exists(Database& db, std::string_view id) {
  auto stmt = db.Prepare("SELECT 1 FROM sandboxes WHERE id = ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, id);
  return stmt->Step();
}

struct Counters {
  int64_t last_seq = 0, dropped = 0, trimmed = 0;
};

Result<Counters> ReadCounters(Database& db, std::string_view table, std::string_view id) {
  auto stmt = db.Prepare("SELECT last_seq, dropped, trimmed FROM " + std::string(table) +
                         " WHERE sandbox_id = ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, id);
  auto row = stmt->Step();
  if (!row) return std::unexpected(std::move(row.error()));
  if (!*row) return Counters{};
  return Counters{stmt->ColumnInt(0), stmt->ColumnInt(1), stmt->ColumnInt(2)};
}

}  // namespace

Status Store::AppendLocked(std::string_view table, std::string_view counters_table,
                           std::string_view sandbox, int64_t count, int64_t dropped, int64_t keep,
                           const std::function<Status(int64_t index, int64_t seq)>& insert) {
  const std::string what = "recording into " + std::string(table) + " for " + std::string(sandbox);
  const std::string counters(counters_table);
  auto add = db_.Prepare("INSERT INTO " + counters +
                         " (sandbox_id, last_seq, dropped, trimmed) VALUES (?1, 0, 0, 0) "
                         "ON CONFLICT (sandbox_id) DO NOTHING");
  if (!add) return std::unexpected(std::move(add.error()));
  add->Bind(1, sandbox);
  if (auto st = add->Run(); !st) return std::unexpected(std::move(st.error()).Wrap(what));
  auto now = ReadCounters(db_, counters, sandbox);
  if (!now) return std::unexpected(std::move(now.error()).Wrap(what));
  int64_t seq = now->last_seq;
  // Of a batch longer than `keep`, the oldest would be removed at once: they get their numbers
  // but are not written.
  const int64_t skipped = count > keep ? count - keep : 0;
  seq += skipped;
  for (int64_t i = skipped; i < count; ++i) {
    if (auto st = insert(i, ++seq); !st) return std::unexpected(std::move(st.error()).Wrap(what));
  }
  auto trim = db_.Prepare("DELETE FROM " + std::string(table) + " WHERE sandbox_id = ? AND seq <= ?");
  if (!trim) return std::unexpected(std::move(trim.error()));
  trim->Bind(1, sandbox).Bind(2, seq - keep);
  if (auto st = trim->Run(); !st) return std::unexpected(std::move(st.error()).Wrap(what));
  const int64_t trimmed = db_.Changes() + skipped;
  auto update = db_.Prepare("UPDATE " + counters +
                            " SET last_seq = ?2, dropped = dropped + ?3, trimmed = trimmed + ?4 "
                            "WHERE sandbox_id = ?1");
  if (!update) return std::unexpected(std::move(update.error()));
  update->Bind(1, sandbox).Bind(2, seq).Bind(3, dropped).Bind(4, trimmed);
  if (auto st = update->Run(); !st) return std::unexpected(std::move(st.error()).Wrap(what));
  return {};
}

namespace {

// Binds one verdict after its sandbox id and seq.
void BindVerdict(Statement& stmt, std::string_view sandbox, int64_t seq,
                 const NetworkEventRecord& e) {
  stmt.Bind(1, sandbox)
      .Bind(2, seq)
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
}

}  // namespace

Status Store::AppendNetworkEvents(std::span<const NetworkEventBatch> batches, int64_t keep) {
  std::vector<EventBatch> converted;
  for (const NetworkEventBatch& b : batches) {
    converted.push_back({.sandbox = b.sandbox, .verdicts = b.events,
                         .verdicts_dropped = b.dropped});
  }
  return AppendEvents(converted, keep, keep);
}

Status Store::AppendEvents(std::span<const EventBatch> batches, int64_t keep,
                           int64_t verdicts_keep) {
  AIRLOCK_CHECK(keep >= 1 && verdicts_keep >= 1);
  std::lock_guard lock(mu_);
  auto tx = Transaction::Begin(db_);
  if (!tx) return std::unexpected(std::move(tx.error()));
  auto insert_event = db_.Prepare(
      "INSERT INTO " + std::string(kEvents) + " (sandbox_id, seq, at_ms, type, data) VALUES (?,?,?,?,?)");
  auto insert_verdict = db_.Prepare("INSERT INTO network_events (sandbox_id, " +
                                    std::string(kVerdictColumns) +
                                    ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  if (!insert_event) return std::unexpected(std::move(insert_event.error()));
  if (!insert_verdict) return std::unexpected(std::move(insert_verdict.error()));
  for (const EventBatch& batch : batches) {
    if (auto valid = ValidateSandboxId(batch.sandbox); !valid) return valid;
    auto found = Exists(db_, batch.sandbox);
    if (!found) return std::unexpected(std::move(found.error()));
    if (!*found) continue;  // purged since its events were made
    if (!batch.verdicts.empty() || batch.verdicts_dropped > 0) {
      auto st = AppendLocked(
          kVerdicts, kVerdictCounters, batch.sandbox, static_cast<int64_t>(batch.verdicts.size()),
          batch.verdicts_dropped, verdicts_keep, [&](int64_t i, int64_t seq) -> Status {
            insert_verdict->Reset();
            BindVerdict(*insert_verdict, batch.sandbox, seq,
                        batch.verdicts[static_cast<size_t>(i)]);
            return insert_verdict->Run();
          });
      if (!st) return st;
    }
    if (batch.events.empty() && batch.dropped == 0) continue;
    // The loss is said in the log, after what this batch brings (a sandbox over its rate, or a
    // full queue, loses what comes after what was queued).
    std::vector<const EventRecord*> events;
    for (const EventRecord& e : batch.events) events.push_back(&e);
    EventRecord lost;
    if (batch.dropped > 0) {
      lost.at_ms = batch.events.empty() ? options_.now_ms() : batch.events.back().at_ms;
      lost.type = "recorder.dropped";
      lost.data = nlohmann::json{{"count", batch.dropped}}.dump();
      events.push_back(&lost);
    }
    auto st = AppendLocked(kEvents, kEventCounters, batch.sandbox, static_cast<int64_t>(events.size()),
                           batch.dropped, keep, [&](int64_t i, int64_t seq) -> Status {
                             const EventRecord& e = *events[static_cast<size_t>(i)];
                             insert_event->Reset();
                             insert_event->Bind(1, batch.sandbox)
                                 .Bind(2, seq)
                                 .Bind(3, e.at_ms)
                                 .Bind(4, e.type)
                                 .Bind(5, e.data);
                             return insert_event->Run();
                           });
    if (!st) return st;
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
  auto stmt = db_.Prepare("SELECT " + std::string(kVerdictColumns) +
                          " FROM network_events WHERE sandbox_id = ? AND seq > ? ORDER BY seq "
                          "LIMIT ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, id).Bind(2, after).Bind(3, limit + 1);  // one more: are there more?
  auto more = stmt->StepPage(limit, [&](const Statement& row) {
    NetworkEventRecord e;
    e.seq = row.ColumnInt(0);
    e.at_ms = row.ColumnInt(1);
    e.kind = row.ColumnText(2);
    e.name = row.ColumnText(3);
    e.sni = row.ColumnText(4);
    e.host = row.ColumnText(5);
    e.dest = row.ColumnText(6);
    e.port = row.ColumnInt(7);
    e.verdict = row.ColumnText(8);
    e.rule = row.ColumnText(9);
    e.reason = row.ColumnText(10);
    e.bytes_up = row.ColumnInt(11);
    e.bytes_down = row.ColumnInt(12);
    page.events.push_back(std::move(e));
  });
  if (!more) return std::unexpected(std::move(more.error()).Wrap(what));
  page.more = *more;
  auto counters = ReadCounters(db_, kVerdictCounters, id);
  if (!counters) return std::unexpected(std::move(counters.error()).Wrap(what));
  page.last_seq = counters->last_seq;
  page.dropped = counters->dropped;
  page.trimmed = counters->trimmed;
  return page;
}

Result<EventPage> Store::Events(std::string_view id, int64_t after,
                                std::span<const std::string> types, int64_t limit) {
  auto valid = ValidateSandboxId(id);
  if (!valid) return std::unexpected(std::move(valid.error()));
  AIRLOCK_CHECK(limit >= 1);
  const std::string what = "reading the events of " + std::string(id);
  std::string sql = "SELECT seq, at_ms, type, data FROM sandbox_events WHERE sandbox_id = ?1 "
                    "AND seq > ?2";
  if (!types.empty()) {
    sql += " AND (";
    for (size_t i = 0; i < types.size(); ++i) {
      // ?4, ?5, ...: the type itself, or what comes before a dot in it.
      const std::string n = std::to_string(i + 4);
      sql += (i ? " OR " : "") + std::string("type = ?") + n + " OR substr(type, 1, length(?" +
             n + ") + 1) = ?" + n + " || '.'";
    }
    sql += ")";
  }
  sql += " ORDER BY seq LIMIT ?3";
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare(sql);
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, id).Bind(2, after).Bind(3, limit + 1);  // one more: are there more?
  for (size_t i = 0; i < types.size(); ++i) stmt->Bind(static_cast<int>(i + 4), types[i]);
  EventPage page;
  auto more = stmt->StepPage(limit, [&](const Statement& row) {
    page.events.push_back({.seq = row.ColumnInt(0),
                           .at_ms = row.ColumnInt(1),
                           .type = row.ColumnText(2),
                           .data = row.ColumnText(3)});
  });
  if (!more) return std::unexpected(std::move(more.error()).Wrap(what));
  page.more = *more;
  auto counters = ReadCounters(db_, kEventCounters, id);
  if (!counters) return std::unexpected(std::move(counters.error()).Wrap(what));
  page.last_seq = counters->last_seq;
  page.dropped = counters->dropped;
  page.trimmed = counters->trimmed;
  return page;
}

}  // namespace airlock::store
