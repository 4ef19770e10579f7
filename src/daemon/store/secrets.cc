// Store: each tenant's secrets, sealed (docs/design/secrets-store.md). The store keeps what
// daemon::SecretStore gives it (ciphertext, nonce, the sealing key's id) and numbers the
// versions; it never sees a value in clear, so nothing here can put one in a message.

#include "daemon/store/store.h"

namespace airlock::store {
namespace {

constexpr size_t kMaxSecretNameBytes = 128;
constexpr std::string_view kSecretColumns =
    "tenant, name, ciphertext, nonce, key_id, version, created_at_ms, updated_at_ms";

Error SecretNotFound(std::string_view name) {
  return Error(ErrorCode::kNotFound, "secret '" + std::string(name) + "' does not exist");
}

Status ValidateKey(std::string_view tenant, std::string_view name) {
  if (auto st = ValidateTenant(tenant); !st) return st;
  return ValidateSecretName(name);
}

// What the table's CHECKs ask of a sealed value, checked first so that a constraint error on
// insert can only mean the name is taken. A failure is a bug in the caller, not bad input.
Status ValidateSealed(const SecretRecord& r) {
  if (auto st = ValidateKey(r.tenant, r.name); !st) return st;
  if (r.nonce.size() != 12 || r.ciphertext.size() <= 16 || r.key_id.empty()) {
    return Fail(ErrorCode::kInternal, "secret " + r.name + ": not a sealed value (nonce of " +
                                          std::to_string(r.nonce.size()) + " bytes, " +
                                          std::to_string(r.ciphertext.size()) +
                                          " bytes of ciphertext and tag)");
  }
  return {};
}

// Reads a row selected with kSecretColumns.
SecretRecord ReadSecret(const Statement& stmt) {
  return SecretRecord{.tenant = stmt.ColumnText(0),
                      .name = stmt.ColumnText(1),
                      .ciphertext = stmt.ColumnBlob(2),
                      .nonce = stmt.ColumnBlob(3),
                      .key_id = stmt.ColumnText(4),
                      .version = stmt.ColumnInt(5),
                      .created_at_ms = stmt.ColumnInt(6),
                      .updated_at_ms = stmt.ColumnInt(7)};
}

}  // namespace

Status ValidateSecretName(std::string_view name) {
  auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  bool ok = !name.empty() && name.size() <= kMaxSecretNameBytes && letter(name[0]);
  for (char c : name) ok = ok && (letter(c) || (c >= '0' && c <= '9'));
  if (!ok) {
    return Fail(ErrorCode::kInvalidArgument,
                "a secret name matches [A-Za-z_][A-Za-z0-9_]* and has 1 to 128 characters");
  }
  return {};
}

Result<SecretRecord> Store::InsertSecret(SecretRecord record) {
  if (auto st = ValidateSealed(record); !st) return std::unexpected(st.error());
  std::lock_guard lock(mu_);
  record.version = 1;
  record.created_at_ms = record.updated_at_ms = options_.now_ms();
  auto stmt = db_.Prepare("INSERT INTO secrets (" + std::string(kSecretColumns) +
                          ") VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, record.tenant)
      .Bind(2, record.name)
      .BindBlob(3, record.ciphertext)
      .BindBlob(4, record.nonce)
      .Bind(5, record.key_id)
      .Bind(6, record.version)
      .Bind(7, record.created_at_ms)
      .Bind(8, record.updated_at_ms);
  auto done = stmt->Run();
  if (!done) {
    // The primary key is the one constraint a record that passed ValidateSealed can break.
    if (done.error().code() == ErrorCode::kAlreadyExists) {
      return Fail(ErrorCode::kAlreadyExists, "secret '" + record.name + "' already exists");
    }
    return std::unexpected(std::move(done.error()).Wrap("storing secret " + record.name));
  }
  return record;
}

Result<SecretRecord> Store::UpdateSecret(const SecretRecord& record) {
  if (auto st = ValidateSealed(record); !st) return std::unexpected(st.error());
  std::lock_guard lock(mu_);
  const int64_t now = options_.now_ms();
  auto stmt = db_.Prepare(
      "UPDATE secrets SET ciphertext = ?3, nonce = ?4, key_id = ?5, version = version + 1, "
      "updated_at_ms = ?6 WHERE tenant = ?1 AND name = ?2 RETURNING " +
      std::string(kSecretColumns));
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, record.tenant)
      .Bind(2, record.name)
      .BindBlob(3, record.ciphertext)
      .BindBlob(4, record.nonce)
      .Bind(5, record.key_id)
      .Bind(6, now);
  auto row = stmt->Step();
  if (!row) return std::unexpected(std::move(row.error()).Wrap("updating secret " + record.name));
  if (!*row) return std::unexpected(SecretNotFound(record.name));
  SecretRecord updated = ReadSecret(*stmt);
  // The statement commits when it is stepped to its end: a failed commit is reported here, not
  // lost in the statement's finalize.
  auto end = stmt->Step();
  if (!end) return std::unexpected(std::move(end.error()).Wrap("updating secret " + record.name));
  return updated;
}

Result<SecretRecord> Store::GetSecret(std::string_view tenant, std::string_view name) {
  if (auto st = ValidateKey(tenant, name); !st) return std::unexpected(st.error());
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare("SELECT " + std::string(kSecretColumns) +
                          " FROM secrets WHERE tenant = ? AND name = ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, tenant).Bind(2, name);
  auto row = stmt->Step();
  if (!row) {
    return std::unexpected(std::move(row.error()).Wrap("reading secret " + std::string(name)));
  }
  if (!*row) return std::unexpected(SecretNotFound(name));
  return ReadSecret(*stmt);
}

Result<std::vector<SecretRecord>> Store::ListSecrets(std::string_view tenant) {
  if (auto st = ValidateTenant(tenant); !st) return std::unexpected(st.error());
  std::lock_guard lock(mu_);
  // The sealed columns are left out: a list has no use for them.
  auto stmt = db_.Prepare(
      "SELECT tenant, name, x'', x'', key_id, version, created_at_ms, updated_at_ms "
      "FROM secrets WHERE tenant = ? ORDER BY name");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, tenant);
  std::vector<SecretRecord> out;
  while (true) {
    auto row = stmt->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap("listing secrets"));
    if (!*row) break;
    out.push_back(ReadSecret(*stmt));
  }
  return out;
}

Status Store::DeleteSecret(std::string_view tenant, std::string_view name) {
  if (auto st = ValidateKey(tenant, name); !st) return st;
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare("DELETE FROM secrets WHERE tenant = ? AND name = ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, tenant).Bind(2, name);
  auto done = stmt->Run();
  if (!done) {
    return std::unexpected(std::move(done.error()).Wrap("deleting secret " + std::string(name)));
  }
  if (db_.Changes() != 1) return std::unexpected(SecretNotFound(name));
  return {};
}

Result<std::map<std::string, int64_t>> Store::CountSecretsByKey() {
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare("SELECT key_id, count(*) FROM secrets GROUP BY key_id");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  std::map<std::string, int64_t> out;
  while (true) {
    auto row = stmt->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap("counting secrets"));
    if (!*row) break;
    out[stmt->ColumnText(0)] = stmt->ColumnInt(1);
  }
  return out;
}

}  // namespace airlock::store
