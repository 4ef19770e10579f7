#include "net/egress_proxy.h"

#include <linux/netfilter_ipv4.h>
#include <linux/netfilter_ipv6/ip6_tables.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <boost/asio/async_result.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "common/on_pool.h"
#include "net/tls_client_hello.h"

namespace airlock::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kChunkBytes = 16 * 1024;
constexpr auto kLingerTimeout = std::chrono::seconds(2);  // after a refusal, before close
constexpr size_t kMaxLingerBytes = 1u << 20;

IpAddress Unmap(const IpAddress& ip) {
  if (ip.is_v6() && ip.to_v6().is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, ip.to_v6());
  }
  return ip;
}

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

bool IsTokenChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

// --- HTTP request heads (RFC 9112), strictly: anything ambiguous is refused ---

struct HttpHead {
  std::string method;
  std::string target;
  std::string version;
  std::vector<std::pair<std::string, std::string>> headers;

  // The values of a header, by case-insensitive name.
  std::vector<std::string_view> Values(std::string_view name) const {
    std::vector<std::string_view> out;
    for (const auto& [k, v] : headers) {
      if (IEquals(k, name)) out.push_back(v);
    }
    return out;
  }
};

// `head` is the request up to and including the blank line.
Result<HttpHead> ParseHead(std::string_view head) {
  auto bad = [](std::string what) { return Fail(ErrorCode::kInvalidArgument, std::move(what)); };
  for (size_t i = 0; i < head.size(); ++i) {
    // Bare CR or LF and NUL are how requests get smuggled past one parser and not another.
    if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r')) return bad("bare LF in request");
    if (head[i] == '\r' && (i + 1 >= head.size() || head[i + 1] != '\n')) {
      return bad("bare CR in request");
    }
    if (head[i] == '\0') return bad("NUL in request");
  }
  HttpHead out;
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return bad("malformed request line");
  }
  out.method = std::string(line.substr(0, sp1));
  out.target = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
  out.version = std::string(line.substr(sp2 + 1));
  if (out.method.empty() || out.target.empty()) return bad("malformed request line");
  for (char c : out.method) {
    if (!IsTokenChar(c)) return bad("malformed method");
  }
  for (char c : out.target) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      return bad("malformed request target");
    }
  }
  if (out.version != "HTTP/1.1" && out.version != "HTTP/1.0") return bad("not HTTP/1.x");
  size_t pos = eol + 2;
  while (pos < head.size()) {
    size_t end = head.find("\r\n", pos);
    std::string_view h = head.substr(pos, end - pos);
    pos = end + 2;
    if (h.empty()) break;
    if (h[0] == ' ' || h[0] == '\t') return bad("folded header line");
    size_t colon = h.find(':');
    if (colon == std::string_view::npos || colon == 0) return bad("malformed header line");
    std::string_view name = h.substr(0, colon);
    for (char c : name) {
      if (!IsTokenChar(c)) return bad("malformed header name");
    }
    std::string_view value = h.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    for (char c : value) {
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
        return bad("control character in a header value");
      }
    }
    out.headers.emplace_back(std::string(name), std::string(value));
  }
  return out;
}

// "host", "host:port", "[v6]", "[v6]:port". nullopt for anything else.
struct Authority {
  std::string host;  // without brackets
  std::optional<uint16_t> port;
};
std::optional<Authority> SplitAuthority(std::string_view text) {
  Authority out;
  std::string_view rest;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    out.host = std::string(text.substr(1, close - 1));
    rest = text.substr(close + 1);
    if (out.host.find(':') == std::string::npos) return std::nullopt;
  } else {
    size_t colon = text.find(':');
    out.host = std::string(text.substr(0, colon));
    if (colon != std::string_view::npos) rest = text.substr(colon);
    if (out.host.find_first_of("[]@/?#\\") != std::string::npos) return std::nullopt;
  }
  if (out.host.empty()) return std::nullopt;
  if (!rest.empty()) {
    if (rest[0] != ':' || rest.size() < 2 || rest.size() > 6) return std::nullopt;
    unsigned port = 0;
    for (char c : rest.substr(1)) {
      if (c < '0' || c > '9') return std::nullopt;
      port = port * 10 + static_cast<unsigned>(c - '0');
    }
    if (port == 0 || port > 65535) return std::nullopt;
    out.port = static_cast<uint16_t>(port);
  }
  return out;
}

