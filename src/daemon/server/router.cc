#include "daemon/server/router.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "common/build_id.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/log.h"
#include "common/syscall.h"
#include "daemon/server/actor.h"
#include "daemon/api/json.h"
#include "daemon/api/query.h"
#include "daemon/api/render.h"
#include "daemon/api/types.h"
#include "protocol/messages.h"

namespace airlock::daemon {
namespace {

using store::SandboxRecord;


HttpReply Bytes(std::string body, std::string content_type) {
  HttpReply reply{200, std::move(body), ""};
  reply.content_type = std::move(content_type);
  return reply;
}

api::FileEntryView ToEntry(const protocol::FileInfo& f) {
  api::FileEntryView e;
  e.name = f.name;
  switch (f.type) {
    case protocol::FileType::kFile:
      e.type = "file";
      break;
    case protocol::FileType::kDirectory:
      e.type = "directory";
      break;
    case protocol::FileType::kSymlink:
      e.type = "symlink";
      break;
    default:
      e.type = "other";
  }
  e.mode = f.mode;
  e.size = f.size;
  e.mtime = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(f.mtime_ns)));
  e.link_target = f.link_target;
  return e;
}

// Runs `fn`, records its latency and outcome as `op`, and passes its result through.
template <typename Fn>
auto Timed(Metrics& metrics, Metrics::Op op, Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  auto result = fn();
  metrics.Observe(op, result.has_value(), std::chrono::steady_clock::now() - start);
  return result;
}

HttpReply MethodNotAllowed(std::string_view method, std::string_view path,
                           std::initializer_list<std::string_view> allowed) {
  std::string allow;
  for (std::string_view m : allowed) {
    if (!allow.empty()) allow += ", ";
    allow += m;
  }
  // ErrorCode has no 405; the body keeps the usual shape with its own code.
  nlohmann::json doc = {{"error",
                         {{"code", "method_not_allowed"},
                          {"message", std::string(method) + " is not allowed on " +
                                          std::string(path) + "; allowed: " + allow}}}};
  HttpReply reply{405, doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), allow};
  reply.error_code = "method_not_allowed";
  return reply;
}

HttpReply NotFoundRoute(std::string_view path) {
  return ErrorReply(Error(ErrorCode::kNotFound, "no such route: " + std::string(path)));
}

api::SandboxView ToView(const SandboxRecord& r) {
  api::SandboxView v;
  v.id = r.id;
  v.state = std::string(store::SandboxStateName(r.state));
  v.template_name = r.template_name;
  v.engine = r.engine;
  v.created_at = FromUnixMs(r.created_at_ms);
  v.expires_at = FromUnixMs(r.expires_at_ms);
  v.limits.cpus = r.limits.cpus;
  v.limits.memory_mb = static_cast<uint64_t>(r.limits.memory_mb);
  v.limits.pids_max = static_cast<uint64_t>(r.limits.pids_max);
  v.limits.disk_mb = static_cast<uint64_t>(r.limits.disk_mb);
  v.metadata = r.metadata;
  const auto reason = r.resources.find(kEndReason);
  if (r.state == store::SandboxState::kFailed) {
    // Failed, unless a restart lost it (a failed destroy's record keeps the reason it was asked).
    const bool lost = reason != r.resources.end() && reason->second == kLost;
    v.end_reason = lost ? std::string(kLost) : "failed";
  } else if (r.state == store::SandboxState::kDestroyed) {
    v.end_reason = reason != r.resources.end() ? reason->second : std::string(kDeleted);
    v.ended_at = FromUnixMs(r.updated_at_ms);
  }
  if (r.state == store::SandboxState::kFailed || r.state == store::SandboxState::kDestroyed) {
    v.error = r.error;
  }
  v.network = r.network;
  v.secrets = r.secrets;
  v.tenant = r.tenant;
  if (auto address = r.resources.find(kNetAddress); address != r.resources.end()) {
    v.address = address->second;
  }
  if (auto address = r.resources.find(kNetAddress6); address != r.resources.end()) {
    v.address6 = address->second;
  }
  if (auto image = r.resources.find(kMemoryImageBytes); image != r.resources.end()) {
    v.memory_image_bytes = std::strtoull(image->second.c_str(), nullptr, 10);
  }
  for (const char* key : {kAutoPause, kAutoHibernate}) {
    if (auto after = r.resources.find(key); after != r.resources.end()) {
      v.auto_pause_seconds = std::strtoll(after->second.c_str(), nullptr, 10);
      v.auto_pause_memory = key == kAutoHibernate;
    }
  }
  v.auto_paused = r.resources.contains(kAutoPaused);
  return v;
}

// The next piece of a stream's body: its next events as NDJSON ("" when none came within a
// second), nullopt after the last.
std::optional<std::string> NextChunk(EventStream& stream) {
  auto events = stream.Next();
  if (!events) return std::nullopt;
  std::string chunk;
  for (const api::Event& event : *events) chunk += api::RenderEvent(event);
  return chunk;
}

// {"sandbox", "interval_ms", "keep", "samples": [{"at_ms", "cpu_seconds", "cpu_cores",
//  "memory_bytes", "memory_peak_bytes", "pids", "disk_bytes", "net_rx_bytes", "net_tx_bytes"}],
//  "truncated"}
std::string RenderSandboxMetrics(const std::string& id, const store::MetricPage& page,
                                 const Sampler& sampler) {
  nlohmann::json list = nlohmann::json::array();
  for (const store::MetricSample& m : page.samples) {
    list.push_back({{"at_ms", m.at_ms},
                    {"cpu_seconds", m.cpu_seconds},
                    {"cpu_cores", m.cpu_cores},
                    {"memory_bytes", m.memory_bytes},
                    {"memory_peak_bytes", m.memory_peak_bytes},
                    {"pids", m.pids},
                    {"disk_bytes", m.disk_bytes},
                    {"net_rx_bytes", m.net_rx_bytes},
                    {"net_tx_bytes", m.net_tx_bytes}});
  }
  nlohmann::json doc = {{"sandbox", id},
                        {"interval_ms", sampler.interval().count()},
                        {"keep", sampler.keep()},
                        {"samples", std::move(list)},
                        {"truncated", page.truncated}};
  return doc.dump();
}

