#pragma once
// Store: airlockd's durable records (sandboxes, templates, API keys, network verdicts, sealed
// secrets) in one
// SQLite database in WAL mode under the state dir. docs/design/store.md has the schema and the
// durability argument.
//
// Contract shared by every method:
//  - Thread-safe: one connection behind one mutex, so calls are serialized. Each call is a
//    single short transaction; none waits on anything but the disk.
//  - A write that returned success is committed with synchronous=FULL: it survives SIGKILL of
//    the daemon and a power cut.
//  - Ids are checked with ValidateSandboxId (kInvalidArgument) before any SQL runs. Strings are
//    always bound as parameters, never spliced into SQL.
//  - State checks happen inside the write transaction, so check-then-write is atomic.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/unique_fd.h"
#include "daemon/store/sandbox_state.h"
#include "daemon/store/sqlite.h"

namespace airlock::store {

// The tenant of the admin key made at first start, and of every record older than tenancy.
inline constexpr std::string_view kAdminTenant = "admin";
// kInvalidArgument unless `tenant` is 1-64 of [A-Za-z0-9._-].
[[nodiscard]] Status ValidateTenant(std::string_view tenant);

struct SandboxLimits {
  double cpus = 0;        // CPU quota in cores; 0 = none
  int64_t memory_mb = 0;  // 0 = none
  int64_t pids_max = 0;   // 0 = none
  int64_t disk_mb = 0;    // writable layer cap; 0 = none
  bool operator==(const SandboxLimits&) const = default;
};

struct SandboxRecord {
  std::string id;  // "sbx-..."; must pass ValidateSandboxId
  SandboxState state = SandboxState::kCreating;
  std::string engine;         // "jail", "gvisor", "microvm"
  std::string template_name;  // the template it was created from
  SandboxLimits limits;
  std::vector<std::string> env;                  // "NAME=value"
  std::map<std::string, std::string> metadata;   // the user's labels; filterable by List
  int64_t created_at_ms = 0;                     // unix ms, set by the store on Insert
  int64_t updated_at_ms = 0;                     // unix ms, set by the store on every write
  int64_t expires_at_ms = 0;                     // absolute unix ms TTL deadline; 0 = none
  // What its engine keeps about it (opaque to the daemon; runtime/engine.h), for adopt.
  std::string engine_state;
  // The daemon's own notes on the sandbox (its network slot, its workdir, ...).
  std::map<std::string, std::string> resources;
  std::string error;                             // why it failed / could not be recovered
  // Made by the warm-pool filler and not claimed by a create yet (docs/design/pools.md). The
  // API never shows such a record; a claim clears the flag.
  bool pooled = false;
  // The read-only layers under its root, topmost first: its template's, and for a fork the
  // snapshot it started from. A layer in use by any live record is never removed.
  std::vector<std::string> layers;
  // Its network policy as the API's `network` JSON (docs/design/network.md); "" for mode none.
  std::string network;
  // The tenant that owns it (docs/design/tenancy.md): the caller's key's tenant at create or
  // fork. Pooled records belong to "admin" until a claim gives them the claimer's.
  std::string tenant = std::string(kAdminTenant);
  // The secrets bound to it as the API's `secrets` JSON, placeholders included, never a value
  // (docs/design/credentials.md); "" for none.
  std::string secrets;
  bool operator==(const SandboxRecord&) const = default;
};

// A template (docs/design/templates.md): layers and the settings its sandboxes start with.
enum class TemplateState { kBuilding, kReady, kFailed };
std::string_view TemplateStateName(TemplateState state);

struct TemplateRecord {
  std::string name;  // api::CheckTemplateName holds; never "base"
  TemplateState state = TemplateState::kBuilding;
  std::string source;  // "build" or "snapshot of sbx-..."
  std::string spec;    // JSON object: base, steps, env, workdir, limits, start_cmd, ready_cmd
  std::vector<std::string> layers;  // digests, topmost first (empty while building)
  int64_t created_at_ms = 0;        // set by the store on insert
  int64_t updated_at_ms = 0;        // set by the store on every write
  std::string error;                // why a build failed
  // "" for a shared template (made by an admin, or older than tenancy): every tenant may use
  // it. Otherwise the tenant that made it by a build or snapshot; invisible to the others.
  std::string tenant;
  bool operator==(const TemplateRecord&) const = default;
};

// One network verdict of a sandbox's egress proxy or DNS stub, as stored (docs/design/network.md,
// "Verdicts"). The API's NetworkEvents schema shows the same fields.
struct NetworkEventRecord {
  int64_t seq = 0;    // per sandbox, from 1, in the order the verdicts were made; set by the store
  int64_t at_ms = 0;  // unix ms
  std::string kind;   // dns, connect, http, tls
  std::string name;   // what was asked for: a name, or an address as text
  std::string sni, host;
  std::string dest;  // the address dialled, or the addresses a DNS answer gave
  int64_t port = 0;
  std::string verdict;  // allowed, denied, closed (an allowed connection ended; bytes final)
  std::string rule, reason;
  int64_t bytes_up = 0, bytes_down = 0;
  bool operator==(const NetworkEventRecord&) const = default;
};

// What one write appends for one sandbox.
struct NetworkEventBatch {
  std::string sandbox;
  std::vector<NetworkEventRecord> events;  // oldest first; their seq is ignored
  int64_t dropped = 0;  // verdicts lost before they reached the store (a full queue)
};

// One page of a sandbox's verdicts.
struct NetworkEventPage {
  std::vector<NetworkEventRecord> events;  // seq > after, oldest first, at most `limit`
  bool more = false;       // events after the last one returned are stored
  int64_t last_seq = 0;    // the newest seq given out (0: none yet)
  int64_t dropped = 0;     // verdicts lost before the store, ever (they have no seq)
  int64_t trimmed = 0;     // stored verdicts removed to keep the newest `keep`
};

// One event of a sandbox's flight recorder, as stored (docs/design/recorder.md). The API's
// SandboxEvent schema shows the same fields, `data` as an object.
struct EventRecord {
  int64_t seq = 0;    // per sandbox, from 1, in the order the events were recorded; set by the store
  int64_t at_ms = 0;  // unix ms
  std::string type;   // "sandbox.created", "exec.start", "net.connect", "proc.exec", ...
  std::string data;   // a JSON object
  bool operator==(const EventRecord&) const = default;
};

// What one write appends for one sandbox: its events, and the network verdicts among them also
// to the verdicts' own table (GET .../network/events).
struct EventBatch {
  std::string sandbox;
  std::vector<EventRecord> events;           // oldest first; their seq is ignored
  std::vector<NetworkEventRecord> verdicts;  // likewise
  int64_t dropped = 0;          // events lost before they reached the store
  int64_t verdicts_dropped = 0;  // verdicts among them
};

// One page of a sandbox's events.
struct EventPage {
  std::vector<EventRecord> events;  // seq > after, of the types asked for, oldest first
  bool more = false;     // events after the last one returned are stored (of those types)
  int64_t last_seq = 0;  // the newest seq given out (0: none yet)
  int64_t dropped = 0;   // events lost before the store, ever (they have no seq)
  int64_t trimmed = 0;   // stored events removed to keep the newest `keep`
};

// One sample of what a sandbox used (docs/design/metrics.md); the API's MetricSample shows the
// same fields.
struct MetricSample {
  int64_t at_ms = 0;  // unix ms
  double cpu_seconds = 0;
  double cpu_cores = 0;  // the rate since the sample before
  int64_t memory_bytes = 0;
  int64_t memory_peak_bytes = 0;
  int64_t pids = 0;
  int64_t disk_bytes = 0;
  int64_t net_rx_bytes = 0;
  int64_t net_tx_bytes = 0;
  bool operator==(const MetricSample&) const = default;
};

// A sandbox's samples in a window.
struct MetricPage {
  std::vector<MetricSample> samples;  // oldest first
  bool truncated = false;             // older samples in the window were left out (the limit)
};

// A tenant's secret as stored (docs/design/secrets-store.md): sealed, never in clear. The store
// neither seals nor opens a value; daemon::SecretStore does, with a key the database never holds.
struct SecretRecord {
  std::string tenant;         // ValidateTenant
  std::string name;           // ValidateSecretName
  std::string ciphertext;     // AES-256-GCM ciphertext followed by its 16-byte tag
  std::string nonce;          // 12 bytes, fresh for every write
  std::string key_id;         // which key sealed it (SecretBox::key_id)
  int64_t version = 1;        // 1 at create, one more at every update; set by the store
  int64_t created_at_ms = 0;  // unix ms, set by the store on insert
  int64_t updated_at_ms = 0;  // unix ms, set by the store on every write
  bool operator==(const SecretRecord&) const = default;
};

// kInvalidArgument unless `name` matches [A-Za-z_][A-Za-z0-9_]{0,127} (an environment
// variable's name).
[[nodiscard]] Status ValidateSecretName(std::string_view name);

// A tenant's quota (docs/design/tenancy.md, "Quotas"): 0 in a field is unlimited.
struct TenantQuota {
  int64_t sandboxes = 0;           // sandboxes at once
  double cpus = 0;                 // sum of their cpus limits
  int64_t memory_mb = 0;           // sum of their memory_mb limits
  int64_t disk_mb = 0;             // sum of their disk_mb limits
  int64_t creates_per_minute = 0;  // creates (fork and pool claims included) in any minute
  bool empty() const {
    return sandboxes == 0 && cpus == 0 && memory_mb == 0 && disk_mb == 0 && creates_per_minute == 0;
  }
  bool operator==(const TenantQuota&) const = default;
};

// What a tenant's sandboxes hold: every record of the tenant that is not pooled, destroyed or
// failed (creating ones included: a create in flight holds its share).
struct TenantUsage {
  int64_t sandboxes = 0;
  double cpus = 0;
  int64_t memory_mb = 0;
  int64_t disk_mb = 0;
  bool operator==(const TenantUsage&) const = default;
};

struct ListFilter {
  std::vector<SandboxState> states;                           // any of these; empty = every state
  std::vector<std::pair<std::string, std::string>> metadata;  // key == value, all ANDed
  std::optional<bool> pooled;  // only pooled / only unpooled records; nullopt = both
  std::optional<std::string> tenant;  // only this tenant's records; nullopt = every tenant's
};

struct KeyInfo {
  int64_t id = 0;
  std::string name;
  std::string tenant = std::string(kAdminTenant);
  int64_t created_at_ms = 0;
  bool admin = false;
  bool revoked = false;
};

struct NewKey {
  KeyInfo info;
  std::string plaintext;  // "al_" + 64 hex digits; shown once, never stored
};

enum class AdminKeyState {
  kCreated,      // first start: a new admin key was written to STATE_DIR/admin.key
  kAdopted,      // admin.key existed without its hash in the database (a crash between the
                 // two writes); its key was stored
  kPresent,      // an admin key exists and admin.key is there: nothing to do
  kFileMissing,  // an admin key exists but admin.key is gone; NOT recreated (log it: the
                 // operator deleted it or it was lost; a new key needs an explicit action)
};

struct StoreOptions {
  // Wall clock in unix ms for created_at / updated_at / key creation. Tests inject one.
  std::function<int64_t()> now_ms;
};

class Store {
 public:
  // Opens the database at `path` (creating it 0600 if missing), sets WAL + synchronous=FULL +
  // busy_timeout + foreign_keys, and migrates the schema to the current version. Fails with
  // kFailedPrecondition on a database from a newer Airlock.
  [[nodiscard]] static Result<std::unique_ptr<Store>> Open(const std::string& path,
                                                           StoreOptions options = {});