// Two spellings of one host: addresses compare as addresses, names after normalising.
bool SameHost(std::string_view a, std::string_view b) {
  auto ia = ParseIpLiteral(a);
  auto ib = ParseIpLiteral(b);
  if (ia || ib) return ia && ib && Unmap(*ia) == Unmap(*ib);
  auto na = NormaliseName(a);
  auto nb = NormaliseName(b);
  return na && nb && *na == *nb;
}

std::string HttpReply(int status, std::string_view phrase, std::string_view body) {
  std::string text = "airlock egress: " + std::string(body) + "\n";
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(phrase) +
         "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
         std::to_string(text.size()) + "\r\nConnection: close\r\n\r\n" + text;
}

}  // namespace

std::string_view KindName(EgressEvent::Kind kind) {
  switch (kind) {
    case EgressEvent::Kind::kConnect:
      return "connect";
    case EgressEvent::Kind::kHttp:
      return "http";
    case EgressEvent::Kind::kTls:
      return "tls";
  }
  return "connect";
}

std::optional<tcp::endpoint> OriginalDestination(tcp::socket& socket) {
  error_code ec;
  tcp::endpoint local = socket.local_endpoint(ec);
  if (ec) return std::nullopt;
  sockaddr_storage storage{};
  socklen_t len = sizeof(storage);
  const bool v6 = local.address().is_v6() && !local.address().to_v6().is_v4_mapped();
  int rc = v6 ? getsockopt(socket.native_handle(), SOL_IPV6, IP6T_SO_ORIGINAL_DST, &storage, &len)
              : getsockopt(socket.native_handle(), SOL_IP, SO_ORIGINAL_DST, &storage, &len);
  if (rc != 0) return std::nullopt;  // ENOENT: not a redirected connection
  tcp::endpoint original;
  if (storage.ss_family == AF_INET) {
    const auto* sin = reinterpret_cast<const sockaddr_in*>(&storage);
    original = tcp::endpoint(asio::ip::address_v4(ntohl(sin->sin_addr.s_addr)), ntohs(sin->sin_port));
  } else if (storage.ss_family == AF_INET6) {
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    asio::ip::address_v6::bytes_type bytes;
    std::memcpy(bytes.data(), &sin6->sin6_addr, 16);
    original = tcp::endpoint(asio::ip::address_v6(bytes), ntohs(sin6->sin6_port));
  } else {
    return std::nullopt;
  }
  if (Unmap(original.address()) == Unmap(local.address()) && original.port() == local.port()) {
    return std::nullopt;
  }
  return original;
}

// One client connection and, once allowed, its upstream.
struct Connection {
  Connection(asio::io_context& io, tcp::socket s)
      : client(std::move(s)), upstream(io), timer(io) {}

  uint64_t id = 0;
  tcp::socket client;
  tcp::socket upstream;
  asio::steady_timer timer;  // the watchdog's
  Clock::time_point deadline;
  NetworkPolicy policy;
  std::optional<tcp::endpoint> original;
  EgressEvent event;  // what is known so far; the closing event is sent from it
  bool closed = false;
  int pumps = 0;  // pump coroutines still running

  // Set once connected, under State::mu: what Recheck judges again.
  bool connected = false;
  bool by_address = false;  // the destination was an IP literal, checked with CheckAddress
};

