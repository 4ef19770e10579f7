// libFuzzer target for the API's request parsers (src/daemon/api): the bytes an HTTP client
// controls in a request body or a query string, plus base64 and UTF-8.
//
// Input: byte 0 picks the parser, the rest is the body, query string or text:
//
//   0 CreateSandboxRequest::FromJson    1 PatchSandboxRequest::FromJson
//   2 ExecRequest::FromJson             3..9 ParseQueryString + FileQuery::FromQuery, one FileOp
//   10 ParseQueryString + ListFilter    11 Base64Decode / Base64Encode   12 IsValidUtf8
//   13 SignalRequest::FromJson          14 StdinRequest::FromJson        15 WaitRequest::FromJson
//   16 ParseQueryString + OutputQuery   17 WsClientMessage::FromJson (a WebSocket message)
//   18 CreateSecretRequest::FromJson and UpdateSecretRequest::FromJson (a secret's body)
//
// What is checked, for every input:
//  - a parser returns a value or an Error whose code is kInvalidArgument (kTooLarge only for a
//    body over kMaxJsonBodyBytes), with a message, and ErrorBody renders it as valid JSON;
//  - a parsed request is in range (types.h's limits) and, re-serialized here (the API has no
//    request serializer) as JSON or as a percent-encoded query string, parses to an equal value;
//    a parsed sandbox also renders (RenderSandbox) to JSON whose fields parse back to its own;
//  - a query string's parameters, percent-encoded again, parse to the same parameters;
//  - Base64Decode(Base64Encode(x)) == x, and a text Base64Decode accepts is Base64Encode's;
//  - IsValidUtf8 agrees with the reference decoder below on every input, and RenderExecResult
//    carries arbitrary bytes through its utf-8 / base64 choice unchanged.
//  - a secret's body is refused without an echo of what the JSON parser read (the value may be
//    in it), and an accepted one holds a name and a value within the rules.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"
#include "daemon/api/base64.h"
#include "daemon/api/json.h"
#include "daemon/api/query.h"
#include "daemon/api/render.h"
#include "daemon/api/types.h"
#include "daemon/api/utf8.h"

namespace airlock::api {
namespace {

using nlohmann::json;

// --- Reference UTF-8 decoder: code points first, then the rules (not the lead-byte table). ---

bool ReferenceUtf8(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t b0 = p[i];
    size_t len = 0;
    uint32_t cp = 0;
    if ((b0 & 0x80) == 0) {
      len = 1;
      cp = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      len = 2;
      cp = b0 & 0x1F;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3;
      cp = b0 & 0x0F;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4;
      cp = b0 & 0x07;
    } else {
      return false;  // a continuation byte or 0xF8..0xFF
    }
    if (bytes.size() - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len]) return false;       // overlong
    if (cp >= 0xD800 && cp <= 0xDFFF) return false;  // surrogate
    if (cp > 0x10FFFF) return false;                 // beyond Unicode
    i += len;
  }
  return true;
}

// --- Errors. ---

void CheckError(const Error& error, size_t input_size) {
  AIRLOCK_CHECK(error.code() == ErrorCode::kInvalidArgument ||
                (error.code() == ErrorCode::kTooLarge && input_size > kMaxJsonBodyBytes));
  AIRLOCK_CHECK(!error.message().empty());
  // The message may quote the client's bytes; the rendered body must still be valid JSON.
  HttpError body = ErrorBody(error);
  AIRLOCK_CHECK(body.status == HttpStatus(error.code()));
  AIRLOCK_CHECK(IsValidUtf8(body.body));
  json doc = json::parse(body.body, nullptr, /*allow_exceptions=*/false);
  AIRLOCK_CHECK(doc.is_object() && doc.contains("error"));
  AIRLOCK_CHECK(doc["error"]["code"] == std::string(ErrorCodeName(error.code())));
}

template <typename T>
bool Accepted(const Result<T>& r, size_t input_size) {
  if (!r) CheckError(r.error(), input_size);
  return r.has_value();
}

// --- Query strings: a percent-encoder that is not the parser's inverse by construction. ---

std::string PercentEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : text) {
    const auto b = static_cast<uint8_t>(c);
    const bool plain = (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') ||
                       b == '-' || b == '_' || b == '.' || b == '~';
    if (plain) {
      out += c;
    } else if (b == ' ') {
      out += '+';
    } else {
      out += '%';
      out += kHex[b >> 4];
      out += kHex[b & 15];
    }
  }
  return out;
}

