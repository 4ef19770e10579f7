#pragma once
// Router: one HTTP request in, one response out, for every route airlockd serves. It knows
// nothing of sockets (http_server.cc does); it authenticates, validates with api/types.h, hands
// the typed request to the Controller and renders the answer with api/render.h.

#include <expected>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/server/controller.h"
#include "daemon/server/metrics.h"
#include "daemon/server/secret_store.h"
#include "daemon/store/store.h"

namespace airlock::daemon {

struct HttpRequest {
  std::string method;         // "GET", "POST", ...
  std::string target;         // "/v1/sandboxes?state=running"
  std::string authorization;  // the Authorization header, "" if absent
  std::string body;
  bool websocket = false;     // asks to upgrade to WebSocket (RFC 6455)
  std::string request_id;     // the client's X-Request-Id when it is a sound one, else made up
};

struct HttpReply {
  unsigned status = 200;
  std::string body;                               // JSON unless content_type says otherwise
  std::string allow;                              // the Allow header of a 405
  std::string content_type = "application/json";  // sent when the body is not empty
  std::string error_code;                         // an error's code name, for the metrics
  // A streamed body: called on the worker pool until it returns nullopt; each piece is sent as
  // one HTTP chunk as soon as it is returned. `body` is unused then.
  std::function<std::optional<std::string>()> next_chunk;
  std::string request_id;  // sent back as X-Request-Id
};

// The route a path is, with the ids in it as placeholders, for the request log:
// "/v1/sandboxes/{id}/processes/{pid}". A path no route has is "-".
std::string RouteOf(std::string_view path);

// The largest request body `method` on `target` may carry (413 past it): file and tar uploads
// take raw bytes up to their caps, everything else JSON.
uint64_t BodyLimit(std::string_view method, std::string_view target);

// The error's status and JSON body (api::ErrorBody), with its code for the metrics.
HttpReply ErrorReply(const Error& error);
// "/v1/sandboxes/x" -> {"v1", "sandboxes", "x"}.
std::vector<std::string_view> SplitPath(std::string_view path);

class WsSession;  // ws_session.h

// Who makes a request: what the key it presented says (docs/design/tenancy.md). With --no-auth
// every caller is this default, an admin.
struct Caller {
  int64_t key_id = 0;  // 0 with --no-auth
  std::string tenant = std::string(store::kAdminTenant);
  bool admin = true;
  std::string key_name;  // "" with --no-auth
};

class Router {
 public:
  // `auth_required` false is --no-auth (loopback only; main checks that).
  // `log_requests`: a line per request (method, route, status, duration, tenant, sandbox id,
  // request id; never a key or a body), at info.
  Router(Controller& controller, store::Store& store, SecretStore& secrets, Metrics& metrics,
         bool auth_required, bool log_requests = false)
      : controller_(controller),
        store_(store),
        secrets_(secrets),
        metrics_(metrics),
        auth_required_(auth_required),
        log_requests_(log_requests) {}

  // Blocks (store, engine, agent): call on the worker pool. Thread-safe.
  HttpReply Handle(const HttpRequest& request);
  // A request on a WebSocket route (IsWebSocketPath): checks the key, the method, the ids and
  // that it asks for the upgrade, then makes the session (processes/{pid}/ws attaches at once,
  // so an unknown pid is a 404 here); otherwise the HTTP reply to answer instead. Blocks: call
  // on the worker pool. Thread-safe. Defined in ws_session.cc.
  std::expected<std::unique_ptr<WsSession>, HttpReply> Upgrade(const HttpRequest& request);

 private:
  // The caller the Authorization header names; nullopt answers 401.
  std::optional<Caller> Authenticate(std::string_view authorization);
  // The tenancy rule, enforced here alone for every /v1/sandboxes/{id}... route (HTTP and
  // WebSocket): an admin may act on any sandbox; anyone else gets, for a sandbox of another
  // tenant, exactly the error of a sandbox that does not exist (SandboxNotFound). Call after
  // the route and the id's syntax are checked and before anything else about the request.
  [[nodiscard]] Status CheckOwner(const Caller& caller, const std::string& id);
  // `tenant` is set to the caller's once the key is known (for the request's log line).
  HttpReply Dispatch(const HttpRequest& request, std::string& tenant);
  // GET /v1/sandboxes/{id}/events: a page, or a stream (JSON Lines, Server-Sent Events).
  HttpReply Events(const std::string& id, const api::EventsQuery& query);
  // For a non-admin caller: 404 (as if absent) for a template of another tenant named `name`.
  [[nodiscard]] Status CheckTemplateVisible(const Caller& caller, const std::string& name);
  HttpReply Keys(const HttpRequest& request, const Caller& caller,
                 std::span<const std::string_view> parts, std::string_view raw_query);
  HttpReply Files(const HttpRequest& request, const std::string& id, std::string_view sub,
                  std::string_view raw_query);
  HttpReply Processes(const HttpRequest& request, const std::string& id,
                      std::span<const std::string_view> rest, std::string_view raw_query);
  // /v1/pools and /v1/pools/{template}; `parts` is the split path.
  HttpReply Templates(const HttpRequest& request, const Caller& caller,
                      std::span<const std::string_view> parts, std::string_view raw_query);
  // GET /v1/engines: every engine, available or not, with what it can do (any caller).
  HttpReply Engines(const HttpRequest& request, std::span<const std::string_view> parts,
                    std::string_view raw_query);
  HttpReply Pools(const HttpRequest& request, std::span<const std::string_view> parts,
                  std::string_view raw_query);
  // /v1/secrets and /v1/secrets/{name}: the caller's tenant's secrets, or with ?tenant= (an
  // admin's only) another tenant's. Metadata in, metadata out: a value is taken, never shown.
  HttpReply Secrets(const HttpRequest& request, const Caller& caller,
                    std::span<const std::string_view> parts, std::string_view raw_query);
  HttpReply Tenants(const HttpRequest& request, const Caller& caller,
                    std::span<const std::string_view> parts, std::string_view raw_query);
  HttpReply RenderMetrics();

  Controller& controller_;
  store::Store& store_;
  SecretStore& secrets_;
  Metrics& metrics_;
  bool auth_required_;
  bool log_requests_;
};

}  // namespace airlock::daemon
