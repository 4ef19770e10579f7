#pragma once
// The API's typed requests (docs/api/openapi.yaml is the contract; keep the limits below and the
// schemas there in step). Each request is validated completely here, at the edge: a value that
// leaves FromJson / FromQuery is in range, and the controller may trust it.
//
// Every refusal is kInvalidArgument (HTTP 400) except a body over kMaxJsonBodyBytes (kTooLarge,
// 413); the message names the field ("env[\"1X\"]", "argv[3]"), the rule and the value sent.

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "daemon/api/query.h"
#include "net/policy.h"
#include "runtime/engine.h"

namespace airlock::api {

// Sandbox limits. Defaults come from runtime::Limits (1 cpu, 512 MiB, 256 pids, 1024 MiB disk).
inline constexpr double kMaxCpus = 64;  // cpus is in (0, kMaxCpus], fractions allowed
inline constexpr int64_t kMinMemoryMb = 16;
inline constexpr int64_t kMaxMemoryMb = 262144;
inline constexpr int64_t kMinPidsMax = 8;
inline constexpr int64_t kMaxPidsMax = 65536;
inline constexpr int64_t kMinDiskMb = 16;
inline constexpr int64_t kMaxDiskMb = 1048576;
inline constexpr int64_t kDefaultTtlSeconds = 3600;
inline constexpr int64_t kMaxTtlSeconds = 30 * 24 * 3600;
inline constexpr std::string_view kDefaultTemplate = "base";
// A template's root, as stored and shown: over the host's /usr ("base", for engines that can),
// or a whole root file system of its own in its bottom layer ("rootfs").
inline constexpr std::string_view kRootHostUsr = "base";
inline constexpr std::string_view kRootOwn = "rootfs";
// An engine's name: 1-32 of [a-z0-9-] (which engines exist, GET /v1/engines says).
inline constexpr size_t kMaxEngineNameBytes = 32;
// The tenant of records made before tenancy, and of the admin key made at first start.
inline constexpr std::string_view kAdminTenant = "admin";
inline constexpr size_t kMaxTemplateNameBytes = 64;  // [a-z0-9][a-z0-9._-]*

// Environment (sandbox-wide on create, per command on exec): KEY matches [A-Za-z_][A-Za-z0-9_]*.
inline constexpr size_t kMaxEnvEntries = 256;
inline constexpr size_t kMaxEnvKeyBytes = 256;
inline constexpr size_t kMaxEnvValueBytes = 32768;

// Metadata: free-form labels for filtering; keys [A-Za-z0-9_.-]{1,64}, values strings.
inline constexpr size_t kMaxMetadataEntries = 64;
inline constexpr size_t kMaxMetadataKeyBytes = 64;
inline constexpr size_t kMaxMetadataValueBytes = 1024;

// Exec.
inline constexpr double kMaxTimeoutSeconds = 86400;  // timeout_seconds is in (0, 86400]
inline constexpr double kDefaultTimeoutSeconds = 300;
inline constexpr size_t kMaxCmdBytes = 131072;  // Linux's MAX_ARG_STRLEN
inline constexpr size_t kMaxArgvEntries = 4096;
inline constexpr size_t kMaxArgBytes = 131072;      // each argv element
inline constexpr size_t kMaxStdinBytes = 4u << 20;  // after base64 decoding
inline constexpr size_t kMaxUserBytes = 32;

// Paths inside a sandbox (cwd, files): absolute or relative, no NUL. They are resolved inside
// the sandbox's root by the agent, so ".." cannot leave it and is not refused here.
inline constexpr size_t kMaxPathBytes = 4096;

// Caps on non-JSON bodies, enforced by the HTTP layer while reading (413 when exceeded).
inline constexpr uint64_t kMaxFileBytes = 256ull << 20;  // PUT / GET .../files
inline constexpr uint64_t kMaxTarBytes = 256ull << 20;  // PUT / GET .../files/tar (in memory)

using EnvMap = std::map<std::string, std::string>;
using Metadata = std::map<std::string, std::string>;

// The state names the API shows and filters on. They mirror store::SandboxStateName
// (src/daemon/store/sandbox_state.h); the daemon's tests should check the two agree.
inline constexpr std::string_view kSandboxStateNames[] = {
    "creating", "running", "paused", "hibernated", "destroying", "destroyed", "failed",
};

// POST /v1/sandboxes. Every field is optional.
// Which of the limits a request set (the others come from the template, then the defaults).
struct LimitFields {
  bool cpus = false, memory_mb = false, pids_max = false, disk_mb = false;
  // `from`'s fields that are set here, over `into`.
  void Apply(const runtime::Limits& from, runtime::Limits& into) const;
  // Marks as set what `other` sets too.
  void Add(const LimitFields& other) {
    cpus |= other.cpus;
    memory_mb |= other.memory_mb;
    pids_max |= other.pids_max;
    disk_mb |= other.disk_mb;
  }
};

struct CreateSandboxRequest {
  std::string template_name{kDefaultTemplate};  // JSON "template"
  int64_t ttl_seconds = kDefaultTtlSeconds;
  // JSON "auto_pause": {"idle_seconds": N, "memory": bool}: paused (memory: hibernated) after
  // N seconds without a call that uses its agent (exec, files, processes) and with no command in
  // the foreground; the next such call resumes it (docs/design/metrics.md, "Auto-pause"). 0:
  // never. Needs Capabilities::pause (memory: memory_checkpoint). The older
  // "auto_hibernate_seconds": N is {"idle_seconds": N, "memory": true}.
  int64_t auto_pause_seconds = 0;
  bool auto_pause_memory = false;
  runtime::Limits limits;  // cpus, memory_mb, pids_max, disk_mb from the body; the rest default
  LimitFields limits_given;
  EnvMap env;
  Metadata metadata;
  // JSON "network" (docs/design/network.md); mode none by default. JSON "secrets" (the secrets
  // bound, docs/design/credentials.md) is in it too (NetworkPolicy::secrets), with placeholders
  // made for them.
  net::NetworkPolicy network;
  // The engine (docs/design/engines.md); "": the template's, else the daemon's default.
  std::string engine;
  // The tenant the sandbox will belong to: never from the body; the router sets the caller's.
  std::string tenant{kAdminTenant};