  // The schema version this build writes (PRAGMA user_version).
  static int CurrentSchemaVersion();

  // An online, consistent copy of the whole database, an SQLite file open for reading (GET
  // /v1/admin/backup streams it). VACUUM INTO on a connection of its own: it reads one snapshot
  // while the daemon goes on writing, and the copy is compact. Made in a private (0600) file
  // beside the database, which is unlinked before this returns: it goes when the fd is closed.
  [[nodiscard]] Result<UniqueFd> Backup();

  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // --- Sandboxes -------------------------------------------------------------------------

  // Adds a record in state creating, before any resource exists. Sets created/updated_at.
  // kAlreadyExists if the id is taken; kInvalidArgument for a bad id, state or limits.
  [[nodiscard]] Result<SandboxRecord> Insert(SandboxRecord record);
  // kNotFound if there is no such record.
  [[nodiscard]] Result<SandboxRecord> Get(std::string_view id);
  // Records matching `filter`, oldest first.
  [[nodiscard]] Result<std::vector<SandboxRecord>> List(const ListFilter& filter = {});

  // Moves `id` to `to`, atomically: its current state must be one of `from` (empty: any state
  // the table lets reach `to`) and the pair must be in AllowedTransitions(). Otherwise
  // kFailedPrecondition (409) "sandbox sbx-.. is paused, not running". `mutate`, if given,
  // edits the record in the same transaction (id, state and created_at are kept).
  [[nodiscard]] Result<SandboxRecord> Transition(
      std::string_view id, std::span<const SandboxState> from, SandboxState to,
      const std::function<void(SandboxRecord&)>& mutate = {});
  // Transition to failed from wherever the table allows (or only from `from`), recording
  // `error`.
  [[nodiscard]] Result<SandboxRecord> MarkFailed(std::string_view id, std::string_view error,
                                                 std::span<const SandboxState> from = {});