// {"events": [{"seq", "time", "kind", "name", "sni"?, "host"?, "dest"?, "port", "verdict",
//  "rule", "reason", "bytes_up"?, "bytes_down"?}], "next_after", "has_more", "last_seq",
//  "dropped", "trimmed"}
std::string RenderNetworkEvents(const store::NetworkEventPage& page, int64_t after) {
  nlohmann::json list = nlohmann::json::array();
  for (const store::NetworkEventRecord& e : page.events) {
    nlohmann::json one = VerdictJson(e);
    one["seq"] = e.seq;
    one["time"] = api::FormatTimestamp(FromUnixMs(e.at_ms));
    one["kind"] = e.kind;
    list.push_back(std::move(one));
  }
  const int64_t next_after = page.events.empty() ? after : page.events.back().seq;
  return api::DumpJson({{"events", std::move(list)},
                        {"next_after", next_after},
                        {"has_more", page.more},
                        {"last_seq", page.last_seq},
                        {"dropped", page.dropped},
                        {"trimmed", page.trimmed}});
}

// One event of the flight recorder as the API shows it: {"seq", "time", "type", "data"}.
nlohmann::json EventJson(const store::EventRecord& e) {
  nlohmann::json data = nlohmann::json::parse(e.data, nullptr, /*allow_exceptions=*/false);
  if (!data.is_object()) data = nlohmann::json::object();
  return {{"seq", e.seq},
          {"time", api::FormatTimestamp(FromUnixMs(e.at_ms))},
          {"type", e.type},
          {"data", std::move(data)}};
}

// {"events": [...], "next_after", "has_more", "last_seq", "dropped", "trimmed"}
std::string RenderEvents(const store::EventPage& page, int64_t after) {
  nlohmann::json list = nlohmann::json::array();
  for (const store::EventRecord& e : page.events) list.push_back(EventJson(e));
  return api::DumpJson({{"events", std::move(list)},
                   {"next_after", page.events.empty() ? after : page.events.back().seq},
                   {"has_more", page.more},
                   {"last_seq", page.last_seq},
                   {"dropped", page.dropped},
                   {"trimmed", page.trimmed}});
}

// A sandbox's events as a stream: what is stored after `after`, then (following) each event as
// the recorder writes it, until the sandbox is destroyed and its last events are sent (or the
// client goes). Each piece is JSON Lines or Server-Sent Events.
class EventFeed {
 public:
  // `first`: the page read (and checked) already, sent first.
  EventFeed(store::Store& store, Recorder& recorder, std::string id, api::EventsQuery query,
            std::vector<store::EventRecord> first)
      : store_(store),
        recorder_(recorder),
        id_(std::move(id)),
        query_(std::move(query)),
        first_(std::move(first)) {}

  std::optional<std::string> Next() {
    if (!first_.empty()) {
      query_.after = first_.back().seq;
      std::string out = Render(first_);
      first_.clear();
      return out;
    }
    const uint64_t seen = recorder_.writes();
    auto page = store_.Events(id_, query_.after, query_.types, api::EventsQuery::kMaxLimit);
    if (!page) {
      spdlog::warn("the event stream of {}: {}", id_, page.error().message());
      return std::nullopt;
    }
    if (!page->events.empty()) {
      query_.after = page->events.back().seq;
      quiet_ms_ = 0;
      return Render(page->events);
    }
    if (!query_.follow || last_) return std::nullopt;
    // Gone (destroyed, or purged): what the recorder still holds is written, read once more,
    // and the stream ends.
    auto record = store_.Get(id_);
    if (!record || record->state == store::SandboxState::kDestroyed) {
      if (auto st = recorder_.Flush(); !st) spdlog::error("storing events: {}", st.error().message());
      last_ = true;
      return std::string();
    }
    constexpr auto kWait = std::chrono::seconds(1);
    if (recorder_.WaitForWrite(seen, kWait) == seen) {
      quiet_ms_ += std::chrono::milliseconds(kWait).count();
      // A comment now and then keeps proxies from closing an idle stream.
      if (quiet_ms_ >= 15000 && query_.format == api::EventsQuery::Format::kServerSentEvents) {
        quiet_ms_ = 0;
        return std::string(": keep-alive\n\n");
      }
    }
    return std::string();
  }

 private:
  std::string Render(const std::vector<store::EventRecord>& events) const {
    std::string out;
    for (const store::EventRecord& e : events) {
      if (query_.format == api::EventsQuery::Format::kServerSentEvents) {
        out += "id: " + std::to_string(e.seq) + "\nevent: " + e.type + "\ndata: " +
               api::DumpJson(EventJson(e)) + "\n\n";
      } else {
        out += api::DumpJson(EventJson(e)) + "\n";
      }
    }
    return out;
  }

  store::Store& store_;
  Recorder& recorder_;
  const std::string id_;
  api::EventsQuery query_;
  std::vector<store::EventRecord> first_;
  bool last_ = false;  // the sandbox is gone: end at the next empty read
  int64_t quiet_ms_ = 0;
};

api::PoolView ToPoolView(const PoolStats& p) {
  return {.template_name = p.template_name,
          .size = p.size,
          .ready = p.ready,
          .hits = p.hits,
          .misses = p.miss_total()};
}

// 403 for a route only admin keys may use.
HttpReply AdminOnly(std::string_view what) {
  return ErrorReply(Error(ErrorCode::kPermissionDenied,
                          "only an admin key may use " + std::string(what)));
}

// A shared template (tenant "") is every tenant's; any other only its tenant's (and admins').
bool TemplateVisible(const Caller& caller, const store::TemplateRecord& t) {
  return caller.admin || t.tenant.empty() || t.tenant == caller.tenant;
}

// The store's answer for a template that does not exist, for one the caller may not see.
Error TemplateNotFound(const std::string& name) {
  return Error(ErrorCode::kNotFound, "template '" + name + "' does not exist");
}

HttpReply SandboxReply(unsigned status, const Result<SandboxRecord>& record) {
  if (!record) return ErrorReply(record.error());
  return {status, api::RenderSandbox(ToView(*record)), ""};
}

}  // namespace

HttpReply ErrorReply(const Error& error) {
  api::HttpError e = api::ErrorBody(error);
  HttpReply reply{static_cast<unsigned>(e.status), std::move(e.body), ""};
  reply.error_code = std::string(ErrorCodeName(error.code()));
  return reply;
}

