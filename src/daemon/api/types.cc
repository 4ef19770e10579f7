#include "daemon/api/types.h"

#include <charconv>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "daemon/api/base64.h"
#include "daemon/api/json.h"

namespace airlock::api {
namespace {

using nlohmann::json;

#define AIRLOCK_TRY_ASSIGN(lhs, expr)                                 \
  do {                                                                \
    auto result_ = (expr);                                            \
    if (!result_) return std::unexpected(std::move(result_.error())); \
    lhs = std::move(*result_);                                        \
  } while (0)
#define AIRLOCK_TRY(expr)                                             \
  do {                                                                \
    auto status_ = (expr);                                            \
    if (!status_) return std::unexpected(std::move(status_.error())); \
  } while (0)

std::unexpected<Error> Invalid(std::string message) {
  return Fail(ErrorCode::kInvalidArgument, std::move(message));
}

bool IsLower(char c) { return c >= 'a' && c <= 'z'; }
bool IsUpper(char c) { return c >= 'A' && c <= 'Z'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

Status ValidateTemplateName(std::string_view name) {
  auto ok_char = [](char c) {
    return IsLower(c) || IsDigit(c) || c == '.' || c == '_' || c == '-';
  };
  bool ok = !name.empty() && name.size() <= kMaxTemplateNameBytes &&
            (IsLower(name[0]) || IsDigit(name[0]));
  for (char c : name) ok = ok && ok_char(c);
  if (!ok) {
    return Invalid(
        "template must be 1-64 characters of [a-z0-9._-] starting with a letter or "
        "digit, got " +
        Quote(name));
  }
  return {};
}

Status ValidateEnvKey(std::string_view key, std::string_view what) {
  bool ok = !key.empty() && key.size() <= kMaxEnvKeyBytes && !IsDigit(key[0]);
  for (char c : key) ok = ok && (IsLower(c) || IsUpper(c) || IsDigit(c) || c == '_');
  if (!ok) {
    return Invalid(std::string(what) + " key " + Quote(key) +
                   " must match [A-Za-z_][A-Za-z0-9_]* and be at most " +
                   std::to_string(kMaxEnvKeyBytes) + " bytes");
  }
  return {};
}

// "user": a name ([A-Za-z_][A-Za-z0-9_.-]*) or a uid (decimal, at most 4294967294).
Status ValidateUser(std::string_view user) {
  bool ok = !user.empty() && user.size() <= kMaxUserBytes;
  if (ok && IsDigit(user[0])) {
    uint64_t uid = 0;
    auto [end, ec] = std::from_chars(user.data(), user.data() + user.size(), uid);
    ok = ec == std::errc() && end == user.data() + user.size() && uid <= 4294967294u;
  } else if (ok) {
    ok = IsLower(user[0]) || IsUpper(user[0]) || user[0] == '_';
    for (char c : user) {
      ok = ok && (IsLower(c) || IsUpper(c) || IsDigit(c) || c == '_' || c == '.' || c == '-');
    }
  }
  if (!ok) {
    return Invalid(
        "user must be a user name ([A-Za-z_][A-Za-z0-9_.-]*, at most 32 characters) "
        "or a numeric uid below 4294967295, got " +
        Quote(user));
  }
  return {};
}

// An object of string values: "env" and "metadata".
Result<EnvMap> GetEnv(const json& value, std::string_view field) {
  if (!value.is_object()) {
    return Invalid(std::string(field) + " must be an object of strings, got " + Describe(value));
  }
  if (value.size() > kMaxEnvEntries) {
    return Invalid(std::string(field) + " may hold at most " + std::to_string(kMaxEnvEntries) +
                   " entries, got " + std::to_string(value.size()));
  }
  EnvMap env;
  for (const auto& [key, item] : value.items()) {
    AIRLOCK_TRY(ValidateEnvKey(key, field));
    std::string v;
    AIRLOCK_TRY_ASSIGN(v, GetString(item, MemberPath(field, key), kMaxEnvValueBytes, false));
    env.emplace(key, std::move(v));
  }
  return env;
}

Result<Metadata> GetMetadata(const json& value, std::string_view field) {
  if (!value.is_object()) {
    return Invalid(std::string(field) + " must be an object of strings, got " + Describe(value));
  }
  if (value.size() > kMaxMetadataEntries) {
    return Invalid(std::string(field) + " may hold at most " + std::to_string(kMaxMetadataEntries) +
                   " entries, got " + std::to_string(value.size()));
  }
  Metadata metadata;
  for (const auto& [key, item] : value.items()) {
    AIRLOCK_TRY(ValidateMetadataKey(key, field));
    std::string v;
    AIRLOCK_TRY_ASSIGN(v, GetString(item, MemberPath(field, key), kMaxMetadataValueBytes, false));
    metadata.emplace(key, std::move(v));
  }
  return metadata;
}

// Query parameters: each name at most once, and only names in `allowed`.
Status CheckQueryNames(const QueryParams& params, std::initializer_list<std::string_view> allowed,
                       bool allow_metadata_prefix) {
  std::set<std::string_view> seen;
  for (const auto& [name, value] : params) {
    bool known = allow_metadata_prefix && name.starts_with("metadata.");
    for (std::string_view a : allowed) known = known || name == a;
    if (!known) {
      std::string names;
      for (std::string_view a : allowed) names += (names.empty() ? "" : ", ") + std::string(a);
      if (allow_metadata_prefix) names += ", metadata.KEY";
      return Invalid("unknown query parameter " + Quote(name) + "; allowed: " + names);
    }
    if (!seen.insert(name).second) {
      return Invalid("query parameter " + Quote(name) + " given more than once");
    }
  }
  return {};
}

Result<bool> ParseQueryBool(std::string_view value, std::string_view name) {
  if (value == "true" || value == "1") return true;
  if (value == "false" || value == "0") return false;
  return Invalid(std::string(name) + " must be true, false, 1 or 0, got " + Quote(value));
}

Result<uint32_t> ParseMode(std::string_view value) {
  uint32_t mode = 0;
  bool ok = !value.empty() && value.size() <= 5;
  for (char c : value) {
    ok = ok && c >= '0' && c <= '7';
    if (ok) mode = mode * 8 + static_cast<uint32_t>(c - '0');
  }
  if (!ok || mode > 07777) {
    return Invalid("mode must be octal permission bits from 0 to 7777 (e.g. 0644), got " +
                   Quote(value));
  }
  return mode;
}

// cpus, memory_mb, pids_max and disk_mb of a request body, into `limits`; `given` says which
// were there.
Status GetLimits(const json& doc, runtime::Limits& limits, LimitFields& given) {
  if (doc.contains("cpus")) {
    AIRLOCK_TRY_ASSIGN(limits.cpus, GetPositiveNumber(doc["cpus"], "cpus", kMaxCpus));
    given.cpus = true;
  }
  // GetInt's bounds are positive, so the casts below are exact.
  const struct {
    const char* name;
    int64_t min, max;
    uint64_t runtime::Limits::*field;
    bool LimitFields::*flag;
  } kInts[] = {{"memory_mb", kMinMemoryMb, kMaxMemoryMb, &runtime::Limits::memory_mb,
                &LimitFields::memory_mb},
               {"pids_max", kMinPidsMax, kMaxPidsMax, &runtime::Limits::pids_max,
                &LimitFields::pids_max},
               {"disk_mb", kMinDiskMb, kMaxDiskMb, &runtime::Limits::disk_mb,
                &LimitFields::disk_mb}};
  for (const auto& f : kInts) {
    if (!doc.contains(f.name)) continue;
    int64_t v = 0;
    AIRLOCK_TRY_ASSIGN(v, GetInt(doc[f.name], f.name, f.min, f.max));
    limits.*f.field = static_cast<uint64_t>(v);
    given.*f.flag = true;
  }
  return {};
}

}  // namespace

Status ValidatePath(std::string_view path, std::string_view what) {
  if (path.empty()) return Invalid(std::string(what) + " must not be empty");
  if (path.size() > kMaxPathBytes) {
    return Invalid(std::string(what) + " must be at most " + std::to_string(kMaxPathBytes) +
                   " bytes, got " + std::to_string(path.size()));
  }
  if (path.find('\0') != std::string_view::npos) {
    return Invalid(std::string(what) + " must not contain NUL");
  }
  return {};
}

Status ValidateMetadataKey(std::string_view key, std::string_view what) {
  bool ok = !key.empty() && key.size() <= kMaxMetadataKeyBytes;
  for (char c : key) {
    ok = ok && (IsLower(c) || IsUpper(c) || IsDigit(c) || c == '_' || c == '.' || c == '-');
  }
  if (!ok) {
    return Invalid(std::string(what) + " key " + Quote(key) +
                   " must be 1-64 characters of [A-Za-z0-9_.-]");
  }
  return {};
}

std::vector<std::string> EnvList(const EnvMap& env) {
  std::vector<std::string> list;
  list.reserve(env.size());
  for (const auto& [key, value] : env) list.push_back(key + "=" + value);
  return list;
}

namespace {

// "engine": an engine's name as the config writes it (whether one is called so, the registry
// says when the request is served).
Result<std::string> GetEngineName(const json& value) {
  if (!value.is_string()) return Invalid("engine must be a string, got " + Describe(value));
  const std::string& name = value.get_ref<const std::string&>();
  bool ok = !name.empty() && name.size() <= kMaxEngineNameBytes;
  for (char c : name) ok = ok && (IsLower(c) || IsDigit(c) || c == '-');
  if (!ok) {
    return Invalid("engine must be an engine's name (1-32 of [a-z0-9-]; GET /v1/engines lists "
                   "them), got " + Quote(name.substr(0, 64)));
  }
  return name;
}

}  // namespace

Result<CreateSandboxRequest> CreateSandboxRequest::FromJson(std::string_view body) {
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(RejectUnknownFields(
      doc, "request body",
      {"template", "ttl_seconds", "cpus", "memory_mb", "pids_max", "disk_mb", "env", "metadata",
       "network", "engine", "auto_hibernate_seconds", "auto_pause", "secrets"}));
  CreateSandboxRequest req;
  if (doc.contains("engine")) AIRLOCK_TRY_ASSIGN(req.engine, GetEngineName(doc["engine"]));
  if (doc.contains("network")) {
    AIRLOCK_TRY_ASSIGN(req.network, net::NetworkPolicy::FromJson(doc["network"]));
  }
  if (doc.contains("secrets")) {
    std::vector<net::SecretBinding> secrets;
    AIRLOCK_TRY_ASSIGN(secrets, net::ParseSecretBindings(doc["secrets"], {}, net::NewPlaceholder));
    req.network.SetSecrets(std::move(secrets));
  }
  if (doc.contains("template")) {
    AIRLOCK_TRY_ASSIGN(req.template_name,
                       GetString(doc["template"], "template", kMaxTemplateNameBytes, false));
    AIRLOCK_TRY(CheckTemplateName(req.template_name));
  }
  if (doc.contains("ttl_seconds")) {
    AIRLOCK_TRY_ASSIGN(req.ttl_seconds,
                       GetInt(doc["ttl_seconds"], "ttl_seconds", 1, kMaxTtlSeconds));
  }
  if (doc.contains("auto_hibernate_seconds")) {
    if (doc.contains("auto_pause")) {
      return Invalid("give auto_pause or auto_hibernate_seconds (the older form of auto_pause "
                     "with memory), not both");
    }
    AIRLOCK_TRY_ASSIGN(req.auto_pause_seconds,
                       GetInt(doc["auto_hibernate_seconds"], "auto_hibernate_seconds", 1,
                              kMaxTtlSeconds));
    req.auto_pause_memory = true;
  }
  if (doc.contains("auto_pause")) {
    const json& pause = doc["auto_pause"];
    if (!pause.is_object()) return Invalid("auto_pause must be an object {idle_seconds, memory}");
    AIRLOCK_TRY(RejectUnknownFields(pause, "auto_pause", {"idle_seconds", "memory"}));
    if (!pause.contains("idle_seconds")) return Invalid("auto_pause.idle_seconds is required");
    AIRLOCK_TRY_ASSIGN(req.auto_pause_seconds,
                       GetInt(pause["idle_seconds"], "auto_pause.idle_seconds", 1, kMaxTtlSeconds));
    if (pause.contains("memory")) {
      AIRLOCK_TRY_ASSIGN(req.auto_pause_memory, GetBool(pause["memory"], "auto_pause.memory"));
    }
  }
  AIRLOCK_TRY(GetLimits(doc, req.limits, req.limits_given));
  if (doc.contains("env")) AIRLOCK_TRY_ASSIGN(req.env, GetEnv(doc["env"], "env"));
  if (doc.contains("metadata")) {
    AIRLOCK_TRY_ASSIGN(req.metadata, GetMetadata(doc["metadata"], "metadata"));
  }
  return req;
}

Status CheckTenantName(std::string_view tenant, std::string_view what) {
  bool ok = !tenant.empty() && tenant.size() <= 64;
  for (char c : tenant) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-');
  }
  if (!ok) {
    return Invalid(std::string(what) + " must be 1-64 of letters, digits, '.', '_' and '-', got " +
                   Quote(tenant));
  }
  return {};
}

Result<CreateKeyRequest> CreateKeyRequest::FromJson(std::string_view body) {
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(RejectUnknownFields(doc, "request body", {"name", "tenant", "admin"}));
  if (!doc.contains("name")) return Invalid("name is required");
  if (!doc.contains("tenant")) return Invalid("tenant is required");
  CreateKeyRequest req;
  AIRLOCK_TRY_ASSIGN(req.name, GetString(doc["name"], "name", 64, false));
  if (req.name.empty()) return Invalid("name must not be empty");
  for (char c : req.name) {
    if (c < 0x20 || c > 0x7e) return Invalid("name may hold only printable ASCII");
  }
  AIRLOCK_TRY_ASSIGN(req.tenant, GetString(doc["tenant"], "tenant", 64, false));
  AIRLOCK_TRY(CheckTenantName(req.tenant, "tenant"));
  if (doc.contains("admin")) AIRLOCK_TRY_ASSIGN(req.admin, GetBool(doc["admin"], "admin"));
  return req;
}

Status CheckSecretName(std::string_view name) {
  bool ok = !name.empty() && name.size() <= kMaxSecretNameBytes &&
            (IsLower(name[0]) || IsUpper(name[0]) || name[0] == '_');
  for (char c : name) ok = ok && (IsLower(c) || IsUpper(c) || IsDigit(c) || c == '_');
  if (!ok) {
    // The name is not quoted: a caller that swapped name and value would see the value.
    return Invalid("a secret name must match [A-Za-z_][A-Za-z0-9_]* and be 1-" +
                   std::to_string(kMaxSecretNameBytes) +
                   " bytes (it is also an environment variable's name)");
  }
  return {};
}

Status CheckSecretValue(std::string_view value) {
  if (value.empty() || value.size() > kMaxSecretValueBytes) {
    return Invalid("value must be 1-" + std::to_string(kMaxSecretValueBytes) + " bytes, got " +
                   std::to_string(value.size()));
  }
  if (value.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos) {
    return Invalid(
        "value must not contain CR, LF or NUL: it is sent in HTTP headers (a value read from a "
        "file may end in a newline; strip it)");
  }
  return {};
}

namespace {

// A body that carries a secret's value: as ParseJsonObject, but an error never quotes the body
// (nlohmann's parse errors end with "; last read: '<the bytes it read>'", which may be the
// value's), and a value that is not a string is not shown.
Result<json> ParseSecretBody(std::string_view body) {
  auto doc = ParseJsonObject(body);
  if (!doc) {
    std::string message = doc.error().message();
    if (size_t quoted = message.find("; last read:"); quoted != std::string::npos) {
      message.resize(quoted);
    }
    return std::unexpected(Error(doc.error().code(), std::move(message)));
  }
  return doc;
}

Result<std::string> GetSecretValue(const json& doc) {
  if (!doc.contains("value")) return Invalid("value is required");
  const json& value = doc["value"];
  if (!value.is_string()) {
    return Invalid(std::string("value must be a string, got ") + value.type_name());
  }
  const auto& text = value.get_ref<const std::string&>();
  AIRLOCK_TRY(CheckSecretValue(text));
  return text;
}

}  // namespace

Result<CreateSecretRequest> CreateSecretRequest::FromJson(std::string_view body) {
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseSecretBody(body));
  AIRLOCK_TRY(RejectUnknownFields(doc, "request body", {"name", "value"}));
  if (!doc.contains("name")) return Invalid("name is required");
  CreateSecretRequest req;
  if (!doc["name"].is_string()) {
    return Invalid(std::string("name must be a string, got ") + doc["name"].type_name());
  }
  req.name = doc["name"].get<std::string>();
  AIRLOCK_TRY(CheckSecretName(req.name));
  AIRLOCK_TRY_ASSIGN(req.value, GetSecretValue(doc));
  return req;
}

