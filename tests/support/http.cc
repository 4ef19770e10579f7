#include "support/http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <sstream>

namespace airlock::testing {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

// A connected TCP socket to 127.0.0.1:`port`, or -1.
int ConnectLoopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Appends what one read gives to `got`; false at the end of the stream or on an error.
bool ReadSome(int fd, std::string& got) {
  char buf[4096];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof buf);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  got.append(buf, static_cast<size_t>(n));
  return true;
}

}  // namespace

Reply Http(uint16_t port, http::verb method, const std::string& target, const std::string& body,
           const std::optional<std::string>& authorization,
           const std::map<std::string, std::string>& headers) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  stream.expires_after(std::chrono::seconds(120));
  stream.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  http::request<http::string_body> req{method, target, 11};
  req.set(http::field::host, "127.0.0.1");
  if (authorization) req.set(http::field::authorization, *authorization);
  for (const auto& [name, value] : headers) req.set(name, value);
  if (!body.empty() || method == http::verb::post) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
  }
  // A server may answer (413) and stop reading before the whole body is sent: read anyway.
  beast::error_code write_ec;
  http::write(stream, req, write_ec);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64u << 20);
  http::read(stream, buffer, parser);
  Reply reply;
  reply.status = static_cast<int>(parser.get().result_int());
  reply.body = parser.get().body();
  for (const auto& field : parser.get()) {
    reply.headers[std::string(field.name_string())] = std::string(field.value());
  }
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  return reply;
}

Reply WsHandshake(uint16_t port, const std::string& key, const std::string& target) {
  asio::io_context io;
  tcp::socket socket(io);
  beast::error_code ec;
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), ec);
  if (ec) return {};
  const std::string request = "GET " + target +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + key +
                              "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                              "Sec-WebSocket-Version: 13\r\n"
                              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
  asio::write(socket, asio::buffer(request), ec);
  if (ec) return {};
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  if (http::read_header(socket, buffer, parser, ec); ec) return {};
  Reply reply;
  reply.status = static_cast<int>(parser.get().result_int());
  if (reply.status != 101) {
    http::read(socket, buffer, parser, ec);
    reply.body = parser.get().body();
  }
  for (const auto& field : parser.get()) {
    reply.headers[std::string(field.name_string())] = std::string(field.value());
  }
  socket.close(ec);
  return reply;
}

int RawStatus(uint16_t port, const std::string& raw) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return 0;
  std::string got;
  if (WriteAll(fd, raw)) {
    while (got.find("\r\n") == std::string::npos && ReadSome(fd, got)) {
    }
  }
  ::close(fd);
  if (!got.starts_with("HTTP/1.1 ") || got.size() < 12) return 0;
  return std::atoi(got.substr(9, 3).c_str());
}

RawStream::RawStream(uint16_t port, const std::string& key, const std::string& target,
                     const std::string& body, const std::string& method)
    : fd_(ConnectLoopback(port)) {
  const std::string request = method + " " + target +
                              " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key +
                              "\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  if (fd_ >= 0 && !WriteAll(fd_, request)) Close();
}

bool RawStream::ReadUntil(const std::string& needle) {
  while (got_.find(needle) == std::string::npos) {
    if (fd_ < 0 || !ReadSome(fd_, got_)) return false;
  }
  return true;
}

void RawStream::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::vector<json> RawStream::Events() const {
  std::vector<json> events;
  const size_t head = got_.find("\r\n\r\n");
  if (head == std::string::npos) return events;
  std::istringstream lines(got_.substr(head + 4));
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("{")) events.push_back(json::parse(line));
  }
  return events;
}

}  // namespace airlock::testing