std::vector<std::string_view> SplitPath(std::string_view path) {
  std::vector<std::string_view> parts;
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  while (true) {
    size_t slash = path.find('/');
    parts.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return parts;
}

std::optional<Caller> Router::Authenticate(std::string_view authorization) {
  if (!auth_required_) return Caller{};
  constexpr std::string_view kScheme = "Bearer ";
  if (!authorization.starts_with(kScheme)) return std::nullopt;
  authorization.remove_prefix(kScheme.size());
  auto key = store_.Authenticate(authorization);
  if (!key) return std::nullopt;
  return Caller{key->id, key->tenant, key->admin, key->name};
}

Status Router::CheckOwner(const Caller& caller, const std::string& id) {
  if (caller.admin) return {};
  // An unknown id is refused here too, before the body or the rest of the path is looked at,
  // so that nothing after this point can answer differently for the two. The caller's own
  // destroyed sandboxes pass: their network verdicts stay readable, and every other route
  // answers them with the controller's SandboxNotFound, the same 404.
  auto record = store_.Get(id);
  if (!record && record.error().code() != ErrorCode::kNotFound) {
    return std::unexpected(std::move(record.error()));
  }
  if (!record || record->pooled || record->tenant != caller.tenant) {
    return std::unexpected(SandboxNotFound(id));
  }
  return {};
}

uint64_t BodyLimit(std::string_view method, std::string_view target) {
  std::string_view path = target.substr(0, target.find('?'));
  if (method == "PUT" && path.starts_with("/v1/sandboxes/")) {
    if (path.ends_with("/files")) return api::kMaxFileBytes;
    if (path.ends_with("/files/tar")) return api::kMaxTarBytes;
  }
  return api::kMaxJsonBodyBytes;
}

std::string RouteOf(std::string_view path) {
  if (path == "/healthz" || path == "/metrics" || path == "/v1") return std::string(path);
  const std::vector<std::string_view> parts = SplitPath(path);
  if (parts.size() < 2 || parts[0] != "v1") return "-";
  // The collections whose next segment is a name or an id, and what it is called.
  static const std::map<std::string_view, std::string_view> kNamed = {
      {"sandboxes", "{id}"}, {"templates", "{name}"}, {"keys", "{id}"},
      {"secrets", "{name}"}, {"tenants", "{tenant}"}, {"pools", "{template}"}};
  std::string route;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string_view part = parts[i];
    if (i == 2 && kNamed.contains(parts[1])) part = kNamed.at(parts[1]);
    if (i == 4 && parts[1] == "sandboxes" && parts[3] == "processes") part = "{pid}";
    route += "/" + std::string(part);
  }
  return "/v1" + route;
}

HttpReply Router::Handle(const HttpRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  std::string tenant;
  HttpReply reply = Dispatch(request, tenant);
  metrics_.CountReply(reply.status, reply.error_code);
  reply.request_id = request.request_id;
  if (log_requests_) {
    const std::string_view path =
        std::string_view(request.target).substr(0, request.target.find('?'));
    const std::vector<std::string_view> parts = SplitPath(path);
    const std::string sandbox =
        parts.size() >= 3 && parts[0] == "v1" && parts[1] == "sandboxes" ? std::string(parts[2])
                                                                         : "";
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.2f",
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                            start)
                      .count());
    LogFields(spdlog::level::info, "request",
              {{"request_id", request.request_id},
               {"method", request.method},
               {"route", RouteOf(path)},
               {"status", std::to_string(reply.status), true},
               {"duration_ms", ms, true},
               {"tenant", tenant},
               {"sandbox", sandbox},
               {"streamed", reply.next_chunk ? "true" : "false", true}});
  }
  return reply;
}

HttpReply Router::RenderMetrics() {
  auto counts = store_.CountByState();
  if (!counts) return ErrorReply(counts.error());
  std::map<std::string, int64_t> by_state;
  for (const auto& [state, n] : *counts) by_state[std::string(store::SandboxStateName(state))] = n;
  auto pools = controller_.pools().List();
  if (!pools) return ErrorReply(pools.error());
  auto secrets = secrets_.Count();
  if (!secrets) return ErrorReply(secrets.error());
  std::map<std::string, ProcessWatchCounts> watches;
  for (const runtime::EngineStatus& status : controller_.engines().List()) {
    if (!status.available || !status.capabilities.process_events) continue;
    auto engine = controller_.engines().Get(status.name);
    if (!engine) continue;
    const runtime::ProcessEventCounters c = (*engine)->ProcessEventCounts();
    watches[status.name] = {.reported = c.reported, .dropped = c.dropped, .lost = c.lost};
  }
  return Bytes(metrics_.Render(by_state, controller_.expiry().expired_total(),
                               controller_.expiry().purged_total()) +
                   RenderPoolMetrics(*pools) +
                   RenderVerdictMetrics(controller_.recorder().verdicts()) +
                   RenderRecorderMetrics(controller_.recorder().counts().recorded,
                                         controller_.recorder().counts().dropped) +
                   RenderProcessWatchMetrics(watches) + RenderSecretMetrics(*secrets) +
                   RenderUsageMetrics(controller_.sampler().Totals()),
               "text/plain; version=0.0.4; charset=utf-8");
}

