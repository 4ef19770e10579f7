#include "daemon/store/sqlite.h"

#include <utility>

namespace airlock::store {
namespace {

ErrorCode CodeForSqlite(int rc) {
  switch (rc & 0xff) {  // the primary code
    case SQLITE_CONSTRAINT:
      return ErrorCode::kAlreadyExists;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return ErrorCode::kUnavailable;
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return ErrorCode::kResourceExhausted;
    case SQLITE_TOOBIG:
      return ErrorCode::kTooLarge;
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return ErrorCode::kPermissionDenied;
    default:
      return ErrorCode::kInternal;
  }
}

}  // namespace

Error SqliteError(sqlite3* db, int rc, std::string_view what) {
  std::string message(what);
  message += ": ";
  message += db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  message += " (";
  message += sqlite3_errstr(rc);
  message += ", code " + std::to_string(rc) + ")";
  return Error(CodeForSqlite(rc), std::move(message));
}

Result<Database> Database::Open(const std::string& path) {
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &raw,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_FULLMUTEX,
      nullptr);
  Database db(raw);  // sqlite3_open_v2 hands out a handle even on failure; it must be closed
  if (rc != SQLITE_OK) {
    return std::unexpected(SqliteError(raw, rc, "opening database " + path));
  }
  sqlite3_extended_result_codes(raw, 1);
  return db;
}

Status Database::Exec(std::string_view sql, std::string_view what) {
  std::string text(sql);
  int rc = sqlite3_exec(db_.get(), text.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return std::unexpected(SqliteError(db_.get(), rc, what));
  return {};
}

Result<Statement> Database::Prepare(std::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db_.get(), sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return std::unexpected(SqliteError(db_.get(), rc, "preparing statement"));
  }
  return Statement(db_.get(), stmt);
}

Result<std::string> Database::PragmaText(std::string_view pragma) {
  auto stmt = Prepare("PRAGMA " + std::string(pragma));
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  auto row = stmt->Step();
  if (!row) return std::unexpected(std::move(row.error()));
  if (!*row) return std::string();
  return stmt->ColumnText(0);
}

Statement& Statement::Bind(int index, std::string_view text) {
  // SQLITE_TRANSIENT: SQLite copies the bytes, so `text` need not outlive the statement.
  int rc = sqlite3_bind_text64(stmt_.get(), index, text.data(), text.size(), SQLITE_TRANSIENT,
                               SQLITE_UTF8);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

Statement& Statement::Bind(int index, int64_t value) {
  int rc = sqlite3_bind_int64(stmt_.get(), index, value);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

Statement& Statement::Bind(int index, double value) {
  int rc = sqlite3_bind_double(stmt_.get(), index, value);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

Statement& Statement::BindBlob(int index, std::string_view bytes) {
  int rc = sqlite3_bind_blob64(stmt_.get(), index, bytes.data(), bytes.size(), SQLITE_TRANSIENT);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

Result<bool> Statement::Step() {
  if (bind_rc_ != SQLITE_OK) return std::unexpected(SqliteError(db_, bind_rc_, "binding"));
  int rc = sqlite3_step(stmt_.get());
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return std::unexpected(SqliteError(db_, rc, "running statement"));
}

Result<bool> Statement::StepPage(int64_t limit,
                                 const std::function<void(const Statement&)>& read) {
  for (int64_t rows = 0;; ++rows) {
    auto row = Step();
    if (!row) return std::unexpected(std::move(row.error()));
    if (!*row) return false;
    if (rows == limit) return true;
    read(*this);
  }
}

Status Statement::Run() {
  auto row = Step();
  if (!row) return std::unexpected(std::move(row.error()));
  return {};
}

std::string Statement::ColumnText(int col) const {
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt_.get(), col));
  if (text == nullptr) return std::string();
  // The byte count, not strlen: values may hold NUL bytes.
  return std::string(text, static_cast<size_t>(sqlite3_column_bytes(stmt_.get(), col)));
}

std::string Statement::ColumnBlob(int col) const {
  const auto* bytes = static_cast<const char*>(sqlite3_column_blob(stmt_.get(), col));
  if (bytes == nullptr) return std::string();
  return std::string(bytes, static_cast<size_t>(sqlite3_column_bytes(stmt_.get(), col)));
}

Result<Transaction> Transaction::Begin(Database& db) {
  auto begun = db.Exec("BEGIN IMMEDIATE", "beginning transaction");
  if (!begun) return std::unexpected(std::move(begun.error()));
  return Transaction(&db);
}

Transaction::~Transaction() {
  // Nothing to report to: a failed ROLLBACK leaves SQLite to roll back on the next open.
  if (db_ != nullptr) (void)db_->Exec("ROLLBACK", "rolling back");
}

Status Transaction::Commit() {
  auto committed = db_->Exec("COMMIT", "committing");
  if (!committed) return committed;  // the destructor rolls back
  db_ = nullptr;
  return {};
}

}  // namespace airlock::store
