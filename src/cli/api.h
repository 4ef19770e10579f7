#pragma once
// The CLI's side of the REST API: where the daemon is, and one call per request. A reply outside
// 2xx becomes a Failure whose message is the server's "<code>: <message>"; a transport error's
// message says what could not be reached ("cannot connect to http://...: Connection refused").

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "cli/outcome.h"
#include "client/http_client.h"
#include "client/ws_client.h"

namespace airlock::cli {

// Set by the top-level flags, or by the same flags after the command.
struct Globals {
  std::optional<std::string> url;      // --url; else $AIRLOCK_URL, else the default
  std::optional<std::string> api_key;  // --api-key; else client::DefaultApiKey()
  bool json = false;                   // --json: machine-readable output
};

// The reply of a call that succeeded: its status and body.
struct Reply {
  int status = 0;
  std::string body;
};

class Api {
 public:
  // Resolves the URL and the key from `globals` and the environment; connects lazily.
  [[nodiscard]] static Outcome<Api> Connect(const Globals& globals);

  // Sends one request; any 2xx is success. `body` goes with `content_type`.
  [[nodiscard]] Outcome<Reply> Call(std::string_view method, const std::string& target,
                                    std::string_view body = {},
                                    std::string_view content_type = "application/json");
  // As Call, for a JSON reply (null for an empty body); `request` is sent as JSON when given.
  [[nodiscard]] Outcome<nlohmann::json> CallJson(std::string_view method, const std::string& target,
                                                 const nlohmann::json* request = nullptr);

  // Sends `request` as JSON (nothing when null) and hands each line of the streamed (NDJSON)
  // answer to `on_line` as it arrives. `on_line` returns false to stop reading (the connection
  // is then dropped).
  [[nodiscard]] Outcome<void> CallStreamed(
      std::string_view method, const std::string& target, const nlohmann::json* request,
      const std::function<bool(std::string_view)>& on_line);

  // Opens a WebSocket session on `target` (exec/ws, processes/{pid}/ws) with the same URL and
  // key. A refused upgrade is a Failure with the server's "<code>: <message>".
  [[nodiscard]] Outcome<std::unique_ptr<client::WsClient>> OpenWebSocket(const std::string& target);

  // Raises the per-request limits for long execs and big transfers.
  void AllowAtLeast(std::chrono::milliseconds timeout);
  void set_body_limit(uint64_t bytes) { http_.set_body_limit(bytes); }

 private:
  Api(client::HttpClient http, std::string api_key)
      : http_(std::move(http)), api_key_(std::move(api_key)) {}
  client::HttpClient http_;
  std::string api_key_;
  std::chrono::milliseconds timeout_ = std::chrono::minutes(10);
};

// "/v1/sandboxes/ID" + suffix, with the id escaped.
std::string SandboxTarget(const std::string& id, std::string_view suffix = {});

// The one-line message for a reply outside 2xx: "not_found: sandbox ... does not exist", or
// "HTTP 502 from URL: ..." when the body is not the API's error document.
std::string DescribeErrorReply(int status, const std::string& body, const std::string& url);

// JSON text for `doc`; bytes that are not UTF-8 are a Failure, never an exception.
[[nodiscard]] Outcome<std::string> DumpJson(const nlohmann::json& doc, int indent = -1);

}  // namespace airlock::cli