  [[nodiscard]] static Result<CreateSandboxRequest> FromJson(std::string_view body);
};

// kInvalidArgument unless `tenant` is 1-64 of [A-Za-z0-9._-] (store::ValidateTenant's rule).
[[nodiscard]] Status CheckTenantName(std::string_view tenant, std::string_view what);

// PUT /v1/tenants/{name}/quota: {"sandboxes"?, "cpus"?, "memory_mb"?, "disk_mb"?,
// "creates_per_minute"?}; a field absent or 0 is unlimited; all of them 0 (or {}) removes the
// quota (docs/design/tenancy.md, "Quotas").
inline constexpr int64_t kMaxQuotaCount = 1'000'000;  // sandboxes, creates_per_minute
inline constexpr double kMaxQuotaCpus = 1'000'000;
inline constexpr int64_t kMaxQuotaMb = int64_t{1} << 40;  // memory_mb, disk_mb
struct QuotaRequest {
  int64_t sandboxes = 0;
  double cpus = 0;
  int64_t memory_mb = 0;
  int64_t disk_mb = 0;
  int64_t creates_per_minute = 0;

  [[nodiscard]] static Result<QuotaRequest> FromJson(std::string_view body);
};

// POST /v1/keys: {"name": 1-64 printable ASCII, "tenant": CheckTenantName, "admin"?: false}.
struct CreateKeyRequest {
  std::string name;
  std::string tenant;
  bool admin = false;

  [[nodiscard]] static Result<CreateKeyRequest> FromJson(std::string_view body);
};

// Secrets (docs/secrets.md): a name is also an environment variable's name; a value goes into
// the HTTP requests the egress proxy forwards, so it may not break a header. No message about a
// value ever holds any of it: not its bytes, not the JSON around them.
inline constexpr size_t kMaxSecretNameBytes = 128;
inline constexpr size_t kMaxSecretValueBytes = 65536;
// kInvalidArgument unless `name` matches [A-Za-z_][A-Za-z0-9_]{0,127} (store::ValidateSecretName's
// rule). The message does not quote the name either: a caller may have swapped name and value.
[[nodiscard]] Status CheckSecretName(std::string_view name);
// kInvalidArgument unless `value` has 1 to kMaxSecretValueBytes bytes, none of them CR, LF or
// NUL. The message says which rule, never what the value holds.
[[nodiscard]] Status CheckSecretValue(std::string_view value);

// POST /v1/secrets: {"name", "value"}.
struct CreateSecretRequest {
  std::string name;
  std::string value;