std::string EncodeQuery(const QueryParams& params) {
  std::string out;
  for (const auto& [name, value] : params) {
    if (!out.empty()) out += '&';
    out += PercentEncode(name);
    out += '=';
    out += PercentEncode(value);
  }
  return out;
}

// Parses and checks that the parameters survive re-encoding; nullopt if refused.
std::optional<QueryParams> ParseQuery(std::string_view raw) {
  auto params = ParseQueryString(raw);
  if (!Accepted(params, raw.size())) return std::nullopt;
  for (const auto& [name, value] : *params) AIRLOCK_CHECK(!name.empty());
  auto again = ParseQueryString(EncodeQuery(*params));
  AIRLOCK_CHECK(again.has_value());
  AIRLOCK_CHECK(*again == *params);
  return std::move(*params);
}

// --- Create. ---

bool SameLimits(const runtime::Limits& a, const runtime::Limits& b) {
  return a.cpus == b.cpus && a.memory_mb == b.memory_mb && a.pids_max == b.pids_max &&
         a.disk_mb == b.disk_mb && a.tmp_mb == b.tmp_mb && a.nofile == b.nofile;
}

bool Same(const CreateSandboxRequest& a, const CreateSandboxRequest& b) {
  return a.template_name == b.template_name && a.ttl_seconds == b.ttl_seconds &&
         SameLimits(a.limits, b.limits) && a.env == b.env && a.metadata == b.metadata;
}

json StringObject(const std::map<std::string, std::string>& m) {
  json obj = json::object();
  for (const auto& [k, v] : m) obj[k] = v;
  return obj;
}

void CheckCreate(std::string_view body) {
  auto req = CreateSandboxRequest::FromJson(body);
  if (!Accepted(req, body.size())) return;
  const runtime::Limits defaults;
  AIRLOCK_CHECK(!req->template_name.empty() && req->template_name.size() <= kMaxTemplateNameBytes);
  AIRLOCK_CHECK(req->ttl_seconds >= 1 && req->ttl_seconds <= kMaxTtlSeconds);
  AIRLOCK_CHECK(req->limits.cpus > 0 && req->limits.cpus <= kMaxCpus);
  AIRLOCK_CHECK(req->limits.memory_mb >= kMinMemoryMb && req->limits.memory_mb <= kMaxMemoryMb);
  AIRLOCK_CHECK(req->limits.pids_max >= kMinPidsMax && req->limits.pids_max <= kMaxPidsMax);
  AIRLOCK_CHECK(req->limits.disk_mb >= kMinDiskMb && req->limits.disk_mb <= kMaxDiskMb);
  AIRLOCK_CHECK(req->limits.tmp_mb == defaults.tmp_mb && req->limits.nofile == defaults.nofile);
  AIRLOCK_CHECK(req->env.size() <= kMaxEnvEntries);
  AIRLOCK_CHECK(req->metadata.size() <= kMaxMetadataEntries);

  // Every field written out explicitly parses to the same request.
  json doc = {
      {"template", req->template_name},   {"ttl_seconds", req->ttl_seconds},
      {"cpus", req->limits.cpus},         {"memory_mb", req->limits.memory_mb},
      {"pids_max", req->limits.pids_max}, {"disk_mb", req->limits.disk_mb},
      {"env", StringObject(req->env)},    {"metadata", StringObject(req->metadata)},
  };
  auto again = CreateSandboxRequest::FromJson(doc.dump());
  AIRLOCK_CHECK(again.has_value());
  AIRLOCK_CHECK(Same(*again, *req));

  // What RenderSandbox shows of it (template, limits, metadata) parses back to the same values.
  SandboxView view;
  view.id = "sbx-fuzz";
  view.state = "running";
  view.template_name = req->template_name;
  view.engine = "jail";
  view.limits = req->limits;
  view.metadata = req->metadata;
  json shown = json::parse(RenderSandbox(view), nullptr, /*allow_exceptions=*/false);
  AIRLOCK_CHECK(shown.is_object());
  json from_render = {
      {"template", shown["template"]},           {"ttl_seconds", req->ttl_seconds},
      {"cpus", shown["limits"]["cpus"]},         {"memory_mb", shown["limits"]["memory_mb"]},
      {"pids_max", shown["limits"]["pids_max"]}, {"disk_mb", shown["limits"]["disk_mb"]},
      {"env", StringObject(req->env)},           {"metadata", shown["metadata"]},
  };
  auto rendered = CreateSandboxRequest::FromJson(from_render.dump());
  AIRLOCK_CHECK(rendered.has_value());
  AIRLOCK_CHECK(Same(*rendered, *req));
}

