#pragma once
// HTTPS sites for the fake internet (support/fake_internet.h), for the tests of credentials added
// at the egress proxy (issue 21): a TLS listener on an address and port the caller picks, in a
// network namespace the caller names (or in this one), serving a set of names, each with a leaf
// of its own chosen by SNI and a behaviour:
//
//   Api{token}    a service that wants the token: `Authorization: Bearer <token>`, basic auth
//                 whose password is the token, or `X-Api-Key: <token>` -> 200 "ok <name>";
//                 anything else -> 401 "bad token".
//   Echo{}        200 with the request as it came (request line and header lines verbatim, a
//                 blank line, then the body, de-chunked), each request header also sent back as
//                 `X-Echo-<Name>: <value>`.
//   Redirect{url} 302 to `url`, "{port}" in it replaced by the sites' port.
//
// Every site: HTTP/1.1 keep-alive (a connection serves requests until the client closes it or
// sends `Connection: close`); request bodies by Content-Length or chunked (`Expect:
// 100-continue` answered); responses framed by Content-Length, or chunked when the query has
// `chunked=1`; `GET /bytes/N` answered with N zero bytes (an Api site only with the token), for
// the throughput benchmark; every response names its site in `X-Fake-Site`.
//
// The certificates come from a CA of its own (net/tls_authority.h, in a temporary directory), not
// the daemon's: ca_file() is what a daemon under test is told to trust upstream. Every request
// is recorded (the SNI it came under, its head and body) so that a test can ask whether a string
// (a credential) reached a site. Nothing sent to it leaves the machine. Whoever includes this
// links airlock_net.
//
// Threads: one accepts (in the namespace), one serves each connection; every method may be
// called from any thread. The destructor stops and joins them all, closes every socket and
// removes the temporary directory.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include "common/unique_fd.h"
#include "net/tls_authority.h"

namespace airlock::testing {

class FakeHttpsSites {
 public:
  struct Api {
    std::string expected_token;
  };
  struct Echo {};
  struct Redirect {
    std::string location;
  };
  using Behaviour = std::variant<Api, Echo, Redirect>;

  // One request as the site got it.
  struct Request {
    std::string name;    // the SNI it came under
    std::string host;    // its Host header ("" without one)
    std::string method;  // "" when the head could not be parsed
    std::string target;
    std::vector<std::string> header_lines;  // "Name: value", verbatim
    std::string head;                       // request line and header lines, as received
    std::string body;                       // de-chunked
  };

  // Serves `sites` (name -> behaviour; names as a certificate takes them) on address:port (port
  // 0: the kernel picks one, see port()) in the network namespace at `netns_path` ("": this
  // process's). ok() says whether it started, error() why not.
  FakeHttpsSites(const std::string& netns_path, const std::string& address, uint16_t port,
                 std::map<std::string, Behaviour> sites)
      : address_(address) {
    char tmpl[] = "/tmp/airlock-fake-https-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      error_ = "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    if (!MakeContexts(std::move(sites))) return;
    std::promise<std::string> ready;
    auto started = ready.get_future();
    acceptor_ = std::thread([this, netns_path, port, &ready] {
      if (!netns_path.empty()) {
        // This thread, and the connections' threads it starts, live in that namespace.
        UniqueFd ns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!ns || ::setns(ns.get(), CLONE_NEWNET) != 0) {
          ready.set_value("joining the network namespace " + netns_path +
                          " failed: " + std::strerror(errno));
          return;
        }
      }
      if (std::string e = Listen(port); !e.empty()) {
        ready.set_value(e);
        return;
      }
      ready.set_value("");
      Accept();
    });
    error_ = started.get();
    if (!error_.empty()) acceptor_.join();
  }
  FakeHttpsSites(const FakeHttpsSites&) = delete;
  FakeHttpsSites& operator=(const FakeHttpsSites&) = delete;
  ~FakeHttpsSites() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    // Each connection's thread sees stop_ within a socket timeout (kTick).
    for (Connection& c : connections_) c.thread.join();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& address() const { return address_; }
  uint16_t port() const { return port_; }
  // The PEM certificate of the sites' CA (readable by anyone): what a client must trust.
  const std::string& ca_file() const { return ca_file_; }

