#include "daemon/store/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <ranges>

#include "common/ids.h"
#include "common/syscall.h"
#include "common/unique_fd.h"

namespace airlock::store {
namespace {

using nlohmann::json;

// Schema migrations. Entry i takes user_version i to i + 1, in its own transaction together
// with the user_version bump. Never edit an entry that has shipped: append a new one.
constexpr std::string_view kMigrations[] = {
    // 1: sandboxes and API keys.
    R"sql(
CREATE TABLE sandboxes (
  id            TEXT PRIMARY KEY NOT NULL,
  state         TEXT NOT NULL CHECK (state IN
                  ('creating', 'running', 'paused', 'destroying', 'destroyed', 'failed')),
  engine        TEXT NOT NULL,
  template_name TEXT NOT NULL,
  cpus          REAL NOT NULL,
  memory_mb     INTEGER NOT NULL,
  pids_max      INTEGER NOT NULL,
  disk_mb       INTEGER NOT NULL,
  env           TEXT NOT NULL CHECK (json_valid(env)),        -- JSON array of strings
  metadata      TEXT NOT NULL CHECK (json_valid(metadata)),   -- JSON object string -> string
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  expires_at_ms INTEGER NOT NULL,                             -- absolute unix ms; 0 = none
  init_pid      INTEGER NOT NULL,
  resources     TEXT NOT NULL CHECK (json_valid(resources)),  -- JSON object string -> string
  error         TEXT NOT NULL
) STRICT;
CREATE INDEX sandboxes_by_state ON sandboxes (state);
CREATE INDEX sandboxes_by_deadline ON sandboxes (expires_at_ms) WHERE expires_at_ms > 0;
CREATE TABLE api_keys (
  id            INTEGER PRIMARY KEY,
  name          TEXT NOT NULL,
  hash          TEXT NOT NULL UNIQUE,  -- SHA-256 of the whole key, lowercase hex
  created_at_ms INTEGER NOT NULL,
  admin         INTEGER NOT NULL CHECK (admin IN (0, 1)),
  revoked       INTEGER NOT NULL CHECK (revoked IN (0, 1))
) STRICT;
)sql",
    // 2: warm pools. `pooled` marks a sandbox the pool filler made and nobody has claimed: the
    // API never shows it. Pool sizes set through the API outlive a restart.
    R"sql(
ALTER TABLE sandboxes ADD COLUMN pooled INTEGER NOT NULL DEFAULT 0 CHECK (pooled IN (0, 1));
CREATE INDEX sandboxes_pooled ON sandboxes (template_name, created_at_ms) WHERE pooled = 1;
CREATE TABLE pools (
  template_name TEXT PRIMARY KEY NOT NULL,
  size          INTEGER NOT NULL CHECK (size >= 0)
) STRICT;
)sql",
    // 3: templates, and the read-only layers each sandbox stacks (docs/design/templates.md).
    R"sql(
ALTER TABLE sandboxes ADD COLUMN layers TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(layers));
CREATE TABLE templates (
  name          TEXT PRIMARY KEY NOT NULL,
  state         TEXT NOT NULL CHECK (state IN ('building', 'ready', 'failed')),
  source        TEXT NOT NULL,                           -- "build" or "snapshot of sbx-..."
  spec          TEXT NOT NULL CHECK (json_valid(spec)),   -- what sandboxes of it get
  layers        TEXT NOT NULL CHECK (json_valid(layers)), -- JSON array of digests, topmost first
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  error         TEXT NOT NULL
) STRICT;
)sql",
    // 4: the network policy of each sandbox (docs/design/network.md); '' for mode none.
    R"sql(
ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '';
)sql",
    // 5: the network verdicts of each sandbox, numbered per sandbox, and its counters (the
    // last number given out; verdicts lost before the store; stored ones removed by the cap).
    // Both go with the sandbox's record.
    R"sql(
CREATE TABLE network_events (
  sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
  seq        INTEGER NOT NULL,
  at_ms      INTEGER NOT NULL,
  kind       TEXT NOT NULL,
  name       TEXT NOT NULL,
  sni        TEXT NOT NULL,
  host       TEXT NOT NULL,
  dest       TEXT NOT NULL,
  port       INTEGER NOT NULL,
  verdict    TEXT NOT NULL CHECK (verdict IN ('allowed', 'denied', 'closed')),
  rule       TEXT NOT NULL,
  reason     TEXT NOT NULL,
  bytes_up   INTEGER NOT NULL,
  bytes_down INTEGER NOT NULL,
  PRIMARY KEY (sandbox_id, seq)
) STRICT, WITHOUT ROWID;
CREATE TABLE network_event_counters (
  sandbox_id TEXT PRIMARY KEY NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
  last_seq   INTEGER NOT NULL,
  dropped    INTEGER NOT NULL,
  trimmed    INTEGER NOT NULL
) STRICT;
)sql",
    // 6: tenancy (docs/design/tenancy.md). Every key and sandbox belongs to a tenant; what
    // existed before belongs to "admin". A template's tenant is '' when it is shared (made by
    // an admin; every older one was), else the tenant that made it.
    R"sql(
