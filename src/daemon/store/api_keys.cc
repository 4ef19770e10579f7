// Store: API keys. A key is "al_" + 64 hex digits (32 bytes from getrandom); the database
// holds only SHA-256 of the whole key string. A fast unsalted hash is enough here: the key is
// 256 random bits, so there is nothing to brute-force that a slow hash would protect.

#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <optional>
#include <span>

#include "common/sha256.h"
#include "common/syscall.h"
#include "common/unique_fd.h"
#include "daemon/store/store.h"

namespace airlock::store {
namespace {

constexpr std::string_view kKeyPrefix = "al_";
constexpr size_t kKeyRandomBytes = 32;
constexpr size_t kKeyLength = kKeyPrefix.size() + 2 * kKeyRandomBytes;
constexpr std::string_view kAdminKeyFile = "admin.key";
// One message for every authentication failure, so a response tells an attacker nothing.
constexpr std::string_view kUnauthenticatedMessage = "missing or invalid API key";

std::string Hex(std::span<const unsigned char> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 0xf];
  }
  return out;
}

Result<std::string> NewKeyText() {
  std::array<unsigned char, kKeyRandomBytes> bytes{};
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = getrandom(bytes.data() + got, bytes.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return FailErrno("getrandom for an API key", errno);
    }
    got += static_cast<size_t>(n);
  }
  return std::string(kKeyPrefix) + Hex(bytes);
}

bool LooksLikeKey(std::string_view key) {
  if (key.size() != kKeyLength || !key.starts_with(kKeyPrefix)) return false;
  for (char c : key.substr(kKeyPrefix.size())) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Status ValidateKeyName(std::string_view name) {
  if (name.empty() || name.size() > 64) {
    return Fail(ErrorCode::kInvalidArgument, "key name must be 1-64 characters long");
  }
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) {
      return Fail(ErrorCode::kInvalidArgument, "key name may hold only printable ASCII");
    }
  }
  return {};
}

// Reads a row selected with kKeyColumns.
constexpr std::string_view kKeyColumns = "id, name, tenant, created_at_ms, admin, revoked";

Result<KeyInfo> ReadKeyInfo(const Statement& stmt) {
  return KeyInfo{stmt.ColumnInt(0), stmt.ColumnText(1), stmt.ColumnText(2), stmt.ColumnInt(3),
                 stmt.ColumnInt(4) != 0, stmt.ColumnInt(5) != 0};
}

}  // namespace

Result<KeyInfo> Store::InsertKeyLocked(std::string_view name, std::string_view hash_hex,
                                       bool admin, std::string_view tenant) {
  KeyInfo info{0, std::string(name), std::string(tenant), options_.now_ms(), admin, false};
  auto stmt = db_.Prepare(
      "INSERT INTO api_keys (name, hash, created_at_ms, admin, revoked, tenant) "
      "VALUES (?, ?, ?, ?, 0, ?)");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, name)
      .Bind(2, hash_hex)
      .Bind(3, info.created_at_ms)
      .Bind(4, int64_t{admin})
      .Bind(5, tenant);
  auto done = stmt->Run();
  if (!done) return std::unexpected(std::move(done.error()).Wrap("storing API key"));
  info.id = sqlite3_last_insert_rowid(db_.get());
  return info;
}

Result<NewKey> Store::CreateKey(std::string_view name, bool admin, std::string_view tenant) {
  auto valid = ValidateKeyName(name);
  if (!valid) return std::unexpected(std::move(valid.error()));
  if (auto st = ValidateTenant(tenant); !st) return std::unexpected(std::move(st.error()));
  auto key = NewKeyText();
  if (!key) return std::unexpected(std::move(key.error()));
  std::lock_guard lock(mu_);
  auto info = InsertKeyLocked(name, Sha256::Of(*key), admin, tenant);
  if (!info) return std::unexpected(std::move(info.error()));
  return NewKey{std::move(*info), std::move(*key)};
}

Result<KeyInfo> Store::Authenticate(std::string_view presented) {
  auto unauthenticated = [] {
    return Fail(ErrorCode::kUnauthenticated, std::string(kUnauthenticatedMessage));
  };
  // Refusing a malformed key early reveals only that it was malformed, which the caller knows.
  if (!LooksLikeKey(presented)) return unauthenticated();
  std::string hash = Sha256::Of(presented);

  std::lock_guard lock(mu_);
  // Compare against every stored hash without stopping at a match, each in constant time,
  // revoked or not: the time taken does not depend on which key matched or how much of it.
  // There are few keys; an index lookup would leak only hash prefixes, but this is simpler
  // to argue about.
  auto stmt = db_.Prepare("SELECT " + std::string(kKeyColumns) + ", hash FROM api_keys");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  std::optional<KeyInfo> match;
  while (true) {
    auto row = stmt->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap("authenticating"));
    if (!*row) break;
    std::string stored = stmt->ColumnText(6);
    if (stored.size() == hash.size() &&
        CRYPTO_memcmp(stored.data(), hash.data(), hash.size()) == 0) {
      auto info = ReadKeyInfo(*stmt);
      if (!info) return std::unexpected(std::move(info.error()));
      match = std::move(*info);
    }
  }
  if (!match || match->revoked) return unauthenticated();
  return *match;
}