  [[nodiscard]] static Result<CreateSecretRequest> FromJson(std::string_view body);
};

// PUT /v1/secrets/{name}: {"value"}.
struct UpdateSecretRequest {
  std::string value;

  [[nodiscard]] static Result<UpdateSecretRequest> FromJson(std::string_view body);
};

// The query of every /v1/secrets route: "tenant" alone, at most once (CheckTenantName). Only
// an admin key may name a tenant other than its own (the router's rule).
struct SecretsQuery {
  std::optional<std::string> tenant;

  [[nodiscard]] static Result<SecretsQuery> FromQuery(const QueryParams& params);
};

// PUT /v1/pools/{template}: {"size": N}, N from 0 to kMaxPoolSize. 0 empties the pool.
inline constexpr int64_t kMaxPoolSize = 256;
struct PoolSizeRequest {
  int64_t size = 0;

  [[nodiscard]] static Result<PoolSizeRequest> FromJson(std::string_view body);
};
// kInvalidArgument unless `name` names a template: a template's own name
// ([a-z0-9][a-z0-9._-]*, <= 64) or a Debian base ("debian:<suite>", made on first use).
[[nodiscard]] Status CheckTemplateName(std::string_view name);
// The entries of a KEY=value list (an OCI image's config Env) that a request's env could hold;
// the others are left out.
EnvMap EnvFromImage(const std::vector<std::string>& list);

// "debian:<suite>", suite [a-z][a-z0-9-]* (bookworm, trixie, ...): a root file system that
// mmdebstrap makes from Debian's packages. Returns the suite, or "" for any other name.
std::string_view DebianSuite(std::string_view name);

// POST /v1/templates (docs/design/templates.md):
//   {"name", "base"?: "base" | a ready template | "debian:<suite>" | an absolute path to an
//    OCI image archive on the daemon's host (below its image_dir), "steps"?: [{"run": "...", "user"?,
//    "timeout_seconds"?} | {"copy": {"path", "content", "encoding"?: "utf-8" | "base64",
//    "mode"?: "0644"}}], "env"?, "workdir"?, "cpus"? ... "disk_mb"?, "start_cmd"?, "ready_cmd"?,
//    "ready_timeout_seconds"?, "stream"?}
inline constexpr size_t kMaxTemplateSteps = 256;
inline constexpr double kDefaultStepTimeoutSeconds = 1800;
inline constexpr double kDefaultReadyTimeoutSeconds = 60;
inline constexpr double kMaxReadyTimeoutSeconds = 600;
struct TemplateStep {
  std::string run;   // a shell command; empty for a copy
  std::string user;  // run: who runs it (default root)
  double timeout_seconds = kDefaultStepTimeoutSeconds;
  std::string path;     // copy: where the file goes (absolute)
  std::string content;  // copy: the bytes (decoded)
  uint32_t mode = 0644;
  bool is_copy() const { return run.empty(); }
};
struct CreateTemplateRequest {
  std::string name;
  std::string base{kDefaultTemplate};
  std::vector<TemplateStep> steps;
  EnvMap env;           // every sandbox of the template (and every step) gets it
  std::string workdir;  // commands' default cwd; empty: the user's home
  runtime::Limits limits;
  LimitFields limits_given;
  std::string start_cmd;  // started in the background as each sandbox is created
  std::string ready_cmd;  // run until it exits 0 before a create returns
  double ready_timeout_seconds = kDefaultReadyTimeoutSeconds;
  // Run once, after the steps, in a sandbox of the new template (its start_cmd and ready_cmd
  // done); once it exits 0 the sandbox's processes and memory are saved and every create of the
  // template restores them instead of booting (Capabilities::memory_fork). "": no memory
  // snapshot.
  std::string snapshot_after;
  bool stream = false;  // answer with NDJSON build events as they happen
  // The build sandbox's network (a create's "network"); not a setting of the template: its
  // sandboxes get the network their own create asks for.
  net::NetworkPolicy network;
  // The engine the build runs on, and the template's sandboxes after ("": the base template's,
  // else the daemon's default).
  std::string engine;
  // The template's owner: "" (shared) or a tenant. Never from the body: the router sets it.
  std::string tenant;