ALTER TABLE api_keys ADD COLUMN tenant TEXT NOT NULL DEFAULT 'admin';
ALTER TABLE sandboxes ADD COLUMN tenant TEXT NOT NULL DEFAULT 'admin';
ALTER TABLE templates ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant);
)sql",
    // 7: engines (docs/design/engines.md). What an engine keeps about a live sandbox is its own,
    // opaque to the daemon: `engine_state`, given back to the engine's adopt. The jail's was the
    // agent's host pid (init_pid) and a few resources entries: they move into it.
    R"sql(
ALTER TABLE sandboxes ADD COLUMN engine_state TEXT NOT NULL DEFAULT '';
UPDATE sandboxes SET engine_state = json_object('init_pid', init_pid) WHERE init_pid > 0;
UPDATE sandboxes SET resources = json_remove(resources, '$.uid_base', '$.dir', '$.cgroup0',
    '$.cgroup1', '$.cgroup2', '$.cgroup3', '$.cgroup4', '$.cgroup5', '$.cgroup6', '$.cgroup7');
ALTER TABLE sandboxes DROP COLUMN init_pid;
)sql",
    // 8: the state hibernated (a sandbox saved to disk with its memory: docs/design/gvisor.md).
    // SQLite cannot change a CHECK in place: the table is made again and filled from the old one,
    // as SQLite's own procedure for it does (foreign keys off around it: see Migrate).
    R"sql(
CREATE TABLE sandboxes_new (
  id            TEXT PRIMARY KEY NOT NULL,
  state         TEXT NOT NULL CHECK (state IN ('creating', 'running', 'paused', 'hibernated',
                                               'destroying', 'destroyed', 'failed')),
  engine        TEXT NOT NULL,
  template_name TEXT NOT NULL,
  cpus          REAL NOT NULL,
  memory_mb     INTEGER NOT NULL,
  pids_max      INTEGER NOT NULL,
  disk_mb       INTEGER NOT NULL,
  env           TEXT NOT NULL CHECK (json_valid(env)),        -- JSON array of strings
  metadata      TEXT NOT NULL CHECK (json_valid(metadata)),   -- JSON object string -> string
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  expires_at_ms INTEGER NOT NULL,                             -- absolute unix ms; 0 = none
  resources     TEXT NOT NULL CHECK (json_valid(resources)),  -- JSON object string -> string
  error         TEXT NOT NULL,
  pooled        INTEGER NOT NULL DEFAULT 0 CHECK (pooled IN (0, 1)),
  layers        TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(layers)),
  network       TEXT NOT NULL DEFAULT '',
  tenant        TEXT NOT NULL DEFAULT 'admin',
  engine_state  TEXT NOT NULL DEFAULT ''
) STRICT;
INSERT INTO sandboxes_new (id, state, engine, template_name, cpus, memory_mb, pids_max, disk_mb,
    env, metadata, created_at_ms, updated_at_ms, expires_at_ms, resources, error, pooled, layers,
    network, tenant, engine_state)
  SELECT id, state, engine, template_name, cpus, memory_mb, pids_max, disk_mb, env, metadata,
    created_at_ms, updated_at_ms, expires_at_ms, resources, error, pooled, layers, network,
    tenant, engine_state FROM sandboxes;
DROP TABLE sandboxes;
ALTER TABLE sandboxes_new RENAME TO sandboxes;
CREATE INDEX sandboxes_by_state ON sandboxes (state);
CREATE INDEX sandboxes_by_deadline ON sandboxes (expires_at_ms) WHERE expires_at_ms > 0;
CREATE INDEX sandboxes_pooled ON sandboxes (template_name, created_at_ms) WHERE pooled = 1;
CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant);
)sql",
    // 9: each tenant's secrets (docs/design/secrets-store.md), sealed with AES-256-GCM under
    // STATE_DIR/secrets.key, which is not in the database: a copy of it reveals no value.
    R"sql(
CREATE TABLE secrets (
  tenant        TEXT NOT NULL,
  name          TEXT NOT NULL,
  ciphertext    BLOB NOT NULL CHECK (length(ciphertext) > 16),  -- the sealed value, then its tag
  nonce         BLOB NOT NULL CHECK (length(nonce) = 12),
  key_id        TEXT NOT NULL,                                  -- the key that sealed it
  version       INTEGER NOT NULL CHECK (version >= 1),
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  PRIMARY KEY (tenant, name)
) STRICT;
)sql",
    // 10: the secrets bound to each sandbox (docs/design/credentials.md): the API's `secrets`
    // with their placeholders, never a value; '' for none.
    R"sql(
ALTER TABLE sandboxes ADD COLUMN secrets TEXT NOT NULL DEFAULT '';
)sql",
    // 11: the flight recorder (docs/design/recorder.md): every sandbox's events, numbered per
    // sandbox, each a type and a JSON object; and its counters, as for the network verdicts.
    // Both go with the sandbox's record.
    R"sql(
