// The egress proxy on loopback. Origin servers on 127.0.0.1 (and ::1) stand in for the internet:
// the test's resolve hook maps test names to them, and its policies call
// TreatLoopbackAsPublicForTests so a resolved 127.0.0.1 passes the re-check (production policies
// never do: loopback is on the always-deny list). Transparent connections get an injected
// original destination: in allowlist mode one in 203.0.113.0/24, an address the proxy must never
// dial; in open mode a loopback origin, or a denied address that the proxy's upstream sockets,
// bound to the loopback interface, could not reach even if it dialled one. No traffic leaves the
// machine; the redirect test works in a network namespace of its own.

#include "net/egress_proxy.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "net/tls_client_hello.h"

namespace airlock::net {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

// --- Origin servers: an echo server that records what it got, and an HTTP server ---

struct Origin {
  explicit Origin(asio::io_context& io, const std::string& address = "127.0.0.1") : acceptor(io) {
    tcp::endpoint ep(asio::ip::make_address(address), 0);
    acceptor.open(ep.protocol());
    if (ep.address().is_v6()) acceptor.set_option(asio::ip::v6_only(true));
    acceptor.bind(ep);
    acceptor.listen();
    port = acceptor.local_endpoint().port();
  }
  std::string Received() {
    std::lock_guard lock(mu);
    return received;
  }
  // The HTTP origin's requests, each as it came on the wire (head and body).
  std::vector<std::string> Requests() {
    std::lock_guard lock(mu);
    return requests;
  }

  tcp::acceptor acceptor;
  uint16_t port = 0;
  std::atomic<int> connections{0};
  std::mutex mu;
  std::string received;
  std::vector<std::string> requests;
};

asio::awaitable<void> EchoSession(Origin* o, tcp::socket socket) {
  error_code ec;
  std::vector<char> chunk(16384);
  while (true) {
    size_t n = co_await socket.async_read_some(asio::buffer(chunk),
                                               asio::redirect_error(asio::use_awaitable, ec));
    if (ec) break;
    {
      std::lock_guard lock(o->mu);
      o->received.append(chunk.data(), n);
    }
    co_await asio::async_write(socket, asio::buffer(chunk.data(), n),
                               asio::redirect_error(asio::use_awaitable, ec));
    if (ec) break;
  }
  socket.shutdown(tcp::socket::shutdown_send, ec);
}

// HTTP/1.1 with keep-alive. Reads each request's body by its Content-Length or chunked framing
// (as the proxy writes it: no extensions, no trailers), records the request, and answers by
// path: /chunked (a chunked body), /eof (no framing: the body ends with the close), /close
// (Content-Length and Connection: close), /204, /early (413 before reading the body, then
// close), /bad (two Content-Lengths), anything else "hello world" with a Content-Length. An
// `Expect: 100-continue` gets its 100 first.
asio::awaitable<void> HttpSession(Origin* o, tcp::socket socket) {
  error_code ec;
  std::vector<char> chunk(16384);
  std::string buf;
  std::string raw;  // the request being read, as it came
  auto fill = [&]() -> asio::awaitable<bool> {
    size_t n = co_await socket.async_read_some(asio::buffer(chunk),
                                               asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return false;
    buf.append(chunk.data(), n);
    std::lock_guard lock(o->mu);
    o->received.append(chunk.data(), n);
    co_return true;
  };
  auto take = [&](size_t n) {
    std::string out = buf.substr(0, n);
    raw += out;
    buf.erase(0, n);
    return out;
  };
  auto send = [&](std::string text) -> asio::awaitable<void> {
    co_await asio::async_write(socket, asio::buffer(text),
                               asio::redirect_error(asio::use_awaitable, ec));
  };
  while (true) {
    raw.clear();
    size_t end;
    while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (!co_await fill()) co_return;
    }
    const std::string head = take(end + 4);
    const std::string path =
        head.substr(head.find(' ') + 1, head.find(' ', head.find(' ') + 1) - head.find(' ') - 1);
    const bool close = head.find("Connection: close\r\n") != std::string::npos;
    if (path == "/early") {
      std::string reply =
          "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      co_await send(reply);
      break;
    }
    if (head.find("Expect: 100-continue\r\n") != std::string::npos) {
      std::string interim = "HTTP/1.1 100 Continue\r\n\r\n";
      co_await send(interim);
    }
    if (size_t at = head.find("Content-Length: "); at != std::string::npos) {
      const size_t n = std::stoul(head.substr(at + 16));
      while (buf.size() < n) {
        if (!co_await fill()) co_return;
      }
      take(n);
    } else if (head.find("Transfer-Encoding: chunked\r\n") != std::string::npos) {
      while (true) {
        size_t eol;
        while ((eol = buf.find("\r\n")) == std::string::npos) {
          if (!co_await fill()) co_return;
        }
        const size_t size = std::stoul(take(eol + 2), nullptr, 16);
        while (buf.size() < size + 2) {
          if (!co_await fill()) co_return;
        }
        take(size + 2);
        if (size == 0) break;
      }
    }
    {
      std::lock_guard lock(o->mu);
      o->requests.push_back(raw);
    }
    std::string reply;
    bool last = close;
    if (path == "/chunked") {
      reply =
          "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n"
          "0\r\nT: 1\r\n\r\n";
    } else if (path == "/eof") {
      reply = "HTTP/1.1 200 OK\r\n\r\nuntil the close";
      last = true;
    } else if (path == "/close") {
      reply = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbye";
      last = true;
    } else if (path == "/204") {
      reply = "HTTP/1.1 204 No Content\r\n\r\n";
    } else if (path == "/bad") {
      reply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok";
      last = true;
    } else if (head.starts_with("HEAD ")) {
      reply = "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n";
    } else {
      reply = std::string("HTTP/1.1 200 OK\r\nContent-Length: 11\r\n") +
              (close ? "Connection: close\r\n" : "") + "\r\nhello world";
    }
    co_await send(reply);
    if (ec || last) break;
  }
  socket.shutdown(tcp::socket::shutdown_send, ec);
}

asio::awaitable<void> OriginAccept(Origin* o, bool http) {
  while (true) {
    error_code ec;
    tcp::socket socket =
        co_await o->acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return;
    ++o->connections;
    asio::co_spawn(o->acceptor.get_executor(),
                   http ? HttpSession(o, std::move(socket)) : EchoSession(o, std::move(socket)),
                   asio::detached);
  }
}

// --- Blocking client sockets ---

struct Fd {
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& other) noexcept : fd(std::exchange(other.fd, -1)), pending(std::move(other.pending)) {}
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd, other.fd);
    std::swap(pending, other.pending);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) close(fd);
  }
  int fd;
  std::string pending;  // read past the last reply (ReadReply)
};