HttpReply Router::Dispatch(const HttpRequest& request, std::string& tenant) {
  std::string_view target = request.target;
  std::string_view path = target.substr(0, target.find('?'));
  std::string_view raw_query;
  if (size_t q = target.find('?'); q != std::string_view::npos) raw_query = target.substr(q + 1);
  const std::string_view method = request.method;

  if (path == "/healthz") {
    if (method != "GET") return MethodNotAllowed(method, path, {"GET"});
    return {200, nlohmann::json{{"status", "ok"}, {"version", kBuildId}}.dump(), ""};
  }
  if (path != "/v1" && !path.starts_with("/v1/") && path != "/metrics") return NotFoundRoute(path);

  // Every /v1 route, known or not, answers 401 first: an unauthenticated caller learns nothing.
  // /metrics needs the key too (it tells how busy the host is).
  const std::optional<Caller> who = Authenticate(request.authorization);
  if (!who) {
    api::HttpError e = api::UnauthenticatedBody();
    HttpReply reply{static_cast<unsigned>(e.status), std::move(e.body), ""};
    reply.error_code = "unauthenticated";
    return reply;
  }
  const Caller& caller = *who;
  tenant = caller.tenant;
  // The recorder's lifecycle events name the key that asked (actor.h).
  ScopedActor actor({caller.key_id, caller.key_name});
  if (path == "/metrics") {
    if (method != "GET") return MethodNotAllowed(method, path, {"GET"});
    // Counts over every tenant's sandboxes.
    if (!caller.admin) return AdminOnly("/metrics");
    return RenderMetrics();
  }

  const std::vector<std::string_view> parts = SplitPath(path);
  if (parts.size() >= 2 && parts[1] == "pools") {
    // Pooled sandboxes are shared capacity: sizing them is the operator's business.
    if (!caller.admin) return AdminOnly("warm pools (/v1/pools)");
    return Pools(request, parts, raw_query);
  }
  if (parts.size() >= 2 && parts[1] == "admin") {
    if (!caller.admin) return AdminOnly("/v1/admin");
    if (parts.size() != 3 || parts[2] != "backup") return NotFoundRoute(path);
    if (method != "GET") return MethodNotAllowed(method, path, {"GET"});
    if (!raw_query.empty()) {
      return ErrorReply(Error(ErrorCode::kInvalidArgument, "this route takes no query string"));
    }
    auto backup = store_.Backup();
    if (!backup) return ErrorReply(backup.error());
    // Streamed from the copy (unlinked already), a MiB at a time: the store may be large.
    HttpReply reply;
    reply.content_type = "application/vnd.sqlite3";
    reply.next_chunk = [fd = std::make_shared<UniqueFd>(std::move(*backup))]()
        -> std::optional<std::string> {
      std::string piece(1 << 20, '\0');
      auto n = ReadFull(fd->get(), std::as_writable_bytes(std::span(piece)));
      if (!n || *n == 0) return std::nullopt;
      piece.resize(*n);
      return piece;
    };
    return reply;
  }
  if (parts.size() >= 2 && parts[1] == "keys") return Keys(request, caller, parts, raw_query);
  if (parts.size() >= 2 && parts[1] == "secrets") {
    return Secrets(request, caller, parts, raw_query);
  }
  if (parts.size() >= 2 && parts[1] == "engines") return Engines(request, parts, raw_query);
  if (parts.size() >= 2 && parts[1] == "tenants") {
    return Tenants(request, caller, parts, raw_query);
  }
  if (parts.size() >= 2 && parts[1] == "templates") {
    return Templates(request, caller, parts, raw_query);
  }
  if (parts.size() < 2 || parts[1] != "sandboxes" || parts.size() > 6) return NotFoundRoute(path);

  if (parts.size() == 2) {  // /v1/sandboxes
    if (method == "POST") {
      if (!raw_query.empty()) {
        return ErrorReply(Error(ErrorCode::kInvalidArgument, "this route takes no query string"));
      }
      auto create = api::CreateSandboxRequest::FromJson(request.body);
      if (!create) return ErrorReply(create.error());
      if (auto st = CheckTemplateVisible(caller, create->template_name); !st) {
        return ErrorReply(st.error());
      }
      create->tenant = caller.tenant;
      return SandboxReply(
          201, Timed(metrics_, Metrics::Op::kCreate, [&] { return controller_.Create(*create); }));
    }
    if (method == "GET") {
      auto params = api::ParseQueryString(raw_query);
      if (!params) return ErrorReply(params.error());
      auto filter = api::ListFilter::FromQuery(*params);
      if (!filter) return ErrorReply(filter.error());
      if (!caller.admin) {
        if (filter->tenant && *filter->tenant != caller.tenant) {
          return ErrorReply(Error(ErrorCode::kPermissionDenied,
                                  "this key lists only its own tenant's sandboxes (" +
                                      caller.tenant + "); only an admin key may ask for another "
                                      "tenant's"));
        }
        filter->tenant = caller.tenant;
      }
      auto records = controller_.List(*filter);
      if (!records) return ErrorReply(records.error());
      std::vector<api::SandboxView> views;
      for (const SandboxRecord& r : *records) views.push_back(ToView(r));
      return {200, api::RenderSandboxList(views), ""};
    }
    return MethodNotAllowed(method, path, {"GET", "POST"});
  }

  // /v1/sandboxes/{id}[/...]: which route first (404 / 405), then the id (400).
  const std::string id(parts[2]);
  const std::string_view op = parts.size() >= 4 ? parts[3] : std::string_view();
  enum class Route {
    kSandbox, kExec, kPause, kResume, kFiles, kProcesses, kSnapshot, kFork, kNetworkEvents,
    kEvents,
    kMetrics
  };
  Route route;
  if (op == "processes" && parts.size() <= 6) {
    route = Route::kProcesses;
  } else if (parts.size() == 6) {
    return NotFoundRoute(path);
  } else if (parts.size() == 3) {
    route = Route::kSandbox;
    if (method != "GET" && method != "DELETE" && method != "PATCH") {
      return MethodNotAllowed(method, path, {"GET", "PATCH", "DELETE"});
    }
  } else if (parts.size() == 4 && (op == "exec" || op == "pause" || op == "resume" ||
                                    op == "snapshot" || op == "fork")) {
    route = op == "exec"       ? Route::kExec
            : op == "pause"    ? Route::kPause
            : op == "resume"   ? Route::kResume
            : op == "snapshot" ? Route::kSnapshot
                               : Route::kFork;
    if (method != "POST") return MethodNotAllowed(method, path, {"POST"});
  } else if (op == "files" && (parts.size() == 4 || parts[4] == "list" || parts[4] == "mkdir" ||
                               parts[4] == "tar")) {
    route = Route::kFiles;
  } else if (op == "metrics" && parts.size() == 4) {
    route = Route::kMetrics;
    if (method != "GET") return MethodNotAllowed(method, path, {"GET"});
  } else if (op == "network" && parts.size() == 5 && parts[4] == "events") {
    route = Route::kNetworkEvents;
    if (method != "GET") return MethodNotAllowed(method, path, {"GET"});
  } else if (op == "events" && parts.size() == 4) {
    route = Route::kEvents;
    if (method != "GET") return MethodNotAllowed(method, path, {"GET"});
  } else {
    return NotFoundRoute(path);
  }
  if (auto st = ValidateSandboxId(id); !st) return ErrorReply(st.error());
  if (auto st = CheckOwner(caller, id); !st) return ErrorReply(st.error());
  if (route == Route::kFiles) {
    return Files(request, id, parts.size() == 5 ? parts[4] : std::string_view(), raw_query);
  }
  if (route == Route::kProcesses) {
    return Processes(request, id, std::span(parts).subspan(4), raw_query);
  }
  if (route == Route::kNetworkEvents) {
    auto params = api::ParseQueryString(raw_query);
    if (!params) return ErrorReply(params.error());
    auto query = api::NetworkEventsQuery::FromQuery(*params);
    if (!query) return ErrorReply(query.error());
    auto page = controller_.NetworkEvents(id, *query);
    if (!page) return ErrorReply(page.error());
    return {200, RenderNetworkEvents(*page, query->after), ""};
  }
  if (route == Route::kEvents) {
    auto params = api::ParseQueryString(raw_query);
    if (!params) return ErrorReply(params.error());
    auto query = api::EventsQuery::FromQuery(*params);
    if (!query) return ErrorReply(query.error());
    return Events(id, *query);
  }
  if (route == Route::kMetrics) {
    auto params = api::ParseQueryString(raw_query);
    if (!params) return ErrorReply(params.error());
    auto query = api::MetricsQuery::FromQuery(*params);
    if (!query) return ErrorReply(query.error());
    auto page = controller_.Metrics(id, *query);
    if (!page) return ErrorReply(page.error());
    return {200, RenderSandboxMetrics(id, *page, controller_.sampler()), ""};
  }
  if (!raw_query.empty()) {
    return ErrorReply(Error(ErrorCode::kInvalidArgument, "this route takes no query string"));
  }

  switch (route) {
    case Route::kSandbox:
      // A destroyed sandbox's record answers too, with why it ended, until it is purged.
      if (method == "GET") return SandboxReply(200, controller_.Describe(id));
      if (method == "DELETE") {
        auto st = Timed(metrics_, Metrics::Op::kDestroy, [&] { return controller_.Destroy(id); });
        if (!st) return ErrorReply(st.error());
        return {204, "", ""};
      }
      {
        auto patch = api::PatchSandboxRequest::FromJson(request.body);
        if (!patch) return ErrorReply(patch.error());
        return SandboxReply(200, controller_.Patch(id, *patch));
      }
    case Route::kPause: {
      auto pause = api::PauseRequest::FromJson(request.body);
      if (!pause) return ErrorReply(pause.error());
      if (pause->memory) return SandboxReply(200, controller_.Hibernate(id));
      return SandboxReply(200, controller_.Pause(id));
    }
    case Route::kSnapshot: {
      auto snapshot = api::SnapshotRequest::FromJson(request.body);
      if (!snapshot) return ErrorReply(snapshot.error());
      snapshot->tenant = caller.admin ? "" : caller.tenant;  // an admin's is shared
      auto made = controller_.snapshots().Snapshot(id, *snapshot);
      if (!made) return ErrorReply(made.error());
      controller_.recorder().Record(id, "sandbox.snapshot", {{"template", made->name}});
      return {201, api::RenderTemplate(ToTemplateView(*made)), ""};
    }
    case Route::kFork: {
      auto fork = api::ForkRequest::FromJson(request.body);
      if (!fork) return ErrorReply(fork.error());
      fork->tenant = caller.tenant;
      auto forked = controller_.snapshots().Fork(id, *fork);
      if (!forked) return ErrorReply(forked.error());
      nlohmann::json children = nlohmann::json::array();
      for (const SandboxRecord& r : forked->sandboxes) children.push_back(r.id);
      controller_.recorder().Record(id, "sandbox.forked",
                                    {{"sandboxes", std::move(children)}, {"memory", fork->memory}});
      std::vector<api::SandboxView> views;
      for (const SandboxRecord& r : forked->sandboxes) views.push_back(ToView(r));
      return {201, api::RenderFork(views, forked->layer, fork->memory), ""};
    }
    case Route::kResume:
      return SandboxReply(200, controller_.Resume(id));
    case Route::kExec: {
      auto exec = api::ExecRequest::FromJson(request.body);
      if (!exec) return ErrorReply(exec.error());
      if (exec->background) {
        auto started = Timed(metrics_, Metrics::Op::kExec,
                             [&] { return controller_.exec().StartBackground(id, *exec); });
        if (!started) return ErrorReply(started.error());
        return {200, api::RenderProcess(ToProcessView(*started)), ""};
      }
      if (exec->stream) {
        auto started =
            Timed(metrics_, Metrics::Op::kExec, [&] { return controller_.exec().StartExec(id, *exec); });
        if (!started) return ErrorReply(started.error());
        HttpReply reply{200, "", ""};
        reply.content_type = "application/x-ndjson";
        std::shared_ptr<EventStream> stream = std::move(*started);
        reply.next_chunk = [stream] { return NextChunk(*stream); };
        return reply;
      }
      auto result =
          Timed(metrics_, Metrics::Op::kExec, [&] { return controller_.exec().Exec(id, *exec); });
      if (!result) return ErrorReply(result.error());
      return {200, api::RenderExecResult(ToResultView(std::move(*result))), ""};
    }
    case Route::kFiles:
    case Route::kProcesses:
    case Route::kNetworkEvents:
    case Route::kEvents:
    case Route::kMetrics:
      break;  // served above
  }
  return NotFoundRoute(path);
}