CREATE TABLE sandbox_events (
  sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
  seq        INTEGER NOT NULL,
  at_ms      INTEGER NOT NULL,
  type       TEXT NOT NULL,
  data       TEXT NOT NULL,
  PRIMARY KEY (sandbox_id, seq)
) STRICT, WITHOUT ROWID;
CREATE TABLE sandbox_event_counters (
  sandbox_id TEXT PRIMARY KEY NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
  last_seq   INTEGER NOT NULL,
  dropped    INTEGER NOT NULL,
  trimmed    INTEGER NOT NULL
) STRICT;
)sql",
    // 12: tenant quotas (docs/design/tenancy.md, "Quotas"). A tenant without a row has none; 0
    // in a column: that kind is unlimited.
    R"sql(
CREATE TABLE tenant_quotas (
  tenant             TEXT PRIMARY KEY NOT NULL,
  sandboxes          INTEGER NOT NULL CHECK (sandboxes >= 0),
  cpus               REAL NOT NULL CHECK (cpus >= 0),
  memory_mb          INTEGER NOT NULL CHECK (memory_mb >= 0),
  disk_mb            INTEGER NOT NULL CHECK (disk_mb >= 0),
  creates_per_minute INTEGER NOT NULL CHECK (creates_per_minute >= 0),
  updated_at_ms      INTEGER NOT NULL
) STRICT;
)sql",
    // 13: what each sandbox used, sampled every few seconds while it lives (docs/design/
    // metrics.md): the newest few hundred per sandbox, gone with its record.
    R"sql(
CREATE TABLE sandbox_metrics (
  sandbox_id        TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
  at_ms             INTEGER NOT NULL,  -- unix ms
  cpu_seconds       REAL NOT NULL,     -- CPU time used since it started
  cpu_cores         REAL NOT NULL,     -- cores in use since the sample before (0 for the first)
  memory_bytes      INTEGER NOT NULL,
  memory_peak_bytes INTEGER NOT NULL,  -- 0: the engine cannot tell
  pids              INTEGER NOT NULL,
  disk_bytes        INTEGER NOT NULL,  -- used in its writable layer
  net_rx_bytes      INTEGER NOT NULL,  -- received by the sandbox through its network
  net_tx_bytes      INTEGER NOT NULL,  -- sent by it
  PRIMARY KEY (sandbox_id, at_ms)
) STRICT, WITHOUT ROWID;
)sql",
};

constexpr std::string_view kColumns =
    "id, state, engine, template_name, cpus, memory_mb, pids_max, disk_mb, env, metadata, "
    "created_at_ms, updated_at_ms, expires_at_ms, engine_state, resources, error, pooled, layers, "
    "network, tenant, secrets";

int64_t RealtimeMs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

// JSON text for a column. nlohmann refuses invalid UTF-8 by throwing; that is bad input.
template <typename T>
Result<std::string> ToJson(const T& value, std::string_view field) {
  try {
    return json(value).dump();
  } catch (const json::exception&) {
    return Fail(ErrorCode::kInvalidArgument, std::string(field) + " is not valid UTF-8");
  }
}

Result<json> ParseColumn(const std::string& text, std::string_view id, std::string_view field) {
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return Fail(ErrorCode::kInternal,
                "record " + std::string(id) + ": column " + std::string(field) + " is not JSON");
  }
  return parsed;
}