Result<UpdateSecretRequest> UpdateSecretRequest::FromJson(std::string_view body) {
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseSecretBody(body));
  AIRLOCK_TRY(RejectUnknownFields(doc, "request body", {"value"}));
  UpdateSecretRequest req;
  AIRLOCK_TRY_ASSIGN(req.value, GetSecretValue(doc));
  return req;
}

Result<SecretsQuery> SecretsQuery::FromQuery(const QueryParams& params) {
  AIRLOCK_TRY(CheckQueryNames(params, {"tenant"}, false));
  SecretsQuery query;
  for (const auto& [name, value] : params) {
    AIRLOCK_TRY(CheckTenantName(value, "tenant"));
    query.tenant = value;
  }
  return query;
}

Result<PoolSizeRequest> PoolSizeRequest::FromJson(std::string_view body) {
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(RejectUnknownFields(doc, "request body", {"size"}));
  if (!doc.contains("size")) return Invalid("size is required");
  PoolSizeRequest req;
  AIRLOCK_TRY_ASSIGN(req.size, GetInt(doc["size"], "size", 0, kMaxPoolSize));
  return req;
}

EnvMap EnvFromImage(const std::vector<std::string>& list) {
  EnvMap env;
  for (const std::string& entry : list) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || env.size() >= kMaxEnvEntries) continue;
    std::string key = entry.substr(0, eq), value = entry.substr(eq + 1);
    if (ValidateEnvKey(key, "env") && value.size() <= kMaxEnvValueBytes &&
        value.find('\0') == std::string::npos) {
      env[std::move(key)] = std::move(value);
    }
  }
  return env;
}