// --- Patch. ---

void CheckPatch(std::string_view body) {
  auto req = PatchSandboxRequest::FromJson(body);
  if (!Accepted(req, body.size())) return;
  if (req->ttl_seconds) {
    AIRLOCK_CHECK(*req->ttl_seconds >= 1 && *req->ttl_seconds <= kMaxTtlSeconds);
  }
  AIRLOCK_CHECK(req->metadata.size() <= kMaxMetadataEntries);

  json doc = json::object();
  if (req->ttl_seconds) doc["ttl_seconds"] = *req->ttl_seconds;
  // An empty metadata patch ({"metadata": {}}) is a valid request with nothing in the map; the
  // re-serialization keeps "metadata" whenever ttl_seconds alone would not make a request.
  if (!req->metadata.empty() || !req->ttl_seconds) {
    json patch = json::object();
    for (const auto& [k, v] : req->metadata) patch[k] = v ? json(*v) : json(nullptr);
    doc["metadata"] = std::move(patch);
  }
  auto again = PatchSandboxRequest::FromJson(doc.dump());
  AIRLOCK_CHECK(again.has_value());
  AIRLOCK_CHECK(again->ttl_seconds == req->ttl_seconds && again->metadata == req->metadata);

  // Applied to empty metadata: exactly the keys set, with their values.
  Metadata current;
  AIRLOCK_CHECK(req->ApplyMetadata(current).has_value());
  for (const auto& [k, v] : req->metadata) {
    auto it = current.find(k);
    AIRLOCK_CHECK(v ? (it != current.end() && it->second == *v) : it == current.end());
  }
}

// --- Exec. ---

bool Same(const ExecRequest& a, const ExecRequest& b) {
  return a.cmd == b.cmd && a.argv == b.argv && a.cwd == b.cwd && a.env == b.env &&
         a.stdin_data == b.stdin_data && a.timeout_seconds == b.timeout_seconds && a.user == b.user &&
         a.stream == b.stream && a.background == b.background && a.stdin_open == b.stdin_open &&
         a.pty.has_value() == b.pty.has_value() &&
         (!a.pty || (a.pty->cols == b.pty->cols && a.pty->rows == b.pty->rows));
}

void CheckExecReparses(const ExecRequest& req, bool stdin_as_base64) {
  json doc = json::object();
  if (req.is_shell()) {
    doc["cmd"] = req.cmd;
  } else {
    doc["argv"] = req.argv;
  }
  if (!req.cwd.empty()) doc["cwd"] = req.cwd;
  doc["env"] = StringObject(req.env);
  if (stdin_as_base64) {
    doc["stdin"] = Base64Encode(req.stdin_data);
    doc["stdin_encoding"] = "base64";
  } else {
    doc["stdin"] = req.stdin_data;
  }
  doc["timeout_seconds"] = req.timeout_seconds;
  if (!req.user.empty()) doc["user"] = req.user;
  doc["stream"] = req.stream;
  doc["background"] = req.background;
  doc["stdin_open"] = req.stdin_open;
  if (req.pty) doc["pty"] = {{"cols", req.pty->cols}, {"rows", req.pty->rows}};
  auto again = ExecRequest::FromJson(doc.dump());
  AIRLOCK_CHECK(again.has_value());
  AIRLOCK_CHECK(Same(*again, req));
}