Result<std::vector<std::string>> ParseStringArray(const std::string& text, std::string_view id,
                                                  std::string_view field) {
  auto parsed = ParseColumn(text, id, field);
  if (!parsed) return std::unexpected(std::move(parsed.error()));
  std::vector<std::string> out;
  if (!parsed->is_array()) {
    return Fail(ErrorCode::kInternal,
                "record " + std::string(id) + ": " + std::string(field) + " is not an array");
  }
  for (const json& item : *parsed) {
    if (!item.is_string()) {
      return Fail(ErrorCode::kInternal,
                  "record " + std::string(id) + ": " + std::string(field) + " holds a non-string");
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

Result<std::map<std::string, std::string>> ParseStringMap(const std::string& text,
                                                          std::string_view id,
                                                          std::string_view field) {
  auto parsed = ParseColumn(text, id, field);
  if (!parsed) return std::unexpected(std::move(parsed.error()));
  if (!parsed->is_object()) {
    return Fail(ErrorCode::kInternal,
                "record " + std::string(id) + ": " + std::string(field) + " is not an object");
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : parsed->items()) {
    if (!value.is_string()) {
      return Fail(ErrorCode::kInternal,
                  "record " + std::string(id) + ": " + std::string(field) + " holds a non-string");
    }
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

// The JSON columns of a record, encoded (and so checked) before any SQL runs.
struct EncodedColumns {
  std::string env, metadata, resources, layers;
};

Result<EncodedColumns> Encode(const SandboxRecord& r) {
  auto env = ToJson(r.env, "env");
  if (!env) return std::unexpected(std::move(env.error()));
  auto metadata = ToJson(r.metadata, "metadata");
  if (!metadata) return std::unexpected(std::move(metadata.error()));
  auto resources = ToJson(r.resources, "resources");
  if (!resources) return std::unexpected(std::move(resources.error()));
  auto layers = ToJson(r.layers, "layers");
  if (!layers) return std::unexpected(std::move(layers.error()));
  return EncodedColumns{std::move(*env), std::move(*metadata), std::move(*resources),
                        std::move(*layers)};
}

Status ValidateFields(const SandboxRecord& r) {
  const SandboxLimits& l = r.limits;
  if (!std::isfinite(l.cpus) || l.cpus < 0 || l.memory_mb < 0 || l.pids_max < 0 || l.disk_mb < 0) {
    return Fail(ErrorCode::kInvalidArgument, "limits must be finite and not negative");
  }
  if (r.expires_at_ms < 0) {
    return Fail(ErrorCode::kInvalidArgument, "expires_at_ms must not be negative");
  }
  return ValidateTenant(r.tenant);
}

// Binds the columns in kColumns order.
void BindRecord(Statement& stmt, const SandboxRecord& r, const EncodedColumns& enc) {
  stmt.Bind(1, r.id)
      .Bind(2, SandboxStateName(r.state))
      .Bind(3, r.engine)
      .Bind(4, r.template_name)
      .Bind(5, r.limits.cpus)
      .Bind(6, r.limits.memory_mb)
      .Bind(7, r.limits.pids_max)
      .Bind(8, r.limits.disk_mb)
      .Bind(9, enc.env)
      .Bind(10, enc.metadata)
      .Bind(11, r.created_at_ms)
      .Bind(12, r.updated_at_ms)
      .Bind(13, r.expires_at_ms)
      .Bind(14, r.engine_state)
      .Bind(15, enc.resources)
      .Bind(16, r.error)
      .Bind(17, static_cast<int64_t>(r.pooled ? 1 : 0))
      .Bind(18, enc.layers)
      .Bind(19, r.network)
      .Bind(20, r.tenant)
      .Bind(21, r.secrets);
}

// Reads a row selected with kColumns.
Result<SandboxRecord> ReadRecord(const Statement& stmt) {
  SandboxRecord r;
  r.id = stmt.ColumnText(0);
  std::string state = stmt.ColumnText(1);
  auto parsed_state = ParseSandboxState(state);
  if (!parsed_state) {
    return Fail(ErrorCode::kInternal, "record " + r.id + ": unknown state '" + state + "'");
  }
  r.state = *parsed_state;
  r.engine = stmt.ColumnText(2);
  r.template_name = stmt.ColumnText(3);
  r.limits = {stmt.ColumnDouble(4), stmt.ColumnInt(5), stmt.ColumnInt(6), stmt.ColumnInt(7)};
  auto env = ParseStringArray(stmt.ColumnText(8), r.id, "env");
  if (!env) return std::unexpected(std::move(env.error()));
  r.env = std::move(*env);
  auto metadata = ParseStringMap(stmt.ColumnText(9), r.id, "metadata");
  if (!metadata) return std::unexpected(std::move(metadata.error()));
  r.metadata = std::move(*metadata);
  r.created_at_ms = stmt.ColumnInt(10);
  r.updated_at_ms = stmt.ColumnInt(11);
  r.expires_at_ms = stmt.ColumnInt(12);
  r.engine_state = stmt.ColumnText(13);
  auto resources = ParseStringMap(stmt.ColumnText(14), r.id, "resources");
  if (!resources) return std::unexpected(std::move(resources.error()));
  r.resources = std::move(*resources);
  r.error = stmt.ColumnText(15);
  r.pooled = stmt.ColumnInt(16) != 0;
  auto layers = ParseStringArray(stmt.ColumnText(17), r.id, "layers");
  if (!layers) return std::unexpected(std::move(layers.error()));
  r.layers = std::move(*layers);
  r.network = stmt.ColumnText(18);
  r.tenant = stmt.ColumnText(19);
  r.secrets = stmt.ColumnText(20);
  return r;
}

// Creates the database file 0600 before SQLite sees it: SQLite would create it 0644, and the
// -wal / -shm files it makes later copy the main file's mode. The file holds key hashes and
// sandbox environments.
Status CreatePrivateFile(const std::string& path) {
  UniqueFd fd(RetryEintr(
      [&] { return ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600); }));
  if (!fd) return FailErrno("creating " + path, errno);
  return {};
}

}  // namespace

Status ValidateTenant(std::string_view tenant) {
  if (tenant.empty() || tenant.size() > 64) {
    return Fail(ErrorCode::kInvalidArgument, "a tenant name has 1 to 64 characters");
  }
  for (char c : tenant) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Fail(ErrorCode::kInvalidArgument,
                  "a tenant name may hold only letters, digits, '.', '_' and '-'");
    }
  }
  return {};
}

int Store::CurrentSchemaVersion() { return static_cast<int>(std::size(kMigrations)); }

Store::Store(Database db, StoreOptions options, std::string path)
    : db_(std::move(db)), options_(std::move(options)), path_(std::move(path)) {
  if (!options_.now_ms) options_.now_ms = RealtimeMs;
}

Result<std::unique_ptr<Store>> Store::Open(const std::string& path, StoreOptions options) {
  auto created = CreatePrivateFile(path);
  if (!created) return std::unexpected(std::move(created.error()).Wrap("opening store"));
  auto db = Database::Open(path);
  if (!db) return std::unexpected(std::move(db.error()));

  // WAL: readers do not block the writer, and a commit appends to the log instead of
  // rewriting pages. synchronous=FULL: the WAL is fsynced at every commit, so an acknowledged
  // write survives power loss too (NORMAL would only survive a process crash).
  auto mode = db->PragmaText("journal_mode = WAL");
  if (!mode) return std::unexpected(std::move(mode.error()).Wrap("setting WAL on " + path));
  if (*mode != "wal") {
    return Fail(ErrorCode::kInternal, "setting WAL on " + path + ": journal_mode is " + *mode);
  }
  auto pragmas =
      db->Exec("PRAGMA synchronous = FULL; PRAGMA busy_timeout = 5000; PRAGMA foreign_keys = ON;",
               "setting pragmas on " + path);
  if (!pragmas) return std::unexpected(std::move(pragmas.error()));

  std::unique_ptr<Store> store(new Store(std::move(*db), std::move(options), path));
  auto migrated = store->Migrate();
  if (!migrated) return std::unexpected(std::move(migrated.error()).Wrap("migrating " + path));
  return store;
}

Result<UniqueFd> Store::Backup() {
  std::string copy = path_ + ".backup-XXXXXX";
  const int fd = ::mkstemp(copy.data());  // 0600, empty: VACUUM INTO fills an empty file
  if (fd < 0) return FailErrno("making a file for the backup beside " + path_, errno);
  ::close(fd);
  struct Remove {
    const std::string& path;
    ~Remove() { ::unlink(path.c_str()); }
  } remove{copy};
  auto db = Database::Open(path_);
  if (!db) return std::unexpected(std::move(db.error()).Wrap("backup"));
  if (auto st = db->Exec("PRAGMA busy_timeout = 5000", "backup"); !st) {
    return std::unexpected(std::move(st.error()));
  }
  auto vacuum = db->Prepare("VACUUM INTO ?");
  if (!vacuum) return std::unexpected(std::move(vacuum.error()).Wrap("backup"));
  vacuum->Bind(1, copy);
  if (auto st = vacuum->Run(); !st) return std::unexpected(std::move(st.error()).Wrap("backup"));
  return OpenFile(copy, O_RDONLY | O_CLOEXEC);  // `remove` unlinks it; the fd keeps it
}

Status Store::Migrate() {
  std::lock_guard lock(mu_);
  // A migration that makes a table again drops the old one, which with foreign keys on would
  // delete what refers to it (network events). Off for the migrations (it cannot change inside
  // a transaction), the references checked before the commit, and on again after.
  if (auto off = db_.Exec("PRAGMA foreign_keys = OFF", "pausing foreign keys"); !off) return off;
  auto migrated = MigrateLocked();
  auto on = db_.Exec("PRAGMA foreign_keys = ON", "restoring foreign keys");
  if (!migrated) return migrated;
  return on;
}

Status Store::MigrateLocked() {
  auto tx = Transaction::Begin(db_);  // read and bump the version under the write lock
  if (!tx) return std::unexpected(std::move(tx.error()));
  auto text = db_.PragmaText("user_version");
  if (!text) return std::unexpected(std::move(text.error()));
  int version = std::stoi(*text);
  if (version > CurrentSchemaVersion()) {
    return Fail(ErrorCode::kFailedPrecondition, "database schema version " +
                                                    std::to_string(version) +
                                                    " is newer than this airlockd understands (" +
                                                    std::to_string(CurrentSchemaVersion()) + ")");
  }
  for (int v = version; v < CurrentSchemaVersion(); ++v) {
    auto applied = db_.Exec(kMigrations[v], "applying migration " + std::to_string(v + 1));
    if (!applied) return applied;
    auto bumped = db_.Exec("PRAGMA user_version = " + std::to_string(v + 1), "bumping version");
    if (!bumped) return bumped;
  }
  auto dangling = db_.PragmaText("foreign_key_check");
  if (!dangling) return std::unexpected(std::move(dangling.error()));
  if (!dangling->empty()) {
    return Fail(ErrorCode::kInternal, "the migrated database has rows that refer to nothing (" +
                                          *dangling + ")");
  }
  return tx->Commit();
}

Result<SandboxRecord> Store::Insert(SandboxRecord record) {
  auto valid_id = ValidateSandboxId(record.id);
  if (!valid_id) return std::unexpected(std::move(valid_id.error()));
  if (record.state != SandboxState::kCreating) {
    return Fail(ErrorCode::kInvalidArgument, "a new record must be in state creating, not " +
                                                 std::string(SandboxStateName(record.state)));
  }
  auto valid = ValidateFields(record);
  if (!valid) return std::unexpected(std::move(valid.error()));
  auto enc = Encode(record);
  if (!enc) return std::unexpected(std::move(enc.error()));

  std::lock_guard lock(mu_);
  record.created_at_ms = record.updated_at_ms = options_.now_ms();
  auto stmt = db_.Prepare("INSERT INTO sandboxes (" + std::string(kColumns) +
                          ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  BindRecord(*stmt, record, *enc);
  auto done = stmt->Run();  // autocommit: one statement, one durable transaction
  if (!done) {
    if (done.error().code() == ErrorCode::kAlreadyExists) {
      return Fail(ErrorCode::kAlreadyExists, "sandbox " + record.id + " already exists");
    }
    return std::unexpected(std::move(done.error()).Wrap("inserting " + record.id));
  }
  return record;
}

Result<SandboxRecord> Store::GetLocked(std::string_view id) {
  auto stmt = db_.Prepare("SELECT " + std::string(kColumns) + " FROM sandboxes WHERE id = ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, id);
  auto row = stmt->Step();
  if (!row) return std::unexpected(std::move(row.error()));
  if (!*row) return Fail(ErrorCode::kNotFound, "sandbox " + std::string(id) + " not found");
  return ReadRecord(*stmt);
}

Result<SandboxRecord> Store::Get(std::string_view id) {
  auto valid = ValidateSandboxId(id);
  if (!valid) return std::unexpected(std::move(valid.error()));
  std::lock_guard lock(mu_);
  return GetLocked(id);
}

Result<std::vector<SandboxRecord>> Store::List(const ListFilter& filter) {
  // Only fixed fragments and '?' go into the SQL text; every value is bound.
  std::string sql = "SELECT " + std::string(kColumns) + " FROM sandboxes WHERE 1";
  if (!filter.states.empty()) {
    sql += " AND state IN (";
    for (size_t i = 0; i < filter.states.size(); ++i) sql += i == 0 ? "?" : ",?";
    sql += ")";
  }
  if (filter.pooled) sql += *filter.pooled ? " AND pooled = 1" : " AND pooled = 0";
  if (filter.tenant) sql += " AND tenant = ?";
  for (size_t i = 0; i < filter.metadata.size(); ++i) {
    sql +=
        " AND EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) AS m"
        " WHERE m.key = ? AND m.value = ?)";
  }
  sql += " ORDER BY created_at_ms, rowid";

  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare(sql);
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  int index = 1;
  for (SandboxState state : filter.states) stmt->Bind(index++, SandboxStateName(state));
  if (filter.tenant) stmt->Bind(index++, *filter.tenant);
  for (const auto& [key, value] : filter.metadata) {
    stmt->Bind(index, key).Bind(index + 1, value);
    index += 2;
  }
  std::vector<SandboxRecord> out;
  while (true) {
    auto row = stmt->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap("listing sandboxes"));
    if (!*row) break;
    auto record = ReadRecord(*stmt);
    if (!record) return std::unexpected(std::move(record.error()));
    out.push_back(std::move(*record));
  }
  return out;
}

Status Store::UpdateLocked(const SandboxRecord& record) {
  auto enc = Encode(record);
  if (!enc) return std::unexpected(std::move(enc.error()));
  auto stmt = db_.Prepare(
      "UPDATE sandboxes SET state = ?2, engine = ?3, template_name = ?4, cpus = ?5, "
      "memory_mb = ?6, pids_max = ?7, disk_mb = ?8, env = ?9, metadata = ?10, "
      "created_at_ms = ?11, updated_at_ms = ?12, expires_at_ms = ?13, engine_state = ?14, "
      "resources = ?15, error = ?16, pooled = ?17, layers = ?18, network = ?19, tenant = ?20, "
      "secrets = ?21 "
      "WHERE id = ?1");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  BindRecord(*stmt, record, *enc);
  auto done = stmt->Run();
  if (!done) return std::unexpected(std::move(done.error()).Wrap("updating " + record.id));
  AIRLOCK_CHECK(db_.Changes() == 1);  // callers read the row in this same transaction
  return {};
}

Result<SandboxRecord> Store::Transition(std::string_view id, std::span<const SandboxState> from,
                                        SandboxState to,
                                        const std::function<void(SandboxRecord&)>& mutate) {
  auto valid = ValidateSandboxId(id);
  if (!valid) return std::unexpected(std::move(valid.error()));
  // The states the caller accepts, narrowed to those the table lets reach `to`.
  std::vector<SandboxState> allowed;
  for (SandboxState s : kAllSandboxStates) {
    bool wanted = from.empty() || std::ranges::find(from, s) != from.end();
    if (wanted && IsAllowedTransition(s, to)) allowed.push_back(s);
  }

  std::lock_guard lock(mu_);
  auto tx = Transaction::Begin(db_);
  if (!tx) return std::unexpected(std::move(tx.error()));
  auto record = GetLocked(id);
  if (!record) return std::unexpected(std::move(record.error()));
  if (allowed.empty()) {
    return Fail(ErrorCode::kFailedPrecondition, "sandbox " + std::string(id) + " is " +
                                                    std::string(SandboxStateName(record->state)) +
                                                    ", cannot become " +
                                                    std::string(SandboxStateName(to)));
  }
  auto fits = RequireState(id, record->state, allowed);
  if (!fits) return std::unexpected(std::move(fits.error()));

  SandboxRecord updated = *record;
  if (mutate) mutate(updated);
  updated.id = record->id;
  updated.created_at_ms = record->created_at_ms;
  updated.state = to;
  return CommitEdit(*tx, std::move(updated));
}

Result<SandboxRecord> Store::CommitEdit(Transaction& tx, SandboxRecord updated) {
  updated.updated_at_ms = options_.now_ms();
  auto fields = ValidateFields(updated);
  if (!fields) return std::unexpected(std::move(fields.error()));
  auto written = UpdateLocked(updated);
  if (!written) return std::unexpected(std::move(written.error()));
  auto committed = tx.Commit();
  if (!committed) return std::unexpected(std::move(committed.error()));
  return updated;
}

Result<SandboxRecord> Store::MarkFailed(std::string_view id, std::string_view error,
                                        std::span<const SandboxState> from) {
  return Transition(id, from, SandboxState::kFailed,
                    [&](SandboxRecord& r) { r.error = std::string(error); });
}

Result<SandboxRecord> Store::EditUnlessDestroyed(std::string_view id,
                                                 const std::function<void(SandboxRecord&)>& edit) {
  auto valid = ValidateSandboxId(id);
  if (!valid) return std::unexpected(std::move(valid.error()));
  std::lock_guard lock(mu_);
  auto tx = Transaction::Begin(db_);
  if (!tx) return std::unexpected(std::move(tx.error()));
  auto record = GetLocked(id);
  if (!record) return std::unexpected(std::move(record.error()));
  if (record->state == SandboxState::kDestroyed) {
    return Fail(ErrorCode::kFailedPrecondition, "sandbox " + std::string(id) + " is destroyed");
  }
  SandboxRecord updated = *record;
  edit(updated);
  return CommitEdit(*tx, std::move(updated));
}

Result<SandboxRecord> Store::UpdateTtl(std::string_view id, int64_t expires_at_ms) {
  return EditUnlessDestroyed(id, [&](SandboxRecord& r) { r.expires_at_ms = expires_at_ms; });
}

Result<SandboxRecord> Store::UpdateLimits(std::string_view id, const SandboxLimits& limits) {
  return EditUnlessDestroyed(id, [&](SandboxRecord& r) { r.limits = limits; });
}

Result<SandboxRecord> Store::UpdateMetadata(std::string_view id,
                                            std::map<std::string, std::string> metadata) {
  return EditUnlessDestroyed(id, [&](SandboxRecord& r) { r.metadata = std::move(metadata); });
}

Result<SandboxRecord> Store::UpdateNetwork(std::string_view id, std::string network,
                                           std::string secrets) {
  return EditUnlessDestroyed(id, [&](SandboxRecord& r) {
    r.network = std::move(network);
    r.secrets = std::move(secrets);
  });
}

Result<SandboxRecord> Store::SetRuntimeInfo(std::string_view id, std::string engine_state,
                                            std::map<std::string, std::string> resources) {
  return EditUnlessDestroyed(id, [&](SandboxRecord& r) {
    r.engine_state = std::move(engine_state);
    r.resources = std::move(resources);
  });
}

Result<SandboxRecord> Store::SetEngineState(std::string_view id, std::string state) {
  return EditUnlessDestroyed(id, [&](SandboxRecord& r) { r.engine_state = std::move(state); });
}

Result<SandboxRecord> Store::SetResource(std::string_view id, const std::string& key,
                                         const std::string& value) {
  return EditUnlessDestroyed(id, [&](SandboxRecord& r) {
    if (value.empty()) {
      r.resources.erase(key);
    } else {
      r.resources[key] = value;
    }
  });
}

Status Store::Delete(std::string_view id) {
  auto valid = ValidateSandboxId(id);
  if (!valid) return valid;
  std::lock_guard lock(mu_);
  auto tx = Transaction::Begin(db_);
  if (!tx) return std::unexpected(std::move(tx.error()));
  auto record = GetLocked(id);
  if (!record) return std::unexpected(std::move(record.error()));
  const SandboxState destroyed[] = {SandboxState::kDestroyed};
  auto fits = RequireState(id, record->state, destroyed);
  if (!fits) return fits;
  auto stmt = db_.Prepare("DELETE FROM sandboxes WHERE id = ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, id);
  auto done = stmt->Run();
  if (!done) return std::unexpected(std::move(done.error()).Wrap("deleting " + std::string(id)));
  return tx->Commit();
}

Result<int64_t> Store::PurgeDestroyed(int64_t cutoff_ms) {
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare("DELETE FROM sandboxes WHERE state = 'destroyed' AND updated_at_ms < ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, cutoff_ms);
  auto done = stmt->Run();
  if (!done) return std::unexpected(std::move(done.error()).Wrap("purging destroyed records"));
  return db_.Changes();
}

Result<std::vector<std::string>> Store::Expired(int64_t now_ms) {
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare(
      "SELECT id FROM sandboxes WHERE expires_at_ms > 0 AND expires_at_ms <= ? "
      "AND state NOT IN ('destroying', 'destroyed') AND pooled = 0 ORDER BY expires_at_ms, rowid");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, now_ms);
  std::vector<std::string> ids;
  while (true) {
    auto row = stmt->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap("finding expired sandboxes"));
    if (!*row) break;
    ids.push_back(stmt->ColumnText(0));
  }
  return ids;
}

Result<std::map<SandboxState, int64_t>> Store::CountByState() {
  std::map<SandboxState, int64_t> counts;
  for (SandboxState s : kAllSandboxStates) counts[s] = 0;
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare("SELECT state, count(*) FROM sandboxes WHERE pooled = 0 GROUP BY state");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  while (true) {
    auto row = stmt->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap("counting sandboxes"));
    if (!*row) break;
    auto state = ParseSandboxState(stmt->ColumnText(0));
    if (!state) return Fail(ErrorCode::kInternal, "unknown state " + stmt->ColumnText(0));
    counts[*state] = stmt->ColumnInt(1);
  }
  return counts;
}

Result<std::optional<SandboxRecord>> Store::TakePooled(
    std::string_view template_name, bool claim, const std::function<void(SandboxRecord&)>& mutate) {
  std::lock_guard lock(mu_);
  // The select and the update share one write transaction, so two callers never take the same
  // record: the second sees it no longer pooled / running.
  auto tx = Transaction::Begin(db_);
  if (!tx) return std::unexpected(std::move(tx.error()));
  auto stmt = db_.Prepare(
      "SELECT id FROM sandboxes WHERE pooled = 1 AND state = 'running' AND template_name = ? "
      "ORDER BY created_at_ms, rowid LIMIT 1");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, template_name);
  auto row = stmt->Step();
  if (!row) return std::unexpected(std::move(row.error()).Wrap("finding a pooled sandbox"));
  if (!*row) return std::optional<SandboxRecord>();
  const std::string id = stmt->ColumnText(0);
  auto record = GetLocked(id);
  if (!record) return std::unexpected(std::move(record.error()));
  SandboxRecord updated = *record;
  if (claim) {
    if (mutate) mutate(updated);
    updated.state = SandboxState::kRunning;
    updated.pooled = false;
    // For its user the sandbox is created now, by their request.
    updated.created_at_ms = options_.now_ms();
  } else {
    // Still pooled, so that the API never sees it on its way out.
    updated.state = SandboxState::kDestroying;
    updated.pooled = true;
  }
  updated.id = record->id;
  updated.template_name = record->template_name;
  auto committed = CommitEdit(*tx, std::move(updated));
  if (!committed) return std::unexpected(std::move(committed.error()));
  return std::optional<SandboxRecord>(std::move(*committed));
}