HttpReply Router::Events(const std::string& id, const api::EventsQuery& query) {
  // The first page also checks the id (404 for unknown and pooled sandboxes) and writes what the
  // recorder holds: whatever happened before this call is in the answer. A stream starts with it.
  auto page = controller_.Events(id, query);
  if (!page) return ErrorReply(page.error());
  if (query.format == api::EventsQuery::Format::kPage) {
    return {200, RenderEvents(*page, query.after), ""};
  }
  HttpReply reply{200, "", ""};
  reply.content_type = query.format == api::EventsQuery::Format::kJsonLines
                           ? "application/x-ndjson"
                           : "text/event-stream";
  auto feed = std::make_shared<EventFeed>(store_, controller_.recorder(), id, query,
                                          std::move(page->events));
  reply.next_chunk = [feed] { return feed->Next(); };
  return reply;
}

HttpReply Router::Templates(const HttpRequest& request, const Caller& caller,
                            std::span<const std::string_view> parts, std::string_view raw_query) {
  const std::string_view method = request.method;
  const std::string path = request.target.substr(0, request.target.find('?'));
  if (parts.size() > 3) return NotFoundRoute(path);
  if (!raw_query.empty()) {
    return ErrorReply(Error(ErrorCode::kInvalidArgument, "this route takes no query string"));
  }
  if (parts.size() == 2) {  // /v1/templates
    if (method == "GET") {
      auto all = controller_.templates().List();
      if (!all) return ErrorReply(all.error());
      std::vector<api::TemplateView> views;
      for (const auto& t : *all) {
        if (TemplateVisible(caller, t)) views.push_back(ToTemplateView(t));
      }
      return {200, api::RenderTemplateList(views), ""};
    }
    if (method != "POST") return MethodNotAllowed(method, path, {"GET", "POST"});
    auto create = api::CreateTemplateRequest::FromJson(request.body);
    if (!create) return ErrorReply(create.error());
    if (auto st = CheckTemplateVisible(caller, create->base); !st) return ErrorReply(st.error());
    create->tenant = caller.admin ? "" : caller.tenant;  // an admin's is shared
    // Before a stream starts: its status line must be the refusal's.
    if (auto st = controller_.CheckNetwork(create->network); !st) return ErrorReply(st.error());
    if (create->stream) {
      HttpReply reply{200, "", ""};
      reply.content_type = "application/x-ndjson";
      std::shared_ptr<EventStream> stream = controller_.templates().StartBuild(std::move(*create));
      reply.next_chunk = [stream] { return NextChunk(*stream); };
      return reply;
    }
    auto built = controller_.templates().Build(*create, [](const api::Event&) {});
    if (!built) return ErrorReply(built.error());
    return {201, api::RenderTemplate(ToTemplateView(*built)), ""};
  }
  const std::string name(parts[2]);
  if (method != "GET" && method != "DELETE") return MethodNotAllowed(method, path, {"GET", "DELETE"});
  if (auto st = api::CheckTemplateName(name); !st) return ErrorReply(st.error());
  auto one = controller_.templates().Get(name);
  if (!one) return ErrorReply(one.error());
  if (!TemplateVisible(caller, *one)) return ErrorReply(TemplateNotFound(name));
  if (method == "DELETE") {
    if (!caller.admin && one->tenant.empty()) {
      return ErrorReply(Error(ErrorCode::kPermissionDenied,
                              "template '" + name +
                                  "' is shared by every tenant; only an admin key may delete it"));
    }
    if (auto st = controller_.templates().Delete(name); !st) return ErrorReply(st.error());
    return {204, "", ""};
  }
  return {200, api::RenderTemplate(ToTemplateView(*one)), ""};
}