  // How many requests came under SNI `name`.
  int Requests(const std::string& name) {
    std::lock_guard lock(mu_);
    return static_cast<int>(std::count_if(requests_.begin(), requests_.end(),
                                          [&](const Request& r) { return r.name == name; }));
  }
  // Whether any request under SNI `name` had `s` in its head or body (case matters).
  bool Seen(const std::string& name, std::string_view s) { return Find(&name, s); }
  // Whether any request to any site had `s` in its head or body.
  bool SeenAnywhere(std::string_view s) { return Find(nullptr, s); }
  // The requests under SNI `name` ("": all of them), in the order they came.
  std::vector<Request> Recorded(const std::string& name = "") {
    std::lock_guard lock(mu_);
    std::vector<Request> out;
    for (const Request& r : requests_) {
      if (name.empty() || r.name == name) out.push_back(r);
    }
    return out;
  }
  // TCP connections accepted, and of them those whose TLS handshake completed.
  int connections() const { return accepted_; }
  int handshakes() const { return handshakes_; }

 private:
  static constexpr auto kTick = std::chrono::milliseconds(100);  // how soon a stop is seen
  static constexpr auto kIdle = std::chrono::seconds(30);        // a quiet connection is closed
  static constexpr size_t kMaxHeadBytes = 64 * 1024;

  struct Site {
    Behaviour behaviour;
    std::shared_ptr<boost::asio::ssl::context> context;
  };
  struct Connection {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  // One connection's TLS and what was read but not yet used.
  struct Stream {
    SSL* ssl;
    std::string in;
    std::chrono::steady_clock::time_point deadline;
    bool ended = false;  // the client went away, went quiet, or the sites are stopping
  };
  struct Response {
    int status = 200;
    std::vector<std::string> headers;  // "Name: value"
    std::string body;
    size_t zero_bytes = 0;  // /bytes/N: N zero bytes instead of body
  };
  using Ssl = std::unique_ptr<SSL, decltype(&SSL_free)>;