std::string_view DebianSuite(std::string_view name) {
  constexpr std::string_view kPrefix = "debian:";
  if (!name.starts_with(kPrefix) || name.size() > kMaxTemplateNameBytes) return {};
  std::string_view suite = name.substr(kPrefix.size());
  bool ok = !suite.empty() && IsLower(suite[0]);
  for (char c : suite) ok = ok && (IsLower(c) || IsDigit(c) || c == '-');
  return ok ? suite : std::string_view();
}

Status CheckTemplateName(std::string_view name) {
  if (!DebianSuite(name).empty()) return {};
  return ValidateTemplateName(name);
}

Result<PatchSandboxRequest> PatchSandboxRequest::FromJson(std::string_view body) {
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(RejectUnknownFields(doc, "request body",
                                  {"ttl_seconds", "metadata", "network", "secrets", "limits"}));
  if (doc.empty()) {
    return Invalid(
        "request body must set at least one of ttl_seconds, metadata, network, secrets, limits");
  }
  PatchSandboxRequest req;
  if (doc.contains("limits")) {
    const json& limits = doc["limits"];
    if (!limits.is_object()) {
      return Invalid("limits must be an object, got " + Describe(limits));
    }
    if (limits.contains("disk_mb")) {
      return Invalid(
          "limits.disk_mb cannot change on a live sandbox (its writable layer is made at "
          "create); cpus, memory_mb and pids_max can");
    }
    AIRLOCK_TRY(RejectUnknownFields(limits, "limits", {"cpus", "memory_mb", "pids_max"}));
    if (limits.empty()) return Invalid("limits must set at least one of cpus, memory_mb, pids_max");
    LimitsPatch patch;
    if (limits.contains("cpus")) {
      AIRLOCK_TRY_ASSIGN(patch.cpus, GetPositiveNumber(limits["cpus"], "limits.cpus", kMaxCpus));
    }
    if (limits.contains("memory_mb")) {
      AIRLOCK_TRY_ASSIGN(patch.memory_mb, GetInt(limits["memory_mb"], "limits.memory_mb",
                                                 kMinMemoryMb, kMaxMemoryMb));
    }
    if (limits.contains("pids_max")) {
      AIRLOCK_TRY_ASSIGN(patch.pids_max,
                         GetInt(limits["pids_max"], "limits.pids_max", kMinPidsMax, kMaxPidsMax));
    }
    req.limits = patch;
  }
  if (doc.contains("network")) {
    AIRLOCK_TRY_ASSIGN(req.network, net::NetworkPolicy::FromJson(doc["network"]));
  }
  if (doc.contains("secrets")) {
    AIRLOCK_TRY_ASSIGN(req.secrets,
                       net::ParseSecretBindings(doc["secrets"], {}, net::NewPlaceholder));
  }
  if (doc.contains("ttl_seconds")) {
    AIRLOCK_TRY_ASSIGN(req.ttl_seconds,
                       GetInt(doc["ttl_seconds"], "ttl_seconds", 1, kMaxTtlSeconds));
  }
  if (doc.contains("metadata")) {
    const json& patch = doc["metadata"];
    if (!patch.is_object()) {
      return Invalid("metadata must be an object of strings (or null to remove a key), got " +
                     Describe(patch));
    }
    if (patch.size() > kMaxMetadataEntries) {
      return Invalid("metadata may hold at most " + std::to_string(kMaxMetadataEntries) +
                     " entries, got " + std::to_string(patch.size()));
    }
    for (const auto& [key, item] : patch.items()) {
      AIRLOCK_TRY(ValidateMetadataKey(key, "metadata"));
      if (item.is_null()) {
        req.metadata.emplace(key, std::nullopt);
        continue;
      }
      std::string v;
      AIRLOCK_TRY_ASSIGN(
          v, GetString(item, MemberPath("metadata", key), kMaxMetadataValueBytes, false));
      req.metadata.emplace(key, std::move(v));
    }
  }
  return req;
}