  [[nodiscard]] static Result<CreateTemplateRequest> FromJson(std::string_view body);
};

// What a template gives the sandboxes made from it, as stored with the template (JSON):
// {"base", "root", "engine", "env", "workdir", "limits": {given ones}, "start_cmd", "ready_cmd",
//  "ready_timeout_seconds", "snapshot_after"?, "memory_snapshot"?: {"image", "bytes"},
//  "steps": [{"run"} | {"copy": {"path", "bytes", "mode"}}]}.
struct TemplateSettings {
  std::string base{kDefaultTemplate};
  // The root under the template's layers: kRootHostUsr (the host's /usr/bin, ...) or kRootOwn
  // (the bottom layer is a Debian or OCI image's whole root).
  std::string root{kRootHostUsr};
  // The engine its sandboxes get when a create names none ("": the daemon's default): the one
  // it was built on.
  std::string engine;
  EnvMap env;
  std::string workdir;
  runtime::Limits limits;
  LimitFields limits_given;
  std::string start_cmd, ready_cmd;
  double ready_timeout_seconds = kDefaultReadyTimeoutSeconds;
  std::string snapshot_after;
  // The memory image its creates restore (its build saved it after snapshot_after), and its
  // size on disk; "": its sandboxes boot.
  std::string memory_image;
  uint64_t memory_image_bytes = 0;

  static TemplateSettings From(const CreateTemplateRequest& request);
  // The stored JSON; steps are described (copy contents are not kept).
  [[nodiscard]] std::string ToJson(const std::vector<TemplateStep>& steps) const;
  [[nodiscard]] static Result<TemplateSettings> FromJson(std::string_view text);
};

// POST /v1/sandboxes/{id}/pause: {"memory"?: bool}. Without memory (or false) the sandbox is
// frozen in place (paused); with it, saved to disk with its memory and stopped (hibernated).
struct PauseRequest {
  bool memory = false;
  [[nodiscard]] static Result<PauseRequest> FromJson(std::string_view body);
};

// POST /v1/sandboxes/{id}/snapshot: {"name"}.
struct SnapshotRequest {
  std::string name;
  std::string tenant;  // the template's owner, "" for shared; set by the router, not the body
  [[nodiscard]] static Result<SnapshotRequest> FromJson(std::string_view body);
};

// POST /v1/sandboxes/{id}/fork: {"count"?: 1..kMaxForkCount, "ttl_seconds"?, "metadata"?,
// "memory"?: bool}.
inline constexpr int64_t kMaxForkCount = 32;
struct ForkRequest {
  int64_t count = 1;
  // Carry the source's processes and memory too (Capabilities::memory_fork): each fork is
  // restored from one memory image of the source, which runs on.
  bool memory = false;
  int64_t ttl_seconds = kDefaultTtlSeconds;
  std::optional<Metadata> metadata;  // default: the source's, plus airlock.forked_from
  std::string tenant{kAdminTenant};  // the forks' owner: set by the router, not the body
  [[nodiscard]] static Result<ForkRequest> FromJson(std::string_view body);
};

// PATCH /v1/sandboxes/{id}: at least one field. ttl_seconds restarts the TTL from now.
// metadata is a merge patch (RFC 7396): a string sets the key, null removes it.
// PATCH /v1/sandboxes/{id} "limits": a live change (cpus, memory_mb, pids_max, each in the
// create's range; at least one). disk_mb is refused: the writable layer is fixed at create.
struct LimitsPatch {
  std::optional<double> cpus;
  std::optional<int64_t> memory_mb;
  std::optional<int64_t> pids_max;
  // `current` with the patch over it.
  runtime::Limits Over(runtime::Limits current) const {
    if (cpus) current.cpus = *cpus;
    if (memory_mb) current.memory_mb = static_cast<uint64_t>(*memory_mb);
    if (pids_max) current.pids_max = static_cast<uint64_t>(*pids_max);
    return current;
  }
};

struct PatchSandboxRequest {
  std::optional<int64_t> ttl_seconds;
  std::optional<LimitsPatch> limits;
  std::optional<net::NetworkPolicy> network;  // a live change of the policy
  // The secrets bound, all of them (a secret bound before keeps its placeholder; the controller
  // puts it back). Unset: they stay as they are, whatever `network` says.
  std::optional<std::vector<net::SecretBinding>> secrets;
  std::map<std::string, std::optional<std::string>> metadata;

