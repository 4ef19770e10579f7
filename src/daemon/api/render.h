#pragma once
// Response bodies: sandboxes, exec results, file listings and errors, as JSON text.

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "daemon/api/types.h"
#include "runtime/engine.h"

namespace airlock::api {

// "2024-05-01T12:34:56.789Z": UTC, milliseconds, truncated toward the past.
std::string FormatTimestamp(std::chrono::system_clock::time_point t);

struct SandboxView {
  std::string id;
  std::string state;  // one of kSandboxStateNames (store::SandboxStateName)
  std::string template_name;
  std::string engine;  // "jail", "gvisor", "microvm"
  std::chrono::system_clock::time_point created_at;
  std::chrono::system_clock::time_point expires_at;
  runtime::Limits limits;  // cpus, memory_mb, pids_max, disk_mb are shown
  Metadata metadata;       // env is never shown: it may hold secrets
  std::string error;       // why a failed sandbox failed (shown only when not empty)
  std::string network;     // its policy's JSON ("" for mode none)
  std::string secrets;     // the secrets bound, JSON with placeholders ("" for none)
  std::string address;     // its IPv4 address, when it has a network
  std::string address6;    // its IPv6 address, when its network has IPv6
  std::string tenant;      // the tenant that owns it
  uint64_t memory_image_bytes = 0;  // a hibernated sandbox's memory image on disk (shown if > 0)
  // Why a destroyed or failed sandbox ended: deleted, expired, failed, lost (shown if not empty),
  // and when (a destroyed one's).
  std::string end_reason;
  std::optional<std::chrono::system_clock::time_point> ended_at;
  // Its auto_pause (shown if idle_seconds > 0), and whether the idle sweep paused it (shown
  // while it did).
  int64_t auto_pause_seconds = 0;
  bool auto_pause_memory = false;
  bool auto_paused = false;
};

// `doc` as compact JSON text; bytes that are not UTF-8 are replaced, never thrown on.
std::string DumpJson(const nlohmann::json& doc);

// {"id", "state", "template", "engine", "created_at", "expires_at", "limits": {...},
//  "metadata": {...}, "network": {"mode", "allow", "deny", "bandwidth_mbps"?,
//  "max_connections"?, "address"?, "address6"?}, "error"?, "end_reason"?, "ended_at"?}
std::string RenderSandbox(const SandboxView& sandbox);
// {"sandboxes": [ ... ]}
std::string RenderSandboxList(std::span<const SandboxView> sandboxes);

// An API key as GET /v1/keys shows it: never its hash. `key` (the plaintext) only in the answer
// to its create, the one time it is shown.
struct KeyView {
  int64_t id = 0;
  std::string name;
  std::string tenant;
  bool admin = false;
  bool revoked = false;
  std::chrono::system_clock::time_point created_at;
  std::string key;  // "" except in the create's answer
};
// {"id", "name", "tenant", "admin", "revoked", "created_at", "key"?}
std::string RenderKey(const KeyView& key);
// {"keys": [ ... ]}
std::string RenderKeyList(std::span<const KeyView> keys);

// A secret as the API shows it (docs/secrets.md): never its value.
struct SecretView {
  std::string name;
  int64_t version = 0;
  std::chrono::system_clock::time_point created_at, updated_at;
};
// {"name", "version", "created_at", "updated_at"}
std::string RenderSecret(const SecretView& secret);
// {"secrets": [ ... ]}
std::string RenderSecretList(std::span<const SecretView> secrets);

// An engine as GET /v1/engines shows it (runtime/registry.h: EngineStatus).
struct EngineView {
  std::string name;
  std::string description;
  bool enabled = true;
  bool available = false;
  std::string reason;  // why not available
  bool is_default = false;
  runtime::Capabilities capabilities;  // when available
};

// {"engines": [{"name", "description", "enabled", "available", "reason"?, "default",
//  "capabilities"?: {...}}], "default"}
std::string RenderEngineList(std::span<const EngineView> engines, std::string_view default_name);

struct PoolView {
  std::string template_name;
  int64_t size = 0;   // the target
  int64_t ready = 0;  // pooled sandboxes ready to be claimed now
  uint64_t hits = 0;  // creates served from the pool since start
  uint64_t misses = 0;  // creates for this template that took the cold path since start
};

// {"template", "size", "ready", "hits", "misses"}
std::string RenderPool(const PoolView& pool);
// {"pools": [ ... ]}
std::string RenderPoolList(std::span<const PoolView> pools);

struct TemplateView {
  std::string name;
  std::string state;   // "building", "ready", "failed"
  std::string source;  // "build" or "snapshot of sbx-..."
  std::string settings;  // the stored settings (TemplateSettings JSON, with steps)
  std::vector<std::string> layers;
  std::chrono::system_clock::time_point created_at, updated_at;
  std::string error;  // why a build failed (shown only when not empty)
  std::string tenant;  // its owner; "" for a shared template (then not shown)
};

// {"name", "state", "source", "base", "layers", "env_keys", "workdir", "limits", "start_cmd",
//  "ready_cmd", "ready_timeout_seconds", "steps", "created_at", "updated_at", "error"?}. Env values
// are never shown (they may hold secrets), only their names.
std::string RenderTemplate(const TemplateView& view);
// {"templates": [ ... ]}; a template owned by a tenant also has "tenant".
std::string RenderTemplateList(std::span<const TemplateView> views);

// The answer to a fork: {"sandboxes": [...], "layer", "memory_carried", "note"}: `layer` the
// snapshot the forks start from ("" for a fork with memory, whose files are copied with it).
std::string RenderFork(std::span<const SandboxView> sandboxes, const std::string& layer,
                       bool memory_carried);

struct ExecResultView {
  int32_t exit_code = -1;  // as the agent reports it: -1 when killed by a signal
  int32_t signal = 0;      // the signal that ended the process, 0 if it exited
  std::string stdout_bytes;
  std::string stderr_bytes;
  uint64_t duration_ms = 0;
  bool timed_out = false;
  bool oom_killed = false;
  bool truncated = false;
};

// exit_code is null when signal is set and signal is null when the process exited. stdout and
// stderr are JSON strings when they are valid UTF-8 ("stdout_encoding": "utf-8"), otherwise the
// base64 of the bytes ("stdout_encoding": "base64"); the same for stderr.
std::string RenderExecResult(const ExecResultView& result);

struct ProcessView {
  int32_t pid = 0;
  std::string command;
  bool running = true;
  bool background = false;
  bool pty = false;
  bool stdin_open = false;
  std::chrono::system_clock::time_point started_at, ended_at;
  ExecResultView exit;  // exit fields, when !running (stdout/stderr unused)
};

// Stream events: what the services hand over as it happens (controller.h: EventStream), and
// RenderEvent's one JSON object per line (NDJSON), each with "type" and "time" (when the event
// reached the daemon).
//
// Streaming exec ("stream": true), attach, exec/ws:
//   {"type": "start", "pid"}                                 the command started (pid inside)
//   {"type": "stdout" | "stderr", "data", "data_encoding"}   output as it comes
//   {"type": "dropped", "bytes"}   output of a background process overwritten in its ring
//                                  before this reader got it
//   {"type": "exit", exit_code, signal, duration_ms, timed_out, oom_killed, truncated}  last
//   {"type": "error", "error": {"code", "message"}}          last, when the command failed to run
// Template builds ("stream": true):
//   {"type": "base", "base", "message"} and the maker's output as "stderr" events, before the
//   steps, when the base is a Debian suite made now or an image imported now
//   {"type": "step", "index", "step": {"run"} | {"copy": {"path", "bytes", "mode"}}}
//   the exec events of a run step (start, stdout, stderr, exit)
//   {"type": "snapshot"}, then last {"type": "done", "template": {...}} or an "error" event
struct StartEvent {
  int32_t pid = 0;
};
struct OutputEvent {
  bool is_stdout = true;
  std::string data;  // bytes
};
struct DroppedEvent {
  uint64_t bytes = 0;
};
struct ExitEvent {
  ExecResultView result;
};
struct ErrorEvent {
  Error error;
};
struct BaseEvent {
  std::string base;
  std::string message;
};
struct StepEvent {
  size_t index = 0;
  std::string step_json;  // the step as the template's record describes it
};
struct SnapshotEvent {};
// A build's memory snapshot (snapshot_after): its sandbox made, the image saved.
struct MemorySnapshotEvent {
  std::string message;
};
struct DoneEvent {
  TemplateView template_view;
};
struct Event {
  std::variant<StartEvent, OutputEvent, DroppedEvent, ExitEvent, ErrorEvent, BaseEvent, StepEvent,
               SnapshotEvent, MemorySnapshotEvent, DoneEvent>
      what;
  std::chrono::system_clock::time_point time = std::chrono::system_clock::now();
};
// One NDJSON line, with its newline.
std::string RenderEvent(const Event& event);

// {"pid", "command", "state": "running" | "exited", "background", "pty", "stdin_open",
//  "started_at", and when exited "ended_at" and the exit fields (exit_code, signal,
//  duration_ms, timed_out, oom_killed)}. command follows the bytes rule ("command_encoding").
std::string RenderProcess(const ProcessView& process);
// {"processes": [ ... ]}
std::string RenderProcessList(std::span<const ProcessView> processes);

struct FileEntryView {
  std::string name;
  std::string type;  // "file", "directory", "symlink", "other"
  uint32_t mode = 0;
  uint64_t size = 0;
  std::chrono::system_clock::time_point mtime;
  std::string link_target;  // symlinks only
};

// {"name", "type", "mode": "0644", "size", "mtime", "link_target"?} (with the encodings below).
std::string RenderFileEntry(const FileEntryView& entry);
// {"path": ..., "entries": [{"name", "type", "mode": "0644", "size", "mtime", "link_target"?}]}.
// name, path and link_target follow the exec output rule: "name_encoding" is "utf-8" or
// "base64" (for names that are not valid UTF-8), and likewise for the others.
std::string RenderFileList(std::string_view path, std::span<const FileEntryView> entries);

struct HttpError {
  int status = 500;
  std::string body;
};

// {"error": {"code": ErrorCodeName(code), "message": message}} and HttpStatus(code). Bytes in
// the message that are not UTF-8 are replaced with U+FFFD.
HttpError ErrorBody(const Error& error);
// The one 401 answer for every authentication failure (missing header, wrong scheme, unknown key)
// so a caller learns nothing about why.
HttpError UnauthenticatedBody();

}  // namespace airlock::api