void SendAll(const Fd& s, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(s.fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// Reads until `stop` says so, EOF, an error or 5 s.
std::string ReadUntil(const Fd& s, const std::function<bool(const std::string&)>& stop) {
  std::string out;
  char buf[4096];
  while (!stop(out)) {
    ssize_t n = recv(s.fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}
std::string ReadAll(const Fd& s) {
  return ReadUntil(s, [](const std::string&) { return false; });
}
std::string ReadHead(const Fd& s) {
  return ReadUntil(s, [](const std::string& b) { return b.find("\r\n\r\n") != std::string::npos; });
}
std::string ReadN(const Fd& s, size_t n) {
  return ReadUntil(s, [n](const std::string& b) { return b.size() >= n; });
}

// The value of a field in a response head ("" when absent), by exact name.
std::string Field(const std::string& head, const std::string& name) {
  const size_t at = head.find("\r\n" + name + ": ");
  if (at == std::string::npos) return "";
  const size_t from = at + name.size() + 4;
  return head.substr(from, head.find("\r\n", from) - from);
}

struct Reply {
  int status = 0;  // 0: no whole reply came
  std::string head;
  std::string body;  // de-chunked
};

// Reads one response on a kept-alive connection: the head, then the body by its Content-Length
// or chunked framing (none for `no_body`, a HEAD's or a 1xx's). What comes after stays in
// s.pending for the next call.
Reply ReadReply(Fd& s, bool no_body = false) {
  Reply r;
  auto fill = [&] {
    char buf[4096];
    ssize_t n = recv(s.fd, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    s.pending.append(buf, static_cast<size_t>(n));
    return true;
  };
  size_t end;
  while ((end = s.pending.find("\r\n\r\n")) == std::string::npos) {
    if (!fill()) return r;
  }
  r.head = s.pending.substr(0, end + 4);
  s.pending.erase(0, end + 4);
  if (!no_body && !Field(r.head, "Content-Length").empty()) {
    const size_t n = std::stoul(Field(r.head, "Content-Length"));
    while (s.pending.size() < n) {
      if (!fill()) return r;
    }
    r.body = s.pending.substr(0, n);
    s.pending.erase(0, n);
  } else if (!no_body && Field(r.head, "Transfer-Encoding") == "chunked") {
    while (true) {
      size_t eol;
      while ((eol = s.pending.find("\r\n")) == std::string::npos) {
        if (!fill()) return r;
      }
      const size_t size = std::stoul(s.pending.substr(0, eol), nullptr, 16);
      while (s.pending.size() < eol + 2 + size + 2) {
        if (!fill()) return r;
      }
      r.body += s.pending.substr(eol + 2, size);
      s.pending.erase(0, eol + 2 + size + 2);
      if (size == 0) break;
    }
  } else if (!no_body && r.head.find("Connection: close\r\n") != std::string::npos) {
    r.body = s.pending + ReadAll(s);
    s.pending.clear();
  }
  r.status = std::stoi(r.head.substr(9, 3));
  return r;
}

// True when the peer closed: recv sees EOF or a reset within 5 s (not the timeout).
bool Closed(const Fd& s) {
  char c;
  const ssize_t n = recv(s.fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

// A TLS 1.3-style ClientHello record; `sni` empty: no server_name extension.
std::string ClientHello(const std::string& sni) {
  auto u16 = [](size_t v) { return std::string{static_cast<char>(v >> 8), static_cast<char>(v)}; };
  std::string ext;
  if (!sni.empty()) {
    std::string entry = std::string(1, '\0') + u16(sni.size()) + sni;
    std::string data = u16(entry.size()) + entry;
    ext += u16(0) + u16(data.size()) + data;
  }
  ext += u16(0x2b) + u16(3) + std::string("\x02\x03\x04", 3);  // supported_versions
  std::string body = std::string("\x03\x03", 2) + std::string(32, 'r') + std::string(1, '\0') +
                     u16(2) + std::string("\x13\x01", 2) + std::string("\x01\x00", 2) +
                     u16(ext.size()) + ext;
  std::string hs = std::string(1, '\x01') + std::string(1, '\0') + u16(body.size()) + body;
  return std::string("\x16\x03\x01", 3) + u16(hs.size()) + hs;
}

class EgressProxyTest : public testing::Test {
 protected:
  void SetUp() override {
    echo_ = std::make_unique<Origin>(io_);
    echo2_ = std::make_unique<Origin>(io_);
    web_ = std::make_unique<Origin>(io_);
    web2_ = std::make_unique<Origin>(io_);
    trap_ = std::make_unique<Origin>(io_);
    for (Origin* o : {echo_.get(), echo2_.get()}) {
      asio::co_spawn(io_, OriginAccept(o, false), asio::detached);
    }
    for (Origin* o : {web_.get(), web2_.get(), trap_.get()}) {
      asio::co_spawn(io_, OriginAccept(o, true), asio::detached);
    }
    SetPolicy(R"({"mode":"allowlist","allow":["a.test","b.test","web.test","tls.test",
                  "rebind.test","pinned.test:)" +
              std::to_string(echo_->port) + R"("]})");
    names_ = {{"a.test", {"127.0.0.1"}},           {"b.test", {"127.0.0.1"}},
              {"web.test", {"127.0.0.1"}},         {"tls.test", {"127.0.0.1"}},
              {"evil.test", {"127.0.0.1"}},        {"pinned.test", {"127.0.0.1"}},
              {"rebind.test", {"169.254.169.254"}}};
  }

  // The proxy on 127.0.0.1 and ::1 (one port); clients from either are the sandbox.
  void StartProxy(ProxyLimits limits = {}, SocketFactory open_socket = {}) {
    ProxyHooks hooks;
    hooks.open_socket = std::move(open_socket);
    hooks.policy_for = [this](const IpAddress& client) -> std::optional<NetworkPolicy> {
      std::lock_guard lock(mu_);
      if (client != asio::ip::make_address("127.0.0.1") && client != asio::ip::make_address("::1"))
        return std::nullopt;
      return policy_;
    };
    hooks.resolve = [this](const std::string& name) -> Result<std::vector<IpAddress>> {
      ++resolves_;
      auto it = names_.find(name);
      if (it == names_.end()) return Fail(ErrorCode::kNotFound, "NXDOMAIN");
      std::vector<IpAddress> out;
      for (const auto& text : it->second) out.push_back(asio::ip::make_address(text));
      return out;
    };
    hooks.on_event = [this](const EgressEvent& e) {
      std::lock_guard lock(mu_);
      events_.push_back(e);
      cv_.notify_all();
    };
    hooks.original_destination = [this](tcp::socket& s) -> std::optional<tcp::endpoint> {
      std::lock_guard lock(mu_);
      auto it = originals_.find(s.remote_endpoint());
      if (it == originals_.end()) return std::nullopt;
      return it->second;
    };
    std::vector<tcp::endpoint> listen = {tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)};
    if (Ipv6Loopback()) listen.emplace_back(asio::ip::make_address("::1"), 0);
    auto proxy = EgressProxy::Start(io_, listen, std::move(hooks), limits);
    ASSERT_TRUE(proxy.has_value()) << proxy.error().message();
    proxy_ = std::move(*proxy);
    thread_ = std::thread([this] { io_.run(); });
  }

  static bool Ipv6Loopback() {
    Fd s(socket(AF_INET6, SOCK_STREAM, 0));
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_loopback;
    return s.fd >= 0 && bind(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }

  void TearDown() override {
    if (proxy_) proxy_->Stop();
    asio::post(io_, [this] {
      for (Origin* o : {echo_.get(), echo2_.get(), web_.get(), web2_.get(), trap_.get()}) {
        o->acceptor.close();
      }
    });
    work_.reset();
    if (thread_.joinable()) {
      // Let Stop close everything, then stop whatever origin sessions remain.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      io_.stop();
      thread_.join();
    }
    proxy_.reset();
  }

  void SetPolicy(const std::string& json_text) {
    auto p = NetworkPolicy::FromJson(nlohmann::json::parse(json_text));
    ASSERT_TRUE(p.has_value()) << p.error().message();
    p->TreatLoopbackAsPublicForTests();
    std::lock_guard lock(mu_);
    policy_ = std::move(*p);
  }

  // A client of the proxy from `from` (127.0.0.1 or ::1); `original`: a transparent connection
  // that nftables would have redirected from there.
  Fd Dial(std::optional<tcp::endpoint> original = std::nullopt,
          const std::string& from = "127.0.0.1") {
    const tcp::endpoint local(asio::ip::make_address(from), 0);
    const bool v6 = local.address().is_v6();
    Fd s(socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0));
    timeval tv{5, 0};
    setsockopt(s.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    EXPECT_EQ(bind(s.fd, local.data(), local.size()), 0);
    tcp::endpoint bound = local;
    socklen_t len = static_cast<socklen_t>(bound.capacity());
    getsockname(s.fd, bound.data(), &len);
    if (original) {
      std::lock_guard lock(mu_);
      originals_[bound] = *original;
    }
    const tcp::endpoint proxy(local.address(), proxy_->port());
    EXPECT_EQ(connect(s.fd, proxy.data(), proxy.size()), 0);
    return s;
  }

  // A transparent connection that nftables would have redirected from 203.0.113.10:port (in
  // allowlist mode the proxy must never dial it).
  Fd DialTransparent(uint16_t port) {
    return Dial(tcp::endpoint(asio::ip::make_address("203.0.113.10"), port));
  }

  Fd Connect(const std::string& target, std::string* reply) {
    Fd s = Dial();
    SendAll(s, "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n");
    *reply = ReadHead(s);
    return s;
  }

  // Waits up to 5 s for an event matching `pred`.
  std::optional<EgressEvent> WaitEvent(const std::function<bool(const EgressEvent&)>& pred) {
    std::unique_lock lock(mu_);
    std::optional<EgressEvent> found;
    cv_.wait_for(lock, std::chrono::seconds(5), [&] {
      for (const auto& e : events_) {
        if (pred(e)) {
          found = e;
          return true;
        }
      }
      return false;
    });
    return found;
  }
  size_t CountEvents(const std::function<bool(const EgressEvent&)>& pred) {
    std::lock_guard lock(mu_);
    return static_cast<size_t>(std::count_if(events_.begin(), events_.end(), pred));
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  std::unique_ptr<Origin> echo_, echo2_;       // echo servers (tunnels)
  std::unique_ptr<Origin> web_, web2_, trap_;  // HTTP; trap_ is only ever named by denied hosts
  std::unique_ptr<EgressProxy> proxy_;
  std::thread thread_;
  std::atomic<int> resolves_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  NetworkPolicy policy_;
  std::map<std::string, std::vector<std::string>> names_;
  std::map<tcp::endpoint, tcp::endpoint> originals_;
  std::vector<EgressEvent> events_;
};

std::string Port(const Origin& o) { return std::to_string(o.port); }

// The origin counts a connection when its accept completes, which may be just after the proxy
// has answered the client: wait (up to 5 s) for a count that should be reached.
int WaitConnections(const Origin& o, int want) {
  for (int i = 0; i < 500 && o.connections.load() < want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return o.connections.load();
}

// Waits (up to 5 s) for the origin to have `want` requests.
std::vector<std::string> WaitRequests(Origin& o, size_t want) {
  for (int i = 0; i < 500 && o.Requests().size() < want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return o.Requests();
}

// --- CONNECT ---

TEST_F(EgressProxyTest, ConnectAllowedSplicesBothWays) {
  StartProxy();
  std::string reply;
  Fd s = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_EQ(reply, "HTTP/1.1 200 Connection established\r\n\r\n");
  SendAll(s, "ping");
  EXPECT_EQ(ReadN(s, 4), "ping");
  SendAll(s, std::string(100000, 'x'));
  EXPECT_EQ(ReadN(s, 100000).size(), 100000u);
  shutdown(s.fd, SHUT_WR);
  EXPECT_EQ(ReadAll(s), "");  // the origin's EOF comes back through the tunnel
  EXPECT_EQ(WaitConnections(*echo_, 1), 1);

  auto verdict = WaitEvent([](const EgressEvent& e) {
    return e.phase == EgressEvent::Phase::kVerdict && e.name == "a.test";
  });
  ASSERT_TRUE(verdict);
  EXPECT_TRUE(verdict->allowed);
  EXPECT_EQ(verdict->kind, EgressEvent::Kind::kConnect);
  EXPECT_EQ(verdict->rule, "a.test");
  EXPECT_EQ(verdict->client, asio::ip::make_address("127.0.0.1"));
  ASSERT_TRUE(verdict->dest);
  EXPECT_EQ(verdict->dest->to_string(), "127.0.0.1");
  auto closed =
      WaitEvent([](const EgressEvent& e) { return e.phase == EgressEvent::Phase::kClosed; });
  ASSERT_TRUE(closed);
  EXPECT_EQ(closed->bytes_up, 100004u);
  EXPECT_EQ(closed->bytes_down, 100004u);
}

// With a namespace uplink the daemon hands the proxy a socket factory: every upstream socket
// comes from it, and when it fails nothing is dialled.
TEST_F(EgressProxyTest, UpstreamSocketsComeFromTheFactory) {
  std::atomic<int> made{0};
  StartProxy({}, [&made](int domain, int type) -> Result<UniqueFd> {
    ++made;
    return UniqueFd(socket(domain, type | SOCK_CLOEXEC, 0));
  });
  std::string reply;
  Fd s = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_EQ(reply, "HTTP/1.1 200 Connection established\r\n\r\n");
  SendAll(s, "ping");
  EXPECT_EQ(ReadN(s, 4), "ping");
  EXPECT_EQ(made.load(), 1);
  EXPECT_EQ(WaitConnections(*echo_, 1), 1);
}

TEST_F(EgressProxyTest, AFailingSocketFactoryIs502AndDialsNothing) {
  StartProxy(
      {}, [](int, int) -> Result<UniqueFd> { return Fail(ErrorCode::kUnavailable, "no uplink"); });
  std::string reply;
  Fd s = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 502")) << reply;
  EXPECT_EQ(Field(reply, "X-Airlock-Deny-Rule"), "connect");
  EXPECT_EQ(echo_->connections.load(), 0);
}

TEST_F(EgressProxyTest, ConnectDeniedAnswers403WithTheReason) {
  StartProxy();
  Fd s = Dial();
  SendAll(s, "CONNECT evil.test:" + Port(*echo_) + " HTTP/1.1\r\n\r\n");
  std::string reply = ReadAll(s);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 403 Forbidden\r\n")) << reply;
  EXPECT_NE(reply.find("airlock egress: evil.test:" + Port(*echo_) +
                       " is not in this sandbox's allowlist"),
            std::string::npos)
      << reply;
  EXPECT_EQ(echo_->connections.load(), 0);
  auto denied = WaitEvent([](const EgressEvent& e) { return !e.allowed; });
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->rule, "allowlist");
  EXPECT_EQ(denied->name, "evil.test");
  // Positive control on the same proxy.
  std::string ok;
  Fd s2 = Connect("A.Test.:" + Port(*echo_), &ok);
  EXPECT_TRUE(ok.starts_with("HTTP/1.1 200")) << ok;
  EXPECT_EQ(WaitConnections(*echo_, 1), 1);
}

TEST_F(EgressProxyTest, ConnectToIpLiteralsDenied) {
  StartProxy();
  for (std::string host : {"127.0.0.1", "2130706433", "0x7f000001", "017700000001", "127.1",
                           "[::ffff:127.0.0.1]", "0x7f.1"}) {
    std::string reply;
    Fd s = Connect(host + ":" + Port(*echo_), &reply);
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 403")) << host << ": " << reply;
  }
  for (std::string host :
       {"2852039166", "0xa9fea9fe", "0251.0376.0251.0376", "169.254.43518", "[::ffff:a9fe:a9fe]"}) {
    Fd s = Dial();
    SendAll(s, "CONNECT " + host + ":80 HTTP/1.1\r\n\r\n");
    std::string reply = ReadAll(s);
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 403")) << host << ": " << reply;
    EXPECT_NE(reply.find("metadata endpoint"), std::string::npos) << host << ": " << reply;
    EXPECT_EQ(Field(reply, "X-Airlock-Deny-Rule"), "metadata") << host;
  }
  EXPECT_EQ(echo_->connections.load(), 0);
  std::string ok;  // control: the same origin by an allowed name
  Fd s = Connect("a.test:" + Port(*echo_), &ok);
  EXPECT_TRUE(ok.starts_with("HTTP/1.1 200")) << ok;
}

TEST_F(EgressProxyTest, ConnectToAllowedNameOnAnotherPortDenied) {
  StartProxy();
  std::string reply;
  Fd s = Connect("pinned.test:" + Port(*echo2_), &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 403")) << reply;
  EXPECT_EQ(echo2_->connections.load(), 0);
  Fd s2 = Connect("pinned.test:" + Port(*echo_), &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 200")) << reply;
  EXPECT_EQ(WaitConnections(*echo_, 1), 1);
}

TEST_F(EgressProxyTest, DnsRebindingToMetadataDenied) {
  StartProxy();
  std::string reply;
  Fd s = Connect("rebind.test:80", &reply);
  std::string rest = ReadAll(s);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 403")) << reply;
  EXPECT_NE((reply + rest).find("resolved to a forbidden address"), std::string::npos)
      << reply << rest;
  auto denied = WaitEvent([](const EgressEvent& e) { return e.name == "rebind.test"; });
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->rule, "metadata");
  Fd s2 = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 200")) << reply;
}

TEST_F(EgressProxyTest, UnresolvableNameIs502) {
  StartProxy();
  SetPolicy(R"({"mode":"allowlist","allow":["nowhere.test","a.test"]})");
  std::string reply;
  Fd s = Connect("nowhere.test:443", &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 502")) << reply;
  EXPECT_EQ(Field(reply, "X-Airlock-Deny-Rule"), "resolve");
}

TEST_F(EgressProxyTest, ConnectTunnelWithDifferentSniDenied) {
  StartProxy();
  std::string reply;
  Fd s = Connect("tls.test:" + Port(*echo_), &reply);
  ASSERT_TRUE(reply.starts_with("HTTP/1.1 200")) << reply;
  SendAll(s, ClientHello("evil.test"));
  EXPECT_EQ(ReadAll(s), "");
  EXPECT_EQ(echo_->Received(), "");
  auto denied = WaitEvent([](const EgressEvent& e) { return !e.allowed && e.rule == "sni"; });
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->sni, "evil.test");
  // Control: the matching name (in another case) passes and reaches the origin byte for byte.
  Fd s2 = Connect("tls.test:" + Port(*echo_), &reply);
  std::string hello = ClientHello("TLS.test");
  SendAll(s2, hello);
  EXPECT_EQ(ReadN(s2, hello.size()), hello);
}

// --- Absolute-form HTTP ---

TEST_F(EgressProxyTest, AbsoluteFormGetForwardedInOriginForm) {
  StartProxy();
  Fd s = Dial();
  SendAll(s, "GET http://web.test:" + Port(*web_) +
                 "/hello?x=1 HTTP/1.1\r\nHost: web.test:" + Port(*web_) +
                 "\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n"
                 "Connection: X-Hop\r\nX-Hop: secret\r\nTE: trailers\r\n\r\n");
  Reply reply = ReadReply(s);
  EXPECT_EQ(reply.status, 200) << reply.head;
  EXPECT_EQ(reply.body, "hello world");
  auto got = WaitRequests(*web_, 1);
  ASSERT_EQ(got.size(), 1u);
  // Origin-form, Host from the URL, the end-to-end fields only: no proxy or hop-by-hop fields,
  // nor one the Connection field named.
  EXPECT_EQ(got[0],
            "GET /hello?x=1 HTTP/1.1\r\nHost: web.test:" + Port(*web_) + "\r\nAccept: */*\r\n\r\n");
  s = Fd();  // the client goes: the upstream connection closes with it
  auto closed =
      WaitEvent([](const EgressEvent& e) { return e.phase == EgressEvent::Phase::kClosed; });
  ASSERT_TRUE(closed);
  EXPECT_EQ(closed->kind, EgressEvent::Kind::kHttp);
  EXPECT_EQ(closed->bytes_up, got[0].size());
  EXPECT_EQ(closed->bytes_down, reply.head.size() + reply.body.size());
}

TEST_F(EgressProxyTest, AbsoluteFormPostBodyForwarded) {
  StartProxy();
  Fd s = Dial();
  SendAll(s,
          "POST http://web.test:" + Port(*web_) + "/up HTTP/1.1\r\nContent-Length: 5\r\n\r\nabcde");
  EXPECT_EQ(ReadReply(s).status, 200);
  auto got = WaitRequests(*web_, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], "POST /up HTTP/1.1\r\nHost: web.test:" + Port(*web_) +
                        "\r\nContent-Length: 5\r\n\r\nabcde");
}

TEST_F(EgressProxyTest, AbsoluteFormDenied) {
  StartProxy();
  for (std::string request :
       {"GET http://evil.test:" + Port(*trap_) + "/ HTTP/1.1\r\n\r\n",
        "GET http://web.test:" + Port(*trap_) + "/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
        "GET http://web.test@evil.test:" + Port(*trap_) + "/ HTTP/1.1\r\n\r\n",
        "GET http://127.0.0.1:" + Port(*trap_) + "/ HTTP/1.1\r\n\r\n"}) {
    Fd s = Dial();
    SendAll(s, request);
    std::string reply = ReadAll(s);
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 403") || reply.starts_with("HTTP/1.1 400"))
        << request << " -> " << reply;
  }
  EXPECT_EQ(trap_->connections.load(), 0);
  Fd ok = Dial();  // control
  SendAll(ok, "GET http://web.test:" + Port(*web_) + "/ HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadReply(ok).status, 200);
}

// --- Request bodies: chunked, and everything ambiguous refused ---

TEST_F(EgressProxyTest, ChunkedRequestBodyForwardedInTheProxysOwnFraming) {
  StartProxy();
  const std::string head = "POST http://web.test:" + Port(*web_) +
                           "/up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                           "Trailer: X-Sum\r\n\r\n";
  const std::string body = "5;ext=\"a;b\"\r\nhello\r\n1 ; last\r\n!\r\n0\r\nX-Sum: 6\r\n\r\n";
  for (bool byte_by_byte : {false, true}) {
    Fd s = Dial();
    SendAll(s, head);
    if (byte_by_byte) {
      for (char c : body) SendAll(s, std::string(1, c));
    } else {
      SendAll(s, body);
    }
    EXPECT_EQ(ReadReply(s).status, 200) << byte_by_byte;
  }
  auto got = WaitRequests(*web_, 2);
  ASSERT_EQ(got.size(), 2u);
  for (const std::string& request : got) {
    const std::string prefix = "POST /up HTTP/1.1\r\nHost: web.test:" + Port(*web_) +
                               "\r\nTransfer-Encoding: chunked\r\n\r\n";
    ASSERT_TRUE(request.starts_with(prefix)) << request;
    // Chunks of the proxy's own: sizes in hex, no extensions, the data as sent, no trailers.
    std::string data;
    std::string_view rest = std::string_view(request).substr(prefix.size());
    while (true) {
      const size_t eol = rest.find("\r\n");
      ASSERT_NE(eol, std::string_view::npos) << request;
      const std::string size_text(rest.substr(0, eol));
      ASSERT_EQ(size_text.find_first_not_of("0123456789abcdef"), std::string::npos) << request;
      const size_t size = std::stoul(size_text, nullptr, 16);
      rest.remove_prefix(eol + 2);
      if (size == 0) {
        EXPECT_EQ(rest, "\r\n") << request;
        break;
      }
      data += rest.substr(0, size);
      EXPECT_EQ(rest.substr(size, 2), "\r\n");
      rest.remove_prefix(size + 2);
    }
    EXPECT_EQ(data, "hello!");
  }
}

TEST_F(EgressProxyTest, AmbiguousRequestFramingIs400AndReachesNothing) {
  StartProxy();
  const std::string url = "http://web.test:" + Port(*web_) + "/";
  for (const std::string& request : {
           "POST " + url +
               " HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
               "0\r\n\r\n",
           "POST " + url + " HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
           "POST " + url +
               " HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
               "identity\r\n\r\n0\r\n\r\n",
           "POST " + url + " HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
           "POST " + url + " HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
           "POST " + url + " HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
           "POST " + url + " HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
           "POST " + url +
               " HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
           "POST " + url + " HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
           "POST " + url +
               " HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n",
           "POST " + url + " HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
           "POST " + url + " HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n folded\r\n\r\n",
           "POST " + url + " HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" +
               std::string(5000, 'f') + "\r\n",
           "POST " + url + " HTTP/1.1\r\nX: a\r\n  folded\r\nContent-Length: 0\r\n\r\n",
           "POST " + url + " HTTP/1.1\nContent-Length: 0\r\n\r\n",
       }) {
    Fd s = Dial();
    SendAll(s, request);
    std::string reply = ReadAll(s);
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 400 Bad Request\r\n")) << request << "\n->\n" << reply;
    EXPECT_EQ(Field(reply, "X-Airlock-Deny-Rule"), "malformed") << request;
  }
  EXPECT_EQ(web_->connections.load(), 0);
  Fd ok = Dial();  // control: the same request, well framed
  SendAll(ok,
          "POST " + url + " HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
  EXPECT_EQ(ReadReply(ok).status, 200);
  EXPECT_EQ(WaitConnections(*web_, 1), 1);
}

// The classic smuggling payload: a body that ends early by one reading, with a second request
// behind it. The proxy reads the second request as a request of its own and judges it.
TEST_F(EgressProxyTest, ARequestBehindABodyIsJudgedOnItsOwn) {
  StartProxy();
  Fd s = Dial();
  SendAll(s, "POST http://web.test:" + Port(*web_) +
                 "/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                 "GET http://evil.test:" +
                 Port(*trap_) + "/ HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadReply(s).status, 200);
  Reply second = ReadReply(s);
  EXPECT_EQ(second.status, 403) << second.head;
  EXPECT_EQ(Field(second.head, "X-Airlock-Deny-Rule"), "allowlist");
  EXPECT_TRUE(Closed(s));
  EXPECT_EQ(trap_->connections.load(), 0);
  auto got = WaitRequests(*web_, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].ends_with("\r\n\r\n0\r\n\r\n")) << got[0];
  EXPECT_EQ(web_->Received(), got[0]);  // not one byte more
}

// A chunked body that turns bad after the proxy has started forwarding: the server has had
// well-formed chunks and never a last one; the connection ends.
TEST_F(EgressProxyTest, AChunkedBodyThatTurnsBadStopsMidStream) {
  StartProxy();
  Fd s = Dial();
  SendAll(s, "POST http://web.test:" + Port(*web_) +
                 "/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
  for (int i = 0; i < 500 && web_->Received().find("hello") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(web_->Received().find("5\r\nhello\r\n"), std::string::npos) << web_->Received();
  SendAll(s, "zz\r\nGET http://evil.test:" + Port(*trap_) + "/ HTTP/1.1\r\n\r\n0\r\n\r\n");
  std::string reply = ReadAll(s);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 400")) << reply;
  EXPECT_EQ(Field(reply, "X-Airlock-Deny-Rule"), "malformed");
  EXPECT_EQ(web_->Requests().size(), 0u);  // no whole request reached it
  EXPECT_EQ(web_->Received().find("0\r\n\r\n"), std::string::npos) << web_->Received();
  EXPECT_EQ(trap_->connections.load(), 0);
}

// --- Keep-alive through the explicit proxy ---

TEST_F(EgressProxyTest, KeepAliveReusesTheUpstreamConnection) {
  StartProxy();
  Fd s = Dial();
  const std::string get = "GET http://web.test:" + Port(*web_) +
                          "/ HTTP/1.1\r\nHost: web.test:" + Port(*web_) + "\r\n\r\n";
  for (int i = 0; i < 3; ++i) {
    SendAll(s, get);
    Reply r = ReadReply(s);
    EXPECT_EQ(r.status, 200) << i;
    EXPECT_EQ(r.body, "hello world") << i;
    EXPECT_EQ(r.head.find("Connection: close"), std::string::npos) << r.head;
  }
  EXPECT_EQ(WaitRequests(*web_, 3).size(), 3u);
  EXPECT_EQ(web_->connections.load(), 1);
  // Every request has its own verdict; the one upstream connection one closing event.
  EXPECT_EQ(CountEvents([](const EgressEvent& e) {
              return e.phase == EgressEvent::Phase::kVerdict && e.allowed && e.name == "web.test";
            }),
            3u);
  s = Fd();
  ASSERT_TRUE(
      WaitEvent([](const EgressEvent& e) { return e.phase == EgressEvent::Phase::kClosed; }));
  EXPECT_EQ(
      CountEvents([](const EgressEvent& e) { return e.phase == EgressEvent::Phase::kClosed; }), 1u);
}

TEST_F(EgressProxyTest, KeepAliveFollowUpToADeniedHostIs403AndReachesNothing) {
  StartProxy();
  Fd s = Dial();
  SendAll(s, "GET http://web.test:" + Port(*web_) + "/ HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadReply(s).status, 200);
  SendAll(s, "GET http://evil.test:" + Port(*trap_) + "/ HTTP/1.1\r\n\r\n");
  Reply denied = ReadReply(s);
  EXPECT_EQ(denied.status, 403) << denied.head;
  EXPECT_EQ(Field(denied.head, "X-Airlock-Deny-Rule"), "allowlist");
  EXPECT_EQ(denied.body,
            "airlock egress: evil.test:" + Port(*trap_) + " is not in this sandbox's allowlist\n");
  EXPECT_TRUE(Closed(s));
  EXPECT_EQ(trap_->connections.load(), 0);
  auto event = WaitEvent([](const EgressEvent& e) { return e.name == "evil.test"; });
  ASSERT_TRUE(event);
  EXPECT_FALSE(event->allowed);
  EXPECT_EQ("airlock egress: " + event->reason + "\n", denied.body);
}

TEST_F(EgressProxyTest, KeepAliveToAnotherAllowedHostOpensANewUpstream) {
  StartProxy();
  Fd s = Dial();
  SendAll(s, "GET http://web.test:" + Port(*web_) + "/ HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadReply(s).status, 200);
  SendAll(s, "GET http://b.test:" + Port(*web2_) + "/ HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadReply(s).status, 200);
  EXPECT_EQ(WaitConnections(*web2_, 1), 1);
  EXPECT_EQ(web_->connections.load(), 1);
  // The same name on another port is another destination too.
  SendAll(s, "GET http://b.test:" + Port(*web_) + "/ HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadReply(s).status, 200);
  EXPECT_EQ(WaitConnections(*web_, 2), 2);
  EXPECT_EQ(WaitRequests(*web_, 2).size(), 2u);
  EXPECT_EQ(web2_->Requests().size(), 1u);
}

TEST_F(EgressProxyTest, ResponseFramingDecidesWhetherTheClientConnectionLives) {
  StartProxy();
  const std::string base = "http://web.test:" + Port(*web_);
  Fd s = Dial();
  SendAll(s, "GET " + base + "/chunked HTTP/1.1\r\n\r\n");
  Reply chunked = ReadReply(s);
  EXPECT_EQ(chunked.status, 200);
  EXPECT_EQ(chunked.body, "hello world");
  EXPECT_EQ(Field(chunked.head, "Transfer-Encoding"), "chunked");
  SendAll(s, "HEAD " + base + "/ HTTP/1.1\r\n\r\n");
  Reply head = ReadReply(s, /*no_body=*/true);
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(Field(head.head, "Content-Length"), "11");  // describes the GET, kept
  SendAll(s, "GET " + base + "/204 HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadReply(s, /*no_body=*/true).status, 204);
  SendAll(s, "GET " + base + "/ HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadReply(s).body, "hello world");
  EXPECT_EQ(web_->connections.load(), 1);
  // A body that ends with the server's close can only end with the client's connection too.
  SendAll(s, "GET " + base + "/eof HTTP/1.1\r\n\r\n");
  Reply eof = ReadReply(s);
  EXPECT_EQ(eof.status, 200);
  EXPECT_EQ(Field(eof.head, "Connection"), "close");
  EXPECT_EQ(eof.body, "until the close");
  EXPECT_TRUE(Closed(s));
}

TEST_F(EgressProxyTest, ClientConnectionCloseAndHttp10AreHonoured) {
  StartProxy();
  const std::string base = "http://web.test:" + Port(*web_);
  Fd s = Dial();
  SendAll(s, "GET " + base + "/ HTTP/1.1\r\nConnection: close\r\n\r\n");
  Reply r = ReadReply(s);
  EXPECT_EQ(r.body, "hello world");
  EXPECT_EQ(Field(r.head, "Connection"), "close");
  EXPECT_TRUE(Closed(s));
  auto got = WaitRequests(*web_, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_NE(got[0].find("Connection: close\r\n"), std::string::npos);  // told upstream too
  // HTTP/1.0: a chunked response de-chunked, ended by the close.
  Fd old = Dial();
  SendAll(old, "GET " + base + "/chunked HTTP/1.0\r\n\r\n");
  std::string all = ReadAll(old);
  EXPECT_TRUE(all.starts_with("HTTP/1.1 200 OK\r\n")) << all;
  EXPECT_TRUE(all.ends_with("\r\nConnection: close\r\n\r\nhello world")) << all;
  EXPECT_EQ(all.find("Transfer-Encoding"), std::string::npos) << all;
}

TEST_F(EgressProxyTest, PipelinedRequestsAreAnsweredInOrder) {
  StartProxy();
  const std::string base = "http://web.test:" + Port(*web_);
  Fd s = Dial();
  SendAll(s, "GET " + base + "/chunked HTTP/1.1\r\n\r\n\r\nPOST " + base +
                 "/ HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET " + base + "/204 HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadReply(s).body, "hello world");
  EXPECT_EQ(ReadReply(s).body, "hello world");
  EXPECT_EQ(ReadReply(s, /*no_body=*/true).status, 204);
  auto got = WaitRequests(*web_, 3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[1].ends_with("\r\n\r\nabc")) << got[1];
  EXPECT_EQ(web_->connections.load(), 1);
}

TEST_F(EgressProxyTest, AnUpstreamThatClosesIsReplacedForTheNextRequest) {
  StartProxy();
  const std::string base = "http://web.test:" + Port(*web_);
  Fd s = Dial();
  SendAll(s, "GET " + base + "/close HTTP/1.1\r\n\r\n");
  Reply bye = ReadReply(s);
  EXPECT_EQ(bye.body, "bye");
  EXPECT_EQ(Field(bye.head, "Connection"), "");  // the client's connection lives on
  SendAll(s, "GET " + base + "/ HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadReply(s).body, "hello world");
  EXPECT_EQ(WaitConnections(*web_, 2), 2);
}

TEST_F(EgressProxyTest, ExpectContinueAndAnEarlyAnswer) {
  StartProxy();
  const std::string base = "http://web.test:" + Port(*web_);
  Fd s = Dial();
  SendAll(s, "PUT " + base + "/ HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
  Reply interim = ReadReply(s, /*no_body=*/true);
  EXPECT_EQ(interim.status, 100) << interim.head;
  SendAll(s, "hello");
  EXPECT_EQ(ReadReply(s).body, "hello world");
  auto got = WaitRequests(*web_, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].ends_with("\r\n\r\nhello"));
  // A server that answers before the body ends: the answer comes through, then the close.
  Fd early = Dial();
  SendAll(early, "POST " + base + "/early HTTP/1.1\r\nContent-Length: 100000\r\n\r\nabc");
  EXPECT_EQ(ReadReply(early).status, 413);
  EXPECT_TRUE(Closed(early));
}

TEST_F(EgressProxyTest, AMalformedResponseIs502) {
  StartProxy();
  Fd s = Dial();
  SendAll(s, "GET http://web.test:" + Port(*web_) + "/bad HTTP/1.1\r\n\r\n");
  std::string reply = ReadAll(s);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 502")) << reply;
  EXPECT_EQ(Field(reply, "X-Airlock-Deny-Rule"), "upstream");
  EXPECT_NE(reply.find("more than one Content-Length"), std::string::npos) << reply;
}

TEST_F(EgressProxyTest, EachRequestIsJudgedByThePolicyAsItIsNow) {
  StartProxy();
  Fd s = Dial();
  const std::string get = "GET http://web.test:" + Port(*web_) + "/ HTTP/1.1\r\n\r\n";
  SendAll(s, get);
  EXPECT_EQ(ReadReply(s).status, 200);
  SetPolicy(R"({"mode":"allowlist","allow":["a.test"]})");  // no Recheck: the next request sees it
  SendAll(s, get);
  Reply denied = ReadReply(s);
  EXPECT_EQ(denied.status, 403);
  EXPECT_EQ(Field(denied.head, "X-Airlock-Deny-Rule"), "allowlist");
  EXPECT_EQ(WaitRequests(*web_, 1).size(), 1u);
}

// --- One refusal, one shape: the status, the rule in a header, the event's reason as the body ---

TEST_F(EgressProxyTest, EveryRefusalNamesItsRuleAndItsEventsReason) {
  ProxyLimits limits;
  limits.max_header_bytes = 4096;
  StartProxy(limits);
  const std::string trap = Port(*trap_);
  struct Case {
    std::optional<uint16_t> transparent;  // the original port, for a redirected connection
    std::string request;
    int status;
    std::string rule;
  };
  const std::vector<Case> cases = {
      {std::nullopt, "CONNECT evil.test:" + trap + " HTTP/1.1\r\n\r\n", 403, "allowlist"},
      {std::nullopt, "GET http://evil.test:" + trap + "/ HTTP/1.1\r\n\r\n", 403, "allowlist"},
      {trap_->port, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", 403, "allowlist"},
      {trap_->port, "GET / HTTP/1.1\r\nHost: web.test:1\r\n\r\n", 403, "port"},
      {std::nullopt, "GET http://web.test:" + trap + "/ HTTP/1.1\r\nHost: evil.test\r\n\r\n", 403,
       "host-mismatch"},
      {std::nullopt, "GET http://169.254.169.254/ HTTP/1.1\r\n\r\n", 403, "metadata"},
      {std::nullopt, "GET / HTTP/1.1\r\nHost: web.test\r\n\r\n", 400, "malformed"},
      {std::nullopt, "GET http://web.test/ HTTP/1.1\r\nX: " + std::string(5000, 'a'), 431,
       "too-large"},
      {std::nullopt, "GET http://nowhere.test/ HTTP/1.1\r\n\r\n", 403, "allowlist"},
  };
  for (const Case& c : cases) {
    Fd s = c.transparent ? DialTransparent(*c.transparent) : Dial();
    SendAll(s, c.request);
    std::string reply = ReadAll(s);
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 " + std::to_string(c.status) + " "))
        << c.request << reply;
    EXPECT_EQ(Field(reply, "X-Airlock-Deny-Rule"), c.rule) << c.request;
    const std::string body = reply.substr(reply.find("\r\n\r\n") + 4);
    auto event = WaitEvent([&](const EgressEvent& e) {
      return !e.allowed && e.rule == c.rule && "airlock egress: " + e.reason + "\n" == body;
    });
    EXPECT_TRUE(event) << c.request << " -> " << body;
  }
  EXPECT_EQ(trap_->connections.load(), 0);
  // TLS cannot be answered: closed, with the wording an HTTP client of the same name would get.
  Fd tls = DialTransparent(trap_->port);
  SendAll(tls, ClientHello("evil.test"));
  EXPECT_EQ(ReadAll(tls), "");
  auto event = WaitEvent([](const EgressEvent& e) { return e.kind == EgressEvent::Kind::kTls; });
  ASSERT_TRUE(event);
  EXPECT_EQ(event->reason, "evil.test:" + trap + " is not in this sandbox's allowlist");
  EXPECT_EQ(trap_->connections.load(), 0);
}

// --- Transparent ---

TEST_F(EgressProxyTest, TransparentHttpByHost) {
  StartProxy();
  Fd s = DialTransparent(web_->port);
  SendAll(s, "GET /x HTTP/1.1\r\nHost: WEB.test\r\n\r\n");
  Reply r = ReadReply(s);
  EXPECT_EQ(r.status, 200) << r.head;
  // Keep-alive here too, each request judged by its Host.
  SendAll(s, "GET /y HTTP/1.1\r\nHost: web.test\r\n\r\n");
  EXPECT_EQ(ReadReply(s).status, 200);
  auto got = WaitRequests(*web_, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].starts_with("GET /x HTTP/1.1\r\nHost: WEB.test\r\n")) << got[0];
  SendAll(s, "GET /z HTTP/1.1\r\nHost: evil.test\r\n\r\n");
  EXPECT_EQ(ReadReply(s).status, 403);

  Fd d = DialTransparent(web_->port);
  SendAll(d, "GET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n");
  EXPECT_TRUE(ReadAll(d).starts_with("HTTP/1.1 403"));
  // A Host whose port is not the one dialled.
  Fd p = DialTransparent(web_->port);
  SendAll(p, "GET /x HTTP/1.1\r\nHost: web.test:1\r\n\r\n");
  EXPECT_TRUE(ReadAll(p).starts_with("HTTP/1.1 403"));
  // Two Host headers.
  Fd h = DialTransparent(web_->port);
  SendAll(h, "GET /x HTTP/1.1\r\nHost: web.test\r\nHost: evil.test\r\n\r\n");
  EXPECT_TRUE(ReadAll(h).starts_with("HTTP/1.1 400"));
  EXPECT_EQ(web_->connections.load(), 1);
  EXPECT_EQ(web_->Requests().size(), 2u);
}

TEST_F(EgressProxyTest, TransparentTlsBySni) {
  StartProxy();
  Fd s = DialTransparent(echo_->port);
  std::string hello = ClientHello("tls.test");
  SendAll(s, hello);
  EXPECT_EQ(ReadN(s, hello.size()), hello);
  EXPECT_EQ(echo_->Received(), hello);
  auto verdict = WaitEvent([](const EgressEvent& e) { return e.kind == EgressEvent::Kind::kTls; });
  ASSERT_TRUE(verdict);
  EXPECT_TRUE(verdict->allowed);
  EXPECT_EQ(verdict->sni, "tls.test");
  EXPECT_EQ(verdict->dest->to_string(), "127.0.0.1");  // never 203.0.113.10
}

TEST_F(EgressProxyTest, TransparentTlsDeniedSniAndMissingSniClosed) {
  StartProxy();
  for (std::string hello : {ClientHello("evil.test"), ClientHello(""), ClientHello("127.0.0.1"),
                            std::string("\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00", 10)}) {
    Fd s = DialTransparent(echo_->port);
    SendAll(s, hello);
    EXPECT_EQ(ReadAll(s), "");
  }
  EXPECT_EQ(echo_->connections.load(), 0);
  Fd ok = DialTransparent(echo_->port);  // control
  std::string hello = ClientHello("tls.test");
  SendAll(ok, hello);
  EXPECT_EQ(ReadN(ok, hello.size()), hello);
}

TEST_F(EgressProxyTest, TransparentTlsSplitAcrossWrites) {
  StartProxy();
  Fd s = DialTransparent(echo_->port);
  std::string hello = ClientHello("tls.test");
  for (char c : hello) {
    SendAll(s, std::string(1, c));
  }
  EXPECT_EQ(ReadN(s, hello.size()), hello);
}

// --- Open mode, transparent: the name judged if there is one, the address always, the address
// the client chose dialled ---

class EgressProxyOpenTest : public EgressProxyTest {
 protected:
  void SetUp() override {
    EgressProxyTest::SetUp();
    SetPolicy(R"({"mode":"open","deny":["evil.test","*.evil.test","127.0.0.2/32"]})");
  }
  // Upstream sockets bound to the loopback interface (a safety belt: a denied address dialled by
  // mistake would not leave the machine) and counted.
  void StartProxy() {
    EgressProxyTest::StartProxy({}, [this](int domain, int type) -> Result<UniqueFd> {
      ++dials_;
      UniqueFd fd(socket(domain, type | SOCK_CLOEXEC, 0));
      if (::geteuid() == 0 && setsockopt(fd.get(), SOL_SOCKET, SO_BINDTODEVICE, "lo", 3) != 0) {
        return FailErrno("SO_BINDTODEVICE", errno);
      }
      return fd;
    });
  }
  std::atomic<int> dials_{0};
  tcp::endpoint At(const std::string& address, uint16_t port) {
    return tcp::endpoint(asio::ip::make_address(address), port);
  }
};

TEST_F(EgressProxyOpenTest, HttpJudgesTheHostAndTheAddressAndDialsTheOriginal) {
  StartProxy();
  // A name no resolver knows: the address the client chose is dialled, nothing is resolved.
  Fd s = Dial(At("127.0.0.1", web_->port));
  SendAll(s, "GET / HTTP/1.1\r\nHost: unknown.test\r\n\r\n");
  EXPECT_EQ(ReadReply(s).body, "hello world");
  EXPECT_EQ(resolves_.load(), 0);
  // The next request names a denied host at the same address: 403, and nothing more reaches it.
  SendAll(s, "GET / HTTP/1.1\r\nHost: www.evil.test\r\n\r\n");
  Reply denied = ReadReply(s);
  EXPECT_EQ(denied.status, 403);
  EXPECT_EQ(Field(denied.head, "X-Airlock-Deny-Rule"), "*.evil.test");
  EXPECT_EQ(WaitRequests(*web_, 1).size(), 1u);
  Fd d = Dial(At("127.0.0.1", web_->port));
  SendAll(d, "GET / HTTP/1.1\r\nHost: EVIL.test.\r\n\r\n");
  EXPECT_TRUE(ReadAll(d).starts_with("HTTP/1.1 403"));
  // No Host at all (HTTP/1.0): the address alone.
  Fd bare = Dial(At("127.0.0.1", web_->port));
  SendAll(bare, "GET / HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(ReadAll(bare).ends_with("hello world"));
  // Denied addresses, whatever the Host says: a deny rule, the metadata endpoint, a private range.
  for (const tcp::endpoint& to : {At("127.0.0.2", web_->port), At("169.254.169.254", 80),
                                  At("10.1.2.3", 80), At("fd00:ec2::254", 80)}) {
    Fd x = Dial(to);
    SendAll(x, "GET / HTTP/1.1\r\nHost: web.test\r\n\r\n");
    std::string reply = ReadAll(x);
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 403")) << to << ": " << reply;
  }
  EXPECT_EQ(web_->Requests().size(), 2u);
  EXPECT_EQ(resolves_.load(), 0);
  EXPECT_EQ(dials_.load(), 2);  // the two allowed connections, nothing for the denied ones
}

TEST_F(EgressProxyOpenTest, TlsWithoutSniByAddressWithADeniedSniClosed) {
  StartProxy();
  for (const std::string& sni :
       {std::string(), std::string("other.test"), std::string("1.2.3.4")}) {
    Fd s = Dial(At("127.0.0.1", echo_->port));
    std::string hello = ClientHello(sni);
    SendAll(s, hello);
    EXPECT_EQ(ReadN(s, hello.size()), hello) << sni;
  }
  EXPECT_EQ(WaitConnections(*echo_, 3), 3);
  Fd denied = Dial(At("127.0.0.1", echo2_->port));
  SendAll(denied, ClientHello("api.evil.test"));
  EXPECT_EQ(ReadAll(denied), "");
  Fd meta = Dial(At("169.254.169.254", 443));
  SendAll(meta, ClientHello(""));
  EXPECT_EQ(ReadAll(meta), "");
  EXPECT_EQ(echo2_->connections.load(), 0);
  auto event = WaitEvent([](const EgressEvent& e) { return e.rule == "metadata"; });
  ASSERT_TRUE(event);
  EXPECT_EQ(event->kind, EgressEvent::Kind::kTls);
  EXPECT_EQ(resolves_.load(), 0);
  EXPECT_EQ(dials_.load(), 3);
}

// --- IPv6: the second listener, and IPv6 destinations ---

TEST_F(EgressProxyTest, Ipv6ClientsOnTheSamePort) {
  if (!Ipv6Loopback()) GTEST_SKIP() << "no IPv6 loopback (::1) on this machine";
  StartProxy();
  Fd s = Dial(std::nullopt, "::1");
  SendAll(s, "CONNECT a.test:" + Port(*echo_) + " HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadHead(s), "HTTP/1.1 200 Connection established\r\n\r\n");
  SendAll(s, "ping");
  EXPECT_EQ(ReadN(s, 4), "ping");
  auto event = WaitEvent([](const EgressEvent& e) { return e.allowed; });
  ASSERT_TRUE(event);
  EXPECT_EQ(event->client, asio::ip::make_address("::1"));
  Fd denied = Dial(std::nullopt, "::1");  // the policy applies the same
  SendAll(denied, "CONNECT evil.test:" + Port(*echo_) + " HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(ReadAll(denied).starts_with("HTTP/1.1 403"));
}

TEST_F(EgressProxyOpenTest, AnIpv6OriginalDestinationIsDialled) {
  if (!Ipv6Loopback()) GTEST_SKIP() << "no IPv6 loopback (::1) on this machine";
  Origin echo6(io_, "::1");
  asio::co_spawn(io_, OriginAccept(&echo6, false), asio::detached);
  StartProxy();
  Fd s = Dial(At("::1", echo6.port), "::1");
  std::string hello = ClientHello("");
  SendAll(s, hello);
  EXPECT_EQ(ReadN(s, hello.size()), hello);
  auto event = WaitEvent([](const EgressEvent& e) { return e.allowed; });
  ASSERT_TRUE(event);
  EXPECT_EQ(event->dest->to_string(), "::1");
  s = Fd();
  TearDown();  // before echo6 goes
}

// The default original_destination: a real redirect (nftables) in a network namespace of the
// test's own, on IPv6 loopback, read with IP6T_SO_ORIGINAL_DST.
TEST(EgressProxyRedirectTest, Ipv6OriginalDestinationFromARealRedirect) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (a network namespace and nftables)";
  if (::access("/usr/sbin/nft", X_OK) != 0) GTEST_SKIP() << "nft (nftables) is not installed";
  std::string failure;
  std::optional<tcp::endpoint> redirected, direct;
  // A thread of its own in a fresh namespace: its sockets are that namespace's; the rest of the
  // process stays where it is.
  std::thread([&] {
    if (::unshare(CLONE_NEWNET) != 0 || std::system("ip link set lo up") != 0) {
      failure = "making a network namespace";
      return;
    }
    asio::io_context io;
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("::1"), 0));
    const uint16_t port = acceptor.local_endpoint().port();
    const std::string rules =
        "nft 'add table ip6 airlock_test; add chain ip6 airlock_test out "
        "{ type nat hook output priority -100; }; add rule ip6 airlock_test "
        "out tcp dport 4444 redirect to :" +
        std::to_string(port) + "'";
    if (std::system(rules.c_str()) != 0) {
      failure = "installing the redirect";
      return;
    }
    for (uint16_t dial : {uint16_t{4444}, port}) {
      tcp::socket client(io);
      boost::system::error_code ec;
      client.connect(tcp::endpoint(asio::ip::make_address("::1"), dial), ec);
      if (ec) {
        failure = "connecting to port " + std::to_string(dial) + ": " + ec.message();
        return;
      }
      tcp::socket accepted = acceptor.accept();
      (dial == 4444 ? redirected : direct) = OriginalDestination(accepted);
    }
    // The namespace (and its table) goes with this thread's last reference to it.
  }).join();
  ASSERT_EQ(failure, "");
  ASSERT_TRUE(redirected);
  EXPECT_EQ(redirected->address().to_string(), "::1");
  EXPECT_EQ(redirected->port(), 4444);
  EXPECT_FALSE(direct);  // the control: a connection that was not redirected
}

// --- Malformed input and limits ---

TEST_F(EgressProxyTest, GarbageAndOversizedHeadersClosedCleanly) {
  StartProxy();
  Fd g = Dial();
  SendAll(g, std::string("\x01\x02garbage\r\n\r\n", 13));
  EXPECT_TRUE(ReadAll(g).starts_with("HTTP/1.1 400"));
  Fd o = Dial();
  SendAll(o, "GET http://web.test/ HTTP/1.1\r\nX: " + std::string(20000, 'a'));
  EXPECT_TRUE(ReadAll(o).starts_with("HTTP/1.1 431"));
  Fd origin_form = Dial();
  SendAll(origin_form, "GET / HTTP/1.1\r\nHost: web.test\r\n\r\n");
  EXPECT_TRUE(ReadAll(origin_form).starts_with("HTTP/1.1 400"));
  Fd smuggle = Dial();
  SendAll(smuggle, "GET http://web.test:" + Port(*web_) +
                       "/ HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "0\r\n\r\n");
  EXPECT_TRUE(ReadAll(smuggle).starts_with("HTTP/1.1 400"));
  Fd bare_lf = Dial();
  SendAll(bare_lf, "GET http://web.test:" + Port(*web_) + "/ HTTP/1.1\nHost: x\r\n\r\n");
  EXPECT_TRUE(ReadAll(bare_lf).starts_with("HTTP/1.1 400"));
  Fd tls_junk = DialTransparent(echo_->port);
  SendAll(tls_junk, std::string("\x16\x03\x01\xff\xff", 5) + std::string(20000, 'z'));
  EXPECT_EQ(ReadAll(tls_junk), "");
  EXPECT_EQ(web_->connections.load(), 0);
  EXPECT_EQ(echo_->connections.load(), 0);
  // Still serving.
  std::string reply;
  Fd s = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 200"));
}

TEST_F(EgressProxyTest, SilentClientClosedAfterFirstRequestTimeout) {
  ProxyLimits limits;
  limits.first_request_timeout = std::chrono::milliseconds(300);
  StartProxy(limits);
  Fd s = Dial();
  EXPECT_TRUE(Closed(s));  // within the 5 s of the socket's timeout
}

TEST_F(EgressProxyTest, IdleKeptAliveClientClosedAfterKeepAliveTimeout) {
  ProxyLimits limits;
  limits.keep_alive_timeout = std::chrono::milliseconds(300);
  StartProxy(limits);
  Fd s = Dial();
  SendAll(s, "GET http://web.test:" + Port(*web_) + "/ HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadReply(s).status, 200);
  EXPECT_TRUE(Closed(s));
}

TEST_F(EgressProxyTest, PerClientConnectionLimit) {
  ProxyLimits limits;
  limits.max_connections_per_client = 3;
  StartProxy(limits);
  std::vector<Fd> tunnels;
  for (int i = 0; i < 3; ++i) {
    std::string reply;
    tunnels.push_back(Connect("a.test:" + Port(*echo_), &reply));
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 200")) << i;
  }
  std::string reply;
  Fd over = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_EQ(reply, "");
  EXPECT_EQ(WaitConnections(*echo_, 3), 3);
}

TEST_F(EgressProxyTest, ModeNoneDeniesEverything) {
  StartProxy();
  {
    std::lock_guard lock(mu_);
    policy_ = NetworkPolicy();  // mode none: everything denied
  }
  std::string reply;
  Fd s = Connect("a.test:" + Port(*echo_), &reply);
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 403")) << reply;
}

// --- Live policy change ---

TEST_F(EgressProxyTest, RecheckClosesTunnelsThePolicyNoLongerAllows) {
  StartProxy();
  std::string reply;
  Fd a = Connect("a.test:" + Port(*echo_), &reply);
  ASSERT_TRUE(reply.starts_with("HTTP/1.1 200"));
  Fd b = Connect("b.test:" + Port(*echo2_), &reply);
  ASSERT_TRUE(reply.starts_with("HTTP/1.1 200"));
  SendAll(a, "1");
  SendAll(b, "2");
  EXPECT_EQ(ReadN(a, 1), "1");
  EXPECT_EQ(ReadN(b, 1), "2");
  EXPECT_EQ(proxy_->Recheck(asio::ip::make_address("127.0.0.1")), 0u);  // nothing changed

  SetPolicy(R"({"mode":"allowlist","allow":["b.test"]})");
  EXPECT_EQ(proxy_->Recheck(asio::ip::make_address("127.0.0.1")), 1u);
  EXPECT_EQ(ReadAll(a), "");  // closed
  SendAll(b, "still here");
  EXPECT_EQ(ReadN(b, 10), "still here");
  auto event = WaitEvent([](const EgressEvent& e) {
    return !e.allowed && e.name == "a.test" && e.phase == EgressEvent::Phase::kVerdict;
  });
  ASSERT_TRUE(event);
  EXPECT_NE(event->reason.find("policy changed"), std::string::npos);
}

TEST_F(EgressProxyTest, RecheckClosesAKeptAliveConnection) {
  StartProxy();
  Fd s = Dial();
  SendAll(s, "GET http://web.test:" + Port(*web_) + "/ HTTP/1.1\r\n\r\n");
  EXPECT_EQ(ReadReply(s).status, 200);
  EXPECT_EQ(proxy_->Recheck(asio::ip::make_address("127.0.0.1")), 0u);
  SetPolicy(R"({"mode":"allowlist","allow":["a.test"]})");
  EXPECT_EQ(proxy_->Recheck(asio::ip::make_address("127.0.0.1")), 1u);
  EXPECT_TRUE(Closed(s));
}

// --- Load ---

TEST_F(EgressProxyTest, TwoHundredConcurrentTunnels) {
  StartProxy();
  std::vector<Fd> tunnels;
  for (int i = 0; i < 200; ++i) {
    Fd s = Dial();
    SendAll(s, "CONNECT a.test:" + Port(*echo_) + " HTTP/1.1\r\n\r\n");
    tunnels.push_back(std::move(s));
  }
  for (auto& s : tunnels) ASSERT_EQ(ReadHead(s), "HTTP/1.1 200 Connection established\r\n\r\n");
  EXPECT_EQ(proxy_->open_connections(), 200u);
  for (size_t i = 0; i < tunnels.size(); ++i) SendAll(tunnels[i], "msg" + std::to_string(i) + ";");
  for (size_t i = 0; i < tunnels.size(); ++i) {
    std::string want = "msg" + std::to_string(i) + ";";
    EXPECT_EQ(ReadN(tunnels[i], want.size()), want);
  }
  EXPECT_EQ(WaitConnections(*echo_, 200), 200);
}

// --- The ClientHello parser on its own ---

TEST(ClientHelloScanTest, PrefixesNeedMoreAndCorruptionIsInvalid) {
  std::string hello = ClientHello("tls.test");
  for (size_t n = 1; n < hello.size(); ++n) {
    ASSERT_EQ(ScanClientHello(hello.substr(0, n)).state, ClientHelloScan::State::kNeedMore) << n;
  }
  auto full = ScanClientHello(hello);
  EXPECT_EQ(full.state, ClientHelloScan::State::kComplete);
  EXPECT_EQ(full.sni, "tls.test");
  // Every single-byte corruption is either caught or still parses; none reads out of bounds.
  for (size_t i = 0; i < hello.size(); ++i) {
    std::string bad = hello;
    bad[i] = static_cast<char>(bad[i] ^ 0xff);
    (void)ScanClientHello(bad);
  }
  EXPECT_EQ(ScanClientHello("GET / HTTP/1.1").state, ClientHelloScan::State::kInvalid);
}

}  // namespace
}  // namespace airlock::net
