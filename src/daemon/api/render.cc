#include "daemon/api/render.h"

#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "daemon/api/base64.h"
#include "daemon/api/utf8.h"

namespace airlock::api {

std::string DumpJson(const nlohmann::json& doc) {
  // Every string put in a response is either checked UTF-8 or replaced; replace keeps dump()
  // from throwing if one slips through.
  return doc.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

namespace {

using nlohmann::json;

json SandboxJson(const SandboxView& s) {
  json limits = {
      {"cpus", s.limits.cpus},
      {"memory_mb", s.limits.memory_mb},
      {"pids_max", s.limits.pids_max},
      {"disk_mb", s.limits.disk_mb},
  };
  json metadata = json::object();
  for (const auto& [key, value] : s.metadata) metadata[key] = value;
  json doc = {
      {"id", s.id},
      {"state", s.state},
      {"template", s.template_name},
      {"engine", s.engine},
      {"created_at", FormatTimestamp(s.created_at)},
      {"expires_at", FormatTimestamp(s.expires_at)},
      {"limits", std::move(limits)},
      {"metadata", std::move(metadata)},
  };
  json network = json::parse(s.network, nullptr, /*allow_exceptions=*/false);
  if (!network.is_object()) network = {{"mode", "none"}, {"allow", json::array()}, {"deny", json::array()}};
  if (!s.address.empty()) network["address"] = s.address;
  if (!s.address6.empty()) network["address6"] = s.address6;
  doc["network"] = std::move(network);
  json secrets = json::parse(s.secrets, nullptr, /*allow_exceptions=*/false);
  doc["secrets"] = secrets.is_array() ? std::move(secrets) : json::array();
  if (!s.error.empty()) doc["error"] = s.error;
  doc["tenant"] = s.tenant;
  if (s.memory_image_bytes > 0) doc["memory_image_bytes"] = s.memory_image_bytes;
  if (!s.end_reason.empty()) doc["end_reason"] = s.end_reason;
  if (s.ended_at) doc["ended_at"] = FormatTimestamp(*s.ended_at);
  if (s.auto_pause_seconds > 0) {
    doc["auto_pause"] = {{"idle_seconds", s.auto_pause_seconds}, {"memory", s.auto_pause_memory}};
  }
  if (s.auto_paused) doc["auto_paused"] = true;
  return doc;
}

json KeyJson(const KeyView& k) {
  json doc = {{"id", k.id},
              {"name", k.name},
              {"tenant", k.tenant},
              {"admin", k.admin},
              {"revoked", k.revoked},
              {"created_at", FormatTimestamp(k.created_at)}};
  if (!k.key.empty()) doc["key"] = k.key;
  return doc;
}

void PutBytes(json& doc, const std::string& field, const std::string& bytes) {
  if (IsValidUtf8(bytes)) {
    doc[field] = bytes;
    doc[field + "_encoding"] = "utf-8";
  } else {
    doc[field] = Base64Encode(bytes);
    doc[field + "_encoding"] = "base64";
  }
}

std::string OctalMode(uint32_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode & 07777);
  return buf;
}

}  // namespace

std::string FormatTimestamp(std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const auto ms = floor<milliseconds>(t);
  const auto days = floor<std::chrono::days>(ms);
  const year_month_day ymd(days);
  const hh_mm_ss<milliseconds> hms(ms - days);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02d.%03dZ",
                static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()), static_cast<int>(hms.hours().count()),
                static_cast<int>(hms.minutes().count()), static_cast<int>(hms.seconds().count()),
                static_cast<int>(hms.subseconds().count()));
  return buf;
}

std::string RenderSandbox(const SandboxView& sandbox) { return DumpJson(SandboxJson(sandbox)); }

std::string RenderSandboxList(std::span<const SandboxView> sandboxes) {
  json list = json::array();
  for (const auto& s : sandboxes) list.push_back(SandboxJson(s));
  return DumpJson(json{{"sandboxes", std::move(list)}});
}

std::string RenderKey(const KeyView& key) { return DumpJson(KeyJson(key)); }

std::string RenderKeyList(std::span<const KeyView> keys) {
  json list = json::array();
  for (const auto& k : keys) list.push_back(KeyJson(k));
  return DumpJson(json{{"keys", std::move(list)}});
}

namespace {
json SecretJson(const SecretView& s) {
  return {{"name", s.name},
          {"version", s.version},
          {"created_at", FormatTimestamp(s.created_at)},
          {"updated_at", FormatTimestamp(s.updated_at)}};
}
}  // namespace

std::string RenderSecret(const SecretView& secret) { return DumpJson(SecretJson(secret)); }

std::string RenderSecretList(std::span<const SecretView> secrets) {
  json list = json::array();
  for (const auto& s : secrets) list.push_back(SecretJson(s));
  return DumpJson(json{{"secrets", std::move(list)}});
}

