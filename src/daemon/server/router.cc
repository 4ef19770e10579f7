#include "daemon/server/router.h"

#include <chrono>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "common/ids.h"
#include "daemon/api/query.h"
#include "daemon/api/render.h"
#include "daemon/api/types.h"

namespace airlock::daemon {
namespace {

using store::SandboxRecord;

HttpReply FromError(const Error& error) {
  api::HttpError e = api::ErrorBody(error);
  return {static_cast<unsigned>(e.status), std::move(e.body), ""};
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
  return {405, doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), allow};
}

HttpReply NotFoundRoute(std::string_view path) {
  return FromError(Error(ErrorCode::kNotFound, "no such route: " + std::string(path)));
}

std::chrono::system_clock::time_point FromMs(int64_t ms) {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}

api::SandboxView ToView(const SandboxRecord& r) {
  api::SandboxView v;
  v.id = r.id;
  v.state = std::string(store::SandboxStateName(r.state));
  v.template_name = r.template_name;
  v.engine = r.engine;
  v.created_at = FromMs(r.created_at_ms);
  v.expires_at = FromMs(r.expires_at_ms);
  v.limits.cpus = r.limits.cpus;
  v.limits.memory_mb = static_cast<uint64_t>(r.limits.memory_mb);
  v.limits.pids_max = static_cast<uint64_t>(r.limits.pids_max);
  v.limits.disk_mb = static_cast<uint64_t>(r.limits.disk_mb);
  v.metadata = r.metadata;
  return v;
}

HttpReply SandboxReply(unsigned status, const Result<SandboxRecord>& record) {
  if (!record) return FromError(record.error());
  return {status, api::RenderSandbox(ToView(*record)), ""};
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

}  // namespace

bool Router::Authenticated(std::string_view authorization) {
  if (!auth_required_) return true;
  constexpr std::string_view kScheme = "Bearer ";
  if (!authorization.starts_with(kScheme)) return false;
  authorization.remove_prefix(kScheme.size());
  return store_.Authenticate(authorization).has_value();
}

HttpReply Router::Handle(const HttpRequest& request) {
  std::string_view target = request.target;
  std::string_view path = target.substr(0, target.find('?'));
  std::string_view raw_query;
  if (size_t q = target.find('?'); q != std::string_view::npos) raw_query = target.substr(q + 1);
  const std::string_view method = request.method;

  if (path == "/healthz") {
    if (method != "GET") return MethodNotAllowed(method, path, {"GET"});
    return {200, R"({"status":"ok"})", ""};
  }
  if (path != "/v1" && !path.starts_with("/v1/")) return NotFoundRoute(path);

  // Every /v1 route, known or not, answers 401 first: an unauthenticated caller learns nothing.
  if (!Authenticated(request.authorization)) {
    api::HttpError e = api::UnauthenticatedBody();
    return {static_cast<unsigned>(e.status), std::move(e.body), ""};
  }

  const std::vector<std::string_view> parts = SplitPath(path);
  if (parts.size() < 2 || parts[1] != "sandboxes" || parts.size() > 5) return NotFoundRoute(path);

  if (parts.size() == 2) {  // /v1/sandboxes
    if (method == "POST") {
      if (!raw_query.empty()) {
        return FromError(Error(ErrorCode::kInvalidArgument, "this route takes no query string"));
      }
      auto create = api::CreateSandboxRequest::FromJson(request.body);
      if (!create) return FromError(create.error());
      return SandboxReply(201, controller_.Create(*create));
    }
    if (method == "GET") {
      auto params = api::ParseQueryString(raw_query);
      if (!params) return FromError(params.error());
      auto filter = api::ListFilter::FromQuery(*params);
      if (!filter) return FromError(filter.error());
      auto records = controller_.List(*filter);
      if (!records) return FromError(records.error());
      std::vector<api::SandboxView> views;
      for (const SandboxRecord& r : *records) views.push_back(ToView(r));
      return {200, api::RenderSandboxList(views), ""};
    }
    return MethodNotAllowed(method, path, {"GET", "POST"});
  }

  // /v1/sandboxes/{id}[/...]: which route first (404 / 405), then the id (400).
  const std::string id(parts[2]);
  const std::string_view op = parts.size() >= 4 ? parts[3] : std::string_view();
  enum class Route { kSandbox, kExec, kPause, kResume, kFiles };
  Route route;
  if (parts.size() == 3) {
    route = Route::kSandbox;
    if (method != "GET" && method != "DELETE" && method != "PATCH") {
      return MethodNotAllowed(method, path, {"GET", "PATCH", "DELETE"});
    }
  } else if (parts.size() == 4 && (op == "exec" || op == "pause" || op == "resume")) {
    route = op == "exec" ? Route::kExec : op == "pause" ? Route::kPause : Route::kResume;
    if (method != "POST") return MethodNotAllowed(method, path, {"POST"});
  } else if (op == "files" && (parts.size() == 4 || parts[4] == "list" || parts[4] == "mkdir" ||
                               parts[4] == "tar")) {
    route = Route::kFiles;
  } else {
    return NotFoundRoute(path);
  }
  if (auto st = ValidateSandboxId(id); !st) return FromError(st.error());
  if (route == Route::kFiles) {
    return FromError(
        Error(ErrorCode::kUnimplemented, "the files API is not implemented in this airlockd yet"));
  }
  if (!raw_query.empty()) {
    return FromError(Error(ErrorCode::kInvalidArgument, "this route takes no query string"));
  }

  switch (route) {
    case Route::kSandbox:
      if (method == "GET") return SandboxReply(200, controller_.Get(id));
      if (method == "DELETE") {
        if (auto st = controller_.Destroy(id); !st) return FromError(st.error());
        return {204, "", ""};
      }
      {
        auto patch = api::PatchSandboxRequest::FromJson(request.body);
        if (!patch) return FromError(patch.error());
        return SandboxReply(200, controller_.Patch(id, *patch));
      }
    case Route::kPause:
      return SandboxReply(200, controller_.Pause(id));
    case Route::kResume:
      return SandboxReply(200, controller_.Resume(id));
    case Route::kExec: {
      auto exec = api::ExecRequest::FromJson(request.body);
      if (!exec) return FromError(exec.error());
      auto result = controller_.Exec(id, *exec);
      if (!result) return FromError(result.error());
      api::ExecResultView view;
      view.exit_code = result->exit.exit_code;
      view.signal = result->exit.term_signal;
      view.stdout_bytes = std::move(result->stdout_data);
      view.stderr_bytes = std::move(result->stderr_data);
      view.duration_ms = result->exit.duration_us / 1000;
      view.timed_out = result->exit.timed_out;
      view.oom_killed = result->exit.oom_killed;
      view.truncated = result->exit.truncated;
      return {200, api::RenderExecResult(view), ""};
    }
    case Route::kFiles:
      break;
  }
  return NotFoundRoute(path);
}

}  // namespace airlock::daemon
