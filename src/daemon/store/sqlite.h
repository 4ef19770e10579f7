#pragma once
// A thin RAII layer over the SQLite C API: one owned connection, prepared statements that
// finalize themselves, and a transaction guard that rolls back unless committed.
//
// Nothing here is thread-safe on its own; Store serializes every use behind one mutex.
// Every failure becomes an Error whose message names what was being done and SQLite's own
// message, with the code mapped as the API needs it (constraint -> kAlreadyExists, busy ->
// kUnavailable, disk full -> kResourceExhausted, everything else kInternal).

#include <sqlite3.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock::store {

// An Error for a failed SQLite call on `db`: "what: <sqlite message> (<extended code name>)".
Error SqliteError(sqlite3* db, int rc, std::string_view what);

class Statement;

class Database {
 public:
  // Opens (creating if missing) the database file at `path`. Does not follow a symlink.
  [[nodiscard]] static Result<Database> Open(const std::string& path);

  Database(Database&&) noexcept = default;
  Database& operator=(Database&&) noexcept = default;

  sqlite3* get() const { return db_.get(); }

  // Runs one or more statements that return no rows the caller needs.
  [[nodiscard]] Status Exec(std::string_view sql, std::string_view what);
  // Compiles one statement.
  [[nodiscard]] Result<Statement> Prepare(std::string_view sql);
  // A pragma's single value as text ("wal", "ok", "1").
  [[nodiscard]] Result<std::string> PragmaText(std::string_view pragma);
  // Rows changed by the last INSERT / UPDATE / DELETE.
  int64_t Changes() const { return sqlite3_changes64(db_.get()); }

 private:
  struct Closer {
    void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
  };
  explicit Database(sqlite3* db) : db_(db) {}
  std::unique_ptr<sqlite3, Closer> db_;
};

class Statement {
 public:
  Statement(Statement&&) noexcept = default;
  Statement& operator=(Statement&&) noexcept = default;

  // Binds parameter `index` (1-based). Text is bound with its length, so embedded NULs and
  // quotes are stored verbatim: values never become SQL text.
  Statement& Bind(int index, std::string_view text);
  Statement& Bind(int index, int64_t value);
  Statement& Bind(int index, double value);
  // Binds bytes as a BLOB (for a BLOB column of a STRICT table; text would be refused there).
  Statement& BindBlob(int index, std::string_view bytes);

  // Runs one step: true while a row is available, false when the statement is done.
  [[nodiscard]] Result<bool> Step();
  // Runs a statement that returns no rows.
  [[nodiscard]] Status Run();
  // A page of rows: steps a statement bound with LIMIT `limit` + 1, hands each of the first
  // `limit` rows to `read`, and says whether a row came after them (there are more).
  [[nodiscard]] Result<bool> StepPage(int64_t limit,
                                      const std::function<void(const Statement&)>& read);
  // Makes the statement ready to run again, from its first row; bindings stay until rebound.
  void Reset() { sqlite3_reset(stmt_.get()); }

  std::string ColumnText(int col) const;
  // A BLOB column's bytes ("" for NULL or an empty blob).
  std::string ColumnBlob(int col) const;
  int64_t ColumnInt(int col) const { return sqlite3_column_int64(stmt_.get(), col); }
  double ColumnDouble(int col) const { return sqlite3_column_double(stmt_.get(), col); }

 private:
  friend class Database;
  struct Finalizer {
    void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
  };
  Statement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  // The first bind failure (a bug: wrong index or out of memory), reported by Step.
  sqlite3* db_;
  std::unique_ptr<sqlite3_stmt, Finalizer> stmt_;
  int bind_rc_ = SQLITE_OK;
};

// BEGIN IMMEDIATE on construction (takes the write lock up front, so a read-then-write
// transaction can never fail half way with SQLITE_BUSY); ROLLBACK on destruction unless
// Commit() succeeded.
class Transaction {
 public:
  [[nodiscard]] static Result<Transaction> Begin(Database& db);
  Transaction(Transaction&& other) noexcept : db_(std::exchange(other.db_, nullptr)) {}
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction();

  // COMMIT. With synchronous=FULL the commit is on disk when this returns.
  [[nodiscard]] Status Commit();

 private:
  explicit Transaction(Database* db) : db_(db) {}
  Database* db_;
};

}  // namespace airlock::store