struct EgressProxy::State : std::enable_shared_from_this<EgressProxy::State> {
  State(asio::io_context& io_in, ProxyHooks hooks_in, ProxyLimits limits_in)
      : io(io_in), acceptor(io_in), hooks(std::move(hooks_in)), limits(limits_in) {}

  asio::io_context& io;
  tcp::acceptor acceptor;
  ProxyHooks hooks;
  ProxyLimits limits;
  asio::thread_pool pool{2};  // resolve() may block
  uint16_t listen_port = 0;

  mutable std::mutex mu;  // guards the members below
  bool stopping = false;
  uint64_t next_id = 1;
  std::map<uint64_t, std::shared_ptr<Connection>> connections;
  std::map<IpAddress, size_t> per_client;

  void Emit(const EgressEvent& event) {
    if (hooks.on_event) hooks.on_event(event);
  }

  // Moves the watchdog's deadline (earlier or later). io thread.
  static void SetDeadline(Connection& c, Clock::duration from_now) {
    Clock::time_point t = Clock::now() + from_now;
    bool earlier = t < c.deadline;
    c.deadline = t;
    if (earlier) c.timer.cancel();
  }

  // Ends a connection: sockets closed (pending operations fail), the closing event sent once.
  // io thread.
  void Close(const std::shared_ptr<Connection>& c) {
    if (c->closed) return;
    c->closed = true;
    error_code ignored;
    c->client.shutdown(tcp::socket::shutdown_both, ignored);
    c->client.close(ignored);
    c->upstream.close(ignored);
    c->timer.cancel();
    {
      std::lock_guard lock(mu);
      connections.erase(c->id);
      auto it = per_client.find(c->event.client);
      if (it != per_client.end() && --it->second == 0) per_client.erase(it);
    }
    if (c->connected) {
      EgressEvent done = c->event;
      done.phase = EgressEvent::Phase::kClosed;
      Emit(done);
    }
  }

  asio::awaitable<void> Accept() {
    auto self = shared_from_this();
    while (true) {
      error_code ec;
      tcp::socket socket = co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
        // Out of descriptors and the like: wait a moment rather than spin.
        asio::steady_timer pause(io, std::chrono::milliseconds(50));
        co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      tcp::endpoint peer = socket.remote_endpoint(ec);
      if (ec) continue;
      const IpAddress client = Unmap(peer.address());
      std::optional<NetworkPolicy> policy = hooks.policy_for(client);
      if (!policy) continue;  // not a sandbox: the socket closes here
      auto c = std::make_shared<Connection>(io, std::move(socket));
      c->policy = std::move(*policy);
      c->event.client = client;
      bool over = false;
      {
        std::lock_guard lock(mu);
        over = stopping || connections.size() >= limits.max_connections ||
               per_client[client] >= limits.max_connections_per_client;
        if (!over) {
          c->id = next_id++;
          connections.emplace(c->id, c);
          ++per_client[client];
        } else if (per_client[client] == 0) {
          per_client.erase(client);
        }
      }
      if (over) {
        EgressEvent refused;
        refused.client = client;
        refused.rule = "limit";
        refused.reason = "too many open connections";
        Emit(refused);
        continue;
      }
      asio::co_spawn(io, Serve(self, c), asio::detached);
    }
  }

  asio::awaitable<void> Watchdog(std::shared_ptr<State> self, std::shared_ptr<Connection> c) {
    while (!c->closed) {
      c->timer.expires_at(c->deadline);
      error_code ec;
      co_await c->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (c->closed) break;
      if (Clock::now() >= c->deadline) self->Close(c);
    }
  }