Result<QuotaRequest> QuotaRequest::FromJson(std::string_view body) {
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(RejectUnknownFields(
      doc, "request body", {"sandboxes", "cpus", "memory_mb", "disk_mb", "creates_per_minute"}));
  QuotaRequest req;
  const struct {
    const char* name;
    int64_t max;
    int64_t QuotaRequest::*field;
  } kInts[] = {{"sandboxes", kMaxQuotaCount, &QuotaRequest::sandboxes},
               {"memory_mb", kMaxQuotaMb, &QuotaRequest::memory_mb},
               {"disk_mb", kMaxQuotaMb, &QuotaRequest::disk_mb},
               {"creates_per_minute", kMaxQuotaCount, &QuotaRequest::creates_per_minute}};
  for (const auto& f : kInts) {
    if (!doc.contains(f.name)) continue;
    AIRLOCK_TRY_ASSIGN(req.*f.field, GetInt(doc[f.name], f.name, 0, f.max));
  }
  if (doc.contains("cpus")) {
    const json& cpus = doc["cpus"];
    // 0 is allowed here (unlimited), unlike a sandbox's cpus.
    if (cpus.is_number() && cpus.get<double>() == 0) {
      req.cpus = 0;
    } else {
      AIRLOCK_TRY_ASSIGN(req.cpus, GetPositiveNumber(cpus, "cpus", kMaxQuotaCpus));
    }
  }
  return req;
}

Status PatchSandboxRequest::ApplyMetadata(Metadata& current) const {
  Metadata next = current;
  for (const auto& [key, value] : metadata) {
    if (value) {
      next[key] = *value;
    } else {
      next.erase(key);
    }
  }
  if (next.size() > kMaxMetadataEntries) {
    return Invalid("metadata would hold " + std::to_string(next.size()) +
                   " keys after this patch; the limit is " + std::to_string(kMaxMetadataEntries));
  }
  current = std::move(next);
  return {};
}

Result<ExecRequest> ExecRequest::FromJson(std::string_view body) {
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(RejectUnknownFields(
      doc, "request body",
      {"cmd", "argv", "cwd", "env", "stdin", "stdin_encoding", "timeout_seconds", "user",
       "stream", "background", "stdin_open", "pty"}));
  ExecRequest req;
  const bool has_cmd = doc.contains("cmd");
  const bool has_argv = doc.contains("argv");
  if (has_cmd == has_argv) {
    return Invalid(has_cmd ? "give either cmd or argv, not both"
                           : "missing command: give cmd (a shell command line) or argv (an array "
                             "of strings)");
  }
  if (has_cmd) {
    AIRLOCK_TRY_ASSIGN(req.cmd, GetString(doc["cmd"], "cmd", kMaxCmdBytes, false));
    if (req.cmd.empty()) return Invalid("cmd must not be empty");
  } else {
    const json& argv = doc["argv"];
    if (!argv.is_array()) {
      return Invalid("argv must be an array of strings, got " + Describe(argv));
    }
    if (argv.empty() || argv.size() > kMaxArgvEntries) {
      return Invalid("argv must hold 1-" + std::to_string(kMaxArgvEntries) + " strings, got " +
                     std::to_string(argv.size()));
    }
    for (size_t i = 0; i < argv.size(); ++i) {
      std::string arg;
      AIRLOCK_TRY_ASSIGN(arg, GetString(argv[i], ElementPath("argv", i), kMaxArgBytes, false));
      req.argv.push_back(std::move(arg));
    }
    if (req.argv[0].empty()) return Invalid("argv[0] must not be empty");
  }
  if (doc.contains("cwd")) {
    AIRLOCK_TRY_ASSIGN(req.cwd, GetString(doc["cwd"], "cwd", kMaxPathBytes, false));
    AIRLOCK_TRY(ValidatePath(req.cwd, "cwd"));
  }
  if (doc.contains("env")) AIRLOCK_TRY_ASSIGN(req.env, GetEnv(doc["env"], "env"));
  std::string encoding = "utf-8";
  if (doc.contains("stdin_encoding")) {
    AIRLOCK_TRY_ASSIGN(encoding, GetString(doc["stdin_encoding"], "stdin_encoding", 16, false));
    if (encoding != "utf-8" && encoding != "base64") {
      return Invalid("stdin_encoding must be \"utf-8\" or \"base64\", got " + Quote(encoding));
    }
    if (!doc.contains("stdin")) return Invalid("stdin_encoding is set but stdin is missing");
  }
  if (doc.contains("stdin")) {
    // Base64 text is 4/3 of the bytes it carries; check the text's length before decoding.
    const size_t max_text = encoding == "base64" ? (kMaxStdinBytes + 2) / 3 * 4 : kMaxStdinBytes;
    std::string text;
    AIRLOCK_TRY_ASSIGN(text, GetString(doc["stdin"], "stdin", max_text, true));
    if (encoding == "base64") {
      auto decoded = Base64Decode(text);
      if (!decoded) return std::unexpected(std::move(decoded.error()).Wrap("stdin"));
      // The text cap admits up to 2 bytes more when the last group has no padding.
      if (decoded->size() > kMaxStdinBytes) {
        return Invalid("stdin must be at most " + std::to_string(kMaxStdinBytes) +
                       " bytes after base64 decoding, got " + std::to_string(decoded->size()));
      }
      req.stdin_data = std::move(*decoded);
    } else {
      req.stdin_data = std::move(text);
    }
  }
  if (doc.contains("timeout_seconds")) {
    AIRLOCK_TRY_ASSIGN(
        req.timeout_seconds,
        GetPositiveNumber(doc["timeout_seconds"], "timeout_seconds", kMaxTimeoutSeconds));
  }
  if (doc.contains("user")) {
    AIRLOCK_TRY_ASSIGN(req.user, GetString(doc["user"], "user", kMaxUserBytes, false));
    AIRLOCK_TRY(ValidateUser(req.user));
  }
  for (auto [name, field] : {std::pair{"stream", &req.stream},
                             std::pair{"background", &req.background},
                             std::pair{"stdin_open", &req.stdin_open}}) {
    if (!doc.contains(name)) continue;
    if (!doc[name].is_boolean()) return Invalid(std::string(name) + " must be true or false");
    *field = doc[name].get<bool>();
  }
  if (req.stream && req.background) return Invalid("give stream or background, not both");
  if (req.stdin_open && !req.stream && !req.background) {
    // A plain exec answers when the command ends, and closes stdin once "stdin" is written.
    return Invalid("stdin_open needs background or stream (or the exec WebSocket)");
  }
  req.timeout_given = doc.contains("timeout_seconds");
  if (doc.contains("pty")) {
    const json& pty = doc["pty"];
    if (!pty.is_object()) return Invalid("pty must be an object {\"cols\", \"rows\"}");
    AIRLOCK_TRY(RejectUnknownFields(pty, "pty", {"cols", "rows"}));
    ExecRequest::Pty size;
    for (auto [name, field] : {std::pair{"cols", &size.cols}, std::pair{"rows", &size.rows}}) {
      if (!pty.contains(name)) continue;
      const json& v = pty[name];
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 1000) {
        return Invalid(std::string("pty.") + name + " must be an integer in 1..1000, got " +
                       Describe(v));
      }
      *field = static_cast<uint16_t>(v.get<int64_t>());
    }
    req.pty = size;
  }
  return req;
}