  // Sets the absolute TTL deadline (0 clears it). Refused (409) once destroyed.
  [[nodiscard]] Result<SandboxRecord> UpdateTtl(std::string_view id, int64_t expires_at_ms);
  // Replaces the limits (a live change the engine has applied). Refused (409) once destroyed.
  [[nodiscard]] Result<SandboxRecord> UpdateLimits(std::string_view id,
                                                   const SandboxLimits& limits);
  // Replaces the whole metadata map. Refused (409) once destroyed.
  [[nodiscard]] Result<SandboxRecord> UpdateMetadata(std::string_view id,
                                                     std::map<std::string, std::string> metadata);
  // Replaces the network policy (JSON; "" for mode none) and the secrets bound (JSON; "" for
  // none); refused once destroyed.
  [[nodiscard]] Result<SandboxRecord> UpdateNetwork(std::string_view id, std::string network,
                                                    std::string secrets);
  // Records what the engine keeps and the daemon's notes, for recovery. Refused (409) once
  // destroyed.
  [[nodiscard]] Result<SandboxRecord> SetRuntimeInfo(std::string_view id, std::string engine_state,
                                                     std::map<std::string, std::string> resources);

  // Replaces what the engine keeps (a save with memory restarts a sandbox). Refused (409) once
  // destroyed.
  [[nodiscard]] Result<SandboxRecord> SetEngineState(std::string_view id, std::string state);
  // Sets one entry of the record's resources ("" removes it). Refused (409) once destroyed.
  [[nodiscard]] Result<SandboxRecord> SetResource(std::string_view id, const std::string& key,
                                                  const std::string& value);

