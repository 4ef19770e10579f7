#include "net/egress_proxy.h"

#include <linux/netfilter_ipv4.h>
#include <linux/netfilter_ipv6/ip6_tables.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <boost/asio/async_result.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "common/on_pool.h"
#include "net/http_message.h"
#include "net/tls_authority.h"
#include "net/tls_client_hello.h"

namespace airlock::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;
using http::IEquals;

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

// The Host field for an authority: brackets around an IPv6 address, the port if it had one.
std::string HostField(const Authority& a) {
  std::string out = a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host;
  if (a.port) out += ":" + std::to_string(*a.port);
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

// The status a refusal is answered with, from its rule: the proxy's own rules first, then every
// rule of the policy is a 403.
int RefusalStatus(const Verdict& v) {
  if (v.rule == "malformed") return 400;
  if (v.rule == "too-large") return 431;
  if (v.rule == "resolve" || v.rule == "connect" || v.rule == "upstream" ||
      v.rule == "upstream-tls") {
    return 502;
  }
  return 403;
}

std::string_view StatusPhrase(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 403:
      return "Forbidden";
    case 431:
      return "Request Header Fields Too Large";
    case 502:
      return "Bad Gateway";
  }
  return "Error";
}

// Every refusal an HTTP client gets: the status, the rule in X-Airlock-Deny-Rule, the reason as a
// one-line body, in the words the verdict event carries.
std::string DenyReply(const Verdict& v) {
  const int status = RefusalStatus(v);
  const std::string text = "airlock egress: " + v.reason + "\n";
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(StatusPhrase(status)) +
         "\r\nContent-Type: text/plain; charset=utf-8\r\n" + std::string(kDenyRuleHeader) + ": " +
         v.rule + "\r\nContent-Length: " + std::to_string(text.size()) +
         "\r\nConnection: close\r\n\r\n" + text;
}

// How a destination was judged, so that Recheck and a reused connection judge it the same way.
enum class JudgedBy {
  kName,            // a name the proxy resolved: CheckName, then CheckResolved on the address
  kAddress,         // an address literal the client gave: CheckAddress
  kNameAndAddress,  // open mode, transparent: CheckName (if there is a name), CheckAddress on the
                    // original destination, which is what is dialled
};

struct Destination {
  JudgedBy by = JudgedBy::kName;
  std::string name;   // normalised (kNameAndAddress: "" without a Host or SNI name)
  IpAddress address;  // dialled, or about to be
  uint16_t port = 0;
};

Verdict Rejudge(const NetworkPolicy& policy, const Destination& d) {
  switch (d.by) {
    case JudgedBy::kAddress:
      return policy.CheckAddress(d.address, d.port);
    case JudgedBy::kName:
      return policy.CheckResolved(policy.CheckName(d.name, d.port), d.address, d.port);
    case JudgedBy::kNameAndAddress:
      if (!d.name.empty()) {
        Verdict by_name = policy.CheckName(d.name, d.port);
        if (!by_name.allowed) return by_name;
        Verdict by_address = policy.CheckAddress(d.address, d.port);
        return by_address.allowed ? by_name : by_address;
      }
      return policy.CheckAddress(d.address, d.port);
  }
  return Verdict{false, "internal", "unknown destination"};
}

bool IsAddress(std::string_view host) { return ParseIpLiteral(host) || LooksLikeIpv4(host); }

