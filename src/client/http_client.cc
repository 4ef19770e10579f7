#include "client/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <vector>

namespace airlock::client {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct HttpClient::Conn {
  asio::io_context io;
  beast::tcp_stream stream{io};
  beast::flat_buffer buffer;
  bool open = false;
};

std::string HttpResponse::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

Result<HostPort> ParseHttpUrl(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  std::string_view rest = url;
  if (!rest.starts_with(kScheme)) {
    return Fail(ErrorCode::kInvalidArgument, "the URL must start with http://, got '" + url + "'");
  }
  rest.remove_prefix(kScheme.size());
  while (rest.ends_with('/')) rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) {
    return Fail(ErrorCode::kInvalidArgument, "the URL takes no path: '" + url + "'");
  }
  std::string host, port = "80";
  if (rest.starts_with('[')) {  // [::1]:7878
    size_t close = rest.find(']');
    if (close == std::string_view::npos) {
      return Fail(ErrorCode::kInvalidArgument, "unbalanced [ in '" + url + "'");
    }
    host = std::string(rest.substr(1, close - 1));
    rest.remove_prefix(close + 1);
    if (rest.starts_with(':')) port = std::string(rest.substr(1));
    else if (!rest.empty()) return Fail(ErrorCode::kInvalidArgument, "bad URL '" + url + "'");
  } else if (size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = std::string(rest.substr(0, colon));
    port = std::string(rest.substr(colon + 1));
  } else {
    host = std::string(rest);
  }
  bool numeric = !port.empty() && port.size() <= 5;
  for (char c : port) numeric = numeric && std::isdigit(static_cast<unsigned char>(c));
  if (host.empty() || !numeric || std::atoi(port.c_str()) > 65535) {
    return Fail(ErrorCode::kInvalidArgument, "bad host or port in '" + url + "'");
  }
  return HostPort{std::move(host), std::move(port)};
}

Result<HttpClient> HttpClient::Open(const std::string& url) {
  auto where = ParseHttpUrl(url);
  if (!where) return std::unexpected(std::move(where.error()));
  return HttpClient(url, std::move(where->host), std::move(where->port));
}

HttpClient::HttpClient(std::string url, std::string host, std::string port)
    : url_(std::move(url)), host_(std::move(host)), port_(std::move(port)) {}
HttpClient::HttpClient(HttpClient&&) noexcept = default;
HttpClient& HttpClient::operator=(HttpClient&&) noexcept = default;
HttpClient::~HttpClient() = default;

Result<HttpResponse> HttpClient::Request(std::string_view method, std::string_view target,
                                         std::string_view body, std::string_view content_type) {
  bool reused = false;
  auto response = RequestOnce(method, target, body, content_type, &reused);
  // A keep-alive connection the server closed while idle fails on first use: retry once on a
  // new one. (The request was never read, so sending it again is safe for any method.)
  if (!response && reused && response.error().code() == ErrorCode::kUnavailable) {
    response = RequestOnce(method, target, body, content_type, &reused);
  }
  return response;
}

Result<HttpResponse> HttpClient::RequestStreamed(
    std::string_view method, std::string_view target, std::string_view body,
    const std::function<void(std::string_view)>& on_body, std::string_view content_type) {
  bool reused = false;
  return RequestOnce(method, target, body, content_type, &reused, &on_body);
}