namespace {
json PoolJson(const PoolView& p) {
  return {{"template", p.template_name},
          {"size", p.size},
          {"ready", p.ready},
          {"hits", p.hits},
          {"misses", p.misses}};
}
}  // namespace

std::string RenderPool(const PoolView& pool) { return DumpJson(PoolJson(pool)); }

std::string RenderEngineList(std::span<const EngineView> engines, std::string_view default_name) {
  json list = json::array();
  for (const EngineView& e : engines) {
    json one = {{"name", e.name},
                {"description", e.description},
                {"enabled", e.enabled},
                {"available", e.available},
                {"default", e.is_default}};
    if (e.available) {
      const runtime::Capabilities& c = e.capabilities;
      one["capabilities"] = {{"limits", c.limits},
                             {"pause", c.pause},
                             {"live_limits", c.live_limits},
                             {"layer_snapshot", c.layer_snapshot},
                             {"memory_checkpoint", c.memory_checkpoint},
                             {"memory_checkpoint_network", c.memory_checkpoint_network},
                             {"memory_fork", c.memory_fork},
                             {"host_usr_root", c.host_usr_root},
                             {"networking", c.networking},
                             {"process_events", c.process_events},
                             {"max_layers", c.max_layers},
                             {"isolation", c.isolation},
                             {"agent_channel", c.agent_channel}};
      if (!c.platform.empty()) one["capabilities"]["platform"] = c.platform;
    } else {
      one["reason"] = e.reason;
    }
    list.push_back(std::move(one));
  }
  return DumpJson(json{{"engines", std::move(list)}, {"default", default_name}});
}

std::string RenderPoolList(std::span<const PoolView> pools) {
  json list = json::array();
  for (const auto& p : pools) list.push_back(PoolJson(p));
  return DumpJson(json{{"pools", std::move(list)}});
}

namespace {
json ExitFields(const ExecResultView& r) {
  return {
      {"exit_code", r.signal != 0 ? json(nullptr) : json(r.exit_code)},
      {"signal", r.signal != 0 ? json(r.signal) : json(nullptr)},
      {"duration_ms", r.duration_ms},
      {"timed_out", r.timed_out},
      {"oom_killed", r.oom_killed},
      {"truncated", r.truncated},
  };
}

}  // namespace

namespace {
json ProcessJson(const ProcessView& p) {
  json doc = {
      {"pid", p.pid},
      {"state", p.running ? "running" : "exited"},
      {"background", p.background},
      {"pty", p.pty},
      {"stdin_open", p.stdin_open},
      {"started_at", FormatTimestamp(p.started_at)},
  };
  PutBytes(doc, "command", p.command);
  if (!p.running) {
    doc["ended_at"] = FormatTimestamp(p.ended_at);
    json exit = ExitFields(p.exit);
    exit.erase("truncated");  // a background process's output is a ring, never "truncated"
    doc.update(exit);
  }
  return doc;
}
}  // namespace

std::string RenderProcess(const ProcessView& process) { return DumpJson(ProcessJson(process)); }

std::string RenderProcessList(std::span<const ProcessView> processes) {
  json list = json::array();
  for (const auto& p : processes) list.push_back(ProcessJson(p));
  return DumpJson(json{{"processes", std::move(list)}});
}

std::string RenderExecResult(const ExecResultView& r) {
  json doc = ExitFields(r);
  PutBytes(doc, "stdout", r.stdout_bytes);
  PutBytes(doc, "stderr", r.stderr_bytes);
  return DumpJson(doc);
}

namespace {
json FileEntryJson(const FileEntryView& e) {
  json entry = {
      {"type", e.type},
      {"mode", OctalMode(e.mode)},
      {"size", e.size},
      {"mtime", FormatTimestamp(e.mtime)},
  };
  PutBytes(entry, "name", e.name);
  if (!e.link_target.empty()) PutBytes(entry, "link_target", e.link_target);
  return entry;
}
}  // namespace

std::string RenderFileEntry(const FileEntryView& entry) { return DumpJson(FileEntryJson(entry)); }

std::string RenderFileList(std::string_view path, std::span<const FileEntryView> entries) {
  json list = json::array();
  for (const auto& e : entries) list.push_back(FileEntryJson(e));
  json doc = {{"entries", std::move(list)}};
  PutBytes(doc, "path", std::string(path));
  return DumpJson(doc);
}

HttpError ErrorBody(const Error& error) {
  json doc = {{"error",
               {{"code", std::string(ErrorCodeName(error.code()))}, {"message", error.message()}}}};
  return HttpError{HttpStatus(error.code()), DumpJson(doc)};
}