  static bool IEquals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) ==
                    std::tolower(static_cast<unsigned char>(y));
           });
  }
  static std::string_view Trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  }
  // The value of the first header field called `name`, nullopt when there is none.
  static std::optional<std::string> Field(const Request& r, std::string_view name) {
    for (const std::string& line : r.header_lines) {
      const size_t colon = line.find(':');
      if (IEquals(std::string_view(line).substr(0, colon), name)) {
        return std::string(Trim(std::string_view(line).substr(colon + 1)));
      }
    }
    return std::nullopt;
  }
  static std::string Base64Decode(std::string_view text) {
    if (text.empty() || text.size() % 4 != 0) return "";
    std::string out(text.size() / 4 * 3, '\0');
    int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                            reinterpret_cast<const unsigned char*>(text.data()),
                            static_cast<int>(text.size()));
    if (n < 0) return "";
    // EVP_DecodeBlock counts the padding as zero bytes.
    size_t size = static_cast<size_t>(n);
    for (size_t i = text.size(); i > 0 && text[i - 1] == '='; --i) --size;
    out.resize(size);
    return out;
  }

  // The CA in the temporary directory, a copy of its certificate for ca_file(), a context per
  // name, and the context every handshake starts on, which only picks one of those by SNI.
  bool MakeContexts(std::map<std::string, Behaviour> sites) {
    auto ca = net::CertificateAuthority::LoadOrCreate(dir_ + "/ca");
    if (!ca) {
      error_ = ca.error().message();
      return false;
    }
    ca_ = std::move(*ca);
    ::chmod(dir_.c_str(), 0755);
    ca_file_ = dir_ + "/ca.crt";
    std::ofstream(ca_file_) << ca_->certificate_pem();
    for (auto& [name, behaviour] : sites) {
      auto context = ca_->ServerContext(name);
      if (!context) {
        error_ = context.error().message();
        return false;
      }
      sites_.emplace(name, Site{std::move(behaviour), *context});
    }
    base_.reset(SSL_CTX_new(TLS_server_method()));
    if (!base_) {
      error_ = "SSL_CTX_new failed";
      return false;
    }
    SSL_CTX_set_min_proto_version(base_.get(), TLS1_2_VERSION);
    SSL_CTX_set_tlsext_servername_callback(base_.get(), PickSite);
    SSL_CTX_set_tlsext_servername_arg(base_.get(), this);
    return true;
  }

  // The servername callback: switches the connection to the context of the name it asked for.
  // No SNI, or a name not served: the handshake ends with unrecognized_name.
  static int PickSite(SSL* ssl, int* alert, void* arg) {
    auto* self = static_cast<FakeHttpsSites*>(arg);
    const char* sni = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    auto it = sni ? self->sites_.find(sni) : self->sites_.end();
    if (it == self->sites_.end()) {
      *alert = SSL_AD_UNRECOGNIZED_NAME;
      return SSL_TLSEXT_ERR_ALERT_FATAL;
    }
    SSL_set_SSL_CTX(ssl, it->second.context->native_handle());
    return SSL_TLSEXT_ERR_OK;
  }

  std::string Listen(uint16_t port) {
    const bool v6 = address_.find(':') != std::string::npos;
    listener_.Reset(::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    ::setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage addr{};
    socklen_t size = 0;
    bool parsed = false;
    if (v6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
      in6->sin6_family = AF_INET6;
      in6->sin6_port = htons(port);
      parsed = ::inet_pton(AF_INET6, address_.c_str(), &in6->sin6_addr) == 1;
      size = sizeof *in6;
    } else {
      auto* in = reinterpret_cast<sockaddr_in*>(&addr);
      in->sin_family = AF_INET;
      in->sin_port = htons(port);
      parsed = ::inet_pton(AF_INET, address_.c_str(), &in->sin_addr) == 1;
      size = sizeof *in;
    }
    if (!parsed) return "\"" + address_ + "\" is not an address";
    if (!listener_ || ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), size) != 0 ||
        ::listen(listener_.get(), 128) != 0 ||
        ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &size) != 0) {
      return "listening on " + address_ + ":" + std::to_string(port) + ": " + std::strerror(errno);
    }
    port_ = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                     : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    return "";
  }

  void Accept() {
    while (!stop_) {
      pollfd p{listener_.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(kTick.count())) <= 0) continue;
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ++accepted_;
      // Heads and bodies are separate writes: without this a kept-alive connection's next
      // response waits for the client's delayed ACK.
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      // Blocking reads and writes that give up every tick, so that a stop is seen.
      timeval tick{0, static_cast<suseconds_t>(kTick.count() * 1000)};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tick, sizeof tick);
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tick, sizeof tick);
      // Threads of connections that ended are joined here, so a long benchmark does not pile
      // them up.
      connections_.remove_if([](Connection& c) {
        if (!*c.done) return false;
        c.thread.join();
        return true;
      });
      auto done = std::make_shared<std::atomic<bool>>(false);
      connections_.push_back(Connection{std::thread([this, fd, done] {
                                          // OpenSSL writes with write(2): a client that went
                                          // away is EPIPE for this thread, not a SIGPIPE that
                                          // kills the test.
                                          sigset_t pipe;
                                          sigemptyset(&pipe);
                                          sigaddset(&pipe, SIGPIPE);
                                          pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
                                          Serve(fd);
                                          ::close(fd);
                                          *done = true;
                                        }),
                                        done});
    }
  }

  // SSL_accept, SSL_read and SSL_write told apart from a socket timeout (a tick): retried until
  // the deadline or a stop.
  bool Retry(SSL* ssl, int result, std::chrono::steady_clock::time_point deadline) {
    const int e = SSL_get_error(ssl, result);
    return (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) && !stop_ &&
           std::chrono::steady_clock::now() < deadline;
  }

  // Reads more into s.in; false at the end of the connection, an error, the deadline or a stop.
  bool Fill(Stream& s) {
    char buf[16 * 1024];
    while (true) {
      int n = SSL_read(s.ssl, buf, sizeof buf);
      if (n > 0) {
        s.in.append(buf, static_cast<size_t>(n));
        return true;
      }
      if (!Retry(s.ssl, n, s.deadline)) {
        s.ended = true;
        return false;
      }
    }
  }
  bool Write(Stream& s, std::string_view data) {
    const auto deadline = std::chrono::steady_clock::now() + kIdle;
    while (!data.empty()) {
      int n = SSL_write(s.ssl, data.data(), static_cast<int>(data.size()));
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else if (!Retry(s.ssl, n, deadline)) {
        return false;
      }
    }
    return true;
  }
  // Takes the next line (without its CRLF); false when there is none within 8 KiB.
  bool TakeLine(Stream& s, std::string& line) {
    size_t end;
    while ((end = s.in.find("\r\n")) == std::string::npos) {
      if (s.in.size() > 8192 || !Fill(s)) return false;
    }
    line = s.in.substr(0, end);
    s.in.erase(0, end + 2);
    return true;
  }
  bool Take(Stream& s, size_t n, std::string& out) {
    while (s.in.size() < n) {
      if (!Fill(s)) return false;
    }
    out.append(s.in, 0, n);
    s.in.erase(0, n);
    return true;
  }
  // A chunked body, de-chunked (extensions and trailers read and dropped).
  bool TakeChunked(Stream& s, std::string& body) {
    while (true) {
      std::string line;
      if (!TakeLine(s, line)) return false;
      const std::string_view digits = Trim(std::string_view(line).substr(0, line.find(';')));
      if (digits.empty() || digits.size() > 15 ||
          digits.find_first_not_of("0123456789abcdefABCDEF") != std::string_view::npos) {
        return false;
      }
      const size_t size = std::stoull(std::string(digits), nullptr, 16);
      if (size == 0) break;
      std::string crlf;
      if (!Take(s, size, body) || !TakeLine(s, crlf) || !crlf.empty()) return false;
    }
    for (std::string trailer; TakeLine(s, trailer) && !trailer.empty();) {
    }
    return true;
  }

  void Serve(int fd) {
    Ssl ssl(SSL_new(base_.get()), SSL_free);
    if (!ssl || SSL_set_fd(ssl.get(), fd) != 1) return;
    const auto handshake_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (true) {
      int r = SSL_accept(ssl.get());
      if (r == 1) break;
      if (!Retry(ssl.get(), r, handshake_deadline)) return;
    }
    ++handshakes_;
    const char* sni = SSL_get_servername(ssl.get(), TLSEXT_NAMETYPE_host_name);
    const std::string name = sni ? sni : "";
    const Site& site = sites_.at(name);
    Stream s{ssl.get(), "", {}};
    while (true) {
      s.deadline = std::chrono::steady_clock::now() + kIdle;
      size_t end;
      while ((end = s.in.find("\r\n\r\n")) == std::string::npos) {
        if (s.in.size() > kMaxHeadBytes || !Fill(s)) return;
      }
      Request request;
      request.name = name;
      request.head = s.in.substr(0, end + 4);
      s.in.erase(0, end + 4);
      const bool parsed = ParseHead(request);
      const bool expects_continue = IEquals(Field(request, "Expect").value_or(""), "100-continue");
      if (parsed && expects_continue && !Write(s, "HTTP/1.1 100 Continue\r\n\r\n")) return;
      const bool body_read = parsed && ReadBody(s, request);
      {
        std::lock_guard lock(mu_);
        requests_.push_back(request);
      }
      if (!body_read) {
        // A request that is malformed, rather than cut short: a 400, and the connection ends.
        if (!s.ended) (void)Send(s, Response{400, {}, "bad request\n"}, name, false, true);
        return;
      }
      const bool close = IEquals(Field(request, "Connection").value_or(""), "close") ||
                         request.head.find(" HTTP/1.0\r\n") != std::string::npos;
      const size_t query = request.target.find('?');
      const bool chunked =
          query != std::string::npos &&
          ("&" + request.target.substr(query + 1) + "&").find("&chunked=1&") != std::string::npos;
      if (!Send(s, Answer(site.behaviour, request, port_), name, chunked, close) || close) {
        SSL_shutdown(ssl.get());
        return;
      }
    }
  }

  // Reads the request line and the header lines out of r.head; false when it is no request.
  static bool ParseHead(Request& r) {
    std::string_view head(r.head);
    head.remove_suffix(4);
    const size_t line_end = head.find("\r\n");
    const std::string_view line = head.substr(0, line_end);
    const size_t sp1 = line.find(' ');
    const size_t sp2 = line.rfind(' ');
    if (sp1 == std::string_view::npos || sp1 == sp2 || !line.substr(sp2 + 1).starts_with("HTTP/")) {
      return false;
    }
    r.method = line.substr(0, sp1);
    r.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    if (line_end != std::string_view::npos) {
      for (std::string_view rest = head.substr(line_end + 2); !rest.empty();) {
        const size_t end = rest.find("\r\n");
        const std::string_view field = rest.substr(0, end);
        if (field.find(':') == std::string_view::npos) return false;
        r.header_lines.emplace_back(field);
        rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 2);
      }
    }
    r.host = Field(r, "Host").value_or("");
    return true;
  }

  // The body by its framing: chunked, Content-Length, or none.
  bool ReadBody(Stream& s, Request& r) {
    if (auto te = Field(r, "Transfer-Encoding")) {
      return IEquals(*te, "chunked") && !Field(r, "Content-Length") && TakeChunked(s, r.body);
    }
    if (auto length = Field(r, "Content-Length")) {
      if (length->empty() || length->size() > 15 ||
          length->find_first_not_of("0123456789") != std::string::npos) {
        return false;
      }
      return Take(s, std::stoull(*length), r.body);
    }
    return true;
  }

  static bool Authorized(const Request& r, const std::string& token) {
    if (Field(r, "X-Api-Key") == token) return true;
    for (const std::string& line : r.header_lines) {
      const size_t colon = line.find(':');
      if (!IEquals(std::string_view(line).substr(0, colon), "Authorization")) continue;
      const std::string_view value = Trim(std::string_view(line).substr(colon + 1));
      const size_t space = value.find(' ');
      const std::string_view scheme = value.substr(0, space);
      const std::string_view credentials =
          space == std::string_view::npos ? "" : Trim(value.substr(space + 1));
      if (IEquals(scheme, "Bearer") && credentials == token) return true;
      if (IEquals(scheme, "Basic")) {
        const std::string user_pass = Base64Decode(credentials);
        const size_t sep = user_pass.find(':');
        if (sep != std::string::npos && user_pass.substr(sep + 1) == token) return true;
      }
    }
    return false;
  }

  static Response Answer(const Behaviour& behaviour, const Request& r, uint16_t port) {
    const std::string path = r.target.substr(0, r.target.find('?'));
    Response bytes;
    const bool wants_bytes = r.method == "GET" && path.starts_with("/bytes/") && path.size() > 7 &&
                             path.size() <= 7 + 15 &&
                             path.find_first_not_of("0123456789", 7) == std::string::npos;
    if (wants_bytes) bytes.zero_bytes = std::stoull(path.substr(7));

    if (auto* api = std::get_if<Api>(&behaviour)) {
      if (!Authorized(r, api->expected_token)) {
        return Response{401, {"WWW-Authenticate: Bearer"}, "bad token"};
      }
      if (wants_bytes) return bytes;
      return Response{200, {}, "ok " + r.name};
    }
    if (auto* redirect = std::get_if<Redirect>(&behaviour)) {
      std::string location = redirect->location;
      if (size_t at = location.find("{port}"); at != std::string::npos) {
        location.replace(at, 6, std::to_string(port));
      }
      return Response{302, {"Location: " + location}, ""};
    }
    if (wants_bytes) return bytes;
    Response echo{200, {}, r.head + r.body};
    // GET /gzip: the echo claims a gzip body (it is not), for a client that must refuse it.
    if (path == "/gzip") echo.headers.push_back("Content-Encoding: gzip");
    for (const std::string& line : r.header_lines) {
      const size_t colon = line.find(':');
      echo.headers.push_back("X-Echo-" + line.substr(0, colon) + ": " +
                             std::string(Trim(std::string_view(line).substr(colon + 1))));
    }
    return echo;
  }

  bool Send(Stream& s, const Response& response, const std::string& name, bool chunked,
            bool close) {
    static const std::map<int, std::string> kReasons = {
        {200, "OK"}, {302, "Found"}, {400, "Bad Request"}, {401, "Unauthorized"}};
    const size_t size = response.zero_bytes ? response.zero_bytes : response.body.size();
    std::string head =
        "HTTP/1.1 " + std::to_string(response.status) + " " + kReasons.at(response.status) +
        "\r\nX-Fake-Site: " + name +
        "\r\nContent-Type: " + (response.zero_bytes ? "application/octet-stream" : "text/plain") +
        "\r\n";
    for (const std::string& h : response.headers) head += h + "\r\n";
    head += chunked ? "Transfer-Encoding: chunked\r\n"
                    : "Content-Length: " + std::to_string(size) + "\r\n";
    if (close) head += "Connection: close\r\n";
    head += "\r\n";
    if (!Write(s, head)) return false;
    auto piece = [&](std::string_view data) {
      if (!chunked) return Write(s, data);
      char size_line[32];
      std::snprintf(size_line, sizeof size_line, "%zx\r\n", data.size());
      return Write(s, size_line) && Write(s, data) && Write(s, "\r\n");
    };
    if (response.zero_bytes) {
      static const std::string kZeros(256 * 1024, '\0');
      for (size_t left = size; left > 0;) {
        const size_t n = std::min(left, kZeros.size());
        if (!piece(std::string_view(kZeros).substr(0, n))) return false;
        left -= n;
      }
    } else if (chunked) {
      // In three chunks where there is enough, so that a client's de-chunking is exercised.
      const std::string_view body(response.body);
      const size_t third = (body.size() + 2) / 3;
      for (size_t at = 0; at < body.size(); at += third) {
        if (!piece(body.substr(at, third))) return false;
      }
    } else if (!Write(s, response.body)) {
      return false;
    }
    return !chunked || Write(s, "0\r\n\r\n");
  }

  bool Find(const std::string* name, std::string_view s) {
    std::lock_guard lock(mu_);
    return std::any_of(requests_.begin(), requests_.end(), [&](const Request& r) {
      return (!name || r.name == *name) &&
             (r.head.find(s) != std::string::npos || r.body.find(s) != std::string::npos);
    });
  }

  const std::string address_;
  std::string error_;
  std::string dir_;
  std::string ca_file_;
  std::unique_ptr<net::CertificateAuthority> ca_;
  std::map<std::string, Site> sites_;  // read-only once the acceptor runs
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> base_{nullptr, SSL_CTX_free};
  UniqueFd listener_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::atomic<int> handshakes_{0};
  std::thread acceptor_;
  std::list<Connection> connections_;  // the acceptor's own until it is joined
  std::mutex mu_;
  std::vector<Request> requests_;
};

}  // namespace airlock::testing