Result<HttpResponse> HttpClient::RequestOnce(std::string_view method, std::string_view target,
                                             std::string_view body, std::string_view content_type,
                                             bool* reused,
                                             const std::function<void(std::string_view)>* on_body) {
  const http::verb verb = http::string_to_verb(beast::string_view(method.data(), method.size()));
  if (verb == http::verb::unknown) {
    return Fail(ErrorCode::kInvalidArgument, "unknown HTTP method " + std::string(method));
  }
  if (!conn_) conn_ = std::make_unique<Conn>();
  *reused = conn_->open;
  beast::error_code ec;
  if (!conn_->open) {
    tcp::resolver resolver(conn_->io);
    auto endpoints = resolver.resolve(host_, port_, ec);
    if (ec) return Fail(ErrorCode::kUnavailable, "resolving " + host_ + ": " + ec.message());
    conn_->stream.expires_after(timeout_);
    conn_->stream.connect(endpoints, ec);
    if (ec) {
      conn_.reset();
      return Fail(ErrorCode::kUnavailable, "cannot connect to " + url_ + ": " + ec.message());
    }
    conn_->open = true;
  }
  http::request<http::string_body> req{verb, std::string(target), 11};
  req.set(http::field::host, host_);
  req.set(http::field::user_agent, "airlock-client");
  if (!api_key_.empty()) req.set(http::field::authorization, "Bearer " + api_key_);
  if (!body.empty() || verb == http::verb::post || verb == http::verb::put ||
      verb == http::verb::patch) {
    req.set(http::field::content_type, std::string(content_type));
    req.body() = std::string(body);
    req.prepare_payload();
  }
  conn_->stream.expires_after(timeout_);
  http::write(conn_->stream, req, ec);
  // A server may answer (413) and stop reading before the whole body is sent: read anyway.
  const bool write_failed = static_cast<bool>(ec);
  auto fail = [&](beast::error_code e) -> Result<HttpResponse> {
    conn_.reset();
    if (e == beast::error::timeout) {
      return Fail(ErrorCode::kDeadlineExceeded, "no reply from " + url_ + " in time");
    }
    if (e == http::error::end_of_stream || e == asio::error::connection_reset ||
        e == asio::error::eof || write_failed) {
      return Fail(ErrorCode::kUnavailable, url_ + " closed the connection: " + e.message());
    }
    return Fail(ErrorCode::kProtocol, "reading the reply from " + url_ + ": " + e.message());
  };
  // The body arrives in pieces of up to 64 KiB; each goes to `on_body` (a 2xx answer being
  // streamed) or is kept (everything else).
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(body_limit_);
  http::read_header(conn_->stream, conn_->buffer, parser, ec);
  if (ec) return fail(ec);
  HttpResponse out;
  out.status = static_cast<int>(parser.get().result_int());
  for (const auto& field : parser.get()) {
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out.headers[name] = std::string(field.value());
  }
  const bool stream_out = on_body != nullptr && out.status >= 200 && out.status <= 299;
  if (stream_out) parser.body_limit(boost::none);  // a stream is as long as its command runs
  std::vector<char> piece(64 * 1024);
  while (!parser.is_done()) {
    parser.get().body().data = piece.data();
    parser.get().body().size = piece.size();
    conn_->stream.expires_after(timeout_);
    http::read_some(conn_->stream, conn_->buffer, parser, ec);  // what has arrived, no more
    if (ec == http::error::need_buffer) ec = {};
    if (ec) return fail(ec);
    const std::string_view got(piece.data(), piece.size() - parser.get().body().size);
    if (got.empty()) continue;
    if (stream_out) {
      (*on_body)(got);
    } else {
      out.body.append(got);
    }
  }
  if (!parser.keep_alive()) conn_.reset();
  return out;
}

std::string UrlEncode(std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string DefaultUrl() {
  const char* url = std::getenv("AIRLOCK_URL");
  return url && *url ? url : "http://127.0.0.1:7878";
}

Result<std::string> DefaultApiKey() {
  if (const char* key = std::getenv("AIRLOCK_API_KEY"); key && *key) return std::string(key);
  const char* dir = std::getenv("AIRLOCK_STATE_DIR");
  const std::string path = std::string(dir && *dir ? dir : "/var/lib/airlock") + "/admin.key";
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return std::string();
    return Fail(ErrorCode::kPermissionDenied,
                "cannot read " + path + " (" + ErrnoName(errno) + "); set AIRLOCK_API_KEY");
  }
  std::string key;
  std::getline(in, key);
  return key;
}

}  // namespace airlock::client
