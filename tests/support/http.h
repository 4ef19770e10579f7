#pragma once
// HTTP for the tests that drive a real airlockd on loopback: one request per connection
// (Http), raw bytes (RawStatus) and a response read as it arrives (RawStream). Compiled once
// (http.cc) so that the test files that include airlockd.h do not each compile Beast.

#include <boost/beast/http/verb.hpp>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace airlock::testing {

namespace http = boost::beast::http;
using nlohmann::json;

struct Reply {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;
  json Json() const { return json::parse(body, nullptr, /*allow_exceptions=*/false); }
  // The headers less X-Request-Id, which is each request's own and never the same twice.
  std::map<std::string, std::string> StableHeaders() const {
    std::map<std::string, std::string> out = headers;
    out.erase("X-Request-Id");
    return out;
  }
};

// One request to 127.0.0.1:`port` on a fresh connection; a JSON body (POST always has one),
// and `headers` beside the usual ones.
Reply Http(uint16_t port, http::verb method, const std::string& target, const std::string& body,
           const std::optional<std::string>& authorization,
           const std::map<std::string, std::string>& headers = {});

// A WebSocket handshake for `target` with `key`; the answer's status, headers and body (a
// refusal's) as Http gives them, status 0 if none came. The connection is closed at once.
Reply WsHandshake(uint16_t port, const std::string& key, const std::string& target);

// Sends `raw` bytes as they are and returns the status line's code (0 if none came back).
int RawStatus(uint16_t port, const std::string& raw);

// One streamed request on a raw connection to 127.0.0.1:`port`, read as it arrives.
class RawStream {
 public:
  // POST `body` to `target`, or GET it when `method` says so.
  RawStream(uint16_t port, const std::string& key, const std::string& target,
            const std::string& body, const std::string& method = "POST");
  ~RawStream() { Close(); }
  RawStream(const RawStream&) = delete;
  RawStream& operator=(const RawStream&) = delete;

  // Reads until `needle` has arrived (true) or the connection ends (false).
  bool ReadUntil(const std::string& needle);
  void Close();
  const std::string& got() const { return got_; }
  // The NDJSON events in what arrived (chunk-size lines are not JSON objects).
  std::vector<json> Events() const;

 private:
  int fd_ = -1;
  std::string got_;
};

}  // namespace airlock::testing