Status Router::CheckTemplateVisible(const Caller& caller, const std::string& name) {
  if (caller.admin) return {};
  // Names that are no template here (a Debian suite, an image path) are the controller's.
  auto t = controller_.templates().Get(name);
  if (t && !TemplateVisible(caller, *t)) return std::unexpected(TemplateNotFound(name));
  return {};
}

HttpReply Router::Keys(const HttpRequest& request, const Caller& caller,
                       std::span<const std::string_view> parts, std::string_view raw_query) {
  const std::string_view method = request.method;
  const std::string path = request.target.substr(0, request.target.find('?'));
  if (parts.size() > 3) return NotFoundRoute(path);
  if (!caller.admin) return AdminOnly("API keys (/v1/keys)");
  if (!raw_query.empty()) {
    return ErrorReply(Error(ErrorCode::kInvalidArgument, "this route takes no query string"));
  }
  auto view = [](const store::KeyInfo& k, std::string plaintext) {
    return api::KeyView{.id = k.id,
                        .name = k.name,
                        .tenant = k.tenant,
                        .admin = k.admin,
                        .revoked = k.revoked,
                        .created_at = FromUnixMs(k.created_at_ms),
                        .key = std::move(plaintext)};
  };
  if (parts.size() == 2) {  // /v1/keys
    if (method == "GET") {
      if (!request.body.empty()) {
        return ErrorReply(Error(ErrorCode::kInvalidArgument, "this call takes no request body"));
      }
      auto keys = store_.ListKeys();
      if (!keys) return ErrorReply(keys.error());
      std::vector<api::KeyView> views;
      for (const store::KeyInfo& k : *keys) views.push_back(view(k, ""));
      return {200, api::RenderKeyList(views), ""};
    }
    if (method != "POST") return MethodNotAllowed(method, path, {"GET", "POST"});
    auto create = api::CreateKeyRequest::FromJson(request.body);
    if (!create) return ErrorReply(create.error());
    auto made = store_.CreateKey(create->name, create->admin, create->tenant);
    if (!made) return ErrorReply(made.error());
    return {201, api::RenderKey(view(made->info, std::move(made->plaintext))), ""};
  }
  // DELETE /v1/keys/{id}
  if (method != "DELETE") return MethodNotAllowed(method, path, {"DELETE"});
  const std::string_view text = parts[2];
  int64_t id = 0;
  bool digits = !text.empty() && text.size() <= 18 && text.front() != '0';
  for (char c : text) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) id = id * 10 + (c - '0');
  }
  if (!digits) {
    return ErrorReply(Error(ErrorCode::kInvalidArgument,
                            "a key id is a positive integer, got " + api::Quote(text)));
  }
  if (!request.body.empty()) {
    return ErrorReply(Error(ErrorCode::kInvalidArgument, "this call takes no request body"));
  }
  if (auto st = store_.RevokeKey(id); !st) return ErrorReply(st.error());
  return {204, "", ""};
}

HttpReply Router::Secrets(const HttpRequest& request, const Caller& caller,
                          std::span<const std::string_view> parts, std::string_view raw_query) {
  const std::string_view method = request.method;
  const std::string path = request.target.substr(0, request.target.find('?'));
  // The route (404, 405), the name (400), the query and whose secrets (400, 403), then the body.
  if (parts.size() > 3) return NotFoundRoute(path);
  const bool one = parts.size() == 3;
  if (!one && method != "GET" && method != "POST") {
    return MethodNotAllowed(method, path, {"GET", "POST"});
  }
  if (one && method != "GET" && method != "PUT" && method != "DELETE") {
    return MethodNotAllowed(method, path, {"GET", "PUT", "DELETE"});
  }
  const std::string name = one ? std::string(parts[2]) : std::string();
  if (one) {
    if (auto st = api::CheckSecretName(name); !st) return ErrorReply(st.error());
  }
  auto params = api::ParseQueryString(raw_query);
  if (!params) return ErrorReply(params.error());
  auto query = api::SecretsQuery::FromQuery(*params);
  if (!query) return ErrorReply(query.error());
  const std::string tenant = query->tenant.value_or(caller.tenant);
  if (!caller.admin && tenant != caller.tenant) {
    return ErrorReply(Error(ErrorCode::kPermissionDenied,
                            "this key acts on its own tenant's secrets (" + caller.tenant +
                                "); only an admin key may name another tenant"));
  }
  const bool takes_body = method == "POST" || method == "PUT";
  if (!takes_body && !request.body.empty()) {
    return ErrorReply(Error(ErrorCode::kInvalidArgument, "this call takes no request body"));
  }
  auto view = [](const SecretInfo& s) {
    return api::SecretView{.name = s.name,
                           .version = s.version,
                           .created_at = FromUnixMs(s.created_at_ms),
                           .updated_at = FromUnixMs(s.updated_at_ms)};
  };
  auto reply = [&](unsigned status, const Result<SecretInfo>& info) -> HttpReply {
    if (!info) return ErrorReply(info.error());
    return {status, api::RenderSecret(view(*info)), ""};
  };
  if (!one && method == "GET") {
    auto all = secrets_.List(tenant);
    if (!all) return ErrorReply(all.error());
    std::vector<api::SecretView> views;
    for (const SecretInfo& s : *all) views.push_back(view(s));
    return {200, api::RenderSecretList(views), ""};
  }
  if (!one) {  // POST /v1/secrets
    auto create = api::CreateSecretRequest::FromJson(request.body);
    if (!create) return ErrorReply(create.error());
    return reply(201, secrets_.Create(tenant, create->name, create->value));
  }
  if (method == "GET") return reply(200, secrets_.Get(tenant, name));
  if (method == "DELETE") {
    if (auto st = secrets_.Delete(tenant, name); !st) return ErrorReply(st.error());
    return {204, "", ""};
  }
  // PUT: the name is known (404) before the body is looked at, as for every other route.
  if (auto known = secrets_.Get(tenant, name); !known) return ErrorReply(known.error());
  auto update = api::UpdateSecretRequest::FromJson(request.body);
  if (!update) return ErrorReply(update.error());
  return reply(200, secrets_.Update(tenant, name, update->value));
}