  // Removes one destroyed record (409 if it is not destroyed, 404 if absent).
  [[nodiscard]] Status Delete(std::string_view id);
  // Removes destroyed records last updated before `cutoff_ms`; returns how many.
  [[nodiscard]] Result<int64_t> PurgeDestroyed(int64_t cutoff_ms);

  // Ids whose deadline is set and <= now_ms, not already destroying or destroyed; oldest
  // deadline first. The reaper destroys them.
  [[nodiscard]] Result<std::vector<std::string>> Expired(int64_t now_ms);
  // Number of records in each state, every state present (for /metrics). Pooled records are
  // not counted (the pool metrics show them).
  [[nodiscard]] Result<std::map<SandboxState, int64_t>> CountByState();

  // --- Warm pools (docs/design/pools.md) ---------------------------------------------------

  // Claims the oldest ready pooled sandbox of `template_name` (pooled, running): in one
  // transaction it stops being pooled, `mutate` gives it the caller's settings (id, state and
  // template are kept) and created_at becomes now. nullopt when the pool has none ready. Two
  // callers never get the same record.
  [[nodiscard]] Result<std::optional<SandboxRecord>> ClaimPooled(
      std::string_view template_name, const std::function<void(SandboxRecord&)>& mutate);
  // Moves the oldest ready pooled sandbox of `template_name` to destroying (still pooled, so
  // still hidden), for shrinking a pool; nullopt when there is none.
  [[nodiscard]] Result<std::optional<SandboxRecord>> TakePooledForDestroy(
      std::string_view template_name);
  // Ready pooled sandboxes (pooled, running) per template; templates with none are absent.
  [[nodiscard]] Result<std::map<std::string, int64_t>> CountPooledReady();
  // The pool size set through the API for `template_name` (kept across restarts).
  [[nodiscard]] Status SetPoolSize(std::string_view template_name, int64_t size);
  // Every pool size recorded by SetPoolSize.
  [[nodiscard]] Result<std::map<std::string, int64_t>> PoolSizes();

  // --- Network verdicts (events.cc; docs/design/network.md) -------------------------------