Result<SignalRequest> SignalRequest::FromJson(std::string_view body) {
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(RejectUnknownFields(doc, "request body", {"signal"}));
  if (!doc.contains("signal")) return Invalid("missing signal (a name like \"TERM\" or a number)");
  SignalRequest req;
  AIRLOCK_TRY_ASSIGN(req.signo, ParseSignal(doc["signal"]));
  return req;
}

Result<StdinRequest> StdinRequest::FromJson(std::string_view body) {
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(RejectUnknownFields(doc, "request body", {"data", "encoding", "close"}));
  StdinRequest req;
  std::string encoding = "utf-8";
  if (doc.contains("encoding")) {
    AIRLOCK_TRY_ASSIGN(encoding, GetString(doc["encoding"], "encoding", 16, false));
    if (encoding != "utf-8" && encoding != "base64") {
      return Invalid("encoding must be \"utf-8\" or \"base64\", got " + Quote(encoding));
    }
  }
  if (doc.contains("data")) {
    const size_t max_text = encoding == "base64" ? (kMaxStdinBytes + 2) / 3 * 4 : kMaxStdinBytes;
    std::string text;
    AIRLOCK_TRY_ASSIGN(text, GetString(doc["data"], "data", max_text, true));
    if (encoding == "base64") {
      auto decoded = Base64Decode(text);
      if (!decoded) return std::unexpected(std::move(decoded.error()).Wrap("data"));
      if (decoded->size() > kMaxStdinBytes) {
        return Invalid("data must be at most " + std::to_string(kMaxStdinBytes) + " bytes");
      }
      req.data = std::move(*decoded);
    } else {
      req.data = std::move(text);
    }
  }
  if (doc.contains("close")) {
    if (!doc["close"].is_boolean()) return Invalid("close must be true or false");
    req.close = doc["close"].get<bool>();
  }
  if (req.data.empty() && !req.close) return Invalid("give data, close: true, or both");
  return req;
}

Result<WaitRequest> WaitRequest::FromJson(std::string_view body) {
  WaitRequest req;
  if (body.empty()) return req;
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(RejectUnknownFields(doc, "request body", {"timeout_seconds"}));
  if (doc.contains("timeout_seconds")) {
    AIRLOCK_TRY_ASSIGN(req.timeout_seconds, GetPositiveNumber(doc["timeout_seconds"],
                                                              "timeout_seconds", kMaxWaitSeconds));
  }
  return req;
}

Result<FileQuery> FileQuery::FromQuery(const QueryParams& params, FileOp op) {
  switch (op) {
    case FileOp::kRead:
    case FileOp::kList:
    case FileOp::kTarGet:
    case FileOp::kTarPut:
      AIRLOCK_TRY(CheckQueryNames(params, {"path"}, false));
      break;
    case FileOp::kWrite:
    case FileOp::kMkdir:
      AIRLOCK_TRY(CheckQueryNames(params, {"path", "mode", "parents"}, false));
      break;
    case FileOp::kDelete:
      AIRLOCK_TRY(CheckQueryNames(params, {"path", "recursive"}, false));
      break;
  }
  FileQuery query;
  bool has_path = false;
  for (const auto& [name, value] : params) {
    if (name == "path") {
      AIRLOCK_TRY(ValidatePath(value, "path"));
      query.path = value;
      has_path = true;
    } else if (name == "mode") {
      AIRLOCK_TRY_ASSIGN(query.mode, ParseMode(value));
    } else if (name == "parents") {
      AIRLOCK_TRY_ASSIGN(query.parents, ParseQueryBool(value, "parents"));
    } else if (name == "recursive") {
      AIRLOCK_TRY_ASSIGN(query.recursive, ParseQueryBool(value, "recursive"));
    }
  }
  if (!has_path) return Invalid("missing query parameter \"path\"");
  return query;
}

Result<OutputQuery> OutputQuery::FromQuery(const QueryParams& params) {
  AIRLOCK_TRY(CheckQueryNames(params, {"follow"}, false));
  OutputQuery query;
  for (const auto& [name, value] : params) {
    AIRLOCK_TRY_ASSIGN(query.follow, ParseQueryBool(value, "follow"));
  }
  return query;
}

Result<ReplayQuery> ReplayQuery::FromQuery(const QueryParams& params) {
  AIRLOCK_TRY(CheckQueryNames(params, {"replay"}, false));
  ReplayQuery query;
  for (const auto& [name, value] : params) {
    AIRLOCK_TRY_ASSIGN(query.replay, ParseQueryBool(value, "replay"));
  }
  return query;
}

Result<NetworkEventsQuery> NetworkEventsQuery::FromQuery(const QueryParams& params) {
  AIRLOCK_TRY(CheckQueryNames(params, {"after", "limit"}, false));
  NetworkEventsQuery query;
  for (const auto& [name, value] : params) {
    int64_t n = -1;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    const bool digits = !value.empty() && value.size() <= 19 && value[0] >= '0' && value[0] <= '9';
    if (name == "after") {
      if (!digits || ec != std::errc() || end != value.data() + value.size() || n < 0) {
        return Invalid("after must be a sequence number (0 or more), got " + Quote(value));
      }
      query.after = n;
    } else {
      if (!digits || ec != std::errc() || end != value.data() + value.size() || n < 1 ||
          n > kMaxLimit) {
        return Invalid("limit must be from 1 to " + std::to_string(kMaxLimit) + ", got " +
                       Quote(value));
      }
      query.limit = n;
    }
  }
  return query;
}

Result<EventsQuery> EventsQuery::FromQuery(const QueryParams& params) {
  AIRLOCK_TRY(CheckQueryNames(params, {"after", "limit", "type", "follow", "format"}, false));
  EventsQuery query;
  QueryParams paging;
  std::optional<std::string> format;
  for (const auto& [name, value] : params) {
    if (name == "after" || name == "limit") {
      paging.emplace_back(name, value);
    } else if (name == "follow") {
      AIRLOCK_TRY_ASSIGN(query.follow, ParseQueryBool(value, "follow"));
    } else if (name == "format") {
      format = value;
    } else {
      for (size_t at = 0; at <= value.size();) {
        size_t comma = value.find(',', at);
        if (comma == std::string::npos) comma = value.size();
        const std::string type = value.substr(at, comma - at);
        const bool ok = !type.empty() && type.size() <= 32 &&
                        std::ranges::all_of(type, [](char c) {
                          return (c >= 'a' && c <= 'z') || c == '.' || c == '_';
                        });
        if (!ok) {
          return Invalid("type must be a comma-separated list of event types such as exec or "
                         "net.connect (1-32 of a-z, '.', '_' each), got " + Quote(value));
        }
        query.types.push_back(type);
        at = comma + 1;
      }
      if (query.types.size() > kMaxTypes) {
        return Invalid("type names at most " + std::to_string(kMaxTypes) + " types");
      }
    }
  }
  NetworkEventsQuery page;
  AIRLOCK_TRY_ASSIGN(page, NetworkEventsQuery::FromQuery(paging));
  query.after = page.after;
  query.limit = page.limit;
  if (!format) {
    query.format = query.follow ? Format::kServerSentEvents : Format::kPage;
  } else if (*format == "json" && !query.follow) {
    query.format = Format::kPage;
  } else if (*format == "jsonl") {
    query.format = Format::kJsonLines;
  } else if (*format == "sse") {
    query.format = Format::kServerSentEvents;
  } else {
    return Invalid("format must be json (a page; not with follow), jsonl or sse, got " +
                   Quote(*format));
  }
  return query;
}

