#include "cli/api.h"

namespace airlock::cli {

using nlohmann::json;

Outcome<Api> Api::Connect(const Globals& globals) {
  const std::string url = globals.url.value_or(client::DefaultUrl());
  auto http = client::HttpClient::Open(url);
  if (!http) return CommandError(http.error().message());
  std::string key;
  if (globals.api_key) {
    key = *globals.api_key;
  } else {
    auto found = client::DefaultApiKey();
    if (!found) return CommandError(found.error().message());
    key = *found;
  }
  http->set_api_key(key);
  return Api(std::move(*http), std::move(key));
}

Outcome<std::unique_ptr<client::WsClient>> Api::OpenWebSocket(const std::string& target) {
  client::HttpResponse refusal;
  auto ws = client::WsClient::Connect(http_.url(), api_key_, target, &refusal);
  if (ws) return std::move(*ws);
  if (refusal.status != 0) {
    return CommandError(DescribeErrorReply(refusal.status, refusal.body, http_.url()));
  }
  return CommandError(ws.error().message());
}

void Api::AllowAtLeast(std::chrono::milliseconds timeout) {
  if (timeout > timeout_) {
    timeout_ = timeout;
    http_.set_timeout(timeout);
  }
}

Outcome<Reply> Api::Call(std::string_view method, const std::string& target, std::string_view body,
                         std::string_view content_type) {
  auto response = http_.Request(method, target, body, content_type);
  if (!response) return CommandError(response.error().message());
  if (response->status < 200 || response->status > 299) {
    return CommandError(DescribeErrorReply(response->status, response->body, http_.url()));
  }
  return Reply{response->status, std::move(response->body)};
}

Outcome<json> Api::CallJson(std::string_view method, const std::string& target,
                            const json* request) {
  std::string body;
  if (request != nullptr) {
    auto text = DumpJson(*request);
    if (!text) return std::unexpected(text.error());
    body = std::move(*text);
  }
  auto reply = Call(method, target, body);
  if (!reply) return std::unexpected(reply.error());
  if (reply->body.empty()) return json();
  json doc = json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return CommandError("the daemon at " + http_.url() + " sent a reply that is not JSON");
  }
  return doc;
}

Outcome<void> Api::CallStreamed(std::string_view method, const std::string& target,
                                const json* request,
                                const std::function<bool(std::string_view)>& on_line) {
  auto body = request ? DumpJson(*request) : Outcome<std::string>(std::string());
  if (!body) return std::unexpected(body.error());
  std::string pending;  // a line not yet complete
  bool stopped = false;
  auto response = http_.RequestStreamed(method, target, *body, [&](std::string_view piece) {
    if (stopped) return;
    pending.append(piece);
    size_t start = 0;
    for (size_t nl; !stopped && (nl = pending.find('\n', start)) != std::string::npos;
         start = nl + 1) {
      stopped = !on_line(std::string_view(pending).substr(start, nl - start));
    }
    pending.erase(0, start);
  });
  if (!response) return CommandError(response.error().message());
  if (response->status < 200 || response->status > 299) {
    return CommandError(DescribeErrorReply(response->status, response->body, http_.url()));
  }
  return {};
}

std::string SandboxTarget(const std::string& id, std::string_view suffix) {
  return "/v1/sandboxes/" + client::UrlEncode(id) + std::string(suffix);
}

std::string DescribeErrorReply(int status, const std::string& body, const std::string& url) {
  const json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_object() && doc.contains("error") && doc["error"].is_object()) {
    const json& error = doc["error"];
    if (error.contains("code") && error["code"].is_string() && error.contains("message") &&
        error["message"].is_string()) {
      std::string message =
          error["code"].get<std::string>() + ": " + error["message"].get<std::string>();
      for (char& c : message) {
        if (c == '\n' || c == '\r') c = ' ';
      }
      return message;
    }
  }
  // Not the API's error document (a proxy, or not airlockd): the status and a little of the body.
  std::string excerpt = body.substr(0, 200);
  for (char& c : excerpt) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  std::string message = "HTTP " + std::to_string(status) + " from " + url;
  if (!excerpt.empty()) message += ": " + excerpt;
  return message;
}

Outcome<std::string> DumpJson(const json& doc, int indent) {
  try {
    return doc.dump(indent);
  } catch (const json::exception&) {
    return CommandError("cannot send text that is not valid UTF-8 (arguments, env, paths)");
  }
}

}  // namespace airlock::cli