HttpReply Router::Tenants(const HttpRequest& request, const Caller& caller,
                          std::span<const std::string_view> parts, std::string_view raw_query) {
  const std::string_view method = request.method;
  const std::string path = request.target.substr(0, request.target.find('?'));
  // /v1/tenants/{name} (GET) and /v1/tenants/{name}/quota (PUT, DELETE): the route (404, 405),
  // the name (400), who asks (403), then the query and the body (400).
  const bool quota = parts.size() == 4 && parts[3] == "quota";
  if (parts.size() != 3 && !quota) return NotFoundRoute(path);
  if (!quota && method != "GET") return MethodNotAllowed(method, path, {"GET"});
  if (quota && method != "PUT" && method != "DELETE") {
    return MethodNotAllowed(method, path, {"PUT", "DELETE"});
  }
  const std::string tenant(parts[2]);
  if (auto st = api::CheckTenantName(tenant, "tenant"); !st) return ErrorReply(st.error());
  if (quota && !caller.admin) return AdminOnly("tenant quotas (/v1/tenants/{name}/quota)");
  if (!caller.admin && tenant != caller.tenant) {
    return ErrorReply(Error(ErrorCode::kPermissionDenied,
                            "this key may see its own tenant (" + caller.tenant +
                                ") only; only an admin key may see another tenant"));
  }
  if (!raw_query.empty()) {
    return ErrorReply(Error(ErrorCode::kInvalidArgument, "this route takes no query string"));
  }
  if (method != "PUT" && !request.body.empty()) {
    return ErrorReply(Error(ErrorCode::kInvalidArgument, "this call takes no request body"));
  }
  if (method == "DELETE") {
    if (auto st = store_.SetQuota(tenant, {}); !st) return ErrorReply(st.error());
    return {204, "", ""};
  }
  if (method == "PUT") {
    auto set = api::QuotaRequest::FromJson(request.body);
    if (!set) return ErrorReply(set.error());
    const store::TenantQuota q{.sandboxes = set->sandboxes,
                               .cpus = set->cpus,
                               .memory_mb = set->memory_mb,
                               .disk_mb = set->disk_mb,
                               .creates_per_minute = set->creates_per_minute};
    if (auto st = store_.SetQuota(tenant, q); !st) return ErrorReply(st.error());
  }
  auto state = controller_.quotas().State(tenant);
  if (!state) return ErrorReply(state.error());
  const store::TenantQuota& q = state->quota;
  const store::TenantUsage& u = state->usage;
  // {"name", "quota": {... 0 = unlimited}, "usage": {...}}
  nlohmann::json doc = {{"name", tenant},
                        {"quota",
                         {{"sandboxes", q.sandboxes},
                          {"cpus", q.cpus},
                          {"memory_mb", q.memory_mb},
                          {"disk_mb", q.disk_mb},
                          {"creates_per_minute", q.creates_per_minute}}},
                        {"usage",
                         {{"sandboxes", u.sandboxes},
                          {"cpus", u.cpus},
                          {"memory_mb", u.memory_mb},
                          {"disk_mb", u.disk_mb},
                          {"creates_last_minute", state->creates_last_minute}}}};
  return {200, doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), ""};
}

HttpReply Router::Engines(const HttpRequest& request, std::span<const std::string_view> parts,
                          std::string_view raw_query) {
  const std::string path = request.target.substr(0, request.target.find('?'));
  if (parts.size() != 2) return NotFoundRoute(path);
  if (request.method != "GET") return MethodNotAllowed(request.method, path, {"GET"});
  if (!raw_query.empty() || !request.body.empty()) {
    return ErrorReply(
        Error(ErrorCode::kInvalidArgument, "this call takes no query string and no body"));
  }
  std::vector<api::EngineView> views;
  for (const runtime::EngineStatus& e : controller_.Engines()) {
    views.push_back({.name = e.name,
                     .description = e.description,
                     .enabled = e.enabled,
                     .available = e.available,
                     .reason = e.reason,
                     .is_default = e.name == controller_.default_engine(),
                     .capabilities = e.capabilities});
  }
  return {200, api::RenderEngineList(views, controller_.default_engine()), ""};
}

HttpReply Router::Pools(const HttpRequest& request, std::span<const std::string_view> parts,
                        std::string_view raw_query) {
  const std::string_view method = request.method;
  const std::string path = request.target.substr(0, request.target.find('?'));
  if (parts.size() > 3) return NotFoundRoute(path);
  const bool one = parts.size() == 3;
  if (method != (one ? "PUT" : "GET")) return MethodNotAllowed(method, path, {one ? "PUT" : "GET"});
  if (!raw_query.empty()) {
    return ErrorReply(Error(ErrorCode::kInvalidArgument, "this route takes no query string"));
  }
  if (!one) {  // GET /v1/pools
    if (!request.body.empty()) {
      return ErrorReply(Error(ErrorCode::kInvalidArgument, "this call takes no request body"));
    }
    auto pools = controller_.pools().List();
    if (!pools) return ErrorReply(pools.error());
    std::vector<api::PoolView> views;
    for (const PoolStats& p : *pools) views.push_back(ToPoolView(p));
    return {200, api::RenderPoolList(views), ""};
  }
  // PUT /v1/pools/{template}: the name (400), then the body (400), then the template (404).
  const std::string name(parts[2]);
  if (auto st = api::CheckTemplateName(name); !st) return ErrorReply(st.error());
  auto size = api::PoolSizeRequest::FromJson(request.body);
  if (!size) return ErrorReply(size.error());
  auto pool = controller_.pools().SetSize(name, size->size);
  if (!pool) return ErrorReply(pool.error());
  return {200, api::RenderPool(ToPoolView(*pool)), ""};
}