Result<MetricsQuery> MetricsQuery::FromQuery(const QueryParams& params) {
  AIRLOCK_TRY(CheckQueryNames(params, {"start", "end", "limit"}, false));
  MetricsQuery query;
  for (const auto& [name, value] : params) {
    int64_t n = -1;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    const bool number = !value.empty() && value.size() <= 19 && value[0] >= '0' &&
                        value[0] <= '9' && ec == std::errc() &&
                        end == value.data() + value.size() && n >= 0;
    if (name == "limit") {
      if (!number || n < 1 || n > kMaxLimit) {
        return Invalid("limit must be from 1 to " + std::to_string(kMaxLimit) + ", got " +
                       Quote(value));
      }
      query.limit = n;
    } else if (!number) {
      return Invalid(name + " must be a time in unix milliseconds (0 or more), got " +
                     Quote(value));
    } else {
      (name == "start" ? query.start_ms : query.end_ms) = n;
    }
  }
  if (query.start_ms > query.end_ms) {
    return Invalid("start (" + std::to_string(query.start_ms) + ") is after end (" +
                   std::to_string(query.end_ms) + ")");
  }
  return query;
}

Result<int32_t> ParsePid(std::string_view text) {
  int32_t pid = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), pid);
  const bool digits_only = !text.empty() && text.size() <= 10 && text[0] >= '1' && text[0] <= '9';
  if (!digits_only || ec != std::errc() || end != text.data() + text.size() || pid < 1) {
    return Invalid("pid must be a decimal process id inside the sandbox, got " + Quote(text));
  }
  return pid;
}

Result<ListFilter> ListFilter::FromQuery(const QueryParams& params) {
  AIRLOCK_TRY(CheckQueryNames(params, {"state", "tenant"}, true));
  ListFilter filter;
  for (const auto& [name, value] : params) {
    if (name == "tenant") {
      AIRLOCK_TRY(CheckTenantName(value, "tenant"));
      filter.tenant = value;
    } else if (name == "state") {
      bool known = false;
      for (std::string_view s : kSandboxStateNames) known = known || value == s;
      if (!known) {
        std::string names;
        for (std::string_view s : kSandboxStateNames) {
          names += (names.empty() ? "" : ", ") + std::string(s);
        }
        return Invalid("state must be one of " + names + ", got " + Quote(value));
      }
      filter.state = value;
    } else {
      const std::string key = name.substr(std::string_view("metadata.").size());
      AIRLOCK_TRY(ValidateMetadataKey(key, "metadata filter"));
      if (value.size() > kMaxMetadataValueBytes || value.find('\0') != std::string::npos) {
        return Invalid("metadata filter value for " + Quote(key) + " must be at most " +
                       std::to_string(kMaxMetadataValueBytes) + " bytes with no NUL");
      }
      filter.metadata.emplace(key, value);
      if (filter.metadata.size() > kMaxMetadataEntries) {
        return Invalid("at most " + std::to_string(kMaxMetadataEntries) +
                       " metadata filters may be given");
      }
    }
  }
  return filter;
}

bool ListFilter::Matches(std::string_view sandbox_state, const Metadata& sandbox_metadata) const {
  if (state && *state != sandbox_state) return false;
  for (const auto& [key, value] : metadata) {
    auto it = sandbox_metadata.find(key);
    if (it == sandbox_metadata.end() || it->second != value) return false;
  }
  return true;
}

namespace {

// Linux's standard signals by name (signal(7)); the real-time ones go by number.
constexpr std::pair<std::string_view, int> kSignalNames[] = {
    {"HUP", 1},    {"INT", 2},     {"QUIT", 3},   {"ILL", 4},     {"TRAP", 5},   {"ABRT", 6},
    {"IOT", 6},    {"BUS", 7},     {"FPE", 8},    {"KILL", 9},    {"USR1", 10},  {"SEGV", 11},
    {"USR2", 12},  {"PIPE", 13},   {"ALRM", 14},  {"TERM", 15},   {"STKFLT", 16}, {"CHLD", 17},
    {"CONT", 18},  {"STOP", 19},   {"TSTP", 20},  {"TTIN", 21},   {"TTOU", 22},  {"URG", 23},
    {"XCPU", 24},  {"XFSZ", 25},   {"VTALRM", 26}, {"PROF", 27},  {"WINCH", 28}, {"IO", 29},
    {"POLL", 29},  {"PWR", 30},    {"SYS", 31},
};
constexpr int kMaxSignal = 64;

}  // namespace

Result<int> ParseSignal(const json& value, std::string_view field) {
  const std::string rule = std::string(field) +
                           " must be a name like \"TERM\" or \"SIGINT\", or a number 1-64, got ";
  if (value.is_number_integer()) {
    // GetInt refuses integers past 64 bits too, with a message naming the range.
    int64_t n = 0;
    AIRLOCK_TRY_ASSIGN(n, GetInt(value, field, 1, kMaxSignal));
    return static_cast<int>(n);
  }
  if (!value.is_string()) return Invalid(rule + Describe(value));
  const std::string& text = value.get_ref<const std::string&>();
  if (text.size() <= 16) {  // "SIGVTALRM" is the longest name
    std::string name;
    for (char c : text) name += static_cast<char>(IsLower(c) ? c - 'a' + 'A' : c);
    std::string_view bare = name;
    if (bare.starts_with("SIG")) bare.remove_prefix(3);
    for (const auto& [known, number] : kSignalNames) {
      if (bare == known) return number;
    }
  }
  return Invalid(rule + Quote(text));
}