void CheckExec(std::string_view body) {
  auto req = ExecRequest::FromJson(body);
  if (!Accepted(req, body.size())) return;
  AIRLOCK_CHECK(req->cmd.empty() != req->argv.empty());
  AIRLOCK_CHECK(req->cmd.size() <= kMaxCmdBytes);
  AIRLOCK_CHECK(req->argv.size() <= kMaxArgvEntries);
  if (!req->argv.empty()) AIRLOCK_CHECK(!req->argv[0].empty());
  AIRLOCK_CHECK(req->cwd.empty() || ValidatePath(req->cwd, "cwd").has_value());
  AIRLOCK_CHECK(req->env.size() <= kMaxEnvEntries);
  AIRLOCK_CHECK(req->stdin_data.size() <= kMaxStdinBytes);
  AIRLOCK_CHECK(req->timeout_seconds > 0 && req->timeout_seconds <= kMaxTimeoutSeconds);
  AIRLOCK_CHECK(req->user.size() <= kMaxUserBytes);
  AIRLOCK_CHECK(EnvList(req->env).size() == req->env.size());
  AIRLOCK_CHECK(!(req->stream && req->background));
  if (req->pty) {
    AIRLOCK_CHECK(req->pty->cols >= 1 && req->pty->cols <= 1000);
    AIRLOCK_CHECK(req->pty->rows >= 1 && req->pty->rows <= 1000);
  }

  CheckExecReparses(*req, /*stdin_as_base64=*/true);
  // A JSON string holds only UTF-8; other stdin can travel only as base64.
  if (IsValidUtf8(req->stdin_data)) CheckExecReparses(*req, /*stdin_as_base64=*/false);
}

// --- File queries and list filters. ---

constexpr FileOp kFileOps[] = {FileOp::kRead,  FileOp::kWrite,  FileOp::kDelete, FileOp::kList,
                               FileOp::kMkdir, FileOp::kTarGet, FileOp::kTarPut};

void CheckFileQuery(std::string_view raw, FileOp op) {
  auto params = ParseQuery(raw);
  if (!params) return;
  auto query = FileQuery::FromQuery(*params, op);
  if (!Accepted(query, raw.size())) return;
  AIRLOCK_CHECK(ValidatePath(query->path, "path").has_value());
  const bool takes_mode = op == FileOp::kWrite || op == FileOp::kMkdir;
  AIRLOCK_CHECK(takes_mode || (!query->mode && !query->parents));
  AIRLOCK_CHECK(op == FileOp::kDelete || !query->recursive);
  if (query->mode) AIRLOCK_CHECK(*query->mode <= 07777);

  QueryParams out = {{"path", query->path}};
  if (query->mode) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "%04o", *query->mode);
    out.emplace_back("mode", buf);
  }
  if (takes_mode) out.emplace_back("parents", query->parents ? "true" : "false");
  if (op == FileOp::kDelete) out.emplace_back("recursive", query->recursive ? "1" : "0");
  auto reparsed = ParseQueryString(EncodeQuery(out));
  AIRLOCK_CHECK(reparsed.has_value());
  auto again = FileQuery::FromQuery(*reparsed, op);
  AIRLOCK_CHECK(again.has_value());
  AIRLOCK_CHECK(again->path == query->path && again->mode == query->mode &&
                again->parents == query->parents && again->recursive == query->recursive);
}

void CheckListFilter(std::string_view raw) {
  auto params = ParseQuery(raw);
  if (!params) return;
  auto filter = ListFilter::FromQuery(*params);
  if (!Accepted(filter, raw.size())) return;
  AIRLOCK_CHECK(filter->metadata.size() <= kMaxMetadataEntries);
  if (filter->state) {
    bool known = false;
    for (std::string_view s : kSandboxStateNames) known = known || *filter->state == s;
    AIRLOCK_CHECK(known);
  }
  if (filter->tenant) AIRLOCK_CHECK(CheckTenantName(*filter->tenant, "tenant").has_value());
  // A sandbox with exactly the filtered state and metadata matches; one without a key does not.
  const std::string state = filter->state.value_or("running");
  AIRLOCK_CHECK(filter->Matches(state, filter->metadata));
  if (!filter->metadata.empty()) {
    Metadata fewer = filter->metadata;
    fewer.erase(fewer.begin());
    AIRLOCK_CHECK(!filter->Matches(state, fewer));
  }

  QueryParams out;
  if (filter->state) out.emplace_back("state", *filter->state);
  if (filter->tenant) out.emplace_back("tenant", *filter->tenant);
  for (const auto& [k, v] : filter->metadata) out.emplace_back("metadata." + k, v);
  auto reparsed = ParseQueryString(EncodeQuery(out));
  AIRLOCK_CHECK(reparsed.has_value());
  auto again = ListFilter::FromQuery(*reparsed);
  AIRLOCK_CHECK(again.has_value());
  AIRLOCK_CHECK(again->state == filter->state && again->metadata == filter->metadata &&
                again->tenant == filter->tenant);
}