  // Sends a refusal (HTTP clients: a status and a sentence; TLS clients: nothing), then closes
  // after a short lingering read so the answer is not lost to a reset.
  asio::awaitable<void> Refuse(std::shared_ptr<Connection> c, std::string reply) {
    error_code ec;
    if (!reply.empty()) {
      SetDeadline(*c, kLingerTimeout);
      co_await asio::async_write(c->client, asio::buffer(reply),
                                 asio::redirect_error(asio::use_awaitable, ec));
      c->client.shutdown(tcp::socket::shutdown_send, ec);
      std::vector<char> sink(kChunkBytes);
      for (size_t drained = 0; !ec && !c->closed && drained < kMaxLingerBytes;) {
        drained += co_await c->client.async_read_some(asio::buffer(sink),
                                                      asio::redirect_error(asio::use_awaitable, ec));
      }
    }
    Close(c);
  }

  void Deny(Connection& c, const Verdict& v) {
    c.event.allowed = false;
    c.event.rule = v.rule;
    c.event.reason = v.reason;
    Emit(c.event);
  }

  asio::awaitable<void> Serve(std::shared_ptr<State> self, std::shared_ptr<Connection> c) {
    c->deadline = Clock::now() + limits.first_request_timeout;
    asio::co_spawn(io, Watchdog(self, c), asio::detached);
    c->original = hooks.original_destination ? hooks.original_destination(c->client)
                                             : OriginalDestination(c->client);
    const bool transparent = c->original.has_value();

    // 1. The head: a TLS ClientHello (transparent only) or an HTTP request head.
    std::string buf;
    std::vector<char> chunk(kChunkBytes);
    error_code ec;
    bool tls = false;
    size_t head_end = 0;
    ClientHelloScan hello;
    while (true) {
      size_t n = co_await c->client.async_read_some(asio::buffer(chunk),
                                                    asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        Close(c);  // EOF, timeout or reset before a whole head: nothing to answer
        co_return;
      }
      buf.append(chunk.data(), n);
      if (transparent && LooksLikeTls(buf)) {
        tls = true;
        hello = ScanClientHello(buf);
        if (hello.state != ClientHelloScan::State::kNeedMore) break;
      } else if (size_t end = buf.find("\r\n\r\n"); end != std::string::npos) {
        head_end = end + 4;
        if (head_end <= limits.max_header_bytes) break;
      }
      if (buf.size() > limits.max_header_bytes) {
        if (tls) {
          Close(c);
        } else {
          std::string reply = HttpReply(431, "Request Header Fields Too Large",
                                        "request head over " +
                                            std::to_string(limits.max_header_bytes) + " bytes");
          co_await Refuse(c, reply);
        }
        co_return;
      }
    }

    // 2. The destination: a name or an address, and a port.
    std::string host;
    uint16_t port = 0;
    std::string forward;  // the bytes to send upstream first
    uint64_t body_left = 0;
    bool inspect_tls = false;  // CONNECT: a ClientHello inside must name the same host
    EgressEvent& ev = c->event;
    if (tls) {
      ev.kind = EgressEvent::Kind::kTls;
      port = c->original->port();
      ev.port = port;
      if (hello.state == ClientHelloScan::State::kInvalid || hello.sni.empty()) {
        ev.name = hello.sni;
        Deny(*c, Verdict{false, "sni",
                         hello.sni.empty() && hello.state != ClientHelloScan::State::kInvalid
                             ? "TLS ClientHello without a server name (SNI)"
                             : "malformed TLS ClientHello: " + hello.error});
        Close(c);
        co_return;
      }
      ev.sni = hello.sni;
      host = hello.sni;
      forward = buf;
      if (ParseIpLiteral(host) || LooksLikeIpv4(host)) {
        ev.name = host;
        Deny(*c, Verdict{false, "sni", "TLS server name " + host + " is an address, not a name"});
        Close(c);
        co_return;
      }
    } else {
      auto head = ParseHead(std::string_view(buf).substr(0, head_end));
      std::string refusal;
      auto refuse = [&refusal](int status, std::string_view phrase, std::string_view why) {
        refusal = HttpReply(status, phrase, why);
      };
      std::optional<Authority> target;
      std::string path;
      std::vector<std::string_view> hosts;
      if (!head) {
        refuse(400, "Bad Request", head.error().message());
      } else {
        hosts = head->Values("host");
        if (hosts.size() > 1) refuse(400, "Bad Request", "more than one Host header");
        if (!hosts.empty()) ev.host = std::string(hosts[0]);
      }
      if (refusal.empty() && head->method == "CONNECT") {
        ev.kind = EgressEvent::Kind::kConnect;
        target = SplitAuthority(head->target);
        if (transparent) {
          refuse(400, "Bad Request", "CONNECT is for the explicit proxy");
        } else if (!target || !target->port) {
          refuse(400, "Bad Request", "CONNECT needs host:port");
        }
        inspect_tls = true;
        forward = buf.substr(head_end);  // bytes the client sent ahead of our 200
      } else if (refusal.empty()) {
        ev.kind = EgressEvent::Kind::kHttp;
        std::string_view t = head->target;
        if (t.size() > 7 && IEquals(t.substr(0, 7), "http://")) {
          std::string_view rest = t.substr(7);
          size_t slash = rest.find_first_of("/?#");
          target = SplitAuthority(rest.substr(0, slash));
          path = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
          if (!path.empty() && path[0] != '/') path = "/" + path;
          if (rest.substr(0, slash).find('@') != std::string_view::npos) {
            refuse(400, "Bad Request", "user information in a URL is not accepted");
          } else if (!target) {
            refuse(400, "Bad Request", "malformed URL authority");
          } else if (auto h = hosts.empty() ? std::nullopt : SplitAuthority(hosts[0]);
                     !hosts.empty() && (!h || !SameHost(h->host, target->host))) {
            refuse(403, "Forbidden", "the Host header differs from the URL's host");
          }
        } else if (t.size() > 8 && IEquals(t.substr(0, 8), "https://")) {
          refuse(400, "Bad Request", "send https through CONNECT");
        } else if (!transparent) {
          refuse(400, "Bad Request",
                 "this is an egress proxy: send CONNECT host:port or an absolute http:// URL");
        } else if (t[0] != '/') {
          refuse(400, "Bad Request", "malformed request target");
        } else if (hosts.empty()) {
          refuse(400, "Bad Request", "no Host header");
        } else {
          target = SplitAuthority(hosts[0]);
          path = std::string(t);
          if (!target) refuse(400, "Bad Request", "malformed Host header");
        }
        if (refusal.empty() && !head->Values("transfer-encoding").empty()) {
          refuse(501, "Not Implemented", "request bodies with Transfer-Encoding are not supported");
        }
        auto lengths = head->Values("content-length");
        if (refusal.empty() && lengths.size() > 1) {
          refuse(400, "Bad Request", "more than one Content-Length header");
        } else if (refusal.empty() && lengths.size() == 1) {
          std::string_view v = lengths[0];
          bool ok = !v.empty() && v.size() <= 15;
          for (char ch : v) ok = ok && ch >= '0' && ch <= '9';
          if (!ok) {
            refuse(400, "Bad Request", "malformed Content-Length");
          } else {
            body_left = std::stoull(std::string(v));
          }
        }
        if (refusal.empty()) {
          // Origin-form, Host from the target, one request per connection.
          forward = head->method + " " + path + " HTTP/1.1\r\n";
          forward += "Host: " +
                     (target->host.find(':') != std::string::npos ? "[" + target->host + "]"
                                                                   : target->host) +
                     (target->port ? ":" + std::to_string(*target->port) : "") + "\r\n";
          for (const auto& [k, v] : head->headers) {
            if (IEquals(k, "host") || IEquals(k, "connection") || IEquals(k, "proxy-connection") ||
                IEquals(k, "keep-alive") || IEquals(k, "proxy-authorization") ||
                IEquals(k, "upgrade")) {
              continue;
            }
            forward += k + ": " + v + "\r\n";
          }
          forward += "Connection: close\r\n\r\n";
          std::string_view body = std::string_view(buf).substr(head_end);
          body = body.substr(0, std::min<uint64_t>(body.size(), body_left));
          forward += body;
          body_left -= body.size();
        }
      }
      if (refusal.empty()) {
        host = target->host;
        if (transparent) {
          port = c->original->port();
          if (target->port && *target->port != port) {
            ev.name = host;
            ev.port = port;
            Deny(*c, Verdict{false, "port",
                             "the Host header's port differs from the port dialled (" +
                                 std::to_string(port) + ")"});
            refuse(403, "Forbidden", c->event.reason);
          }
        } else {
          port = target->port.value_or(80);
        }
      }
      if (!refusal.empty()) {
        if (c->event.rule.empty()) {  // not yet reported as a policy denial
          std::string why = refusal.substr(refusal.rfind("egress: ") + 8);
          if (!why.empty() && why.back() == '\n') why.pop_back();
          Deny(*c, Verdict{false, "malformed", why});
        }
        co_await Refuse(c, refusal);
        co_return;
      }
    }
    ev.port = port;

    // 3. The verdict, and the addresses to dial.
    std::vector<IpAddress> addresses;
    Verdict verdict;
    ev.name = host;
    if (auto literal = ParseIpLiteral(host)) {
      c->by_address = true;
      verdict = c->policy.CheckAddress(*literal, port);
      ev.dest = *literal;
      addresses.push_back(Unmap(*literal));
    } else {
      if (auto normal = NormaliseName(host)) ev.name = *normal;
      verdict = c->policy.CheckName(host, port);
      if (verdict.allowed) {
        auto resolve = [this, name = ev.name] { return hooks.resolve(name); };
        Result<std::vector<IpAddress>> resolved = co_await OnPool(pool, resolve);
        if (!resolved || resolved->empty()) {
          verdict = Verdict{false, "resolve",
                            "cannot resolve " + ev.name +
                                (resolved ? std::string(": no addresses")
                                          : ": " + resolved.error().message())};
        } else {
          std::optional<Verdict> first_denial;
          for (const auto& ip : *resolved) {
            Verdict v = c->policy.CheckResolved(verdict, ip, port);
            if (v.allowed) {
              addresses.push_back(Unmap(ip));
            } else if (!first_denial) {
              first_denial = v;
              ev.dest = ip;
            }
          }
          if (addresses.empty()) verdict = *first_denial;
        }
      }
    }
    if (c->closed) co_return;  // timed out or rechecked meanwhile
    if (!verdict.allowed) {
      Deny(*c, verdict);
      if (tls) {
        Close(c);
      } else {
        std::string reply = HttpReply(verdict.rule == "resolve" ? 502 : 403,
                                      verdict.rule == "resolve" ? "Bad Gateway" : "Forbidden",
                                      verdict.reason);
        co_await Refuse(c, reply);
      }
      co_return;
    }

    // 4. Connect: the first address that answers, never the one a transparent client chose.
    SetDeadline(*c, limits.connect_timeout);
    bool connected = false;
    for (const auto& ip : addresses) {
      error_code cec;
      c->upstream.close(cec);
      if (hooks.open_socket) {
        auto fd = hooks.open_socket(ip.is_v4() ? AF_INET : AF_INET6, SOCK_STREAM);
        if (!fd) continue;
        c->upstream.assign(ip.is_v4() ? tcp::v4() : tcp::v6(), fd->get(), cec);
        if (cec) continue;
        (void)fd->Release();
      }
      co_await c->upstream.async_connect(tcp::endpoint(ip, port),
                                         asio::redirect_error(asio::use_awaitable, cec));
      if (c->closed) co_return;
      if (!cec) {
        connected = true;
        ev.dest = ip;
        break;
      }
    }
    ev.allowed = true;
    ev.rule = verdict.rule;
    ev.reason = verdict.reason;
    Emit(ev);
    if (!connected) {
      if (tls) {
        Close(c);
      } else {
        std::string reply = HttpReply(502, "Bad Gateway", "cannot connect to " + HostPort(host, port));
        co_await Refuse(c, reply);
      }
      co_return;
    }
    {
      std::lock_guard lock(mu);
      c->connected = true;
    }
    SetDeadline(*c, limits.idle_timeout);

    // 5. Splice.
    if (ev.kind == EgressEvent::Kind::kConnect) {
      static constexpr std::string_view kEstablished = "HTTP/1.1 200 Connection established\r\n\r\n";
      co_await asio::async_write(c->client, asio::buffer(kEstablished),
                                 asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        Close(c);
        co_return;
      }
    }
    c->pumps = 2;
    const bool http = ev.kind == EgressEvent::Kind::kHttp;
    asio::co_spawn(io, PumpUp(self, c, std::move(forward), http, body_left,
                              inspect_tls && !c->by_address),
                   asio::detached);
    asio::co_spawn(io, PumpDown(self, c, http), asio::detached);
  }