  // Appends each batch's events to its sandbox's, numbered on from its last seq, adds its
  // dropped count, then removes all but the newest `keep` (>= 1) of that sandbox: one
  // transaction for every batch. A batch whose sandbox has no record (purged meanwhile) is
  // skipped. Events of a sandbox go when its record is deleted or purged.
  [[nodiscard]] Status AppendNetworkEvents(std::span<const NetworkEventBatch> batches,
                                           int64_t keep);
  // The sandbox's stored events with seq > `after`, oldest first, at most `limit` (>= 1), and
  // its counters. A sandbox with no events (or no record) gets an empty page.
  [[nodiscard]] Result<NetworkEventPage> NetworkEvents(std::string_view id, int64_t after,
                                                       int64_t limit);

  // --- The flight recorder (events.cc; docs/design/recorder.md) -------------------------

  // Appends each batch's events to its sandbox's as AppendNetworkEvents does (numbered on,
  // its dropped count added, all but the newest `keep` removed), and its verdicts to the
  // verdicts' table (newest `verdicts_keep` kept): one transaction for every batch. A batch with
  // dropped events gets a "recorder.dropped" event ({"count": n}) after its own.
  [[nodiscard]] Status AppendEvents(std::span<const EventBatch> batches, int64_t keep,
                                    int64_t verdicts_keep);
  // The sandbox's stored events with seq > `after` whose type is one of `types` or starts with
  // one of them and a dot ("exec" is exec.start and exec.end; empty: every type), oldest first,
  // at most `limit` (>= 1), and its counters. No events (or no record): an empty page.
  [[nodiscard]] Result<EventPage> Events(std::string_view id, int64_t after,
                                         std::span<const std::string> types, int64_t limit);

  // --- Metrics samples (metric_samples.cc; docs/design/metrics.md) ------------------------

  // Adds one sample for each (sandbox, sample) pair, then keeps the newest `keep` (>= 1) of each
  // sandbox: one transaction for all. A sandbox with no record (purged meanwhile) is skipped; a
  // second sample of a sandbox at the same at_ms replaces the first. Samples go with the record.
  [[nodiscard]] Status AppendMetrics(
      std::span<const std::pair<std::string, MetricSample>> samples, int64_t keep);
  // The sandbox's samples with start_ms <= at_ms <= end_ms, oldest first: the newest `limit`
  // (>= 1) of them when there are more (truncated). Empty for a sandbox with none.
  [[nodiscard]] Result<MetricPage> Metrics(std::string_view id, int64_t start_ms, int64_t end_ms,
                                           int64_t limit);

  // --- Templates (templates.cc; docs/design/templates.md) ---------------------------------

  // Adds a template (state building unless the record says otherwise); kAlreadyExists if the
  // name is taken, whatever its state.
  [[nodiscard]] Result<TemplateRecord> InsertTemplate(TemplateRecord record);
  [[nodiscard]] Result<TemplateRecord> GetTemplate(std::string_view name);
  // Every template, by name.
  [[nodiscard]] Result<std::vector<TemplateRecord>> ListTemplates();
  // Writes state, layers, spec and error of an existing template.
  [[nodiscard]] Result<TemplateRecord> UpdateTemplate(const TemplateRecord& record);
  // Removes a template, atomically refusing (kFailedPrecondition, 409) while a sandbox that is
  // not destroyed or failed (pooled ones included) was made from it, or while it is building.
  [[nodiscard]] Status DeleteTemplate(std::string_view name);
  // Every layer digest that a template or a sandbox not yet destroyed or failed refers to.
  [[nodiscard]] Result<std::set<std::string>> LayersInUse();

  // --- Secrets (secrets.cc; docs/design/secrets-store.md) ---------------------------------
  // Sealed values only. A secret is named within its tenant: (tenant, name) is the key, and
  // every call names both. kNotFound says "secret 'NAME' does not exist", whoever else has one.

  // Adds a secret at version 1 (ciphertext, nonce and key_id from `record`); kAlreadyExists if
  // the tenant has one of that name.
  [[nodiscard]] Result<SecretRecord> InsertSecret(SecretRecord record);
  // Replaces the sealed value (ciphertext, nonce, key_id) of the tenant's secret `record.name`
  // and adds one to its version, in one statement; kNotFound if the tenant has none.
  [[nodiscard]] Result<SecretRecord> UpdateSecret(const SecretRecord& record);
  [[nodiscard]] Result<SecretRecord> GetSecret(std::string_view tenant, std::string_view name);
  // The tenant's secrets by name, without their sealed values (ciphertext and nonce empty).
  [[nodiscard]] Result<std::vector<SecretRecord>> ListSecrets(std::string_view tenant);
  [[nodiscard]] Status DeleteSecret(std::string_view tenant, std::string_view name);
  // How many secrets, every tenant's, each key id sealed; empty when there are none.
  [[nodiscard]] Result<std::map<std::string, int64_t>> CountSecretsByKey();