Result<WsClientMessage> WsClientMessage::FromJson(std::string_view text) {
  if (text.size() > kMaxWsMessageBytes) {
    return Fail(ErrorCode::kTooLarge, "message over " + std::to_string(kMaxWsMessageBytes) +
                                          " bytes");
  }
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(text));
  if (!doc.contains("type")) {
    return Invalid("message has no type; one of stdin, stdin_close, signal, resize");
  }
  std::string type;
  AIRLOCK_TRY_ASSIGN(type, GetString(doc["type"], "type", 16, false));
  WsClientMessage msg;
  if (type == "stdin") {
    AIRLOCK_TRY(RejectUnknownFields(doc, "stdin message", {"type", "data", "encoding"}));
    if (!doc.contains("data")) return Invalid("stdin message has no data");
    std::string encoding = "utf-8";
    if (doc.contains("encoding")) {
      AIRLOCK_TRY_ASSIGN(encoding, GetString(doc["encoding"], "encoding", 16, false));
      if (encoding != "utf-8" && encoding != "base64") {
        return Invalid("encoding must be \"utf-8\" or \"base64\", got " + Quote(encoding));
      }
    }
    AIRLOCK_TRY_ASSIGN(msg.data, GetString(doc["data"], "data", kMaxWsMessageBytes, true));
    if (encoding == "base64") {
      auto decoded = Base64Decode(msg.data);
      if (!decoded) return std::unexpected(std::move(decoded.error()).Wrap("data"));
      msg.data = std::move(*decoded);
    }
    msg.type = Type::kStdin;
  } else if (type == "stdin_close") {
    AIRLOCK_TRY(RejectUnknownFields(doc, "stdin_close message", {"type"}));
    msg.type = Type::kStdinClose;
  } else if (type == "signal") {
    AIRLOCK_TRY(RejectUnknownFields(doc, "signal message", {"type", "signal"}));
    if (!doc.contains("signal")) return Invalid("signal message has no signal");
    AIRLOCK_TRY_ASSIGN(msg.signal, ParseSignal(doc["signal"]));
    msg.type = Type::kSignal;
  } else if (type == "resize") {
    AIRLOCK_TRY(RejectUnknownFields(doc, "resize message", {"type", "cols", "rows"}));
    for (auto [name, field] : {std::pair{"cols", &msg.cols}, std::pair{"rows", &msg.rows}}) {
      if (!doc.contains(name)) return Invalid(std::string("resize message has no ") + name);
      int64_t n = 0;
      AIRLOCK_TRY_ASSIGN(n, GetInt(doc[name], name, 1, 1000));
      *field = static_cast<uint16_t>(n);
    }
    msg.type = Type::kResize;
  } else {
    return Invalid("unknown message type " + Quote(type) +
                   "; one of stdin, stdin_close, signal, resize");
  }
  return msg;
}

void LimitFields::Apply(const runtime::Limits& from, runtime::Limits& into) const {
  if (cpus) into.cpus = from.cpus;
  if (memory_mb) into.memory_mb = from.memory_mb;
  if (pids_max) into.pids_max = from.pids_max;
  if (disk_mb) into.disk_mb = from.disk_mb;
}

namespace {

Result<TemplateStep> GetStep(const json& value, size_t index) {
  const std::string where = ElementPath("steps", index);
  if (!value.is_object()) return Invalid(where + " must be an object, got " + Describe(value));
  TemplateStep step;
  if (value.contains("run") == value.contains("copy")) {
    return Invalid(where + " must have exactly one of run and copy");
  }
  if (value.contains("run")) {
    AIRLOCK_TRY(RejectUnknownFields(value, where, {"run", "user", "timeout_seconds"}));
    AIRLOCK_TRY_ASSIGN(step.run,
                       GetString(value["run"], MemberPath(where, "run"), kMaxCmdBytes, false));
    if (step.run.empty()) return Invalid(MemberPath(where, "run") + " must not be empty");
    step.user = "root";
    if (value.contains("user")) {
      AIRLOCK_TRY_ASSIGN(step.user,
                         GetString(value["user"], MemberPath(where, "user"), kMaxUserBytes, false));
      if (step.user.empty()) return Invalid(MemberPath(where, "user") + " must not be empty");
    }
    if (value.contains("timeout_seconds")) {
      AIRLOCK_TRY_ASSIGN(step.timeout_seconds,
                         GetPositiveNumber(value["timeout_seconds"],
                                           MemberPath(where, "timeout_seconds"), kMaxTimeoutSeconds));
    }
    return step;
  }
  AIRLOCK_TRY(RejectUnknownFields(value, where, {"copy"}));
  const json& copy = value["copy"];
  const std::string cwhere = MemberPath(where, "copy");
  if (!copy.is_object()) return Invalid(cwhere + " must be an object, got " + Describe(copy));
  AIRLOCK_TRY(RejectUnknownFields(copy, cwhere, {"path", "content", "encoding", "mode"}));
  if (!copy.contains("path") || !copy.contains("content")) {
    return Invalid(cwhere + " needs path and content");
  }
  AIRLOCK_TRY_ASSIGN(step.path,
                     GetString(copy["path"], MemberPath(cwhere, "path"), kMaxPathBytes, false));
  AIRLOCK_TRY(ValidatePath(step.path, MemberPath(cwhere, "path")));
  if (!step.path.starts_with('/')) return Invalid(MemberPath(cwhere, "path") + " must be absolute");
  std::string encoding = "utf-8";
  if (copy.contains("encoding")) {
    AIRLOCK_TRY_ASSIGN(encoding, GetString(copy["encoding"], MemberPath(cwhere, "encoding"), 16,
                                           false));
    if (encoding != "utf-8" && encoding != "base64") {
      return Invalid(MemberPath(cwhere, "encoding") + " must be \"utf-8\" or \"base64\", got " +
                     Quote(encoding));
    }
  }
  std::string text;
  AIRLOCK_TRY_ASSIGN(text, GetString(copy["content"], MemberPath(cwhere, "content"),
                                     kMaxJsonBodyBytes, true));
  if (encoding == "base64") {
    auto decoded = Base64Decode(text);
    if (!decoded) return Invalid(MemberPath(cwhere, "content") + " is not valid base64");
    step.content = std::move(*decoded);
  } else {
    step.content = std::move(text);
  }
  if (copy.contains("mode")) {
    std::string mode;
    AIRLOCK_TRY_ASSIGN(mode, GetString(copy["mode"], MemberPath(cwhere, "mode"), 8, false));
    AIRLOCK_TRY_ASSIGN(step.mode, ParseMode(mode));
  }
  return step;
}

json LimitsJson(const runtime::Limits& limits, const LimitFields& given) {
  json out = json::object();
  if (given.cpus) out["cpus"] = limits.cpus;
  if (given.memory_mb) out["memory_mb"] = limits.memory_mb;
  if (given.pids_max) out["pids_max"] = limits.pids_max;
  if (given.disk_mb) out["disk_mb"] = limits.disk_mb;
  return out;
}

}  // namespace