  // Sandbox -> destination. `budget`: HTTP forwards only the declared body, then stops reading.
  // `inspect`: a CONNECT tunnel whose first bytes, if TLS, must name the CONNECT host.
  // `self` keeps the state alive while the pump runs.
  asio::awaitable<void> PumpUp([[maybe_unused]] std::shared_ptr<State> self, std::shared_ptr<Connection> c,
                               std::string first, bool http, uint64_t budget, bool inspect) {
    error_code ec;
    std::vector<char> chunk(kChunkBytes);
    std::string pending = std::move(first);
    while (inspect && !c->closed) {
      if (!pending.empty() && !LooksLikeTls(pending)) break;  // not TLS: nothing to compare
      if (!pending.empty()) {
        ClientHelloScan scan = ScanClientHello(pending);
        if (scan.state == ClientHelloScan::State::kComplete && SameHost(scan.sni, c->event.name)) {
          c->event.sni = scan.sni;
          break;
        }
        if (scan.state == ClientHelloScan::State::kComplete && scan.sni.empty()) break;
        if (scan.state != ClientHelloScan::State::kNeedMore ||
            pending.size() > limits.max_header_bytes) {
          c->event.sni = scan.sni;
          Verdict v{false, "sni",
                    scan.state == ClientHelloScan::State::kInvalid
                        ? "malformed TLS ClientHello in the tunnel: " + scan.error
                        : "TLS server name " + scan.sni + " differs from the CONNECT host " +
                              c->event.name};
          Deny(*c, v);
          Close(c);
          co_return;
        }
      }
      size_t n = co_await c->client.async_read_some(asio::buffer(chunk),
                                                    asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      pending.append(chunk.data(), n);
      SetDeadline(*c, limits.idle_timeout);
    }
    if (!pending.empty() && !c->closed) {
      co_await asio::async_write(c->upstream, asio::buffer(pending),
                                 asio::redirect_error(asio::use_awaitable, ec));
      c->event.bytes_up += pending.size();
    }
    while (!ec && !c->closed && (!http || budget > 0)) {
      size_t want = http ? std::min<uint64_t>(budget, chunk.size()) : chunk.size();
      size_t n = co_await c->client.async_read_some(asio::buffer(chunk.data(), want),
                                                    asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      SetDeadline(*c, limits.idle_timeout);
      co_await asio::async_write(c->upstream, asio::buffer(chunk.data(), n),
                                 asio::redirect_error(asio::use_awaitable, ec));
      c->event.bytes_up += n;
      if (http) budget -= n;
    }
    if (ec == asio::error::eof && !c->closed) {
      error_code ignored;
      c->upstream.shutdown(tcp::socket::shutdown_send, ignored);  // pass the half-close on
    } else if (ec && !http) {
      Close(c);
    }
    if (--c->pumps == 0) Close(c);
  }

  // Destination -> sandbox. For HTTP the response's end ends the connection.
  asio::awaitable<void> PumpDown([[maybe_unused]] std::shared_ptr<State> self, std::shared_ptr<Connection> c,
                                 bool http) {
    error_code ec;
    std::vector<char> chunk(kChunkBytes);
    while (!c->closed) {
      size_t n = co_await c->upstream.async_read_some(asio::buffer(chunk),
                                                      asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      SetDeadline(*c, limits.idle_timeout);
      co_await asio::async_write(c->client, asio::buffer(chunk.data(), n),
                                 asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      c->event.bytes_down += n;
    }
    if (ec == asio::error::eof && !c->closed && !http) {
      error_code ignored;
      c->client.shutdown(tcp::socket::shutdown_send, ignored);
      if (--c->pumps == 0) Close(c);
      co_return;
    }
    --c->pumps;
    Close(c);
  }
};

Result<std::unique_ptr<EgressProxy>> EgressProxy::Start(asio::io_context& io,
                                                        const tcp::endpoint& listen,
                                                        ProxyHooks hooks, ProxyLimits limits) {
  AIRLOCK_CHECK(hooks.policy_for && hooks.resolve);
  auto state = std::make_shared<State>(io, std::move(hooks), limits);
  error_code ec;
  state->acceptor.open(listen.protocol(), ec);
  if (!ec) state->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) state->acceptor.bind(listen, ec);
  if (!ec) state->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Fail(CodeForErrno(ec.value()), "egress proxy: listening on " +
                                              listen.address().to_string() + ":" +
                                              std::to_string(listen.port()) + ": " + ec.message());
  }
  state->listen_port = state->acceptor.local_endpoint(ec).port();
  asio::co_spawn(io, [state]() { return state->Accept(); }, asio::detached);
  return std::unique_ptr<EgressProxy>(new EgressProxy(std::move(state)));
}

EgressProxy::~EgressProxy() { Stop(); }

uint16_t EgressProxy::port() const { return state_->listen_port; }

size_t EgressProxy::open_connections() const {
  std::lock_guard lock(state_->mu);
  return state_->connections.size();
}

size_t EgressProxy::Recheck(const IpAddress& raw_client) {
  const IpAddress client = Unmap(raw_client);
  std::optional<NetworkPolicy> policy = state_->hooks.policy_for(client);
  std::vector<std::pair<std::shared_ptr<Connection>, Verdict>> doomed;
  {
    std::lock_guard lock(state_->mu);
    for (const auto& [id, c] : state_->connections) {
      if (c->event.client != client || !c->connected || !c->event.dest) continue;
      Verdict v;
      if (!policy) {
        v = Verdict{false, "no-policy", "the sandbox no longer has a network policy"};
      } else if (c->by_address) {
        v = policy->CheckAddress(*c->event.dest, c->event.port);
      } else {
        v = policy->CheckResolved(policy->CheckName(c->event.name, c->event.port),
                                  *c->event.dest, c->event.port);
      }
      if (!v.allowed) doomed.emplace_back(c, std::move(v));
    }
  }
  for (auto& [c, v] : doomed) {
    asio::post(state_->io, [state = state_, c = c, v = v] {
      if (c->closed) return;
      EgressEvent event = c->event;
      event.phase = EgressEvent::Phase::kVerdict;
      event.allowed = false;
      event.rule = v.rule;
      event.reason = "policy changed: " + v.reason;
      state->Emit(event);
      state->Close(c);
    });
  }
  return doomed.size();
}

void EgressProxy::Stop() {
  asio::post(state_->io, [state = state_] {
    std::vector<std::shared_ptr<Connection>> all;
    {
      std::lock_guard lock(state->mu);
      state->stopping = true;
      for (const auto& [id, c] : state->connections) all.push_back(c);
    }
    error_code ignored;
    state->acceptor.close(ignored);
    for (const auto& c : all) state->Close(c);
  });
}

}  // namespace airlock::net