HttpError UnauthenticatedBody() {
  return ErrorBody(Error(ErrorCode::kUnauthenticated, "missing or invalid API key"));
}

namespace {
json TemplateJson(const TemplateView& v) {
  json settings = json::parse(v.settings, nullptr, /*allow_exceptions=*/false);
  if (!settings.is_object()) settings = json::object();
  json env_keys = json::array();
  if (settings.contains("env") && settings["env"].is_object()) {
    for (const auto& [key, value] : settings["env"].items()) env_keys.push_back(key);
  }
  json out = {{"name", v.name},
              {"state", v.state},
              {"source", v.source},
              {"base", settings.value("base", std::string(kDefaultTemplate))},
              {"root", settings.value("root", std::string(kRootHostUsr))},
              {"engine", settings.value("engine", std::string())},
              {"layers", v.layers},
              {"env_keys", std::move(env_keys)},
              {"workdir", settings.value("workdir", std::string())},
              {"limits", settings.value("limits", json::object())},
              {"start_cmd", settings.value("start_cmd", std::string())},
              {"ready_cmd", settings.value("ready_cmd", std::string())},
              {"ready_timeout_seconds",
               settings.value("ready_timeout_seconds", kDefaultReadyTimeoutSeconds)},
              {"steps", settings.value("steps", json::array())},
              {"created_at", FormatTimestamp(v.created_at)},
              {"updated_at", FormatTimestamp(v.updated_at)}};
  if (settings.contains("snapshot_after")) out["snapshot_after"] = settings["snapshot_after"];
  // The image's name is the engine's business; its size on disk is the user's.
  if (const json memory = settings.value("memory_snapshot", json::object()); !memory.empty()) {
    out["memory_snapshot"] = {{"bytes", memory.value("bytes", uint64_t{0})}};
  }
  if (!v.error.empty()) out["error"] = v.error;
  if (!v.tenant.empty()) out["tenant"] = v.tenant;
  return out;
}
}  // namespace

std::string RenderTemplate(const TemplateView& view) { return DumpJson(TemplateJson(view)); }

std::string RenderTemplateList(std::span<const TemplateView> views) {
  json list = json::array();
  for (const auto& v : views) list.push_back(TemplateJson(v));
  return DumpJson(json{{"templates", std::move(list)}});
}

std::string RenderEvent(const Event& event) {
  struct Fields {
    json operator()(const StartEvent& e) const { return {{"type", "start"}, {"pid", e.pid}}; }
    json operator()(const OutputEvent& e) const {
      json doc = {{"type", e.is_stdout ? "stdout" : "stderr"}};
      PutBytes(doc, "data", e.data);
      return doc;
    }
    json operator()(const DroppedEvent& e) const {
      return {{"type", "dropped"}, {"bytes", e.bytes}};
    }
    json operator()(const ExitEvent& e) const {
      json doc = ExitFields(e.result);
      doc["type"] = "exit";
      return doc;
    }
    json operator()(const ErrorEvent& e) const {
      return {{"type", "error"},
              {"error",
               {{"code", std::string(ErrorCodeName(e.error.code()))},
                {"message", e.error.message()}}}};
    }
    json operator()(const BaseEvent& e) const {
      return {{"type", "base"}, {"base", e.base}, {"message", e.message}};
    }
    json operator()(const StepEvent& e) const {
      json step = json::parse(e.step_json, nullptr, /*allow_exceptions=*/false);
      return {{"type", "step"}, {"index", e.index}, {"step", step.is_discarded() ? json() : step}};
    }
    json operator()(const SnapshotEvent&) const { return {{"type", "snapshot"}}; }
    json operator()(const MemorySnapshotEvent& e) const {
      return {{"type", "memory_snapshot"}, {"message", e.message}};
    }
    json operator()(const DoneEvent& e) const {
      return {{"type", "done"}, {"template", TemplateJson(e.template_view)}};
    }
  };
  json doc = std::visit(Fields{}, event.what);
  doc["time"] = FormatTimestamp(event.time);
  return DumpJson(doc) + "\n";
}

std::string RenderFork(std::span<const SandboxView> sandboxes, const std::string& layer,
                       bool memory_carried) {
  json list = json::array();
  for (const auto& s : sandboxes) list.push_back(SandboxJson(s));
  return DumpJson(json{
      {"sandboxes", std::move(list)},
      {"layer", layer},
      {"memory_carried", memory_carried},
      {"note", memory_carried
                   ? "each fork goes on from the source's processes, memory, /tmp and files as "
                     "they were at the fork, with the source's hostname and environment; open "
                     "network connections are not carried (a fork with memory has no network)"
                   : "the file system is copied (not /tmp): processes and memory start fresh in "
                     "each fork"}});
}

}  // namespace airlock::api