Status Store::RevokeKey(int64_t id) {
  std::lock_guard lock(mu_);
  // The check and the write share one transaction, so two revokes cannot both pass it.
  auto tx = Transaction::Begin(db_);
  if (!tx) return std::unexpected(std::move(tx.error()));
  auto key = db_.Prepare("SELECT admin, revoked FROM api_keys WHERE id = ?");
  if (!key) return std::unexpected(std::move(key.error()));
  key->Bind(1, id);
  auto row = key->Step();
  if (!row) return std::unexpected(std::move(row.error()).Wrap("revoking API key"));
  if (!*row) return Fail(ErrorCode::kNotFound, "API key " + std::to_string(id) + " not found");
  if (key->ColumnInt(1) != 0) return {};
  if (key->ColumnInt(0) != 0) {
    auto admins = db_.Prepare("SELECT count(*) FROM api_keys WHERE admin = 1 AND revoked = 0");
    if (!admins) return std::unexpected(std::move(admins.error()));
    auto counted = admins->Step();
    if (!counted) return std::unexpected(std::move(counted.error()).Wrap("revoking API key"));
    if (admins->ColumnInt(0) <= 1) {
      return Fail(ErrorCode::kFailedPrecondition,
                  "API key " + std::to_string(id) +
                      " is the last admin key; create another admin key before revoking it");
    }
  }
  auto stmt = db_.Prepare("UPDATE api_keys SET revoked = 1 WHERE id = ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, id);
  auto done = stmt->Run();
  if (!done) return std::unexpected(std::move(done.error()).Wrap("revoking API key"));
  return tx->Commit();
}

Result<std::vector<KeyInfo>> Store::ListKeys() {
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare("SELECT " + std::string(kKeyColumns) + " FROM api_keys ORDER BY id");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  std::vector<KeyInfo> keys;
  while (true) {
    auto row = stmt->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap("listing API keys"));
    if (!*row) break;
    auto info = ReadKeyInfo(*stmt);
    if (!info) return std::unexpected(std::move(info.error()));
    keys.push_back(std::move(*info));
  }
  return keys;
}

Result<AdminKeyState> Store::EnsureAdminKey(const std::string& state_dir) {
  const std::string path = state_dir + "/" + std::string(kAdminKeyFile);
  std::lock_guard lock(mu_);

  // Any admin key, revoked included: an operator who revoked it does not want a new one.
  auto count = db_.Prepare("SELECT count(*) FROM api_keys WHERE admin = 1");
  if (!count) return std::unexpected(std::move(count.error()));
  auto row = count->Step();
  if (!row) return std::unexpected(std::move(row.error()).Wrap("looking for the admin key"));
  const bool have_admin = *row && count->ColumnInt(0) > 0;

  struct stat st {};
  bool file_exists = ::lstat(path.c_str(), &st) == 0;
  if (!file_exists && errno != ENOENT) return FailErrno("stat " + path, errno);
  if (file_exists && !S_ISREG(st.st_mode)) {
    return Fail(ErrorCode::kFailedPrecondition, path + " exists and is not a regular file");
  }

  if (have_admin) return file_exists ? AdminKeyState::kPresent : AdminKeyState::kFileMissing;

  if (file_exists) {
    // A previous start wrote the file and died before storing the hash: adopt that key, so
    // the file the operator may already have copied stays valid.
    auto fd = OpenFile(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (!fd) return std::unexpected(std::move(fd.error()));
    std::string text(kKeyLength + 2, '\0');
    auto got = ReadFull(fd->get(), std::as_writable_bytes(std::span(text)));
    if (!got) return std::unexpected(std::move(got.error()).Wrap("reading " + path));
    text.resize(*got);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    if (!LooksLikeKey(text)) {
      return Fail(ErrorCode::kFailedPrecondition,
                  path +
                      " holds no valid key and the database has no admin key; remove the "
                      "file to have a new admin key created");
    }
    if (::fchmod(fd->get(), 0600) != 0) return FailErrno("chmod " + path, errno);
    auto info = InsertKeyLocked("admin", Sha256::Of(text), /*admin=*/true, kAdminTenant);
    if (!info) return std::unexpected(std::move(info.error()));
    return AdminKeyState::kAdopted;
  }

  // First start. The file goes first: a crash before the hash is stored is repaired by the
  // adoption above; the other order could leave a key nobody holds.
  auto key = NewKeyText();
  if (!key) return std::unexpected(std::move(key.error()));
  auto written = WriteNewPrivateFile(state_dir, path, *key + "\n");
  if (!written) return std::unexpected(std::move(written.error()).Wrap("writing admin key"));
  auto info = InsertKeyLocked("admin", Sha256::Of(*key), /*admin=*/true, kAdminTenant);
  if (!info) return std::unexpected(std::move(info.error()));
  return AdminKeyState::kCreated;
}

}  // namespace airlock::store
