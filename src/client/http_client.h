#pragma once
// HttpClient: a small synchronous HTTP/1.1 client for airlockd's API, used by the `airlock` CLI,
// the API benchmark and the end-to-end tests. One keep-alive connection, opened on first use and
// reopened once if the server closed it between requests. Not thread-safe: one per thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"

namespace airlock::client {

struct HttpResponse {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // names lower-cased
  // The header's value, or "" when absent; `name` in lower case.
  std::string Header(const std::string& name) const;
};

class HttpClient {
 public:
  // `url` is http://HOST:PORT (an IPv4 / IPv6 literal or a name; no path, no https).
  [[nodiscard]] static Result<HttpClient> Open(const std::string& url);
  HttpClient(HttpClient&&) noexcept;
  HttpClient& operator=(HttpClient&&) noexcept;
  ~HttpClient();

  // Sent as "Authorization: Bearer KEY" on every request when not empty.
  void set_api_key(std::string key) { api_key_ = std::move(key); }
  // Limit on one whole request (connect, send, receive); 10 minutes unless set.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  // The cap on a response body; 256 MiB unless set.
  void set_body_limit(uint64_t bytes) { body_limit_ = bytes; }
  const std::string& url() const { return url_; }

  // Sends one request and reads the whole response. Errors are transport errors only (cannot
  // connect: kUnavailable; timeout: kDeadlineExceeded; a malformed reply: kProtocol); any HTTP
  // status comes back as a response. `content_type` is sent when `body` is not empty, or when
  // the method is POST / PUT / PATCH.
  [[nodiscard]] Result<HttpResponse> Request(std::string_view method, std::string_view target,
                                             std::string_view body = {},
                                             std::string_view content_type = "application/json");
  // As Request, but a successful (2xx) response's body goes to `on_body` piece by piece as it
  // arrives (a streamed exec), and the returned body is empty; an error response's body is
  // returned whole, as Request does. Never retried.
  [[nodiscard]] Result<HttpResponse> RequestStreamed(
      std::string_view method, std::string_view target, std::string_view body,
      const std::function<void(std::string_view)>& on_body,
      std::string_view content_type = "application/json");

 private:
  struct Conn;
  HttpClient(std::string url, std::string host, std::string port);
  Result<HttpResponse> RequestOnce(std::string_view method, std::string_view target,
                                   std::string_view body, std::string_view content_type,
                                   bool* reused,
                                   const std::function<void(std::string_view)>* on_body = nullptr);

  std::string url_, host_, port_;
  std::string api_key_;
  std::chrono::milliseconds timeout_ = std::chrono::minutes(10);
  uint64_t body_limit_ = 256ull << 20;
  std::unique_ptr<Conn> conn_;
};

// http://HOST:PORT split (an IPv6 host without its brackets; port "80" when not given).
struct HostPort {
  std::string host, port;
};
[[nodiscard]] Result<HostPort> ParseHttpUrl(const std::string& url);

// "%2F"-style escaping of a query value (RFC 3986 unreserved characters pass as they are).
std::string UrlEncode(std::string_view value);

// Where the CLI, the SDK and the tests find the daemon and the key:
//   URL: $AIRLOCK_URL, else http://127.0.0.1:7878.
//   key: $AIRLOCK_API_KEY, else the first line of $AIRLOCK_STATE_DIR/admin.key (default state
//        dir /var/lib/airlock); "" when neither exists (the daemon may run with --no-auth).
std::string DefaultUrl();
Result<std::string> DefaultApiKey();

}  // namespace airlock::client