// --- Base64 and UTF-8. ---

void CheckBase64(std::string_view bytes) {
  const std::string encoded = Base64Encode(bytes);
  AIRLOCK_CHECK(encoded.size() == (bytes.size() + 2) / 3 * 4);
  auto decoded = Base64Decode(encoded);
  AIRLOCK_CHECK(decoded.has_value());
  AIRLOCK_CHECK(*decoded == bytes);

  auto as_text = Base64Decode(bytes);
  if (!Accepted(as_text, bytes.size())) return;
  AIRLOCK_CHECK(Base64Encode(*as_text) == bytes);  // the one canonical encoding
}

void CheckUtf8(std::string_view bytes) {
  AIRLOCK_CHECK(IsValidUtf8(bytes) == ReferenceUtf8(bytes));
  // RenderExecResult sends valid UTF-8 as a string and anything else as base64: either way the
  // client gets the bytes back.
  ExecResultView result;
  result.stdout_bytes = std::string(bytes);
  json doc = json::parse(RenderExecResult(result), nullptr, /*allow_exceptions=*/false);
  AIRLOCK_CHECK(doc.is_object());
  const std::string encoding = doc["stdout_encoding"].get<std::string>();
  AIRLOCK_CHECK(encoding == (ReferenceUtf8(bytes) ? "utf-8" : "base64"));
  const std::string shown = doc["stdout"].get<std::string>();
  if (encoding == "utf-8") {
    AIRLOCK_CHECK(shown == bytes);
  } else {
    auto back = Base64Decode(shown);
    AIRLOCK_CHECK(back.has_value() && *back == bytes);
  }
}

// --- Process routes. ---

void CheckSignal(std::string_view body) {
  auto req = SignalRequest::FromJson(body);
  if (!Accepted(req, body.size())) return;
  AIRLOCK_CHECK(req->signo >= 1 && req->signo <= 64);
  // The number, and (for the classic signals) the name, parse to the same signal.
  auto again = SignalRequest::FromJson(json{{"signal", req->signo}}.dump());
  AIRLOCK_CHECK(again.has_value() && again->signo == req->signo);
}

void CheckStdin(std::string_view body) {
  auto req = StdinRequest::FromJson(body);
  if (!Accepted(req, body.size())) return;
  AIRLOCK_CHECK(req->data.size() <= kMaxStdinBytes);
  AIRLOCK_CHECK(!req->data.empty() || req->close);
  json doc = {{"data", Base64Encode(req->data)}, {"encoding", "base64"}, {"close", req->close}};
  auto again = StdinRequest::FromJson(doc.dump());
  AIRLOCK_CHECK(again.has_value() && again->data == req->data && again->close == req->close);
}

void CheckWait(std::string_view body) {
  auto req = WaitRequest::FromJson(body);
  if (!Accepted(req, body.size())) return;
  AIRLOCK_CHECK(req->timeout_seconds > 0 && req->timeout_seconds <= kMaxWaitSeconds);
  auto again = WaitRequest::FromJson(json{{"timeout_seconds", req->timeout_seconds}}.dump());
  AIRLOCK_CHECK(again.has_value() && again->timeout_seconds == req->timeout_seconds);
}

void CheckOutputQuery(std::string_view raw) {
  auto params = ParseQueryString(raw);
  if (!Accepted(params, raw.size())) return;
  auto query = OutputQuery::FromQuery(*params);
  if (!Accepted(query, raw.size())) return;
  auto again = OutputQuery::FromQuery({{"follow", query->follow ? "true" : "false"}});
  AIRLOCK_CHECK(again.has_value() && again->follow == query->follow);
}

// --- WebSocket client messages. ---

bool Same(const WsClientMessage& a, const WsClientMessage& b) {
  return a.type == b.type && a.data == b.data && a.signal == b.signal && a.cols == b.cols &&
         a.rows == b.rows;
}