HttpReply Router::Processes(const HttpRequest& request, const std::string& id,
                           std::span<const std::string_view> rest, std::string_view raw_query) {
  const std::string_view method = request.method;
  const std::string path(request.target.substr(0, request.target.find('?')));
  auto reply = [](Result<protocol::ProcessInfo> info) -> HttpReply {
    if (!info) return ErrorReply(info.error());
    return {200, api::RenderProcess(ToProcessView(*info)), ""};
  };
  const bool is_output = rest.size() == 2 && rest[1] == "output";
  if (!raw_query.empty() && !is_output) {
    return ErrorReply(Error(ErrorCode::kInvalidArgument, "this route takes no query string"));
  }
  if (rest.empty()) {  // .../processes
    if (method != "GET") return MethodNotAllowed(method, path, {"GET"});
    auto all = controller_.exec().ListProcesses(id);
    if (!all) return ErrorReply(all.error());
    std::vector<api::ProcessView> views;
    for (const auto& p : *all) views.push_back(ToProcessView(p));
    return {200, api::RenderProcessList(views), ""};
  }
  const std::string_view action = rest.size() == 2 ? rest[1] : std::string_view();
  if (rest.size() == 2 && action != "signal" && action != "stdin" && action != "wait" &&
      !is_output) {
    return NotFoundRoute(path);
  }
  const char* allowed = rest.size() == 1 || is_output ? "GET" : "POST";
  if (method != allowed) return MethodNotAllowed(method, path, {allowed});
  auto parsed_pid = api::ParsePid(rest[0]);
  if (!parsed_pid) return ErrorReply(parsed_pid.error());
  const int32_t pid = *parsed_pid;
  if (rest.size() == 1) return reply(controller_.exec().GetProcess(id, pid));
  if (action == "signal") {
    auto req = api::SignalRequest::FromJson(request.body);
    if (!req) return ErrorReply(req.error());
    return reply(controller_.exec().SignalProcess(id, pid, req->signo));
  }
  if (action == "stdin") {
    auto req = api::StdinRequest::FromJson(request.body);
    if (!req) return ErrorReply(req.error());
    return reply(controller_.exec().WriteProcessStdin(id, pid, req->data, req->close));
  }
  if (action == "wait") {
    auto req = api::WaitRequest::FromJson(request.body);
    if (!req) return ErrorReply(req.error());
    const auto timeout = std::chrono::milliseconds(std::llround(req->timeout_seconds * 1000));
    return reply(controller_.exec().WaitProcess(id, pid, timeout));
  }
  // output
  auto params = api::ParseQueryString(raw_query);
  if (!params) return ErrorReply(params.error());
  auto query = api::OutputQuery::FromQuery(*params);
  if (!query) return ErrorReply(query.error());
  auto stream = controller_.exec().AttachOutput(id, pid, /*replay=*/true, query->follow);
  if (!stream) return ErrorReply(stream.error());
  HttpReply out{200, "", ""};
  out.content_type = "application/x-ndjson";
  std::shared_ptr<EventStream> shared = std::move(*stream);
  out.next_chunk = [shared] { return NextChunk(*shared); };
  return out;
}

HttpReply Router::Files(const HttpRequest& request, const std::string& id, std::string_view sub,
                        std::string_view raw_query) {
  const std::string_view method = request.method;
  api::FileOp op;
  if (sub.empty()) {
    if (method == "GET") {
      op = api::FileOp::kRead;
    } else if (method == "PUT") {
      op = api::FileOp::kWrite;
    } else if (method == "DELETE") {
      op = api::FileOp::kDelete;
    } else {
      return MethodNotAllowed(method, request.target.substr(0, request.target.find('?')),
                              {"GET", "PUT", "DELETE"});
    }
  } else if (sub == "list" || sub == "mkdir") {
    const char* allowed = sub == "list" ? "GET" : "POST";
    if (method != allowed) {
      return MethodNotAllowed(method, request.target.substr(0, request.target.find('?')),
                              {allowed});
    }
    op = sub == "list" ? api::FileOp::kList : api::FileOp::kMkdir;
  } else {  // tar
    if (method != "GET" && method != "PUT") {
      return MethodNotAllowed(method, request.target.substr(0, request.target.find('?')),
                              {"GET", "PUT"});
    }
    op = method == "GET" ? api::FileOp::kTarGet : api::FileOp::kTarPut;
  }
  auto params = api::ParseQueryString(raw_query);
  if (!params) return ErrorReply(params.error());
  auto query = api::FileQuery::FromQuery(*params, op);
  if (!query) return ErrorReply(query.error());
  const bool takes_body = op == api::FileOp::kWrite || op == api::FileOp::kTarPut;
  if (!takes_body && !request.body.empty()) {
    return ErrorReply(Error(ErrorCode::kInvalidArgument, "this call takes no request body"));
  }

  const auto start = std::chrono::steady_clock::now();
  HttpReply reply;
  switch (op) {
    case api::FileOp::kRead: {
      auto data = controller_.files().ReadFile(id, *query);
      reply = data ? Bytes(std::move(*data), "application/octet-stream") : ErrorReply(data.error());
      break;
    }
    case api::FileOp::kWrite: {
      auto info = controller_.files().WriteFile(id, *query, request.body);
      reply = info ? HttpReply{200, api::RenderFileEntry(ToEntry(*info)), ""}
                   : ErrorReply(info.error());
      break;
    }
    case api::FileOp::kDelete: {
      auto st = controller_.files().DeleteFile(id, *query);
      reply = st ? HttpReply{204, "", ""} : ErrorReply(st.error());
      break;
    }
    case api::FileOp::kList: {
      auto entries = controller_.files().ListFiles(id, *query);
      if (!entries) {
        reply = ErrorReply(entries.error());
        break;
      }
      std::vector<api::FileEntryView> views;
      for (const auto& e : *entries) views.push_back(ToEntry(e));
      reply = {200, api::RenderFileList(query->path, views), ""};
      break;
    }
    case api::FileOp::kMkdir: {
      auto info = controller_.files().MakeDirectory(id, *query);
      reply = info ? HttpReply{201, api::RenderFileEntry(ToEntry(*info)), ""}
                   : ErrorReply(info.error());
      break;
    }
    case api::FileOp::kTarGet: {
      auto tar = controller_.files().ReadTar(id, *query);
      reply = tar ? Bytes(std::move(*tar), "application/x-tar") : ErrorReply(tar.error());
      break;
    }
    case api::FileOp::kTarPut: {
      auto st = controller_.files().WriteTar(id, *query, request.body);
      reply = st ? HttpReply{204, "", ""} : ErrorReply(st.error());
      break;
    }
  }
  metrics_.Observe(Metrics::Op::kFiles, reply.status < 400, std::chrono::steady_clock::now() - start);
  return reply;
}

}  // namespace airlock::daemon