Result<std::optional<SandboxRecord>> Store::ClaimPooled(
    std::string_view template_name, const std::function<void(SandboxRecord&)>& mutate) {
  return TakePooled(template_name, /*claim=*/true, mutate);
}

Result<std::optional<SandboxRecord>> Store::TakePooledForDestroy(std::string_view template_name) {
  return TakePooled(template_name, /*claim=*/false, {});
}

Result<std::map<std::string, int64_t>> Store::CountPooledReady() {
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare(
      "SELECT template_name, count(*) FROM sandboxes WHERE pooled = 1 AND state = 'running' "
      "GROUP BY template_name");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  std::map<std::string, int64_t> counts;
  while (true) {
    auto row = stmt->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap("counting pooled sandboxes"));
    if (!*row) break;
    counts[stmt->ColumnText(0)] = stmt->ColumnInt(1);
  }
  return counts;
}

Status Store::SetPoolSize(std::string_view template_name, int64_t size) {
  if (size < 0) return Fail(ErrorCode::kInvalidArgument, "a pool size must not be negative");
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare(
      "INSERT INTO pools (template_name, size) VALUES (?, ?) "
      "ON CONFLICT (template_name) DO UPDATE SET size = excluded.size");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, template_name).Bind(2, size);
  auto done = stmt->Run();
  if (!done) {
    return std::unexpected(
        std::move(done.error()).Wrap("recording the pool size of " + std::string(template_name)));
  }
  return {};
}

Result<std::map<std::string, int64_t>> Store::PoolSizes() {
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare("SELECT template_name, size FROM pools ORDER BY template_name");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  std::map<std::string, int64_t> sizes;
  while (true) {
    auto row = stmt->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap("reading pool sizes"));
    if (!*row) break;
    sizes[stmt->ColumnText(0)] = stmt->ColumnInt(1);
  }
  return sizes;
}

Status Store::CheckIntegrity() {
  std::lock_guard lock(mu_);
  auto report = db_.PragmaText("integrity_check");
  if (!report) return std::unexpected(std::move(report.error()));
  if (*report != "ok") return Fail(ErrorCode::kInternal, "integrity_check: " + *report);
  return {};
}

}  // namespace airlock::store