void CheckWsMessage(std::string_view text) {
  auto msg = WsClientMessage::FromJson(text);
  if (!msg) {
    // The cap on a message is below the JSON body cap that CheckError knows.
    if (msg.error().code() == ErrorCode::kTooLarge) {
      AIRLOCK_CHECK(text.size() > kMaxWsMessageBytes);
      return;
    }
    CheckError(msg.error(), text.size());
    return;
  }
  json doc;
  switch (msg->type) {
    case WsClientMessage::Type::kStdin:
      AIRLOCK_CHECK(msg->data.size() <= kMaxWsMessageBytes);
      doc = {{"type", "stdin"}, {"data", Base64Encode(msg->data)}, {"encoding", "base64"}};
      break;
    case WsClientMessage::Type::kStdinClose:
      doc = {{"type", "stdin_close"}};
      break;
    case WsClientMessage::Type::kSignal:
      AIRLOCK_CHECK(msg->signal >= 1 && msg->signal <= 64);
      doc = {{"type", "signal"}, {"signal", msg->signal}};
      break;
    case WsClientMessage::Type::kResize:
      AIRLOCK_CHECK(msg->cols >= 1 && msg->cols <= 1000 && msg->rows >= 1 && msg->rows <= 1000);
      doc = {{"type", "resize"}, {"cols", msg->cols}, {"rows", msg->rows}};
      break;
  }
  auto again = WsClientMessage::FromJson(doc.dump());
  AIRLOCK_CHECK(again.has_value());
  AIRLOCK_CHECK(Same(*again, *msg));
}

// --- Secrets: bodies that carry a value (docs/design/secrets-store.md). ---

// A refused secret body's error shows none of the body's bytes that nlohmann read (its parse
// errors end with "; last read: '<bytes>'") and not the value: a string "value" of 8 bytes or
// more is nowhere in the message, unless the message may rightly quote it because a key or the
// name holds it too ("unknown field ...", "name ... is not valid").
template <typename T>
bool AcceptedSecret(const Result<T>& r, std::string_view body) {
  if (r) return true;
  CheckError(r.error(), body.size());
  const std::string& message = r.error().message();
  AIRLOCK_CHECK(message.find("; last read:") == std::string::npos);
  const json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("value") || !doc["value"].is_string()) return false;
  const auto& value = doc["value"].get_ref<const std::string&>();
  if (value.size() < 8) return false;
  for (const auto& [key, item] : doc.items()) {
    if (key.find(value) != std::string::npos) return false;
    if (key == "name" && item.is_string() &&
        item.get_ref<const std::string&>().find(value) != std::string::npos) {
      return false;
    }
  }
  AIRLOCK_CHECK(message.find(value) == std::string::npos);
  return false;
}

void CheckSecret(std::string_view body) {
  auto create = CreateSecretRequest::FromJson(body);
  if (AcceptedSecret(create, body)) {
    AIRLOCK_CHECK(CheckSecretName(create->name).has_value());
    AIRLOCK_CHECK(CheckSecretValue(create->value).has_value());
    auto again = CreateSecretRequest::FromJson(
        json{{"name", create->name}, {"value", create->value}}.dump());
    AIRLOCK_CHECK(again.has_value() && again->name == create->name &&
                  again->value == create->value);
  }
  auto update = UpdateSecretRequest::FromJson(body);
  if (AcceptedSecret(update, body)) {
    AIRLOCK_CHECK(CheckSecretValue(update->value).has_value());
    AIRLOCK_CHECK(update->value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos);
  }
}

void Run(uint8_t selector, std::string_view rest) {
  switch (selector % 19) {
    case 0:
      CheckCreate(rest);
      break;
    case 1:
      CheckPatch(rest);
      break;
    case 2:
      CheckExec(rest);
      break;
    case 3:
    case 4:
    case 5:
    case 6:
    case 7:
    case 8:
    case 9:
      CheckFileQuery(rest, kFileOps[selector % 19 - 3]);
      break;
    case 10:
      CheckListFilter(rest);
      break;
    case 11:
      CheckBase64(rest);
      break;
    case 12:
      CheckUtf8(rest);
      break;
    case 13:
      CheckSignal(rest);
      break;
    case 14:
      CheckStdin(rest);
      break;
    case 15:
      CheckWait(rest);
      break;
    case 16:
      CheckOutputQuery(rest);
      break;
    case 17:
      CheckWsMessage(rest);
      break;
    case 18:
      CheckSecret(rest);
      break;
  }
}

}  // namespace
}  // namespace airlock::api

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  airlock::api::Run(data[0], std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  return 0;
}