// The first `n` bytes of `buf`, taken out of it (without a copy when that is all of it: the
// usual case for a body read 16 KiB at a time).
std::string TakeFront(std::string& buf, size_t n) {
  std::string out;
  if (n == buf.size()) {
    out.swap(buf);
  } else {
    out = buf.substr(0, n);
    buf.erase(0, n);
  }
  return out;
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
    original =
        tcp::endpoint(asio::ip::address_v4(ntohl(sin->sin_addr.s_addr)), ntohs(sin->sin_port));
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

// One client connection and the upstream connection it has open, if any. io thread only, except
// `dest`.
// A client socket that gives back what was already read from it before reading more: the
// ClientHello the proxy read to judge a connection starts the handshake it then terminates.
class Replay {
 public:
  using executor_type = tcp::socket::executor_type;
  using lowest_layer_type = tcp::socket::lowest_layer_type;
  Replay(tcp::socket& socket, std::string first) : socket_(socket), first_(std::move(first)) {}
  executor_type get_executor() { return socket_.get_executor(); }
  lowest_layer_type& lowest_layer() { return socket_.lowest_layer(); }

  template <typename Buffers, typename Token>
  auto async_read_some(const Buffers& buffers, Token&& token) {
    return asio::async_initiate<Token, void(error_code, size_t)>(
        [this](auto handler, const Buffers& b) {
          if (first_.empty()) {
            socket_.async_read_some(b, std::move(handler));
            return;
          }
          const size_t n = asio::buffer_copy(b, asio::buffer(first_));
          first_.erase(0, n);
          asio::post(socket_.get_executor(),
                     [h = std::move(handler), n]() mutable { h(error_code(), n); });
        },
        token, buffers);
  }
  template <typename Buffers, typename Token>
  auto async_write_some(const Buffers& buffers, Token&& token) {
    return socket_.async_write_some(buffers, std::forward<Token>(token));
  }

 private:
  tcp::socket& socket_;
  std::string first_;
};

using DownTls = asio::ssl::stream<Replay>;      // the sandbox's side, terminated here
using UpTls = asio::ssl::stream<tcp::socket&>;  // the host's side, originated here

// Reads from `stream` into `buf` until it holds a whole head (up to CRLF CRLF): the head's
// length; 0 when the stream ends or fails first; npos when the head is over `limit` bytes.
template <typename Stream>
asio::awaitable<size_t> ReadHeadFrom(Stream& stream, std::string& buf, size_t limit) {
  std::vector<char> chunk(kChunkBytes);
  while (true) {
    if (size_t end = buf.find("\r\n\r\n"); end != std::string::npos) {
      co_return end + 4 <= limit ? end + 4 : std::string::npos;
    }
    if (buf.size() > limit) co_return std::string::npos;
    error_code ec;
    const size_t n = co_await stream.async_read_some(asio::buffer(chunk),
                                                     asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return 0;
    buf.append(chunk.data(), n);
  }
}

// A body as its framing delimits it, read from a stream (and first from `buf`, bytes already
// read), given back as the data it carries, piece by piece; what follows it stays in `buf`.
template <typename Stream>
class BodyReader {
 public:
  BodyReader(Stream& stream, std::string& buf, http::Framing framing)
      : stream_(stream), buf_(buf), framing_(framing), left_(framing.length) {}
  bool done() const { return done_; }

  // The next piece ("" only at the end, with done()), or why the body is broken.
  asio::awaitable<Result<std::string>> Next() {
    while (!done_) {
      std::string data;
      switch (framing_.kind) {
        case http::Framing::Kind::kNone:
          done_ = true;
          co_return data;
        case http::Framing::Kind::kLength:
          if (left_ == 0) {
            done_ = true;
            co_return data;
          }
          if (!buf_.empty()) {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(left_, buf_.size()));
            data = buf_.substr(0, n);
            buf_.erase(0, n);
            left_ -= n;
            co_return data;
          }
          break;
        case http::Framing::Kind::kChunked:
          if (!buf_.empty()) {
            auto taken = decoder_.Feed(buf_, &data);
            if (!taken) co_return std::unexpected(taken.error());
            buf_.erase(0, *taken);
            if (decoder_.done()) done_ = true;
            if (!data.empty() || done_) co_return data;
          }
          break;
        case http::Framing::Kind::kUntilClose:
          if (!buf_.empty()) {
            data = std::move(buf_);
            buf_.clear();
            co_return data;
          }
          break;
      }
      error_code ec;
      const size_t n = co_await stream_.async_read_some(
          asio::buffer(chunk_), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        const bool ended = ec == asio::error::eof || ec == asio::ssl::error::stream_truncated;
        if (ended && framing_.kind == http::Framing::Kind::kUntilClose) {
          done_ = true;
          co_return data;
        }
        co_return Fail(ErrorCode::kUnavailable, "the body ended early: " + ec.message());
      }
      buf_.append(chunk_.data(), n);
    }
    co_return std::string();
  }

 private:
  // A piece read at once, re-framed as a chunk, still fits one TLS record (16 KiB).
  static constexpr size_t kPieceBytes = 16 * 1024 - 64;
  std::vector<char> chunk_ = std::vector<char>(kPieceBytes);
  Stream& stream_;
  std::string& buf_;
  http::Framing framing_;
  uint64_t left_ = 0;
  http::ChunkedDecoder decoder_;
  bool done_ = false;
};

template <typename Stream>
asio::awaitable<bool> WriteAll(Stream& stream, std::string_view bytes) {
  error_code ec;
  co_await asio::async_write(stream, asio::buffer(bytes.data(), bytes.size()),
                             asio::redirect_error(asio::use_awaitable, ec));
  co_return !ec;
}

// The path of a request target without its query: what an event may show.
std::string PathOf(std::string_view target) {
  return std::string(target.substr(0, target.find_first_of("?#")));
}

struct Connection {
  Connection(asio::io_context& io, tcp::socket s) : client(std::move(s)), upstream(io), timer(io) {}

  uint64_t id = 0;
  IpAddress client_ip;
  tcp::socket client;
  tcp::socket upstream;
  asio::steady_timer timer;  // the watchdog's
  Clock::time_point deadline;
  NetworkPolicy policy;  // HTTP: asked again for each request
  std::optional<tcp::endpoint> original;
  std::string in;             // read from the client, not yet used (a head, a body, what follows)
  std::string from_upstream;  // read from the upstream, not yet forwarded
  EgressEvent link;           // the verdict that opened `upstream`, then the bytes through it
  std::string link_key;       // HTTP: the destination `upstream` serves, reused for the same
  bool closed = false;
  int pumps = 0;  // tunnel pump coroutines still running

  // Guarded by State::mu: where `upstream` goes while it is open, for Recheck.
  std::optional<Destination> dest;
};

// The verdict on a destination and the addresses it allows dialling, in order.
struct Decision {
  Verdict verdict;
  Destination dest;
  std::vector<IpAddress> addresses;
  std::optional<IpAddress> shown;  // the address the event names (dialled or refused), if known
};

// One HTTP request, ready to forward.
struct Request {
  std::string method;
  std::string host;  // what is judged: a name, an address, or "" (open mode, no Host)
  uint16_t port = 0;
  std::string head;  // to send upstream, without its framing fields and the blank line
  http::Framing framing;
  bool client_keeps = false;  // HTTP/1.1 without Connection: close: more requests may follow
  bool http10 = false;        // the client speaks HTTP/1.0: no chunked responses for it
};

// What became of one request's exchange with the upstream.
struct Exchange {
  enum class Outcome {
    kComplete,    // the whole response reached the client
    kNoResponse,  // nothing of a response reached the client: it can still get a 502
    kBroken,      // it failed part way: the client connection can only be closed
  };
  Outcome outcome = Outcome::kNoResponse;
  std::string why;           // kNoResponse
  bool nothing_read = true;  // the upstream sent not one byte (a stale kept-alive connection)
  bool client_may_continue = false;
  bool upstream_may_continue = false;
};

// A request body on its way up, beside the response on its way down.
struct Upload {
  bool finished = false;  // SendBody has returned (it reads the client no more)
  bool done = false;      // ...having sent the whole body
  std::string malformed;  // why the body was refused, if it was
};

struct EgressProxy::State : std::enable_shared_from_this<EgressProxy::State> {
  State(asio::io_context& io_in, ProxyHooks hooks_in, ProxyLimits limits_in)
      : io(io_in), hooks(std::move(hooks_in)), limits(limits_in) {}

  asio::io_context& io;
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors;  // one port, IPv4 and IPv6
  ProxyHooks hooks;
  ProxyLimits limits;
  asio::thread_pool pool{2};  // resolve() may block
  uint16_t listen_port = 0;

  mutable std::mutex mu;  // guards the members below and Connection::dest
  bool stopping = false;
  uint64_t next_id = 1;
  std::map<uint64_t, std::shared_ptr<Connection>> connections;
  std::map<IpAddress, size_t> per_client;

  void Emit(const EgressEvent& event) {
    if (hooks.on_event) hooks.on_event(event);
  }

  static EgressEvent NewEvent(const Connection& c, EgressEvent::Kind kind) {
    EgressEvent e;
    e.kind = kind;
    e.client = c.client_ip;
    return e;
  }

  void Deny(EgressEvent& ev, const Verdict& v) {
    ev.allowed = false;
    ev.rule = v.rule;
    ev.reason = v.reason;
    Emit(ev);
  }

  // Moves the watchdog's deadline (earlier or later). io thread.
  static void SetDeadline(Connection& c, Clock::duration from_now) {
    Clock::time_point t = Clock::now() + from_now;
    bool earlier = t < c.deadline;
    c.deadline = t;
    if (earlier) c.timer.cancel();
  }

  // Closes the upstream connection, if one is open, with its closing event. io thread.
  void CloseUpstream(Connection& c) {
    error_code ignored;
    c.upstream.close(ignored);
    c.from_upstream.clear();
    c.link_key.clear();
    bool had = false;
    {
      std::lock_guard lock(mu);
      had = c.dest.has_value();
      c.dest.reset();
    }
    if (had) {
      EgressEvent done = c.link;
      done.phase = EgressEvent::Phase::kClosed;
      Emit(done);
    }
  }

  // Ends a connection: sockets closed (pending operations fail), the closing event sent once.
  // io thread.
  void Close(const std::shared_ptr<Connection>& c) {
    if (c->closed) return;
    c->closed = true;
    error_code ignored;
    c->client.shutdown(tcp::socket::shutdown_both, ignored);
    c->client.close(ignored);
    c->timer.cancel();
    CloseUpstream(*c);
    std::lock_guard lock(mu);
    connections.erase(c->id);
    auto it = per_client.find(c->client_ip);
    if (it != per_client.end() && --it->second == 0) per_client.erase(it);
  }

  asio::awaitable<void> Accept(tcp::acceptor& acceptor) {
    auto self = shared_from_this();
    while (true) {
      error_code ec;
      tcp::socket socket =
          co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
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
      // A relay writes what it has as soon as it has it (heads and bodies are separate writes);
      // Nagle would hold the second behind the peer's delayed ACK.
      socket.set_option(tcp::no_delay(true), ec);
      auto c = std::make_shared<Connection>(io, std::move(socket));
      c->policy = std::move(*policy);
      c->client_ip = client;
      // The sandbox's own cap (network.max_connections), else the proxy's.
      const size_t client_cap = c->policy.max_connections() != 0
                                    ? c->policy.max_connections()
                                    : limits.max_connections_per_client;
      bool over = false;
      {
        std::lock_guard lock(mu);
        over = stopping || connections.size() >= limits.max_connections ||
               per_client[client] >= client_cap;
        if (!over) {
          c->id = next_id++;
          connections.emplace(c->id, c);
          ++per_client[client];
        } else if (per_client[client] == 0) {
          per_client.erase(client);
        }
      }
      if (over) {
        EgressEvent refused = NewEvent(*c, EgressEvent::Kind::kConnect);
        Deny(refused, Verdict{false, "limit", "too many open connections"});
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

  // Ends the connection gracefully: the reply (if any) written, our side shut, then a short
  // lingering read so that the client reads what it was sent rather than a reset. No `linger`
  // when something else still reads the client (an unfinished request body).
  asio::awaitable<void> Finish(std::shared_ptr<Connection> c, std::string reply,
                               bool linger = true) {
    error_code ec;
    SetDeadline(*c, kLingerTimeout);
    if (!reply.empty()) {
      co_await asio::async_write(c->client, asio::buffer(reply),
                                 asio::redirect_error(asio::use_awaitable, ec));
    }
    c->client.shutdown(tcp::socket::shutdown_send, ec);
    if (!linger) ec = asio::error::shut_down;
    std::vector<char> sink(kChunkBytes);
    for (size_t drained = 0; !ec && !c->closed && drained < kMaxLingerBytes;) {
      drained += co_await c->client.async_read_some(asio::buffer(sink),
                                                    asio::redirect_error(asio::use_awaitable, ec));
    }
    Close(c);
  }

  // A refused request: its event (allowed false, the rule, the reason) and, for an HTTP client,
  // the DenyReply; the connection ends. TLS clients cannot be answered: they are closed.
  asio::awaitable<void> Refuse(std::shared_ptr<Connection> c, EgressEvent ev, Verdict v,
                               bool http_client) {
    Deny(ev, v);
    if (!http_client) {
      Close(c);
      co_return;
    }
    std::string reply = DenyReply(v);
    co_await Finish(c, std::move(reply));
  }

  // --- The first bytes ---

  struct HeadRead {
    enum class Kind { kGone, kTls, kHttp, kTooLarge };
    Kind kind = Kind::kGone;
    size_t head_end = 0;    // kHttp: c->in[0, head_end) is the request head
    ClientHelloScan hello;  // kTls (kNeedMore: over the limit)
  };

  // Reads from the client until c->in holds a whole request head or, when `allow_tls`, a whole
  // (or a malformed) TLS ClientHello.
  asio::awaitable<HeadRead> ReadHead(std::shared_ptr<Connection> c, bool allow_tls) {
    HeadRead out;
    std::vector<char> chunk(kChunkBytes);
    while (!c->closed) {
      // Empty lines before a request line are ignored (RFC 9112 2.2); some clients send one
      // after a body. They never reach the upstream: the proxy writes request lines itself.
      size_t blank = 0;
      while (c->in.compare(blank, 2, "\r\n") == 0) blank += 2;
      c->in.erase(0, blank);
      if (allow_tls && LooksLikeTls(c->in)) {
        out.hello = ScanClientHello(c->in);
        if (out.hello.state != ClientHelloScan::State::kNeedMore ||
            c->in.size() > limits.max_header_bytes) {
          out.kind = HeadRead::Kind::kTls;
          co_return out;
        }
      } else if (size_t end = c->in.find("\r\n\r\n"); end != std::string::npos) {
        out.head_end = end + 4;
        out.kind = out.head_end <= limits.max_header_bytes ? HeadRead::Kind::kHttp
                                                           : HeadRead::Kind::kTooLarge;
        co_return out;
      } else if (c->in.size() > limits.max_header_bytes) {
        out.kind = HeadRead::Kind::kTooLarge;
        co_return out;
      }
      error_code ec;
      size_t n = co_await c->client.async_read_some(asio::buffer(chunk),
                                                    asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return out;  // EOF, timeout or reset before a whole head: nothing to answer
      c->in.append(chunk.data(), n);
    }
    co_return out;
  }

  asio::awaitable<void> Serve(std::shared_ptr<State> self, std::shared_ptr<Connection> c) {
    c->deadline = Clock::now() + limits.first_request_timeout;
    asio::co_spawn(io, Watchdog(self, c), asio::detached);
    c->original = hooks.original_destination ? hooks.original_destination(c->client)
                                             : OriginalDestination(c->client);
    HeadRead first = co_await ReadHead(c, /*allow_tls=*/c->original.has_value());
    switch (first.kind) {
      case HeadRead::Kind::kGone:
        Close(c);
        break;
      case HeadRead::Kind::kTls:
        co_await ServeTls(self, c, std::move(first.hello));
        break;
      case HeadRead::Kind::kTooLarge:
      case HeadRead::Kind::kHttp:
        co_await ServeHttp(self, c, first);
        break;
    }
  }

  // --- Judging and dialling ---

  // The verdict on `host` (a name or an address literal) at `port`, and the addresses it allows.
  // `dial_original` (open mode, transparent): the original destination is judged as an address,
  // `host` as a name if it is one ("" or an address: no name), and the original is what is dialled.
  asio::awaitable<Decision> Judge(std::shared_ptr<Connection> c, std::string host, uint16_t port,
                                  bool dial_original) {
    Decision d;
    d.dest.port = port;
    if (dial_original) {
      d.dest.by = JudgedBy::kNameAndAddress;
      if (!host.empty() && !IsAddress(host)) d.dest.name = NormaliseName(host).value_or(host);
      d.dest.address = Unmap(c->original->address());
      d.shown = d.dest.address;
      d.verdict = Rejudge(c->policy, d.dest);
      if (d.verdict.allowed) d.addresses.push_back(d.dest.address);
      co_return d;
    }
    if (auto literal = ParseIpLiteral(host)) {
      d.dest.by = JudgedBy::kAddress;
      d.dest.name = host;
      d.dest.address = Unmap(*literal);
      d.shown = *literal;
      d.verdict = c->policy.CheckAddress(*literal, port);
      if (d.verdict.allowed) d.addresses.push_back(d.dest.address);
      co_return d;
    }
    d.dest.by = JudgedBy::kName;
    d.dest.name = NormaliseName(host).value_or(host);
    d.verdict = c->policy.CheckName(host, port);
    if (!d.verdict.allowed) co_return d;
    auto resolve = [this, name = d.dest.name] { return hooks.resolve(name); };
    Result<std::vector<IpAddress>> resolved = co_await OnPool(pool, resolve);
    if (!resolved || resolved->empty()) {
      d.verdict = Verdict{
          false, "resolve",
          "cannot resolve " + d.dest.name +
              (resolved ? std::string(": no addresses") : ": " + resolved.error().message())};
      co_return d;
    }
    std::optional<Verdict> first_denial;
    for (const auto& ip : *resolved) {
      Verdict v = c->policy.CheckResolved(d.verdict, ip, port);
      if (v.allowed) {
        d.addresses.push_back(Unmap(ip));
      } else if (!first_denial) {
        first_denial = v;
        d.shown = ip;
      }
    }
    if (d.addresses.empty()) d.verdict = *first_denial;
    co_return d;
  }

  // Dials d.addresses in order, the first that answers. Connected: c->upstream open, c->dest set,
  // the verdict sent (allowed) and kept in c->link. Not: its refusal event is sent (rule connect)
  // and the caller answers the client, unless the connection was closed meanwhile.
  asio::awaitable<bool> Connect(std::shared_ptr<Connection> c, EgressEvent& ev, Decision& d) {
    SetDeadline(*c, limits.connect_timeout);
    for (const auto& ip : d.addresses) {
      error_code ec;
      c->upstream.close(ec);
      if (hooks.open_socket) {
        auto fd = hooks.open_socket(ip.is_v4() ? AF_INET : AF_INET6, SOCK_STREAM);
        if (!fd) continue;
        c->upstream.assign(ip.is_v4() ? tcp::v4() : tcp::v6(), fd->get(), ec);
        if (ec) continue;
        (void)fd->Release();
      }
      co_await c->upstream.async_connect(tcp::endpoint(ip, d.dest.port),
                                         asio::redirect_error(asio::use_awaitable, ec));
      if (c->closed) co_return false;
      if (!ec) {
        c->upstream.set_option(tcp::no_delay(true), ec);
        d.dest.address = ip;
        ev.dest = ip;
        ev.allowed = true;
        ev.rule = d.verdict.rule;
        ev.reason = d.verdict.reason;
        Emit(ev);
        c->link = ev;
        {
          std::lock_guard lock(mu);
          c->dest = d.dest;
        }
        SetDeadline(*c, limits.idle_timeout);
        co_return true;
      }
    }
    error_code ignored;
    c->upstream.close(ignored);
    if (!d.addresses.empty()) ev.dest = d.addresses.front();
    const std::string target = d.dest.name.empty() ? HostPort(d.dest.address, d.dest.port)
                                                   : HostPort(d.dest.name, d.dest.port);
    d.verdict = Verdict{false, "connect", "cannot connect to " + target};
    Deny(ev, d.verdict);
    co_return false;
  }

  // --- TLS, transparent ---

  asio::awaitable<void> ServeTls(std::shared_ptr<State> self, std::shared_ptr<Connection> c,
                                 ClientHelloScan hello) {
    EgressEvent ev = NewEvent(*c, EgressEvent::Kind::kTls);
    const uint16_t port = c->original->port();
    const bool open = c->policy.mode() == NetworkMode::kOpen;
    ev.port = port;
    ev.sni = hello.sni;
    ev.name = hello.sni;
    std::optional<Verdict> refused;
    if (hello.state == ClientHelloScan::State::kNeedMore) {
      refused =
          Verdict{false, "sni",
                  "TLS ClientHello over " + std::to_string(limits.max_header_bytes) + " bytes"};
    } else if (hello.state == ClientHelloScan::State::kInvalid) {
      refused = Verdict{false, "sni", "malformed TLS ClientHello: " + hello.error};
    } else if (!open && hello.sni.empty()) {
      refused = Verdict{false, "sni", "TLS ClientHello without a server name (SNI)"};
    } else if (!open && IsAddress(hello.sni)) {
      refused =
          Verdict{false, "sni", "TLS server name " + hello.sni + " is an address, not a name"};
    }
    if (refused) {
      co_await Refuse(c, ev, *refused, /*http_client=*/false);
      co_return;
    }
    // Open mode: no SNI (or an address as SNI) names nothing; the address alone is judged.
    Decision d = co_await Judge(c, hello.sni, port, /*dial_original=*/open);
    if (c->closed) co_return;
    if (!d.dest.name.empty()) ev.name = d.dest.name;
    if (ev.name.empty()) ev.name = d.dest.address.to_string();
    ev.dest = d.shown;
    if (!d.verdict.allowed) {
      co_await Refuse(c, ev, d.verdict, /*http_client=*/false);
      co_return;
    }
    if (c->policy.HasSecretsFor(d.dest.name)) {
      std::string hello_bytes = std::move(c->in);
      c->in.clear();
      co_await Intercept(c, ev, d, d.dest.name, port, std::move(hello_bytes));
      co_return;
    }
    if (!co_await Connect(c, ev, d)) {
      Close(c);
      co_return;
    }
    std::string first = std::move(c->in);  // the ClientHello, forwarded unchanged
    c->in.clear();
    StartTunnel(self, c, std::move(first), /*inspect=*/false);
  }

  // --- Intercepted TLS: a host the sandbox has secrets bound to ---

  // A refusal on an intercepted connection: its event, and the DenyReply over the sandbox's TLS
  // when `down` is up, else nothing (the handshake never finished); the connection ends.
  asio::awaitable<void> RefuseIntercepted(std::shared_ptr<Connection> c, DownTls* down,
                                          EgressEvent ev, Verdict v) {
    Deny(ev, v);
    co_await AnswerIntercepted(c, down, v);
  }
  // The DenyReply for `v` over the sandbox's TLS (if it is up), then the end of the connection.
  asio::awaitable<void> AnswerIntercepted(std::shared_ptr<Connection> c, DownTls* down,
                                          Verdict v) {
    if (down) {
      SetDeadline(*c, kLingerTimeout);
      const std::string reply = DenyReply(v);
      if (co_await WriteAll(*down, reply)) {
        error_code ec;
        co_await down->async_shutdown(asio::redirect_error(asio::use_awaitable, ec));
      }
    }
    Close(c);
  }

  // The sandbox's TLS to `host` (a name with secrets bound; `first`: its ClientHello, read
  // already) is terminated here with a certificate of the daemon's CA; each request in it is
  // checked (Host must name `host`), has the values put in for its placeholders, and goes to
  // `host` over TLS the proxy originates to an address it resolved itself (`d`) and verifies;
  // each response has the values taken out. `ev`: the connection's verdict event, so far.
  asio::awaitable<void> Intercept(std::shared_ptr<Connection> c, EgressEvent ev, Decision d,
                                  std::string host, uint16_t port, std::string first) {
    if (c->policy.mode() != NetworkMode::kAllowlist) {
      Verdict v{false, "secret",
                "secrets are bound to " + host + " but the sandbox's network is not in allowlist "
                "mode"};
      co_await RefuseIntercepted(c, nullptr, ev, v);
      co_return;
    }
    Result<std::shared_ptr<asio::ssl::context>> server =
        hooks.server_tls && hooks.upstream_tls && hooks.secret_value
            ? hooks.server_tls(host)
            : Fail(ErrorCode::kUnavailable, "this proxy has no certificate authority");
    if (!server) {
      Verdict v{false, "secret",
                "cannot intercept TLS to " + host + ": " + server.error().message()};
      co_await RefuseIntercepted(c, nullptr, ev, v);
      co_return;
    }
    DownTls down(Replay(c->client, std::move(first)), **server);
    error_code ec;
    co_await down.async_handshake(asio::ssl::stream_base::server,
                                  asio::redirect_error(asio::use_awaitable, ec));
    if (c->closed) co_return;
    if (ec) {
      Verdict v{false, "secret",
                "the client did not accept the proxy's certificate for " + host +
                    ", which has secrets bound (" + ec.message() +
                    "): nothing was sent; the client must trust the Airlock CA and not "
                    "pin certificates"};
      co_await RefuseIntercepted(c, nullptr, ev, v);
      co_return;
    }
    if (!co_await Connect(c, ev, d)) {  // its refusal is on record already
      if (!c->closed) co_await AnswerIntercepted(c, &down, d.verdict);
      co_return;
    }
    UpTls up(c->upstream, *hooks.upstream_tls);
    if (auto prepared = PrepareUpstream(up.native_handle(), host); !prepared) {
      Verdict v{false, "upstream-tls",
                "cannot set up TLS to " + host + ": " + prepared.error().message()};
      co_await RefuseIntercepted(c, &down, ev, v);
      co_return;
    }
    co_await up.async_handshake(asio::ssl::stream_base::client,
                                asio::redirect_error(asio::use_awaitable, ec));
    if (c->closed) co_return;
    if (ec) {
      const long verify = SSL_get_verify_result(up.native_handle());
      Verdict v{false, "upstream-tls",
                "TLS to " + HostPort(host, port) + " failed: " +
                    (verify != X509_V_OK ? X509_verify_cert_error_string(verify) : ec.message())};
      co_await RefuseIntercepted(c, &down, ev, v);
      co_return;
    }
    std::string from_client, from_host;
    while (!c->closed) {
      EgressEvent rev = NewEvent(*c, EgressEvent::Kind::kHttp);
      rev.name = host;
      rev.sni = host;
      rev.port = port;
      rev.dest = d.dest.address;
      const size_t head_end = co_await ReadHeadFrom(down, from_client, limits.max_header_bytes);
      if (head_end == 0 || c->closed) break;
      if (head_end == std::string::npos) {
        Verdict v{false, "too-large",
                  "request head over " + std::to_string(limits.max_header_bytes) + " bytes"};
        co_await RefuseIntercepted(c, &down, rev, v);
        co_return;
      }
      SetDeadline(*c, limits.idle_timeout);
      auto head = http::ParseRequestHead(std::string_view(from_client).substr(0, head_end));
      from_client.erase(0, head_end);
      // Each request is judged by the policy (and its secrets) as they are now.
      std::optional<NetworkPolicy> policy = hooks.policy_for(c->client_ip);
      if (!policy) break;
      c->policy = std::move(*policy);
      auto checked = CheckIntercepted(head, host, port, rev);
      if (!checked) {
        co_await RefuseIntercepted(c, &down, rev, checked.error());
        co_return;
      }
      const std::string path = checked->first;
      const http::Framing framing = checked->second;
      if (Verdict v = Rejudge(c->policy, d.dest); !v.allowed) {
        co_await RefuseIntercepted(c, &down, rev, v);
        co_return;
      }
      std::vector<std::pair<std::string, std::string>> fields;
      const std::vector<std::string> listed = head->ConnectionOptions();
      for (const auto& [k, v] : head->fields) {
        if (IEquals(k, "host") || IEquals(k, "content-length") || IEquals(k, "expect") ||
            IEquals(k, "accept-encoding") || http::IsHopByHop(k)) {
          continue;
        }
        bool is_listed = false;
        for (const std::string& l : listed) is_listed = is_listed || IEquals(k, l);
        if (!is_listed) fields.emplace_back(k, v);
      }
      const IpAddress client = c->client_ip;
      auto injected = InjectSecrets(
          fields, head->target, host, c->policy.secrets(),
          [&](const std::string& secret) { return hooks.secret_value(client, secret); });
      if (!injected) {
        Verdict v{false, "secret", injected.error().message()};
        co_await RefuseIntercepted(c, &down, rev, v);
        co_return;
      }
      std::string out = head->method + " " + path +
                        " HTTP/1.1\r\nHost: " + (port == 443 ? host : HostPort(host, port)) +
                        "\r\n";
      for (const auto& [k, v] : injected->fields) out += k + ": " + v + "\r\n";
      // Identity only: a compressed answer could carry the value where the proxy cannot see it.
      out += "Accept-Encoding: identity\r\n";
      if (framing.kind == http::Framing::Kind::kLength) {
        out += "Content-Length: " + std::to_string(framing.length) + "\r\n";
      } else if (framing.kind == http::Framing::Kind::kChunked) {
        out += "Transfer-Encoding: chunked\r\n";
      }
      out += "\r\n";
      // The proxy sends the body after the head, whatever the server says first: a client that
      // waits for a 100 Continue gets it from here.
      if (!head->Values("expect").empty()) {
        const bool sent = co_await WriteAll(down, "HTTP/1.1 100 Continue\r\n\r\n");
        if (!sent) break;
      }
      if (!co_await WriteAll(up, out)) {
        Verdict v{false, "upstream", "cannot send the request to " + host};
        co_await RefuseIntercepted(c, &down, rev, v);
        co_return;
      }
      c->link.bytes_up += out.size();
      // The body as it comes: a placeholder of a secret not bound to this host stops it before
      // any of its bytes leave (the tail that could be the start of one is held back until the
      // next piece shows it is not; the upstream connection is cut, the request never ends).
      Finder foreign(ForeignPlaceholders(c->policy.secrets(), host));
      BodyReader body(down, from_client, framing);
      std::string held;
      while (!body.done()) {
        Result<std::string> piece = co_await body.Next();
        if (!piece) {
          Verdict v{false, "malformed", piece.error().message()};
          co_await RefuseIntercepted(c, &down, rev, v);
          co_return;
        }
        if (std::string found = foreign.Feed(*piece); !found.empty()) {
          std::string name;
          for (const SecretBinding& b : c->policy.secrets()) {
            if (b.placeholder == found) name = b.secret;
          }
          Verdict v{false, "secret",
                    "the placeholder of secret " + name + " is in the body of a request to " +
                        host + ", a host it is not bound to"};
          co_await RefuseIntercepted(c, &down, rev, v);
          co_return;
        }
        held += *piece;
        const size_t keep = body.done() ? 0 : std::min(held.size(), foreign.held_back());
        std::string ready = held.substr(0, held.size() - keep);
        held.erase(0, held.size() - keep);
        std::string wire;
        if (framing.kind != http::Framing::Kind::kChunked) {
          wire = std::move(ready);
        } else {
          if (!ready.empty()) wire = http::EncodeChunk(ready);
          if (body.done()) wire += http::kLastChunk;
        }
        bool sent = true;
        if (!wire.empty()) sent = co_await WriteAll(up, wire);
        if (!sent) {
          Verdict v{false, "upstream", "cannot send the request body to " + host};
          co_await RefuseIntercepted(c, &down, rev, v);
          co_return;
        }
        c->link.bytes_up += wire.size();
      }
      // The response: interim ones (1xx) are not passed on.
      Result<http::Head> response = Fail(ErrorCode::kUnavailable, "no response");
      size_t response_end = 0;
      do {
        response_end = co_await ReadHeadFrom(up, from_host, limits.max_response_header_bytes);
        if (response_end == 0 || response_end == std::string::npos) break;
        response = http::ParseResponseHead(std::string_view(from_host).substr(0, response_end));
        from_host.erase(0, response_end);
      } while (response && response->status >= 100 && response->status < 200);
      if (c->closed) co_return;
      if (!response || response_end == 0 || response_end == std::string::npos) {
        Verdict v{false, "upstream",
                  "no valid response from " + HostPort(host, port) +
                      (response ? std::string() : ": " + response.error().message())};
        co_await RefuseIntercepted(c, &down, rev, v);
        co_return;
      }
      auto response_framing = http::ResponseFraming(*response, head->method);
      if (!response_framing) {
        Verdict v{false, "upstream",
                  "a response from " + host +
                      " the proxy cannot read: " + response_framing.error().message()};
        co_await RefuseIntercepted(c, &down, rev, v);
        co_return;
      }
      const bool has_body = response_framing->kind != http::Framing::Kind::kNone;
      for (std::string_view coding : response->Values("content-encoding")) {
        if (has_body && !IEquals(coding, "identity")) {
          Verdict v{false, "upstream",
                    host + " answered with a " + std::string(coding) +
                        "-encoded body, which the proxy cannot check for secrets"};
          co_await RefuseIntercepted(c, &down, rev, v);
          co_return;
        }
      }
      Scrubber scrub(injected->scrub);
      const bool http10 = head->version == "HTTP/1.0";
      const bool client_keeps = !http10 && !head->ConnectionHas("close");
      const bool host_keeps = !response->ConnectionHas("close") &&
                              response_framing->kind != http::Framing::Kind::kUntilClose;
      const bool keep = client_keeps && host_keeps;
      std::string reply = "HTTP/1.1 " + std::to_string(response->status) + " " +
                          scrub.All(response->reason) + "\r\n";
      const std::vector<std::string> response_listed = response->ConnectionOptions();
      for (const auto& [k, v] : response->fields) {
        const bool length = IEquals(k, "content-length");
        if ((length && has_body) || http::IsHopByHop(k)) continue;
        bool is_listed = false;
        for (const std::string& l : response_listed) is_listed = is_listed || IEquals(k, l);
        if (!is_listed) reply += scrub.All(k) + ": " + scrub.All(v) + "\r\n";
      }
      if (has_body && !http10) reply += "Transfer-Encoding: chunked\r\n";
      if (!keep || (has_body && http10)) reply += "Connection: close\r\n";
      reply += "\r\n";
      if (!co_await WriteAll(down, reply)) break;
      BodyReader answer(up, from_host, *response_framing);
      bool broken = false;
      while (has_body && !answer.done() && !broken) {
        Result<std::string> piece = co_await answer.Next();
        if (!piece) {
          broken = true;
          break;
        }
        c->link.bytes_down += piece->size();
        std::string clean = scrub.Feed(*piece);
        if (answer.done()) clean += scrub.Finish();
        std::string wire = http10 || clean.empty() ? std::move(clean) : http::EncodeChunk(clean);
        if (answer.done() && !http10) wire += http::kLastChunk;
        if (!wire.empty()) broken = !co_await WriteAll(down, wire);
      }
      rev.allowed = !broken;
      rev.rule = broken ? "upstream" : d.verdict.rule;
      std::string names;
      for (const std::string& n : injected->secrets) names += (names.empty() ? "" : ",") + n;
      rev.secrets = names;
      rev.reason = (names.empty() ? std::string() : "secret " + names + " injected: ") +
                   head->method + " " + PathOf(path) + " -> " + std::to_string(response->status) +
                   (broken ? " (the response broke off)" : "");
      Emit(rev);
      if (broken || !keep) break;
      SetDeadline(*c, limits.keep_alive_timeout);
    }
    if (!c->closed) {
      SetDeadline(*c, kLingerTimeout);
      co_await down.async_shutdown(asio::redirect_error(asio::use_awaitable, ec));
    }
    Close(c);
  }

  // An intercepted request's head, checked: the host it names (Host, and the URL's authority in
  // absolute form) is `host` at `port`, exactly; its path (origin-form) and body framing.
  std::expected<std::pair<std::string, http::Framing>, Verdict> CheckIntercepted(
      const Result<http::Head>& head, const std::string& host, uint16_t port, EgressEvent& ev) {
    auto refuse = [](std::string rule, std::string why) {
      return std::unexpected(Verdict{false, std::move(rule), std::move(why)});
    };
    if (!head) return refuse("malformed", head.error().message());
    ev.host = head->Values("host").empty() ? "" : std::string(head->Values("host")[0]);
    auto same = [&](std::string_view authority) {
      auto a = SplitAuthority(authority);
      return a && SameHost(a->host, host) && a->port.value_or(443) == port;
    };
    const auto hosts = head->Values("host");
    if (hosts.size() != 1) return refuse("malformed", "a request needs exactly one Host header");
    if (!same(hosts[0])) {
      return refuse("host-mismatch", "the Host header (" + std::string(hosts[0]) +
                                         ") differs from the TLS server name " + host +
                                         ", which has secrets bound");
    }
    std::string path = head->target;
    if (head->target.size() > 8 &&
        IEquals(std::string_view(head->target).substr(0, 8), "https://")) {
      const std::string_view rest = std::string_view(head->target).substr(8);
      const size_t slash = rest.find_first_of("/?#");
      if (!same(rest.substr(0, slash))) {
        return refuse("host-mismatch", "the URL's host differs from the TLS server name " + host);
      }
      path = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
      if (path[0] != '/') path = "/" + path;
    } else if (path.empty() || path[0] != '/') {
      return refuse("malformed", "malformed request target");
    }
    if (head->method == "CONNECT") return refuse("malformed", "CONNECT inside an intercepted TLS");
    auto framing = http::RequestFraming(*head);
    if (!framing) return refuse("malformed", framing.error().message());
    return std::make_pair(std::move(path), *framing);
  }

  // --- HTTP: explicit (CONNECT, absolute-form) and transparent, with keep-alive ---

  asio::awaitable<void> ServeHttp(std::shared_ptr<State> self, std::shared_ptr<Connection> c,
                                  HeadRead read) {
    for (bool first = true;; first = false) {
      EgressEvent ev = NewEvent(*c, EgressEvent::Kind::kHttp);
      if (!first) {
        SetDeadline(*c, limits.keep_alive_timeout);
        read = co_await ReadHead(c, /*allow_tls=*/false);
        if (read.kind == HeadRead::Kind::kGone) {
          Close(c);
          co_return;
        }
        // Each request is judged by the policy as it is now.
        std::optional<NetworkPolicy> policy = hooks.policy_for(c->client_ip);
        if (!policy) {
          Close(c);
          co_return;
        }
        c->policy = std::move(*policy);
      }
      if (read.kind == HeadRead::Kind::kTooLarge) {
        Verdict v{false, "too-large",
                  "request head over " + std::to_string(limits.max_header_bytes) + " bytes"};
        co_await Refuse(c, ev, v, /*http_client=*/true);
        co_return;
      }
      SetDeadline(*c, limits.idle_timeout);
      auto head = http::ParseRequestHead(std::string_view(c->in).substr(0, read.head_end));
      std::optional<Verdict> refused;
      if (!head) {
        refused = Verdict{false, "malformed", head.error().message()};
      } else if (auto hosts = head->Values("host"); hosts.size() > 1) {
        refused = Verdict{false, "malformed", "more than one Host header"};
      } else if (!hosts.empty()) {
        ev.host = std::string(hosts[0]);
      }
      if (!refused && head->method == "CONNECT") {
        ev.kind = EgressEvent::Kind::kConnect;
        co_await ServeConnect(self, c, *head, read.head_end, ev);
        co_return;
      }
      Request req;
      if (!refused) {
        auto prepared = Prepare(*c, *head, ev);
        if (prepared) {
          req = std::move(*prepared);
        } else {
          refused = prepared.error();
        }
      }
      if (!refused && req.framing.kind == http::Framing::Kind::kChunked) {
        // The part of a chunked body already here is checked before anything is dialled, so
        // that a malformed one is a clean 400 (later parts are checked as they come).
        http::ChunkedDecoder probe;
        std::string ignored;
        auto checked = probe.Feed(std::string_view(c->in).substr(read.head_end), &ignored);
        if (!checked) refused = Verdict{false, "malformed", checked.error().message()};
      }
      if (refused) {
        co_await Refuse(c, ev, *refused, /*http_client=*/true);
        co_return;
      }
      c->in.erase(0, read.head_end);

      bool done = false;
      for (int attempt = 0; !done; ++attempt) {
        // An upstream connection to the same destination is reused, judged again; else one is
        // opened for this request.
        const bool dial_original = c->original && c->policy.mode() == NetworkMode::kOpen;
        const std::string key = (dial_original ? c->original->address().to_string()
                                               : NormaliseName(req.host).value_or(req.host)) +
                                "|" + std::to_string(req.port);
        bool reused = false;
        if (c->upstream.is_open() && c->link_key == key && UpstreamIdle(*c)) {
          Destination dest = *c->dest;
          if (dest.by == JudgedBy::kNameAndAddress) {
            dest.name = IsAddress(req.host) ? "" : NormaliseName(req.host).value_or(req.host);
          }
          Verdict v = Rejudge(c->policy, dest);
          ev.name = dest.name.empty() ? dest.address.to_string() : dest.name;
          ev.dest = dest.address;
          ev.port = req.port;
          if (!v.allowed) {
            co_await Refuse(c, ev, v, /*http_client=*/true);
            co_return;
          }
          ev.allowed = true;
          ev.rule = v.rule;
          ev.reason = v.reason;
          Emit(ev);
          {
            std::lock_guard lock(mu);
            c->dest = dest;
          }
          reused = true;
        } else {
          CloseUpstream(*c);
          Decision d = co_await Judge(c, req.host, req.port, dial_original);
          if (c->closed) co_return;
          ev.name = d.dest.name.empty() ? d.dest.address.to_string() : d.dest.name;
          ev.dest = d.shown;
          ev.port = req.port;
          if (!d.verdict.allowed) {
            co_await Refuse(c, ev, d.verdict, /*http_client=*/true);
            co_return;
          }
          if (!co_await Connect(c, ev, d)) {
            std::string reply = DenyReply(d.verdict);
            if (!c->closed) co_await Finish(c, std::move(reply));
            co_return;
          }
          c->link_key = key;
        }

        // The head, then the body beside the response (a server may answer before the body
        // ends, or only after a 100 Continue).
        std::string out = req.head;
        switch (req.framing.kind) {
          case http::Framing::Kind::kLength:
            out += "Content-Length: " + std::to_string(req.framing.length) + "\r\n";
            break;
          case http::Framing::Kind::kChunked:
            out += "Transfer-Encoding: chunked\r\n";
            break;
          default:
            break;
        }
        if (!req.client_keeps) out += "Connection: close\r\n";
        out += "\r\n";
        error_code ec;
        co_await asio::async_write(c->upstream, asio::buffer(out),
                                   asio::redirect_error(asio::use_awaitable, ec));
        if (c->closed) co_return;
        c->link.bytes_up += out.size();
        auto upload = std::make_shared<Upload>();
        if (!ec) {
          asio::co_spawn(io, SendBody(self, c, req.framing, upload), asio::detached);
        } else {
          upload->finished = true;
        }
        Exchange x;
        if (ec) {
          x.why = ec.message();
        } else {
          x = co_await ForwardResponse(c, req);
        }
        if (c->closed) co_return;
        switch (x.outcome) {
          case Exchange::Outcome::kNoResponse: {
            // A kept-alive upstream the server closed while it sat idle: once more on a new one
            // (only without a body: a body may be half sent).
            if (reused && x.nothing_read && attempt == 0 &&
                req.framing.kind == http::Framing::Kind::kNone) {
              CloseUpstream(*c);
              continue;
            }
            Verdict v = !upload->malformed.empty()
                            ? Verdict{false, "malformed", upload->malformed}
                            : Verdict{false, "upstream",
                                      "no valid response from " + HostPort(ev.name, req.port) +
                                          ": " + x.why};
            Deny(ev, v);
            std::string reply = DenyReply(v);
            co_await Finish(c, std::move(reply), /*linger=*/upload->finished);
            co_return;
          }
          case Exchange::Outcome::kBroken:
            Close(c);
            co_return;
          case Exchange::Outcome::kComplete:
            done = true;
            break;
        }
        if (!upload->done) {  // the server answered before the body ended
          Close(c);
          co_return;
        }
        if (!x.upstream_may_continue) CloseUpstream(*c);
        if (!x.client_may_continue) {
          std::string no_reply;
          co_await Finish(c, std::move(no_reply));
          co_return;
        }
      }
    }
  }

  // The request's destination and the head to forward, or the refusal. Origin-form, Host from the
  // URL (or the client's Host), without the hop-by-hop fields, those the Connection field lists,
  // and the framing fields (written from the framing the proxy read).
  std::expected<Request, Verdict> Prepare(const Connection& c, const http::Head& head,
                                          EgressEvent& ev) {
    auto refuse = [](std::string rule, std::string why) {
      return std::unexpected(Verdict{false, std::move(rule), std::move(why)});
    };
    const bool transparent = c.original.has_value();
    const bool open = c.policy.mode() == NetworkMode::kOpen;
    const auto hosts = head.Values("host");
    std::optional<Authority> target;
    std::string path;
    std::string_view t = head.target;
    if (t.size() > 7 && IEquals(t.substr(0, 7), "http://")) {
      std::string_view rest = t.substr(7);
      const size_t slash = rest.find_first_of("/?#");
      const std::string_view authority = rest.substr(0, slash);
      path = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
      if (path[0] != '/') path = "/" + path;
      if (authority.find('@') != std::string_view::npos) {
        return refuse("malformed", "user information in a URL is not accepted");
      }
      target = SplitAuthority(authority);
      if (!target) return refuse("malformed", "malformed URL authority");
      if (!hosts.empty()) {
        auto h = SplitAuthority(hosts[0]);
        if (!h || !SameHost(h->host, target->host)) {
          ev.name = target->host;
          return refuse("host-mismatch", "the Host header differs from the URL's host");
        }
      }
    } else if (t.size() > 8 && IEquals(t.substr(0, 8), "https://")) {
      return refuse("malformed", "send https through CONNECT");
    } else if (!transparent) {
      return refuse("malformed",
                    "this is an egress proxy: send CONNECT host:port or an absolute http:// URL");
    } else if (t[0] != '/') {
      return refuse("malformed", "malformed request target");
    } else {
      path = std::string(t);
      if (!hosts.empty()) {
        target = SplitAuthority(hosts[0]);
        if (!target) return refuse("malformed", "malformed Host header");
      } else if (!open) {
        return refuse("malformed", "no Host header");
      }  // open mode without a Host: judged by the address alone
    }
    Request req;
    req.method = head.method;
    if (target) req.host = target->host;
    if (transparent) {
      req.port = c.original->port();
      if (target && target->port && *target->port != req.port) {
        ev.name = target->host;
        ev.port = req.port;
        return refuse("port", "the Host header's port differs from the port dialled (" +
                                  std::to_string(req.port) + ")");
      }
    } else {
      req.port = target->port.value_or(80);
    }
    // Plain HTTP is never intercepted: a placeholder in it would go out as it is, to a host that
    // may log it, bound or not. The value goes only over TLS the proxy terminates.
    if (const SecretBinding* b =
            ForeignPlaceholderIn(head.fields, head.target, "", c.policy.secrets())) {
      ev.name = req.host;
      ev.port = req.port;
      return refuse("secret", "the placeholder of secret " + b->secret +
                                  " is in a plain-HTTP "
                                  "request to " +
                                  HostPort(req.host, req.port) +
                                  ": secrets go only over HTTPS to the hosts they are bound to");
    }
    auto framing = http::RequestFraming(head);
    if (!framing) return refuse("malformed", framing.error().message());
    req.framing = *framing;
    req.http10 = head.version == "HTTP/1.0";
    req.client_keeps = !req.http10 && !head.ConnectionHas("close");

    req.head = head.method + " " + path + " HTTP/1.1\r\n";
    if (target) req.head += "Host: " + HostField(*target) + "\r\n";
    const std::vector<std::string> listed = head.ConnectionOptions();
    for (const auto& [k, v] : head.fields) {
      if (IEquals(k, "host") || IEquals(k, "content-length") || http::IsHopByHop(k)) continue;
      bool is_listed = false;
      for (const std::string& l : listed) is_listed = is_listed || IEquals(k, l);
      if (!is_listed) req.head += k + ": " + v + "\r\n";
    }
    return req;
  }

  // A kept-alive upstream connection still usable: nothing to read (no EOF, no stray bytes).
  static bool UpstreamIdle(Connection& c) {
    char byte;
    const ssize_t n = ::recv(c.upstream.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }

  // The request body, client -> upstream, as the framing says; what follows it stays in c->in.
  // A malformed chunked body, or one the client ends early, stops it: the upstream connection is
  // closed (it has had a prefix of well-formed chunks, never a whole message), and `upload` says
  // why.
  asio::awaitable<void> SendBody([[maybe_unused]] std::shared_ptr<State> self,
                                 std::shared_ptr<Connection> c, http::Framing framing,
                                 std::shared_ptr<Upload> upload) {
    struct Finished {
      Upload& u;
      ~Finished() { u.finished = true; }
    } finished{*upload};
    auto refuse = [&](std::string why) {
      upload->malformed = std::move(why);
      error_code ignored;
      c->upstream.close(ignored);  // the response will never come: stop waiting for it
    };
    error_code ec;
    std::vector<char> chunk(kChunkBytes);
    auto up = [&](std::string_view bytes) -> asio::awaitable<bool> {
      if (bytes.empty()) co_return true;
      co_await asio::async_write(c->upstream, asio::buffer(bytes.data(), bytes.size()),
                                 asio::redirect_error(asio::use_awaitable, ec));
      c->link.bytes_up += bytes.size();
      co_return !ec && !c->closed;
    };
    auto read = [&]() -> asio::awaitable<size_t> {
      size_t n = co_await c->client.async_read_some(asio::buffer(chunk),
                                                    asio::redirect_error(asio::use_awaitable, ec));
      if (c->closed) co_return 0;
      if (ec) {
        refuse("the request body ended early: " + ec.message());
        co_return 0;
      }
      SetDeadline(*c, limits.idle_timeout);
      co_return n;
    };
    if (framing.kind == http::Framing::Kind::kLength) {
      uint64_t left = framing.length;
      while (left > 0) {
        if (c->in.empty()) {
          size_t n = co_await read();
          if (n == 0) co_return;
          c->in.append(chunk.data(), n);
        }
        const size_t take = static_cast<size_t>(std::min<uint64_t>(left, c->in.size()));
        std::string part = TakeFront(c->in, take);
        left -= take;
        if (!co_await up(part)) co_return;
      }
    } else if (framing.kind == http::Framing::Kind::kChunked) {
      http::ChunkedDecoder decoder;
      while (!decoder.done()) {
        if (c->in.empty()) {
          size_t n = co_await read();
          if (n == 0) co_return;
          c->in.append(chunk.data(), n);
        }
        std::string data;
        auto used = decoder.Feed(c->in, &data);
        if (!used) {
          refuse(used.error().message());
          co_return;
        }
        c->in.erase(0, *used);
        std::string encoded = http::EncodeChunk(data);
        if (!co_await up(encoded)) co_return;
      }
      if (!co_await up(http::kLastChunk)) co_return;
    }
    upload->done = true;
  }

  // The response, upstream -> client: interim 1xx responses, then the final one, its head
  // rewritten (hop-by-hop fields out, the framing written by the proxy) and its body forwarded as
  // its framing says.
  asio::awaitable<Exchange> ForwardResponse(std::shared_ptr<Connection> c, const Request& req) {
    Exchange x;
    std::string& buf = c->from_upstream;
    std::vector<char> chunk(kChunkBytes);
    error_code ec;
    bool sent = false;  // bytes of a response reached the client
    auto read = [&]() -> asio::awaitable<bool> {
      size_t n = co_await c->upstream.async_read_some(
          asio::buffer(chunk), asio::redirect_error(asio::use_awaitable, ec));
      if (ec || c->closed) co_return false;
      x.nothing_read = false;
      buf.append(chunk.data(), n);
      SetDeadline(*c, limits.idle_timeout);
      co_return true;
    };
    auto down = [&](std::string_view bytes) -> asio::awaitable<bool> {
      if (bytes.empty()) co_return true;
      co_await asio::async_write(c->client, asio::buffer(bytes.data(), bytes.size()),
                                 asio::redirect_error(asio::use_awaitable, ec));
      c->link.bytes_down += bytes.size();
      sent = true;
      co_return !ec && !c->closed;
    };
    auto failed = [&](std::string why) {
      x.outcome = sent ? Exchange::Outcome::kBroken : Exchange::Outcome::kNoResponse;
      x.why = std::move(why);
      return x;
    };
    while (true) {
      size_t end;
      while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
        if (buf.size() > limits.max_response_header_bytes) {
          co_return failed("response head over " +
                           std::to_string(limits.max_response_header_bytes) + " bytes");
        }
        if (!co_await read()) {
          co_return failed(ec == asio::error::eof ? "the server closed the connection"
                                                  : ec.message());
        }
      }
      auto head = http::ParseResponseHead(std::string_view(buf).substr(0, end + 4));
      if (!head) co_return failed("malformed response: " + head.error().message());
      auto framing = http::ResponseFraming(*head, req.method);
      if (!framing) co_return failed("malformed response: " + framing.error().message());
      if (head->status == 101) co_return failed("the server switched protocols (101)");
      buf.erase(0, end + 4);
      const bool interim = head->status / 100 == 1;
      if (interim && req.http10) continue;  // HTTP/1.0 has no interim responses
      const bool chunked = framing->kind == http::Framing::Kind::kChunked;
      const bool until_close = framing->kind == http::Framing::Kind::kUntilClose;
      // An HTTP/1.0 client gets a chunked body de-chunked, ended by the close.
      const bool client_keeps = req.client_keeps && !until_close;

      std::string out = "HTTP/1.1 " + std::to_string(head->status) + " " + head->reason + "\r\n";
      const std::vector<std::string> listed = head->ConnectionOptions();
      for (const auto& [k, v] : head->fields) {
        if (http::IsHopByHop(k)) continue;
        // A body-less response's Content-Length describes the representation: kept.
        if (IEquals(k, "content-length") && framing->kind != http::Framing::Kind::kNone) continue;
        bool is_listed = false;
        for (const std::string& l : listed) is_listed = is_listed || IEquals(k, l);
        if (!is_listed) out += k + ": " + v + "\r\n";
      }
      if (framing->kind == http::Framing::Kind::kLength) {
        out += "Content-Length: " + std::to_string(framing->length) + "\r\n";
      } else if (chunked && !req.http10) {
        out += "Transfer-Encoding: chunked\r\n";
      } else if (until_close) {
        for (std::string_view coding : head->Values("transfer-encoding")) {
          out += "Transfer-Encoding: " + std::string(coding) + "\r\n";
        }
      }
      if (!interim && !client_keeps) out += "Connection: close\r\n";
      out += "\r\n";
      if (!co_await down(out)) co_return failed(ec.message());
      if (interim) continue;

      switch (framing->kind) {
        case http::Framing::Kind::kNone:
          break;
        case http::Framing::Kind::kLength: {
          uint64_t left = framing->length;
          while (left > 0) {
            if (buf.empty() && !co_await read()) co_return failed("the response ended early");
            const size_t take = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
            std::string part = TakeFront(buf, take);
            left -= take;
            if (!co_await down(part)) co_return failed(ec.message());
          }
          break;
        }
        case http::Framing::Kind::kChunked: {
          http::ChunkedDecoder decoder;
          while (!decoder.done()) {
            if (buf.empty() && !co_await read()) co_return failed("the response ended early");
            std::string data;
            auto used = decoder.Feed(buf, &data);
            if (!used) co_return failed("malformed chunked response: " + used.error().message());
            buf.erase(0, *used);
            std::string part = req.http10 ? std::move(data) : http::EncodeChunk(data);
            if (!co_await down(part)) co_return failed(ec.message());
          }
          if (!req.http10 && !co_await down(http::kLastChunk)) co_return failed(ec.message());
          break;
        }
        case http::Framing::Kind::kUntilClose: {
          while (true) {
            std::string part = std::move(buf);
            buf.clear();
            if (!co_await down(part)) co_return failed(ec.message());
            if (!co_await read()) break;
          }
          if (ec != asio::error::eof) co_return failed(ec.message());
          break;
        }
      }
      x.outcome = Exchange::Outcome::kComplete;
      x.client_may_continue = client_keeps;
      x.upstream_may_continue = !until_close && req.client_keeps && head->version == "HTTP/1.1" &&
                                !head->ConnectionHas("close") && buf.empty();
      co_return x;
    }
  }

  // --- CONNECT ---

  asio::awaitable<void> ServeConnect(std::shared_ptr<State> self, std::shared_ptr<Connection> c,
                                     http::Head head, size_t head_end, EgressEvent ev) {
    std::optional<Authority> target = SplitAuthority(head.target);
    std::optional<Verdict> refused;
    if (c->original) {
      refused = Verdict{false, "malformed", "CONNECT is for the explicit proxy"};
    } else if (!target || !target->port) {
      refused = Verdict{false, "malformed", "CONNECT needs host:port"};
    }
    if (refused) {
      co_await Refuse(c, ev, *refused, /*http_client=*/true);
      co_return;
    }
    CloseUpstream(*c);         // a CONNECT after plain requests on one connection
    c->in.erase(0, head_end);  // what is left: bytes the client sent ahead of our 200
    Decision d = co_await Judge(c, target->host, *target->port, /*dial_original=*/false);
    if (c->closed) co_return;
    ev.name = d.dest.name;
    ev.port = *target->port;
    ev.dest = d.shown;
    if (!d.verdict.allowed) {
      co_await Refuse(c, ev, d.verdict, /*http_client=*/true);
      co_return;
    }
    static constexpr std::string_view kEstablished = "HTTP/1.1 200 Connection established\r\n\r\n";
    error_code ec;
    if (d.dest.by == JudgedBy::kName && c->policy.HasSecretsFor(d.dest.name)) {
      // A tunnel to a host with secrets bound: it must carry TLS to that very name, which the
      // proxy terminates; anything else (another protocol, another name) is refused.
      co_await asio::async_write(c->client, asio::buffer(kEstablished),
                                 asio::redirect_error(asio::use_awaitable, ec));
      HeadRead hello;
      if (!ec) hello = co_await ReadHead(c, /*allow_tls=*/true);
      if (c->closed || hello.kind == HeadRead::Kind::kGone) {
        Close(c);
        co_return;
      }
      ev.sni = hello.hello.sni;
      if (hello.kind != HeadRead::Kind::kTls ||
          hello.hello.state != ClientHelloScan::State::kComplete) {
        Verdict v{false, "secret",
                  "the tunnel to " + d.dest.name +
                      ", which has secrets bound, must carry TLS the proxy can terminate"};
        co_await Refuse(c, ev, v, /*http_client=*/false);
        co_return;
      }
      if (!SameHost(hello.hello.sni, d.dest.name)) {
        Verdict v{
            false, "sni",
            "TLS server name " + hello.hello.sni + " differs from the CONNECT host " + d.dest.name};
        co_await Refuse(c, ev, v, /*http_client=*/false);
        co_return;
      }
      std::string hello_bytes = std::move(c->in);
      c->in.clear();
      co_await Intercept(c, ev, d, d.dest.name, *target->port, std::move(hello_bytes));
      co_return;
    }
    if (!co_await Connect(c, ev, d)) {
      std::string reply = DenyReply(d.verdict);
      if (!c->closed) co_await Finish(c, std::move(reply));
      co_return;
    }
    co_await asio::async_write(c->client, asio::buffer(kEstablished),
                               asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      Close(c);
      co_return;
    }
    std::string first = std::move(c->in);
    c->in.clear();
    StartTunnel(self, c, std::move(first), /*inspect=*/d.dest.by == JudgedBy::kName);
  }

  // --- Tunnels (CONNECT, transparent TLS): bytes both ways ---

  void StartTunnel(const std::shared_ptr<State>& self, const std::shared_ptr<Connection>& c,
                   std::string first, bool inspect) {
    SetDeadline(*c, limits.idle_timeout);
    c->pumps = 2;
    asio::co_spawn(io, PumpUp(self, c, std::move(first), inspect), asio::detached);
    asio::co_spawn(io, PumpDown(self, c), asio::detached);
  }

  // Sandbox -> destination. `inspect`: a CONNECT tunnel whose first bytes, if TLS, must name the
  // CONNECT host. `self` keeps the state alive while the pump runs.
  asio::awaitable<void> PumpUp([[maybe_unused]] std::shared_ptr<State> self,
                               std::shared_ptr<Connection> c, std::string first, bool inspect) {
    error_code ec;
    std::vector<char> chunk(kChunkBytes);
    std::string pending = std::move(first);
    // With secrets bound, TLS to one of their hosts is never let through a tunnel unread (one to
    // an address, say): the proxy would not see what it carries.
    const bool secrets = !c->policy.secrets().empty();
    while ((inspect || secrets) && !c->closed) {
      if (!pending.empty() && !LooksLikeTls(pending)) break;  // not TLS: nothing to compare
      if (!pending.empty()) {
        ClientHelloScan scan = ScanClientHello(pending);
        if (scan.state == ClientHelloScan::State::kComplete && secrets &&
            c->policy.HasSecretsFor(NormaliseName(scan.sni).value_or(scan.sni)) &&
            !SameHost(scan.sni, c->link.name)) {
          EgressEvent ev = c->link;
          ev.sni = scan.sni;
          Deny(ev, Verdict{false, "secret",
                           "TLS to " + scan.sni +
                               ", which has secrets bound, through a tunnel "
                               "to " +
                               c->link.name});
          Close(c);
          co_return;
        }
        if (!inspect && scan.state != ClientHelloScan::State::kNeedMore) break;
        if (scan.state == ClientHelloScan::State::kComplete && SameHost(scan.sni, c->link.name)) {
          c->link.sni = scan.sni;
          break;
        }
        if (scan.state == ClientHelloScan::State::kComplete && scan.sni.empty()) break;
        if (scan.state != ClientHelloScan::State::kNeedMore ||
            pending.size() > limits.max_header_bytes) {
          EgressEvent ev = c->link;
          ev.sni = scan.sni;
          Verdict v{false, "sni",
                    scan.state == ClientHelloScan::State::kInvalid
                        ? "malformed TLS ClientHello in the tunnel: " + scan.error
                        : "TLS server name " + scan.sni + " differs from the CONNECT host " +
                              c->link.name};
          Deny(ev, v);
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
      c->link.bytes_up += pending.size();
    }
    while (!ec && !c->closed) {
      size_t n = co_await c->client.async_read_some(asio::buffer(chunk),
                                                    asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      SetDeadline(*c, limits.idle_timeout);
      co_await asio::async_write(c->upstream, asio::buffer(chunk.data(), n),
                                 asio::redirect_error(asio::use_awaitable, ec));
      c->link.bytes_up += n;
    }
    if (ec == asio::error::eof && !c->closed) {
      error_code ignored;
      c->upstream.shutdown(tcp::socket::shutdown_send, ignored);  // pass the half-close on
    } else if (ec) {
      Close(c);
    }
    if (--c->pumps == 0) Close(c);
  }

  // Destination -> sandbox.
  asio::awaitable<void> PumpDown([[maybe_unused]] std::shared_ptr<State> self,
                                 std::shared_ptr<Connection> c) {
    error_code ec;
    std::vector<char> chunk(kChunkBytes);
    while (!c->closed) {
      size_t n = co_await c->upstream.async_read_some(
          asio::buffer(chunk), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      SetDeadline(*c, limits.idle_timeout);
      co_await asio::async_write(c->client, asio::buffer(chunk.data(), n),
                                 asio::redirect_error(asio::use_awaitable, ec));
      if (ec) break;
      c->link.bytes_down += n;
    }
    if (ec == asio::error::eof && !c->closed) {
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
                                                        const std::vector<tcp::endpoint>& listen,
                                                        ProxyHooks hooks, ProxyLimits limits) {
  AIRLOCK_CHECK(hooks.policy_for && hooks.resolve && !listen.empty());
  auto state = std::make_shared<State>(io, std::move(hooks), limits);
  // A port the kernel picked for the first endpoint may be taken on another family: a few tries.
  const int tries = listen[0].port() == 0 ? 8 : 1;
  error_code ec;
  tcp::endpoint failed;
  for (int attempt = 0; attempt < tries; ++attempt) {
    state->acceptors.clear();
    uint16_t port = listen[0].port();
    ec.clear();
    for (const tcp::endpoint& requested : listen) {
      tcp::endpoint ep(requested.address(), port);
      auto acceptor = std::make_unique<tcp::acceptor>(io);
      acceptor->open(ep.protocol(), ec);
      if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
      if (!ec && ep.address().is_v6()) acceptor->set_option(asio::ip::v6_only(true), ec);
      if (!ec) acceptor->bind(ep, ec);
      if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
      if (!ec && port == 0) port = acceptor->local_endpoint(ec).port();
      if (ec) {
        failed = ep;
        break;
      }
      state->acceptors.push_back(std::move(acceptor));
    }
    if (!ec) {
      state->listen_port = port;
      break;
    }
    if (ec != asio::error::address_in_use) break;
  }
  if (ec) {
    state->acceptors.clear();
    return Fail(CodeForErrno(ec.value()), "egress proxy: listening on " +
                                              HostPort(failed.address(), failed.port()) + ": " +
                                              ec.message());
  }
  for (auto& acceptor : state->acceptors) {
    tcp::acceptor* a = acceptor.get();
    asio::co_spawn(
        io, [state, a]() { return state->Accept(*a); }, asio::detached);
  }
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
  auto judge = [policy](const Destination& d) {
    return policy ? Rejudge(*policy, d)
                  : Verdict{false, "no-policy", "the sandbox no longer has a network policy"};
  };
  std::vector<std::shared_ptr<Connection>> doomed;
  {
    std::lock_guard lock(state_->mu);
    for (const auto& [id, c] : state_->connections) {
      if (c->client_ip == client && c->dest && !judge(*c->dest).allowed) doomed.push_back(c);
    }
  }
  for (auto& c : doomed) {
    // Judged again on the io thread: a kept-alive connection may have moved on meanwhile.
    asio::post(state_->io, [state = state_, c = c, judge] {
      std::optional<Destination> dest;
      {
        std::lock_guard lock(state->mu);
        dest = c->dest;
      }
      if (c->closed || !dest) return;
      Verdict v = judge(*dest);
      if (v.allowed) return;
      EgressEvent event = c->link;
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
    for (auto& acceptor : state->acceptors) acceptor->close(ignored);
    for (const auto& c : all) state->Close(c);
  });
}

}  // namespace airlock::net