  [[nodiscard]] static Result<PatchSandboxRequest> FromJson(std::string_view body);
  // Applies the metadata patch to `current`; kInvalidArgument (nothing changed) if the result
  // would hold more than kMaxMetadataEntries keys.
  [[nodiscard]] Status ApplyMetadata(Metadata& current) const;
};

// POST /v1/sandboxes/{id}/exec. Exactly one of cmd (run as /bin/sh -c cmd) and argv.
struct ExecRequest {
  std::string cmd;                // non-empty iff argv is empty
  std::vector<std::string> argv;  // argv[0] non-empty; looked up in PATH by the agent
  std::string cwd;                // empty: the user's home directory
  EnvMap env;                     // on top of the sandbox's env
  std::string stdin_data;         // JSON "stdin"; decoded when "stdin_encoding" is "base64"
  double timeout_seconds = kDefaultTimeoutSeconds;
  std::string user;  // a user name or a numeric uid; empty: the sandbox's default user
  bool stream = false;  // answer with NDJSON events as they happen (render.h)
  bool background = false;  // start and answer with the process entry at once (not with stream)
  bool stdin_open = false;  // stdin stays a pipe after stdin_data, for later writes
  struct Pty {
    uint16_t cols = 80, rows = 24;  // 1..1000 each
  };
  std::optional<Pty> pty;  // run on a new terminal (stdout and stderr as one stream)
  bool timeout_given = false;  // timeout_seconds was in the request (background: else none)

  bool is_shell() const { return !cmd.empty(); }
  [[nodiscard]] static Result<ExecRequest> FromJson(std::string_view body);
};

// A signal as the API takes it (processes/{pid}/signal, the WebSocket "signal" message): a
// name with or without "SIG", in any case ("TERM", "SIGINT", "sigterm"), or a JSON integer
// 1..64. `field` names it in errors.
[[nodiscard]] Result<int> ParseSignal(const nlohmann::json& value,
                                      std::string_view field = "signal");

// POST .../processes/{pid}/signal: {"signal"}.
struct SignalRequest {
  int signo = 0;
  [[nodiscard]] static Result<SignalRequest> FromJson(std::string_view body);
};

// POST .../processes/{pid}/stdin: {"data"?, "encoding"?: "utf-8" | "base64", "close"?}.
struct StdinRequest {
  std::string data;  // decoded; at most kMaxStdinBytes
  bool close = false;
  [[nodiscard]] static Result<StdinRequest> FromJson(std::string_view body);
};

// POST .../processes/{pid}/wait: {"timeout_seconds"?} (an empty body takes the default).
inline constexpr double kDefaultWaitSeconds = 30;
inline constexpr double kMaxWaitSeconds = 300;  // a wait holds a worker thread
struct WaitRequest {
  double timeout_seconds = kDefaultWaitSeconds;
  [[nodiscard]] static Result<WaitRequest> FromJson(std::string_view body);
};

// A pid in a route: decimal digits only, 1..2^31-1 (a pid inside the sandbox).
[[nodiscard]] Result<int32_t> ParsePid(std::string_view text);

// GET .../processes/{pid}/output?follow=true|false
struct OutputQuery {
  bool follow = false;
  [[nodiscard]] static Result<OutputQuery> FromQuery(const QueryParams& params);
};

// GET .../processes/{pid}/ws?replay=true|false
struct ReplayQuery {
  bool replay = true;
  [[nodiscard]] static Result<ReplayQuery> FromQuery(const QueryParams& params);
};

// GET .../network/events?after=SEQ&limit=N: verdicts with seq > after, oldest first.
struct NetworkEventsQuery {
  static constexpr int64_t kMaxLimit = 1000;
  int64_t after = 0;           // 0 .. 2^63-1
  int64_t limit = kMaxLimit;   // 1 .. kMaxLimit
  [[nodiscard]] static Result<NetworkEventsQuery> FromQuery(const QueryParams& params);
};

// GET /v1/sandboxes/{id}/events?after=SEQ&limit=N&type=T,...&follow=1&format=F: the flight
// recorder's events (docs/design/recorder.md) with seq > after, oldest first.
struct EventsQuery {
  static constexpr int64_t kMaxLimit = 1000;
  static constexpr size_t kMaxTypes = 16;
  enum class Format { kPage, kJsonLines, kServerSentEvents };
  int64_t after = 0;          // 0 .. 2^63-1
  int64_t limit = kMaxLimit;  // 1 .. kMaxLimit: a page's size (the streams ignore it)
  // Types, or the part before a dot ("exec" is exec.start and exec.end): 1-32 of [a-z._], at
  // most kMaxTypes. Empty: every type.
  std::vector<std::string> types;
  bool follow = false;  // a live stream: what is stored, then each event as it is recorded
  // "json" (a page; not with follow), "jsonl" (every event, a line each), "sse" (the default
  // with follow: Server-Sent Events).
  Format format = Format::kPage;
  [[nodiscard]] static Result<EventsQuery> FromQuery(const QueryParams& params);
};

// GET .../metrics?start=MS&end=MS&limit=N: the samples with start <= at_ms <= end (unix ms),
// the newest `limit` of them.
struct MetricsQuery {
  static constexpr int64_t kMaxLimit = 10000;
  static constexpr int64_t kDefaultLimit = 1000;
  int64_t start_ms = 0;
  int64_t end_ms = INT64_MAX;
  int64_t limit = kDefaultLimit;  // 1 .. kMaxLimit
  [[nodiscard]] static Result<MetricsQuery> FromQuery(const QueryParams& params);
};

// "KEY=VALUE" strings, as runtime::SandboxSpec and the agent protocol take them.
std::vector<std::string> EnvList(const EnvMap& env);

// The file operations; each accepts its own set of query parameters.
enum class FileOp {
  kRead,    // GET    .../files?path=
  kWrite,   // PUT    .../files?path=[&mode=0644][&parents=true]
  kDelete,  // DELETE .../files?path=[&recursive=true]
  kList,    // GET    .../files/list?path=
  kMkdir,   // POST   .../files/mkdir?path=[&mode=0755][&parents=true]
  kTarGet,  // GET    .../files/tar?path=
  kTarPut,  // PUT    .../files/tar?path=
};

struct FileQuery {
  std::string path;
  std::optional<uint32_t> mode;  // permission bits (<= 07777), octal in the query: "0644"
  bool parents = false;          // create missing parent directories
  bool recursive = false;        // delete a directory and everything under it