Result<CreateTemplateRequest> CreateTemplateRequest::FromJson(std::string_view body) {
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(RejectUnknownFields(
      doc, "request body",
      {"name", "base", "steps", "env", "workdir", "cpus", "memory_mb", "pids_max", "disk_mb",
       "start_cmd", "ready_cmd", "ready_timeout_seconds", "snapshot_after", "stream", "network",
       "engine"}));
  CreateTemplateRequest req;
  if (doc.contains("engine")) AIRLOCK_TRY_ASSIGN(req.engine, GetEngineName(doc["engine"]));
  if (!doc.contains("name")) return Invalid("name is required");
  AIRLOCK_TRY_ASSIGN(req.name, GetString(doc["name"], "name", kMaxTemplateNameBytes, false));
  AIRLOCK_TRY(ValidateTemplateName(req.name));
  if (req.name == kDefaultTemplate) return Invalid("name \"base\" is the built-in template's");
  if (doc.contains("base")) {
    AIRLOCK_TRY_ASSIGN(req.base, GetString(doc["base"], "base", kMaxPathBytes, false));
    if (req.base.starts_with('/')) {
      AIRLOCK_TRY(ValidatePath(req.base, "base"));
    } else if (auto st = CheckTemplateName(req.base); !st) {
      return Invalid("base must be \"base\", a template, \"debian:<suite>\" or the absolute "
                     "path of an image archive, got " + Quote(req.base));
    }
  }
  if (doc.contains("steps")) {
    const json& steps = doc["steps"];
    if (!steps.is_array()) return Invalid("steps must be an array, got " + Describe(steps));
    if (steps.size() > kMaxTemplateSteps) {
      return Invalid("steps may hold at most " + std::to_string(kMaxTemplateSteps) + " steps");
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      TemplateStep step;
      AIRLOCK_TRY_ASSIGN(step, GetStep(steps[i], i));
      req.steps.push_back(std::move(step));
    }
  }
  if (doc.contains("env")) AIRLOCK_TRY_ASSIGN(req.env, GetEnv(doc["env"], "env"));
  if (doc.contains("workdir")) {
    AIRLOCK_TRY_ASSIGN(req.workdir, GetString(doc["workdir"], "workdir", kMaxPathBytes, false));
    AIRLOCK_TRY(ValidatePath(req.workdir, "workdir"));
    if (!req.workdir.starts_with('/')) return Invalid("workdir must be an absolute path");
  }
  AIRLOCK_TRY(GetLimits(doc, req.limits, req.limits_given));
  for (auto [field, target] : {std::pair{"start_cmd", &req.start_cmd},
                               {"ready_cmd", &req.ready_cmd},
                               {"snapshot_after", &req.snapshot_after}}) {
    if (!doc.contains(field)) continue;
    AIRLOCK_TRY_ASSIGN(*target, GetString(doc[field], field, kMaxCmdBytes, false));
    if (target->empty()) return Invalid(std::string(field) + " must not be empty when given");
  }
  if (doc.contains("ready_timeout_seconds")) {
    AIRLOCK_TRY_ASSIGN(req.ready_timeout_seconds,
                       GetPositiveNumber(doc["ready_timeout_seconds"], "ready_timeout_seconds",
                                         kMaxReadyTimeoutSeconds));
  }
  if (doc.contains("stream")) AIRLOCK_TRY_ASSIGN(req.stream, GetBool(doc["stream"], "stream"));
  if (doc.contains("network")) {
    AIRLOCK_TRY_ASSIGN(req.network, net::NetworkPolicy::FromJson(doc["network"]));
  }
  return req;
}

TemplateSettings TemplateSettings::From(const CreateTemplateRequest& request) {
  TemplateSettings s;
  s.base = request.base;
  s.engine = request.engine;
  s.env = request.env;
  s.workdir = request.workdir;
  s.limits = request.limits;
  s.limits_given = request.limits_given;
  s.start_cmd = request.start_cmd;
  s.ready_cmd = request.ready_cmd;
  s.ready_timeout_seconds = request.ready_timeout_seconds;
  s.snapshot_after = request.snapshot_after;
  return s;
}

std::string TemplateSettings::ToJson(const std::vector<TemplateStep>& steps) const {
  json out = {{"base", base},
              {"root", root},
              {"engine", engine},
              {"env", env},
              {"workdir", workdir},
              {"limits", LimitsJson(limits, limits_given)},
              {"start_cmd", start_cmd},
              {"ready_cmd", ready_cmd},
              {"ready_timeout_seconds", ready_timeout_seconds}};
  if (!snapshot_after.empty()) out["snapshot_after"] = snapshot_after;
  if (!memory_image.empty()) {
    out["memory_snapshot"] = {{"image", memory_image}, {"bytes", memory_image_bytes}};
  }
  json described = json::array();
  for (const TemplateStep& step : steps) {
    if (step.is_copy()) {
      described.push_back({{"copy", {{"path", step.path}, {"bytes", step.content.size()},
                                     {"mode", step.mode}}}});
    } else {
      described.push_back({{"run", step.run}, {"user", step.user}});
    }
  }
  out["steps"] = std::move(described);
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<TemplateSettings> TemplateSettings::FromJson(std::string_view text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return Fail(ErrorCode::kInternal, "a stored template's settings are not a JSON object");
  }
  TemplateSettings s;
  try {
    s.base = doc.value("base", std::string(kDefaultTemplate));
    s.root = doc.value("root", std::string(kRootHostUsr));
    if (s.root != kRootHostUsr && s.root != kRootOwn) {
      return Fail(ErrorCode::kInternal, "a stored template's root '" + s.root + "' is unknown");
    }
    s.engine = doc.value("engine", std::string());
    s.env = doc.value("env", EnvMap{});
    s.workdir = doc.value("workdir", std::string());
    s.start_cmd = doc.value("start_cmd", std::string());
    s.ready_cmd = doc.value("ready_cmd", std::string());
    s.ready_timeout_seconds = doc.value("ready_timeout_seconds", kDefaultReadyTimeoutSeconds);
    s.snapshot_after = doc.value("snapshot_after", std::string());
    if (const json memory = doc.value("memory_snapshot", json::object()); !memory.empty()) {
      s.memory_image = memory.at("image").get<std::string>();
      s.memory_image_bytes = memory.at("bytes").get<uint64_t>();
    }
    const json limits = doc.value("limits", json::object());
    AIRLOCK_TRY(GetLimits(limits, s.limits, s.limits_given));
  } catch (const json::exception& e) {
    return Fail(ErrorCode::kInternal, std::string("a stored template's settings: ") + e.what());
  }
  return s;
}

Result<SnapshotRequest> SnapshotRequest::FromJson(std::string_view body) {
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(RejectUnknownFields(doc, "request body", {"name"}));
  if (!doc.contains("name")) return Invalid("name is required");
  SnapshotRequest req;
  AIRLOCK_TRY_ASSIGN(req.name, GetString(doc["name"], "name", kMaxTemplateNameBytes, false));
  AIRLOCK_TRY(ValidateTemplateName(req.name));
  if (req.name == kDefaultTemplate) return Invalid("name \"base\" is the built-in template's");
  return req;
}

Result<PauseRequest> PauseRequest::FromJson(std::string_view body) {
  PauseRequest req;
  if (body.empty()) return req;
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(RejectUnknownFields(doc, "request body", {"memory"}));
  if (doc.contains("memory")) AIRLOCK_TRY_ASSIGN(req.memory, GetBool(doc["memory"], "memory"));
  return req;
}

Result<ForkRequest> ForkRequest::FromJson(std::string_view body) {
  ForkRequest req;
  if (body.empty()) return req;
  json doc;
  AIRLOCK_TRY_ASSIGN(doc, ParseJsonObject(body));
  AIRLOCK_TRY(
      RejectUnknownFields(doc, "request body", {"count", "ttl_seconds", "metadata", "memory"}));
  if (doc.contains("count")) AIRLOCK_TRY_ASSIGN(req.count, GetInt(doc["count"], "count", 1, kMaxForkCount));
  if (doc.contains("memory")) AIRLOCK_TRY_ASSIGN(req.memory, GetBool(doc["memory"], "memory"));
  if (doc.contains("ttl_seconds")) {
    AIRLOCK_TRY_ASSIGN(req.ttl_seconds, GetInt(doc["ttl_seconds"], "ttl_seconds", 1, kMaxTtlSeconds));
  }
  if (doc.contains("metadata")) {
    Metadata metadata;
    AIRLOCK_TRY_ASSIGN(metadata, GetMetadata(doc["metadata"], "metadata"));
    req.metadata = std::move(metadata);
  }
  return req;
}

}  // namespace airlock::api