  // --- Tenant quotas (quotas.cc; docs/design/tenancy.md) ---------------------------------

  // Sets the tenant's quota; an empty one (every field 0) removes it. kInvalidArgument for a
  // bad tenant or a negative field.
  [[nodiscard]] Status SetQuota(std::string_view tenant, const TenantQuota& quota);
  // The tenant's quota; an empty one when none is set.
  [[nodiscard]] Result<TenantQuota> GetQuota(std::string_view tenant);
  // What the tenant's sandboxes hold now (TenantUsage).
  [[nodiscard]] Result<TenantUsage> Usage(std::string_view tenant);

  // --- API keys (api_keys.cc) ------------------------------------------------------------

  // A new random key; only its SHA-256 is stored. `name`: 1-64 printable ASCII characters;
  // `tenant`: ValidateTenant.
  [[nodiscard]] Result<NewKey> CreateKey(std::string_view name, bool admin = false,
                                         std::string_view tenant = kAdminTenant);
  // The key `presented` (the Bearer token) belongs to, if it is not revoked. Every failure is
  // the same kUnauthenticated error with the same message, whatever the reason.
  [[nodiscard]] Result<KeyInfo> Authenticate(std::string_view presented);
  // kNotFound for an unknown id; kFailedPrecondition (409) for the last admin key that is not
  // revoked (nobody could make keys any more). Revoking a revoked key succeeds.
  [[nodiscard]] Status RevokeKey(int64_t id);
  [[nodiscard]] Result<std::vector<KeyInfo>> ListKeys();
  // First start: creates an admin key and writes it to `state_dir`/admin.key (0600, written
  // to a temp file, fsynced, then linked into place so it never exists half written). Later
  // starts change nothing; see AdminKeyState for what is reported.
  [[nodiscard]] Result<AdminKeyState> EnsureAdminKey(const std::string& state_dir);

  // --- Maintenance -----------------------------------------------------------------------

  // PRAGMA integrity_check; kInternal with its report unless "ok".
  [[nodiscard]] Status CheckIntegrity();

 private:
  Store(Database db, StoreOptions options, std::string path);
  [[nodiscard]] Status Migrate();
  [[nodiscard]] Status MigrateLocked();  // Migrate's transaction, foreign keys off
  // Reads one record inside the caller's lock / transaction.
  [[nodiscard]] Result<SandboxRecord> GetLocked(std::string_view id);
  // Writes every mutable column of `record` (which must exist).
  [[nodiscard]] Status UpdateLocked(const SandboxRecord& record);
  // Stamps, validates and writes an edited record, then commits `tx`. Caller holds mu_.
  [[nodiscard]] Result<SandboxRecord> CommitEdit(Transaction& tx, SandboxRecord updated);
  // Get, check the state is not destroyed, edit, write: one transaction.
  [[nodiscard]] Result<SandboxRecord> EditUnlessDestroyed(
      std::string_view id, const std::function<void(SandboxRecord&)>& edit);
  // ClaimPooled (`claim`) and TakePooledForDestroy.
  [[nodiscard]] Result<std::optional<SandboxRecord>> TakePooled(
      std::string_view template_name, bool claim,
      const std::function<void(SandboxRecord&)>& mutate);
  // Appends `count` rows to `table` for one sandbox, numbered on from its row in `counters`,
  // and keeps the newest `keep` (events.cc). Caller holds mu_, in a transaction.
  [[nodiscard]] Status AppendLocked(std::string_view table, std::string_view counters,
                                    std::string_view sandbox, int64_t count,
                                    int64_t dropped, int64_t keep,
                                    const std::function<Status(int64_t index, int64_t seq)>& insert);
  [[nodiscard]] Result<KeyInfo> InsertKeyLocked(std::string_view name, std::string_view hash_hex,
                                                bool admin, std::string_view tenant);

  std::mutex mu_;
  Database db_;  // guarded by mu_
  StoreOptions options_;
  std::string path_;  // the database file, for Backup's connection of its own
};

}  // namespace airlock::store