  // Refuses unknown or repeated parameters, a missing path, and bad values. Booleans are
  // "true" / "false" / "1" / "0".
  [[nodiscard]] static Result<FileQuery> FromQuery(const QueryParams& params, FileOp op);
};

// GET /v1/sandboxes?state=running&metadata.team=ml&metadata.run=7 : every condition must hold.
struct ListFilter {
  std::optional<std::string> state;   // one of kSandboxStateNames
  Metadata metadata;                  // each key must be present with exactly this value
  std::optional<std::string> tenant;  // "tenant": CheckTenantName holds

  [[nodiscard]] static Result<ListFilter> FromQuery(const QueryParams& params);
  bool Matches(std::string_view sandbox_state, const Metadata& sandbox_metadata) const;
};

// The largest message a WebSocket client may send (text or binary); the server closes the
// session (1009) past it.
inline constexpr size_t kMaxWsMessageBytes = 1u << 20;

// One text message from a WebSocket client (exec/ws after its first message, processes/{pid}/ws;
// docs/design/processes.md). A binary message is raw stdin and needs no parsing.
//   {"type": "stdin", "data": "...", "encoding": "utf-8" | "base64"}   encoding defaults to utf-8
//   {"type": "stdin_close"}
//   {"type": "signal", "signal": "INT"}                                 see ParseSignal
//   {"type": "resize", "cols": 120, "rows": 40}                         each 1..1000
// Unknown types and fields are refused: a client that sends what the server does not understand
// is told so instead of being silently half-served.
struct WsClientMessage {
  enum class Type { kStdin, kStdinClose, kSignal, kResize };
  Type type = Type::kStdin;
  std::string data;  // kStdin: the bytes (decoded from base64 when sent so)
  int signal = 0;    // kSignal: 1..64
  uint16_t cols = 0, rows = 0;  // kResize: 1..1000 each

  [[nodiscard]] static Result<WsClientMessage> FromJson(std::string_view text);
};

// Rules shared with the HTTP layer (kInvalidArgument naming `what`).
[[nodiscard]] Status ValidatePath(std::string_view path, std::string_view what);
[[nodiscard]] Status ValidateMetadataKey(std::string_view key, std::string_view what);

}  // namespace airlock::api
